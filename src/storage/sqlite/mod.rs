//! The sqlite provider: one file, one writer thread, `read_connections` reader threads.
//!
//! Only this module touches rusqlite. Async callers send a request on a bounded
//! channel and await its completion; a full channel makes the caller wait (backpressure)
//! rather than grow a queue.

mod batch;
mod ops;
mod positioned;
mod schema;
mod sweep;
mod writer;

use std::path::PathBuf;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use smol::channel::{Receiver, Sender};

use self::ops::{Done, ReadOp, WriteOp};
use self::positioned::Positioned;
use self::writer::{Counters, Writer};
use super::error::StorageError;
use super::lock::{ProviderLock, sqlite_lock_path};
use super::record::{
    Attempts, ChannelStats, DeadLetter, Held, HeldKey, NewRecord, Record, SweepReport, Window,
    WindowRequest,
};
use super::settings::{ChannelSettings, SqliteSettings};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Requests that may wait for the writer before a sender waits in turn. A bounded
/// queue's slots are all allocated and touched when it is made: 16 bytes each, as
/// requests are boxed (4,096 inline requests were 0.9 MiB of resident memory).
const WRITE_QUEUE: usize = 1024;
/// Position writes and drops that may wait for the writer, behind the requests a
/// client waits on.
const BACKGROUND_QUEUE: usize = 256;
/// Reads that may wait for a reader before a sender waits in turn.
const READ_QUEUE: usize = 256;

/// A sqlite storage provider (RFC 0002 "How a sqlite provider commits publishes",
/// "How a sqlite provider reads", "flush_interval").
#[derive(Debug)]
pub struct SqliteProvider {
    name: String,
    file_path: PathBuf,
    max_bytes: u64,
    reserve_bytes: u64,
    writes: Sender<Box<WriteOp>>,
    /// Consumer positions: taken by the writer after `writes`.
    background: Sender<Box<WriteOp>>,
    /// `None` when `read_connections` is 0: reads go to the writer (B-153).
    reads: Option<Sender<ReadOp>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    lock: ProviderLock,
    counters: Arc<Counters>,
    /// Whose positions `drop_positions` has to delete.
    positioned: Positioned,
}

/// What a sqlite provider's writer has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriterStats {
    /// Transactions committed.
    pub commits: u64,
    /// Records appended by them.
    pub appended: u64,
    /// Times the write-ahead log was forced to disk.
    pub flushes: u64,
    /// Bytes of the file's pages in use after the last commit (what `max_bytes` bounds).
    pub used_bytes: u64,
}

