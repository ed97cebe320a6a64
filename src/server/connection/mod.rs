//! One connection: a task that owns its socket from CONNECT to close.
//!
//! The loop is: handle every whole packet buffered, write what the session is owed,
//! then wait for whichever comes first of more bytes, a wake-up from the broker, or
//! the keepalive deadline. Nothing else ever writes to this socket.
//!
//! What a packet asks is done beside this loop: `handshake` up to the CONNACK,
//! `publish` and `subscribe` for what a client sends; `routing` (storing), `channels`
//! (reading), `queue` and `verbs` for what those reach.

use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_lite::future;

mod acl;
pub(crate) mod channels;
mod handshake;
pub(crate) mod keep_alive;
mod outbox;
mod publish;
mod queue;
pub(crate) mod routing;
mod subscribe;
mod verbs;

pub(crate) use handshake::refuse_busy;
use publish::PublishStep;
pub(crate) use routing::{drop_unneeded_log, log_owed, remove_dead_retained, route, with_room};

use super::Shared;
use super::frame::{FrameError, FrameReader};
use super::slots::Slot;
use super::socket::Socket;
use crate::broker::TOPIC_ALIAS_MAXIMUM;
use crate::broker::inflight::Answer;
use crate::broker::session::{Delivery, Inflight};
use crate::broker::{ConnLink, WillAtEnd, topic};
use crate::codec::reason;
use crate::codec::{
    self, Ack, DecodeError, Disconnect, Packet, Properties, ProtocolVersion, Publish, QoS,
    Subscribe, Unsubscribe,
};

/// Bytes still read from a client whose connection is ending - told to go, or its
/// write past `write_timeout` - for what it sent before it knew (B-299, B-041).
const DRAIN_AT_END: usize = 64 * 1024;

/// A packet whose handling may wait (for storage, a cursor, a write): what
/// `Conn::handle_now` leaves to `Conn::handle`.
enum Waiting {
    Publish(Publish, PublishStep),
    PubRec(Ack),
    PubRel(Ack),
    Subscribe(Subscribe),
    Unsubscribe(Unsubscribe),
}

/// Whether a session reads channels, as its queue was written: only one that does
/// is asked what to read next.
#[derive(Clone, Copy)]
enum Reading {
    Nothing,
    Channels,
}

/// Why a connection ends.
#[derive(Debug)]
enum End {
    /// The client sent DISCONNECT with this reason: only 0x00 withdraws its Will
    /// (MQTT-3.1.2-10, MQTT 5 section 3.14.4); any other, 0x04 included, leaves it owed.
    Client(u8),
    /// The broker ends it with this reason (a DISCONNECT on MQTT 5).
    Broker(u8),
    /// Close with nothing more written (3.1.1 refusals, bad UTF-8 topics, I/O errors).
    Close,
    /// Another connection took the session, or the broker is stopping: the session
    /// is not this connection's to touch any more.
    Kicked(u8),
}

/// How the log says a connection ended.
impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            End::Client(reason::NORMAL_DISCONNECTION) => f.write_str("DISCONNECT from the client"),
            End::Client(code) => {
                write!(
                    f,
                    "DISCONNECT 0x{code:02X} from the client: its Will is published"
                )
            }
            End::Broker(code) | End::Kicked(code) => {
                write!(
                    f,
                    "ended by the broker, 0x{code:02X}: {}",
                    refusal_text(code)
                )
            }
            End::Close => f.write_str("closed without a DISCONNECT"),
        }
    }
}

struct Conn {
    stream: Socket,
    peer: Box<str>,
    shared: Rc<Shared>,
    reader: FrameReader,
    out: outbox::Outbox,
    protocol: ProtocolVersion,
    client_id: Arc<str>,
    link: Rc<ConnLink>,
    woken: crate::broker::Woken,
    keep_alive: Option<Rc<keep_alive::KeepAlive>>,
    /// Topic aliases the client registered, allocated at its first alias.
    aliases: Option<Box<[Option<Arc<str>>; TOPIC_ALIAS_MAXIMUM as usize]>>,
    /// The client asked for Reason Strings (Request Problem Information, default 1).
    problem_info: bool,
    /// The client's Maximum Packet Size, which nothing sent to it exceeds
    /// (MQTT-3.1.2-24).
    max_packet: usize,
    /// What a DISCONNECT's Session Expiry Interval may still do to the session.
    expiry_at_disconnect: ExpiryAtDisconnect,
    /// When the positions of this consumer were last written.
    positions_stored_at: Option<Instant>,
    /// The session outlives this connection, so it has positions to write: its expiry
    /// is fixed from the CONNECT to the connection's end. A session that does not is
    /// not asked on every turn.
    durable: bool,
    /// Its positions being written, beside the read loop (B-457).
    positions_writing: Option<channels::PositionsWrite>,
    /// What wakes the connection when its moved positions are due though nothing else
    /// does (B-457), and the deadline it is set to: kept from turn to turn and re-armed
    /// only when the deadline moves, as a timer made and dropped in every turn costs
    /// the reactor an insertion and a removal. Boxed: only a consumer has one.
    positions_timer: Option<Box<(Instant, smol::Timer)>>,
    /// A Reason String for the SUBACK being built (a queue form's refusal).
    suback_reason: Option<Box<str>>,
    /// Whether a filter was refused over `limits.max_subscriptions` since this
    /// client last added one: warned once per such episode (B-096).
    over_max_subscriptions: bool,
    /// The Reason String for the next refusing PUBACK or PUBREC, when the reason code
    /// alone does not say which rule refused.
    puback_reason: Option<Box<str>>,
    /// This client under the acl_file, when one is held (`connection/acl.rs`).
    acl: Option<Rc<crate::acl::Principal>>,
    /// A wait for the client or the broker was not over at once since the last
    /// packet was handled.
    waited: bool,
    /// `write_owed` stopped at a logged delivery: the Receive Maximum of them are on
    /// the wire above the stored log position, which is written now (B-459).
    log_window_full: bool,
    /// Exchanges of the resumed session wait to be sent again, as the client's
    /// Receive Maximum has room (`resend_unsent`).
    resending: bool,
}

