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
    /// Shared-group messages no member could take.
    pub dropped_no_shared_member: Cell<u64>,
    /// Storage operations that failed.
    pub storage_errors: Cell<u64>,
    /// Publishes refused, by the spec's label ("quota exceeded", "publish rate exceeded"...).
    pub publish_refused: RefCell<BTreeMap<&'static str, u64>>,
    /// Connections refused, by reason.
    pub connections_refused: RefCell<BTreeMap<&'static str, u64>>,
    /// Filters a SUBACK refused, by the code decided for them.
    pub subscriptions_refused: RefCell<BTreeMap<u8, u64>>,
}

impl Metrics {
    /// Counts a refused connection under `label`.
    pub fn refuse_connection(&self, label: &'static str) {
        *self
            .connections_refused
            .borrow_mut()
            .entry(label)
            .or_default() += 1;
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
}
