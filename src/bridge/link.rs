//! One connection to a bridge's peer: dialled over TCP or TLS, with a WebSocket on
//! top for a ws:// or wss:// peer (`server::ws::dial`), opened with an MQTT 5
//! CONNECT, and read and written packet by packet with the broker's own codec and
//! frame reader (RFC 0002 "Bridges", "On a bridge, dialling out").
//!
//! The client certificate and key are read at every handshake (B-211), so a renewed
//! pair is presented at the next reconnect with no signal; rustls presents the
//! configured certificate whenever the peer asks, whatever issuers it lists (B-209).
//! Peer verification cannot be turned off: no key for it exists (B-204).

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_lite::future;
use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use smol::Async;
use smol::io::AsyncWrite;

use crate::broker::Settings;
use crate::codec::{self, Connect, Packet, Properties, PropertyValues, ProtocolVersion, QoS};
use crate::config::{Bridge, PeerScheme};
use crate::server::frame::{FrameError, FrameReader};
use crate::server::socket::Socket;

/// The Keep Alive the bridge asks for, seconds.
const KEEP_ALIVE: u16 = 60;
/// How long a dial, its handshake and the CONNACK may take together.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Where the system's authorities are kept, tried in order when a bridge names no
/// `ca_file` (the paths rustls-native-certs probes on Linux; `SSL_CERT_FILE` first).
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Outbox capacity kept between writes; a larger one is released once written.
const KEEP_OUTBOX: usize = 16 << 10;
/// Answers queued past which the link stops reading until they are written: far
/// above what an honest peer's exchanges in flight call for (65,535 PUBACKs).
const REPLY_BOUND: u64 = 512 << 10;

/// An open link: the socket, its reader, what is queued for the peer, and what the
/// peer's CONNACK granted.
#[derive(Debug)]
pub struct Link {
    socket: Socket,
    reader: FrameReader,
    /// The most this broker takes in one packet.
    max_packet: u32,
    /// Encoded packets for the peer; `written` of them are written. Written beside
    /// reading ([`Link::exchange`]), never instead of it: two brokers whose writes
    /// to each other both waited, each reading nothing meanwhile, stopped each
    /// other until the write gave up and the link dropped.
    outbox: Vec<u8>,
    written: usize,
    /// What of the bytes queued since the link opened is written.
    ledger: Ledger,
    /// Since when the socket has taken none of the outbox: the link is given up
    /// once that lasts the connect wait (`write_stalled_at`).
    blocked_since: Option<Instant>,
    /// The outbox was written whole and [`Link::exchange`] has not said so yet.
    drain_unseen: bool,
    /// What the peer granted.
    pub granted: Granted,
}

/// Where things stand in the stream of bytes queued for the peer since the link
/// opened, by offset in it: the answers not yet wholly written, and the PINGREQ
/// awaiting its PINGRESP.
#[derive(Debug, Default)]
struct Ledger {
    /// Bytes written.
    sent: u64,
    /// Runs of packets other than PUBLISH, `(start, end)`, not yet wholly written:
    /// answers the peer's own packets call for. Past [`REPLY_BOUND`] bytes of them
    /// the link reads no more until they are written, so a peer that sends and
    /// takes nothing cannot grow the outbox.
    replies: VecDeque<(u64, u64)>,
    reply_bytes: u64,
    /// Where the PINGREQ ends, and when it was found written: the PINGRESP is
    /// waited for from then, however long it waited behind a large record.
    ping: Option<(u64, Option<Instant>)>,
}

impl Ledger {
    fn queued_reply(&mut self, start: u64, end: u64) {
        match self.replies.back_mut() {
            Some(run) if run.1 == start => run.1 = end,
            _ => self.replies.push_back((start, end)),
        }
        self.reply_bytes += end - start;
    }

    fn wrote(&mut self, n: usize) {
        self.sent += n as u64;
        while let Some(run) = self.replies.front_mut()
            && run.0 < self.sent
        {
            let written = run.1.min(self.sent);
            self.reply_bytes -= written - run.0;
            run.0 = written;
            if written == run.1 {
                self.replies.pop_front();
            }
        }
        if let Some((end, at @ None)) = &mut self.ping
            && *end <= self.sent
        {
            *at = Some(Instant::now());
        }
    }
}

