//! `--check-config`'s two outputs: the summary and the resolved document.

use std::fmt::Write;
use std::time::Duration;

use super::units::{format_duration, format_size};
use super::{
    Backoff, Bridge, Channel, ChannelType, CommitMode, Config, ListenAddress, Listeners, LogLevel,
    ProtocolVersion, ProviderKind, Start, Tls, TlsVersion,
};
use crate::routing::{Route, Router};

/// YAML for a string: quoted when a plain scalar would read differently.
fn q(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        // What YAML 1.1 or 1.2 reads as a boolean or null, in any case (`Yes`, `N`,
        // `NULL`), and what it reads as a number (`.inf`, `1e3`, `0x1F`).
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "y" | "n" | "on" | "off" | "none" | "~"
        )
        && s.parse::<f64>().is_err()
        // A digit, a dot or a sign may open a number (`-.inf`, `-0x1F`, `-1_000`).
        && !s.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '.' | '-'));
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
    }
}

fn dur(d: Option<Duration>) -> String {
    d.map(format_duration).unwrap_or_else(|| "none".into())
}

fn size(n: Option<u64>) -> String {
    n.map(format_size).unwrap_or_else(|| "none".into())
}

fn path(p: &std::path::Path) -> String {
    q(&p.display().to_string())
}

