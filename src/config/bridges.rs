//! `bridges:`: Sagüin as a client of another broker.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::Origin;
use super::limits::Limits;
use super::node::{Kind, Node};
use super::walk::{self, Ctx, DurationRule, Fields};
use crate::routing::filter;

/// A bridge, every default applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    /// Its name (the key under `bridges:`).
    pub name: String,
    /// The broker it dials.
    pub peer: Peer,
    /// Sagüin's client id at the far end. Required.
    pub client_id: String,
    /// The authority that signs the peer's certificate (tls/wss only); `None` uses the system roots.
    pub ca_file: Option<PathBuf>,
    /// The certificate presented when the peer asks for one (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// Its key.
    pub key_file: Option<PathBuf>,
    /// How long the peer keeps Sagüin's session. Default 1d.
    pub session_expiry: Duration,
    /// How many records the peer may have in flight to Sagüin. Default 20.
    pub receive_maximum: u16,
    /// How long a stored record may wait before the peer is told. Default 5ms.
    pub ack_interval: Duration,
    /// The rules, braces expanded (one rule per spelling), in the order written.
    pub topics: Vec<BridgeRule>,
    /// Where it was defined.
    pub origin: Origin,
}

/// `peer: scheme://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// tcp, tls, ws or wss.
    pub scheme: PeerScheme,
    /// The host.
    pub host: String,
    /// The port.
    pub port: u16,
    /// A ws/wss path, empty when none was written.
    pub path: String,
    /// The peer as written.
    pub written: String,
}

/// A peer's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerScheme {
    /// MQTT over TCP.
    Tcp,
    /// MQTT over TLS.
    Tls,
    /// MQTT over WebSocket.
    Ws,
    /// MQTT over WebSocket over TLS.
    Wss,
}

impl PeerScheme {
    /// Whether the link is encrypted.
    pub fn is_tls(self) -> bool {
        matches!(self, PeerScheme::Tls | PeerScheme::Wss)
    }
}

/// One rule under `topics:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeRule {
    /// The plain filter (one spelling of a braced one).
    pub filter: String,
    /// The filter as written, braces kept.
    pub written_filter: String,
    /// The topic template for in and out rules; `None` on both.
    pub topic: Option<String>,
    /// Which way it carries.
    pub direction: Direction,
    /// The line it was written on.
    pub line: u32,
    /// The `$N` its topic leaves unused: every value of that `+` level lands
    /// on one topic. A note for `--check-config`, not a finding.
    pub unused: Vec<usize>,
}

/// `direction:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Subscribe at the peer, publish here.
    In,
    /// Read here, publish at the peer.
    Out,
    /// Both, each topic mapped to itself.
    Both,
}

impl Direction {
    /// The spelling in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
            Direction::Both => "both",
        }
    }
}

const KEYS: &[&str] = &[
    "peer",
    "client_id",
    "ca_file",
    "cert_file",
    "key_file",
    "session_expiry",
    "receive_maximum",
    "ack_interval",
    "topics",
];
const RULE_KEYS: &[&str] = &["filter", "topic", "direction"];
/// The longest session expiry asked of a peer: one second short of 2^32-1, which
/// MQTT reads as "never" (MQTT 5 3.1.2.11.2), refused as `none` is.
const MQTT_MAX_EXPIRY: u64 = u32::MAX as u64 - 1;

/// Reads `bridges:`, sorted by name.
pub(crate) fn read(ctx: &mut Ctx, node: &Node, limits: &Limits) -> Vec<Bridge> {
    let Kind::Map(entries) = &node.kind else {
        if !matches!(node.kind, Kind::Null) {
            ctx.bad(
                node,
                "bridges",
                "is a mapping of bridge names to their settings",
            );
        }
        return Vec::new();
    };
    let mut out: BTreeMap<String, Bridge> = BTreeMap::new();
    for (key, value) in entries {
        if out.contains_key(&key.name) {
            continue;
        }
        let origin = Origin {
            file: ctx.file.clone(),
            line: key.line,
        };
        if let Some(b) = read_bridge(ctx, &key.name, value, origin, limits) {
            out.insert(key.name.clone(), b);
        }
    }
    Fields::open(ctx, node, "bridges", &[]).finish_duplicates_only(ctx);
    // No two bridges share a client_id at one peer.
    let list: Vec<Bridge> = out.into_values().collect();
    for (i, b) in list.iter().enumerate() {
        if let Some(a) = list[..i]
            .iter()
            .find(|a| a.client_id == b.client_id && same_peer(&a.peer, &b.peer))
        {
            ctx.say(
                b.origin.line,
                &format!("bridges.{}.client_id", b.name),
                Some(format!("{:?}", b.client_id)),
                format!(
                    "is the client id bridge {} (line {}) already uses at {}; the peer would close one session for the other, for ever - give each its own",
                    a.name, a.origin.line, a.peer.written
                ),
            );
        }
    }
    list
}

