//! The broker's shared state: sessions, the subscription index, the retained store and
//! pending Wills, and the operations connections perform on them.
//!
//! Everything here runs on one thread (the broker's executor), so the state is plain
//! data behind one `RefCell`, borrowed for the length of one operation and never across
//! an await. Connections own their sockets; the broker only queues deliveries on
//! sessions and wakes the connection that holds one (DESIGN-NOTES 3).

pub mod broadcast_log;
pub mod channels;
mod connection_link;
pub mod cursor;
pub mod delivery_queue;
pub mod held;
pub mod inflight;
pub mod metrics;
pub mod partition;
pub mod queue;
mod rate;
pub mod records;
pub mod released;
mod restore;
pub mod retained;
pub mod session;
mod settings;
mod share;
pub mod stored;
pub mod topic;
mod waiter;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use connection_link::{ConnLink, Woken};
pub use settings::{Settings, TOPIC_ALIAS_MAXIMUM};
pub use waiter::Waiter;

use crate::codec::reason;
use crate::codec::{Connect, ProtocolVersion, QoS, RetainHandling, SubscriptionOptions};
use channels::{ChannelId, Channels};
use cursor::ChannelSub;
use metrics::Metrics;
use rate::PublishBudgets;
use retained::RetainedStore;
use session::{ArmedWill, Delivery, Held, Inflight, Message, Session, Subscription, Untracked};
use topic::{SubEntry, Target, TopicTree};

/// A map keyed by what clients name - client ids, topic levels - and looked up for
/// every delivery: foldhash, seeded per process, hashes such a key in a fraction of
/// SipHash's instructions (a QoS 1 fan-out delivery looks its session up six times).
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The first character of every client id the broker holds sessions under for
/// itself (`attach_internal`): a control character, which no client's CONNECT may
/// carry in its client id, so no client can name, take over or hang up such a
/// session.
pub const INTERNAL: char = '\u{1}';

/// A client id as a log line shows it: the broker's own sessions' ids
/// (`bridge/<name>/out/...`) without the control character that begins them.
pub fn shown(client_id: &str) -> &str {
    client_id.strip_prefix(INTERNAL).unwrap_or(client_id)
}

/// What becomes of a session's Will when its connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WillAtEnd {
    /// Published now, or after its delay: the connection ended without a DISCONNECT.
    Publish,
    /// Discarded: a DISCONNECT that did not ask for it.
    Withdraw,
    /// Kept on the session, due at no moment: the broker is stopping (C-282).
    Keep,
}

/// A subscription a broadcast reaches: client, options, identifier, and the group it
/// is held for when no member of its group could take it now.
type Placed = (Arc<str>, SubscriptionOptions, Option<u32>, Option<Arc<str>>);

/// The most places `Broker::fan_out` keeps room for between broadcasts (48 bytes
/// each): a fan-out wider than that allocates its own.
const PLACED_KEPT: usize = 1024;

/// Where a publish goes. The one place that decides it is [`Broker::destination`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// No channel claims the topic: ordinary MQTT.
    Broadcast,
    /// The channel whose filter spells the topic out most exactly.
    Channel(ChannelId),
}

/// What a CONNECT was granted.
#[derive(Debug)]
pub struct Accepted {
    /// Whether an existing session was resumed.
    pub session_present: bool,
    /// The client id the session is kept under (assigned when the client sent none).
    pub client_id: Arc<str>,
    /// The Session Expiry Interval granted.
    pub session_expiry: u32,
    /// The client id was assigned: the CONNECT sent none.
    pub assigned: bool,
    /// The session store had no room for the session it asked for, so it ends with
    /// this connection: the CONNACK says Session Expiry Interval 0 (B-469).
    pub cut_for_room: bool,
}

/// What a CONNECT writes to `broker.session.storage` before its CONNACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordWrite {
    /// The session's record, encoded (`stored::SessionRecord`).
    Put(stored::Encoded),
    /// The deletion of the record the session it replaces or shortens left.
    Delete,
    /// Nothing: no record was or will be kept.
    Nothing,
}

/// A subscription's place in one channel cursor, and its pending state pass, kept to
/// put back if the SUBSCRIBE replacing it is refused.
pub type CursorSub = (ChannelId, ChannelSub, Option<cursor::Pass>);

/// The broker's state.
#[derive(Debug)]
pub struct Broker {
    /// The limits and knobs the configuration sets.
    pub settings: Settings,
    /// Counters the operations listener reports.
    pub metrics: Metrics,
    /// The configured channels and the routing table.
    pub channels: Channels,
    /// The mailboxes of the queues' owners.
    pub queues: queue::Queues,
    /// Boxed: the table then holds a pointer per slot, not a whole session per slot.
    sessions: Map<Arc<str>, Box<Session>>,
    tree: TopicTree,
    retained: RetainedStore,
    /// Sessions whose connection ended and that expire unless one resumes them.
    expiring: HashMap<Arc<str>, Instant>,
    /// Wills waiting out their delay: the session generation they belong to and when.
    wills: HashMap<Arc<str>, (u64, Instant)>,
    budgets: PublishBudgets,
    /// When the next sweep of groups' backlogs held by away members is due.
    next_backlog_sweep: Instant,
    /// Shared groups (`<ShareName>/<filter>`) that may have deliveries held for them
    /// in a member's queue, for their other members to collect (B-447): one entry per
    /// group, forgotten when a look finds none.
    backlogged: BTreeSet<Arc<str>>,
    /// Cursors whose last window read failed, by client id: read again at the next
    /// tick rather than left waiting for a record that may never come (INV-16).
    /// One entry per cursor at most.
    read_failed: BTreeSet<(Arc<str>, ChannelId)>,
    /// Wills that fired and must be stored before they are handed out (bound for a
    /// channel, or retained on a broadcast topic), waiting for the server.
    unstored: Vec<Arc<Message>>,
    /// Stored sessions whose Will fired and is not yet stored: their records are not
    /// written until it is, so a crash between the two publishes it again rather than
    /// losing it (C-281). Once per Will.
    wills_storing: Vec<Arc<str>>,
    /// Those of `wills_storing` whose Will no `take_unstored` has taken yet: each is
    /// released by the call that stores its Will, not by another finishing first.
    wills_untaken: Vec<Arc<str>>,
    /// Client ids whose sessions lapsed, whose channel positions the server discards
    /// in every provider.
    lapsed: Vec<Arc<str>>,
    /// Client ids whose stored session records no longer say what the broker holds
    /// (the session ended, or a start changed it), to be written again or deleted by
    /// the server, which awaits the provider (`server::sync_records`).
    record_work: Vec<Arc<str>>,
    /// Client ids whose record the provider refused: written again on every tick and
    /// as the broker stops, until it takes them (C-285). One entry per client id.
    records_refused: std::collections::HashSet<Arc<str>>,
    /// Broadcast deliveries handed to sessions since the start (`handed`).
    handed: u64,
    next_assigned: u64,
    /// Whether broadcasts owed to sessions that outlive their connection are logged:
    /// the broker runs with a `broker.session.storage` provider (B-456).
    logs: bool,
    /// The deliveries of the broadcast being handed out that wait for its log write;
    /// kept for its capacity, empty between broadcasts.
    owed_now: Vec<(Arc<str>, u64, Delivery)>,
    /// The subscriptions a broadcast being handed out reaches; kept for its capacity
    /// (at most `PLACED_KEPT`), empty between broadcasts.
    placed: Vec<Placed>,
    /// Broadcasts waiting for their log write, for the server (`take_unlogged`).
    unlogged: Vec<broadcast_log::Pending>,
    /// Each log record, by offset, and how many sessions still hold it.
    log_refs: BTreeMap<u64, usize>,
    /// Log records no session needs any more, to be deleted by the server.
    log_unneeded: Vec<u64>,
    /// What a full log cost since the last warning (B-474).
    log_losses: broadcast_log::Losses,
    /// Sessions held by the broker itself (`attach_internal`), never ended.
    internal_sessions: usize,
    /// Held QoS 2 publishes kept in storage that are to be forgotten there
    /// (abandoned, or their session ended), for the server (`take_held_forget`).
    held_forget: Vec<held::HeldRef>,
    /// The token of the next held QoS 2 publish kept in storage: from the clock at
    /// start, so one kept before a restart is never mistaken for a newer one.
    next_held_token: u64,
}

