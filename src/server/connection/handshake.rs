//! Everything from a socket's first byte to its CONNACK: the PROXY header, the
//! WebSocket upgrade, reading and checking the CONNECT, credentials, the takeover of
//! a session, storing it before it is acknowledged, and the refusals on the way.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::future;
use smol::io::AsyncWriteExt;

use super::{
    Conn, ExpiryAtDisconnect, check_topic_name, is_control, linger, outbox, publish_packet,
    with_write_timeout,
};
use crate::broker::session::Inflight;
use crate::broker::{Accepted, ConnLink, TOPIC_ALIAS_MAXIMUM};
use crate::codec::{
    self, Ack, ConnAck, Connect, DecodeError, Packet, Properties, PropertyValues, ProtocolVersion,
    reason,
};
use crate::server::Shared;
use crate::server::frame::{FrameError, FrameReader};
use crate::server::slots::{Place, Slot};
use crate::server::socket::Socket;

/// Everything from the first byte to the CONNACK: PROXY header, WebSocket upgrade,
/// CONNECT, credentials, takeover. `None` when the connection ended there.
pub(super) async fn establish(
    stream: Socket,
    mut peer: String,
    shared: Rc<Shared>,
    slot: Slot,
    gate: Rc<crate::auth::Gate>,
    websocket: Option<Rc<crate::server::ws::OriginPolicy>>,
) -> Option<(Box<Conn>, Slot)> {
    let mut reader = FrameReader::default();
    // One deadline for the TLS handshake, the WebSocket upgrade and the CONNECT
    // together (B-062).
    let deadline = Instant::now() + shared.settings.connect_timeout;
    // A stop ends the TLS handshake and the upgrade as it ends the CONNECT's wait: a
    // silent socket must not hold the stop for its deadline (B-065).
    let admit = crate::server::proxy::admit(&gate, stream, deadline, &mut peer, &shared);
    let (stream, certificate) = future::or(admit, nothing_once_stopped(&shared)).await?;
    let (mut stream, slot) = match websocket {
        None => (stream, slot),
        Some(policy) => {
            let max = shared.settings.max_message_size as usize;
            let upgrade = crate::server::ws::upgrade(stream, slot, &policy, max, deadline, &peer);
            future::or(upgrade, nothing_once_stopped(&shared)).await?
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
    let asked_expiry = connect.properties.session_expiry_interval.unwrap_or(0);
    let refused = check_connect(&connect, &shared)
        .map(|code| match code {
            // A `saguin-` property, not a store that failed.
            reason::IMPLEMENTATION_SPECIFIC_ERROR => (code, "implementation specific error"),
            code => (code, connection_refusal_label(code)),
        })
        .or_else(|| will_refusal(&connect, &shared));
    let admitted = match refused {
        Some(refused) => Err(refused),
        None => crate::auth::check_connect(&gate, &mut connect, certificate, &peer)
            .map_err(|code| (code, connection_refusal_label(code))),
    };
    let mut admitted = match admitted {
        Ok(admitted) => admitted,
        Err((code, label)) => {
            // Refusals given to clients are warnings (B-021).
            log::warn!(
                "{peer}: CONNECT from {:?} refused with 0x{code:02X}",
                connect.client_id
            );
            let properties = Properties::default();
            refuse(stream, slot, &shared, &connect, (code, label), properties).await;
            return None;
        }
    };
    let (link, woken) = ConnLink::new(shared.next_link_id());
    // A session is its user's. Resumed under another name it would hand the newcomer
    // what was queued and in flight for the first, asked of nobody (B-254, B-293):
    // it starts clean instead.
    if !connect.clean_start && !connect.client_id.is_empty() {
        let held_by = (shared.broker.borrow_mut())
            .session(&connect.client_id)
            .map(|s| s.user.clone());
        if let Some(held_by) = held_by
            && held_by != crate::broker::session::user_named(&admitted.user)
        {
            log::info!(
                "{peer}: {:?} holds a session another user made; it starts clean",
                connect.client_id
            );
            // A 3.1.1 cleanSession 0 asked for a session that lasts: it still does.
            if connect.protocol == ProtocolVersion::V311 {
                connect.properties.edit().session_expiry_interval = Some(u32::MAX);
            }
            connect.clean_start = true;
        }
    }
    // An assigned id is chosen now, so the record written below is kept under it.
    let assigned = connect.client_id.is_empty();
    if assigned {
        connect.client_id = shared.broker.borrow_mut().assign_client_id().to_string();
        admitted.principal =
            (admitted.principal.as_deref()).map(|p| Rc::new(p.assigned(&connect.client_id)));
    }
    take_over(&shared, &connect.client_id).await;
    // What a Clean Start replaces ends before the CONNACK, once the connection that
    // held it has written what it had, so no position it wrote on its way out
    // survives (G-11); a store that cannot end it refuses the CONNECT 0x83 (A-234,
    //
    // So does one the CONNECT cannot resume: it ended with its connection.
    let resumable = (shared.broker.borrow_mut())
        .session(&connect.client_id)
        .is_some_and(|s| s.outlives_connection());
    let discarded = if (connect.clean_start || !resumable) && !assigned {
        discard_positions(&shared, &connect.client_id, &peer).await
    } else {
        Ok(())
    };
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
                    connect.properties.edit().session_expiry_interval = None;
                    if let Err(e) = discard_positions(&shared, &connect.client_id, &peer).await {
                        return refuse_unstored(&shared, &peer, &connect, e, slot, stream).await;
                    }
                }
                // Started clean for another user, yet asked to last: no room for it
                // to (B-469).
                ProtocolVersion::V311 => connect.properties.edit().session_expiry_interval = None,
            }
            // What remains to write: the deletion of the record of the session it
            // replaces, if there was one.
            store_connect(&shared, &connect, &admitted.user).await
        }
        other => other,
    };
    let incarnation = match stored {
        Ok(incarnation) => incarnation,
        Err(e) => return refuse_unstored(&shared, &peer, &connect, e, slot, stream).await,
    };
    // The session the record names: a new one under the incarnation it was stored
    // with, so what the log keeps for it is handed to it after a restart.
    let mut accepted = (shared.broker.borrow_mut()).connect(&connect, link.clone(), incarnation);
    // A stop that told every connection to end while this CONNECT was being stored
    // never saw this one: it is told now, after its CONNACK (0x8B).
    if shared.stopping() {
        link.kick(reason::SERVER_SHUTTING_DOWN);
    }
    accepted.assigned = assigned;
    accepted.cut_for_room = cut_for_room;
    // A Clean Start ended the session it replaces: its held QoS 2 publishes leave
    // storage before the CONNACK, so a crash cannot hand them to this one.
    crate::server::forget_held(&shared).await;
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
        max_packet: max_packet_of(&connect),
        expiry_at_disconnect: ExpiryAtDisconnect::of(
            asked_expiry,
            connect.properties.session_expiry_interval.unwrap_or(0),
        ),
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
        resending: false,
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
    stream: Socket,
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
    // What filled, for a Will there is no room for (B-461).
    let properties = Properties::from(PropertyValues {
        reason_string: e
            .is_full()
            .then(|| format!("the session store has no room for this Will: {e}")),
        ..PropertyValues::default()
    });
    let label = connection_refusal_label(code);
    refuse(stream, slot, shared, connect, (code, label), properties).await;
    None
}

