//! A persistent session's record, as the provider `broker.session.storage` names
//! keeps it (B-454, B-455, B-460; gaps G-10 "State").
//!
//! What is kept: the client id, the name its door proved when an acl_file is held
//! (so the restored session is asked as the same client, B-290), the protocol, the
//! granted Session Expiry Interval,
//! every subscription (filter, share name, options, Subscription Identifier, the
//! `saguin-filter` slice), the armed Will with its due moment once it waits out a
//! delay, and, while the session is away, the wall-clock moment its connection ended.
//! What it is owed of broadcast is in the broadcast log (`super::broadcast_log`), beside it;
//! its channel positions are in the channels' providers.
//!
//! The record is JSON (serde_json), opaque to the provider. Only sessions that outlive
//! their connection are written, and only at CONNECT, SUBSCRIBE, UNSUBSCRIBE and the
//! end of a connection: never per message. A record is bounded by what the limits
//! bound already: `max_subscriptions` filters of `max_topic_length`, and a Will of at
//! most `max_message_size`.

use serde::{Deserialize, Serialize};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::codec::{
    Properties, PropertyValues, ProtocolVersion, QoS, RetainHandling, SubscriptionOptions, Will,
};

use super::partition::Slice;
use super::session::{ArmedWill, Session, Subscription};

/// The version of the record's shape; a record of another is skipped, logged.
const VERSION: u32 = 1;
/// What any session is charged before its client id, filters and Will (B-465).
const SESSION_CHARGE: usize = 3_500;

/// A record as written: its text, and its charge (B-465).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// The JSON the provider keeps, opaque to it.
    pub text: String,
    /// What it counts against a memory provider's `max_bytes`.
    pub charge: u64,
}

/// One session's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The shape's version ([`VERSION`]).
    pub version: u32,
    /// The client identifier.
    pub client_id: String,
    /// The name its door proved (empty: anonymous); absent in a record written before
    /// the name was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The protocol level of the connection that last held it (4 or 5).
    pub protocol: u8,
    /// The granted Session Expiry Interval, seconds (`u32::MAX` never expires).
    pub expiry: u32,
    /// Its subscriptions.
    pub subscriptions: Vec<StoredSubscription>,
    /// Its armed Will.
    pub will: Option<StoredWill>,
    /// When its last connection ended (ms since the epoch); `None` while connected.
    pub away_ms: Option<u64>,
    /// The Receive Maximum of its last connection: how many of what it is owed from
    /// the broadcast log may have been on the wire at a stop (B-459). Absent in
    /// records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive_maximum: Option<u16>,
    /// Which session of its client id this is (`Session::incarnation`); absent in
    /// records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
}

/// One subscription of a stored session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredSubscription {
    /// The filter, without any `$share/<name>/` prefix.
    pub filter: String,
    /// The share name of a shared subscription.
    pub share: Option<String>,
    /// Maximum QoS granted.
    pub qos: u8,
    /// No Local.
    pub no_local: bool,
    /// Retain As Published.
    pub retain_as_published: bool,
    /// Retain Handling (0, 1 or 2).
    pub retain_handling: u8,
    /// Subscription Identifier.
    pub identifier: Option<u32>,
    /// The declared slice: partition count and indices.
    pub slice: Option<(u32, Vec<u32>)>,
}

/// A stored Will.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredWill {
    /// Will Topic.
    pub topic: String,
    /// Will Payload, base64.
    pub payload: String,
    /// Will QoS.
    pub qos: u8,
    /// Will Retain.
    pub retain: bool,
    /// Will Delay Interval, seconds.
    pub delay: u32,
    /// When it is due (ms since the epoch), once its connection ended and it waits
    /// out its delay (C-278); `None` while connected, or for a Will whose connection
    /// the broker's stop cut (C-282).
    pub due_ms: Option<u64>,
    /// Payload Format Indicator.
    pub payload_format: Option<u8>,
    /// Message Expiry Interval.
    pub message_expiry: Option<u32>,
    /// Content Type.
    pub content_type: Option<String>,
    /// Response Topic.
    pub response_topic: Option<String>,
    /// Correlation Data, base64.
    pub correlation_data: Option<String>,
    /// User Properties.
    pub user_properties: Vec<(String, String)>,
}

