//! Offers, answers and leases end to end (issue 6; RFC 0003 "queue - Delivery",
//! "Acknowledgement and return", "Attempts, timeout, and redelivery").

mod common;

use std::time::{Duration, Instant};

use common::{Broker, Raw, opts, publish, user_property};
use saguin::codec::{
    Packet,
    ProtocolVersion::{V5, V311},
    QoS,
};

const CHANNELS: &str = "channels:
  jobs:
    type: queue
    filter: jobs/#
    visibility_timeout: 1s
  other:
    type: queue
    filter: other/#
";

const FORM: &str = "$saguin/queue/jobs";

fn start() -> Broker {
    Broker::start(CHANNELS)
}

fn worker(broker: &Broker, id: &str) -> Raw {
    let mut w = Raw::connected(broker.addr, V5, id);
    assert_eq!(w.subscribe(FORM, opts(QoS::AtLeastOnce)), [1]);
    w
}

fn put(broker: &Broker, topic: &str, payload: &[u8]) {
    let mut p = Raw::connected(broker.addr, V311, "producer");
    assert_eq!(p.publish(topic, payload, QoS::AtLeastOnce, false), Some(0));
}

fn attempt(offer: &saguin::codec::Publish) -> &str {
    user_property(offer, "saguin-attempt").expect("saguin-attempt")
}

/// C-048..C-057, A-04: the publisher's topic, payload and properties, the queue's
/// Response Topic and a Delivery ID of at most 32 bytes as Correlation Data (replacing
/// the publisher's), and the saguin- properties.
/// A-100, A-101: offered at QoS 1 with Response Topic and Correlation Data.
#[test]
fn an_offer_is_the_original_message_plus_the_queues_properties() {
    let broker = start();
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    let mut p = publish("jobs/resize/42", b"\x00payload", QoS::AtLeastOnce, false);
    p.properties.edit().content_type = Some("image/png".into());
    p.properties.edit().message_expiry_interval = Some(3600);
    p.properties.edit().correlation_data = Some(b"publisher's".to_vec());
    p.properties.edit().response_topic = Some("replies/x".into());
    p.properties.edit().user_properties = vec![("trace".into(), "t-1".into())];
    assert_eq!(producer.publish_packet(p), Some(0));
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    assert_eq!(offer.qos, QoS::AtLeastOnce);
    assert!(!offer.retain);
    assert_eq!(&*offer.topic, "jobs/resize/42");
    assert_eq!(&*offer.payload, b"\x00payload");
    assert_eq!(offer.properties.content_type.as_deref(), Some("image/png"));
    assert_eq!(
        offer.properties.response_topic.as_deref(),
        Some("$saguin/queue/jobs/response")
    );
    let id = offer
        .properties
        .correlation_data
        .clone()
        .expect("a Delivery ID");
    assert!(!id.is_empty() && id.len() <= 32 && id != b"publisher's");
    assert_eq!(user_property(&offer, "trace"), Some("t-1"));
    assert!(user_property(&offer, "saguin-id").is_some_and(|v| !v.is_empty()));
    assert_eq!(user_property(&offer, "saguin-offset"), Some("0"));
    let ts: u64 = user_property(&offer, "saguin-timestamp")
        .and_then(|v| v.parse().ok())
        .expect("saguin-timestamp");
    let expires: u64 = user_property(&offer, "saguin-expires")
        .and_then(|v| v.parse().ok())
        .expect("saguin-expires");
    assert_eq!(expires, ts + 3_600_000);
    assert_eq!(attempt(&offer), "1");
}

