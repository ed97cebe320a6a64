//! One job's delivery state (RFC 0003 "queue - States"), as an enum carrying what each
//! state needs, and the transitions between them as plain functions of the clock.
//!
//! Nothing here does I/O: each transition says what the owner must write (count an
//! attempt, resolve, dead-letter) and the owner writes it. RESOLVED is not a state a
//! job stays in: a resolved job leaves the owner's table.
//!
//! Architecture invariant: the only clock on a held job is the visibility deadline,
//! which starts at PUBACK (invariant 7); every other way a hold ends is an observed
//! fact - an answer, the connection ending, the PUBLISH never having been written.

use std::sync::Arc;

use super::{DeliveryId, Policy};
use crate::storage::Attempts;

/// The worker a job is out with: a session, through one connection of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Worker {
    /// The session's client id.
    pub client: Arc<str>,
    /// The connection it was offered through.
    pub link: u64,
}

/// Where a job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// Waiting to be offered, not before `not_before_ms` (its backoff gap).
    Available {
        /// Milliseconds since the epoch; 0 offers it on the next pass.
        not_before_ms: u64,
    },
    /// Offered: the PUBLISH is queued or on the wire and no PUBACK has come. No
    /// deadline runs (C-034, C-037).
    Delivering {
        /// Who it was offered to.
        worker: Worker,
        /// This attempt's Delivery ID.
        delivery: DeliveryId,
    },
    /// The worker showed it had the job (PUBACK); the visibility deadline runs.
    Leased {
        /// Who holds it.
        worker: Worker,
        /// This attempt's Delivery ID.
        delivery: DeliveryId,
        /// When the worker received it (its PUBACK), milliseconds since the epoch:
        /// the backoff gap of a take-back is measured from here (C-094, gaps A-09).
        received_ms: u64,
        /// `received_ms + visibility_timeout`.
        deadline_ms: u64,
    },
}

/// One job the owner knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// When the broker received it (0: never expires, C-142).
    pub timestamp_ms: u64,
    /// Attempts spent (counted at PUBACK or answer, whichever first: C-085), and
    /// when, for `saguin-dlq-first` and `-last` (gaps A-08).
    pub attempts: Attempts<Moment>,
    /// Where it is.
    pub lease: Lease,
}

/// When an attempt was spent, on the clock it was read on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// In this run, on the owner's lease clock: told on the wall clock as it reads
    /// when told, so a wall clock stepped since (a gateway with no real-time clock
    /// that NTP sets late) does not misdate it.
    Lease(u64),
    /// In an earlier run, read from storage: milliseconds since the epoch, told as
    /// they are. Never moved onto this run's clock, which may disagree with the wall
    /// clock by any amount.
    Wall(u64),
}

/// A worker's answer to a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `ack`: the work succeeded.
    Ack,
    /// `return`: the work failed.
    Return,
}

impl Verdict {
    /// The payload, read exactly: `ack` or `return`, nothing else (C-081).
    pub fn parse(payload: &[u8]) -> Option<Verdict> {
        match payload {
            b"ack" => Some(Verdict::Ack),
            b"return" => Some(Verdict::Return),
            _ => None,
        }
    }
}

/// Why a job goes to the dead-letter channel (`saguin-dlq-reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// `retry.max_attempts` reached.
    AttemptsExhausted,
    /// Older than `job_expires_after`.
    Expired,
}

impl DeadReason {
    /// The header's value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::AttemptsExhausted => "attempts_exhausted",
            DeadReason::Expired => "expired",
        }
    }
}

/// What a transition asks the owner to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing changed: the event named no current delivery of this worker (C-080).
    Ignored,
    /// The state changed in memory only.
    Moved,
    /// An attempt was spent: write the count (C-112).
    Counted,
    /// `ack`: remove the job (RESOLVED).
    Resolve,
    /// Back to AVAILABLE; `counted` says an attempt was spent on the way.
    Available {
        /// Write the attempt count too.
        counted: bool,
    },
    /// Attempts exhausted: move it to the dead-letter channel (C-088).
    DeadLetter {
        /// Write the attempt count first (it is carried in `saguin-dlq-attempts`).
        counted: bool,
    },
}

impl Job {
    /// A job just stored, or found at startup with `attempts` spent: available at once
    /// (C-033, C-152, gaps A-10).
    pub fn new(timestamp_ms: u64, attempts: Attempts<Moment>) -> Job {
        Job {
            timestamp_ms,
            attempts,
            lease: Lease::Available { not_before_ms: 0 },
        }
    }

