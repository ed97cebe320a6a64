//! The writer thread: the only code that writes a sqlite provider's file.
//!
//! It takes requests from a bounded channel, gathers them into one transaction as the
//! commit mode says (RFC 0002 "How a sqlite provider commits publishes"), commits, and
//! only then completes every request in it: stored before acknowledged (B-151).
//! Between batches it serves what is not batched (channel opens, sweeps, and reads when
//! `read_connections` is 0) and forces the log to disk every `flush_interval`.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_lite::FutureExt;
use rusqlite::{Connection, Transaction, TransactionBehavior};
use smol::channel::Receiver;

use super::batch::{Batch, Bounds, Channel, Completion, Counts};
use super::ops::{WriteOp, fail, serve_read};
use super::schema::u;
use super::sweep;
use crate::storage::error::StorageError;
use crate::storage::settings::{COLLECT_MAX_RECORDS, ChannelSettings, CommitMode, SqliteSettings};

/// Background writes (positions) taken into every batch, however busy the urgent
/// lane is.
const BACKGROUND_SHARE: usize = 16;

/// Counters the writer keeps, read by metrics and by tests of group commit.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Transactions committed that held at least one batched write.
    pub(crate) commits: AtomicU64,
    /// Records appended in committed transactions.
    pub(crate) appended: AtomicU64,
    /// Times the write-ahead log was forced to disk.
    pub(crate) flushes: AtomicU64,
    /// Bytes of the database's pages in use (free pages excluded), after the last commit.
    pub(crate) used_bytes: AtomicU64,
    /// The last write failure of the database itself, until a commit succeeds again:
    /// what `/health` reports while the provider cannot write.
    pub(crate) failure: std::sync::Mutex<Option<String>>,
}

impl Counters {
    fn set_failure(&self, failure: Option<&StorageError>) {
        if let Ok(mut slot) = self.failure.lock() {
            *slot = failure.map(ToString::to_string);
        }
    }
}

pub(crate) struct Writer {
    name: String,
    conn: Connection,
    /// Writes a client's packet is waiting on: publishes, job state, dead-lettering.
    rx: Receiver<Box<WriteOp>>,
    /// Writes nobody waits on a packet for (consumer positions): taken after `rx`.
    bg: Receiver<Box<WriteOp>>,
    commit: CommitMode,
    flush_interval: Duration,
    wal_path: PathBuf,
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
    /// One of the two channels closed under the wait; look again.
    Retry,
}

