//! The reading half of a connection's channels: cursors opened at SUBSCRIBE, their
//! windows read into the session, and the positions a durable consumer keeps
//! (DESIGN-NOTES 6); storing is `routing.rs`.
//!
//! Architecture invariant: a consumer's position moves only over settled offsets
//! and is written at most every `ack_commit_interval`, and at the end of the
//! connection.

use std::ops::Bound;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::{Conn, Shared};
use crate::acl::Verb;
use crate::broker::channels::{ChannelId, Kind};
use crate::broker::cursor::{ChannelSub, Cursor};
use crate::broker::metrics::{Gaps, Metrics};
use crate::broker::partition::{self, Slice};
use crate::broker::records::{self, now_ms};
use crate::broker::session::{Delivery, Untracked};
use crate::broker::topic;
use crate::codec::{QoS, RetainHandling, SubscriptionOptions};
use crate::storage::{RecordState, WindowRequest};

/// The most records one read takes.
const WINDOW_RECORDS: usize = 64;

impl Conn {
    /// The queue a plain filter lies wholly inside, if any (refused 0x8F).
    pub(super) fn inside_queue(&self, filter: &str) -> Option<String> {
        self.shared.broker.borrow().channels.reach(filter).1
    }

    /// Opens (or joins) a cursor on every channel `filter` touches, recorded before
    /// the SUBACK so nothing landing in between is missed. A cursor starts at the
    /// stored position of a durable consumer, else at the floor or, for `start:
    /// tail`, the head (gaps G-11, G-12). A latest channel shows the subscription its
    /// current state, as Retain Handling allows (`existed`: the filter replaces one
    /// the session held), however far the cursor had read.
    ///
    /// # Errors
    /// A channel's bounds or the stored position could not be read: nothing is
    /// opened, and the filter is refused 0x83 rather than served from a guess.
    pub(super) async fn open_cursors(
        &mut self,
        filter: &str,
        options: SubscriptionOptions,
        identifier: Option<u32>,
        deletions: bool,
        slice: Option<Slice>,
        opening: Opening,
    ) -> Result<(), ()> {
        let sub = ChannelSub {
            filter: filter.to_string(),
            options,
            identifier,
            deletions,
            slice,
            from: 0,
        };
        self.reader().open_cursors(sub, opening).await
    }

    /// Reads what the session's cursors are owed into its queue ([`Reader::pump`]);
    /// whether it read anything.
    pub(super) async fn pump_channels(&mut self) -> bool {
        self.reader().pump().await
    }

    /// What to read next ([`Reader::next_read`]).
    pub(super) fn next_read(&self) -> Option<NextRead> {
        self.reader().next_read()
    }

    fn reader(&self) -> Reader<'_> {
        Reader {
            shared: &self.shared,
            client_id: &self.client_id,
            link_id: self.link.id,
            gaps: Gaps::Consumer,
        }
    }
}

/// A session's channel reading, by whoever holds it: a client's connection, or a
/// bridge's outbound rule (`crate::bridge::outbound`), so one mechanism opens
/// cursors, reads windows into the session and writes positions for both.
pub(crate) struct Reader<'a> {
    /// The broker.
    pub shared: &'a Shared,
    /// The session's client id.
    pub client_id: &'a Arc<str>,
    /// The link holding the session.
    pub link_id: u64,
    /// Whom what retention takes below its positions is counted against.
    pub gaps: Gaps<'a>,
}

/// Why a subscription's cursors are opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// A SUBSCRIBE; `existed`: the session held the filter already.
    Subscribe {
        /// The filter was held before this SUBSCRIBE.
        existed: bool,
    },
    /// A session read back at startup resuming at its stored positions: no
    /// SUBSCRIBE, so no current-state pass - a consumer reconnecting is sent only
    /// what changed, whether or not the broker restarted between (RFC 0002
    /// "latest", G-19). A cursor with no stored position reads the state as it goes.
    Resume,
}

