//! The memory provider: records in RAM, bounded by `max_bytes`, kept across a graceful
//! restart by snapshots (RFC 0002 "Validation", gaps.md section 3 "Memory snapshots").
//!
//! One mutex guards the whole state and is held only for in-memory work, never across
//! an await or file I/O (snapshots are written at shutdown, when nothing else runs).

mod snapshot;

use rustix::fs::Access;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use super::SESSION_LOG;
use super::error::StorageError;
use super::lock::ProviderLock;
use super::record::{
    Attempts, ChannelStats, DeadLetter, Held, HeldKey, NewRecord, Record, RecordState, SweepReport,
    Window, WindowRequest, held_size,
};
use super::settings::{ChannelKind, ChannelSettings, MemorySettings};

pub use snapshot::{SnapshotReport, snapshot_file_name};

/// One channel's records and counts.
#[derive(Debug, Default)]
pub(crate) struct MemChannel {
    pub(crate) next_offset: u64,
    pub(crate) records: BTreeMap<u64, Record>,
    pub(crate) bytes: u64,
    /// `latest` channels: topic to the offset of its current value (or tombstone).
    pub(crate) latest: HashMap<String, u64>,
    /// Consumer positions on this channel, by client id.
    pub(crate) positions: HashMap<String, u64>,
}

impl MemChannel {
    fn floor(&self) -> u64 {
        self.records
            .keys()
            .next()
            .copied()
            .unwrap_or(self.next_offset)
    }

    /// The record the latest index holds for `topic`: its value or its deletion.
    fn latest_of(&self, topic: &str) -> Option<&Record> {
        self.latest.get(topic).and_then(|o| self.records.get(o))
    }

    fn take(&mut self, offset: u64) -> Option<Record> {
        let rec = self.records.remove(&offset)?;
        self.bytes = self.bytes.saturating_sub(rec.size());
        if self.latest.get(&rec.topic) == Some(&offset) {
            self.latest.remove(&rec.topic);
        }
        Some(rec)
    }

    fn insert(&mut self, new: NewRecord, state: RecordState) -> u64 {
        let offset = self.next_offset;
        self.next_offset += 1;
        self.bytes += new.size();
        self.records
            .insert(offset, Record::from_new(offset, new, state));
        offset
    }
}

struct Open {
    settings: ChannelSettings,
    data: MemChannel,
}

/// What a queue's dead-letter channel adds to its name; the two share a file (B-505).
const DEAD_LETTER_SUFFIX: &str = "__dlq";

#[derive(Default)]
struct State {
    channels: HashMap<String, Open>,
    /// Loaded from a snapshot and not yet opened (a group file holds several channels).
    pending: HashMap<String, MemChannel>,
    /// Bytes held across every channel, counted by `record_size`, and the sessions'
    /// charges (B-465).
    used: u64,
    /// Session records by client id (`broker::stored`), kept by the snapshot, each
    /// with what it is charged.
    sessions: BTreeMap<String, (String, u64)>,
    /// Sessions read back from the snapshot and charged their text's length only:
    /// the broker's first write of each, at startup, brings its real charge, and is
    /// never refused for room, for the snapshot is loaded whole and nothing in it
    /// dropped (B-467). Refused, it drained the broadcast log for room and cut the
    /// session short at its resume (B-469).
    charged_as_text: std::collections::HashSet<String>,
    /// Held QoS 2 publishes by (client id, packet id), as (token, data), counted in
    /// `used` (B-441) and kept by the snapshot (B-443).
    held: BTreeMap<(String, u16), (u64, Vec<u8>)>,
}

/// A memory storage provider.
#[derive(Debug)]
pub struct MemoryProvider {
    settings: MemorySettings,
    state: Mutex<State>,
    /// What the manifest found at start lists.
    manifest: snapshot::Listed,
    lock: Option<ProviderLock>,
}

impl State {
    /// What the sessions hold: their records, their held QoS 2 publishes, and the
    /// broadcast log when it is open here.
    fn sessions_share(&self) -> u64 {
        let records: u64 = self.sessions.values().map(|(_, charge)| charge).sum();
        let held: u64 = self
            .held
            .iter()
            .map(|((c, _), (_, d))| held_size(c, d))
            .sum();
        let log = self.channels.get(SESSION_LOG).map_or(0, |o| o.data.bytes);
        records + held + log
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("channels", &self.channels.len())
            .field("used", &self.used)
            .finish()
    }
}

