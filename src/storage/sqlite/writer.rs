//! The writer thread: the only code that writes a sqlite provider's file.
//!
//! It takes requests from a bounded channel, runs each in a savepoint inside the
//! current transaction (so one refused publish does not undo its neighbours), commits,
//! and only then completes every request in the batch (stored before acknowledged).

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_lite::FutureExt;
use rusqlite::{Connection, ErrorCode, OptionalExtension, Transaction, params};
use smol::channel::{Receiver, Sender};

use super::schema::{self, RECORD_COLUMNS, STATE_DELETED, STATE_JOB, STATE_STORED, i, u};
use crate::storage::error::StorageError;
use crate::storage::record::{ChannelStats, NewRecord, Record, SweepReport, Window, WindowRequest};
use crate::storage::settings::{
    COLLECT_MAX_RECORDS, ChannelKind, ChannelSettings, CommitMode, SqliteSettings,
};

/// Where a request's answer goes; `bounded(1)`, so completing never blocks.
pub(crate) type Done<T> = Sender<Result<T, StorageError>>;

/// A read, served by a reader thread or (read_connections 0) by the writer.
pub(crate) enum ReadOp {
    Window {
        channel: String,
        req: WindowRequest,
        done: Done<Window>,
    },
    Stats {
        channel: String,
        done: Done<ChannelStats>,
    },
    Position {
        client_id: String,
        channel: String,
        done: Done<Option<u64>>,
    },
}

/// A write the writer thread performs.
pub(crate) enum WriteOp {
    OpenChannel {
        name: String,
        settings: ChannelSettings,
        done: Done<()>,
    },
    Append {
        channel: String,
        record: NewRecord,
        done: Done<u64>,
    },
    RecordAttempt {
        channel: String,
        offset: u64,
        available_after_ms: u64,
        done: Done<u32>,
    },
    SetAvailableAfter {
        channel: String,
        offset: u64,
        available_after_ms: u64,
        done: Done<()>,
    },
    Resolve {
        channel: String,
        offset: u64,
        done: Done<()>,
    },
    DeadLetter {
        queue: String,
        offset: u64,
        dlq: String,
        extra_user_properties: Vec<(String, String)>,
        done: Done<u64>,
    },
    SetPosition {
        client_id: String,
        channel: String,
        offset: u64,
        done: Done<()>,
    },
    DropPositions {
        client_id: String,
        done: Done<()>,
    },
    SweepAge {
        now_ms: u64,
        done: Done<SweepReport>,
    },
    SweepSize {
        done: Done<SweepReport>,
    },
    Read(ReadOp),
}

impl WriteOp {
    fn is_publish(&self) -> bool {
        matches!(self, WriteOp::Append { .. })
    }
}

/// Serves one read on `conn`.
pub(crate) fn serve_read(conn: &mut Connection, provider: &str, op: ReadOp) {
    match op {
        ReadOp::Window { channel, req, done } => {
            let _ = done.try_send(schema::read_window(conn, provider, &channel, req));
        }
        ReadOp::Stats { channel, done } => {
            let _ = done.try_send(schema::read_stats(conn, provider, &channel));
        }
        ReadOp::Position {
            client_id,
            channel,
            done,
        } => {
            let _ = done.try_send(schema::read_position(conn, provider, &client_id, &channel));
        }
    }
}

/// What the writer knows about an open channel.
struct Channel {
    id: i64,
    settings: ChannelSettings,
}

/// Provider-wide bounds, in pages (gaps.md section 3 "The reserve").
struct Bounds {
    page_size: u64,
    max_pages: u64,
    reserve_pages: u64,
    max_bytes: u64,
    reserve_bytes: u64,
}

/// Counters the writer keeps, read by metrics and by tests of group commit.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Transactions committed that held at least one batched write.
    pub(crate) commits: AtomicU64,
    /// Records appended in committed transactions.
    pub(crate) appended: AtomicU64,
    /// Times the write-ahead log was forced to disk.
    pub(crate) flushes: AtomicU64,
}

/// Called once the batch's commit is known: `None` if it committed.
type Completion = Box<dyn FnOnce(Option<&StorageError>) + Send>;