fn same_peer(a: &Peer, b: &Peer) -> bool {
    a.host.eq_ignore_ascii_case(&b.host) && a.port == b.port
}

fn read_bridge(
    ctx: &mut Ctx,
    name: &str,
    node: &Node,
    origin: Origin,
    limits: &Limits,
) -> Option<Bridge> {
    let path = walk::join("bridges", name);
    let mut f = Fields::open(ctx, node, &path, KEYS);
    let peer = match f.take("peer") {
        Some(n) => walk::string(ctx, n, &f.path("peer")).and_then(|s| match parse_peer(&s) {
            Ok(p) => Some(p),
            Err(e) => {
                ctx.bad(n, &f.path("peer"), e);
                None
            }
        }),
        None => {
            ctx.say(
                origin.line,
                &f.path("peer"),
                None,
                "is missing; write the broker to dial, such as tls://mqtt.example.com:8883",
            );
            None
        }
    };
    let client_id = match f.take("client_id") {
        Some(n) => walk::string(ctx, n, &f.path("client_id")).filter(|s| {
            if s.is_empty() {
                ctx.bad(
                    n,
                    &f.path("client_id"),
                    "is empty; write this broker's identity at the far end, such as vessel-07",
                );
            }
            !s.is_empty()
        }),
        None => {
            ctx.say(origin.line, &f.path("client_id"), None, "is missing and has no default: it is this broker's identity at the far end, and an invented one lets two boxes share a session; write one, such as vessel-07");
            None
        }
    };
    let tls = peer.as_ref().map(|p| p.scheme.is_tls());
    let file = |ctx: &mut Ctx, f: &mut Fields, key: &str| -> Option<PathBuf> {
        let n = f.take(key)?;
        let p = walk::abs_path(ctx, n, &f.path(key))?;
        if tls == Some(false) {
            ctx.bad(n, &f.path(key), "is refused beside an unencrypted peer: there is no handshake for it to take part in; dial tls:// or wss://, or remove it");
        }
        Some(p)
    };
    let ca_file = file(ctx, &mut f, "ca_file");
    let cert_file = file(ctx, &mut f, "cert_file");
    let key_file = file(ctx, &mut f, "key_file");
    match (f.key_line("cert_file"), f.key_line("key_file")) {
        (Some(l), None) => ctx.say(l, &f.path("cert_file"), None, "is written without key_file; a certificate with no key cannot be presented - write both"),
        (None, Some(l)) => ctx.say(l, &f.path("key_file"), None, "is written without cert_file; a key with no certificate names nobody - write both"),
        _ => {}
    }
    let session_expiry = match f.take("session_expiry") {
        None => Duration::from_secs(86_400),
        Some(n) if walk::is_none_word(n) => {
            ctx.bad(n, &f.path("session_expiry"), "is refused: a session that never expires sits on somebody else's broker after this box is gone, and only that operator can clear it; write a duration such as 1d");
            Duration::from_secs(86_400)
        }
        Some(n) => {
            let key = f.path("session_expiry");
            let rule = DurationRule::seconds(Duration::from_secs(u64::MAX / 2));
            match walk::duration(ctx, n, &key, rule) {
                Some(d) if d.as_secs() > MQTT_MAX_EXPIRY => {
                    ctx.bad(n, &key, "is longer than MQTT's ceiling of about 136 years, and it is the peer's storage being spent; write a shorter duration such as 1d");
                    Duration::from_secs(86_400)
                }
                Some(d) => d,
                None => Duration::from_secs(86_400),
            }
        }
    };
    let receive_maximum = match f.take("receive_maximum") {
        None => 20,
        Some(n) => {
            let key = f.path("receive_maximum");
            if matches!(n.kind, Kind::Int(0)) {
                ctx.bad(n, &key, "is zero, which is not unlimited but a subscriber that may receive nothing, and MQTT forbids sending it; write 1 to 65535 - it is how many records are held unacknowledged");
                20
            } else if matches!(n.kind, Kind::Int(i) if i > 65_535) {
                // B-537: what the value costs, as the zero's refusal says.
                ctx.bad(n, &key, "is above 65535, the most MQTT can say; write 1 to 65535 - it is how many records are held unacknowledged, each direction, in memory");
                20
            } else {
                walk::uint(ctx, n, &key, 1, 65_535).unwrap_or(20) as u16
            }
        }
    };
    let ack_interval = match f.take("ack_interval") {
        None => Duration::from_millis(5),
        Some(n) => {
            let key = f.path("ack_interval");
            let rule = DurationRule {
                millis: true,
                min: Duration::from_millis(1),
                max: Duration::from_secs(1),
            };
            match walk::duration(ctx, n, &key, rule) {
                Some(d) => d,
                None => {
                    if let Some(last) = ctx.findings.last_mut() {
                        last.text.push_str(&format!(
                            " (the link's ceiling is receive_maximum / ack_interval records a second, {receive_maximum} at 1s)"
                        ));
                    }
                    Duration::from_millis(5)
                }
            }
        }
    };
    let topics = match f.take("topics") {
        Some(n) => read_rules(ctx, n, &f.path("topics"), limits),
        None => Vec::new(),
    };
    if topics.is_empty() && !f.has("topics") {
        ctx.say(origin.line, &f.path("topics"), None, "is missing; a bridge carries at least one rule, or it holds a session open at somebody else's broker for nothing");
    }
    f.finish(ctx);
    Some(Bridge {
        name: name.to_string(),
        peer: peer?,
        client_id: client_id?,
        ca_file,
        cert_file,
        key_file,
        session_expiry,
        receive_maximum,
        ack_interval,
        topics,
        origin,
    })
}

