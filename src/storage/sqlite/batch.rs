//! One group-commit transaction: the writes in it, and the channel counts they move.
//!
//! Refusals (a channel or the provider at its bound, an unknown channel or record) are
//! decided before a request writes anything, so a refused request leaves the
//! transaction as it found it. A statement that fails is the disk failing: the whole
//! transaction is rolled back and every request in it is told (0x83, or 0x97 when
//! SQLite's page ceiling was what refused).
//!
//! A channel's next offset, record count and byte count are kept in memory and written
//! once per channel per transaction, rather than once per record.

use std::cell::Cell;
use std::collections::HashMap;

use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

use super::ops::{Done, WriteOp, fail};
use super::schema::{self, RECORD_COLUMNS, STATE_DELETED, STATE_JOB, STATE_STORED, i, u};
use crate::storage::error::StorageError;
use crate::storage::record::{Attempts, DeadLetter, Held, HeldKey, NewRecord, Record};
use crate::storage::settings::ChannelSettings;

/// What the pages of a record cost beyond its counted size, for the reserve check.
const ROW_OVERHEAD: u64 = 80;

/// What a record's row takes in the file, for the page check: its counted `size`
/// (B-417), the properties that count leaves out (Content Type, Response Topic and
/// Correlation Data, up to 64 KiB each) and the User Properties' JSON framing. A
/// batch of records each counted at a page that wrote a hundred grew the file past
/// SQLite's page limit, and SQLITE_FULL failed every write in the batch, the acks
/// and positions that relieve the store among them.
fn row_bytes(size: u64, p: &crate::storage::RecordProperties) -> u64 {
    let len = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let counted: usize = p
        .user_properties
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let json = schema::encode_user_properties(&p.user_properties).map_or(0, |j| j.len());
    let extra = len(&p.content_type)
        + len(&p.response_topic)
        + p.correlation_data.as_ref().map_or(0, Vec::len)
        + json.saturating_sub(counted);
    size + extra as u64 + ROW_OVERHEAD
}

/// A channel's counters, as stored in the `channels` table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) next_offset: u64,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
}

/// What the writer knows about an open channel.
pub(crate) struct Channel {
    pub(crate) id: i64,
    pub(crate) settings: ChannelSettings,
    pub(crate) counts: Counts,
}

/// Provider-wide bounds, in pages (gaps.md section 3 "The reserve").
pub(crate) struct Bounds {
    pub(crate) page_size: u64,
    pub(crate) max_pages: u64,
    pub(crate) reserve_pages: u64,
    pub(crate) max_bytes: u64,
    pub(crate) reserve_bytes: u64,
}

/// Called once the batch's fate is known: `None` if it committed.
pub(crate) type Completion = Box<dyn FnOnce(Option<&StorageError>) + Send>;

/// The transaction being built.
pub(crate) struct Batch<'a> {
    provider: &'a str,
    channels: &'a HashMap<String, Channel>,
    bounds: &'a Bounds,
    /// Working copies of the counts this transaction moved.
    counts: HashMap<String, Counts>,
    used_pages: Option<u64>,
    added_bytes: u64,
    /// Set when a statement failed: the transaction must not commit.
    failed: Cell<bool>,
    failure: Option<StorageError>,
    pub(crate) publishes: u64,
}

