//! Bridges: Sagüin as a client of another broker (RFC 0002 "Bridges").
//!
//! Each bridge is one task on the broker's executor that keeps a [`link::Link`] to
//! its peer - dialled, opened with an MQTT 5 CONNECT, kept alive with PINGREQ, and
//! dialled again after a capped, jittered delay when it goes (B-378) - and beside it
//! a worker ([`inbound::run`]) that stores what the peer sends through the broker's
//! own publish path, in order, so a channel refusing a record never keeps the link
//! from noticing it has gone (B-404). What the bridge carries out is read by
//! sessions inside the broker, one per outbound rule ([`outbound`]), served by the
//! same fan-out and channel cursors as any client's.
//!
//! - `link.rs`: the connection - TCP or TLS, a WebSocket on top for ws:// and wss://,
//!   the CONNECT and CONNACK, packets in and out through the broker's codec and frame
//!   reader.
//! - `inbound.rs`: rules in written order, the DUP memory, the storing worker and
//!   `saguin_bridge_unstored_total`.
//! - `outbound.rs`: the outbound rules' sessions, the window, one record per topic.
//! - `template.rs`: `$1`, `$2` … `$#`, one function for both directions.
//!
//! **Invariants:** with no bridge configured nothing here runs and nothing on the
//! publish path asks about bridges - the mark of a bridged record is its publisher
//! id, a control character no client id may hold ([`inbound::VIA_BRIDGE`]). Every
//! buffer is bounded by `receive_maximum` or the session bound.

pub mod inbound;
pub mod link;
pub mod outbound;
pub mod template;

use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::server::executor::LocalExecutor;
use futures_lite::future;

use crate::broker::{ConnLink, Woken};
use crate::codec::{
    Ack, Packet, Properties, Publish, QoS, RetainHandling, Subscribe, SubscriptionOptions, reason,
};
use crate::config::{Bridge, Direction};
use crate::server::Shared;
use inbound::{Arrival, Cause, Mark, State};
use link::Link;
use outbound::Outbound;

/// The first reconnection delay; it doubles to the ceiling, each jittered by up to
/// a quarter either way (B-378).
const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The packet identifier of the bridge's SUBSCRIBE, which no outbound PUBLISH takes,
/// so the two are never in use at once (MQTT-2.2.1-3).
const SUBSCRIBE_ID: u16 = 1;
const RETRY_CEILING: Duration = Duration::from_secs(30);
/// Bytes of publishes a link encodes ahead of what its peer has taken; past them
/// the rest wait as messages. Acknowledgements and pings are queued whatever the
/// outbox holds: their number is bounded by the exchanges in flight.
const OUTBOX_BOUND: usize = 64 << 10;

/// Starts every bridge; the tasks end when the broker stops (their links are told
/// through the shutdown's kick).
pub fn spawn(
    executor: &LocalExecutor,
    shared: &Rc<Shared>,
    bridges: Vec<Bridge>,
) -> Vec<smol::Task<()>> {
    bridges
        .into_iter()
        .map(|bridge| executor.spawn(run(shared.clone(), Rc::new(bridge))))
        .collect()
}

/// Why a connected link ended.
enum Ended {
    /// It went: dial again.
    Lost(String),
    /// The peer said DISCONNECT 0x95: the two brokers' limits disagree.
    Stopped(String),
    /// The broker is stopping.
    Shutdown,
}

/// One bridge, for the life of the broker.
async fn run(shared: Rc<Shared>, bridge: Rc<Bridge>) {
    let (handle, woken) = ConnLink::new(shared.next_link_id());
    let state = Rc::new(State {
        generation: std::cell::Cell::new(0),
        marks: std::cell::RefCell::new(Vec::new()),
        qos0_waiting: std::cell::Cell::new(0),
        link: handle.clone(),
    });
    shared
        .broker
        .borrow()
        .metrics
        .bridge_connected(&bridge.name, false);
    let capacity = 2 * usize::from(bridge.receive_maximum);
    let (arrivals, waiting) = smol::channel::bounded(capacity);
    let worker = inbound::run(shared.clone(), bridge.clone(), state.clone(), waiting);
    let mut out = Outbound::open(&shared, &bridge, &handle).await;
    let links = keep_linked(&shared, &bridge, &state, &woken, &mut out, arrivals);
    future::or(links, worker).await;
    out.store_positions(&shared, true).await;
}