/// Parses `scheme://host:port[/path]`.
pub(crate) fn parse_peer(s: &str) -> Result<Peer, String> {
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(
            "is not scheme://host:port; write one such as tls://mqtt.example.com:8883".into(),
        );
    };
    let scheme = match scheme {
        "tcp" => PeerScheme::Tcp,
        "tls" => PeerScheme::Tls,
        "ws" => PeerScheme::Ws,
        "wss" => PeerScheme::Wss,
        other => {
            return Err(format!(
                "has the scheme {other}://, which nothing can dial; write tcp://, tls://, ws:// or wss://"
            ));
        }
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !path.is_empty() && !matches!(scheme, PeerScheme::Ws | PeerScheme::Wss) {
        return Err("has a path, which only a ws:// or wss:// peer takes; remove it".into());
    }
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let Some((h, p)) = r.split_once("]:") else {
            return Err("has no port; write host:port, such as tls://[::1]:8883".into());
        };
        (h, p)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p),
            None => {
                return Err(format!(
                    "has no port; write one, such as {}:{}",
                    s,
                    if scheme.is_tls() { 8883 } else { 1883 }
                ));
            }
        }
    };
    if host.is_empty() {
        return Err("has no host; write the peer's host name or address".into());
    }
    let port: u16 = port
        .parse()
        .map_err(|_| "has a port that is not a number from 1 to 65535".to_string())?;
    if port == 0 {
        return Err("has port 0, which cannot be dialled; write the peer's port".into());
    }
    Ok(Peer {
        scheme,
        host: host.to_string(),
        port,
        path: path.to_string(),
        written: s.to_string(),
    })
}

