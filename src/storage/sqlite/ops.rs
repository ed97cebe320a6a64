//! The requests the async side sends to a sqlite provider's threads.

use rusqlite::Connection;
use smol::channel::Sender;

use super::schema;
use super::sweep::Swept;
use crate::storage::error::StorageError;
use crate::storage::record::{
    Attempts, ChannelStats, DeadLetter, Held, HeldKey, NewRecord, Record, Window, WindowRequest,
};
use crate::storage::settings::ChannelSettings;

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
    Latest {
        channel: String,
        topic: String,
        done: Done<Option<Record>>,
    },
    FirstAt {
        channel: String,
        at_ms: u64,
        done: Done<Option<u64>>,
    },
    Position {
        client_id: String,
        channel: String,
        done: Done<Option<u64>>,
    },
    Sessions {
        done: Done<Vec<(String, String)>>,
    },
    Held {
        done: Done<Vec<Held>>,
    },
}

impl ReadOp {
    /// Whether a read connection may serve it: a channel's records and counts alone
    /// (B-156). The broadcast log's reads decide what its deliveries acknowledge and
    /// remove, and positions, sessions and held publishes are the store's own
    /// bookkeeping: those stay on the write connection.
    pub(crate) fn on_a_reader(&self) -> bool {
        match self {
            ReadOp::Window { channel, .. }
            | ReadOp::Stats { channel, .. }
            | ReadOp::Latest { channel, .. }
            | ReadOp::FirstAt { channel, .. } => channel != crate::storage::SESSION_LOG,
            ReadOp::Position { .. } | ReadOp::Sessions { .. } | ReadOp::Held { .. } => false,
        }
    }
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
        /// The held QoS 2 publish this record releases, in the same transaction.
        release: Option<HeldKey>,
        done: Done<u64>,
    },
    PutHeld {
        held: Held,
        done: Done<()>,
    },
    DropHeld {
        key: HeldKey,
        done: Done<()>,
    },
    StoreAttempts {
        channel: String,
        offset: u64,
        attempts: Attempts,
        available_after_ms: u64,
        done: Done<()>,
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
        to: DeadLetter,
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
    PutSession {
        client_id: String,
        record: String,
        done: Done<()>,
    },
    DeleteSession {
        client_id: String,
        done: Done<()>,
    },
    SweepAge {
        now_ms: u64,
        done: Done<Swept>,
    },
    SweepSize {
        done: Done<Swept>,
    },
    Read(ReadOp),
}

impl WriteOp {
    /// Whether this is a publish, the thing a commit mode counts.
    pub(crate) fn is_publish(&self) -> bool {
        matches!(self, WriteOp::Append { .. })
    }
}

impl std::fmt::Debug for WriteOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteOp")
    }
}

impl std::fmt::Debug for ReadOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadOp")
    }
}

/// Completes a write that never ran, with `err`.
pub(crate) fn fail(op: WriteOp, err: &StorageError) {
    let e = err.clone();
    match op {
        WriteOp::OpenChannel { done, .. }
        | WriteOp::SetAvailableAfter { done, .. }
        | WriteOp::Resolve { done, .. }
        | WriteOp::SetPosition { done, .. }
        | WriteOp::DropPositions { done, .. }
        | WriteOp::PutSession { done, .. }
        | WriteOp::DeleteSession { done, .. }
        | WriteOp::PutHeld { done, .. }
        | WriteOp::DropHeld { done, .. } => drop(done.try_send(Err(e))),
        WriteOp::Append { done, .. } | WriteOp::DeadLetter { done, .. } => {
            drop(done.try_send(Err(e)))
        }
        WriteOp::StoreAttempts { done, .. } => drop(done.try_send(Err(e))),
        WriteOp::SweepAge { done, .. } | WriteOp::SweepSize { done } => drop(done.try_send(Err(e))),
        WriteOp::Read(read) => fail_read(read, err),
    }
}

/// Completes a read that never ran, with `err`.
pub(crate) fn fail_read(op: ReadOp, err: &StorageError) {
    let e = err.clone();
    match op {
        ReadOp::Window { done, .. } => drop(done.try_send(Err(e))),
        ReadOp::Stats { done, .. } => drop(done.try_send(Err(e))),
        ReadOp::Latest { done, .. } => drop(done.try_send(Err(e))),
        ReadOp::FirstAt { done, .. } => drop(done.try_send(Err(e))),
        ReadOp::Position { done, .. } => drop(done.try_send(Err(e))),
        ReadOp::Sessions { done } => drop(done.try_send(Err(e))),
        ReadOp::Held { done } => drop(done.try_send(Err(e))),
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
        ReadOp::Latest {
            channel,
            topic,
            done,
        } => {
            let _ = done.try_send(schema::read_latest(conn, provider, &channel, &topic));
        }
        ReadOp::FirstAt {
            channel,
            at_ms,
            done,
        } => {
            let _ = done.try_send(schema::read_first_at(conn, provider, &channel, at_ms));
        }
        ReadOp::Position {
            client_id,
            channel,
            done,
        } => {
            let _ = done.try_send(schema::read_position(conn, provider, &client_id, &channel));
        }
        ReadOp::Sessions { done } => {
            let _ = done.try_send(schema::read_sessions(conn, provider));
        }
        ReadOp::Held { done } => {
            let _ = done.try_send(schema::read_held(conn, provider));
        }
    }
}
