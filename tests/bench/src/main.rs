//! saguin-bench: the same MQTT 3.1.1 scenarios against two brokers on loopback,
//! in one run, printed as a Markdown table with the ratio first/second.
//!
//! It speaks MQTT itself (CONNECT, SUBSCRIBE, PUBLISH QoS 0/1, PUBACK) so that the
//! client costs the same against either broker and is not the bottleneck.
//!
//! ```text
//! saguin-bench --target saguin=127.0.0.1:18830,PID --target mosquitto=127.0.0.1:18831,PID
//!              [--duration 3] [--latency-secs 4] [--load-secs 2] [--idle 1000] [--rounds 1] [--jobs 3000] [--only SUBSTR] [--out FILE]
//! ```
//!
//! Each scenario has three phases on the same subscriptions:
//! * latency: publishers paced well below saturation; every delivery's one-way
//!   latency (the send time travels in the payload; both ends are this process)
//!   gives p50 / p99. The two brokers' latency phases run at the same time, one's
//!   publishes half a period after the other's, so that a moment of a noisy machine
//!   falls on both alike (run one after the other, a burst of steal landed on one
//!   broker's phase and moved p99 by 10x between rounds);
//! * latency under load: the same, one broker at a time, at 20,000 deliveries a
//!   second of 128 bytes or 10,000 of 16 KiB (twice that for 1to100) for
//!   `--load-secs`. Paced at 500 a second the machine idles between publishes, and
//!   p99 is mostly a vCPU woken from halt, the same for any broker; under load it
//!   does not idle, and what a broker spends on each message shows;
//! * throughput: publishers send as fast as the broker takes it, with at most a
//!   window of messages ahead of the subscribers (so neither broker is pushed
//!   into dropping by its queue bounds), for `--duration` seconds; the result is
//!   deliveries per second, summed over subscribers.
//!
//! With `--rounds N` every scenario runs N times per broker, the order of the two
//! brokers (which connects and floods first, which paces first) alternating, and
//! each figure is the median of its N values.
//!
//! Broker RSS is sampled from /proc/PID/status every 50 ms; the peak per
//! scenario is reported, and once idle and with `--idle` idle connections. With
//! those open, the broker's context switches (every thread) over 5 s say how often
//! it wakes with nothing to carry: an idle gateway's CPU and power.
//!
//! Channels, measured on a target whose name starts with `saguin` only (mosquitto
//! has none; its columns print n/a). The broker must declare an append channel on
//! `bench/log/#` (sqlite) and a queue `bench-jobs` on `bench/jobs/#`, as
//! tests/bench/run's generated saguin.yaml does:
//! * `append-qos1-sqlite-{1,8}pub-128B`: QoS 1 publishers, 32 unacknowledged each,
//!   for `--duration` seconds: PUBACKs per second (sent after the commit); then one
//!   new QoS 1 subscriber to `bench/log/#` is replayed everything written: records/s;
//! * `queue-drain-{1,4}worker(s)`: `--jobs` jobs published at QoS 1 to
//!   `bench/jobs/x`, then MQTT 5 workers subscribed to `$saguin/queue/bench-jobs`
//!   answer each offer (`ack` on its Response Topic with its Correlation Data, QoS 0)
//!   and PUBACK it: jobs/s from their SUBSCRIBE to the last offer answered. This is
//!   the only MQTT 5 the client speaks.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, Semaphore};
use tokio::time::{sleep, sleep_until, timeout};

static EPOCH: OnceLock<Instant> = OnceLock::new();
fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

// ---------------------------------------------------------------- MQTT 3.1.1 codec

fn put_varint(buf: &mut Vec<u8>, mut n: usize) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        buf.push(b);
        if n == 0 {
            break;
        }
    }
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u16).to_be_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn connect_packet(client_id: &str, keepalive: u16) -> Vec<u8> {
    let mut body = Vec::new();
    put_str(&mut body, "MQTT");
    body.push(4); // 3.1.1
    body.push(0x02); // clean session
    body.extend_from_slice(&keepalive.to_be_bytes());
    put_str(&mut body, client_id);
    let mut p = vec![0x10];
    put_varint(&mut p, body.len());
    p.extend_from_slice(&body);
    p
}

fn subscribe_packet(pid: u16, filter: &str, qos: u8) -> Vec<u8> {
    let mut body = pid.to_be_bytes().to_vec();
    put_str(&mut body, filter);
    body.push(qos);
    let mut p = vec![0x82];
    put_varint(&mut p, body.len());
    p.extend_from_slice(&body);
    p
}

fn put_publish(buf: &mut Vec<u8>, topic: &str, qos: u8, pid: u16, payload: &[u8]) {
    buf.push(0x30 | (qos << 1));
    let len = 2 + topic.len() + if qos > 0 { 2 } else { 0 } + payload.len();
    put_varint(buf, len);
    put_str(buf, topic);
    if qos > 0 {
        buf.extend_from_slice(&pid.to_be_bytes());
    }
    buf.extend_from_slice(payload);
}

// ---------------------------------------------------------------- MQTT 5: what a queue worker needs

/// CONNECT at protocol level 5, clean start, no properties.
fn connect_packet_v5(client_id: &str, keepalive: u16) -> Vec<u8> {
    let mut body = Vec::new();
    put_str(&mut body, "MQTT");
    body.push(5);
    body.push(0x02); // clean start
    body.extend_from_slice(&keepalive.to_be_bytes());
    body.push(0); // properties
    put_str(&mut body, client_id);
    let mut p = vec![0x10];
    put_varint(&mut p, body.len());
    p.extend_from_slice(&body);
    p
}

/// SUBSCRIBE at level 5: no properties, options byte = maximum QoS.
fn subscribe_packet_v5(pid: u16, filter: &str, qos: u8) -> Vec<u8> {
    let mut body = pid.to_be_bytes().to_vec();
    body.push(0); // properties
    put_str(&mut body, filter);
    body.push(qos);
    let mut p = vec![0x82];
    put_varint(&mut p, body.len());
    p.extend_from_slice(&body);
    p
}

/// PUBLISH at level 5 carrying only Correlation Data (0x09) among its properties.
fn put_publish_v5(
    buf: &mut Vec<u8>,
    topic: &str,
    qos: u8,
    pid: u16,
    correlation: &[u8],
    payload: &[u8],
) {
    let mut props = Vec::with_capacity(3 + correlation.len());
    if !correlation.is_empty() {
        props.push(0x09);
        props.extend_from_slice(&(correlation.len() as u16).to_be_bytes());
        props.extend_from_slice(correlation);
    }
    let mut plen = Vec::new();
    put_varint(&mut plen, props.len());
    buf.push(0x30 | (qos << 1));
    let len =
        2 + topic.len() + if qos > 0 { 2 } else { 0 } + plen.len() + props.len() + payload.len();
    put_varint(buf, len);
    put_str(buf, topic);
    if qos > 0 {
        buf.extend_from_slice(&pid.to_be_bytes());
    }
    buf.extend_from_slice(&plen);
    buf.extend_from_slice(&props);
    buf.extend_from_slice(payload);
}

/// A variable byte integer at `b[i..]`: (value, bytes used).
fn get_varint(b: &[u8], mut i: usize) -> Option<(usize, usize)> {
    let (mut v, mut mult, start) = (0usize, 1usize, i);
    loop {
        let x = *b.get(i)?;
        v += (x & 0x7f) as usize * mult;
        mult *= 128;
        i += 1;
        if x & 0x80 == 0 {
            return Some((v, i - start));
        }
        if i - start >= 4 {
            return None;
        }
    }
}

/// What a queue worker reads off an MQTT 5 PUBLISH body: packet id, Response Topic, Correlation Data.
#[derive(Default)]
struct Offer {
    pid: Option<u16>,
    response_topic: Option<String>,
    correlation: Vec<u8>,
}

