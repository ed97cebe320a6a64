//! The knobs the broker runs with, taken from the validated configuration.

use std::time::Duration;

use crate::codec::ProtocolVersion;

/// Limits and identity the broker enforces (RFC 0002 `broker.limits` and friends).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `broker.id`.
    pub broker_id: String,
    /// `broker.mqtt.min_protocol_version`.
    pub min_protocol: ProtocolVersion,
    /// `limits.max_message_size`: the Maximum Packet Size advertised and enforced.
    pub max_message_size: u32,
    /// `limits.max_connect_size`: the bound on a CONNECT.
    pub max_connect_size: u32,
    /// `limits.max_client_id_length`.
    pub max_client_id_length: usize,
    /// `limits.max_session_expiry`, seconds.
    pub max_session_expiry: u32,
    /// `limits.max_topic_length`.
    pub max_topic_length: usize,
    /// `limits.max_topic_levels`.
    pub max_topic_levels: usize,
    /// `limits.max_keepalive`, seconds; `None` for no ceiling.
    pub max_keepalive: Option<u16>,
    /// `limits.max_connections`.
    pub max_connections: usize,
    /// `limits.max_subscriptions`.
    pub max_subscriptions: usize,
    /// `limits.session_queue_bytes`.
    pub session_queue_bytes: usize,
    /// `limits.write_timeout`; `None` is no ceiling.
    pub write_timeout: Option<Duration>,
    /// `limits.connect_timeout`.
    pub connect_timeout: Duration,
    /// The Receive Maximum advertised, the protocol's window: a client past it is
    /// disconnected 0x93. Within it, one past `qos2_max_inflight` is told 0x97
    /// on its PUBREC and kept.
    pub receive_maximum: u16,
    /// `broker.qos2.max_inflight_per_client`: unreleased QoS 2 publishes one client
    /// may hold.
    pub qos2_max_inflight: usize,
    /// `broker.qos2.expires_after`: how long a held QoS 2 publish waits for its PUBREL.
    pub qos2_expires_after: Duration,
    /// `broker.share.expires_after`: how long a shared group's delivery waits for a
    /// member to take it before it is dropped; `None` keeps it as long as the session.
    pub share_expires_after: Option<Duration>,
    /// `broker.retained.retention_period`: how long a retained broadcast value is
    /// kept after it was stored; `None` keeps it until its Message Expiry.
    pub retained_retention_period: Option<Duration>,
    /// `broker.session.ack_commit_interval`: how long a moved channel position may
    /// wait before it is written (B-457).
    pub ack_commit_interval: Duration,
    /// `limits.max_header_count`: User Properties a publish may carry.
    pub max_header_count: usize,
    /// `limits.max_header_bytes`: their keys and values together.
    pub max_header_bytes: usize,
    /// `limits.publish_rate`: messages a second per client id; `None` is unbounded.
    pub publish_rate: Option<u32>,
    /// `limits.publish_bytes`: bytes a second per client id; `None` is unbounded.
    pub publish_bytes: Option<u64>,
    /// `limits.max_connect_rate`: connections each listener accepts a second.
    pub max_connect_rate: Option<u32>,
}

/// Topic aliases a client may register (RFC 0001: sixteen per connection).
pub const TOPIC_ALIAS_MAXIMUM: u16 = 16;

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            broker_id: "saguin".into(),
            min_protocol: ProtocolVersion::V311,
            max_message_size: 1024 * 1024,
            max_connect_size: 100 * 1024,
            max_client_id_length: 256,
            max_session_expiry: 30 * 24 * 3600,
            max_topic_length: 1024,
            max_topic_levels: 200,
            max_keepalive: None,
            max_connections: 10_000,
            max_subscriptions: 10_000,
            session_queue_bytes: 1024 * 1024,
            write_timeout: Some(Duration::from_secs(5)),
            connect_timeout: Duration::from_secs(10),
            receive_maximum: 32,
            qos2_max_inflight: 20,
            qos2_expires_after: Duration::from_secs(300),
            share_expires_after: None,
            retained_retention_period: None,
            ack_commit_interval: Duration::from_millis(200),
            max_header_count: 32,
            max_header_bytes: 8 * 1024,
            publish_rate: None,
            publish_bytes: None,
            max_connect_rate: Some(500),
        }
    }
}

impl Settings {
    /// The settings a validated configuration gives.
    pub fn from_config(config: &crate::config::Config) -> Settings {
        let broker = &config.broker;
        let limits = &broker.limits;
        let seconds = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        Settings {
            broker_id: broker.id.clone(),
            min_protocol: match broker.mqtt.min_protocol_version {
                crate::config::ProtocolVersion::V3_1_1 => ProtocolVersion::V311,
                crate::config::ProtocolVersion::V5 => ProtocolVersion::V5,
            },
            max_message_size: limits.max_message_size,
            max_connect_size: limits.max_connect_size,
            max_client_id_length: limits.max_client_id_length as usize,
            max_session_expiry: seconds(limits.max_session_expiry),
            max_topic_length: limits.max_topic_length as usize,
            max_topic_levels: limits.max_topic_levels as usize,
            max_keepalive: limits
                .max_keepalive
                .map(|d| u16::try_from(d.as_secs()).unwrap_or(u16::MAX)),
            max_connections: limits.max_connections as usize,
            max_subscriptions: limits.max_subscriptions as usize,
            session_queue_bytes: usize::try_from(limits.session_queue_bytes).unwrap_or(usize::MAX),
            write_timeout: limits.write_timeout,
            connect_timeout: limits.connect_timeout,
            max_header_count: limits.max_header_count as usize,
            max_header_bytes: limits.max_header_bytes as usize,
            publish_rate: limits.publish_rate,
            publish_bytes: limits.publish_bytes,
            max_connect_rate: limits.max_connect_rate,
            qos2_max_inflight: broker.qos2.max_inflight_per_client as usize,
            qos2_expires_after: broker.qos2.expires_after,
            share_expires_after: broker.share.expires_after,
            retained_retention_period: broker.retained.retention_period,
            ack_commit_interval: broker.session.ack_commit_interval,
            ..Settings::default()
        }
    }
}
