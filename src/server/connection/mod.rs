//! One connection: a task that owns its socket from CONNECT to close.
//!
//! The loop is: handle every whole packet buffered, write what the session is owed,
//! then wait for whichever comes first of more bytes, a wake-up from the broker, or
//! the keepalive deadline. Nothing else ever writes to this socket.

use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_lite::future;
use smol::io::AsyncWriteExt;

mod acl;
pub(crate) mod channels;
pub(crate) mod keep_alive;
mod outbox;
mod queue;
mod verbs;

use channels::{Routing, route_now, route_rest};
pub(crate) use channels::{drop_unneeded_log, log_owed, route, route_releasing, with_room};
use verbs::Verb;

use super::Shared;
use super::frame::{FrameError, FrameReader};
use super::slots::{Place, Slot};
use super::socket::Socket;
use crate::broker::TOPIC_ALIAS_MAXIMUM;
use crate::broker::session::{Delivery, HeldQos2, Inflight, Message, Subscription};
use crate::broker::{Accepted, ConnLink, WillAtEnd, partition, topic};
use crate::codec::reason;
use crate::codec::{
    self, Ack, ConnAck, Connect, DecodeError, Disconnect, Packet, Properties, PropertyValues,
    ProtocolVersion, Publish, QoS, SubAck, Subscribe, UnsubAck, Unsubscribe,
};

/// The SUBSCRIBE property asking to be told of deletions on latest channels.
const DELETIONS: &str = "saguin-deletions";
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

