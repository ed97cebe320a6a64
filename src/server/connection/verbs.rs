//! The verbs Sagüin defines under `$saguin/`: a point read of a latest channel
//! (`$saguin/kv/get`), a consumer's seek (`$saguin/consumer/<channel>/seek`), a
//! channel's catalogue entry, and an operator's hang-up (`$saguin/sessions/disconnect`).
//! Each is a publish answered on its PUBACK, with the answer written to this
//! connection alone, never routed (gaps G-01, G-18).

use std::sync::Arc;

use super::Conn;
use crate::broker::channels::{ChannelId, Kind};
use crate::broker::records::{self, now_ms};
use crate::broker::topic;
use crate::codec::{Packet, Properties, PropertyValues, ProtocolVersion, Publish, QoS, reason};
use crate::storage::RecordState;

/// The point-read topic.
pub const KV_GET: &str = "$saguin/kv/get";
/// The hang-up topic (RFC 0002 "Hanging up a client").
pub const SESSIONS_DISCONNECT: &str = "$saguin/sessions/disconnect";

/// A verb a publish names, if its topic is one.
pub(super) enum Verb {
    /// `$saguin/kv/get`.
    PointRead,
    /// `$saguin/consumer/<channel>/seek`.
    Seek(String),
    /// `$saguin/catalogue/<channel>`; `None` when the name held a `/`.
    Catalogue(Option<String>),
    /// `$saguin/sessions/disconnect`.
    HangUp,
}

impl Verb {
    /// Whether only a PUBACK can carry this verb's refusals, so that at QoS 0 it is
    /// dropped unread (C-005, B-327). A hang-up at QoS 0 is acted on (B-301).
    pub(super) fn needs_acknowledgement(&self) -> bool {
        matches!(self, Verb::PointRead | Verb::Catalogue(_))
    }

    /// The verb `topic_name` names.
    pub(super) fn of(topic_name: &str) -> Option<Verb> {
        if topic_name == KV_GET {
            return Some(Verb::PointRead);
        }
        if topic_name == SESSIONS_DISCONNECT {
            return Some(Verb::HangUp);
        }
        if let Some(name) = topic_name.strip_prefix("$saguin/catalogue/") {
            return Some(Verb::Catalogue(
                (!name.is_empty() && !name.contains('/')).then(|| name.to_string()),
            ));
        }
        let channel = topic_name
            .strip_prefix("$saguin/consumer/")?
            .strip_suffix("/seek")?;
        (!channel.is_empty() && !channel.contains('/')).then(|| Verb::Seek(channel.to_string()))
    }
}

pub(super) use crate::routing::is_seek_reply;

impl Conn {
    /// Performs a verb and returns the PUBACK code; the answer, if any, is queued
    /// after the acknowledgement by the caller's `reply`.
    pub(super) async fn perform(&mut self, verb: Verb, publish: &Publish) -> (u8, Option<Publish>) {
        // Nothing is delivered under `$saguin/` but a queue's offers and a seek's
        // reply: an answer aimed anywhere else there is refused unperformed.
        if let Some(topic) = &publish.properties.response_topic
            && topic.starts_with("$saguin/")
            && !is_seek_reply(topic)
        {
            self.puback_reason = Some(
                format!("Response Topic {topic:?} is reserved: name a topic of your own").into(),
            );
            return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
        }
        match verb {
            Verb::PointRead => self.point_read(publish).await,
            Verb::Seek(channel) => self.seek(&channel, publish).await,
            Verb::Catalogue(name) => self.catalogue(name.as_deref(), publish),
            Verb::HangUp => self.hang_up(publish),
        }
    }

