//! The broadcast log (B-456..B-459; gaps G-14 "Broadcast"): what a session that
//! outlives its connection is owed of broadcast, kept by `broker.session.storage`.
//!
//! A QoS 1 or 2 broadcast owed to at least one such session is written once, as one
//! record of a queue channel of the broker's own, [`CHANNEL`] (a name no
//! configuration can spell), however many sessions are owed it: the record holds the
//! message and, in one reserved User Property, who it is owed to and at which QoS,
//! RETAIN and Subscription Identifiers. The publisher's PUBACK waits for that write
//! (RFC 0003 "What Sagüin does not guarantee": at QoS 1 or 2 the PUBACK says "every
//! session owed it has kept it"). Deliveries to sessions that end with their
//! connection are never logged and never wait.
//!
//! Each session keeps only a [`LogCursor`]: the log offsets it holds queued or on the
//! wire, and its position, the lowest offset it has not settled, stored as the
//! session's position on [`CHANNEL`] (`Provider::set_position`) at most
//! `ack_commit_interval` after it moves and at the connection's end (B-457, B-458).
//! A record leaves the log (`Provider::resolve`) once every session it was handed to
//! has settled or given it up; the broker counts them (`Broker::log_refs`).
//!
//! B-459: at most the client's Receive Maximum of logged deliveries are on the wire
//! at or above the stored position; a full window has the position written before
//! more go, so an unclean stop sends at most that many again. At startup the
//! deliveries at or above a restored session's position are handed back, the first
//! Receive Maximum of them with DUP set, since any of them may have been sent. After
//! a graceful stop those that were on the wire go under the packet identifiers they
//! had (`broker::released`, MQTT-4.4.0-1); after a crash under new ones.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::codec::QoS;
use crate::storage::{
    ChannelKind, ChannelSettings, NewRecord, Provider, Record, RecordProperties, Retention,
};

use super::session::{Delivery, Held, Message, Untracked};

/// The channel the log is kept under.
pub const CHANNEL: &str = crate::storage::SESSION_LOG;
/// The User Property a logged record keeps who it is owed to in (never delivered).
const OWED: &str = "saguin-log";

/// A broadcast handed out to sessions that outlive their connection, waiting for its
/// log write before they are given it.
#[derive(Debug)]
pub struct Pending {
    /// The message.
    pub message: Arc<Message>,
    /// Each session owed it (its client id and incarnation), and its delivery.
    pub owed: Vec<(Arc<str>, u64, Delivery)>,
}

/// What a logged record says beside the message: its QoS and RETAIN as published, its
/// publisher (for No Local, never delivered) and who is owed it.
#[derive(Debug, Serialize, Deserialize)]
struct Owed {
    qos: u8,
    retain: bool,
    publisher: String,
    to: Vec<Target>,
}

/// One session's share of a logged message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    /// The client id.
    #[serde(rename = "c")]
    pub client_id: String,
    /// The QoS it is delivered at.
    #[serde(rename = "q")]
    pub qos: u8,
    /// RETAIN as it goes out.
    #[serde(rename = "r")]
    pub retain: bool,
    /// Its Subscription Identifiers.
    #[serde(rename = "i", default, skip_serializing_if = "Vec::is_empty")]
    pub identifiers: Vec<u32>,
    /// The incarnation of the session owed it (`Session::incarnation`); absent in
    /// records written before it was kept.
    #[serde(rename = "n", default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
    /// For a shared group's delivery held for a member that is away, when
    /// `broker.share.expires_after` gives it up (ms since the epoch; B-446, B-447).
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    pub held_until_ms: Option<u64>,
    /// For a shared group's delivery held for a member, the group
    /// (`<ShareName>/<filter>`), whose other members may collect it (B-447). A
    /// record written before groups were named has none: its delivery stays with
    /// the member it was held for, and still expires.
    #[serde(rename = "g", default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A logged message read back at startup.
#[derive(Debug)]
pub struct Entry {
    /// Its offset in the log.
    pub offset: u64,
    /// The message.
    pub message: Arc<Message>,
    /// Who it is owed to.
    pub targets: Vec<Target>,
}

