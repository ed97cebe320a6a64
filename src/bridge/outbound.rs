//! What a bridge carries out (RFC 0002 "Bridges", `out` and the out half of `both`).
//!
//! Each outbound rule is a session inside the broker, subscribed to its filter like
//! any client's: broadcast fan-out queues on it, and its channel cursors are opened,
//! read and positioned by the same code a connection uses
//! (`server::connection::channels::Reader`). So an append channel is drained from a
//! stored position per (bridge, filter, topic) - the session's client id names all
//! three - that resumes after an outage without re-sending or skipping (B-382,
//! B-383); a latest channel is read from its head, never as a current-state pass,
//! and what changed while the link was down is read from the position, the newest
//! per topic (B-386); a broadcast topic has no position, and what is published
//! while the link is down is let go (B-385). A queue is never read: `Channels::reach`
//! leaves queues out for every subscriber (B-381, INV-11).
//!
//! **Invariants:** one record in flight per topic, at most min(peer Receive Maximum,
//! `receive_maximum`) altogether (B-387); a record that arrived over a bridge never
//! leaves over one (B-399); the first refusal stops the pass and the position stays
//! on the refused record (B-388).

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::inbound::{self, Cause, VIA_BRIDGE};
use super::link::Granted;
use super::template;
use crate::broker::ConnLink;
use crate::broker::cursor::ChannelSub;
use crate::broker::metrics::Gaps;
use crate::broker::session::{Delivery, Inflight, Session, Subscription};
use crate::codec::{ProtocolVersion, Publish, QoS, RetainHandling, SubscriptionOptions};
use crate::config::{Bridge, Direction};
use crate::server::Shared;
use crate::server::connection::channels::Opening;
use crate::server::connection::channels::Reader;

/// How long an outbound rule waits after the peer refused a record before it reads
/// again from its position.
const AFTER_REFUSAL: Duration = Duration::from_secs(1);

/// A peer's refusal that no retry can change.
const TOPIC_NAME_INVALID: u8 = crate::codec::reason::TOPIC_NAME_INVALID;

/// The one `saguin-` property that crosses: a record's id, so the peer's copy is the
/// same record. Offsets, times and a dead letter's history are this broker's own
/// (B-370, RFC 0002 "Nothing else of Sagüin's crosses").
const CROSSES: &str = "saguin-id";

/// One outbound rule: its session's id, its filter and template.
#[derive(Debug)]
struct Rule {
    client_id: Arc<str>,
    filter: String,
    template: Option<String>,
    /// Topics with a record in flight: one at a time per topic (B-387).
    busy: HashSet<Arc<str>>,
    /// After the peer refused one of its records, the rule issues nothing until
    /// then; the other rules go on (B-384, B-388).
    paused_until: Option<Instant>,
}

/// A bridge's outbound rules and what they have on the wire.
#[derive(Debug)]
pub struct Outbound {
    name: String,
    rules: Vec<Rule>,
    /// Packet identifiers on the wire: the rule and its session's identifier.
    wire: HashMap<u16, (usize, u16, Arc<str>)>,
    next_wire: u16,
    limit: u16,
    link_id: u64,
    positions_at: Option<Instant>,
}