/// C-074, C-040, C-065, C-061, C-039, C-073, C-204, C-059: one job at a time; an ack resolves it and the next is
/// offered at once, not on the owner's next tick; a resolved job never comes back.
/// A-100, A-102: one job at a time; `ack` on the response topic, Correlation Data echoed.
#[test]
fn ack_resolves_and_the_next_job_follows_at_once() {
    const JOBS: usize = 21;
    let broker = start();
    for n in 0..JOBS {
        put(&broker, &format!("jobs/{n}"), format!("{n}").as_bytes());
    }
    let mut w = worker(&broker, "w");
    let first = w.recv_offer();
    assert_eq!(&*first.payload, b"0");
    w.puback(&first);
    // One job per worker per queue, whatever the Receive Maximum (C-063).
    w.expect_nothing(Duration::from_millis(500));
    // Twenty answers, each followed by the next offer. Offered on the tick instead,
    // each would wait half a tick on average (TICK is 200 ms): 2 s in all, under
    // 1 s about once in twenty thousand runs. At once, a slow machine has 50 ms each.
    let mut offer = first;
    let answered = Instant::now();
    for n in 1..JOBS {
        w.answer(&offer, b"ack");
        offer = w.recv_offer();
        assert_eq!(&*offer.payload, format!("{n}").as_bytes(), "in order");
        w.puback(&offer);
    }
    let took = answered.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "twenty offers each at once, not on a tick: {took:?}"
    );
    w.answer(&offer, b"ack");
    // Past the visibility timeout: nothing comes back.
    w.expect_nothing(Duration::from_millis(1500));
}

/// C-046: offers go round robin over the workers that can take one. A-103.
/// A-114: every subscriber to the form is one worker population.
#[test]
fn offers_take_turns_over_free_workers() {
    let broker = start();
    let mut a = worker(&broker, "a");
    let mut b = worker(&broker, "b");
    for i in 0..4 {
        put(&broker, &format!("jobs/{i}"), format!("{i}").as_bytes());
    }
    let ja = a.recv_offer();
    let jb = b.recv_offer();
    assert_ne!(ja.payload, jb.payload);
    a.puback(&ja);
    b.puback(&jb);
    a.answer(&ja, b"ack");
    b.answer(&jb, b"ack");
    let (na, nb) = (a.recv_offer(), b.recv_offer());
    let mut got: Vec<Vec<u8>> = [&ja, &jb, &na, &nb]
        .iter()
        .map(|p| p.payload.to_vec())
        .collect();
    got.sort();
    assert_eq!(got, [b"0", b"1", b"2", b"3"]);
}

/// C-062: a worker on two queues holds one job from each.
#[test]
fn a_worker_holds_one_job_from_each_queue() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    put(&broker, "other/1", b"o");
    let mut w = Raw::connected(broker.addr, V5, "w");
    w.send(&Packet::Subscribe(saguin::codec::Subscribe {
        packet_id: 1,
        properties: Default::default(),
        filters: vec![
            (FORM.into(), opts(QoS::AtLeastOnce)),
            ("$saguin/queue/other".into(), opts(QoS::AtLeastOnce)),
        ],
    }));
    let mut got = Vec::new();
    for _ in 0..3 {
        match w.recv() {
            Packet::SubAck(ack) => assert_eq!(ack.codes, [1, 1]),
            Packet::Publish(p) => got.push(p.payload.to_vec()),
            other => panic!("unexpected {other:?}"),
        }
    }
    got.sort();
    assert_eq!(got, [b"j".to_vec(), b"o".to_vec()]);
}

/// C-084, C-078, C-071, C-089, C-041, C-083: an ack from another session is acknowledged and
/// ignored; the job comes back as attempt 2 with a new Delivery ID once the visibility
/// timeout (from the PUBACK) passes.
#[test]
fn an_ack_from_another_session_is_ignored_and_the_job_times_out() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    w.puback(&offer);
    let mut stranger = Raw::connected(broker.addr, V5, "stranger");
    let code = stranger.answer_qos1(
        "$saguin/queue/jobs/response",
        offer.properties.correlation_data.clone(),
        b"ack",
    );
    assert_eq!(code, 0, "C-082: the PUBACK says nothing about the answer");
    let again = w.recv_offer();
    assert_eq!(&*again.payload, b"j");
    assert_eq!(attempt(&again), "2");
    assert_ne!(
        again.properties.correlation_data,
        offer.properties.correlation_data
    );
}

