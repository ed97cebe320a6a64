//! SUBSCRIBE and UNSUBSCRIBE: filters checked against the rules and the ACL, the
//! channel cursors and retained values a subscription opens, and the session
//! record written before the SUBACK; a resumed session's cursors reopened.

use std::collections::HashMap;
use std::time::Instant;

use super::channels::Opening;
use super::routing::log_owed;
use super::verbs;
use super::{Conn, End, refusal_text};
use crate::broker::queue::FORM_PREFIX;
use crate::broker::session::{Delivery, Subscription, Untracked};
use crate::broker::{partition, topic};
use crate::codec::{
    Packet, Properties, PropertyValues, ProtocolVersion, RetainHandling, SubAck, Subscribe,
    SubscriptionOptions, UnsubAck, Unsubscribe, reason,
};

/// The SUBSCRIBE property asking to be told of deletions on latest channels.
pub(super) const DELETIONS: &str = "saguin-deletions";

impl Conn {
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

    pub(super) async fn on_subscribe(&mut self, mut subscribe: Subscribe) -> Result<(), End> {
        self.features_on_subscribe(&mut subscribe)?;
        // The session this SUBSCRIBE is for: another CONNECT may replace it while the
        // SUBSCRIBE waits on storage (a Clean Start), or resume it.
        let incarnation = self.with_session(|s| s.incarnation);
        // What ends the connection is found before anything is granted: nothing of a
        // SUBSCRIBE that gets no SUBACK stays in the session (A-156, MQTT-3.8.3-4).
        let v5 = self.protocol == ProtocolVersion::V5;
        for (filter, options) in &subscribe.filters {
            if !v5 && !topic::is_valid_filter(filter) {
                return Err(End::Close);
            }
            if v5 && options.no_local && filter.starts_with("$share/") {
                return Err(End::Broker(reason::PROTOCOL_ERROR));
            }
        }
        // A filter named more than once is granted once, with its last options (each
        // copy replaces the one before, MQTT-3.8.4-3), and every copy gets that code:
        // a packet of one filter repeated costs one grant, not one per copy. It is sent
        // the retained values its copies would have been, applied in turn (MQTT-3.8.4-5):
        // as the first copy's Retain Handling says, unless a later one asks for them at
        // every subscribe. Each filter: the index of its last copy, and that handling.
        let mut last: HashMap<&str, (usize, RetainHandling)> = HashMap::new();
        for (index, (filter, options)) in subscribe.filters.iter().enumerate() {
            let asked = options.retain_handling;
            last.entry(filter.as_str())
                .and_modify(|(at, handling)| {
                    *at = index;
                    if asked == RetainHandling::OnSubscribe {
                        *handling = asked;
                    }
                })
                .or_insert((index, asked));
        }
        let mut copies = Vec::new();
        let identifier = subscribe
            .properties
            .subscription_identifiers
            .first()
            .copied();
        let mut codes = Vec::with_capacity(subscribe.filters.len());
        let mut retained = std::collections::VecDeque::new();
        // What the retained values to send weigh, summed: no more is gathered than the
        // session could hold (`session_queue_bytes`), however many filters of one
        // SUBSCRIBE match however many values. Past it the oldest gathered go, counted,
        // as the session's queue gives up its oldest (B-082).
        let mut retained_bytes = 0usize;
        let mut retained_dropped = 0u64;
        let now = Instant::now();
        // Read once: the declaration applies to every filter of this packet (C-160).
        let declared = partition::declared(&subscribe.properties.user_properties);
        let slice = declared.as_ref().ok().and_then(Option::as_ref);
        // Each filter this packet granted, with the subscription it replaced: what a
        // record the store refused gives back (the session is kept as it was).
        let mut changed: Vec<(usize, String, Option<Subscription>)> = Vec::new();
        // What the channel cursors held for each changed filter before, beside
        // `changed`, for a refusal to put back.
        let mut cursors_before = Vec::new();
        for (index, (filter, options)) in subscribe.filters.iter().enumerate() {
            let (at, handling) =
                (last.get(filter.as_str()).copied()).unwrap_or((index, options.retain_handling));
            if at != index {
                copies.push(index);
                codes.push(reason::SUCCESS); // the last copy's code, below
                continue;
            }
            let options = &SubscriptionOptions {
                retain_handling: handling,
                ..*options
            };
            let before = filter
                .starts_with(FORM_PREFIX)
                .then(|| self.with_session(|s| s.subscriptions.get(filter.as_str()).cloned()));
            if let Some(code) =
                self.queue_subscription(filter, *options, &subscribe.properties, identifier)
            {
                // A queue's form granted is a lasting session's like any
                // subscription: stored before the SUBACK, and resumed (gaps A-03).
                // One that ends with its connection stores nothing, so a worker can
                // still come to drain a queue whose provider is full.
                let lasting = self.with_session(|s| s.outlives_connection());
                if code < 0x80 && lasting == Some(true) {
                    changed.push((codes.len(), filter.clone(), before.flatten().flatten()));
                    cursors_before.push(Vec::new());
                }
                codes.push(code);
                continue;
            }
            let granted = match self.check_filter(filter, &subscribe.properties, &declared) {
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
                    let mut in_cursors = Vec::new();
                    if share.is_none() {
                        let deletions = subscribe
                            .properties
                            .user_properties
                            .iter()
                            .any(|(k, _)| k == DELETIONS);
                        let existed = self
                            .with_session(|s| s.subscriptions.contains_key(filter.as_str()))
                            .unwrap_or(false);
                        if existed {
                            in_cursors =
                                (self.shared.broker.borrow()).cursor_subs(&self.client_id, filter);
                        }
                        let opened = self
                            .open_cursors(
                                filter,
                                *options,
                                identifier,
                                deletions,
                                slice.cloned(),
                                Opening::Subscribe { existed },
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
                        // Replaced while the channels were read: nothing of this
                        // SUBSCRIBE is the new session's (MQTT-3.1.2-4).
                        if !self.same_session(incarnation) {
                            return Ok(());
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
                    cursors_before.push(in_cursors);
                    // In the index before the SUBACK is written, so a publish in
                    // between is delivered (C-233).
                    let existed = broker.subscribe(&self.client_id, sub);
                    // A filter added ends an episode over max_subscriptions (B-096).
                    self.over_max_subscriptions &= existed;
                    if !shared_sub {
                        let mut messages =
                            broker.retained_for_subscription(&inner, *options, slice, existed, now);
                        // Every delivery is asked (B-293): a filter granted whole may
                        // still match a topic no rule lets this client read (a `$`
                        // topic, which a leading wildcard's grant does not reach).
                        if let Some(acl) = &self.acl {
                            messages.retain(|m| acl.may_read(&m.topic));
                        }
                        let bound = self.shared.settings.session_queue_bytes;
                        for message in messages {
                            retained_bytes += message.charge();
                            retained.push_back((message, *options));
                            while retained_bytes > bound && retained.len() > 1 {
                                if let Some((oldest, _)) = retained.pop_front() {
                                    retained_bytes -= oldest.charge();
                                    retained_dropped += 1;
                                }
                            }
                        }
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
                // Every refusal says why; one more particular said it already.
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
        let stored = match changed.is_empty() {
            true => Ok(()),
            false => self.store_subscriptions(&changed).await,
        };
        // Replaced while the record was written: the undo would land on the new
        // session. Resumed by another connection, the undo still applies to it, but no
        // SUBACK or retained value goes from here.
        if !self.same_session(incarnation) {
            return Ok(());
        }
        if let Err(e) = stored {
            // Stored before acknowledged (invariant 18): what the store could not keep
            // is refused, 0x97 when it is full, 0x83 otherwise (3.1.1: 0x80), and the
            // session goes back to what it was.
            let own = if e.is_full() {
                reason::QUOTA_EXCEEDED
            } else {
                reason::IMPLEMENTATION_SPECIFIC_ERROR
            };
            let code = match self.protocol {
                ProtocolVersion::V311 => reason::v311::SUBACK_FAILURE,
                ProtocolVersion::V5 => own,
            };
            self.suback_reason = Some(format!("the session could not be stored: {e}").into());
            let mut broker = self.shared.broker.borrow_mut();
            let undone = changed.into_iter().zip(cursors_before).rev();
            for ((index, filter, before), in_cursors) in undone {
                codes[index] = code;
                // Counted under its own code, as every refusal is.
                broker.metrics.refuse_subscription(own);
                match before {
                    // Replaced, not removed: its channel cursors read on as they did
                    // (B-470).
                    Some(before) => {
                        broker.restore_subscription(&self.client_id, before, in_cursors)
                    }
                    None => {
                        broker.unsubscribe(&self.client_id, &filter);
                    }
                }
            }
            retained.clear();
            retained_dropped = 0;
        }
        if !self.holds_session() {
            return Ok(());
        }
        for index in copies {
            let filter = subscribe.filters[index].0.as_str();
            codes[index] = last.get(filter).map_or(codes[index], |&(at, _)| codes[at]);
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
            let dropped = &broker.metrics.dropped_queue_full;
            dropped.set(dropped.get() + retained_dropped);
            for (message, options) in retained {
                let delivery = Delivery {
                    qos: options.qos.min(message.qos),
                    retain: true,
                    identifiers: identifier.into_iter().collect(),
                    message,
                    record: None,
                    held: None,
                    resent: false,
                    untracked: Untracked::No,
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
    /// SUBACK table). `Ok(share)` grants it, with the share name and inner filter of a
    /// shared subscription; `Err(code)` refuses it. `declared` is the packet's
    /// `saguin-filter` declaration.
    fn check_filter<'f>(
        &mut self,
        filter: &'f str,
        properties: &Properties,
        declared: &Result<Option<partition::Slice>, partition::Refusal>,
    ) -> Result<Option<(&'f str, &'f str)>, u8> {
        let v5 = self.protocol == ProtocolVersion::V5;
        if !topic::is_valid_filter(filter) {
            // 3.1.1 has no code for it: `on_subscribe` closed the connection.
            return Err(reason::TOPIC_FILTER_INVALID);
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
            return Err(reason::IMPLEMENTATION_SPECIFIC_ERROR);
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
            return Err(reason::IMPLEMENTATION_SPECIFIC_ERROR);
        }
        let mut inner = filter;
        let mut share = None;
        if let Some(rest) = filter.strip_prefix("$share/") {
            if !v5 {
                // Sent as 0x80, counted under its own code.
                return Err(reason::TOPIC_FILTER_INVALID);
            }
            let Some((name, f)) = rest.split_once('/') else {
                return Err(reason::TOPIC_FILTER_INVALID);
            };
            if name.is_empty()
                || crate::codec::has_wildcard(name)
                || f.is_empty()
                || f.to_lowercase().starts_with("$share")
            {
                return Err(reason::TOPIC_FILTER_INVALID);
            }
            share = Some(name);
            inner = f;
        } else if filter
            .split('/')
            .next()
            .is_some_and(|first| first.eq_ignore_ascii_case("$share"))
        {
            // $SHARE, $Share..., or `$share` with no group: refused rather than read
            // as an ordinary level; `$shares` is an ordinary level.
            return Err(reason::TOPIC_FILTER_INVALID);
        }
        if topic::level_count(inner) > self.shared.settings.max_topic_levels {
            return Err(reason::TOPIC_FILTER_INVALID);
        }
        let first = inner.split('/').next().unwrap_or_default();
        if share.is_none() && verbs::is_seek_reply(inner) {
            return Ok(None);
        }
        if first == "$SYS" || first == "$saguin" {
            return Err(reason::NOT_AUTHORIZED);
        }
        Ok(share.map(|name| (name, inner)))
    }

    /// Opens the channel cursors of a session read back from storage at startup, which
    /// has its subscriptions and no cursors: each resumes at its stored position.
    /// `saguin-deletions` is not kept with a subscription yet, so it is not asked for.
    pub(super) async fn reopen_restored_cursors(&mut self) {
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
        // A worker's queue forms: its queues learn of it again, as at its SUBSCRIBE.
        self.tell_queues_of_forms(subs.iter().map(|s| s.filter.as_str()));
        for sub in subs {
            let opened = self
                .open_cursors(
                    &sub.filter,
                    sub.options,
                    sub.identifier,
                    false,
                    sub.slice,
                    Opening::Resume,
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

    /// The channel records of released exchanges read back at startup, now
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
            .record_of(&self.client_id, without);
        let Some(record) = record else {
            return Ok(());
        };
        crate::server::write_session_record(&self.shared, &self.client_id, Some(record)).await?;
        self.shared
            .broker
            .borrow_mut()
            .set_stored(&self.client_id, true);
        Ok(())
    }

    /// Whether this connection still holds its client id's session: not once another
    /// CONNECT took it over while this one waited on storage.
    fn holds_session(&self) -> bool {
        self.with_session(|_| ()).is_some()
    }

    /// Whether the client id's session is still the one of `incarnation`, whichever
    /// connection holds it now.
    fn same_session(&self, incarnation: Option<u64>) -> bool {
        let broker = self.shared.broker.borrow();
        let now = broker.held_session(&self.client_id).map(|s| s.incarnation);
        now.is_some() && now == incarnation
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
    pub(super) async fn on_unsubscribe(&mut self, unsubscribe: Unsubscribe) -> Result<(), End> {
        // A cursor its last filter leaves goes with it: the position it reached is
        // written first, so subscribing again goes on from there (G-11).
        self.store_positions_now().await;
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
}
