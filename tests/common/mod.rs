//! Test support: start the real `saguin` binary on a configuration of the test's own,
//! and talk to it over loopback with raw packets.
#![allow(dead_code)]

pub mod proxy;
pub mod sessions;
pub mod tls;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use saguin::codec::{self, Packet, ProtocolVersion};

/// How long any single wait in a test may take before it fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// Polls `done` until it holds, failing with `what` past [`WAIT`]: for what the broker
/// does on its own time (a sweep, a tick, a write), watched rather than slept on.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long a broker may take to start: longer on ARM, where CI runs the suite under
/// qemu-user and seven emulated brokers starting at once translate a debug binary.
const START_WAIT: Duration = if cfg!(target_arch = "arm") {
    Duration::from_secs(30)
} else {
    WAIT
};

/// A running broker process, killed when dropped.
pub struct Broker {
    child: Child,
    /// The MQTT listener's address.
    pub addr: SocketAddr,
    /// The directory holding its configuration.
    pub dir: PathBuf,
    /// What it logged before its first listener (at most 200 lines).
    pub startup: Vec<String>,
    log: mpsc::Receiver<String>,
}

/// A directory of the test's own under the system temp dir.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "saguin-test-{}-{name}-{}",
        std::process::id(),
        nanos()
    ));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    dir
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The smallest configuration: a memory provider and one TCP listener on an ephemeral
/// loopback port, with `extra` appended after `broker.mqtt.listen` (indent it by two
/// spaces for a key of `broker`, four for one of `broker.mqtt`).
pub fn config(extra: &str) -> String {
    let storage = "  storage:
    default: mem
    default_retention_period: none
    default_retention_bytes: none
    providers:
      mem:
        type: memory
        max_bytes: 64MiB
        snapshot_dir: none
";
    format!(
        "broker:\n  id: test\n  log_level: debug\n{storage}  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n{extra}"
    )
}

impl Broker {
    /// Starts the broker on `config(extra)`.
    pub fn start(extra: &str) -> Broker {
        Broker::start_with(&config(extra))
    }

    /// Starts the broker on a whole configuration file's text.
    pub fn start_with(yaml: &str) -> Broker {
        Broker::start_in(temp_dir("broker"), yaml)
    }

    /// Starts the broker with its configuration in `dir`; `{dir}` in `yaml` is
    /// replaced by the directory, for storage paths.
    pub fn start_in(dir: PathBuf, yaml: &str) -> Broker {
        Broker::start_under(dir, yaml, None)
    }

    /// Starts the broker through `bash -c WRAPPER`, where the wrapper ends with
    /// `exec ... "$@"` (a resource limit, say); `None` starts it directly.
    pub fn start_under(dir: PathBuf, yaml: &str, wrapper: Option<&str>) -> Broker {
        let yaml = yaml.replace("{dir}", &dir.display().to_string());
        let path = dir.join("saguin.yaml");
        std::fs::write(&path, yaml).expect("write the configuration");
        let mut command = match wrapper {
            Some(wrapper) => {
                let mut c = Command::new("bash");
                c.args(["-c", wrapper, "saguin", env!("CARGO_BIN_EXE_saguin")]);
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_saguin")),
        };
        let mut child = command
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start saguin");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if std::env::var_os("SAGUIN_TEST_LOG").is_some() {
                    eprintln!("[broker] {line}");
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + START_WAIT;
        let mut seen = Vec::new();
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = log.recv_timeout(left).unwrap_or_else(|e| {
                let _ = child.kill();
                panic!(
                    "the broker did not report a listener within {START_WAIT:?} ({e}); \
                     it printed:\n{}",
                    seen.join("\n")
                )
            });
            if seen.len() < 200 {
                seen.push(line.clone());
            }
            if let Some(addr) = line.split("listening on ").nth(1) {
                break addr.trim().parse().expect("a socket address");
            }
        };
        Broker {
            child,
            addr,
            dir,
            startup: seen,
            log,
        }
    }

