//! `channels:`: names, filters, types and the keys each type takes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::Origin;
use super::include;
use super::limits::Limits;
use super::node::{Kind, Node};
use super::storage::{self, Storage};
use super::walk::{self, Ctx, DurationRule, Fields};
use crate::routing::filter;

/// A channel's type. There is no broadcast type: a topic no filter matches is broadcast.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChannelType {
    /// A replayable log; readers hold positions.
    Append,
    /// One current value per topic.
    Latest,
    /// Work handed to one worker at a time.
    Queue,
}

impl ChannelType {
    /// The spelling in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelType::Append => "append",
            ChannelType::Latest => "latest",
            ChannelType::Queue => "queue",
        }
    }
}

/// Where an append reader with no position starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Everything the channel still holds, then what follows (the default).
    Floor,
    /// Only what arrives after it subscribed.
    Tail,
}

/// A channel, every default applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    /// Its name: identity, one topic level.
    pub name: String,
    /// Its type.
    pub kind: ChannelType,
    /// The filter as written (braces kept), or `<name>/#` when none was written.
    pub filter: String,
    /// The plain filters `filter` expands to; what routing uses.
    pub filters: Vec<String>,
    /// The provider that keeps it (written, or broker.storage.default).
    pub storage: String,
    /// How long a record (append) or a quiet topic's value (latest) is kept;
    /// `None` keeps everything. Always `None` on a queue.
    pub retention_period: Option<Duration>,
    /// Oldest records removed to stay under this (append only); `None` for no bound.
    pub retention_bytes: Option<u64>,
    /// Publishes refused with 0x97 past this (append and queue); `None` for no bound.
    pub max_bytes: Option<u64>,
    /// Where an append reader with no position starts. Floor on every other type.
    pub start: Start,
    /// How long a latest channel keeps a deletion (default 1d); `None` keeps it
    /// as long as the channel exists. Always `None` on other types.
    pub deletion_retention_period: Option<Duration>,
    /// A queue's settings; `None` on other types.
    pub queue: Option<QueueSettings>,
    /// For a derived dead-letter channel, the queue it belongs to.
    pub dlq_of: Option<String>,
    /// Where it was defined (the queue's, for a derived channel).
    pub origin: Origin,
    /// The order it was read in, for display only: routing never looks at it.
    pub position: usize,
    /// The keys the file wrote for it, so `render` prints only those.
    pub written: Vec<&'static str>,
}

/// A queue's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// How long a worker holds a job before it is offered again. Default 30s.
    pub visibility_timeout: Duration,
    /// How long a job may wait before it is dead-lettered; `None` never expires work.
    pub job_expires_after: Option<Duration>,
    /// Retry policy.
    pub retry: Retry,
    /// The dead-letter channel's retention_period as written (`Some(None)` for none).
    pub dlq_retention_period: Option<Option<Duration>>,
    /// The dead-letter channel's retention_bytes as written (`Some(None)` for none).
    pub dlq_retention_bytes: Option<Option<u64>>,
}

/// `retry:` on a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Deliveries before a job is dead-lettered, at least 1. Default 5.
    pub max_attempts: u32,
    /// The shape of the wait between attempts. Default none.
    pub backoff: Backoff,
    /// The base of that wait, whole seconds; present exactly when `backoff` is not none.
    pub backoff_base: Option<Duration>,
}

/// `retry.backoff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// Offer again at once (the default).
    None,
    /// base, 2×base, 3×base, …
    Linear,
    /// base, 2×base, 4×base, …
    Exponential,
}

impl Backoff {
    /// The spelling in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Backoff::None => "none",
            Backoff::Linear => "linear",
            Backoff::Exponential => "exponential",
        }
    }
}

/// Every key a channel accepts, whatever its type.
pub(crate) const KEYS: &[&str] = &[
    "type",
    "filter",
    "storage",
    "retention_period",
    "retention_bytes",
    "max_bytes",
    "start",
    "deletion_retention_period",
    "visibility_timeout",
    "job_expires_after",
    "retry",
    "dlq_retention_period",
    "dlq_retention_bytes",
];
const RETRY_KEYS: &[&str] = &["max_attempts", "backoff", "backoff_base"];