/// Refuses a CONNECT that was read: counted under `label`, its slot given back, and
/// the CONNACK carrying `code` written before the socket closes.
async fn refuse(
    mut stream: Socket,
    slot: Slot,
    shared: &Shared,
    connect: &Connect,
    (code, label): (u8, &'static str),
    properties: Properties,
) {
    shared.broker.borrow().metrics.refuse_connection(label);
    let ack = connack(connect.protocol, false, code, properties);
    let mut bytes = Vec::new();
    let max_size = max_packet_of(connect);
    codec::encode_within(
        &Packet::ConnAck(ack),
        connect.protocol,
        max_size,
        &mut bytes,
    );
    drop(slot);
    close_with(&mut stream, &bytes, shared).await;
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
            shared.broker.borrow().metrics.storage_failed(&e); // B-462
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
) -> Result<crate::broker::Incarnation, crate::storage::StorageError> {
    let id = &connect.client_id;
    let (write, refused, incarnation) = {
        let broker = shared.broker.borrow();
        let incarnation = broker.incarnation_for(connect);
        (
            broker.connect_record(connect, id, user, incarnation),
            broker.record_refused(id),
            incarnation,
        )
    };
    let record = match write {
        crate::broker::RecordWrite::Put(record) => Some(record),
        crate::broker::RecordWrite::Delete => None,
        // A write the provider refused before - a withdrawn Will, a deletion - lands
        // before this client connects again, or the CONNECT is refused (C-286).
        crate::broker::RecordWrite::Nothing if refused => shared.broker.borrow().record_of(id, &[]),
        crate::broker::RecordWrite::Nothing => return Ok(incarnation),
    };
    crate::server::write_session_record(shared, id, record).await?;
    if refused {
        // What this wrote supersedes what was waiting to be written again.
        let id = Arc::from(id.as_str());
        shared.broker.borrow_mut().record_written(&id, true);
    }
    Ok(incarnation)
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
    let Some((mut stream, _)) = Box::pin(crate::server::proxy::admit(
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
    // Written and closed by the deadline, lingering included: a socket not admitted
    // is gone within 100 ms of arriving (B-052), so those told Server busy cannot
    // pile up past the overflow budget (B-054).
    let left = deadline.saturating_duration_since(Instant::now());
    let _ = write_with_timeout(&mut stream, &bytes, Some(left)).await;
    super::linger_until(&mut stream, deadline).await;
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
/// What refuses a CONNECT's Will that every publish would be refused for (C-249):
/// its code and the label it is counted under. Refused at CONNECT, since once
/// published the Will is nobody's to be told.
fn will_refusal(connect: &Connect, shared: &Shared) -> Option<(u8, &'static str)> {
    let will = connect.will.as_ref()?;
    if will.properties.payload_format_indicator == Some(1)
        && std::str::from_utf8(&will.payload).is_err()
    {
        return Some((reason::PAYLOAD_FORMAT_INVALID, "payload format invalid"));
    }
    if super::over_header_limits(&will.properties, &shared.settings) {
        return Some((reason::QUOTA_EXCEEDED, "quota exceeded"));
    }
    None
}

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
    // Bytes: the bound is on durable state the client chooses the size of.
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

/// The Maximum Packet Size `connect` asked to be held to; none is no bound.
fn max_packet_of(connect: &Connect) -> usize {
    connect
        .properties
        .maximum_packet_size
        .map_or(usize::MAX, |size| size as usize)
}

fn encode_one(packet: &Packet, protocol: ProtocolVersion) -> Vec<u8> {
    let mut out = Vec::new();
    codec::encode(packet, protocol, &mut out);
    out
}

/// `None` once the broker stops: raced against a step of the handshake.
async fn nothing_once_stopped<T>(shared: &Shared) -> Option<T> {
    shared.stopped().await;
    None
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

/// Writes a last packet and closes.
async fn close_with(stream: &mut Socket, bytes: &[u8], shared: &Shared) {
    let _ = write_with_timeout(stream, bytes, shared.settings.write_timeout).await;
    linger(stream).await;
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
    /// connection ended (MQTT-4.4.0-1), as many at once as its Receive Maximum takes
    /// now (MQTT-3.3.4-9): the rest wait on the table (`InflightTable::mark_unsent`)
    /// and go as the client settles, before anything queued (`resend_unsent`).
    fn resend_inflight(&mut self) {
        self.strip_queue_offers();
        self.with_session(|s| s.inflight.mark_unsent());
        self.resending = true;
        self.resend_unsent();
    }

    /// Re-sends, DUP set and oldest first, the exchanges of a resumed session not
    /// yet sent on this connection, as far as the client's Receive Maximum has room
    /// (those sent again and not settled count). One this connection's Maximum
    /// Packet Size no longer takes is not sent: a broadcast is done with, as if it
    /// had been (MQTT-3.1.2-25); a channel's record goes back to the head of the
    /// queue, whose writing tells the consumer why it cannot have it (0x95, G-17).
    pub(super) fn resend_unsent(&mut self) {
        // What is not sent frees its room for the next, which goes before anything
        // queued and may be the last thing the client would answer.
        while self.resend_window() {}
    }

    /// One pass of `resend_unsent`: whether it left room it freed and more to send.
    fn resend_window(&mut self) -> bool {
        let shared = self.shared.clone();
        let mut broker = shared.broker.borrow_mut();
        let Some(session) = broker.session_of(&self.client_id, self.link.id) else {
            self.resending = false;
            return false;
        };
        let now = Instant::now();
        let mut packets = Vec::new();
        // In the order first sent, which the identifiers do not tell (MQTT-4.6.0-5).
        while session.inflight.on_wire() < usize::from(session.receive_maximum) {
            let Some(id) = session.inflight.take_unsent() else {
                break;
            };
            packets.push(match session.inflight.get(&id) {
                Some(Inflight::Published(d)) => {
                    Packet::Publish(publish_packet(d, Some(id), true, now, self.protocol))
                }
                _ => Packet::PubRel(Ack::new(id, 0)),
            });
        }
        self.resending = session.inflight.has_unsent();
        drop(broker);
        let mut too_large = Vec::new();
        for packet in &packets {
            match packet {
                Packet::Publish(p) => {
                    if !self.out.publish(p, self.protocol, self.max_packet) {
                        too_large.extend(p.packet_id);
                    }
                }
                packet => self.queue_packet(packet),
            }
        }
        let freed = !too_large.is_empty();
        self.with_session(|s| {
            for id in too_large.into_iter().rev() {
                match s.inflight.get(&id) {
                    Some(Inflight::Published(d)) if d.is_channel_value() => {
                        if let Some(Inflight::Published(d)) = s.inflight.remove(&id) {
                            s.queue.push_front(d);
                        }
                    }
                    _ => {
                        s.settle(id);
                    }
                }
            }
        });
        freed && self.resending
    }
}