/// What a publish waits for once `Conn::accept_publish` has done what needs no
/// waiting: for an ordinary broadcast at QoS 0 or 1, nothing.
enum PublishStep {
    /// A `$saguin/...` verb, to perform and answer.
    Verb(Verb),
    /// A QoS 2 publish, to keep in storage before its PUBREC.
    StoreHeld(u16, Arc<Message>),
    /// The rest of its routing: a channel's store, a retained write, the log.
    Route(Routing),
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
    /// The client sent DISCONNECT; `will` says whether its Will is still owed (0x04).
    Client { will: bool },
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
            End::Client { will: false } => f.write_str("DISCONNECT from the client"),
            End::Client { will: true } => {
                f.write_str("DISCONNECT 0x04 from the client: its Will is published")
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
    /// The Session Expiry Interval the CONNECT asked for was 0 (MQTT-3.14.2-2).
    connected_with_zero_expiry: bool,
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
    /// alone does not say which rule refused (A-207).
    puback_reason: Option<Box<str>>,
    /// This client under the acl_file, when one is held (`connection/acl.rs`).
    acl: Option<Rc<crate::acl::Principal>>,
    /// A wait for the client or the broker was not over at once since the last
    /// packet was handled.
    waited: bool,
    /// `write_owed` stopped at a logged delivery: the Receive Maximum of them are on
    /// the wire above the stored log position, which is written now (B-459).
    log_window_full: bool,
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
    let established = Box::pin(establish(stream, peer, shared, slot, gate, websocket));
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

/// Everything from the first byte to the CONNACK: PROXY header, WebSocket upgrade,
/// CONNECT, credentials, takeover. `None` when the connection ended there.
async fn establish(
    stream: Socket,
    mut peer: String,
    shared: Rc<Shared>,
    slot: Slot,
    gate: Rc<crate::auth::Gate>,
    websocket: Option<Rc<super::ws::OriginPolicy>>,
) -> Option<(Box<Conn>, Slot)> {
    let mut reader = FrameReader::default();
    // One deadline for the TLS handshake, the WebSocket upgrade and the CONNECT
    // together (B-062).
    let deadline = Instant::now() + shared.settings.connect_timeout;
    let (stream, certificate) =
        super::proxy::admit(&gate, stream, deadline, &mut peer, &shared).await?;
    let (mut stream, slot) = match websocket {
        None => (stream, slot),
        Some(policy) => {
            let max = shared.settings.max_message_size as usize;
            let upgrade = super::ws::upgrade(stream, slot, &policy, max, deadline, &peer);
            match upgrade.await {
                Some(upgraded) => upgraded,
                None => return None,
            }
        }
    };
    let connect = match read_connect(&mut stream, &mut reader, &shared, deadline).await {
        Ok(connect) => connect,
        Err(reply) => {
            shared
                .broker
                .borrow()
                .metrics
                .refuse_connection("unreadable connect");
            drop(slot);
            if let Some(bytes) = reply {
                close_with(&mut stream, &bytes, &shared).await;
            }
            log::debug!("{peer}: connection refused before CONNECT was read");
            return None;
        }
    };
    reader.connected();
    let protocol = connect.protocol;
    // Mutable: a features denial may make the session end with the connection.
    let mut connect = connect;
    let admitted = match check_connect(&connect, &shared) {
        Some(code) => Err(code),
        None => crate::auth::check_connect(&gate, &mut connect, certificate, &peer),
    };
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(code) => {
            // Refusals given to clients are warnings (B-021).
            log::warn!(
                "{peer}: CONNECT from {:?} refused with 0x{code:02X}",
                connect.client_id
            );
            shared
                .broker
                .borrow()
                .metrics
                .refuse_connection(connection_refusal_label(code));
            let bytes = encode_one(
                &Packet::ConnAck(connack(protocol, false, code, Properties::default())),
                protocol,
            );
            drop(slot);
            close_with(&mut stream, &bytes, &shared).await;
            return None;
        }
    };
    let (link, woken) = ConnLink::new(shared.next_link_id());
    // What a Clean Start replaces ends before the CONNACK; a store that cannot end
    // it refuses the CONNECT 0x83 (A-234, A-261).
    let discarded = if connect.clean_start && !connect.client_id.is_empty() {
        discard_positions(&shared, &connect.client_id, &peer).await
    } else {
        Ok(())
    };
    // An assigned id is chosen now, so the record written below is kept under it.
    let assigned = connect.client_id.is_empty();
    if assigned {
        connect.client_id = shared.broker.borrow_mut().assign_client_id().to_string();
    }
    take_over(&shared, &connect.client_id).await;
    let asked_zero_expiry = connect.properties.session_expiry_interval.unwrap_or(0) == 0;
    let mut cut_for_room = false;
    let stored = match discarded {
        Err(e) => Err(e),
        Ok(()) => store_connect(&shared, &connect, &admitted.user).await,
    };
    let stored = match stored {
        Err(e) if e.is_full() && connect.will.is_none() => {
            // B-469: a session the store has no room for is accepted ending with its
            // connection, and told so; a Will is refused below instead (B-461), since
            // MQTT has no way to say "your Will is not held".
            log::warn!(
                "{peer}: {:?} asked for a session that outlives its connection; the session \
                 store has no room ({e}), so it ends with this connection",
                connect.client_id
            );
            {
                let broker = shared.broker.borrow();
                let dropped = &broker.metrics.sessions_dropped_full;
                dropped.set(dropped.get() + 1);
            }
            cut_for_room = true;
            match protocol {
                ProtocolVersion::V5 => connect.properties.edit().session_expiry_interval = Some(0),
                ProtocolVersion::V311 if !connect.clean_start => {
                    connect.clean_start = true;
                    if let Err(e) = discard_positions(&shared, &connect.client_id, &peer).await {
                        return refuse_unstored(&shared, &peer, &connect, e, slot, stream).await;
                    }
                }
                ProtocolVersion::V311 => {}
            }
            // What remains to write: the deletion of the record of the session it
            // replaces, if there was one.
            store_connect(&shared, &connect, &admitted.user).await
        }
        other => other,
    };
    if let Err(e) = stored {
        return refuse_unstored(&shared, &peer, &connect, e, slot, stream).await;
    }
    let mut accepted = shared.broker.borrow_mut().connect(&connect, link.clone());
    accepted.assigned = assigned;
    accepted.cut_for_room = cut_for_room;
    // A Clean Start ended the session it replaces: its held QoS 2 publishes leave
    // storage before the CONNACK, so a crash cannot hand them to this one.
    super::forget_held(&shared).await;
    let mut conn = Conn {
        stream,
        peer: peer.into_boxed_str(),
        reader,
        out: outbox::Outbox::default(),
        protocol,
        client_id: accepted.client_id.clone(),
        link,
        woken,
        keep_alive: None,
        aliases: None,
        problem_info: connect.properties.request_problem_information != Some(0),
        connected_with_zero_expiry: asked_zero_expiry,
        positions_stored_at: None,
        durable: false,
        positions_writing: None,
        positions_timer: None,
        suback_reason: None,
        over_max_subscriptions: false,
        puback_reason: None,
        acl: admitted.principal.clone(),
        waited: false,
        log_window_full: false,
        shared,
    };
    if accepted.session_present {
        conn.reopen_restored_cursors().await;
    }
    conn.keep_alive = conn
        .send_connack(&connect, &accepted)
        .map(|grace| conn.shared.keep_alive.watch(grace));
    conn.bind_acl_to_session();
    conn.durable = conn
        .with_session(|s| s.outlives_connection())
        .unwrap_or(false);
    // Who holds the session, and on which door, for /v1/operations/users (B-175).
    conn.with_session(|s| {
        s.user = crate::broker::session::user_named(&admitted.user);
        s.listener = Some(gate.door.clone());
    });
    // The door by the name B-175 gives it, as certificate errors name it.
    log::info!(
        "{}: {} connected ({protocol:?}, session present {}) listener={}",
        conn.peer,
        conn.client_id,
        accepted.session_present,
        gate.door
    );
    Some((Box::new(conn), slot))
}

/// Refuses a CONNECT whose session the store could not keep, or whose replaced
/// session it could not end: stored before acknowledged, and the refusal changes
/// nothing (B-462, C-270, A-234). 0x97 when the store is full, 0x83 otherwise.
async fn refuse_unstored(
    shared: &Shared,
    peer: &str,
    connect: &Connect,
    e: crate::storage::StorageError,
    slot: Slot,
    mut stream: Socket,
) -> Option<(Box<Conn>, Slot)> {
    let code = if e.is_full() {
        reason::QUOTA_EXCEEDED
    } else {
        reason::IMPLEMENTATION_SPECIFIC_ERROR
    };
    log::warn!(
        "{peer}: CONNECT from {:?} refused with 0x{code:02X}: its session could not be stored",
        connect.client_id
    );
    shared
        .broker
        .borrow()
        .metrics
        .refuse_connection(connection_refusal_label(code));
    // What filled, for a Will there is no room for (B-461).
    let properties = Properties::from(PropertyValues {
        reason_string: e
            .is_full()
            .then(|| format!("the session store has no room for this Will: {e}")),
        ..PropertyValues::default()
    });
    let ack = connack(connect.protocol, false, code, properties);
    let bytes = encode_one(&Packet::ConnAck(ack), connect.protocol);
    drop(slot);
    close_with(&mut stream, &bytes, shared).await;
    None
}

/// Clean Start discards what a durable consumer kept (gaps G-11): its channel
/// positions and its place in the broadcast log, in every provider; the first
/// provider that fails stops it.
async fn discard_positions(
    shared: &Shared,
    client_id: &str,
    peer: &str,
) -> Result<(), crate::storage::StorageError> {
    let providers = shared.broker.borrow().channels.providers();
    for provider in providers {
        if let Err(e) = provider.drop_positions(client_id).await {
            log::error!("{peer}: positions of {client_id:?} not discarded: {e}");
            return Err(e);
        }
    }
    Ok(())
}

/// Writes what a CONNECT changes in `broker.session.storage` before its CONNACK: the
/// record of a session that outlives its connection, with the Will the CONNECT arms
/// (B-460), or the deletion of the record a Clean Start or a zero expiry ends.
async fn store_connect(
    shared: &Shared,
    connect: &Connect,
    user: &str,
) -> Result<(), crate::storage::StorageError> {
    let id = &connect.client_id;
    let (write, refused) = {
        let broker = shared.broker.borrow();
        (
            broker.connect_record(connect, id, user),
            broker.record_refused(id),
        )
    };
    let record = match write {
        crate::broker::RecordWrite::Put(record) => Some(record),
        crate::broker::RecordWrite::Delete => None,
        // A write the provider refused before - a withdrawn Will, a deletion - lands
        // before this client connects again, or the CONNECT is refused (C-286).
        crate::broker::RecordWrite::Nothing if refused => {
            shared.broker.borrow().record_of(id, &[], false)
        }
        crate::broker::RecordWrite::Nothing => return Ok(()),
    };
    super::write_session_record(shared, id, record).await?;
    if refused {
        // What this wrote supersedes what was waiting to be written again.
        let id = Arc::from(id.as_str());
        shared.broker.borrow_mut().record_written(&id, true);
    }
    Ok(())
}

/// Answers a socket that held an overflow place but got no slot: once the opening
/// bytes of its CONNECT name the protocol, CONNACK 0x89 Server busy (3.1.1: 0x03), no
/// credential checked (B-051); by `deadline` it is closed with nothing written (B-052).
/// Its `place` is given back before the answer is written, as a slot is (B-054).
pub(crate) async fn refuse_busy(
    stream: Socket,
    peer: &str,
    shared: &Shared,
    gate: &crate::auth::Gate,
    deadline: Instant,
    place: Place,
) {
    let mut peer = peer.to_string();
    let Some((mut stream, _)) = Box::pin(super::proxy::admit(
        gate, stream, deadline, &mut peer, shared,
    ))
    .await
    else {
        return;
    };
    let mut reader = FrameReader::default();
    let level = loop {
        let head = reader.peek(16);
        if head.first().is_some_and(|first| first >> 4 != 1) {
            return; // not a CONNECT: nothing to answer
        }
        if let Some(level) = connect_level(head) {
            break level;
        }
        if head.len() == 16 {
            // A CONNECT's level is within its first 12 bytes: this is not one, and
            // reading on would let a sender keep this task reading past the deadline.
            return;
        }
        // What is already in the socket first: a task that first runs past the
        // deadline would otherwise see the timer win and reset an unread CONNECT.
        match reader.try_fill(&mut stream).await {
            Ok(0) => {}
            Ok(_) => continue,
            Err(_) => return,
        }
        let read = future::or(async { Some(reader.fill(&mut stream).await) }, async {
            smol::Timer::at(deadline).await;
            None
        });
        match read.await {
            Some(Ok(n)) if n > 0 => {}
            _ => return,
        }
    };
    let protocol = if level == 5 {
        ProtocolVersion::V5
    } else {
        ProtocolVersion::V311
    };
    log::info!("{peer}: refused with Server busy: every connection slot is taken");
    shared
        .broker
        .borrow()
        .metrics
        .refuse_connection("server busy");
    let ack = connack(protocol, false, reason::SERVER_BUSY, Properties::default());
    let bytes = encode_one(&Packet::ConnAck(ack), protocol);
    drop(place);
    Box::pin(close_with(&mut stream, &bytes, shared)).await;
}

/// Takes a session over from the connection holding it: that connection is told to end
/// (0x8E), finishes what it has already read and hands the session back, and only then
/// does the new one resume it, so nothing the client sent before reconnecting is lost.
/// One that does not finish within `TAKEOVER_WAIT` is taken over regardless.
async fn take_over(shared: &Shared, client_id: &str) {
    const TAKEOVER_WAIT: Duration = Duration::from_secs(1);
    let Some(old) = shared.broker.borrow().holder(client_id) else {
        return;
    };
    old.kick(reason::SESSION_TAKEN_OVER);
    let deadline = Instant::now() + TAKEOVER_WAIT;
    while Instant::now() < deadline
        && shared
            .broker
            .borrow()
            .holder(client_id)
            .is_some_and(|h| h.id == old.id)
    {
        smol::Timer::after(Duration::from_millis(2)).await;
    }
}

/// Reads the CONNECT by `deadline` (accept + `connect_timeout`). On failure, returns
/// the bytes to send
/// before closing, if the refused protocol has a way to say it.
async fn read_connect(
    stream: &mut Socket,
    reader: &mut FrameReader,
    shared: &Shared,
    deadline: Instant,
) -> Result<Box<Connect>, Option<Vec<u8>>> {
    loop {
        match reader.next_frame(shared.settings.max_connect_size) {
            Ok(Some(frame)) => {
                if frame.first_byte >> 4 != 1 {
                    return Err(None); // the first packet must be CONNECT (MQTT-3.1.0-1)
                }
                let result = codec::decode_connect(frame.first_byte, reader.body(&frame));
                reader.consume(frame);
                return result
                    .map(Box::new)
                    .map_err(|e| connect_refusal(e.protocol, &e.error));
            }
            Ok(None) => {}
            Err(FrameError::Decode(_)) => return Err(None),
            Err(FrameError::TooLarge { first_byte, .. }) => {
                // Learn the level from the bytes at hand: an MQTT 5 client is told 0x95.
                let speaks_v5 = first_byte >> 4 == 1 && connect_level(reader.peek(16)) == Some(5);
                let reply = speaks_v5.then(|| {
                    let ack = connack(
                        ProtocolVersion::V5,
                        false,
                        reason::PACKET_TOO_LARGE,
                        Properties::default(),
                    );
                    encode_one(&Packet::ConnAck(ack), ProtocolVersion::V5)
                });
                return Err(reply);
            }
        }
        // A stopping broker closes a socket still short of its CONNECT at once (B-065).
        let give_up = future::or(
            async {
                smol::Timer::at(deadline).await;
            },
            shared.stopped(),
        );
        let read = future::or(async { Some(reader.fill(stream).await) }, async {
            give_up.await;
            None
        });
        match read.await {
            Some(Ok(n)) if n > 0 => {}
            _ => return Err(None),
        }
    }
}

/// The protocol level byte of a CONNECT whose first bytes are `head`.
fn connect_level(head: &[u8]) -> Option<u8> {
    let header = codec::read_fixed_header(head).ok()??;
    head.get(header.header_len + 6).copied()
}

/// The CONNACK that answers an unreadable CONNECT, in the protocol it declared.
fn connect_refusal(protocol: Option<ProtocolVersion>, error: &DecodeError) -> Option<Vec<u8>> {
    match (protocol, error) {
        // MQTT 3.1 and older levels: their CONNACK has the same two bytes as 3.1.1's.
        (_, DecodeError::UnsupportedProtocol(level)) if *level < 4 => Some(vec![
            0x20,
            0x02,
            0x00,
            reason::v311::UNACCEPTABLE_PROTOCOL_VERSION,
        ]),
        (_, DecodeError::UnsupportedProtocol(_)) => {
            let ack = connack(
                ProtocolVersion::V5,
                false,
                reason::UNSUPPORTED_PROTOCOL_VERSION,
                Properties::default(),
            );
            Some(encode_one(&Packet::ConnAck(ack), ProtocolVersion::V5))
        }
        (Some(ProtocolVersion::V5), e) => {
            let code = e.reason_code()?;
            let ack = connack(ProtocolVersion::V5, false, code, Properties::default());
            Some(encode_one(&Packet::ConnAck(ack), ProtocolVersion::V5))
        }
        (Some(ProtocolVersion::V311), e) => Some(vec![0x20, 0x02, 0x00, e.v311_connect_code()?]),
        _ => None,
    }
}

/// The refusal a decoded CONNECT earns, if any (RFC 0002 "At CONNECT").
fn check_connect(connect: &Connect, shared: &Shared) -> Option<u8> {
    let settings = &shared.settings;
    if connect.protocol == ProtocolVersion::V311 && settings.min_protocol == ProtocolVersion::V5 {
        return Some(reason::UNSUPPORTED_PROTOCOL_VERSION);
    }
    if connect.properties.authentication_method.is_some() {
        return Some(reason::BAD_AUTHENTICATION_METHOD);
    }
    if connect
        .properties
        .user_properties
        .iter()
        .any(|(k, _)| k.starts_with("saguin-"))
    {
        return Some(reason::IMPLEMENTATION_SPECIFIC_ERROR);
    }
    let id = &connect.client_id;
    // Bytes: the bound is on durable state the client chooses the size of (A-032).
    if id.len() > settings.max_client_id_length
        || id.chars().any(is_control)
        || (id.is_empty() && !connect.clean_start)
    {
        return Some(reason::CLIENT_IDENTIFIER_NOT_VALID);
    }
    if connect
        .username
        .as_deref()
        .is_some_and(|u| u.chars().any(|c| c == '\0' || is_control(c)))
    {
        log::warn!(
            "CONNECT from {:?}: its user name holds U+0000 or a control character, which no name may (B-200)",
            connect.client_id
        );
        return Some(reason::BAD_USER_NAME_OR_PASSWORD);
    }
    if let Some(will) = &connect.will
        && let Err(code) = check_topic_name(&will.topic, settings)
    {
        // A Will that could never be delivered (RFC 0003 "Last Will").
        return Some(if code == reason::NOT_AUTHORIZED {
            reason::TOPIC_NAME_INVALID
        } else {
            code
        });
    }
    // A Will bound for a dead-letter channel could never be stored (A-245, C-254).
    if let Some(will) = &connect.will
        && shared.broker.borrow().channels.is_dead_letter(&will.topic)
    {
        return Some(reason::TOPIC_NAME_INVALID);
    }
    None
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
    let headers = &properties.user_properties;
    let header_bytes: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    headers.len() > settings.max_header_count || header_bytes > settings.max_header_bytes
}

/// Whether a topic name may be published to (RFC 0002 "Publishing"): `Err` carries the
/// reason code.
pub(crate) fn check_topic_name(
    topic_name: &str,
    settings: &crate::broker::Settings,
) -> Result<(), u8> {
    if crate::codec::has_wildcard(topic_name) {
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

fn connack(
    protocol: ProtocolVersion,
    session_present: bool,
    code: u8,
    properties: Properties,
) -> ConnAck {
    let code = match protocol {
        ProtocolVersion::V5 => code,
        ProtocolVersion::V311 => connack_v311(code),
    };
    ConnAck {
        session_present: session_present && code == 0,
        code,
        properties,
    }
}

/// The label a refused connection is counted under (RFC 0005, proposed in gaps §4).
fn connection_refusal_label(code: u8) -> &'static str {
    match code {
        reason::SERVER_BUSY => "server busy",
        reason::UNSUPPORTED_PROTOCOL_VERSION => "unsupported protocol version",
        reason::CLIENT_IDENTIFIER_NOT_VALID => "client identifier not valid",
        reason::BAD_USER_NAME_OR_PASSWORD => "bad user name or password",
        reason::BAD_AUTHENTICATION_METHOD => "bad authentication method",
        reason::TOPIC_NAME_INVALID => "topic name invalid",
        reason::PACKET_TOO_LARGE => "packet too large",
        reason::QUOTA_EXCEEDED => "session store full",
        reason::IMPLEMENTATION_SPECIFIC_ERROR => "storage error",
        _ => "not authorized",
    }
}

/// The 3.1.1 CONNACK return code for an MQTT 5 CONNACK refusal (RFC 0002 "At CONNECT").
fn connack_v311(code: u8) -> u8 {
    match code {
        reason::SUCCESS => reason::v311::ACCEPTED,
        reason::UNSUPPORTED_PROTOCOL_VERSION => reason::v311::UNACCEPTABLE_PROTOCOL_VERSION,
        reason::CLIENT_IDENTIFIER_NOT_VALID => reason::v311::IDENTIFIER_REJECTED,
        reason::BAD_USER_NAME_OR_PASSWORD => reason::v311::BAD_USER_NAME_OR_PASSWORD,
        reason::SERVER_BUSY | reason::IMPLEMENTATION_SPECIFIC_ERROR => {
            reason::v311::SERVER_UNAVAILABLE
        }
        _ => reason::v311::NOT_AUTHORIZED,
    }
}

fn encode_one(packet: &Packet, protocol: ProtocolVersion) -> Vec<u8> {
    let mut out = Vec::new();
    codec::encode(packet, protocol, &mut out);
    out
}

/// Writes all of `bytes`, giving up after `timeout` (`limits.write_timeout`; `None`
/// waits as long as it takes).
async fn write_with_timeout(
    stream: &mut Socket,
    bytes: &[u8],
    timeout: Option<Duration>,
) -> std::io::Result<()> {
    let write = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    with_write_timeout(write, timeout).await
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

/// Writes a last packet and closes.
async fn close_with(stream: &mut Socket, bytes: &[u8], shared: &Shared) {
    let _ = write_with_timeout(stream, bytes, shared.settings.write_timeout).await;
    linger(stream).await;
}

/// Closes our side and discards what the peer still sends, briefly, so the last
/// packet we wrote is not lost to a reset: closing a socket with unread bytes makes
/// the kernel send RST, which can overtake a CONNACK or DISCONNECT still in flight.
/// Memory stays bounded: the rest is read into a small buffer and dropped.
async fn linger(stream: &mut Socket) {
    const LINGER: Duration = Duration::from_millis(500);
    const MAX_DISCARD: usize = 1 << 20;
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
        smol::Timer::after(LINGER).await;
    })
    .await;
}

/// Deliveries a publisher's batch may hand out and still let them be written before
/// its own acknowledgements (`Conn::serve`).
const DELIVER_FIRST_UP_TO: u64 = 8;

/// What one wait of the main loop ended with.
enum Event {
    Read(std::io::Result<usize>),
    Woken,
    KeepAliveExpired,
    /// The positions write begun beside the loop ended: when it began, if it wrote.
    PositionsStored(Option<Instant>),
}

impl Conn {
    /// Sends the CONNACK and, for a resumed session, what was on the wire. Returns the
    /// keepalive the connection runs with.
    fn send_connack(&mut self, connect: &Connect, accepted: &Accepted) -> Option<Duration> {
        let settings = &self.shared.settings;
        let mut properties = Properties::default();
        let mut keep_alive = connect.keep_alive;
        if self.protocol == ProtocolVersion::V5 {
            properties.edit().topic_alias_maximum = Some(TOPIC_ALIAS_MAXIMUM);
            properties.edit().maximum_packet_size = Some(settings.max_message_size);
            properties.edit().retain_available = Some(1);
            properties.edit().receive_maximum = Some(settings.receive_maximum);
            if accepted.cut_for_room
                || connect.properties.session_expiry_interval.unwrap_or(0)
                    != accepted.session_expiry
            {
                properties.edit().session_expiry_interval = Some(accepted.session_expiry);
            }
            if accepted.assigned {
                properties.edit().assigned_client_identifier = Some(accepted.client_id.to_string());
            }
            if let Some(max) = settings.max_keepalive
                && (keep_alive == 0 || keep_alive > max)
            {
                properties.edit().server_keep_alive = Some(max);
                keep_alive = max;
            }
            self.features_in_connack(&mut properties);
        }
        // A 3.1.1 client cannot be told a Server Keep Alive, so it keeps the one it
        // asked for: a ceiling it never heard of would only cut it off (B-076).
        let ack = connack(
            self.protocol,
            accepted.session_present,
            reason::SUCCESS,
            properties,
        );
        self.queue_packet(&Packet::ConnAck(ack));
        if accepted.session_present {
            self.resend_inflight();
        }
        (keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500))
    }

