//! Held inbound QoS 2 publishes kept in storage (RFC 0002 "Exactly-once publishes:
//! broker.qos2", B-441..B-443; gaps G-13).
//!
//! A session that outlives its connection keeps each publish it has been sent
//! PUBREC for, until the PUBREL, in the provider of the channel the topic is for, or
//! the broadcast log's (`broker.session.storage`) for a broadcast topic, keyed by
//! (client id, packet id) (`Provider::put_held`). The PUBREL writes the record and
//! removes the held publish in one store operation (`Provider::append_releasing`). At
//! startup what every provider holds is handed back to the sessions that came back
//! (`Broker::restore_held`); the rest is dropped and counted.
//!
//! What is stored is opaque to the provider: a version byte, the moment it was
//! received (ms since the epoch), then the publish as an MQTT 5 PUBLISH packet - the
//! codec already reads and writes every field a message carries. Its publisher is
//! the client id it is kept under.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::codec::{self, Packet, ProtocolVersion, Publish, QoS};
use crate::storage::{HeldKey, Provider};

use super::session::Message;

/// The format of what is stored.
const VERSION: u8 = 1;

/// Where a held publish is kept: a provider, and which exchange it is there.
#[derive(Debug, Clone)]
pub struct StoredHeld {
    /// The provider keeping it.
    pub provider: Arc<Provider>,
    /// Which exchange under its (client id, packet id) (`storage::Held::token`).
    pub token: u64,
}

impl StoredHeld {
    /// It, as the exchange `packet_id` of `client_id`: what a release or a forget names.
    pub fn at(&self, client_id: &str, packet_id: u16) -> HeldRef {
        HeldRef {
            provider: self.provider.clone(),
            key: HeldKey {
                client_id: client_id.to_owned(),
                packet_id,
                token: self.token,
            },
        }
    }
}

/// One held publish in storage: what a PUBREL releases with its record (B-442), and
/// what the server forgets when it is abandoned or its session ended
/// (`server::forget_held`).
#[derive(Debug, Clone)]
pub struct HeldRef {
    /// Where it is kept.
    pub provider: Arc<Provider>,
    /// Which one.
    pub key: HeldKey,
}

/// What is stored for `message`, received at `received_ms`.
pub fn encode(message: &Message, received_ms: u64) -> Vec<u8> {
    let publish = Publish {
        dup: false,
        qos: QoS::ExactlyOnce,
        retain: message.retain,
        topic: message.topic.clone(),
        packet_id: Some(1),
        properties: message.properties.clone(),
        payload: message.payload.clone(),
    };
    let mut out = Vec::with_capacity(16 + message.wire_size_bound());
    out.push(VERSION);
    out.extend_from_slice(&received_ms.to_be_bytes());
    codec::encode(&Packet::Publish(publish), ProtocolVersion::V5, &mut out);
    out
}

/// A stored row as this module and `released` write it: its format byte, which must be
/// `version`, then a big-endian u64; the number and what follows it.
///
/// # Errors
/// An empty or truncated row, or another format.
pub(super) fn unframe(version: u8, data: &[u8]) -> Result<(u64, &[u8]), String> {
    let (&found, rest) = data.split_first().ok_or("empty")?;
    if found != version {
        return Err(format!("format {found}, this broker reads {version}"));
    }
    let (number, rest) = rest.split_first_chunk::<8>().ok_or("truncated")?;
    Ok((u64::from_be_bytes(*number), rest))
}

/// A held publish read back: the message, published by `client_id`, and the moment
/// it was received as this process's clock counts (no later than `now`).
///
/// # Errors
/// What is wrong with data that does not read back (damaged, or a newer format).
pub fn decode(
    client_id: &Arc<str>,
    data: &[u8],
    now: Instant,
    now_ms: u64,
) -> Result<(Message, Instant), String> {
    let (received_ms, packet) = unframe(VERSION, data)?;
    let header = codec::read_fixed_header(packet)
        .map_err(|e| format!("{e:?}"))?
        .ok_or("truncated packet")?;
    let body = packet
        .get(header.header_len..)
        .filter(|b| b.len() == header.remaining_length)
        .ok_or("packet length does not match")?;
    let publish = match codec::decode(header.first_byte, body, ProtocolVersion::V5) {
        Ok(Packet::Publish(p)) => p,
        Ok(_) => return Err("not a PUBLISH".to_string()),
        Err(e) => return Err(format!("{e:?}")),
    };
    let waited = Duration::from_millis(now_ms.saturating_sub(received_ms));
    let since = now.checked_sub(waited).unwrap_or(now);
    // The Message Expiry counts from when it was received, as it did before the stop.
    let expires_at = publish
        .properties
        .message_expiry_interval
        .map(|s| since + Duration::from_secs(u64::from(s)));
    let message = Message {
        topic: publish.topic,
        payload: publish.payload,
        qos: QoS::ExactlyOnce,
        retain: publish.retain,
        properties: publish.properties,
        publisher: client_id.clone(),
        expires_at,
    };
    Ok((message, since))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_publish_reads_back_as_it_was_kept() {
        let mut properties = codec::Properties::default();
        properties
            .edit()
            .user_properties
            .push(("k".into(), "v".into()));
        properties.edit().correlation_data = Some(vec![1, 2, 3]);
        properties.edit().message_expiry_interval = Some(60);
        let message = Message {
            topic: Arc::from("a/b"),
            payload: Arc::from(&b"payload"[..]),
            qos: QoS::ExactlyOnce,
            retain: true,
            properties: properties.clone(),
            publisher: Arc::from("c"),
            expires_at: None,
        };
        let now_ms = 1_000_000;
        let data = encode(&message, now_ms - 2_000);
        let now = Instant::now();
        let (back, since) = decode(&Arc::from("c"), &data, now, now_ms).unwrap();
        assert_eq!(&*back.topic, "a/b");
        assert_eq!(&*back.payload, b"payload");
        assert!(back.retain);
        assert_eq!(back.properties, properties);
        assert_eq!(&*back.publisher, "c");
        assert!(now.duration_since(since) >= Duration::from_millis(1_900));
        assert!(back.expires_at.is_some());
        assert!(decode(&Arc::from("c"), &data[..data.len() - 1], now, now_ms).is_err());
        assert!(decode(&Arc::from("c"), &[2], now, now_ms).is_err());
    }
}