/// Which types take which key, and what to say to the others.
fn refused_on(kind: ChannelType, key: &str) -> Option<&'static str> {
    use ChannelType::*;
    match (key, kind) {
        ("retention_bytes" | "max_bytes", Latest) => Some(
            "is refused on a latest channel: it holds one value per topic, not a history; bound it with retention_period",
        ),
        ("retention_period" | "retention_bytes", Queue) => Some(
            "is refused on a queue: deleting unacknowledged work by age or size is never permitted; bound a queue with max_bytes, and its dead letters with dlq_retention_period and dlq_retention_bytes",
        ),
        ("dlq_retention_period" | "dlq_retention_bytes", Append | Latest) => {
            Some("is refused: only a queue derives a dead-letter channel; remove it")
        }
        ("visibility_timeout" | "job_expires_after" | "retry", Append | Latest) => Some(
            "is a queue's key and is refused on any other type; remove it, or make the channel type: queue",
        ),
        ("start", Latest) => {
            Some("is refused on a latest channel, which always serves current state; remove it")
        }
        ("start", Queue) => {
            Some("is refused on a queue, which has no per-reader position; remove it")
        }
        ("deletion_retention_period", Append | Queue) => {
            Some("is a latest channel's key and is refused on any other type; remove it")
        }
        _ => None,
    }
}

/// The longest a file name may be, and what a snapshot adds to a channel's encoded name.
const FILE_NAME_MAX: usize = 255;
const SNAPSHOT_SUFFIX: usize = 9;

/// Checks a channel name; `Err` says what to write instead.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(
            "is empty; a channel name is 1 to 128 characters from a-z, A-Z, 0-9, -, _ and .".into(),
        );
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "holds {c:?}; a channel name holds only a-z, A-Z, 0-9, -, _ and . (it is one topic level and a file name) - place the channel with filter: instead"
        ));
    }
    if name == "." || name == ".." {
        return Err("names a directory in every listing; choose another name".into());
    }
    if name.len() > 128 {
        return Err(format!(
            "is {} bytes; a channel name is at most 128",
            name.len()
        ));
    }
    if name.ends_with("__dlq") {
        return Err("ends with __dlq, which is reserved for the dead-letter channel a queue derives; choose another name".into());
    }
    let encoded = name.len() + 2 * name.matches('.').count();
    if encoded + SNAPSHOT_SUFFIX > FILE_NAME_MAX {
        return Err(format!(
            "does not fit a snapshot file name: each . is percent-encoded, making {} bytes of the {FILE_NAME_MAX} a file name holds; use fewer dots or a shorter name",
            encoded + SNAPSHOT_SUFFIX
        ));
    }
    Ok(())
}

/// Reads `channels:` into channels sorted by name, each queue's dead-letter channel derived.
pub(crate) fn read(
    ctx: &mut Ctx,
    node: &Node,
    base: &Path,
    storage: &Storage,
    limits: &Limits,
) -> Vec<Channel> {
    let mut out: BTreeMap<String, Channel> = BTreeMap::new();
    for group in include::groups(ctx, node, "channels", base, "channels") {
        let saved = std::mem::replace(&mut ctx.file, group.file.clone());
        if let Kind::Map(entries) = &group.node.kind {
            let mut seen: Vec<&str> = Vec::new();
            for (key, value) in entries {
                if seen.contains(&key.name.as_str()) {
                    continue;
                }
                seen.push(&key.name);
                let path = walk::join("channels", &key.name);
                let origin = Origin {
                    file: group.file.clone(),
                    line: key.line,
                };
                if let Some(first) = out.get(&key.name) {
                    ctx.say(
                        key.line,
                        &path,
                        None,
                        format!(
                            "is defined twice, here and in {} line {}; a name belongs to one domain - rename one",
                            first.origin.file, first.origin.line
                        ),
                    );
                    continue;
                }
                if let Err(e) = check_name(&key.name) {
                    ctx.say(key.line, &path, Some(format!("{:?}", key.name)), e);
                }
                if let Some(mut ch) =
                    read_channel(ctx, &key.name, value, &path, origin, storage, limits)
                {
                    ch.position = out.len();
                    out.insert(key.name.clone(), ch);
                }
            }
            let fields = Fields::open(ctx, &group.node, "channels", &[]);
            fields.finish_duplicates_only(ctx);
        }
        ctx.file = saved;
    }
    check_duplicate_filters(ctx, &out);
    let mut all: Vec<Channel> = Vec::new();
    for ch in out.into_values() {
        let dlq = derive_dlq(&ch, storage);
        all.push(ch);
        all.extend(dlq);
    }
    all.sort_by(|a, b| a.name.cmp(&b.name));
    all
}