    /// Re-sends, DUP set, every exchange that was on the wire when the session's last
    /// connection ended (MQTT-4.4.0-1).
    fn resend_inflight(&mut self) {
        self.strip_queue_offers();
        let shared = self.shared.clone();
        let mut broker = shared.broker.borrow_mut();
        let Some(session) = broker.session_of(&self.client_id, self.link.id) else {
            return;
        };
        let now = Instant::now();
        let mut packets = Vec::new();
        // In the order first sent, which the identifiers do not tell (MQTT-4.6.0-5).
        for (id, inflight) in session.inflight.in_send_order() {
            packets.push(match inflight {
                Inflight::Published(d) => {
                    Packet::Publish(publish_packet(d, Some(id), true, now, self.protocol))
                }
                Inflight::Released(..) => Packet::PubRel(Ack::new(id, 0)),
            });
        }
        drop(broker);
        for packet in &packets {
            self.queue_packet(packet);
        }
    }

    fn queue_packet(&mut self, packet: &Packet) {
        self.out.packet(packet, self.protocol);
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
    /// waits (B-058). What is left stays in the outbox, for `finish` to write.
    async fn flush_waiting_unless_kicked(&mut self) -> Result<(), End> {
        let Conn {
            out,
            stream,
            woken,
            link,
            shared,
            ..
        } = self;
        let mut woken_meanwhile = false;
        let write = with_write_timeout(out.write_to(stream), shared.settings.write_timeout);
        let kicked = async {
            loop {
                woken.recv().await;
                if link.kicked().is_some() {
                    return None;
                }
                woken_meanwhile = true;
            }
        };
        let written = future::or(async { Some(write.await) }, kicked).await;
        // A wake-up taken while the write waited is the next turn's.
        if woken_meanwhile {
            self.link.wake();
        }
        match written {
            Some(result) => self.flushed(result),
            None => Ok(()),
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
            match self.write_owed() {
                // Only a session reading channels is asked what to read: the question
                // looks the session up again.
                Ok(Reading::Channels) if self.next_read().is_some() => {
                    Box::pin(self.pump_channels()).await;
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
            match event {
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
            Packet::PubAck(ack) => self.settle_outbound(ack.packet_id, true),
            Packet::PubComp(ack) => self.settle_outbound(ack.packet_id, false),
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
                    self.settle_outbound(ack.packet_id, false);
                } else {
                    let code = if known {
                        0
                    } else {
                        reason::PACKET_IDENTIFIER_NOT_FOUND
                    };
                    self.queue_packet(&Packet::PubRel(Ack::new(ack.packet_id, code)));
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
    /// log's offset), then releases it and sends its PUBREL (A-254). A store that
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

    /// Resolves a topic alias (MQTT 5 section 3.3.2.3.4) into the publish's topic.
    fn resolve_alias(&mut self, publish: &mut Publish) -> Result<(), End> {
        let Some(alias) = (publish.properties.present_mut()).and_then(|p| p.topic_alias.take())
        else {
            if publish.topic.is_empty() {
                return Err(self.refuse(reason::PROTOCOL_ERROR));
            }
            return Ok(());
        };
        let protocol = self.protocol;
        let aliases = self.aliases.get_or_insert_with(Default::default);
        let Some(slot) = alias
            .checked_sub(1)
            .and_then(|i| aliases.get_mut(usize::from(i)))
        else {
            return Err(refusal(protocol, reason::TOPIC_ALIAS_INVALID));
        };
        if publish.topic.is_empty() {
            match slot {
                Some(topic) => publish.topic = topic.clone(),
                None => return Err(refusal(protocol, reason::PROTOCOL_ERROR)),
            }
        } else {
            *slot = Some(publish.topic.clone());
        }
        Ok(())
    }

    /// Handles a publish as far as it goes without waiting, and says what is left:
    /// `None` once it is answered (or dropped, at QoS 0).
    fn accept_publish(&mut self, publish: &mut Publish) -> Result<Option<PublishStep>, End> {
        self.resolve_alias(publish)?;
        if let Some(end) = self.features_refuse_publish(publish) {
            return Err(end);
        }
        if let Some(answered) = self.queue_response(publish) {
            return answered.map(|()| None);
        }
        if let Some(verb) = Verb::of(&publish.topic) {
            // A 3.1.1 client cannot name a Response Topic: asking to hang somebody up
            // ends its own connection, whatever the QoS (B-302).
            if matches!(verb, Verb::HangUp) && self.protocol == ProtocolVersion::V311 {
                return Err(End::Close);
            }
            // A point read or a catalogue question at QoS 0 has no PUBACK to carry
            // its refusals, so it is dropped unread (C-005, B-327).
            if publish.qos == QoS::AtMostOnce && verb.needs_acknowledgement() {
                return Ok(None);
            }
            return Ok(Some(PublishStep::Verb(verb)));
        }
        let shared = self.shared.clone();
        let settings = &shared.settings;
        let refused = |label| {
            shared.broker.borrow().metrics.refuse_publish(label);
        };
        let mut over_rate = false;
        let code = match check_topic_name(&publish.topic, settings) {
            Err(code) => {
                refused(if code == reason::NOT_AUTHORIZED {
                    "not authorized"
                } else {
                    "topic name invalid"
                });
                code
            }
            Ok(())
                if publish.properties.payload_format_indicator == Some(1)
                    && std::str::from_utf8(&publish.payload).is_err() =>
            {
                refused("payload format invalid");
                reason::PAYLOAD_FORMAT_INVALID
            }
            Ok(()) => match self.check_quota(publish) {
                Quota::Within => reason::SUCCESS,
                Quota::Over { rate } => {
                    over_rate = rate;
                    reason::QUOTA_EXCEEDED
                }
            },
        };
        // Asked after the rate, which spends before any authorization (B-120).
        let code = match self.authorize_publish(code, publish) {
            // Into a dead-letter channel, refused on the PUBREC, before anything is
            // held (A-166, A-222): at the PUBREL it would hold the message for a
            // retry that can never succeed. QoS 0 and 1 are refused as they are
            // stored (`channels::store`), the topic resolved once.
            reason::SUCCESS
                if publish.qos == QoS::ExactlyOnce
                    && shared
                        .broker
                        .borrow()
                        .channels
                        .is_dead_letter(&publish.topic) =>
            {
                refused("not authorized");
                reason::NOT_AUTHORIZED
            }
            code => code,
        };
        if code != reason::SUCCESS {
            // Every refused publish is logged, whatever its QoS (A-185); one over its
            // rate at debug, since such a client refuses itself many times a second
            // (B-123).
            let level = if over_rate {
                log::Level::Debug
            } else {
                log::Level::Info
            };
            log::log!(
                level,
                "{}: publish by {} to {:?} refused 0x{code:02X}",
                self.peer,
                self.client_id,
                publish.topic
            );
            return self.answer_publish(publish, code).map(|()| None);
        }
        let code = if publish.qos == QoS::ExactlyOnce {
            let packet_id = publish.packet_id.unwrap_or(0);
            match self.hold_qos2(publish, packet_id)? {
                Hold::Answer(code) => code,
                Hold::Store(message) => {
                    return Ok(Some(PublishStep::StoreHeld(packet_id, message)));
                }
            }
        } else {
            match route_now(&self.shared, Arc::new(self.message_from(publish))) {
                Routing::Done(code) => code,
                routing => return Ok(Some(PublishStep::Route(routing))),
            }
        };
        self.answer_publish(publish, code).map(|()| None)
    }

    /// What `accept_publish` left: performed, stored or routed, then answered.
    async fn finish_publish(&mut self, publish: Publish, step: PublishStep) -> Result<(), End> {
        let code = match step {
            PublishStep::Verb(verb) => return self.answer_verb(verb, &publish).await,
            PublishStep::StoreHeld(packet_id, message) => {
                Box::pin(self.store_held(packet_id, message)).await
            }
            PublishStep::Route(routing) => route_rest(&self.shared, routing).await,
        };
        self.answer_publish(&publish, code)
    }

    /// Performs a `$saguin/...` verb and answers it: its code, and the reply to its
    /// Response Topic if it has one.
    async fn answer_verb(&mut self, verb: Verb, publish: &Publish) -> Result<(), End> {
        let (code, reply) = self.perform(verb, publish).await;
        if code != reason::SUCCESS {
            log::info!(
                "{}: {} {:?} refused 0x{code:02X}",
                self.peer,
                self.client_id,
                publish.topic
            );
            let label = match code {
                reason::NOT_AUTHORIZED => "not authorized",
                reason::TOPIC_NAME_INVALID => "topic name invalid",
                _ => "implementation specific error",
            };
            self.shared.broker.borrow().metrics.refuse_publish(label); // C-006
        }
        self.answer_publish(publish, code)?;
        if let Some(reply) = reply {
            self.queue_packet(&verbs::reply_packet(reply));
        }
        Ok(())
    }

    /// The publish quota (RFC 0002 "How fast one client may publish"; max_header_count,
    /// max_header_bytes): 0x97 before routing or storage, counted by label.
    fn check_quota(&mut self, publish: &Publish) -> Quota {
        let settings = &self.shared.settings;
        let mut broker = self.shared.broker.borrow_mut();
        let (label, why, rate) = if over_header_limits(&publish.properties, settings) {
            (
                "quota exceeded",
                "limits.max_header_count or max_header_bytes",
                false,
            )
        } else if !broker.spend_publish_budget(
            &self.client_id,
            publish.payload.len(),
            Instant::now(),
        ) {
            (
                "publish rate exceeded",
                "limits.publish_rate or publish_bytes",
                true,
            )
        } else {
            return Quota::Within;
        };
        broker.metrics.refuse_publish(label);
        drop(broker);
        // Which bound refused, not only that one did (A-187).
        self.puback_reason = Some(format!("{label}: over {why}").into());
        Quota::Over { rate }
    }

    /// Answers a publish with `code`: PUBACK or PUBREC, and on 3.1.1 a refusal closes
    /// the connection, since its acknowledgements carry no code. At QoS 0 nothing is
    /// sent and nothing closes, on 3.1.1 as on MQTT 5 (A-183, B-122, B-287).
    pub(super) fn answer_publish(&mut self, publish: &Publish, code: u8) -> Result<(), End> {
        let Some(packet_id) = publish.packet_id else {
            self.puback_reason = None;
            return Ok(());
        };
        if code >= 0x80 && self.protocol == ProtocolVersion::V311 {
            return Err(End::Close);
        }
        let mut ack = Ack::new(packet_id, code);
        let why = self.puback_reason.take();
        if code >= 0x80 && self.problem_info {
            ack.properties.edit().reason_string =
                Some(why.map_or_else(|| refusal_text(code).to_string(), String::from));
        }
        let packet = match publish.qos {
            QoS::ExactlyOnce => Packet::PubRec(ack),
            _ => Packet::PubAck(ack),
        };
        self.queue_packet(&packet);
        Ok(())
    }

    fn message_from(&self, publish: &Publish) -> Message {
        Message::published(
            publish.topic.clone(),
            publish.payload.clone(),
            (publish.qos, publish.retain),
            publish.properties.clone(),
            self.client_id.clone(),
            Instant::now(),
        )
    }

    /// Holds a QoS 2 publish on the session until its PUBREL, in memory, or says it
    /// is to be kept in storage first (`store_held`); a DUP re-send of one held is
    /// answered again. Past Receive Maximum the connection ends.
    fn hold_qos2(&mut self, publish: &Publish, packet_id: u16) -> Result<Hold, End> {
        let shared = self.shared.clone();
        let settings = &shared.settings;
        let mut broker = shared.broker.borrow_mut();
        let Some(session) = broker.session_of(&self.client_id, self.link.id) else {
            // Another connection holds the client id now: nothing can be held for
            // a PUBREL here (A-168; 3.1.1 closes, as every refusal does).
            return Ok(Hold::Answer(reason::UNSPECIFIED_ERROR));
        };
        // A DUP re-send of a held publish gets its PUBREC again and is not kept
        // twice (gaps G-13).
        if session.incoming.contains_key(&packet_id) {
            return Ok(Hold::Answer(reason::SUCCESS));
        }
        if session.incoming.len() >= usize::from(settings.receive_maximum) {
            drop(broker);
            return Err(self.refuse(reason::RECEIVE_MAXIMUM_EXCEEDED));
        }
        if session.incoming.len() >= settings.qos2_max_inflight {
            // Refused before ownership is taken; the connection stays (A-167).
            broker.metrics.refuse_publish("inflight allowance exceeded");
            return Ok(Hold::Answer(reason::QUOTA_EXCEEDED));
        }
        // Held until PUBREL, so a retransmission is never delivered twice; the
        // message is built only for a publish that is kept.
        let message = Arc::new(self.message_from(publish));
        if session.stored && session.keeps_owed_in_log() {
            // Its session outlives the connection: kept in storage before the
            // PUBREC (B-441).
            return Ok(Hold::Store(message));
        }
        let held = HeldQos2 {
            since: Instant::now(),
            message: Some(message),
            stored: None,
        };
        session.incoming.insert(packet_id, held);
        Ok(Hold::Answer(reason::SUCCESS))
    }

    /// Keeps a QoS 2 publish of a session that outlives its connection in the
    /// provider of the channel it is for, or the broadcast log's (B-441), before its
    /// PUBREC, and then holds it on the session; the PUBREC's code. A full provider
    /// takes room from the broadcast log first (B-476), then refuses 0x97.
    async fn store_held(&mut self, packet_id: u16, message: Arc<Message>) -> u8 {
        let shared = self.shared.clone();
        let (provider, token) = {
            let mut broker = shared.broker.borrow_mut();
            let provider = match broker.destination(&message.topic) {
                crate::broker::Destination::Channel(id) => {
                    Some(broker.channels.get(id).provider.clone())
                }
                crate::broker::Destination::Broadcast => broker.session_store(),
            };
            (provider, broker.held_token())
        };
        let since = Instant::now();
        let Some(provider) = provider else {
            // No provider to keep it in: held in memory, as for any other session.
            let held = HeldQos2 {
                since,
                message: Some(message),
                stored: None,
            };
            self.with_session(|s| s.incoming.insert(packet_id, held));
            return reason::SUCCESS;
        };
        let held = crate::storage::Held {
            client_id: self.client_id.to_string(),
            packet_id,
            token,
            data: crate::broker::held::encode(&message, crate::broker::records::now_ms()),
        };
        let key = held.key();
        let put = || provider.put_held(held.clone());
        let written = with_room(&shared, &provider, put).await;
        let mut broker = shared.broker.borrow_mut();
        match written {
            Ok(()) => {
                let stored = crate::broker::held::StoredHeld {
                    provider: provider.clone(),
                    token,
                };
                let held = HeldQos2 {
                    since,
                    message: Some(message),
                    stored: Some(stored),
                };
                if let Some(session) = broker.session_of(&self.client_id, self.link.id) {
                    session.incoming.insert(packet_id, held);
                    return reason::SUCCESS;
                }
                // Taken over while it was written: nothing here can release it.
                broker.forget_held(crate::broker::held::HeldRef { provider, key });
                reason::UNSPECIFIED_ERROR
            }
            Err(e) if e.is_full() => {
                log::info!(
                    "{}: QoS 2 publish {packet_id} by {} to {:?} refused 0x97: {e}",
                    self.peer,
                    self.client_id,
                    message.topic
                );
                broker.metrics.refuse_publish("quota exceeded");
                reason::QUOTA_EXCEEDED
            }
            Err(e) => {
                log::error!(
                    "{}: QoS 2 publish {packet_id} by {} to {:?} could not be kept: {e}",
                    self.peer,
                    self.client_id,
                    message.topic
                );
                broker.metrics.storage_failed(&e);
                reason::IMPLEMENTATION_SPECIFIC_ERROR
            }
        }
    }

    async fn on_pubrel(&mut self, packet_id: u16) -> Result<(), End> {
        let held = self
            .with_session(|s| s.incoming.remove(&packet_id))
            .flatten();
        let code = match held {
            Some(HeldQos2 {
                since,
                message: Some(message),
                stored,
            }) => {
                // Kept in storage: the record is written as one operation with the
                // release (B-442).
                let mut release = stored.as_ref().map(|s| s.at(&self.client_id, packet_id));
                let code = route_releasing(&self.shared, message.clone(), &mut release).await;
                if code >= 0x80 {
                    // The message stays held, and a PUBREL on the next connection
                    // completes it (RFC 0002 "A DISCONNECT from the broker").
                    let held = HeldQos2 {
                        since,
                        message: Some(message),
                        stored,
                    };
                    self.with_session(|s| s.incoming.insert(packet_id, held));
                    return Err(self.refuse(code));
                }
                code
            }
            Some(HeldQos2 { message: None, .. }) => reason::SUCCESS,
            // Never held, or abandoned after broker.qos2.expires_after (A-269).
            None => reason::PACKET_IDENTIFIER_NOT_FOUND,
        };
        self.queue_packet(&Packet::PubComp(Ack::new(packet_id, code)));
        Ok(())
    }

    /// Why `filter` is refused when it would be one subscription more than
    /// `limits.max_subscriptions` allows (replacing one the session holds is not one
    /// more): the SUBACK's Reason String, naming the key (B-094).
    pub(super) fn past_max_subscriptions(&self, filter: &str) -> Option<String> {
        let max = self.shared.settings.max_subscriptions;
        let mut broker = self.shared.broker.borrow_mut();
        let over = broker.subscription_count(&self.client_id) >= max
            && !broker
                .session(&self.client_id)
                .is_some_and(|s| s.subscriptions.contains_key(filter));
        over.then(|| {
            format!("limits.max_subscriptions ({max}) reached: {filter:?} would be one more")
        })
    }

    async fn on_subscribe(&mut self, mut subscribe: Subscribe) -> Result<(), End> {
        self.features_on_subscribe(&mut subscribe)?;
        let identifier = subscribe
            .properties
            .subscription_identifiers
            .first()
            .copied();
        let mut codes = Vec::with_capacity(subscribe.filters.len());
        let mut retained = Vec::new();
        let now = Instant::now();
        // Read once: the declaration applies to every filter of this packet (C-160).
        let declared = partition::declared(&subscribe.properties.user_properties);
        let slice = declared.as_ref().ok().and_then(Option::as_ref);
        // Each filter this packet granted, with the subscription it replaced: what a
        // record the store refused gives back (the session is kept as it was).
        let mut changed: Vec<(usize, String, Option<Subscription>)> = Vec::new();
        for (filter, options) in &subscribe.filters {
            if let Some(code) =
                self.queue_subscription(filter, *options, &subscribe.properties, identifier)
            {
                codes.push(code);
                continue;
            }
            let granted = match self.check_filter(
                filter,
                options.no_local,
                &subscribe.properties,
                &declared,
            )? {
                Err(code) => {
                    log::info!(
                        "{}: {} refused filter {filter:?} 0x{code:02X}",
                        self.peer,
                        self.client_id
                    );
                    code
                }
                Ok(None) if let Some(queue) = self.inside_queue(filter) => {
                    log::info!(
                        "{}: {} refused {filter:?}: it lies inside queue {queue} (0x8F)",
                        self.peer,
                        self.client_id
                    );
                    reason::TOPIC_FILTER_INVALID
                }
                Ok(share) if !self.may_subscribe(share.map_or(filter, |(_, f)| f)) => {
                    self.not_granted(filter)
                }
                // Refused before any channel cursor opens, so nothing of it is ever
                // served (A-149, B-094).
                Ok(_) if let Some(why) = self.past_max_subscriptions(filter) => {
                    if !std::mem::replace(&mut self.over_max_subscriptions, true) {
                        log::warn!("{}: {} refused: {why}", self.peer, self.client_id);
                    }
                    self.suback_reason = Some(why.into());
                    reason::QUOTA_EXCEEDED
                }
                Ok(share) => 'granted: {
                    if share.is_none() {
                        let deletions = subscribe
                            .properties
                            .user_properties
                            .iter()
                            .any(|(k, _)| k == DELETIONS);
                        let existed = self
                            .with_session(|s| s.subscriptions.contains_key(filter.as_str()))
                            .unwrap_or(false);
                        let opened = self
                            .open_cursors(
                                filter,
                                *options,
                                identifier,
                                deletions,
                                slice.cloned(),
                                existed,
                            )
                            .await;
                        if opened.is_err() {
                            self.suback_reason = Some(
                                format!(
                                    "{filter}: storage could not be read; subscribe again later"
                                )
                                .into(),
                            );
                            break 'granted reason::IMPLEMENTATION_SPECIFIC_ERROR;
                        }
                    }
                    let mut broker = self.shared.broker.borrow_mut();
                    let (share, inner) = match share {
                        Some((name, inner)) => (Some(name.to_string()), inner.to_string()),
                        None => (None, filter.clone()),
                    };
                    let shared_sub = share.is_some();
                    let sub = Subscription {
                        filter: inner.clone(),
                        share,
                        options: *options,
                        identifier,
                        slice: slice.cloned(),
                    };
                    let before = broker
                        .session(&self.client_id)
                        .and_then(|s| s.subscriptions.get(filter.as_str()).cloned());
                    changed.push((codes.len(), filter.clone(), before));
                    // In the index before the SUBACK is written, so a publish in
                    // between is delivered (C-233).
                    let existed = broker.subscribe(&self.client_id, sub);
                    // A filter added ends an episode over max_subscriptions (B-096).
                    self.over_max_subscriptions &= existed;
                    if !shared_sub {
                        let messages =
                            broker.retained_for_subscription(&inner, *options, slice, existed, now);
                        retained.extend(messages.into_iter().map(|m| (m, *options)));
                    }
                    options.qos as u8
                }
            };
            if granted >= 0x80 {
                self.shared
                    .broker
                    .borrow()
                    .metrics
                    .refuse_subscription(granted);
                // Every refusal says why (A-184); one more particular said it already.
                if self.suback_reason.is_none() {
                    self.suback_reason =
                        Some(format!("{filter:?} refused: {}", refusal_text(granted)).into());
                }
            }
            codes.push(match self.protocol {
                ProtocolVersion::V311 if granted >= 0x80 => reason::v311::SUBACK_FAILURE,
                _ => granted,
            });
        }
        if !changed.is_empty()
            && let Err(e) = self.store_subscriptions(&changed).await
        {
            // Stored before acknowledged (invariant 18): what the store could not keep
            // is refused, 0x97 when it is full, 0x83 otherwise (3.1.1: 0x80), and the
            // session goes back to what it was.
            let code = match (self.protocol, e.is_full()) {
                (ProtocolVersion::V311, _) => reason::v311::SUBACK_FAILURE,
                (_, true) => reason::QUOTA_EXCEEDED,
                (_, false) => reason::IMPLEMENTATION_SPECIFIC_ERROR,
            };
            self.suback_reason = Some(format!("the session could not be stored: {e}").into());
            let mut broker = self.shared.broker.borrow_mut();
            for (index, filter, before) in changed {
                codes[index] = code;
                broker.unsubscribe(&self.client_id, &filter);
                if let Some(before) = before {
                    broker.subscribe(&self.client_id, before);
                }
            }
            retained.clear();
        }
        let properties = Properties::from(PropertyValues {
            reason_string: self
                .suback_reason
                .take()
                .filter(|_| self.problem_info)
                .map(String::from),
            ..PropertyValues::default()
        });
        let ack = SubAck {
            packet_id: subscribe.packet_id,
            properties,
            codes,
        };
        self.queue_packet(&Packet::SubAck(ack));
        // Retained values follow the SUBACK, RETAIN set (MQTT-3.3.1-9).
        let unlogged = {
            let mut broker = self.shared.broker.borrow_mut();
            for (message, options) in retained {
                let delivery = Delivery {
                    qos: options.qos.min(message.qos),
                    retain: true,
                    identifiers: identifier.into_iter().collect(),
                    message,
                    record: None,
                    held: None,
                    resent: false,
                };
                broker.deliver_retained(&self.client_id, delivery);
            }
            broker.has_unlogged()
        };
        if unlogged {
            log_owed(&self.shared).await;
        }
        Ok(())
    }

    /// Checks one filter of a SUBSCRIBE (RFC 0002 "Shared subscriptions" and the
    /// SUBACK table). `Ok(Ok(share))` grants it, with the share name and inner filter
    /// of a shared subscription; `Ok(Err(code))` refuses the filter alone; `Err` ends
    /// the connection. `declared` is the packet's `saguin-filter` declaration.
    #[allow(clippy::type_complexity)]
    fn check_filter<'f>(
        &mut self,
        filter: &'f str,
        no_local: bool,
        properties: &Properties,
        declared: &Result<Option<partition::Slice>, partition::Refusal>,
    ) -> Result<Result<Option<(&'f str, &'f str)>, u8>, End> {
        let v5 = self.protocol == ProtocolVersion::V5;
        if !topic::is_valid_filter(filter) {
            // 3.1.1 has no code for a malformed filter: the connection closes.
            return if v5 {
                Ok(Err(reason::TOPIC_FILTER_INVALID))
            } else {
                Err(End::Close)
            };
        }
        // The saguin- properties a SUBSCRIBE may carry are `saguin-deletions: true`
        // (gaps G-19) and `saguin-filter`; any other, or another value, refuses every
        // filter.
        let unread = |(k, v): &(String, String)| {
            k.starts_with("saguin-") && !(k == DELETIONS && v == "true") && k != partition::PROPERTY
        };
        if properties.user_properties.iter().any(unread) {
            self.suback_reason = Some(
                "a saguin- property a SUBSCRIBE does not take: saguin-deletions: true and saguin-filter are the two".into(),
            );
            return Ok(Err(reason::IMPLEMENTATION_SPECIFIC_ERROR));
        }
        // A malformed declaration refuses every filter; a valid one refuses a shared
        // or queue form alone, by its prefix (C-161, C-167..C-169).
        let refused = match declared {
            Err(refusal) => Some(refusal.clone()),
            Ok(Some(_)) => partition::allowed_on(filter).err(),
            Ok(None) => None,
        };
        if let Some(refusal) = refused {
            log::debug!(
                "{}: {} refused filter {filter:?} 0x83: {refusal}",
                self.peer,
                self.client_id
            );
            // The SUBACK's Reason String (C-187, C-189: dropped without Request
            // Problem Information).
            self.suback_reason = Some(refusal.to_string().into());
            return Ok(Err(reason::IMPLEMENTATION_SPECIFIC_ERROR));
        }
        let mut inner = filter;
        let mut share = None;
        if let Some(rest) = filter.strip_prefix("$share/") {
            if !v5 {
                return Ok(Err(reason::v311::SUBACK_FAILURE));
            }
            let Some((name, f)) = rest.split_once('/') else {
                return Ok(Err(reason::TOPIC_FILTER_INVALID));
            };
            if name.is_empty()
                || crate::codec::has_wildcard(name)
                || f.is_empty()
                || f.to_lowercase().starts_with("$share")
            {
                return Ok(Err(reason::TOPIC_FILTER_INVALID));
            }
            if no_local {
                return Err(End::Broker(reason::PROTOCOL_ERROR)); // MQTT-3.8.3-4
            }
            share = Some(name);
            inner = f;
        } else if filter
            .split('/')
            .next()
            .is_some_and(|first| first.eq_ignore_ascii_case("$share"))
        {
            // $SHARE, $Share..., or `$share` with no group: refused rather than read
            // as an ordinary level (A-135); `$shares` is an ordinary level.
            return Ok(Err(reason::TOPIC_FILTER_INVALID));
        }
        if topic::level_count(inner) > self.shared.settings.max_topic_levels {
            return Ok(Err(reason::TOPIC_FILTER_INVALID));
        }
        let first = inner.split('/').next().unwrap_or_default();
        if share.is_none() && verbs::is_seek_reply(inner) {
            return Ok(Ok(None));
        }
        if first == "$SYS" || first == "$saguin" {
            return Ok(Err(reason::NOT_AUTHORIZED));
        }
        Ok(Ok(share.map(|name| (name, inner))))
    }

    /// Opens the channel cursors of a session read back from storage at startup, which
    /// has its subscriptions and no cursors: each resumes at its stored position.
    /// `saguin-deletions` is not kept with a subscription yet, so it is not asked for.
    async fn reopen_restored_cursors(&mut self) {
        let subs: Vec<Subscription> = {
            let mut broker = self.shared.broker.borrow_mut();
            let Some(session) = broker.session(&self.client_id).filter(|s| s.restored) else {
                return;
            };
            session.restored = false;
            session
                .subscriptions
                .values()
                .filter(|s| s.share.is_none())
                .cloned()
                .collect()
        };
        for sub in subs {
            let opened = self
                .open_cursors(
                    &sub.filter,
                    sub.options,
                    sub.identifier,
                    false,
                    sub.slice,
                    true,
                )
                .await;
            if opened.is_err() {
                log::error!(
                    "{}: {}'s restored subscription {:?} could not open its channels; \
                     subscribe again",
                    self.peer,
                    self.client_id,
                    sub.filter
                );
            }
        }
        self.settle_restored_releases();
    }

    /// The channel records of released exchanges read back at startup (A-254), now
    /// that their cursors are open: one at or past the cursor is held unsettled, so
    /// it is not read again as a PUBLISH and the position stays below it until its
    /// PUBCOMP; any other only waits for its PUBCOMP. That includes one below the
    /// stored position: a seek may have moved the position past an exchange never
    /// completed, so its PUBREL goes again. At worst the client completed it before
    /// the crash (its row not yet forgotten), and answers a PUBREL it does not know
    /// with PUBCOMP (0x92 on MQTT 5).
    fn settle_restored_releases(&mut self) {
        let mut broker = self.shared.broker.borrow_mut();
        let Some(session) = broker.session(&self.client_id) else {
            return;
        };
        for record in session.inflight.released_records_mut() {
            let Some((Some(channel), offset)) = *record else {
                continue;
            };
            match session.cursors.get_mut(&channel) {
                Some(c) if offset >= c.next => {
                    c.unsettled.insert(offset);
                }
                _ => *record = None,
            }
        }
        // An identifier kept for a channel record below the stored position, or on a
        // channel no longer read here, is free again (MQTT-4.4.0-1).
        session.forget_kept_channel_ids();
    }

    /// Writes the session's record as it is, less the filters in `without`, if the
    /// session outlives its connection (B-454); nothing is written otherwise.
    async fn store_session(&self, without: &[String]) -> Result<(), crate::storage::StorageError> {
        let record = self
            .shared
            .broker
            .borrow()
            .record_of(&self.client_id, without, false);
        let Some(record) = record else {
            return Ok(());
        };
        super::write_session_record(&self.shared, &self.client_id, Some(record)).await?;
        self.shared
            .broker
            .borrow_mut()
            .set_stored(&self.client_id, true);
        Ok(())
    }

    /// Stores the subscriptions a SUBSCRIBE changed: a session that outlives its
    /// connection writes its record (B-454); one that does not writes nothing, and is
    /// refused all the same when the session store has no room for the filters, since
    /// a full store refuses a new subscription from every client (B-471).
    async fn store_subscriptions(
        &self,
        changed: &[(usize, String, Option<Subscription>)],
    ) -> Result<(), crate::storage::StorageError> {
        let outlives = self
            .with_session(|s| s.outlives_connection())
            .unwrap_or(false);
        if outlives {
            return self.store_session(&[]).await;
        }
        let Some(provider) = self.shared.broker.borrow().session_store() else {
            return Ok(());
        };
        let charge: u64 = changed
            .iter()
            .map(|(_, filter, _)| crate::broker::stored::filter_charge(filter, None))
            .sum();
        provider.check_room(charge)
    }

    /// Forgets the filters, once the session is stored without them (B-463): a store
    /// that fails answers 0x83 for each and keeps them, and a 3.1.1 client, which has
    /// no code to be told it with, is disconnected instead (B-464).
    async fn on_unsubscribe(&mut self, unsubscribe: Unsubscribe) -> Result<(), End> {
        let held: Vec<String> = {
            let mut broker = self.shared.broker.borrow_mut();
            let session = broker.session(&self.client_id);
            unsubscribe
                .filters
                .iter()
                .filter(|f| {
                    session
                        .as_ref()
                        .is_some_and(|s| s.subscriptions.contains_key(f))
                })
                .cloned()
                .collect()
        };
        if !held.is_empty() && self.store_session(&held).await.is_err() {
            if self.protocol == ProtocolVersion::V311 {
                return Err(End::Close);
            }
            let codes = unsubscribe
                .filters
                .iter()
                .map(|_| reason::IMPLEMENTATION_SPECIFIC_ERROR)
                .collect();
            let properties = Properties::from(PropertyValues {
                reason_string: self
                    .problem_info
                    .then(|| "the session could not be stored; it keeps these filters".into()),
                ..PropertyValues::default()
            });
            let ack = UnsubAck {
                packet_id: unsubscribe.packet_id,
                properties,
                codes,
            };
            self.queue_packet(&Packet::UnsubAck(ack));
            return Ok(());
        }
        let mut broker = self.shared.broker.borrow_mut();
        let codes = unsubscribe
            .filters
            .iter()
            .map(|f| {
                if broker.unsubscribe(&self.client_id, f) {
                    reason::SUCCESS
                } else {
                    reason::NO_SUBSCRIPTION_EXISTED
                }
            })
            .collect();
        drop(broker);
        let ack = UnsubAck {
            packet_id: unsubscribe.packet_id,
            properties: Properties::default(),
            codes,
        };
        self.queue_packet(&Packet::UnsubAck(ack));
        Ok(())
    }

    fn on_disconnect(&mut self, disconnect: Disconnect) -> End {
        if let Some(expiry) = disconnect.properties.session_expiry_interval {
            if self.connected_with_zero_expiry && expiry != 0 {
                return End::Broker(reason::PROTOCOL_ERROR); // MQTT-3.14.2-2
            }
            let capped = expiry.min(self.shared.settings.max_session_expiry);
            self.with_session(|s| s.expiry = capped);
        }
        End::Client {
            will: disconnect.code == reason::DISCONNECT_WITH_WILL_MESSAGE,
        }
    }

    /// Moves what the session is owed into the write buffer, as far as the client's
    /// Receive Maximum and the session bound allow; with room left, what its shared
    /// groups hold for a member that can take it comes next (B-447).
    fn write_owed(&mut self) -> Result<Reading, End> {
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
        let now = Instant::now();
        let max_packet = session.max_packet_size as usize;
        while let Some(front) = session.queue.front() {
            if front.qos != QoS::AtMostOnce && !session.window_open() {
                break;
            }
            if front.logged().is_some() && !session.log_window_open() {
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
            let charge = delivery.message.charge();
            // A broadcast that expired is gone; a channel's record is delivered anyway,
            // its countdown left out (gaps G-16).
            if delivery.origin().is_none() && delivery.message.expired(now) {
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
                if delivery.origin().is_some() {
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
            End::Client { will: true } => (WillAtEnd::Publish, None),
            End::Client { will: false } => (WillAtEnd::Withdraw, None),
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
        // A Will that must be stored first goes now rather than at the next tick.
        crate::server::store_unstored(&self.shared).await;
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
        // Rounded up, so a message is never sent with less time than it has.
        let secs = left.as_millis().div_ceil(1000);
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

/// What a publish's quota check came to (`Conn::check_quota`).
enum Quota {
    Within,
    /// Refused 0x97; `rate` when by the client's publish rate rather than its
    /// headers.
    Over {
        rate: bool,
    },
}

/// What holding an inbound QoS 2 publish came to (`Conn::hold_qos2`).
enum Hold {
    /// Answered now with this PUBREC code (held in memory, a DUP, or refused).
    Answer(u8),
    /// To be kept in storage before its PUBREC (B-441).
    Store(Arc<Message>),
}
