//! Memory snapshots: one file per channel group plus `manifest.json`.
//!
//! A group is a channel, or a queue with its `__dlq` (B-505). Each file is written to a
//! temporary name, synced and renamed; the manifest is written the same way and last,
//! so a crash while writing leaves the previous snapshot whole. Reading is bounded: no
//! length read from a file is trusted beyond the bytes the file has left.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::MemChannel;
use crate::storage::error::StorageError;
use crate::storage::record::{Attempts, Held, Record, RecordProperties, RecordState};

const MAGIC: &[u8; 16] = b"SAGUIN-SNAPSHOT1";
const MANIFEST: &str = "manifest.json";
/// Present while a broker runs on the directory; removed by a graceful snapshot.
const RUNNING: &str = "running";
/// The manifest lists file names; anything larger was not written by us.
const MANIFEST_MAX: u64 = 16 << 20;
/// The session records, as one JSON object of client id to encoded record.
const SESSIONS: &str = "sessions.json";
/// Far above what any sessions file we write holds: every record is bounded by the
/// limits (a Will by `max_message_size`, filters by `max_subscriptions`).
const SESSIONS_MAX: u64 = 4 << 30;

/// The held QoS 2 publishes (B-443): [`HELD_MAGIC`], a count, then each as client
/// id, packet id, token and data. A snapshot from before they were kept has no such
/// file, and holds none. Not `.snap`, which every channel group's file ends in.
const HELD: &str = "held.qos2";
/// Where earlier versions wrote them: also the file of a channel group named
/// `held`, so it is read as held publishes only when it starts as one.
const HELD_BEFORE: &str = "held.snap";
const HELD_MAGIC: &[u8; 16] = b"SAGUIN-HELD0001\n";

/// What one snapshot wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotReport {
    /// Files written (one per channel group).
    pub files: usize,
    /// Channels in them.
    pub channels: usize,
    /// Records in them.
    pub records: u64,
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    version: u32,
    provider: String,
    written_at_ms: u64,
    files: Vec<ManifestFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ManifestFile {
    file: String,
    channels: Vec<String>,
    records: u64,
}

/// What the manifest found at start lists: each channel's file, and the entries as
/// written, so that a file whose channels this run never opened is listed again by
/// the next snapshot rather than dropped (B-506).
#[derive(Debug, Default)]
pub(crate) struct Listed {
    by_channel: HashMap<String, PathBuf>,
    files: Vec<ManifestFile>,
}

impl Listed {
    /// The file holding `channel`.
    pub(crate) fn get(&self, channel: &str) -> Option<&PathBuf> {
        self.by_channel.get(channel)
    }

    /// Whether it lists nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The entries none of whose channels `written` holds: files this run left
    /// alone, to be listed again as they are.
    pub(crate) fn untouched<'a>(
        &'a self,
        written: &'a BTreeMap<String, Vec<(&str, &MemChannel)>>,
    ) -> impl Iterator<Item = &'a ManifestFile> + 'a {
        let touched = |f: &ManifestFile| {
            written
                .values()
                .flatten()
                .any(|(n, _)| f.channels.iter().any(|c| c == n))
                || written.keys().any(|g| snapshot_file_name(g) == f.file)
        };
        self.files.iter().filter(move |f| !touched(f))
    }
}

/// The file a channel group is written to: its name with `.` (and `%`) percent-encoded,
/// so no name is `.`/`..` or hidden (B-491), then `.snap`.
pub fn snapshot_file_name(group: &str) -> String {
    let mut out = String::with_capacity(group.len() + 5);
    for c in group.chars() {
        match c {
            '.' => out.push_str("%2E"),
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out.push_str(".snap");
    out
}

fn snap_err(path: &Path, reason: impl Into<String>) -> StorageError {
    StorageError::Snapshot {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// What the manifest lists; nothing when there is none.
pub(crate) fn read_manifest(provider: &str, dir: &Path) -> Result<Listed, StorageError> {
    let path = dir.join(MANIFEST);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Listed::default()),
        Err(e) => {
            return Err(StorageError::io(
                provider,
                &format!("open {}", path.display()),
                e,
            ));
        }
    };
    let mut text = String::new();
    file.take(MANIFEST_MAX)
        .read_to_string(&mut text)
        .map_err(|e| snap_err(&path, e.to_string()))?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| snap_err(&path, e.to_string()))?;
    if m.version != 1 {
        return Err(snap_err(&path, format!("version {} is not 1", m.version)));
    }
    let mut out = Listed::default();
    for f in m.files {
        if f.file.contains('/') || f.file.starts_with('.') || !f.file.ends_with(".snap") {
            return Err(snap_err(
                &path,
                format!("names a file outside it: {}", f.file),
            ));
        }
        for ch in &f.channels {
            out.by_channel.insert(ch.clone(), dir.join(&f.file));
        }
        out.files.push(f);
    }
    Ok(out)
}

/// Opens a file a snapshot may hold; `None` when it holds none.
fn open_if_present(provider: &str, path: &Path) -> Result<Option<File>, StorageError> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::io(
            provider,
            &format!("open {}", path.display()),
            e,
        )),
    }
}