    /// Waits for a log line containing `needle`.
    pub fn wait_log(&self, needle: &str) -> String {
        self.wait_log_for(needle, WAIT)
    }

    /// Waits up to `wait` for a log line containing `needle`: for a line that comes
    /// after a deadline of the broker's own, which [`WAIT`] must not race.
    pub fn wait_log_for(&self, needle: &str, wait: Duration) -> String {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no log line containing {needle:?} within {wait:?}"),
            }
        }
    }

    /// Waits for a log line containing `needle`; every line up to it, it included.
    pub fn wait_log_lines(&self, needle: &str) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    lines.push(line);
                    if found {
                        return lines;
                    }
                }
                Err(_) => panic!("no log line containing {needle:?} within {WAIT:?}"),
            }
        }
    }

    /// The operations listener's TCP address, from the line logged at startup (read
    /// before any other `wait_log`, which passes over the lines before its own).
    pub fn ops_addr(&self) -> String {
        let line = self.wait_log("operations listening on http://");
        line.split("http://")
            .nth(1)
            .expect("address")
            .trim()
            .to_string()
    }

    /// Whether `/metrics` on the operations listener's Unix socket `ops.sock` in the
    /// broker's directory has the exact line `line`; panics showing the body if not.
    pub fn assert_metric(&self, line: &str) {
        let (status, body) = http_get(self.ops_socket(), "/metrics");
        assert_eq!(status, 200);
        assert!(body.lines().any(|l| l == line), "no {line:?} in {body}");
    }

    /// A connection to the operations listener's Unix socket `ops.sock` in the
    /// broker's directory, its reads bounded by [`WAIT`].
    pub fn ops_socket(&self) -> std::os::unix::net::UnixStream {
        let ops = std::os::unix::net::UnixStream::connect(self.dir.join("ops.sock"))
            .expect("the ops socket");
        ops.set_read_timeout(Some(WAIT)).expect("read timeout");
        ops
    }

    /// Sends a signal to the broker process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal}");
    }

    /// Waits for the process to exit, returning its exit status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the broker did not exit within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Broker {
    /// Stops the broker gracefully (SIGTERM) and keeps its directory, for a restart.
    pub fn stop(mut self) -> PathBuf {
        self.signal("TERM");
        assert!(self.wait_exit().success(), "the broker exits 0 on SIGTERM");
        let dir = self.dir.clone();
        self.dir = PathBuf::new();
        dir
    }
}

impl Broker {
    /// Keeps the directory of a broker that was killed, for a restart.
    pub fn stop_killed(mut self) -> PathBuf {
        let dir = self.dir.clone();
        self.dir = PathBuf::new();
        dir
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs the broker on `yaml` (written into `dir`) expecting it to refuse to start;
/// returns everything it printed.
pub fn refused_at_startup(dir: &std::path::Path, yaml: &str) -> String {
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, yaml).expect("write the configuration");
    // Bounded: a broker that starts after all serves until it is killed.
    let out = run_saguin(&["--config".as_ref(), path.as_os_str()]);
    assert!(
        !out.status.success(),
        "the broker started: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs the `saguin` binary with `args` to its end, within [`WAIT`] (killed and
/// failed past it); its exit status and everything it printed.
pub fn run_saguin<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    let child = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run saguin");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(WAIT) {
        Ok(out) => out.expect("saguin's output"),
        Err(_) => {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
            panic!("saguin did not exit within {WAIT:?}");
        }
    }
}

/// A client speaking raw bytes, decoding what comes back with the crate's codec.
pub struct Raw {
    pub stream: TcpStream,
    protocol: ProtocolVersion,
    buf: Vec<u8>,
}

impl Raw {
    /// Opens a TCP connection.
    pub fn open(addr: SocketAddr, protocol: ProtocolVersion) -> Raw {
        Raw::on(
            TcpStream::connect_timeout(&addr, WAIT).expect("connect"),
            protocol,
        )
    }

