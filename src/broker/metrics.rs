//! Counters the broker keeps as it works; the operations listener renders them.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// Plain counters, bumped where the event happens.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Connections accepted since start.
    pub connections_total: Cell<u64>,
    /// Publishes routed.
    pub messages_received: Cell<u64>,
    /// Wills published.
    pub wills_published: Cell<u64>,
    /// Deliveries given up because a session's queue was full.
    pub dropped_queue_full: Cell<u64>,
    /// QoS 2 deliveries refused because a session held its bound and nothing it could
    /// give up.
    pub deliveries_refused: Cell<u64>,
    /// Shared-group messages no member could take.
    pub dropped_no_shared_member: Cell<u64>,
    /// Shared-group deliveries dropped after waiting `broker.share.expires_after`.
    pub dropped_share_expired: Cell<u64>,
    /// Deliveries owed to sessions that outlive their connection lost because the
    /// broadcast log's provider was full (B-472, B-473).
    pub dropped_storage_full: Cell<u64>,
    /// Shared-group deliveries held in the broadcast log and given up for room
    /// (B-475).
    pub dropped_share_storage_full: Cell<u64>,
    /// Sessions asked to outlive their connection and accepted ending with it, the
    /// session store having no room (B-469).
    pub sessions_dropped_full: Cell<u64>,
    /// Storage operations that failed.
    pub storage_errors: Cell<u64>,
    /// Inbound QoS 2 publishes given up for want of their PUBREL.
    pub qos2_abandoned: Cell<u64>,
    /// Publishes refused, by the spec's label ("quota exceeded", "publish rate exceeded"...).
    pub publish_refused: RefCell<BTreeMap<&'static str, u64>>,
    /// Connections refused, by reason.
    pub connections_refused: RefCell<BTreeMap<&'static str, u64>>,
    /// Filters a SUBACK refused, by the code decided for them.
    pub subscriptions_refused: RefCell<BTreeMap<u8, u64>>,
    /// Each queue's counters and depth, by queue name.
    pub queues: RefCell<BTreeMap<String, QueueCounts>>,
    /// Each bridge's link state and drops, by bridge name (empty with no bridges).
    pub bridges: RefCell<BTreeMap<String, BridgeCounts>>,
    /// Offsets of each append channel that retention took before a consumer's
    /// position reached them (gaps G-11), by channel.
    pub consumer_gaps: RefCell<BTreeMap<String, u64>>,
}

/// Whom a reader's gap is counted against (`Metrics::gap`).
#[derive(Debug, Clone, Copy)]
pub enum Gaps<'a> {
    /// A client's session: `saguin_consumer_gap_records_total{channel}`.
    Consumer,
    /// A bridge's out rule, and that rule alone (B-384):
    /// `saguin_bridge_gap_records_total{bridge,filter}`.
    Rule {
        /// The bridge's name.
        bridge: &'a str,
        /// The rule's filter.
        filter: &'a str,
    },
}

/// One bridge's gauge and counters (gaps section 4: `saguin_bridge_connected{bridge}`,
/// `saguin_bridge_unstored_total{bridge,cause}`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BridgeCounts {
    /// Gauge: the link is up.
    pub connected: bool,
    /// Records let go at this hop, by cause.
    pub unstored: BTreeMap<&'static str, u64>,
    /// Offsets retention took before an out rule's position reached them, by the
    /// rule's filter (B-384).
    pub gaps: BTreeMap<String, u64>,
}

/// One queue's counters (RFC 0005 `saguin_queue_*`, gaps section 4) and depth gauges.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueCounts {
    /// Offers made.
    pub delivered: u64,
    /// Jobs resolved by `ack`.
    pub acknowledged: u64,
    /// Jobs handed back by `return`.
    pub returned: u64,
    /// Leases whose visibility deadline passed.
    pub timed_out: u64,
    /// Jobs dead-lettered `attempts_exhausted`.
    pub dead_lettered_attempts: u64,
    /// Jobs dead-lettered `expired`.
    pub dead_lettered_expired: u64,
    /// Retained publishes taken as work with the flag dropped.
    pub retain_ignored: u64,
    /// Gauge: jobs waiting (available or in their backoff gap).
    pub available: u64,
    /// Gauge: jobs out with a worker (delivering or leased).
    pub held: u64,
}

impl Metrics {
    /// Counts a storage operation that failed; a provider that is only full is a
    /// refusal the caller answers (0x97), not a failure.
    pub fn storage_failed(&self, error: &crate::storage::StorageError) {
        if !error.is_full() {
            self.storage_errors.set(self.storage_errors.get() + 1);
        }
    }

    /// Counts a refused connection under `label`.
    pub fn refuse_connection(&self, label: &'static str) {
        *self
            .connections_refused
            .borrow_mut()
            .entry(label)
            .or_default() += 1;
    }

    /// Counts a Will published: broadcast, or stored in its channel or the retained
    /// store (C-267).
    pub fn will_published(&self) {
        self.wills_published.set(self.wills_published.get() + 1);
    }

    /// Counts a filter refused with `code`.
    pub fn refuse_subscription(&self, code: u8) {
        *self
            .subscriptions_refused
            .borrow_mut()
            .entry(code)
            .or_default() += 1;
    }

    /// Counts a refused publish under `label`.
    pub fn refuse_publish(&self, label: &'static str) {
        *self.publish_refused.borrow_mut().entry(label).or_default() += 1;
    }

    /// Sets bridge `name`'s connected gauge.
    pub fn bridge_connected(&self, name: &str, connected: bool) {
        let mut bridges = self.bridges.borrow_mut();
        bridges.entry(name.to_owned()).or_default().connected = connected;
    }

    /// Counts a record bridge `name` let go, under `cause`.
    pub fn bridge_unstored(&self, name: &str, cause: &'static str) {
        let mut bridges = self.bridges.borrow_mut();
        *bridges
            .entry(name.to_owned())
            .or_default()
            .unstored
            .entry(cause)
            .or_default() += 1;
    }

    /// Counts `offsets` of `channel` that retention took before a reader's position
    /// reached them, against the reader: a client's session, or a bridge's out rule.
    pub fn gap(&self, reader: Gaps<'_>, channel: &str, offsets: u64) {
        let (mut map, key) = match reader {
            Gaps::Consumer => (self.consumer_gaps.borrow_mut(), channel),
            Gaps::Rule { bridge, filter } => {
                let bridges = self.bridges.borrow_mut();
                let counts = std::cell::RefMut::map(bridges, |b| {
                    &mut b.entry(bridge.to_owned()).or_default().gaps
                });
                (counts, filter)
            }
        };
        match map.get_mut(key) {
            Some(n) => *n += offsets,
            None => {
                map.insert(key.to_owned(), offsets);
            }
        }
    }

    /// Updates the counters of queue `name`.
    pub fn queue(&self, name: &str, f: impl FnOnce(&mut QueueCounts)) {
        let mut queues = self.queues.borrow_mut();
        match queues.get_mut(name) {
            Some(counts) => f(counts),
            None => f(queues.entry(name.to_owned()).or_default()),
        }
    }
}