/// Removes a file a previous snapshot left, if it did.
fn remove_if_present(provider: &str, path: &Path) -> Result<(), StorageError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StorageError::io(
            provider,
            &format!("remove {}", path.display()),
            e,
        )),
        _ => Ok(()),
    }
}

/// The session records the last graceful stop wrote; none when there is no file.
pub(crate) fn read_sessions(
    provider: &str,
    dir: &Path,
) -> Result<BTreeMap<String, String>, StorageError> {
    let path = dir.join(SESSIONS);
    let Some(file) = open_if_present(provider, &path)? else {
        return Ok(BTreeMap::new());
    };
    let reader = BufReader::new(file.take(SESSIONS_MAX));
    serde_json::from_reader(reader).map_err(|e| snap_err(&path, e.to_string()))
}

/// Writes the session records (before the manifest, which marks the snapshot whole);
/// with none, removes the file a previous snapshot left.
pub(crate) fn write_sessions(
    provider: &str,
    dir: &Path,
    sessions: &BTreeMap<&String, &String>,
) -> Result<(), StorageError> {
    let path = dir.join(SESSIONS);
    if sessions.is_empty() {
        return remove_if_present(provider, &path);
    }
    write_atomically(&path, |w| {
        serde_json::to_writer(&mut *w, sessions).map_err(std::io::Error::other)
    })
    .map_err(|e| StorageError::io(provider, &format!("write {}", path.display()), e))
}

/// The held QoS 2 publishes the last graceful stop wrote; none when there is no file.
pub(crate) fn read_held(provider: &str, dir: &Path) -> Result<Vec<Held>, StorageError> {
    let mut path = dir.join(HELD);
    let mut file = open_if_present(provider, &path)?;
    if file.is_none() && held_before(dir) {
        path = dir.join(HELD_BEFORE);
        file = open_if_present(provider, &path)?;
    }
    let Some(file) = file else {
        return Ok(Vec::new());
    };
    let mut r = Bounded::open(
        provider,
        file,
        &path,
        HELD_MAGIC,
        "not a held-publishes file",
    )?;
    // Each at least: id length (8), packet id (4), token (8), data length (8).
    let n = r.count("held publishes", 28)?;
    let mut held = Vec::new();
    for _ in 0..n {
        let client_id = r.string("client id")?;
        let packet_id = u16::try_from(r.u32("packet id")?)
            .map_err(|_| snap_err(&path, "packet id out of range"))?;
        let token = r.u64("token")?;
        let data = r.bytes("held data")?;
        held.push(Held {
            client_id,
            packet_id,
            token,
            data,
        });
    }
    Ok(held)
}

/// Whether `dir` holds held publishes where an earlier version wrote them.
fn held_before(dir: &Path) -> bool {
    let mut magic = [0u8; 16];
    std::fs::File::open(dir.join(HELD_BEFORE))
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == HELD_MAGIC)
}

/// Writes the held QoS 2 publishes (before the manifest); with none, removes the
/// file a previous snapshot left.
pub(crate) fn write_held(
    provider: &str,
    dir: &Path,
    held: &BTreeMap<(String, u16), (u64, Vec<u8>)>,
) -> Result<(), StorageError> {
    if held_before(dir) {
        remove_if_present(provider, &dir.join(HELD_BEFORE))?;
    }
    let path = dir.join(HELD);
    if held.is_empty() {
        return remove_if_present(provider, &path);
    }
    write_atomically(&path, |w| {
        w.write_all(HELD_MAGIC)?;
        put_u64(w, held.len() as u64)?;
        for ((client_id, packet_id), (token, data)) in held {
            put_bytes(w, client_id.as_bytes())?;
            put_u32(w, u32::from(*packet_id))?;
            put_u64(w, *token)?;
            put_bytes(w, data)?;
        }
        Ok(())
    })
    .map_err(|e| StorageError::io(provider, &format!("write {}", path.display()), e))
}