/// What a CONNACK told the bridge about its peer.
#[derive(Debug, Clone, Copy)]
pub struct Granted {
    /// The peer resumed the bridge's session.
    pub session_present: bool,
    /// How many QoS 1/2 publishes the peer takes unacknowledged.
    pub receive_maximum: u16,
    /// The largest packet the peer takes.
    pub max_packet: u32,
    /// Whether the peer keeps retained messages.
    pub retain_available: bool,
    /// The highest QoS the peer takes.
    pub max_qos: QoS,
    /// How often the bridge must show it is alive.
    pub keep_alive: Duration,
}

/// Reads every file a bridge names, as the start does before any listener opens
/// (B-210): a file that cannot be read stops the broker rather than running a dead
/// bridge.
///
/// # Errors
/// The file and what is wrong with it.
pub fn check_files(bridge: &Bridge) -> Result<(), String> {
    if bridge.peer.scheme.is_tls() {
        client_config(bridge).map(|_| ())
    } else {
        Ok(())
    }
}

/// The TLS client configuration: the peer's authority (`ca_file`, else the system
/// roots, B-203) and, when written, the certificate presented (B-206, B-207).
fn client_config(bridge: &Bridge) -> Result<Arc<ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let (path, what) = match &bridge.ca_file {
        Some(path) => (path.clone(), "ca_file"),
        None => (system_roots()?, "the system roots"),
    };
    let cas = CertificateDer::pem_file_iter(&path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    let (added, _) = roots.add_parsable_certificates(cas);
    if added == 0 {
        return Err(format!(
            "{what} {}: holds no usable certificate",
            path.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match (&bridge.cert_file, &bridge.key_file) {
        (Some(cert), Some(key)) => {
            let chain = read_chain(cert)?;
            let key_der = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("key_file {}: {e}", key.display()))?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                format!(
                    "key_file {} does not serve cert_file {}: {e}",
                    key.display(),
                    cert.display()
                )
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| format!("cert_file {}: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "cert_file {}: holds no PEM certificate",
            path.display()
        ));
    }
    Ok(chain)
}

/// The system's bundle of authorities: `SSL_CERT_FILE`, else the first bundle found
/// where Linux distributions keep one.
fn system_roots() -> Result<std::path::PathBuf, String> {
    if let Some(file) = std::env::var_os("SSL_CERT_FILE") {
        return Ok(file.into());
    }
    SYSTEM_ROOTS
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "no ca_file is written and no system bundle of authorities was found (tried SSL_CERT_FILE and /etc/ssl/certs/ca-certificates.crt among others); write ca_file".to_string()
        })
}

impl Link {
    /// Dials the peer, makes the TLS handshake where the scheme asks for one, and
    /// opens the session: MQTT 5, Clean Start 0, Session Expiry `session_expiry`
    /// (B-376), Receive Maximum `receive_maximum` (B-403), no user name or password
    /// (B-212).
    ///
    /// # Errors
    /// What failed, for the log.
    pub async fn open(bridge: &Bridge, settings: &Settings) -> Result<Link, String> {
        let dial = Link::dial(bridge, settings);
        future::or(dial, async {
            smol::Timer::after(CONNECT_WAIT).await;
            Err(format!("no CONNACK within {}s", CONNECT_WAIT.as_secs()))
        })
        .await
    }

