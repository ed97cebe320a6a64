//! Queue channels (RFC 0003 "queue"; RFC 0002 "The dead-letter channel"; issue 6).
//!
//! # Design
//!
//! **Each queue has one owner** (DESIGN-NOTES 7): a task on the broker's executor
//! ([`owner`]) that alone holds the queue's lease state - every job it knows, as a
//! [`lease::Job`] whose [`lease::Lease`] is AVAILABLE, DELIVERING or LEASED with what
//! each needs (RESOLVED jobs leave the table). Nothing else reads or writes that state,
//! so it needs no lock. Connections tell the owner what happened through an unbounded
//! channel of [`Event`]s - a job stored, a worker subscribed, a PUBACK of an offer, a
//! worker's full window reopened by any acknowledgement, an answer on
//! `$saguin/queue/<name>/response`, a connection ending - and never wait on
//! it: a worker's PUBACK for its answer is the broker having received the packet, and
//! nothing more (C-082).
//!
//! **Offers.** After every batch of events and on a fixed 200ms tick the owner walks
//! its workers round robin (its own index, C-047) and hands each one that is live,
//! speaks MQTT 5, still holds the form, holds no job from this queue and has window
//! room the lowest offset that is available and past its backoff gap (C-046, C-105).
//! An offer is queued on the worker's session like any delivery (the connection alone
//! writes its socket) with its `origin` naming the queue and offset, so the connection
//! can tell the owner about its PUBACK. The owner checks on each tick whether an offer
//! it made is still queued or on the wire, and one that is neither went back without a
//! PUBACK - never written - so the job is available again with its attempt unspent
//! (C-038). That is a question with an answer, not a clock (invariant 7).
//!
//! **Storage.** The provider keeps each job's attempt count; the owner writes it at the
//! PUBACK or answer that spends it (C-085), removes a job at `ack`, and moves one into
//! `<name>__dlq` in one transaction, topic rewritten with the `__dlq` level
//! ([`dlq_topic`]). Deliveries, Delivery IDs and deadlines live only in the owner, so a
//! restart has nothing in flight and every job is available at once (C-150..C-153).
//!
//! Architecture invariant: a queue's records leave only as offers to its workers
//! (invariant 11); nothing but the owner decides an offer.

pub mod lease;
pub mod owner;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use smol::channel::{Receiver, Sender};

use super::channels::{ChannelId, Channels, Kind};
use crate::storage::Record;
use lease::{Verdict, Worker};

/// The prefix of every queue's subscription form (`$saguin/queue/<name>`).
pub const FORM_PREFIX: &str = "$saguin/queue/";

/// How often the owner offers new work, checks deadlines and sweeps expired jobs; not
/// configurable (C-067, C-068).
pub const TICK: Duration = Duration::from_millis(200);

/// `retry.backoff` with its base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// Offer again on the next pass (the default).
    None,
    /// `base × n`.
    Linear(Duration),
    /// `base × 2^(n-1)`.
    Exponential(Duration),
}

/// A queue's settings as the owner runs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The queue's filter, which places the `__dlq` level of its dead letters.
    pub filter: String,
    /// How long a worker holds a job after its PUBACK.
    pub visibility_timeout: Duration,
    /// How old a job may get before it is dead-lettered `expired`.
    pub job_expires_after: Option<Duration>,
    /// Attempts before a job is dead-lettered.
    pub max_attempts: u32,
    /// The gap between attempts.
    pub backoff: Backoff,
}

impl Policy {
    /// The gap after `n` attempts, in milliseconds (C-095..C-097); no ceiling (C-098).
    pub fn gap_ms(&self, n: u32) -> u64 {
        match self.backoff {
            Backoff::None => 0,
            Backoff::Linear(base) => (base.as_millis() as u64).saturating_mul(u64::from(n)),
            Backoff::Exponential(base) => {
                let factor = 1u64.checked_shl(n.saturating_sub(1)).unwrap_or(u64::MAX);
                (base.as_millis() as u64).saturating_mul(factor)
            }
        }
    }
}