impl Reader<'_> {
    /// The offsets, in order, of a latest channel's values in `records` whose topic
    /// no longer reaches the channel: its filter was edited, or another channel
    /// claims the topic now. What is stored behind such a topic is reachable by
    /// nothing (RFC 0002 "Changing a filter"), where served it could arrive after
    /// the topic's real current value.
    fn strays(&self, id: ChannelId, kind: Kind, records: &[crate::storage::Record]) -> Vec<u64> {
        if kind != Kind::Latest {
            return Vec::new();
        }
        let broker = self.shared.broker.borrow();
        records
            .iter()
            .filter(|r| broker.channels.resolve(&r.topic) != Some(id))
            .map(|r| r.offset)
            .collect()
    }

    /// Opens (or joins) a cursor on every channel `sub`'s filter touches (see
    /// [`Conn::open_cursors`]).
    ///
    /// # Errors
    /// A channel's bounds or the stored position could not be read: nothing is
    /// opened.
    pub(crate) async fn open_cursors(&self, sub: ChannelSub, opening: Opening) -> Result<(), ()> {
        let filter = sub.filter.as_str();
        let options = sub.options;
        let wants_state = match (opening, options.retain_handling) {
            (Opening::Resume, _) | (_, RetainHandling::OnSubscribe) => true,
            (Opening::Subscribe { existed }, RetainHandling::OnNewSubscribe) => !existed,
            (_, RetainHandling::Never) => false,
        };
        let touched = self.shared.broker.borrow().channels.reach(filter).0;
        // Everything read first, so a failure leaves the session as it was.
        let mut opened = Vec::new();
        for id in touched {
            let (provider, name, kind, durable, joins) = {
                let mut broker = self.shared.broker.borrow_mut();
                let (durable, joins) = broker.session(self.client_id).map_or((false, false), |s| {
                    (s.outlives_connection(), s.cursors.contains_key(&id))
                });
                let channel = broker.channels.get(id);
                (
                    channel.provider.clone(),
                    channel.name.clone(),
                    channel.kind,
                    durable,
                    joins,
                )
            };
            let stats = || async {
                provider.stats(&name).await.map_err(|e| {
                    log::error!(
                        "channel {name}: cannot read its bounds for {}: {e}",
                        crate::broker::shown(self.client_id)
                    );
                })
            };
            if joins {
                // One that wants no stored state is owed what comes after the head,
                // wherever the cursor it joins is still reading (C-235).
                let head = if kind == Kind::Latest && !wants_state {
                    Some(stats().await?.head)
                } else {
                    None
                };
                opened.push((id, kind, None, head));
                continue;
            }
            let stats = stats().await?;
            // A client's stored position is read whatever its session's expiry now:
            // a session resumed after a restart keeps its place though this CONNECT
            // asked for no expiry (G-10, G-11), and one that ends with its connection
            // may have set a position by a seek before subscribing (G-18). What a
            // session that ended left is gone already (A-079, a Clean Start's too).
            let stored = if durable || matches!(self.gaps, Gaps::Consumer) {
                provider
                    .position(self.client_id, &name)
                    .await
                    .map_err(|e| {
                        log::error!(
                            "channel {name}: cannot read the position of {}: {e}",
                            crate::broker::shown(self.client_id)
                        );
                    })?
            } else {
                None
            };
            if let (Some(position), Kind::Append { .. } | Kind::DeadLetter) = (stored, kind)
                && position < stats.floor
            {
                let broker = self.shared.broker.borrow();
                self.lost_to_retention(&broker.metrics, &name, position, stats.floor);
            }
            let start = match (stored, kind) {
                (Some(position), _) => position.max(stats.floor),
                (None, Kind::Append { tail: true }) => stats.head,
                // Retain Handling said not now: a latest channel's state is not read.
                (None, Kind::Latest) if !wants_state => stats.head,
                (None, _) => stats.floor,
            };
            // A reader new to the channel reads its current state as it goes; one
            // resuming a stored position is shown what lies below it by a pass.
            let pass_until = if kind == Kind::Latest && stored.is_none() && wants_state {
                stats.head
            } else {
                0
            };
            let mut cursor = Cursor::new(start, pass_until, stored);
            cursor.add(sub.clone());
            opened.push((id, kind, Some(cursor), None));
        }
        let mut broker = self.shared.broker.borrow_mut();
        let client = self.client_id.clone();
        let Some(session) = broker.session_of(&client, self.link_id) else {
            return Ok(());
        };
        let mut new_readers = Vec::new();
        for (id, kind, fresh, head) in opened {
            let joined = fresh.is_none();
            let cursor = match fresh {
                Some(fresh) => {
                    new_readers.push(id);
                    session.cursors.entry(id).or_insert(fresh)
                }
                None => match session.cursors.get_mut(&id) {
                    Some(cursor) => {
                        let mut sub = sub.clone();
                        // The state stored before it is not shown to one that asked
                        // for none (C-235, MQTT-3.3.1-10, -11); a filter subscribed
                        // again keeps what its first SUBSCRIBE is still owed.
                        let before = cursor.subs.iter().find(|s| s.filter == sub.filter);
                        sub.from = match (head, before) {
                            (None, _) => 0, // it wants the state: owed all of it
                            (Some(_), Some(before)) => before.from,
                            (Some(head), None) => head,
                        };
                        cursor.add(sub);
                        cursor
                    }
                    None => continue,
                },
            };
            // What the cursor has read past, or starts past, this subscription is
            // shown by a pass; a new reader's own reading covers the rest.
            if kind == Kind::Latest
                && wants_state
                && opening != Opening::Resume
                && (joined || cursor.pass_until == 0)
            {
                let until = cursor.next;
                cursor.add_pass(sub.clone(), until);
            }
            cursor.wake();
        }
        for id in new_readers {
            broker.channels.get_mut(id).readers.insert(client.clone());
        }
        Ok(())
    }

    /// Reads what the session's cursors are owed into its queue, as far as the session
    /// bound allows: never more than half the bound queued, so acknowledgements keep
    /// room for what follows (RFC 0002 "How much a session may hold"). Returns
    /// whether it read any record.
    pub(crate) async fn pump(&self) -> bool {
        let mut read_any = false;
        loop {
            let Some(NextRead {
                channel: id,
                from,
                room,
                wakes,
                pass,
            }) = self.next_read()
            else {
                return read_any;
            };
            let (provider, name, kind, max_age) = {
                let broker = self.shared.broker.borrow();
                let c = broker.channels.get(id);
                (c.provider.clone(), c.name.clone(), c.kind, c.max_age)
            };
            let request = WindowRequest {
                from,
                max_records: WINDOW_RECORDS,
                max_bytes: room as u64,
            };
            let window = match provider.read_window(&name, request).await {
                Ok(window) => window,
                Err(e) => {
                    log::error!(
                        "channel {name}: read for {} failed: {e}",
                        crate::broker::shown(self.client_id)
                    );
                    let mut broker = self.shared.broker.borrow_mut();
                    if let Some(c) = broker
                        .session_of(self.client_id, self.link_id)
                        .and_then(|s| s.cursors.get_mut(&id))
                    {
                        c.caught_up = true;
                        broker.read_failed(self.client_id, id);
                    }
                    return read_any;
                }
            };
            read_any |= !window.records.is_empty();
            let stray = self.strays(id, kind, &window.records);
            let now = now_ms();
            let client = self.client_id.clone();
            let mut broker = self.shared.broker.borrow_mut();
            let Some((session, metrics)) = broker.session_and_metrics(&client, self.link_id) else {
                return read_any;
            };
            session.last_read = Some(id);
            let Some(cursor) = session.cursors.get_mut(&id) else {
                continue;
            };
            // Asked on every delivery, so a re-read acl_file applies (B-293).
            let grants = session.principal.as_ref().map(|p| p.grants());
            if pass {
                let deliveries = current_state(cursor, window.records, &client, now, |record| {
                    !max_age.passed(record, now)
                        && stray.binary_search(&record.offset).is_err()
                        && grants
                            .as_ref()
                            .is_none_or(|g| g.channel_allows(&name, &record.topic, Verb::Read))
                });
                for delivery in deliveries {
                    session.enqueue_counted(metrics, delivery);
                }
                continue;
            }
            if cursor.next < window.floor {
                if matches!(kind, Kind::Append { .. } | Kind::DeadLetter) {
                    self.lost_to_retention(metrics, &name, cursor.next, window.floor);
                }
                cursor.next = window.floor;
            }
            if window.records.is_empty() {
                cursor.found_nothing(wakes);
                continue;
            }
            let mut deliveries = Vec::with_capacity(window.records.len());
            for record in window.records {
                if record.offset < cursor.next {
                    continue;
                }
                cursor.next = record.offset + 1;
                if cursor.unsettled.contains(&record.offset) {
                    continue; // released before a restart, its PUBREL sent again
                }
                let own = records::origin(&record) == &*client;
                let deletion = matches!(record.state, RecordState::Deleted);
                let Some((qos, identifiers)) = select(&cursor.subs, &record, own, deletion) else {
                    continue; // no filter of this session takes it: settled at once
                };
                if !matches!(record.state, RecordState::Stored | RecordState::Deleted)
                    || (deletion && record.offset < cursor.pass_until)
                    || max_age.passed(&record, now)
                    || stray.binary_search(&record.offset).is_ok()
                {
                    continue;
                }
                if grants
                    .as_ref()
                    .is_some_and(|g| !g.channel_allows(&name, &record.topic, Verb::Read))
                {
                    // Stalled, not skipped: the position stays on this record until
                    // the grant is back and the channel wakes the cursor (B-294).
                    log::debug!(
                        "{client}: channel {name} stalled at {}: no read",
                        record.offset
                    );
                    cursor.next = record.offset;
                    cursor.caught_up = true;
                    break;
                }
                // Only the current-state pass carries RETAIN: a record keeps no
                // publisher's flag for Retain As Published to pass on.
                let retain = record.offset < cursor.pass_until;
                cursor.unsettled.insert(record.offset);
                let kept = Some((Some(id), record.offset));
                let message = Arc::new(records::from_record(record, qos, now));
                deliveries.push(Delivery {
                    message,
                    qos,
                    retain,
                    identifiers: identifiers.into(),
                    record: kept,
                    held: None,
                    resent: false,
                    untracked: Untracked::No,
                });
            }
            for delivery in deliveries {
                session.enqueue_counted(metrics, delivery);
            }
        }
    }

    /// Retention took offsets `from..floor` of append channel `name` before this
    /// reader's position reached them: it goes on at the floor, and the gap is logged
    /// and counted against this reader (gaps G-11; B-384 for an out rule).
    fn lost_to_retention(&self, metrics: &Metrics, name: &str, from: u64, floor: u64) {
        log::warn!(
            "{}: channel {name} no longer holds offsets {from}..{floor}; continuing at its floor",
            crate::broker::shown(self.client_id)
        );
        metrics.gap(self.gaps, name, floor - from);
    }

    /// What to read next, as far as the session has room; `None` when nothing is owed
    /// or there is no room. A cursor's pending current-state pass is read first.
    pub(crate) fn next_read(&self) -> Option<NextRead> {
        let mut broker = self.shared.broker.borrow_mut();
        let session = broker.session_of(self.client_id, self.link_id)?;
        let room = (session.queue_bound / 2).checked_sub(session.queued_bytes)?;
        if room == 0 {
            return None;
        }
        let owed = |(_, c): &(&ChannelId, &Cursor)| !c.caught_up || !c.passes.is_empty();
        // Round robin, from the channel after the one read last.
        let (id, cursor) = match session.last_read {
            Some(last) => {
                let after = session
                    .cursors
                    .range((Bound::Excluded(last), Bound::Unbounded));
                after.chain(session.cursors.range(..=last)).find(owed)
            }
            None => session.cursors.iter().find(owed),
        }?;
        let (from, pass) = match cursor.passes.first() {
            Some(pass) => (pass.next, true),
            None => (cursor.next, false),
        };
        Some(NextRead {
            channel: *id,
            from,
            room,
            wakes: cursor.wakes,
            pass,
        })
    }

    /// Writes the positions of a durable session's cursors that moved; whether any
    /// had moved.
    pub(crate) async fn write_positions(&self) -> bool {
        let moved: Vec<ChannelId> = {
            let mut broker = self.shared.broker.borrow_mut();
            let Some(session) = broker.session(self.client_id) else {
                return false;
            };
            if !session.outlives_connection() {
                return false;
            }
            session
                .cursors
                .iter()
                .filter(|(_, c)| c.dirty())
                .map(|(id, _)| *id)
                .collect()
        };
        if moved.is_empty() {
            return false;
        }
        for id in moved {
            // Each position is read as its write is sent, not with the list: a seek
            // handled while an earlier channel's write waited stored its own, which
            // one read before it would write over (G-18).
            let (provider, name, position) = {
                let mut broker = self.shared.broker.borrow_mut();
                let Some(position) = broker
                    .session(self.client_id)
                    .and_then(|s| s.cursors.get(&id))
                    .filter(|c| c.dirty())
                    .map(crate::broker::cursor::Cursor::position)
                else {
                    continue;
                };
                let channel = broker.channels.get(id);
                (channel.provider.clone(), channel.name.clone(), position)
            };
            match provider.set_position(self.client_id, &name, position).await {
                Ok(()) => {
                    let mut broker = self.shared.broker.borrow_mut();
                    if let Some(cursor) = broker
                        .session(self.client_id)
                        .and_then(|s| s.cursors.get_mut(&id))
                    {
                        cursor.stored = Some(position);
                    }
                }
                Err(e) => log::error!(
                    "channel {name}: position of {} not stored: {e}",
                    crate::broker::shown(self.client_id)
                ),
            }
        }
        true
    }
}

