//! The small optional blocks: `broker.retained`, `qos2`, `share`, `session`
//! and `operations`.

use std::path::PathBuf;
use std::time::Duration;

use super::listen::{self, Block, DoorLine, Listeners};
use super::node::{Kind, Node};
use super::storage::{self, Storage};
use super::walk::{self, Ctx, DurationRule, Fields};

/// `broker.retained`: the store for retained messages on broadcast topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retained {
    /// The provider that keeps them. Default broker.storage.default.
    pub storage: String,
    /// How long a quiet topic's value is kept; `None` (the default) keeps it.
    pub retention_period: Option<Duration>,
}

/// `broker.qos2`: exactly-once publishes held before their PUBREL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qos2 {
    /// Unreleased exactly-once publishes one client may hold. Default 20.
    pub max_inflight_per_client: u32,
    /// How long a held publish waits for its PUBREL. Default 5m.
    pub expires_after: Duration,
}

/// `broker.share`: what a shared group is owed while its members are away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// Drops a backlogged delivery that waited this long; `None` (the default)
    /// keeps it as long as a member session.
    pub expires_after: Option<Duration>,
}

/// `broker.session`: where every session's state is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The provider that keeps sessions. Default broker.storage.default.
    pub storage: String,
    /// How long acknowledgements may wait to be taken for writing. Default 200ms.
    pub ack_commit_interval: Duration,
}

/// `broker.operations`: the HTTP listener for /health, /metrics and /v1/operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operations {
    /// Its doors (tcp and unix; never ws).
    pub listen: Listeners,
    /// The operators who may read it, absolute; a door's own file wins.
    pub password_file: Option<PathBuf>,
    /// The shortest interval at which metrics are recomputed; at least 60s. Default 60s.
    pub min_scrape_interval: Duration,
}

const DAY: u64 = 86_400;

fn refuse(ctx: &mut Ctx, f: &mut Fields, key: &str, text: &str) {
    if let Some(line) = f.key_line(key) {
        let _ = f.take_unchecked(key);
        ctx.say(line, &f.path(key), None, text);
    }
}

fn storage_name(ctx: &mut Ctx, f: &mut Fields, storage: &Storage) -> String {
    match f.take("storage") {
        Some(n) => match walk::string(ctx, n, &f.path("storage")) {
            Some(s) => {
                storage.check_reference(ctx, n, &f.path("storage"), &s);
                s
            }
            None => storage.default.clone(),
        },
        None => storage.default.clone(),
    }
}

pub(crate) fn retained(ctx: &mut Ctx, node: Option<&Node>, storage: &Storage) -> Retained {
    let null = Node {
        kind: Kind::Null,
        line: 0,
        tag: None,
    };
    let mut f = Fields::open(
        ctx,
        node.unwrap_or(&null),
        "broker.retained",
        &["storage", "retention_period"],
    );
    refuse(
        ctx,
        &mut f,
        "retention_bytes",
        "is refused: the retained store holds one value per topic, not a history; its size is its provider's max_bytes",
    );
    refuse(
        ctx,
        &mut f,
        "max_bytes",
        "is refused: the retained store is bounded by its provider's max_bytes; set it there",
    );
    let storage_v = storage_name(ctx, &mut f, storage);
    let retention_period = f
        .take("retention_period")
        .and_then(|n| storage::period(ctx, n, "broker.retained.retention_period"))
        .flatten();
    f.finish(ctx);
    Retained {
        storage: storage_v,
        retention_period,
    }
}

pub(crate) fn qos2(ctx: &mut Ctx, node: Option<&Node>) -> Qos2 {
    let null = Node {
        kind: Kind::Null,
        line: 0,
        tag: None,
    };
    let mut f = Fields::open(
        ctx,
        node.unwrap_or(&null),
        "broker.qos2",
        &["max_inflight_per_client", "expires_after"],
    );
    refuse(
        ctx,
        &mut f,
        "max_bytes",
        "is refused: a held message counts against its provider's max_bytes, and max_inflight_per_client bounds one client; remove it",
    );
    for k in ["enabled", "enable", "disabled"] {
        refuse(
            ctx,
            &mut f,
            k,
            "is refused: every Sagüin offers QoS 2; take it from a client with the acl_file's features denial",
        );
    }
    let max_inflight_per_client = f
        .take("max_inflight_per_client")
        .and_then(|n| walk::uint(ctx, n, "broker.qos2.max_inflight_per_client", 1, 65_535))
        .unwrap_or(20) as u32;
    let expires_after = f
        .take("expires_after")
        .and_then(|n| {
            walk::duration(
                ctx,
                n,
                "broker.qos2.expires_after",
                DurationRule::seconds(Duration::from_secs(365 * DAY)),
            )
        })
        .unwrap_or(Duration::from_secs(300));
    f.finish(ctx);
    Qos2 {
        max_inflight_per_client,
        expires_after,
    }
}