/// The topic a dead letter takes: `__dlq` inserted where the queue's filter carries its
/// `#`, or appended where it carries none (RFC 0002 "The dead-letter channel", C-119).
pub fn dlq_topic(queue_filter: &str, topic: &str) -> String {
    let Some(head) = queue_filter.strip_suffix('#') else {
        return format!("{topic}/__dlq");
    };
    let depth = head.matches('/').count();
    let levels: Vec<&str> = topic.split('/').collect();
    let at = depth.min(levels.len());
    let mut out: Vec<&str> = Vec::with_capacity(levels.len() + 1);
    out.extend_from_slice(&levels[..at]);
    out.push("__dlq");
    out.extend_from_slice(&levels[at..]);
    out.join("/")
}

/// A Delivery ID: 24 opaque bytes, an 8-byte boot nonce, the offset and an epoch that
/// grows with every offer, so each attempt's is new and none survives a restart
/// (C-070, C-071, C-151; gaps A-12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeliveryId([u8; 24]);

impl DeliveryId {
    /// The ID of offer number `epoch` of the job at `offset`.
    pub fn new(nonce: [u8; 8], offset: u64, epoch: u64) -> DeliveryId {
        let mut bytes = [0u8; 24];
        bytes[..8].copy_from_slice(&nonce);
        bytes[8..16].copy_from_slice(&offset.to_be_bytes());
        bytes[16..].copy_from_slice(&epoch.to_be_bytes());
        DeliveryId(bytes)
    }

    /// Reads Correlation Data as a Delivery ID; anything not 24 bytes is none.
    pub fn parse(bytes: &[u8]) -> Option<DeliveryId> {
        Some(DeliveryId(bytes.try_into().ok()?))
    }

    /// The offset of the job it names.
    pub fn offset(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..16]);
        u64::from_be_bytes(b)
    }

    /// The nonce of the boot that issued it.
    pub fn nonce(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        b
    }

    /// The bytes, as Correlation Data.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// What a connection tells a queue's owner.
#[derive(Debug)]
pub enum Event {
    /// A job was stored (the publisher is being acknowledged).
    Stored(Record),
    /// A job was stored while the mailbox was long: its offset, receive time and
    /// attempts, without its body, which the owner reads back when it offers the job.
    Known {
        /// The job's offset.
        offset: u64,
        /// When the broker received it.
        timestamp_ms: u64,
    },
    /// A worker subscribed to the form.
    Subscribed(Arc<str>),
    /// A worker acknowledged the PUBLISH of an offer.
    Puback(Worker, Vec<u8>),
    /// A worker's full window (Receive Maximum) was reopened by an acknowledgement of
    /// any delivery: it may take an offer now (C-066).
    Reopened(Arc<str>),
    /// A worker answered on the response topic: the Delivery ID its Correlation Data
    /// names, or why it names none, and the verdict (`None` for a payload that is
    /// neither `ack` nor `return`). Read at the connection, so a mailbox of answers
    /// holds 24 bytes each, whatever Correlation Data the worker sent.
    Answer(Worker, Result<DeliveryId, &'static str>, Option<Verdict>),
    /// A connection ended: every job it held comes back at once.
    Ended(Worker),
    /// A worker acknowledged an offer it may no longer take (its `consume` gone with
    /// an acl_file re-read): the job comes back with its attempt unspent (B-295).
    Withdrawn(Worker),
}

/// Events past which a stored job's body is left in storage (see [`Queues::stored`]).
const MAILBOX_BODIES: usize = 256;
/// Events past which a stored job is not announced at all: the owner finds it in
/// storage (see [`Missed`]).
pub const MAILBOX_JOBS: usize = 4096;
/// Answers a mailbox takes past what stored jobs may fill: a burst of publishes never
/// leaves a worker's `ack` refused.
const MAILBOX_ANSWERS: usize = 1024;

/// Jobs stored while an owner's mailbox was full: the lowest offset and how many. The
/// owner reads them back from storage, so a flood of publishes costs no memory here.
#[derive(Debug, Default)]
pub struct Missed(std::cell::Cell<Option<(u64, u64)>>);

impl Missed {
    fn note(&self, offset: u64) {
        let (from, count) = self.0.get().unwrap_or((offset, 0));
        self.0.set(Some((from.min(offset), count + 1)));
    }

