//! Retention on a sqlite provider: statements for one channel's age and size sweeps.
//! Each runs in a transaction of its own on the writer, between batches, and removes
//! at most [`CHUNK`] records: a channel far past its retention goes in several
//! transactions with the producers' batches between them, rather than holding every
//! publish behind one long delete while the write-ahead log grows by all of it.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::batch::Channel;
use super::schema::{STATE_DELETED, i, u};
use crate::storage::record::SweepReport;
use crate::storage::settings::{ChannelKind, ChannelSettings};

/// The most records one sweep transaction removes from one channel.
pub(crate) const CHUNK: i64 = 8_192;

/// What one sweep transaction removed, and whether the channel has more to remove.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Swept {
    pub report: SweepReport,
    pub more: bool,
}

impl Swept {
    pub(crate) fn add(&mut self, other: Swept) {
        self.report.add(other.report);
        self.more |= other.more;
    }
}

/// Whether the age sweep has anything to do on a channel.
pub(crate) fn ages(s: &ChannelSettings) -> bool {
    s.effective_retention().period.is_some()
        || matches!(
            s.kind,
            ChannelKind::Latest {
                deletion_retention: Some(_)
            }
        )
}

/// Whether the size sweep has anything to do on a channel.
pub(crate) fn sizes(s: &ChannelSettings) -> bool {
    s.effective_retention().bytes.is_some()
}

/// Removes what is past the channel's period and, on latest, tombstones past theirs.
pub(crate) fn age(c: &Connection, ch: &Channel, now_ms: u64) -> rusqlite::Result<Swept> {
    let cutoff =
        |d: Duration| i(now_ms.saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
    let tombstones = match ch.settings.kind {
        ChannelKind::Latest { deletion_retention } => deletion_retention,
        _ => None,
    };
    let mut report = Swept::default();
    match ch.settings.effective_retention().period {
        Some(p) if ch.settings.is_latest() => {
            let cond = format!("timestamp_ms < ?2 AND state != {STATE_DELETED}");
            report.add(delete_where(c, ch.id, &cond, cutoff(p))?);
        }
        Some(p) => {
            // A log ages as a prefix, so what is above the floor stays contiguous: up
            // to the first record young enough to keep.
            let keep: Option<i64> = c
                .prepare_cached(
                    "SELECT MIN(record_offset) FROM records WHERE channel_id = ?1 AND timestamp_ms >= ?2",
                )?
                .query_row(params![ch.id, cutoff(p)], |r| r.get(0))?;
            let below = keep.unwrap_or(i64::MAX);
            report.add(delete_where(c, ch.id, "record_offset < ?2", below)?);
        }
        None => {}
    }
    if let Some(p) = tombstones {
        let cond = format!("timestamp_ms < ?2 AND state = {STATE_DELETED}");
        report.add(delete_where(c, ch.id, &cond, cutoff(p))?);
    }
    Ok(report)
}

/// Removes the oldest records until the channel is under its retention_bytes.
pub(crate) fn size(c: &Connection, ch: &Channel) -> rusqlite::Result<Swept> {
    let Some(bound) = ch.settings.effective_retention().bytes else {
        return Ok(Swept::default());
    };
    let mut excess = ch.counts.bytes.saturating_sub(bound);
    if excess == 0 {
        return Ok(Swept::default());
    }
    // Oldest first until enough is gone (or a chunk's worth); then one range delete.
    let mut cut = None;
    {
        let mut stmt = c.prepare_cached(
            "SELECT record_offset, size FROM records WHERE channel_id = ?1 ORDER BY record_offset",
        )?;
        let mut rows = stmt.query([ch.id])?;
        let mut counted = 0;
        while let Some(row) = rows.next()? {
            let (off, size): (i64, i64) = (row.get(0)?, row.get(1)?);
            cut = Some(off);
            excess = excess.saturating_sub(u(size));
            counted += 1;
            if excess == 0 || counted == CHUNK {
                break;
            }
        }
    }
    match cut {
        Some(off) => delete_where(c, ch.id, "record_offset <= ?2", off),
        None => Ok(Swept::default()),
    }
}

/// Deletes the first [`CHUNK`] of a channel's records matching `cond` (with `?2` bound
/// to `arg`), keeping the `channels` counts and the latest index in step.
fn delete_where(c: &Connection, id: i64, cond: &str, arg: i64) -> rusqlite::Result<Swept> {
    let last_in_chunk: Option<i64> = c
        .query_row(
            &format!(
                "SELECT record_offset FROM records WHERE channel_id = ?1 AND {cond} \
                 ORDER BY record_offset LIMIT 1 OFFSET {}",
                CHUNK - 1
            ),
            params![id, arg],
            |r| r.get(0),
        )
        .optional()?;
    let up_to = last_in_chunk.unwrap_or(i64::MAX);
    let cond = format!("{cond} AND record_offset <= ?3");
    let (n, bytes): (i64, Option<i64>) = c.query_row(
        &format!("SELECT COUNT(*), SUM(size) FROM records WHERE channel_id = ?1 AND {cond}"),
        params![id, arg, up_to],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if n == 0 {
        return Ok(Swept::default());
    }
    c.execute(
        &format!(
            "DELETE FROM latest WHERE channel_id = ?1 AND record_offset IN \
             (SELECT record_offset FROM records WHERE channel_id = ?1 AND {cond})"
        ),
        params![id, arg, up_to],
    )?;
    c.execute(
        &format!("DELETE FROM records WHERE channel_id = ?1 AND {cond}"),
        params![id, arg, up_to],
    )?;
    let bytes = bytes.unwrap_or(0);
    c.execute(
        "UPDATE channels SET records = records - ?2, bytes = bytes - ?3 WHERE id = ?1",
        params![id, n, bytes],
    )?;
    Ok(Swept {
        report: SweepReport {
            records: u(n),
            bytes: u(bytes),
        },
        more: last_in_chunk.is_some(),
    })
}
