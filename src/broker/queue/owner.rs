//! The task that owns one queue (DESIGN-NOTES 7): its jobs' lease state, its index of
//! workers, its offers, and every write to its jobs' storage.
//!
//! It runs on the broker's executor and borrows the broker only for one step at a time
//! (choosing a worker, queueing an offer, looking at a worker's session), never across
//! an await. Storage writes are awaited here, so no connection ever waits on them.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Why an answer names no job: the job it named is settled already, by another
/// worker or by its retries running out (logged at warn, B-026).
const JOB_GONE: &str = "names a job that is resolved or dead-lettered";

use crate::server::executor::LocalExecutor;
use futures_lite::future;
use smol::Task;
use smol::channel::Receiver;

use super::lease::{DeadReason, Job, Lease, Moment, Outcome, Verdict, Worker};
use super::{DeliveryId, Event, FORM_PREFIX, Policy, TICK, dlq_topic};
use crate::broker::channels::ChannelId;
use crate::broker::records::{self, now_ms};
use crate::broker::session::{Delivery, Inflight, Session, Untracked};
use crate::codec::{ProtocolVersion, QoS};
use crate::server::Shared;
use crate::storage::{
    Attempts, DeadLetter, Provider, Record, RecordState, StorageError, WindowRequest,
};

/// Job bodies kept in memory ahead of their offers, at most.
const CACHE_RECORDS: usize = 256;
/// Bytes of job bodies kept in memory, at most.
const CACHE_BYTES: u64 = 4 << 20;
/// How often waiting jobs are checked against `job_expires_after` and their attempts.
const SWEEP_EVERY_MS: u64 = 1000;
/// Jobs the owner keeps in its table, at most. The rest wait in storage, where they
/// already are, and are read in offset order as the table drains: a queue of millions
/// of small jobs costs the owner this many entries, not millions.
const TABLE_JOBS: usize = 4096;

/// Jobs stored beyond the owner's table: every one from offset `from` on that the
/// table does not hold.
#[derive(Debug, Clone, Copy)]
struct Backlog {
    from: u64,
    /// How many, for the depth gauge.
    jobs: u64,
}

/// Starts the owner of every queue. Each task ends once its mailbox is closed
/// ([`super::Queues::close`]) and every event already in it is applied, so a stopping
/// broker that awaits them loses no acknowledged answer.
pub fn spawn(executor: &LocalExecutor, shared: &Rc<Shared>) -> Vec<Task<()>> {
    let unstarted = shared.broker.borrow_mut().queues.take_unstarted();
    unstarted
        .into_iter()
        .map(|(id, mailbox, missed)| executor.spawn(run(shared.clone(), id, mailbox, missed)))
        .collect()
}

/// One queue's owner.
struct Owner {
    shared: Rc<Shared>,
    id: ChannelId,
    name: Arc<str>,
    provider: Arc<Provider>,
    policy: Policy,
    /// The dead-letter channel.
    dlq: Option<(ChannelId, Arc<str>)>,
    /// `$saguin/queue/<name>`, the key of a worker's subscription.
    form: String,
    /// `$saguin/queue/<name>/response`.
    response_topic: String,
    /// This boot's, so no Delivery ID outlives a restart (C-151).
    nonce: [u8; 8],
    epoch: u64,
    /// At most `TABLE_JOBS`; every job of the queue is here or in `backlog`.
    jobs: BTreeMap<u64, Job>,
    backlog: Option<Backlog>,
    bodies: BTreeMap<u64, Record>,
    body_bytes: u64,
    /// Workers in the order they subscribed; offers take turns over them.
    workers: Vec<Arc<str>>,
    turn: usize,
    /// The job each worker holds from this queue (one at most, C-061).
    held: HashMap<Arc<str>, u64>,
    /// When the waiting jobs were last swept, on `clock`.
    swept_at: u64,
    clock: LeaseClock,
}

/// The clock leases, backoff gaps and sweeps are measured on: milliseconds moving
/// with the monotonic clock from the wall clock's reading when the owner started. A
/// wall clock stepped while jobs are out - NTP on a gateway that booted without a
/// real-time clock - neither times out every lease at once nor holds one for the
/// length of the step (C-061, C-089). Expiry is asked of the wall clock, which the
/// records' timestamps are on (C-135).
#[derive(Debug)]
struct LeaseClock {
    wall_at_start_ms: u64,
    started: Instant,
}