/// Marks the directory in use. Finding the mark left over means the last run ended
/// without a snapshot (killed, or power lost): what it stored after the last snapshot
/// is gone, and the offsets it handed out since will be handed out again - which is
/// what a memory provider promises after SIGKILL (C-211), said once at start.
pub(crate) fn mark_running(
    provider: &str,
    dir: &Path,
    has_snapshot: bool,
) -> Result<(), StorageError> {
    let path = dir.join(RUNNING);
    if path.exists() {
        log::warn!(
            "storage provider {provider}: the last broker on {} did not shut down gracefully; {} records stored since are lost and their offsets will be reused",
            dir.display(),
            if has_snapshot {
                "loading the last snapshot;"
            } else {
                "there is no snapshot;"
            }
        );
    }
    File::create(&path)
        .map(drop)
        .map_err(|e| StorageError::io(provider, &format!("create {}", path.display()), e))
}

/// Writes every group, then the manifest, which lists `kept` (files left as they
/// are) after them.
pub(crate) fn write_all<'a>(
    provider: &str,
    dir: &Path,
    groups: &BTreeMap<String, Vec<(&str, &MemChannel)>>,
    kept: impl Iterator<Item = &'a ManifestFile>,
    now_ms: u64,
) -> Result<SnapshotReport, StorageError> {
    let mut report = SnapshotReport::default();
    let mut files = Vec::new();
    for (group, channels) in groups {
        let name = snapshot_file_name(group);
        let path = dir.join(&name);
        write_atomically(&path, |w| write_group(w, channels))
            .map_err(|e| StorageError::io(provider, &format!("write {}", path.display()), e))?;
        let records: u64 = channels.iter().map(|(_, c)| c.records.len() as u64).sum();
        report.files += 1;
        report.channels += channels.len();
        report.records += records;
        files.push(ManifestFile {
            file: name,
            channels: channels.iter().map(|(n, _)| (*n).to_owned()).collect(),
            records,
        });
    }
    files.extend(kept.cloned());
    let manifest = Manifest {
        version: 1,
        provider: provider.to_owned(),
        written_at_ms: now_ms,
        files,
    };
    let path = dir.join(MANIFEST);
    write_atomically(&path, |w| {
        serde_json::to_writer_pretty(&mut *w, &manifest).map_err(std::io::Error::other)
    })
    .map_err(|e| StorageError::io(provider, &format!("write {}", path.display()), e))?;
    let _ = std::fs::remove_file(dir.join(RUNNING));
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(report)
}

