//! A start: the sessions `broker.session.storage` kept, read back in before any client
//! connects - their subscriptions, Wills and expiry, the QoS 2 exchanges they held
//! and the broadcasts their log still owes them (B-455, A-254, gaps G-10).

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::session::{HeldQos2, Inflight, Session, Subscription};
use super::{Broker, broadcast_log, held, queue, records, released, session, shown, stored};

impl Broker {
    /// Hands each restored session the outbound QoS 2 exchanges its client had
    /// answered with PUBREC and not yet completed: `Inflight::Released` under
    /// the same packet identifier, its PUBREL sent again when the session resumes
    /// (MQTT-4.4.0-1), its record settled rather than sent again (`restore_owed` for
    /// the broadcast log, `Conn::reopen_restored_cursors` for a channel). One below
    /// the session's stored log position was completed (the position passes a record
    /// only once it is settled) and is forgotten, as is one whose session did not
    /// come back. Then the identifiers of the exchanges still published at a graceful
    /// stop ([`released::Row::Published`]): each is kept for its record
    /// (`Session::kept_ids`), which goes out again under it (MQTT-4.4.0-1); the row is
    /// forgotten in storage now, read once.
    pub(super) fn restore_released(
        &mut self,
        rows: Vec<(Arc<crate::storage::Provider>, crate::storage::Held)>,
    ) {
        let (mut restored, mut dropped, mut published) = (0usize, 0usize, 0usize);
        let mut rows: Vec<_> = rows
            .into_iter()
            .map(|(provider, row)| {
                let read = released::decode(&row.data);
                (provider, row, read)
            })
            .collect();
        // Released ones first: an identifier released is never kept for a publish.
        rows.sort_by_key(|(_, _, read)| matches!(read, Ok(released::Row::Published(_))));
        for (provider, row, read) in rows {
            let key = row.key();
            let session = released::client_of(&row.client_id)
                .and_then(|client| self.sessions.get_mut(client))
                .filter(|s| !s.internal && !s.inflight.contains_key(&row.packet_id));
            // Its stored place in the broadcast log: a log record below it was settled.
            let position = session
                .as_ref()
                .and_then(|s| s.log.as_ref())
                .map_or(0, |l| l.stored.unwrap_or(0));
            let kept = match (session, read) {
                (Some(session), Ok(released::Row::Released(None, offset))) => {
                    (offset >= position).then_some((session, Some((None, offset))))
                }
                (Some(session), Ok(released::Row::Released(Some(channel), offset))) => {
                    let record = self.channels.by_name(&channel).map(|id| (Some(id), offset));
                    Some((session, record))
                }
                (Some(session), Ok(released::Row::Published(exchanges))) => {
                    let mut ids = Box::<session::KeptIds>::default();
                    for (packet_id, channel, offset) in exchanges {
                        let record = match channel {
                            None if offset >= position => (None, offset),
                            None => continue,
                            Some(name) => match self.channels.by_name(&name) {
                                Some(id) => (Some(id), offset),
                                None => continue,
                            },
                        };
                        if !session.inflight.contains_key(&packet_id) {
                            ids.keep(record, packet_id);
                        }
                    }
                    if !ids.is_empty() {
                        published += 1;
                        session.kept_ids = Some(ids);
                    }
                    self.held_forget.push(held::HeldRef { provider, key });
                    continue;
                }
                (Some(_), Err(why)) => {
                    damaged(&provider, "released QoS 2 exchange", &row, &why);
                    None
                }
                (None, _) => None,
            };
            match kept {
                Some((session, record)) => {
                    let released = Inflight::Released(record, Some(row.token));
                    session.inflight.insert(row.packet_id, released);
                    restored += 1;
                }
                None => {
                    dropped += 1;
                    self.held_forget.push(held::HeldRef { provider, key });
                }
            }
        }
        if restored + dropped > 0 {
            log::info!(
                "released QoS 2 exchanges read back: {restored} handed to restored sessions \
                 (their PUBREL goes again), {dropped} dropped (completed, or their session \
                 did not come back)"
            );
        }
        if published > 0 {
            log::info!(
                "{published} restored sessions keep the packet identifiers of what was on \
                 the wire at the last stop: it goes again under them (MQTT-4.4.0-1)"
            );
        }
    }

