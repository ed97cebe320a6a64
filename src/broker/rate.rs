//! Per-client publish budgets (`limits.publish_rate`, `limits.publish_bytes`): a token
//! bucket per client id, kept by the broker so a reconnect does not refill it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// One unit's bucket: refills at `rate` a second, holds at most one second's worth.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn refill(&mut self, rate: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.last = now;
    }
}

/// The budgets of every client that published recently.
#[derive(Debug, Default)]
pub struct PublishBudgets {
    /// Messages a second, if bounded.
    pub rate: Option<u32>,
    /// Bytes a second, if bounded.
    pub bytes: Option<u64>,
    buckets: HashMap<Arc<str>, (Bucket, Bucket)>,
}

impl PublishBudgets {
    /// Budgets at the broker-wide figures.
    pub fn new(rate: Option<u32>, bytes: Option<u64>) -> PublishBudgets {
        PublishBudgets {
            rate,
            bytes,
            buckets: HashMap::new(),
        }
    }

    /// Spends one message of `size` bytes for `client`; false when either budget is
    /// spent, in which case nothing is taken.
    pub fn spend(&mut self, client: &Arc<str>, size: usize, now: Instant) -> bool {
        if self.rate.is_none() && self.bytes.is_none() {
            return true;
        }
        let rate = self.rate.map_or(f64::INFINITY, f64::from);
        let bytes = self.bytes.map_or(f64::INFINITY, |b| b as f64);
        let full = |r: f64| Bucket {
            tokens: r,
            last: now,
        };
        let (messages, volume) = self
            .buckets
            .entry(client.clone())
            .or_insert_with(|| (full(rate), full(bytes)));
        messages.refill(rate, now);
        volume.refill(bytes, now);
        // A message larger than a whole second's bytes may go when the bucket is full,
        // or it could never be sent at all.
        let size = (size as f64).min(bytes);
        if messages.tokens < 1.0 || volume.tokens < size {
            return false;
        }
        messages.tokens -= 1.0;
        volume.tokens -= size;
        true
    }

    /// Forgets buckets that have refilled: they hold nothing a fresh one would not.
    pub fn prune(&mut self, now: Instant) {
        let rate = self.rate.map_or(f64::INFINITY, f64::from);
        let bytes = self.bytes.map_or(f64::INFINITY, |b| b as f64);
        self.buckets.retain(|_, (m, v)| {
            m.refill(rate, now);
            v.refill(bytes, now);
            m.tokens < rate || v.tokens < bytes
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_spent_budget_refuses_until_it_refills() {
        let mut b = PublishBudgets::new(Some(2), None);
        let c: Arc<str> = Arc::from("c");
        let t = Instant::now();
        assert!(b.spend(&c, 10, t));
        assert!(b.spend(&c, 10, t));
        assert!(!b.spend(&c, 10, t));
        assert!(b.spend(&c, 10, t + Duration::from_millis(600)));
    }

    #[test]
    fn bytes_are_bounded_separately_and_full_buckets_are_forgotten() {
        let mut b = PublishBudgets::new(None, Some(100));
        let c: Arc<str> = Arc::from("c");
        let t = Instant::now();
        assert!(b.spend(&c, 80, t));
        assert!(!b.spend(&c, 80, t));
        b.prune(t + Duration::from_secs(2));
        assert!(b.buckets.is_empty());
    }
}
