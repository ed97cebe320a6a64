//! What a bridge brings in: the peer's publishes, mapped by the first rule that
//! matches (B-395), stored through the broker's own publish path on a worker of
//! their own, in order (B-368, B-404), and acknowledged only once stored (B-402),
//! by the link's ack ticker (B-411).
//!
//! **Invariants:** nothing here writes storage: a record goes through
//! `server::connection::routing::route`, the path a client's publish takes after
//! its checks, so channel resolution, the store's bounds and their reason codes are
//! the client's. What the worker holds is bounded: the peer may have
//! `receive_maximum` QoS 1/2 publishes unacknowledged, and at most as many QoS 0
//! ones wait (B-406). The DUP memory holds at most `receive_maximum` entries, in RAM
//! (B-373, B-374).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::template::{self, Unmappable};
use crate::broker::session::Message;
use crate::codec::{Publish, QoS, reason};
use crate::config::{Bridge, Direction};
use crate::server::Shared;

/// The prefix of the publisher id every record a bridge brings in carries: a
/// control character, which no MQTT client's id may hold (`check_connect`), so the
/// mark cannot be forged and needs no field of its own (B-399, gaps G-16 `via_bridge`).
pub const VIA_BRIDGE: char = crate::broker::INTERNAL;

/// Whether a record's publisher says it arrived over a bridge (B-399).
pub fn via_bridge(publisher: &str) -> bool {
    publisher.starts_with(VIA_BRIDGE)
}

/// A refused record is offered again this long after, then twice as long, up to
/// the ceiling (B-405: without a limit on the attempts).
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_CEILING: Duration = Duration::from_secs(5);

/// One publish the link read, handed to the worker.
#[derive(Debug)]
pub struct Arrival {
    /// The link it came on (`Shared::generation`).
    pub generation: u64,
    /// The publish.
    pub publish: Publish,
}

/// An acknowledgement the worker marked, for the ticker to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The packet identifier.
    pub packet_id: u16,
    /// PUBACK for QoS 1, PUBREC for QoS 2.
    pub qos: QoS,
}

/// Why a record was let go at this hop (`saguin_bridge_unstored_total{cause}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// No rule covers the topic.
    NoRule,
    /// A rule covers it and produces no topic, or one in the reserved `$` space.
    Unmappable,
    /// Sagüin would refuse it whatever the channel.
    NeverAccepted,
    /// A QoS 0 record past one Receive Maximum of waiting ones.
    QueueFull,
}

impl Cause {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::NoRule => "no_rule",
            Cause::Unmappable => "unmappable",
            Cause::NeverAccepted => "never_accepted",
            Cause::QueueFull => "queue_full",
        }
    }
}

/// What the link and the worker share.
#[derive(Debug)]
pub struct State {
    /// Bumped at every connection: marks from an older one are not sent.
    pub generation: Cell<u64>,
    /// Acknowledgements marked and not yet sent.
    pub marks: RefCell<Vec<Mark>>,
    /// QoS 0 arrivals waiting for the worker.
    pub qos0_waiting: Cell<usize>,
    /// Wakes the link's task (marks to send, deliveries to write).
    pub link: Rc<crate::broker::ConnLink>,
}

/// The DUP memory: a stored and acknowledged record's packet identifier and a
/// digest of its topic and payload, the oldest overwritten (B-373, B-374).
#[derive(Debug)]
pub struct Settled {
    entries: VecDeque<(u16, u64)>,
    capacity: usize,
}

impl Settled {
    /// A memory of at most `capacity` entries.
    pub fn new(capacity: u16) -> Settled {
        Settled {
            entries: VecDeque::with_capacity(usize::from(capacity)),
            capacity: usize::from(capacity).max(1),
        }
    }

    /// Remembers a record stored and acknowledged.
    pub fn remember(&mut self, packet_id: u16, digest: u64) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back((packet_id, digest));
    }

    /// Whether a DUP publish is one already stored.
    pub fn holds(&self, packet_id: u16, digest: u64) -> bool {
        self.entries.contains(&(packet_id, digest))
    }
}