/// Runs a connection to its end. It holds `slot` until the broker decides it ends
/// (B-056); `gate` is its door's TLS and credentials (`crate::auth`).
pub(crate) fn run(
    stream: Socket,
    peer: String,
    shared: Rc<Shared>,
    slot: Slot,
    gate: Rc<crate::auth::Gate>,
    websocket: Option<Rc<super::ws::OriginPolicy>>,
) -> impl Future<Output = ()> {
    // Boxed, and a function of its own: what the handshake holds (the CONNECT, its
    // answer) is gone once it ends, and no idle connection's task keeps room for it.
    // Boxed before the block, which then captures a pointer, not the arguments: an
    // async fn would keep them in every connection's task (rust-lang/rust#62958).
    let established = Box::pin(handshake::establish(
        stream, peer, shared, slot, gate, websocket,
    ));
    // The connection is boxed: the task keeps it across an await. Served in this
    // block, not a function of its own, whose future would keep its arguments again.
    async move {
        let Some((mut conn, slot)) = established.await else {
            return;
        };
        let end = conn.serve().await;
        // The slot is free before the ending is written: the client may reconnect.
        drop(slot);
        Box::pin(conn.finish(end)).await;
    }
}

/// U+0001-U+001F and U+007F-U+009F, which no client id or user name may hold.
fn is_control(c: char) -> bool {
    matches!(c, '\u{1}'..='\u{1F}' | '\u{7F}'..='\u{9F}')
}

/// Whether a publish carries more User Properties than `limits.max_header_count` or
/// more of their bytes than `max_header_bytes` (0x97 for a client, B-407 for a bridge).
pub(crate) fn over_header_limits(
    properties: &crate::codec::Properties,
    settings: &crate::broker::Settings,
) -> bool {
    // The broker's own `saguin-` properties are not the publisher's headers: a
    // client's are stripped before anything is kept (C-017), and a Sagüin peer's
    // record carries its id and offset, which must not push a full record over.
    let headers = properties
        .user_properties
        .iter()
        .filter(|(k, _)| !k.starts_with(crate::broker::records::RESERVED_PREFIX));
    let (count, bytes) = headers.fold((0, 0), |(n, b), (k, v)| (n + 1, b + k.len() + v.len()));
    count > settings.max_header_count || bytes > settings.max_header_bytes
}

/// Whether a topic name may be published to (RFC 0002 "Publishing"): `Err` carries the
/// reason code.
pub(crate) fn check_topic_name(
    topic_name: &str,
    settings: &crate::broker::Settings,
) -> Result<(), u8> {
    // No topic name is empty (MQTT-4.7.3-1); a PUBLISH's is its alias's by now.
    if topic_name.is_empty() || crate::codec::has_wildcard(topic_name) {
        return Err(reason::TOPIC_NAME_INVALID);
    }
    if topic_name.len() > settings.max_topic_length
        || topic::level_count(topic_name) > settings.max_topic_levels
    {
        return Err(reason::TOPIC_NAME_INVALID);
    }
    if topic_name.starts_with("$share/")
        || topic_name.starts_with("$saguin/")
        || topic_name == "$saguin"
    {
        return Err(reason::TOPIC_NAME_INVALID);
    }
    if topic_name.starts_with("$SYS/") || topic_name == "$SYS" {
        return Err(reason::NOT_AUTHORIZED);
    }
    Ok(())
}

/// Runs `write`, giving up after `timeout` (`None` waits as long as it takes).
async fn with_write_timeout(
    write: impl Future<Output = std::io::Result<()>>,
    timeout: Option<Duration>,
) -> std::io::Result<()> {
    future::or(write, async {
        match timeout {
            Some(timeout) => smol::Timer::after(timeout).await,
            None => smol::Timer::never().await,
        };
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "write_timeout passed",
        ))
    })
    .await
}

/// Closes our side and discards what the peer still sends, briefly, so the last
/// packet we wrote is not lost to a reset: closing a socket with unread bytes makes
/// the kernel send RST, which can overtake a CONNACK or DISCONNECT still in flight.
/// Memory stays bounded: the rest is read into a small buffer and dropped.
async fn linger(stream: &mut Socket) {
    linger_until(stream, Instant::now() + LINGER).await;
}

/// How long [`linger`] discards what the peer still sends.
const LINGER: Duration = Duration::from_millis(500);

/// [`linger`], ending at `until` however much is left to discard.
async fn linger_until(stream: &mut Socket, until: Instant) {
    const MAX_DISCARD: usize = 1 << 20;
    if let Socket::Ws(ws) = stream {
        // A WebSocket ends with a Close frame, ours or the answer to the peer's
        // (RFC 6455 5.5.1): a browser told nothing reports an unclean close (1006).
        let close = async {
            let _ = smol::io::AsyncWriteExt::close(&mut **ws).await;
        };
        future::or(close, async {
            smol::Timer::at(until).await;
        })
        .await;
    }
    stream.close_write();
    let drain = async {
        let mut scratch = vec![0u8; 1024];
        let mut discarded = 0;
        while discarded < MAX_DISCARD {
            match smol::io::AsyncReadExt::read(stream, &mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => discarded += n,
            }
        }
    };
    future::or(drain, async {
        smol::Timer::at(until).await;
    })
    .await;
}

/// Turns of a connection's loop in a row that found its socket ready before the
/// connection yields to the other tasks: 16 reads of up to a chunk each.
const BUSY_TURNS: u32 = 16;