pub(crate) struct Writer {
    pub(crate) name: String,
    pub(crate) conn: Connection,
    pub(crate) rx: Receiver<WriteOp>,
    pub(crate) commit: CommitMode,
    pub(crate) flush_interval: Duration,
    pub(crate) wal_path: PathBuf,
    channels: HashMap<String, Channel>,
    bounds: Bounds,
    wal: Option<File>,
    /// Set when a commit has not yet been forced to disk.
    dirty_since: Option<Instant>,
    pub(crate) counters: Arc<Counters>,
}

#[allow(clippy::large_enum_variant)] // a transient value on the writer's stack
enum Next {
    Op(WriteOp),
    Timeout,
    Closed,
}

impl Writer {
    pub(crate) fn new(
        settings: &SqliteSettings,
        conn: Connection,
        rx: Receiver<WriteOp>,
        wal_path: PathBuf,
    ) -> Result<Writer, StorageError> {
        let name = settings.name.clone();
        let (max_bytes, reserve_bytes) = (settings.max_bytes, settings.reserve_bytes);
        let page_size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| StorageError::io(&name, "read page_size", e))?;
        let page_size = u(page_size).max(512);
        let max_pages = (max_bytes / page_size).max(1);
        // max_page_count cannot go below the pages in use; SQLite keeps the larger.
        conn.query_row(&format!("PRAGMA max_page_count = {max_pages}"), [], |_| {
            Ok(())
        })
        .map_err(|e| StorageError::io(&name, "set max_page_count", e))?;
        let bounds = Bounds {
            page_size,
            max_pages,
            reserve_pages: reserve_bytes.div_ceil(page_size),
            max_bytes,
            reserve_bytes,
        };
        Ok(Writer {
            name,
            conn,
            rx,
            commit: settings.commit,
            flush_interval: settings.flush_interval,
            wal_path,
            channels: HashMap::new(),
            bounds,
            wal: None,
            dirty_since: None,
            counters: Arc::default(),
        })
    }

    /// Waits for the next request, or until `deadline` (the next flush).
    fn next(&self, deadline: Option<Instant>) -> Next {
        let rx = &self.rx;
        let recv = async {
            match rx.recv().await {
                Ok(op) => Next::Op(op),
                Err(_) => Next::Closed,
            }
        };
        match deadline {
            None => smol::block_on(recv),
            Some(at) => smol::block_on(recv.or(async {
                smol::Timer::at(at).await;
                Next::Timeout
            })),
        }
    }

    fn flush_deadline(&self) -> Option<Instant> {
        self.dirty_since.map(|t| t + self.flush_interval)
    }

    /// The writer's loop: collect a batch as the commit mode says, commit it, complete it.
    pub(crate) fn run(mut self) {
        loop {
            let first = match self.next(self.flush_deadline()) {
                Next::Op(op) => op,
                Next::Timeout => {
                    self.flush();
                    continue;
                }
                Next::Closed => break,
            };
            let Some(first) = self.take_standalone(first) else {
                self.flush_if_due();
                continue;
            };
            let mut batch = vec![first];
            self.collect(&mut batch);
            self.commit_batch(batch);
            self.flush_if_due();
        }
        self.flush();
        log::debug!("storage provider {}: writer stopped", self.name);
    }

    /// Runs what is not batched (reads, channel opens, sweeps) at once; hands back a
    /// batchable write.
    fn take_standalone(&mut self, op: WriteOp) -> Option<WriteOp> {
        match op {
            WriteOp::Read(read) => {
                serve_read(&mut self.conn, &self.name, read);
                None
            }
            WriteOp::OpenChannel {
                name,
                settings,
                done,
            } => {
                let r = self.open_channel(name, settings);
                let _ = done.try_send(r);
                None
            }
            WriteOp::SweepAge { now_ms, done } => {
                let r = self.sweep(
                    |c| {
                        c.effective_retention().period.is_some()
                            || matches!(
                                c.kind,
                                ChannelKind::Latest {
                                    deletion_retention: Some(_)
                                }
                            )
                    },
                    |w, tx, name| w.sweep_age_one(tx, name, now_ms),
                );
                let _ = done.try_send(r);
                None
            }
            WriteOp::SweepSize { done } => {
                let r = self.sweep(
                    |c| c.effective_retention().bytes.is_some(),
                    |w, tx, name| w.sweep_size_one(tx, name),
                );
                let _ = done.try_send(r);
                None
            }
            other => Some(other),
        }
    }

    /// Adds to `batch` per the commit mode (B-139 to B-143).
    fn collect(&mut self, batch: &mut Vec<WriteOp>) {
        let mut publishes = batch.iter().filter(|o| o.is_publish()).count();
        match self.commit {
            CommitMode::PerPublish => {}
            CommitMode::Collect => {
                // Whatever arrived while the last commit ran, without waiting.
                while publishes < COLLECT_MAX_RECORDS && batch.len() < 4 * COLLECT_MAX_RECORDS {
                    let Ok(op) = self.rx.try_recv() else { break };
                    if let Some(op) = self.take_standalone(op) {
                        publishes += usize::from(op.is_publish());
                        batch.push(op);
                    }
                }
            }
            CommitMode::Interval {
                interval,
                max_records,
            } => {
                // The leader waits holding no transaction (B-150): reads that arrive
                // meanwhile are served on the free connection.
                let deadline = Instant::now() + interval;
                while publishes < max_records && batch.len() < 4 * max_records.max(64) {
                    match self.next(Some(deadline)) {
                        Next::Op(op) => {
                            if let Some(op) = self.take_standalone(op) {
                                publishes += usize::from(op.is_publish());
                                batch.push(op);
                            }
                        }
                        Next::Timeout | Next::Closed => break,
                    }
                }
            }
        }
    }

    fn commit_batch(&mut self, batch: Vec<WriteOp>) {
        let name = self.name.clone();
        let mut completions: Vec<Completion> = Vec::with_capacity(batch.len());
        let tx = match self.conn.transaction() {
            Ok(tx) => tx,
            Err(e) => {
                let err = StorageError::io(&name, "begin a transaction", e);
                for op in batch {
                    fail(op, &err);
                }
                return;
            }
        };
        let mut tx = tx;
        let publishes = batch.iter().filter(|o| o.is_publish()).count() as u64;
        for op in batch {
            completions.push(exec(&mut tx, &name, &self.channels, &self.bounds, op));
        }
        let commit_err = tx
            .commit()
            .err()
            .map(|e| StorageError::io(&name, "commit", e));
        if commit_err.is_none() {
            self.counters.commits.fetch_add(1, Ordering::Relaxed);
            self.counters
                .appended
                .fetch_add(publishes, Ordering::Relaxed);
            if self.dirty_since.is_none() {
                self.dirty_since = Some(Instant::now());
            }
        }
        for c in completions {
            c(commit_err.as_ref());
        }
    }

    fn flush_if_due(&mut self) {
        if self.flush_deadline().is_some_and(|d| Instant::now() >= d) {
            self.flush();
        }
    }

    /// Forces the write-ahead log to disk; nothing when nothing was written (B-159).
    fn flush(&mut self) {
        if self.dirty_since.take().is_none() {
            return;
        }
        if self.wal.is_none() {
            self.wal = File::open(&self.wal_path).ok();
        }
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        if let Some(wal) = &self.wal
            && let Err(e) = wal.sync_data()
        {
            log::warn!(
                "storage provider {}: forcing {} to disk failed: {e}",
                self.name,
                self.wal_path.display()
            );
            self.wal = None;
        }
    }

    fn open_channel(
        &mut self,
        name: String,
        settings: ChannelSettings,
    ) -> Result<(), StorageError> {
        let err = |e| StorageError::io(&self.name, &format!("open channel {name}"), e);
        self.conn
            .execute("INSERT OR IGNORE INTO channels(name) VALUES (?1)", [&name])
            .map_err(err)?;
        let (id, _) = schema::channel_row(&self.conn, &name)
            .map_err(err)?
            .ok_or_else(|| StorageError::io(&self.name, "open channel", "row vanished"))?;
        self.channels.insert(name, Channel { id, settings });
        Ok(())
    }

    /// Runs `one` for every open channel, each in a transaction of its own.
    fn sweep(
        &mut self,
        wanted: impl Fn(&ChannelSettings) -> bool,
        one: impl Fn(&Writer, &Transaction<'_>, &str) -> rusqlite::Result<SweepReport>,
    ) -> Result<SweepReport, StorageError> {
        let mut total = SweepReport::default();
        let names: Vec<String> = self
            .channels
            .iter()
            .filter(|(_, c)| wanted(&c.settings))
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let tx = self
                .conn
                .unchecked_transaction()
                .map_err(|e| StorageError::io(&self.name, "begin a sweep", e))?;
            let r = one(self, &tx, &name)
                .and_then(|r| tx.commit().map(|()| r))
                .map_err(|e| StorageError::io(&self.name, &format!("sweep channel {name}"), e))?;
            if r.records > 0 && self.dirty_since.is_none() {
                self.dirty_since = Some(Instant::now());
            }
            total.add(r);
        }
        Ok(total)
    }

    fn sweep_age_one(
        &self,
        tx: &Transaction<'_>,
        name: &str,
        now_ms: u64,
    ) -> rusqlite::Result<SweepReport> {
        let Some(ch) = self.channels.get(name) else {
            return Ok(SweepReport::default());
        };
        let cutoff = |d: Duration| i(now_ms.saturating_sub(d.as_millis() as u64));
        let period = ch.settings.effective_retention().period;
        let tombstones = match ch.settings.kind {
            ChannelKind::Latest { deletion_retention } => deletion_retention,
            _ => None,
        };
        let mut report = SweepReport::default();
        if let Some(p) = period {
            report.add(delete_where(
                tx,
                ch.id,
                "timestamp_ms < ?2 AND state != 1",
                cutoff(p),
            )?);
        }
        if let Some(p) = tombstones {
            report.add(delete_where(
                tx,
                ch.id,
                "timestamp_ms < ?2 AND state = 1",
                cutoff(p),
            )?);
        }
        Ok(report)
    }

    fn sweep_size_one(&self, tx: &Transaction<'_>, name: &str) -> rusqlite::Result<SweepReport> {
        let Some(ch) = self.channels.get(name) else {
            return Ok(SweepReport::default());
        };
        let Some(bound) = ch.settings.effective_retention().bytes else {
            return Ok(SweepReport::default());
        };
        let held: i64 = tx.query_row("SELECT bytes FROM channels WHERE id = ?1", [ch.id], |r| {
            r.get(0)
        })?;
        let mut excess = u(held).saturating_sub(bound);
        if excess == 0 {
            return Ok(SweepReport::default());
        }
        // Oldest first until enough is gone; then one range delete.
        let mut cut = None;
        {
            let mut stmt = tx.prepare_cached(
                "SELECT record_offset, size FROM records WHERE channel_id = ?1 ORDER BY record_offset",
            )?;
            let mut rows = stmt.query([ch.id])?;
            while let Some(row) = rows.next()? {
                let (off, size): (i64, i64) = (row.get(0)?, row.get(1)?);
                cut = Some(off);
                excess = excess.saturating_sub(u(size));
                if excess == 0 {
                    break;
                }
            }
        }
        match cut {
            Some(off) => delete_where(tx, ch.id, "record_offset <= ?2", off),
            None => Ok(SweepReport::default()),
        }
    }
}