/// Parses an MQTT 5 PUBLISH (`h` its first byte, `b` its body), skipping properties other
/// than Response Topic (0x08) and Correlation Data (0x09).
fn parse_publish_v5(h: u8, b: &[u8]) -> Option<Offer> {
    let q = (h >> 1) & 3;
    let tlen = u16::from_be_bytes([*b.first()?, *b.get(1)?]) as usize;
    let mut i = 2 + tlen;
    let mut o = Offer::default();
    if q > 0 {
        o.pid = Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]));
        i += 2;
    }
    let (plen, n) = get_varint(b, i)?;
    i += n;
    let end = i + plen;
    if end > b.len() {
        return None;
    }
    let two = |i: usize| -> Option<usize> {
        Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]) as usize)
    };
    while i < end {
        let id = b[i];
        i += 1;
        match id {
            0x01 => i += 1,                   // payload format indicator
            0x02 => i += 4,                   // message expiry interval
            0x23 => i += 2,                   // topic alias
            0x0b => i += get_varint(b, i)?.1, // subscription identifier
            0x03 => i += 2 + two(i)?,         // content type
            0x08 => {
                let l = two(i)?;
                o.response_topic =
                    Some(String::from_utf8_lossy(b.get(i + 2..i + 2 + l)?).into_owned());
                i += 2 + l;
            }
            0x09 => {
                let l = two(i)?;
                o.correlation = b.get(i + 2..i + 2 + l)?.to_vec();
                i += 2 + l;
            }
            0x26 => {
                // user property: two strings
                i += 2 + two(i)?;
                i += 2 + two(i)?;
            }
            _ => return None,
        }
    }
    Some(o)
}

/// Reads whole MQTT packets from one socket.
struct Rd {
    r: OwnedReadHalf,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
}

impl Rd {
    fn new(r: OwnedReadHalf) -> Self {
        Rd {
            r,
            buf: vec![0; 256 * 1024],
            pos: 0,
            len: 0,
        }
    }

    /// The next complete packet already in the buffer: (first byte, body range).
    fn parse(&mut self) -> Option<(u8, usize, usize)> {
        let a = &self.buf[self.pos..self.len];
        if a.len() < 2 {
            return None;
        }
        let (mut rl, mut mult, mut i) = (0usize, 1usize, 1usize);
        loop {
            if i >= a.len() {
                return None;
            }
            let b = a[i];
            rl += (b & 0x7f) as usize * mult;
            mult *= 128;
            i += 1;
            if b & 0x80 == 0 {
                break;
            }
            assert!(i <= 4, "malformed remaining length");
        }
        if a.len() < i + rl {
            return None;
        }
        let s = self.pos + i;
        self.pos = s + rl;
        Some((a[0], s, s + rl))
    }

    async fn fill(&mut self) -> io::Result<()> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.len, 0);
            self.len -= self.pos;
            self.pos = 0;
        }
        if self.len == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = self.r.read(&mut self.buf[self.len..]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "broker closed the connection",
            ));
        }
        self.len += n;
        Ok(())
    }

    async fn next(&mut self) -> io::Result<(u8, usize, usize)> {
        loop {
            if let Some(p) = self.parse() {
                return Ok(p);
            }
            self.fill().await?;
        }
    }
}

type Wr = BufWriter<OwnedWriteHalf>;

/// Every client asks for the Keep Alive stock clients use (mosquitto_sub, Paho: 60 s),
/// so each broker pays for watching it as it would in the field.
const KEEPALIVE: u16 = 60;

async fn connect(addr: &str, id: &str, keepalive: u16) -> io::Result<(Rd, Wr)> {
    connect_level(addr, id, keepalive, 4).await
}

/// CONNECT at protocol level 4 (3.1.1) or 5, waiting at most 10 s for the CONNACK.
async fn connect_level(addr: &str, id: &str, keepalive: u16, level: u8) -> io::Result<(Rd, Wr)> {
    let s = timeout(Duration::from_secs(10), TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::other("TCP connect timed out"))??;
    s.set_nodelay(true)?;
    let (r, w) = s.into_split();
    let mut w = BufWriter::with_capacity(64 * 1024, w);
    let pkt = if level == 5 {
        connect_packet_v5(id, keepalive)
    } else {
        connect_packet(id, keepalive)
    };
    w.write_all(&pkt).await?;
    w.flush().await?;
    let mut rd = Rd::new(r);
    let (h, s, e) = timeout(Duration::from_secs(10), rd.next())
        .await
        .map_err(|_| io::Error::other("no CONNACK within 10 s"))??;
    // 3.1.1: flags, return code. 5: flags, reason code, properties.
    let ok = h == 0x20 && e - s >= 2 && rd.buf[s + 1] == 0 && (level == 5 || e - s == 2);
    if !ok {
        return Err(io::Error::other(format!(
            "CONNECT refused: {:02x?}",
            &rd.buf[s.saturating_sub(2)..e]
        )));
    }
    Ok((rd, w))
}