impl Target {
    /// The delivery this target is owed of `message`, at log `offset`, `now_ms`
    /// being the wall clock at `now`.
    pub fn delivery(
        &self,
        message: &Arc<Message>,
        offset: u64,
        (now, now_ms): (Instant, u64),
    ) -> Option<Delivery> {
        Some(Delivery {
            message: message.clone(),
            qos: QoS::from_bits(self.qos)?,
            retain: self.retain,
            identifiers: self.identifiers.as_slice().into(),
            record: Some((None, offset)),
            held: (self.group.as_deref())
                .or(self.held_until_ms.map(|_| ""))
                .map(|group| {
                    Box::new(Held {
                        group: Arc::from(group),
                        until: self
                            .held_until_ms
                            .map(|at| now + Duration::from_millis(at.saturating_sub(now_ms))),
                    })
                }),
            resent: false,
            untracked: Untracked::No,
        })
    }
}

/// The record `pending` is written as.
pub fn record(pending: &Pending, now_ms: u64) -> NewRecord {
    let m = &pending.message;
    let p = &m.properties;
    let now = Instant::now();
    let owed = Owed {
        qos: m.qos as u8,
        retain: m.retain,
        publisher: m.publisher.to_string(),
        to: pending
            .owed
            .iter()
            .map(|(client, incarnation, d)| Target {
                client_id: client.to_string(),
                incarnation: Some(*incarnation),
                qos: d.qos as u8,
                retain: d.retain,
                identifiers: d.identifiers.to_vec(),
                held_until_ms: d.held.as_ref().and_then(|h| h.until).map(|at| {
                    let left = at.saturating_duration_since(now).as_millis();
                    now_ms.saturating_add(u64::try_from(left).unwrap_or(u64::MAX))
                }),
                group: d.held.as_ref().map(|h| h.group.to_string()),
            })
            .collect(),
    };
    let mut user_properties = p.user_properties.clone();
    // Strings, integers and vectors: serializing them cannot fail.
    user_properties.push((
        OWED.into(),
        serde_json::to_string(&owed).unwrap_or_default(),
    ));
    NewRecord {
        // Never delivered: a broadcast's own `saguin-id`, if any, is among its
        // User Properties.
        message_id: String::new(),
        timestamp_ms: now_ms,
        topic: m.topic.to_string(),
        payload: m.payload.to_vec(),
        properties: RecordProperties {
            payload_format_indicator: p.payload_format_indicator,
            // What is left of it now, counted from the record's timestamp.
            message_expiry_interval: m.expires_at.map(|at| {
                let left = at.saturating_duration_since(Instant::now()).as_millis();
                u32::try_from(left.div_ceil(1000)).unwrap_or(u32::MAX)
            }),
            content_type: p.content_type.clone(),
            response_topic: p.response_topic.clone(),
            correlation_data: p.correlation_data.clone(),
            user_properties,
        },
    }
}

/// A logged record read back.
///
/// # Errors
/// What is wrong with it, for the log line that skips it.
pub fn decode(record: Record, now_ms: u64) -> Result<Entry, String> {
    let p = record.properties;
    let mut user_properties = p.user_properties;
    let at = user_properties
        .iter()
        .rposition(|(k, _)| k == OWED)
        .ok_or("no list of sessions owed it")?;
    let owed: Owed =
        serde_json::from_str(&user_properties.remove(at).1).map_err(|e| e.to_string())?;
    let qos = QoS::from_bits(owed.qos).ok_or_else(|| format!("QoS {}", owed.qos))?;
    let expires_at = p.message_expiry_interval.map(|seconds| {
        let at_ms = record
            .timestamp_ms
            .saturating_add(u64::from(seconds) * 1000);
        // One that ran out while the broker was stopped is due now, and dropped
        // unsent, settled, when its turn comes.
        Instant::now() + Duration::from_millis(at_ms.saturating_sub(now_ms))
    });
    let properties = RecordProperties {
        user_properties,
        ..p
    };
    let message = super::records::stored_message(
        record.topic,
        record.payload,
        properties,
        (qos, owed.retain),
        Arc::from(owed.publisher),
        expires_at,
    );
    Ok(Entry {
        offset: record.offset,
        message: Arc::new(message),
        targets: owed.to,
    })
}

