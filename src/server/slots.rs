//! Connection slots and the overflow budget (RFC 0002 "limits.connect_timeout,
//! connection slots and the overflow budget", B-047..B-056).
//!
//! A socket holds one of `max_connections` slots from the moment it is accepted until
//! the broker decides the connection ends. When every slot is taken, up to
//! `min(max_connections, 32)` sockets hold a place in the overflow budget: each waits
//! briefly for a slot, first come first served, and one whose wait ends empty-handed is
//! told Server busy. A socket that finds the budget full too is closed at once.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

/// How a socket just accepted is let in.
pub(crate) enum Admission {
    /// A slot was free: serve it.
    Slot(Slot),
    /// Every slot is taken: it holds an overflow place and waits for one.
    Wait(Place, smol::channel::Receiver<Slot>),
    /// The overflow budget is full as well: close it with nothing read or written.
    Full,
}

/// The slots and the overflow budget of one broker.
#[derive(Debug)]
pub(crate) struct Slots {
    max: usize,
    budget: usize,
    taken: Cell<usize>,
    places: Cell<usize>,
    /// Waiting sockets, longest first: `(place id, where to hand a slot)`.
    waiting: RefCell<VecDeque<(u64, smol::channel::Sender<Slot>)>>,
    next_place: Cell<u64>,
}

impl Slots {
    /// `max_connections` slots and an overflow budget of `min(max_connections, 32)`.
    pub(crate) fn new(max_connections: usize) -> Rc<Slots> {
        Rc::new(Slots {
            max: max_connections,
            budget: max_connections.min(32),
            taken: Cell::new(0),
            places: Cell::new(0),
            waiting: RefCell::new(VecDeque::new()),
            next_place: Cell::new(0),
        })
    }

    /// Admits a socket just accepted. A slot goes to it only when nobody waits ahead of
    /// it (B-050).
    pub(crate) fn admit(self: &Rc<Slots>) -> Admission {
        if self.taken.get() < self.max && self.waiting.borrow().is_empty() {
            self.taken.set(self.taken.get() + 1);
            return Admission::Slot(Slot(self.clone()));
        }
        if self.places.get() >= self.budget {
            return Admission::Full;
        }
        self.places.set(self.places.get() + 1);
        let id = self.next_place.get();
        self.next_place.set(id + 1);
        let (hand, receive) = smol::channel::bounded(1);
        self.waiting.borrow_mut().push_back((id, hand));
        Admission::Wait(
            Place {
                slots: self.clone(),
                id,
            },
            receive,
        )
    }

    /// Ends every overflow wait at once: a stopping broker admits nothing (B-055).
    pub(crate) fn close(&self) {
        self.waiting.borrow_mut().clear();
    }

    /// Slots held now.
    pub(crate) fn taken(&self) -> usize {
        self.taken.get()
    }

    /// Gives a freed slot to the socket that has waited longest, or frees it.
    fn release(self: &Rc<Slots>) {
        let next = self.waiting.borrow_mut().pop_front();
        match next {
            None => self.taken.set(self.taken.get().saturating_sub(1)),
            // The slot passes on without ever being free. If that waiter has just given
            // up, the slot it refuses is dropped, which brings it back here for the next.
            Some((_, hand)) => drop(hand.try_send(Slot(self.clone()))),
        }
    }
}

/// One of the `max_connections` slots, released when dropped.
#[derive(Debug)]
pub(crate) struct Slot(Rc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A place in the overflow budget, given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    slots: Rc<Slots>,
    id: u64,
}

impl Place {
    /// Stops waiting for a slot; the place itself is kept until dropped (B-051).
    pub(crate) fn stop_waiting(&self) {
        self.slots
            .waiting
            .borrow_mut()
            .retain(|(id, _)| *id != self.id);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.stop_waiting();
        self.slots.places.set(self.slots.places.get() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(admission: Admission) -> Slot {
        match admission {
            Admission::Slot(slot) => slot,
            _ => panic!("expected a slot"),
        }
    }

    fn wait(admission: Admission) -> (Place, smol::channel::Receiver<Slot>) {
        match admission {
            Admission::Wait(place, receive) => (place, receive),
            _ => panic!("expected a wait"),
        }
    }

    #[test]
    fn slots_then_budget_then_full() {
        let slots = Slots::new(2);
        let a = slot(slots.admit());
        let _b = slot(slots.admit());
        let (_p1, r1) = wait(slots.admit());
        let (_p2, r2) = wait(slots.admit());
        assert!(
            matches!(slots.admit(), Admission::Full),
            "budget min(2, 32)"
        );
        // A freed slot goes to the longest waiter, never back to the pool (B-050).
        drop(a);
        assert_eq!(slots.taken(), 2);
        let handed = r1.try_recv().expect("the first waiter gets the slot");
        assert!(r2.try_recv().is_err());
        drop(handed);
        let _second = r2.try_recv().expect("then the second");
        assert_eq!(slots.taken(), 2);
    }

    #[test]
    fn a_waiter_that_gave_up_is_skipped() {
        let slots = Slots::new(2);
        let a = slot(slots.admit());
        let _b = slot(slots.admit());
        let (p1, r1) = wait(slots.admit());
        let (_p2, r2) = wait(slots.admit());
        drop(r1);
        drop(a);
        let _c = r2.try_recv().expect("the slot skips the waiter gone");
        drop(p1);
        let (p3, _r3) = wait(slots.admit());
        p3.stop_waiting();
        assert_eq!(slots.waiting.borrow().len(), 0);
    }

    #[test]
    fn slots_come_back_when_nobody_waits() {
        let slots = Slots::new(1);
        let a = slot(slots.admit());
        let (place, _r) = wait(slots.admit());
        drop(place);
        drop(a);
        assert_eq!(slots.taken(), 0);
        let _again = slot(slots.admit());
    }
}