impl LeaseClock {
    fn new() -> LeaseClock {
        LeaseClock {
            wall_at_start_ms: now_ms(),
            started: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.wall_at_start_ms.saturating_add(elapsed)
    }

    /// Moments as the wall clock reads them now (`wall_ms`): each on this clock as
    /// long ago as it is on this one, each stored by an earlier run as it is. This
    /// clock is read once, beside the wall clock, so a thread preempted while headers
    /// are written does not push every moment back by the pause.
    fn on_wall(&self, wall_ms: u64) -> impl Fn(Moment) -> u64 + use<> {
        let now_ms = self.now_ms();
        move |at| match at {
            Moment::Lease(at_ms) => wall_ms.saturating_sub(now_ms.saturating_sub(at_ms)),
            Moment::Wall(at_ms) => at_ms,
        }
    }
}

async fn run(
    shared: Rc<Shared>,
    id: ChannelId,
    mailbox: Receiver<Event>,
    missed: Rc<super::Missed>,
) {
    let Some(mut owner) = Owner::new(shared, id) else {
        return;
    };
    owner.load().await;
    let mut next_tick = Instant::now() + TICK;
    loop {
        // An empty queue sleeps until an event: its first one finds the tick overdue
        // and runs it before anything is offered, as a tick on time would have.
        let timer = if owner.idle() {
            smol::Timer::never()
        } else {
            smol::Timer::at(next_tick)
        };
        let got = future::or(async { Some(mailbox.recv().await) }, async {
            timer.await;
            None
        })
        .await;
        match got {
            Some(Err(_)) => return, // every sender is gone: the broker is stopping
            Some(Ok(event)) => owner.handle(event).await,
            None => {}
        }
        // Checked on every turn, so a mailbox that is never empty cannot starve it.
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + TICK;
            owner.drain(&mailbox).await;
            owner.tick().await;
        }
        // Events are applied before anything looks at the sessions, so a PUBACK the
        // connection has already settled is never mistaken for an offer not written.
        owner.drain(&mailbox).await;
        if let Some((from, jobs)) = missed.take() {
            owner.behind(from, jobs);
        }
        owner.refill().await;
        owner.offer().await;
        owner.gauge();
    }
}