    /// `$saguin/sessions/disconnect`: ends the connection of the client whose id is
    /// the payload, with DISCONNECT 0x98 on MQTT 5 (B-296..B-307). Only the
    /// connection ends: the session stays, its queue jobs go back at once, and the
    /// reply never waits on the target's socket. With no acl_file every
    /// authenticated client holds `disconnect` (B-306).
    fn hang_up(&self, publish: &Publish) -> (u8, Option<Publish>) {
        let Some(response_topic) = &publish.properties.response_topic else {
            return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None); // B-300
        };
        if !self.may_disconnect() {
            return (reason::NOT_AUTHORIZED, None); // B-297
        }
        let target = String::from_utf8_lossy(&publish.payload);
        if target.is_empty() || *target == *self.client_id {
            return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
        }
        let holder = self.shared.broker.borrow().holder(&target);
        let word = match holder {
            Some(link) => {
                log::info!(
                    "{}: {} hung up {target:?} ($saguin/sessions/disconnect)",
                    self.peer,
                    self.client_id
                );
                link.kick(reason::ADMINISTRATIVE_ACTION);
                "hung-up"
            }
            None => "no-such-client",
        };
        let properties = Properties::from(PropertyValues {
            correlation_data: publish.properties.correlation_data.clone(),
            ..PropertyValues::default()
        });
        (
            reason::SUCCESS,
            Some(answer(
                response_topic,
                Arc::from(word.as_bytes()),
                properties,
            )),
        )
    }

    /// `$saguin/catalogue/<channel>`: what the channel is, as JSON, for a client
    /// composing topics (RFC 0002 "Asking what a channel is"). With no acl_file every
    /// client holds every verb; a channel that does not exist is the empty reply.
    fn catalogue(&self, name: Option<&str>, publish: &Publish) -> (u8, Option<Publish>) {
        let Some(name) = name else {
            return (reason::TOPIC_NAME_INVALID, None);
        };
        let Some(response_topic) = &publish.properties.response_topic else {
            return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
        };
        let body = {
            let broker = self.shared.broker.borrow();
            broker.channels.by_name(name).and_then(|id| {
                let channel = broker.channels.get(id);
                let verbs: &[&str] = match channel.kind {
                    Kind::Append { .. } => &["write", "read", "seek"],
                    Kind::Latest => &["write", "read", "delete"],
                    Kind::Queue => &["write", "consume"],
                    Kind::DeadLetter => &["read", "seek"],
                };
                // Scoped to the verbs held: holding none is the empty reply (B-324).
                let verbs = self.verbs_held(name, verbs);
                if verbs.is_empty() {
                    return None;
                }
                let mut answer = serde_json::json!({
                    "name": name,
                    "type": channel.kind.as_str(),
                    "filter": &*channel.filter,
                    "verbs": verbs,
                });
                if channel.kind == Kind::Queue {
                    answer["pin"] = serde_json::Value::from(format!("$saguin/queue/{name}"));
                }
                Some(answer.to_string())
            })
        };
        let properties = Properties::from(PropertyValues {
            correlation_data: publish.properties.correlation_data.clone(),
            ..PropertyValues::default()
        });
        let payload: Arc<[u8]> = Arc::from(body.unwrap_or_default().as_bytes());
        (
            reason::SUCCESS,
            Some(answer(response_topic, payload, properties)),
        )
    }

    /// A point read refused with `code`, its Reason String saying `why`.
    fn read_refused(&mut self, code: u8, why: impl Into<Box<str>>) -> (u8, Option<Publish>) {
        self.puback_reason = Some(why.into());
        (code, None)
    }

    /// `$saguin/kv/get`: the payload is the key; the value goes to the Response Topic.
    /// Each refusal says why in its PUBACK's Reason String (A-055, gaps G-01).
    async fn point_read(&mut self, publish: &Publish) -> (u8, Option<Publish>) {
        let Some(response_topic) = publish.properties.response_topic.clone() else {
            return self.read_refused(
                reason::IMPLEMENTATION_SPECIFIC_ERROR,
                "no Response Topic to answer on",
            );
        };
        let Ok(key) = std::str::from_utf8(&publish.payload) else {
            return self.read_refused(reason::TOPIC_NAME_INVALID, "the key is not UTF-8");
        };
        if key.is_empty() {
            return self.read_refused(reason::IMPLEMENTATION_SPECIFIC_ERROR, "the key is empty");
        }
        let settings = &self.shared.settings;
        if key.len() > settings.max_topic_length
            || topic::level_count(key) > settings.max_topic_levels
            || crate::codec::has_wildcard(key)
            || key.starts_with('$')
            || key.contains('\0')
        {
            let why = format!(
                "{key:?} is not a topic a latest channel can hold: a wildcard, a leading $, U+0000, or past max_topic_length or max_topic_levels"
            );
            return self.read_refused(reason::TOPIC_NAME_INVALID, why);
        }
        let Some(id) = self.latest_channel_of(key) else {
            return self.read_refused(
                reason::TOPIC_NAME_INVALID,
                format!("{key:?} names no latest channel"),
            );
        };
        if !self.may_read_key(key) {
            // read on the latest channel (B-282)
            return self.read_refused(
                reason::NOT_AUTHORIZED,
                format!("not authorized: no read on {key:?}"),
            );
        }
        let (provider, name) = self.store_of(id);
        let max_age = self.shared.broker.borrow().channels.get(id).max_age;
        let now = now_ms();
        let found = match provider.latest(&name, key).await {
            Ok(found) => {
                found.filter(|r| matches!(r.state, RecordState::Stored) && !max_age.passed(r, now))
            }
            Err(e) => {
                self.read_failed(&name, &e);
                return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
            }
        };
        // The reply names its request: its Correlation Data, or else the key (C-007).
        let correlation = Some(
            publish
                .properties
                .correlation_data
                .clone()
                .unwrap_or_else(|| key.as_bytes().to_vec()),
        );
        let reply = match found {
            Some(record) => {
                let message = records::from_record(record, QoS::AtMostOnce, now);
                let mut properties = message.properties.clone();
                properties.edit().correlation_data = correlation;
                if let Some(p) = properties.present_mut() {
                    p.response_topic = None;
                }
                answer(&response_topic, message.payload.clone(), properties)
            }
            None => {
                let properties = Properties::from(PropertyValues {
                    correlation_data: correlation,
                    ..PropertyValues::default()
                });
                answer(&response_topic, Arc::from(&b""[..]), properties)
            }
        };
        (reason::SUCCESS, Some(reply))
    }

    fn latest_channel_of(&self, key: &str) -> Option<ChannelId> {
        let broker = self.shared.broker.borrow();
        let id = broker.channels.resolve(key)?;
        (broker.channels.get(id).kind == Kind::Latest).then_some(id)
    }

    /// Channel `id`'s provider and name, for a verb to ask its store.
    fn store_of(&self, id: ChannelId) -> (Arc<crate::storage::Provider>, Arc<str>) {
        let broker = self.shared.broker.borrow();
        let channel = broker.channels.get(id);
        (channel.provider.clone(), channel.name.clone())
    }

    /// A verb's read of `channel` failed: logged and counted (B-462).
    fn read_failed(&self, channel: &str, e: &crate::storage::StorageError) {
        log::error!("channel {channel}: read failed: {e}");
        self.shared.broker.borrow().metrics.storage_failed(e);
    }

    /// `$saguin/consumer/<channel>/seek`: moves this consumer's position to an offset
    /// (decimal) or a time (RFC 3339, with its zone).
    async fn seek(&mut self, channel: &str, publish: &Publish) -> (u8, Option<Publish>) {
        let id = match self.append_channel(channel) {
            Ok(id) => id,
            Err(why) => {
                self.puback_reason = Some(why.into());
                return (reason::TOPIC_NAME_INVALID, None);
            }
        };
        if !self.may_seek(channel) {
            return (reason::NOT_AUTHORIZED, None); // seek on the append channel (B-282)
        }
        let (provider, name) = self.store_of(id);
        let stats = match provider.stats(&name).await {
            Ok(stats) => stats,
            Err(e) => {
                self.read_failed(&name, &e);
                return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
            }
        };
        let text = std::str::from_utf8(&publish.payload).unwrap_or("").trim();
        let position = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            match text.parse::<u64>() {
                Ok(offset) if offset <= stats.head => offset.max(stats.floor),
                _ => return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None),
            }
        } else if let Ok(at) = text.parse::<jiff::Timestamp>() {
            // A time before 1970 is before every record: the floor (G-18).
            let at_ms = u64::try_from(at.as_millisecond()).unwrap_or(0);
            if at_ms > now_ms() {
                return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
            }
            match provider.first_at(&name, at_ms).await {
                Ok(found) => found.unwrap_or(stats.head),
                Err(e) => {
                    self.read_failed(&name, &e);
                    return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
                }
            }
        } else {
            return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
        };
        // Stored before it takes effect: a seek refused 0x83 moves nothing, where
        // moved first it restarted delivery from the new offset while the client was
        // told it failed, and the position it left in memory was never written.
        if let Err(e) = provider
            .set_position(&self.client_id, &name, position)
            .await
        {
            log::error!("channel {name}: seek of {} not stored: {e}", self.client_id);
            self.shared.broker.borrow().metrics.storage_failed(&e);
            return (reason::IMPLEMENTATION_SPECIFIC_ERROR, None);
        }
        self.move_cursor(id, position);
        let response_topic = match (&publish.properties.response_topic, self.protocol) {
            (Some(topic), ProtocolVersion::V5) => topic.clone(),
            _ => format!("$saguin/consumer/{channel}/seek/reply"),
        };
        let properties = Properties::from(PropertyValues {
            correlation_data: publish.properties.correlation_data.clone(),
            ..PropertyValues::default()
        });
        (
            reason::SUCCESS,
            Some(answer(
                &response_topic,
                Arc::from(position.to_string().as_bytes()),
                properties,
            )),
        )
    }

    /// The append (or dead-letter) channel a seek names; `Err` says which it is not,
    /// for the PUBACK's Reason String.
    fn append_channel(&self, name: &str) -> Result<ChannelId, String> {
        let broker = self.shared.broker.borrow();
        let id = broker
            .channels
            .by_name(name)
            .ok_or_else(|| format!("no channel is named {name}"))?;
        match broker.channels.get(id).kind {
            Kind::Append { .. } | Kind::DeadLetter => Ok(id),
            Kind::Latest => Err(format!(
                "{name} is a latest channel: only an append channel seeks"
            )),
            Kind::Queue => Err(format!("{name} is a queue: only an append channel seeks")),
        }
    }

    /// Points the session's cursor on channel `id` at `position`: what it had queued and
    /// not written is dropped, and reading starts again there.
    fn move_cursor(&mut self, id: ChannelId, position: u64) {
        self.with_session(|s| {
            let Some(cursor) = s.cursors.get_mut(&id) else {
                return;
            };
            cursor.next = position;
            cursor.unsettled.clear();
            // What is on the wire was read from the old position: its PUBACK must
            // not settle the same offset read again from the new one.
            s.inflight.detach_channel(id);
            // Written again with the next positions: a write of the old position
            // already queued behind the seek's would otherwise stand (G-18).
            cursor.stored = None;
            cursor.wake();
            let before = s.queue.len();
            let mut freed = 0;
            s.queue.retain(|d| {
                let keep = d.origin().is_none_or(|(c, _)| c != id);
                if !keep {
                    freed += d.charge();
                }
                keep
            });
            s.queued_bytes -= freed;
            debug_assert!(s.queue.len() <= before);
        });
    }
}

/// An answer written straight to the asking connection: QoS 0, RETAIN 0.
fn answer(topic_name: &str, payload: Arc<[u8]>, properties: Properties) -> Publish {
    Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: Arc::from(topic_name),
        packet_id: None,
        properties,
        payload,
    }
}

/// Queues an answer for the connection after its acknowledgement.
pub(super) fn reply_packet(reply: Publish) -> Packet {
    Packet::Publish(reply)
}
