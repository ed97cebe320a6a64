//! One client's session: what it subscribed to and what it is owed.
//!
//! Sessions live in memory; a persistent session's record (subscriptions, expiry,
//! Will, when its connection ended) is also kept by `broker.session.storage`
//! (`super::stored`), and the QoS 1/2 broadcasts it is owed by that provider's
//! broadcast log (`super::broadcast_log`), of which the session keeps only its cursor.
//!
//! Architecture invariant: a session's queue is bounded by `limits.session_queue_bytes`;
//! past the bound the oldest delivery not yet on the wire is given up (RFC 0002
//! "How much a session may hold").

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use crate::codec::{Properties, ProtocolVersion, QoS, SubscriptionOptions, Will};

use super::channels::ChannelId;
use super::connection_link::ConnLink;
use super::cursor::Cursor;
use super::delivery_queue::DeliveryQueue;
use super::inflight::InflightTable;

/// A message as the broker routes it: shared by every session it is delivered to.
#[derive(Debug)]
pub struct Message {
    /// Topic name (never an alias).
    pub topic: Arc<str>,
    /// Payload.
    pub payload: Arc<[u8]>,
    /// QoS it was published at.
    pub qos: QoS,
    /// RETAIN as published.
    pub retain: bool,
    /// The publisher's properties, minus Topic Alias and Subscription Identifiers.
    pub properties: Properties,
    /// The client id of the publisher (for No Local).
    pub publisher: Arc<str>,
    /// When the Message Expiry Interval runs out.
    pub expires_at: Option<Instant>,
}

impl Message {
    /// What a client, a bridge's peer or a Will published, as it is routed: without
    /// the properties that belong to one hop (Topic Alias, Subscription Identifiers,
    /// Will Delay Interval) or the `saguin-` User Properties a client may not set,
    /// and expiring when its Message Expiry Interval runs out, counted from `now`.
    pub fn published(
        topic: Arc<str>,
        payload: Arc<[u8]>,
        (qos, retain): (QoS, bool),
        mut properties: Properties,
        publisher: Arc<str>,
        now: Instant,
    ) -> Message {
        if let Some(p) = properties.present_mut() {
            p.topic_alias = None;
            p.subscription_identifiers.clear();
            p.will_delay_interval = None;
            super::records::strip_reserved(&mut p.user_properties);
        }
        // A publish whose only property was hop-only (a Topic Alias) is routed, and
        // cloned into every record and delivery, with none.
        properties.shed_if_empty();
        let expires_at = properties
            .message_expiry_interval
            .map(|s| now + std::time::Duration::from_secs(u64::from(s)));
        Message {
            topic,
            payload,
            qos,
            retain,
            properties,
            publisher,
            expires_at,
        }
    }

    /// Bytes this message is charged against a session's bound: payload, topic and
    /// properties.
    pub fn charge(&self) -> usize {
        let p = &self.properties;
        let props = p.content_type.as_ref().map_or(0, String::len)
            + p.response_topic.as_ref().map_or(0, String::len)
            + p.correlation_data.as_ref().map_or(0, Vec::len)
            + p.user_properties
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        self.payload.len() + self.topic.len() + props + ENTRY_OVERHEAD
    }

    /// At least the size of its PUBLISH to any subscriber: fixed header, topic,
    /// packet identifier, every property it carries (two Subscription Identifiers
    /// allowed for) and the payload. A shared group's member whose Maximum Packet
    /// Size is below it is passed over.
    pub fn wire_size_bound(&self) -> usize {
        let p = &self.properties;
        let string = |s: &Option<String>| s.as_ref().map_or(0, |s| 3 + s.len());
        let props = 2
            + 5
            + string(&p.content_type)
            + string(&p.response_topic)
            + p.correlation_data.as_ref().map_or(0, |c| 3 + c.len())
            + p.user_properties
                .iter()
                .map(|(k, v)| 5 + k.len() + v.len())
                .sum::<usize>()
            + 2 * 5;
        1 + 4 + 2 + self.topic.len() + 2 + 4 + props + self.payload.len()
    }

    /// Whether its Message Expiry Interval has run out.
    pub fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// What a queued entry costs beyond its content (RFC 0002 measures ~80 bytes). One
/// figure for every entry, on the wire or waiting: B-081's 600, 300 and 192 bytes
/// price the substrate's in-flight tables, which this broker does not have.
const ENTRY_OVERHEAD: usize = 80;

/// One delivery owed to a session. 56 bytes: a session's queue and its exchanges on
/// the wire hold one per message, for every subscriber of a fan-out.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message.
    pub message: Arc<Message>,
    /// The QoS it is delivered at: the lower of the publish's and the subscription's.
    pub qos: QoS,
    /// RETAIN as it goes out.
    pub retain: bool,
    /// Subscription Identifiers of every matching subscription that carried one.
    pub identifiers: Box<[u32]>,
    /// The stored record it is, if any: a channel's (settling it moves the cursor),
    /// or the broadcast log's, for a broadcast owed to a session that outlives its
    /// connection (B-456: settling or giving it up moves the session's log cursor).
    pub record: Option<KeptRecord>,
    /// For a shared group's delivery no member could take when it came: the group it
    /// is held for, which any member that can take it collects (B-447). Boxed: every
    /// other delivery pays a word.
    pub held: Option<Box<Held>>,
    /// Read back from the log at startup and perhaps sent before the stop: it goes
    /// out with DUP set (B-459).
    pub resent: bool,
    /// Whether it is a copy of a channel's record no cursor tracks, and which:
    /// settling it moves no position.
    pub untracked: Untracked,
}

const _: () = assert!(size_of::<Delivery>() <= 56 && size_of::<Inflight>() <= 56);

/// A copy of a channel's record that no cursor tracks (`Delivery::untracked`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untracked {
    /// Not a copy: a broadcast, or a record its cursor tracks.
    No,
    /// A latest channel's current value shown by a state pass, or a record on the
    /// wire that a seek detached from its cursor: kept as a channel's record is (see
    /// [`Delivery::is_channel_value`]).
    Kept,
    /// A record handed to a shared group: bounded as a broadcast is, but it outlives
    /// its publisher's expiry as every channel record does.
    Group,
}

/// The user a session names for the name a door proved: none for an anonymous
/// client, whose name is empty (B-175). Records stored before bfc5bbf name an
/// anonymous client "", and are read through this too.
pub fn user_named(name: &str) -> Option<Arc<str>> {
    (!name.is_empty()).then(|| Arc::from(name))
}

/// Slots an emptied session queue keeps (3.5 KiB at 56 bytes a `Delivery`).
const QUEUE_KEPT: usize = 64;

/// The shortest episode of deliveries given up at the bound: a session that fills
/// and empties its queue over and over is said to at most once in this long.
const GIVING_UP_EPISODE: std::time::Duration = std::time::Duration::from_secs(10);

/// An episode of deliveries given up or refused at a session's bound, said at WARN
/// when it starts and with its count when the session catches up, as mosquitto warns
/// that outgoing messages are being dropped.
#[derive(Debug)]
struct GivingUp {
    since: Instant,
    deliveries: u64,
}

impl Delivery {
    /// The channel record it is, for a channel delivery: its channel and offset.
    pub fn origin(&self) -> Option<(ChannelId, u64)> {
        match self.record {
            Some((Some(channel), offset)) => Some((channel, offset)),
            _ => None,
        }
    }