impl<'a> Batch<'a> {
    pub(crate) fn new(
        provider: &'a str,
        channels: &'a HashMap<String, Channel>,
        bounds: &'a Bounds,
    ) -> Batch<'a> {
        Batch {
            provider,
            channels,
            bounds,
            counts: HashMap::new(),
            used_pages: None,
            added_bytes: 0,
            failed: Cell::new(false),
            failure: None,
            publishes: 0,
        }
    }

    /// The error that doomed the transaction, if one did.
    pub(crate) fn failure(&self) -> Option<&StorageError> {
        self.failure.as_ref()
    }

    /// The counts to write back, by channel.
    pub(crate) fn into_counts(self) -> HashMap<String, Counts> {
        self.counts
    }

    /// Writes the moved counts into the `channels` table (inside the transaction).
    pub(crate) fn store_counts(&self, c: &Connection) -> Result<(), StorageError> {
        for (name, n) in &self.counts {
            let id = self.channel(name)?.id;
            c.prepare_cached(
                "UPDATE channels SET next_offset = ?2, records = ?3, bytes = ?4 WHERE id = ?1",
            )
            .and_then(|mut s| s.execute(params![id, i(n.next_offset), i(n.records), i(n.bytes)]))
            .map_err(|e| self.sql(c, name, e))?;
        }
        Ok(())
    }

    /// Runs one request. Once a statement has failed, later requests are not run.
    pub(crate) fn exec(&mut self, c: &Connection, op: WriteOp) -> Completion {
        if let Some(e) = &self.failure {
            fail(op, e);
            return Box::new(|_| {});
        }
        match op {
            WriteOp::Append {
                channel,
                record,
                release,
                done,
            } => {
                self.publishes += 1;
                // The release after the record: a refused append writes nothing, and
                // a failed delete fails the transaction holding both (B-442).
                // A release frees about what its record takes, so it may use the
                // reserve, as the other writes relieving a full bound do.
                let reserve = release.is_some();
                let r =
                    self.append(c, &channel, record, reserve)
                        .and_then(|offset| match release {
                            Some(key) => self.drop_held(c, &key).map(|()| offset),
                            None => Ok(offset),
                        });
                self.complete(done, r)
            }
            WriteOp::PutHeld { held, done } => {
                let r = self.put_held(c, &held);
                self.complete(done, r)
            }
            WriteOp::DropHeld { key, done } => {
                let r = self.drop_held(c, &key);
                self.complete(done, r)
            }
            WriteOp::StoreAttempts {
                channel,
                offset,
                attempts,
                available_after_ms,
                done,
            } => {
                let r = self.store_attempts(c, &channel, offset, attempts, available_after_ms);
                self.complete(done, r)
            }
            WriteOp::SetAvailableAfter {
                channel,
                offset,
                available_after_ms,
                done,
            } => {
                let r = self.set_available_after(c, &channel, offset, available_after_ms);
                self.complete(done, r)
            }
            WriteOp::Resolve {
                channel,
                offset,
                done,
            } => {
                let r = self.remove_record(c, &channel, offset);
                self.complete(done, r)
            }
            WriteOp::DeadLetter {
                queue,
                offset,
                to,
                done,
            } => {
                let r = self.dead_letter(c, &queue, offset, to);
                self.complete(done, r)
            }
            WriteOp::SetPosition {
                client_id,
                channel,
                offset,
                done,
            } => {
                let r = c
                    .prepare_cached(
                        "INSERT INTO positions(client_id, channel, record_offset) VALUES (?1, ?2, ?3) \
                         ON CONFLICT(client_id, channel) DO UPDATE SET record_offset = excluded.record_offset",
                    )
                    .and_then(|mut s| s.execute(params![client_id, channel, i(offset)]))
                    .map(|_| ())
                    .map_err(|e| self.sql(c, &channel, e));
                self.complete(done, r)
            }
            WriteOp::DropPositions { client_id, done } => {
                // Cached: every connection with Clean Start asks it (G-11).
                let r = c
                    .prepare_cached("DELETE FROM positions WHERE client_id = ?1")
                    .and_then(|mut s| s.execute([client_id]))
                    .map(|_| ())
                    .map_err(|e| self.sql(c, "positions", e));
                self.complete(done, r)
            }
            WriteOp::PutSession {
                client_id,
                record,
                done,
            } => {
                let size = (client_id.len() + record.len()) as u64;
                let r = self.check_room(c, "sessions", size).and_then(|()| {
                    c.prepare_cached(
                        "INSERT INTO sessions(client_id, record) VALUES (?1, ?2) \
                         ON CONFLICT(client_id) DO UPDATE SET record = excluded.record",
                    )
                    .and_then(|mut s| s.execute(params![client_id, record]))
                    .map(|_| self.added_bytes += size + ROW_OVERHEAD)
                    .map_err(|e| self.sql(c, "sessions", e))
                });
                self.complete(done, r)
            }
            WriteOp::DeleteSession { client_id, done } => {
                let r = c
                    .prepare_cached("DELETE FROM sessions WHERE client_id = ?1")
                    .and_then(|mut s| s.execute([client_id]))
                    .map(|_| ())
                    .map_err(|e| self.sql(c, "sessions", e));
                self.complete(done, r)
            }
            other => {
                // Standalone requests never reach a batch.
                fail(
                    other,
                    &StorageError::io(self.provider, "batch", "unbatchable request"),
                );
                Box::new(|_| {})
            }
        }
    }

    fn complete<T: Send + 'static>(
        &mut self,
        done: Done<T>,
        result: Result<T, StorageError>,
    ) -> Completion {
        if self.failed.get() && self.failure.is_none() {
            self.failure = Some(match &result {
                Err(e) => e.clone(),
                Ok(_) => StorageError::io(self.provider, "commit", "a statement failed"),
            });
        }
        Box::new(move |batch_err| {
            let out = match (result, batch_err) {
                (Ok(v), None) => Ok(v),
                (Ok(_), Some(e)) => Err(e.clone()),
                (Err(e), _) => Err(e),
            };
            let _ = done.try_send(out);
        })
    }

    /// Maps a failed statement, marking the transaction failed. SQLITE_FULL is the page
    /// ceiling (0x97) only when the file is at it; otherwise the disk itself refused.
    fn sql(&self, c: &Connection, channel: &str, e: rusqlite::Error) -> StorageError {
        self.failed.set(true);
        if e.sqlite_error_code() == Some(ErrorCode::DiskFull) {
            let pages: Option<i64> = c.query_row("PRAGMA page_count", [], |r| r.get(0)).ok();
            if pages.is_some_and(|n| u(n) + 1 >= self.bounds.max_pages) {
                return self.provider_full();
            }
        }
        StorageError::io(self.provider, &format!("write channel {channel}"), e)
    }

    fn provider_full(&self) -> StorageError {
        StorageError::ProviderFull {
            provider: self.provider.to_owned(),
            max_bytes: self.bounds.max_bytes,
            reserve: self.bounds.reserve_bytes,
        }
    }

    fn channel(&self, name: &str) -> Result<&'a Channel, StorageError> {
        self.channels
            .get(name)
            .ok_or_else(|| StorageError::UnknownChannel {
                provider: self.provider.to_owned(),
                channel: name.to_owned(),
            })
    }

    fn job_channel(
        &self,
        name: &str,
        operation: &'static str,
    ) -> Result<&'a Channel, StorageError> {
        let ch = self.channel(name)?;
        if ch.settings.is_queue() {
            Ok(ch)
        } else {
            Err(StorageError::WrongChannelKind {
                channel: name.to_owned(),
                operation,
            })
        }
    }

    fn counts(&self, name: &str, ch: &Channel) -> Counts {
        self.counts.get(name).copied().unwrap_or(ch.counts)
    }

    fn used_pages(&mut self, c: &Connection, channel: &str) -> Result<u64, StorageError> {
        if let Some(u) = self.used_pages {
            return Ok(u);
        }
        let (pages, free): (i64, i64) = c
            .query_row(
                "SELECT (SELECT page_count FROM pragma_page_count()), \
                 (SELECT freelist_count FROM pragma_freelist_count())",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(|e| self.sql(c, channel, e))?;
        let used = u(pages).saturating_sub(u(free));
        self.used_pages = Some(used);
        Ok(used)
    }

    /// A publish: the channel's own bound, then the provider's bound less its reserve
    /// (the whole bound for one releasing a held publish, `may_use_reserve`), then
    /// the writes (C-021, C-115).
    fn append(
        &mut self,
        c: &Connection,
        name: &str,
        record: NewRecord,
        may_use_reserve: bool,
    ) -> Result<u64, StorageError> {
        let ch = self.channel(name)?;
        let size = record.size();
        let mut n = self.counts(name, ch);
        let latest = ch.settings.is_latest();
        // On a latest channel the write replaces the topic's value: only what it adds
        // counts against the bounds, so a store at its bound still takes an update
        // no larger than the value, and a deletion (C-216, C-220).
        let replaced = if latest {
            self.latest_of(c, name, ch.id, &record.topic)?
        } else {
            None
        };
        let replaced_size = replaced.as_ref().map_or(0, |(_, size, _)| *size);
        StorageError::check_channel_room(
            name,
            ch.settings.max_bytes,
            n.bytes,
            size,
            replaced_size,
        )?;
        let used = self.used_pages(c, name)?;
        let b = self.bounds;
        let replaced_row = replaced.as_ref().map_or(0, |(_, _, row)| *row);
        let adds = row_bytes(size, &record.properties).saturating_sub(replaced_row);
        let grown = (self.added_bytes + adds).div_ceil(b.page_size);
        let reserve = if may_use_reserve { 0 } else { b.reserve_pages };
        if adds > 0 && used + grown > b.max_pages.saturating_sub(reserve) {
            return Err(self.provider_full());
        }
        let state = if ch.settings.is_queue() {
            STATE_JOB
        } else if latest && record.payload.is_empty() {
            STATE_DELETED
        } else {
            STATE_STORED
        };
        if let Some((old, _, _)) = replaced {
            self.take_record(c, name, old)?;
            n = self.counts(name, ch);
        }
        let offset = n.next_offset;
        self.insert_row(c, name, ch.id, offset, state, &record)?;
        if latest {
            c.prepare_cached(
                "INSERT INTO latest(channel_id, topic, record_offset) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(channel_id, topic) DO UPDATE SET record_offset = excluded.record_offset",
            )
            .and_then(|mut s| s.execute(params![ch.id, record.topic, i(offset)]))
            .map_err(|e| self.sql(c, name, e))?;
        }
        n.next_offset += 1;
        n.records += 1;
        n.bytes += size;
        self.counts.insert(name.to_owned(), n);
        self.added_bytes += adds;
        Ok(offset)
    }

    /// The offset, counted size and row size of `topic`'s current value on latest
    /// channel `name`.
    fn latest_of(
        &self,
        c: &Connection,
        name: &str,
        channel_id: i64,
        topic: &str,
    ) -> Result<Option<(u64, u64, u64)>, StorageError> {
        schema::latest_record(c, channel_id, topic)
            .map(|found| {
                found.map(|r| {
                    let size = r.size();
                    (r.offset, size, row_bytes(size, &r.properties))
                })
            })
            .map_err(|e| self.sql(c, name, e))
    }

    /// That `size` more bytes fit within the provider's bound less its reserve: a
    /// write that only adds - a held publish, a session's record - leaves the reserve
    /// to what frees room (C-115), and is refused 0x97 before SQLite's own page limit
    /// could fail the whole batch it is in.
    fn check_room(&mut self, c: &Connection, what: &str, size: u64) -> Result<(), StorageError> {
        let used = self.used_pages(c, what)?;
        let b = self.bounds;
        let grown = (self.added_bytes + size + ROW_OVERHEAD).div_ceil(b.page_size);
        if used + grown > b.max_pages.saturating_sub(b.reserve_pages) {
            return Err(self.provider_full());
        }
        Ok(())
    }

    /// Keeps a held QoS 2 publish, within the provider's bound less its reserve (B-441).
    fn put_held(&mut self, c: &Connection, held: &Held) -> Result<(), StorageError> {
        let size = held.size();
        self.check_room(c, "held", size)?;
        c.prepare_cached(
            "INSERT INTO held(client_id, packet_id, token, data) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT(client_id, packet_id) DO UPDATE SET token = excluded.token, \
             data = excluded.data",
        )
        .and_then(|mut s| {
            s.execute(params![
                held.client_id,
                held.packet_id,
                i(held.token),
                held.data
            ])
        })
        .map_err(|e| self.sql(c, "held", e))?;
        self.added_bytes += size + ROW_OVERHEAD;
        Ok(())
    }

    /// Removes a held QoS 2 publish, if that exchange is still the one held.
    fn drop_held(&mut self, c: &Connection, key: &HeldKey) -> Result<(), StorageError> {
        c.prepare_cached("DELETE FROM held WHERE client_id = ?1 AND packet_id = ?2 AND token = ?3")
            .and_then(|mut s| s.execute(params![key.client_id, key.packet_id, i(key.token)]))
            .map(|_| ())
            .map_err(|e| self.sql(c, "held", e))
    }

    fn insert_row(
        &self,
        c: &Connection,
        name: &str,
        id: i64,
        offset: u64,
        state: i64,
        r: &NewRecord,
    ) -> Result<(), StorageError> {
        let pr = &r.properties;
        c.prepare_cached(
            "INSERT INTO records(channel_id, record_offset, message_id, timestamp_ms, topic, payload, \
             size, state, payload_format, message_expiry, content_type, response_topic, \
             correlation_data, user_properties, first_attempt_ms, last_attempt_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?15)",
        )
        .and_then(|mut s| {
            let unspent = (state == STATE_JOB).then_some(schema::UNSPENT);
            s.execute(params![
                id,
                i(offset),
                r.message_id,
                i(r.timestamp_ms),
                r.topic,
                r.payload,
                i(r.size()),
                state,
                pr.payload_format_indicator,
                pr.message_expiry_interval,
                pr.content_type,
                pr.response_topic,
                pr.correlation_data,
                schema::encode_user_properties(&pr.user_properties),
                unspent,
            ])
        })
        .map(|_| ())
        .map_err(|e| self.sql(c, name, e))
    }

    /// Removes a resolved job, or a latest channel's value by the record it is (and
    /// then the topic has none).
    fn remove_record(
        &mut self,
        c: &Connection,
        name: &str,
        offset: u64,
    ) -> Result<(), StorageError> {
        let ch = self.channel(name)?;
        if !ch.settings.is_latest() {
            self.job_channel(name, "resolve")?;
        }
        let (id, latest) = (ch.id, ch.settings.is_latest());
        self.take_record(c, name, offset)?;
        if latest {
            c.prepare_cached("DELETE FROM latest WHERE channel_id = ?1 AND record_offset = ?2")
                .and_then(|mut s| s.execute(params![id, i(offset)]))
                .map_err(|e| self.sql(c, name, e))?;
        }
        Ok(())
    }

    /// Removes one record and returns it, moving the channel's counts.
    fn take_record(
        &mut self,
        c: &Connection,
        name: &str,
        offset: u64,
    ) -> Result<Record, StorageError> {
        let ch = self.channel(name)?;
        let sql = format!(
            "DELETE FROM records WHERE channel_id = ?1 AND record_offset = ?2 RETURNING {RECORD_COLUMNS}"
        );
        let rec = c
            .prepare_cached(&sql)
            .and_then(|mut s| {
                s.query_row(params![ch.id, i(offset)], schema::record_from_row)
                    .optional()
            })
            .map_err(|e| self.sql(c, name, e))?
            .ok_or(StorageError::NoSuchRecord {
                channel: name.to_owned(),
                offset,
            })?;
        let mut n = self.counts(name, ch);
        n.records = n.records.saturating_sub(1);
        n.bytes = n.bytes.saturating_sub(rec.size());
        self.counts.insert(name.to_owned(), n);
        Ok(rec)
    }

    fn store_attempts(
        &mut self,
        c: &Connection,
        name: &str,
        offset: u64,
        attempts: Attempts,
        available_after_ms: u64,
    ) -> Result<(), StorageError> {
        let ch = self.job_channel(name, "store the attempts")?;
        let opt = |t: Option<u64>| t.map(i);
        let n = c
            .prepare_cached(
                "UPDATE records SET attempts = ?3, first_attempt_ms = ?4, last_attempt_ms = ?5, \
                 available_after_ms = ?6 WHERE channel_id = ?1 AND record_offset = ?2",
            )
            .and_then(|mut s| {
                s.execute(params![
                    ch.id,
                    i(offset),
                    i64::from(attempts.count),
                    opt(attempts.first_ms),
                    opt(attempts.last_ms),
                    i(available_after_ms)
                ])
            })
            .map_err(|e| self.sql(c, name, e))?;
        updated_one(n, name, offset)
    }

    fn set_available_after(
        &mut self,
        c: &Connection,
        name: &str,
        offset: u64,
        available_after_ms: u64,
    ) -> Result<(), StorageError> {
        let ch = self.job_channel(name, "set available-after")?;
        let n = c
            .prepare_cached(
                "UPDATE records SET available_after_ms = ?3 WHERE channel_id = ?1 AND record_offset = ?2",
            )
            .and_then(|mut s| s.execute(params![ch.id, i(offset), i(available_after_ms)]))
            .map_err(|e| self.sql(c, name, e))?;
        updated_one(n, name, offset)
    }

    /// The move into the dead-letter channel: not a publish, so no bound is checked
    /// (C-113, B-500); SQLite's page ceiling is the only limit.
    fn dead_letter(
        &mut self,
        c: &Connection,
        queue: &str,
        offset: u64,
        to: DeadLetter,
    ) -> Result<u64, StorageError> {
        self.job_channel(queue, "dead-letter")?;
        let dlq = to.channel.clone();
        let dlq = dlq.as_str();
        let d = self.channel(dlq)?;
        let rec = self.take_record(c, queue, offset)?;
        let new = to.apply(rec);
        let mut n = self.counts(dlq, d);
        let at = n.next_offset;
        self.insert_row(c, dlq, d.id, at, STATE_STORED, &new)?;
        n.next_offset += 1;
        n.records += 1;
        n.bytes += new.size();
        self.counts.insert(dlq.to_owned(), n);
        Ok(at)
    }
}

/// An update of a job's row: `NoSuchRecord` when there was none to update.
fn updated_one(rows: usize, channel: &str, offset: u64) -> Result<(), StorageError> {
    if rows == 0 {
        return Err(StorageError::NoSuchRecord {
            channel: channel.to_owned(),
            offset,
        });
    }
    Ok(())
}
