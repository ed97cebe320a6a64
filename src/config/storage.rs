//! `broker.storage`: providers, the default provider and default retention.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::Origin;
use super::include;
use super::limits::Limits;
use super::node::{Kind, Node};
use super::units::format_size;
use super::walk::{self, Ctx, DurationRule, Fields};

/// `broker.storage`.
#[derive(Debug, Clone, PartialEq)]
pub struct Storage {
    /// `broker.storage.default`: the provider a channel gets when it names none.
    pub default: String,
    /// `default_retention_period`: `None` is the written `none` (keep everything).
    pub default_retention_period: Option<Duration>,
    /// `default_retention_bytes`: `None` is the written `none`.
    pub default_retention_bytes: Option<u64>,
    /// Every provider, by name (the order of the file decides nothing).
    pub providers: BTreeMap<String, Provider>,
    /// Providers written but refused, each already reported where it is defined: a
    /// reference to one is not reported again. Empty in a valid configuration.
    pub(crate) refused: BTreeSet<String>,
}

/// A storage provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    /// Its name.
    pub name: String,
    /// Its type and settings.
    pub kind: ProviderKind,
    /// Where it was defined.
    pub origin: Origin,
}

impl Storage {
    /// Reports `name`, written at `node` under `path`, when no provider has it; a
    /// provider that was written but refused is already reported at its definition,
    /// and with no provider at all so is the missing block.
    pub(crate) fn check_reference(&self, ctx: &mut Ctx, node: &Node, path: &str, name: &str) {
        if self.providers.contains_key(name) || self.refused.contains(name) {
            return;
        }
        let written: Vec<&str> = self
            .providers
            .keys()
            .chain(&self.refused)
            .map(String::as_str)
            .collect();
        if !written.is_empty() {
            let list = walk::list_or(&written, "or");
            ctx.bad(
                node,
                path,
                format!("names no provider; write one of {list}"),
            );
        }
    }

    /// The `max_bytes` declared across every memory provider, for the startup
    /// line (Sagüin cannot know what the machine has; the operator adds it up).
    pub fn memory_total(&self) -> u64 {
        self.providers
            .values()
            .filter_map(|p| match &p.kind {
                ProviderKind::Memory(m) => m.max_bytes,
                ProviderKind::Sqlite(_) => None,
            })
            .sum()
    }
}

impl Provider {
    /// `max_bytes`, whichever type.
    pub fn max_bytes(&self) -> Option<u64> {
        match &self.kind {
            ProviderKind::Sqlite(s) => s.max_bytes,
            ProviderKind::Memory(m) => m.max_bytes,
        }
    }
}

/// `type: sqlite` or `type: memory`, with that type's settings.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderKind {
    /// A SQLite database file.
    Sqlite(SqliteSettings),
    /// Memory, optionally snapshotted at shutdown.
    Memory(MemorySettings),
}

/// A sqlite provider's settings, defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteSettings {
    /// `file_path`: the database file, absolute. Its lock is `<file_path>.lock`.
    pub file_path: PathBuf,
    /// `max_bytes`: a bound on the file, in bytes; `None` for no bound.
    pub max_bytes: Option<u64>,
    /// How publishes are committed (`publish_commit_interval` / `publish_commit_max_records`).
    pub commit: CommitMode,
    /// `read_connections`: read-only connections beside the writer, 0 to 8. Default 2.
    pub read_connections: u8,
    /// `flush_interval`: how often the write-ahead log is forced to disk. Default 150ms.
    pub flush_interval: Duration,
}

/// How a sqlite provider groups publishes into transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    /// Both keys absent: collect without waiting (what arrived during the
    /// previous commit, at most 256 records). The default.
    Collect,
    /// `publish_commit_interval: none`: a transaction per publish.
    PerPublish,
    /// Wait up to `interval` (1ms to 1s) or until `max_records` (2 to
    /// limits.max_connections) have arrived, whichever comes first.
    Batch {
        /// `publish_commit_interval`.
        interval: Duration,
        /// `publish_commit_max_records`.
        max_records: u32,
    },
}

/// A memory provider's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemorySettings {
    /// `max_bytes`: what its records and sessions may take; `None` for no bound.
    pub max_bytes: Option<u64>,
    /// `snapshot_dir`: where a snapshot is written at shutdown (absolute);
    /// `None` for the written `snapshot_dir: none` (keep nothing across a restart).
    pub snapshot_dir: Option<PathBuf>,
}