impl Owner {
    fn new(shared: Rc<Shared>, id: ChannelId) -> Option<Owner> {
        let (name, provider, policy, dlq) = {
            let broker = shared.broker.borrow();
            let channel = broker.channels.get(id);
            let dlq_name: Arc<str> = Arc::from(format!("{}__dlq", channel.name));
            let dlq = broker
                .channels
                .by_name(&dlq_name)
                .map(|dlq_id| (dlq_id, dlq_name));
            let Some(policy) = channel.queue.clone() else {
                log::error!("queue {} has no settings; it offers nothing", channel.name);
                return None;
            };
            (channel.name.clone(), channel.provider.clone(), policy, dlq)
        };
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&uuid::Uuid::now_v7().as_bytes()[8..]);
        Some(Owner {
            form: format!("{FORM_PREFIX}{name}"),
            response_topic: format!("{FORM_PREFIX}{name}/response"),
            shared,
            id,
            name,
            provider,
            policy,
            dlq,
            nonce,
            epoch: 0,
            jobs: BTreeMap::new(),
            backlog: None,
            bodies: BTreeMap::new(),
            body_bytes: 0,
            workers: Vec::new(),
            turn: 0,
            held: HashMap::new(),
            swept_at: 0,
            clock: LeaseClock::new(),
        })
    }

    /// Reads the jobs the queue holds, as many as the table takes, counting the rest:
    /// after a restart nothing is in flight and every job is available at once, its
    /// attempts as stored (C-150, C-152, C-153).
    async fn load(&mut self) {
        self.count(|_| {}); // its counters exist from the start, at zero
        let mut from = 0;
        loop {
            let request = WindowRequest::new(from, 1024, CACHE_BYTES);
            let window = match self.provider.read_window(&self.name, request).await {
                Ok(window) => window,
                Err(e) => {
                    // What is left is the backlog's, read again on every turn until
                    // it can be: no job stored is left out of the queue (C-152).
                    log::error!(
                        "queue {}: cannot read its jobs from offset {from} on, tried again: {e}",
                        self.name
                    );
                    self.behind(from, 0);
                    return;
                }
            };
            let Some(last) = window.records.last() else {
                break;
            };
            from = last.offset + 1;
            for record in window.records {
                self.learn(record);
            }
        }
        let waiting = self.jobs.len() as u64 + self.backlog.map_or(0, |b| b.jobs);
        if waiting > 0 {
            log::info!("queue {}: {waiting} jobs waiting", self.name);
        }
    }

    /// Takes a stored job into the table if it has room and nothing waits ahead of it
    /// in storage; otherwise the job joins the backlog. Whether it was taken.
    fn take_in(&mut self, offset: u64, job: Job) -> bool {
        if self.jobs.contains_key(&offset) {
            return false;
        }
        match &mut self.backlog {
            Some(backlog) if offset >= backlog.from => {
                backlog.jobs += 1;
                false
            }
            _ if self.jobs.len() >= TABLE_JOBS => {
                self.behind(offset, 1);
                false
            }
            _ => {
                self.jobs.insert(offset, job);
                true
            }
        }
    }

    /// Notes `jobs` jobs from `from` on that wait in storage, not in the table.
    fn behind(&mut self, from: u64, jobs: u64) {
        let backlog = self.backlog.get_or_insert(Backlog { from, jobs: 0 });
        backlog.from = backlog.from.min(from);
        backlog.jobs += jobs;
    }

    /// Reads waiting jobs back from storage, in offset order, once the table has
    /// drained to half.
    async fn refill(&mut self) {
        let Some(backlog) = self.backlog else {
            return;
        };
        if self.jobs.len() >= TABLE_JOBS / 2 {
            return;
        }
        let room = TABLE_JOBS - self.jobs.len();
        let request = WindowRequest::new(backlog.from, room, CACHE_BYTES);
        let window = match self.provider.read_window(&self.name, request).await {
            Ok(window) => window,
            Err(e) => {
                log::error!("queue {}: cannot read its waiting jobs: {e}", self.name);
                self.shared.broker.borrow().metrics.storage_failed(&e);
                return;
            }
        };
        let Some(next) = window.records.last().map(|r| r.offset + 1) else {
            // Nothing stored from there on: the table holds every job again.
            self.backlog = None;
            return;
        };
        let mut taken = 0;
        for record in window.records {
            if let RecordState::Job { attempts, .. } = record.state
                && !self.jobs.contains_key(&record.offset)
            {
                let job = Self::stored_job(record.timestamp_ms, attempts);
                self.jobs.insert(record.offset, job);
                self.cache_body(record);
                taken += 1;
            }
        }
        // Jobs announced while the read was out are counted in `backlog` already.
        if let Some(backlog) = &mut self.backlog {
            backlog.from = backlog.from.max(next);
            backlog.jobs = backlog.jobs.saturating_sub(taken);
        }
    }

    /// Takes a stored job into the table, keeping its body if there is room.
    fn learn(&mut self, record: Record) {
        let RecordState::Job { attempts, .. } = record.state else {
            return;
        };
        let job = Self::stored_job(record.timestamp_ms, attempts);
        if !self.take_in(record.offset, job) {
            return;
        }
        self.cache_body(record);
    }

    /// A job as storage holds it: its attempts' times are an earlier run's.
    fn stored_job(timestamp_ms: u64, attempts: Attempts) -> Job {
        Job::new(timestamp_ms, attempts.retimed(Moment::Wall))
    }

    /// Keeps a job's body in memory ahead of its offer, if the cache has room.
    fn cache_body(&mut self, record: Record) {
        let size = record.size();
        if self.bodies.len() < CACHE_RECORDS && self.body_bytes + size <= CACHE_BYTES {
            self.body_bytes += size;
            self.bodies.insert(record.offset, record);
        }
    }

    async fn drain(&mut self, mailbox: &Receiver<Event>) {
        while let Ok(event) = mailbox.try_recv() {
            self.handle(event).await;
        }
    }

    async fn handle(&mut self, event: Event) {
        match event {
            Event::Stored(record) => self.learn(record),
            Event::Known {
                offset,
                timestamp_ms,
            } => {
                self.take_in(offset, Job::new(timestamp_ms, Attempts::default()));
            }
            Event::Subscribed(client) => {
                if !self.workers.contains(&client) {
                    self.workers.push(client);
                }
            }
            Event::Puback(worker, correlation) => self.on_puback(&worker, &correlation).await,
            // Nothing to apply: the offer pass that follows every batch of events finds
            // the worker's room (C-066).
            Event::Reopened(client) => {
                log::debug!("queue {}: {client}'s window reopened", self.name);
            }
            Event::Answer(worker, named, verdict) => {
                self.on_answer(&worker, named, verdict).await;
            }
            Event::Ended(worker) => {
                self.take_back(&worker, "its worker's connection ended")
                    .await;
            }
            Event::Withdrawn(worker) => {
                self.take_back(&worker, "its worker may no longer consume it")
                    .await;
            }
        }
    }

    /// The current job a Delivery ID names, or why there is none.
    ///
    /// `JOB_GONE` when the job it named is settled already.
    fn named(&self, delivery: DeliveryId) -> Result<(DeliveryId, u64), &'static str> {
        if delivery.nonce() != self.nonce {
            return Err("was not issued since the broker started");
        }
        let offset = delivery.offset();
        match self.jobs.get(&offset) {
            Some(_) => Ok((delivery, offset)),
            None => Err(JOB_GONE),
        }
    }

    async fn on_puback(&mut self, worker: &Worker, correlation: &[u8]) {
        let Some(Ok((delivery, offset))) = DeliveryId::parse(correlation).map(|d| self.named(d))
        else {
            return; // a stale offer's PUBACK: nothing to do
        };
        let Some(job) = self.jobs.get_mut(&offset) else {
            return;
        };
        if job.puback(worker, &delivery, &self.policy, self.clock.now_ms()) == Outcome::Counted {
            log::debug!(
                "queue {}: job {offset} leased to {}",
                self.name,
                worker.client
            );
            self.write_attempt(offset).await;
        }
    }

    async fn on_answer(
        &mut self,
        worker: &Worker,
        named: Result<DeliveryId, &'static str>,
        verdict: Option<Verdict>,
    ) {
        // A client answers at will: a line per answer is debug (B-022), but one for a
        // job that is gone - superseded, resolved by another worker or dead-lettered -
        // is the warning B-026 asks for.
        let ignore = |why: &str, level| {
            log::log!(
                level,
                "queue {}: a response from {} ignored: {why}",
                self.name,
                worker.client
            );
        };
        let (delivery, offset) = match named.and_then(|d| self.named(d)) {
            Ok(named) => named,
            Err(why) => {
                let level = match why {
                    JOB_GONE => log::Level::Warn,
                    _ => log::Level::Debug,
                };
                return ignore(&format!("its Correlation Data {why}"), level);
            }
        };
        let Some(verdict) = verdict else {
            return ignore("its payload is neither ack nor return", log::Level::Debug);
        };
        let now = self.clock.now_ms();
        let Some(job) = self.jobs.get_mut(&offset) else {
            return;
        };
        let before = job.clone();
        let outcome = job.answer(worker, &delivery, verdict, &self.policy, now);
        match outcome {
            // A superseded delivery's answer: a worker past its deadline (B-026).
            Outcome::Ignored => log::warn!(
                "queue {}: a response from {} ignored: it is not the current delivery of a job this session holds",
                self.name,
                worker.client
            ),
            Outcome::Resolve => match self.provider.resolve(&self.name, offset).await {
                Ok(()) | Err(StorageError::NoSuchRecord { .. }) => {
                    log::debug!(
                        "queue {}: job {offset} acknowledged by {}",
                        self.name,
                        worker.client
                    );
                    self.forget(offset);
                    self.count(|c| c.acknowledged += 1);
                }
                Err(e) => {
                    log::error!(
                        "queue {}: job {offset} acknowledged but not removed: {e}",
                        self.name
                    );
                    self.shared.broker.borrow().metrics.storage_failed(&e);
                    // As it was, so its PUBACK counts the attempt once (C-085, C-117).
                    if let Some(job) = self.jobs.get_mut(&offset) {
                        *job = before;
                    }
                }
            },
            _ => {
                if self.settle_outcome(offset, outcome, worker, before).await {
                    log::debug!(
                        "queue {}: job {offset} returned by {}",
                        self.name,
                        worker.client
                    );
                    self.count(|c| c.returned += 1);
                }
            }
        }
    }

    /// Every job the ended connection held comes back at once (C-090, gaps A-03).
    /// The job `worker` holds comes back, for `why`.
    async fn take_back(&mut self, worker: &Worker, why: &str) {
        // A worker holds one job from this queue at most: no need to look further.
        let Some(&offset) = self.held.get(&worker.client) else {
            return;
        };
        if self.jobs.get(&offset).and_then(Job::holder) == Some(worker) {
            self.release(offset, why).await;
        }
    }

    async fn release(&mut self, offset: u64, why: &str) {
        let Some(job) = self.jobs.get_mut(&offset) else {
            return;
        };
        let Some(worker) = job.holder().cloned() else {
            return;
        };
        let before = job.clone();
        let outcome = job.released(&self.policy, self.clock.now_ms());
        log::debug!(
            "queue {}: job {offset} back from {} ({why})",
            self.name,
            worker.client
        );
        self.settle_outcome(offset, outcome, &worker, before).await;
    }

    /// Writes what a take-back spent and frees the worker, or dead-letters a job out of
    /// attempts. `before` is the job as it was before the take-back: the move is tried
    /// first, and one that fails puts it back exactly - still held by its worker, the
    /// attempt neither counted in memory nor written - so a failure that was the
    /// broker's spends nothing (C-117). The take-back that comes next (the deadline, a
    /// timeout already due on the next tick) tries the move again. Whether the
    /// take-back took effect.
    async fn settle_outcome(
        &mut self,
        offset: u64,
        outcome: Outcome,
        worker: &Worker,
        before: Job,
    ) -> bool {
        let (counted, dead) = match outcome {
            Outcome::Counted => (true, false),
            Outcome::Available { counted } => (counted, false),
            Outcome::DeadLetter { counted } => (counted, true),
            Outcome::Ignored | Outcome::Moved | Outcome::Resolve => (false, false),
        };
        // Out of attempts, and perhaps out of time as well: then it goes as expired,
        // whatever its attempt count (C-135).
        let reason = self
            .jobs
            .get(&offset)
            .and_then(|job| self.due_out(job, now_ms()))
            .unwrap_or(DeadReason::AttemptsExhausted);
        if dead && !self.dead_letter(offset, reason).await {
            if let Some(job) = self.jobs.get_mut(&offset) {
                *job = before;
            }
            return false;
        }
        if self.held.get(&worker.client) == Some(&offset) {
            self.held.remove(&worker.client);
        }
        if counted && !dead {
            self.write_attempt(offset).await;
        }
        true
    }

    /// Stores a job's attempts as the table counted them, their times on the wall
    /// clock; never refused for room (C-112).
    async fn write_attempt(&mut self, offset: u64) {
        let Some(job) = self.jobs.get(&offset) else {
            return;
        };
        let attempts = job.attempts.retimed(self.clock.on_wall(now_ms()));
        let written = self
            .provider
            .store_attempts(&self.name, offset, attempts, 0);
        if let Err(e) = written.await {
            log::error!(
                "queue {}: the attempt count of job {offset} was not stored: {e}",
                self.name
            );
        }
    }

    /// Whether the tick has nothing to find: no job waits, is out with a worker, or is
    /// left in storage (a missed job arrives with a full mailbox, which wakes the
    /// owner). Workers that left are pruned by the tick its next event runs.
    fn idle(&self) -> bool {
        self.jobs.is_empty() && self.held.is_empty() && self.backlog.is_none()
    }

    /// The tick: offers never written go back unspent, deadlines that passed take their
    /// jobs back, workers that left are dropped, and waiting jobs are swept.
    async fn tick(&mut self) {
        let now = self.clock.now_ms();
        let unwritten: Vec<u64> = {
            let shared = self.shared.clone();
            let mut broker = shared.broker.borrow_mut();
            self.held
                .values()
                .filter_map(|offset| Some((*offset, self.jobs.get(offset)?)))
                .filter_map(|(offset, job)| match &job.lease {
                    Lease::Delivering { worker, delivery } => {
                        let carried = broker
                            .session_of(&worker.client, worker.link)
                            .is_some_and(|s| carries(s, self.id, offset, delivery));
                        (!carried).then_some(offset)
                    }
                    _ => None,
                })
                .collect()
        };
        for offset in unwritten {
            self.release(offset, "its PUBLISH was never written").await;
        }
        let due: Vec<u64> = self
            .held
            .values()
            .filter(|o| {
                self.jobs.get(o).is_some_and(
                    |j| matches!(j.lease, Lease::Leased { deadline_ms, .. } if deadline_ms <= now),
                )
            })
            .copied()
            .collect();
        for offset in due {
            let Some(job) = self.jobs.get_mut(&offset) else {
                continue;
            };
            let Some(worker) = job.holder().cloned() else {
                continue;
            };
            let before = job.clone();
            let outcome = job.timed_out(&self.policy, now);
            // One line per job: debug, never info (B-022, B-023).
            log::debug!(
                "queue {}: job {offset} timed out with {}",
                self.name,
                worker.client
            );
            if self.settle_outcome(offset, outcome, &worker, before).await {
                self.count(|c| c.timed_out += 1);
            }
        }
        self.prune_workers();
        if now.saturating_sub(self.swept_at) >= SWEEP_EVERY_MS {
            self.swept_at = now;
            self.sweep(now_ms()).await;
        }
    }

    /// Dead-letters waiting jobs that are out of time, or out of attempts (a restart,
    /// or a move that failed before). Jobs out with a worker are left alone (C-141).
    async fn sweep(&mut self, now: u64) {
        // The tick looks at held jobs through `held`; one it does not list would never
        // time out, so none may exist.
        let unlisted: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(o, j)| {
                j.holder()
                    .is_some_and(|w| self.held.get(&w.client) != Some(*o))
            })
            .map(|(o, _)| *o)
            .collect();
        for offset in unlisted {
            log::error!(
                "queue {}: job {offset} was held off the books; taking it back",
                self.name
            );
            self.release(offset, "its hold was not on the books").await;
        }
        let due: Vec<(u64, DeadReason)> = self
            .jobs
            .iter()
            .filter(|(_, j)| matches!(j.lease, Lease::Available { .. }))
            .filter_map(|(o, j)| self.due_out(j, now).map(|r| (*o, r)))
            .collect();
        for (offset, reason) in due {
            self.dead_letter(offset, reason).await;
        }
    }

    /// Whether a waiting job must go to the dead-letter channel rather than out.
    fn due_out(&self, job: &Job, now: u64) -> Option<DeadReason> {
        if job.expired(&self.policy, now) {
            Some(DeadReason::Expired)
        } else if job.attempts.count >= self.policy.max_attempts {
            Some(DeadReason::AttemptsExhausted)
        } else {
            None
        }
    }

    fn prune_workers(&mut self) {
        let shared = self.shared.clone();
        let mut broker = shared.broker.borrow_mut();
        let form = &self.form;
        self.workers.retain(|client| {
            broker
                .session(client)
                .is_some_and(|s| s.subscriptions.contains_key(form))
        });
    }

    /// Offers available jobs to workers that can take one, round robin (C-046).
    async fn offer(&mut self) {
        // One walk over the table in offset order: a job skipped is passed, never
        // looked at again in this pass (a rescan per skip was quadratic in the table).
        let mut after = Bound::Unbounded;
        loop {
            if self.next_worker(false, None).is_none() {
                return;
            }
            let now = self.clock.now_ms();
            let Some(offset) = self
                .jobs
                .range((after, Bound::Unbounded))
                .find(|(_, j)| j.offerable(now))
                .map(|(o, _)| *o)
            else {
                return;
            };
            after = Bound::Excluded(offset);
            // Checked as it is about to go out (C-136, C-139).
            let wall = now_ms();
            if let Some(reason) = self.jobs.get(&offset).and_then(|j| self.due_out(j, wall)) {
                self.dead_letter(offset, reason).await;
                continue;
            }
            let Some(record) = self.take_body(offset).await else {
                continue;
            };
            // Only to a worker a rule lets consume this job's topic (B-253); one no
            // worker may take now waits, and the jobs behind it go on. Its body is
            // kept only as the cache's bounds allow.
            let Some((worker, identifier)) = self.next_worker(true, Some(&record.topic)) else {
                self.cache_body(record);
                continue;
            };
            self.hand_out(worker, identifier, record);
        }
    }

    /// The next worker that may be offered a job (the job stored under `topic`, when
    /// it is known), with the Subscription Identifier of its form; `take` moves the
    /// turn past it.
    fn next_worker(&mut self, take: bool, topic: Option<&str>) -> Option<(Worker, Option<u32>)> {
        let shared = self.shared.clone();
        let mut broker = shared.broker.borrow_mut();
        let n = self.workers.len();
        for i in 0..n {
            let at = (self.turn + i) % n;
            let client = &self.workers[at];
            if self.held.contains_key(client) {
                continue;
            }
            let Some(session) = broker.session(client) else {
                continue;
            };
            let Some(link) = session.link.as_ref().map(|l| l.id) else {
                continue;
            };
            if session.protocol != ProtocolVersion::V5
                || !session.subscriptions.contains_key(&self.form)
                || !session.can_take(QoS::AtLeastOnce, 0)
                || !session.may_consume(&self.name)
                || topic.is_some_and(|t| !session.may_consume_job(&self.name, t))
            {
                continue;
            }
            if take {
                self.turn = at + 1;
            }
            let identifier = session
                .subscriptions
                .get(&self.form)
                .and_then(|s| s.identifier);
            return Some((
                Worker {
                    client: client.clone(),
                    link,
                },
                identifier,
            ));
        }
        None
    }

    /// Queues the offer on the worker's session: AVAILABLE → DELIVERING.
    fn hand_out(&mut self, worker: Worker, identifier: Option<u32>, record: Record) {
        let offset = record.offset;
        let Some(job) = self.jobs.get_mut(&offset) else {
            return;
        };
        self.epoch += 1;
        let delivery = DeliveryId::new(self.nonce, offset, self.epoch);
        let attempt = job.next_attempt();
        let mut message = records::from_record(record, QoS::AtLeastOnce, now_ms());
        // The queue's own Response Topic and Delivery ID replace a publisher's (gaps A-04).
        let properties = message.properties.edit();
        properties.response_topic = Some(self.response_topic.clone());
        properties.correlation_data = Some(delivery.bytes().to_vec());
        properties
            .user_properties
            .push(("saguin-attempt".into(), attempt.to_string()));
        job.offer(worker.clone(), delivery);
        log::debug!(
            "queue {}: job {offset} offered to {} (attempt {attempt})",
            self.name,
            worker.client
        );
        self.held.insert(worker.client.clone(), offset);
        let delivery = Delivery {
            message: Arc::new(message),
            qos: QoS::AtLeastOnce,
            retain: false,
            identifiers: identifier.into_iter().collect(),
            record: Some((Some(self.id), offset)),
            held: None,
            resent: false,
            untracked: Untracked::No,
        };
        self.shared
            .broker
            .borrow_mut()
            .deliver(&worker.client, delivery);
        self.count(|c| c.delivered += 1);
    }

    /// A job's body, from memory or the provider, taken out of memory. `None` when it
    /// cannot be read now, or the job is gone (then it is forgotten).
    async fn take_body(&mut self, offset: u64) -> Option<Record> {
        if let Some(record) = self.bodies.remove(&offset) {
            self.body_bytes = self.body_bytes.saturating_sub(record.size());
            return Some(record);
        }
        self.read_body(offset).await
    }

    async fn read_body(&mut self, offset: u64) -> Option<Record> {
        let request = WindowRequest::new(offset, 1, 1);
        match self.provider.read_window(&self.name, request).await {
            Ok(window) => match window.records.into_iter().next() {
                Some(record) if record.offset == offset => Some(record),
                _ => {
                    log::warn!("queue {}: job {offset} is no longer stored", self.name);
                    self.forget(offset);
                    None
                }
            },
            Err(e) => {
                log::error!("queue {}: cannot read job {offset}: {e}", self.name);
                self.shared.broker.borrow().metrics.storage_failed(&e);
                None
            }
        }
    }

    /// Moves a job to `<name>__dlq` in one transaction, topic rewritten and the
    /// `saguin-dlq-*` headers added (C-118..C-132). A move that fails changes nothing
    /// here; the caller puts the job back as it was, to be tried again by the sweep or
    /// the next take-back (C-117, gaps A-02). Returns whether the job left the queue.
    async fn dead_letter(&mut self, offset: u64, reason: DeadReason) -> bool {
        let Some((dlq_id, dlq_name)) = self.dlq.clone() else {
            log::error!("queue {} has no dead-letter channel", self.name);
            return false;
        };
        let Some(job) = self.jobs.get(&offset).cloned() else {
            return true;
        };
        let topic = match self.bodies.get(&offset) {
            Some(record) => record.topic.clone(),
            None => match self.read_body(offset).await {
                Some(record) => {
                    let topic = record.topic.clone();
                    self.cache_body(record);
                    topic
                }
                None => return !self.jobs.contains_key(&offset),
            },
        };
        let now = now_ms();
        let on_wall = self.clock.on_wall(now);
        let mut headers = vec![
            ("saguin-dlq-channel".to_string(), self.name.to_string()),
            ("saguin-dlq-offset".into(), offset.to_string()),
            ("saguin-dlq-attempts".into(), job.attempts.count.to_string()),
        ];
        // Left out when no delivery was ever received (gaps A-08); counted on the
        // lease clock, told on the wall clock as it reads now.
        headers.extend(
            (job.attempts.first_ms).map(|t| ("saguin-dlq-first".into(), on_wall(t).to_string())),
        );
        headers.extend(
            (job.attempts.last_ms).map(|t| ("saguin-dlq-last".into(), on_wall(t).to_string())),
        );
        headers.push(("saguin-dlq-at".into(), now.to_string()));
        headers.push(("saguin-dlq-reason".into(), reason.as_str().into()));
        let dead_topic = dlq_topic(&self.policy.filter, &topic);
        let to = DeadLetter {
            channel: dlq_name.to_string(),
            topic: dead_topic,
            timestamp_ms: now,
            user_properties: headers,
        };
        // A full provider gives up the broadcast log's oldest records first, as any
        // write does (B-476).
        let provider = self.provider.clone();
        let write = || provider.dead_letter(&self.name, offset, to.clone());
        let moved = crate::server::connection::with_room(&self.shared, &provider, write).await;
        match moved {
            Ok(at) => {
                log::warn!(
                    "queue {}: job {offset} dead-lettered ({}) to {dlq_name} at {at}",
                    self.name,
                    reason.as_str()
                );
                self.forget(offset);
                self.count(|c| match reason {
                    DeadReason::AttemptsExhausted => c.dead_lettered_attempts += 1,
                    DeadReason::Expired => c.dead_lettered_expired += 1,
                });
                self.landed(dlq_id, &dlq_name, at).await;
                true
            }
            Err(StorageError::NoSuchRecord { .. }) => {
                self.forget(offset);
                true
            }
            Err(e) => {
                log::warn!(
                    "queue {}: job {offset} could not be dead-lettered and is left as it was, to be tried again: {e}",
                    self.name
                );
                false
            }
        }
    }

    /// Wakes the dead-letter channel's readers for its new record; a shared group is
    /// handed the record itself, read back only when one exists.
    async fn landed(&mut self, dlq_id: ChannelId, dlq_name: &str, at: u64) {
        let mut message = None;
        if self.shared.broker.borrow().has_shared_groups() {
            let request = WindowRequest::new(at, 1, 1);
            if let Ok(window) = self.provider.read_window(dlq_name, request).await {
                message = window
                    .records
                    .into_iter()
                    .find(|r| r.offset == at)
                    .map(|r| Arc::new(records::from_record(r, QoS::AtLeastOnce, now_ms())));
            }
        }
        self.shared.broker.borrow_mut().landed(dlq_id, message);
    }

    /// Drops a job that left the queue.
    fn forget(&mut self, offset: u64) {
        if let Some(job) = self.jobs.remove(&offset)
            && let Some(worker) = job.holder()
            && self.held.get(&worker.client) == Some(&offset)
        {
            self.held.remove(&worker.client);
        }
        if let Some(record) = self.bodies.remove(&offset) {
            self.body_bytes = self.body_bytes.saturating_sub(record.size());
        }
    }

    fn count(&self, f: impl FnOnce(&mut crate::broker::metrics::QueueCounts)) {
        self.shared.broker.borrow().metrics.queue(&self.name, f);
    }

    /// The depth gauges: jobs waiting, and jobs out with a worker.
    fn gauge(&self) {
        let held = self.held.len() as u64;
        let waiting = self.jobs.len() as u64 - held.min(self.jobs.len() as u64)
            + self.backlog.map_or(0, |b| b.jobs);
        self.count(|c| {
            c.available = waiting;
            c.held = held;
        });
    }
}