pub(crate) fn share(ctx: &mut Ctx, node: Option<&Node>) -> Share {
    let null = Node {
        kind: Kind::Null,
        line: 0,
        tag: None,
    };
    let mut f = Fields::open(
        ctx,
        node.unwrap_or(&null),
        "broker.share",
        &["expires_after"],
    );
    let expires_after = f
        .take("expires_after")
        .and_then(|n| storage::period(ctx, n, "broker.share.expires_after"))
        .flatten();
    f.finish(ctx);
    Share { expires_after }
}

pub(crate) fn session(ctx: &mut Ctx, node: Option<&Node>, storage: &Storage) -> Session {
    let null = Node {
        kind: Kind::Null,
        line: 0,
        tag: None,
    };
    let mut f = Fields::open(
        ctx,
        node.unwrap_or(&null),
        "broker.session",
        &["storage", "ack_commit_interval"],
    );
    refuse(
        ctx,
        &mut f,
        "max_bytes",
        "is refused: the provider's max_bytes bounds the session store, and limits.session_queue_bytes bounds one session; remove it",
    );
    let storage_v = storage_name(ctx, &mut f, storage);
    let ack_commit_interval = match f.take("ack_commit_interval") {
        None => None,
        Some(n) if walk::is_none_word(n) => {
            ctx.bad(n, "broker.session.ack_commit_interval", "is refused: nothing else stops acknowledgements being stored; write a duration from 10ms to 1s, or omit the key for 200ms");
            None
        }
        Some(n) => walk::duration(
            ctx,
            n,
            "broker.session.ack_commit_interval",
            DurationRule { millis: true, min: Duration::from_millis(10), max: Duration::from_secs(1) },
        ),
    }
    .unwrap_or(Duration::from_millis(200));
    f.finish(ctx);
    Session {
        storage: storage_v,
        ack_commit_interval,
    }
}

pub(crate) fn operations(ctx: &mut Ctx, node: &Node) -> (Operations, Vec<DoorLine>) {
    let mut f = Fields::open(
        ctx,
        node,
        "broker.operations",
        &["listen", "password_file", "min_scrape_interval"],
    );
    refuse(
        ctx,
        &mut f,
        "allow_anonymous",
        "is refused on the operations listener: true would open /metrics to whoever can reach it; give the door a password_file, a client certificate, or use the Unix socket",
    );
    let listen_node = f.take("listen");
    let (listen, doors) = listen::read(
        ctx,
        listen_node,
        "broker.operations.listen",
        Block::Operations,
    );
    if listen.tcp.is_empty() && listen.unix.is_empty() {
        let line = f.key_line("listen").unwrap_or(node.line);
        ctx.say(line, "broker.operations.listen", None, "opens no door, and there is no default address; write listen.tcp.address (such as 127.0.0.1:9090) or listen.unix.path, or remove the operations block");
    }
    let password_file = f
        .take("password_file")
        .and_then(|n| walk::abs_path(ctx, n, "broker.operations.password_file"));
    let min_scrape_interval = f
        .take("min_scrape_interval")
        .and_then(|n| {
            let key = "broker.operations.min_scrape_interval";
            let d = walk::duration(ctx, n, key, DurationRule::seconds(Duration::from_secs(DAY)))?;
            if d < Duration::from_secs(60) {
                ctx.bad(n, key, "is below the 60s floor and would not be honoured; write 60s or more, or omit the key for 60s");
                return None;
            }
            Some(d)
        })
        .unwrap_or(Duration::from_secs(60));
    f.finish(ctx);
    // A TCP door on a routable address must authenticate somebody.
    for door in &listen.tcp {
        let loopback = door
            .address
            .socket_addr()
            .map(|a| a.ip().to_canonical().is_loopback())
            .unwrap_or(door.address.host == "localhost");
        let authenticates = door.password_file.is_some()
            || password_file.is_some()
            || door
                .tls
                .as_ref()
                .is_some_and(super::Tls::requires_certificate);
        if !loopback
            && !authenticates
            && let Some(d) = doors.iter().find(|d| d.name == door.name)
        {
            ctx.say(
                d.bind_line,
                &format!("{}.address", d.path),
                Some(format!("{:?}", door.address.written)),
                "is not loopback and nothing on this door authenticates; give it a password_file (its own or broker.operations'), tls with a required client certificate, or a 127.0.0.1 address",
            );
        }
    }
    (
        Operations {
            listen,
            password_file,
            min_scrape_interval,
        },
        doors,
    )
}