/// C-092, C-091: after a redelivery to another worker, the first worker's late ack resolves
/// nothing: the second still holds the job and can return it.
#[test]
fn a_late_ack_after_redelivery_changes_nothing() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut a = worker(&broker, "a");
    let first = a.recv_offer();
    a.puback(&first);
    let mut b = worker(&broker, "b");
    // a times out (1s); b is the free worker by then... or a again: take whichever.
    std::thread::sleep(Duration::from_millis(1400));
    let (mut holder, mut idle, second) = match b.try_recv() {
        Ok(Packet::Publish(p)) => (b, a, p),
        other => panic!("expected the job at b after a timed out, got {other:?}"),
    };
    holder.puback(&second);
    idle.answer(&first, b"ack"); // stale Delivery ID, and not the holder
    std::thread::sleep(Duration::from_millis(300));
    holder.answer(&second, b"return");
    let third = match idle.try_recv() {
        Ok(Packet::Publish(p)) => p,
        other => panic!("the returned job comes back, got {other:?}"),
    };
    assert_eq!(&*third.payload, b"j");
    assert_eq!(attempt(&third), "3");
}

/// C-081: a payload that is neither `ack` nor `return` is ignored.
#[test]
fn a_payload_other_than_ack_or_return_is_ignored() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    put(&broker, "jobs/2", b"k");
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    w.puback(&offer);
    for bad in [&b"ACK"[..], b"ack\n", b""] {
        w.answer(&offer, bad);
    }
    w.expect_nothing(Duration::from_millis(500));
    // Still held: it times out and is redelivered.
    let again = w.recv_offer();
    assert_eq!((&*again.payload, attempt(&again)), (&b"j"[..], "2"));
}

/// A-213: the PUBACK of a response judges only its topic: a malformed payload at
/// QoS 1 is acknowledged 0x00, logged as ignored, the worker told nothing more, and
/// the job still held.
#[test]
fn a_malformed_response_is_acknowledged_by_its_topic_and_only_logged_a213() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    w.puback(&offer);
    let correlation = offer.properties.correlation_data.clone();
    assert_eq!(
        w.answer_qos1("$saguin/queue/jobs/response", correlation, b"done!"),
        0
    );
    broker.wait_log("its payload is neither ack nor return");
    w.expect_nothing(Duration::from_millis(300));
    let again = w.recv_offer();
    assert_eq!((&*again.payload, attempt(&again)), (&b"j"[..], "2"));
}

/// C-075, C-087, C-041: `return` before the PUBACK counts the attempt; the job comes back.
/// A-102: a worker returns a delivery on the response topic.
#[test]
fn return_before_puback_counts_and_the_job_comes_back() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    w.answer(&offer, b"return");
    w.puback(&offer);
    let again = w.recv_offer();
    assert_eq!(attempt(&again), "2");
}

/// C-037, C-036: no deadline while DELIVERING: a worker that never PUBACKs keeps its job
/// past the visibility timeout.
#[test]
fn a_job_without_puback_is_never_timed_out() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut w = worker(&broker, "w");
    let mut other = worker(&broker, "other");
    let offer = match (w.try_recv(), ()) {
        (Ok(Packet::Publish(p)), ()) => p,
        (got, ()) => panic!("expected the offer at w, got {got:?}"),
    };
    other.expect_nothing(Duration::from_millis(2500));
    w.answer(&offer, b"ack");
}

/// C-090, C-038, A-01, A-03, C-041: a connection ending returns its job at once; one never
/// acknowledged goes back with its attempt unspent.
#[test]
fn a_workers_connection_ending_returns_its_job_at_once() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut a = worker(&broker, "a");
    let first = a.recv_offer();
    assert_eq!(attempt(&first), "1");
    let mut b = worker(&broker, "b");
    a.disconnect();
    let again = b.recv_offer();
    assert_eq!(attempt(&again), "1", "no PUBACK: the attempt is unspent");
    b.puback(&again);
    drop(b); // a dropped socket, not a DISCONNECT
    let mut c = worker(&broker, "c");
    let third = c.recv_offer();
    assert_eq!(attempt(&third), "2");
}

/// A-193, C-214: a retained publish into a queue is work, its flag dropped.
#[test]
fn a_retained_publish_into_a_queue_is_ordinary_work() {
    let broker = start();
    let mut p = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(p.publish("jobs/r", b"r", QoS::AtLeastOnce, true), Some(0));
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    assert!(!offer.retain);
    let mut late = Raw::connected(broker.addr, V5, "late");
    assert_eq!(late.subscribe("#", opts(QoS::AtLeastOnce)), [1]);
    late.expect_nothing(Duration::from_millis(300));
}

