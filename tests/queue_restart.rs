//! A queue across a broker restart on sqlite (issue 6; RFC 0003 "queue - Restart",
//! C-150..C-153).

mod common;

use std::time::Duration;

use common::{Broker, Raw, opts, temp_dir, user_property};
use saguin::codec::{
    ProtocolVersion::{V5, V311},
    QoS,
};

const CONFIG: &str = "broker:
  id: queue-restart
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  storage:
    default: disk
    default_retention_period: none
    default_retention_bytes: none
    providers:
      disk:
        type: sqlite
        file_path: {dir}/saguin.db
channels:
  jobs:
    type: queue
    filter: jobs/#
    retry:
      max_attempts: 5
  once:
    type: queue
    filter: once/#
    retry:
      max_attempts: 1
  twice:
    type: queue
    filter: twice/#
    retry:
      max_attempts: 2
";

fn worker(broker: &Broker, id: &str) -> Raw {
    let mut w = Raw::connected(broker.addr, V5, id);
    assert_eq!(
        w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    w
}

fn attempt(p: &saguin::codec::Publish) -> &str {
    user_property(p, "saguin-attempt").expect("saguin-attempt")
}

/// Waits until the job under `topic` has `attempts` counted in the provider's file,
/// read beside the broker (WAL): what a stop or a kill must find written.
fn wait_attempts(dir: &std::path::Path, topic: &str, attempts: i64) {
    let db = rusqlite::Connection::open(dir.join("saguin.db")).expect("open the db");
    common::wait_until(&format!("{topic}: attempt {attempts} written"), || {
        db.query_row(
            "SELECT max(attempts) FROM records WHERE topic = ?1",
            [topic],
            |r| r.get::<_, Option<i64>>(0),
        )
        .ok()
        .flatten()
            == Some(attempts)
    });
}

/// C-150, C-151, C-153: after a restart a held job is offered again with its attempts
/// as counted, a Delivery ID from before is dead, and a job whose attempts were
/// exhausted is dead-lettered rather than offered again.
#[test]
fn jobs_survive_a_restart_with_their_attempts() {
    let dir = temp_dir("queue-restart");
    let broker = Broker::start_in(dir, CONFIG);
    let mut producer = Raw::connected(broker.addr, V311, "producer");
    for topic in ["jobs/a", "once/b"] {
        assert_eq!(
            producer.publish(topic, topic.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let mut w = worker(&broker, "w");
    // jobs/a: returned once, then taken again and held across the restart.
    let a1 = w.recv_offer();
    w.puback(&a1);
    w.answer(&a1, b"return");
    let a2 = w.recv_offer();
    assert_eq!((&*a2.payload, attempt(&a2)), (&b"jobs/a"[..], "2"));
    w.puback(&a2);
    // once/b: its one attempt spent and held.
    assert_eq!(
        w.subscribe("$saguin/queue/once", opts(QoS::AtLeastOnce)),
        [1]
    );
    let b1 = w.recv_offer();
    assert_eq!(&*b1.payload, b"once/b");
    w.puback(&b1);
    wait_attempts(&broker.dir, "jobs/a", 2);
    wait_attempts(&broker.dir, "once/b", 1);
    drop(w);
    drop(producer);
    let dir = broker.stop();

    let broker = Broker::start_in(dir, CONFIG);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("once/__dlq/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    let dead = reader.recv_publish();
    assert_eq!(&*dead.payload, b"once/b");
    assert_eq!(
        user_property(&dead, "saguin-dlq-reason"),
        Some("attempts_exhausted")
    );
    assert_eq!(user_property(&dead, "saguin-dlq-attempts"), Some("1"));
    let mut w = worker(&broker, "w");
    let a3 = w.recv_offer();
    assert_eq!((&*a3.payload, attempt(&a3)), (&b"jobs/a"[..], "3"));
    // A Delivery ID issued before the restart resolves nothing (C-151): the job is
    // still held and comes back when returned.
    w.puback(&a3);
    w.answer(&a2, b"ack");
    w.expect_nothing(Duration::from_millis(300));
    w.answer(&a3, b"return");
    let a4 = w.recv_offer();
    assert_eq!(attempt(&a4), "4");
}

/// C-152: a job held (PUBACKed, attempt spent) when the broker stops is offered at once
/// after it starts, not after a visibility timeout.
#[test]
fn a_held_job_is_offered_at_once_after_a_restart() {
    let dir = temp_dir("queue-restart-held");
    let broker = Broker::start_in(dir, CONFIG);
    let mut producer = Raw::connected(broker.addr, V311, "producer");
    assert_eq!(
        producer.publish("jobs/x", b"x", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    w.puback(&offer);
    wait_attempts(&broker.dir, "jobs/x", 1);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, CONFIG);
    let started = std::time::Instant::now();
    let mut w = worker(&broker, "w");
    let again = w.recv_offer();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(&*again.payload, b"x");
    assert_eq!(attempt(&again), "2");
    assert_ne!(
        again.properties.correlation_data,
        offer.properties.correlation_data
    );
}

/// C-150, C-153 after a crash: the attempt counted at PUBACK was committed before the
/// broker died, and the job is offered again at once as the next attempt.
#[test]
fn attempt_counts_survive_a_crash() {
    let dir = temp_dir("queue-crash");
    let mut broker = Broker::start_in(dir.clone(), CONFIG);
    let mut producer = Raw::connected(broker.addr, V311, "producer");
    assert_eq!(
        producer.publish("jobs/c", b"c", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    w.puback(&offer);
    wait_attempts(&dir, "jobs/c", 1);
    broker.signal("KILL");
    let _ = broker.wait_exit();
    broker.dir = std::path::PathBuf::new(); // keep the directory for the restart
    drop(broker);
    let broker = Broker::start_in(dir, CONFIG);
    let mut w = worker(&broker, "w");
    let again = w.recv_offer();
    assert_eq!((&*again.payload, attempt(&again)), (&b"c"[..], "2"));
}

/// [`CONFIG`] on a memory provider with snapshots, in a new directory.
fn on_memory(name: &str) -> (std::path::PathBuf, String) {
    let config = CONFIG.replace(
        "      disk:\n        type: sqlite\n        file_path: {dir}/saguin.db\n",
        "      disk:\n        type: memory\n        max_bytes: 16MiB\n        snapshot_dir: {dir}/snapshots\n",
    );
    let dir = temp_dir(name);
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    (dir, config)
}

/// The same on a memory provider with snapshots: a graceful stop keeps the jobs and
/// their attempts, and they are offered again at once.
#[test]
fn jobs_survive_a_graceful_restart_on_memory_snapshots() {
    let (dir, config) = on_memory("queue-restart-memory");
    let broker = Broker::start_in(dir, &config);
    let mut producer = Raw::connected(broker.addr, V311, "producer");
    for topic in ["jobs/m1", "jobs/m2"] {
        assert_eq!(
            producer.publish(topic, topic.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    assert_eq!(&*offer.payload, b"jobs/m1");
    w.puback(&offer);
    broker.wait_log("leased to w");
    drop(w);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &config);
    let mut w = worker(&broker, "w");
    let first = w.recv_offer();
    assert_eq!((&*first.payload, attempt(&first)), (&b"jobs/m1"[..], "2"));
    w.answer(&first, b"ack");
    let second = w.recv_offer();
    assert_eq!((&*second.payload, attempt(&second)), (&b"jobs/m2"[..], "1"));
}

/// C-129, C-130 across a restart: a job whose first attempt was spent before the
/// broker stopped and whose last after it starts again is dead-lettered telling both
/// times, on sqlite and on memory snapshots alike.
#[test]
fn a_dead_letter_tells_when_attempts_before_a_restart_were_spent() {
    let sqlite = (temp_dir("queue-restart-times"), CONFIG.to_string());
    for (dir, config) in [sqlite, on_memory("queue-restart-times-memory")] {
        let broker = Broker::start_in(dir, &config);
        let mut producer = Raw::connected(broker.addr, V311, "producer");
        assert_eq!(
            producer.publish("twice/t", b"t", QoS::AtLeastOnce, false),
            Some(0)
        );
        let mut w = Raw::connected(broker.addr, V5, "w");
        assert_eq!(
            w.subscribe("$saguin/queue/twice", opts(QoS::AtLeastOnce)),
            [1]
        );
        let first = w.recv_offer();
        let first_from = now_ms();
        w.puback(&first);
        broker.wait_log("leased to w");
        let first_by = now_ms();
        let dir = broker.stop();
        drop(w);

        let broker = Broker::start_in(dir, &config);
        let mut w = Raw::connected(broker.addr, V5, "w");
        assert_eq!(
            w.subscribe("$saguin/queue/twice", opts(QoS::AtLeastOnce)),
            [1]
        );
        let last = w.recv_offer();
        assert_eq!(attempt(&last), "2");
        let last_from = now_ms();
        w.puback(&last);
        broker.wait_log("leased to w");
        let last_by = now_ms();
        w.answer(&last, b"return");
        let mut reader = Raw::connected(broker.addr, V5, "reader");
        assert_eq!(
            reader.subscribe("twice/__dlq/#", opts(QoS::AtLeastOnce)),
            [1]
        );
        let dead = reader.recv_publish();
        assert_eq!(user_property(&dead, "saguin-dlq-attempts"), Some("2"));
        for (key, from, by) in [
            ("saguin-dlq-first", first_from, first_by),
            ("saguin-dlq-last", last_from, last_by),
        ] {
            let at: u64 = user_property(&dead, key)
                .unwrap_or_else(|| panic!("{config}: {key} is missing"))
                .parse()
                .expect("milliseconds");
            assert!(
                (from - CLOCKS..=by + CLOCKS).contains(&at),
                "{key} {at} not in {from}..={by}"
            );
        }
    }
}

/// How far apart the test's wall clock and a queue's lease clock may read: the lease
/// clock runs on the monotonic clock from the broker's start, each read to the
/// millisecond, and is told on the wall clock.
const CLOCKS: u64 = 50;

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.expect("after 1970").as_millis() as u64
}

/// Publishes `n` jobs `jobs/<i>` at QoS 1 without waiting for each PUBACK in turn.
fn put_many(broker: &Broker, n: usize) {
    let mut p = Raw::connected(broker.addr, V311, "bulk-producer");
    for i in 0..n {
        let mut job = common::publish(
            &format!("jobs/{i}"),
            i.to_string().as_bytes(),
            QoS::AtLeastOnce,
            false,
        );
        job.packet_id = Some(u16::try_from(i % 60_000 + 1).expect("a packet id"));
        p.send(&saguin::codec::Packet::Publish(job));
        if i % 500 == 499 {
            // Keep the acknowledgements read as we go.
            for _ in 0..500 {
                assert!(matches!(p.recv(), saguin::codec::Packet::PubAck(a) if a.code == 0));
            }
        }
    }
    for _ in 0..n % 500 {
        assert!(matches!(p.recv(), saguin::codec::Packet::PubAck(a) if a.code == 0));
    }
}

/// Takes `n` offers, acknowledging each, and returns their payloads in order.
fn drain(w: &mut Raw, n: usize) -> Vec<usize> {
    (0..n)
        .map(|_| {
            let offer = w.recv_offer();
            w.puback(&offer);
            w.answer(&offer, b"ack");
            String::from_utf8_lossy(&offer.payload)
                .parse()
                .expect("a job number")
        })
        .collect()
}

/// A queue deeper than the owner's table (4,096 jobs) is offered whole and in order,
/// before and after a restart: the jobs past the table wait in storage, where they
/// already are, and the owner's memory stays one table's worth.
#[test]
fn a_queue_deeper_than_the_owners_table_is_offered_whole_and_in_order() {
    const JOBS: usize = 4_600;
    let dir = temp_dir("queue-deep");
    let broker = Broker::start_in(dir, CONFIG);
    put_many(&broker, JOBS);
    let mut w = worker(&broker, "deep-worker");
    let mut first = drain(&mut w, 299);
    // The last ack at QoS 1: its PUBACK says it is resolved, so the stop below cannot
    // overtake it (a QoS 0 ack in flight at a stop is rightly offered again).
    let last = w.recv_offer();
    w.puback(&last);
    let topic = last
        .properties
        .response_topic
        .clone()
        .expect("a Response Topic");
    let correlation = last.properties.correlation_data.clone();
    assert_eq!(w.answer_qos1(&topic, correlation, b"ack"), 0);
    first.push(
        String::from_utf8_lossy(&last.payload)
            .parse()
            .expect("a job number"),
    );
    assert_eq!(first, (0..300).collect::<Vec<_>>());
    drop(w);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, CONFIG);
    broker.wait_log("4300 jobs waiting");
    let mut w = worker(&broker, "deep-worker");
    let rest = drain(&mut w, JOBS - 300);
    assert_eq!(rest, (300..JOBS).collect::<Vec<_>>());
    w.expect_nothing(Duration::from_millis(300));
}

/// An answer the broker has PUBACKed is applied before a graceful stop ends: no job
/// acknowledged by its worker is offered again after the restart (C-063, C-150).
#[test]
fn answers_acknowledged_before_a_stop_are_kept_across_it() {
    const WORKERS: usize = 48;
    let dir = temp_dir("queue-settle");
    let broker = Broker::start_in(dir, CONFIG);
    put_many(&broker, WORKERS);
    let mut workers: Vec<(Raw, saguin::codec::Publish)> = (0..WORKERS)
        .map(|i| {
            let mut w = worker(&broker, &format!("settle-{i}"));
            let offer = w.recv_offer();
            w.puback(&offer);
            (w, offer)
        })
        .collect();
    // Every answer leaves before any PUBACK is read, so the owner has a full mailbox
    // when the stop arrives.
    for (w, offer) in &mut workers {
        let mut answer = common::publish(
            offer
                .properties
                .response_topic
                .as_deref()
                .expect("a Response Topic"),
            b"ack",
            QoS::AtLeastOnce,
            false,
        );
        answer.packet_id = Some(7);
        answer.properties.edit().correlation_data =
            offer.properties.edit().correlation_data.clone();
        w.send(&saguin::codec::Packet::Publish(answer));
    }
    for (w, _) in &mut workers {
        assert!(matches!(w.recv(), saguin::codec::Packet::PubAck(a) if a.code == 0));
    }
    drop(workers);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, CONFIG);
    let mut w = worker(&broker, "after");
    w.expect_nothing(Duration::from_millis(500));
}

/// gaps A-03, INV-18, C-280: a worker's lasting session keeps its queue form across a
/// restart, a crash or a graceful stop alike: it resumes with Session Present 1 and
/// is offered jobs without subscribing again.
#[test]
fn a_workers_lasting_session_keeps_its_queue_form_across_restarts() {
    for killed in [true, false] {
        let dir = temp_dir("queue-worker-session");
        let broker = Broker::start_in(dir, CONFIG);
        let lasting = |clean| {
            let mut c = common::connect(V5, "steady", clean);
            c.properties.edit().session_expiry_interval = Some(300);
            c
        };
        let (mut w, _) = Raw::handshake(broker.addr, lasting(true));
        assert_eq!(
            w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
            [1]
        );
        let dir = if killed {
            let mut broker = broker;
            broker.signal("KILL");
            broker.wait_exit();
            broker.stop_killed()
        } else {
            w.disconnect();
            broker.wait_log("steady disconnected");
            broker.stop()
        };
        let broker = Broker::start_in(dir, CONFIG);
        let (mut w, ack) = Raw::handshake(broker.addr, lasting(false));
        assert!(ack.session_present, "killed: {killed}");
        let mut producer = Raw::connected(broker.addr, V5, "producer");
        assert_eq!(
            producer.publish("jobs/a", b"work", QoS::AtLeastOnce, false),
            Some(0)
        );
        assert_eq!(&*w.recv_offer().payload, b"work", "killed: {killed}");
    }
}