/// Counts a turn taken without waiting, and lets the other tasks run every
/// [`BUSY_TURNS`] of them.
async fn busy_turn(busy_turns: &mut u32) {
    *busy_turns += 1;
    if *busy_turns >= BUSY_TURNS {
        *busy_turns = 0;
        future::yield_now().await;
    }
}

/// Deliveries a publisher's batch may hand out and still let them be written before
/// its own acknowledgements (`Conn::serve`).
const DELIVER_FIRST_UP_TO: u64 = 8;

/// What a wait on a write that the socket did not take at once ended with.
enum WriteWait {
    Written(std::io::Result<()>),
    Kicked,
    Silent,
}

/// What one wait of the main loop ended with.
enum Event {
    Read(std::io::Result<usize>),
    Woken,
    KeepAliveExpired,
    /// The positions write begun beside the loop ended: when it began, if it wrote.
    PositionsStored(Option<Instant>),
}

/// What a DISCONNECT's Session Expiry Interval may do, from what the CONNECT asked
/// and what the broker granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ExpiryAtDisconnect {
    /// The CONNECT asked for 0: another value is a Protocol Error (MQTT-3.14.2-2).
    Refused,
    /// The CONNECT asked for more and the broker granted 0 (a `persistent` denial,
    /// B-309; no room in the session store, B-469): the session ends with the
    /// connection whatever the DISCONNECT says, as a value above the grant is capped.
    Pinned,
    /// The DISCONNECT's value is taken, capped at `max_session_expiry`.
    Free,
}

impl ExpiryAtDisconnect {
    /// From the expiry the CONNECT asked for and the one the broker granted.
    pub(super) fn of(asked: u32, granted: u32) -> ExpiryAtDisconnect {
        match (asked, granted) {
            (0, _) => ExpiryAtDisconnect::Refused,
            (_, 0) => ExpiryAtDisconnect::Pinned,
            _ => ExpiryAtDisconnect::Free,
        }
    }
}

impl Conn {
    fn queue_packet(&mut self, packet: &Packet) {
        self.out.packet(packet, self.protocol, self.max_packet);
    }

    /// An acknowledgement with `code`; a refusal says why, `why` or the code's own
    /// words, unless the client asked for no Reason Strings.
    fn ack(&self, packet_id: u16, code: u8, why: Option<&str>) -> Ack {
        let mut ack = Ack::new(packet_id, code);
        if code >= 0x80 && self.problem_info {
            let why = why.unwrap_or_else(|| refusal_text(code));
            ack.properties.edit().reason_string = Some(why.to_string());
        }
        ack
    }

    /// Writes what is owed.
    async fn flush(&mut self) -> Result<(), End> {
        if !self.flush_now()? {
            self.flush_waiting().await?;
        }
        Ok(())
    }

    /// Writes what is owed as far as the socket takes it at once; whether all of it
    /// went.
    fn flush_now(&mut self) -> Result<bool, End> {
        if self.out.is_empty() {
            return Ok(true);
        }
        match self.out.write_now(&self.stream) {
            Ok(false) => Ok(false),
            Ok(true) => self.flushed(Ok(())).map(|()| true),
            Err(e) => self.flushed(Err(e)).map(|()| true),
        }
    }

    /// Writes the rest of what is owed, waiting for the socket up to `write_timeout`.
    async fn flush_waiting(&mut self) -> Result<(), End> {
        let result = with_write_timeout(
            self.out.write_to(&mut self.stream),
            self.shared.settings.write_timeout,
        )
        .await;
        self.flushed(result)
    }

    /// [`Conn::flush_waiting`] for the serve loop: a connection told to end stops
    /// waiting for its reader at once, so its slot is free while its last write still
    /// waits (B-058). What is left stays in the outbox, for `finish` to write. The
    /// keepalive is watched too: a client silent past its grace is told 0x8D however
    /// long `write_timeout` lets a write wait (MQTT-3.1.2-22).
    async fn flush_waiting_unless_kicked(&mut self) -> Result<(), End> {
        // One deadline for the whole write, however often the wait is woken.
        let deadline = self
            .shared
            .settings
            .write_timeout
            .map(|t| Instant::now() + t);
        loop {
            // Kicked already: its one wake-up was taken by an earlier wait.
            if self.link.kicked().is_some() {
                return Ok(());
            }
            let Conn {
                out,
                stream,
                woken,
                link,
                keep_alive,
                ..
            } = self;
            let mut woken_meanwhile = false;
            let write = async {
                let timeout = deadline.map(|at| at.saturating_duration_since(Instant::now()));
                WriteWait::Written(with_write_timeout(out.write_to(stream), timeout).await)
            };
            let kicked = async {
                loop {
                    woken.recv().await;
                    if link.kicked().is_some() {
                        return WriteWait::Kicked;
                    }
                    woken_meanwhile = true;
                }
            };
            let silent = async {
                match keep_alive {
                    Some(watch) => std::future::poll_fn(|cx| watch.poll_expired(cx)).await,
                    None => future::pending().await,
                }
                WriteWait::Silent
            };
            let waited = future::or(write, future::or(kicked, silent)).await;
            // A wake-up taken while the write waited is the next turn's.
            if woken_meanwhile {
                self.link.wake();
            }
            match waited {
                WriteWait::Written(result) => return self.flushed(result),
                // The kick's wake-up was taken here: given back, so the loop sees it.
                WriteWait::Kicked => {
                    self.link.wake();
                    return Ok(());
                }
                WriteWait::Silent => {
                    // What it sent while the write waited has not been read: a client
                    // heard is alive, and the write goes on. Read up to a packet's
                    // worth ahead, so a client that sends and never reads cannot grow
                    // the buffer by a chunk each grace.
                    let room =
                        self.reader.buffered() < self.shared.settings.max_message_size as usize;
                    let heard = room
                        && self
                            .reader
                            .try_fill(&mut self.stream)
                            .await
                            .is_ok_and(|n| n > 0);
                    if heard && let Some(watch) = &self.keep_alive {
                        watch.heard();
                        // What was read is handled at the next turn, which waits on
                        // the socket for nothing more: woken, it looks.
                        self.link.wake();
                        continue;
                    }
                    log::info!(
                        "{}: {} missed its keepalive while a write to it waited",
                        self.peer,
                        self.client_id
                    );
                    return Err(End::Broker(reason::KEEP_ALIVE_TIMEOUT));
                }
            }
        }
    }

