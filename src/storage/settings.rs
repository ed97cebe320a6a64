//! Typed settings for providers and channels. The configuration layer maps its
//! validated YAML onto these; storage never reads YAML.

use std::path::PathBuf;
use std::time::Duration;

/// How a sqlite provider groups publishes into transactions (RFC 0002 "How a sqlite
/// provider commits publishes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitMode {
    /// Both keys absent: collect without waiting. What arrived during one commit goes
    /// into the next, at most [`COLLECT_MAX_RECORDS`] records a transaction (B-139, B-140).
    #[default]
    Collect,
    /// `publish_commit_interval: none`: a transaction per publish (B-141).
    PerPublish,
    /// `publish_commit_interval` + `publish_commit_max_records`: the first publish waits
    /// up to `interval` for company, closing early at `max_records` (B-142, B-143).
    Interval {
        /// 1ms to 1s.
        interval: Duration,
        /// 2 to `limits.max_connections`.
        max_records: usize,
    },
}

/// Records one collecting transaction holds at most (B-140).
pub const COLLECT_MAX_RECORDS: usize = 256;

/// A sqlite provider's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteSettings {
    /// The provider's name, as channels and log lines refer to it.
    pub name: String,
    /// The database file (absolute). The lock is `<file_path>.lock`.
    pub file_path: PathBuf,
    /// Bound on the file, enforced in pages (B-419).
    pub max_bytes: u64,
    /// The reserve: `limits.max_message_size + limits.max_header_bytes` (C-115).
    pub reserve_bytes: u64,
    /// Group commit.
    pub commit: CommitMode,
    /// Read-only connections, 0 to 8; 0 puts reads on the write connection (B-152, B-153).
    pub read_connections: usize,
    /// How often the write-ahead log is forced to disk, 10ms to 1s (B-157).
    pub flush_interval: Duration,
}

impl SqliteSettings {
    /// The defaults for everything but what has none (name, path, bounds).
    pub fn new(
        name: impl Into<String>,
        file_path: impl Into<PathBuf>,
        max_bytes: u64,
        reserve_bytes: u64,
    ) -> SqliteSettings {
        SqliteSettings {
            name: name.into(),
            file_path: file_path.into(),
            max_bytes,
            reserve_bytes,
            commit: CommitMode::Collect,
            read_connections: 2,
            flush_interval: Duration::from_millis(150),
        }
    }
}

/// A memory provider's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemorySettings {
    /// The provider's name.
    pub name: String,
    /// Bound on what it holds, counted by `record_size` (B-417).
    pub max_bytes: u64,
    /// The reserve: `limits.max_message_size + limits.max_header_bytes` (C-115).
    pub reserve_bytes: u64,
    /// Where snapshots go at graceful shutdown; `None` is `snapshot_dir: none` (B-502).
    pub snapshot_dir: Option<PathBuf>,
}

/// A channel's retention: each `None` is the word `none` (keep everything by that rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// `retention_period`: records older than this are removed by the age sweep.
    pub period: Option<Duration>,
    /// `retention_bytes`: the oldest records are removed by the size sweep to stay under.
    pub bytes: Option<u64>,
}

/// What kind of channel, with what only that kind takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelKind {
    /// An append log.
    Append,
    /// One current value per topic; deletions are tombstones kept for
    /// `deletion_retention_period` (`None` keeps them, A-092).
    Latest {
        /// `deletion_retention_period`.
        deletion_retention: Option<Duration>,
    },
    /// Work; never removed by retention (invariant 2).
    Queue {
        /// `job_expires_after`: counted as a deadline for the age-sweep interval (C-026).
        job_expires_after: Option<Duration>,
    },
    /// A queue's `<queue>__dlq`: an append channel in every respect (C-134) that shares
    /// its queue's snapshot file.
    DeadLetter {
        /// The queue it belongs to.
        queue: String,
    },
}

/// A channel as its provider needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSettings {
    /// The kind.
    pub kind: ChannelKind,
    /// The channel's own `max_bytes` (append, dead-letter and queue).
    pub max_bytes: Option<u64>,
    /// Retention (ignored on a queue; `bytes` ignored on latest, per B-415).
    pub retention: Retention,
}

impl ChannelSettings {
    /// An append channel with no bounds.
    pub fn append() -> ChannelSettings {
        ChannelSettings {
            kind: ChannelKind::Append,
            max_bytes: None,
            retention: Retention::default(),
        }
    }

    /// Retention as it applies to this kind: none on a queue, no bytes on latest.
    pub fn effective_retention(&self) -> Retention {
        match self.kind {
            ChannelKind::Queue { .. } => Retention::default(),
            ChannelKind::Latest { .. } => Retention {
                period: self.retention.period,
                bytes: None,
            },
            _ => self.retention,
        }
    }

    /// Whether records on this channel carry delivery state.
    pub fn is_queue(&self) -> bool {
        matches!(self.kind, ChannelKind::Queue { .. })
    }