/// Every key `broker.storage` accepts.
pub(crate) const KEYS: &[&str] = &[
    "default",
    "default_retention_period",
    "default_retention_bytes",
    "providers",
];
const PROVIDER_KEYS: &[&str] = &[
    "type",
    "file_path",
    "max_bytes",
    "publish_commit_interval",
    "publish_commit_max_records",
    "read_connections",
    "flush_interval",
    "snapshot_dir",
];
const SQLITE_ONLY: &[&str] = &[
    "file_path",
    "publish_commit_interval",
    "publish_commit_max_records",
    "read_connections",
    "flush_interval",
];

/// What a sqlite database takes before any record.
const SQLITE_EMPTY: u64 = 88 << 10;
const DAY: u64 = 86_400;

/// A retention period: whole seconds, or `none` (`Some(None)`).
pub(crate) fn period(ctx: &mut Ctx, node: &Node, key: &str) -> Option<Option<Duration>> {
    let rule = DurationRule::seconds(Duration::from_secs(100 * 365 * DAY));
    walk::or_none(ctx, node, key, |c, n, k| walk::duration(c, n, k, rule))
}

/// A bytes bound: a size, or `none` (`Some(None)`); zero refused.
pub(crate) fn bytes(ctx: &mut Ctx, node: &Node, key: &str) -> Option<Option<u64>> {
    walk::or_none(ctx, node, key, |c, n, k| walk::size(c, n, k, 1, u64::MAX))
}

/// Reads `broker.storage`. `base` is the master file, for `!include`.
/// `parent_line` is the `broker:` line, where a missing block is reported.
pub(crate) fn read(
    ctx: &mut Ctx,
    node: Option<&Node>,
    parent_line: u32,
    base: &Path,
    limits: &Limits,
) -> Storage {
    let null = Node {
        kind: Kind::Null,
        line: 0,
        tag: None,
    };
    let mut f = Fields::open(ctx, node.unwrap_or(&null), "broker.storage", KEYS);
    let block_line = node.map(|n| n.line).unwrap_or(parent_line);
    let mut out = Storage {
        default: String::new(),
        default_retention_period: None,
        default_retention_bytes: None,
        providers: BTreeMap::new(),
        refused: BTreeSet::new(),
    };
    match f.take("providers") {
        Some(n) => read_providers(ctx, n, base, limits, &mut out),
        None => ctx.say(block_line, "broker.storage.providers", None, "is missing; define at least one provider, such as local: {type: sqlite, file_path: /var/lib/saguin/saguin.db}"),
    }
    if out.providers.is_empty() && out.refused.is_empty() && f.has("providers") {
        let line = f.key_line("providers").unwrap_or(block_line);
        ctx.say(line, "broker.storage.providers", None, "defines no provider; Sagüin keeps nothing in a store the operator did not name - define at least one");
    }
    match f.take("default") {
        Some(n) => {
            if let Some(name) = walk::string(ctx, n, "broker.storage.default") {
                out.check_reference(ctx, n, "broker.storage.default", &name);
                out.default = name;
            }
        }
        None => ctx.say(
            block_line,
            "broker.storage.default",
            None,
            "is missing and has no default; name the provider a channel gets when it names none",
        ),
    }
    match f.take("default_retention_period") {
        Some(n) => out.default_retention_period = period(ctx, n, "broker.storage.default_retention_period").flatten(),
        None => ctx.say(block_line, "broker.storage.default_retention_period", None, "is missing; it is always stated - write a duration such as 3d, or none to keep everything"),
    }
    match f.take("default_retention_bytes") {
        Some(n) => {
            out.default_retention_bytes =
                bytes(ctx, n, "broker.storage.default_retention_bytes").flatten()
        }
        None => ctx.say(
            block_line,
            "broker.storage.default_retention_bytes",
            None,
            "is missing; it is always stated - write a size such as 20GiB, or none for no bound",
        ),
    }
    f.finish(ctx);
    out
}