/// Dials, serves and dials again until the broker stops or the peer stops the link.
async fn keep_linked(
    shared: &Rc<Shared>,
    bridge: &Bridge,
    state: &State,
    woken: &Woken,
    out: &mut Outbound,
    arrivals: smol::channel::Sender<Arrival>,
) {
    let peer = &bridge.peer.written;
    let name = &bridge.name;
    let mut ever_connected = false;
    let mut down_since: Option<(Instant, bool)> = None; // (since, warned)
    let mut wait = RETRY_FIRST;
    loop {
        if shared.stopping() {
            return;
        }
        log::debug!("bridge {name}: dialling {peer}");
        let opened = future::or(
            async { Some(Link::open(bridge, &shared.settings).await) },
            async {
                shared.stopped().await;
                None
            },
        )
        .await;
        let Some(opened) = opened else {
            return;
        };
        match opened {
            Ok(link) => {
                let up_at = Instant::now();
                match down_since.take() {
                    None => log::info!("bridge {name}: connected to {peer}"),
                    Some((since, _)) if ever_connected => log::warn!(
                        "bridge {name}: link to {peer} up again after {:.1}s down",
                        since.elapsed().as_secs_f64()
                    ),
                    Some((since, warned)) => {
                        let say = format!(
                            "bridge {name}: connected to {peer} after {:.1}s unreachable",
                            since.elapsed().as_secs_f64()
                        );
                        if warned {
                            log::warn!("{say}");
                        } else {
                            log::info!("{say}");
                        }
                    }
                }
                // Also at the first link after a start: an edge box down for longer
                // than session_expiry comes back to no session (B-377).
                if !link.granted.session_present {
                    let first = if ever_connected {
                        ""
                    } else {
                        " (as expected the very first time this bridge connects)"
                    };
                    log::warn!(
                        "bridge {name}: {peer} kept no session for {} (Session Present 0){first}: whatever it held while the link was down is lost, and its retained values come again",
                        bridge.client_id
                    );
                }
                if !link.granted.retain_available {
                    // Once per link, not per record (RFC 0003 "Retained messages").
                    log::warn!(
                        "bridge {name}: {peer} keeps no retained messages: retained values cross with the flag down, live only"
                    );
                }
                ever_connected = true;
                shared.broker.borrow().metrics.bridge_connected(name, true);
                let ended = serve(shared, bridge, state, woken, out, &arrivals, link).await;
                // A link that stayed up a while went down afresh: dialled again soon.
                // One that ends as soon as it is up (the peer taking the client id
                // back, or busy) backs off as a refused dial does (B-378).
                if up_at.elapsed() >= RETRY_CEILING {
                    wait = RETRY_FIRST;
                }
                shared.broker.borrow().metrics.bridge_connected(name, false);
                out.rewind(shared);
                out.store_positions(shared, true).await;
                match ended {
                    Ended::Shutdown => return,
                    Ended::Stopped(why) => {
                        log::error!("bridge {name}: link to {peer} stopped: {why}");
                        return;
                    }
                    Ended::Lost(why) => {
                        log::warn!("bridge {name}: link to {peer} down: {why}");
                        down_since = Some((Instant::now(), true));
                    }
                }
            }
            Err(why) => {
                let since = down_since.get_or_insert((Instant::now(), false));
                log::debug!(
                    "bridge {name}: attempt to reach {peer} failed: {why}; next in {wait:?}"
                );
                if !since.1 {
                    log::warn!("bridge {name}: cannot reach {peer}: {why}; retrying");
                    since.1 = true;
                }
            }
        }
        let delay = jittered(wait);
        wait = (wait * 2).min(RETRY_CEILING);
        // While down, broadcast queued for the outbound rules is let go (B-385).
        let until = Instant::now() + delay;
        while Instant::now() < until {
            let stopped = async {
                shared.stopped().await;
                true
            };
            let woke = async {
                woken.recv().await;
                false
            };
            let timer = async {
                smol::Timer::at(until).await;
                false
            };
            if future::or(stopped, future::or(woke, timer)).await {
                return;
            }
            out.rewind(shared);
        }
    }
}

