//! A session's deliveries not yet written, oldest first, counting those it may give
//! up at its bound.
//!
//! Past `limits.session_queue_bytes` the oldest broadcast at QoS 0 or 1 goes
//! (B-045, B-082, B-083); a channel's record and a QoS 2 delivery never do. When the
//! queue holds nothing it may give up, the count says so at once: without it every
//! new broadcast walked the whole queue before being refused (B-086), thousands of
//! entries per publish for each subscriber stuck that way.

use std::collections::VecDeque;
use std::ops::Deref;

use crate::codec::QoS;

use super::session::Delivery;

/// Whether `delivery` may be given up at the session's bound: a broadcast not at
/// QoS 2.
fn may_give_up(delivery: &Delivery) -> bool {
    !delivery.is_channel_value() && delivery.qos != QoS::ExactlyOnce
}

/// Deliveries in the order they are to be written. Reads go through `Deref` to the
/// `VecDeque`; every change goes through a method here, so the count stays true.
#[derive(Debug, Default)]
pub struct DeliveryQueue {
    deliveries: VecDeque<Delivery>,
    /// How many of `deliveries` [`may_give_up`] says yes to.
    may_give_up: usize,
    /// What those are charged (`Message::charge`), summed.
    may_give_up_bytes: usize,
}

impl Deref for DeliveryQueue {
    type Target = VecDeque<Delivery>;

    fn deref(&self) -> &VecDeque<Delivery> {
        &self.deliveries
    }
}

impl DeliveryQueue {
    fn counted(&mut self, delivery: &Delivery, added: bool) {
        if may_give_up(delivery) {
            let charge = delivery.charge();
            if added {
                self.may_give_up += 1;
                self.may_give_up_bytes += charge;
            } else {
                self.may_give_up -= 1;
                self.may_give_up_bytes -= charge;
            }
        }
    }

    /// Queues `delivery` last.
    pub fn push_back(&mut self, delivery: Delivery) {
        self.counted(&delivery, true);
        self.deliveries.push_back(delivery);
    }

    /// Puts `delivery` back first (one taken that could not be written yet).
    pub fn push_front(&mut self, delivery: Delivery) {
        self.counted(&delivery, true);
        self.deliveries.push_front(delivery);
    }

    /// Takes the first.
    pub fn pop_front(&mut self) -> Option<Delivery> {
        let delivery = self.deliveries.pop_front()?;
        self.counted(&delivery, false);
        Some(delivery)
    }

    /// Takes the one at `at`.
    pub fn remove(&mut self, at: usize) -> Option<Delivery> {
        let delivery = self.deliveries.remove(at)?;
        self.counted(&delivery, false);
        Some(delivery)
    }

    /// Keeps only those `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&Delivery) -> bool) {
        let (mut gone, mut gone_bytes) = (0, 0);
        self.deliveries.retain(|d| {
            let kept = keep(d);
            if !kept && may_give_up(d) {
                gone += 1;
                gone_bytes += d.charge();
            }
            kept
        });
        self.may_give_up -= gone;
        self.may_give_up_bytes -= gone_bytes;
    }

    /// Takes out those `take` says yes to, in order.
    pub fn take_where(&mut self, take: impl Fn(&Delivery) -> bool) -> VecDeque<Delivery> {
        let (taken, kept): (VecDeque<Delivery>, VecDeque<Delivery>) =
            std::mem::take(&mut self.deliveries)
                .into_iter()
                .partition(|d| take(d));
        self.deliveries = kept;
        for d in taken.iter().filter(|d| may_give_up(d)) {
            self.may_give_up -= 1;
            self.may_give_up_bytes -= d.charge();
        }
        taken
    }

    /// Takes every delivery out.
    pub fn clear(&mut self) {
        self.deliveries.clear();
        self.may_give_up = 0;
        self.may_give_up_bytes = 0;
    }

    /// Frees its room when empty and holding more than `keep` slots.
    pub fn release_room(&mut self, keep: usize) {
        if self.deliveries.is_empty() && self.deliveries.capacity() > keep {
            self.deliveries = VecDeque::new();
        }
    }

    /// What the deliveries it may give up at the bound are charged, summed: the room
    /// giving them all up would make.
    pub fn giveable_bytes(&self) -> usize {
        self.may_give_up_bytes
    }

    /// Where the oldest delivery that may be given up at the bound is, if any is.
    pub fn oldest_to_give_up(&self) -> Option<usize> {
        if self.may_give_up == 0 {
            return None;
        }
        self.deliveries.iter().position(may_give_up)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::broker::session::Message;
    use crate::codec::Properties;

    fn delivery(qos: QoS, channel_record: bool) -> Delivery {
        Delivery {
            message: Arc::new(Message {
                topic: Arc::from("t"),
                payload: vec![0u8; 10].into(),
                qos,
                retain: false,
                properties: Properties::default(),
                publisher: Arc::from("p"),
                expires_at: None,
            }),
            qos,
            retain: false,
            identifiers: Box::default(),
            record: channel_record.then_some((Some(0), 1)),
            held: None,
            resent: false,
            untracked: crate::broker::session::Untracked::No,
        }
    }

    /// The count and the bytes are what a walk gives, after every kind of change.
    fn checked(q: &DeliveryQueue) -> usize {
        assert_eq!(q.may_give_up, q.iter().filter(|d| may_give_up(d)).count());
        let bytes: usize = (q.iter().filter(|d| may_give_up(d)))
            .map(|d| d.charge())
            .sum();
        assert_eq!(q.giveable_bytes(), bytes);
        q.may_give_up
    }

    #[test]
    fn what_may_be_given_up_is_counted_through_every_change() {
        let mut q = DeliveryQueue::default();
        q.push_back(delivery(QoS::ExactlyOnce, false));
        q.push_back(delivery(QoS::AtLeastOnce, true));
        assert_eq!((checked(&q), q.oldest_to_give_up()), (0, None));
        q.push_back(delivery(QoS::AtMostOnce, false));
        q.push_back(delivery(QoS::AtLeastOnce, false));
        assert_eq!((checked(&q), q.oldest_to_give_up()), (2, Some(2)));
        let first = q.pop_front().expect("queued");
        q.push_front(first);
        assert!(q.remove(2).is_some());
        assert_eq!((checked(&q), q.oldest_to_give_up()), (1, Some(2)));
        q.push_back(delivery(QoS::AtMostOnce, false));
        q.retain(|d| d.qos != QoS::AtLeastOnce);
        assert_eq!((checked(&q), q.len()), (1, 2));
        let taken = q.take_where(|d| d.qos == QoS::AtMostOnce);
        assert_eq!(
            (taken.len(), checked(&q), q.oldest_to_give_up()),
            (1, 0, None)
        );
        q.push_back(delivery(QoS::AtMostOnce, false));
        q.clear();
        assert_eq!(checked(&q), 0);
    }
}