    /// What it counts against `limits.session_queue_bytes`: its message's charge
    /// and its Subscription Identifiers, which one message may carry thousands of
    /// (one per matching filter).
    pub fn charge(&self) -> usize {
        self.message.charge() + 4 * self.identifiers.len()
    }

    /// Whether it is a channel's: a record or a current value. Such a delivery is
    /// never given up or refused at the session's bound (B-083, B-087; "a latest
    /// value stays pending"), goes out once expired without its countdown (gaps
    /// G-16), and is not skipped when too large for the client (gaps G-17, A-266).
    pub fn is_channel_value(&self) -> bool {
        self.untracked == Untracked::Kept || self.origin().is_some()
    }

    /// Whether it goes out once its publisher's expiry has passed, without the
    /// countdown: a channel's value, or a record handed to a shared group (C-137,
    /// gaps G-16).
    pub fn outlives_expiry(&self) -> bool {
        self.is_channel_value() || self.untracked == Untracked::Group
    }

    /// Its offset in the broadcast log, for a logged broadcast.
    pub fn logged(&self) -> Option<u64> {
        match self.record {
            Some((None, offset)) => Some(offset),
            _ => None,
        }
    }

    /// Whether this is a shared group's backlog that waited out
    /// `broker.share.expires_after` (B-446).
    pub fn backlog_expired(&self, now: Instant) -> bool {
        self.held
            .as_ref()
            .and_then(|h| h.until)
            .is_some_and(|at| at <= now)
    }

    /// Whether it is held for the shared group `group`.
    fn held_for(&self, group: &str) -> bool {
        self.held.as_ref().is_some_and(|h| *h.group == *group)
    }
}

/// A shared group's delivery no member could take when it came (B-447): held in the
/// queue of a member whose session outlives its connection - in the broadcast log
/// under that member's cursor - until a member that can take it collects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The group, `<ShareName>/<filter>`.
    pub group: Arc<str>,
    /// When `broker.share.expires_after` gives it up (B-446).
    pub until: Option<Instant>,
}

/// An outbound QoS 1 or 2 exchange on the wire.
#[derive(Debug)]
pub enum Inflight {
    /// PUBLISH sent; waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    Published(Delivery),
    /// PUBREL sent; waiting for PUBCOMP. Carries the record it was, if any (a
    /// channel's, or the broadcast log's), and the token of its row in
    /// `broker.session.storage` when it is kept there (`broker::released`, A-254).
    Released(Option<KeptRecord>, Option<u64>),
}

/// A subscription as the session remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The filter without any `$share/<name>/` prefix.
    pub filter: String,
    /// The share name, for a shared subscription.
    pub share: Option<String>,
    /// Options as granted.
    pub options: SubscriptionOptions,
    /// Subscription Identifier.
    pub identifier: Option<u32>,
    /// The slice its SUBSCRIBE declared (`saguin-filter`), kept for as long as the
    /// session, a resumed one included (C-160, C-200).
    pub slice: Option<super::partition::Slice>,
}

impl Subscription {
    /// The filter string the client sent (`$share/<name>/<filter>` for a shared
    /// one), byte by byte, without building it.
    fn key_bytes(&self) -> impl Iterator<Item = u8> + '_ {
        let (prefix, name, slash) = match &self.share {
            Some(name) => ("$share/", name.as_str(), "/"),
            None => ("", "", ""),
        };
        [prefix, name, slash, &self.filter]
            .into_iter()
            .flat_map(str::bytes)
    }
}

/// A session's subscriptions by the filter string the client sent, in that string's
/// order. A sorted vector: most sessions hold a few, and a B-tree's first node has
/// room for eleven whatever the count (1,248 bytes for one subscription, 88 here).
#[derive(Debug, Clone, Default)]
pub struct Subscriptions(Vec<Subscription>);

impl Subscriptions {
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|s| s.key_bytes().cmp(key.bytes()))
    }

    /// The subscription made with the filter string `key`.
    pub fn get(&self, key: &str) -> Option<&Subscription> {
        self.find(key).ok().map(|at| &self.0[at])
    }

    /// Whether a subscription was made with the filter string `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Adds `sub`, or replaces the one with its filter string, which it returns.
    pub fn insert(&mut self, sub: Subscription) -> Option<Subscription> {
        match self
            .0
            .binary_search_by(|s| s.key_bytes().cmp(sub.key_bytes()))
        {
            Ok(at) => Some(std::mem::replace(&mut self.0[at], sub)),
            Err(at) => {
                if self.0.len() == self.0.capacity() {
                    // Half again, from one: a session of one filter holds one.
                    self.0.reserve_exact(self.0.len() / 2 + 1);
                }
                self.0.insert(at, sub);
                None
            }
        }
    }

    /// Removes the subscription made with the filter string `key`.
    pub fn remove(&mut self, key: &str) -> Option<Subscription> {
        self.find(key).ok().map(|at| self.0.remove(at))
    }

    /// Every subscription, in order.
    pub fn values(&self) -> std::slice::Iter<'_, Subscription> {
        self.0.iter()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A Will waiting for its connection to end abnormally, or for its delay to run out.
#[derive(Debug, Clone)]
pub struct ArmedWill {
    /// The Will as the CONNECT carried it.
    pub will: Will,
    /// Will Delay Interval, seconds.
    pub delay: u32,
    /// Its client under the acl_file, when one is held: the Will is asked again,
    /// as that client, when it fires, the file having perhaps been re-read (B-290).
    pub asker: Option<std::rc::Rc<crate::acl::Principal>>,
}

/// An inbound QoS 2 exchange between its PUBREC and its PUBREL (`broker.qos2`).
#[derive(Debug, Clone)]
pub struct HeldQos2 {
    /// When it was received: it is abandoned `broker.qos2.expires_after` later.
    pub since: Instant,
    /// The publish, routed at PUBREL; `None` when it was applied already (a queue
    /// answer) and the PUBREL only completes the exchange.
    pub message: Option<Arc<Message>>,
    /// Where it is kept in storage, for a session that outlives its connection
    /// (B-441); `None` for every other, which holds it in memory alone.
    pub stored: Option<super::held::StoredHeld>,
}