    /// Whether the job may be offered now: available and past its gap (C-105).
    pub fn offerable(&self, now_ms: u64) -> bool {
        matches!(self.lease, Lease::Available { not_before_ms } if not_before_ms <= now_ms)
    }

    /// Whether `job_expires_after` has passed (C-135); a job with no timestamp never
    /// expires (C-142).
    pub fn expired(&self, policy: &Policy, now_ms: u64) -> bool {
        match policy.job_expires_after {
            Some(after) if self.timestamp_ms != 0 => {
                now_ms.saturating_sub(self.timestamp_ms) > after.as_millis() as u64
            }
            _ => false,
        }
    }

    /// The worker holding it, if it is out.
    pub fn holder(&self) -> Option<&Worker> {
        match &self.lease {
            Lease::Available { .. } => None,
            Lease::Delivering { worker, .. } | Lease::Leased { worker, .. } => Some(worker),
        }
    }

    /// The current Delivery ID, if it is out.
    pub fn delivery(&self) -> Option<&DeliveryId> {
        match &self.lease {
            Lease::Available { .. } => None,
            Lease::Delivering { delivery, .. } | Lease::Leased { delivery, .. } => Some(delivery),
        }
    }

    /// The attempt number an offer now carries: attempts spent + 1 (gaps A-01).
    pub fn next_attempt(&self) -> u32 {
        self.attempts.count.saturating_add(1)
    }

    /// AVAILABLE → DELIVERING.
    pub fn offer(&mut self, worker: Worker, delivery: DeliveryId) {
        self.lease = Lease::Delivering { worker, delivery };
    }

    fn is_current(&self, worker: &Worker, delivery: &DeliveryId) -> bool {
        self.holder() == Some(worker) && self.delivery() == Some(delivery)
    }

    fn count(&mut self, now_ms: u64) {
        self.attempts.spend(Moment::Lease(now_ms));
    }

    /// The worker's PUBACK for the offer: DELIVERING → LEASED, the deadline starts and
    /// the attempt is spent (C-035, C-085). A PUBACK for anything else changes nothing.
    pub fn puback(
        &mut self,
        worker: &Worker,
        delivery: &DeliveryId,
        policy: &Policy,
        now_ms: u64,
    ) -> Outcome {
        if !self.is_current(worker, delivery) {
            return Outcome::Ignored;
        }
        let Lease::Delivering { worker, delivery } = &self.lease else {
            return Outcome::Ignored; // already leased: the answer came first
        };
        self.lease = Lease::Leased {
            worker: worker.clone(),
            delivery: *delivery,
            received_ms: now_ms,
            deadline_ms: now_ms.saturating_add(policy.visibility_timeout.as_millis() as u64),
        };
        self.count(now_ms);
        Outcome::Counted
    }

    /// The worker's answer, applied only for its current delivery (C-076..C-078). An
    /// answer before the PUBACK spends the attempt itself (C-087).
    pub fn answer(
        &mut self,
        worker: &Worker,
        delivery: &DeliveryId,
        verdict: Verdict,
        policy: &Policy,
        now_ms: u64,
    ) -> Outcome {
        if !self.is_current(worker, delivery) {
            return Outcome::Ignored;
        }
        // Past its deadline the lease is over, though the tick that takes it back has
        // not come yet (C-089, C-092).
        if let Lease::Leased { deadline_ms, .. } = self.lease
            && deadline_ms <= now_ms
        {
            return Outcome::Ignored;
        }
        let counted = matches!(self.lease, Lease::Delivering { .. });
        if counted {
            self.count(now_ms);
        }
        match verdict {
            Verdict::Ack => Outcome::Resolve,
            // A worker that answers is measured from its answer (C-093).
            Verdict::Return => self.take_back(policy, now_ms, now_ms, counted),
        }
    }

    /// The visibility deadline passed (C-089): back after what is left of the gap,
    /// measured from when the worker received it.
    pub fn timed_out(&mut self, policy: &Policy, now_ms: u64) -> Outcome {
        match self.lease {
            Lease::Leased {
                deadline_ms,
                received_ms,
                ..
            } if deadline_ms <= now_ms => self.take_back(policy, received_ms, now_ms, false),
            _ => Outcome::Ignored,
        }
    }

