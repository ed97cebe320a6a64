//! Per-client publish budgets (`limits.publish_rate`, `limits.publish_bytes`): a token
//! bucket per client id, kept by the broker so a reconnect does not refill it. The
//! figures are the broker-wide ones, or those the acl_file entry of the client's
//! user name carries (B-115): the budget follows the client id, the figures the
//! user name (B-116).

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
    buckets: HashMap<Arc<str>, Budget>,
}

/// One client's two buckets and the figures they refill at.
#[derive(Debug, Clone, Copy)]
struct Budget {
    messages: Bucket,
    volume: Bucket,
    rate: f64,
    bytes: f64,
}

fn per_second<T: Into<f64>>(figure: Option<T>) -> f64 {
    figure.map_or(f64::INFINITY, Into::into)
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
        self.spend_at(client, size, now, self.rate, self.bytes)
    }

    /// [`PublishBudgets::spend`] at these figures rather than the broker-wide ones.
    pub fn spend_at(
        &mut self,
        client: &Arc<str>,
        size: usize,
        now: Instant,
        rate: Option<u32>,
        bytes: Option<u64>,
    ) -> bool {
        if rate.is_none() && bytes.is_none() {
            return true;
        }
        let rate = per_second(rate);
        let bytes = per_second(bytes.map(|b| b as f64));
        let full = |r: f64| Bucket {
            tokens: r,
            last: now,
        };
        let budget = self
            .buckets
            .entry(client.clone())
            .or_insert_with(|| Budget {
                messages: full(rate),
                volume: full(bytes),
                rate,
                bytes,
            });
        // New figures (a re-read acl_file, another user on this id) apply from now.
        budget.rate = rate;
        budget.bytes = bytes;
        let Budget {
            messages, volume, ..
        } = budget;
        messages.refill(rate, now);
        volume.refill(bytes, now);
        // A message larger than a whole second's bytes may go when the bucket is full,
        // or it could never be sent at all; it spends the bucket into deficit, so
        // the rate holds over time (B-118).
        let size = size as f64;
        if messages.tokens < 1.0 || volume.tokens < size.min(bytes) {
            return false;
        }
        messages.tokens -= 1.0;
        volume.tokens -= size;
        true
    }

    /// Forgets buckets that have refilled: they hold nothing a fresh one would not.
    pub fn prune(&mut self, now: Instant) {
        self.buckets.retain(|_, b| {
            b.messages.refill(b.rate, now);
            b.volume.refill(b.bytes, now);
            b.messages.tokens < b.rate || b.volume.tokens < b.bytes
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
    fn a_message_larger_than_a_seconds_bytes_goes_and_leaves_a_deficit_b118() {
        let mut b = PublishBudgets::new(None, Some(1000));
        let c: Arc<str> = Arc::from("c");
        let t = Instant::now();
        assert!(b.spend(&c, 10_000, t), "admitted on a full bucket");
        assert!(
            !b.spend(&c, 10, t + Duration::from_secs(1)),
            "9 s in deficit"
        );
        assert!(!b.spend(&c, 10, t + Duration::from_secs(8)));
        assert!(b.spend(&c, 10, t + Duration::from_millis(9100)));
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