/// Whether a session still has an offer queued or on the wire.
fn carries(session: &Session, queue: ChannelId, offset: u64, delivery: &DeliveryId) -> bool {
    let is_it = |d: &Delivery| {
        d.origin() == Some((queue, offset))
            && d.message.properties.correlation_data.as_deref() == Some(delivery.bytes())
    };
    session.queue.iter().any(is_it)
        || session.inflight.values().any(|i| match i {
            Inflight::Published(d) => is_it(d),
            Inflight::Released(..) => false,
        })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::storage::{NewRecord, RecordProperties};
    use std::time::Duration;

    #[test]
    fn a_lease_moment_is_told_on_the_wall_clock_as_long_ago_as_it_was() {
        // Started 5 s ago at wall 1 s; the wall clock has since been stepped (NTP on a
        // gateway with no real-time clock) to 1,000,000 s.
        let started = Instant::now()
            .checked_sub(Duration::from_secs(5))
            .expect("up for 5 s");
        let clock = LeaseClock {
            wall_at_start_ms: 1_000,
            started,
        };
        let lease_now = clock.now_ms();
        assert!((6_000..7_000).contains(&lease_now), "{lease_now}");
        let told = clock.on_wall(1_000_000_000)(Moment::Lease(lease_now - 2_000));
        assert!(
            (999_997_900..=999_998_000).contains(&told),
            "2 s ago on the wall clock: {told}"
        );
        // C-129, C-130: a time an earlier run stored is told as it was stored, however
        // far this clock is from the wall clock.
        assert_eq!(clock.on_wall(1_000_000_000)(Moment::Wall(7_000)), 7_000);
    }

    /// One memory queue, `jobs`, that dead-letters at the first attempt.
    const CONFIG: &str = "broker:
  id: owner-test
  storage:
    default: mem
    default_retention_period: none
    default_retention_bytes: none
    providers:
      mem:
        type: memory
        max_bytes: 64MiB
        snapshot_dir: none
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
channels:
  jobs:
    type: queue
    filter: jobs/#
    retry:
      max_attempts: 1
";

    /// An owner of `jobs` holding one stored job; its offset.
    async fn owner_with_a_job() -> (Owner, u64) {
        let config = crate::config::from_str(CONFIG, Path::new("owner-test.yaml"))
            .unwrap_or_else(|e| panic!("the test configuration loads: {e}"));
        let (channels, _) = crate::startup::open_channels(&config)
            .await
            .unwrap_or_else(|e| panic!("the channels open: {e}"));
        let settings = crate::broker::Settings::from_config(&config);
        let id = channels.by_name("jobs").expect("jobs is configured");
        let shared = Shared::new(settings, channels, None);
        let mut owner = Owner::new(shared, id).expect("jobs is a queue");
        let job = NewRecord {
            message_id: "m-1".into(),
            timestamp_ms: now_ms(),
            topic: "jobs/1".into(),
            payload: b"work".to_vec(),
            properties: RecordProperties::default(),
        };
        let offset = owner.provider.append("jobs", job).await.expect("stored");
        owner.load().await;
        (owner, offset)
    }

    /// Offers the job to `w` by hand (no session is needed to hold it).
    async fn offer_to(owner: &mut Owner, worker: &Worker, offset: u64) -> DeliveryId {
        let record = owner.take_body(offset).await.expect("the job's body");
        owner.hand_out(worker.clone(), None, record);
        *owner.jobs[&offset].delivery().expect("offered")
    }

    async fn stored_attempts(owner: &Owner, offset: u64) -> u32 {
        let window = owner
            .provider
            .read_window("jobs", WindowRequest::new(offset, 1, 1 << 20))
            .await
            .expect("readable");
        match window.records.first().map(|r| (r.offset, &r.state)) {
            Some((at, RecordState::Job { attempts, .. })) if at == offset => attempts.count,
            other => panic!("job {offset} is not stored as a job: {other:?}"),
        }
    }

    /// C-117: a `return` that spends the last attempt (answered before the PUBACK)
    /// while the move cannot be made leaves the job exactly as it was - DELIVERING to
    /// its worker, held, its attempt neither counted nor written - and once the move
    /// can be made the next take-back makes it.
    #[test]
    fn a_failed_dead_letter_move_changes_nothing() {
        smol::block_on(async {
            let (mut owner, offset) = owner_with_a_job().await;
            let worker = Worker {
                client: Arc::from("w"),
                link: 1,
            };
            let delivery = offer_to(&mut owner, &worker, offset).await;
            let before = owner.jobs[&offset].clone();
            // The provider knows no such channel: the move is refused.
            let dlq = owner.dlq.clone();
            owner.dlq = dlq.clone().map(|(id, _)| (id, Arc::from("nowhere__dlq")));
            owner
                .on_answer(&worker, Ok(delivery), Some(Verdict::Return))
                .await;
            assert_eq!(owner.jobs.get(&offset), Some(&before));
            assert_eq!(owner.held.get(&worker.client), Some(&offset));
            assert_eq!(stored_attempts(&owner, offset).await, 0);

            // The worker's PUBACK leases it and spends the attempt; at the deadline
            // the move is tried again, and now it can be made.
            owner.dlq = dlq;
            owner.on_puback(&worker, delivery.bytes()).await;
            assert_eq!(stored_attempts(&owner, offset).await, 1);
            if let Some(Job {
                lease: Lease::Leased { deadline_ms, .. },
                ..
            }) = owner.jobs.get_mut(&offset)
            {
                *deadline_ms = 0;
            }
            owner.tick().await;
            assert!(!owner.jobs.contains_key(&offset), "dead-lettered");
            assert!(!owner.held.contains_key(&worker.client));
        });
    }

    /// C-117: a visibility timeout past the last attempt whose move fails leaves the
    /// job LEASED to its worker, held, as it was; the next tick tries again.
    #[test]
    fn a_timeout_whose_move_fails_leaves_the_lease_as_it_was() {
        smol::block_on(async {
            let (mut owner, offset) = owner_with_a_job().await;
            let worker = Worker {
                client: Arc::from("w"),
                link: 1,
            };
            let delivery = offer_to(&mut owner, &worker, offset).await;
            owner.on_puback(&worker, delivery.bytes()).await;
            if let Some(Job {
                lease: Lease::Leased { deadline_ms, .. },
                ..
            }) = owner.jobs.get_mut(&offset)
            {
                *deadline_ms = 0;
            }
            let before = owner.jobs[&offset].clone();
            let dlq = owner.dlq.clone();
            owner.dlq = None;
            owner.tick().await;
            assert_eq!(owner.jobs.get(&offset), Some(&before));
            assert_eq!(owner.held.get(&worker.client), Some(&offset));
            assert_eq!(stored_attempts(&owner, offset).await, 1);
            owner.dlq = dlq;
            owner.tick().await;
            assert!(
                !owner.jobs.contains_key(&offset),
                "dead-lettered on the next tick"
            );
        });
    }

    /// An owner sleeps without a tick only while the tick could find nothing: a job
    /// waiting (its backoff or expiry), out with a worker (its lease) or left in
    /// storage (the refill) each keeps the 200 ms tick going (C-067).
    #[test]
    fn only_an_empty_queue_sleeps_past_its_tick() {
        smol::block_on(async {
            let (mut owner, offset) = owner_with_a_job().await;
            assert!(!owner.idle(), "a waiting job");
            let worker = Worker {
                client: Arc::from("w"),
                link: 1,
            };
            let delivery = offer_to(&mut owner, &worker, offset).await;
            owner.on_puback(&worker, delivery.bytes()).await;
            assert!(!owner.idle(), "a leased job");
            owner
                .on_answer(&worker, Ok(delivery), Some(Verdict::Ack))
                .await;
            assert!(!owner.jobs.contains_key(&offset), "acknowledged");
            assert!(owner.idle(), "nothing left to tick for");
            owner.behind(offset + 1, 1);
            assert!(!owner.idle(), "a job missed into storage");
        });
    }
}