/// A record read back, turned into what the broker holds.
#[derive(Debug)]
pub struct Restored {
    /// The client identifier.
    pub client_id: String,
    /// The name its door proved, when the record kept one.
    pub user: Option<String>,
    /// The protocol of its last connection.
    pub protocol: ProtocolVersion,
    /// Granted Session Expiry Interval.
    pub expiry: u32,
    /// Its subscriptions.
    pub subscriptions: Vec<Subscription>,
    /// Its Will and when it is due, if it is waiting out a delay.
    pub will: Option<(ArmedWill, Option<u64>)>,
    /// When its last connection ended; `None` when the broker stopped while it was
    /// connected and could not say (a crash).
    pub away_ms: Option<u64>,
    /// The Receive Maximum of its last connection.
    pub receive_maximum: u16,
    /// Its stored position in the broadcast log (`super::broadcast_log`), read beside the
    /// record; `None` when it never stored one.
    pub log_position: Option<u64>,
    /// Which session of its client id it is, when the record says.
    pub incarnation: Option<u64>,
}

impl SessionRecord {
    /// The record of `session`, away since `away_ms`, its Will due at `will_due_ms`.
    pub fn of(session: &Session, away_ms: Option<u64>, will_due_ms: Option<u64>) -> SessionRecord {
        let mut subscriptions: Vec<StoredSubscription> = session
            .subscriptions
            .values()
            .map(StoredSubscription::of)
            .collect();
        subscriptions.sort_by(|a, b| (&a.share, &a.filter).cmp(&(&b.share, &b.filter)));
        SessionRecord {
            version: VERSION,
            client_id: session.client_id.to_string(),
            user: session.user.as_deref().map(str::to_string),
            protocol: session.protocol.level(),
            expiry: session.expiry,
            subscriptions,
            will: session
                .will
                .as_ref()
                .map(|w| StoredWill::of(w, will_due_ms)),
            away_ms,
            receive_maximum: Some(session.receive_maximum),
            incarnation: Some(session.incarnation),
        }
    }

    /// The record as stored, with its charge.
    pub fn encode(&self) -> Encoded {
        Encoded {
            // Plain strings, integers and vectors: serializing them cannot fail.
            text: serde_json::to_string(self).unwrap_or_default(),
            charge: self.charge(),
        }
    }

    /// What the session is charged against a memory provider's `max_bytes`: the
    /// memory the broker holds for it while its client is away (B-465, RFC 0002
    /// "Every session's state"): 3,500 bytes and its client id; for each filter 800
    /// bytes, 400 more if shared, 600 for each level after its first, and its length;
    /// and its Will's topic, payload and properties.
    pub fn charge(&self) -> u64 {
        let filters: usize = self
            .subscriptions
            .iter()
            .map(|s| filter_charge(&s.filter, s.share.as_deref()) as usize)
            .sum();
        let will = self.will.as_ref().map_or(0, |w| {
            // Base64 keeps three bytes in four characters.
            let bytes = |b64: &str| b64.len() / 4 * 3;
            w.topic.len()
                + bytes(&w.payload)
                + w.content_type.as_ref().map_or(0, String::len)
                + w.response_topic.as_ref().map_or(0, String::len)
                + w.correlation_data.as_deref().map_or(0, bytes)
                + w.user_properties
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
        });
        (SESSION_CHARGE + self.client_id.len() + filters + will) as u64
    }

    /// A stored record read back and checked, under the client id it was stored as.
    ///
    /// # Errors
    /// What is wrong with it, for the log line that skips it.
    pub fn decode(client_id: &str, text: &str) -> Result<Restored, String> {
        let record: SessionRecord = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if record.version != VERSION {
            return Err(format!(
                "record version {} is not {VERSION}",
                record.version
            ));
        }
        if record.client_id != client_id {
            return Err(format!(
                "stored under {client_id:?} but names {:?}",
                record.client_id
            ));
        }
        let protocol = match record.protocol {
            4 => ProtocolVersion::V311,
            5 => ProtocolVersion::V5,
            other => return Err(format!("protocol level {other}")),
        };
        let subscriptions = record
            .subscriptions
            .into_iter()
            .map(StoredSubscription::restore)
            .collect::<Result<Vec<_>, _>>()?;
        let will = record.will.map(StoredWill::restore).transpose()?;
        Ok(Restored {
            client_id: record.client_id,
            user: record.user,
            protocol,
            expiry: record.expiry,
            subscriptions,
            will,
            away_ms: record.away_ms,
            receive_maximum: record.receive_maximum.unwrap_or(u16::MAX),
            log_position: None,
            incarnation: record.incarnation,
        })
    }
}