/// The digest of a publish's topic and payload.
pub fn digest(publish: &Publish) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    publish.topic.hash(&mut h);
    publish.payload.hash(&mut h);
    h.finish()
}

/// The topic the first matching `in` or `both` rule gives `topic` (B-395), or why
/// none does.
pub fn map_topic(bridge: &Bridge, topic: &str) -> Result<String, (Cause, String)> {
    if topic.is_empty() {
        return Err((Cause::Unmappable, "the peer sent an empty topic".into()));
    }
    for rule in bridge
        .topics
        .iter()
        .filter(|r| matches!(r.direction, Direction::In | Direction::Both))
    {
        match template::map(&rule.filter, rule.topic.as_deref(), topic) {
            None => continue,
            Some(Ok(mapped)) => return Ok(mapped),
            Some(Err(
                e @ (Unmappable::Empty | Unmappable::Reserved(_) | Unmappable::TooLong(_)),
            )) => {
                return Err((Cause::Unmappable, format!("rule {:?}: {e}", rule.filter)));
            }
        }
    }
    Err((Cause::NoRule, "no in or both rule covers it".into()))
}

/// The checks a client's publish meets before it is routed whose refusal no retry
/// can change (B-100, B-105, B-407): the topic (0x90 / 0x87), the header limits,
/// a payload that says it is UTF-8 and is not.
fn never_accepted(shared: &Shared, topic: &str, publish: &Publish) -> Option<String> {
    let settings = &shared.settings;
    if let Err(code) = crate::server::connection::check_topic_name(topic, settings) {
        return Some(format!("its topic {topic:?} is refused 0x{code:02X}"));
    }
    if crate::server::connection::over_header_limits(&publish.properties, settings) {
        return Some("it carries more than limits.max_header_count or max_header_bytes".into());
    }
    if publish.properties.payload_format_indicator == Some(1)
        && std::str::from_utf8(&publish.payload).is_err()
    {
        return Some("its payload says UTF-8 and is not".into());
    }
    None
}

/// The message an arrival becomes: the mapped topic, the publisher's properties
/// (its `saguin-id` kept, B-370, B-371), RETAIN as sent (B-372), and the bridge's
/// mark as publisher (B-399).
fn message(publish: Publish, topic: String, publisher: &Arc<str>) -> Message {
    Message::published(
        Arc::from(topic),
        publish.payload,
        (publish.qos, publish.retain),
        publish.properties,
        publisher.clone(),
        Instant::now(),
    )
}

/// The worker: takes arrivals in order, stores each through the publish path and
/// marks its acknowledgement; a refused QoS 1/2 record is offered again until it
/// is taken (B-405) or its link is gone (the peer then sends it again).
pub async fn run(
    shared: Rc<Shared>,
    bridge: Rc<Bridge>,
    state: Rc<State>,
    arrivals: smol::channel::Receiver<Arrival>,
) {
    let publisher: Arc<str> = Arc::from(format!("{VIA_BRIDGE}bridge/{}", bridge.name));
    let mut settled = Settled::new(bridge.receive_maximum);
    while let Ok(arrival) = arrivals.recv().await {
        let publish = arrival.publish;
        let qos = publish.qos;
        if qos == QoS::AtMostOnce {
            state
                .qos0_waiting
                .set(state.qos0_waiting.get().saturating_sub(1));
        }
        let packet_id = publish.packet_id.unwrap_or(0);
        let digest = digest(&publish);
        let mark = |state: &State| {
            if qos != QoS::AtMostOnce && state.generation.get() == arrival.generation {
                state.marks.borrow_mut().push(Mark { packet_id, qos });
                state.link.wake();
            }
        };
        if publish.dup && qos != QoS::AtMostOnce && settled.holds(packet_id, digest) {
            log::debug!(
                "bridge {}: {:?} again (DUP), stored already",
                bridge.name,
                publish.topic
            );
            mark(&state);
            continue;
        }
        let topic = match map_topic(&bridge, &publish.topic) {
            Ok(topic) => topic,
            Err((cause, why)) => {
                unstored(&shared, &bridge.name, cause, &publish.topic, &why);
                mark(&state);
                continue;
            }
        };
        if let Some(why) = never_accepted(&shared, &topic, &publish) {
            unstored(
                &shared,
                &bridge.name,
                Cause::NeverAccepted,
                &publish.topic,
                &why,
            );
            mark(&state);
            continue;
        }
        let from = publish.topic.clone();
        let message = Arc::new(message(publish, topic, &publisher));
        match store(&shared, &bridge.name, &state, arrival.generation, message).await {
            Stored::Taken => {
                if qos != QoS::AtMostOnce {
                    settled.remember(packet_id, digest);
                }
                mark(&state);
            }
            Stored::Never(why) => {
                unstored(&shared, &bridge.name, Cause::NeverAccepted, &from, &why);
                mark(&state);
            }
            Stored::Abandoned => {}
        }
    }
}