/// One client's session.
#[derive(Debug)]
pub struct Session {
    /// The client identifier.
    pub client_id: Arc<str>,
    /// Protocol of the connection that last held it.
    pub protocol: ProtocolVersion,
    /// Granted Session Expiry Interval, seconds (`u32::MAX` is never).
    pub expiry: u32,
    /// Subscriptions by the filter string the client sent. Routing asks the topic
    /// tree, not this (a queue's offer asks it, among a worker's few filters).
    pub subscriptions: Subscriptions,
    /// Deliveries not yet written.
    pub queue: DeliveryQueue,
    /// The connected client under the acl_file, when one is held: whose entry's
    /// `limits:` its publish budget refills at (B-115, B-116).
    pub principal: Option<std::rc::Rc<crate::acl::Principal>>,
    /// The grants its queue was last asked under ([`Session::drop_unreadable`]).
    read_checked: Option<Rc<crate::acl::Grants>>,
    /// Outbound exchanges on the wire, by packet identifier, in the order sent.
    pub inflight: InflightTable,
    /// Inbound QoS 2 publishes received and not yet released, by packet identifier.
    pub incoming: BTreeMap<u16, HeldQos2>,
    /// Bytes charged for `queue` and the published part of `inflight`.
    pub queued_bytes: usize,
    /// The bound on `queued_bytes`.
    pub queue_bound: usize,
    /// The connection holding the session, if any.
    pub link: Option<Rc<ConnLink>>,
    /// The client's Receive Maximum: the outbound window.
    pub receive_maximum: u16,
    /// The client's Maximum Packet Size.
    pub max_packet_size: u32,
    /// The Will of the current connection.
    pub will: Option<Box<ArmedWill>>,
    /// Bumped whenever a connection takes the session, so stale timers can tell.
    pub generation: u64,
    /// Which session of its client id this is: new with every session, kept across
    /// resumes and restarts. A delivery owed to a session its client has since
    /// replaced (Clean Start, or a new session after the old one lapsed) names the
    /// old one, and is not handed to the new (MQTT-3.1.2-4).
    pub incarnation: u64,
    /// Cursors on the channels its subscriptions touch.
    pub cursors: BTreeMap<ChannelId, Cursor>,
    /// The channel read last: the next read starts after it, so one channel's
    /// backlog does not keep the others waiting.
    pub last_read: Option<ChannelId>,
    /// Its record is in `broker.session.storage` (`broker::stored`): whatever ends
    /// or changes the session writes it again.
    pub stored: bool,
    /// When its last connection ended (ms since the epoch); `None` while connected.
    pub away_ms: Option<u64>,
    /// Read back from storage at startup and not resumed since: its channel
    /// subscriptions have no cursors until the connection resuming it opens them.
    pub restored: bool,
    /// Held by the broker itself (a bridge's out rule, `Broker::attach_internal`),
    /// never by a client's connection.
    pub internal: bool,
    /// The name its last connection's door proved (`None`: anonymous, see
    /// [`user_named`]), for the operations listener; restored sessions carry the name
    /// their record kept.
    pub user: Option<Arc<str>>,
    /// The door its last connection came through, by the name B-175 gives it.
    pub listener: Option<Arc<str>>,
    /// Its place in the broadcast log, once it has been owed a logged broadcast or
    /// was restored with one (B-456); boxed, so a session that never is pays a word.
    pub log: Option<Box<super::broadcast_log::LogCursor>>,
    /// Packet identifiers its exchanges still published had when the broker last
    /// stopped gracefully, by record (`broker::released`, MQTT-4.4.0-1): read back at
    /// the start, each is taken by its record when it goes out again, and no other
    /// delivery is given one meanwhile. `None` for every other session, so a
    /// delivery pays one test of it.
    pub kept_ids: Option<Box<KeptIds>>,
    next_packet_id: u16,
    /// Its episode of deliveries given up at the bound, if one is going on; boxed, as
    /// a session that keeps up never has one.
    giving_up: Option<Box<GivingUp>>,
}

/// A record an exchange carried: its channel (`None`: the broadcast log) and offset.
pub type KeptRecord = (Option<ChannelId>, u64);

/// The packet identifiers of a restored session's exchanges that were still
/// published at a graceful stop, by the record each carried (MQTT-4.4.0-1).
#[derive(Debug, Default)]
pub struct KeptIds {
    by_record: BTreeMap<KeptRecord, u16>,
    ids: BTreeMap<u16, KeptRecord>,
}

impl KeptIds {
    /// Keeps `packet_id` for `record`; an identifier or a record kept already keeps
    /// what it had.
    pub fn keep(&mut self, record: KeptRecord, packet_id: u16) {
        if packet_id == 0 || self.ids.contains_key(&packet_id) {
            return;
        }
        if let std::collections::btree_map::Entry::Vacant(v) = self.by_record.entry(record) {
            v.insert(packet_id);
            self.ids.insert(packet_id, record);
        }
    }

    /// Takes the identifier kept for `record`, if one is.
    fn take(&mut self, record: KeptRecord) -> Option<u16> {
        let id = self.by_record.remove(&record)?;
        self.ids.remove(&id);
        Some(id)
    }

    /// Forgets every identifier whose record `stale` says is no longer owed.
    pub fn forget(&mut self, mut stale: impl FnMut(KeptRecord) -> bool) {
        self.by_record.retain(|record, _| !stale(*record));
        self.ids.retain(|_, record| !stale(*record));
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Every identifier kept and its record.
    pub fn iter(&self) -> impl Iterator<Item = (u16, KeptRecord)> + '_ {
        self.ids.iter().map(|(id, record)| (*id, *record))
    }
}

/// What queueing one delivery cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Enqueued {
    /// Older broadcasts given up to make room.
    dropped: usize,
    /// The delivery itself was refused (QoS 2, nothing left to give up).
    refused: bool,
}

/// A session incarnation unlikely ever to repeat for one client id, across restarts
/// too: the 62 random bits of a UUIDv7, never [`LEGACY_INCARNATION`].
pub(crate) fn new_incarnation() -> u64 {
    uuid::Uuid::now_v7().as_u64_pair().1.max(1)
}

/// The incarnation of a session restored from a record written before incarnations
/// were kept, the same at every start until its record is written again.
pub(crate) const LEGACY_INCARNATION: u64 = 0;

impl Session {
    /// A new, empty session.
    pub fn new(client_id: Arc<str>, protocol: ProtocolVersion, queue_bound: usize) -> Session {
        Session {
            client_id,
            protocol,
            expiry: 0,
            subscriptions: Subscriptions::default(),
            queue: DeliveryQueue::default(),
            principal: None,
            read_checked: None,
            inflight: InflightTable::default(),
            incoming: BTreeMap::new(),
            queued_bytes: 0,
            queue_bound,
            link: None,
            receive_maximum: u16::MAX,
            max_packet_size: u32::MAX,
            will: None,
            generation: 0,
            incarnation: LEGACY_INCARNATION,
            cursors: BTreeMap::new(),
            last_read: None,
            stored: false,
            away_ms: None,
            restored: false,
            internal: false,
            user: None,
            listener: None,
            log: None,
            kept_ids: None,
            next_packet_id: 1,
            giving_up: None,
        }
    }

    /// Releases the room a burst left in the emptied queue: a `VecDeque` keeps its
    /// largest capacity, and a subscriber that once fell 4,000 messages behind would
    /// hold 220 KiB of it for as long as its session lives. Up to `QUEUE_KEPT` slots
    /// stay, so steady traffic does not allocate anew at every write.
    ///
    /// The session has caught up, too: an episode of deliveries given up that has
    /// lasted `GIVING_UP_EPISODE` ends, said with its count.
    pub fn release_empty_queue(&mut self) {
        if !self.queue.is_empty() {
            return;
        }
        self.queue.release_room(QUEUE_KEPT);
        if self
            .giving_up
            .as_deref()
            .is_some_and(|e| e.since.elapsed() >= GIVING_UP_EPISODE)
        {
            self.end_giving_up("caught up");
        }
    }

    /// Ends an episode of deliveries given up at the bound, if one is going on, saying
    /// how many it lost and `why` it ends.
    pub fn end_giving_up(&mut self, why: &str) {
        if let Some(episode) = self.giving_up.take() {
            log::warn!(
                "{}: {why}; {} deliveries to it were given up at its bound in {}s",
                self.client_id,
                episode.deliveries,
                episode.since.elapsed().as_secs()
            );
        }
    }