impl Writer {
    pub(crate) fn new(
        settings: &SqliteSettings,
        conn: Connection,
        (rx, bg): (Receiver<Box<WriteOp>>, Receiver<Box<WriteOp>>),
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
            bg,
            commit: settings.commit,
            flush_interval: settings.flush_interval,
            wal_path,
            channels: HashMap::new(),
            bounds,
            wal: None,
            dirty_since: None,
            counters: Arc::default(),
        })
        .inspect(|w| w.measure())
    }

    /// The next request already queued, urgent ones first (RFC 0004 "Group commit", as
    /// gaps.md proposes it: the writes a client's packet waits on first, the rest after).
    fn try_next(&self) -> Option<WriteOp> {
        self.rx
            .try_recv()
            .or_else(|_| self.bg.try_recv())
            .ok()
            .map(|op| *op)
    }

    /// Takes a share of the background lane into `batch` however busy the urgent
    /// one is ("the rest in turns"): publishers that never let the urgent lane empty
    /// held every position write back, and the CONNACK of a Clean Start waiting on
    /// its positions' deletion, for as long as they published (B-457).
    fn add_background(&mut self, batch: &mut Vec<WriteOp>) {
        let room = (4 * COLLECT_MAX_RECORDS).saturating_sub(batch.len());
        for _ in 0..BACKGROUND_SHARE.min(room) {
            let Ok(op) = self.bg.try_recv() else {
                break;
            };
            if let Some(op) = self.take_standalone(*op) {
                batch.push(op);
            }
        }
    }

    /// Waits for the next request, or until `deadline`.
    fn next(&self, deadline: Option<Instant>) -> Next {
        loop {
            if let Some(op) = self.try_next() {
                return Next::Op(op);
            }
            let (rx, bg) = (&self.rx, &self.bg);
            let wait = async {
                let got = match (rx.is_closed(), bg.is_closed()) {
                    (true, true) => return Next::Closed,
                    (false, false) => rx.recv().or(bg.recv()).await,
                    (true, false) => bg.recv().await,
                    (false, true) => rx.recv().await,
                };
                got.map_or(Next::Retry, |op| Next::Op(*op))
            };
            let next = wait_until(wait, deadline).unwrap_or(Next::Timeout);
            if !matches!(next, Next::Retry) {
                return next;
            }
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
                Next::Retry => continue,
            };
            if let Some(first) = self.take_standalone(first) {
                let mut batch = vec![first];
                self.collect(&mut batch);
                self.add_background(&mut batch);
                self.commit_batch(batch);
            }
            self.flush_if_due();
        }
        self.flush();
        log::debug!("storage provider {}: writer stopped", self.name);
    }

    /// Runs what is not batched (reads, channel opens, sweeps) at once; hands back a
    /// batchable write.
    fn take_standalone(&mut self, op: WriteOp) -> Option<WriteOp> {
        match op {
            WriteOp::Read(read) => serve_read(&mut self.conn, &self.name, read),
            WriteOp::OpenChannel {
                name,
                settings,
                done,
            } => {
                let _ = done.try_send(self.open_channel(name, settings));
            }
            WriteOp::SweepAge { now_ms, done } => {
                let r = self.sweep(sweep::ages, |c, ch| sweep::age(c, ch, now_ms));
                let _ = done.try_send(r);
            }
            WriteOp::SweepSize { done } => {
                let _ = done.try_send(self.sweep(sweep::sizes, sweep::size));
            }
            other => return Some(other),
        }
        None
    }

    /// Adds to `batch` per the commit mode (B-139 to B-143).
    fn collect(&mut self, batch: &mut Vec<WriteOp>) {
        let mut publishes = batch.iter().filter(|o| o.is_publish()).count();
        match self.commit {
            CommitMode::PerPublish => {}
            CommitMode::Collect => {
                // Whatever arrived while the last commit ran, without waiting.
                while publishes < COLLECT_MAX_RECORDS && batch.len() < 4 * COLLECT_MAX_RECORDS {
                    let Some(op) = self.try_next() else { break };
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
                        Next::Timeout | Next::Closed | Next::Retry => break,
                    }
                }
            }
        }
    }

    /// One transaction for the whole batch; completions only after the commit.
    fn commit_batch(&mut self, ops: Vec<WriteOp>) {
        let tx = match Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                let err = StorageError::io(&self.name, "begin a transaction", e);
                self.counters.set_failure(Some(&err));
                ops.into_iter().for_each(|op| fail(op, &err));
                return;
            }
        };
        let mut batch = Batch::new(&self.name, &self.channels, &self.bounds);
        let completions: Vec<Completion> = ops.into_iter().map(|op| batch.exec(&tx, op)).collect();
        let outcome = match batch.failure().cloned() {
            Some(e) => {
                drop(tx); // rolls back
                Err(e)
            }
            None => batch.store_counts(&tx).and_then(|()| {
                tx.commit()
                    .map_err(|e| StorageError::io(&self.name, "commit", e))
            }),
        };
        let publishes = batch.publishes;
        let counts = batch.into_counts();
        match &outcome {
            Ok(()) => {
                self.apply_counts(counts);
                self.counters.commits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .appended
                    .fetch_add(publishes, Ordering::Relaxed);
                self.dirty_since.get_or_insert_with(Instant::now);
                self.measure();
                self.counters.set_failure(None);
            }
            Err(e) => {
                // A refusal (a full channel, say) says nothing about the database.
                if matches!(e, StorageError::Io { .. }) {
                    self.counters.set_failure(Some(e));
                }
                log::warn!("{e}");
            }
        }
        let err = outcome.err();
        for c in completions {
            c(err.as_ref());
        }
    }

    /// Records the pages in use, for metrics and the operator.
    fn measure(&self) {
        let used: rusqlite::Result<(i64, i64)> = self.conn.query_row(
            "SELECT (SELECT page_count FROM pragma_page_count()), \
             (SELECT freelist_count FROM pragma_freelist_count())",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        );
        if let Ok((pages, free)) = used {
            let bytes = u(pages).saturating_sub(u(free)) * self.bounds.page_size;
            self.counters.used_bytes.store(bytes, Ordering::Relaxed);
        }
    }

    fn apply_counts(&mut self, counts: HashMap<String, Counts>) {
        for (name, n) in counts {
            if let Some(ch) = self.channels.get_mut(&name) {
                ch.counts = n;
            }
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
            let err = StorageError::io(
                &self.name,
                &format!("force {} to disk", self.wal_path.display()),
                e,
            );
            log::warn!("{err}");
            self.counters.set_failure(Some(&err));
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
        let (id, counts) = self
            .conn
            .query_row(
                "SELECT id, next_offset, records, bytes FROM channels WHERE name = ?1",
                [&name],
                |r| {
                    let counts = Counts {
                        next_offset: u(r.get(1)?),
                        records: u(r.get(2)?),
                        bytes: u(r.get(3)?),
                    };
                    Ok((r.get::<_, i64>(0)?, counts))
                },
            )
            .map_err(err)?;
        self.channels.insert(
            name,
            Channel {
                id,
                settings,
                counts,
            },
        );
        Ok(())
    }

    /// Runs `one` for every channel `wanted` selects, each in a transaction of its own,
    /// and moves the in-memory counts by what it removed. `more` when a channel has
    /// more than a chunk to remove: the caller asks again, behind the batches queued.
    fn sweep(
        &mut self,
        wanted: impl Fn(&ChannelSettings) -> bool,
        one: impl Fn(&Connection, &Channel) -> rusqlite::Result<sweep::Swept>,
    ) -> Result<sweep::Swept, StorageError> {
        let mut total = sweep::Swept::default();
        let names: Vec<String> = self
            .channels
            .iter()
            .filter(|(_, c)| wanted(&c.settings))
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let Some(ch) = self.channels.get(&name) else {
                continue;
            };
            let tx = Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)
                .map_err(|e| StorageError::io(&self.name, "begin a sweep", e))?;
            let r = one(&tx, ch)
                .and_then(|r| tx.commit().map(|()| r))
                .map_err(|e| StorageError::io(&self.name, &format!("sweep channel {name}"), e))?;
            if let Some(ch) = self.channels.get_mut(&name) {
                ch.counts.records = ch.counts.records.saturating_sub(r.report.records);
                ch.counts.bytes = ch.counts.bytes.saturating_sub(r.report.bytes);
            }
            if r.report.records > 0 {
                self.dirty_since.get_or_insert_with(Instant::now);
                self.measure();
            }
            total.add(r);
        }
        Ok(total)
    }
}

/// Runs `future` on this thread until it is ready (`Some`) or `deadline` passes
/// (`None`), parking in between. Not `smol::block_on`: that one takes async-io's reactor
/// whenever the serving thread lets go of it, and then runs the broker's epoll from this
/// thread, so every socket event crosses threads and wakes the writer for nothing.
fn wait_until<T>(future: impl Future<Output = T>, deadline: Option<Instant>) -> Option<T> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(t) = future.as_mut().poll(&mut cx) {
            return Some(t);
        }
        match deadline {
            None => std::thread::park(),
            Some(at) => {
                let left = at.checked_duration_since(Instant::now())?;
                std::thread::park_timeout(left);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_gives_up_at_the_deadline_and_wakes_for_a_message() {
        let (tx, rx) = smol::channel::bounded::<u8>(1);
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(wait_until(rx.recv(), Some(soon)), None);
        assert!(Instant::now() >= soon);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send_blocking(7)
        });
        let later = Instant::now() + Duration::from_secs(10);
        assert_eq!(wait_until(rx.recv(), Some(later)), Some(Ok(7)));
        assert!(sender.join().is_ok_and(|sent| sent.is_ok()));
    }
}
