//! The retained store for broadcast topics: one value per topic, bounded in bytes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::session::Message;
use super::topic;

/// Retained messages by topic.
#[derive(Debug)]
pub struct RetainedStore {
    values: HashMap<Arc<str>, Arc<Message>>,
    bytes: usize,
    max_bytes: usize,
}

impl RetainedStore {
    /// An empty store holding at most `max_bytes`.
    pub fn new(max_bytes: usize) -> RetainedStore {
        RetainedStore {
            values: HashMap::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// Keeps `message` as its topic's value, or deletes the value for an empty payload.
    /// Returns false, keeping nothing, when the store has no room.
    pub fn store(&mut self, message: &Arc<Message>) -> bool {
        let old = self.values.get(&message.topic).map_or(0, |m| m.charge());
        if message.payload.is_empty() {
            self.values.remove(&message.topic);
            self.bytes -= old;
            return true;
        }
        let new = message.charge();
        if self.bytes - old + new > self.max_bytes {
            return false;
        }
        self.bytes = self.bytes - old + new;
        self.values.insert(message.topic.clone(), message.clone());
        true
    }

    /// The unexpired values whose topics `filter` matches.
    pub fn matching(&mut self, filter: &str, now: Instant) -> Vec<Arc<Message>> {
        self.purge_expired(now);
        self.values
            .values()
            .filter(|m| topic::matches(filter, &m.topic))
            .cloned()
            .collect()
    }

    /// Drops values whose Message Expiry Interval ran out.
    pub fn purge_expired(&mut self, now: Instant) {
        let before = self.values.len();
        if self.values.values().any(|m| m.expired(now)) {
            self.values.retain(|_, m| !m.expired(now));
            self.bytes = self.values.values().map(|m| m.charge()).sum();
        }
        debug_assert!(self.values.len() <= before);
    }

    /// How many values are held.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}