    /// Empties the outbox once a write has ended, well or not.
    fn flushed(&mut self, result: std::io::Result<()>) -> Result<(), End> {
        self.out.clear();
        result.map_err(|e| {
            log::debug!("{}: write failed: {e}", self.peer);
            End::Close
        })
    }

    /// Handles what the client sent before its connection ends, which still counts:
    /// its acknowledgements, or the DISCONNECT that ends it on its own terms. Only so
    /// much, though: a client that keeps sending must not keep a connection that is
    /// ending alive, nor the thread busy (B-057, B-299).
    async fn handle_what_was_sent(&mut self) -> Result<(), End> {
        let mut drained = 0;
        loop {
            Box::pin(self.handle_buffered()).await?;
            match self.reader.try_fill(&mut self.stream).await {
                Ok(n) if n > 0 && drained < DRAIN_AT_END => drained += n,
                _ => return Ok(()),
            }
            future::yield_now().await;
        }
    }

    async fn serve(&mut self) -> End {
        let mut busy_turns = 0;
        loop {
            if let Some(code) = self.link.kicked() {
                return match self.handle_what_was_sent().await {
                    Ok(()) => End::Kicked(code),
                    Err(end) => end,
                };
            }
            let handed_before = self.shared.broker.borrow().handed();
            // Boxed: what handling a packet awaits (storage, cursors) is large, and
            // inline it would be paid by every idle connection's task. Each boxed
            // step below runs only when it has work, so a turn allocates no more; the
            // packets that need no waiting (acknowledgements, PINGREQ) none at all.
            match self.handle_ready() {
                Ok(None) => {}
                Ok(Some(packet)) => {
                    let handling = async {
                        self.handle(packet).await?;
                        self.handle_buffered().await
                    };
                    if let Err(end) = Box::pin(handling).await {
                        return end;
                    }
                }
                Err(end) => return end,
            }
            let handed = self.shared.broker.borrow().handed() - handed_before;
            if self.waited && (1..=DELIVER_FIRST_UP_TO).contains(&handed) {
                // The few subscribers this woke write before this publisher's PUBACKs
                // do, as they would on a broker that writes to them in place: on one
                // thread a delivery otherwise waits behind the acknowledgement's write
                // and the publisher's wake-up it causes. At QoS 0 too: waiting for its
                // next packet re-arms the publisher's socket, a syscall the delivery
                // would wait behind (1.5 µs, BENCHMARKS.md). Only for a publisher that
                // waited for this packet: one in full flow is better served by its
                // subscribers writing larger batches, and a fan-out's publisher would
                // wait behind every subscriber's write.
                future::yield_now().await;
            }
            if self.reader.is_empty() {
                // What was waited for is handled; a packet still arriving keeps it.
                self.waited = false;
            }
            let mut read_channels = false;
            match self.write_owed() {
                // Only a session reading channels is asked what to read: the question
                // looks the session up again.
                Ok(Reading::Channels) if self.next_read().is_some() => {
                    read_channels = Box::pin(self.pump_channels()).await;
                    if let Err(end) = self.write_owed() {
                        return end;
                    }
                }
                Ok(_) => {}
                Err(end) => return end,
            }
            // Boxed: a write's state (slices, its timeout) is the largest this loop
            // awaits, and inline every idle connection would keep room for it. Only a
            // write the socket does not take at once waits.
            match self.flush_now() {
                Ok(true) => {}
                Ok(false) => {
                    if let Err(end) = Box::pin(self.flush_waiting_unless_kicked()).await {
                        // Acknowledgements that arrived while the write waited move
                        // positions before the connection ends (B-041).
                        return self.handle_what_was_sent().await.err().unwrap_or(end);
                    }
                }
                Err(end) => return end,
            }
            // QoS 0 records free their room as they are written, and nothing else
            // would wake the connection to read on: a reader of more than its bound's
            // worth would stop after the first window (B-087).
            if read_channels && self.next_read().is_some() {
                // Through the wait, which then ends at once: the socket is still read
                // and positions still written while a backlog goes out.
                self.link.wake();
            }
            // A full log window is written at once: what waits behind it goes when
            // the write has moved the position (B-459).
            self.start_storing_positions();
            // Moved positions are written when their interval is up, even if nothing
            // else wakes the connection (B-457).
            let positions_due_at = self.positions_deadline();
            if let Some(at) = positions_due_at {
                match &mut self.positions_timer {
                    // Set already, and not spent: a timer that fired is set again.
                    Some(timer) if timer.0 == at && at > Instant::now() => {}
                    Some(timer) => {
                        timer.0 = at;
                        timer.1.set_at(at);
                    }
                    None => self.positions_timer = Some(Box::new((at, smol::Timer::at(at)))),
                }
            }
            let (event, waited) = {
                let Conn {
                    stream,
                    reader,
                    woken,
                    keep_alive,
                    positions_writing,
                    positions_timer,
                    ..
                } = self;
                // Asked only while positions are due: a timer left armed past that
                // wakes the connection for one turn at most.
                let mut positions_due = positions_timer
                    .as_mut()
                    .filter(|_| positions_due_at.is_some());
                // Whether the connection had to wait: a publisher that did is not in a
                // stream of packets, and its deliveries go out before its PUBACKs.
                let mut waited = false;
                // One poll over what the connection waits for, in this order, and no
                // future of each: an idle connection's task is as large as this wait.
                let event = std::future::poll_fn(|cx| {
                    if let Poll::Ready(read) = reader.poll_fill(stream, cx) {
                        return Poll::Ready(Event::Read(read));
                    }
                    if woken.poll_recv(cx).is_ready()
                        || positions_due
                            .as_mut()
                            .is_some_and(|timer| Pin::new(&mut timer.1).poll(cx).is_ready())
                    {
                        return Poll::Ready(Event::Woken);
                    }
                    if keep_alive
                        .as_ref()
                        .is_some_and(|watch| watch.poll_expired(cx).is_ready())
                    {
                        return Poll::Ready(Event::KeepAliveExpired);
                    }
                    if let Some(Poll::Ready(began)) = positions_writing
                        .as_mut()
                        .map(|writing| writing.as_mut().poll(cx))
                    {
                        return Poll::Ready(Event::PositionsStored(began));
                    }
                    waited = true;
                    Poll::Pending
                })
                .await;
                (event, waited)
            };
            self.waited |= waited;
            // A client that keeps its socket full never makes this task wait: after
            // so many turns in a row it lets the others run (one thread serves all).
            if waited {
                busy_turns = 0;
            } else {
                busy_turn(&mut busy_turns).await;
            }
            match event {
                // A WebSocket message past its bound (`ws::ws_error`) carries a
                // packet past max_message_size.
                Event::Read(Err(e)) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                    log::info!("{}: {} sent {e}", self.peer, self.client_id);
                    return self.refuse(reason::PACKET_TOO_LARGE);
                }
                Event::Read(Ok(0)) | Event::Read(Err(_)) => return End::Close,
                Event::Read(Ok(_)) => {
                    if let Some(watch) = &self.keep_alive {
                        watch.heard();
                    }
                }
                Event::Woken => {}
                Event::PositionsStored(written) => self.positions_stored(written),
                Event::KeepAliveExpired => {
                    log::info!("{}: {} missed its keepalive", self.peer, self.client_id);
                    return End::Broker(reason::KEEP_ALIVE_TIMEOUT);
                }
            }
        }
    }

    /// Handles every whole packet read.
    async fn handle_buffered(&mut self) -> Result<(), End> {
        while let Some(packet) = self.handle_ready()? {
            self.handle(packet).await?;
            // Answers owed past a session's bound are written before more requests
            // are read: a read buffer of point reads asks for many stored values. A
            // kick ends the wait, as it ends every write's.
            if self.out.len() > self.shared.settings.session_queue_bytes && !self.flush_now()? {
                // Kicked, it answers no more than its bound: the rest is dropped
                // with the connection.
                if self.link.kicked().is_some() {
                    return Ok(());
                }
                Box::pin(self.flush_waiting_unless_kicked()).await?;
            }
        }
        Ok(())
    }

    /// Handles the whole packets read for as long as none needs waiting for, and
    /// returns the first that does, for `handle`.
    fn handle_ready(&mut self) -> Result<Option<Waiting>, End> {
        while let Some(packet) = self.next_packet()? {
            if let Some(waiting) = self.handle_now(packet)? {
                return Ok(Some(waiting));
            }
        }
        Ok(None)
    }

    /// The next whole packet read, decoded.
    fn next_packet(&mut self) -> Result<Option<Packet>, End> {
        let frame = match self
            .reader
            .next_frame(self.shared.settings.max_message_size)
        {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(None),
            Err(FrameError::TooLarge { declared, .. }) => {
                log::info!(
                    "{}: {} sent a {declared}-byte packet",
                    self.peer,
                    self.client_id
                );
                return Err(self.refuse(reason::PACKET_TOO_LARGE));
            }
            Err(FrameError::Decode(e)) => return Err(self.decode_failed(&e)),
        };
        let decoded = codec::decode(frame.first_byte, self.reader.body(&frame), self.protocol);
        self.reader.consume(frame);
        decoded.map(Some).map_err(|e| self.decode_failed(&e))
    }

    fn decode_failed(&self, error: &DecodeError) -> End {
        log::info!("{}: {}: {error}", self.peer, self.client_id);
        match error.reason_code() {
            Some(code) => self.refuse(code),
            None => End::Close,
        }
    }

    /// Ends the connection for a protocol violation: a DISCONNECT with `code` on
    /// MQTT 5, a plain close on 3.1.1, which has no way to say why.
    fn refuse(&self, code: u8) -> End {
        refusal(self.protocol, code)
    }

    /// Handles `packet` when that needs no waiting for; otherwise hands it back.
    fn handle_now(&mut self, packet: Packet) -> Result<Option<Waiting>, End> {
        match packet {
            Packet::PubAck(ack) => self.settle_outbound(ack.packet_id, Answer::PubAck)?,
            Packet::PubComp(ack) => self.settle_outbound(ack.packet_id, Answer::PubComp)?,
            Packet::PingReq => self.queue_packet(&Packet::PingResp),
            Packet::Disconnect(disconnect) => return Err(self.on_disconnect(disconnect)),
            Packet::Auth(_) => return Err(self.refuse(reason::PROTOCOL_ERROR)),
            Packet::Connect(_)
            | Packet::ConnAck(_)
            | Packet::SubAck(_)
            | Packet::UnsubAck(_)
            | Packet::PingResp => {
                log::info!(
                    "{}: {} sent a packet only a server sends",
                    self.peer,
                    self.client_id
                );
                return Err(self.refuse(reason::PROTOCOL_ERROR));
            }
            Packet::Publish(mut publish) => {
                if let Some(step) = self.accept_publish(&mut publish)? {
                    return Ok(Some(Waiting::Publish(publish, step)));
                }
            }
            Packet::PubRec(ack) => return Ok(Some(Waiting::PubRec(ack))),
            Packet::PubRel(ack) => return Ok(Some(Waiting::PubRel(ack))),
            Packet::Subscribe(subscribe) => return Ok(Some(Waiting::Subscribe(subscribe))),
            Packet::Unsubscribe(unsubscribe) => {
                return Ok(Some(Waiting::Unsubscribe(unsubscribe)));
            }
        }
        Ok(None)
    }

    /// Handles a packet whose handling may wait.
    async fn handle(&mut self, packet: Waiting) -> Result<(), End> {
        match packet {
            Waiting::Publish(publish, step) => self.finish_publish(publish, step).await,
            Waiting::PubRec(ack) => {
                let id = ack.packet_id;
                let fits = self.with_session(|s| s.inflight.fits(id, Answer::PubRec));
                if fits == Some(false) {
                    return Err(self.mismatched(id, Answer::PubRec));
                }
                let known = self.with_session(|s| match s.to_keep_released(id) {
                    Some(record) if ack.code < 0x80 => Err(record),
                    _ => Ok(s.release(id, None)),
                });
                let known = match known {
                    Some(Err(record)) => return self.keep_released(id, record).await,
                    Some(Ok(known)) => known,
                    None => false,
                };
                if ack.code >= 0x80 {
                    self.settle_outbound(ack.packet_id, Answer::PubRec)?;
                } else {
                    let code = if known {
                        0
                    } else {
                        reason::PACKET_IDENTIFIER_NOT_FOUND
                    };
                    self.queue_packet(&Packet::PubRel(self.ack(ack.packet_id, code, None)));
                }
                Ok(())
            }
            Waiting::PubRel(ack) => self.on_pubrel(ack.packet_id).await,
            Waiting::Subscribe(subscribe) => self.on_subscribe(subscribe).await,
            Waiting::Unsubscribe(unsubscribe) => {
                Box::pin(self.on_unsubscribe(unsubscribe)).await?;
                Ok(())
            }
        }
    }

    /// Writes the outbound QoS 2 exchange `packet_id` the client answered with PUBREC
    /// to `broker.session.storage` (the `record` it is: a channel's, or the broadcast
    /// log's offset), then releases it and sends its PUBREL. A store that
    /// cannot write it ends the connection, DISCONNECT 0x80 on MQTT 5 and no PUBREL:
    /// the exchange stays published, sent again with DUP when the session resumes
    /// (MQTT-4.4.0-1).
    async fn keep_released(
        &mut self,
        packet_id: u16,
        record: crate::broker::session::KeptRecord,
    ) -> Result<(), End> {
        let shared = self.shared.clone();
        let (provider, held) = {
            let mut broker = shared.broker.borrow_mut();
            let channel = record.0.map(|id| broker.channels.get(id).name.clone());
            let held = crate::storage::Held {
                client_id: crate::broker::released::stored_id(&self.client_id),
                packet_id,
                token: broker.held_token(),
                data: crate::broker::released::encode(channel.as_deref(), record.1),
            };
            (broker.session_store(), held)
        };
        let Some(provider) = provider else {
            self.with_session(|s| s.release(packet_id, None));
            self.queue_packet(&Packet::PubRel(Ack::new(packet_id, 0)));
            return Ok(());
        };
        let put = || provider.put_held(held.clone());
        let written = with_room(&shared, &provider, put).await;
        let mut broker = shared.broker.borrow_mut();
        if let Err(e) = written {
            log::error!(
                "{}: the PUBREC of {} for {packet_id} could not be kept; no PUBREL, the \
                 delivery goes again when the session resumes: {e}",
                self.peer,
                self.client_id
            );
            broker.metrics.storage_failed(&e);
            return Err(self.refuse(reason::UNSPECIFIED_ERROR));
        }
        let key = held.key();
        match broker.session_of(&self.client_id, self.link.id) {
            Some(session) => {
                session.release(packet_id, Some(held.token));
            }
            None => {
                // Taken over while it was written: the session the next connection
                // holds still has the exchange published, and sends it again.
                broker.forget_held(crate::broker::held::HeldRef { provider, key });
                return Ok(());
            }
        }
        drop(broker);
        self.queue_packet(&Packet::PubRel(Ack::new(packet_id, 0)));
        Ok(())
    }

    fn with_session<R>(
        &self,
        f: impl FnOnce(&mut crate::broker::session::Session) -> R,
    ) -> Option<R> {
        let mut broker = self.shared.broker.borrow_mut();
        broker.session_of(&self.client_id, self.link.id).map(f)
    }

    fn on_disconnect(&mut self, disconnect: Disconnect) -> End {
        if let Some(expiry) = disconnect.properties.session_expiry_interval {
            match self.expiry_at_disconnect {
                ExpiryAtDisconnect::Refused if expiry != 0 => {
                    return End::Broker(reason::PROTOCOL_ERROR); // MQTT-3.14.2-2
                }
                ExpiryAtDisconnect::Free => {
                    let capped = expiry.min(self.shared.settings.max_session_expiry);
                    self.with_session(|s| s.expiry = capped);
                }
                ExpiryAtDisconnect::Refused | ExpiryAtDisconnect::Pinned => {}
            }
        }
        // Discarded as it is read (MQTT-3.14.4-3), not once the connection has
        // finished: a CONNECT taking the session over while this one still waits on
        // storage would otherwise find the Will armed and publish it.
        if disconnect.code == reason::NORMAL_DISCONNECTION {
            self.with_session(|s| s.will = None);
        }
        End::Client(disconnect.code)
    }

    /// Moves what the session is owed into the write buffer, as far as the client's
    /// Receive Maximum and the session bound allow: what a resume has still to send
    /// again first, then its queue; with room left, what its shared groups hold for
    /// a member that can take it comes next (B-447).
    fn write_owed(&mut self) -> Result<Reading, End> {
        if self.resending {
            self.resend_unsent();
        }
        loop {
            let reading = self.write_queued()?;
            let collected = self
                .shared
                .broker
                .borrow_mut()
                .collect_backlog(&self.client_id);
            if collected == 0 {
                return Ok(reading);
            }
        }
    }

    /// Moves the session's queue into the write buffer, as far as the client's
    /// Receive Maximum and the session bound allow.
    fn write_queued(&mut self) -> Result<Reading, End> {
        let shared = self.shared.clone();
        let mut broker = shared.broker.borrow_mut();
        let Some((session, metrics)) = broker.session_and_metrics(&self.client_id, self.link.id)
        else {
            return Ok(Reading::Nothing);
        };
        let reading = if session.cursors.is_empty() {
            Reading::Nothing
        } else {
            Reading::Channels
        };
        session.drop_unreadable();
        let now = Instant::now();
        let max_packet = session.max_packet_size as usize;
        while let Some(front) = session.queue.front() {
            if front.qos != QoS::AtMostOnce && !session.window_open_for(front.charge()) {
                break;
            }
            if let Some(offset) = front.logged()
                && !session.log_window_open(offset)
            {
                self.log_window_full = true;
                break;
            }
            let Some(mut delivery) = session.queue.pop_front() else {
                break;
            };
            // A qos2 denial holds whatever the subscription was granted before it
            // (a resumed session, an acl_file re-read) to QoS 1 (B-314).
            if delivery.qos == QoS::ExactlyOnce
                && session
                    .principal
                    .as_ref()
                    .is_some_and(|p| p.denies(crate::acl::Feature::Qos2))
            {
                delivery.qos = QoS::AtLeastOnce;
            }
            let charge = delivery.charge();
            // A broadcast that expired is gone; a channel's record is delivered anyway,
            // its countdown left out (gaps G-16).
            if !delivery.outlives_expiry() && delivery.message.expired(now) {
                session.queued_bytes -= charge;
                session.settle_logged(delivery.logged());
                continue;
            }
            // A group's backlog waits `broker.share.expires_after` at most (B-446).
            if delivery.backlog_expired(now) {
                session.queued_bytes -= charge;
                session.settle_logged(delivery.logged());
                let dropped = &metrics.dropped_share_expired;
                dropped.set(dropped.get() + 1);
                continue;
            }
            let packet_id =
                (delivery.qos != QoS::AtMostOnce).then(|| session.packet_id_for(&mut delivery));
            let publish = publish_packet(&delivery, packet_id, delivery.resent, now, self.protocol);
            if !self.out.publish(&publish, self.protocol, max_packet) {
                if delivery.is_channel_value() {
                    // A channel's record is not skipped: the consumer is told why it
                    // cannot have it, and its position stays (gaps G-17).
                    session.queue.push_front(delivery);
                    return Err(refusal(self.protocol, reason::PACKET_TOO_LARGE));
                }
                // A broadcast over the client's Maximum Packet Size is discarded
                // (MQTT-3.1.2-25).
                session.queued_bytes -= charge;
                session.settle_logged(delivery.logged());
                continue;
            }
            match packet_id {
                Some(id) => {
                    if let (Some(offset), Some(log)) = (delivery.logged(), &mut session.log) {
                        log.sent.insert(offset);
                    }
                    session.inflight.insert(id, Inflight::Published(delivery));
                }
                None => {
                    session.queued_bytes -= charge;
                    // A group's logged delivery collected by a member granted QoS 0 too.
                    session.settle_record(delivery.record);
                }
            }
        }
        session.release_empty_queue();
        Ok(reading)
    }

    /// Ends the connection: the last packet, the Will, the session's fate.
    async fn finish(mut self, end: End) {
        let (will, code) = match end {
            End::Client(reason::NORMAL_DISCONNECTION) => (WillAtEnd::Withdraw, None),
            End::Client(_) => (WillAtEnd::Publish, None),
            End::Broker(code) => (WillAtEnd::Publish, Some(code)),
            End::Close => (WillAtEnd::Publish, None),
            // A broker stopping is not a device dying: the Will stays with the session,
            // due at no moment, and goes if the session ends (C-282, C-287).
            End::Kicked(reason::SERVER_SHUTTING_DOWN) => {
                (WillAtEnd::Keep, Some(reason::SERVER_SHUTTING_DOWN))
            }
            // Taken over or hung up: the session is handed back as at any other end
            // (if a new connection has not taken it already), its Will owed.
            End::Kicked(code) => (WillAtEnd::Publish, Some(code)),
        };
        // Its queue jobs go back, and the session keeps no offer to send again.
        self.queue_connection_ended();
        Box::pin(self.store_positions_now()).await;
        self.shared.broker.borrow_mut().disconnect(
            &self.client_id,
            self.link.id,
            will,
            Instant::now(),
        );
        // A Will published at this end is stored before the record without it is
        // written: a crash between the two publishes it again, never not at all
        // (C-281).
        crate::server::store_unstored(&self.shared).await;
        // The moment it went away, and its Will's due moment (C-278), or its
        // deletion when the session ended with it.
        super::sync_records(&self.shared).await;
        // Before this client can connect again and read them.
        super::drop_lapsed_positions(&self.shared).await;
        super::forget_held(&self.shared).await;
        if let (Some(code), ProtocolVersion::V5) = (code, self.protocol) {
            let mut disconnect = Disconnect::new(code);
            if self.problem_info {
                disconnect.properties.edit().reason_string = Some(refusal_text(code).to_string());
            }
            self.queue_packet(&Packet::Disconnect(disconnect));
        }
        let _ = self.flush().await;
        linger(&mut self.stream).await;
        log::info!("{}: {} disconnected: {end}", self.peer, self.client_id);
    }
}