fn read_rules(ctx: &mut Ctx, node: &Node, path: &str, limits: &Limits) -> Vec<BridgeRule> {
    let Kind::Seq(items) = &node.kind else {
        ctx.bad(
            node,
            path,
            "is a list of rules, each with filter and direction",
        );
        return Vec::new();
    };
    if items.is_empty() {
        ctx.bad(node, path, "holds no rule; a bridge carries at least one");
    }
    let mut out: Vec<BridgeRule> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let rpath = format!("{path}[{i}]");
        let mut f = Fields::open(ctx, item, &rpath, RULE_KEYS);
        let direction = match f.take("direction") {
            Some(n) => match n.scalar_text().as_deref() {
                Some("in") => Some(Direction::In),
                Some("out") => Some(Direction::Out),
                Some("both") => Some(Direction::Both),
                _ => {
                    ctx.bad(n, &f.path("direction"), "it is in, out or both");
                    None
                }
            },
            None => {
                ctx.say(item.line, &f.path("direction"), None, "is missing and has no default: whether this broker's records leave it must be visible in the file; write in, out or both");
                None
            }
        };
        let topic = match (f.take("topic"), direction) {
            (Some(n), Some(Direction::Both)) => {
                ctx.bad(n, &f.path("topic"), "is refused on a both rule, which maps each topic to itself; remove it, or split the rule into an in and an out");
                None
            }
            (Some(n), _) => walk::string(ctx, n, &f.path("topic")).map(|s| (s, n)),
            (None, Some(Direction::In | Direction::Out)) => {
                ctx.say(item.line, &f.path("topic"), None, "is missing; an in or out rule states the whole topic its records take, such as readings/$1/$#");
                None
            }
            (None, _) => None,
        };
        let Some(fnode) = f.take("filter") else {
            ctx.say(
                item.line,
                &f.path("filter"),
                None,
                "is missing; write the topic filter to carry, such as fleet/+/telemetry/#",
            );
            f.finish(ctx);
            continue;
        };
        let fkey = f.path("filter");
        let Some(written) = walk::string(ctx, fnode, &fkey) else {
            f.finish(ctx);
            continue;
        };
        let expanded = match filter::expand_braces(&written) {
            Ok(v) => v,
            Err(e) => {
                ctx.bad(fnode, &fkey, e);
                f.finish(ctx);
                continue;
            }
        };
        for plain in expanded {
            let which = if plain == written {
                String::new()
            } else {
                format!(" (expanded to {plain})")
            };
            if let Err(e) = filter::check(&plain) {
                ctx.bad(fnode, &fkey, format!("{e}{which}"));
                continue;
            }
            if plain.starts_with("$saguin/") || plain == "$saguin" {
                ctx.bad(fnode, &fkey, format!("names the reserved $saguin/ space{which}, in any direction a forgery of queue deliveries and control topics; choose another filter"));
                continue;
            }
            // A peer takes no No Local on a shared subscription (MQTT-3.8.3-4), and what
            // it shares out arrives under its own topic, which no rule maps.
            if direction != Some(Direction::Out)
                && (plain == "$share" || plain.starts_with("$share/"))
            {
                ctx.bad(fnode, &fkey, format!("is a shared subscription{which}, which a bridge cannot take from its peer: the bridge subscribes with No Local, which MQTT refuses on $share/, and shared records arrive under topics no rule maps; name the topics themselves"));
                continue;
            }
            if direction == Some(Direction::Both) && plain.starts_with('$') {
                ctx.bad(fnode, &fkey, format!("begins with ${which} on a both rule, which would map a $ topic to itself, and nothing may publish a $ topic here; use an in rule with a topic"));
                continue;
            }
            let depth = filter::levels(&plain).filter(|l| *l != "#").count() as u32;
            if depth > limits.max_topic_levels {
                ctx.bad(fnode, &fkey, format!("has {depth} levels{which}, more than limits.max_topic_levels ({}); shorten it", limits.max_topic_levels));
                continue;
            }
            // what an in rule brings in is published here under its topic (a
            // both rule's, its filter), and a dead-letter channel takes records from
            // its queue alone. Reading dead letters out is an out rule's right.
            let lands_in = match (direction, &topic) {
                (Some(Direction::In), Some((t, tnode))) => {
                    Some((t.as_str(), *tnode, f.path("topic")))
                }
                (Some(Direction::Both), _) => Some((plain.as_str(), fnode, fkey.clone())),
                _ => None,
            };
            if let Some((local, node, key)) = lands_in
                && local.split('/').any(|level| level == "__dlq")
            {
                ctx.bad(node, &key, format!("has a level __dlq{which}: what the rule brings in would land in a dead-letter channel, which takes records from its queue alone; bring it in under another topic"));
                continue;
            }
            let mut unused = Vec::new();
            if let Some((t, tnode)) = &topic {
                match check_template(t, &plain, limits) {
                    Ok(u) => unused = u,
                    Err(e) => {
                        ctx.bad(tnode, &f.path("topic"), format!("{e}{which}"));
                        continue;
                    }
                }
            }
            if let Some(d) = direction {
                let rule = BridgeRule {
                    filter: plain,
                    written_filter: written.clone(),
                    topic: topic.as_ref().map(|(t, _)| t.clone()),
                    direction: d,
                    line: fnode.line,
                    unused,
                };
                let outbound =
                    |r: &BridgeRule| matches!(r.direction, Direction::Out | Direction::Both);
                if outbound(&rule)
                    && let Some(prev) = out.iter().find(|r| {
                        outbound(r)
                            && r.filter == rule.filter
                            && r.topic.as_deref().unwrap_or(&r.filter)
                                == rule.topic.as_deref().unwrap_or(&rule.filter)
                    })
                {
                    ctx.bad(
                        fnode,
                        &fkey,
                        format!(
                            "sends {} to the same topic at the peer as the rule on line {}; every record would cross twice - remove one",
                            rule.filter, prev.line
                        ),
                    );
                    continue;
                }
                // An out rule keeps its positions under its filter and topic joined
                // by `/`: two rules joining to the same would share them, and each
                // would pass over the records only the other's filter matches.
                let key = |r: &BridgeRule| {
                    format!("{}/{}", r.filter, r.topic.as_deref().unwrap_or(&r.filter))
                };
                if outbound(&rule)
                    && let Some(prev) = out.iter().find(|r| outbound(r) && key(r) == key(&rule))
                {
                    ctx.bad(
                        fnode,
                        &fkey,
                        format!(
                            "would keep its place under the same name as the rule on line {} ({}), and the two would lose records to each other; change either rule's filter or topic",
                            prev.line,
                            key(&rule)
                        ),
                    );
                    continue;
                }
                out.push(rule);
            }
        }
        f.finish(ctx);
    }
    out
}