    /// Speaks over `stream`: one the test opened, or one it accepted, as a broker
    /// would (a bridge's peer played by the test).
    pub fn on(stream: TcpStream, protocol: ProtocolVersion) -> Raw {
        stream.set_read_timeout(Some(WAIT)).expect("read timeout");
        stream.set_nodelay(true).expect("nodelay");
        Raw {
            stream,
            protocol,
            buf: Vec::new(),
        }
    }

    /// Sends bytes as they are.
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Sends a packet, saying whether the write went through (the peer may be gone).
    pub fn try_send(&mut self, packet: &Packet) -> bool {
        let mut out = Vec::new();
        codec::encode(packet, self.protocol, &mut out);
        self.stream.write_all(&out).is_ok()
    }

    /// Sends a packet encoded by the codec.
    pub fn send(&mut self, packet: &Packet) {
        let mut out = Vec::new();
        codec::encode(packet, self.protocol, &mut out);
        self.send_bytes(&out);
    }

    /// Reads one packet, failing the test after `WAIT`.
    pub fn recv(&mut self) -> Packet {
        self.try_recv()
            .unwrap_or_else(|e| panic!("expected a packet: {e}"))
    }

    /// Reads one packet, or says why none came (closed, timed out).
    pub fn try_recv(&mut self) -> Result<Packet, String> {
        loop {
            if let Some(header) = codec::read_fixed_header(&self.buf).map_err(|e| e.to_string())? {
                let total = header.header_len + header.remaining_length;
                if self.buf.len() >= total {
                    let packet = codec::decode(
                        header.first_byte,
                        &self.buf[header.header_len..total],
                        self.protocol,
                    )
                    .map_err(|e| e.to_string());
                    self.buf.drain(..total);
                    return packet;
                }
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("closed".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                // A signal to the test process; a socket with a read timeout is not
                // restarted by the kernel (signal(7)), so read again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // "read:" is a read that timed out: nothing came. A reset is not
                // "nothing", and says so.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(format!("read: {e}"));
                }
                Err(e) => return Err(format!("failed: {e}")),
            }
        }
    }

    /// Reads the raw bytes that arrive until the broker closes the connection (a
    /// reset included); panics if it is still open after [`WAIT`].
    pub fn read_to_close(&mut self) -> Vec<u8> {
        let mut all = std::mem::take(&mut self.buf);
        match self.stream.read_to_end(&mut all) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("the connection was not closed within {WAIT:?}; read {all:02X?}")
            }
            Ok(_) | Err(_) => all,
        }
    }

    /// Asserts the broker closes the connection, with nothing more sent.
    pub fn expect_closed_silently(&mut self) {
        let rest = self.read_to_close();
        assert!(rest.is_empty(), "expected a silent close, got {rest:02X?}");
    }

    /// The next packet within `wait`, or why there was none.
    pub fn expect_nothing_or_packet(&mut self, wait: Duration) -> Result<Packet, String> {
        self.stream
            .set_read_timeout(Some(wait))
            .expect("read timeout");
        let got = self.try_recv();
        self.stream
            .set_read_timeout(Some(WAIT))
            .expect("read timeout");
        got
    }

    /// Asserts nothing arrives within `wait`.
    pub fn expect_nothing(&mut self, wait: Duration) {
        self.stream
            .set_read_timeout(Some(wait))
            .expect("read timeout");
        let got = self.try_recv();
        self.stream
            .set_read_timeout(Some(WAIT))
            .expect("read timeout");
        match got {
            Err(e) if e.contains("read:") => {}
            other => panic!("expected nothing, got {other:?}"),
        }
    }
}