/// Deletes a channel's records matching `cond` (with `?2` bound to `arg`), keeping the
/// channel's counts and the latest index in step.
fn delete_where(tx: &Connection, id: i64, cond: &str, arg: i64) -> rusqlite::Result<SweepReport> {
    let (n, bytes): (i64, Option<i64>) = tx.query_row(
        &format!("SELECT COUNT(*), SUM(size) FROM records WHERE channel_id = ?1 AND {cond}"),
        params![id, arg],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if n == 0 {
        return Ok(SweepReport::default());
    }
    tx.execute(
        &format!(
            "DELETE FROM latest WHERE channel_id = ?1 AND record_offset IN \
             (SELECT record_offset FROM records WHERE channel_id = ?1 AND {cond})"
        ),
        params![id, arg],
    )?;
    tx.execute(
        &format!("DELETE FROM records WHERE channel_id = ?1 AND {cond}"),
        params![id, arg],
    )?;
    let bytes = bytes.unwrap_or(0);
    tx.execute(
        "UPDATE channels SET records = records - ?2, bytes = bytes - ?3 WHERE id = ?1",
        params![id, n, bytes],
    )?;
    Ok(SweepReport {
        records: u(n),
        bytes: u(bytes),
    })
}

/// Completes a request that never ran.
fn fail(op: WriteOp, err: &StorageError) {
    match op {
        WriteOp::OpenChannel { done, .. }
        | WriteOp::SetAvailableAfter { done, .. }
        | WriteOp::Resolve { done, .. }
        | WriteOp::SetPosition { done, .. }
        | WriteOp::DropPositions { done, .. } => {
            let _ = done.try_send(Err(err.clone()));
        }
        WriteOp::Append { done, .. } | WriteOp::DeadLetter { done, .. } => {
            let _ = done.try_send(Err(err.clone()));
        }
        WriteOp::RecordAttempt { done, .. } => {
            let _ = done.try_send(Err(err.clone()));
        }
        WriteOp::SweepAge { done, .. } | WriteOp::SweepSize { done } => {
            let _ = done.try_send(Err(err.clone()));
        }
        WriteOp::Read(_) => {}
    }
}

/// Runs `f` in a savepoint of `tx`: its effects are kept only if it succeeds. The
/// completion sends its result once the batch's commit is known.
fn in_savepoint<T: Send + 'static>(
    tx: &mut Transaction<'_>,
    provider: &str,
    done: Done<T>,
    f: impl FnOnce(&Connection) -> Result<T, StorageError>,
) -> Completion {
    let result = match tx.savepoint() {
        Ok(sp) => match f(&sp) {
            Ok(v) => sp
                .commit()
                .map(|()| v)
                .map_err(|e| StorageError::io(provider, "release a savepoint", e)),
            Err(e) => Err(e), // dropping the savepoint rolls it back
        },
        Err(e) => Err(StorageError::io(provider, "open a savepoint", e)),
    };
    Box::new(move |commit_err| {
        let out = match (result, commit_err) {
            (Ok(v), None) => Ok(v),
            (Ok(_), Some(e)) => Err(e.clone()),
            (Err(e), _) => Err(e),
        };
        let _ = done.try_send(out);
    })
}