impl Outbound {
    /// Opens a session per outbound rule, held by `link`, subscribed to its filter,
    /// with cursors at their stored positions or where a new reader starts.
    pub async fn open(shared: &Shared, bridge: &Bridge, link: &Rc<ConnLink>) -> Outbound {
        let mut rules = Vec::new();
        for rule in bridge
            .topics
            .iter()
            .filter(|r| matches!(r.direction, Direction::Out | Direction::Both))
        {
            let topic = rule.topic.as_deref().unwrap_or(&rule.filter);
            let client_id: Arc<str> = Arc::from(format!(
                "{VIA_BRIDGE}bridge/{}/out/{}/{topic}",
                bridge.name, rule.filter
            ));
            let options = SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                no_local: false,
                retain_as_published: true,
                retain_handling: RetainHandling::Never,
            };
            {
                let mut session = Session::new(
                    client_id.clone(),
                    ProtocolVersion::V5,
                    shared.settings.session_queue_bytes,
                );
                session.expiry = u32::MAX;
                session.link = Some(link.clone());
                session.receive_maximum = bridge.receive_maximum;
                let mut broker = shared.broker.borrow_mut();
                broker.attach_internal(session);
                broker.subscribe(
                    &client_id,
                    Subscription {
                        filter: rule.filter.clone(),
                        share: None,
                        options,
                        identifier: None,
                        slice: None,
                    },
                );
            }
            let sub = ChannelSub {
                filter: rule.filter.clone(),
                options,
                identifier: None,
                // Outbound rules always ask for deletions (gaps G-19).
                deletions: true,
                slice: None,
                from: 0,
            };
            let reader = Reader {
                shared,
                client_id: &client_id,
                link_id: link.id,
                gaps: Gaps::Rule {
                    bridge: &bridge.name,
                    filter: &rule.filter,
                },
            };
            let opening = Opening::Subscribe { existed: false };
            if reader.open_cursors(sub, opening).await.is_err() {
                log::error!(
                    "bridge {}: out {:?}: its channels could not be opened; it carries broadcast only until a restart",
                    bridge.name,
                    rule.filter
                );
            }
            rules.push(Rule {
                client_id,
                filter: rule.filter.clone(),
                template: rule.topic.clone(),
                busy: HashSet::new(),
                paused_until: None,
            });
        }
        Outbound {
            name: bridge.name.clone(),
            rules,
            wire: HashMap::new(),
            next_wire: FIRST_WIRE_ID,
            limit: bridge.receive_maximum,
            link_id: link.id,
            positions_at: None,
        }
    }

    /// Whether there is any outbound rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Reads what each rule's cursors are owed into its session.
    pub async fn pump(&self, shared: &Shared) {
        for rule in &self.rules {
            let reader = self.reader(shared, rule);
            if reader.next_read().is_some() {
                reader.pump().await;
            }
        }
    }

    fn reader<'a>(&'a self, shared: &'a Shared, rule: &'a Rule) -> Reader<'a> {
        Reader {
            shared,
            client_id: &rule.client_id,
            link_id: self.link_id,
            gaps: Gaps::Rule {
                bridge: &self.name,
                filter: &rule.filter,
            },
        }
    }

    /// When the first pause after a refusal ends, if one is running.
    pub fn paused_until(&self) -> Option<Instant> {
        self.rules.iter().filter_map(|r| r.paused_until).min()
    }

    /// Ends the pauses that ran out: such a rule reads again from its position, so
    /// what was refused is offered again (B-388). Called before [`Outbound::pump`];
    /// whether any rule was read again.
    pub fn resume(&mut self, shared: &Shared) -> bool {
        let now = Instant::now();
        let mut rewound = false;
        for index in 0..self.rules.len() {
            if self.rules[index]
                .paused_until
                .is_some_and(|until| until <= now)
            {
                self.rules[index].paused_until = None;
                self.rewind_rule(shared, index);
                rewound = true;
            }
        }
        rewound
    }

    /// Whether the packet identifier `wire_id` is in flight to the peer.
    pub fn on_wire(&self, wire_id: u16) -> bool {
        self.wire.contains_key(&wire_id)
    }

    /// The publishes to write now: per rule, the oldest delivery whose topic has
    /// nothing in flight, while the window allows (B-387).
    pub fn next_publishes(&mut self, shared: &Shared, granted: &Granted) -> Vec<Publish> {
        let now = Instant::now();
        let limit = usize::from(self.limit.min(granted.receive_maximum));
        let mut out = Vec::new();
        let mut broker = shared.broker.borrow_mut();
        for index in 0..self.rules.len() {
            let rule = &mut self.rules[index];
            if rule.paused_until.is_some() {
                continue;
            }
            let Some((session, metrics)) =
                broker.session_and_metrics(&rule.client_id, self.link_id)
            else {
                continue;
            };
            let mut at = 0;
            while at < session.queue.len() {
                if session.queue[at].qos != QoS::AtMostOnce && self.wire.len() >= limit {
                    break;
                }
                if rule.busy.contains(&session.queue[at].message.topic) {
                    at += 1;
                    continue;
                }
                let Some(delivery) = session.queue.remove(at) else {
                    break;
                };
                let Some(publish) = publish_of(&self.name, rule, &delivery, granted, now, metrics)
                else {
                    session.queued_bytes -= delivery.charge();
                    session.settle_origin(delivery.origin());
                    continue;
                };
                if publish.qos == QoS::AtMostOnce {
                    session.queued_bytes -= delivery.charge();
                    session.settle_origin(delivery.origin());
                    out.push(publish);
                    continue;
                }
                let pid = session.next_packet_id();
                let topic = delivery.message.topic.clone();
                session.inflight.insert(pid, Inflight::Published(delivery));
                rule.busy.insert(topic.clone());
                let wire_id = next_free(&mut self.next_wire, &self.wire);
                self.wire.insert(wire_id, (index, pid, topic));
                out.push(Publish {
                    packet_id: Some(wire_id),
                    ..publish
                });
            }
            // As a client's connection does: a burst's room back, an episode of
            // deliveries given up ended.
            session.release_empty_queue();
        }
        if !out.is_empty() {
            drop(broker);
            log::debug!("bridge {}: {} record(s) out", self.name, out.len());
        }
        out
    }

    /// The peer answered `wire_id` with `code`: settled when taken; a refusal stops
    /// the pass and leaves the position on the record (B-384, B-388).
    pub fn answered(&mut self, shared: &Shared, wire_id: u16, code: u8) {
        let Some((index, pid, topic)) = self.wire.remove(&wire_id) else {
            return;
        };
        let rule = &mut self.rules[index];
        rule.busy.remove(&topic);
        let mut broker = shared.broker.borrow_mut();
        let Some((session, metrics)) = broker.session_and_metrics(&rule.client_id, self.link_id)
        else {
            return;
        };
        if code < 0x80 {
            session.settle(pid);
            log::debug!("bridge {}: the peer took {topic:?}", self.name);
            return;
        }
        if code == TOPIC_NAME_INVALID {
            // Its topic is one the peer will never take (deeper than its
            // max_topic_levels, say): retrying would hold the rule for ever (B-107).
            log::warn!(
                "bridge {}: the peer refused {topic:?} 0x90 (topic name invalid); skipped (peer_refused)",
                self.name
            );
            metrics.bridge_unstored(&self.name, "peer_refused");
            session.settle(pid);
            return;
        }
        log::warn!(
            "bridge {}: the peer refused {topic:?} 0x{code:02X}; rule {:?} holds it and reads again in {}s",
            self.name,
            rule.filter,
            AFTER_REFUSAL.as_secs()
        );
        if let Some(Inflight::Published(d)) = session.inflight.get(&pid)
            && d.origin().is_none()
        {
            // A broadcast has no position to hold it at.
            session.settle(pid);
        }
        rule.paused_until = Some(Instant::now() + AFTER_REFUSAL);
    }

    /// Forgets everything queued and in flight and reads again from each cursor's
    /// position: at a link that went. Broadcast deliveries are let go (B-385);
    /// channel records are read again, none skipped (B-382).
    pub fn rewind(&mut self, shared: &Shared) {
        for index in 0..self.rules.len() {
            self.rules[index].paused_until = None;
            self.rewind_rule(shared, index);
        }
        self.wire.clear();
    }

    /// [`Outbound::rewind`] for one rule, after the peer refused one of its records.
    fn rewind_rule(&mut self, shared: &Shared, index: usize) {
        self.wire.retain(|_, (rule, _, _)| *rule != index);
        let rule = &mut self.rules[index];
        rule.busy.clear();
        let mut broker = shared.broker.borrow_mut();
        let Some(session) = broker.session_of(&rule.client_id, self.link_id) else {
            return;
        };
        session.queue.clear();
        session.inflight.clear();
        session.queued_bytes = 0;
        for cursor in session.cursors.values_mut() {
            cursor.next = cursor.position();
            cursor.unsettled.clear();
            cursor.caught_up = false;
            cursor.wakes += 1;
        }
    }

    /// When positions that moved must be written (`ack_commit_interval` after the
    /// last write), if any moved.
    pub fn positions_deadline(&self, shared: &Shared) -> Option<Instant> {
        let mut broker = shared.broker.borrow_mut();
        let moved = self.rules.iter().any(|r| {
            broker
                .session(&r.client_id)
                .is_some_and(|s| s.cursors.values().any(|c| c.dirty()))
        });
        moved.then(|| {
            self.positions_at
                .map_or_else(Instant::now, |at| at + shared.settings.ack_commit_interval)
        })
    }

    /// Writes the positions that moved, when due or `force`.
    pub async fn store_positions(&mut self, shared: &Shared, force: bool) {
        let due = self
            .positions_deadline(shared)
            .is_some_and(|at| force || at <= Instant::now());
        if !due {
            return;
        }
        self.positions_at = Some(Instant::now());
        for rule in &self.rules {
            self.reader(shared, rule).write_positions().await;
        }
    }
}