    /// Hands each restored session the QoS 2 publishes it was holding in storage
    /// (B-443): its PUBREL then completes them. One whose session did not come back
    /// (it expired while the broker was stopped, or a start ended it), or that does
    /// not read back, is dropped - forgotten by the server before any client
    /// connects - logged and counted in `saguin_qos2_abandoned_total`.
    pub(super) fn restore_held(
        &mut self,
        kept: Vec<(Arc<crate::storage::Provider>, crate::storage::Held)>,
    ) {
        let (now, now_ms) = (Instant::now(), records::now_ms());
        let (mut restored, mut dropped) = (0usize, 0usize);
        for (provider, kept) in kept {
            let key = kept.key();
            let session = self
                .sessions
                .get_mut(kept.client_id.as_str())
                .filter(|s| !s.internal && !s.incoming.contains_key(&kept.packet_id));
            let back = session.map(|session| {
                let read = held::decode(&session.client_id, &kept.data, now, now_ms);
                (session, read)
            });
            match back {
                Some((session, Ok((message, since)))) => {
                    let stored = held::StoredHeld {
                        provider,
                        token: kept.token,
                    };
                    let held = HeldQos2 {
                        since,
                        message: Some(Arc::new(message)),
                        stored: Some(stored),
                    };
                    session.incoming.insert(kept.packet_id, held);
                    restored += 1;
                }
                other => {
                    if let Some((_, Err(why))) = other {
                        damaged(&provider, "held QoS 2 publish", &kept, &why);
                    }
                    dropped += 1;
                    self.held_forget.push(held::HeldRef { provider, key });
                }
            }
        }
        if restored + dropped > 0 {
            log::info!(
                "held QoS 2 publishes read back: {restored} handed to restored sessions, \
                 {dropped} dropped (their session did not come back)"
            );
        }
        let total = &self.metrics.qos2_abandoned;
        total.set(total.get() + dropped as u64);
    }

    /// Reads the sessions `broker.session.storage` kept back in, before any client
    /// connects (B-455, gaps G-10 "A start ends sessions as well as restoring them").
    /// A session whose expiry passed while the broker was stopped ends: its Will is
    /// published if it has a due moment (C-280), discarded otherwise (C-283). Others
    /// come back away, with their subscriptions in the index, their expiry counting
    /// from the moment their connection ended, and a Will's wait resuming what is left
    /// of it or published now when it ran out while stopped (C-279). A session whose
    /// connection the stop cut without saying when (a crash) counts from now, and its
    /// Will waits for the session's end (C-282). A session holding a subscription the
    /// configuration now refuses ends as an expired one does, logged (C-280).
    /// What they are owed of broadcast is handed back by `restore_owed` (B-456), their
    /// held QoS 2 publishes by `restore_held` (B-443).
    pub(super) fn restore(
        &mut self,
        loaded: Vec<stored::Restored>,
        acl: Option<&Rc<crate::acl::Acl>>,
    ) {
        let (now, now_ms) = (Instant::now(), records::now_ms());
        let (mut restored, mut ended, mut wills_fired) = (0usize, 0usize, 0usize);
        let mut due_now = Vec::new();
        for mut record in loaded {
            let client_id: Arc<str> = Arc::from(record.client_id.as_str());
            // Asked as the client it was stored as: every delivery it is owed while
            // away, and its Will when it fires (B-290). A record written before the
            // name was kept names nobody, and is asked as anonymous.
            let principal = acl.map(|acl| {
                let user = record.user.as_deref().unwrap_or_default();
                Rc::new(acl.principal(user, &client_id))
            });
            if let Some((will, _)) = &mut record.will {
                will.asker = principal.clone();
            }
            let away_ms = record.away_ms.unwrap_or(now_ms);
            let ends_ms = (record.expiry != u32::MAX)
                .then(|| away_ms.saturating_add(u64::from(record.expiry) * 1000));
            self.record_work.push(client_id.clone());
            // A session holding a subscription the configuration now refuses is ended
            // rather than restored without it: a client told Session Present 1 would
            // believe itself subscribed (C-280).
            let refused = record
                .subscriptions
                .iter()
                .find_map(|sub| Some((&sub.filter, self.refused_at_restore(sub)?)));
            if let Some((filter, why)) = &refused {
                log::warn!(
                    "session {client_id} ended at the start: its subscription {filter:?} is \
                     one the configuration now refuses ({why}); its client is told Session \
                     Present 0 and subscribes again"
                );
            }
            if record.expiry == 0 || ends_ms.is_some_and(|at| at <= now_ms) || refused.is_some() {
                ended += 1;
                // Its positions go with it.
                self.lapsed.push(client_id.clone());
                if let Some((will, Some(_))) = record.will {
                    due_now.push((client_id, Box::new(will)));
                }
                continue;
            }
            let bound = self.settings.session_queue_bytes;
            let mut session = Session::new(client_id.clone(), record.protocol, bound);
            session.expiry = record.expiry;
            if let Some(incarnation) = record.incarnation {
                session.incarnation = incarnation;
            }
            session.stored = true;
            session.restored = true;
            session.away_ms = Some(away_ms);
            // The window its last connection had: how many of what it is owed from
            // the log may have been on the wire (B-459), until a connection resumes it.
            session.receive_maximum = record.receive_maximum;
            session.log = record
                .log_position
                .map(|p| Box::new(broadcast_log::LogCursor::restored(p)));
            session.principal = principal;
            session.user = record.user.as_deref().and_then(session::user_named);
            let generation = session.generation;
            let mut will_due = None;
            if let Some((will, due_ms)) = record.will {
                match due_ms {
                    Some(due) if due <= now_ms => due_now.push((client_id.clone(), Box::new(will))),
                    Some(due) => {
                        will_due = Some(now + Duration::from_millis(due - now_ms));
                        session.will = Some(Box::new(will));
                    }
                    None => session.will = Some(Box::new(will)),
                }
            }
            self.sessions.insert(client_id.clone(), Box::new(session));
            for sub in record.subscriptions {
                self.subscribe(&client_id, sub);
            }
            if let Some(at) = will_due {
                self.wills.insert(client_id.clone(), (generation, at));
            }
            if let Some(at) = ends_ms {
                let left = Duration::from_millis(at - now_ms);
                self.expiring.insert(client_id, now + left);
            }
            restored += 1;
        }
        // Restored subscribers hear the Wills that fell due while the broker was
        // stopped; each is published before the write that removes it (C-281).
        for (client_id, will) in due_now {
            wills_fired += 1;
            self.publish_will(&client_id, *will);
        }
        if restored + ended > 0 {
            log::info!(
                "sessions restored from broker.session.storage: {restored} ({ended} ended \
                 while the broker was stopped, {wills_fired} Wills published that fell due \
                 meanwhile)"
            );
        }
    }

