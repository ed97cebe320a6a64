//! Storage providers: where channels keep their records (issue 4).
//!
//! # Design
//!
//! A channel's records live on a named **provider**, and a provider is one of two
//! kinds behind one interface, [`Provider`]: a **sqlite** file ([`SqliteProvider`]) or
//! **memory with snapshots** ([`MemoryProvider`]). Channel code calls the same async
//! methods on either and never learns which one it is on. Every provider keeps, per
//! channel: records with offsets that only grow and are never reused (the next offset
//! is stored with the channel, so retention emptying a channel or a restart does not
//! bring an offset back); the latest index (one current value per topic, deletions kept
//! as tombstones) for `latest` channels; delivery state (attempts, available-after) for
//! `queue` records; and consumer positions per (client id, channel). Beside the
//! channels a provider keeps session records and held QoS 2 publishes by (client id,
//! packet id) ([`Held`], B-441); [`Provider::append_releasing`] writes a record and
//! removes the held publish it becomes in one transaction (sqlite) or under one lock
//! (memory), B-442. The broker keeps its released outbound QoS 2 exchanges as held
//! rows too, under an id of its own (`broker::released`, A-254), and at a graceful
//! stop the packet identifiers of its exchanges still published (MQTT-4.4.0-1): the
//! data is opaque here.
//!
//! **Sizes.** A record counts as payload + topic + message id + each User Property's
//! key and value ([`record_size`], `store.RecordSize`). A channel's `max_bytes` and
//! `retention_bytes` and a memory provider's `max_bytes` count that; a sqlite
//! provider's `max_bytes` bounds the file in pages (`PRAGMA max_page_count`). Each
//! provider keeps a **reserve** (`max_message_size + max_header_bytes`): a publish is
//! refused (0x97) if it would eat into it, while the operations that relieve a full
//! bound - resolving a job, counting an attempt, storing a position, the dead-letter
//! move - may use it. A channel's own `max_bytes` is exact and checked on the write;
//! retention is not: it is applied by sweeps on the broker's clock ([`retention`]).
//!
//! **sqlite.** Only `storage::sqlite` touches rusqlite. Each provider has one writer
//! thread that owns the write connection (WAL, synchronous=NORMAL) and takes requests
//! from two bounded channels: the writes a client's packet waits on (publishes, job
//! state, dead-lettering) first, consumer positions after. Async callers send a request
//! and await a one-shot completion, so a full queue is backpressure, never growth.
//!
//! The writer commits in groups. By default it takes whatever arrived while the previous
//! commit ran (at most 256 publishes) without waiting; `publish_commit_interval: none`
//! is a transaction per publish; an interval waits for company up to the interval or the
//! record count, holding no transaction while it waits. A refusal (a bound, an unknown
//! record) is decided before a request writes anything, so it does not undo its batch;
//! a statement that fails is the disk failing, and the whole batch is rolled back and
//! told (0x83). Every completion is sent only after the commit: stored before
//! acknowledged. A channel's next offset and counts are cached by the writer and written
//! once per transaction, in the same transaction as the records.
//!
//! `read_connections` reader threads each own a read-only connection, opened at first
//! use. A window read is one read transaction, so floor, head and records come from one
//! instant, and in WAL mode it never queues behind a commit. With `read_connections: 0`
//! reads go to the writer between batches. One `flush_interval` after a commit the
//! writer fsyncs the write-ahead log; an idle provider fsyncs nothing. The writer's
//! transactions begin IMMEDIATE, so an operator's `sqlite3` holding the file is waited
//! for (up to 5s) rather than failing a batch. `<file_path>.lock` (an OS lock, released
//! by the kernel when the process dies) keeps a second broker off the file while
//! `sqlite3` can still read it. The schema version is `PRAGMA user_version`.
//!
//! **memory.** Records in RAM under one lock, held only for in-memory work, bounded by
//! `max_bytes`. At graceful shutdown each channel group (a queue and its `__dlq` share
//! one) is written to its own file in `snapshot_dir` (dots in names percent-encoded),
//! each to a temporary name then renamed, and the manifest last; at start the manifest
//! is read, and a channel's file is loaded when the channel is opened (a file whose
//! channels are no longer configured is never opened). Every length read from a file
//! is checked against what the file has left. `snapshot_dir: none` keeps nothing.
//! `saguin.lock` in the directory keeps a second broker out. A memory provider promises
//! nothing after SIGKILL: the next start loads the last snapshot, says so once, and the
//! offsets handed out since are handed out again.
//!
//! **Code map.** [`provider`] is the interface ([`Provider`], [`ProviderSettings`]);
//! [`record`] the record, window and size types; [`settings`] the typed settings and the
//! storage rules of "Validation"; [`error`] the one error type, whose
//! [`StorageError::reason_code`] is what a refused publish answers; [`retention`] the
//! sweep schedule and loop; [`lock`] the provider lock; [`sqlite`] (`mod.rs` the handle,
//! `writer.rs` the thread and group commit, `batch.rs` one transaction's writes,
//! `sweep.rs` retention statements, `schema.rs` tables and reads, `ops.rs` the requests);
//! [`memory`] (`mod.rs` the state, `snapshot.rs` the files).
//!
//! **Wiring (for the broker).** At startup: `Provider::open` each provider a channel
//! names (an unnamed one stays inert), `open_channel` every configured channel (a
//! queue's `<queue>__dlq` too), then spawn [`run_sweeps`] with
//! [`RetentionSchedule::for_channels`]. A publish awaits `append` and answers its error's
//! `reason_code`. At graceful shutdown: stop the sweeps, then `Provider::close`, which
//! writes a memory provider's snapshot. Tombstones ([`RecordState::Deleted`]) come back
//! from window reads of a latest channel so that deletions can be reported; they are
//! never delivered as values.
//!
//! **Architecture invariants.** Only `storage::sqlite` touches rusqlite; async code never
//! blocks on it. Nothing here reads YAML: the settings are plain typed structs the
//! configuration is mapped onto. Every queue between the async side and a thread is
//! bounded, and every read is bounded by a record count and a byte count.

pub mod error;
pub mod lock;
pub mod memory;
pub mod provider;
pub mod record;
pub mod retention;
pub mod settings;
pub mod sqlite;

pub use error::StorageError;

/// The channel the broadcast log is kept under (`broker::broadcast_log`): a name no
/// configuration can spell. A provider counts it with the sessions it serves.
pub const SESSION_LOG: &str = "$broadcast";
pub use memory::{MemoryProvider, SnapshotReport};
pub use provider::{Provider, ProviderSettings};
pub use record::{
    Attempts, ChannelStats, DeadLetter, Held, HeldKey, NewRecord, Record, RecordProperties,
    RecordState, SweepReport, Window, WindowRequest, record_size,
};
pub use retention::{RetentionSchedule, run_sweeps};
pub use settings::{
    ChannelKind, ChannelSettings, CommitMode, MemorySettings, Retention, SqliteSettings,
};
pub use sqlite::{SqliteProvider, WriterStats};