/// What one filter is charged (B-465): 800 bytes, 400 more if shared, 600 for each
/// level after its first, and its length as the client spelled it.
pub fn filter_charge(filter: &str, share: Option<&str>) -> u64 {
    let levels = filter.split('/').count();
    let shared = share.map_or(0, |name| 400 + "$share//".len() + name.len());
    (800 + shared + 600 * levels.saturating_sub(1) + filter.len()) as u64
}

fn qos(bits: u8, what: &str) -> Result<QoS, String> {
    QoS::from_bits(bits).ok_or_else(|| format!("{what} QoS {bits}"))
}

impl StoredSubscription {
    fn of(sub: &Subscription) -> StoredSubscription {
        StoredSubscription {
            filter: sub.filter.clone(),
            share: sub.share.clone(),
            qos: sub.options.qos as u8,
            no_local: sub.options.no_local,
            retain_as_published: sub.options.retain_as_published,
            retain_handling: sub.options.retain_handling as u8,
            identifier: sub.identifier,
            slice: sub
                .slice
                .as_ref()
                .map(|s| (s.partitions(), s.indices().to_vec())),
        }
    }

    fn restore(self) -> Result<Subscription, String> {
        let retain_handling = match self.retain_handling {
            0 => RetainHandling::OnSubscribe,
            1 => RetainHandling::OnNewSubscribe,
            2 => RetainHandling::Never,
            other => return Err(format!("{:?}: Retain Handling {other}", self.filter)),
        };
        let slice = match self.slice {
            None => None,
            Some((partitions, indices)) => Some(
                Slice::from_parts(partitions, indices)
                    .ok_or_else(|| format!("{:?}: a slice that is no slice", self.filter))?,
            ),
        };
        if self.filter.is_empty() {
            return Err("an empty filter".to_string());
        }
        Ok(Subscription {
            options: SubscriptionOptions {
                qos: qos(self.qos, &self.filter)?,
                no_local: self.no_local,
                retain_as_published: self.retain_as_published,
                retain_handling,
            },
            filter: self.filter,
            share: self.share,
            identifier: self.identifier,
            slice,
        })
    }
}

impl StoredWill {
    fn of(armed: &ArmedWill, due_ms: Option<u64>) -> StoredWill {
        let w = &armed.will;
        let p = &w.properties;
        StoredWill {
            topic: w.topic.clone(),
            payload: STANDARD.encode(&w.payload),
            qos: w.qos as u8,
            retain: w.retain,
            delay: armed.delay,
            due_ms,
            payload_format: p.payload_format_indicator,
            message_expiry: p.message_expiry_interval,
            content_type: p.content_type.clone(),
            response_topic: p.response_topic.clone(),
            correlation_data: p.correlation_data.as_ref().map(|c| STANDARD.encode(c)),
            user_properties: p.user_properties.clone(),
        }
    }