/// The resolved configuration as YAML that loads again unchanged: every
/// `!include` expanded, every default filled in, each channel's source file
/// as a comment, derived dead-letter channels left out. A channel's keys
/// that take the broker-wide default when absent are printed only when the
/// file wrote them; braces stay as written.
pub fn render(c: &Config) -> String {
    let mut o = String::new();
    let b = &c.broker;
    let l = &b.limits;
    let _ = writeln!(o, "# resolved from {}", c.source.display());
    let _ = writeln!(o, "broker:");
    let _ = writeln!(o, "  id: {}", q(&b.id));
    let _ = writeln!(o, "  log_level: {}", b.log_level.as_str());
    let _ = LogLevel::Info;
    if let Some(p) = &b.pid_file {
        let _ = writeln!(o, "  pid_file: {}", path(p));
    }
    let _ = writeln!(o, "  mqtt:");
    if !b.mqtt.listen.defaulted {
        let _ = writeln!(o, "    listen:");
        listeners(&mut o, &b.mqtt.listen, "      ");
    }
    if let Some(p) = &b.mqtt.password_file {
        let _ = writeln!(o, "    password_file: {}", path(p));
    }
    if let Some(a) = b.mqtt.allow_anonymous {
        let _ = writeln!(o, "    allow_anonymous: {a}");
    }
    let v = match b.mqtt.min_protocol_version {
        ProtocolVersion::V3_1_1 => "\"3.1.1\"",
        ProtocolVersion::V5 => "\"5\"",
    };
    let _ = writeln!(o, "    min_protocol_version: {v}");
    if let Some(p) = &b.mqtt.acl_file {
        let _ = writeln!(o, "    acl_file: {}", path(p));
    }
    if let Some(ops) = &b.operations {
        let _ = writeln!(o, "  operations:");
        let _ = writeln!(o, "    listen:");
        listeners(&mut o, &ops.listen, "      ");
        if let Some(p) = &ops.password_file {
            let _ = writeln!(o, "    password_file: {}", path(p));
        }
        let _ = writeln!(
            o,
            "    min_scrape_interval: {}",
            format_duration(ops.min_scrape_interval)
        );
    }
    let s = &b.storage;
    let _ = writeln!(o, "  storage:");
    let _ = writeln!(o, "    default: {}", q(&s.default));
    let _ = writeln!(
        o,
        "    default_retention_period: {}",
        dur(s.default_retention_period)
    );
    let _ = writeln!(
        o,
        "    default_retention_bytes: {}",
        size(s.default_retention_bytes)
    );
    let _ = writeln!(o, "    providers:");
    for p in s.providers.values() {
        let _ = writeln!(o, "      {}: # {}", q(&p.name), p.origin.file);
        match &p.kind {
            ProviderKind::Sqlite(x) => {
                let _ = writeln!(o, "        type: sqlite");
                let _ = writeln!(o, "        file_path: {}", path(&x.file_path));
                if let Some(m) = x.max_bytes {
                    let _ = writeln!(o, "        max_bytes: {}", format_size(m));
                }
                match x.commit {
                    CommitMode::Collect => {}
                    CommitMode::PerPublish => {
                        let _ = writeln!(o, "        publish_commit_interval: none");
                    }
                    CommitMode::Batch {
                        interval,
                        max_records,
                    } => {
                        let _ = writeln!(
                            o,
                            "        publish_commit_interval: {}",
                            format_duration(interval)
                        );
                        let _ = writeln!(o, "        publish_commit_max_records: {max_records}");
                    }
                }
                let _ = writeln!(o, "        read_connections: {}", x.read_connections);
                let _ = writeln!(
                    o,
                    "        flush_interval: {}",
                    format_duration(x.flush_interval)
                );
            }
            ProviderKind::Memory(x) => {
                let _ = writeln!(o, "        type: memory");
                if let Some(m) = x.max_bytes {
                    let _ = writeln!(o, "        max_bytes: {}", format_size(m));
                }
                let d = x
                    .snapshot_dir
                    .as_deref()
                    .map(path)
                    .unwrap_or_else(|| "none".into());
                let _ = writeln!(o, "        snapshot_dir: {d}");
            }
        }
    }
    let _ = writeln!(o, "  retained:");
    let _ = writeln!(o, "    storage: {}", q(&b.retained.storage));
    let _ = writeln!(
        o,
        "    retention_period: {}",
        dur(b.retained.retention_period)
    );
    let _ = writeln!(o, "  limits:");
    let _ = writeln!(
        o,
        "    max_message_size: {}",
        format_size(l.max_message_size as u64)
    );
    let _ = writeln!(o, "    max_topic_length: {}", l.max_topic_length);
    let _ = writeln!(o, "    max_client_id_length: {}", l.max_client_id_length);
    let _ = writeln!(o, "    max_header_count: {}", l.max_header_count);
    let _ = writeln!(
        o,
        "    max_header_bytes: {}",
        format_size(l.max_header_bytes as u64)
    );
    let _ = writeln!(o, "    max_connections: {}", l.max_connections);
    let _ = writeln!(o, "    max_subscriptions: {}", l.max_subscriptions);
    let _ = writeln!(o, "    max_topic_levels: {}", l.max_topic_levels);
    let _ = writeln!(
        o,
        "    max_session_expiry: {}",
        format_duration(l.max_session_expiry)
    );
    let _ = writeln!(o, "    max_keepalive: {}", dur(l.max_keepalive));
    if let Some(r) = l.publish_rate {
        let _ = writeln!(o, "    publish_rate: {r}");
    }
    if let Some(r) = l.publish_bytes {
        let _ = writeln!(o, "    publish_bytes: {}", format_size(r));
    }
    let _ = writeln!(o, "    write_timeout: {}", dur(l.write_timeout));
    let _ = writeln!(
        o,
        "    connect_timeout: {}",
        format_duration(l.connect_timeout)
    );
    let _ = writeln!(
        o,
        "    max_connect_size: {}",
        format_size(l.max_connect_size as u64)
    );
    let _ = writeln!(
        o,
        "    max_connect_rate: {}",
        l.max_connect_rate
            .map(|r| r.to_string())
            .unwrap_or_else(|| "none".into())
    );
    let _ = writeln!(
        o,
        "    session_queue_bytes: {}",
        format_size(l.session_queue_bytes)
    );
    let _ = writeln!(o, "  qos2:");
    let _ = writeln!(
        o,
        "    max_inflight_per_client: {}",
        b.qos2.max_inflight_per_client
    );
    let _ = writeln!(
        o,
        "    expires_after: {}",
        format_duration(b.qos2.expires_after)
    );
    let _ = writeln!(o, "  share:");
    let _ = writeln!(o, "    expires_after: {}", dur(b.share.expires_after));
    let _ = writeln!(o, "  session:");
    let _ = writeln!(o, "    storage: {}", q(&b.session.storage));
    let _ = writeln!(
        o,
        "    ack_commit_interval: {}",
        format_duration(b.session.ack_commit_interval)
    );
    let mut shown: Vec<&Channel> = c.channels.iter().filter(|ch| ch.dlq_of.is_none()).collect();
    shown.sort_by_key(|ch| ch.position);
    if !shown.is_empty() {
        let _ = writeln!(o, "channels:");
        for ch in shown {
            channel(&mut o, ch);
        }
    }
    if !c.bridges.is_empty() {
        let _ = writeln!(o, "bridges:");
        for br in &c.bridges {
            bridge(&mut o, br);
        }
    }
    o
}