fn open_write_connection(s: &SqliteSettings) -> Result<Connection, StorageError> {
    let io = |op: &str, e: rusqlite::Error| StorageError::io(&s.name, op, e);
    let conn = Connection::open(&s.file_path)
        .map_err(|e| io(&format!("open {}", s.file_path.display()), e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| io("set busy_timeout", e))?;
    // Asked before anything is changed: a file this version must not take is left
    // as it was found.
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| io("read the schema version", e))?;
    if version > schema::VERSION {
        return Err(StorageError::io(
            &s.name,
            "open the database",
            format!(
                "{} was written by a newer Sagüin (schema {version}, this one knows {}); run that version, or restore a copy",
                s.file_path.display(),
                schema::VERSION
            ),
        ));
    }
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .and_then(|mut q| q.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| io("read the schema", e))?;
    // A new file holds no table; one of ours holds only ours, and `channels` once
    // versioned. Anything else is another program's, whatever its user_version.
    let ours = [
        "channels",
        "records",
        "latest",
        "positions",
        "sessions",
        "held",
    ];
    let mut foreign: Vec<&str> = (tables.iter().map(String::as_str))
        .filter(|t| !ours.contains(t))
        .collect();
    let unversioned_or_ours = version == 0 || tables.iter().any(|t| t == "channels");
    if !foreign.is_empty() || !unversioned_or_ours {
        foreign.truncate(3);
        return Err(StorageError::io(
            &s.name,
            "open the database",
            format!(
                "{} holds tables Sagüin did not write ({}; user_version {version}); it belongs to \
                 another program: name a file of the provider's own in file_path",
                s.file_path.display(),
                if foreign.is_empty() {
                    "no channels table".to_string()
                } else {
                    foreign.join(", ")
                }
            ),
        ));
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| io("enable WAL", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StorageError::io(
            &s.name,
            "enable WAL",
            format!(
                "journal_mode is {mode}; is the file on a filesystem that supports shared memory?"
            ),
        ));
    }
    // A write-ahead log that grew past the limit (a burst while a reader held the
    // checkpoint back) is cut back to it once a checkpoint lets it start over: a
    // gateway's flash does not keep the largest burst ever seen.
    conn.execute_batch(&format!(
        "PRAGMA synchronous = NORMAL; PRAGMA journal_size_limit = {WAL_SIZE_LIMIT};"
    ))
    .map_err(|e| io("set synchronous and journal_size_limit", e))?;
    conn.execute_batch(schema::SCHEMA)
        .and_then(|()| schema::add_missing_columns(&conn))
        .and_then(|()| conn.execute_batch(&format!("PRAGMA user_version = {}", schema::VERSION)))
        .map_err(|e| io("create tables", e))?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// The bytes a write-ahead log is cut back to after a checkpoint: its steady size
/// under SQLite's automatic checkpoint (1,000 pages) with room to spare.
const WAL_SIZE_LIMIT: u64 = 8 << 20;

fn open_read_connection(name: &str, path: &std::path::Path) -> Result<Connection, StorageError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| StorageError::io(name, "open a read connection", e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| StorageError::io(name, "set busy_timeout", e))?;
    Ok(conn)
}

/// A reader thread: opens its read-only connection at its first read and keeps it.
fn reader_loop(name: String, path: PathBuf, rx: Receiver<ReadOp>) {
    let mut conn: Option<Connection> = None;
    while let Ok(op) = rx.recv_blocking() {
        if conn.is_none() {
            match open_read_connection(&name, &path) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    ops::fail_read(op, &e);
                    continue;
                }
            }
        }
        if let Some(c) = conn.as_mut() {
            ops::serve_read(c, &name, op);
        }
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, StorageError> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|e| StorageError::io(&name, "start a thread", e))
}

