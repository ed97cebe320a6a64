//! From publish to record and back (RFC 0003 "From publish to record", gaps G-16):
//! what a channel stores of a publish, and what a delivery of a record carries.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::codec::{Properties, PropertyValues, QoS};
use crate::storage::{NewRecord, Record, RecordProperties};

use super::session::Message;

/// The reserved prefix of User Properties.
pub const RESERVED_PREFIX: &str = "saguin-";
/// Where a record keeps the client id that published it, for No Local (gaps G-15).
/// Stored with the record, never delivered.
const ORIGIN: &str = "saguin-origin";

/// The client id that published a stored record (empty for one published by the
/// broker itself or read from before origins were kept).
pub fn origin(record: &Record) -> &str {
    record
        .properties
        .user_properties
        .iter()
        .find(|(k, _)| k == ORIGIN)
        .map_or("", |(_, v)| v.as_str())
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Drops every `saguin-` User Property a client set except its first `saguin-id`
/// (C-017, C-146, C-249): the names are the broker's, on broadcast as in channels.
pub fn strip_reserved(user_properties: &mut Vec<(String, String)>) {
    let mut id_kept = false;
    user_properties.retain(|(k, _)| {
        if !k.starts_with(RESERVED_PREFIX) {
            return true;
        }
        let first_id = k == "saguin-id" && !id_kept;
        id_kept |= first_id;
        first_id
    });
}

/// The record a publish becomes. The publisher's own `saguin-id` is kept (first
/// occurrence, invariant 8); every other `saguin-` property is dropped silently;
/// otherwise a UUIDv7 is minted.
pub fn to_record(message: &Message, received_ms: u64) -> NewRecord {
    let p = &message.properties;
    let mut message_id = None;
    let mut user_properties = Vec::with_capacity(p.user_properties.len());
    for (k, v) in &p.user_properties {
        if k == "saguin-id" {
            message_id.get_or_insert_with(|| v.clone());
        } else if !k.starts_with(RESERVED_PREFIX) {
            user_properties.push((k.clone(), v.clone()));
        }
    }
    if !message.publisher.is_empty() {
        user_properties.push((ORIGIN.into(), message.publisher.to_string()));
    }
    NewRecord {
        message_id: message_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
        timestamp_ms: received_ms,
        topic: message.topic.to_string(),
        payload: message.payload.to_vec(),
        properties: RecordProperties {
            payload_format_indicator: p.payload_format_indicator,
            message_expiry_interval: p.message_expiry_interval,
            content_type: p.content_type.clone(),
            response_topic: p.response_topic.clone(),
            correlation_data: p.correlation_data.clone(),
            user_properties,
        },
    }
}

/// The message a stored record is delivered as: the publisher's topic, payload and
/// properties, plus `saguin-id`, `saguin-offset`, `saguin-timestamp` and, where an
/// expiry was set, `saguin-expires`. The Message Expiry Interval counts down from the
/// receive time; once it has run out the record is still delivered, without it.
pub fn from_record(record: Record, qos: QoS, now_ms: u64) -> Message {
    let p = record.properties;
    let mut publisher = String::new();
    let mut user_properties = p.user_properties;
    if let Some(at) = user_properties.iter().position(|(k, _)| k == ORIGIN) {
        publisher = user_properties.remove(at).1;
    }
    user_properties.push(("saguin-id".into(), record.message_id));
    user_properties.push(("saguin-offset".into(), record.offset.to_string()));
    user_properties.push(("saguin-timestamp".into(), record.timestamp_ms.to_string()));
    let mut expires_at = None;
    if let Some(seconds) = p.message_expiry_interval {
        let at_ms = record
            .timestamp_ms
            .saturating_add(u64::from(seconds) * 1000);
        user_properties.push(("saguin-expires".into(), at_ms.to_string()));
        if at_ms > now_ms {
            expires_at = Some(Instant::now() + Duration::from_millis(at_ms - now_ms));
        }
    }
    Message {
        topic: Arc::from(record.topic),
        payload: record.payload.into(),
        qos,
        retain: false,
        properties: Properties::from(PropertyValues {
            payload_format_indicator: p.payload_format_indicator,
            content_type: p.content_type,
            response_topic: p.response_topic,
            correlation_data: p.correlation_data,
            user_properties,
            ..PropertyValues::default()
        }),
        publisher: Arc::from(publisher),
        expires_at,
    }
}

/// The message a record of the broker's own channels keeps (`$retained`,
/// `$broadcast`) is again: its topic, payload and properties as published, the
/// record's reserved User Properties already taken out of `properties` by the caller.
pub fn stored_message(
    topic: String,
    payload: Vec<u8>,
    properties: RecordProperties,
    (qos, retain): (QoS, bool),
    publisher: Arc<str>,
    expires_at: Option<Instant>,
) -> Message {
    let p = properties;
    Message {
        topic: Arc::from(topic),
        payload: payload.into(),
        qos,
        retain,
        properties: Properties::from(PropertyValues {
            payload_format_indicator: p.payload_format_indicator,
            message_expiry_interval: p.message_expiry_interval,
            content_type: p.content_type,
            response_topic: p.response_topic,
            correlation_data: p.correlation_data,
            user_properties: p.user_properties,
            ..PropertyValues::default()
        }),
        publisher,
        expires_at,
    }
}