/// Opens the log on `provider` and reads every record it holds, in offset order; a
/// damaged one is logged and skipped (and left for the first housekeeping to delete,
/// since no session is handed it).
///
/// # Errors
/// The provider refused the channel or could not be read.
pub async fn open(provider: &Provider, now_ms: u64) -> Result<Vec<Entry>, String> {
    let settings = ChannelSettings {
        kind: ChannelKind::Queue {
            job_expires_after: None,
        },
        max_bytes: None,
        retention: Retention::default(),
    };
    let failed = |e| format!("broker.session.storage: the broadcast log: {e}");
    provider
        .open_channel(CHANNEL, settings)
        .await
        .map_err(failed)?;
    let mut entries = Vec::new();
    let read = provider.scan_stored(CHANNEL, |record| {
        let offset = record.offset;
        match decode(record, now_ms) {
            Ok(entry) => entries.push(entry),
            Err(why) => log::error!(
                "storage provider {}: broadcast log record {offset} is damaged and skipped: \
                 {why}",
                provider.name()
            ),
        }
    });
    read.await.map_err(failed)?;
    Ok(entries)
}

/// What a full provider cost the sessions since the last warning (B-474): logged at
/// most every [`Losses::EVERY`], with the totals since the one before.
#[derive(Debug, Default)]
pub struct Losses {
    /// Messages given up or not kept.
    messages: u64,
    /// Deliveries lost, one per session per message.
    deliveries: u64,
    /// The sessions that lost any; bounded by the sessions the broker holds.
    sessions: std::collections::HashSet<Arc<str>>,
    /// When the last warning was logged.
    warned_at: Option<Instant>,
}

impl Losses {
    /// The least time between two warnings.
    pub const EVERY: Duration = Duration::from_secs(10);

    /// One message lost by `sessions`.
    pub fn note<'a>(&mut self, sessions: impl IntoIterator<Item = &'a Arc<str>>) {
        self.messages += 1;
        for session in sessions {
            self.deliveries += 1;
            if !self.sessions.contains(session) {
                self.sessions.insert(session.clone());
            }
        }
    }

    /// Logs the totals since the last warning if there are any and the last was at
    /// least [`Losses::EVERY`] ago.
    pub fn warn_if_due(&mut self, provider: &str, now: Instant) {
        if self.messages == 0 || self.warned_at.is_some_and(|at| now < at + Self::EVERY) {
            return;
        }
        log::warn!(
            "broadcast log on storage provider {provider} is full: {} messages owed to \
             sessions that outlive their connection were given up or not kept ({} sessions, \
             {} deliveries lost) since the last warning; give broker.session.storage a \
             provider of its own, or a larger max_bytes",
            self.messages,
            self.sessions.len(),
            self.deliveries
        );
        *self = Losses {
            warned_at: Some(now),
            ..Losses::default()
        };
    }
}

/// A session's place in the broadcast log.
#[derive(Debug, Default)]
pub struct LogCursor {
    /// Logged offsets queued or on the wire and not yet settled.
    pub unsettled: BTreeSet<u64>,
    /// One past the highest offset the session was handed.
    pub next: u64,
    /// The position last written to the provider.
    pub stored: Option<u64>,
    /// Logged offsets written to the wire at or above the stored position: at most
    /// the Receive Maximum (B-459).
    pub sent: BTreeSet<u64>,
    /// Offsets settled or given up since the broker last counted them.
    pub released: Vec<u64>,
}

impl LogCursor {
    /// A cursor restored at its stored `position`.
    pub fn restored(position: u64) -> LogCursor {
        LogCursor {
            next: position,
            stored: Some(position),
            ..LogCursor::default()
        }
    }

    /// The position: the lowest offset the session has not settled.
    pub fn position(&self) -> u64 {
        self.unsettled.first().copied().unwrap_or(self.next)
    }

    /// Whether the position moved since it was last stored.
    pub fn dirty(&self) -> bool {
        self.stored != Some(self.position())
    }

    /// `offset` is owed to the session.
    pub fn hand(&mut self, offset: u64) {
        self.unsettled.insert(offset);
        self.next = self.next.max(offset + 1);
    }

    /// `offset` was settled or given up.
    pub fn settle(&mut self, offset: u64) {
        if self.unsettled.remove(&offset) {
            self.released.push(offset);
        }
    }

    /// The position `position` was written.
    pub fn stored_at(&mut self, position: u64) {
        self.stored = Some(position);
        self.sent = self.sent.split_off(&position);
    }