fn derive_dlq(queue: &Channel, storage: &Storage) -> Option<Channel> {
    let q = queue.queue.as_ref()?;
    Some(Channel {
        name: format!("{}__dlq", queue.name),
        kind: ChannelType::Append,
        filter: filter::dlq_filter(&queue.filter),
        filters: queue
            .filters
            .iter()
            .map(|f| filter::dlq_filter(f))
            .collect(),
        storage: queue.storage.clone(),
        retention_period: q
            .dlq_retention_period
            .unwrap_or(storage.default_retention_period),
        retention_bytes: q
            .dlq_retention_bytes
            .unwrap_or(storage.default_retention_bytes),
        max_bytes: None,
        start: Start::Floor,
        deletion_retention_period: None,
        queue: None,
        dlq_of: Some(queue.name.clone()),
        origin: queue.origin.clone(),
        position: queue.position,
        written: Vec::new(),
    })
}

fn check_duplicate_filters(ctx: &mut Ctx, channels: &BTreeMap<String, Channel>) {
    // Sorted by name, so the report does not depend on the file's order.
    let mut owners: BTreeMap<&str, &Channel> = BTreeMap::new();
    for ch in channels.values() {
        for f in &ch.filters {
            if let Some(first) = owners.get(f.as_str()) {
                if first.name == ch.name {
                    continue;
                }
                let saved = std::mem::replace(&mut ctx.file, ch.origin.file.clone());
                ctx.say(
                    ch.origin.line,
                    &format!("channels.{}.filter", ch.name),
                    Some(format!("{:?}", ch.filter)),
                    format!(
                        "claims {f}, as channel {} ({} line {}, filter {:?}) does; two channels may not carry the same filter - change one",
                        first.name, first.origin.file, first.origin.line, first.filter
                    ),
                );
                ctx.file = saved;
            } else {
                owners.insert(f, ch);
            }
        }
    }
}

fn read_channel(
    ctx: &mut Ctx,
    name: &str,
    node: &Node,
    path: &str,
    origin: Origin,
    storage: &Storage,
    limits: &Limits,
) -> Option<Channel> {
    let mut f = Fields::open(ctx, node, path, KEYS);
    let kind = match f.take("type") {
        Some(n) => match n.scalar_text().as_deref() {
            Some("append") => Some(ChannelType::Append),
            Some("latest") => Some(ChannelType::Latest),
            Some("queue") => Some(ChannelType::Queue),
            Some("broadcast") => {
                ctx.bad(n, &f.path("type"), "is not a type: a topic no filter matches is broadcast already; remove the channel, or write append, latest or queue");
                None
            }
            _ => {
                ctx.bad(n, &f.path("type"), "it is append, latest or queue");
                None
            }
        },
        None => {
            ctx.say(
                origin.line,
                &f.path("type"),
                None,
                "is missing; write type: append, latest or queue",
            );
            None
        }
    };
    let written: Vec<&'static str> = KEYS.iter().copied().filter(|k| f.has(k)).collect();
    let Some(kind) = kind else {
        for k in KEYS {
            let _ = f.take(k);
        }
        f.finish(ctx);
        return None;
    };
    // Keys this type refuses.
    for key in KEYS {
        if let (Some(msg), Some(line)) = (refused_on(kind, key), f.key_line(key)) {
            let _ = f.take(key);
            ctx.say(line, &f.path(key), None, msg);
        }
    }
    let (filter_text, filters) = read_filter(ctx, &mut f, name, kind, limits, origin.line);
    let storage_name = match f.take("storage") {
        Some(n) => walk::string(ctx, n, &f.path("storage"))
            .inspect(|s| storage.check_reference(ctx, n, &f.path("storage"), s)),
        None => None,
    }
    .unwrap_or_else(|| storage.default.clone());
    let retention_period = match f.take("retention_period") {
        Some(n) => storage::period(ctx, n, &f.path("retention_period")).flatten(),
        None if kind == ChannelType::Queue => None,
        None => storage.default_retention_period,
    };
    let retention_bytes = match f.take("retention_bytes") {
        Some(n) => storage::bytes(ctx, n, &f.path("retention_bytes")).flatten(),
        None if kind == ChannelType::Append => storage.default_retention_bytes,
        None => None,
    };
    let max_bytes = f
        .take("max_bytes")
        .and_then(|n| walk::size(ctx, n, &f.path("max_bytes"), 1, u64::MAX));
    let start = match f.take("start") {
        None => Start::Floor,
        Some(n) => match n.scalar_text().as_deref() {
            Some("floor") => Start::Floor,
            Some("tail") => Start::Tail,
            _ => {
                ctx.bad(
                    n,
                    &f.path("start"),
                    "it is floor or tail; omit the key for floor",
                );
                Start::Floor
            }
        },
    };
    let deletion_retention_period = match f.take("deletion_retention_period") {
        Some(n) => storage::period(ctx, n, &f.path("deletion_retention_period")).flatten(),
        None if kind == ChannelType::Latest => Some(Duration::from_secs(86_400)),
        None => None,
    };
    let queue = (kind == ChannelType::Queue).then(|| read_queue(ctx, &mut f, origin.line));
    f.finish(ctx);
    Some(Channel {
        name: name.to_string(),
        kind,
        filter: filter_text,
        filters,
        storage: storage_name,
        retention_period,
        retention_bytes,
        max_bytes,
        start,
        deletion_retention_period,
        queue,
        dlq_of: None,
        origin,
        position: 0,
        written,
    })
}

