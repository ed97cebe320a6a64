//! The one interface channel code uses: [`Provider`], over both kinds.

use super::error::StorageError;
use super::memory::MemoryProvider;
use super::record::{
    ChannelStats, DeadLetter, Held, HeldKey, NewRecord, Record, RecordState, SweepReport, Window,
    WindowRequest,
};
use super::settings::{ChannelSettings, MemorySettings, SqliteSettings};
use super::sqlite::SqliteProvider;

/// A provider's settings, either kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderSettings {
    /// `type: sqlite`.
    Sqlite(SqliteSettings),
    /// `type: memory`.
    Memory(MemorySettings),
}

impl ProviderSettings {
    /// The provider's name.
    pub fn name(&self) -> &str {
        match self {
            ProviderSettings::Sqlite(s) => &s.name,
            ProviderSettings::Memory(s) => &s.name,
        }
    }
}

/// A storage provider of either kind. Channel code holds one of these (behind an `Arc`)
/// and never learns which kind it is on.
#[derive(Debug)]
pub enum Provider {
    /// A sqlite file.
    Sqlite(SqliteProvider),
    /// Memory with snapshots.
    Memory(MemoryProvider),
}

impl Provider {
    /// Opens a provider: takes its lock, opens or loads its store, starts its threads.
    /// Blocking: call at startup.
    ///
    /// # Errors
    /// [`StorageError::Locked`] when another broker holds it; [`StorageError::Io`] or
    /// [`StorageError::Snapshot`] when its store cannot be opened.
    pub fn open(settings: &ProviderSettings) -> Result<Provider, StorageError> {
        Ok(match settings {
            ProviderSettings::Sqlite(s) => Provider::Sqlite(SqliteProvider::open(s)?),
            ProviderSettings::Memory(s) => Provider::Memory(MemoryProvider::open(s)?),
        })
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        match self {
            Provider::Sqlite(p) => p.name(),
            Provider::Memory(p) => p.name(),
        }
    }

    /// What the provider's `max_bytes` counts now: a memory provider's records, a sqlite
    /// provider's pages in use as of its last commit. For metrics and startup lines.
    pub fn used_bytes(&self) -> u64 {
        match self {
            Provider::Sqlite(p) => p.writer_stats().used_bytes,
            Provider::Memory(p) => p.used_bytes(),
        }
    }

    /// Its `max_bytes`: what `used_bytes` may grow to, the reserve included.
    pub fn max_bytes(&self) -> u64 {
        match self {
            Provider::Sqlite(p) => p.max_bytes(),
            Provider::Memory(p) => p.max_bytes(),
        }
    }

