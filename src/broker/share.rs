//! What a shared group is owed while no member can take it (RFC 0002 "What a shared
//! group is owed: broker.share", B-446..B-450).
//!
//! A delivery no member can take when it comes is held for the group in the queue of
//! a member whose session outlives its connection - at QoS 1 or 2 in the broadcast
//! log, under that member's cursor, so it keeps across a restart what the sessions
//! keep. It is the group's, not that member's: [`Broker::collect_backlog`] hands it to
//! whichever member can take it first, as much as that member's window takes at a
//! time, and a member whose session ends gives back what the group had handed it and
//! it had not settled ([`Broker::give_back_held`]).
//!
//! Moving a held delivery moves its log offset from one member's cursor to the
//! other's; the record itself still names the member it was first held for. After a
//! crash that member is owed it again, so a delivery collected and not yet settled is
//! held again rather than lost.

use std::sync::Arc;

use crate::codec::SubscriptionOptions;

use super::session::Delivery;
use super::topic::SubEntry;
use super::{Broker, enqueue_counted, release_logged};

impl Broker {
    /// Hands `client_id` - a connected member with nothing queued and room on the
    /// wire - what its groups hold in other members' queues, at most as much as its
    /// window takes now; how many it was handed (B-447).
    pub fn collect_backlog(&mut self, client_id: &str) -> usize {
        if self.backlogged.is_empty() {
            return 0;
        }
        let Some(taker) = self.sessions.get(client_id) else {
            return 0;
        };
        let mut room = taker.window_room();
        if room == 0 || !taker.queue.is_empty() {
            return 0;
        }
        // (the group, the taker's subscription options and identifier in it)
        let groups: Vec<(Arc<str>, SubscriptionOptions, Option<u32>)> = taker
            .subscriptions
            .values()
            .filter_map(|sub| {
                let key = format!("{}/{}", sub.share.as_deref()?, sub.filter);
                let group = self.backlogged.get(key.as_str())?.clone();
                Some((group, sub.options, sub.identifier))
            })
            .collect();
        if groups.is_empty() {
            return 0;
        }
        let max_packet = taker.max_packet_size as usize;
        let principal = taker.principal.clone();
        // Within the taker's bound too, which would otherwise give up what it took: the
        // first goes whatever its size, as into any empty session (B-088).
        let mut bytes = taker.queue_bound.saturating_sub(taker.queued_bytes);
        let mut first = taker.queued_bytes == 0;
        let mut fits = |d: &Delivery| {
            let charge = d.charge();
            let fits = (first || charge <= bytes)
                && d.message.wire_size_bound() <= max_packet
                && principal
                    .as_ref()
                    .is_none_or(|p| p.may_read(&d.message.topic));
            if fits {
                bytes = bytes.saturating_sub(charge);
                first = false;
            }
            fits
        };
        let mut collected = Vec::new();
        for (group, options, identifier) in groups {
            let mut left = false;
            for (holder, _) in self.members(&group) {
                if *holder == *client_id {
                    continue;
                }
                let Some(session) = self.sessions.get_mut(&holder) else {
                    continue;
                };
                let taken = session.take_held(&group, room, &mut fits);
                room -= taken.len();
                collected.extend(
                    taken
                        .into_iter()
                        .map(|d| as_subscribed(d, options, identifier)),
                );
                left |= session.holds_for(&group);
            }
            if !left {
                self.backlogged.remove(&group);
            }
        }
        let count = collected.len();
        if let Some(taker) = self.sessions.get_mut(client_id) {
            for delivery in collected {
                if let Some(offset) = delivery.logged() {
                    taker.hand_logged(offset);
                }
                enqueue_counted(taker, &self.metrics, delivery);
            }
        }
        count
    }

    /// Gives what `ending`, a session that has ended, held for its groups to another
    /// member of each: one that can take it now, else one whose session outlives its
    /// connection, which holds it. With neither it is dropped and counted
    /// (`no_shared_member`, B-448).
    pub(super) fn give_back_held(&mut self, ending: &str, held: Vec<Delivery>) {
        let (mut lost, mut released) = (0u64, Vec::new());
        for delivery in held {
            let Some(group) = delivery.held.as_ref().map(|h| h.group.clone()) else {
                continue;
            };
            let (qos, size) = (delivery.qos, delivery.message.wire_size_bound());
            let charge = delivery.charge();
            let topic = &delivery.message.topic;
            let members = self.members(&group);
            let sessions = &self.sessions;
            let pick = |now: bool| {
                members.iter().find(|(c, _)| {
                    **c != *ending
                        && sessions.get(c).is_some_and(|s| {
                            s.may_read(topic)
                                && if now {
                                    s.can_hold(qos, size, charge)
                                } else {
                                    s.outlives_connection()
                                }
                        })
                })
            };
            let to = pick(true).or_else(|| pick(false));
            let to = to.and_then(|(c, entry)| Some((self.sessions.get_mut(c)?, entry)));
            match to {
                Some((session, entry)) => {
                    let delivery = as_subscribed(delivery, entry.options, entry.identifier);
                    if let Some(offset) = delivery.logged() {
                        session.hand_logged(offset);
                    }
                    enqueue_counted(session, &self.metrics, delivery);
                    self.backlogged.insert(group);
                }
                None => {
                    lost += 1;
                    released.extend(delivery.logged());
                }
            }
        }
        let total = &self.metrics.dropped_no_shared_member;
        total.set(total.get() + lost);
        release_logged(&mut self.log_refs, &mut self.log_unneeded, released);
    }

    /// Whether `client` is a member of group `<ShareName>/<filter>`.
    pub(super) fn is_member(&self, group: &str, client: &str) -> bool {
        self.members(group).iter().any(|(c, _)| &**c == client)
    }

    /// The members of group `<ShareName>/<filter>` and their subscriptions.
    fn members(&self, group: &str) -> Vec<(Arc<str>, SubEntry)> {
        match group.split_once('/') {
            Some((name, filter)) => self.tree.group_members(filter, name),
            None => Vec::new(),
        }
    }
}

/// `delivery` as the member taking it subscribed to the group: at the lower of the
/// publish's QoS and the member's, with RETAIN as its Retain As Published says and its
/// Subscription Identifier (MQTT-3.3.4-3) - not the holder's.
fn as_subscribed(
    mut delivery: Delivery,
    options: SubscriptionOptions,
    identifier: Option<u32>,
) -> Delivery {
    let message = &delivery.message;
    delivery.qos = message.qos.min(options.qos);
    delivery.retain = message.retain && options.retain_as_published;
    delivery.identifiers = identifier.into_iter().collect();
    delivery
}
