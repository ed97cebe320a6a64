//! The MQTT side of queues (RFC 0002 "What each channel type admits", RFC 0003
//! "queue"): the one subscription form `$saguin/queue/<name>`, answers on
//! `$saguin/queue/<name>/response`, PUBACKs of offers, a worker's full window
//! reopening, and a worker's connection ending. Each only tells the queue's owner what happened; the owner decides.

use super::{Conn, End, Shared};
use crate::broker::channels::{ChannelId, Kind};
use crate::broker::inflight::Answer;
use crate::broker::queue::lease::{Verdict, Worker};
use crate::broker::queue::{DeliveryId, Event, FORM_PREFIX};
use crate::broker::session::{Inflight, Subscription};
use crate::broker::topic;
use crate::codec::{Properties, ProtocolVersion, Publish, QoS, SubscriptionOptions, reason};
use crate::storage::Record;

/// A job was stored: its owner learns of it, and nobody else does - a queue's records
/// leave only as offers (invariant 11). A retained publish is taken as work with the
/// flag dropped, and counted.
pub(crate) fn stored(shared: &Shared, id: ChannelId, record: Record, retain: bool) -> u8 {
    let broker = shared.broker.borrow();
    if retain {
        let name = &broker.channels.get(id).name;
        broker.metrics.queue(name, |c| c.retain_ignored += 1);
    }
    broker.queues.stored(id, record);
    reason::SUCCESS
}

impl Conn {
    fn worker(&self) -> Worker {
        Worker {
            client: self.client_id.clone(),
            link: self.link.id,
        }
    }

    /// The queue called `name`, if there is one.
    fn queue_named(&self, name: &str) -> Option<ChannelId> {
        let broker = self.shared.broker.borrow();
        broker
            .channels
            .by_name(name)
            .filter(|id| broker.channels.get(*id).kind == Kind::Queue)
    }