    /// [`Self::enqueue`], counting in `metrics` what the bound gave up or refused
    /// (B-091); the first of an episode is said at WARN.
    pub fn enqueue_counted(&mut self, metrics: &super::metrics::Metrics, delivery: Delivery) {
        let enqueued = self.enqueue(delivery);
        let lost = enqueued.dropped as u64 + u64::from(enqueued.refused);
        if lost == 0 {
            return;
        }
        metrics
            .dropped_queue_full
            .set(metrics.dropped_queue_full.get() + enqueued.dropped as u64);
        metrics
            .deliveries_refused
            .set(metrics.deliveries_refused.get() + u64::from(enqueued.refused));
        match &mut self.giving_up {
            Some(episode) => episode.deliveries += lost,
            None => {
                log::warn!(
                    "{}: its queue is full (limits.session_queue_bytes {}): broadcasts to \
                     it are given up until it reads faster; counted in \
                     saguin_session_deliveries_dropped_total",
                    self.client_id,
                    crate::config::format_size(self.queue_bound as u64)
                );
                self.giving_up = Some(Box::new(GivingUp {
                    since: Instant::now(),
                    deliveries: lost,
                }));
            }
        }
    }

    /// Gives up the groups' deliveries held past their expiry; how many.
    pub fn drop_expired_backlog(&mut self, now: Instant) -> usize {
        let before = self.queue.len();
        let mut freed = 0;
        let mut gone = Vec::new();
        self.queue.retain(|d| {
            let expired = d.backlog_expired(now);
            if expired {
                freed += d.charge();
                gone.extend(d.logged());
            }
            !expired
        });
        self.queued_bytes -= freed;
        for offset in gone {
            self.settle_logged(Some(offset));
        }
        before - self.queue.len()
    }

    /// Queues a delivery, giving up the oldest not on the wire while over the bound;
    /// says how many it gave up, and whether it refused this one.
    fn enqueue(&mut self, delivery: Delivery) -> Enqueued {
        let charge = delivery.charge();
        let mut dropped = 0;
        // Only a QoS 0 or 1 broadcast not yet on the wire is given up: a channel's
        // record or a queue's offer is tracked under its offset, and a cursor or a
        // lease would be left pointing at nothing; a QoS 2 delivery is never lost
        // (RFC 0002 "How much a session may hold", B-082, B-083).
        while self.queued_bytes + charge > self.queue_bound {
            let Some(oldest) = self.queue.oldest_to_give_up() else {
                break;
            };
            let Some(oldest) = self.queue.remove(oldest) else {
                break;
            };
            self.queued_bytes -= oldest.charge();
            self.settle_logged(oldest.logged());
            dropped += 1;
        }
        let over = self.queued_bytes + charge > self.queue_bound;
        if over && !delivery.is_channel_value() && self.queued_bytes > 0 {
            // Nothing left to give up and the bound is still passed: what is held
            // cannot be lost, so the new broadcast is refused rather than over-run the
            // bound (B-086). A channel's record is never refused (B-087), nor is a
            // message into an empty session, however large (B-088).
            self.settle_logged(delivery.logged());
            return Enqueued {
                dropped,
                refused: true,
            };
        }
        self.queued_bytes += charge;
        self.queue.push_back(delivery);
        Enqueued {
            dropped,
            refused: false,
        }
    }

    /// Whether a QoS > 0 delivery may be put on the wire now.
    pub fn window_open(&self) -> bool {
        self.window_open_for(0)
    }

    /// Whether a QoS > 0 delivery charged `charge` may be put on the wire now: within
    /// Receive Maximum, and with it at most half the bound on the wire, or alone there
    /// however large (B-084).
    pub fn window_open_for(&self, charge: usize) -> bool {
        let half = self.queue_bound / 2;
        // What is on the wire is counted in `queued_bytes` until it is settled; the
        // table keeps its part summed.
        self.inflight.len() < usize::from(self.receive_maximum)
            && self.inflight.published_bytes() + charge <= half
            || self.inflight.is_empty()
    }

    /// Whether the acl_file lets this session's client read `topic` now: asked
    /// on every broadcast delivery, so a re-read applies to subscriptions
    /// already granted (B-293). True where no acl_file is held.
    pub fn may_read(&self, topic: &str) -> bool {
        self.principal.as_ref().is_none_or(|p| p.may_read(topic))
    }

    /// Asks the acl_file again about what waits in the queue, once per policy (a
    /// re-read, or a restart under an edited file): a delivery is asked at fan-out
    /// and at the channel read, and what was queued before the re-read must not
    /// go out past it (B-293). A broadcast no longer readable is dropped. A
    /// channel's records go back from the first refused on, so the cursor reads
    /// them again and stalls there rather than skip it (B-294). A queue's offer
    /// stays (`consume` governs it, B-295), as does a shared group's backlog.
    pub fn drop_unreadable(&mut self) {
        let Some(principal) = &self.principal else {
            return;
        };
        let grants = principal.grants();
        if self
            .read_checked
            .as_ref()
            .is_some_and(|g| Rc::ptr_eq(g, &grants))
        {
            return;
        }
        self.read_checked = Some(grants);
        let cursors = &self.cursors;
        let unreadable = |d: &Delivery| {
            d.held.is_none()
                && d.origin().is_none_or(|(c, _)| cursors.contains_key(&c))
                && !principal.may_read(&d.message.topic)
        };
        let mut rewind: BTreeMap<ChannelId, u64> = BTreeMap::new();
        for (channel, offset) in self
            .queue
            .iter()
            .filter(|d| unreadable(d))
            .filter_map(Delivery::origin)
        {
            let at = rewind.entry(channel).or_insert(offset);
            *at = (*at).min(offset);
        }
        let gone = self.queue.take_where(|d| {
            d.origin().map_or_else(
                || unreadable(d),
                |(c, o)| rewind.get(&c).is_some_and(|&at| o >= at),
            )
        });
        for delivery in gone {
            self.queued_bytes -= delivery.charge();
            match delivery.origin() {
                Some((channel, offset)) => {
                    if let Some(cursor) = self.cursors.get_mut(&channel) {
                        cursor.unsettled.remove(&offset);
                        cursor.next = cursor.next.min(offset);
                        cursor.wake();
                    }
                }
                None => self.settle_logged(delivery.logged()),
            }
        }
    }

    /// Whether the acl_file lets this session's client take jobs from `queue`
    /// now: a worker that lost `consume` is offered nothing, so no attempt of a
    /// job is spent on it (B-295). True where no acl_file is held.
    pub fn may_consume(&self, queue: &str) -> bool {
        self.principal.as_ref().is_none_or(|p| p.may_consume(queue))
    }

    /// Whether the acl_file lets this session's client take the job of `queue`
    /// stored under `topic`: a rule narrowed by `filter:` gives the jobs under it
    /// alone (B-253). True where no acl_file is held.
    pub fn may_consume_job(&self, queue: &str, topic: &str) -> bool {
        self.principal
            .as_ref()
            .is_none_or(|p| p.may_consume_job(queue, topic))
    }

    /// Whether this session can take one more delivery of at most `size` bytes on the
    /// wire right now (for shared groups, A-125).
    pub fn can_take(&self, qos: QoS, size: usize) -> bool {
        self.link.is_some()
            && self.queued_bytes < self.queue_bound
            && (qos == QoS::AtMostOnce || self.window_open())
            && size <= self.max_packet_size as usize
    }