fn read_filter(
    ctx: &mut Ctx,
    f: &mut Fields,
    name: &str,
    kind: ChannelType,
    limits: &Limits,
    line: u32,
) -> (String, Vec<String>) {
    let key = f.path("filter");
    let (text, line, shown) = match f.take("filter") {
        Some(n) => match walk::string(ctx, n, &key) {
            Some(s) => (s, n.line, Some(n.show())),
            None => return (String::new(), Vec::new()),
        },
        None => (format!("{name}/#"), line, None),
    };
    let say = |ctx: &mut Ctx, msg: String| match &shown {
        Some(v) => ctx.phrase(line, &key, Some(v.clone()), msg),
        None => ctx.say(
            line,
            &key,
            None,
            format!("is not written, so the channel claims {text:?}, which {msg}; write a filter:"),
        ),
    };
    if kind == ChannelType::Queue && filter::has_braces(&text) {
        say(ctx, "holds {a,b} on a queue: its workers pin one exact string, and two spellings would be two groups each taking every job; write one filter, or one queue per spelling".into());
        return (text, Vec::new());
    }
    let expanded = match filter::expand_braces(&text) {
        Ok(v) => v,
        Err(e) => {
            say(ctx, e);
            return (text, Vec::new());
        }
    };
    let mut ok = Vec::new();
    for plain in expanded {
        let which = if plain == text {
            String::new()
        } else {
            format!(" (expanded to {plain})")
        };
        if let Err(e) = filter::check(&plain) {
            say(ctx, format!("{e}{which}"));
            continue;
        }
        let first = filter::levels(&plain).next().unwrap_or("");
        if first == "+" || first == "#" {
            say(
                ctx,
                format!(
                    "begins with {first}{which}, which would claim $SYS/ and $saguin/ with everything else; spell the first level out"
                ),
            );
            continue;
        }
        if first.starts_with('$') {
            say(
                ctx,
                format!(
                    "begins with ${which}; a channel may not claim the broker's own $ topics - spell out an ordinary first level"
                ),
            );
            continue;
        }
        if filter::levels(&plain).any(|l| l == "__dlq") {
            say(
                ctx,
                format!(
                    "has a level __dlq{which}, which is reserved for the filters the broker derives for dead letters; rename that level"
                ),
            );
            continue;
        }
        let depth = filter::levels(&plain).filter(|l| *l != "#").count() as u32;
        if depth > limits.max_topic_levels {
            say(
                ctx,
                format!(
                    "has {depth} levels{which}, more than limits.max_topic_levels ({}), so it could match nothing a client may publish; shorten it or raise the limit",
                    limits.max_topic_levels
                ),
            );
            continue;
        }
        let prefix_len = plain.strip_suffix("/#").unwrap_or(&plain).len() as u32;
        if prefix_len >= limits.max_topic_length {
            say(
                ctx,
                format!(
                    "is {prefix_len} bytes{which} and leaves no room for a topic under limits.max_topic_length ({}); shorten it or raise the limit",
                    limits.max_topic_length
                ),
            );
            continue;
        }
        if !ok.contains(&plain) {
            ok.push(plain);
        }
    }
    (text, ok)
}