    /// Decides a filter under `$saguin/queue/` (the SUBACK table): `None` for any other
    /// filter, and for one the ordinary checks must refuse first (not a filter at all,
    /// a reserved User Property).
    pub(super) fn queue_subscription(
        &mut self,
        filter: &str,
        options: SubscriptionOptions,
        properties: &Properties,
        identifier: Option<u32>,
    ) -> Option<u8> {
        let name = filter.strip_prefix(FORM_PREFIX)?;
        // `saguin-deletions: true` is a SUBSCRIBE's own (gaps G-19) and means nothing
        // to a queue; any other saguin- property refuses every filter, in
        // `check_filter`.
        let unread = |(k, v): &(String, String)| {
            k.starts_with("saguin-") && !(k == super::subscribe::DELETIONS && v == "true")
        };
        if !topic::is_valid_filter(filter) || properties.user_properties.iter().any(unread) {
            return None;
        }
        let refuse = |code: u8, why: &str| {
            log::info!(
                "{}: {} refused {filter:?} 0x{code:02X}: {why}",
                self.peer,
                self.client_id
            );
            self.shared
                .broker
                .borrow()
                .metrics
                .refuse_subscription(code);
            code
        };
        if self.protocol == ProtocolVersion::V311 {
            // Recorded as 0x8F; 3.1.1 carries only 0x80.
            refuse(
                reason::TOPIC_FILTER_INVALID,
                "a queue needs MQTT 5 to answer its jobs",
            );
            return Some(reason::v311::SUBACK_FAILURE);
        }
        let queue = (!name.contains(['/', '+', '#']))
            .then(|| self.queue_named(name))
            .flatten();
        let Some(queue) = queue else {
            return Some(refuse(
                reason::TOPIC_FILTER_INVALID,
                "not a queue's form: $saguin/queue/ and the name of a queue, nothing else",
            ));
        };
        if options.no_local {
            // The SUBACK's Reason String names the filter to change (C-044).
            self.suback_reason = Some(format!(
                "{filter}: No Local is refused on a queue's form, since it would withhold a job from the one worker that published it; subscribe without it"
            ).into());
            return Some(refuse(
                reason::TOPIC_FILTER_INVALID,
                "No Local would withhold a job from the one worker that published it",
            ));
        }
        if options.qos == QoS::AtMostOnce {
            return Some(refuse(
                reason::IMPLEMENTATION_SPECIFIC_ERROR,
                "QoS 0 has no PUBACK to start a visibility timeout from",
            ));
        }
        if !self.may_consume(name) {
            // After the structural refusals, which no grant widens (B-286).
            return Some(refuse(
                reason::NOT_AUTHORIZED,
                "the acl_file grants this client no consume on the queue",
            ));
        }
        if let Some(why) = self.past_max_subscriptions(filter) {
            let code = refuse(reason::QUOTA_EXCEEDED, &why);
            self.suback_reason = Some(why.into());
            return Some(code);
        }
        let mut broker = self.shared.broker.borrow_mut();
        // Granted at 1: offers go at QoS 1.
        let options = SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            ..options
        };
        let sub = Subscription {
            filter: filter.to_string(),
            share: None,
            options,
            identifier,
            slice: None,
        };
        // Its owner learns of a worker once, not at every SUBSCRIBE naming the form
        // again: its mailbox is not bounded by the packet.
        if !broker.subscribe(&self.client_id, sub) {
            broker
                .queues
                .tell(queue, Event::Subscribed(self.client_id.clone()));
        }
        Some(QoS::AtLeastOnce as u8)
    }

    /// Tells each queue whose form is among `filters` that this client works it: a
    /// session restored at startup holds its forms, and the queues' owners, started
    /// afresh, know no workers.
    pub(super) fn tell_queues_of_forms<'f>(&self, filters: impl Iterator<Item = &'f str>) {
        let broker = self.shared.broker.borrow();
        for name in filters.filter_map(|f| f.strip_prefix(FORM_PREFIX)) {
            if let Some(queue) = broker
                .channels
                .by_name(name)
                .filter(|id| broker.channels.get(*id).kind == Kind::Queue)
            {
                broker
                    .queues
                    .tell(queue, Event::Subscribed(self.client_id.clone()));
            }
        }
    }

    /// Answers a publish to `$saguin/queue/<name>/response`: `None` for any other
    /// topic. A response naming a queue is acknowledged 0x00 whatever becomes of it
    /// (C-082); one naming no queue is refused 0x90, saying so.
    pub(super) fn queue_response(&mut self, publish: &Publish) -> Option<Result<(), End>> {
        let name = publish
            .topic
            .strip_prefix(FORM_PREFIX)?
            .strip_suffix("/response")?;
        if name.is_empty() || name.contains('/') {
            return None; // not the shape: refused with everything else under $saguin/
        }
        let Some(queue) = self.queue_named(name) else {
            log::info!(
                "{}: {} answered on {:?}, which names no queue (0x90)",
                self.peer,
                self.client_id,
                publish.topic
            );
            self.puback_reason = Some(format!("{name} is not a queue").into());
            return Some(self.answer_publish(publish, reason::TOPIC_NAME_INVALID));
        };
        if !self.may_consume(name) {
            // The response topic is part of consume (B-282).
            log::info!(
                "{}: {} answered on {:?} without consume on queue {name} (0x87)",
                self.peer,
                self.client_id,
                publish.topic
            );
            self.shared
                .broker
                .borrow()
                .metrics
                .refuse_publish("not authorized");
            self.puback_reason = Some(format!("not authorized: no consume on queue {name}").into());
            return Some(self.answer_publish(publish, reason::NOT_AUTHORIZED));
        }
        // An owner that cannot keep up is not handed more than its mailbox's bound:
        // the worker is told 0x97 and answers again (a QoS 0 answer is dropped, and
        // its job comes back at its visibility timeout).
        if !self.shared.broker.borrow().queues.takes_answers(queue) {
            log::debug!(
                "{}: {} answered queue {name} while its owner is {} events behind (0x97)",
                self.peer,
                self.client_id,
                crate::broker::queue::MAILBOX_JOBS
            );
            self.shared
                .broker
                .borrow()
                .metrics
                .refuse_publish("quota exceeded");
            return Some(self.answer_publish(publish, reason::QUOTA_EXCEEDED));
        }
        // An answer at QoS 2 is held until its PUBREL like any other.
        if let Some(answered) = self.qos2_answered_already(publish) {
            return Some(answered);
        }
        let verdict = Verdict::parse(&publish.payload);
        let named = match &publish.properties.correlation_data {
            Some(data) => DeliveryId::parse(data).ok_or("is not a Delivery ID"),
            None => Err("is missing"),
        };
        self.shared
            .broker
            .borrow()
            .queues
            .tell(queue, Event::Answer(self.worker(), named, verdict));
        self.hold_acted_on(publish);
        Some(self.answer_publish(publish, reason::SUCCESS))
    }

    /// Settles an outbound exchange (PUBACK, PUBCOMP, or a PUBREC refusing it); an
    /// answer the exchange may not get ends the connection, 0x82. A PUBACK of a
    /// queue's offer tells the queue's owner the worker has it.
    /// When settling reopens the session's full window, the owner of every queue whose
    /// form the session holds is told, so a job waiting for room is offered now rather
    /// than at the owner's next tick - whatever the acknowledged delivery was: a
    /// broadcast, a channel record, or another queue's offer (C-066).
    pub(super) fn settle_outbound(&self, packet_id: u16, answer: Answer) -> Result<(), End> {
        let mut broker = self.shared.broker.borrow_mut();
        let Some(session) = broker.session_of(&self.client_id, self.link.id) else {
            return Ok(());
        };
        // One lookup serves both questions: a PUBACK is the hot path.
        let inflight = session.inflight.get(&packet_id);
        if inflight.is_some_and(|i| !i.takes(answer)) {
            drop(broker);
            return Err(self.mismatched(packet_id, answer));
        }
        let offer = match inflight {
            Some(Inflight::Published(delivery)) if answer == Answer::PubAck => {
                delivery.origin().map(|(channel, _)| {
                    let correlation = delivery.message.properties.correlation_data.clone();
                    let topic = delivery.message.topic.clone();
                    (channel, correlation.unwrap_or_default(), topic)
                })
            }
            _ => None,
        };
        // A released exchange kept in storage is forgotten there, with the
        // next housekeeping: a restart that finds it still held sends its PUBREL only
        // if the stored position has not passed its record.
        let kept = session
            .stored
            .then(|| session.stored_release(packet_id))
            .flatten();
        let principal = offer.as_ref().and_then(|_| session.principal.clone());
        let was_full = !session.can_take(QoS::AtLeastOnce, 0);
        session.settle(packet_id);
        let reopened = was_full && session.can_take(QoS::AtLeastOnce, 0);
        let forms: Vec<String> = if reopened {
            session
                .subscriptions
                .values()
                .filter(|s| s.share.is_none() && s.filter.starts_with(FORM_PREFIX))
                .map(|s| s.filter.clone())
                .collect()
        } else {
            Vec::new()
        };
        if let Some(token) = kept {
            broker.forget_released(&self.client_id, packet_id, token);
        }
        if let Some((channel, correlation, topic)) = offer
            && broker.channels.get(channel).kind == Kind::Queue
        {
            // A worker that lost `consume` since the offer was written gives the job
            // back with its attempt unspent (B-295).
            let name = &broker.channels.get(channel).name;
            let event = if principal.is_some_and(|p| !p.may_consume_job(name, &topic)) {
                Event::Withdrawn(self.worker())
            } else {
                Event::Puback(self.worker(), correlation)
            };
            broker.queues.tell(channel, event);
        }
        for form in forms {
            let queue = form
                .strip_prefix(FORM_PREFIX)
                .and_then(|name| broker.channels.by_name(name))
                .filter(|id| broker.channels.get(*id).kind == Kind::Queue);
            if let Some(queue) = queue {
                broker
                    .queues
                    .tell(queue, Event::Reopened(self.client_id.clone()));
            }
        }
        Ok(())
    }

    /// A client's answer that its exchange may not get (`InflightTable::fits`): the
    /// connection ends with a Protocol Error, as mosquitto ends it.
    pub(super) fn mismatched(&self, packet_id: u16, answer: Answer) -> End {
        log::info!(
            "{}: {} answered exchange {packet_id} with a {answer:?} it may not get",
            self.peer,
            self.client_id
        );
        self.refuse(reason::PROTOCOL_ERROR)
    }

    /// The connection is ending: every job it held goes back at once, and a session
    /// that outlives it keeps no offer to send again (gaps A-03). A session another
    /// connection holds already is left alone.
    pub(super) fn queue_connection_ended(&self) {
        self.shared.broker.borrow().queues.ended(&self.worker());
        self.strip_queue_offers();
    }

    /// Takes every queue offer out of the session this connection holds: a resumed
    /// session is never sent a stale offer again (gaps A-03); its job went back when
    /// the connection that carried it ended.
    pub(super) fn strip_queue_offers(&self) {
        let mut broker = self.shared.broker.borrow_mut();
        let queues: Vec<ChannelId> = broker
            .channels
            .iter()
            .filter(|(_, c)| c.kind == Kind::Queue)
            .map(|(id, _)| id)
            .collect();
        if queues.is_empty() {
            return;
        }
        let Some(session) = broker.session_of(&self.client_id, self.link.id) else {
            return;
        };
        let is_offer =
            |origin: Option<(ChannelId, u64)>| origin.is_some_and(|(c, _)| queues.contains(&c));
        let mut freed = 0;
        session.queue.retain(|d| {
            let offer = is_offer(d.origin());
            if offer {
                freed += d.charge();
            }
            !offer
        });
        session.inflight.retain(|_, i| match i {
            Inflight::Published(d) if is_offer(d.origin()) => {
                freed += d.charge();
                false
            }
            _ => true,
        });
        session.queued_bytes = session.queued_bytes.saturating_sub(freed);
    }
}