/// Checks a topic template against its filter; returns the `$N` it leaves unused.
pub(crate) fn check_template(
    t: &str,
    filter_s: &str,
    limits: &Limits,
) -> Result<Vec<usize>, String> {
    if t.is_empty() {
        return Err("is empty; write the topic records take, such as readings/$1/$#".into());
    }
    if crate::codec::has_wildcard(&t.replace("$#", "")) {
        return Err(
            "holds + or #, which no published topic carries; write literal levels and $1.., $#"
                .into(),
        );
    }
    if t.starts_with('/') || t.ends_with('/') {
        return Err("begins or ends with /; remove the separator".into());
    }
    let plus = filter::levels(filter_s).filter(|l| *l == "+").count();
    let ends_hash = filter_s == "#" || filter_s.ends_with("/#");
    let mut used = vec![false; plus + 1];
    let mut saw_tail = false;
    let lvls: Vec<&str> = filter::levels(t).collect();
    for (li, level) in lvls.iter().enumerate() {
        let bytes = level.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] != b'$' {
                i += 1;
                continue;
            }
            let rest = &level[i + 1..];
            if let Some(after) = rest.strip_prefix('#') {
                if !ends_hash {
                    return Err(format!(
                        "uses $# but its filter {filter_s:?} does not end in #; remove it"
                    ));
                }
                if !after.is_empty() || *level != "$#" || li + 1 != lvls.len() {
                    return Err("has $# somewhere other than as its whole last level; a tail goes at the end".into());
                }
                saw_tail = true;
                i += 2;
                continue;
            }
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if digits.is_empty() {
                return Err("has a $ that is neither $# nor $<number>; write $1.. for the filter's + levels or $# for its tail".into());
            }
            let n: usize = digits.parse().unwrap_or(usize::MAX);
            if n == 0 || n > plus {
                return Err(format!(
                    "uses ${n}, but its filter {filter_s:?} has {plus} + level(s); use $1 to ${plus}"
                ));
            }
            used[n] = true;
            i += 1 + digits.len();
        }
    }
    if ends_hash && !saw_tail {
        return Err(format!(
            "drops the # tail of {filter_s:?}, collapsing every deeper topic onto one; end the topic with /$#"
        ));
    }
    if lvls.len() as u32 > limits.max_topic_levels {
        return Err(format!(
            "has more levels than limits.max_topic_levels ({})",
            limits.max_topic_levels
        ));
    }
    if t.starts_with("$saguin")
        || (t.starts_with('$')
            && !t.starts_with("$#")
            && !t[1..].starts_with(|c: char| c.is_ascii_digit()))
    {
        return Err("publishes into the reserved $ space; choose another topic".into());
    }
    Ok((1..=plus).filter(|n| !used[*n]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_with_a_wildcard_is_refused_but_its_trailing_dollar_hash_is_not() {
        let limits = Limits::default();
        for bad in ["readings/+/x", "readings/#", "a/b#/$1"] {
            let e = check_template(bad, "site/+/x", &limits).expect_err(bad);
            assert!(e.starts_with("holds + or #"), "{bad}: {e}");
        }
        assert!(check_template("readings/$1/x", "site/+/x", &limits).is_ok());
        assert!(
            check_template("readings/$#", "site/#", &limits).is_ok_and(|unused| unused.is_empty())
        );
    }
}