    /// Whether this is a latest channel.
    pub fn is_latest(&self) -> bool {
        matches!(self.kind, ChannelKind::Latest { .. })
    }
}

/// A provider setting the storage layer refuses, naming the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    /// The provider.
    pub provider: String,
    /// The key.
    pub key: &'static str,
    /// What is wrong and what to write instead.
    pub message: String,
}

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "storage provider {}: {}: {}",
            self.provider, self.key, self.message
        )
    }
}

impl std::error::Error for SettingsError {}

/// What an empty sqlite database takes before any record (B-499).
pub const SQLITE_EMPTY_BYTES: u64 = 88 * 1024;

fn reserve_rule(provider: &str, max_bytes: u64, reserve: u64) -> Option<SettingsError> {
    (max_bytes < reserve.saturating_mul(2)).then(|| SettingsError {
        provider: provider.to_owned(),
        key: "max_bytes",
        message: format!(
            "{max_bytes} is below twice the reserve of {reserve} bytes (limits.max_message_size + limits.max_header_bytes); raise max_bytes to at least {} or lower limits.max_message_size",
            reserve.saturating_mul(2)
        ),
    })
}

impl SqliteSettings {
    /// The storage rules of RFC 0002 "Validation" that concern a sqlite provider
    /// (B-144, B-145, B-152, B-158, B-498, B-499, B-503). Every finding is returned.
    pub fn validate(&self, max_connections: usize) -> Vec<SettingsError> {
        let err = |key, message: String| SettingsError {
            provider: self.name.clone(),
            key,
            message,
        };
        let mut out = Vec::new();
        if !self.file_path.is_absolute() {
            out.push(err("file_path", "must be an absolute path".into()));
        }
        out.extend(reserve_rule(&self.name, self.max_bytes, self.reserve_bytes));
        let floor = SQLITE_EMPTY_BYTES + self.reserve_bytes.saturating_mul(2);
        if self.max_bytes <= floor {
            out.push(err(
                "max_bytes",
                format!("{} is not above the 88KiB an empty database takes plus twice the reserve ({floor} bytes)", self.max_bytes),
            ));
        }
        if self.read_connections > 8 {
            out.push(err(
                "read_connections",
                format!(
                    "{} is above 8; write a whole number from 0 to 8",
                    self.read_connections
                ),
            ));
        }
        let ms = Duration::from_millis;
        if self.flush_interval < ms(10) || self.flush_interval > ms(1000) {
            out.push(err(
                "flush_interval",
                "must be a duration from 10ms to 1s".into(),
            ));
        }
        if let CommitMode::Interval {
            interval,
            max_records,
        } = self.commit
        {
            if interval < ms(1) || interval > ms(1000) {
                out.push(err(
                    "publish_commit_interval",
                    "must be none or a duration from 1ms to 1s".into(),
                ));
            }
            if max_records < 2 || max_records > max_connections {
                out.push(err(
                    "publish_commit_max_records",
                    format!(
                        "{max_records} is outside 2 to limits.max_connections ({max_connections})"
                    ),
                ));
            }
        }
        out
    }
}

impl MemorySettings {
    /// The storage rules of RFC 0002 "Validation" that concern a memory provider
    /// (B-498, B-503).
    pub fn validate(&self) -> Vec<SettingsError> {
        let mut out: Vec<SettingsError> =
            reserve_rule(&self.name, self.max_bytes, self.reserve_bytes)
                .into_iter()
                .collect();
        if let Some(dir) = &self.snapshot_dir
            && !dir.is_absolute()
        {
            out.push(SettingsError {
                provider: self.name.clone(),
                key: "snapshot_dir",
                message: "must be an absolute path, or none".into(),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// B-498, B-499: max_bytes against the reserve, naming both figures.
    #[test]
    fn max_bytes_below_twice_reserve_is_refused_naming_both_figures() {
        let s = SqliteSettings::new("local", "/var/lib/s.db", 1_000_000, 600_000);
        let errs = s.validate(100);
        assert!(errs.iter().any(|e| e.key == "max_bytes"
            && e.message.contains("600000")
            && e.message.contains("1000000")));
        let ok = SqliteSettings::new("local", "/var/lib/s.db", 10_000_000, 1_000_000);
        assert!(ok.validate(100).is_empty());
    }

    /// B-144, B-145, B-152, B-158.
    #[test]
    fn out_of_range_sqlite_keys_are_each_reported() {
        let mut s = SqliteSettings::new("local", "relative.db", 10_000_000, 1000);
        s.read_connections = 9;
        s.flush_interval = Duration::from_millis(5);
        s.commit = CommitMode::Interval {
            interval: Duration::from_secs(2),
            max_records: 1,
        };
        let keys: Vec<_> = s.validate(100).into_iter().map(|e| e.key).collect();
        for k in [
            "file_path",
            "read_connections",
            "flush_interval",
            "publish_commit_interval",
            "publish_commit_max_records",
        ] {
            assert!(keys.contains(&k), "{k} missing from {keys:?}");
        }
    }
}