impl Conn {
    /// Whether `broker.session.ack_commit_interval` has passed since positions were
    /// last written.
    pub(super) fn positions_due(&self) -> bool {
        self.positions_stored_at
            .is_none_or(|at| at.elapsed() >= self.shared.settings.ack_commit_interval)
    }

    /// When moved positions must be written though nothing else wakes the connection:
    /// `ack_commit_interval` after the last write, if a position moved since (B-457).
    /// Only a connection that has written positions asks the session.
    /// None while a write is in flight: its end wakes the connection.
    pub(super) fn positions_deadline(&self) -> Option<Instant> {
        if self.positions_writing.is_some() {
            return None;
        }
        let at = self.positions_stored_at? + self.shared.settings.ack_commit_interval;
        self.positions_moved().then_some(at)
    }

    /// Whether a position of a session that outlives its connection moved since it
    /// was written: a channel's, or its place in the broadcast log.
    fn positions_moved(&self) -> bool {
        self.with_session(|s| {
            s.outlives_connection()
                && (s.cursors.values().any(Cursor::dirty)
                    || s.log.as_ref().is_some_and(|l| l.dirty()))
        })
        .unwrap_or(false)
    }

    /// Starts writing the positions of a durable consumer that moved, and its place in
    /// the broadcast log, when `ack_commit_interval` is up or the log window is full:
    /// beside the read loop, which goes on handling the client's packets meanwhile
    /// (B-457). One write at a time; the loop hears of its end as an event.
    pub(super) fn start_storing_positions(&mut self) {
        if !self.durable
            || self.positions_writing.is_some()
            || !(self.positions_due() || self.log_window_full)
            || !self.positions_moved()
        {
            return;
        }
        // What waits behind a full window goes once the write has moved the position.
        self.log_window_full = false;
        self.positions_writing = Some(Box::pin(store_moved(
            self.shared.clone(),
            self.client_id.clone(),
            self.link.id,
        )));
    }