impl SqliteProvider {
    /// Takes `<file_path>.lock`, opens (or creates) the database in WAL mode with
    /// synchronous=NORMAL, and starts the writer thread and the reader threads.
    ///
    /// Blocking: call it at startup, before the executor serves clients.
    ///
    /// # Errors
    /// [`StorageError::Locked`] when another broker holds the lock (B-520);
    /// [`StorageError::Io`] when the file cannot be opened or set up.
    pub fn open(settings: &SqliteSettings) -> Result<SqliteProvider, StorageError> {
        let lock = ProviderLock::acquire(&settings.name, &sqlite_lock_path(&settings.file_path))?;
        let conn = open_write_connection(settings)?;
        let positioned = schema::read_positioned(&conn)
            .map_err(|e| StorageError::io(&settings.name, "read the consumer positions", e))?;
        let (wtx, wrx) = smol::channel::bounded(WRITE_QUEUE);
        let (btx, brx) = smol::channel::bounded(BACKGROUND_QUEUE);
        let mut wal = settings.file_path.as_os_str().to_owned();
        wal.push("-wal");
        let writer = Writer::new(settings, conn, (wrx, brx), PathBuf::from(wal))?;
        let counters = writer.counters.clone();
        let mut threads = vec![spawn(format!("sqlite-{}-w", settings.name), move || {
            writer.run()
        })?];
        let reads = if settings.read_connections == 0 {
            None
        } else {
            let (rtx, rrx) = smol::channel::bounded(READ_QUEUE);
            for n in 0..settings.read_connections.min(8) {
                let (name, path, rx) = (
                    settings.name.clone(),
                    settings.file_path.clone(),
                    rrx.clone(),
                );
                threads.push(spawn(
                    format!("sqlite-{}-r{n}", settings.name),
                    move || reader_loop(name, path, rx),
                )?);
            }
            Some(rtx)
        };
        Ok(SqliteProvider {
            name: settings.name.clone(),
            file_path: settings.file_path.clone(),
            max_bytes: settings.max_bytes,
            reserve_bytes: settings.reserve_bytes,
            writes: wtx,
            background: btx,
            reads,
            threads: Mutex::new(threads),
            lock,
            counters,
            positioned,
        })
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its `max_bytes`.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Whether `bytes` more would fit under `max_bytes` less the reserve, by the
    /// pages in use at the last commit.
    ///
    /// # Errors
    /// [`StorageError::ProviderFull`] when they would not.
    pub fn check_room(&self, bytes: u64) -> Result<(), StorageError> {
        let used = self.writer_stats().used_bytes;
        if used + bytes <= self.max_bytes.saturating_sub(self.reserve_bytes) {
            return Ok(());
        }
        Err(StorageError::ProviderFull {
            provider: self.name.clone(),
            max_bytes: self.max_bytes,
            reserve: self.reserve_bytes,
        })
    }

    /// The database file.
    pub fn file_path(&self) -> &std::path::Path {
        &self.file_path
    }

    /// The lock file this provider holds.
    pub fn lock_path(&self) -> &std::path::Path {
        self.lock.path()
    }

    /// Commits, appended records and flushes so far.
    pub fn writer_stats(&self) -> WriterStats {
        WriterStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            appended: self.counters.appended.load(Ordering::Relaxed),
            flushes: self.counters.flushes.load(Ordering::Relaxed),
            used_bytes: self.counters.used_bytes.load(Ordering::Relaxed),
        }
    }