    /// [`Session::can_take`] for a shared group's message charged `charge`: a member
    /// whose queue would refuse it (B-086) is passed over, or the message is lost to
    /// a member that cannot hold it while another could.
    pub fn can_hold(&self, qos: QoS, size: usize, charge: usize) -> bool {
        // Room once what `enqueue` may give up is given up, counted as it goes.
        let kept = self.queued_bytes - self.queue.giveable_bytes().min(self.queued_bytes);
        // Into what is left empty, a message of any size is taken (B-088).
        self.can_take(qos, size) && (kept == 0 || kept + charge <= self.queue_bound)
    }

    /// The next free packet identifier for an outbound exchange: neither on the wire
    /// nor kept for a record that goes out again (MQTT-4.4.0-1).
    pub fn next_packet_id(&mut self) -> u16 {
        let mut tried = 0u32;
        loop {
            let id = self.next_packet_id;
            self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
            let kept = self
                .kept_ids
                .as_ref()
                .is_some_and(|k| k.ids.contains_key(&id));
            if !self.inflight.contains_key(&id) && !kept {
                return id;
            }
            tried += 1;
            if tried == u32::from(u16::MAX) {
                // Every identifier is on the wire or kept: the kept ones give way, their
                // records going again under new ones, as after a crash.
                self.kept_ids = None;
            }
        }
    }

    /// The packet identifier `delivery` goes out under: the one its record had when
    /// the broker stopped gracefully, if one was kept - the delivery then goes with
    /// DUP set (MQTT-4.4.0-1) - else the next free one.
    pub fn packet_id_for(&mut self, delivery: &mut Delivery) -> u16 {
        let kept = self.kept_ids.as_mut();
        if let Some(id) = kept.and_then(|k| k.take(delivery.record?)) {
            self.drop_kept_if_empty();
            delivery.resent = true;
            return id;
        }
        self.next_packet_id()
    }

    /// `kept_ids` back to `None` once nothing is kept, so a delivery pays one test.
    fn drop_kept_if_empty(&mut self) {
        if self.kept_ids.as_ref().is_some_and(|k| k.is_empty()) {
            self.kept_ids = None;
        }
    }

    /// Frees the identifiers kept for broadcast log records the session is no longer
    /// owed (settled before the stop, or given up), once the log is read back.
    pub fn forget_kept_log_ids(&mut self) {
        let (Some(kept), log) = (&mut self.kept_ids, &self.log) else {
            return;
        };
        let owed = |offset| log.as_ref().is_some_and(|l| l.unsettled.contains(&offset));
        kept.forget(|(channel, offset)| channel.is_none() && !owed(offset));
        self.drop_kept_if_empty();
    }

    /// Frees the identifiers kept for channel records below their cursor's stored
    /// position (settled before the stop) or on a channel no longer read, once a
    /// resumed session's cursors are open.
    pub fn forget_kept_channel_ids(&mut self) {
        let (Some(kept), cursors) = (&mut self.kept_ids, &self.cursors) else {
            return;
        };
        let stale = |channel, offset| {
            cursors
                .get(&channel)
                .is_none_or(|c: &Cursor| c.stored.is_some_and(|p| offset < p))
        };
        kept.forget(|(channel, offset)| channel.is_some_and(|c| stale(c, offset)));
        self.drop_kept_if_empty();
    }

    /// The exchanges to keep at a graceful stop (MQTT-4.4.0-1): for a session that
    /// outlives its connection, each still published whose delivery has a record
    /// (`offer` says which channel records are a queue's offer, never kept: a
    /// resumed session is sent no stale offer), and each identifier kept since the
    /// start and not yet taken, at most its Receive Maximum of them. Empty for
    /// every other session.
    pub fn to_keep_published(&self, offer: impl Fn(ChannelId) -> bool) -> Vec<(u16, KeptRecord)> {
        if !self.stored || !self.keeps_owed_in_log() {
            return Vec::new();
        }
        let published = self
            .inflight
            .in_send_order()
            .into_iter()
            .filter_map(|(id, inflight)| match inflight {
                Inflight::Published(d) => d
                    .record
                    .filter(|(channel, _)| !channel.is_some_and(&offer))
                    .map(|record| (id, record)),
                Inflight::Released(..) => None,
            });
        let kept = self.kept_ids.iter().flat_map(|k| k.iter());
        published
            .chain(kept)
            .take(usize::from(self.receive_maximum))
            .collect()
    }

    /// Settles an outbound exchange at PUBACK or PUBCOMP; returns whether it existed.
    pub fn settle(&mut self, packet_id: u16) -> bool {
        match self.inflight.remove(&packet_id) {
            Some(Inflight::Published(d)) => {
                self.queued_bytes = self.queued_bytes.saturating_sub(d.charge());
                self.settle_record(d.record);
                true
            }
            Some(Inflight::Released(record, _)) => {
                self.settle_record(record);
                true
            }
            None => false,
        }
    }

    /// Moves the cursor a settled delivery's record was under: its channel's, or the
    /// session's place in the broadcast log.
    pub fn settle_record(&mut self, record: Option<KeptRecord>) {
        match record {
            Some((Some(channel), offset)) => self.settle_origin(Some((channel, offset))),
            Some((None, offset)) => self.settle_logged(Some(offset)),
            None => {}
        }
    }

    /// Moves a channel cursor past a delivery that is settled.
    pub fn settle_origin(&mut self, origin: Option<(ChannelId, u64)>) {
        if let Some((channel, offset)) = origin
            && let Some(cursor) = self.cursors.get_mut(&channel)
        {
            cursor.unsettled.remove(&offset);
        }
    }

    /// Moves the session's log cursor past a logged delivery settled or given up.
    pub fn settle_logged(&mut self, logged: Option<u64>) {
        let positioned = self.keeps_owed_in_log();
        if let Some(offset) = logged
            && let Some(log) = &mut self.log
        {
            log.settle(offset);
            // A session that ends with its connection stores no position, so what it
            // sent is never sent again: it leaves the window as it settles.
            if !positioned {
                log.sent.remove(&offset);
            }
        }
    }

    /// Gives up the logged delivery at `offset` the session holds queued, for room
    /// in a full log (B-472): `None` when it held none, else whether it was a shared
    /// group's held delivery (B-475). The broker has stopped counting the record's
    /// holders already, so it is not released again.
    pub fn give_up_logged(&mut self, offset: u64) -> Option<bool> {
        if !self
            .log
            .as_mut()
            .is_some_and(|l| l.unsettled.remove(&offset))
        {
            return None;
        }
        let at = self.queue.iter().position(|d| d.logged() == Some(offset));
        let gone = at.and_then(|at| self.queue.remove(at));
        if let Some(gone) = &gone {
            self.queued_bytes -= gone.charge();
        }
        Some(gone.is_some_and(|d| d.held.is_some()))
    }

    /// Takes up to `most` of the deliveries queued here for shared group `group` that
    /// `fits` accepts, oldest first, for another member to collect (B-447). A logged
    /// one leaves this session's log cursor without being settled: its record stays
    /// until the member collecting it settles it.
    pub fn take_held(
        &mut self,
        group: &str,
        most: usize,
        mut fits: impl FnMut(&Delivery) -> bool,
    ) -> Vec<Delivery> {
        let mut taken = Vec::new();
        let mut i = 0;
        while i < self.queue.len() && taken.len() < most {
            if !(self.queue[i].held_for(group) && fits(&self.queue[i])) {
                i += 1;
                continue;
            }
            let Some(delivery) = self.queue.remove(i) else {
                break;
            };
            self.queued_bytes -= delivery.charge();
            if let (Some(offset), Some(log)) = (delivery.logged(), &mut self.log) {
                log.unsettled.remove(&offset);
            }
            taken.push(delivery);
        }
        taken
    }

