//! `broker.limits`: every bound the spec defines, with its default applied.

use std::time::Duration;

use super::walk::{self, Ctx, DurationRule, Fields};

/// `broker.limits`, every key resolved to its value (defaults applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest packet a client may send, advertised as Maximum Packet Size. Default 1MiB.
    pub max_message_size: u32,
    /// Longest topic name a client may publish, in bytes. Default 1024.
    pub max_topic_length: u32,
    /// Longest client id admitted at CONNECT (0x85 above it); never below 23. Default 256.
    pub max_client_id_length: u32,
    /// Most User Properties one publish may carry (0x97 above it). Default 32.
    pub max_header_count: u32,
    /// Most bytes of User Properties one publish may carry (0x97 above it). Default 8KiB.
    pub max_header_bytes: u32,
    /// Connections held at once across every MQTT door. Default 10000.
    pub max_connections: u32,
    /// Topic filters one client may hold at once (0x97 above it). Default 10000.
    pub max_subscriptions: u32,
    /// Levels a topic name or filter may have. Default 200.
    pub max_topic_levels: u32,
    /// Cap on a session's expiry interval, in whole seconds. Default 30 days.
    pub max_session_expiry: Duration,
    /// Server Keep Alive ceiling (whole seconds, at most 65535s); `None` for no ceiling (the default).
    pub max_keepalive: Option<Duration>,
    /// Publishes a second one client may make; `None` for no bound (the default).
    pub publish_rate: Option<u32>,
    /// Bytes a second one client may publish; `None` for no bound (the default).
    pub publish_bytes: Option<u64>,
    /// Longest wait to hand a packet to a client; `None` for no ceiling. Default 5s.
    pub write_timeout: Option<Duration>,
    /// Longest a socket may take to send its CONNECT, whole seconds. Default 10s.
    pub connect_timeout: Duration,
    /// Largest CONNECT read before authentication, fixed header included.
    /// Default 100KiB, or max_message_size when that is smaller.
    pub max_connect_size: u32,
    /// Connections each MQTT listener accepts a second (bursts of twice that);
    /// `None` for no limit. Default 500.
    pub max_connect_rate: Option<u32>,
    /// Most one session may hold of unacknowledged deliveries, in bytes.
    /// Default 1MiB, or max_message_size where that is larger.
    pub session_queue_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_size: 1 << 20,
            max_topic_length: 1024,
            max_client_id_length: 256,
            max_header_count: 32,
            max_header_bytes: 8 << 10,
            max_connections: 10_000,
            max_subscriptions: 10_000,
            max_topic_levels: 200,
            max_session_expiry: Duration::from_secs(30 * 86_400),
            max_keepalive: None,
            publish_rate: None,
            publish_bytes: None,
            write_timeout: Some(Duration::from_secs(5)),
            connect_timeout: Duration::from_secs(10),
            max_connect_size: 100 << 10,
            max_connect_rate: Some(500),
            session_queue_bytes: 1 << 20,
        }
    }
}

/// Every key `broker.limits` accepts.
pub(crate) const KEYS: &[&str] = &[
    "max_message_size",
    "max_topic_length",
    "max_client_id_length",
    "max_header_count",
    "max_header_bytes",
    "max_connections",
    "max_subscriptions",
    "max_topic_levels",
    "max_session_expiry",
    "max_keepalive",
    "publish_rate",
    "publish_bytes",
    "write_timeout",
    "connect_timeout",
    "max_connect_size",
    "max_connect_rate",
    "session_queue_bytes",
];

/// MQTT's largest packet: a four-byte remaining length plus the fixed header.
const MQTT_MAX_PACKET: u64 = 268_435_460;
const DAY: u64 = 86_400;