    /// The write in flight has ended; `written` is when it began, if it wrote anything.
    pub(super) fn positions_stored(&mut self, written: Option<Instant>) {
        self.positions_writing = None;
        if written.is_some() {
            self.positions_stored_at = written;
        }
    }

    /// Writes whatever moved, now, after the write in flight if one is: a clean
    /// DISCONNECT or a graceful stop waits for no interval (B-458).
    pub(super) async fn store_positions_now(&mut self) {
        if let Some(writing) = self.positions_writing.take() {
            writing.await;
        }
        store_moved(self.shared.clone(), self.client_id.clone(), self.link.id).await;
    }
}

/// A write of a durable consumer's moved positions, run beside its connection's read
/// loop; `Some(when it began)` if it wrote anything.
pub(super) type PositionsWrite =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<Instant>>>>;

/// Writes what moved of `client_id`'s channel positions and of its place in the
/// broadcast log (B-457, B-458).
async fn store_moved(shared: Rc<Shared>, client_id: Arc<str>, link_id: u64) -> Option<Instant> {
    let started = Instant::now();
    let reader = Reader {
        shared: &shared,
        client_id: &client_id,
        link_id,
        gaps: Gaps::Consumer,
    };
    let log_moved = shared
        .broker
        .borrow_mut()
        .session(&client_id)
        .filter(|s| s.outlives_connection())
        .and_then(|s| s.log.as_ref())
        .filter(|l| l.dirty())
        .map(|l| l.position());
    if let Some(position) = log_moved {
        reader.write_log_position(position).await;
    }
    (reader.write_positions().await || log_moved.is_some()).then_some(started)
}

