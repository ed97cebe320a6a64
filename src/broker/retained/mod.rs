//! The retained store for broadcast topics: one value per topic (B-426), held in
//! memory to answer every SUBSCRIBE and written through to [`durable`] before a
//! publish is acknowledged.
//!
//! A value dies at the earlier of its publisher's Message Expiry and
//! `broker.retained.retention_period`, counted from when it was stored (B-431, C-239):
//! the two clocks are checked on the broker's tick and again before any value is
//! served, so an expired value is never handed out (C-240). What a subscriber is told
//! is the publisher's countdown alone (C-241).
//!
//! Architecture invariant: there is no bound of the store's own. Its size is its
//! provider's `max_bytes`, refused 0x97 by the write-through before memory is touched
//! (B-432, C-220), so what memory holds is what the provider took.

pub mod durable;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use durable::{CHANNEL, Durable, Loaded, write_through};

use super::session::Message;
use super::topic;

/// One topic's value and when `retention_period` ends it.
#[derive(Debug)]
struct Held {
    message: Arc<Message>,
    /// When the operator's period runs out; `None` without a period.
    aged_at: Option<Instant>,
    /// The record it is in [`durable`], once written through.
    offset: Option<u64>,
}

impl Held {
    /// Whether neither clock has run out at `now`.
    fn alive(&self, now: Instant) -> bool {
        !self.message.expired(now) && self.aged_at.is_none_or(|at| at > now)
    }
}

/// Retained messages by topic.
#[derive(Debug)]
pub struct RetainedStore {
    values: HashMap<Arc<str>, Held>,
    /// `broker.retained.retention_period`.
    period: Option<Duration>,
    /// The records in [`durable`] of values that died, for the server to remove
    /// (C-239): the storage sweep knows the operator's period but not a publisher's
    /// expiry. At most one per value held, taken every housekeeping tick.
    dead: Vec<u64>,
}

impl RetainedStore {
    /// An empty store whose values live at most `period` after they were stored.
    pub fn new(period: Option<Duration>) -> RetainedStore {
        RetainedStore {
            values: HashMap::new(),
            period,
            dead: Vec::new(),
        }
    }

    /// Keeps `message`, stored at `now`, as its topic's value, or deletes the value for
    /// an empty payload.
    pub fn store(&mut self, message: &Arc<Message>, now: Instant) {
        if message.payload.is_empty() {
            self.values.remove(&message.topic);
            return;
        }
        let aged_at = self.period.and_then(|p| now.checked_add(p));
        self.keep(message.clone(), aged_at, None);
    }

    /// Notes that `message`, `topic`'s value, is the record at `offset` in
    /// [`durable`]; a value that replaced it since keeps its own.
    pub fn written_at(&mut self, message: &Arc<Message>, offset: u64) {
        if let Some(held) = self.values.get_mut(&message.topic)
            && Arc::ptr_eq(&held.message, message)
        {
            held.offset = Some(offset);
        }
    }

    /// Keeps a value read back from storage, the record at `offset` stored `age`
    /// before `now`. One already past either clock is not kept, and its record is left
    /// for [`RetainedStore::take_dead`]; returns whether it was kept.
    pub fn load(
        &mut self,
        message: Arc<Message>,
        offset: u64,
        age: Duration,
        now: Instant,
    ) -> bool {
        let left = self
            .period
            .map(|p| p.checked_sub(age).filter(|l| !l.is_zero()));
        if left == Some(None) || message.payload.is_empty() || message.expired(now) {
            self.dead.push(offset);
            return false;
        }
        let aged_at = left.flatten().and_then(|left| now.checked_add(left));
        self.keep(message, aged_at, Some(offset));
        true
    }

    fn keep(&mut self, message: Arc<Message>, aged_at: Option<Instant>, offset: Option<u64>) {
        let held = Held {
            message,
            aged_at,
            offset,
        };
        self.values.insert(held.message.topic.clone(), held);
    }

    /// The live values whose topics `filter` matches.
    pub fn matching(&mut self, filter: &str, now: Instant) -> Vec<Arc<Message>> {
        self.purge(now);
        self.values
            .values()
            .filter(|h| topic::matches(filter, &h.message.topic))
            .map(|h| h.message.clone())
            .collect()
    }

    /// Drops, silently (C-243), the values whose Message Expiry or retention period
    /// ran out, keeping their records for [`RetainedStore::take_dead`].
    pub fn purge(&mut self, now: Instant) {
        let dead = &mut self.dead;
        self.values.retain(|_, h| {
            let alive = h.alive(now);
            if !alive && let Some(offset) = h.offset {
                dead.push(offset);
            }
            alive
        });
    }

    /// The records of the values that died since the last call, to remove from
    /// [`durable`]. A record a newer value replaced there is gone already.
    pub fn take_dead(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.dead)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Properties, QoS};

    fn value(topic: &str, expiry: Option<Duration>, now: Instant) -> Arc<Message> {
        Arc::new(Message {
            topic: Arc::from(topic),
            payload: Arc::from(&b"v"[..]),
            qos: QoS::AtMostOnce,
            retain: true,
            properties: Properties::default(),
            publisher: Arc::from("p"),
            expires_at: expiry.map(|e| now + e),
        })
    }

    #[test]
    fn a_value_dies_at_the_retention_period_b431_c242() {
        let now = Instant::now();
        let mut store = RetainedStore::new(Some(Duration::from_secs(2)));
        store.store(&value("a", None, now), now);
        assert_eq!(store.matching("#", now + Duration::from_secs(1)).len(), 1);
        assert!(store.matching("#", now + Duration::from_secs(2)).is_empty());
    }

    #[test]
    fn the_earlier_clock_wins_c239() {
        let now = Instant::now();
        let mut store = RetainedStore::new(Some(Duration::from_secs(10)));
        store.store(&value("a", Some(Duration::from_secs(1)), now), now);
        assert!(store.matching("#", now + Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn a_loaded_value_keeps_the_age_it_had_b431() {
        let now = Instant::now();
        let mut store = RetainedStore::new(Some(Duration::from_secs(10)));
        assert!(!store.load(value("old", None, now), 1, Duration::from_secs(10), now));
        assert!(store.load(value("young", None, now), 2, Duration::from_secs(8), now));
        assert_eq!(store.matching("#", now + Duration::from_secs(1)).len(), 1);
        assert!(store.matching("#", now + Duration::from_secs(2)).is_empty());
        assert_eq!(
            store.take_dead(),
            [1, 2],
            "both records go from storage too"
        );
    }

    #[test]
    fn the_record_of_a_value_that_died_is_left_for_storage_to_remove_c239() {
        let now = Instant::now();
        let mut store = RetainedStore::new(None);
        let expiring = value("a", Some(Duration::from_secs(1)), now);
        store.store(&expiring, now);
        store.written_at(&expiring, 7);
        let lasting = value("b", None, now);
        store.store(&lasting, now);
        store.written_at(&lasting, 8);
        // Replaced before it was noted: the newer value keeps no record of the older.
        let stale = value("c", Some(Duration::from_secs(1)), now);
        store.store(&stale, now);
        store.store(&value("c", Some(Duration::from_secs(1)), now), now);
        store.written_at(&stale, 9);
        store.purge(now + Duration::from_millis(500));
        assert!(store.take_dead().is_empty(), "nothing has died yet");
        store.purge(now + Duration::from_secs(1));
        assert_eq!(store.take_dead(), [7], "c's value was never written at 9");
        assert!(store.take_dead().is_empty(), "taken once");
        assert_eq!(store.len(), 1);
    }
}