fn channel(o: &mut String, ch: &Channel) {
    let w = |k: &str| ch.written.contains(&k);
    let _ = writeln!(
        o,
        "  {}: # {} line {}",
        q(&ch.name),
        ch.origin.file,
        ch.origin.line
    );
    let _ = writeln!(o, "    type: {}", ch.kind.as_str());
    if w("filter") {
        let _ = writeln!(o, "    filter: {}", q(&ch.filter));
    }
    let _ = writeln!(o, "    storage: {}", q(&ch.storage));
    if w("retention_period") {
        let _ = writeln!(o, "    retention_period: {}", dur(ch.retention_period));
    }
    if w("retention_bytes") {
        let _ = writeln!(o, "    retention_bytes: {}", size(ch.retention_bytes));
    }
    if let Some(m) = ch.max_bytes {
        let _ = writeln!(o, "    max_bytes: {}", format_size(m));
    }
    if ch.kind == ChannelType::Append && (w("start") || ch.start == Start::Tail) {
        let _ = writeln!(
            o,
            "    start: {}",
            if ch.start == Start::Tail {
                "tail"
            } else {
                "floor"
            }
        );
    }
    if ch.kind == ChannelType::Latest {
        let _ = writeln!(
            o,
            "    deletion_retention_period: {}",
            dur(ch.deletion_retention_period)
        );
    }
    if let Some(qs) = &ch.queue {
        let _ = writeln!(
            o,
            "    visibility_timeout: {}",
            format_duration(qs.visibility_timeout)
        );
        if let Some(j) = qs.job_expires_after {
            let _ = writeln!(o, "    job_expires_after: {}", format_duration(j));
        }
        let _ = writeln!(o, "    retry:");
        let _ = writeln!(o, "      max_attempts: {}", qs.retry.max_attempts);
        if qs.retry.backoff != Backoff::None {
            let _ = writeln!(o, "      backoff: {}", qs.retry.backoff.as_str());
            if let Some(bb) = qs.retry.backoff_base {
                let _ = writeln!(o, "      backoff_base: {}", format_duration(bb));
            }
        }
        if let Some(p) = qs.dlq_retention_period {
            let _ = writeln!(o, "    dlq_retention_period: {}", dur(p));
        }
        if let Some(b) = qs.dlq_retention_bytes {
            let _ = writeln!(o, "    dlq_retention_bytes: {}", size(b));
        }
    }
}

fn bridge(o: &mut String, b: &Bridge) {
    let _ = writeln!(o, "  {}:", q(&b.name));
    let _ = writeln!(o, "    peer: {}", q(&b.peer.written));
    let _ = writeln!(o, "    client_id: {}", q(&b.client_id));
    for (k, v) in [
        ("ca_file", &b.ca_file),
        ("cert_file", &b.cert_file),
        ("key_file", &b.key_file),
    ] {
        if let Some(p) = v {
            let _ = writeln!(o, "    {k}: {}", path(p));
        }
    }
    let _ = writeln!(
        o,
        "    session_expiry: {}",
        format_duration(b.session_expiry)
    );
    let _ = writeln!(o, "    receive_maximum: {}", b.receive_maximum);
    let _ = writeln!(o, "    ack_interval: {}", format_duration(b.ack_interval));
    let _ = writeln!(o, "    topics:");
    // One rule per written rule: a braced rule expanded to several is printed once,
    // as written; two rules written on one line (a flow list) are two.
    let mut seen: Vec<(u32, &str, Option<&str>, &str)> = Vec::new();
    for r in &b.topics {
        let written = (
            r.line,
            r.written_filter.as_str(),
            r.topic.as_deref(),
            r.direction.as_str(),
        );
        if seen.contains(&written) {
            continue;
        }
        seen.push(written);
        let _ = writeln!(o, "      - filter: {}", q(&r.written_filter));
        if let Some(t) = &r.topic {
            let _ = writeln!(o, "        topic: {}", q(t));
        }
        let _ = writeln!(o, "        direction: {}", r.direction.as_str());
    }
}