fn read_providers(ctx: &mut Ctx, node: &Node, base: &Path, limits: &Limits, storage: &mut Storage) {
    let path = "broker.storage.providers";
    let out = &mut storage.providers;
    let mut stores: Vec<(PathBuf, String, Origin)> = Vec::new();
    for group in include::groups(ctx, node, path, base, "providers") {
        let saved = std::mem::replace(&mut ctx.file, group.file.clone());
        let Kind::Map(entries) = &group.node.kind else {
            ctx.file = saved;
            continue;
        };
        let mut seen_here: Vec<&str> = Vec::new();
        for (key, value) in entries {
            let ppath = walk::join(path, &key.name);
            if seen_here.contains(&key.name.as_str()) {
                continue; // reported by the duplicate-key rule below
            }
            seen_here.push(&key.name);
            let origin = Origin {
                file: group.file.clone(),
                line: key.line,
            };
            if let Some(first) = out.get(&key.name) {
                ctx.say(
                    key.line,
                    &ppath,
                    None,
                    format!(
                        "is defined twice, here and in {} line {}; keep one definition",
                        first.origin.file, first.origin.line
                    ),
                );
                continue;
            }
            if !valid_name(&key.name) {
                ctx.say(
                    key.line,
                    &ppath,
                    None,
                    "is not a provider name; use only a-z, A-Z, 0-9, -, _ and .",
                );
            }
            let Some(kind) = read_provider(ctx, value, &ppath, limits, origin.line) else {
                storage.refused.insert(key.name.clone());
                continue;
            };
            let store = match &kind {
                ProviderKind::Sqlite(s) => Some(("file_path", s.file_path.clone())),
                ProviderKind::Memory(m) => m.snapshot_dir.clone().map(|d| ("snapshot_dir", d)),
            };
            if let Some((k, p)) = store {
                let cleaned = clean(&p);
                if let Some((_, other, o)) = stores.iter().find(|(q, _, _)| *q == cleaned) {
                    ctx.say(
                        key.line,
                        &walk::join(&ppath, k),
                        Some(format!("{:?}", p.display().to_string())),
                        format!(
                            "is the store provider {other} ({} line {}) already names; two names on one store are two writers on it - give each provider its own",
                            o.file, o.line
                        ),
                    );
                } else {
                    stores.push((cleaned, key.name.clone(), origin.clone()));
                }
            }
            out.insert(
                key.name.clone(),
                Provider {
                    name: key.name.clone(),
                    kind,
                    origin,
                },
            );
        }
        // Keys written twice in one group.
        let fields = Fields::open(ctx, &group.node, path, &[]);
        report_duplicates(ctx, fields);
        ctx.file = saved;
    }
}

/// Reports only the keys written twice (names are free-form, so none is unknown).
pub(crate) fn report_duplicates(ctx: &mut Ctx, fields: Fields) {
    fields.finish_duplicates_only(ctx);
}

pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Cleans a path lexically: `/var/lib/./x` and `/var/lib/y/../x` are `/var/lib/x`.
pub(crate) fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn read_provider(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    limits: &Limits,
    line: u32,
) -> Option<ProviderKind> {
    let mut f = Fields::open(ctx, node, path, PROVIDER_KEYS);
    let kind = match f.take("type") {
        Some(n) => match n.scalar_text().as_deref() {
            Some("sqlite") => Some("sqlite"),
            Some("memory") => Some("memory"),
            _ => {
                ctx.bad(n, &f.path("type"), "it is sqlite or memory");
                None
            }
        },
        None => {
            ctx.say(
                line,
                &f.path("type"),
                None,
                "is missing; write type: sqlite or type: memory",
            );
            None
        }
    };
    let reserve = limits.max_message_size as u64 + limits.max_header_bytes as u64;
    let max_bytes = f.take("max_bytes").and_then(|n| {
        let key = f.path("max_bytes");
        let v = walk::size(ctx, n, &key, 1, u64::MAX)?;
        let floor = if kind == Some("sqlite") { SQLITE_EMPTY + 2 * reserve } else { 2 * reserve };
        if v < floor || (kind == Some("sqlite") && v == floor) {
            let what = if kind == Some("sqlite") {
                format!("above {} (the empty database, 88KiB, plus twice the reserve)", format_size(floor))
            } else {
                format!("at least {}", format_size(floor))
            };
            ctx.bad(
                n,
                &key,
                format!(
                    "is below twice the reserve held back for the operations that free room - limits.max_message_size ({}) plus limits.max_header_bytes ({}); write {what}, or lower limits.max_message_size",
                    format_size(limits.max_message_size as u64),
                    format_size(limits.max_header_bytes as u64)
                ),
            );
            return None;
        }
        Some(v)
    });
    let result = match kind {
        Some("sqlite") => {
            if let Some(l) = f.key_line("snapshot_dir") {
                let _ = f.take("snapshot_dir");
                ctx.say(l, &f.path("snapshot_dir"), None, "is a memory provider's key; a sqlite provider names its database with file_path");
            }
            let file_path = match f.take("file_path") {
                Some(n) => walk::abs_path(ctx, n, &f.path("file_path")),
                None => {
                    ctx.say(line, &f.path("file_path"), None, "is missing and has no default; name the database file, such as /var/lib/saguin/saguin.db");
                    None
                }
            };
            let commit = commit_mode(ctx, &mut f, limits);
            let read_connections = f
                .take("read_connections")
                .and_then(|n| walk::uint(ctx, n, &f.path("read_connections"), 0, 8))
                .unwrap_or(2) as u8;
            let flush_interval = match f.take("flush_interval") {
                None => Duration::from_millis(150),
                Some(n) => {
                    let key = f.path("flush_interval");
                    if walk::is_none_word(n) {
                        ctx.bad(n, &key, "is refused: there is no setting that turns flushing off; write a duration from 10ms to 1s, or omit the key for 150ms");
                        None
                    } else {
                        let rule = DurationRule { millis: true, min: Duration::from_millis(10), max: Duration::from_secs(1) };
                        walk::duration(ctx, n, &key, rule)
                    }
                    .unwrap_or(Duration::from_millis(150))
                }
            };
            file_path.map(|file_path| {
                ProviderKind::Sqlite(SqliteSettings {
                    file_path,
                    max_bytes,
                    commit,
                    read_connections,
                    flush_interval,
                })
            })
        }
        Some(_) => {
            for k in SQLITE_ONLY {
                if let Some(l) = f.key_line(k) {
                    let _ = f.take(k);
                    ctx.say(l, &f.path(k), None, "is a sqlite provider's key and means nothing on a memory provider; remove it");
                }
            }
            let snapshot_dir = match f.take("snapshot_dir") {
                Some(n) if walk::is_none_word(n) => Some(None),
                Some(n) => walk::abs_path(ctx, n, &f.path("snapshot_dir")).map(Some),
                None => {
                    ctx.say(line, &f.path("snapshot_dir"), None, "is missing and has no default; name a directory, such as /var/lib/saguin/snapshots, or write none to keep nothing across a restart");
                    None
                }
            };
            snapshot_dir.map(|snapshot_dir| {
                ProviderKind::Memory(MemorySettings {
                    max_bytes,
                    snapshot_dir,
                })
            })
        }
        None => {
            for k in PROVIDER_KEYS {
                let _ = f.take(k);
            }
            None
        }
    };
    f.finish(ctx);
    result
}

