//! The retained store for broadcast topics: one value per topic, bounded in bytes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::session::Message;
use super::topic;

/// Retained messages by topic.
#[derive(Debug)]
pub struct RetainedStore {
    values: HashMap<Arc<str>, Arc<Message>>,
    bytes: usize,
    max_bytes: usize,
}

impl RetainedStore {
    /// An empty store holding at most `max_bytes`.
    pub fn new(max_bytes: usize) -> RetainedStore {
        RetainedStore {
            values: HashMap::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// Keeps `message` as its topic's value, or deletes the value for an empty payload.
    /// Returns false, keeping nothing, when the store has no room.
    pub fn store(&mut self, message: &Arc<Message>) -> bool {
        let old = self.values.get(&message.topic).map_or(0, |m| m.charge());
        if message.payload.is_empty() {
            self.values.remove(&message.topic);
            self.bytes -= old;
            return true;
        }
        let new = message.charge();
        if self.bytes - old + new > self.max_bytes {
            return false;
        }
        self.bytes = self.bytes - old + new;
        self.values.insert(message.topic.clone(), message.clone());
        true
    }

    /// The unexpired values whose topics `filter` matches.
    pub fn matching(&mut self, filter: &str, now: Instant) -> Vec<Arc<Message>> {
        self.purge_expired(now);
        self.values
            .values()
            .filter(|m| topic::matches(filter, &m.topic))
            .cloned()
            .collect()
    }

    /// Drops values whose Message Expiry Interval ran out.
    pub fn purge_expired(&mut self, now: Instant) {
        let before = self.values.len();
        if self.values.values().any(|m| m.expired(now)) {
            self.values.retain(|_, m| !m.expired(now));
            self.bytes = self.values.values().map(|m| m.charge()).sum();
        }
        debug_assert!(self.values.len() <= before);
    }

    /// How many values are held.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Where retained values are written through to, so they survive a restart: a latest
/// channel of the broker's own (`$retained`, a name no configuration can spell) on the
/// provider `broker.retained.storage` names. The in-memory store above serves every
/// SUBSCRIBE; this one is written before the publish is acknowledged and read once at
/// startup.
#[derive(Debug)]
pub struct Durable {
    /// The provider holding the values.
    pub provider: std::sync::Arc<crate::storage::Provider>,
    /// The values found at startup, handed to the in-memory store once.
    pub loaded: Vec<Arc<Message>>,
}

/// The channel name retained values are kept under.
pub const CHANNEL: &str = "$retained";
/// The User Property a stored value keeps its QoS in (stripped when loaded).
const QOS_PROPERTY: &str = "saguin-retained-qos";

impl Durable {
    /// Opens the retained channel on `provider` and reads every value it holds.
    ///
    /// # Errors
    /// The provider refused the channel or could not be read, named.
    pub async fn open(
        provider: std::sync::Arc<crate::storage::Provider>,
        retention_period: Option<std::time::Duration>,
    ) -> Result<Durable, String> {
        use crate::storage::{ChannelKind, ChannelSettings, RecordState, Retention, WindowRequest};
        let settings = ChannelSettings {
            kind: ChannelKind::Latest {
                deletion_retention: Some(std::time::Duration::ZERO),
            },
            max_bytes: None,
            retention: Retention {
                period: retention_period,
                bytes: None,
            },
        };
        provider
            .open_channel(CHANNEL, settings)
            .await
            .map_err(|e| format!("broker.retained: {e}"))?;
        let mut loaded = Vec::new();
        let mut from = 0;
        let now_ms = super::records::now_ms();
        loop {
            let request = WindowRequest {
                from,
                max_records: 1024,
                max_bytes: 4 << 20,
            };
            let window = provider
                .read_window(CHANNEL, request)
                .await
                .map_err(|e| format!("broker.retained: {e}"))?;
            let Some(last) = window.records.last().map(|r| r.offset) else {
                break;
            };
            for record in window.records {
                if matches!(record.state, RecordState::Stored) {
                    loaded.extend(from_stored(record, now_ms));
                }
            }
            from = last + 1;
        }
        log::info!(
            "retained store: {} values loaded from {}",
            loaded.len(),
            provider.name()
        );
        Ok(Durable { provider, loaded })
    }
}

/// Writes `message` (a retained broadcast) through to `provider`; an empty payload
/// deletes the topic's value.
///
/// # Errors
/// The provider's refusal.
pub async fn write_through(
    provider: &crate::storage::Provider,
    message: &Message,
) -> Result<(), crate::storage::StorageError> {
    let mut record = super::records::to_record(message, super::records::now_ms());
    record
        .properties
        .user_properties
        .push((QOS_PROPERTY.into(), (message.qos as u8).to_string()));
    provider.append(CHANNEL, record).await.map(|_| ())
}

/// A stored value as the message it was, or nothing if it has expired.
fn from_stored(record: crate::storage::Record, now_ms: u64) -> Option<Arc<Message>> {
    use crate::codec::{Properties, QoS};
    let p = record.properties;
    let expires_ms = p
        .message_expiry_interval
        .map(|s| record.timestamp_ms + u64::from(s) * 1000);
    if expires_ms.is_some_and(|at| at <= now_ms) {
        return None;
    }
    let mut qos = QoS::AtMostOnce;
    let mut user_properties = Vec::with_capacity(p.user_properties.len());
    for (k, v) in p.user_properties {
        if k == QOS_PROPERTY {
            qos = v
                .parse()
                .ok()
                .and_then(QoS::from_bits)
                .unwrap_or(QoS::AtMostOnce);
        } else if !k.starts_with(super::records::RESERVED_PREFIX) {
            // A publisher's own `saguin-` properties never reach storage; these are ours.
            user_properties.push((k, v));
        }
    }
    Some(Arc::new(Message {
        topic: Arc::from(record.topic),
        payload: record.payload.into(),
        qos,
        retain: true,
        properties: Properties {
            payload_format_indicator: p.payload_format_indicator,
            message_expiry_interval: p.message_expiry_interval,
            content_type: p.content_type,
            response_topic: p.response_topic,
            correlation_data: p.correlation_data,
            user_properties,
            ..Properties::default()
        },
        publisher: Arc::from(""),
        expires_at: expires_ms
            .map(|at| Instant::now() + std::time::Duration::from_millis(at - now_ms)),
    }))
}