/// `base`, moved by up to a quarter either way, so bridges that lost one peer at
/// once do not dial it again in step.
fn jittered(base: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // A fresh RandomState is keyed at random: its hash of the clock is the draw.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let spread = base.as_millis() as u64 / 2;
    let offset = if spread == 0 { 0 } else { h.finish() % spread };
    base - base / 4 + Duration::from_millis(offset)
}

/// What woke a connected link.
enum Event {
    /// A packet from the peer, or `None` once everything queued was written.
    Packet(Box<Result<Option<Packet>, link::PeerFault>>),
    Woken,
    Timer,
}

/// Serves one connection until it ends.
async fn serve(
    shared: &Rc<Shared>,
    bridge: &Bridge,
    state: &State,
    woken: &Woken,
    out: &mut Outbound,
    arrivals: &smol::channel::Sender<Arrival>,
    mut link: Link,
) -> Ended {
    state.generation.set(state.generation.get() + 1);
    state.marks.borrow_mut().clear();
    // Whatever broadcast reached the outbound rules while the link was down is let
    // go (B-385); channel records are read again from their positions.
    out.rewind(shared);
    let generation = state.generation.get();
    let keep_alive = link.granted.keep_alive;
    if let Err(why) = subscribe(bridge, &mut link).await {
        return Ended::Lost(why);
    }
    let mut last_sent = Instant::now();
    // When the peer was last heard from: a link that only sends (QoS 0, or to a
    // Maximum QoS 0 peer) must still find out that nothing comes back.
    let mut last_heard = last_sent;
    let mut ping_out = false;
    let mut ack_due: Option<Instant> = None;
    let mut in_flight_in = 0usize;
    let mut unqueued = std::collections::VecDeque::new();
    loop {
        if shared.stopping() {
            link.close(reason::SUCCESS).await;
            return Ended::Shutdown;
        }
        // Marks waiting: the ticker sends them every ack_interval (B-411).
        if !state.marks.borrow().is_empty() && ack_due.is_none() {
            ack_due = Some(Instant::now() + bridge.ack_interval);
        }
        if ack_due.is_some_and(|at| at <= Instant::now()) {
            ack_due = None;
            let marks: Vec<Mark> = std::mem::take(&mut *state.marks.borrow_mut());
            in_flight_in = in_flight_in.saturating_sub(marks.len());
            for mark in marks {
                let ack = Ack::new(mark.packet_id, reason::SUCCESS);
                link.queue(&match mark.qos {
                    QoS::ExactlyOnce => Packet::PubRec(ack),
                    _ => Packet::PubAck(ack),
                });
            }
            last_sent = Instant::now();
        }
        if out.resume(shared) {
            // A rule read again lets go of what it had in flight, so its publishes
            // not yet queued would go under identifiers no longer its own.
            unqueued
                .retain(|p: &crate::codec::Publish| p.packet_id.is_none_or(|id| out.on_wire(id)));
        }
        out.pump(shared).await;
        // Publishes are queued while the link's outbox is small, the rest held here
        // in order: a peer slow to take them bounds what is encoded ahead.
        if unqueued.is_empty() && link.queued() < OUTBOX_BOUND {
            unqueued.extend(out.next_publishes(shared, &link.granted));
        }
        while link.queued() < OUTBOX_BOUND
            && let Some(publish) = unqueued.pop_front()
        {
            link.queue(&Packet::Publish(publish));
            last_sent = Instant::now();
        }
        out.store_positions(shared, false).await;
        // Keep alive: a PINGREQ when nothing was sent, or nothing heard, for three
        // quarters of it, and the link given up when no PINGRESP comes within it of
        // the PINGREQ's being written. Queued behind a large record on a slow uplink
        // it can wait longer than that, and meanwhile a write that stops moving is
        // what gives the link up.
        let now = Instant::now();
        let ping_at = last_sent.min(last_heard) + keep_alive * 3 / 4;
        if !ping_out && now >= ping_at {
            link.queue_ping();
            ping_out = true;
            last_sent = now;
        }
        // Tried once more, the PINGREQ just queued with the rest: a socket that takes
        // none of it is timed from here.
        let stalled_at = match link.write_stalled_at().await {
            Ok(at) => at,
            Err(fault) => return Ended::Lost(format!("the peer {}", fault.why)),
        };
        if stalled_at.is_some_and(|at| now >= at) {
            return Ended::Lost("a write made no progress in time".into());
        }
        let pingresp_due = link.ping_written_at().map(|at| at + keep_alive);
        if pingresp_due.is_some_and(|due| now >= due) {
            return Ended::Lost(format!("no PINGRESP within {}s", keep_alive.as_secs()));
        }
        let deadline = [
            match ping_out {
                false => Some(ping_at),
                true => pingresp_due,
            },
            stalled_at,
            ack_due,
            out.paused_until(),
            out.positions_deadline(shared),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now + keep_alive);
        let event = future::or(
            async { Event::Packet(Box::new(link.exchange().await)) },
            future::or(
                async {
                    woken.recv().await;
                    Event::Woken
                },
                async {
                    future::or(smol::Timer::at(deadline), async {
                        shared.stopped().await;
                        Instant::now()
                    })
                    .await;
                    Event::Timer
                },
            ),
        )
        .await;
        let packet = match event {
            Event::Packet(read) => match *read {
                Ok(Some(packet)) => {
                    last_heard = Instant::now();
                    packet
                }
                // All that was queued is written: the next turn queues more.
                Ok(None) => continue,
                Err(fault) => {
                    if let Some(code) = fault.code {
                        link.close(code).await;
                    }
                    return Ended::Lost(format!("the peer {}", fault.why));
                }
            },
            Event::Woken | Event::Timer => continue,
        };
        match packet {
            Packet::Publish(publish) => {
                if let Err(end) = arrive(
                    shared,
                    bridge,
                    state,
                    arrivals,
                    generation,
                    publish,
                    &mut in_flight_in,
                ) {
                    link.close(end.0).await;
                    return Ended::Lost(end.1);
                }
            }
            Packet::PubAck(ack) => out.answered(shared, ack.packet_id, ack.code),
            Packet::PubRec(ack) => {
                // Outbound records go at QoS 1 at most; a PUBREC is answered so the
                // peer's state ends.
                out.answered(shared, ack.packet_id, ack.code);
                let rel =
                    Packet::PubRel(Ack::new(ack.packet_id, reason::PACKET_IDENTIFIER_NOT_FOUND));
                link.queue(&rel);
            }
            Packet::PubRel(ack) => {
                link.queue(&Packet::PubComp(Ack::new(ack.packet_id, reason::SUCCESS)));
                last_sent = Instant::now();
            }
            Packet::PubComp(ack) => out.answered(shared, ack.packet_id, ack.code),
            Packet::PingResp => {
                ping_out = false;
                link.ponged();
            }
            Packet::SubAck(ack) => refused_filters(bridge, &ack.codes),
            Packet::Disconnect(d) if d.code == reason::PACKET_TOO_LARGE => {
                return Ended::Stopped(
                    "the peer disconnected 0x95 (packet too large): the two brokers' limits blocks have to agree; restart once they do".into(),
                );
            }
            Packet::Disconnect(d) => {
                let why = d.properties.reason_string.as_deref().unwrap_or_default();
                return Ended::Lost(format!("the peer disconnected 0x{:02X} {why}", d.code));
            }
            other => {
                let name = link::name_of(&other);
                link.close(reason::PROTOCOL_ERROR).await;
                return Ended::Lost(format!("the peer sent {name}, which a server never sends"));
            }
        }
    }
}

