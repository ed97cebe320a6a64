//! The executor of the serving thread: every connection, door, queue owner and bridge
//! task runs on it.
//!
//! smol's `LocalExecutor` is its multi-threaded `Executor` behind a `!Send` marker: a
//! global queue and per-runner queues with work stealing, a list of sleeping tickers
//! under a mutex and a notification flag, all paid on every wake-up and every task
//! run. On one thread none of it has anything to do, and it cost about 1,000 of the
//! 9,800 user-space instructions of a 1-to-1 message (BENCHMARKS.md, "The twentieth
//! session"). This is the same tasks - async-task's, the `Task` smol hands out - on
//! one first-in first-out queue.
//!
//! A task is in the queue at most once at a time (async-task schedules a woken task
//! only once until it runs), so the queue is bounded by the tasks alive, which the
//! connection slots bound.

use std::collections::VecDeque;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use async_task::{Builder, Runnable, Task};
use slab::Slab;

/// Tasks run before the thread looks at the reactor again, as smol's executor does: a
/// busy queue must not keep sockets that became ready from being read.
const BATCH: usize = 200;

/// Runs `!Send` tasks on the thread that calls [`LocalExecutor::run`].
pub struct LocalExecutor {
    state: Arc<State>,
    _one_thread: PhantomData<Rc<()>>,
}

#[derive(Default)]
struct State {
    queue: Mutex<RunQueue>,
    /// The wakers of the tasks not yet finished, woken when the executor is dropped so
    /// that each is dropped with it, as smol's executor does.
    active: Mutex<Slab<Waker>>,
}

#[derive(Default)]
struct RunQueue {
    ready: VecDeque<Runnable>,
    /// The runner's waker while it waits for a task: taken by the push that ends the
    /// wait. A push while the runner is running wakes nobody.
    waiting: Option<Waker>,
}

impl State {
    fn queue(&self) -> MutexGuard<'_, RunQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn active(&self) -> MutexGuard<'_, Slab<Waker>> {
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a woken task; called from any thread (storage writers wake tasks too).
    fn push(&self, runnable: Runnable) {
        let waiting = {
            let mut queue = self.queue();
            queue.ready.push_back(runnable);
            queue.waiting.take()
        };
        if let Some(runner) = waiting {
            runner.wake();
        }
    }
}

pin_project_lite::pin_project! {
    /// A future beside what its task keeps until it ends. A struct, not an async
    /// block: a block keeps the future it awaits twice, as the value it captured and
    /// as the value it polls (rust-lang/rust#62958), and a task is as large as its
    /// future for as long as it lives - an idle connection's, say.
    struct Holding<F, H> {
        #[pin]
        future: F,
        held: H,
    }
}

impl<F: Future, H> Future for Holding<F, H> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().future.poll(cx)
    }
}

/// Runs a closure when dropped.
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

impl LocalExecutor {
    pub fn new() -> Self {
        Self {
            state: Arc::default(),
            _one_thread: PhantomData,
        }
    }

