//! The sqlite schema, row mapping, and the reads (which run on a read-only connection,
//! or on the write connection when `read_connections` is 0).

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::storage::error::StorageError;
use crate::storage::record::{
    Attempts, ChannelStats, Held, Record, RecordProperties, RecordState, Window, WindowRequest,
};

/// The schema version, kept in `PRAGMA user_version`; a file from a newer version is
/// refused rather than misread.
pub(crate) const VERSION: i64 = 1;

/// Tables. Plain names and columns so that `sqlite3` on the live file is readable.
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS channels(
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    next_offset INTEGER NOT NULL DEFAULT 0,
    records INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS records(
    channel_id INTEGER NOT NULL,
    record_offset INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    size INTEGER NOT NULL,
    state INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    available_after_ms INTEGER NOT NULL DEFAULT 0,
    payload_format INTEGER,
    message_expiry INTEGER,
    content_type TEXT,
    response_topic TEXT,
    correlation_data BLOB,
    user_properties TEXT,
    first_attempt_ms INTEGER,
    last_attempt_ms INTEGER,
    PRIMARY KEY(channel_id, record_offset)
);
CREATE TABLE IF NOT EXISTS latest(
    channel_id INTEGER NOT NULL,
    topic TEXT NOT NULL,
    record_offset INTEGER NOT NULL,
    PRIMARY KEY(channel_id, topic)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS positions(
    client_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    record_offset INTEGER NOT NULL,
    PRIMARY KEY(client_id, channel)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions(
    client_id TEXT NOT NULL PRIMARY KEY,
    record TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS held(
    client_id TEXT NOT NULL,
    packet_id INTEGER NOT NULL,
    token INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY(client_id, packet_id)
) WITHOUT ROWID;
";

/// Columns added to a table since the schema was first versioned. Each may be null,
/// so a file keeps its version number and stays readable by the version that wrote
/// it, which never names them.
const ADDED_COLUMNS: [(&str, &str, &str); 2] = [
    ("records", "first_attempt_ms", "INTEGER"),
    ("records", "last_attempt_ms", "INTEGER"),
];

/// Adds to a file written before them the columns [`ADDED_COLUMNS`] names.
pub(crate) fn add_missing_columns(conn: &Connection) -> rusqlite::Result<()> {
    for (table, column, kind) in ADDED_COLUMNS {
        let present: bool = conn.query_row(
            "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
            params![table, column],
            |r| r.get(0),
        )?;
        if !present {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"))?;
        }
    }
    Ok(())
}

/// What a job's attempt times hold before its first attempt: six bytes wide, as a
/// time in milliseconds is until the year 6429, so storing the first attempt does not
/// grow a row the reserve check has already counted (C-112).
pub(crate) const UNSPENT: i64 = 1 << 40;

pub(crate) const STATE_STORED: i64 = 0;
pub(crate) const STATE_DELETED: i64 = 1;
pub(crate) const STATE_JOB: i64 = 2;

pub(crate) const RECORD_COLUMNS: &str = "record_offset, message_id, timestamp_ms, topic, payload, \
     state, attempts, available_after_ms, payload_format, message_expiry, content_type, \
     response_topic, correlation_data, user_properties, first_attempt_ms, last_attempt_ms";

/// i64 as SQLite stores it, to the u64 the API speaks (never negative here).
pub(crate) fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// u64 to what SQLite stores, saturating (offsets and sizes never approach 2^63).
pub(crate) fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn encode_user_properties(p: &[(String, String)]) -> Option<String> {
    if p.is_empty() {
        None
    } else {
        serde_json::to_string(p).ok()
    }
}

/// A job's attempts: no time where the row holds [`UNSPENT`] (before the first, or
/// counted by an earlier version) or nothing (written before the columns).
fn attempts_from_row(row: &Row<'_>) -> rusqlite::Result<Attempts> {
    let time = |column: usize| -> rusqlite::Result<Option<u64>> {
        let at: Option<i64> = row.get(column)?;
        Ok(at.filter(|&at| at != UNSPENT).map(u))
    };
    Ok(Attempts {
        count: u32::try_from(row.get::<_, i64>(6)?).unwrap_or(u32::MAX),
        first_ms: time(14)?,
        last_ms: time(15)?,
    })
}

pub(crate) fn record_from_row(row: &Row<'_>) -> rusqlite::Result<Record> {
    let state = match row.get::<_, i64>(5)? {
        STATE_DELETED => RecordState::Deleted,
        STATE_JOB => RecordState::Job {
            attempts: attempts_from_row(row)?,
            available_after_ms: u(row.get(7)?),
        },
        _ => RecordState::Stored,
    };
    let user_properties = match row.get::<_, Option<String>>(13)? {
        // Written by us as JSON; an unreadable value (edited by hand) reads as none
        // rather than failing every read of the channel.
        Some(s) => serde_json::from_str(&s).unwrap_or_default(),
        None => Vec::new(),
    };
    Ok(Record {
        offset: u(row.get(0)?),
        message_id: row.get(1)?,
        timestamp_ms: u(row.get(2)?),
        topic: row.get(3)?,
        payload: row.get(4)?,
        state,
        properties: RecordProperties {
            payload_format_indicator: row
                .get::<_, Option<i64>>(8)?
                .and_then(|v| u8::try_from(v).ok()),
            message_expiry_interval: row
                .get::<_, Option<i64>>(9)?
                .and_then(|v| u32::try_from(v).ok()),
            content_type: row.get(10)?,
            response_topic: row.get(11)?,
            correlation_data: row.get(12)?,
            user_properties,
        },
    })
}

/// A channel's id and next offset, if it exists.
pub(crate) fn channel_row(conn: &Connection, name: &str) -> rusqlite::Result<Option<(i64, u64)>> {
    conn.prepare_cached("SELECT id, next_offset FROM channels WHERE name = ?1")?
        .query_row([name], |r| Ok((r.get(0)?, u(r.get(1)?))))
        .optional()
}

fn floor(conn: &Connection, id: i64, head: u64) -> rusqlite::Result<u64> {
    let min: Option<i64> = conn
        .prepare_cached("SELECT MIN(record_offset) FROM records WHERE channel_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    Ok(min.map(u).unwrap_or(head))
}

fn unknown(provider: &str, channel: &str) -> StorageError {
    StorageError::UnknownChannel {
        provider: provider.to_owned(),
        channel: channel.to_owned(),
    }
}

/// The record a latest channel's index holds for `topic`: its value, or the
/// deletion that replaced it (C-216).
pub(crate) fn latest_record(
    conn: &Connection,
    channel_id: i64,
    topic: &str,
) -> rusqlite::Result<Option<Record>> {
    let sql = format!(
        "SELECT {RECORD_COLUMNS} FROM records WHERE channel_id = ?1 AND record_offset = \
         (SELECT record_offset FROM latest WHERE channel_id = ?1 AND topic = ?2)"
    );
    conn.prepare_cached(&sql)?
        .query_row(params![channel_id, topic], record_from_row)
        .optional()
}

/// `read` of the channel named `channel`, given its id and head, in one read
/// transaction: what it reads is from one instant (B-155).
fn read_channel<T>(
    conn: &mut Connection,
    provider: &str,
    channel: &str,
    read: impl FnOnce(&Connection, i64, u64) -> rusqlite::Result<T>,
) -> Result<T, StorageError> {
    let sql_err = |e| StorageError::io(provider, &format!("read channel {channel}"), e);
    let tx = conn.transaction().map_err(sql_err)?;
    let (id, head) = channel_row(&tx, channel)
        .map_err(sql_err)?
        .ok_or_else(|| unknown(provider, channel))?;
    let read = read(&tx, id, head).map_err(sql_err)?;
    tx.commit().map_err(sql_err)?;
    Ok(read)
}

/// [`latest_record`] of the channel named `channel`: one indexed lookup, where a
/// scan of its windows would read every topic it holds.
pub(crate) fn read_latest(
    conn: &mut Connection,
    provider: &str,
    channel: &str,
    topic: &str,
) -> Result<Option<Record>, StorageError> {
    read_channel(conn, provider, channel, |tx, id, _| {
        latest_record(tx, id, topic)
    })
}

/// The offset of the first record of `channel` stamped at or after `at_ms`: where a
/// seek to a time lands (G-18). One query; no record is read out.
pub(crate) fn read_first_at(
    conn: &mut Connection,
    provider: &str,
    channel: &str,
    at_ms: u64,
) -> Result<Option<u64>, StorageError> {
    read_channel(conn, provider, channel, |tx, id, _| {
        tx.prepare_cached(
            "SELECT record_offset FROM records WHERE channel_id = ?1 AND timestamp_ms >= ?2 \
             ORDER BY record_offset LIMIT 1",
        )?
        .query_row(params![id, i(at_ms)], |r| r.get(0))
        .optional()
        .map(|found| found.map(u))
    })
}

/// One window: floor, head and records from one instant (B-155).
pub(crate) fn read_window(
    conn: &mut Connection,
    provider: &str,
    channel: &str,
    req: WindowRequest,
) -> Result<Window, StorageError> {
    read_channel(conn, provider, channel, |tx, id, head| {
        let floor = floor(tx, id, head)?;
        let sql = format!(
            "SELECT {RECORD_COLUMNS} FROM records WHERE channel_id = ?1 AND record_offset >= ?2 \
             ORDER BY record_offset LIMIT ?3"
        );
        let mut stmt = tx.prepare_cached(&sql)?;
        let limit = i64::try_from(req.max_records).unwrap_or(1024);
        let mut rows = stmt.query(params![id, i(req.from), limit])?;
        let mut records = Vec::new();
        let mut bytes = 0u64;
        while let Some(row) = rows.next()? {
            let rec = record_from_row(row)?;
            bytes += rec.size();
            if bytes > req.max_bytes && !records.is_empty() {
                break;
            }
            records.push(rec);
        }
        Ok(Window {
            floor,
            head,
            records,
        })
    })
}

/// A channel's floor, head and counts.
pub(crate) fn read_stats(
    conn: &mut Connection,
    provider: &str,
    channel: &str,
) -> Result<ChannelStats, StorageError> {
    let sql_err = |e| StorageError::io(provider, &format!("read channel {channel}"), e);
    let tx = conn.transaction().map_err(sql_err)?;
    let (id, records, bytes, head) = tx
        .prepare_cached("SELECT id, records, bytes, next_offset FROM channels WHERE name = ?1")
        .and_then(|mut s| {
            s.query_row([channel], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    u(r.get(1)?),
                    u(r.get(2)?),
                    u(r.get(3)?),
                ))
            })
            .optional()
        })
        .map_err(sql_err)?
        .ok_or_else(|| unknown(provider, channel))?;
    let floor = floor(&tx, id, head).map_err(sql_err)?;
    tx.commit().map_err(sql_err)?;
    Ok(ChannelStats {
        floor,
        head,
        records,
        bytes,
    })
}

/// The client ids the file holds positions of, read once at open.
pub(super) fn read_positioned(
    conn: &Connection,
) -> rusqlite::Result<super::positioned::Positioned> {
    let positioned = super::positioned::Positioned::new();
    let mut ids = conn.prepare("SELECT DISTINCT client_id FROM positions")?;
    let mut rows = ids.query([])?;
    while let Some(row) = rows.next()? {
        positioned.mark(row.get_ref(0)?.as_str()?);
    }
    Ok(positioned)
}

/// A consumer's stored position on a channel, if any.
pub(crate) fn read_position(
    conn: &Connection,
    provider: &str,
    client_id: &str,
    channel: &str,
) -> Result<Option<u64>, StorageError> {
    conn.prepare_cached("SELECT record_offset FROM positions WHERE client_id = ?1 AND channel = ?2")
        .and_then(|mut s| {
            s.query_row([client_id, channel], |r| r.get::<_, i64>(0))
                .optional()
        })
        .map(|o| o.map(u))
        .map_err(|e| StorageError::io(provider, "read a consumer position", e))
}

/// Every stored session record, as (client id, encoded record) (`broker::stored`).
pub(crate) fn read_sessions(
    conn: &Connection,
    provider: &str,
) -> Result<Vec<(String, String)>, StorageError> {
    let io = |e| StorageError::io(provider, "read the session records", e);
    let mut stmt = conn
        .prepare_cached("SELECT client_id, record FROM sessions ORDER BY client_id")
        .map_err(io)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(io)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(io)
}

/// Every held QoS 2 publish (B-443); a row whose packet identifier is out of range
/// (edited by hand) is skipped.
pub(crate) fn read_held(conn: &Connection, provider: &str) -> Result<Vec<Held>, StorageError> {
    let io = |e| StorageError::io(provider, "read the held QoS 2 publishes", e);
    let mut stmt = conn
        .prepare_cached(
            "SELECT client_id, packet_id, token, data FROM held ORDER BY client_id, packet_id",
        )
        .map_err(io)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Vec<u8>>(3)?,
            ))
        })
        .map_err(io)?;
    let mut held = Vec::new();
    for row in rows {
        let (client_id, packet_id, token, data) = row.map_err(io)?;
        let Ok(packet_id) = u16::try_from(packet_id) else {
            continue;
        };
        held.push(Held {
            client_id,
            packet_id,
            token: u(token),
            data,
        });
    }
    Ok(held)
}