    /// Whether a delivery held for shared group `group` is queued here.
    pub fn holds_for(&self, group: &str) -> bool {
        self.queue.iter().any(|d| d.held_for(group))
    }

    /// Takes every delivery a shared group had handed this session and it has not
    /// settled - queued, or published and not acknowledged - as the session ends, for
    /// the group to give to another member (RFC 0002 "Shared subscriptions"). A logged
    /// one leaves the log cursor unsettled, as in [`Session::take_held`].
    pub fn take_all_held(&mut self) -> Vec<Delivery> {
        let on_wire: Vec<u16> = self
            .inflight
            .in_send_order()
            .into_iter()
            .filter(|(_, f)| matches!(f, Inflight::Published(d) if d.held.is_some()))
            .map(|(id, _)| id)
            .collect();
        let mut taken: Vec<Delivery> = on_wire
            .into_iter()
            .filter_map(|id| match self.inflight.remove(&id) {
                Some(Inflight::Published(mut d)) => {
                    d.resent = true;
                    self.queued_bytes = self.queued_bytes.saturating_sub(d.charge());
                    Some(d)
                }
                _ => None,
            })
            .collect();
        let held = self.queue.take_where(|d| d.held.is_some());
        for d in &held {
            self.queued_bytes -= d.charge();
        }
        taken.extend(held);
        if let Some(log) = &mut self.log {
            for offset in taken.iter().filter_map(|d| d.logged()) {
                log.unsettled.remove(&offset);
                log.sent.remove(&offset);
            }
        }
        taken
    }

    /// How many more QoS 1/2 deliveries it could put on the wire now: what a member
    /// collects of its groups' backlog at a time, so a member that goes away holds
    /// no more of it than it was sent.
    pub fn window_room(&self) -> usize {
        if self.link.is_none() || !self.window_open() {
            return 0;
        }
        usize::from(self.receive_maximum).saturating_sub(self.inflight.len())
    }

    /// Notes that the logged broadcast at `offset` is owed to this session.
    pub fn hand_logged(&mut self, offset: u64) {
        self.log.get_or_insert_with(Box::default).hand(offset);
    }

    /// Whether one more logged delivery may go on the wire: at most the Receive
    /// Maximum of them at or above the stored log position (B-459). A session that
    /// ends with its connection - a member that collected a group's backlog - stores
    /// no position and has no such window.
    pub fn log_window_open(&self, offset: u64) -> bool {
        self.log.as_ref().is_none_or(|log| {
            log.window_open(self.receive_maximum, offset) || !self.keeps_owed_in_log()
        })
    }

    /// The record a QoS 2 exchange published and answered by PUBREC is to be kept as
    /// before its PUBREL: its channel record or broadcast log offset, for a
    /// session that outlives its connection. `None` for every other exchange and
    /// session, which is released in memory alone.
    pub fn to_keep_released(&self, packet_id: u16) -> Option<KeptRecord> {
        if !self.stored || !self.keeps_owed_in_log() {
            return None;
        }
        match self.inflight.get(&packet_id) {
            Some(Inflight::Published(d)) if d.qos == QoS::ExactlyOnce => d.record,
            _ => None,
        }
    }

    /// The token of the stored row of the released exchange `packet_id`, if it has one.
    pub fn stored_release(&self, packet_id: u16) -> Option<u64> {
        match self.inflight.get(&packet_id) {
            Some(Inflight::Released(_, token)) => *token,
            _ => None,
        }
    }

    /// Moves a QoS 2 exchange from PUBLISH to PUBREL at PUBREC, its row in storage
    /// named by `stored` when it is kept there; returns whether it existed.
    pub fn release(&mut self, packet_id: u16, stored: Option<u64>) -> bool {
        match self.inflight.release(packet_id, stored) {
            Some(published) => {
                if let Some(d) = published {
                    self.queued_bytes = self.queued_bytes.saturating_sub(d.charge());
                }
                true
            }
            None => false,
        }
    }

    /// Whether the session is to be kept after its connection ends.
    pub fn outlives_connection(&self) -> bool {
        self.expiry > 0
    }

    /// Whether what it is owed at QoS 1/2 of broadcast is kept in the broadcast log
    /// (B-456): a client's session that outlives its connection. The broker's own
    /// sessions carry broadcast live only (a bridge's out rule, B-385).
    pub fn keeps_owed_in_log(&self) -> bool {
        self.outlives_connection() && !self.internal
    }

    /// Wakes the connection holding the session, if any.
    pub fn wake(&self) {
        if let Some(link) = &self.link {
            link.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: usize) -> Arc<Message> {
        Arc::new(Message {
            topic: Arc::from("t"),
            payload: vec![0u8; payload].into(),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: Properties::default(),
            publisher: Arc::from("p"),
            expires_at: None,
        })
    }

    #[test]
    fn subscriptions_go_by_the_filter_string_the_client_sent() {
        let sub = |filter: &str, share: Option<&str>, identifier| Subscription {
            filter: filter.into(),
            share: share.map(String::from),
            options: SubscriptionOptions::with_qos(QoS::AtLeastOnce),
            identifier,
            slice: None,
        };
        let mut subs = Subscriptions::default();
        for (filter, share) in [
            ("b", None),
            ("a/#", Some("g")),
            ("$share", None),
            ("a", None),
        ] {
            assert!(subs.insert(sub(filter, share, None)).is_none());
        }
        // In the order of the strings: "$share" < "$share/g/a/#" < "a" < "b".
        let keys: Vec<_> = subs
            .values()
            .map(|s| String::from_utf8(s.key_bytes().collect()).expect("utf-8"))
            .collect();
        assert_eq!(keys, ["$share", "$share/g/a/#", "a", "b"]);
        assert!(subs.contains_key("$share/g/a/#"));
        assert!(!subs.contains_key("a/#"));
        // The same string again replaces, and hands back what it replaced.
        let old = subs.insert(sub("a/#", Some("g"), Some(9)));
        assert_eq!(old.map(|s| s.identifier), Some(None));
        assert_eq!(
            subs.get("$share/g/a/#").map(|s| s.identifier),
            Some(Some(9))
        );
        assert_eq!(subs.remove("a").map(|s| s.filter), Some("a".to_string()));
        assert_eq!(subs.remove("a"), None);
        assert_eq!(subs.len(), 3);
    }

    /// A 100-byte QoS 1 broadcast.
    fn owed(held_until: Option<Instant>) -> Delivery {
        Delivery {
            message: message(100),
            qos: QoS::AtLeastOnce,
            retain: false,
            identifiers: Box::default(),
            record: None,
            held: held_until.map(|until| {
                Box::new(Held {
                    group: Arc::from("g/t"),
                    until: Some(until),
                })
            }),
            resent: false,
            untracked: Untracked::No,
        }
    }

    /// A-123, B-086: a group member whose queue would refuse a message is not picked
    /// for it; one that can give up an older broadcast for it, or holds nothing, is.
    #[test]
    fn a_member_that_would_refuse_a_message_cannot_hold_it() {
        let mut s = Session::new(Arc::from("m"), ProtocolVersion::V5, 380);
        s.link = Some(ConnLink::new(1).0);
        let charge = 250;
        assert!(s.can_hold(QoS::AtMostOnce, 100, charge), "an empty queue");
        let mut kept = owed(None);
        kept.qos = QoS::ExactlyOnce; // never given up
        s.enqueue(kept);
        assert!(s.queued_bytes + charge > 380);
        assert!(
            !s.can_hold(QoS::AtMostOnce, 100, charge),
            "it would be refused"
        );
        assert!(s.can_take(QoS::AtMostOnce, 100), "what was asked before");
        s.enqueue(owed(None)); // a QoS 1 broadcast it may give up
        // Giving it up makes room for 150 bytes, not for 250: that one would still
        // be refused, after the broadcast was given up for nothing.
        assert!(s.can_hold(QoS::AtMostOnce, 100, 150));
        assert!(!s.can_hold(QoS::AtMostOnce, 100, charge));
    }

    /// INV-13: a delivery's Subscription Identifiers count against the session's
    /// bound; one message matching thousands of filters carries one each.
    #[test]
    fn subscription_identifiers_count_against_the_bound() {
        let mut many = owed(None);
        many.identifiers = (1..=1000).collect();
        assert_eq!(many.charge(), many.message.charge() + 4000);
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 10_000);
        let mut refused = 0;
        for _ in 0..3 {
            let mut d = owed(None);
            d.identifiers = (1..=1000).collect();
            d.qos = QoS::ExactlyOnce; // never given up: the third is refused
            refused += usize::from(s.enqueue(d).refused);
        }
        assert_eq!((s.queue.len(), refused), (2, 1));
        assert!(s.queued_bytes <= 10_000, "{}", s.queued_bytes);
    }

