//! The keep-alive watch (MQTT-3.1.2-24): a client silent for one and a half times
//! its Keep Alive is disconnected.
//!
//! One ticker watches every connection, as mosquitto's main loop does, rather than a
//! timer per connection: a timer is polled on every turn of its connection's loop
//! and walked by the reactor on every wake-up, which under callgrind cost a QoS 1
//! fan-out delivery about 560 instructions (BENCHMARKS.md). The ticker sleeps until
//! the first grace that could run out, at most once a [`TICK`], so a silent client is
//! told between its grace and one tick later, and a broker whose clients all talk
//! does not wake for them (a gateway's idle CPU is its power budget).

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::broker::Waiter;

/// The least time between two looks of the ticker: how late past its grace a silent
/// client may be told.
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
    /// The client sent something: its silence starts again now. A connection busy
    /// past the grace (a slow store, a full socket) reads what its client sent in the
    /// meantime before it looks at the watch, so a client found silent is let off
    /// here if it was heard after all.
    pub(crate) fn heard(&self) {
        self.heard_at.set(Instant::now());
        self.expired.set(false);
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
/// and the ticker forgets it at its next look, or [`Watches::watch`] when the list is
/// full. Bounded by twice the connections open at once.
#[derive(Default)]
pub(crate) struct Watches {
    watched: RefCell<Vec<Weak<KeepAlive>>>,
    /// When the ticker looks next; `None` while it sleeps until something is watched.
    /// Only a look, or a watch whose grace runs out sooner, sets it.
    next_look: Cell<Option<Instant>>,
    ticker: Waiter,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("watched", &self.watched.borrow().len())
            .field("next_look", &self.next_look.get())
            .finish()
    }
}

impl Watches {
    /// A watch over a client that negotiated `grace`, heard from now.
    pub(crate) fn watch(&self, grace: Duration) -> Rc<KeepAlive> {
        let now = Instant::now();
        let watch = Rc::new(KeepAlive {
            grace,
            heard_at: Cell::new(now),
            expired: Cell::new(false),
            waiter: Waiter::default(),
        });
        let mut watched = self.watched.borrow_mut();
        if watched.len() == watched.capacity() {
            // Between two looks minutes apart, connections that came and went would
            // otherwise pile up here. Growing when half is still live keeps this
            // amortised O(1).
            watched.retain(|w| w.strong_count() > 0);
            let live = watched.len();
            if live >= watched.capacity() / 2 {
                watched.reserve(live.max(4));
            }
        }
        watched.push(Rc::downgrade(&watch));
        let runs_out = now + grace;
        if self.next_look.get().is_none_or(|at| runs_out < at) {
            self.next_look.set(Some(runs_out));
            self.ticker.wake();
        }
        watch
    }

    /// Wakes every connection whose client has been silent past its grace at `now`,
    /// forgets the watches of connections that ended, and says when the first grace
    /// still running runs out, if any runs.
    pub(crate) fn look(&self, now: Instant) -> Option<Instant> {
        let mut first: Option<Instant> = None;
        self.watched.borrow_mut().retain(|watch| {
            let Some(watch) = watch.upgrade() else {
                return false;
            };
            let mut runs_out = watch.heard_at.get() + watch.grace;
            if now >= runs_out {
                if !watch.expired.replace(true) {
                    watch.waiter.wake();
                }
                // Its connection ends at its next turn, or was busy and hears its
                // client after all (`KeepAlive::heard`): looked at again a grace on.
                runs_out = now + watch.grace;
            }
            if first.is_none_or(|at| runs_out < at) {
                first = Some(runs_out);
            }
            true
        });
        first
    }

    /// Looks when the first grace could run out, a [`TICK`] after the last look at
    /// the soonest, for as long as the broker serves. A client heard since only moves
    /// its own end later, so a look that finds nobody silent is the only cost of it.
    pub(crate) async fn tick(&self) {
        let mut looked = Instant::now();
        loop {
            // A sooner watch only sets the timer again: its look waits for the timer.
            while !self.sleep_until_look(looked + TICK).await {}
            looked = Instant::now();
            self.next_look.set(self.look(looked));
        }
    }