/// How a protocol violation ends a connection: DISCONNECT with `code` on MQTT 5, a
/// plain close on 3.1.1.
fn refusal(protocol: ProtocolVersion, code: u8) -> End {
    match protocol {
        ProtocolVersion::V5 => End::Broker(code),
        ProtocolVersion::V311 => End::Close,
    }
}

/// The Publish packet for a delivery: the publisher's properties, this subscriber's
/// Subscription Identifiers, and the expiry interval that remains (MQTT-3.3.2-6).
/// On 3.1.1 no property goes on the wire, so none is copied: the hot path of a
/// broadcast to a 3.1.1 subscriber allocates nothing for properties.
pub(crate) fn publish_packet(
    delivery: &Delivery,
    packet_id: Option<u16>,
    dup: bool,
    now: Instant,
    protocol: ProtocolVersion,
) -> Publish {
    let message = &delivery.message;
    let properties = match protocol {
        ProtocolVersion::V5 => delivered_properties(delivery, now),
        ProtocolVersion::V311 => Properties::default(),
    };
    Publish {
        dup,
        qos: delivery.qos,
        retain: delivery.retain,
        topic: message.topic.clone(),
        packet_id,
        properties,
        payload: message.payload.clone(),
    }
}

/// The publisher's properties as one subscriber gets them: its Subscription
/// Identifiers, and the Message Expiry Interval that is left (MQTT 5 3.3.2.3.3).
fn delivered_properties(delivery: &Delivery, now: Instant) -> Properties {
    let mut properties = delivery.message.properties.clone();
    let expiry = delivery.message.expires_at.and_then(|at| {
        let left = at.saturating_duration_since(now);
        // Rounded up from the nanosecond, so a message is never sent with less time
        // than it has, nor as one that never expires while any is left
        // (MQTT-3.3.2-6). Past it, only a channel's record is still sent, without.
        let secs = left.as_nanos().div_ceil(1_000_000_000);
        (secs > 0).then(|| u32::try_from(secs).unwrap_or(u32::MAX))
    });
    // Written only when there is something to write: the first write allocates.
    if expiry.is_some() || properties.message_expiry_interval.is_some() {
        properties.edit().message_expiry_interval = expiry;
    }
    if !delivery.identifiers.is_empty() || !properties.subscription_identifiers.is_empty() {
        let ids = &mut properties.edit().subscription_identifiers;
        ids.clear();
        ids.extend_from_slice(&delivery.identifiers);
    }
    properties
}