fn channel<'a>(
    channels: &'a HashMap<String, Channel>,
    provider: &str,
    name: &str,
) -> Result<&'a Channel, StorageError> {
    channels
        .get(name)
        .ok_or_else(|| StorageError::UnknownChannel {
            provider: provider.to_owned(),
            channel: name.to_owned(),
        })
}

fn exec(
    tx: &mut Transaction<'_>,
    provider: &str,
    channels: &HashMap<String, Channel>,
    bounds: &Bounds,
    op: WriteOp,
) -> Completion {
    let p = provider;
    match op {
        WriteOp::Append {
            channel: name,
            record,
            done,
        } => in_savepoint(tx, p, done, |c| {
            let ch = channel(channels, p, &name)?;
            append(c, p, &name, ch, bounds, record)
        }),
        WriteOp::RecordAttempt {
            channel: name,
            offset,
            available_after_ms,
            done,
        } => in_savepoint(tx, p, done, |c| {
            let ch = job_channel(channels, p, &name, "record an attempt")?;
            c.prepare_cached(
                "UPDATE records SET attempts = attempts + 1, available_after_ms = ?3 \
                 WHERE channel_id = ?1 AND record_offset = ?2 RETURNING attempts",
            )
            .and_then(|mut s| {
                s.query_row(params![ch.id, i(offset), i(available_after_ms)], |r| {
                    r.get::<_, i64>(0)
                })
                .optional()
            })
            .map_err(|e| StorageError::io(p, "record an attempt", e))?
            .map(|a| u32::try_from(a).unwrap_or(u32::MAX))
            .ok_or(StorageError::NoSuchRecord {
                channel: name.clone(),
                offset,
            })
        }),
        WriteOp::SetAvailableAfter {
            channel: name,
            offset,
            available_after_ms,
            done,
        } => in_savepoint(tx, p, done, |c| {
            let ch = job_channel(channels, p, &name, "set available-after")?;
            let n = c
                .execute(
                    "UPDATE records SET available_after_ms = ?3 WHERE channel_id = ?1 AND record_offset = ?2",
                    params![ch.id, i(offset), i(available_after_ms)],
                )
                .map_err(|e| StorageError::io(p, "set available-after", e))?;
            found(n, &name, offset)
        }),
        WriteOp::Resolve {
            channel: name,
            offset,
            done,
        } => in_savepoint(tx, p, done, |c| {
            let ch = job_channel(channels, p, &name, "resolve")?;
            take_record(c, p, ch.id, &name, offset).map(|_| ())
        }),
        WriteOp::DeadLetter {
            queue,
            offset,
            dlq,
            extra_user_properties,
            done,
        } => in_savepoint(tx, p, done, |c| {
            let q = job_channel(channels, p, &queue, "dead-letter")?;
            let d = channel(channels, p, &dlq)?;
            let rec = take_record(c, p, q.id, &queue, offset)?;
            let mut props = rec.properties;
            props.user_properties.extend(extra_user_properties);
            let new = NewRecord {
                message_id: rec.message_id,
                timestamp_ms: rec.timestamp_ms,
                topic: rec.topic,
                payload: rec.payload,
                properties: props,
            };
            insert(c, p, &dlq, d.id, STATE_STORED, &new, bounds)
        }),
        WriteOp::SetPosition {
            client_id,
            channel,
            offset,
            done,
        } => in_savepoint(tx, p, done, |c| {
            c.prepare_cached(
                "INSERT INTO positions(client_id, channel, record_offset) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(client_id, channel) DO UPDATE SET record_offset = excluded.record_offset",
            )
            .and_then(|mut s| s.execute(params![client_id, channel, i(offset)]))
            .map(|_| ())
            .map_err(|e| StorageError::io(p, "store a consumer position", e))
        }),
        WriteOp::DropPositions { client_id, done } => in_savepoint(tx, p, done, |c| {
            c.execute("DELETE FROM positions WHERE client_id = ?1", [client_id])
                .map(|_| ())
                .map_err(|e| StorageError::io(p, "drop consumer positions", e))
        }),
        other => {
            // Standalone operations never reach a batch.
            let err = StorageError::io(p, "batch", "unbatchable operation");
            fail(other, &err);
            Box::new(|_| {})
        }
    }
}