    /// The lowest offset missed and how many jobs, if any, clearing them.
    pub fn take(&self) -> Option<(u64, u64)> {
        self.0.take()
    }
}

/// The owners' mailboxes, by queue.
#[derive(Debug, Default)]
pub struct Queues {
    senders: HashMap<ChannelId, (Sender<Event>, std::rc::Rc<Missed>)>,
    unstarted: Vec<(ChannelId, Receiver<Event>, std::rc::Rc<Missed>)>,
}

impl Queues {
    /// A mailbox for every queue among `channels`; the owners are started by
    /// [`owner::spawn`].
    pub fn new(channels: &Channels) -> Queues {
        let mut queues = Queues::default();
        for (id, channel) in channels.iter() {
            if channel.kind == Kind::Queue {
                let (tx, rx) = smol::channel::unbounded();
                let missed = std::rc::Rc::new(Missed::default());
                queues.senders.insert(id, (tx, missed.clone()));
                queues.unstarted.push((id, rx, missed));
            }
        }
        queues
    }

    /// Whether the owner of `queue` has room for a worker's answer. Answers are the one
    /// event a client sends at will, so they are what the mailbox's bound refuses
    /// (0x97); stored jobs stop at `MAILBOX_JOBS`, and answers have room past that,
    /// so only answers themselves fill it (C-111).
    pub fn takes_answers(&self, queue: ChannelId) -> bool {
        self.senders
            .get(&queue)
            .is_some_and(|(tx, _)| tx.len() < MAILBOX_JOBS + MAILBOX_ANSWERS)
    }

    /// Tells the owner of `queue` about `event`.
    pub fn tell(&self, queue: ChannelId, event: Event) {
        if let Some((tx, _)) = self.senders.get(&queue) {
            // Unbounded for control events, which connections send one per act of
            // theirs: a send fails only once the owner is gone (the broker stopping).
            let _ = tx.try_send(event);
        }
    }

    /// Tells a queue's owner that a job was stored. Past `MAILBOX_BODIES` waiting
    /// events the body stays in storage and only the job's place travels, so a burst
    /// of publishes faster than the owner can take them costs memory by the event, not
    /// by the payload.
    pub fn stored(&self, queue: ChannelId, record: Record) {
        let Some((tx, missed)) = self.senders.get(&queue) else {
            return;
        };
        if tx.len() >= MAILBOX_JOBS {
            missed.note(record.offset);
            return;
        }
        let event = if tx.len() < MAILBOX_BODIES {
            Event::Stored(record)
        } else {
            Event::Known {
                offset: record.offset,
                timestamp_ms: record.timestamp_ms,
            }
        };
        let _ = tx.try_send(event);
    }

    /// Tells every owner that a worker's connection ended.
    pub fn ended(&self, worker: &Worker) {
        for (tx, _) in self.senders.values() {
            let _ = tx.try_send(Event::Ended(worker.clone()));
        }
    }

    /// Closes every mailbox: what is in them is still delivered, then each owner ends.
    pub fn close(&self) {
        for (tx, _) in self.senders.values() {
            tx.close();
        }
    }