/// The Reason String sent beside a refusal, when the client asked for them.
fn refusal_text(code: u8) -> &'static str {
    match code {
        reason::MALFORMED_PACKET => "malformed packet",
        reason::PROTOCOL_ERROR => "protocol error",
        reason::NOT_AUTHORIZED => "not authorized: a reserved topic, or not granted to this client",
        reason::TOPIC_FILTER_INVALID => {
            "topic filter invalid: malformed, too deep, or inside a queue's filter"
        }
        reason::TOPIC_NAME_INVALID => {
            "topic name invalid: too long, too deep, or in a reserved space"
        }
        reason::TOPIC_ALIAS_INVALID => "topic alias above the maximum of 16",
        reason::PACKET_TOO_LARGE => "packet larger than the Maximum Packet Size",
        reason::QUOTA_EXCEEDED => "quota exceeded",
        reason::PAYLOAD_FORMAT_INVALID => {
            "payload is not UTF-8 as its Payload Format Indicator says"
        }
        reason::RECEIVE_MAXIMUM_EXCEEDED => {
            "more QoS 2 exchanges unfinished than the Receive Maximum"
        }
        reason::SESSION_TAKEN_OVER => "another connection took this client id",
        reason::SERVER_SHUTTING_DOWN => "the broker is stopping",
        reason::ADMINISTRATIVE_ACTION => "an operator hung this client up",
        reason::KEEP_ALIVE_TIMEOUT => "nothing received within 1.5 times the keepalive",
        reason::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED => {
            "shared subscriptions are not granted to this client"
        }
        _ => "refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::session::Message;
    use crate::codec::PropertyValues;

    /// MQTT-3.3.2-6: a message with under a second of its expiry left goes out with
    /// 1 s, under a millisecond too, never as one that does not expire; past it (a
    /// channel's record, which outlives it) with none.
    #[test]
    fn the_expiry_sent_is_rounded_up_from_the_nanosecond() {
        let now = Instant::now();
        let message = |expires_at: Option<Instant>| {
            let properties = Properties::from(PropertyValues {
                message_expiry_interval: Some(5),
                ..PropertyValues::default()
            });
            let mut message = Message::published(
                Arc::from("t"),
                Arc::from(&b"x"[..]),
                (QoS::AtLeastOnce, false),
                properties,
                Arc::from("p"),
                now,
            );
            if expires_at.is_some() {
                message.expires_at = expires_at;
            }
            Delivery {
                message: Arc::new(message),
                qos: QoS::AtLeastOnce,
                retain: false,
                identifiers: Box::new([]),
                record: None,
                held: None,
                resent: false,
                untracked: crate::broker::session::Untracked::No,
            }
        };
        let sent =
            |delivery: &Delivery, at| delivered_properties(delivery, at).message_expiry_interval;
        assert_eq!(sent(&message(None), now), Some(5));
        let nearly = message(Some(now + Duration::from_micros(300)));
        assert_eq!(sent(&nearly, now), Some(1));
        assert_eq!(sent(&nearly, now + Duration::from_millis(1)), None);
    }
}