    async fn dial(bridge: &Bridge, settings: &Settings) -> Result<Link, String> {
        let peer = &bridge.peer;
        let addrs = smol::net::resolve((peer.host.as_str(), peer.port))
            .await
            .map_err(|e| format!("cannot resolve {}: {e}", peer.host))?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        let mut tcp = None;
        // Each address its share of the wait: one whose SYNs vanish (an AAAA record
        // on a network without IPv6) must not keep the next from being tried.
        let share = CONNECT_WAIT / u32::try_from(addrs.len().max(1)).unwrap_or(u32::MAX);
        for addr in addrs {
            let connect = async { Some(Async::<TcpStream>::connect(addr).await) };
            let timed_out = async {
                smol::Timer::after(share).await;
                None
            };
            match future::or(connect, timed_out).await {
                Some(Ok(s)) => {
                    tcp = Some(s);
                    break;
                }
                Some(Err(e)) => last = e,
                None => {
                    last = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("{addr} did not answer within {}s", share.as_secs()),
                    )
                }
            }
        }
        let tcp = tcp.ok_or_else(|| format!("cannot connect: {last}"))?;
        let _ = tcp.get_ref().set_nodelay(true);
        let socket = if peer.scheme.is_tls() {
            let config = client_config(bridge)?;
            let name = ServerName::try_from(peer.host.clone())
                .map_err(|e| format!("{} is not a name TLS can check: {e}", peer.host))?;
            let tls = futures_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS handshake failed: {e}"))?;
            Socket::TlsClient(Box::new(tls))
        } else {
            Socket::Tcp(tcp)
        };
        let socket = match peer.scheme {
            PeerScheme::Tcp | PeerScheme::Tls => socket,
            PeerScheme::Ws | PeerScheme::Wss => {
                let max = settings.max_message_size as usize;
                crate::server::ws::dial(&ws_url(peer), socket, max).await?
            }
        };
        let mut link = Link {
            socket,
            reader: FrameReader::default(),
            max_packet: settings.max_message_size,
            outbox: Vec::new(),
            written: 0,
            ledger: Ledger::default(),
            blocked_since: None,
            drain_unseen: false,
            granted: Granted {
                session_present: false,
                receive_maximum: u16::MAX,
                max_packet: u32::MAX,
                retain_available: true,
                max_qos: QoS::ExactlyOnce,
                keep_alive: Duration::from_secs(u64::from(KEEP_ALIVE)),
            },
        };
        link.reader.connected();
        link.send(&Packet::Connect(Box::new(connect(bridge, settings))))
            .await?;
        let ack = match link.next_packet().await? {
            Packet::ConnAck(ack) => ack,
            other => return Err(format!("answered CONNECT with {}", name_of(&other))),
        };
        if ack.code != codec::reason::SUCCESS {
            let why = ack.properties.reason_string.as_deref().unwrap_or_default();
            return Err(format!("refused the CONNECT 0x{:02X} {why}", ack.code));
        }
        let p = &ack.properties;
        link.granted = Granted {
            session_present: ack.session_present,
            receive_maximum: p.receive_maximum.unwrap_or(u16::MAX).max(1),
            max_packet: p.maximum_packet_size.unwrap_or(u32::MAX),
            retain_available: p.retain_available != Some(0),
            max_qos: p
                .maximum_qos
                .and_then(QoS::from_bits)
                .unwrap_or(QoS::ExactlyOnce),
            // A Server Keep Alive of 0 asks for no keepalive; the bridge still pings
            // at its own pace, to notice a link that went silent.
            keep_alive: Duration::from_secs(u64::from(
                p.server_keep_alive.filter(|k| *k > 0).unwrap_or(KEEP_ALIVE),
            )),
        };
        Ok(link)
    }

    /// The next packet from the peer, writing nothing meanwhile: for the handshake,
    /// before anything is queued. Safe to cancel: a packet counts only once whole.
    ///
    /// # Errors
    /// As [`Link::exchange`].
    pub async fn next_packet(&mut self) -> Result<Packet, PeerFault> {
        std::future::poll_fn(|cx| self.poll_packet(cx)).await
    }

    /// Writes what is queued as far as the socket takes it and reads meanwhile: the
    /// next packet from the peer, or `None` once everything queued is written and
    /// nothing more has come (for the caller to queue more). Safe to cancel: a
    /// packet counts only once whole, and every byte the socket took is counted.
    ///
    /// # Errors
    /// The link ended, a write failed, or the peer sent something the codec refuses
    /// or larger than `max_message_size` (a malformed packet ends the link, never a
    /// panic).
    pub async fn exchange(&mut self) -> Result<Option<Packet>, PeerFault> {
        std::future::poll_fn(|cx| self.poll_exchange(cx)).await
    }

    fn poll_exchange(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Packet>, PeerFault>> {
        if let Poll::Ready(Err(fault)) = self.poll_write_queued(cx) {
            return Poll::Ready(Err(fault));
        }
        // Read even when the write just finished: a backlog the socket takes as
        // fast as it is queued must not keep the peer's packets unread.
        if self.ledger.reply_bytes <= REPLY_BOUND
            && let Poll::Ready(packet) = self.poll_packet(cx)
        {
            return Poll::Ready(packet.map(Some));
        }
        // A drain is said once, wherever it happened (`write_stalled_at` polls too).
        match std::mem::take(&mut self.drain_unseen) {
            true => Poll::Ready(Ok(None)),
            false => Poll::Pending,
        }
    }

    /// The next packet, reading the socket for it.
    fn poll_packet(&mut self, cx: &mut Context<'_>) -> Poll<Result<Packet, PeerFault>> {
        loop {
            if let Some(parsed) = self.parsed() {
                return Poll::Ready(parsed);
            }
            let filled = std::task::ready!(self.reader.poll_fill(&mut self.socket, cx));
            if let Err(fault) = filled_some(filled) {
                return Poll::Ready(Err(fault));
            }
        }
    }

    /// Ready once the outbox is written and flushed, or the write failed; pending
    /// while it has bytes the socket does not take now (or nothing to write).
    fn poll_write_queued(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PeerFault>> {
        if self.outbox.is_empty() {
            return Poll::Pending;
        }
        let failed = |e: io::Error| PeerFault {
            code: None,
            why: format!("write failed: {e}"),
        };
        while let Some(rest) = self.outbox.get(self.written..).filter(|r| !r.is_empty()) {
            match Pin::new(&mut self.socket).poll_write(cx, rest) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(failed(io::ErrorKind::WriteZero.into())));
                }
                Poll::Ready(Ok(n)) => {
                    self.written += n;
                    self.ledger.wrote(n);
                    self.blocked_since = None;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(failed(e))),
                Poll::Pending => return self.blocked(),
            }
        }
        match Pin::new(&mut self.socket).poll_flush(cx) {
            Poll::Ready(flushed) => flushed.map_err(failed)?,
            Poll::Pending => return self.blocked(),
        }
        self.outbox.clear();
        self.written = 0;
        self.blocked_since = None;
        self.drain_unseen = true;
        if self.outbox.capacity() > KEEP_OUTBOX {
            self.outbox = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    /// The socket took nothing now: the wait for it starts, if it had not.
    fn blocked(&mut self) -> Poll<Result<(), PeerFault>> {
        self.blocked_since.get_or_insert_with(Instant::now);
        Poll::Pending
    }

    /// A whole packet from what is buffered, decoded, if one is there.
    fn parsed(&mut self) -> Option<Result<Packet, PeerFault>> {
        match self.reader.next_frame(self.max_packet) {
            Ok(Some(frame)) => {
                let decoded = codec::decode(
                    frame.first_byte,
                    self.reader.body(&frame),
                    ProtocolVersion::V5,
                );
                self.reader.consume(frame);
                Some(decoded.map_err(|e| PeerFault {
                    code: e.reason_code(),
                    why: format!("sent a packet that does not decode: {e:?}"),
                }))
            }
            Ok(None) => None,
            Err(FrameError::Decode(e)) => Some(Err(PeerFault {
                code: Some(codec::reason::MALFORMED_PACKET),
                why: format!("sent a fixed header that does not decode: {e:?}"),
            })),
            Err(FrameError::TooLarge { declared, .. }) => Some(Err(PeerFault {
                code: Some(codec::reason::PACKET_TOO_LARGE),
                why: format!("sent a packet of {declared} bytes, over max_message_size"),
            })),
        }
    }

    /// Queues one packet for [`Link::exchange`] to write.
    pub fn queue(&mut self, packet: &Packet) {
        let start = self.queued_end();
        codec::encode(packet, ProtocolVersion::V5, &mut self.outbox);
        if !matches!(packet, Packet::Publish(_)) {
            let end = self.queued_end();
            self.ledger.queued_reply(start, end);
        }
    }

    /// Queues a PINGREQ, whose PINGRESP [`Link::ping_written_at`] times.
    pub fn queue_ping(&mut self) {
        self.queue(&Packet::PingReq);
        self.ledger.ping = Some((self.queued_end(), None));
    }

    /// When the PINGREQ awaiting its PINGRESP was found written, once it was.
    pub fn ping_written_at(&self) -> Option<Instant> {
        self.ledger.ping.and_then(|(_, at)| at)
    }

    /// The PINGRESP came.
    pub fn ponged(&mut self) {
        self.ledger.ping = None;
    }

    /// The offset, in the stream since the link opened, where what is queued ends.
    fn queued_end(&self) -> u64 {
        self.ledger.sent + self.queued() as u64
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.outbox.len() - self.written
    }

    /// Tries the socket once more, and says when the link is to be given up if it
    /// still takes none of what is queued by then: the wait is for progress, not for
    /// the whole, so a large record on a slow uplink (a satellite's few hundred
    /// kbit/s), which takes longer than the connect wait to drain, still crosses;
    /// and time spent elsewhere (a slow store) is not the socket's.
    ///
    /// # Errors
    /// The write failed.
    pub async fn write_stalled_at(&mut self) -> Result<Option<Instant>, PeerFault> {
        let tried = future::poll_once(std::future::poll_fn(|cx| self.poll_write_queued(cx)));
        if let Some(Err(fault)) = tried.await {
            return Err(fault);
        }
        Ok(self.blocked_since.map(|since| since + CONNECT_WAIT))
    }

    /// Queues one packet and writes everything queued, reading nothing meanwhile:
    /// for the handshake and the SUBSCRIBE that follows it.
    ///
    /// # Errors
    /// The socket's, or a write that made no progress within the connect wait.
    pub async fn send(&mut self, packet: &Packet) -> Result<(), String> {
        self.queue(packet);
        loop {
            let written = std::future::poll_fn(|cx| self.poll_write_queued(cx));
            match within_connect_wait(written).await {
                Some(result) => return result.map_err(String::from),
                // Only the wait for progress is bounded: a write that moved goes on.
                None if self
                    .blocked_since
                    .is_none_or(|since| since.elapsed() < CONNECT_WAIT) => {}
                None => return Err("a write made no progress in time".into()),
            }
        }
    }

    /// Closes the link, sending DISCONNECT `code` first when it can. What is queued
    /// is let go when none of it is written yet, to be sent again by the next link
    /// as anything unacknowledged is; behind a packet part-written, it is written
    /// first, since the DISCONNECT can only follow whole packets.
    pub async fn close(mut self, code: u8) {
        if self.written == 0 {
            self.outbox.clear();
            self.ledger = Ledger::default();
        }
        let _ = self
            .send(&Packet::Disconnect(codec::Disconnect::new(code)))
            .await;
        self.socket.close_write();
    }
}

