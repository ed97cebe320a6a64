//! A session's place in one channel (DESIGN-NOTES 6: a channel subscription is a
//! cursor). The connection reads windows from the provider at `next`, paced by the
//! session's room; the position is the lowest offset not yet settled.

use std::collections::BTreeSet;

use super::partition::Slice;
use crate::codec::SubscriptionOptions;

/// One of the session's subscriptions that touches the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSub {
    /// The filter as subscribed.
    pub filter: String,
    /// Its options.
    pub options: SubscriptionOptions,
    /// Its Subscription Identifier.
    pub identifier: Option<u32>,
    /// It asked to be told of deletions on latest channels (`saguin-deletions`).
    pub deletions: bool,
    /// The slice its SUBSCRIBE declared (`saguin-filter`): records outside it are
    /// stepped over like records its filter does not match (C-165, C-166, C-198).
    pub slice: Option<Slice>,
    /// The first offset the cursor's reading owes it: past 0 for a subscription to a
    /// latest channel that wanted no stored state (Retain Handling) and joined a
    /// cursor still reading that state, which is not its to be shown (C-235).
    pub from: u64,
}

/// A current-state pass over a latest channel for a subscription that joined after
/// its cursor had read past records it must be shown: what its filter
/// takes in `next..until` goes out once, RETAIN set, and never moves the position.
#[derive(Debug, Clone)]
pub struct Pass {
    /// The subscription that asked for the current state.
    pub sub: ChannelSub,
    /// The next offset to read.
    pub next: u64,
    /// Where the cursor itself takes over.
    pub until: u64,
}

/// A session's cursor on one channel.
#[derive(Debug, Clone)]
pub struct Cursor {
    /// The next offset to read.
    pub next: u64,
    /// The subscriptions reading through it.
    pub subs: Vec<ChannelSub>,
    /// Offsets queued or on the wire and not yet settled (PUBACK, PUBCOMP, or the write
    /// at QoS 0).
    pub unsettled: BTreeSet<u64>,
    /// The position last written to the provider.
    pub stored: Option<u64>,
    /// On a latest channel, offsets below this are the current-state pass, sent with
    /// RETAIN set.
    pub pass_until: u64,
    /// The last read found nothing new: wait for a wake-up before reading again.
    pub caught_up: bool,
    /// Wake-ups so far: a read that began before one cannot have seen what it was for.
    pub wakes: u64,
    /// Current-state passes still to read, oldest first: at most one per filter, so
    /// bounded by `limits.max_subscriptions`.
    pub passes: Vec<Pass>,
}

impl Cursor {
    /// A cursor starting at `next`.
    pub fn new(next: u64, pass_until: u64, stored: Option<u64>) -> Cursor {
        Cursor {
            next,
            subs: Vec::new(),
            unsettled: BTreeSet::new(),
            stored,
            pass_until,
            caught_up: false,
            wakes: 0,
            passes: Vec::new(),
        }
    }

    /// The position: the next offset owed to the consumer (G-11).
    pub fn position(&self) -> u64 {
        self.unsettled.first().copied().unwrap_or(self.next)
    }

    /// Whether the position moved since it was last stored.
    pub fn dirty(&self) -> bool {
        self.stored != Some(self.position())
    }

    /// Something new may be readable: read again.
    pub fn wake(&mut self) {
        self.caught_up = false;
        self.wakes = self.wakes.wrapping_add(1);
    }

    /// A read that began at `wakes_before` found nothing new: caught up, unless a
    /// wake-up came while it was reading, whose record the read may have missed.
    pub fn found_nothing(&mut self, wakes_before: u64) {
        self.caught_up = self.wakes == wakes_before;
    }

    /// Shows `sub` the current state in `..until` (a latest channel's records below
    /// where this cursor reads), replacing a pass its filter still had pending.
    pub fn add_pass(&mut self, sub: ChannelSub, until: u64) {
        self.passes.retain(|p| p.sub.filter != sub.filter);
        if until > 0 {
            self.passes.push(Pass {
                sub,
                next: 0,
                until,
            });
        }
    }

    /// Adds or replaces a subscription reading through this cursor.
    pub fn add(&mut self, sub: ChannelSub) {
        self.subs.retain(|s| s.filter != sub.filter);
        self.subs.push(sub);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_is_the_lowest_unsettled_offset() {
        let mut c = Cursor::new(10, 0, Some(10));
        assert!(!c.dirty());
        c.unsettled.extend([10, 11, 12]);
        c.next = 13;
        assert_eq!(c.position(), 10);
        c.unsettled.remove(&11);
        assert_eq!(
            c.position(),
            10,
            "an acknowledgement out of order moves nothing"
        );
        c.unsettled.remove(&10);
        assert_eq!(c.position(), 12);
        c.unsettled.clear();
        assert_eq!(c.position(), 13);
        assert!(c.dirty());
    }
}
