//! The keep-alive watch (MQTT-3.1.2-24): a client silent for one and a half times
//! its Keep Alive is disconnected.
//!
//! One ticker watches every connection, as mosquitto's main loop does, rather than a
//! timer per connection: a timer is polled on every turn of its connection's loop
//! and walked by the reactor on every wake-up, which under callgrind cost a QoS 1
//! fan-out delivery about 560 instructions (BENCHMARKS.md). A silent client is told
//! between its grace and one tick later.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::broker::Waiter;

/// How often the ticker looks: how late past its grace a silent client may be told.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// One connection's watch, shared between its task and the ticker.
pub(crate) struct KeepAlive {
    /// One and a half times the negotiated Keep Alive.
    grace: Duration,
    heard_at: Cell<Instant>,
    expired: Cell<bool>,
    waiter: Waiter,
}

impl KeepAlive {
    /// The client sent something: its silence starts again now.
    pub(crate) fn heard(&self) {
        self.heard_at.set(Instant::now());
    }

    /// Ready once the ticker has found the client silent for the whole grace.
    pub(crate) fn poll_expired(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.expired.get() {
            return Poll::Ready(());
        }
        self.waiter.wait(cx);
        Poll::Pending
    }
}

/// Every connection's watch, weakly: a connection that ends takes its watch with it,
/// and the ticker forgets it at its next look. Bounded by the connections open and
/// those accepted within one tick.
#[derive(Default)]
pub(crate) struct Watches(RefCell<Vec<Weak<KeepAlive>>>);

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("watched", &self.0.borrow().len())
            .finish()
    }
}

impl Watches {
    /// A watch over a client that negotiated `grace`, heard from now.
    pub(crate) fn watch(&self, grace: Duration) -> Rc<KeepAlive> {
        let watch = Rc::new(KeepAlive {
            grace,
            heard_at: Cell::new(Instant::now()),
            expired: Cell::new(false),
            waiter: Waiter::default(),
        });
        self.0.borrow_mut().push(Rc::downgrade(&watch));
        watch
    }

    /// Wakes every connection whose client has been silent past its grace at `now`,
    /// and forgets the watches of connections that ended.
    pub(crate) fn look(&self, now: Instant) {
        self.0.borrow_mut().retain(|watch| {
            let Some(watch) = watch.upgrade() else {
                return false;
            };
            if !watch.expired.get() && now >= watch.heard_at.get() + watch.grace {
                watch.expired.set(true);
                watch.waiter.wake();
            }
            true
        });
    }

    /// Looks every [`TICK`], for as long as the broker serves.
    pub(crate) async fn tick(&self) {
        loop {
            smol::Timer::after(TICK).await;
            self.look(Instant::now());
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_heard_pushes_the_expiry_back() {
        let watches = Watches::default();
        let grace = Duration::from_secs(3);
        let watch = watches.watch(grace);
        let start = watch.heard_at.get();
        watches.look(start + Duration::from_secs(2));
        assert!(!watch.expired.get());
        watch.heard_at.set(start + Duration::from_secs(2));
        watches.look(start + Duration::from_secs(4));
        assert!(!watch.expired.get(), "heard 2 s ago, the grace is 3 s");
        watches.look(start + Duration::from_secs(5));
        assert!(watch.expired.get());
        smol::block_on(std::future::poll_fn(|cx| watch.poll_expired(cx)));
    }

    #[test]
    fn a_silent_client_is_found_by_the_ticker_after_its_grace() {
        let watches = Rc::new(Watches::default());
        let grace = Duration::from_millis(300);
        let started = Instant::now();
        let watch = watches.watch(grace);
        let ex = smol::LocalExecutor::new();
        let ticker = ex.spawn({
            let watches = watches.clone();
            async move { watches.tick().await }
        });
        smol::block_on(ex.run(std::future::poll_fn(|cx| watch.poll_expired(cx))));
        drop(ticker);
        let waited = started.elapsed();
        // A tick late at most on a quiet machine; the bound leaves room for a loaded
        // or emulated one (the ARM run under qemu-user).
        assert!(
            waited >= grace && waited <= grace + TICK + Duration::from_secs(2),
            "{waited:?}"
        );
    }

    #[test]
    fn an_ended_connection_is_forgotten_at_the_next_look() {
        let watches = Watches::default();
        let kept = watches.watch(Duration::from_secs(60));
        drop(watches.watch(Duration::from_secs(60)));
        assert_eq!(watches.len(), 2);
        watches.look(Instant::now());
        assert_eq!(watches.len(), 1);
        drop(kept);
    }
}