/// A fill of the reader that brought bytes, or why the link ended.
fn filled_some(filled: io::Result<usize>) -> Result<(), PeerFault> {
    let gone = |why: String| PeerFault { code: None, why };
    match filled {
        Ok(0) => Err(gone("closed the connection".into())),
        Ok(_) => Ok(()),
        Err(e) => Err(gone(format!("read failed: {e}"))),
    }
}

/// Why the peer's side of a link ended, and the DISCONNECT a client owes a peer
/// that sent what it may not: 0x95 past the Maximum Packet Size it was told
/// (MQTT-3.1.2-24's other half, 3.1.2.11.4), 0x81 or 0x82 for what does not decode
/// (4.13.1). `None` when there is no one left to tell.
#[derive(Debug)]
pub struct PeerFault {
    /// The DISCONNECT reason code owed, if any.
    pub code: Option<u8>,
    /// What happened, for the log.
    pub why: String,
}

impl From<PeerFault> for String {
    fn from(fault: PeerFault) -> String {
        fault.why
    }
}

/// `step`, unless it takes longer than the connect wait.
async fn within_connect_wait<T>(step: impl std::future::Future<Output = T>) -> Option<T> {
    future::or(async { Some(step.await) }, async {
        smol::Timer::after(CONNECT_WAIT).await;
        None
    })
    .await
}