fn addr(a: &ListenAddress) -> String {
    q(&a.written)
}

fn tls(o: &mut String, t: &Tls, ind: &str) {
    let _ = writeln!(o, "{ind}tls:");
    let _ = writeln!(o, "{ind}  cert_file: {}", path(&t.cert_file));
    let _ = writeln!(o, "{ind}  key_file: {}", path(&t.key_file));
    if let Some(ca) = &t.client_ca_file {
        let _ = writeln!(o, "{ind}  client_ca_file: {}", path(ca));
        let _ = writeln!(o, "{ind}  require_certificate: {}", t.require_certificate);
    }
    let v = match t.min_version {
        TlsVersion::V1_2 => "\"1.2\"",
        TlsVersion::V1_3 => "\"1.3\"",
    };
    let _ = writeln!(o, "{ind}  min_version: {v}");
}

fn listeners(o: &mut String, l: &Listeners, ind: &str) {
    if !l.tcp.is_empty() {
        let _ = writeln!(o, "{ind}tcp:");
        for d in &l.tcp {
            let (lead, pad) = door_lead(l.tcp.len(), "tcp", &d.name, ind);
            let _ = writeln!(o, "{lead}address: {}", addr(&d.address));
            if let Some(t) = &d.tls {
                tls(o, t, &pad);
            }
            auth(o, &d.password_file, d.allow_anonymous, &pad);
        }
    }
    if !l.ws.is_empty() {
        let _ = writeln!(o, "{ind}ws:");
        for d in &l.ws {
            let (lead, pad) = door_lead(l.ws.len(), "ws", &d.name, ind);
            let _ = writeln!(o, "{lead}address: {}", addr(&d.address));
            if let Some(t) = &d.tls {
                tls(o, t, &pad);
            }
            auth(o, &d.password_file, d.allow_anonymous, &pad);
            let _ = writeln!(o, "{pad}same_origin: {}", d.same_origin);
            if !d.allowed_origins.is_empty() {
                let _ = writeln!(o, "{pad}allowed_origins:");
                for origin in &d.allowed_origins {
                    let _ = writeln!(o, "{pad}  - {}", q(origin));
                }
            }
        }
    }
    if !l.unix.is_empty() {
        let _ = writeln!(o, "{ind}unix:");
        for d in &l.unix {
            let (lead, pad) = door_lead(l.unix.len(), "unix", &d.name, ind);
            let _ = writeln!(o, "{lead}path: {}", path(&d.path));
            let _ = writeln!(o, "{pad}mode: \"{:04o}\"", d.mode);
            if d.proxy_protocol {
                let _ = writeln!(o, "{pad}proxy_protocol: true");
            }
            auth(o, &d.password_file, d.allow_anonymous, &pad);
        }
    }
}

/// The first line's lead and the indent of a door's other keys: the mapping form for
/// the one door of its `kind` that carries the kind's own name (as it was read), the
/// list form with its name otherwise, so the name survives being read again.
fn door_lead(count: usize, kind: &str, name: &str, ind: &str) -> (String, String) {
    if count == 1 && name == kind {
        (format!("{ind}  "), format!("{ind}  "))
    } else {
        (
            format!("{ind}  - name: {}\n{ind}    ", q(name)),
            format!("{ind}    "),
        )
    }
}

fn auth(o: &mut String, pw: &Option<std::path::PathBuf>, anon: Option<bool>, pad: &str) {
    if let Some(p) = pw {
        let _ = writeln!(o, "{pad}password_file: {}", path(p));
    }
    if let Some(a) = anon {
        let _ = writeln!(o, "{pad}allow_anonymous: {a}");
    }
}

