//! The one task waiting on something of the broker's thread, kept in a cell.

use std::cell::Cell;
use std::task::{Context, Waker};

/// The task to wake, at most one. Everything runs on the broker's one thread, so a
/// cell is the whole of it: a channel would cost every idle connection a few hundred
/// bytes more for nothing it uses.
#[derive(Default)]
pub struct Waiter(Cell<Option<Waker>>);

impl Waiter {
    /// Keeps the task `cx` polls for in place of the one kept. A kept waker that
    /// wakes the same task stays: no clone on every wait.
    pub fn wait(&self, cx: &Context<'_>) {
        let waker = match self.0.take() {
            Some(kept) if kept.will_wake(cx.waker()) => kept,
            _ => cx.waker().clone(),
        };
        self.0.set(Some(waker));
    }

    /// Wakes the task kept, if any, and forgets it.
    pub fn wake(&self) {
        if let Some(waker) = self.0.take() {
            waker.wake();
        }
    }

    /// Forgets the task kept without waking it.
    pub fn forget(&self) {
        self.0.take();
    }
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.0.take();
        let waiting = kept.is_some();
        self.0.set(kept);
        f.debug_struct("Waiter").field("waiting", &waiting).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn wakes_the_task_kept_once() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let woken = || count.0.load(Ordering::Relaxed);
        let waiter = Waiter::default();
        waiter.wait(&Context::from_waker(&waker));
        waiter.wait(&Context::from_waker(&waker));
        waiter.wake();
        waiter.wake();
        assert_eq!(woken(), 1, "one task kept, woken once");
        waiter.wait(&Context::from_waker(&waker));
        waiter.forget();
        waiter.wake();
        assert_eq!(woken(), 1, "a forgotten task is not woken");
    }
}