fn read_queue(ctx: &mut Ctx, f: &mut Fields, line: u32) -> QueueSettings {
    let secs = DurationRule::seconds(Duration::from_secs(100 * 365 * 86_400));
    let vis_node = f.take("visibility_timeout");
    let visibility_timeout = vis_node
        .and_then(|n| walk::duration(ctx, n, &f.path("visibility_timeout"), secs))
        .unwrap_or(Duration::from_secs(30));
    let job_expires_after = f.take("job_expires_after").and_then(|n| {
        let key = f.path("job_expires_after");
        if walk::is_none_word(n) {
            ctx.bad(n, &key, "is not a value here: a queue that never expires work omits the key");
            return None;
        }
        let d = walk::duration(ctx, n, &key, secs)?;
        if d <= visibility_timeout {
            ctx.bad(
                n,
                &key,
                format!(
                    "is not longer than visibility_timeout ({}); a job must be able to time out at least once before it expires - write a longer period, or shorten visibility_timeout",
                    super::units::format_duration(visibility_timeout)
                ),
            );
        }
        Some(d)
    });
    let retry = match f.take("retry") {
        Some(n) => read_retry(ctx, n, &f.path("retry")),
        None => Retry {
            max_attempts: 5,
            backoff: Backoff::None,
            backoff_base: None,
        },
    };
    let _ = line;
    let dlq_retention_period = f
        .take("dlq_retention_period")
        .and_then(|n| storage::period(ctx, n, &f.path("dlq_retention_period")));
    let dlq_retention_bytes = f
        .take("dlq_retention_bytes")
        .and_then(|n| storage::bytes(ctx, n, &f.path("dlq_retention_bytes")));
    QueueSettings {
        visibility_timeout,
        job_expires_after,
        retry,
        dlq_retention_period,
        dlq_retention_bytes,
    }
}

fn read_retry(ctx: &mut Ctx, node: &Node, path: &str) -> Retry {
    let mut f = Fields::open(ctx, node, path, RETRY_KEYS);
    let max_attempts = f
        .take("max_attempts")
        .and_then(|n| walk::uint(ctx, n, &f.path("max_attempts"), 1, u32::MAX as u64))
        .unwrap_or(5) as u32;
    let backoff_node = f.take("backoff");
    let mut backoff_valid = true;
    let backoff = match backoff_node {
        None => Backoff::None,
        Some(n) => match n.scalar_text().as_deref() {
            Some("none") => Backoff::None,
            Some("linear") => Backoff::Linear,
            Some("exponential") => Backoff::Exponential,
            _ => {
                backoff_valid = false;
                ctx.bad(
                    n,
                    &f.path("backoff"),
                    "it is none, linear or exponential; omit the key for none",
                );
                Backoff::None
            }
        },
    };
    let base_node = f.take("backoff_base");
    let backoff_base = base_node.and_then(|n| {
        walk::duration(
            ctx,
            n,
            &f.path("backoff_base"),
            DurationRule::seconds(Duration::from_secs(86_400)),
        )
    });
    match (backoff, base_node, backoff_node) {
        (Backoff::Linear | Backoff::Exponential, None, Some(n)) => ctx.bad(
            n,
            &f.path("backoff"),
            "is written without retry.backoff_base, so it has no gap to build from; write backoff_base beside it, such as 2s",
        ),
        (Backoff::None, Some(n), _) if backoff_valid => ctx.bad(
            n,
            &f.path("backoff_base"),
            "is written without a retry.backoff of linear or exponential, so nothing reads it; write backoff beside it, or remove it",
        ),
        _ => {}
    }
    f.finish(ctx);
    Retry {
        max_attempts,
        backoff,
        backoff_base: if backoff == Backoff::None {
            None
        } else {
            backoff_base
        },
    }
}