    /// Hands each restored session what the broadcast log holds for it at or above
    /// its stored position, in log order (B-456): the first Receive Maximum of them
    /// with DUP set, since any of them may have been on the wire when the broker
    /// stopped (B-459). A record no restored session is owed is left for the server
    /// to delete.
    pub(super) fn restore_owed(&mut self, entries: Vec<broadcast_log::Entry>) {
        let (records, mut owed) = (entries.len(), 0usize);
        let clocks = (Instant::now(), records::now_ms());
        for entry in entries {
            let mut holders = 0;
            for target in &entry.targets {
                // A group's held delivery is the group's: it stays with a session that
                // is still the group's member, whichever incarnation.
                let member = (target.group.as_deref())
                    .is_some_and(|group| self.is_member(group, &target.client_id));
                let Some(session) = self.sessions.get_mut(target.client_id.as_str()) else {
                    continue;
                };
                // Owed to a session its client has since replaced (MQTT-3.1.2-4); a
                // record or target from before incarnations were kept matches any.
                if !member && target.incarnation.is_some_and(|n| n != session.incarnation) {
                    continue;
                }
                let (position, handed) = session.log.as_ref().map_or((0, 0), |l| {
                    (l.stored.unwrap_or(0), l.unsettled.len() + l.released.len())
                });
                if entry.offset < position {
                    continue;
                }
                // Released before the stop: its PUBREL goes again, the record
                // is held until its PUBCOMP and never sent again as a PUBLISH.
                if session.inflight.values().any(
                    |f| matches!(f, Inflight::Released(Some((None, o)), _) if *o == entry.offset),
                ) {
                    session.hand_logged(entry.offset);
                    holders += 1;
                    continue;
                }
                let Some(mut delivery) = target.delivery(&entry.message, entry.offset, clocks)
                else {
                    continue;
                };
                delivery.resent = handed < usize::from(session.receive_maximum);
                // Held for a group: any member may collect it (B-447).
                if let Some(held) = delivery.held.as_ref().filter(|h| !h.group.is_empty()) {
                    self.backlogged.insert(held.group.clone());
                }
                session.hand_logged(entry.offset);
                session.enqueue_counted(&self.metrics, delivery);
                holders += 1;
            }
            owed += holders;
            if holders == 0 {
                self.log_unneeded.push(entry.offset);
            } else {
                self.log_refs.insert(entry.offset, holders);
            }
        }
        // An identifier kept for a log record the session is no longer owed (settled
        // before the stop, or given up) is free again.
        for session in self.sessions.values_mut() {
            session.forget_kept_log_ids();
        }
        if records > 0 {
            log::info!(
                "broadcast log: {records} messages read back, {owed} deliveries owed to \
                 restored sessions"
            );
        }
    }

    /// Why the configuration now refuses a stored subscription, if it does.
    fn refused_at_restore(&self, sub: &Subscription) -> Option<String> {
        if sub.share.is_none()
            && let (_, Some(queue)) = self.channels.reach(&sub.filter)
        {
            return Some(format!("it lies inside queue {queue}"));
        }
        if let Some(name) = sub.filter.strip_prefix(queue::FORM_PREFIX) {
            let a_queue = self
                .channels
                .by_name(name)
                .is_some_and(|id| self.channels.get(id).kind == super::channels::Kind::Queue);
            if !a_queue || sub.share.is_some() {
                return Some(format!("no queue {name:?} is configured"));
            }
        }
        None
    }
}

/// Logs a held row (`what` it is) read back at startup that is damaged and dropped.
fn damaged(provider: &crate::storage::Provider, what: &str, row: &crate::storage::Held, why: &str) {
    log::error!(
        "storage provider {}: the {what} {} of {:?} is damaged and dropped: {why}",
        provider.name(),
        row.packet_id,
        shown(&row.client_id)
    );
}