/// Reads `broker.limits`.
pub(crate) fn read(ctx: &mut Ctx, mut f: Fields) -> Limits {
    let mut l = Limits::default();
    let u32max = u32::MAX as u64;

    if let Some(n) = f.take("max_message_size")
        && let Some(v) = walk::size(ctx, n, &f.path("max_message_size"), 16, MQTT_MAX_PACKET)
    {
        l.max_message_size = v as u32;
    }
    if let Some(n) = f.take("max_topic_length")
        && let Some(v) = walk::uint(ctx, n, &f.path("max_topic_length"), 1, 65_535)
    {
        l.max_topic_length = v as u32;
    }
    if let Some(n) = f.take("max_client_id_length") {
        let key = f.path("max_client_id_length");
        if let Some(v) = walk::uint(ctx, n, &key, 0, 65_535) {
            if v < 23 {
                ctx.bad(n, &key, "is below the 23 bytes MQTT requires every server to accept; write 23 or more, or omit the key for 256");
            } else {
                l.max_client_id_length = v as u32;
            }
        }
    }
    if let Some(n) = f.take("max_header_count")
        && let Some(v) = walk::uint(ctx, n, &f.path("max_header_count"), 0, 65_535)
    {
        l.max_header_count = v as u32;
    }
    if let Some(n) = f.take("max_header_bytes")
        && let Some(v) = walk::size(ctx, n, &f.path("max_header_bytes"), 0, MQTT_MAX_PACKET)
    {
        l.max_header_bytes = v as u32;
    }
    if let Some(n) = f.take("max_connections")
        && let Some(v) = walk::uint(ctx, n, &f.path("max_connections"), 1, u32max)
    {
        l.max_connections = v as u32;
    }
    if let Some(n) = f.take("max_subscriptions")
        && let Some(v) = walk::uint(ctx, n, &f.path("max_subscriptions"), 1, u32max)
    {
        l.max_subscriptions = v as u32;
    }
    if let Some(n) = f.take("max_topic_levels")
        && let Some(v) = walk::uint(ctx, n, &f.path("max_topic_levels"), 1, 65_535)
    {
        l.max_topic_levels = v as u32;
    }
    if let Some(n) = f.take("max_session_expiry") {
        let key = f.path("max_session_expiry");
        if walk::is_none_word(n) {
            ctx.bad(n, &key, "is refused: a session that never expires is unbounded state; write a duration such as 30d, or omit the key for 30d");
        } else if let Some(v) = walk::duration(
            ctx,
            n,
            &key,
            // 2^32-1 seconds is MQTT's "never" (MQTT 5 3.1.2.11.2), which `none`
            // is refused for: the longest duration stops one second short.
            DurationRule::seconds(Duration::from_secs(u32max - 1)),
        ) {
            l.max_session_expiry = v;
        }
    }
    if let Some(n) = f.take("max_keepalive") {
        let key = f.path("max_keepalive");
        let rule = DurationRule::seconds(Duration::from_secs(100 * 365 * DAY));
        if let Some(v) = walk::or_none(ctx, n, &key, |c, n, k| walk::duration(c, n, k, rule)) {
            match v {
                Some(d) if d.as_secs() > 65_535 => ctx.phrase(
                    n.line,
                    &key,
                    Some(n.show()),
                    "is longer than MQTT can express, which is 65535 seconds or about 18 hours; write `none` for no ceiling",
                ),
                v => l.max_keepalive = v,
            }
        }
    }
    if let Some(n) = f.take("publish_rate") {
        let key = f.path("publish_rate");
        if let Some(v) = walk::or_none(ctx, n, &key, |c, n, k| rate(c, n, k, u32max)) {
            l.publish_rate = v.map(|v| v as u32);
        }
    }
    if let Some(n) = f.take("publish_bytes") {
        let key = f.path("publish_bytes");
        if let Some(v) = walk::or_none(ctx, n, &key, |c, n, k| walk::size(c, n, k, 1, u64::MAX)) {
            l.publish_bytes = v;
        }
    }
    if let Some(n) = f.take("write_timeout") {
        let key = f.path("write_timeout");
        let rule = DurationRule {
            millis: true,
            min: Duration::from_millis(1),
            max: Duration::from_secs(365 * DAY),
        };
        if let Some(v) = walk::or_none(ctx, n, &key, |c, n, k| walk::duration(c, n, k, rule)) {
            l.write_timeout = v;
        }
    }
    if let Some(n) = f.take("connect_timeout") {
        let key = f.path("connect_timeout");
        if walk::is_none_word(n) {
            ctx.bad(n, &key, "is refused: this bound is all that stands between an idle socket and the broker's descriptors; write a duration of 1s or more, or omit the key for 10s");
        } else if let Some(v) = walk::duration(
            ctx,
            n,
            &key,
            DurationRule::seconds(Duration::from_secs(DAY)),
        ) {
            l.connect_timeout = v;
        }
    }
    let connect_size = f
        .take("max_connect_size")
        .map(|n| (n, f.path("max_connect_size")));
    if let Some(n) = f.take("max_connect_rate") {
        let key = f.path("max_connect_rate");
        if let Some(v) = walk::or_none(ctx, n, &key, |c, n, k| rate(c, n, k, u32max)) {
            l.max_connect_rate = v.map(|v| v as u32);
        }
    }
    let queue_bytes = f
        .take("session_queue_bytes")
        .map(|n| (n, f.path("session_queue_bytes")));

    // Defaults and bounds that depend on max_message_size.
    let mms = l.max_message_size;
    l.max_connect_size = (100u32 << 10).min(mms);
    if let Some((n, key)) = connect_size
        && let Some(v) = walk::size(ctx, n, &key, 16, MQTT_MAX_PACKET)
    {
        if v > mms as u64 {
            ctx.phrase(
                    n.line,
                    &key,
                    Some(n.show()),
                    format!(
                        "is larger than limits.max_message_size ({}); write at most that, or raise max_message_size",
                        super::units::format_size(mms as u64)
                    ),
                );
        } else {
            l.max_connect_size = v as u32;
        }
    }
    l.session_queue_bytes = (1u64 << 20).max(mms as u64);
    if let Some((n, key)) = queue_bytes {
        if walk::is_none_word(n) {
            ctx.bad(n, &key, "is refused: a session that stops reading would hold everything it is sent; write a size such as 4MiB, or omit the key for 1MiB");
        } else if let Some(v) = walk::size(ctx, n, &key, 1, u64::MAX) {
            if v < mms as u64 {
                ctx.phrase(
                    n.line,
                    &key,
                    Some(n.show()),
                    format!(
                        "is below limits.max_message_size ({}) and could never queue the largest message a client may publish; write at least that",
                        super::units::format_size(mms as u64)
                    ),
                );
            } else {
                l.session_queue_bytes = v;
            }
        }
    }
    f.finish(ctx);
    l
}

/// A per-second count: a whole number of at least 1 (0 is refused, never "unset").
pub(crate) fn rate(ctx: &mut Ctx, node: &super::node::Node, key: &str, max: u64) -> Option<u64> {
    if matches!(node.kind, super::node::Kind::Int(0)) {
        ctx.bad(node, key, "is zero, which would refuse every one; write a whole number of at least 1, or `none` for no bound");
        return None;
    }
    walk::uint(ctx, node, key, 1, max)
}