    /// Whether `bytes` more would fit under its `max_bytes` less the reserve: a
    /// memory provider's count, a sqlite provider's pages in use at its last commit.
    ///
    /// # Errors
    /// [`StorageError::ProviderFull`] when they would not.
    pub fn check_room(&self, bytes: u64) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.check_room(bytes),
            Provider::Memory(p) => p.check_room(bytes),
        }
    }

    /// Whether the provider can write now (`/health`).
    ///
    /// # Errors
    /// What stops it, naming the provider.
    pub fn health(&self) -> Result<(), String> {
        match self {
            Provider::Sqlite(p) => p.health(),
            Provider::Memory(p) => p.health(),
        }
    }

    /// Graceful shutdown: a sqlite provider finishes its queued writes and forces its log
    /// to disk; a memory provider writes its snapshot. Blocking.
    ///
    /// # Errors
    /// A memory provider's snapshot that could not be written.
    pub fn close(&self, now_ms: u64) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => {
                p.close();
                Ok(())
            }
            Provider::Memory(p) => p.write_snapshot(now_ms).map(|_| ()),
        }
    }

    /// Opens (creating if new) a channel with its settings; call for every configured channel at startup, the dead-letter channel of a queue included.
    pub async fn open_channel(
        &self,
        name: &str,
        settings: ChannelSettings,
    ) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.open_channel(name, settings).await,
            Provider::Memory(p) => p.open_channel(name, settings).await,
        }
    }

    /// Stores a record and returns its offset once it is durable as the provider promises (committed, on sqlite). Refused with a 0x97 error at the channel's `max_bytes` or the provider's bound less its reserve.
    pub async fn append(&self, channel: &str, record: NewRecord) -> Result<u64, StorageError> {
        self.append_releasing(channel, record, None).await
    }

    /// [`Provider::append`], and in the same store operation the held QoS 2 publish
    /// `release` names is removed (B-442): one sqlite transaction, one lock of a
    /// memory provider, so no crash or refusal falls between the two. A refused
    /// append releases nothing; a held publish already gone is no error.
    pub async fn append_releasing(
        &self,
        channel: &str,
        record: NewRecord,
        release: Option<HeldKey>,
    ) -> Result<u64, StorageError> {
        match self {
            Provider::Sqlite(p) => p.append_releasing(channel, record, release).await,
            Provider::Memory(p) => p.append_releasing(channel, record, release).await,
        }
    }

    /// Keeps an inbound QoS 2 publish until its PUBREL (B-441), replacing one under
    /// the same (client id, packet id). Counted against `max_bytes` less the
    /// reserve, and refused past it (0x97) as a record is.
    pub async fn put_held(&self, held: Held) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.put_held(held).await,
            Provider::Memory(p) => p.put_held(held).await,
        }
    }

    /// Forgets a held publish (abandoned, its session ended, or released without a
    /// record of this provider's); one already gone, or replaced by a newer
    /// exchange (another token), is left alone.
    pub async fn drop_held(&self, key: HeldKey) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.drop_held(key).await,
            Provider::Memory(p) => p.drop_held(key).await,
        }
    }

    /// Every held publish: read at startup (B-443).
    pub async fn held(&self) -> Result<Vec<Held>, StorageError> {
        match self {
            Provider::Sqlite(p) => p.held().await,
            Provider::Memory(p) => p.held().await,
        }
    }

    /// Reads a bounded window from an offset, with the floor and head from the same instant.
    pub async fn read_window(
        &self,
        channel: &str,
        req: WindowRequest,
    ) -> Result<Window, StorageError> {
        match self {
            Provider::Sqlite(p) => p.read_window(channel, req).await,
            Provider::Memory(p) => p.read_window(channel, req).await,
        }
    }

    /// Hands every record of `channel` to `each`, in offset order, a window at a
    /// time (at most [`super::record::MAX_WINDOW_RECORDS`] records and 4 MiB held at
    /// once); deletions are left out, a queue's jobs are not (the broadcast log's
    /// records are jobs). For what a start reads whole.
    pub async fn scan_stored(
        &self,
        channel: &str,
        mut each: impl FnMut(Record),
    ) -> Result<(), StorageError> {
        let mut from = 0;
        loop {
            let window = self
                .read_window(channel, WindowRequest::new(from, 1024, 4 << 20))
                .await?;
            let Some(last) = window.records.last().map(|r| r.offset) else {
                return Ok(());
            };
            window
                .records
                .into_iter()
                .filter(|r| !matches!(r.state, RecordState::Deleted))
                .for_each(&mut each);
            from = last + 1;
        }
    }

    /// The offset of the first record of `channel`, in offset order, stamped at or
    /// after `at_ms`: where a seek to that time lands (G-18). Asked of the store in
    /// one read, where reading the channel window by window read every record.
    pub async fn first_at(&self, channel: &str, at_ms: u64) -> Result<Option<u64>, StorageError> {
        match self {
            Provider::Sqlite(p) => p.first_at(channel, at_ms).await,
            Provider::Memory(p) => p.first_at(channel, at_ms).await,
        }
    }

    /// What a latest channel holds for `topic`: its current value, the deletion that
    /// replaced it (C-216), or nothing. One lookup, however many topics it holds.
    pub async fn latest(&self, channel: &str, topic: &str) -> Result<Option<Record>, StorageError> {
        match self {
            Provider::Sqlite(p) => p.latest(channel, topic).await,
            Provider::Memory(p) => p.latest(channel, topic).await,
        }
    }

    /// A channel's floor, head and counts.
    pub async fn stats(&self, channel: &str) -> Result<ChannelStats, StorageError> {
        match self {
            Provider::Sqlite(p) => p.stats(channel).await,
            Provider::Memory(p) => p.stats(channel).await,
        }
    }

    /// Stores a queue job's attempts as its owner counted them (C-112), their times on
    /// the wall clock, and when it may next be offered. The whole count, not one more:
    /// a write that failed is made good by the next. Never refused for want of room.
    pub async fn store_attempts(
        &self,
        channel: &str,
        offset: u64,
        attempts: crate::storage::Attempts,
        available_after_ms: u64,
    ) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => {
                p.store_attempts(channel, offset, attempts, available_after_ms)
                    .await
            }
            Provider::Memory(p) => {
                p.store_attempts(channel, offset, attempts, available_after_ms)
                    .await
            }
        }
    }

    /// Sets when a queue job may next be offered (a return, with backoff).
    pub async fn set_available_after(
        &self,
        channel: &str,
        offset: u64,
        available_after_ms: u64,
    ) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => {
                p.set_available_after(channel, offset, available_after_ms)
                    .await
            }
            Provider::Memory(p) => {
                p.set_available_after(channel, offset, available_after_ms)
                    .await
            }
        }
    }

    /// Removes one record: a resolved queue job, or a latest channel's value by the
    /// record it is - the retained store's, once its Message Expiry ran out (C-239). A
    /// value a newer one replaced is gone already: `NoSuchRecord`.
    pub async fn resolve(&self, channel: &str, offset: u64) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.resolve(channel, offset).await,
            Provider::Memory(p) => p.resolve(channel, offset).await,
        }
    }

    /// Moves a queue job into its dead-letter channel in one step (both or neither);
    /// returns its offset there. Never refused for want of room, and no channel bound is
    /// checked (C-113, B-500).
    pub async fn dead_letter(
        &self,
        queue: &str,
        offset: u64,
        to: DeadLetter,
    ) -> Result<u64, StorageError> {
        match self {
            Provider::Sqlite(p) => p.dead_letter(queue, offset, to).await,
            Provider::Memory(p) => p.dead_letter(queue, offset, to).await,
        }
    }

    /// Stores a consumer's position on a channel.
    pub async fn set_position(
        &self,
        client_id: &str,
        channel: &str,
        offset: u64,
    ) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.set_position(client_id, channel, offset).await,
            Provider::Memory(p) => p.set_position(client_id, channel, offset).await,
        }
    }

    /// A consumer's stored position on a channel.
    pub async fn position(
        &self,
        client_id: &str,
        channel: &str,
    ) -> Result<Option<u64>, StorageError> {
        match self {
            Provider::Sqlite(p) => p.position(client_id, channel).await,
            Provider::Memory(p) => p.position(client_id, channel).await,
        }
    }

    /// Forgets every position a client holds (its session ended).
    pub async fn drop_positions(&self, client_id: &str) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.drop_positions(client_id).await,
            Provider::Memory(p) => p.drop_positions(client_id).await,
        }
    }

    /// Stores a session's record (`broker::stored`, opaque here) under its client id,
    /// replacing the one there. Durable as the provider promises once it returns:
    /// committed on sqlite, in memory until the graceful stop's snapshot (B-455).
    /// A memory provider counts the session as `charge` bytes against its
    /// `max_bytes` and refuses one that grows past it (0x97; B-465); a sqlite
    /// provider's bound is its file's (RFC 0002 "Every session's state").
    pub async fn put_session(
        &self,
        client_id: &str,
        record: String,
        charge: u64,
    ) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.put_session(client_id, record).await,
            Provider::Memory(p) => p.put_session(client_id, record, charge).await,
        }
    }

    /// Forgets a session's record (the session ended).
    pub async fn delete_session(&self, client_id: &str) -> Result<(), StorageError> {
        match self {
            Provider::Sqlite(p) => p.delete_session(client_id).await,
            Provider::Memory(p) => p.delete_session(client_id).await,
        }
    }

    /// Every stored session record, as (client id, encoded record): read at startup.
    pub async fn sessions(&self) -> Result<Vec<(String, String)>, StorageError> {
        match self {
            Provider::Sqlite(p) => p.sessions().await,
            Provider::Memory(p) => p.sessions().await,
        }
    }

    /// The age sweep: removes records past their channel's `retention_period` and, on latest channels, tombstones past `deletion_retention_period`. Queues are never swept.
    pub async fn sweep_age(&self, now_ms: u64) -> Result<SweepReport, StorageError> {
        match self {
            Provider::Sqlite(p) => p.sweep_age(now_ms).await,
            Provider::Memory(p) => p.sweep_age(now_ms).await,
        }
    }

    /// The size sweep: removes each channel's oldest records to bring it under its `retention_bytes`.
    pub async fn sweep_size(&self) -> Result<SweepReport, StorageError> {
        match self {
            Provider::Sqlite(p) => p.sweep_size().await,
            Provider::Memory(p) => p.sweep_size().await,
        }
    }
}