/// A-13, A-207: a response naming no queue is refused 0x90.
#[test]
fn a_response_naming_no_queue_is_refused_0x90() {
    let broker = start();
    let mut c = Raw::connected(broker.addr, V5, "c");
    assert_eq!(
        c.answer_qos1("$saguin/queue/nothing/response", None, b"ack"),
        0x90
    );
    assert_eq!(
        c.answer_qos1("$saguin/queue/jobs/response", None, b"ack"),
        0
    );
    assert_eq!(c.answer_qos1("$saguin/queue/jobs", None, b"ack"), 0x90);
}

/// C-065/C-066, C-039 with Receive Maximum 1: the PUBACK that reopens the window offers the
/// next job, even when the answer came first.
#[test]
fn receive_maximum_1_drains_when_the_answer_precedes_the_puback() {
    let broker = start();
    for i in 0..5 {
        put(&broker, &format!("jobs/{i}"), b"x");
    }
    let mut w = Raw::connected_with_receive_maximum(broker.addr, "w", Some(1));
    assert_eq!(w.subscribe(FORM, opts(QoS::AtLeastOnce)), [1]);
    for _ in 0..5 {
        let offer = w.recv_offer();
        w.answer(&offer, b"ack");
        w.puback(&offer);
    }
    w.expect_nothing(Duration::from_millis(1300));
}

/// Gaps A-03: a session taken over by a new connection is never sent the old offer
/// again; the job went back when the old connection ended and is offered afresh,
/// attempt unspent, with a new Delivery ID.
#[test]
fn a_resumed_worker_session_gets_a_fresh_offer_not_a_stale_one() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut c = common::connect(V5, "w", false);
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut old, ack) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(ack.code, 0);
    assert_eq!(old.subscribe(FORM, opts(QoS::AtLeastOnce)), [1]);
    let stale = old.recv_offer();
    let (mut new, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    let fresh = new.recv_offer();
    assert!(!fresh.dup, "the stale offer is not re-sent");
    assert_eq!(attempt(&fresh), "1");
    assert_ne!(
        fresh.properties.correlation_data,
        stale.properties.correlation_data
    );
    new.expect_nothing(Duration::from_millis(300));
}

/// MQTT-3.3.4-3: an offer carries the Subscription Identifier of the form's SUBSCRIBE.
#[test]
fn an_offer_carries_the_forms_subscription_identifier() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut w = Raw::connected(broker.addr, V5, "w");
    let props = saguin::codec::Properties::from(saguin::codec::PropertyValues {
        subscription_identifiers: vec![7],
        ..Default::default()
    });
    assert_eq!(w.subscribe_with(FORM, opts(QoS::AtLeastOnce), props), [1]);
    let offer = w.recv_offer();
    assert_eq!(offer.properties.subscription_identifiers, [7]);
}

/// B-511, C-058, C-137: a job whose publisher-set expiry has passed is still offered, carrying
/// `saguin-expires` in the past; the publisher's clock removes nothing.
#[test]
fn a_job_past_its_publishers_expiry_is_still_offered() {
    let broker = start();
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    let mut p = publish("jobs/late", b"late", QoS::AtLeastOnce, false);
    p.properties.edit().message_expiry_interval = Some(1);
    assert_eq!(producer.publish_packet(p), Some(0));
    std::thread::sleep(Duration::from_millis(1300));
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    assert_eq!(&*offer.payload, b"late");
    let expires: u64 = user_property(&offer, "saguin-expires")
        .and_then(|v| v.parse().ok())
        .expect("saguin-expires");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    assert!(expires < now, "the expiry has passed");
    assert_eq!(offer.properties.message_expiry_interval, None);
}