/// The next packet identifier not on the wire.
/// The first packet identifier an outbound PUBLISH takes: the ones below are the
/// SUBSCRIBE's.
const FIRST_WIRE_ID: u16 = super::SUBSCRIBE_ID + 1;

fn next_free(next: &mut u16, wire: &HashMap<u16, (usize, u16, Arc<str>)>) -> u16 {
    loop {
        let id = *next;
        *next = next.checked_add(1).unwrap_or(FIRST_WIRE_ID);
        if !wire.contains_key(&id) {
            return id;
        }
    }
}

/// The publish a delivery becomes at the peer, or `None` when it does not cross: it
/// arrived over a bridge (B-399), its topic maps to nothing (B-393, B-394, B-409),
/// or it is larger than the peer takes.
fn publish_of(
    bridge: &str,
    rule: &Rule,
    delivery: &Delivery,
    granted: &Granted,
    now: Instant,
    metrics: &crate::broker::metrics::Metrics,
) -> Option<Publish> {
    let message = &delivery.message;
    if inbound::via_bridge(&message.publisher) {
        return None;
    }
    if !delivery.outlives_expiry() && message.expired(now) {
        return None;
    }
    let topic = match template::map(&rule.filter, rule.template.as_deref(), &message.topic) {
        Some(Ok(topic)) => topic,
        Some(Err(e)) => {
            log::warn!(
                "bridge {bridge}: {:?} not carried out ({}): rule {:?}: {e}",
                message.topic,
                Cause::Unmappable.as_str(),
                rule.filter
            );
            metrics.bridge_unstored(bridge, Cause::Unmappable.as_str());
            return None;
        }
        None => return None,
    };
    let mut publish =
        crate::server::connection::publish_packet(delivery, None, false, now, ProtocolVersion::V5);
    publish.topic = Arc::from(topic);
    publish.qos = publish.qos.min(granted.max_qos);
    // A peer keeping no retained messages is sent the value with the flag down.
    publish.retain &= granted.retain_available;
    if let Some(properties) = publish.properties.present_mut() {
        properties.subscription_identifiers.clear();
        properties
            .user_properties
            .retain(|(k, _)| !k.starts_with("saguin-") || k == CROSSES);
    }
    // Measured with the topic it goes out under, which a template may lengthen.
    let size = message.wire_size_bound() - message.topic.len() + publish.topic.len();
    if size > granted.max_packet as usize {
        log::warn!(
            "bridge {bridge}: {:?} not carried out: larger than the peer's Maximum Packet Size {}",
            message.topic,
            granted.max_packet
        );
        return None;
    }
    Some(publish)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_never_takes_the_subscribes_packet_identifier() {
        let mut wire = HashMap::new();
        let mut next = FIRST_WIRE_ID;
        assert_eq!(next_free(&mut next, &wire), 2);
        wire.insert(3, (0, 0, Arc::from("t")));
        assert_eq!(next_free(&mut next, &wire), 4, "one in use is passed over");
        next = u16::MAX;
        assert_eq!(next_free(&mut next, &wire), u16::MAX);
        assert_eq!(
            next_free(&mut next, &wire),
            2,
            "wraps past the SUBSCRIBE's 1"
        );
    }
}