impl State {
    /// What the held publish `key` names counts, if that exchange is held.
    fn held_size_of(&self, key: &HeldKey) -> u64 {
        let k = (key.client_id.clone(), key.packet_id);
        self.held
            .get(&k)
            .filter(|(token, _)| *token == key.token)
            .map_or(0, |(_, data)| held_size(&k.0, data))
    }

    fn drop_held(&mut self, key: &HeldKey) {
        let k = (key.client_id.clone(), key.packet_id);
        if self
            .held
            .get(&k)
            .is_some_and(|(token, _)| *token == key.token)
            && let Some((_, data)) = self.held.remove(&k)
        {
            self.used = self.used.saturating_sub(held_size(&k.0, &data));
        }
    }
}

impl MemoryProvider {
    /// Takes `saguin.lock` in `snapshot_dir` (creating the directory) and reads the
    /// manifest of the last graceful shutdown, if there is one. Channel files are loaded
    /// as their channels are opened; a file for a channel no longer configured is never
    /// opened (B-506). Blocking: call at startup.
    ///
    /// # Errors
    /// [`StorageError::Locked`] when another broker holds the directory (B-520);
    /// [`StorageError::Io`] or [`StorageError::Snapshot`] when it cannot be read.
    pub fn open(settings: &MemorySettings) -> Result<MemoryProvider, StorageError> {
        let (lock, manifest, sessions, held) = match &settings.snapshot_dir {
            None => (
                None,
                snapshot::Listed::default(),
                BTreeMap::new(),
                Vec::new(),
            ),
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StorageError::io(&settings.name, &format!("create {}", dir.display()), e)
                })?;
                let lock = ProviderLock::acquire(&settings.name, &dir.join("saguin.lock"))?;
                let manifest = snapshot::read_manifest(&settings.name, dir)?;
                let sessions = snapshot::read_sessions(&settings.name, dir)?;
                let held = snapshot::read_held(&settings.name, dir)?;
                snapshot::mark_running(&settings.name, dir, !manifest.is_empty())?;
                (Some(lock), manifest, sessions, held)
            }
        };
        // A record read back is charged its length until the broker writes it again
        // at startup with its charge; a snapshot over max_bytes is loaded whole (B-467).
        let sessions: BTreeMap<String, (String, u64)> = sessions
            .into_iter()
            .map(|(client, record)| {
                let charge = record.len() as u64;
                (client, (record, charge))
            })
            .collect();
        let held: BTreeMap<(String, u16), (u64, Vec<u8>)> = held
            .into_iter()
            .map(|h| ((h.client_id, h.packet_id), (h.token, h.data)))
            .collect();
        let used = sessions.values().map(|(_, charge)| charge).sum::<u64>()
            + held
                .iter()
                .map(|((c, _), (_, d))| held_size(c, d))
                .sum::<u64>();
        let provider = MemoryProvider {
            settings: settings.clone(),
            state: Mutex::new(State {
                charged_as_text: sessions.keys().cloned().collect(),
                sessions,
                held,
                used,
                ..State::default()
            }),
            manifest,
            lock,
        };
        if used > provider.limit() {
            // Over before any channel is loaded: the sessions alone are.
            provider.warn_over(used, used);
        }
        Ok(provider)
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The lock file, when there is a snapshot directory.
    pub fn lock_path(&self) -> Option<&Path> {
        self.lock.as_ref().map(|l| l.path())
    }

    /// Whether the provider can keep what it holds: its snapshot directory, if it has
    /// one, is still a directory it can write its snapshot into at shutdown.
    ///
    /// # Errors
    /// What stops it, naming the provider and the directory.
    pub fn health(&self) -> Result<(), String> {
        let Some(dir) = &self.settings.snapshot_dir else {
            return Ok(());
        };
        // Asked of the kernel, not read from the mode bits: a filesystem remounted
        // read-only (an SD card failing) keeps its modes and refuses every write.
        let writable = || rustix::fs::access(dir, Access::WRITE_OK | Access::EXEC_OK).is_ok();
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() && writable() => Ok(()),
            Ok(_) => Err(format!(
                "storage provider {}: snapshot_dir {} is not a writable directory",
                self.settings.name,
                dir.display()
            )),
            Err(e) => Err(format!(
                "storage provider {}: snapshot_dir {}: {e}",
                self.settings.name,
                dir.display()
            )),
        }
    }

    /// Its `max_bytes`.
    pub fn max_bytes(&self) -> u64 {
        self.settings.max_bytes
    }

    /// Bytes held across every channel.
    pub fn used_bytes(&self) -> u64 {
        self.state().used
    }

    /// What publishes and sessions may take: `max_bytes` less the reserve.
    fn limit(&self) -> u64 {
        self.settings
            .max_bytes
            .saturating_sub(self.settings.reserve_bytes)
    }

    /// The refusal of a write past [`MemoryProvider::limit`].
    fn full(&self) -> StorageError {
        StorageError::ProviderFull {
            provider: self.settings.name.clone(),
            max_bytes: self.settings.max_bytes,
            reserve: self.settings.reserve_bytes,
        }
    }

    /// B-468: a snapshot restored over `max_bytes` less the reserve, said once, with
    /// how much of it the sessions hold.
    fn warn_over(&self, holds: u64, sessions: u64) {
        log::warn!(
            "storage provider {}: the snapshot holds {holds} bytes, over max_bytes {} less the reserve {}; the sessions hold {sessions} of them (their records, held QoS 2 publishes and the broadcast log); publishes into its channels are refused (0x97) until retention or consumers make room, or max_bytes is raised",
            self.settings.name,
            self.settings.max_bytes,
            self.settings.reserve_bytes
        );
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts that are still consistent (every
        // mutation updates them before returning), so a poisoned lock is taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open channel `channel` of `st`.
    fn open_in<'s>(&self, st: &'s State, channel: &str) -> Result<&'s Open, StorageError> {
        st.channels
            .get(channel)
            .ok_or_else(|| self.unknown(channel))
    }

    fn unknown(&self, channel: &str) -> StorageError {
        StorageError::UnknownChannel {
            provider: self.settings.name.clone(),
            channel: channel.to_owned(),
        }
    }

    /// Opens a channel, loading it from the snapshot the first time.
    pub async fn open_channel(
        &self,
        name: &str,
        settings: ChannelSettings,
    ) -> Result<(), StorageError> {
        if let Some(open) = self.state().channels.get_mut(name) {
            open.settings = settings;
            return Ok(());
        }
        let needs_file = !self.state().pending.contains_key(name);
        if needs_file && let Some(path) = self.manifest.get(name).cloned() {
            let provider = self.settings.name.clone();
            let loaded = smol::unblock(move || snapshot::read_group(&provider, &path)).await?;
            let mut st = self.state();
            for (n, ch) in loaded {
                if !st.channels.contains_key(&n) {
                    st.pending.insert(n, ch);
                }
            }
        }
        let mut st = self.state();
        let mut data = st.pending.remove(name).unwrap_or_default();
        let limit = self.limit();
        if st.used <= limit && st.used + data.bytes > limit {
            // B-467, B-468: loaded whole, said once.
            let sessions = st.sessions_share() + if name == SESSION_LOG { data.bytes } else { 0 };
            self.warn_over(st.used + data.bytes, sessions);
        }
        if settings.is_latest() {
            // The index is not in the file: rebuild it (offset order, so the last wins).
            data.latest = data
                .records
                .values()
                .map(|r| (r.topic.clone(), r.offset))
                .collect();
        }
        st.used += data.bytes;
        st.channels.insert(name.to_owned(), Open { settings, data });
        Ok(())
    }

    /// Stores a record and returns its offset; refused at the channel's `max_bytes` or
    /// when it would eat into the provider's reserve (0x97).
    pub async fn append(&self, channel: &str, record: NewRecord) -> Result<u64, StorageError> {
        self.append_releasing(channel, record, None).await
    }

    /// [`Self::append`], removing the held QoS 2 publish `release` names in the same
    /// store operation (B-442).
    pub async fn append_releasing(
        &self,
        channel: &str,
        record: NewRecord,
        release: Option<HeldKey>,
    ) -> Result<u64, StorageError> {
        let size = record.size();
        let mut guard = self.state();
        let st = &mut *guard;
        // What the held publish it releases is counted frees as much (B-442).
        let freed = release.as_ref().map_or(0, |key| st.held_size_of(key));
        let open = st
            .channels
            .get_mut(channel)
            .ok_or_else(|| self.unknown(channel))?;
        // A latest value replaces the topic's previous one, which frees its bytes:
        // in the channel's bound as in the provider's, as sqlite counts it.
        let replaced = match open.settings.is_latest() {
            true => open.data.latest_of(&record.topic).map_or(0, Record::size),
            false => 0,
        };
        StorageError::check_channel_room(
            channel,
            open.settings.max_bytes,
            open.data.bytes,
            size,
            replaced,
        )?;
        let limit = self.limit();
        if st.used.saturating_sub(replaced + freed) + size > limit {
            return Err(self.full());
        }
        let state = match open.settings.kind {
            ChannelKind::Queue { .. } => RecordState::Job {
                attempts: Attempts::default(),
                available_after_ms: 0,
            },
            ChannelKind::Latest { .. } if record.payload.is_empty() => RecordState::Deleted,
            _ => RecordState::Stored,
        };
        if open.settings.is_latest()
            && let Some(old) = open.data.latest.get(&record.topic).copied()
            && let Some(gone) = open.data.take(old)
        {
            st.used = st.used.saturating_sub(gone.size());
        }
        let topic = open.settings.is_latest().then(|| record.topic.clone());
        let offset = open.data.insert(record, state);
        if let Some(topic) = topic {
            open.data.latest.insert(topic, offset);
        }
        st.used += size;
        // Under the same lock as the record (B-442).
        if let Some(key) = release {
            st.drop_held(&key);
        }
        Ok(offset)
    }

    /// Keeps a held QoS 2 publish, within `max_bytes` less the reserve (B-441).
    pub async fn put_held(&self, held: Held) -> Result<(), StorageError> {
        let mut st = self.state();
        let key = (held.client_id, held.packet_id);
        let old = st.held.get(&key).map_or(0, |(_, d)| held_size(&key.0, d));
        let size = held_size(&key.0, &held.data);
        if size > old && st.used.saturating_sub(old) + size > self.limit() {
            return Err(self.full());
        }
        st.used = st.used.saturating_sub(old) + size;
        st.held.insert(key, (held.token, held.data));
        Ok(())
    }

    /// Removes a held QoS 2 publish, if that exchange is still the one held.
    pub async fn drop_held(&self, key: HeldKey) -> Result<(), StorageError> {
        self.state().drop_held(&key);
        Ok(())
    }

    /// Every held QoS 2 publish (B-443).
    pub async fn held(&self) -> Result<Vec<Held>, StorageError> {
        Ok(self
            .state()
            .held
            .iter()
            .map(|((client_id, packet_id), (token, data))| Held {
                client_id: client_id.clone(),
                packet_id: *packet_id,
                token: *token,
                data: data.clone(),
            })
            .collect())
    }

    /// Reads a window; floor, head and records from one instant.
    pub async fn read_window(
        &self,
        channel: &str,
        req: WindowRequest,
    ) -> Result<Window, StorageError> {
        let st = self.state();
        let open = self.open_in(&st, channel)?;
        let mut records = Vec::new();
        let mut bytes = 0u64;
        for rec in open.data.records.range(req.from..).map(|(_, r)| r) {
            if records.len() >= req.max_records {
                break;
            }
            bytes += rec.size();
            if bytes > req.max_bytes && !records.is_empty() {
                break;
            }
            records.push(rec.clone());
        }
        Ok(Window {
            floor: open.data.floor(),
            head: open.data.next_offset,
            records,
        })
    }

    /// The offset of the first record stamped at or after `at_ms`.
    pub async fn first_at(&self, channel: &str, at_ms: u64) -> Result<Option<u64>, StorageError> {
        let st = self.state();
        Ok((self.open_in(&st, channel)?.data.records.values())
            .find(|r| r.timestamp_ms >= at_ms)
            .map(|r| r.offset))
    }

    /// What a latest channel holds for `topic`: its value, its deletion, or nothing.
    pub async fn latest(&self, channel: &str, topic: &str) -> Result<Option<Record>, StorageError> {
        let st = self.state();
        Ok(self.open_in(&st, channel)?.data.latest_of(topic).cloned())
    }

    /// A channel's floor, head and counts.
    pub async fn stats(&self, channel: &str) -> Result<ChannelStats, StorageError> {
        let st = self.state();
        let d = &self.open_in(&st, channel)?.data;
        Ok(ChannelStats {
            floor: d.floor(),
            head: d.next_offset,
            records: d.records.len() as u64,
            bytes: d.bytes,
        })
    }

    /// That `channel` is an open queue holding a job at `offset`; checked under the same
    /// lock as the change that follows.
    fn check_job(
        &self,
        st: &State,
        channel: &str,
        offset: u64,
        operation: &'static str,
    ) -> Result<(), StorageError> {
        let open = st
            .channels
            .get(channel)
            .ok_or_else(|| self.unknown(channel))?;
        if !open.settings.is_queue() {
            return Err(StorageError::WrongChannelKind {
                channel: channel.to_owned(),
                operation,
            });
        }
        if !open.data.records.contains_key(&offset) {
            return Err(StorageError::NoSuchRecord {
                channel: channel.to_owned(),
                offset,
            });
        }
        Ok(())
    }

    fn with_job<T>(
        &self,
        channel: &str,
        offset: u64,
        operation: &'static str,
        f: impl FnOnce(&mut Attempts, &mut u64) -> T,
    ) -> Result<T, StorageError> {
        let mut st = self.state();
        let open = st
            .channels
            .get_mut(channel)
            .ok_or_else(|| self.unknown(channel))?;
        if !open.settings.is_queue() {
            return Err(StorageError::WrongChannelKind {
                channel: channel.to_owned(),
                operation,
            });
        }
        match open.data.records.get_mut(&offset).map(|r| &mut r.state) {
            Some(RecordState::Job {
                attempts,
                available_after_ms,
            }) => Ok(f(attempts, available_after_ms)),
            _ => Err(StorageError::NoSuchRecord {
                channel: channel.to_owned(),
                offset,
            }),
        }
    }

    /// Stores a job's attempts as its owner counted them and when it may next be
    /// offered.
    pub async fn store_attempts(
        &self,
        channel: &str,
        offset: u64,
        attempts: Attempts,
        available_after_ms: u64,
    ) -> Result<(), StorageError> {
        self.with_job(channel, offset, "store the attempts", |a, after| {
            *a = attempts;
            *after = available_after_ms;
        })
    }

    /// Sets when a job may next be offered.
    pub async fn set_available_after(
        &self,
        channel: &str,
        offset: u64,
        available_after_ms: u64,
    ) -> Result<(), StorageError> {
        self.with_job(channel, offset, "set available-after", |_, after| {
            *after = available_after_ms
        })
    }

    /// Removes a resolved job, or a latest channel's value by the record it is.
    pub async fn resolve(&self, channel: &str, offset: u64) -> Result<(), StorageError> {
        let mut st = self.state();
        match st.channels.get(channel) {
            Some(open) if open.settings.is_latest() => {
                if !open.data.records.contains_key(&offset) {
                    return Err(StorageError::NoSuchRecord {
                        channel: channel.to_owned(),
                        offset,
                    });
                }
            }
            _ => self.check_job(&st, channel, offset, "resolve")?,
        }
        let gone = st
            .channels
            .get_mut(channel)
            .and_then(|o| o.data.take(offset))
            .map_or(0, |r| r.size());
        st.used = st.used.saturating_sub(gone);
        Ok(())
    }

    /// Moves a job into the dead-letter channel at once (under one lock). Not a
    /// publish: it may use the reserve (C-113), and is refused, the job left as it
    /// was, only past `max_bytes` itself (gaps A-02), which the dead letter's longer
    /// topic and its headers would otherwise push `used` past without bound.
    pub async fn dead_letter(
        &self,
        queue: &str,
        offset: u64,
        to: DeadLetter,
    ) -> Result<u64, StorageError> {
        let dlq = to.channel.clone();
        let dlq = dlq.as_str();
        let mut guard = self.state();
        self.check_job(&guard, queue, offset, "dead-letter")?;
        let st = &mut *guard;
        if !st.channels.contains_key(dlq) {
            return Err(self.unknown(dlq));
        }
        let missing = || StorageError::NoSuchRecord {
            channel: queue.to_owned(),
            offset,
        };
        let rec = (st.channels.get(queue))
            .and_then(|o| o.data.records.get(&offset))
            .ok_or_else(missing)?;
        let taken = rec.size();
        let new = to.apply(rec.clone());
        let grown = new.size();
        if st.used.saturating_sub(taken) + grown > self.settings.max_bytes {
            return Err(self.full());
        }
        (st.channels.get_mut(queue))
            .and_then(|o| o.data.take(offset))
            .ok_or_else(missing)?;
        st.used = st.used.saturating_sub(taken);
        let d = st.channels.get_mut(dlq).ok_or_else(|| self.unknown(dlq))?;
        let at = d.data.insert(new, RecordState::Stored);
        st.used += grown;
        Ok(at)
    }

    /// Stores a consumer's position.
    pub async fn set_position(
        &self,
        client_id: &str,
        channel: &str,
        offset: u64,
    ) -> Result<(), StorageError> {
        let mut st = self.state();
        let open = st
            .channels
            .get_mut(channel)
            .ok_or_else(|| self.unknown(channel))?;
        open.data.positions.insert(client_id.to_owned(), offset);
        Ok(())
    }

    /// A consumer's stored position.
    pub async fn position(
        &self,
        client_id: &str,
        channel: &str,
    ) -> Result<Option<u64>, StorageError> {
        let st = self.state();
        let open = st
            .channels
            .get(channel)
            .ok_or_else(|| self.unknown(channel))?;
        Ok(open.data.positions.get(client_id).copied())
    }

    /// Stores a session's record under its client id, replacing the one there,
    /// charged `charge` bytes (B-465). Kept across a graceful stop by the snapshot
    /// (B-455). A record that grows its session's charge past `max_bytes` less the
    /// reserve is refused (0x97); one that does not grow it never is, so a snapshot
    /// restored over the bound still takes resumes without a Will (B-467).
    pub async fn put_session(
        &self,
        client_id: &str,
        record: String,
        charge: u64,
    ) -> Result<(), StorageError> {
        let mut st = self.state();
        let old = st.sessions.get(client_id).map_or(0, |(_, c)| *c);
        let limit = self.limit();
        let loaded = st.charged_as_text.remove(client_id);
        if !loaded && charge > old && st.used.saturating_sub(old) + charge > limit {
            return Err(self.full());
        }
        st.used = st.used.saturating_sub(old) + charge;
        st.sessions.insert(client_id.to_owned(), (record, charge));
        Ok(())
    }

    /// Forgets a session's record, and its charge.
    pub async fn delete_session(&self, client_id: &str) -> Result<(), StorageError> {
        let mut st = self.state();
        st.charged_as_text.remove(client_id);
        if let Some((_, charge)) = st.sessions.remove(client_id) {
            st.used = st.used.saturating_sub(charge);
        }
        Ok(())
    }

    /// Whether `bytes` more would fit under `max_bytes` less the reserve.
    ///
    /// # Errors
    /// [`StorageError::ProviderFull`] when they would not.
    pub fn check_room(&self, bytes: u64) -> Result<(), StorageError> {
        let limit = self.limit();
        if self.state().used + bytes <= limit {
            return Ok(());
        }
        Err(self.full())
    }

    /// Every stored session record, as (client id, encoded record).
    pub async fn sessions(&self) -> Result<Vec<(String, String)>, StorageError> {
        Ok(self
            .state()
            .sessions
            .iter()
            .map(|(c, (r, _))| (c.clone(), r.clone()))
            .collect())
    }

    /// Forgets every position a client holds.
    pub async fn drop_positions(&self, client_id: &str) -> Result<(), StorageError> {
        let mut st = self.state();
        for open in st.channels.values_mut() {
            open.data.positions.remove(client_id);
        }
        Ok(())
    }

    /// The age sweep (see [`crate::storage::retention`]).
    pub async fn sweep_age(&self, now_ms: u64) -> Result<SweepReport, StorageError> {
        let mut guard = self.state();
        let st = &mut *guard;
        let mut total = SweepReport::default();
        for open in st.channels.values_mut() {
            let period = open.settings.effective_retention().period;
            let tombstones = match open.settings.kind {
                ChannelKind::Latest { deletion_retention } => deletion_retention,
                _ => None,
            };
            let cutoff = |d: std::time::Duration| {
                now_ms.saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            };
            let (value_cut, tomb_cut) = (period.map(cutoff), tombstones.map(cutoff));
            let expired = |r: &Record| {
                let cut = match r.state {
                    RecordState::Deleted => tomb_cut,
                    _ => value_cut,
                };
                cut.is_some_and(|c| r.timestamp_ms < c)
            };
            let records = open.data.records.values();
            // An append log is in time order, so the lock is held only for what goes;
            // a latest channel's values are not, and are looked at one by one.
            let doomed: Vec<u64> = if open.settings.is_latest() {
                records.filter(|r| expired(r)).map(|r| r.offset).collect()
            } else {
                records
                    .take_while(|r| expired(r))
                    .map(|r| r.offset)
                    .collect()
            };
            for off in doomed {
                if let Some(r) = open.data.take(off) {
                    total.add(SweepReport {
                        records: 1,
                        bytes: r.size(),
                    });
                }
            }
        }
        st.used = st.used.saturating_sub(total.bytes);
        Ok(total)
    }

    /// The size sweep: oldest records go until each channel is under retention_bytes.
    pub async fn sweep_size(&self) -> Result<SweepReport, StorageError> {
        let mut guard = self.state();
        let st = &mut *guard;
        let mut total = SweepReport::default();
        for open in st.channels.values_mut() {
            let Some(bound) = open.settings.effective_retention().bytes else {
                continue;
            };
            while open.data.bytes > bound {
                let Some(first) = open.data.records.keys().next().copied() else {
                    break;
                };
                if let Some(r) = open.data.take(first) {
                    total.add(SweepReport {
                        records: 1,
                        bytes: r.size(),
                    });
                }
            }
        }
        st.used = st.used.saturating_sub(total.bytes);
        Ok(total)
    }

    /// Writes the snapshot (one file per channel group, then the manifest). Blocking:
    /// call at graceful shutdown. With `snapshot_dir: none` it writes nothing.
    ///
    /// # Errors
    /// [`StorageError::Io`] naming the file that could not be written; the previous
    /// manifest stays in place, so the last good snapshot is still what loads.
    pub fn write_snapshot(&self, now_ms: u64) -> Result<SnapshotReport, StorageError> {
        let Some(dir) = &self.settings.snapshot_dir else {
            return Ok(SnapshotReport::default());
        };
        let st = self.state();
        let mut groups: BTreeMap<String, Vec<(&str, &MemChannel)>> = BTreeMap::new();
        for (name, open) in &st.channels {
            let group = match &open.settings.kind {
                ChannelKind::DeadLetter { queue } => queue.clone(),
                _ => name.clone(),
            };
            groups
                .entry(group)
                .or_default()
                .push((name.as_str(), &open.data));
        }
        // Loaded with an opened channel's file and never opened itself (a queue's
        // dead letters): written back into that file, not dropped from it.
        for (name, data) in &st.pending {
            let group = name.strip_suffix(DEAD_LETTER_SUFFIX).unwrap_or(name);
            groups
                .entry(group.to_owned())
                .or_default()
                .push((name.as_str(), data));
        }
        let sessions = st.sessions.iter().map(|(c, (r, _))| (c, r)).collect();
        snapshot::write_sessions(&self.settings.name, dir, &sessions)?;
        snapshot::write_held(&self.settings.name, dir, &st.held)?;
        // A file whose channels this run never opened is listed again as it is: the
        // channel comes back with its records and offsets if it is configured again.
        let kept = self.manifest.untouched(&groups);
        snapshot::write_all(&self.settings.name, dir, &groups, kept, now_ms)
    }
}