/// SUBSCRIBEs every `in` and `both` filter verbatim (B-375) with No Local (B-400)
/// and Retain As Published (B-372); a resumed subscription is sent no retained set.
async fn subscribe(bridge: &Bridge, link: &mut Link) -> Result<(), String> {
    let filters: Vec<(String, SubscriptionOptions)> = bridge
        .topics
        .iter()
        .filter(|r| matches!(r.direction, Direction::In | Direction::Both))
        .map(|r| {
            let options = SubscriptionOptions {
                qos: QoS::ExactlyOnce,
                no_local: true,
                retain_as_published: true,
                retain_handling: RetainHandling::OnNewSubscribe,
            };
            (r.filter.clone(), options)
        })
        .collect();
    if filters.is_empty() {
        return Ok(());
    }
    let subscribe = Subscribe {
        packet_id: SUBSCRIBE_ID,
        properties: Properties::default(),
        filters,
    };
    link.send(&Packet::Subscribe(subscribe)).await
}

/// Logs each filter the peer refused.
fn refused_filters(bridge: &Bridge, codes: &[u8]) {
    let filters = bridge
        .topics
        .iter()
        .filter(|r| matches!(r.direction, Direction::In | Direction::Both));
    log::debug!(
        "bridge {}: SUBACK for {} filter(s)",
        bridge.name,
        codes.len()
    );
    for (rule, code) in filters.zip(codes) {
        if *code >= 0x80 {
            log::warn!(
                "bridge {}: the peer refused the subscription {:?} 0x{code:02X}; nothing arrives under it",
                bridge.name,
                rule.filter
            );
        }
    }
}