/// What became of a record offered to the store.
enum Stored {
    /// Stored: acknowledge it.
    Taken,
    /// Refused for good, and why: drop it, acknowledged (B-407).
    Never(String),
    /// Its link went while it was refused: the peer sends it again.
    Abandoned,
}

/// Routes `message` until it is taken, refused for good, or (QoS 1/2) its link is
/// gone.
async fn store(
    shared: &Rc<Shared>,
    name: &str,
    state: &State,
    generation: u64,
    message: Arc<Message>,
) -> Stored {
    let mut wait = RETRY_FIRST;
    loop {
        let routed = crate::server::connection::routing::route(shared, message.clone()).await;
        let code = routed.code;
        match code {
            reason::SUCCESS => return Stored::Taken,
            // A broadcast is handed out before its log write can refuse it: routed
            // again, it would reach every subscriber again. A retained value the
            // retained store refused reached nobody, and is offered again (B-402).
            _ if routed.handed_out => {
                return Stored::Never(format!(
                    "the broadcast to {:?} was handed out but refused 0x{code:02X}; it is not sent again",
                    message.topic
                ));
            }
            // A dead-letter channel takes nothing but its queue's records.
            reason::NOT_AUTHORIZED | reason::TOPIC_NAME_INVALID => {
                return Stored::Never(format!(
                    "{:?} is refused 0x{code:02X} by the channel it lands in",
                    message.topic
                ));
            }
            _ => {}
        }
        log::debug!(
            "bridge {name}: {:?} refused 0x{code:02X}; unacknowledged, offered again in {wait:?}",
            message.topic
        );
        smol::Timer::after(wait).await;
        wait = (wait * 2).min(RETRY_CEILING);
        // A QoS 1/2 record whose link went is sent again by the peer; a QoS 0 one
        // never is, so it waits its turn here, and those arriving past one Receive
        // Maximum of waiting ones are dropped by the link (B-406).
        if message.qos != QoS::AtMostOnce && state.generation.get() != generation {
            return Stored::Abandoned;
        }
    }
}

/// Logs and counts a record let go at this hop (B-393, B-394, B-395, B-407, B-408).
pub fn unstored(shared: &Shared, bridge: &str, cause: Cause, topic: &str, why: &str) {
    if cause == Cause::QueueFull {
        log::debug!("bridge {bridge}: QoS 0 {topic:?} dropped: {why}");
    } else {
        log::warn!(
            "bridge {bridge}: {topic:?} dropped ({}): {why}",
            cause.as_str()
        );
    }
    shared
        .broker
        .borrow()
        .metrics
        .bridge_unstored(bridge, cause.as_str());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dup_memory_keeps_the_newest_receive_maximum_b374() {
        let mut m = Settled::new(2);
        m.remember(1, 10);
        m.remember(2, 20);
        m.remember(3, 30);
        assert!(!m.holds(1, 10));
        assert!(m.holds(2, 20) && m.holds(3, 30));
        assert!(
            !m.holds(3, 31),
            "a recycled identifier with another payload is new"
        );
    }
}