fn write_atomically(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut w = BufWriter::new(File::create(&tmp)?);
    body(&mut w)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn put_u8(w: &mut impl Write, v: u8) -> std::io::Result<()> {
    w.write_all(&[v])
}
fn put_u32(w: &mut impl Write, v: u32) -> std::io::Result<()> {
    w.write_all(&v.to_be_bytes())
}
fn put_u64(w: &mut impl Write, v: u64) -> std::io::Result<()> {
    w.write_all(&v.to_be_bytes())
}
fn put_bytes(w: &mut impl Write, v: &[u8]) -> std::io::Result<()> {
    put_u64(w, v.len() as u64)?;
    w.write_all(v)
}
fn put_opt_u64(w: &mut impl Write, v: Option<u64>) -> std::io::Result<()> {
    match v {
        None => put_u8(w, 0),
        Some(v) => {
            put_u8(w, 1)?;
            put_u64(w, v)
        }
    }
}

fn put_opt_bytes(w: &mut impl Write, v: Option<&[u8]>) -> std::io::Result<()> {
    match v {
        None => put_u8(w, 0),
        Some(b) => {
            put_u8(w, 1)?;
            put_bytes(w, b)
        }
    }
}

fn write_group(w: &mut impl Write, channels: &[(&str, &MemChannel)]) -> std::io::Result<()> {
    w.write_all(MAGIC)?;
    put_u32(w, channels.len() as u32)?;
    for (name, ch) in channels {
        put_bytes(w, name.as_bytes())?;
        put_u64(w, ch.next_offset)?;
        put_u64(w, ch.records.len() as u64)?;
        for r in ch.records.values() {
            write_record(w, r)?;
        }
        put_u64(w, ch.positions.len() as u64)?;
        for (client, off) in &ch.positions {
            put_bytes(w, client.as_bytes())?;
            put_u64(w, *off)?;
        }
    }
    w.write_all(b"END")
}

fn write_record(w: &mut impl Write, r: &Record) -> std::io::Result<()> {
    put_u64(w, r.offset)?;
    put_bytes(w, r.message_id.as_bytes())?;
    put_u64(w, r.timestamp_ms)?;
    put_bytes(w, r.topic.as_bytes())?;
    put_bytes(w, &r.payload)?;
    match r.state {
        RecordState::Stored => put_u8(w, 0)?,
        RecordState::Deleted => put_u8(w, 1)?,
        // A job whose attempts have times is written under its own tag, so a job
        // never offered stays readable by a version that kept no times.
        RecordState::Job {
            attempts,
            available_after_ms,
        } => {
            let timed = attempts.first_ms.is_some() || attempts.last_ms.is_some();
            put_u8(w, if timed { 3 } else { 2 })?;
            put_u32(w, attempts.count)?;
            put_u64(w, available_after_ms)?;
            if timed {
                put_opt_u64(w, attempts.first_ms)?;
                put_opt_u64(w, attempts.last_ms)?;
            }
        }
    }
    let p = &r.properties;
    put_opt_bytes(
        w,
        p.payload_format_indicator
            .map(|v| [v])
            .as_ref()
            .map(|a| &a[..]),
    )?;
    put_opt_bytes(
        w,
        p.message_expiry_interval
            .map(u32::to_be_bytes)
            .as_ref()
            .map(|a| &a[..]),
    )?;
    put_opt_bytes(w, p.content_type.as_deref().map(str::as_bytes))?;
    put_opt_bytes(w, p.response_topic.as_deref().map(str::as_bytes))?;
    put_opt_bytes(w, p.correlation_data.as_deref())?;
    put_u64(w, p.user_properties.len() as u64)?;
    for (k, v) in &p.user_properties {
        put_bytes(w, k.as_bytes())?;
        put_bytes(w, v.as_bytes())?;
    }
    Ok(())
}

/// A reader that refuses any length beyond what the file has left.
struct Bounded<R> {
    inner: R,
    left: u64,
    path: PathBuf,
}

impl Bounded<BufReader<File>> {
    /// Reads `file` no further than its length, after checking its 16-byte header is
    /// `magic` (`not_it` says what the file is not, when it is not).
    fn open(
        provider: &str,
        file: File,
        path: &Path,
        magic: &[u8; 16],
        not_it: &str,
    ) -> Result<Self, StorageError> {
        let left = file
            .metadata()
            .map_err(|e| StorageError::io(provider, &format!("stat {}", path.display()), e))?
            .len();
        let mut r = Bounded {
            inner: BufReader::new(file),
            left,
            path: path.to_owned(),
        };
        if &r.array::<16>("header")? != magic {
            return Err(snap_err(path, not_it));
        }
        Ok(r)
    }
}

impl<R: Read> Bounded<R> {
    fn take(&mut self, n: u64, what: &str) -> Result<Vec<u8>, StorageError> {
        if n > self.left {
            return Err(snap_err(
                &self.path,
                format!(
                    "{what} claims {n} bytes with {} left in the file",
                    self.left
                ),
            ));
        }
        let mut buf = vec![0; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| snap_err(&self.path, format!("{what}: {e}")))?;
        self.left -= n;
        Ok(buf)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], StorageError> {
        let v = self.take(N as u64, what)?;
        let mut a = [0; N];
        a.copy_from_slice(&v);
        Ok(a)
    }
    fn u8(&mut self, what: &str) -> Result<u8, StorageError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32, StorageError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, StorageError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }
    fn bytes(&mut self, what: &str) -> Result<Vec<u8>, StorageError> {
        let n = self.u64(what)?;
        self.take(n, what)
    }
    fn string(&mut self, what: &str) -> Result<String, StorageError> {
        let b = self.bytes(what)?;
        String::from_utf8(b).map_err(|_| snap_err(&self.path, format!("{what} is not UTF-8")))
    }
    fn opt_bytes(&mut self, what: &str) -> Result<Option<Vec<u8>>, StorageError> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.bytes(what)?)),
            t => Err(snap_err(&self.path, format!("{what}: bad tag {t}"))),
        }
    }
    fn opt_u64(&mut self, what: &str) -> Result<Option<u64>, StorageError> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.u64(what)?)),
            t => Err(snap_err(&self.path, format!("{what}: bad tag {t}"))),
        }
    }
    fn opt_string(&mut self, what: &str) -> Result<Option<String>, StorageError> {
        self.opt_bytes(what)?
            .map(|b| {
                String::from_utf8(b)
                    .map_err(|_| snap_err(&self.path, format!("{what} is not UTF-8")))
            })
            .transpose()
    }
    /// A count of items each at least `min_item` bytes long, checked against what is left.
    fn count(&mut self, what: &str, min_item: u64) -> Result<u64, StorageError> {
        let n = self.u64(what)?;
        if n.saturating_mul(min_item) > self.left {
            return Err(snap_err(
                &self.path,
                format!("{what} count {n} exceeds the file"),
            ));
        }
        Ok(n)
    }
}

