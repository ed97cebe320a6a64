//! The thin handle the broker keeps to a connection: wake it, or tell it to end.

use std::cell::Cell;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Context, Poll};

use super::Waiter;

/// Shared between a connection task and the session it holds. The broker never
/// writes to a socket; it queues deliveries on the session and wakes the connection.
/// A wake-up is a flag and the waiting task, in the same allocation as the link.
#[derive(Debug)]
pub struct ConnLink {
    /// Unique per connection, so a session can tell which connection holds it.
    pub id: u64,
    kick: Cell<Option<u8>>,
    pending: Cell<bool>,
    waiter: Waiter,
}

/// The connection's end of its link: waits for a wake-up.
#[derive(Debug)]
pub struct Woken(Rc<ConnLink>);

impl Woken {
    /// Waits until the link is woken, consuming the wake-up. Wake-ups while nobody
    /// waits are one wake-up, which is all a wake-up says.
    pub async fn recv(&self) {
        poll_fn(|cx| self.poll_recv(cx)).await;
    }

    /// [`Woken::recv`] as a poll.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.pending.replace(false) {
            return Poll::Ready(());
        }
        self.0.waiter.wait(cx);
        Poll::Pending
    }
}

impl Drop for Woken {
    /// The waker goes with the task: a session keeping the link keeps no ended task.
    fn drop(&mut self) {
        self.0.waiter.forget();
    }
}

impl ConnLink {
    /// A link and the end its connection task waits on.
    pub fn new(id: u64) -> (Rc<ConnLink>, Woken) {
        let link = Rc::new(ConnLink {
            id,
            kick: Cell::new(None),
            pending: Cell::new(false),
            waiter: Waiter::default(),
        });
        (link.clone(), Woken(link))
    }

    /// Wakes the connection to write what its session has queued.
    pub fn wake(&self) {
        self.pending.set(true);
        self.waiter.wake();
    }

    /// Tells the connection to end with `reason` (a DISCONNECT reason code).
    pub fn kick(&self, reason: u8) {
        self.kick.set(Some(reason));
        self.wake();
    }

    /// The reason the connection was told to end with, if it was.
    pub fn kicked(&self) -> Option<u8> {
        self.kick.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_ups_while_nobody_waits_are_one_wake_up() {
        let (link, woken) = ConnLink::new(1);
        link.wake();
        link.wake();
        futures_lite::future::block_on(woken.recv());
        let again = futures_lite::future::block_on(futures_lite::future::poll_once(woken.recv()));
        assert_eq!(again, None, "the second wake-up was the first one");
        link.kick(0x8E);
        futures_lite::future::block_on(woken.recv());
        assert_eq!(link.kicked(), Some(0x8E));
    }
}