/// `--check-config`'s summary on success: the file, each channel and its
/// type, and where each bridge rule's records land.
pub fn summary(c: &Config) -> String {
    let router = Router::new(c);
    let mut o = format!("{}: ok\n", c.source.display());
    let mut shown: Vec<&Channel> = c.channels.iter().collect();
    shown.sort_by(|a, b| a.name.cmp(&b.name));
    let width = shown
        .iter()
        .map(|ch| ch.name.len())
        .max()
        .unwrap_or(0)
        .max(24);
    for ch in shown {
        let _ = writeln!(o, "  {:width$} {}", ch.name, ch.kind.as_str());
    }
    for b in &c.bridges {
        for r in &b.topics {
            let subject = if r.direction == super::Direction::In {
                r.topic.as_deref().unwrap_or(&r.filter)
            } else {
                &r.filter
            };
            let _ = writeln!(
                o,
                "  bridge {:?}, {} {:?}: {}",
                b.name,
                r.direction.as_str(),
                r.filter,
                lands(&router, subject, r.direction == super::Direction::In, r)
            );
        }
    }
    for n in &c.notes {
        let _ = writeln!(o, "  note: {n}");
    }
    o
}

/// Where an inbound rule's records land (its template with substitutions as `+`/`#`),
/// or what an outbound filter reads.
fn lands(router: &Router, subject: &str, inbound: bool, r: &super::BridgeRule) -> String {
    let pattern = if inbound && r.topic.is_some() {
        template_pattern(subject)
    } else {
        subject.to_string()
    };
    // An out rule reads here and publishes at the peer: say what it reads.
    let verb = if r.direction == super::Direction::Out {
        "reads"
    } else {
        "lands in"
    };
    if !crate::codec::has_wildcard(&pattern) {
        return match router.resolve(&pattern) {
            Route::Channel { name, kind, .. } => format!("{verb} {name} ({})", kind.as_str()),
            Route::Broadcast => format!("{verb} broadcast"),
        };
    }
    let reach = router.reach(&pattern);
    let mut served: Vec<String> = Vec::new();
    let mut crossed: Vec<String> = Vec::new();
    let mut touches: Vec<_> = reach.channels.iter().collect();
    touches.sort_by(|a, b| a.name.cmp(b.name));
    for t in touches {
        if t.kind == ChannelType::Queue {
            crossed.push(format!("{} (queue)", t.name));
        } else {
            served.push(format!("{} ({})", t.name, t.kind.as_str()));
        }
    }
    if served.is_empty() && reach.broadcast {
        served.push("broadcast".into());
    }
    let mut s = format!("{verb} {}", served.join(", "));
    if !crossed.is_empty() {
        let _ = write!(s, "; crosses {}, never served", crossed.join(", "));
    }
    s
}

/// The notes `--check-config` prints for bridge topics that leave a `$N`
/// unused, saying separately when the records land in a latest channel.
pub(crate) fn substitution_notes(channels: &[Channel], bridges: &[Bridge]) -> Vec<String> {
    let router = Router::from_channels(channels.iter().map(|c| {
        (
            c.name.clone(),
            c.kind,
            c.filters.clone(),
            (c.position, c.dlq_of.is_some()),
        )
    }));
    let mut notes = Vec::new();
    for b in bridges {
        for r in &b.topics {
            let Some(t) = &r.topic else { continue };
            for n in &r.unused {
                let mut note = format!(
                    "bridge {:?}, {} {:?}: topic {t:?} does not use ${n}, so every value of that + level lands on one topic",
                    b.name,
                    r.direction.as_str(),
                    r.filter
                );
                if r.direction == super::Direction::In {
                    let pattern = template_pattern(t);
                    let latest: Vec<&str> = if crate::codec::has_wildcard(&pattern) {
                        router
                            .reach(&pattern)
                            .channels
                            .iter()
                            .filter(|x| x.kind == ChannelType::Latest)
                            .map(|x| x.name)
                            .collect()
                    } else {
                        match router.resolve(&pattern) {
                            Route::Channel {
                                name,
                                kind: ChannelType::Latest,
                                ..
                            } => vec![name],
                            _ => Vec::new(),
                        }
                    };
                    if !latest.is_empty() {
                        note.push_str(&format!(
                            "; it lands in the latest channel {}, where those topics overwrite one value rather than crowd one topic",
                            latest.join(", ")
                        ));
                    }
                }
                notes.push(note);
            }
        }
    }
    notes
}

/// A topic template as a filter: `$1`.. stand for one level, `$#` for the tail.
fn template_pattern(t: &str) -> String {
    t.split('/')
        .map(|l| {
            if l == "$#" {
                "#".to_string()
            } else if l.contains('$') {
                "+".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}