fn commit_mode(ctx: &mut Ctx, f: &mut Fields, limits: &Limits) -> CommitMode {
    let interval_node = f.take("publish_commit_interval");
    let records_node = f.take("publish_commit_max_records");
    let ikey = f.path("publish_commit_interval");
    let rkey = f.path("publish_commit_max_records");
    let interval = match interval_node {
        None => None,
        Some(n) if walk::is_none_word(n) => Some(None),
        Some(n) => {
            let rule = DurationRule {
                millis: true,
                min: Duration::from_millis(1),
                max: Duration::from_secs(1),
            };
            match walk::duration(ctx, n, &ikey, rule) {
                Some(d) => Some(Some(d)),
                None => return CommitMode::Collect,
            }
        }
    };
    let records = records_node.and_then(|n| {
        let max = limits.max_connections as u64;
        let v = walk::uint(ctx, n, &rkey, 0, u32::MAX as u64)?;
        if v < 2 {
            ctx.bad(n, &rkey, "is 1 or less, which only makes every transaction wait; write a whole number from 2 to limits.max_connections, or remove both commit keys");
            None
        } else if v > max {
            ctx.bad(n, &rkey, format!("is more than limits.max_connections ({max}), so no batch could ever fill; write at most {max} - near the number of connections publishing at once"));
            None
        } else {
            Some((v as u32, n))
        }
    });
    match (interval, records_node, records) {
        (None, None, _) => CommitMode::Collect,
        (None, Some(n), _) => {
            ctx.bad(n, &rkey, "is set while publish_commit_interval is not, so nothing would wait for the count; write publish_commit_interval beside it, or remove it");
            CommitMode::Collect
        }
        (Some(None), None, _) => CommitMode::PerPublish,
        (Some(None), Some(n), _) => {
            ctx.bad(n, &rkey, "is set beside publish_commit_interval: none, which gives every publish its own transaction; remove it");
            CommitMode::PerPublish
        }
        (Some(Some(_)), None, _) => {
            let line = interval_node.map(|n| n.line).unwrap_or(0);
            ctx.say(line, &rkey, None, "is missing and has no default; with publish_commit_interval set, write the number of connections you expect to publish at once (2 to limits.max_connections)");
            CommitMode::Collect
        }
        (Some(Some(interval)), Some(_), Some((max_records, _))) => CommitMode::Batch {
            interval,
            max_records,
        },
        (Some(Some(_)), Some(_), None) => CommitMode::Collect,
    }
}