    /// The holder's connection ended (C-090, gaps A-03), or the PUBLISH was never
    /// written (C-038): a job that was only DELIVERING goes back with its attempt
    /// unspent and no gap; a LEASED one after what is left of its gap.
    pub fn released(&mut self, policy: &Policy, now_ms: u64) -> Outcome {
        match self.lease {
            Lease::Available { .. } => Outcome::Ignored,
            Lease::Delivering { .. } => {
                self.lease = Lease::Available { not_before_ms: 0 };
                Outcome::Moved
            }
            Lease::Leased { received_ms, .. } => self.take_back(policy, received_ms, now_ms, false),
        }
    }

    /// Out of the worker's hands: dead-lettered when its attempts are spent (C-088),
    /// otherwise available once the gap since `from_ms` has passed (C-100).
    fn take_back(&mut self, policy: &Policy, from_ms: u64, now_ms: u64, counted: bool) -> Outcome {
        let not_before_ms = from_ms.saturating_add(policy.gap_ms(self.attempts.count));
        self.lease = Lease::Available {
            not_before_ms: if not_before_ms <= now_ms {
                0
            } else {
                not_before_ms
            },
        };
        if self.attempts.count >= policy.max_attempts {
            Outcome::DeadLetter { counted }
        } else {
            Outcome::Available { counted }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Backoff;
    use super::*;

    /// `n` attempts spent, with no times (as loaded from a file written without them).
    fn spent(n: u32) -> Attempts<Moment> {
        Attempts {
            count: n,
            ..Attempts::default()
        }
    }

    fn policy(backoff: Backoff) -> Policy {
        Policy {
            filter: "jobs/#".into(),
            visibility_timeout: Duration::from_secs(30),
            job_expires_after: None,
            max_attempts: 5,
            backoff,
        }
    }

    fn worker(name: &str) -> Worker {
        Worker {
            client: Arc::from(name),
            link: 1,
        }
    }

    fn id(epoch: u64) -> DeliveryId {
        DeliveryId::new([7; 8], 3, epoch)
    }

    /// C-034, C-035, C-085, C-032: offered is DELIVERING with no deadline; PUBACK leases it,
    /// starts the deadline and spends the attempt.
    #[test]
    fn puback_leases_and_counts() {
        let p = policy(Backoff::None);
        let mut job = Job::new(1, spent(0));
        job.offer(worker("w"), id(1));
        assert!(matches!(job.lease, Lease::Delivering { .. }));
        assert_eq!(job.timed_out(&p, u64::MAX), Outcome::Ignored);
        assert_eq!(job.puback(&worker("w"), &id(1), &p, 1000), Outcome::Counted);
        assert_eq!(job.attempts.count, 1);
        assert!(matches!(
            job.lease,
            Lease::Leased {
                deadline_ms: 31_000,
                ..
            }
        ));
    }

    /// C-078, C-092: another worker's answer, or a dead Delivery ID, changes nothing.
    #[test]
    fn fencing_ignores_strangers_and_stale_ids() {
        let p = policy(Backoff::None);
        let mut job = Job::new(1, spent(0));
        job.offer(worker("w"), id(2));
        let before = job.clone();
        assert_eq!(
            job.answer(&worker("x"), &id(2), Verdict::Ack, &p, 5),
            Outcome::Ignored
        );
        assert_eq!(
            job.answer(&worker("w"), &id(1), Verdict::Ack, &p, 5),
            Outcome::Ignored
        );
        assert_eq!(job, before);
    }

    /// C-089, C-092: an answer past the visibility deadline is too late, though the
    /// tick that takes the lease back has not run yet.
    #[test]
    fn an_answer_past_the_deadline_is_ignored() {
        let p = policy(Backoff::None);
        let mut job = Job::new(1, spent(0));
        job.offer(worker("w"), id(1));
        job.puback(&worker("w"), &id(1), &p, 1_000);
        let leased = job.clone();
        assert_eq!(
            job.answer(&worker("w"), &id(1), Verdict::Ack, &p, 31_000),
            Outcome::Ignored
        );
        assert_eq!(job, leased);
        assert_eq!(
            job.answer(&worker("w"), &id(1), Verdict::Ack, &p, 30_999),
            Outcome::Resolve
        );
    }

    /// C-087: a return before the PUBACK spends the attempt; the late PUBACK is ignored.
    #[test]
    fn an_answer_before_puback_counts_once() {
        let p = policy(Backoff::None);
        let mut job = Job::new(1, spent(0));
        job.offer(worker("w"), id(1));
        assert_eq!(
            job.answer(&worker("w"), &id(1), Verdict::Return, &p, 10),
            Outcome::Available { counted: true }
        );
        assert_eq!(job.puback(&worker("w"), &id(1), &p, 11), Outcome::Ignored);
        assert_eq!(job.attempts.count, 1);
    }

    /// C-038, C-086: a delivery that was never received burns nothing and waits no gap.
    #[test]
    fn released_while_delivering_is_unspent() {
        let p = policy(Backoff::Exponential(Duration::from_secs(2)));
        let mut job = Job::new(1, spent(2));
        job.offer(worker("w"), id(1));
        assert_eq!(job.released(&p, 100), Outcome::Moved);
        assert_eq!(job.attempts.count, 2);
        assert!(job.offerable(100));
    }

    /// C-093, C-096: a return waits the whole gap from the answer (linear, n=1 → 2s).
    #[test]
    fn a_return_waits_the_whole_gap() {
        let p = policy(Backoff::Linear(Duration::from_secs(2)));
        let mut job = Job::new(1, spent(0));
        job.offer(worker("w"), id(1));
        job.puback(&worker("w"), &id(1), &p, 1_000);
        job.answer(&worker("w"), &id(1), Verdict::Return, &p, 5_000);
        assert!(!job.offerable(6_999));
        assert!(job.offerable(7_000));
    }

    /// C-101, C-102, C-104: a timeout longer than the gap leaves nothing to wait.
    #[test]
    fn a_timed_out_job_has_served_its_gap() {
        let p = policy(Backoff::Exponential(Duration::from_secs(2)));
        let mut job = Job::new(1, spent(3));
        job.offer(worker("w"), id(1));
        job.puback(&worker("w"), &id(1), &p, 0);
        assert_eq!(job.timed_out(&p, 29_999), Outcome::Ignored);
        assert_eq!(
            job.timed_out(&p, 30_000),
            Outcome::Available { counted: false }
        );
        assert!(job.offerable(30_000));
    }

    /// C-103: a session ending 1s after delivery with a 4s gap leaves 3s.
    #[test]
    fn a_session_ending_waits_what_is_left_of_the_gap() {
        let p = policy(Backoff::Linear(Duration::from_secs(2)));
        let mut job = Job::new(1, spent(1));
        job.offer(worker("w"), id(1));
        job.puback(&worker("w"), &id(1), &p, 10_000); // attempt 2: gap 4s
        job.released(&p, 11_000);
        assert!(!job.offerable(13_999));
        assert!(job.offerable(14_000));
    }

    /// C-088: the take-back that reaches max_attempts dead-letters.
    #[test]
    fn the_last_attempt_dead_letters() {
        let p = policy(Backoff::None);
        let mut job = Job::new(1, spent(4));
        job.offer(worker("w"), id(9));
        job.puback(&worker("w"), &id(9), &p, 0);
        assert_eq!(
            job.answer(&worker("w"), &id(9), Verdict::Return, &p, 1),
            Outcome::DeadLetter { counted: false }
        );
    }

    /// C-135, C-142: expiry counts from the timestamp; a zero timestamp never expires.
    #[test]
    fn expiry_needs_a_timestamp() {
        let mut p = policy(Backoff::None);
        p.job_expires_after = Some(Duration::from_secs(60));
        assert!(Job::new(1_000, spent(0)).expired(&p, 61_001));
        assert!(!Job::new(1_000, spent(0)).expired(&p, 61_000));
        assert!(!Job::new(0, spent(0)).expired(&p, u64::MAX));
    }

    /// C-138, B-510: a queue without `job_expires_after` never expires work, however
    /// old.
    #[test]
    fn no_job_expires_after_never_expires() {
        let p = policy(Backoff::None);
        assert_eq!(p.job_expires_after, None);
        assert!(!Job::new(1_000, spent(0)).expired(&p, u64::MAX));
    }

    /// C-081: only the exact payloads are answers.
    #[test]
    fn only_exact_payloads_are_verdicts() {
        assert_eq!(Verdict::parse(b"ack"), Some(Verdict::Ack));
        assert_eq!(Verdict::parse(b"return"), Some(Verdict::Return));
        for other in [&b"ACK"[..], b"ack\n", b""] {
            assert_eq!(Verdict::parse(other), None);
        }
    }
}