impl Reader<'_> {
    /// Writes the session's position in the broadcast log (B-457, B-458); once
    /// written, what was sent below it can no longer be sent again (B-459).
    async fn write_log_position(&self, position: u64) {
        let Some(provider) = self.shared.broker.borrow().session_store() else {
            return;
        };
        let channel = crate::broker::broadcast_log::CHANNEL;
        match provider
            .set_position(self.client_id, channel, position)
            .await
        {
            Ok(()) => {
                let mut broker = self.shared.broker.borrow_mut();
                if let Some(log) = broker.session(self.client_id).and_then(|s| s.log.as_mut()) {
                    log.stored_at(position);
                }
            }
            Err(e) => {
                log::error!(
                    "the broadcast log position of {} not stored: {e}",
                    crate::broker::shown(self.client_id)
                );
                self.shared.broker.borrow().metrics.storage_failed(&e);
            }
        }
    }
}

/// Which of a cursor's subscriptions take a record on `topic`: the highest QoS among
/// them, every Subscription Identifier, and whether any keeps RETAIN as published.
/// `own` says the session's own client published it, which a No Local subscription
/// never takes (gaps G-15).
/// A deletion on a latest channel goes only to a subscription that asked for deletions
/// (`saguin-deletions`), as a zero-length publish, and never in the current-state pass
/// (gaps G-19).
/// A subscription that declared a slice takes only records in it, in the replay, the
/// current-state pass and live alike; a record no subscription takes is stepped over
/// (C-165, C-166, C-198).
fn select(
    subs: &[ChannelSub],
    record: &crate::storage::Record,
    own: bool,
    deletion: bool,
) -> Option<(QoS, Vec<u32>)> {
    let topic_name = &*record.topic;
    let mut taken = None::<(QoS, Vec<u32>)>;
    let wanted = |s: &&ChannelSub| {
        record.offset >= s.from
            && !(own && s.options.no_local)
            && (!deletion || s.deletions)
            && topic::matches(&s.filter, topic_name)
            && partition::admits(s.slice.as_ref(), topic_name)
    };
    for sub in subs.iter().filter(wanted) {
        let (qos, ids) = taken.get_or_insert((QoS::AtMostOnce, Vec::new()));
        *qos = (*qos).max(sub.options.qos);
        ids.extend(sub.identifier);
    }
    taken
}