fn found(n: usize, channel: &str, offset: u64) -> Result<(), StorageError> {
    if n == 0 {
        Err(StorageError::NoSuchRecord {
            channel: channel.to_owned(),
            offset,
        })
    } else {
        Ok(())
    }
}

fn job_channel<'a>(
    channels: &'a HashMap<String, Channel>,
    provider: &str,
    name: &str,
    operation: &'static str,
) -> Result<&'a Channel, StorageError> {
    let ch = channel(channels, provider, name)?;
    if ch.settings.is_queue() {
        Ok(ch)
    } else {
        Err(StorageError::WrongChannelKind {
            channel: name.to_owned(),
            operation,
        })
    }
}

/// A publish: the channel's own bound, the provider's bound less its reserve, then the
/// insert (C-021, C-115).
fn append(
    c: &Connection,
    p: &str,
    name: &str,
    ch: &Channel,
    bounds: &Bounds,
    record: NewRecord,
) -> Result<u64, StorageError> {
    let io = |e| StorageError::io(p, &format!("store a record on {name}"), e);
    let size = record.size();
    if let Some(max) = ch.settings.max_bytes {
        let used: i64 = c
            .prepare_cached("SELECT bytes FROM channels WHERE id = ?1")
            .and_then(|mut s| s.query_row([ch.id], |r| r.get(0)))
            .map_err(io)?;
        if u(used) + size > max {
            return Err(StorageError::ChannelFull {
                channel: name.to_owned(),
                max_bytes: max,
                used: u(used),
                size,
            });
        }
    }
    let (pages, free): (i64, i64) = c
        .query_row(
            "SELECT (SELECT page_count FROM pragma_page_count()), (SELECT freelist_count FROM pragma_freelist_count())",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(io)?;
    let used_pages = u(pages).saturating_sub(u(free));
    let need = size.div_ceil(bounds.page_size) + 1;
    if used_pages + need > bounds.max_pages.saturating_sub(bounds.reserve_pages) {
        return Err(provider_full(p, bounds));
    }
    let state = if ch.settings.is_queue() {
        STATE_JOB
    } else if ch.settings.is_latest() && record.payload.is_empty() {
        STATE_DELETED
    } else {
        STATE_STORED
    };
    if ch.settings.is_latest() {
        let old: Option<i64> = c
            .prepare_cached("SELECT record_offset FROM latest WHERE channel_id = ?1 AND topic = ?2")
            .and_then(|mut s| {
                s.query_row(params![ch.id, record.topic], |r| r.get(0))
                    .optional()
            })
            .map_err(io)?;
        if let Some(old) = old {
            take_record(c, p, ch.id, name, u(old))?;
        }
    }
    let offset = insert(c, p, name, ch.id, state, &record, bounds)?;
    if ch.settings.is_latest() {
        c.prepare_cached(
            "INSERT INTO latest(channel_id, topic, record_offset) VALUES (?1, ?2, ?3) \
             ON CONFLICT(channel_id, topic) DO UPDATE SET record_offset = excluded.record_offset",
        )
        .and_then(|mut s| s.execute(params![ch.id, record.topic, i(offset)]))
        .map_err(io)?;
    }
    Ok(offset)
}

fn provider_full(p: &str, bounds: &Bounds) -> StorageError {
    StorageError::ProviderFull {
        provider: p.to_owned(),
        max_bytes: bounds.max_bytes,
        reserve: bounds.reserve_bytes,
    }
}

/// SQLITE_FULL is the page ceiling (0x97) only when the file is at it; otherwise the
/// disk itself is full or refusing, which is a failure (0x83), not a quota.
fn full_or_failed(
    c: &Connection,
    p: &str,
    name: &str,
    bounds: &Bounds,
    e: rusqlite::Error,
) -> StorageError {
    if e.sqlite_error_code() == Some(ErrorCode::DiskFull) {
        let pages: Option<i64> = c.query_row("PRAGMA page_count", [], |r| r.get(0)).ok();
        if pages.is_some_and(|n| u(n) + 1 >= bounds.max_pages) {
            return provider_full(p, bounds);
        }
    }
    StorageError::io(p, &format!("store a record on {name}"), e)
}

/// Takes the next offset and inserts; no bound but SQLite's page ceiling is checked.
fn insert(
    c: &Connection,
    p: &str,
    name: &str,
    id: i64,
    state: i64,
    r: &NewRecord,
    bounds: &Bounds,
) -> Result<u64, StorageError> {
    let io = |e: rusqlite::Error| full_or_failed(c, p, name, bounds, e);
    let offset: i64 = c
        .prepare_cached(
            "UPDATE channels SET next_offset = next_offset + 1 WHERE id = ?1 RETURNING next_offset - 1",
        )
        .and_then(|mut s| s.query_row([id], |r| r.get(0)))
        .map_err(io)?;
    let size = i(r.size());
    let pr = &r.properties;
    c.prepare_cached(
        "INSERT INTO records(channel_id, record_offset, message_id, timestamp_ms, topic, payload, size, \
         state, payload_format, message_expiry, content_type, response_topic, correlation_data, user_properties) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            offset,
            r.message_id,
            i(r.timestamp_ms),
            r.topic,
            r.payload,
            size,
            state,
            pr.payload_format_indicator,
            pr.message_expiry_interval,
            pr.content_type,
            pr.response_topic,
            pr.correlation_data,
            schema::encode_user_properties(&pr.user_properties),
        ])
    })
    .map_err(io)?;
    c.prepare_cached("UPDATE channels SET records = records + 1, bytes = bytes + ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id, size]))
        .map_err(io)?;
    Ok(u(offset))
}

/// Removes one record and returns it, keeping the channel's counts in step.
fn take_record(
    c: &Connection,
    p: &str,
    id: i64,
    name: &str,
    offset: u64,
) -> Result<Record, StorageError> {
    let io = |e| StorageError::io(p, &format!("remove a record from {name}"), e);
    let sql = format!(
        "DELETE FROM records WHERE channel_id = ?1 AND record_offset = ?2 RETURNING {RECORD_COLUMNS}"
    );
    let rec = c
        .prepare_cached(&sql)
        .and_then(|mut s| {
            s.query_row(params![id, i(offset)], schema::record_from_row)
                .optional()
        })
        .map_err(io)?
        .ok_or(StorageError::NoSuchRecord {
            channel: name.to_owned(),
            offset,
        })?;
    c.prepare_cached("UPDATE channels SET records = records - 1, bytes = bytes - ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id, i(rec.size())]))
        .map_err(io)?;
    Ok(rec)
}