/// A CONNECT with the given protocol, client id and Clean Start, keepalive 60.
pub fn connect(protocol: ProtocolVersion, client_id: &str, clean_start: bool) -> codec::Connect {
    codec::Connect {
        protocol,
        clean_start,
        keep_alive: 60,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
        properties: codec::Properties::default(),
    }
}

impl Raw {
    /// Connects, sends `connect` and returns the CONNACK.
    pub fn handshake(addr: SocketAddr, connect: codec::Connect) -> (Raw, codec::ConnAck) {
        let mut raw = Raw::open(addr, connect.protocol);
        raw.send(&Packet::Connect(Box::new(connect)));
        match raw.recv() {
            Packet::ConnAck(ack) => (raw, ack),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    /// Connects and expects success.
    pub fn connected(addr: SocketAddr, protocol: ProtocolVersion, client_id: &str) -> Raw {
        let (raw, ack) = Raw::handshake(addr, connect(protocol, client_id, true));
        assert_eq!(ack.code, 0, "CONNACK {ack:?}");
        raw
    }

    /// Subscribes to one filter and returns the SUBACK's codes.
    pub fn subscribe(&mut self, filter: &str, options: codec::SubscriptionOptions) -> Vec<u8> {
        self.subscribe_with(filter, options, codec::Properties::default())
    }

    /// Subscribes with SUBSCRIBE properties.
    pub fn subscribe_with(
        &mut self,
        filter: &str,
        options: codec::SubscriptionOptions,
        properties: codec::Properties,
    ) -> Vec<u8> {
        self.send(&Packet::Subscribe(codec::Subscribe {
            packet_id: 1,
            properties,
            filters: vec![(filter.into(), options)],
        }));
        match self.recv() {
            Packet::SubAck(ack) => ack.codes,
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    /// Publishes and returns the PUBACK / PUBREC reason code (None at QoS 0).
    pub fn publish(
        &mut self,
        topic: &str,
        payload: &[u8],
        qos: codec::QoS,
        retain: bool,
    ) -> Option<u8> {
        self.publish_packet(publish(topic, payload, qos, retain))
    }

    /// Sends a PUBLISH and returns the acknowledgement's reason code (None at QoS 0).
    pub fn publish_packet(&mut self, packet: codec::Publish) -> Option<u8> {
        let qos = packet.qos;
        self.send(&Packet::Publish(packet));
        match qos {
            codec::QoS::AtMostOnce => None,
            codec::QoS::AtLeastOnce => match self.recv() {
                Packet::PubAck(ack) => Some(ack.code),
                other => panic!("expected PUBACK, got {other:?}"),
            },
            codec::QoS::ExactlyOnce => match self.recv() {
                Packet::PubRec(ack) => {
                    if ack.code < 0x80 {
                        self.send(&Packet::PubRel(codec::Ack::new(ack.packet_id, 0)));
                        match self.recv() {
                            Packet::PubComp(_) => {}
                            other => panic!("expected PUBCOMP, got {other:?}"),
                        }
                    }
                    Some(ack.code)
                }
                other => panic!("expected PUBREC, got {other:?}"),
            },
        }
    }

    /// Receives a PUBLISH, acknowledging it at QoS 1 and 2.
    pub fn recv_publish(&mut self) -> codec::Publish {
        match self.recv() {
            Packet::Publish(p) => {
                match (p.qos, p.packet_id) {
                    (codec::QoS::AtLeastOnce, Some(id)) => {
                        self.send(&Packet::PubAck(codec::Ack::new(id, 0)))
                    }
                    (codec::QoS::ExactlyOnce, Some(id)) => {
                        self.send(&Packet::PubRec(codec::Ack::new(id, 0)));
                        match self.recv() {
                            Packet::PubRel(_) => {
                                self.send(&Packet::PubComp(codec::Ack::new(id, 0)))
                            }
                            other => panic!("expected PUBREL, got {other:?}"),
                        }
                    }
                    _ => {}
                }
                p
            }
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Expects a DISCONNECT from the broker and returns its reason code.
    pub fn expect_disconnect(&mut self) -> u8 {
        match self.recv() {
            Packet::Disconnect(d) => d.code,
            other => panic!("expected DISCONNECT, got {other:?}"),
        }
    }
}

/// The value of the first User Property called `key`.
pub fn user_property<'a>(publish: &'a codec::Publish, key: &str) -> Option<&'a str> {
    publish
        .properties
        .user_properties
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A PUBLISH with packet id 1 when QoS > 0.
pub fn publish(topic: &str, payload: &[u8], qos: codec::QoS, retain: bool) -> codec::Publish {
    codec::Publish {
        dup: false,
        qos,
        retain,
        topic: topic.into(),
        packet_id: (qos != codec::QoS::AtMostOnce).then_some(1),
        properties: codec::Properties::default(),
        payload: payload.into(),
    }
}

/// Subscription options at `qos` and otherwise MQTT's defaults.
pub fn opts(qos: codec::QoS) -> codec::SubscriptionOptions {
    codec::SubscriptionOptions::with_qos(qos)
}

/// Queue helpers (issue 6): a worker reads offers without acknowledging them, so a
/// test decides when (and whether) the PUBACK goes.
impl Raw {
    /// Connects with Clean Start and a Receive Maximum, if given.
    pub fn connected_with_receive_maximum(
        addr: SocketAddr,
        client_id: &str,
        receive_maximum: Option<u16>,
    ) -> Raw {
        let mut c = connect(ProtocolVersion::V5, client_id, true);
        c.properties.edit().receive_maximum = receive_maximum;
        let (raw, ack) = Raw::handshake(addr, c);
        assert_eq!(ack.code, 0, "CONNACK {ack:?}");
        raw
    }

    /// Receives a PUBLISH and does not acknowledge it.
    pub fn recv_offer(&mut self) -> codec::Publish {
        match self.recv() {
            Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Acknowledges a QoS 1 PUBLISH.
    pub fn puback(&mut self, publish: &codec::Publish) {
        let id = publish.packet_id.expect("a QoS 1 PUBLISH has a packet id");
        self.send(&Packet::PubAck(codec::Ack::new(id, 0)));
    }

    /// Answers an offer at QoS 0 on the Response Topic it carries, echoing its
    /// Correlation Data: nothing comes back, so the next offer may follow at once.
    pub fn answer(&mut self, offer: &codec::Publish, payload: &[u8]) {
        let topic = offer
            .properties
            .response_topic
            .clone()
            .expect("an offer carries a Response Topic");
        let mut p = publish(&topic, payload, codec::QoS::AtMostOnce, false);
        p.properties.edit().correlation_data = offer.properties.correlation_data.clone();
        self.publish_packet(p);
    }

    /// Answers at QoS 1 on `topic` with `correlation`, returning the PUBACK code.
    pub fn answer_qos1(&mut self, topic: &str, correlation: Option<Vec<u8>>, payload: &[u8]) -> u8 {
        let mut p = publish(topic, payload, codec::QoS::AtLeastOnce, false);
        p.properties.edit().correlation_data = correlation;
        self.publish_packet(p).expect("QoS 1 is acknowledged")
    }

    /// Sends DISCONNECT 0x00 and waits for the broker to close.
    pub fn disconnect(mut self) {
        self.send(&Packet::Disconnect(codec::Disconnect::new(0)));
        let _ = self.read_to_close();
    }
}

impl Raw {
    /// Sets how long a read waits before `try_recv` gives up.
    pub fn set_timeout(&mut self, wait: Duration) {
        self.stream
            .set_read_timeout(Some(wait))
            .expect("read timeout");
    }
}

/// Channels on both provider kinds: events (append, sqlite), recent (append, tail),
/// memlog (append, memory), state (latest, memory), jobs (queue).
pub const CHANNELS: &str = "broker:
  id: channels-test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  storage:
    default: local
    default_retention_period: 7d
    default_retention_bytes: none
    providers:
      local:
        type: sqlite
        file_path: {dir}/saguin.db
      volatile:
        type: memory
        max_bytes: 64MiB
        snapshot_dir: {dir}/snapshots
channels:
  events:
    type: append
  recent:
    type: append
    start: tail
  memlog:
    type: append
    storage: volatile
  state:
    type: latest
    storage: volatile
  jobs:
    type: queue
    filter: work/+/todo
";

/// Holds the write lock of a broker's sqlite file (`saguin.db`) until dropped: past
/// the broker's 5 s busy timeout every write it tries fails, which is how a disk
/// that stops taking writes looks from the broker.
pub struct WriteLock(rusqlite::Connection);

impl WriteLock {
    /// Takes the lock.
    pub fn take(broker: &Broker) -> WriteLock {
        let db = rusqlite::Connection::open(broker.dir.join("saguin.db")).expect("open the db");
        db.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        WriteLock(db)
    }
}

impl Drop for WriteLock {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("COMMIT");
    }
}

/// Starts a broker on [`CHANNELS`] in a fresh directory.
pub fn start_with_channels() -> Broker {
    let dir = temp_dir("channels");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    Broker::start_in(dir, CHANNELS)
}

/// The operations listener's answer to one request: its status, its head (status
/// line and headers) and its body.
#[derive(Debug)]
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// The status line and headers.
    pub head: String,
    /// The body.
    pub body: String,
}

/// Sends `GET path`, with `Authorization: Basic` for `credentials` when given, and
/// reads the answer to the close; an error where the connection failed first (a
/// refused TLS client certificate, say).
pub fn try_http_get(
    mut stream: impl Read + Write,
    path: &str,
    credentials: Option<(&str, &str)>,
) -> std::io::Result<HttpAnswer> {
    use base64::Engine;
    let authorization = credentials.map_or_else(String::new, |(user, password)| {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Authorization: Basic {token}\r\n")
    });
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {response:?}")))?;
    Ok(HttpAnswer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

/// `GET path` with no credentials: the status and the body.
pub fn http_get(stream: impl Read + Write, path: &str) -> (u16, String) {
    let answer = try_http_get(stream, path, None).expect("an HTTP answer");
    (answer.status, answer.body)
}

/// A connection to a TCP address written as text (from a log line).
pub fn tcp(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect to the operations listener");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    stream
}

/// Stores `count` current values of 10 KiB, `state/0` up, in the `state` latest
/// channel of [`CHANNELS`].
pub fn fill_state(addr: SocketAddr, count: u32) {
    let mut publisher = Raw::connected(addr, ProtocolVersion::V5, "state-filler");
    for i in 0..count {
        let topic = format!("state/{i}");
        publisher.publish(&topic, &[b's'; 10 * 1024], codec::QoS::AtLeastOnce, false);
    }
}

/// Subscribes `reader`, whose Receive Maximum is 1, to `state/0` and returns that
/// value unacknowledged: with its window shut, a `state/#` pass subscribed next
/// fills half the session's bound and waits there.
pub fn shut_window_on_state(reader: &mut Raw) -> codec::Publish {
    assert_eq!(
        reader.subscribe("state/0", opts(codec::QoS::AtLeastOnce)),
        [1]
    );
    match reader.recv() {
        Packet::Publish(first) => first,
        other => panic!("state/0's value first, got {other:?}"),
    }
}

/// Every PUBLISH that arrives until none comes for `quiet`, acknowledged as its QoS
/// asks.
pub fn drain(reader: &mut Raw, quiet: Duration) -> Vec<codec::Publish> {
    let mut got = Vec::new();
    while let Ok(Packet::Publish(p)) = reader.expect_nothing_or_packet(quiet) {
        if p.qos != codec::QoS::AtMostOnce {
            reader.puback(&p);
        }
        got.push(p);
    }
    got
}