    /// The mailboxes whose owners are not running yet.
    pub fn take_unstarted(&mut self) -> Vec<(ChannelId, Receiver<Event>, std::rc::Rc<Missed>)> {
        std::mem::take(&mut self.unstarted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// C-120, C-121, C-122, A-216, A-218: the `__dlq` level goes where the `#` is, or on
    /// the end.
    #[test]
    fn dead_letter_topics_follow_the_spec_table() {
        assert_eq!(dlq_topic("jobs/#", "jobs/j1"), "jobs/__dlq/j1");
        assert_eq!(dlq_topic("jobs/#", "jobs/a/b"), "jobs/__dlq/a/b");
        assert_eq!(
            dlq_topic("iot/+/work/+", "iot/site/work/j1"),
            "iot/site/work/j1/__dlq"
        );
        assert_eq!(
            dlq_topic("orders/#", "orders/resize/thumbnails/42"),
            "orders/__dlq/resize/thumbnails/42"
        );
        assert_eq!(
            dlq_topic("iot/water/+/inspect", "iot/water/w-7/inspect"),
            "iot/water/w-7/inspect/__dlq"
        );
        assert_eq!(dlq_topic("#", "a/b"), "__dlq/a/b");
        assert_eq!(dlq_topic("jobs/#", "jobs"), "jobs/__dlq");
    }

    /// C-111: a burst of stored jobs fills the mailbox to its bound for jobs, and a
    /// worker's answer still finds room: only answers fill the room left for them.
    #[test]
    fn stored_jobs_never_leave_an_answer_refused_c111() {
        let mut queues = Queues::default();
        let (tx, rx) = smol::channel::unbounded();
        queues
            .senders
            .insert(7, (tx, std::rc::Rc::new(Missed::default())));
        let job = |offset| Record {
            offset,
            message_id: String::new(),
            timestamp_ms: 0,
            topic: "jobs/j".into(),
            payload: Vec::new(),
            properties: Default::default(),
            state: crate::storage::RecordState::Stored,
        };
        for offset in 0..2 * MAILBOX_JOBS as u64 {
            queues.stored(7, job(offset));
        }
        assert_eq!(rx.len(), MAILBOX_JOBS);
        let worker = lease::Worker {
            client: "w".into(),
            link: 1,
        };
        let mut answered = 0;
        while queues.takes_answers(7) {
            queues.tell(7, Event::Answer(worker.clone(), Err("is missing"), None));
            answered += 1;
        }
        assert_eq!(answered, MAILBOX_ANSWERS);
    }

    /// C-096, C-097, C-099: linear and exponential gaps at a 2s base.
    #[test]
    fn gaps_grow_as_the_table_says() {
        let mut p = Policy {
            filter: "jobs/#".into(),
            visibility_timeout: Duration::from_secs(30),
            job_expires_after: None,
            max_attempts: 5,
            backoff: Backoff::Linear(Duration::from_secs(2)),
        };
        assert_eq!([p.gap_ms(1), p.gap_ms(2), p.gap_ms(3)], [2000, 4000, 6000]);
        p.backoff = Backoff::Exponential(Duration::from_secs(2));
        let gaps: Vec<u64> = (1..=4).map(|n| p.gap_ms(n)).collect();
        assert_eq!(gaps, [2000, 4000, 8000, 16000]);
        assert_eq!(gaps.iter().sum::<u64>(), 30_000);
        p.backoff = Backoff::None;
        assert_eq!(p.gap_ms(3), 0);
    }

    /// C-070, C-071: at most 32 bytes, and a new epoch is a new ID.
    #[test]
    fn delivery_ids_are_short_and_per_attempt() {
        let a = DeliveryId::new([1; 8], 42, 1);
        let b = DeliveryId::new([1; 8], 42, 2);
        assert!(a.bytes().len() <= 32);
        assert_ne!(a, b);
        assert_eq!(DeliveryId::parse(a.bytes()), Some(a));
        assert_eq!(a.offset(), 42);
        assert_eq!(DeliveryId::parse(b"short"), None);
    }
}