/// What to read next: a channel's cursor, or its pending current-state pass.
pub(crate) struct NextRead {
    channel: ChannelId,
    from: u64,
    /// Bytes the session has room for.
    room: usize,
    /// The cursor's wake-ups when the read began.
    wakes: u64,
    /// Whether this reads the cursor's first pass rather than the cursor.
    pass: bool,
}

/// Moves the cursor's first current-state pass over `window`: each current value its
/// filter takes (and `servable` allows) goes out with RETAIN set and no origin, so
/// settling it never moves the position. The pass ends at its `until`
/// or at the end of what is stored.
fn current_state(
    cursor: &mut Cursor,
    window: Vec<crate::storage::Record>,
    client: &str,
    now: u64,
    servable: impl Fn(&crate::storage::Record) -> bool,
) -> Vec<Delivery> {
    let Some(pass) = cursor.passes.first_mut() else {
        return Vec::new();
    };
    let mut done = window.is_empty();
    let mut deliveries = Vec::new();
    for record in window {
        if record.offset >= pass.until {
            done = true;
            break;
        }
        pass.next = record.offset + 1;
        if !matches!(record.state, RecordState::Stored) || !servable(&record) {
            continue;
        }
        let own = records::origin(&record) == client;
        let Some((qos, identifiers)) = select(std::slice::from_ref(&pass.sub), &record, own, false)
        else {
            continue;
        };
        let message = Arc::new(records::from_record(record, qos, now));
        deliveries.push(Delivery {
            message,
            qos,
            retain: true,
            identifiers: identifiers.into(),
            record: None,
            held: None,
            resent: false,
            untracked: Untracked::Kept,
        });
    }
    if done || pass.next >= pass.until {
        cursor.passes.remove(0);
    }
    deliveries
}