    fn restore(self) -> Result<(ArmedWill, Option<u64>), String> {
        let bytes = |field: &str, text: &str| {
            STANDARD
                .decode(text)
                .map_err(|e| format!("the Will's {field}: {e}"))
        };
        let properties = Properties::from(PropertyValues {
            payload_format_indicator: self.payload_format,
            message_expiry_interval: self.message_expiry,
            content_type: self.content_type,
            response_topic: self.response_topic,
            correlation_data: self
                .correlation_data
                .map(|c| bytes("correlation data", &c))
                .transpose()?,
            user_properties: self.user_properties,
            will_delay_interval: (self.delay > 0).then_some(self.delay),
            ..PropertyValues::default()
        });
        let will = Will {
            payload: bytes("payload", &self.payload)?,
            qos: qos(self.qos, "the Will's")?,
            retain: self.retain,
            topic: self.topic,
            properties,
        };
        let armed = ArmedWill {
            will,
            delay: self.delay,
            // Given by `Broker::restore`, which holds the acl_file (B-290).
            asker: None,
        };
        Ok((armed, self.due_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_record_reads_back_as_it_was_written() {
        let mut session = Session::new(Arc::from("dev-1"), ProtocolVersion::V5, 1024);
        session.expiry = 300;
        session.subscriptions.insert(Subscription {
            filter: "a/+".into(),
            share: None,
            options: SubscriptionOptions::with_qos(QoS::AtLeastOnce),
            identifier: Some(7),
            slice: Slice::from_parts(4, vec![1, 3]),
        });
        let properties = Properties::from(PropertyValues {
            correlation_data: Some(vec![0, 255]),
            user_properties: vec![("k".into(), "v".into())],
            ..PropertyValues::default()
        });
        session.will = Some(Box::new(ArmedWill {
            will: Will {
                topic: "gone/dev-1".into(),
                payload: vec![1, 2, 3],
                qos: QoS::AtLeastOnce,
                retain: true,
                properties,
            },
            delay: 30,
            asker: None,
        }));
        let text = SessionRecord::of(&session, Some(5), Some(35)).encode().text;
        let back = SessionRecord::decode("dev-1", &text).expect("decodes");
        assert_eq!(back.expiry, 300);
        assert_eq!(back.away_ms, Some(5));
        assert_eq!(back.subscriptions.len(), 1);
        assert_eq!(
            Some(&back.subscriptions[0]),
            session.subscriptions.get("a/+")
        );
        let (will, due) = back.will.expect("a Will");
        assert_eq!(due, Some(35));
        assert_eq!(will.will.payload, vec![1, 2, 3]);
        assert_eq!(will.will.properties.correlation_data, Some(vec![0, 255]));
        assert_eq!(will.delay, 30);
    }

    #[test]
    fn a_session_is_charged_as_rfc_0002_counts_it_b465() {
        let mut session = Session::new(Arc::from("dev"), ProtocolVersion::V5, 1024);
        session.expiry = 60;
        assert_eq!(SessionRecord::of(&session, None, None).charge(), 3_503);
        let sub = |filter: &str, share: Option<&str>| Subscription {
            filter: filter.into(),
            share: share.map(String::from),
            options: SubscriptionOptions::with_qos(QoS::AtLeastOnce),
            identifier: None,
            slice: None,
        };
        session.subscriptions.insert(sub("a/b/c", None));
        session.subscriptions.insert(sub("x", Some("g")));
        let with_filters = 3_503 + (800 + 2 * 600 + 5) + (800 + 400 + 9 + 1);
        assert_eq!(
            SessionRecord::of(&session, None, None).charge(),
            with_filters
        );
        session.will = Some(Box::new(ArmedWill {
            will: Will {
                topic: "gone".into(),
                payload: vec![0; 30],
                qos: QoS::AtMostOnce,
                retain: false,
                properties: Properties::from(PropertyValues {
                    user_properties: vec![("k".into(), "vv".into())],
                    ..PropertyValues::default()
                }),
            },
            delay: 0,
            asker: None,
        }));
        let charge = SessionRecord::of(&session, None, None).charge();
        assert_eq!(charge, with_filters + 4 + 30 + 3);
    }

    #[test]
    fn a_damaged_record_is_an_error_not_a_panic() {
        for text in ["", "{", "null", "{\"version\":1}", "[1,2]"] {
            assert!(SessionRecord::decode("x", text).is_err(), "{text:?}");
        }
        let mut session = Session::new(Arc::from("x"), ProtocolVersion::V311, 1);
        session.expiry = 1;
        let text = SessionRecord::of(&session, None, None).encode().text;
        assert!(SessionRecord::decode("y", &text).is_err(), "another id");
        let bad = text.replace("\"protocol\":4", "\"protocol\":9");
        assert!(SessionRecord::decode("x", &bad).is_err(), "protocol 9");
    }
}