/// Reads one group file into its channels.
pub(crate) fn read_group(
    provider: &str,
    path: &Path,
) -> Result<Vec<(String, MemChannel)>, StorageError> {
    let file = File::open(path)
        .map_err(|e| StorageError::io(provider, &format!("open {}", path.display()), e))?;
    let mut r = Bounded::open(
        provider,
        file,
        path,
        MAGIC,
        "not a Sagüin snapshot (bad header)",
    )?;
    let n = r.u32("channel count")?;
    let mut out = Vec::new();
    for _ in 0..n {
        let name = r.string("channel name")?;
        let mut ch = MemChannel {
            next_offset: r.u64("next offset")?,
            ..MemChannel::default()
        };
        // Offsets only grow: a head near the end of their range (no channel reaches
        // half of it) would wrap to 0, and a record written twice would be counted
        // twice and held once.
        if ch.next_offset > u64::MAX / 2 {
            return Err(snap_err(
                path,
                "channel head near the end of the offset range",
            ));
        }
        let mut last = None;
        for _ in 0..r.count("record count", 40)? {
            let rec = read_record(&mut r)?;
            if rec.offset >= ch.next_offset {
                return Err(snap_err(
                    path,
                    format!("record offset {} at or above the channel head", rec.offset),
                ));
            }
            if last.is_some_and(|last| rec.offset <= last) {
                return Err(snap_err(
                    path,
                    format!("record offset {} out of order", rec.offset),
                ));
            }
            last = Some(rec.offset);
            ch.bytes += rec.size();
            ch.records.insert(rec.offset, rec);
        }
        for _ in 0..r.count("position count", 16)? {
            let client = r.string("client id")?;
            let off = r.u64("position")?;
            ch.positions.insert(client, off);
        }
        out.push((name, ch));
    }
    if r.take(3, "end marker")? != b"END" {
        return Err(snap_err(path, "truncated (no end marker)"));
    }
    Ok(out)
}

fn read_record<R: Read>(r: &mut Bounded<R>) -> Result<Record, StorageError> {
    let offset = r.u64("offset")?;
    let message_id = r.string("message id")?;
    let timestamp_ms = r.u64("timestamp")?;
    let topic = r.string("topic")?;
    let payload = r.bytes("payload")?;
    let state = match r.u8("state")? {
        0 => RecordState::Stored,
        1 => RecordState::Deleted,
        tag @ (2 | 3) => {
            let count = r.u32("attempts")?;
            let available_after_ms = r.u64("available after")?;
            let mut attempts = Attempts {
                count,
                ..Attempts::default()
            };
            if tag == 3 {
                attempts.first_ms = r.opt_u64("first attempt")?;
                attempts.last_ms = r.opt_u64("last attempt")?;
            }
            RecordState::Job {
                attempts,
                available_after_ms,
            }
        }
        t => return Err(snap_err(&r.path, format!("record state {t} is unknown"))),
    };
    let pfi = r.opt_bytes("payload format")?;
    let expiry = r.opt_bytes("message expiry")?;
    let mut properties = RecordProperties {
        payload_format_indicator: pfi.and_then(|b| b.first().copied()),
        message_expiry_interval: expiry
            .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
            .map(u32::from_be_bytes),
        content_type: r.opt_string("content type")?,
        response_topic: r.opt_string("response topic")?,
        correlation_data: r.opt_bytes("correlation data")?,
        user_properties: Vec::new(),
    };
    for _ in 0..r.count("user property count", 16)? {
        let k = r.string("user property key")?;
        let v = r.string("user property value")?;
        properties.user_properties.push((k, v));
    }
    Ok(Record {
        offset,
        message_id,
        timestamp_ms,
        topic,
        payload,
        properties,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// B-491, A-030: dots are percent-encoded, so `.` and `..` cannot be file names.
    #[test]
    fn snapshot_names_percent_encode_dots() {
        assert_eq!(snapshot_file_name("fleet.v2"), "fleet%2Ev2.snap");
        assert_eq!(snapshot_file_name(".."), "%2E%2E.snap");
        assert_eq!(snapshot_file_name("jobs"), "jobs.snap");
    }
}