/// The address a ws:// or wss:// peer is upgraded at: its path, `/mqtt` when none
/// was written (what mosquitto, EMQX and HiveMQ serve).
fn ws_url(peer: &crate::config::Peer) -> String {
    let scheme = if peer.scheme.is_tls() { "wss" } else { "ws" };
    let host = if peer.host.contains(':') {
        format!("[{}]", peer.host)
    } else {
        peer.host.clone()
    };
    let path = if peer.path.is_empty() {
        "/mqtt"
    } else {
        &peer.path
    };
    format!("{scheme}://{host}:{}{path}", peer.port)
}

fn connect(bridge: &Bridge, settings: &Settings) -> Connect {
    let properties = Properties::from(PropertyValues {
        session_expiry_interval: Some(
            u32::try_from(bridge.session_expiry.as_secs()).unwrap_or(u32::MAX),
        ),
        receive_maximum: Some(bridge.receive_maximum),
        maximum_packet_size: Some(settings.max_message_size),
        ..PropertyValues::default()
    });
    Connect {
        protocol: ProtocolVersion::V5,
        clean_start: false,
        keep_alive: KEEP_ALIVE,
        client_id: bridge.client_id.clone(),
        will: None,
        username: None,
        password: None,
        properties,
    }
}

/// A packet's name, for a log line.
pub fn name_of(packet: &Packet) -> &'static str {
    match packet {
        Packet::Connect(_) => "CONNECT",
        Packet::ConnAck(_) => "CONNACK",
        Packet::Publish(_) => "PUBLISH",
        Packet::PubAck(_) => "PUBACK",
        Packet::PubRec(_) => "PUBREC",
        Packet::PubRel(_) => "PUBREL",
        Packet::PubComp(_) => "PUBCOMP",
        Packet::Subscribe(_) => "SUBSCRIBE",
        Packet::SubAck(_) => "SUBACK",
        Packet::Unsubscribe(_) => "UNSUBSCRIBE",
        Packet::UnsubAck(_) => "UNSUBACK",
        Packet::PingReq => "PINGREQ",
        Packet::PingResp => "PINGRESP",
        Packet::Disconnect(_) => "DISCONNECT",
        Packet::Auth(_) => "AUTH",
    }
}