    /// Sleeps until `next_look`, `not_before` at the soonest (true), or until a
    /// sooner watch moves `next_look` (false).
    async fn sleep_until_look(&self, not_before: Instant) -> bool {
        let planned = self.next_look.get();
        let timer = match planned {
            Some(at) => smol::Timer::at(at.max(not_before)),
            None => smol::Timer::never(),
        };
        let sooner = std::future::poll_fn(|cx| {
            if self.next_look.get() != planned {
                return Poll::Ready(false);
            }
            self.ticker.wait(cx);
            Poll::Pending
        });
        let looks = async {
            timer.await;
            true
        };
        smol::future::or(looks, sooner).await
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.watched.borrow().len()
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

    /// Whether `watch` is found silent within ten seconds: bounded, so a ticker that
    /// never looks fails a test rather than hanging it.
    async fn expires_within_ten_seconds(watch: &KeepAlive) -> bool {
        let expired = async {
            std::future::poll_fn(|cx| watch.poll_expired(cx)).await;
            true
        };
        let given_up = async {
            smol::Timer::after(Duration::from_secs(10)).await;
            false
        };
        smol::future::or(expired, given_up).await
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
        assert!(
            smol::block_on(ex.run(expires_within_ten_seconds(&watch))),
            "the ticker never found the client silent"
        );
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
    fn a_look_says_when_the_first_running_grace_runs_out() {
        let watches = Watches::default();
        let long = watches.watch(Duration::from_secs(90));
        let short = watches.watch(Duration::from_secs(3));
        let start = short.heard_at.get();
        assert_eq!(watches.look(start), Some(start + Duration::from_secs(3)));
        // Expired, the short one is looked at again a grace on, in case its
        // connection was busy and hears from its client after all.
        let later = start + Duration::from_secs(4);
        assert_eq!(watches.look(later), Some(later + Duration::from_secs(3)));
        assert!(short.expired.get());
        drop(short);
        assert_eq!(
            watches.look(later),
            Some(long.heard_at.get() + Duration::from_secs(90)),
            "its connection ended: the long one's end is next"
        );
        drop(long);
        assert_eq!(watches.look(later), None, "nothing runs: the ticker sleeps");
    }

    #[test]
    fn a_client_heard_after_it_was_found_silent_is_let_off() {
        // MQTT-3.1.2-24 asks for silence; a connection busy past the grace reads
        // what its client sent meanwhile before it looks at the watch.
        let watches = Watches::default();
        let watch = watches.watch(Duration::from_secs(3));
        let start = watch.heard_at.get();
        watches.look(start + Duration::from_secs(4));
        assert!(watch.expired.get());
        watch.heard();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(watch.poll_expired(&mut cx).is_pending());
        let heard = watch.heard_at.get();
        watches.look(heard + Duration::from_secs(2));
        assert!(!watch.expired.get());
        watches.look(heard + Duration::from_secs(3));
        assert!(watch.expired.get(), "silent for a whole grace since");
        assert!(watch.poll_expired(&mut cx).is_ready());
    }

    #[test]
    fn a_sooner_watch_wakes_a_ticker_asleep_on_a_later_one() {
        let watches = Rc::new(Watches::default());
        let ex = smol::LocalExecutor::new();
        let ticker = ex.spawn({
            let watches = watches.clone();
            async move { watches.tick().await }
        });
        let far = watches.watch(Duration::from_secs(600));
        let near = smol::block_on(ex.run(async {
            smol::Timer::after(Duration::from_millis(50)).await;
            assert_eq!(
                watches.next_look.get(),
                Some(far.heard_at.get() + Duration::from_secs(600))
            );
            let near = watches.watch(Duration::from_millis(300));
            assert!(
                expires_within_ten_seconds(&near).await,
                "the ticker slept on"
            );
            near
        }));
        drop(ticker);
        let waited = near.heard_at.get().elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited <= Duration::from_secs(3),
            "{waited:?}"
        );
        assert!(!far.expired.get());
    }

    #[test]
    fn connections_that_came_and_went_between_looks_do_not_pile_up() {
        let watches = Watches::default();
        let kept: Vec<_> = (0..10)
            .map(|_| watches.watch(Duration::from_secs(60)))
            .collect();
        for _ in 0..10_000 {
            drop(watches.watch(Duration::from_secs(60)));
        }
        assert!(
            watches.len() <= 64,
            "{} watches kept for 10 live",
            watches.len()
        );
        drop(kept);
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