/// Gaps A-13: an answer at QoS 2 is applied, and its exchange completes (PUBREC 0x00,
/// PUBCOMP 0x00).
#[test]
fn an_answer_at_qos_2_is_applied() {
    let broker = start();
    put(&broker, "jobs/1", b"one");
    put(&broker, "jobs/2", b"two");
    let mut w = worker(&broker, "w");
    let first = w.recv_offer();
    w.puback(&first);
    let mut answer = publish(
        "$saguin/queue/jobs/response",
        b"ack",
        QoS::ExactlyOnce,
        false,
    );
    answer.properties.edit().correlation_data = first.properties.correlation_data.clone();
    w.send(&Packet::Publish(answer));
    let mut next = None;
    let mut completed = false;
    while next.is_none() || !completed {
        match w.recv() {
            Packet::PubRec(ack) => {
                assert_eq!(ack.code, 0);
                w.send(&Packet::PubRel(saguin::codec::Ack::new(ack.packet_id, 0)));
            }
            Packet::PubComp(ack) => {
                assert_eq!(ack.code, 0);
                completed = true;
            }
            Packet::Publish(p) => next = Some(p),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(next.map(|p| p.payload.to_vec()), Some(b"two".to_vec()));
}

/// A-167, gaps G-13: answers at QoS 2 are held until their PUBREL like any other QoS 2
/// publish - a re-sent one is answered again, and one past
/// `broker.qos2.max_inflight_per_client` (20) is refused 0x97 with the connection kept.
#[test]
fn answers_at_qos_2_count_against_the_qos2_allowance() {
    let broker = start();
    let mut w = worker(&broker, "w");
    let answer = |id: u16, dup: bool| {
        let mut p = publish(
            "$saguin/queue/jobs/response",
            b"ack",
            QoS::ExactlyOnce,
            false,
        );
        p.properties.edit().correlation_data = Some(format!("none-{id}").into_bytes());
        p.packet_id = Some(id);
        p.dup = dup;
        Packet::Publish(p)
    };
    let code_of = |w: &mut Raw, packet: Packet| {
        w.send(&packet);
        match w.recv() {
            Packet::PubRec(ack) => ack.code,
            other => panic!("expected PUBREC, got {other:?}"),
        }
    };
    for id in 1..=20u16 {
        assert_eq!(code_of(&mut w, answer(id, false)), 0);
    }
    assert_eq!(
        code_of(&mut w, answer(20, true)),
        0,
        "a re-send is answered again"
    );
    assert_eq!(code_of(&mut w, answer(21, false)), 0x97);
    w.send(&Packet::PubRel(saguin::codec::Ack::new(1, 0)));
    assert!(matches!(w.recv(), Packet::PubComp(ack) if ack.code == 0));
    assert_eq!(
        code_of(&mut w, answer(21, false)),
        0,
        "room again after a PUBREL"
    );
}

/// Everything that accumulates is bounded (gaps INV-13): a queue's owner held up by
/// its store is not handed answers past its mailbox's bound (4,096 events, and 1,024
/// answers past that); the answer past it is refused 0x97, and the worker may answer
/// again.
#[test]
fn answers_past_a_held_up_owners_mailbox_are_refused_0x97() {
    let broker = common::start_with_channels();
    let mut w = Raw::connected(broker.addr, V5, "w");
    assert_eq!(
        w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut p = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        p.publish("work/a/todo", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    let offer = w.recv_offer();
    w.puback(&offer);
    let lock = common::WriteLock::take(&broker);
    // The ack's removal waits on the store, and the owner with it.
    w.answer(&offer, b"ack");
    for n in 0..6000u32 {
        let mut answer = publish(
            "$saguin/queue/jobs/response",
            b"ack",
            QoS::AtMostOnce,
            false,
        );
        answer.properties.edit().correlation_data = Some(n.to_be_bytes().to_vec());
        w.send(&Packet::Publish(answer));
    }
    let code = w.answer_qos1(
        "$saguin/queue/jobs/response",
        Some(b"late".to_vec()),
        b"ack",
    );
    assert_eq!(code, 0x97);
    drop(lock);
}

/// B-307: hanging a worker up ($saguin/sessions/disconnect) returns the job it holds
/// to the other workers at once.
#[test]
fn hanging_up_a_worker_returns_its_job_at_once() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut a = worker(&broker, "a");
    let held = a.recv_offer();
    a.puback(&held);
    let mut b = worker(&broker, "b");
    let mut operator = Raw::connected(broker.addr, V5, "operator");
    let mut hang_up = publish("$saguin/sessions/disconnect", b"a", QoS::AtLeastOnce, false);
    hang_up.properties.edit().response_topic = Some("ops/reply".into());
    assert_eq!(operator.publish_packet(hang_up), Some(0));
    assert_eq!(a.expect_disconnect(), 0x98);
    let again = b.recv_offer();
    assert_eq!(&*again.payload, b"j");
}

/// C-066: a PUBACK of a broadcast delivery that reopens a worker's full window
/// (Receive Maximum 1) wakes the queue's owner, which offers the waiting job then, not
/// on its next tick. The owner's debug line says the wake came from the window.
#[test]
fn a_broadcast_puback_that_reopens_the_window_offers_the_next_job() {
    let broker = start();
    let mut w = Raw::connected_with_receive_maximum(broker.addr, "w", Some(1));
    assert_eq!(w.subscribe(FORM, opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(w.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(
        publisher.publish("news/1", b"n", QoS::AtLeastOnce, false),
        Some(0)
    );
    let news = w.recv_offer();
    assert_eq!(&*news.topic, "news/1");
    put(&broker, "jobs/1", b"j");
    // The window is full: the job waits, through at least one of the owner's ticks.
    w.expect_nothing(Duration::from_millis(450));
    w.puback(&news);
    broker.wait_log("queue jobs: w's window reopened");
    let offer = w.recv_offer();
    assert_eq!(&*offer.payload, b"j");
}

/// C-066: the PUBACK of another queue's offer that reopens the window wakes this
/// queue's owner too: one mechanism, whatever was acknowledged.
#[test]
fn another_queues_puback_that_reopens_the_window_offers_the_next_job() {
    let broker = start();
    let mut w = Raw::connected_with_receive_maximum(broker.addr, "w", Some(1));
    assert_eq!(w.subscribe(FORM, opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(
        w.subscribe("$saguin/queue/other", opts(QoS::AtLeastOnce)),
        [1]
    );
    put(&broker, "other/1", b"o");
    let other = w.recv_offer();
    assert_eq!(&*other.payload, b"o");
    put(&broker, "jobs/1", b"j");
    w.expect_nothing(Duration::from_millis(450));
    w.puback(&other);
    broker.wait_log("queue jobs: w's window reopened");
    let offer = w.recv_offer();
    assert_eq!(&*offer.payload, b"j");
}

/// C-251, C-252: a Will whose topic the queue claims is an ordinary job, offered with a
/// Delivery ID and the queue's Response Topic, and taken back by the visibility timeout.
#[test]
fn a_will_into_a_queue_is_a_job_reclaimed_by_the_visibility_timeout_c251_c252() {
    let broker = start();
    let mut c = common::connect(V5, "dies", true);
    c.will = Some(saguin::codec::Will {
        topic: "jobs/will".into(),
        payload: b"gone".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    });
    let (raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0);
    drop(raw);
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    assert_eq!(
        (&*offer.topic, &*offer.payload),
        ("jobs/will", &b"gone"[..])
    );
    assert_eq!(
        offer.properties.response_topic.as_deref(),
        Some("$saguin/queue/jobs/response")
    );
    assert!(
        offer
            .properties
            .correlation_data
            .as_ref()
            .is_some_and(|id| !id.is_empty())
    );
    assert_eq!(attempt(&offer), "1");
    w.puback(&offer);
    // No answer: past the 1 s visibility timeout the job comes back.
    let again = w.recv_offer();
    assert_eq!((&*again.payload, attempt(&again)), (&b"gone"[..], "2"));
}

/// C-072: Delivery IDs are matched by exact bytes: an `ack` whose Correlation Data
/// differs by one byte resolves nothing, and the job times out.
#[test]
fn an_ack_with_correlation_data_off_by_one_byte_is_ignored_c072() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut w = worker(&broker, "w");
    let offer = w.recv_offer();
    w.puback(&offer);
    let mut id = offer
        .properties
        .correlation_data
        .clone()
        .expect("a Delivery ID");
    let last = id.len() - 1;
    id[last] ^= 1;
    assert_eq!(
        w.answer_qos1("$saguin/queue/jobs/response", Some(id), b"ack"),
        0
    );
    let again = w.recv_offer();
    assert_eq!((&*again.payload, attempt(&again)), (&b"j"[..], "2"));
}

/// C-079: the fencing check runs on `return` too: after a redelivery, the first
/// worker's stale `return` takes nothing from the holder.
#[test]
fn a_stale_return_after_redelivery_changes_nothing_c079() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut a = worker(&broker, "a");
    let first = a.recv_offer();
    a.puback(&first);
    let mut b = worker(&broker, "b");
    std::thread::sleep(Duration::from_millis(1400));
    let second = match b.try_recv() {
        Ok(Packet::Publish(p)) => p,
        other => panic!("expected the job at b after a timed out, got {other:?}"),
    };
    b.puback(&second);
    a.answer(&first, b"return"); // stale: a no longer holds it
    // Had it been applied the job would be free and offered to a at once.
    a.expect_nothing(Duration::from_millis(500));
    b.answer(&second, b"ack");
    a.expect_nothing(Duration::from_millis(1200));
    b.expect_nothing(Duration::from_millis(100));
}

/// C-091: a `return` advances the delivery epoch: the Delivery ID just used is dead,
/// so an `ack` naming it after the job came back resolves nothing.
#[test]
fn a_returned_jobs_old_delivery_id_is_dead_c091() {
    let broker = start();
    put(&broker, "jobs/1", b"j");
    let mut w = worker(&broker, "w");
    let first = w.recv_offer();
    w.puback(&first);
    w.answer(&first, b"return");
    let second = w.recv_offer();
    assert_eq!(attempt(&second), "2");
    assert_ne!(
        second.properties.correlation_data,
        first.properties.correlation_data
    );
    w.puback(&second);
    w.answer(&first, b"ack"); // the dead Delivery ID
    // Still held under the new one: it times out and comes back as attempt 3.
    let third = w.recv_offer();
    assert_eq!((&*third.payload, attempt(&third)), (&b"j"[..], "3"));
}

/// B-038: a client write that blocks does not hold the queue's loop: with one worker's
/// socket full and a 60 s write_timeout, another worker is offered jobs at once.
#[test]
fn a_blocked_write_does_not_hold_the_queues_offers_b038() {
    let broker = Broker::start(
        "  limits:\n    write_timeout: 60s\n    max_message_size: 256KiB\n    max_connect_size: 100KiB\nchannels:\n  jobs:\n    type: queue\n    filter: jobs/#\n    visibility_timeout: 1h\n",
    );
    let mut deaf = worker(&broker, "deaf");
    assert_eq!(deaf.subscribe("flood/#", opts(QoS::AtMostOnce)), [0]);
    // From here on `deaf` reads nothing: broadcast fills its socket and the write waits.
    let mut publisher = Raw::connected(broker.addr, V5, "flooder");
    let payload = vec![b'x'; 200 * 1024];
    for _ in 0..100 {
        assert_eq!(
            publisher.publish("flood/x", &payload, QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let mut next = worker(&broker, "next");
    let asked = Instant::now();
    for i in 0..3 {
        put(&broker, &format!("jobs/{i}"), b"j");
    }
    let offer = next.recv_offer();
    assert_eq!(&*offer.payload, b"j");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "offered while the other write waits, after {:?}",
        asked.elapsed()
    );
    drop(deaf);
}

/// B-039: a worker hung up at write_timeout (its socket full of broadcast) gives
/// its lease back as any worker that goes: the job goes to the next worker long
/// before its visibility_timeout.
#[test]
fn a_worker_hung_up_at_write_timeout_gives_its_lease_back_b039() {
    let broker = Broker::start(
        "  limits:\n    write_timeout: 1s\n    max_message_size: 256KiB\n    max_connect_size: 100KiB\nchannels:\n  jobs:\n    type: queue\n    filter: jobs/#\n    visibility_timeout: 1h\n",
    );
    let mut deaf = worker(&broker, "deaf");
    assert_eq!(deaf.subscribe("flood/#", opts(QoS::AtMostOnce)), [0]);
    put(&broker, "jobs/1", b"j");
    let offer = deaf.recv_offer();
    deaf.puback(&offer);
    // From here on `deaf` reads nothing: broadcast fills its socket.
    let mut publisher = Raw::connected(broker.addr, V5, "flooder");
    let payload = vec![b'x'; 200 * 1024];
    for _ in 0..100 {
        assert_eq!(
            publisher.publish("flood/x", &payload, QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    broker.wait_log("write_timeout passed");
    let mut next = worker(&broker, "next");
    let again = next.recv_offer();
    assert_eq!(&*again.payload, b"j");
    drop(deaf);
}