    /// Whether the provider can write now: its writer runs, its database file is still
    /// where it was opened (a deleted file takes every later write with it at the next
    /// restart), and its last transaction did not fail.
    ///
    /// # Errors
    /// What stops it writing, naming the provider and what to look at.
    pub fn health(&self) -> Result<(), String> {
        if self.writes.is_closed() {
            return Err(format!(
                "storage provider {}: its writer has stopped",
                self.name
            ));
        }
        if !self.file_path.exists() {
            return Err(format!(
                "storage provider {}: {} is gone; what it writes now is lost at restart",
                self.name,
                self.file_path.display()
            ));
        }
        match self.counters.failure.lock().ok().and_then(|f| f.clone()) {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    fn closed(&self) -> StorageError {
        StorageError::Closed {
            provider: self.name.clone(),
        }
    }

    async fn write<T>(&self, make: impl FnOnce(Done<T>) -> WriteOp) -> Result<T, StorageError> {
        self.write_on(&self.writes, make).await
    }

    async fn write_on<T>(
        &self,
        lane: &Sender<Box<WriteOp>>,
        make: impl FnOnce(Done<T>) -> WriteOp,
    ) -> Result<T, StorageError> {
        let (tx, rx) = smol::channel::bounded(1);
        lane.send(Box::new(make(tx)))
            .await
            .map_err(|_| self.closed())?;
        rx.recv().await.map_err(|_| self.closed())?
    }

    async fn read<T>(&self, make: impl FnOnce(Done<T>) -> ReadOp) -> Result<T, StorageError> {
        let (tx, rx) = smol::channel::bounded(1);
        let op = make(tx);
        match &self.reads {
            Some(reads) if op.on_a_reader() => reads.send(op).await.map_err(|_| self.closed())?,
            _ => self
                .writes
                .send(Box::new(WriteOp::Read(op)))
                .await
                .map_err(|_| self.closed())?,
        }
        rx.recv().await.map_err(|_| self.closed())?
    }

    /// Opens (creating if new) a channel and tells the writer its settings.
    pub async fn open_channel(
        &self,
        name: &str,
        settings: ChannelSettings,
    ) -> Result<(), StorageError> {
        let name = name.to_owned();
        self.write(|done| WriteOp::OpenChannel {
            name,
            settings,
            done,
        })
        .await
    }

    /// Stores a record; resolves with its offset once the transaction holding it has
    /// committed (stored before acknowledged, B-151).
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
        let channel = channel.to_owned();
        self.write(|done| WriteOp::Append {
            channel,
            record,
            release,
            done,
        })
        .await
    }

    /// Keeps a held QoS 2 publish; committed before it returns (B-441).
    pub async fn put_held(&self, held: Held) -> Result<(), StorageError> {
        self.write(|done| WriteOp::PutHeld { held, done }).await
    }

    /// Removes a held QoS 2 publish, if that exchange is still the one held.
    pub async fn drop_held(&self, key: HeldKey) -> Result<(), StorageError> {
        self.write(|done| WriteOp::DropHeld { key, done }).await
    }

    /// Every held QoS 2 publish, read at startup (B-443).
    pub async fn held(&self) -> Result<Vec<Held>, StorageError> {
        self.read(|done| ReadOp::Held { done }).await
    }

    /// Reads a window in one snapshot, on a read connection (B-154, B-155); the
    /// broadcast log's on the write connection (B-156).
    pub async fn read_window(
        &self,
        channel: &str,
        req: WindowRequest,
    ) -> Result<Window, StorageError> {
        let channel = channel.to_owned();
        self.read(|done| ReadOp::Window { channel, req, done })
            .await
    }

    /// A channel's floor, head and counts.
    pub async fn stats(&self, channel: &str) -> Result<ChannelStats, StorageError> {
        let channel = channel.to_owned();
        self.read(|done| ReadOp::Stats { channel, done }).await
    }

    /// The offset of the first record stamped at or after `at_ms`, on a read
    /// connection.
    pub async fn first_at(&self, channel: &str, at_ms: u64) -> Result<Option<u64>, StorageError> {
        let channel = channel.to_owned();
        self.read(|done| ReadOp::FirstAt {
            channel,
            at_ms,
            done,
        })
        .await
    }

    /// What a latest channel holds for `topic`, on a read connection.
    pub async fn latest(&self, channel: &str, topic: &str) -> Result<Option<Record>, StorageError> {
        let (channel, topic) = (channel.to_owned(), topic.to_owned());
        self.read(|done| ReadOp::Latest {
            channel,
            topic,
            done,
        })
        .await
    }

    /// Stores a job's attempts as its owner counted them and when it may next be
    /// offered. Never refused for want of room.
    pub async fn store_attempts(
        &self,
        channel: &str,
        offset: u64,
        attempts: Attempts,
        available_after_ms: u64,
    ) -> Result<(), StorageError> {
        let channel = channel.to_owned();
        self.write(|done| WriteOp::StoreAttempts {
            channel,
            offset,
            attempts,
            available_after_ms,
            done,
        })
        .await
    }

    /// Sets when a job may next be offered (a return with backoff).
    pub async fn set_available_after(
        &self,
        channel: &str,
        offset: u64,
        available_after_ms: u64,
    ) -> Result<(), StorageError> {
        let channel = channel.to_owned();
        self.write(|done| WriteOp::SetAvailableAfter {
            channel,
            offset,
            available_after_ms,
            done,
        })
        .await
    }

    /// Removes a resolved job, or a latest channel's value by the record it is.
    pub async fn resolve(&self, channel: &str, offset: u64) -> Result<(), StorageError> {
        let channel = channel.to_owned();
        self.write(|done| WriteOp::Resolve {
            channel,
            offset,
            done,
        })
        .await
    }

    /// Moves a job into the dead-letter channel in one transaction; returns its offset
    /// there. Not a publish: no channel bound is checked and the reserve may be used
    /// (C-113, B-500).
    pub async fn dead_letter(
        &self,
        queue: &str,
        offset: u64,
        to: DeadLetter,
    ) -> Result<u64, StorageError> {
        let queue = queue.to_owned();
        self.write(|done| WriteOp::DeadLetter {
            queue,
            offset,
            to,
            done,
        })
        .await
    }

    /// Stores a consumer's position on a channel.
    pub async fn set_position(
        &self,
        client_id: &str,
        channel: &str,
        offset: u64,
    ) -> Result<(), StorageError> {
        self.positioned.mark(client_id);
        let (client_id, channel) = (client_id.to_owned(), channel.to_owned());
        self.write_on(&self.background, |done| WriteOp::SetPosition {
            client_id,
            channel,
            offset,
            done,
        })
        .await
    }

    /// A consumer's stored position on a channel.
    pub async fn position(
        &self,
        client_id: &str,
        channel: &str,
    ) -> Result<Option<u64>, StorageError> {
        let (client_id, channel) = (client_id.to_owned(), channel.to_owned());
        self.read(|done| ReadOp::Position {
            client_id,
            channel,
            done,
        })
        .await
    }

    /// Forgets every position a client holds (its session ended). Without a trip to
    /// the writer when the client never stored one.
    pub async fn drop_positions(&self, client_id: &str) -> Result<(), StorageError> {
        if !self.positioned.may_hold(client_id) {
            return Ok(());
        }
        let client_id = client_id.to_owned();
        self.write_on(&self.background, |done| WriteOp::DropPositions {
            client_id,
            done,
        })
        .await
    }

    /// Stores a session's record under its client id, replacing the one there. On the
    /// lane a client's packet waits on: the CONNACK, SUBACK or UNSUBACK follows it.
    pub async fn put_session(&self, client_id: &str, record: String) -> Result<(), StorageError> {
        let client_id = client_id.to_owned();
        self.write(|done| WriteOp::PutSession {
            client_id,
            record,
            done,
        })
        .await
    }

    /// Forgets a session's record.
    pub async fn delete_session(&self, client_id: &str) -> Result<(), StorageError> {
        let client_id = client_id.to_owned();
        self.write(|done| WriteOp::DeleteSession { client_id, done })
            .await
    }

    /// Every stored session record, as (client id, encoded record).
    pub async fn sessions(&self) -> Result<Vec<(String, String)>, StorageError> {
        self.read(|done| ReadOp::Sessions { done }).await
    }

    /// The age sweep: removes what is past its channel's retention_period and, on latest
    /// channels, tombstones past deletion_retention_period.
    pub async fn sweep_age(&self, now_ms: u64) -> Result<SweepReport, StorageError> {
        self.sweep_in_chunks(|done| WriteOp::SweepAge { now_ms, done })
            .await
    }

    /// The size sweep: removes each channel's oldest records to bring it under its
    /// retention_bytes.
    pub async fn sweep_size(&self) -> Result<SweepReport, StorageError> {
        self.sweep_in_chunks(|done| WriteOp::SweepSize { done })
            .await
    }

    /// Asks the writer for a sweep until no channel has more to remove: each request
    /// waits behind the batches queued meanwhile (see [`sweep::CHUNK`]).
    async fn sweep_in_chunks(
        &self,
        make: impl Fn(Done<sweep::Swept>) -> WriteOp,
    ) -> Result<SweepReport, StorageError> {
        let mut total = SweepReport::default();
        loop {
            let swept = self.write(&make).await?;
            total.add(swept.report);
            if !swept.more {
                return Ok(total);
            }
        }
    }

    /// Stops the threads after the writes already queued, forcing the log to disk.
    /// Blocking; the lock is released when the provider is dropped.
    pub fn close(&self) {
        self.writes.close();
        self.background.close();
        if let Some(r) = &self.reads {
            r.close();
        }
        let threads = match self.threads.lock() {
            Ok(mut t) => std::mem::take(&mut *t),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for SqliteProvider {
    fn drop(&mut self) {
        self.close();
    }
}