/// Forgets that group `$share/<name>/<filter>` has a backlog once it has no member
/// left to collect it: its key would otherwise outlive every session that named it
/// (one per group name a client ever made up).
fn forget_group_if_empty(
    backlogged: &mut BTreeSet<Arc<str>>,
    tree: &topic::TopicTree,
    filter: &str,
    name: &str,
) {
    if !backlogged.is_empty() && tree.group_members(filter, name).is_empty() {
        backlogged.remove(format!("{name}/{filter}").as_str());
    }
}

/// The incarnation a CONNECT's record names (`Broker::incarnation_for`), and whether
/// it is that of the session the CONNECT expects to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incarnation {
    /// `Session::incarnation`.
    pub value: u64,
    /// Chosen as the session to resume's own.
    pub resumes: bool,
}

impl Broker {
    /// A broker serving `channels`, holding the sessions its session store kept, each
    /// asked under `acl` as the client it was stored as (B-290).
    pub fn new(
        settings: Settings,
        mut channels: Channels,
        acl: Option<&Rc<crate::acl::Acl>>,
    ) -> Broker {
        let mut retained = RetainedStore::new(settings.retained_retention_period);
        if let Some(durable) = &mut channels.retained {
            let (now, now_ms) = (Instant::now(), records::now_ms());
            for loaded in std::mem::take(&mut durable.loaded) {
                let age = Duration::from_millis(now_ms.saturating_sub(loaded.stored_ms));
                retained.load(loaded.message, loaded.offset, age, now);
            }
        }
        let budgets = PublishBudgets::new(settings.publish_rate, settings.publish_bytes);
        let (loaded, logged, kept) = channels
            .sessions
            .as_mut()
            .map(|s| {
                (
                    std::mem::take(&mut s.loaded),
                    std::mem::take(&mut s.log),
                    std::mem::take(&mut s.held),
                )
            })
            .unwrap_or_default();
        let logs = channels.sessions.is_some();
        let mut broker = Broker {
            retained,
            settings,
            metrics: Metrics::default(),
            queues: queue::Queues::new(&channels),
            channels,
            sessions: Map::default(),
            tree: TopicTree::default(),
            expiring: HashMap::new(),
            next_backlog_sweep: Instant::now(),
            backlogged: BTreeSet::new(),
            read_failed: BTreeSet::new(),
            wills: HashMap::new(),
            budgets,
            unstored: Vec::new(),
            wills_storing: Vec::new(),
            wills_untaken: Vec::new(),
            lapsed: Vec::new(),
            record_work: Vec::new(),
            records_refused: std::collections::HashSet::new(),
            handed: 0,
            next_assigned: 0,
            logs,
            owed_now: Vec::new(),
            placed: Vec::new(),
            unlogged: Vec::new(),
            log_refs: BTreeMap::new(),
            log_unneeded: Vec::new(),
            log_losses: broadcast_log::Losses::default(),
            internal_sessions: 0,
            held_forget: Vec::new(),
            next_held_token: records::now_ms().saturating_mul(1000),
        };
        let (released, kept) = kept
            .into_iter()
            .partition(|(_, h)| released::client_of(&h.client_id).is_some());
        broker.restore(loaded, acl);
        broker.restore_released(released);
        broker.restore_owed(logged);
        broker.restore_held(kept);
        broker
    }

    /// A token for the next held QoS 2 publish kept in storage.
    pub fn held_token(&mut self) -> u64 {
        self.next_held_token += 1;
        self.next_held_token
    }

    /// Held QoS 2 publishes to forget in storage.
    pub fn take_held_forget(&mut self) -> Vec<held::HeldRef> {
        std::mem::take(&mut self.held_forget)
    }

    /// Notes a held QoS 2 publish to forget in storage.
    pub fn forget_held(&mut self, forget: held::HeldRef) {
        self.held_forget.push(forget);
    }

    /// Notes the released outbound exchange `packet_id` of `client_id`, kept in
    /// storage under `token`, to forget there: completed, or its session ended.
    pub fn forget_released(&mut self, client_id: &str, packet_id: u16, token: u64) {
        if let Some(provider) = self.session_store() {
            let key = crate::storage::HeldKey {
                client_id: released::stored_id(client_id),
                packet_id,
                token,
            };
            self.held_forget.push(held::HeldRef { provider, key });
        }
    }

    /// What a graceful stop keeps of each session's exchanges still published
    /// (`broker::released`, MQTT-4.4.0-1): the row of each session that has any, as
    /// `Provider::put_held` takes it, one per session. A queue's offer is never kept.
    pub fn published_to_keep(&mut self) -> Vec<crate::storage::Held> {
        let channels = &self.channels;
        let offer = |id: ChannelId| channels.get(id).kind == channels::Kind::Queue;
        let mut rows = Vec::new();
        for session in self.sessions.values() {
            let exchanges = session.to_keep_published(offer);
            if exchanges.is_empty() {
                continue;
            }
            let named = exchanges.iter().map(|(id, (channel, offset))| {
                let name = channel.map(|c| &*channels.get(c).name);
                (*id, name, *offset)
            });
            let data = released::encode_published(named);
            self.next_held_token += 1;
            rows.push(crate::storage::Held {
                client_id: released::stored_id(&session.client_id),
                packet_id: released::PUBLISHED_ROW,
                token: self.next_held_token,
                data,
            });
        }
        rows
    }

    /// The provider `broker.session.storage` names, when the broker runs with one.
    pub fn session_store(&self) -> Option<Arc<crate::storage::Provider>> {
        self.channels.sessions.as_ref().map(|s| s.provider.clone())
    }