#[cfg(test)]
mod tests {
    use super::Ledger;

    /// Answers count until written, a run trimmed as a write passes through it;
    /// adjacent answers are one run; the PINGREQ is timed from its last byte.
    #[test]
    fn the_ledger_counts_answers_until_written_and_times_the_ping() {
        let mut ledger = Ledger::default();
        // A publish at 0..100, answers at 100..104 and 104..108, a publish, one more.
        ledger.queued_reply(100, 104);
        ledger.queued_reply(104, 108);
        ledger.queued_reply(200, 204);
        assert_eq!(ledger.replies.len(), 2, "adjacent answers merge");
        assert_eq!(ledger.reply_bytes, 12);
        ledger.ping = Some((204, None));
        ledger.wrote(102);
        assert_eq!(ledger.reply_bytes, 10, "two of the first run written");
        ledger.wrote(6);
        assert_eq!((ledger.reply_bytes, ledger.replies.len()), (4, 1));
        ledger.wrote(95);
        assert!(
            ledger.ping.is_some_and(|(_, at)| at.is_none()),
            "one byte short"
        );
        ledger.wrote(1);
        assert_eq!((ledger.reply_bytes, ledger.replies.len()), (0, 0));
        assert!(ledger.ping.is_some_and(|(_, at)| at.is_some()));
    }
}