    /// Whether logged delivery `offset` may go on the wire (B-459). One below every
    /// offset sent always may: a shared group's backlog collected after newer
    /// records went out holds the position below them, and the window, counting
    /// them until the position passes them, would otherwise never open again.
    pub fn window_open(&self, receive_maximum: u16, offset: u64) -> bool {
        self.sent.len() < usize::from(receive_maximum)
            || self.sent.first().is_some_and(|&lowest| offset < lowest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Properties, PropertyValues};

    fn message() -> Arc<Message> {
        Arc::new(Message {
            topic: Arc::from("a/b"),
            payload: vec![1, 2, 3].into(),
            qos: QoS::ExactlyOnce,
            retain: true,
            properties: Properties::from(PropertyValues {
                user_properties: vec![("k".into(), "v".into())],
                correlation_data: Some(vec![9]),
                ..PropertyValues::default()
            }),
            publisher: Arc::from("pub"),
            expires_at: None,
        })
    }

    #[test]
    fn a_logged_message_reads_back_with_who_is_owed_it() {
        let message = message();
        let delivery = Target {
            client_id: "s".into(),
            qos: 1,
            retain: false,
            identifiers: vec![7],
            incarnation: Some(9),
            held_until_ms: Some(61_000),
            group: Some("g/a/+".into()),
        }
        .delivery(&message, 0, (Instant::now(), 1000))
        .expect("QoS 1");
        let pending = Pending {
            message: message.clone(),
            owed: vec![(Arc::from("s"), 9, delivery)],
        };
        let new = record(&pending, 1000);
        let stored = Record {
            offset: 4,
            message_id: new.message_id,
            timestamp_ms: new.timestamp_ms,
            topic: new.topic,
            payload: new.payload,
            properties: new.properties,
            state: crate::storage::RecordState::Stored,
        };
        let entry = decode(stored, 1000).expect("decodes");
        assert_eq!(entry.offset, 4);
        assert_eq!(&*entry.message.topic, "a/b");
        assert_eq!(entry.message.qos, QoS::ExactlyOnce);
        assert!(entry.message.retain);
        assert_eq!(&*entry.message.publisher, "pub");
        assert_eq!(
            entry.message.properties.user_properties,
            [("k".to_string(), "v".to_string())]
        );
        assert_eq!(entry.targets.len(), 1);
        assert_eq!(
            entry.targets[0].incarnation,
            Some(9),
            "whose session it was"
        );
        let now = Instant::now();
        let d = entry.targets[0]
            .delivery(&entry.message, 4, (now, 1000))
            .expect("QoS 1");
        let held = d.held.as_ref().expect("held for a group");
        assert_eq!(&*held.group, "g/a/+");
        let left = held.until.map(|at| at.duration_since(now).as_secs());
        assert!(matches!(left, Some(59 | 60)), "{left:?}");
        assert_eq!(
            (d.qos, &*d.identifiers, d.logged()),
            (QoS::AtLeastOnce, &[7][..], Some(4))
        );
    }

    #[test]
    fn a_damaged_record_is_an_error_not_a_panic() {
        for value in [
            "",
            "{",
            "null",
            "{\"qos\":7,\"retain\":false,\"publisher\":\"\",\"to\":[]}",
        ] {
            let record = Record {
                offset: 0,
                message_id: String::new(),
                timestamp_ms: 0,
                topic: "t".into(),
                payload: Vec::new(),
                properties: RecordProperties {
                    user_properties: vec![(OWED.into(), value.into())],
                    ..RecordProperties::default()
                },
                state: crate::storage::RecordState::Stored,
            };
            assert!(decode(record, 0).is_err(), "{value:?}");
        }
    }

    #[test]
    fn the_position_is_the_lowest_unsettled_and_the_window_counts_what_was_sent() {
        let mut c = LogCursor::restored(3);
        assert!(!c.dirty());
        c.hand(5);
        c.hand(6);
        assert_eq!(c.position(), 5);
        c.sent.extend([5, 6]);
        assert!(!c.window_open(2, 7));
        c.settle(5);
        assert_eq!((c.position(), c.released.as_slice()), (6, &[5][..]));
        c.stored_at(6);
        assert!(c.window_open(2, 7) && !c.dirty());
        c.settle(6);
        assert_eq!(c.position(), 7);
    }

    #[test]
    fn an_offset_below_everything_sent_may_go_out_though_the_window_is_full() {
        // A group's backlog collected after 6 and 7 went out and were settled: the
        // position falls to 5, and 6 and 7 stay counted until it passes them.
        let mut c = LogCursor::restored(6);
        c.hand(6);
        c.hand(7);
        c.sent.extend([6, 7]);
        c.settle(6);
        c.settle(7);
        c.hand(5);
        c.stored_at(c.position());
        assert_eq!(c.position(), 5);
        assert!(c.window_open(2, 5), "5 would never go out");
        assert!(!c.window_open(2, 8));
    }
}