    /// Spawns `future` as a task; it runs while [`LocalExecutor::run`] is awaited.
    pub fn spawn<T: 'static>(&self, future: impl Future<Output = T> + 'static) -> Task<T> {
        self.spawn_holding(future, ())
    }

    /// Spawns `future` as a task that keeps `held` until it ends: dropped when the
    /// future is done, or with the task when it never finishes.
    pub fn spawn_holding<T: 'static, H: 'static>(
        &self,
        future: impl Future<Output = T> + 'static,
        held: H,
    ) -> Task<T> {
        let mut active = self.state.active();
        let entry = active.vacant_entry();
        let key = entry.key();
        // Captured, not created on the first poll: a task dropped before it ever ran
        // leaves the set too.
        let done = OnDrop(Some({
            let state = self.state.clone();
            move || drop(state.active().try_remove(key))
        }));
        let future = Holding {
            future,
            held: (held, done),
        };
        let state = self.state.clone();
        let (runnable, task) = Builder::new()
            .propagate_panic(true)
            .spawn_local(move |()| future, move |runnable| state.push(runnable));
        entry.insert(runnable.waker());
        drop(active);
        runnable.schedule();
        task
    }

    /// Runs the spawned tasks until `future` completes.
    pub async fn run<T>(&self, future: impl Future<Output = T>) -> T {
        futures_lite::future::or(future, self.run_tasks()).await
    }

    /// Runs tasks as they are woken, forever; waits without a task to run.
    async fn run_tasks<T>(&self) -> T {
        std::future::poll_fn(|cx| {
            for _ in 0..BATCH {
                let next = {
                    let mut queue = self.state.queue();
                    let next = queue.ready.pop_front();
                    if next.is_none() {
                        match &mut queue.waiting {
                            Some(waker) => waker.clone_from(cx.waker()),
                            none => *none = Some(cx.waker().clone()),
                        }
                    }
                    next
                };
                match next {
                    Some(runnable) => {
                        runnable.run();
                    }
                    None => return Poll::Pending,
                }
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }
}

impl Default for LocalExecutor {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for LocalExecutor {
    /// Drops every task not finished: each is woken into the queue, then the queue is
    /// emptied, which drops each task's future on this thread.
    fn drop(&mut self) {
        let wakers: Vec<Waker> = self.state.active().drain().collect();
        for waker in wakers {
            waker.wake();
        }
        loop {
            // Not under the lock: dropping a future may wake another task.
            let next = self.state.queue().ready.pop_front();
            match next {
                Some(runnable) => drop(runnable),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::time::Duration;

    #[test]
    fn runs_tasks_in_the_order_they_were_woken() {
        let ex = LocalExecutor::new();
        let order = Rc::new(RefCell::new(Vec::new()));
        let tasks: Vec<_> = (0..3)
            .map(|i| {
                let order = order.clone();
                ex.spawn(async move {
                    order.borrow_mut().push(i);
                    futures_lite::future::yield_now().await;
                    order.borrow_mut().push(i + 10);
                })
            })
            .collect();
        smol::block_on(ex.run(async {
            for task in tasks {
                task.await;
            }
        }));
        // A task that yields goes behind the ones already woken.
        assert_eq!(*order.borrow(), [0, 1, 2, 10, 11, 12]);
    }

    #[test]
    fn a_task_woken_by_another_thread_runs() {
        let ex = LocalExecutor::new();
        let (tx, rx) = smol::channel::bounded(1);
        let task = ex.spawn(async move { rx.recv().await.ok() });
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            smol::block_on(tx.send(7)).ok();
        });
        let got = smol::block_on(ex.run(smol::future::or(task, async {
            smol::Timer::after(Duration::from_secs(10)).await;
            None
        })));
        assert_eq!(got, Some(7));
        sender.join().ok();
    }

    #[test]
    fn a_busy_queue_still_lets_timers_fire() {
        // A task that yields forever keeps the queue busy; the run still ends when its
        // future does, because the runner hands back to the reactor between batches.
        let ex = LocalExecutor::new();
        let spins = Rc::new(Cell::new(0u64));
        let spinning = spins.clone();
        ex.spawn(async move {
            loop {
                spinning.set(spinning.get() + 1);
                futures_lite::future::yield_now().await;
            }
        })
        .detach();
        smol::block_on(ex.run(smol::Timer::after(Duration::from_millis(30))));
        assert!(spins.get() > BATCH as u64);
    }

    #[test]
    fn dropping_the_executor_drops_the_tasks_left() {
        struct Dropped(Rc<Cell<u32>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.set(self.0.get() + 1);
            }
        }
        let dropped = Rc::new(Cell::new(0));
        let ex = LocalExecutor::new();
        let waiting = Dropped(dropped.clone());
        ex.spawn(async move {
            let _held = waiting;
            futures_lite::future::pending::<()>().await;
        })
        .detach();
        // The first task runs and waits.
        smol::block_on(ex.run(futures_lite::future::yield_now()));
        let never_ran = Dropped(dropped.clone());
        ex.spawn(async move {
            let _held = never_ran;
        })
        .detach();
        assert_eq!(dropped.get(), 0);
        drop(ex);
        assert_eq!(dropped.get(), 2);
    }

    #[test]
    fn a_finished_task_leaves_the_active_set() {
        let ex = LocalExecutor::new();
        let task = ex.spawn(async { 5 });
        assert_eq!(smol::block_on(ex.run(task)), 5);
        drop(ex.spawn(async {}));
        // A task dropped before it ran leaves when its queued run is taken.
        smol::block_on(ex.run(futures_lite::future::yield_now()));
        assert!(ex.state.active().is_empty());
    }
}