async fn subscribe(rd: &mut Rd, w: &mut Wr, filter: &str, qos: u8) -> io::Result<()> {
    w.write_all(&subscribe_packet(1, filter, qos)).await?;
    w.flush().await?;
    loop {
        let (h, s, e) = rd.next().await?;
        if h == 0x90 {
            let rc = rd.buf[e - 1];
            if rc == 0x80 || e - s < 3 {
                return Err(io::Error::other("SUBSCRIBE refused"));
            }
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------- scenarios

#[derive(Clone)]
struct Scenario {
    name: String,
    qos: u8,
    pubs: usize,
    subs: usize,
    payload: usize,
    /// the topic publishers send to (bench/NAME for the broadcast scenarios)
    topic: String,
    /// total publishes per second across publishers in the latency phase
    paced_rate: f64,
    /// total publishes per second across publishers in the latency-under-load phase
    loaded_rate: f64,
}

#[derive(Default)]
struct Shared {
    sent: AtomicU64,
    delivered: AtomicU64,
    /// PUBACKs received by QoS 1 publishers
    acked: AtomicU64,
    forgiven: AtomicU64,
    stop_subs: AtomicBool,
    /// Publishers waiting for the subscribers to catch up, and their wake-up: a
    /// delivery wakes them at once. (A 100 µs sleep was a 1 ms one on tokio's timer
    /// wheel, which capped 16 KiB 1to1 and 8to1 at the window per millisecond, 16k/s,
    /// whichever broker was measured.)
    waiting: AtomicUsize,
    progress: Notify,
}

#[derive(Default, Clone)]
struct Outcome {
    deliveries_per_s: f64,
    publishes_per_s: f64,
    lost_pct: f64,
    p50_us: f64,
    p99_us: f64,
    /// latency under load (phase 2)
    load_p50_us: f64,
    load_p99_us: f64,
    peak_rss_kib: Option<u64>,
    error: Option<String>,
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// A latency phase; its byte follows the 8-byte send time in a publish's payload
/// (0 there: the throughput phase, not timed).
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    /// paced well below saturation, both targets at once
    Paced = 1,
    /// latency under load, one target at a time
    Loaded = 2,
}
const FLOODED: u8 = 0;

struct Sub {
    count: u64,
    /// latencies of the paced (idle-machine) phase
    lat_ns: Vec<u64>,
    /// latencies of the latency-under-load phase
    load_ns: Vec<u64>,
}

async fn subscriber(mut rd: Rd, mut w: Wr, sh: Arc<Shared>) -> io::Result<Sub> {
    let mut out = Sub {
        count: 0,
        lat_ns: Vec::new(),
        load_ns: Vec::new(),
    };
    let mut acks = Vec::new();
    loop {
        while let Some((h, s, e)) = rd.parse() {
            if h & 0xf0 != 0x30 {
                continue;
            }
            let q = (h >> 1) & 3;
            let tlen = u16::from_be_bytes([rd.buf[s], rd.buf[s + 1]]) as usize;
            let mut p = s + 2 + tlen;
            if q > 0 {
                acks.extend_from_slice(&[0x40, 2, rd.buf[p], rd.buf[p + 1]]);
                p += 2;
            }
            let payload = &rd.buf[p..e];
            if payload.len() >= 9 && payload[8] != FLOODED {
                let ts = u64::from_le_bytes(payload[..8].try_into().unwrap());
                let into = if payload[8] == Phase::Loaded as u8 {
                    &mut out.load_ns
                } else {
                    &mut out.lat_ns
                };
                into.push(now_ns().saturating_sub(ts));
            }
            out.count += 1;
            sh.delivered.fetch_add(1, SeqCst);
            if sh.waiting.load(SeqCst) > 0 {
                sh.progress.notify_waiters();
            }
        }
        if !acks.is_empty() {
            w.write_all(&acks).await?;
            w.flush().await?;
            acks.clear();
        }
        match timeout(Duration::from_millis(50), rd.fill()).await {
            Ok(r) => r?,
            Err(_) if sh.stop_subs.load(Relaxed) => return Ok(out),
            Err(_) => {}
        }
    }
}

enum Mode {
    /// `per_s` publishes a second, the first at `first`, marked `phase`.
    Paced {
        per_s: f64,
        first: Instant,
        until: Instant,
        phase: Phase,
    },
    Flood {
        until: Instant,
        window: u64,
    },
}

/// Runs one flooding publisher on each connection until `until`, at most `window`
/// messages ahead of the subscribers, 32 QoS 1 publishes unacknowledged each.
async fn flood(
    conns: Vec<(Rd, Wr)>,
    sh: &Arc<Shared>,
    sc: &Scenario,
    until: Instant,
    window: u64,
) -> io::Result<()> {
    let handles: Vec<_> = conns
        .into_iter()
        .map(|(rd, w)| {
            let mode = Mode::Flood { until, window };
            let inflight = Arc::new(Semaphore::new(32));
            tokio::spawn(publisher(rd, w, sh.clone(), sc.clone(), mode, inflight))
        })
        .collect();
    for h in handles {
        h.await.map_err(io::Error::other)??;
    }
    Ok(())
}

async fn publisher(
    rd: Rd,
    mut w: Wr,
    sh: Arc<Shared>,
    sc: Scenario,
    mode: Mode,
    inflight: Arc<Semaphore>,
) -> io::Result<u64> {
    // QoS 1: a reader task returns a permit per PUBACK.
    let acker = if sc.qos > 0 {
        let sem = inflight.clone();
        let sh = sh.clone();
        let mut rd = rd;
        Some(tokio::spawn(async move {
            loop {
                match rd.next().await {
                    Ok((h, _, _)) if h & 0xf0 == 0x40 => {
                        sh.acked.fetch_add(1, Relaxed);
                        sem.add_permits(1)
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        }))
    } else {
        None
    };
    let topic = sc.topic.clone();
    let mut payload = vec![0x5au8; sc.payload.max(9)];
    let mut pkt = Vec::with_capacity(sc.payload + 64);
    let mut pid: u16 = 0;
    let mut n: u64 = 0;
    let subs = sc.subs as u64;
    loop {
        let now = Instant::now();
        match mode {
            Mode::Paced {
                per_s,
                first,
                until,
                ..
            } => {
                if now >= until {
                    break;
                }
                let due = first + Duration::from_secs_f64(n as f64 / per_s);
                if due > now {
                    sleep_until(due.into()).await;
                }
            }
            Mode::Flood { until, window } => {
                if now >= until {
                    break;
                }
                // At most `window` messages ahead of the subscribers, summed over publishers.
                let mut last = (sh.delivered.load(Relaxed), Instant::now());
                loop {
                    // Counted as waiting and listening before looking, so a delivery
                    // after the look always wakes this publisher.
                    sh.waiting.fetch_add(1, SeqCst);
                    let progress = sh.progress.notified();
                    tokio::pin!(progress);
                    progress.as_mut().enable();
                    let sent = sh.sent.load(SeqCst) * subs;
                    let done = sh.delivered.load(SeqCst) + sh.forgiven.load(SeqCst);
                    let ahead = sent.saturating_sub(done);
                    if ahead <= window * subs {
                        sh.waiting.fetch_sub(1, SeqCst);
                        break;
                    }
                    w.flush().await?;
                    let _ = timeout(Duration::from_millis(5), progress).await;
                    sh.waiting.fetch_sub(1, SeqCst);
                    let d = sh.delivered.load(Relaxed);
                    if d != last.0 {
                        last = (d, Instant::now());
                    } else if sc.qos == 0 && last.1.elapsed() > Duration::from_millis(300) {
                        // Nothing arrives: the broker dropped these (QoS 0 may be dropped) - stop
                        // waiting for them. QoS 1 is never forgiven: a loss there is a finding.
                        sh.forgiven.fetch_add(ahead, Relaxed);
                    }
                    if Instant::now() >= until {
                        break;
                    }
                }
            }
        }
        if sc.qos > 0 {
            match inflight.try_acquire() {
                Ok(p) => p.forget(),
                Err(_) => {
                    w.flush().await?;
                    match timeout(Duration::from_secs(10), inflight.acquire()).await {
                        Ok(p) => p.unwrap().forget(),
                        Err(_) => return Err(io::Error::other("no PUBACK for 10 s")),
                    }
                }
            }
            pid = if pid == u16::MAX { 1 } else { pid + 1 };
        }
        let (flood, phase) = match mode {
            Mode::Flood { .. } => (true, FLOODED),
            Mode::Paced { phase, .. } => (false, phase as u8),
        };
        payload[..8].copy_from_slice(&now_ns().to_le_bytes());
        payload[8] = phase;
        pkt.clear();
        put_publish(&mut pkt, &topic, sc.qos, pid, &payload);
        w.write_all(&pkt).await?;
        if !flood {
            w.flush().await?;
        }
        sh.sent.fetch_add(1, Relaxed);
        n += 1;
    }
    w.flush().await?;
    if let Some(a) = acker {
        // Wait for the last PUBACKs, then stop reading.
        let t = Instant::now();
        while inflight.available_permits() < 32 && t.elapsed() < Duration::from_secs(5) {
            sleep(Duration::from_millis(5)).await;
        }
        a.abort();
    }
    let _ = w.write_all(&[0xe0, 0]).await;
    let _ = w.flush().await;
    Ok(n)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// Waits until the subscribers have everything that was sent, or nothing arrives for 3 s.
async fn drain(sh: &Shared, subs: u64) -> Instant {
    let mut last = (sh.delivered.load(Relaxed), Instant::now());
    loop {
        let d = sh.delivered.load(Relaxed);
        if d >= sh.sent.load(Relaxed) * subs {
            return Instant::now();
        }
        if d != last.0 {
            last = (d, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(3) {
            return last.1;
        }
        sleep(Duration::from_millis(2)).await;
    }
}

/// One target's connections for a scenario: subscribed, with idle publishers for
/// each phase.
struct Stage {
    sh: Arc<Shared>,
    peak: Arc<AtomicU64>,
    sampling: Arc<AtomicBool>,
    subscribers: Vec<tokio::task::JoinHandle<io::Result<Sub>>>,
    pacers: Vec<(Rd, Wr)>,
    loaders: Vec<(Rd, Wr)>,
    flooders: Vec<(Rd, Wr)>,
}

async fn stage(t: &Target, sc: &Scenario, tag: usize) -> io::Result<Stage> {
    let (peak, sampling) = rss_sampler(t.pid);
    let sh = Arc::new(Shared::default());
    let mut subscribers = Vec::new();
    for i in 0..sc.subs {
        let (mut rd, mut w) = connect(&t.addr, &format!("sb{tag}-s{i}"), KEEPALIVE).await?;
        subscribe(&mut rd, &mut w, &sc.topic, sc.qos).await?;
        subscribers.push(tokio::spawn(subscriber(rd, w, sh.clone())));
    }
    let (mut pacers, mut loaders, mut flooders) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..sc.pubs {
        pacers.push(connect(&t.addr, &format!("sb{tag}-l{i}"), KEEPALIVE).await?);
        loaders.push(connect(&t.addr, &format!("sb{tag}-u{i}"), KEEPALIVE).await?);
        flooders.push(connect(&t.addr, &format!("sb{tag}-p{i}"), KEEPALIVE).await?);
    }
    Ok(Stage {
        sh,
        peak,
        sampling,
        subscribers,
        pacers,
        loaders,
        flooders,
    })
}

/// Phase 1, latency: `sc.paced_rate` publishes a second in all, each publisher's
/// first due at `first`, until `until`; then waits for their deliveries.
/// Phase 2, latency under load, is the same at `sc.loaded_rate` on its own publishers.
async fn paced(
    st: &mut Stage,
    sc: &Scenario,
    phase: Phase,
    first: Instant,
    until: Instant,
) -> io::Result<()> {
    let (publishers, rate) = match phase {
        Phase::Loaded => (&mut st.loaders, sc.loaded_rate),
        Phase::Paced => (&mut st.pacers, sc.paced_rate),
    };
    let mut handles = Vec::new();
    for (rd, w) in publishers.drain(..) {
        let mode = Mode::Paced {
            per_s: rate / sc.pubs as f64,
            first,
            until,
            phase,
        };
        handles.push(tokio::spawn(publisher(
            rd,
            w,
            st.sh.clone(),
            sc.clone(),
            mode,
            Arc::new(Semaphore::new(32)),
        )));
    }
    for h in handles {
        h.await.unwrap()?;
    }
    drain(&st.sh, sc.subs as u64).await;
    Ok(())
}

/// Phase 3, throughput, on the publishers that stayed idle until now; then the
/// scenario's figures.
async fn flooded(st: Stage, sc: &Scenario, cfg: &Config) -> io::Result<Outcome> {
    let Stage {
        sh,
        peak,
        sampling,
        subscribers,
        flooders,
        ..
    } = st;
    let d0 = sh.delivered.load(Relaxed);
    let s0 = sh.sent.load(Relaxed);
    // What never arrived in the latency phases is lost too (below), and must not hold
    // this phase's publishers back: the window counts from here.
    sh.forgiven
        .fetch_add((s0 * sc.subs as u64).saturating_sub(d0), Relaxed);
    let window = ((256 * 1024) / sc.payload.max(1)).clamp(16, 500) as u64;
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(cfg.duration);
    flood(flooders, &sh, sc, until, window).await?;
    let pub_end = Instant::now();
    let last = drain(&sh, sc.subs as u64).await;
    sh.stop_subs.store(true, Relaxed);
    let (mut lat, mut load) = (Vec::new(), Vec::new());
    for s in subscribers {
        let s = s.await.unwrap()?;
        lat.extend(s.lat_ns);
        load.extend(s.load_ns);
    }
    sampling.store(false, Relaxed);
    lat.sort_unstable();
    load.sort_unstable();
    let delivered = sh.delivered.load(Relaxed) - d0;
    let sent = sh.sent.load(Relaxed) - s0;
    // Lost counts every phase: a QoS 1 delivery missing from the latency phases is a
    // finding as much as one missing here.
    let expected = sh.sent.load(Relaxed) * sc.subs as u64;
    let delivered_all = sh.delivered.load(Relaxed);
    if std::env::var_os("BENCH_DEBUG").is_some() {
        eprintln!(
            "debug {}: phase 3 sent {sent} delivered {delivered} (phases 1 and 2 sent {s0} delivered {d0})",
            sc.name
        );
        let at = |p| percentile(&lat, p);
        eprintln!(
            "debug {}: latency µs min {:.1} p10 {:.1} p25 {:.1} p50 {:.1} p75 {:.1} p90 {:.1} p99 {:.1}",
            sc.name,
            at(0.0),
            at(0.10),
            at(0.25),
            at(0.50),
            at(0.75),
            at(0.90),
            at(0.99)
        );
    }
    Ok(Outcome {
        deliveries_per_s: delivered as f64 / (last.max(pub_end) - t0).as_secs_f64(),
        publishes_per_s: sent as f64 / (pub_end - t0).as_secs_f64(),
        lost_pct: if expected > 0 {
            100.0 * (expected.saturating_sub(delivered_all)) as f64 / expected as f64
        } else {
            0.0
        },
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        load_p50_us: percentile(&load, 0.50),
        load_p99_us: percentile(&load, 0.99),
        peak_rss_kib: Some(peak.load(Relaxed)).filter(|&k| k > 0),
        error: None,
    })
}

/// `paced` on a target that is staged, within `limit` beyond its phase.
async fn pace(
    st: Option<&mut Stage>,
    sc: &Scenario,
    phase: Phase,
    first: Instant,
    until: Instant,
    limit: Duration,
) -> io::Result<()> {
    let Some(st) = st else { return Ok(()) };
    match timeout(limit + (until - first), paced(st, sc, phase, first, until)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::other(if phase == Phase::Loaded {
            "timed out in the latency-under-load phase"
        } else {
            "timed out in the latency phase"
        })),
    }
}

/// One round of a scenario on both targets, `order` first. The latency phases run
/// at once, the second target's publishes half a period after the first's, so that
/// both brokers meet the same moments of the machine (a noisy neighbour, a stolen
/// core) and p50 / p99 compare like with like; then, one target after the other,
/// its latency under load and its throughput. Under load the machine does not idle, so
/// the wake-from-halt that a paced phase's p99 mostly measures is not there, and a
/// broker's own cost per message is what shows.
async fn round(cfg: &Config, sc: &Scenario, order: [usize; 2], tag: &mut usize) -> [Outcome; 2] {
    let failed = |e: String| Outcome {
        error: Some(e),
        ..Default::default()
    };
    let limit = Duration::from_secs(30);
    let mut staged: [Option<Stage>; 2] = [None, None];
    let mut out: [Outcome; 2] = Default::default();
    for ti in order {
        *tag += 1;
        match timeout(limit, stage(&cfg.targets[ti], sc, *tag)).await {
            Ok(Ok(st)) => staged[ti] = Some(st),
            Ok(Err(e)) => out[ti] = failed(e.to_string()),
            Err(_) => out[ti] = failed("timed out connecting".into()),
        }
    }
    sleep(Duration::from_millis(200)).await; // let subscriptions settle
    let period = Duration::from_secs_f64(sc.pubs as f64 / sc.paced_rate);
    let first = Instant::now() + Duration::from_millis(20);
    let until = first + Duration::from_secs_f64(cfg.latency_secs);
    let shifts = if order[0] == 0 {
        [Duration::ZERO, period / 2]
    } else {
        [period / 2, Duration::ZERO]
    };
    let [a, b] = &mut staged;
    let (ra, rb) = tokio::join!(
        pace(
            a.as_mut(),
            sc,
            Phase::Paced,
            first + shifts[0],
            until + shifts[0],
            limit
        ),
        pace(
            b.as_mut(),
            sc,
            Phase::Paced,
            first + shifts[1],
            until + shifts[1],
            limit
        )
    );
    for (ti, r) in [(0, ra), (1, rb)] {
        if let Err(e) = r {
            staged[ti] = None;
            out[ti] = failed(e.to_string());
        }
    }
    for ti in order {
        let Some(mut st) = staged[ti].take() else {
            continue;
        };
        let first = Instant::now() + Duration::from_millis(20);
        let until = first + Duration::from_secs_f64(cfg.load_secs);
        if let Err(e) = pace(Some(&mut st), sc, Phase::Loaded, first, until, limit).await {
            out[ti] = failed(e.to_string());
            continue;
        }
        sleep(Duration::from_millis(100)).await;
        out[ti] = match timeout(
            limit + Duration::from_secs_f64(cfg.duration),
            flooded(st, sc, cfg),
        )
        .await
        {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => failed(e.to_string()),
            Err(_) => failed("timed out in the throughput phase".into()),
        };
        sleep(Duration::from_millis(300)).await;
    }
    out
}

// ---------------------------------------------------------------- channels (Sagüin only)

/// The append channel the generated saguin.yaml declares (type append, sqlite provider).
const LOG_FILTER: &str = "bench/log/#";
/// The queue channel the generated saguin.yaml declares, its filter bench/jobs/#.
const JOBS_QUEUE: &str = "bench-jobs";

/// One figure of a channel scenario.
#[derive(Default, Clone)]
struct ChanOutcome {
    rate: f64,
    /// what was sent and never acknowledged, or never delivered, in %
    lost_pct: f64,
    peak_rss_kib: Option<u64>,
    /// how many records or jobs the figure is over
    count: u64,
    error: Option<String>,
}

/// Samples the broker's VmRSS every 50 ms until the returned flag is cleared.
fn rss_sampler(pid: Option<u32>) -> (Arc<AtomicU64>, Arc<AtomicBool>) {
    let peak = Arc::new(AtomicU64::new(0));
    let on = Arc::new(AtomicBool::new(true));
    if let Some(pid) = pid {
        let (peak, on) = (peak.clone(), on.clone());
        tokio::spawn(async move {
            while on.load(Relaxed) {
                if let Some(r) = rss_kib(pid) {
                    peak.fetch_max(r, Relaxed);
                }
                sleep(Duration::from_millis(50)).await;
            }
        });
    }
    (peak, on)
}

/// `pubs` QoS 1 publishers into the append channel for `--duration` seconds, at most 32
/// unacknowledged each: PUBACKs per second (Sagüin sends one after the record is committed).
async fn append_publish(
    t: &Target,
    pubs: usize,
    cfg: &Config,
    tag: usize,
) -> io::Result<ChanOutcome> {
    let (peak, on) = rss_sampler(t.pid);
    let sh = Arc::new(Shared::default());
    let sc = Scenario {
        name: format!("append-{pubs}"),
        qos: 1,
        pubs,
        subs: 0, // no subscriber: no window, only the 32 in flight
        payload: 128,
        topic: format!("bench/log/r{tag}"),
        paced_rate: 0.0,
        loaded_rate: 0.0,
    };
    let mut conns = Vec::new();
    for i in 0..pubs {
        conns.push(connect(&t.addr, &format!("sb{tag}-a{i}"), KEEPALIVE).await?);
    }
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(cfg.duration);
    flood(conns, &sh, &sc, until, 500).await?;
    let took = t0.elapsed();
    on.store(false, Relaxed);
    let (sent, acked) = (sh.sent.load(Relaxed), sh.acked.load(Relaxed));
    t.appended.fetch_add(acked, Relaxed);
    Ok(ChanOutcome {
        rate: acked as f64 / took.as_secs_f64(),
        lost_pct: if sent > 0 {
            100.0 * sent.saturating_sub(acked) as f64 / sent as f64
        } else {
            0.0
        },
        peak_rss_kib: t.pid.map(|_| peak.load(Relaxed)),
        count: acked,
        error: (acked < sent)
            .then(|| format!("{} of {sent} publishes never acknowledged", sent - acked)),
    })
}

/// A new QoS 1 subscriber (3.1.1, clean session) to the whole append channel is replayed
/// everything in it from the retention floor: records per second, from SUBSCRIBE to the
/// last record. Stops at `expected` records, or after 3 s without one.
async fn append_replay(t: &Target, expected: u64, tag: usize) -> io::Result<ChanOutcome> {
    let (peak, on) = rss_sampler(t.pid);
    let (mut rd, mut w) = connect(&t.addr, &format!("sb{tag}-replay"), KEEPALIVE).await?;
    let t0 = Instant::now();
    w.write_all(&subscribe_packet(1, LOG_FILTER, 1)).await?;
    w.flush().await?;
    let (mut count, mut last, mut acks, mut granted) = (0u64, t0, Vec::new(), false);
    let cap = Instant::now() + Duration::from_secs(300);
    'read: loop {
        while let Some((h, s, e)) = rd.parse() {
            match h & 0xf0 {
                0x90 => {
                    if rd.buf[e - 1] & 0x80 != 0 {
                        return Err(io::Error::other(format!("SUBSCRIBE {LOG_FILTER} refused")));
                    }
                    granted = true;
                }
                0x30 => {
                    if (h >> 1) & 3 > 0 {
                        let tlen = u16::from_be_bytes([rd.buf[s], rd.buf[s + 1]]) as usize;
                        let p = s + 2 + tlen;
                        acks.extend_from_slice(&[0x40, 2, rd.buf[p], rd.buf[p + 1]]);
                    }
                    count += 1;
                    last = Instant::now();
                }
                _ => {}
            }
        }
        if !acks.is_empty() {
            w.write_all(&acks).await?;
            w.flush().await?;
            acks.clear();
        }
        if count >= expected && granted {
            break;
        }
        if Instant::now() >= cap {
            break;
        }
        match timeout(Duration::from_secs(3), rd.fill()).await {
            Ok(r) => r?,
            Err(_) => break 'read,
        }
    }
    on.store(false, Relaxed);
    let _ = w.write_all(&[0xe0, 0]).await;
    let _ = w.flush().await;
    if !granted {
        return Err(io::Error::other("no SUBACK"));
    }
    Ok(ChanOutcome {
        rate: count as f64 / (last - t0).as_secs_f64().max(1e-6),
        lost_pct: if expected > 0 {
            100.0 * expected.saturating_sub(count) as f64 / expected as f64
        } else {
            0.0
        },
        peak_rss_kib: t.pid.map(|_| peak.load(Relaxed)),
        count,
        error: (count < expected).then(|| format!("replayed {count} of {expected} records")),
    })
}

/// Publishes `jobs` jobs to the queue at QoS 1 (3.1.1, at most 32 unacknowledged),
/// returning when every one is acknowledged, i.e. stored.
async fn enqueue(t: &Target, jobs: u64, tag: usize) -> io::Result<()> {
    let (mut rd, mut w) = connect(&t.addr, &format!("sb{tag}-producer"), KEEPALIVE).await?;
    let (mut sent, mut acked, mut pkt) = (0u64, 0u64, Vec::new());
    while acked < jobs {
        while sent < jobs && sent - acked < 32 {
            sent += 1;
            pkt.clear();
            put_publish(
                &mut pkt,
                "bench/jobs/x",
                1,
                (sent % 65535 + 1) as u16,
                b"job",
            );
            w.write_all(&pkt).await?;
        }
        w.flush().await?;
        let (h, _, _) = timeout(Duration::from_secs(10), rd.next())
            .await
            .map_err(|_| {
                io::Error::other(format!("enqueue: no PUBACK for 10 s ({acked} of {jobs})"))
            })??;
        if h & 0xf0 == 0x40 {
            acked += 1;
        }
    }
    let _ = w.write_all(&[0xe0, 0]).await;
    let _ = w.flush().await;
    Ok(())
}

/// One MQTT 5 queue worker doing no work: for each offer, `ack` on its Response Topic with
/// its Correlation Data (QoS 0), then the PUBACK. Stops when `done` reaches `jobs`, or after
/// 10 s without an offer.
async fn worker(
    mut rd: Rd,
    mut w: Wr,
    done: Arc<AtomicU64>,
    end_ns: Arc<AtomicU64>,
    jobs: u64,
) -> io::Result<()> {
    let mut out = Vec::new();
    let mut idle_since = Instant::now();
    loop {
        while let Some((h, s, e)) = rd.parse() {
            if h & 0xf0 != 0x30 {
                continue;
            }
            let o = parse_publish_v5(h, &rd.buf[s..e])
                .ok_or_else(|| io::Error::other("malformed MQTT 5 PUBLISH"))?;
            let rt = o
                .response_topic
                .ok_or_else(|| io::Error::other("an offer without a Response Topic"))?;
            put_publish_v5(&mut out, &rt, 0, 0, &o.correlation, b"ack");
            if let Some(pid) = o.pid {
                out.extend_from_slice(&[0x40, 2]);
                out.extend_from_slice(&pid.to_be_bytes());
            }
            if done.fetch_add(1, Relaxed) + 1 >= jobs {
                end_ns.fetch_max(now_ns(), Relaxed);
            }
            idle_since = Instant::now();
        }
        if !out.is_empty() {
            w.write_all(&out).await?;
            w.flush().await?;
            out.clear();
        }
        if done.load(Relaxed) >= jobs {
            break;
        }
        if idle_since.elapsed() > Duration::from_secs(10) {
            break;
        }
        if let Ok(r) = timeout(Duration::from_millis(100), rd.fill()).await {
            r?;
        }
    }
    let _ = w.write_all(&[0xe0, 0]).await;
    let _ = w.flush().await;
    Ok(())
}

/// `jobs` jobs stored in the queue, then `workers` MQTT 5 workers drain them: jobs per
/// second from the workers' SUBSCRIBE to the last offer answered.
async fn queue_drain(t: &Target, workers: usize, jobs: u64, tag: usize) -> io::Result<ChanOutcome> {
    let (peak, on) = rss_sampler(t.pid);
    enqueue(t, jobs, tag).await?;
    let mut conns = Vec::new();
    for i in 0..workers {
        conns.push(connect_level(&t.addr, &format!("sb{tag}-w{i}"), KEEPALIVE, 5).await?);
    }
    let done = Arc::new(AtomicU64::new(0));
    let end_ns = Arc::new(AtomicU64::new(0));
    let t0 = now_ns();
    let mut handles = Vec::new();
    for (mut rd, mut w) in conns {
        w.write_all(&subscribe_packet_v5(
            1,
            &format!("$saguin/queue/{JOBS_QUEUE}"),
            1,
        ))
        .await?;
        w.flush().await?;
        // The SUBACK (MQTT 5: packet id, properties, reason codes) comes before any offer.
        let (h, _, e) = timeout(Duration::from_secs(10), rd.next())
            .await
            .map_err(|_| io::Error::other("no SUBACK within 10 s"))??;
        if h != 0x90 || rd.buf[e - 1] != 1 {
            return Err(io::Error::other(format!(
                "SUBSCRIBE $saguin/queue/{JOBS_QUEUE} not granted at QoS 1"
            )));
        }
        handles.push(tokio::spawn(worker(
            rd,
            w,
            done.clone(),
            end_ns.clone(),
            jobs,
        )));
    }
    for h in handles {
        h.await.map_err(io::Error::other)??;
    }
    on.store(false, Relaxed);
    let n = done.load(Relaxed);
    let end = if n >= jobs {
        end_ns.load(Relaxed)
    } else {
        now_ns()
    };
    let left = if n >= jobs {
        leftover(t, tag).await?
    } else {
        0
    };
    Ok(ChanOutcome {
        rate: n.min(jobs) as f64 / ((end - t0) as f64 / 1e9),
        lost_pct: 100.0 * jobs.saturating_sub(n) as f64 / jobs as f64,
        peak_rss_kib: t.pid.map(|_| peak.load(Relaxed)),
        count: n,
        error: if n < jobs {
            Some(format!(
                "{n} of {jobs} jobs offered, then 10 s without an offer"
            ))
        } else if left > 0 {
            Some(format!(
                "{left} jobs offered again after the drain: answers not taken"
            ))
        } else {
            None
        },
    })
}

/// After a drain the queue must be empty: a fresh worker is offered nothing within 500 ms.
/// (A job whose `ack` the broker had not taken would come back when its worker left.)
/// Whatever it is offered it answers, so the next run starts from an empty queue.
async fn leftover(t: &Target, tag: usize) -> io::Result<u64> {
    let (mut rd, mut w) = connect_level(&t.addr, &format!("sb{tag}-check"), KEEPALIVE, 5).await?;
    w.write_all(&subscribe_packet_v5(
        1,
        &format!("$saguin/queue/{JOBS_QUEUE}"),
        1,
    ))
    .await?;
    w.flush().await?;
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(500);
    let mut out = Vec::new();
    let mut last = Instant::now();
    loop {
        while let Some((h, s, e)) = rd.parse() {
            if h & 0xf0 == 0x90 && rd.buf[e - 1] != 1 {
                return Err(io::Error::other(
                    "check worker's SUBSCRIBE not granted at QoS 1",
                ));
            }
            if h & 0xf0 != 0x30 {
                continue;
            }
            let o = parse_publish_v5(h, &rd.buf[s..e])
                .ok_or_else(|| io::Error::other("malformed MQTT 5 PUBLISH"))?;
            if let Some(rt) = o.response_topic {
                put_publish_v5(&mut out, &rt, 0, 0, &o.correlation, b"ack");
            }
            if let Some(pid) = o.pid {
                out.extend_from_slice(&[0x40, 2]);
                out.extend_from_slice(&pid.to_be_bytes());
            }
            done.fetch_add(1, Relaxed);
            last = Instant::now();
        }
        if !out.is_empty() {
            w.write_all(&out).await?;
            w.flush().await?;
            out.clear();
        }
        // 500 ms of nothing at the start; once something arrived, until 500 ms of quiet (at most 30 s).
        let quiet = Instant::now() >= deadline && last.elapsed() > Duration::from_millis(500);
        if quiet || start.elapsed() > Duration::from_secs(30) {
            break;
        }
        if let Ok(r) = timeout(Duration::from_millis(100), rd.fill()).await {
            r?;
        }
    }
    let _ = w.write_all(&[0xe0, 0]).await;
    let _ = w.flush().await;
    Ok(done.load(Relaxed))
}

fn median_chan(runs: &[ChanOutcome]) -> ChanOutcome {
    if let Some(e) = runs.iter().find(|o| o.error.is_some()) {
        return e.clone();
    }
    let mut v = runs.to_vec();
    v.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    v[v.len() / 2].clone()
}

/// What a broker does with `--idle` connections open and nothing to carry.
struct Idle {
    /// VmRSS with them open.
    rss_kib: Option<u64>,
    /// Handshakes a second while opening them.
    rate: f64,
    /// Context switches a second, every thread of the broker, over [`IDLE_WAKE_WINDOW`]:
    /// how often an idle broker wakes a gateway's CPU.
    wakeups: Option<f64>,
    error: Option<String>,
}

/// How long the idle connections' broker is watched for wake-ups.
const IDLE_WAKE_WINDOW: Duration = Duration::from_secs(5);

async fn idle_connections(t: &Target, n: usize, tag: usize) -> Idle {
    let start = Instant::now();
    let mut conns = Vec::with_capacity(n);
    let mut err = None;
    // 50 handshakes at a time.
    let mut i = 0;
    while i < n {
        let batch: Vec<_> = (i..(i + 50).min(n))
            .map(|k| {
                let addr = t.addr.clone();
                tokio::spawn(
                    async move { connect(&addr, &format!("sb{tag}-idle{k}"), KEEPALIVE).await },
                )
            })
            .collect();
        for b in batch {
            match b.await.unwrap() {
                Ok(c) => conns.push(c),
                Err(e) => err = Some(e.to_string()),
            }
        }
        i += 50;
    }
    let rate = conns.len() as f64 / start.elapsed().as_secs_f64();
    sleep(Duration::from_secs(1)).await;
    let rss_kib = t.pid.and_then(rss_kib);
    // Keep Alive is 60 s: nobody pings within the window.
    let switched = t.pid.and_then(context_switches);
    sleep(IDLE_WAKE_WINDOW).await;
    let wakeups = t
        .pid
        .and_then(context_switches)
        .zip(switched)
        .map(|(after, before)| {
            after.saturating_sub(before) as f64 / IDLE_WAKE_WINDOW.as_secs_f64()
        });
    if conns.len() < n {
        err = Some(format!(
            "{} of {n} connected: {}",
            conns.len(),
            err.unwrap_or_default()
        ));
    }
    for (_, mut w) in conns {
        let _ = w.write_all(&[0xe0, 0]).await;
        let _ = w.flush().await;
    }
    sleep(Duration::from_millis(500)).await;
    Idle {
        rss_kib,
        rate,
        wakeups,
        error: err,
    }
}

/// Voluntary and involuntary context switches of every thread of `pid` so far.
fn context_switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let switches = tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum();
    Some(switches)
}

// ---------------------------------------------------------------- command line, report

struct Target {
    name: String,
    addr: String,
    pid: Option<u32>,
    /// records acknowledged into the append channel so far (what a replay should return)
    appended: AtomicU64,
}

struct Config {
    targets: Vec<Target>,
    duration: f64,
    latency_secs: f64,
    /// the latency-under-load phase, per target
    load_secs: f64,
    idle: usize,
    rounds: usize,
    /// jobs per queue-drain run
    jobs: u64,
    only: Option<String>,
    out: Option<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: saguin-bench --target NAME=HOST:PORT[,PID] --target NAME=HOST:PORT[,PID]\n\
         \x20      [--duration SECS] [--latency-secs SECS] [--load-secs SECS] [--idle N] [--rounds N] [--jobs N] [--only SUBSTR] [--out FILE]\n\
         Ratios are first target / second target. Loopback addresses only."
    );
    std::process::exit(2)
}

fn parse_args() -> Config {
    let mut c = Config {
        targets: vec![],
        duration: 3.0,
        latency_secs: 4.0,
        load_secs: 2.0,
        idle: 1000,
        rounds: 1,
        jobs: 3000,
        only: None,
        out: None,
    };
    let mut a = std::env::args().skip(1);
    while let Some(k) = a.next() {
        let mut v = || a.next().unwrap_or_else(|| usage());
        match k.as_str() {
            "--target" => {
                let v = v();
                let (name, rest) = v.split_once('=').unwrap_or_else(|| usage());
                let (addr, pid) = match rest.split_once(',') {
                    Some((a, p)) => (a, Some(p.parse().unwrap_or_else(|_| usage()))),
                    None => (rest, None),
                };
                let host = addr.rsplit_once(':').map(|x| x.0).unwrap_or("");
                if !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
                    eprintln!("saguin-bench: {addr} is not a loopback address");
                    std::process::exit(2);
                }
                c.targets.push(Target {
                    name: name.into(),
                    addr: addr.into(),
                    pid,
                    appended: AtomicU64::new(0),
                });
            }
            "--duration" => c.duration = v().parse().unwrap_or_else(|_| usage()),
            "--latency-secs" => c.latency_secs = v().parse().unwrap_or_else(|_| usage()),
            "--load-secs" => c.load_secs = v().parse().unwrap_or_else(|_| usage()),
            "--idle" => c.idle = v().parse().unwrap_or_else(|_| usage()),
            "--rounds" => c.rounds = v().parse::<usize>().unwrap_or_else(|_| usage()).max(1),
            "--jobs" => c.jobs = v().parse::<u64>().unwrap_or_else(|_| usage()).max(1),
            "--only" => c.only = Some(v()),
            "--out" => c.out = Some(v()),
            _ => usage(),
        }
    }
    if c.targets.len() != 2 {
        usage()
    }
    c
}

fn scenarios() -> Vec<Scenario> {
    let mut v = Vec::new();
    for qos in [0u8, 1] {
        for (payload, plabel) in [(128usize, "128B"), (16 * 1024, "16KiB")] {
            // Paced rates per target: the two targets' latency phases run at once, so
            // 1to1 and 8to1 are 1,000 publishes a second in all; each target's period
            // (publishers / rate) is a whole even number of milliseconds, so that the
            // halves tokio's 1 ms timer can tell apart interleave them. Under load, one
            // target at a time: 20,000 deliveries a second of 128 bytes, 10,000 of 16 KiB
            // (40,000 and 20,000 for 1to100), at most half of the slowest row's
            // throughput on either broker, so the load is never a backlog.
            let per_s = if payload == 128 { 20_000.0 } else { 10_000.0 };
            for (pubs, subs, shape, rate, loaded) in [
                (1, 1, "1to1", 500.0, per_s),
                (8, 1, "8to1", 500.0, per_s),
                (1, 100, "1to100", 100.0, per_s / 50.0),
            ] {
                v.push(Scenario {
                    name: format!("qos{qos}-{shape}-{plabel}"),
                    qos,
                    pubs,
                    subs,
                    payload,
                    topic: format!("bench/qos{qos}-{shape}-{plabel}"),
                    paced_rate: rate,
                    loaded_rate: loaded,
                });
            }
        }
    }
    v
}

/// Each figure the median of the rounds; an error in any round is the outcome.
fn median(runs: &[Outcome]) -> Outcome {
    if let Some(e) = runs.iter().find(|o| o.error.is_some()) {
        return e.clone();
    }
    let med = |f: &dyn Fn(&Outcome) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    Outcome {
        deliveries_per_s: med(&|o| o.deliveries_per_s),
        publishes_per_s: med(&|o| o.publishes_per_s),
        lost_pct: med(&|o| o.lost_pct),
        p50_us: med(&|o| o.p50_us),
        p99_us: med(&|o| o.p99_us),
        load_p50_us: med(&|o| o.load_p50_us),
        load_p99_us: med(&|o| o.load_p99_us),
        peak_rss_kib: runs[0]
            .peak_rss_kib
            .map(|_| med(&|o| o.peak_rss_kib.unwrap_or(0) as f64) as u64),
        error: None,
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "n/a".into()
    }
}

fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x >= 100.0 {
        format!("{:.0}", x)
    } else {
        format!("{:.1}", x)
    }
}

fn mib(k: Option<u64>) -> f64 {
    k.map(|k| k as f64 / 1024.0).unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    now_ns();
    let cfg = parse_args();
    let (a, b) = (&cfg.targets[0], &cfg.targets[1]);
    let mut md = String::new();
    md.push_str(&format!(
        "Ratios are {} / {}; each figure is the median of {} round(s). Throughput: deliveries/s summed over subscribers, publishers at most a window ahead \
         ({}s). Latency: one-way publish→delivery at a paced rate (500 msgs/s a broker for 1to1 and 8to1, 100 msgs/s \
         for 1to100; {}s), both brokers at once, one's publishes half a period after the other's; \
         under load (second table): the same at 20,000 deliveries/s of 128 B or 10,000 of 16 KiB (twice that for 1to100), \
         one broker at a time, measured from each publish's actual send time. RSS: broker's peak VmRSS during the scenario. MQTT 3.1.1, clean sessions, TCP_NODELAY. \
         Channel rows (Sagüin only): append = QoS 1 publishers, 32 unacknowledged each, into an append channel on sqlite \
         ({}s), then one new QoS 1 subscriber replayed all of it; queue = {} jobs stored, then MQTT 5 workers answer `ack` \
         and PUBACK each offer, from SUBSCRIBE to the last answer; the lost column there is unacknowledged or undelivered %.\n\n",
        a.name, b.name, cfg.rounds, cfg.duration, cfg.latency_secs, cfg.duration, cfg.jobs
    ));
    md.push_str(&format!(
        "| scenario | {a} msgs/s | {b} msgs/s | ratio | {a} p50 µs | {b} p50 µs | ratio | {a} p99 µs | {b} p99 µs | ratio | {a} RSS MiB | {b} RSS MiB | ratio | lost % ({a}/{b}) |\n",
        a = a.name,
        b = b.name
    ));
    md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");

    let idle_a = a.pid.and_then(rss_kib);
    let idle_b = b.pid.and_then(rss_kib);
    let mut results: BTreeMap<usize, (Outcome, Outcome)> = BTreeMap::new();
    // Latency under load: a table of its own after the main one.
    let mut load_md = format!(
        "\n| latency under load, one broker at a time ({}s) | deliveries/s | {a} p50 µs | {b} p50 µs | ratio | {a} p99 µs | {b} p99 µs | ratio |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
        cfg.load_secs,
        a = a.name,
        b = b.name
    );
    let list = scenarios();
    let mut tag = 0;
    for (i, sc) in list.iter().enumerate() {
        if cfg
            .only
            .as_ref()
            .is_some_and(|o| !sc.name.contains(o.as_str()))
        {
            continue;
        }
        let mut runs: [Vec<Outcome>; 2] = [Vec::new(), Vec::new()];
        for r in 0..cfg.rounds {
            let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
            let outcomes = round(&cfg, sc, order, &mut tag).await;
            for (ti, o) in outcomes.into_iter().enumerate() {
                eprintln!(
                    "{:<22} {:<12} {:>10.0} deliveries/s  {:>9.0} publishes/s  lost {:>5.2}%  p50 {:>8.1} µs  p99 {:>8.1} µs  under load p50 {:>8.1} µs  p99 {:>8.1} µs  peak RSS {:>6.1} MiB{}",
                    sc.name,
                    cfg.targets[ti].name,
                    o.deliveries_per_s,
                    o.publishes_per_s,
                    o.lost_pct,
                    o.p50_us,
                    o.p99_us,
                    o.load_p50_us,
                    o.load_p99_us,
                    mib(o.peak_rss_kib),
                    o.error
                        .as_ref()
                        .map(|e| format!("  ERROR {e}"))
                        .unwrap_or_default()
                );
                runs[ti].push(o);
            }
        }
        let pair = [median(&runs[0]), median(&runs[1])];
        let (oa, ob) = (pair[0].clone(), pair[1].clone());
        let cell = |o: &Outcome, x: f64| {
            if o.error.is_some() {
                "error".to_string()
            } else {
                fmt_num(x)
            }
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2}/{:.2} |\n",
            sc.name,
            cell(&oa, oa.deliveries_per_s),
            cell(&ob, ob.deliveries_per_s),
            ratio(oa.deliveries_per_s, ob.deliveries_per_s),
            cell(&oa, oa.p50_us),
            cell(&ob, ob.p50_us),
            ratio(oa.p50_us, ob.p50_us),
            cell(&oa, oa.p99_us),
            cell(&ob, ob.p99_us),
            ratio(oa.p99_us, ob.p99_us),
            fmt_num(mib(oa.peak_rss_kib)),
            fmt_num(mib(ob.peak_rss_kib)),
            ratio(mib(oa.peak_rss_kib), mib(ob.peak_rss_kib)),
            oa.lost_pct,
            ob.lost_pct
        ));
        load_md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            sc.name,
            fmt_num(sc.loaded_rate * sc.subs as f64),
            cell(&oa, oa.load_p50_us),
            cell(&ob, ob.load_p50_us),
            ratio(oa.load_p50_us, ob.load_p50_us),
            cell(&oa, oa.load_p99_us),
            cell(&ob, ob.load_p99_us),
            ratio(oa.load_p99_us, ob.load_p99_us),
        ));
        results.insert(i, (oa, ob));
    }
    // Idle connections right after the broadcast rows, which both brokers ran: the
    // channel rows below are Sagüin's alone, and what their storage keeps in the heap
    // would be charged to its idle connections.
    let mut idle_row = String::new();
    let mut wakeup_md = String::new();
    if cfg.idle > 0 {
        tag += 1;
        let ia = idle_connections(a, cfg.idle, tag).await;
        tag += 1;
        let ib = idle_connections(b, cfg.idle, tag).await;
        for (n, e) in [(&a.name, &ia.error), (&b.name, &ib.error)] {
            if let Some(e) = e {
                eprintln!("idle connections on {n}: {e}");
            }
        }
        let flag = |i: &Idle| if i.error.is_some() { " (error)" } else { "" };
        let per_s = |i: &Idle| i.wakeups.unwrap_or(f64::NAN);
        idle_row = format!(
            "| {} idle connections | {}{} | {}{} | {} | {:.0} | {:.0} |\n",
            cfg.idle,
            fmt_num(mib(ia.rss_kib)),
            flag(&ia),
            fmt_num(mib(ib.rss_kib)),
            flag(&ib),
            ratio(mib(ia.rss_kib), mib(ib.rss_kib)),
            ia.rate,
            ib.rate
        );
        wakeup_md = format!(
            "\n| idle, {} connections, {} s | {a} wake-ups/s | {b} wake-ups/s | ratio |\n|---|---:|---:|---:|\n\
             | context switches, every thread | {} | {} | {} |\n",
            cfg.idle,
            IDLE_WAKE_WINDOW.as_secs(),
            fmt_num(per_s(&ia)),
            fmt_num(per_s(&ib)),
            ratio(per_s(&ia), per_s(&ib)),
            a = a.name,
            b = b.name
        );
    }
    // Channels: Sagüin only (mosquitto has none), so a target not named saguin… is n/a.
    // --only: a substring of a row's name, or a row name of which the family is a prefix.
    let wanted = |name: &str| {
        cfg.only
            .as_ref()
            .is_none_or(|o| name.contains(o.as_str()) || o.starts_with(name))
    };
    let is_saguin = |t: &Target| t.name.starts_with("saguin");
    let why = if is_saguin(a) || is_saguin(b) {
        "Sagüin only: mosquitto has no channels"
    } else {
        "Sagüin only: not measured in a self-check"
    };
    let mut chan_failed = false;
    let chan_row = |md: &mut String, label: String, unit: &str, o: [Option<ChanOutcome>; 2]| {
        let cell = |o: &Option<ChanOutcome>| match o {
            None => "n/a".to_string(),
            Some(o) if o.error.is_some() => "error".to_string(),
            Some(o) => fmt_num(o.rate),
        };
        let rss = |o: &Option<ChanOutcome>| fmt_num(mib(o.as_ref().and_then(|o| o.peak_rss_kib)));
        let lost = |o: &Option<ChanOutcome>| {
            o.as_ref()
                .map(|o| format!("{:.2}", o.lost_pct))
                .unwrap_or("n/a".into())
        };
        md.push_str(&format!(
            "| {label}, {unit} ({why}) | {} | {} | n/a | n/a | n/a | n/a | n/a | n/a | n/a | {} | {} | n/a | {}/{} |\n",
            cell(&o[0]),
            cell(&o[1]),
            rss(&o[0]),
            rss(&o[1]),
            lost(&o[0]),
            lost(&o[1])
        ));
    };
    let chan_timeout = Duration::from_secs_f64(cfg.duration + 120.0);
    // Runs `f` on each saguin target, `rounds` times, the median kept; errors reported.
    macro_rules! per_target {
        ($name:expr, |$t:ident, $tag:ident| $body:expr) => {{
            let mut out: [Option<ChanOutcome>; 2] = [None, None];
            for (ti, $t) in cfg.targets.iter().enumerate() {
                if !is_saguin($t) {
                    continue;
                }
                let mut runs = Vec::new();
                for _ in 0..cfg.rounds {
                    tag += 1;
                    let $tag = tag;
                    let o = match timeout(chan_timeout, $body).await {
                        Ok(Ok(o)) => o,
                        Ok(Err(e)) => ChanOutcome {
                            error: Some(e.to_string()),
                            ..Default::default()
                        },
                        Err(_) => ChanOutcome {
                            error: Some("timed out".into()),
                            ..Default::default()
                        },
                    };
                    eprintln!(
                        "{:<22} {:<12} {:>10.0} /s over {} (lost {:.2}%, peak RSS {:.1} MiB){}",
                        $name,
                        $t.name,
                        o.rate,
                        o.count,
                        o.lost_pct,
                        mib(o.peak_rss_kib),
                        o.error
                            .as_ref()
                            .map(|e| format!("  ERROR {e}"))
                            .unwrap_or_default()
                    );
                    runs.push(o);
                    sleep(Duration::from_millis(300)).await;
                }
                let m = median_chan(&runs);
                chan_failed |= m.error.is_some();
                out[ti] = Some(m);
            }
            out
        }};
    }
    if wanted("append-qos1-sqlite") {
        for pubs in [1usize, 8] {
            let name = format!("append-qos1-sqlite-{pubs}pub-128B");
            let o = per_target!(name, |t, tg| append_publish(t, pubs, &cfg, tg));
            chan_row(&mut md, name, "PUBACKs/s (acknowledged after commit)", o);
        }
        // Everything acknowledged above, on every round, is in the log (retention none).
        let o = per_target!("append-qos1-sqlite-replay", |t, tg| append_replay(
            t,
            t.appended.load(Relaxed),
            tg
        ));
        let n = o.iter().flatten().map(|o| o.count).max().unwrap_or(0);
        let what = if n > 0 {
            format!("{n} records")
        } else {
            "the records written".into()
        };
        chan_row(
            &mut md,
            format!("append-qos1-sqlite-replay of {what} to 1 QoS 1 subscriber"),
            "records/s",
            o,
        );
    }
    if wanted("queue-drain") {
        for workers in [1usize, 4] {
            let name = format!(
                "queue-drain-{workers}worker{}",
                if workers > 1 { "s" } else { "" }
            );
            if !wanted(&name) {
                continue;
            }
            let o = per_target!(name, |t, tg| queue_drain(t, workers, cfg.jobs, tg));
            chan_row(&mut md, format!("{name} of {} jobs", cfg.jobs), "jobs/s", o);
        }
    }

    if !results.is_empty() {
        md.push_str(&load_md);
    }
    md.push_str(&format!(
        "\n| broker RSS | {a} MiB | {b} MiB | ratio | {a} conn/s | {b} conn/s |\n|---|---:|---:|---:|---:|---:|\n",
        a = a.name,
        b = b.name
    ));
    md.push_str(&format!(
        "| idle, at start | {} | {} | {} | | |\n",
        fmt_num(mib(idle_a)),
        fmt_num(mib(idle_b)),
        ratio(mib(idle_a), mib(idle_b))
    ));
    md.push_str(&idle_row);
    md.push_str(&wakeup_md);
    println!("{md}");
    if let Some(path) = &cfg.out {
        std::fs::write(path, &md).expect("write --out");
    }
    let failed = chan_failed
        || results
            .values()
            .any(|(x, y)| x.error.is_some() || y.error.is_some());
    std::process::exit(if failed { 1 } else { 0 });
}