/// Hands an arriving publish to the worker. A QoS 0 record past one Receive Maximum
/// waiting is dropped and counted (B-406); a QoS 1/2 record past the Receive
/// Maximum this bridge advertised ends the link (0x93).
fn arrive(
    shared: &Shared,
    bridge: &Bridge,
    state: &State,
    arrivals: &smol::channel::Sender<Arrival>,
    generation: u64,
    publish: Publish,
    in_flight_in: &mut usize,
) -> Result<(), (u8, String)> {
    if publish.properties.topic_alias.is_some() {
        return Err((
            reason::TOPIC_ALIAS_INVALID,
            "the peer used a topic alias, which the bridge never allowed".into(),
        ));
    }
    if publish.qos == QoS::AtMostOnce {
        if state.qos0_waiting.get() >= usize::from(bridge.receive_maximum) {
            let why = "one Receive Maximum of records already waits for the store";
            inbound::unstored(shared, &bridge.name, Cause::QueueFull, &publish.topic, why);
            return Ok(());
        }
        state.qos0_waiting.set(state.qos0_waiting.get() + 1);
    } else {
        *in_flight_in += 1;
        if *in_flight_in > usize::from(bridge.receive_maximum) {
            return Err((
                reason::RECEIVE_MAXIMUM_EXCEEDED,
                "the peer sent past the Receive Maximum the bridge advertised".into(),
            ));
        }
    }
    let qos0 = publish.qos == QoS::AtMostOnce;
    let arrival = Arrival {
        generation,
        publish,
    };
    match arrivals.try_send(arrival) {
        Ok(()) => Ok(()),
        // Arrivals of a link that went still wait for the store: a QoS 0 record is
        // dropped as any past its bound is, and its place given back, never held
        // against the peer (B-406).
        Err(full) if qos0 => {
            state
                .qos0_waiting
                .set(state.qos0_waiting.get().saturating_sub(1));
            let why = "the worker holds as many as it takes, earlier links' included";
            let topic = &full.into_inner().publish.topic;
            inbound::unstored(shared, &bridge.name, Cause::QueueFull, topic, why);
            Ok(())
        }
        Err(_) => Err((
            reason::RECEIVE_MAXIMUM_EXCEEDED,
            "more arrived than the worker holds".into(),
        )),
    }
}