    /// A client id for a CONNECT that sent none (MQTT-3.1.3-6).
    pub fn assign_client_id(&mut self) -> Arc<str> {
        // Never the id of a session held now, restored ones included: the counter
        // starts again at every start, and a Clean Start under a taken id would end
        // somebody else's session.
        loop {
            self.next_assigned += 1;
            let id: Arc<str> = Arc::from(format!(
                "saguin-{}-{}",
                self.settings.broker_id, self.next_assigned
            ));
            if !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }

    /// The Session Expiry Interval a CONNECT is granted.
    fn granted_expiry(&self, connect: &Connect) -> u32 {
        let requested = match connect.protocol {
            ProtocolVersion::V5 => connect.properties.session_expiry_interval.unwrap_or(0),
            // A 3.1.1 CONNECT carries no expiry; one the handshake set stands (a
            // cleanSession 0 session started clean for another user still lasts).
            ProtocolVersion::V311 => match connect.properties.session_expiry_interval {
                Some(kept) => kept,
                None if connect.clean_start => 0,
                None => u32::MAX,
            },
        };
        requested.min(self.settings.max_session_expiry)
    }

    /// What a CONNECT that passed every check must write before its CONNACK (B-460,
    /// gaps G-10 "Clean Start 1"): the record of the session it will hold, connected,
    /// with the Will it arms; the deletion of the record a session it replaces or
    /// shortens left; or nothing, for a session that was never stored and ends with
    /// its connection. Computed before [`Broker::connect`] so a failed write changes
    /// nothing (C-270).
    pub fn connect_record(
        &self,
        connect: &Connect,
        client_id: &str,
        user: &str,
        incarnation: Incarnation,
    ) -> RecordWrite {
        let expiry = self.granted_expiry(connect);
        let existing = self.sessions.get(client_id);
        if expiry == 0 {
            return match existing {
                Some(s) if s.stored => RecordWrite::Delete,
                _ => RecordWrite::Nothing,
            };
        }
        let mut session = Session::new(Arc::from(client_id), connect.protocol, 0);
        session.incarnation = incarnation.value;
        session.expiry = expiry;
        session.receive_maximum = connect.properties.receive_maximum.unwrap_or(u16::MAX);
        session.user = session::user_named(user);
        if let Some(old) = existing.filter(|s| !connect.clean_start && s.outlives_connection()) {
            session.subscriptions = old.subscriptions.clone();
        }
        session.will = connect.will.as_ref().map(|will| {
            Box::new(ArmedWill {
                will: will.clone(),
                delay: will.properties.will_delay_interval.unwrap_or(0),
                asker: None,
            })
        });
        RecordWrite::Put(stored::SessionRecord::of(&session, None, None).encode())
    }

    /// The record `client_id`'s session should have now: `None` when there is no such
    /// session or it ends with its connection. `without` are filters (as the client
    /// spelled them) left out, for an UNSUBSCRIBE stored before it is applied. A Will
    /// waiting out its delay keeps its due moment, at a stop too (C-279); one kept by
    /// a connection the stop cut has none (C-282), as it is in no wait.
    pub fn record_of(&self, client_id: &str, without: &[String]) -> Option<stored::Encoded> {
        let session = self.sessions.get(client_id).filter(|s| s.expiry > 0)?;
        let due_ms = self
            .wills
            .get(client_id)
            .filter(|(generation, _)| *generation == session.generation)
            .map(|(_, at)| {
                let left = at.saturating_duration_since(Instant::now()).as_millis();
                records::now_ms().saturating_add(u64::try_from(left).unwrap_or(u64::MAX))
            });
        let mut record = stored::SessionRecord::of(session, session.away_ms, due_ms);
        record.subscriptions.retain(|s| {
            let key = match &s.share {
                Some(name) => format!("$share/{name}/{}", s.filter),
                None => s.filter.clone(),
            };
            !without.contains(&key)
        });
        Some(record.encode())
    }

    /// The client ids whose records are to be written again or deleted, those the
    /// provider refused before among them.
    pub fn take_record_work(&mut self) -> Vec<Arc<str>> {
        let mut work = std::mem::take(&mut self.record_work);
        work.extend(self.records_refused.iter().cloned());
        work.sort_unstable();
        work.dedup();
        // Written once their Will is stored (`wills_stored`), not before (C-281).
        if !self.wills_storing.is_empty() {
            work.retain(|c| !self.wills_storing.contains(c));
        }
        work
    }

    /// Notes how writing `client_id`'s record went: a refused one is tried again on
    /// every [`Broker::take_record_work`] until it lands (C-285). Whether it had been
    /// refused before.
    pub fn record_written(&mut self, client_id: &Arc<str>, landed: bool) -> bool {
        if landed {
            self.records_refused.remove(client_id)
        } else {
            !self.records_refused.insert(client_id.clone())
        }
    }

    /// Whether `client_id`'s record waits to be written again (C-286).
    pub fn record_refused(&self, client_id: &str) -> bool {
        self.records_refused.contains(client_id)
    }

    /// Marks `client_id`'s session as stored (its record written) or not.
    pub fn set_stored(&mut self, client_id: &str, stored: bool) {
        if let Some(session) = self.sessions.get_mut(client_id) {
            session.stored = stored;
        }
    }

    /// Where a publish to `topic` goes.
    pub fn destination(&self, topic: &str) -> Destination {
        match self.channels.resolve(topic) {
            Some(id) => Destination::Channel(id),
            None => Destination::Broadcast,
        }
    }

    /// Every session held, the broker's own included.
    pub fn held_sessions(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values().map(|s| &**s)
    }

    /// The session of `client_id`, if it exists.
    pub fn held_session(&self, client_id: &str) -> Option<&Session> {
        self.sessions.get(client_id).map(|s| &**s)
    }

    /// `client_id`'s session, to change.
    pub fn session(&mut self, client_id: &str) -> Option<&mut Session> {
        self.sessions.get_mut(client_id).map(|s| &mut **s)
    }

    /// The session `client_id` holds through the connection `link_id`, if it still does.
    pub fn session_of(&mut self, client_id: &str, link_id: u64) -> Option<&mut Session> {
        self.session_and_metrics(client_id, link_id).map(|(s, _)| s)
    }

    /// [`Broker::session_of`], with the counters beside it for what the caller drops.
    pub fn session_and_metrics(
        &mut self,
        client_id: &str,
        link_id: u64,
    ) -> Option<(&mut Session, &Metrics)> {
        let session = self
            .sessions
            .get_mut(client_id)
            .filter(|s| s.link.as_ref().is_some_and(|l| l.id == link_id))?;
        Some((&mut **session, &self.metrics))
    }

    /// Wills waiting out their delay.
    pub fn wills_waiting(&self) -> usize {
        self.wills.len()
    }

    /// Subscriptions held across clients' sessions, and what they hold queued
    /// (messages, bytes): the broker's own (a bridge's out rules) are not a client's,
    /// as `session_count` counts them.
    pub fn session_totals(&self) -> (usize, usize, usize) {
        self.sessions
            .values()
            .filter(|s| !s.internal)
            .fold((0, 0, 0), |(subs, msgs, bytes), s| {
                (
                    subs + s.subscriptions.len(),
                    msgs + s.queue.len() + s.inflight.len(),
                    bytes + s.queued_bytes,
                )
            })
    }

    /// The connection holding `client_id`'s session, if one does.
    pub fn holder(&self, client_id: &str) -> Option<Rc<ConnLink>> {
        // The broker's own sessions (a bridge's outbound rules) are held by no
        // client's connection: nothing to take over or hang up.
        if client_id.starts_with(INTERNAL) {
            return None;
        }
        self.sessions.get(client_id).and_then(|s| s.link.clone())
    }

    /// How many clients' sessions exist.
    pub fn session_count(&self) -> usize {
        // A bridge's outbound rules hold sessions of the broker's own: no client's.
        self.sessions.len().saturating_sub(self.internal_sessions)
    }

    /// The incarnation of the session `connect` will hold: the one it resumes, or a
    /// new one (`Session::incarnation`), chosen before its record is written.
    pub fn incarnation_for(&self, connect: &Connect) -> Incarnation {
        match self.sessions.get(connect.client_id.as_str()) {
            Some(s) if !connect.clean_start && s.outlives_connection() => Incarnation {
                value: s.incarnation,
                resumes: true,
            },
            _ => Incarnation {
                value: session::new_incarnation(),
                resumes: false,
            },
        }
    }

    /// Takes or creates the session for a CONNECT that passed every check, a new one
    /// under `incarnation` (`incarnation_for`). Another connection holding the same
    /// client id is told to end (0x8E).
    pub fn connect(
        &mut self,
        connect: &Connect,
        link: Rc<ConnLink>,
        chosen: Incarnation,
    ) -> Accepted {
        let client_id: Arc<str> = if connect.client_id.is_empty() {
            self.assign_client_id()
        } else {
            Arc::from(connect.client_id.as_str())
        };
        let expiry = self.granted_expiry(connect);
        let delay = connect
            .will
            .as_ref()
            .and_then(|w| w.properties.will_delay_interval)
            .unwrap_or(0);
        if expiry == 0 && delay > 0 {
            // MQTT publishes such a Will as the session ends, with the connection; a
            // client asking to wait is told how to (C-275).
            log::info!(
                "{client_id}: asked a Will Delay Interval of {delay} s on a session that ends with its connection, so its Will goes at once when it does; ask a Session Expiry Interval of at least {delay} s for the delay to apply"
            );
        }

        let waiting = self.wills.contains_key(&client_id);
        // A session that ends with its connection is never resumed, even while that
        // connection is still finishing (MQTT-3.1.2-6, MQTT-3.2.2-2).
        let resumed = !connect.clean_start
            && (self.sessions.get(&client_id)).is_some_and(|s| s.outlives_connection());
        if let Some(old) = self.sessions.get_mut(&client_id) {
            let cut = old
                .link
                .take()
                .inspect(|link| link.kick(reason::SESSION_TAKEN_OVER));
            // A connection cut here ends without a DISCONNECT: its Will is due unless
            // its delay lets this resuming connection cancel it. A Clean Start ends
            // the session, which publishes a Will waiting out its delay (C-271); one
            // kept at a stop, due at no moment, is replaced by this CONNECT (C-282).
            // A session not resumed ends here too, its Will with it.
            if let Some(will) = old.will.take()
                && ((cut.is_some() && (will.delay == 0 || !resumed)) || (waiting && !resumed))
            {
                let publisher = old.client_id.clone();
                self.publish_will(&publisher, *will);
            }
        }
        self.expiring.remove(&client_id);
        self.wills.remove(&client_id);
        if !resumed {
            self.end_session(&client_id);
        }
        let bound = self.settings.session_queue_bytes;
        // What the record written before this says, unless the session changed while
        // it was written: the one to resume lapsed (a new one must not take its
        // incarnation), or another CONNECT made the one resumed. Then the record is
        // written again under the incarnation the session has.
        let incarnation = match (resumed, chosen.resumes) {
            (false, true) => session::new_incarnation(),
            _ => chosen.value,
        };
        let session = self.sessions.entry(client_id.clone()).or_insert_with(|| {
            let mut session = Session::new(client_id.clone(), connect.protocol, bound);
            session.incarnation = incarnation;
            Box::new(session)
        });
        if session.incarnation != chosen.value && expiry > 0 {
            self.record_work.push(client_id.clone());
        }
        session.protocol = connect.protocol;
        session.expiry = expiry;
        if resumed {
            // `saguin-deletions` is asked for again by each SUBSCRIBE that wants it,
            // not kept for a resumed session, as none is for one restored at a start
            // (gaps G-19).
            for sub in session.cursors.values_mut().flat_map(|c| c.subs.iter_mut()) {
                sub.deletions = false;
            }
        }
        // What `connect_record` wrote before this: the record, or its deletion.
        session.stored = expiry > 0;
        session.away_ms = None;
        session.generation += 1;
        session.receive_maximum = connect.properties.receive_maximum.unwrap_or(u16::MAX);
        session.max_packet_size = connect.properties.maximum_packet_size.unwrap_or(u32::MAX);
        session.will = connect.will.as_ref().map(|will| {
            Box::new(ArmedWill {
                will: will.clone(),
                delay: will.properties.will_delay_interval.unwrap_or(0),
                asker: None,
            })
        });
        // Deliveries that were on the wire go again, DUP set, before anything new.
        session.link = Some(link);
        self.metrics
            .connections_total
            .set(self.metrics.connections_total.get() + 1);
        Accepted {
            session_present: resumed,
            assigned: false,
            client_id,
            session_expiry: expiry,
            cut_for_room: false,
        }
    }

    /// The connection `link_id` of `client_id` ended. `will_due` says whether it ended
    /// without a normal DISCONNECT (or with 0x04), so its Will is owed.
    pub fn disconnect(
        &mut self,
        client_id: &Arc<str>,
        link_id: u64,
        will: WillAtEnd,
        now: Instant,
    ) {
        let Some(session) = self.session_of(client_id, link_id) else {
            return;
        };
        session.link = None;
        session.away_ms = Some(records::now_ms());
        session.end_giving_up("its connection ended");
        if session.stored {
            self.record_work.push(client_id.clone());
        }
        let Some(session) = self.sessions.get_mut(client_id) else {
            return;
        };
        let armed = match will {
            WillAtEnd::Keep => None,
            WillAtEnd::Publish | WillAtEnd::Withdraw => session.will.take(),
        };
        let generation = session.generation;
        let expiry = session.expiry;
        if let Some(will) = armed.filter(|_| will == WillAtEnd::Publish) {
            if will.delay == 0 || expiry == 0 {
                self.publish_will(client_id, *will);
            } else {
                let delay = will.delay.min(expiry);
                if let Some(session) = self.sessions.get_mut(client_id) {
                    session.will = Some(will);
                }
                self.wills.insert(
                    client_id.clone(),
                    (generation, now + Duration::from_secs(delay.into())),
                );
            }
        }
        if expiry == 0 {
            self.lapse_session(client_id);
        } else if expiry != u32::MAX {
            self.expiring
                .insert(client_id.clone(), now + Duration::from_secs(expiry.into()));
        }
    }

    /// Publishes due Wills and ends expired sessions; called about once a second.
    pub fn tick(&mut self, now: Instant) {
        for (client_id, channel) in std::mem::take(&mut self.read_failed) {
            if let Some(session) = self.sessions.get_mut(&client_id)
                && let Some(cursor) = session.cursors.get_mut(&channel)
            {
                cursor.wake();
                session.wake();
            }
        }
        let due: Vec<Arc<str>> = self
            .wills
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(c, _)| c.clone())
            .collect();
        for client_id in due {
            self.fire_delayed_will(&client_id);
        }
        let expired: Vec<Arc<str>> = self
            .expiring
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(c, _)| c.clone())
            .collect();
        for client_id in expired {
            self.expiring.remove(&client_id);
            self.fire_delayed_will(&client_id);
            // A Will restored with no due moment goes when its session ends (C-282).
            if let Some(session) = self.sessions.get_mut(&client_id)
                && session.link.is_none()
                && let Some(will) = session.will.take()
            {
                self.publish_will(&client_id, *will);
            }
            self.lapse_session(&client_id);
        }
        self.retained.purge(now);
        self.budgets.prune(now);
        self.abandon_held_qos2(now);
        self.drop_expired_backlog(now);
        self.count_released();
        self.warn_of_losses(now);
    }

    /// Drops what members away from their connections hold for shared groups past
    /// `broker.share.expires_after` (B-446), sweeping at most twice a period: a member
    /// that is connected drops its own as it writes (`Conn::write_owed`).
    fn drop_expired_backlog(&mut self, now: Instant) {
        let Some(wait) = self.settings.share_expires_after else {
            return;
        };
        if now < self.next_backlog_sweep {
            return;
        }
        self.next_backlog_sweep = now + wait / 2;
        let dropped: usize = self
            .sessions
            .values_mut()
            .filter(|s| s.link.is_none())
            .map(|s| s.drop_expired_backlog(now))
            .sum();
        if dropped > 0 {
            log::debug!(
                "{dropped} shared group deliveries dropped: held past broker.share.expires_after"
            );
        }
        let total = &self.metrics.dropped_share_expired;
        total.set(total.get() + dropped as u64);
    }

    /// Gives up inbound QoS 2 publishes whose PUBREL has not come within
    /// `broker.qos2.expires_after`; a late PUBREL is answered 0x92.
    fn abandon_held_qos2(&mut self, now: Instant) {
        let wait = self.settings.qos2_expires_after;
        let mut abandoned = 0;
        let forget = &mut self.held_forget;
        for session in self.sessions.values_mut() {
            let before = session.incoming.len();
            let client_id = &session.client_id;
            session.incoming.retain(|packet_id, held| {
                let keep = now.saturating_duration_since(held.since) < wait;
                // Kept in storage: forgotten there too.
                if !keep && let Some(stored) = &held.stored {
                    forget.push(stored.at(client_id, *packet_id));
                }
                keep
            });
            abandoned += before - session.incoming.len();
        }
        if abandoned > 0 {
            log::info!(
                "{abandoned} QoS 2 publishes abandoned: no PUBREL within broker.qos2.expires_after"
            );
            let total = &self.metrics.qos2_abandoned;
            total.set(total.get() + abandoned as u64);
        }
    }

    /// Inbound QoS 2 publishes held across every session.
    pub fn qos2_held(&self) -> usize {
        self.sessions.values().map(|s| s.incoming.len()).sum()
    }

    /// Spends `client`'s publish budget on a message of `size` bytes; false when it is
    /// over `publish_rate` or `publish_bytes` (0x97).
    pub fn spend_publish_budget(&mut self, client: &Arc<str>, size: usize, now: Instant) -> bool {
        // The figures of the client's acl_file entry, when it carries limits: (B-115).
        let figures = self
            .sessions
            .get(client)
            .and_then(|s| s.principal.as_ref())
            .and_then(|p| p.limits());
        match figures {
            Some(l) => self
                .budgets
                .spend_at(client, size, now, l.publish_rate, l.publish_bytes),
            None => self.budgets.spend(client, size, now),
        }
    }

    fn fire_delayed_will(&mut self, client_id: &Arc<str>) {
        let Some((generation, _)) = self.wills.remove(client_id) else {
            return;
        };
        let Some(session) = self.sessions.get_mut(client_id) else {
            return;
        };
        if session.generation == generation
            && session.link.is_none()
            && let Some(will) = session.will.take()
        {
            // The record is written again without it once the Will is stored
            // (`publish_will`, C-281): a restart must not publish it twice.
            if session.stored {
                self.record_work.push(client_id.clone());
            }
            self.publish_will(client_id, *will);
        }
    }

    fn publish_will(&mut self, client_id: &Arc<str>, armed: ArmedWill) {
        if let Some(asker) = &armed.asker
            && !asker.may_publish(&armed.will.topic, armed.will.payload.is_empty())
        {
            log::warn!(
                "the Will of {client_id} to {:?} is not published: the acl_file no longer lets it publish there",
                armed.will.topic
            );
            self.metrics.refuse_publish("not authorized"); // C-265
            return;
        }
        if self.sessions.get(client_id).is_some_and(|s| s.stored) {
            self.wills_storing.push(client_id.clone());
            self.wills_untaken.push(client_id.clone());
        }
        let will = armed.will;
        let message = Message::from_will(client_id.clone(), will, Instant::now());
        log::debug!("publishing the Will of {client_id} to {}", message.topic);
        // A Will's topic passed the same checks as a publish at CONNECT. What must be
        // stored first - a channel's record, a retained broadcast value - takes the
        // ordinary publish path from the server (`take_unstored`, C-248), and is
        // counted published once stored (C-267); a plain broadcast needs no storage
        // and goes now.
        let message = Arc::new(message);
        let stored_first = match self.destination(&message.topic) {
            Destination::Channel(_) => true,
            Destination::Broadcast => message.retain && self.channels.retained.is_some(),
        };
        if stored_first {
            self.unstored.push(message);
        } else {
            self.metrics.will_published();
            self.broadcast(message);
        }
    }

    /// Ends a session that lapsed (it expired, or its connection ended it) rather than
    /// one a Clean Start replaced: the positions it stored go too, so a later session
    /// of the same client id starts where the channel's `start` says. Asked of
    /// every lapse, not only one with an open cursor: a session restored at a start and
    /// never resumed, one that unsubscribed, or one that only seeked holds positions
    /// no cursor shows. A provider answers at no cost for a client that stored none.
    fn lapse_session(&mut self, client_id: &Arc<str>) {
        if !self.sessions.contains_key(client_id) {
            return;
        }
        self.end_session(client_id);
        self.lapsed.push(client_id.clone());
    }

    /// The client ids whose stored positions are to be discarded.
    pub fn take_lapsed(&mut self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.lapsed)
    }

    /// Ends a session: its subscriptions leave the index and it is forgotten.
    fn end_session(&mut self, client_id: &str) {
        let Some(mut session) = self.sessions.remove(client_id) else {
            return;
        };
        if session.stored {
            self.record_work.push(session.client_id.clone());
        }
        for sub in session.subscriptions.values() {
            self.tree
                .remove(&sub.filter, sub.share.as_deref(), client_id);
            if let Some(name) = &sub.share {
                forget_group_if_empty(&mut self.backlogged, &self.tree, &sub.filter, name);
            }
        }
        for channel in session.cursors.keys() {
            self.channels.get_mut(*channel).readers.remove(client_id);
        }
        self.wills.remove(client_id);
        self.expiring.remove(client_id);
        // Its held QoS 2 publishes go with it, from storage too.
        for (packet_id, held) in &session.incoming {
            if let Some(stored) = &held.stored {
                self.held_forget.push(stored.at(client_id, *packet_id));
            }
        }
        // Its released outbound exchanges too.
        for (packet_id, inflight) in session.inflight.in_send_order() {
            if let Inflight::Released(_, Some(token)) = inflight {
                self.forget_released(client_id, packet_id, *token);
            }
        }
        // What its groups had handed it and it had not settled goes back to them.
        let held = session.take_all_held();
        if !held.is_empty() {
            self.give_back_held(client_id, held);
        }
        // What it held of the broadcast log, settled or not, it holds no more.
        if let Some(log) = session.log {
            let held = log.released.into_iter().chain(log.unsettled);
            release_logged(&mut self.log_refs, &mut self.log_unneeded, held);
        }
    }

    /// Adds or replaces a subscription (its filter already checked). Returns whether
    /// it replaced an existing one, which Retain Handling 1 needs.
    pub fn subscribe(&mut self, client_id: &Arc<str>, sub: Subscription) -> bool {
        if let Some(slice) = &sub.slice
            && sub.share.is_none()
            && let Some((other, theirs)) =
                self.tree
                    .partition_disagreement(&sub.filter, client_id, slice.partitions())
        {
            // Two members of one space disagreeing on its size cannot both be right
            // (C-195); only the identical filter string is compared (C-196).
            log::warn!(
                "{client_id} declares {} partitions on {:?} where {other} declares {theirs}: \
                 their slices do not divide one space",
                slice.partitions(),
                sub.filter
            );
        }
        let entry = SubEntry {
            options: sub.options,
            identifier: sub.identifier,
            slice: sub.slice.clone(),
        };
        let existed = self
            .tree
            .insert(&sub.filter, sub.share.as_deref(), client_id, entry);
        if let Some(session) = self.sessions.get_mut(client_id) {
            session.subscriptions.insert(sub);
        }
        existed
    }

    /// What the channel cursors of `client_id` hold for `filter`, by channel.
    pub fn cursor_subs(&self, client_id: &str, filter: &str) -> Vec<CursorSub> {
        self.sessions.get(client_id).map_or_else(Vec::new, |s| {
            s.cursors
                .iter()
                .filter_map(|(id, c)| {
                    let sub = c.subs.iter().find(|x| x.filter == filter)?.clone();
                    let pass = c.passes.iter().find(|p| p.sub.filter == filter).cloned();
                    Some((*id, sub, pass))
                })
                .collect()
        })
    }

    /// Puts back a subscription a refused SUBSCRIBE replaced: its entry, and what its
    /// channel cursors held for it (`in_cursors`, from [`Broker::cursor_subs`]).
    pub fn restore_subscription(
        &mut self,
        client_id: &Arc<str>,
        before: Subscription,
        in_cursors: Vec<CursorSub>,
    ) {
        // A shared subscription owns no cursor, nor any pass: the one its inner
        // filter names is the client's own subscription's.
        let filter = before.share.is_none().then(|| before.filter.clone());
        self.subscribe(client_id, before);
        if let Some(session) = self.sessions.get_mut(client_id) {
            // The refused SUBSCRIBE's state pass goes with it; what the one it
            // replaced was still owed comes back.
            for cursor in session.cursors.values_mut() {
                cursor
                    .passes
                    .retain(|p| filter.as_ref().is_none_or(|f| p.sub.filter != *f));
            }
            for (id, sub, pass) in in_cursors {
                if let Some(cursor) = session.cursors.get_mut(&id) {
                    cursor.add(sub);
                    cursor.passes.extend(pass);
                }
            }
        }
    }

    /// Removes a subscription by the filter string the client sent; returns whether
    /// it existed.
    pub fn unsubscribe(&mut self, client_id: &Arc<str>, filter: &str) -> bool {
        let Some(session) = self.sessions.get_mut(client_id) else {
            return false;
        };
        let Some(sub) = session.subscriptions.remove(filter) else {
            return false;
        };
        if sub.share.is_none() {
            let channels = &mut self.channels;
            session.cursors.retain(|channel, cursor| {
                cursor.subs.retain(|s| s.filter != sub.filter);
                // Nothing more is sent for it after the UNSUBACK (MQTT-3.10.4-2).
                cursor.passes.retain(|p| p.sub.filter != sub.filter);
                let keep = !cursor.subs.is_empty();
                if !keep {
                    channels.get_mut(*channel).readers.remove(client_id);
                }
                keep
            });
        }
        let removed = self
            .tree
            .remove(&sub.filter, sub.share.as_deref(), client_id);
        if let Some(name) = &sub.share {
            forget_group_if_empty(&mut self.backlogged, &self.tree, &sub.filter, name);
        }
        removed
    }

    /// Holds `session` for a part of the broker itself - a bridge's outbound rule
    /// (`crate::bridge::outbound`): its client id holds a control character, so no
    /// client's CONNECT can name it; it is never stored, never expires and is held
    /// by its link for the life of the process. It subscribes like any session, so
    /// broadcast fan-out and channel cursors serve it unchanged.
    pub fn attach_internal(&mut self, mut session: Session) {
        session.internal = true;
        let held = self
            .sessions
            .insert(session.client_id.clone(), Box::new(session));
        if held.is_none() {
            self.internal_sessions += 1;
        }
    }

    /// A record landed in `channel`: wake every session reading it, and hand it to
    /// the shared groups whose filters match, which are served what is published
    /// after they began (RFC 0002 "Shared subscriptions").
    pub fn landed(&mut self, channel: ChannelId, message: Option<Arc<Message>>) {
        for reader in &self.channels.get(channel).readers {
            if let Some(session) = self.sessions.get_mut(reader) {
                if let Some(cursor) = session.cursors.get_mut(&channel) {
                    cursor.wake();
                }
                session.wake();
            }
        }
        if let Some(message) = message {
            self.fan_out(message, true);
        }
    }

    /// Whether a landed record could be owed to a shared group.
    pub fn has_shared_groups(&self) -> bool {
        self.tree.has_shared_groups()
    }

    /// How many filters a client holds.
    pub fn subscription_count(&self, client_id: &str) -> usize {
        self.sessions
            .get(client_id)
            .map_or(0, |s| s.subscriptions.len())
    }

    /// Notes the record in `broker.retained.storage` a retained broadcast was written
    /// through to, so that it is removed there when the value dies (C-239).
    pub fn retained_written_at(&mut self, message: &Arc<Message>, offset: u64) {
        self.retained.written_at(message, offset);
    }

    /// The records in `broker.retained.storage` of the retained values that died.
    pub fn take_dead_retained(&mut self) -> Vec<u64> {
        self.retained.take_dead()
    }

    /// The retained messages `filter` matches, to be sent after the SUBACK.
    pub fn retained_matching(&mut self, filter: &str, now: Instant) -> Vec<Arc<Message>> {
        self.retained.matching(filter, now)
    }

    /// Routes a publish whose storage is done: a broadcast (its retained value, if
    /// any, already written through by `routing::write_retained`) is handed out now;
    /// one bound for a channel is left for the server to store (`take_unstored`).
    pub fn publish(&mut self, message: Arc<Message>) {
        match self.destination(&message.topic) {
            Destination::Broadcast => self.broadcast(message),
            Destination::Channel(_) => self.unstored.push(message),
        }
    }

    fn broadcast(&mut self, message: Arc<Message>) {
        if message.retain {
            // Its provider took it already: the store's one bound (B-432).
            self.retained.store(&message, Instant::now());
        }
        self.metrics
            .messages_received
            .set(self.metrics.messages_received.get() + 1);
        self.fan_out(message, false);
    }

    /// Whether broadcasts wait for their log write (`take_unlogged`).
    pub fn has_unlogged(&self) -> bool {
        !self.unlogged.is_empty()
    }

    /// The broadcasts whose deliveries to sessions that outlive their connection
    /// wait for the log write, for the server to write (B-456).
    pub fn take_unlogged(&mut self) -> Vec<broadcast_log::Pending> {
        std::mem::take(&mut self.unlogged)
    }

    /// The log write of `pending` is done: each session owed it is handed its
    /// delivery, under the record's `offset`. With no offset (the write failed) the
    /// deliveries are kept in memory only.
    pub fn logged(&mut self, pending: broadcast_log::Pending, offset: Option<u64>) {
        let mut holders = 0;
        let mut orphaned = Vec::new();
        for (client, incarnation, mut delivery) in pending.owed {
            // Gone, or replaced while the write waited (a Clean Start): the session
            // it was owed to has ended, and the new one never subscribed. A group's
            // held delivery is the group's: it goes to another member.
            let Some(session) = self
                .sessions
                .get_mut(&client)
                .filter(|s| s.incarnation == incarnation)
            else {
                if delivery.held.is_some() {
                    delivery.record = offset.map(|offset| (None, offset));
                    orphaned.push(delivery);
                }
                continue;
            };
            if let Some(offset) = offset {
                delivery.record = Some((None, offset));
                session.hand_logged(offset);
                holders += 1;
            }
            enqueue_counted(session, &self.metrics, delivery);
        }
        match offset {
            Some(offset) if holders > 0 => {
                self.log_refs.insert(offset, holders);
            }
            Some(offset) if orphaned.is_empty() => self.log_unneeded.push(offset),
            _ => {}
        }
        for delivery in orphaned {
            // Counted as held by whoever takes it, or released with it.
            if let Some(offset) = delivery.logged() {
                *self.log_refs.entry(offset).or_insert(0) += 1;
            }
            self.give_back_held("", vec![delivery]);
        }
    }

    /// Makes room in a full broadcast log (B-472, B-473): a record no session needs
    /// any more, else the oldest no session has on the wire unacknowledged, which
    /// every session holding it loses, counted `storage_full`. Returns the offset to
    /// delete; `None` when nothing in the log can go.
    pub fn give_up_oldest_logged(&mut self) -> Option<u64> {
        // What sessions settled since the tick is room that costs nobody anything.
        self.count_released();
        if let Some(offset) = self.log_unneeded.pop() {
            return Some(offset);
        }
        let on_wire: std::collections::BTreeSet<u64> = self
            .sessions
            .values()
            .filter_map(|s| s.log.as_ref())
            .flat_map(|l| l.sent.intersection(&l.unsettled).copied())
            .collect();
        let offset = *self.log_refs.keys().find(|o| !on_wire.contains(o))?;
        self.log_refs.remove(&offset);
        let (mut losers, mut shares) = (Vec::new(), 0);
        for session in self.sessions.values_mut() {
            match session.give_up_logged(offset) {
                Some(true) => shares += 1,
                Some(false) => losers.push(session.client_id.clone()),
                None => {}
            }
        }
        // A group's held delivery is the group's loss (B-475).
        let total = &self.metrics.dropped_share_storage_full;
        total.set(total.get() + shares);
        self.lost_to_full_store(&losers);
        Some(offset)
    }

    /// A broadcast the full log could not keep (B-473): the sessions owed it do not
    /// get it, each counted `storage_full`.
    pub fn not_kept(&mut self, pending: broadcast_log::Pending) {
        let losers: Vec<Arc<str>> = pending.owed.into_iter().map(|(c, ..)| c).collect();
        self.lost_to_full_store(&losers);
    }

    fn lost_to_full_store(&mut self, losers: &[Arc<str>]) {
        let total = &self.metrics.dropped_storage_full;
        total.set(total.get() + losers.len() as u64);
        self.log_losses.note(losers);
        self.warn_of_losses(Instant::now());
    }

    /// The rate-limited warning of what a full log cost (B-474).
    fn warn_of_losses(&mut self, now: Instant) {
        let provider = self.session_store();
        let name = provider.as_ref().map_or("", |p| p.name());
        self.log_losses.warn_if_due(name, now);
    }

    /// Log records no session needs any more, for the server to delete.
    pub fn take_log_unneeded(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.log_unneeded)
    }

    /// Counts what sessions settled or gave up of the broadcast log since the last
    /// count: a record none of its sessions holds any more is to be deleted.
    pub fn count_released(&mut self) {
        if self.log_refs.is_empty() {
            return;
        }
        for session in self.sessions.values_mut() {
            if let Some(log) = &mut session.log
                && !log.released.is_empty()
            {
                let released = std::mem::take(&mut log.released);
                release_logged(&mut self.log_refs, &mut self.log_unneeded, released);
            }
        }
    }

    /// Hands `message` to every subscription matching its topic (only the shared
    /// groups when `shared_only`, for a channel's record).
    fn fan_out(&mut self, message: Arc<Message>, shared_only: bool) {
        let mut targets = std::mem::take(&mut self.placed);
        let sessions = &self.sessions;
        let publisher = &message.publisher;
        let topic = &*message.topic;
        let mut unplaced = 0u64;
        let backlogged = &mut self.backlogged;
        let mut size = None;
        let places = self
            .tree
            .for_each_match(&message.topic, |target| match target {
                Target::Client(client, entry) => {
                    let own = entry.options.no_local && client == publisher;
                    // A subscription outside its declared slice is not owed it; another
                    // of the client's that is still is (C-154, C-163).
                    if !shared_only && !own && partition::admits(entry.slice.as_ref(), topic) {
                        targets.push((client.clone(), entry.options, entry.identifier, None));
                    }
                }
                Target::Group(group) => {
                    let qos = message.qos;
                    let size = *size.get_or_insert_with(|| message.wire_size_bound());
                    let charge = message.charge();
                    // At the QoS it would go out at, charged with its identifier: one
                    // granted 0 needs no window.
                    let taker = group.turn_order().find(|(c, e)| {
                        let charge = charge + 4 * usize::from(e.identifier.is_some());
                        sessions.get(*c).is_some_and(|s| {
                            s.can_hold(e.options.qos.min(qos), size, charge) && s.may_read(topic)
                        })
                    });
                    let taken = taker.map(|(c, e)| (c.clone(), e.options, e.identifier));
                    if let Some((client, options, identifier)) = taken {
                        group.last = Some(client.clone());
                        targets.push((client, options, identifier, None));
                        return;
                    }
                    // No member can take it: the group's backlog is kept in one member's
                    // queue, the first in client-id order whose session outlives its
                    // connection, so that it is collected in the order it came (B-447).
                    // Not one granted QoS 0, which would hold it at QoS 0, that is not
                    // at all, nor one whose Maximum Packet Size it passes, which would
                    // discard it: either passes it over for the next.
                    let holder = group.members.iter().find(|(c, e)| {
                        e.options.qos.min(qos) != QoS::AtMostOnce
                            && sessions.get(*c).is_some_and(|s| {
                                s.outlives_connection()
                                    && size <= s.max_packet_size as usize
                                    && s.may_read(topic)
                            })
                    });
                    match holder {
                        Some((client, entry)) => {
                            backlogged.insert(group.key.clone());
                            let held = Some(group.key.clone());
                            targets.push((client.clone(), entry.options, entry.identifier, held));
                        }
                        None => unplaced += 1,
                    }
                }
            });
        if unplaced > 0 {
            self.metrics
                .dropped_no_shared_member
                .set(self.metrics.dropped_no_shared_member.get() + unplaced);
        }
        // A client whose subscriptions overlap gets the message once, at the highest
        // QoS they grant, with every Subscription Identifier (MQTT-3.3.4-2, -3.3.4-3):
        // its targets side by side. From one place they are distinct already.
        if places > 1 {
            targets.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
        let mut i = 0;
        // The clock is read only when a group's message is held: not on every publish.
        let mut held_until = None;
        while i < targets.len() {
            let client = targets[i].0.clone();
            let mut qos = QoS::AtMostOnce;
            let mut retain_as_published = false;
            let start = i;
            // Only a group's backlog is held for the group: a subscription of the
            // client's own that matched too is owed the message for as long as the
            // session lives.
            let mut held: Option<Arc<str>> = None;
            let mut only_held = true;
            while i < targets.len() && targets[i].0 == client {
                let (_, options, _, group) = &targets[i];
                qos = qos.max(options.qos);
                retain_as_published |= options.retain_as_published;
                only_held &= group.is_some();
                held = held.or_else(|| group.clone());
                i += 1;
            }
            // Sized as it is made: the usual single match allocates its one
            // identifier exactly, and none allocates nothing.
            let identifiers: Box<[u32]> = match &targets[start..i] {
                [one] => one.2.into_iter().collect(),
                run => run.iter().filter_map(|t| t.2).collect(),
            };
            let held = held.filter(|_| only_held).map(|group| {
                let until = *held_until.get_or_insert_with(|| {
                    self.settings
                        .share_expires_after
                        .map(|d| Instant::now() + d)
                });
                Box::new(Held { group, until })
            });
            let delivery = Delivery {
                qos: qos.min(message.qos),
                retain: message.retain && retain_as_published,
                identifiers,
                message: message.clone(),
                record: None,
                held,
                resent: false,
                // A channel's record outlives its expiry in a group's hands too
                // (C-137, gaps G-16).
                untracked: match shared_only {
                    true => Untracked::Group,
                    false => Untracked::No,
                },
            };
            self.deliver_as(&client, delivery, true, !shared_only);
            self.handed += 1;
        }
        if targets.capacity() <= PLACED_KEPT {
            targets.clear();
            self.placed = targets;
        }
        if !self.owed_now.is_empty() {
            let owed = std::mem::take(&mut self.owed_now);
            self.unlogged.push(broadcast_log::Pending { message, owed });
        }
    }

    /// How many broadcast deliveries have been handed to sessions since the start: a
    /// connection compares it around its work to learn how many it handed out.
    pub fn handed(&self) -> u64 {
        self.handed
    }

    /// Messages the broker published itself (Wills) that must be stored first: the
    /// server sends each down the ordinary publish path (`connection::route`).
    /// With them, the sessions whose Wills they are, for `wills_stored` once this
    /// call has stored them.
    pub fn take_unstored(&mut self) -> (Vec<Arc<Message>>, Vec<Arc<str>>) {
        (
            std::mem::take(&mut self.unstored),
            std::mem::take(&mut self.wills_untaken),
        )
    }

    /// The Wills of `owners` are stored (or refused for good): their sessions'
    /// records are written now, unless another of their Wills is still on its way.
    pub fn wills_stored(&mut self, owners: Vec<Arc<str>>) {
        for owner in &owners {
            if let Some(at) = self.wills_storing.iter().position(|c| c == owner) {
                self.wills_storing.swap_remove(at);
            }
        }
        self.record_work.extend(owners);
    }

    /// Queues a retained value sent after a SUBACK. To a session that outlives its
    /// connection, at QoS 1 or 2, it is first kept in the broadcast log for that
    /// session alone, a copy nothing else is owed, so a restart sends it again until
    /// it is acknowledged (RFC 0003 "Retained messages", MQTT-4.4.0-1): it waits
    /// for the server's `connection::log_owed` like a broadcast.
    pub fn deliver_retained(&mut self, client_id: &str, delivery: Delivery) {
        let kept = self
            .sessions
            .get(client_id)
            .filter(|s| self.logs && delivery.qos != QoS::AtMostOnce && s.keeps_owed_in_log())
            .map(|s| (s.client_id.clone(), s.incarnation));
        match kept {
            Some((client, incarnation)) => self.unlogged.push(broadcast_log::Pending {
                message: delivery.message.clone(),
                owed: vec![(client, incarnation, delivery)],
            }),
            None => self.deliver(client_id, delivery),
        }
    }

    /// Queues a delivery on a session and wakes its connection.
    pub fn deliver(&mut self, client_id: &str, delivery: Delivery) {
        self.deliver_as(client_id, delivery, false, false);
    }

    /// [`Broker::deliver`]; `as_read` asks the acl_file first whether the client
    /// may read the topic, as every broadcast delivery is asked (B-293) - a queue's
    /// offer rides on consume instead, asked when its worker is chosen. A `loggable`
    /// (broadcast) delivery at QoS 1 or 2 to a session that outlives its connection
    /// waits for the broadcast log instead (`owed_now`, B-456), a group's held
    /// delivery with what it is held for (B-447).
    fn deliver_as(&mut self, client_id: &str, delivery: Delivery, as_read: bool, loggable: bool) {
        let Some(session) = self.sessions.get_mut(client_id) else {
            return;
        };
        if session.link.is_none() && delivery.qos == QoS::AtMostOnce {
            return; // QoS 0 is not kept for a client that is away (MQTT-3.1.2-5 allows it)
        }
        if as_read && !session.may_read(&delivery.message.topic) {
            return;
        }
        if loggable && self.logs && delivery.qos != QoS::AtMostOnce && session.keeps_owed_in_log() {
            self.owed_now
                .push((session.client_id.clone(), session.incarnation, delivery));
            return;
        }
        enqueue_counted(session, &self.metrics, delivery);
    }

    /// Applies Retain Handling for one granted filter and returns what to send: the
    /// retained values its declared slice takes, if it declared one (C-164).
    pub fn retained_for_subscription(
        &mut self,
        filter: &str,
        options: SubscriptionOptions,
        slice: Option<&partition::Slice>,
        existed: bool,
        now: Instant,
    ) -> Vec<Arc<Message>> {
        match options.retain_handling {
            RetainHandling::Never => Vec::new(),
            RetainHandling::OnNewSubscribe if existed => Vec::new(),
            _ => {
                let mut messages = self.retained_matching(filter, now);
                messages.retain(|m| partition::admits(slice, &m.topic));
                messages
            }
        }
    }

    /// `client_id`'s cursor on `channel` could not read its window: it is tried
    /// again at the next tick.
    pub fn read_failed(&mut self, client_id: &Arc<str>, channel: ChannelId) {
        self.read_failed.insert((client_id.clone(), channel));
    }

    /// Marks every cursor of every session unread and wakes its connection: what a
    /// re-read acl_file does, so a stalled subscriber looks again (B-294).
    pub fn wake_every_cursor(&mut self) {
        for session in self.sessions.values_mut() {
            for cursor in session.cursors.values_mut() {
                cursor.wake();
            }
            session.wake();
        }
    }

    /// Every connected session's link, for a graceful shutdown.
    pub fn links(&self) -> Vec<Rc<ConnLink>> {
        self.sessions
            .values()
            .filter_map(|s| s.link.clone())
            .collect()
    }
}

/// Queues a delivery on `session`, counting what the session bound gave up or
/// refused, and wakes its connection.
fn enqueue_counted(session: &mut Session, metrics: &Metrics, delivery: Delivery) {
    session.enqueue_counted(metrics, delivery);
    session.wake();
}

/// Counts `released` log offsets off their records; a record no session holds any
/// more is noted for deletion.
fn release_logged(
    refs: &mut BTreeMap<u64, usize>,
    unneeded: &mut Vec<u64>,
    released: impl IntoIterator<Item = u64>,
) {
    for offset in released {
        if let Some(holders) = refs.get_mut(&offset) {
            *holders = holders.saturating_sub(1);
            if *holders == 0 {
                refs.remove(&offset);
                unneeded.push(offset);
            }
        }
    }
}

impl Message {
    /// The message a Will becomes when it fires.
    pub fn from_will(publisher: Arc<str>, will: crate::codec::Will, now: Instant) -> Message {
        Message::published(
            Arc::from(will.topic),
            will.payload.into(),
            (will.qos, will.retain),
            will.properties,
            publisher,
            now,
        )
    }
}