    /// B-084: at most half the bound is on the wire, the next delivery counted; one
    /// goes out alone however large.
    #[test]
    fn at_most_half_the_bound_is_on_the_wire_b084() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 600);
        s.receive_maximum = 10;
        let charge = owed(None).charge();
        assert!(charge * 2 > 300 && charge <= 300, "{charge}");
        assert!(s.window_open_for(2000), "alone, however large");
        s.inflight.insert(1, Inflight::Published(owed(None)));
        assert!(
            !s.window_open_for(charge),
            "a second would put {} of a 600-byte bound on the wire",
            2 * charge
        );
        assert!(s.window_open_for(300 - charge));
    }

    #[test]
    fn an_emptied_queue_gives_back_what_a_burst_grew_it_to() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 1 << 20);
        for _ in 0..8 {
            s.enqueue(owed(None));
        }
        s.queue.clear();
        s.release_empty_queue();
        let small = s.queue.capacity();
        assert!(
            (8..=QUEUE_KEPT).contains(&small),
            "a small queue keeps its room"
        );
        for _ in 0..1000 {
            s.enqueue(owed(None));
        }
        s.release_empty_queue();
        assert!(s.queue.capacity() >= 1000, "not while anything waits");
        s.queue.clear();
        s.release_empty_queue();
        assert_eq!(s.queue.capacity(), 0);
    }

    #[test]
    fn a_full_queue_gives_up_its_oldest() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 1000);
        for _ in 0..20 {
            s.enqueue(owed(None));
        }
        assert!(s.queued_bytes <= 1000);
        assert_eq!(s.queue.len(), 1000 / message(100).charge());
    }

    #[test]
    fn qos2_is_never_given_up_and_a_full_session_of_it_refuses_the_next_b083_b086() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 1000);
        let fits = 1000 / message(100).charge();
        for _ in 0..fits {
            let mut d = owed(None);
            d.qos = QoS::ExactlyOnce;
            assert!(!s.enqueue(d).refused);
        }
        let next = s.enqueue(owed(None));
        assert_eq!((next.dropped, next.refused), (0, true));
        assert_eq!(s.queue.len(), fits);
        assert!(s.queue.iter().all(|d| d.qos == QoS::ExactlyOnce));
        // B-088: an empty session takes a message as large as its bound.
        let mut empty = Session::new(Arc::from("e"), ProtocolVersion::V5, 100);
        assert!(!empty.enqueue(owed(None)).refused);
    }

    #[test]
    fn a_groups_expired_backlog_goes_and_frees_its_bytes() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 10_000);
        let now = Instant::now();
        for held_until in [
            Some(now),
            None,
            Some(now + std::time::Duration::from_secs(60)),
        ] {
            s.enqueue(owed(held_until));
        }
        assert_eq!(s.drop_expired_backlog(now), 1);
        assert_eq!(s.queue.len(), 2);
        assert_eq!(s.queued_bytes, 2 * message(100).charge());
    }

    /// A held delivery for group `g/t` at log `offset`, handed to `s`.
    fn hold(s: &mut Session, offset: u64) {
        let mut d = owed(Some(Instant::now() + std::time::Duration::from_secs(60)));
        d.record = Some((None, offset));
        s.hand_logged(offset);
        assert!(!s.enqueue(d).refused);
    }

    #[test]
    fn a_groups_held_deliveries_are_taken_oldest_first_their_records_kept_b447() {
        let mut s = Session::new(Arc::from("holder"), ProtocolVersion::V5, 10_000);
        for offset in [1, 2, 3] {
            hold(&mut s, offset);
        }
        s.enqueue(owed(None)); // its own, not the group's
        let taken = s.take_held("g/t", 2, |_| true);
        let offsets: Vec<Option<u64>> = taken.iter().map(|d| d.logged()).collect();
        assert_eq!(offsets, [Some(1), Some(2)]);
        assert!(s.holds_for("g/t") && !s.holds_for("h/t"));
        assert!(s.take_held("h/t", 9, |_| true).is_empty());
        assert!(s.take_held("g/t", 9, |_| false).is_empty(), "none fits");
        let log = s.log.as_ref().expect("a log cursor");
        // Moved, not settled: the record stays for whoever collects it.
        assert_eq!(log.unsettled.iter().copied().collect::<Vec<_>>(), [3]);
        assert!(log.released.is_empty());
        assert_eq!(s.queue.len(), 2);
        assert_eq!(s.queued_bytes, 2 * message(100).charge());
    }

    #[test]
    fn an_ending_member_gives_back_what_it_held_queued_or_on_the_wire() {
        let mut s = Session::new(Arc::from("member"), ProtocolVersion::V5, 10_000);
        s.link = None;
        hold(&mut s, 5);
        hold(&mut s, 6);
        s.enqueue(owed(None));
        // The first went out and was not acknowledged.
        let sent = s.queue.pop_front().expect("queued");
        s.inflight.insert(1, Inflight::Published(sent));
        let back = s.take_all_held();
        let got: Vec<(Option<u64>, bool)> = back.iter().map(|d| (d.logged(), d.resent)).collect();
        assert_eq!(got, [(Some(5), true), (Some(6), false)]);
        assert!(s.inflight.is_empty());
        assert_eq!(s.queue.len(), 1);
        assert_eq!(s.queued_bytes, message(100).charge());
        let log = s.log.as_ref().expect("a log cursor");
        assert!(log.unsettled.is_empty() && log.released.is_empty());
    }

    #[test]
    fn a_logged_delivery_given_up_or_dropped_moves_the_log_cursor_b472() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 1000);
        for offset in [3, 4] {
            let mut d = owed(None);
            d.record = Some((None, offset));
            s.hand_logged(offset);
            assert!(!s.enqueue(d).refused);
        }
        assert_eq!(s.give_up_logged(3), Some(false));
        assert_eq!(s.give_up_logged(3), None, "held once");
        let log = s.log.as_ref().expect("a log cursor");
        assert_eq!((log.position(), log.released.len()), (4, 0));
        assert_eq!(s.queue.len(), 1);
        assert_eq!(s.queued_bytes, message(100).charge());
        // The session bound giving it up releases it like a PUBACK would.
        let fits = 1000 / message(100).charge();
        for _ in 0..fits {
            s.enqueue(owed(None));
        }
        let log = s.log.as_ref().expect("a log cursor");
        assert_eq!((log.position(), log.released.as_slice()), (5, &[4][..]));
    }

    #[test]
    fn packet_ids_skip_those_in_flight_and_never_use_zero() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 1000);
        s.next_packet_id = u16::MAX;
        assert_eq!(s.next_packet_id(), u16::MAX);
        s.inflight.insert(1, Inflight::Released(None, None));
        assert_eq!(s.next_packet_id(), 2);
    }

    #[test]
    fn a_kept_packet_id_goes_to_its_record_alone_mqtt_4_4_0_1() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 10_000);
        let mut kept = Box::<KeptIds>::default();
        kept.keep((None, 7), 1);
        kept.keep((Some(0), 3), 2);
        kept.keep((None, 8), 2);
        kept.keep((None, 9), 0);
        assert_eq!(kept.iter().count(), 2, "an identifier kept once, never 0");
        s.kept_ids = Some(kept);
        let mut other = owed(None);
        other.record = Some((None, 5));
        assert_eq!(s.packet_id_for(&mut other), 3, "1 and 2 are kept");
        assert!(!other.resent);
        let mut record = owed(None);
        record.record = Some((Some(0), 3));
        assert_eq!(s.packet_id_for(&mut record), 2);
        assert!(record.resent, "MQTT-4.4.0-1: DUP set");
        s.forget_kept_log_ids();
        assert!(
            s.kept_ids.is_none(),
            "no log record is owed: nothing left kept"
        );
        s.next_packet_id = 1;
        assert_eq!(s.next_packet_id(), 1, "free again");
    }

    #[test]
    fn a_graceful_stop_keeps_what_is_published_with_a_record_up_to_the_receive_maximum() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 10_000);
        for (id, record) in [(1, Some((None, 4))), (2, Some((Some(0), 9))), (3, None)] {
            let mut d = owed(None);
            d.record = record;
            s.inflight.insert(id, Inflight::Published(d));
        }
        s.inflight
            .insert(4, Inflight::Released(Some((None, 5)), None));
        assert!(s.to_keep_published(|_| false).is_empty(), "a clean session");
        s.expiry = 300;
        s.stored = true;
        let all = s.to_keep_published(|_| false);
        assert_eq!(all, [(1, (None, 4)), (2, (Some(0), 9))]);
        assert_eq!(s.to_keep_published(|_| true), [(1, (None, 4))], "no offer");
        s.receive_maximum = 1;
        assert_eq!(s.to_keep_published(|_| false).len(), 1);
    }

    #[test]
    fn an_id_kept_for_a_record_no_longer_owed_is_freed() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 10_000);
        let mut kept = Box::<KeptIds>::default();
        for (record, id) in [((None, 4), 1), ((None, 5), 2), ((Some(0), 1), 3)] {
            kept.keep(record, id);
        }
        kept.keep((Some(0), 9), 4);
        kept.keep((Some(1), 9), 5);
        s.kept_ids = Some(kept);
        let mut log = super::super::broadcast_log::LogCursor::restored(4);
        log.hand(5);
        s.log = Some(Box::new(log));
        s.forget_kept_log_ids();
        let left = |s: &Session| {
            s.kept_ids
                .iter()
                .flat_map(|k| k.iter())
                .map(|(id, _)| id)
                .collect::<Vec<_>>()
        };
        assert_eq!(left(&s), [2, 3, 4, 5], "offset 4 is not owed");
        s.cursors.insert(0, Cursor::new(2, 0, Some(2)));
        s.forget_kept_channel_ids();
        assert_eq!(left(&s), [2, 4], "below the stored position, or no cursor");
    }

    #[test]
    fn packet_ids_all_taken_by_kept_ones_give_way() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 10_000);
        let mut kept = Box::<KeptIds>::default();
        for id in 1..=u16::MAX {
            kept.keep((None, u64::from(id)), id);
        }
        s.kept_ids = Some(kept);
        assert_eq!(s.next_packet_id(), 1);
        assert!(s.kept_ids.is_none());
    }

    #[test]
    fn only_a_stored_session_keeps_a_logged_qos2_pubrec_a254() {
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 1000);
        let mut delivery = owed(None);
        delivery.qos = QoS::ExactlyOnce;
        delivery.record = Some((None, 7));
        s.inflight.insert(3, Inflight::Published(delivery.clone()));
        assert_eq!(s.to_keep_released(3), None, "a clean session keeps nothing");
        s.expiry = 300;
        s.stored = true;
        assert_eq!(s.to_keep_released(3), Some((None, 7)));
        assert_eq!(s.to_keep_released(4), None, "no such exchange");
        assert!(s.release(3, Some(11)));
        assert_eq!(s.stored_release(3), Some(11));
        assert_eq!(s.to_keep_released(3), None, "released already");
        delivery.record = None;
        s.inflight.insert(5, Inflight::Published(delivery));
        assert_eq!(s.to_keep_released(5), None, "no record to keep it by");
    }

    /// The table's running sum of what is published on the wire is, after every kind
    /// of change, what walking it gives.
    #[test]
    fn the_bytes_published_on_the_wire_are_summed_as_exchanges_come_and_go() {
        fn walked(s: &Session) -> usize {
            s.inflight
                .values()
                .map(|i| match i {
                    Inflight::Published(d) => d.charge(),
                    Inflight::Released(..) => 0,
                })
                .sum()
        }
        let mut s = Session::new(Arc::from("c"), ProtocolVersion::V5, 1 << 20);
        for (id, size) in [(1, 100), (2, 2_000), (3, 30), (4, 400)] {
            let mut d = owed(None);
            d.message = message(size);
            d.qos = QoS::ExactlyOnce;
            s.inflight.insert(id, Inflight::Published(d));
        }
        let all = walked(&s);
        assert_eq!(s.inflight.published_bytes(), all);
        assert!(s.release(2, None), "PUBREC: its PUBLISH leaves the sum");
        assert!(s.release(2, None), "a PUBREC again changes nothing");
        assert_eq!(s.inflight.published_bytes(), walked(&s));
        assert!(walked(&s) < all);
        s.inflight.insert(3, Inflight::Released(None, None));
        assert!(s.settle(4));
        s.inflight.retain(|id, _| *id != 1);
        assert_eq!(s.inflight.published_bytes(), walked(&s));
        assert_eq!(s.inflight.published_bytes(), 0, "only PUBRELs are left");
        s.inflight.insert(9, Inflight::Published(owed(None)));
        assert_eq!(s.inflight.published_bytes(), walked(&s));
        s.inflight.clear();
        assert_eq!(s.inflight.published_bytes(), 0);
    }
}
