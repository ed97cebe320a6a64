//! A queue's subscription form and its refusals, and nothing else ever receiving a
//! queue's records (issue 6; RFC 0002 "What each channel type admits", the SUBACK
//! table; RFC 0003 "queue - Delivery").

mod common;

use std::time::Duration;

use common::{Broker, Raw, opts};
use saguin::codec::{
    Packet,
    ProtocolVersion::{V5, V311},
    QoS, SubscriptionOptions,
};

const CHANNELS: &str = "channels:
  jobs:
    type: queue
    filter: work/#
  events:
    type: append
";

fn start() -> Broker {
    Broker::start(CHANNELS)
}

/// QoS 1 is granted 1, QoS 2 is granted 1, QoS 0 is refused 0x83.
#[test]
fn the_form_is_granted_at_qos_1_only() {
    let broker = start();
    let mut w = Raw::connected(broker.addr, V5, "w");
    assert_eq!(
        w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(
        w.subscribe("$saguin/queue/jobs", opts(QoS::ExactlyOnce)),
        [1]
    );
    let mut z = Raw::connected(broker.addr, V5, "z");
    assert_eq!(
        z.subscribe("$saguin/queue/jobs", opts(QoS::AtMostOnce)),
        [0x83]
    );
}

/// C-043, C-044, A-105: No Local on the form is refused 0x8F, saying which filter, and
/// the connection stands.
#[test]
fn no_local_is_refused_0x8f_and_the_connection_stands() {
    let broker = start();
    let mut w = Raw::connected(broker.addr, V5, "w");
    let no_local = SubscriptionOptions {
        no_local: true,
        ..opts(QoS::AtLeastOnce)
    };
    w.send(&Packet::Subscribe(saguin::codec::Subscribe {
        packet_id: 1,
        properties: Default::default(),
        filters: vec![("$saguin/queue/jobs".into(), no_local)],
    }));
    match w.recv() {
        Packet::SubAck(ack) => {
            assert_eq!(ack.codes, [0x8F]);
            // C-044: the Reason String names the filter to change.
            let why = ack.properties.reason_string.clone().unwrap_or_default();
            assert!(
                why.contains("$saguin/queue/jobs") && why.contains("No Local"),
                "{why}"
            );
        }
        other => panic!("expected SUBACK, got {other:?}"),
    }
    assert_eq!(
        w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
}

/// A-107..A-111, A-096: every other spelling under `$saguin/queue/` is refused 0x8F.
/// a queue has exactly one valid subscription form.
#[test]
fn every_other_spelling_under_the_prefix_is_refused_0x8f() {
    let broker = start();
    let mut w = Raw::connected(broker.addr, V5, "w");
    for filter in [
        "$saguin/queue/jobs/#",
        "$saguin/queue/jobs/w-7",
        "$saguin/queue/jobs/response",
        "$saguin/queue/#",
        "$saguin/queue/+",
        "$saguin/queue/events",
        "$saguin/queue/jobs__dlq",
        "$saguin/queue/nothing",
        "$saguin/queue/JOBS",
    ] {
        assert_eq!(
            w.subscribe(filter, opts(QoS::AtLeastOnce)),
            [0x8F],
            "{filter}"
        );
    }
    // the rest of $saguin/ is still 0x87; A-134: so is the form inside $share.
    assert_eq!(w.subscribe("$saguin/#", opts(QoS::AtLeastOnce)), [0x87]);
    assert_eq!(
        w.subscribe("$share/g/$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [0x87]
    );
}

/// a 3.1.1 client is refused the form with 0x80.
#[test]
fn a_311_worker_is_refused_0x80() {
    let broker = start();
    let mut w = Raw::connected(broker.addr, V311, "old");
    assert_eq!(
        w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [0x80]
    );
}

/// C-042, A-113, A-121, invariant 11: `#`, a crossing filter and a shared group inside
/// the queue are granted and never see a job; the worker does.
/// only the form's subscriber is offered the job.
/// a shared filter lying inside a queue is granted, not refused for what it reaches.
#[test]
fn nothing_but_the_form_receives_a_queues_records() {
    let broker = start();
    let mut all = Raw::connected(broker.addr, V5, "all");
    assert_eq!(all.subscribe("#", opts(QoS::AtLeastOnce)), [1]);
    let mut group = Raw::connected(broker.addr, V5, "group");
    assert_eq!(
        group.subscribe("$share/g/work/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut inside = Raw::connected(broker.addr, V5, "inside");
    assert_eq!(inside.subscribe("work/a", opts(QoS::AtLeastOnce)), [0x8F]);
    let mut publisher = Raw::connected(broker.addr, V311, "producer");
    assert_eq!(
        publisher.publish("work/a", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut worker = Raw::connected(broker.addr, V5, "worker");
    assert_eq!(
        worker.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    let offer = worker.recv_offer();
    assert_eq!(&*offer.payload, b"job");
    all.expect_nothing(Duration::from_millis(400));
    group.expect_nothing(Duration::from_millis(100));
}

/// the refusal is decided at SUBSCRIBE on the filter as sent, not on the topics
/// it would match: `work/a` lies inside the queue and is 0x8F, while `+/a`, which
/// matches the same job's topic, crosses it, is granted, and is sent no job.
#[test]
fn the_filter_as_sent_decides_its_refusal_a069() {
    let broker = start();
    let mut s = Raw::connected(broker.addr, V5, "s");
    assert_eq!(s.subscribe("work/a", opts(QoS::AtLeastOnce)), [0x8F]);
    assert_eq!(s.subscribe("+/a", opts(QoS::AtLeastOnce)), [1]);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        publisher.publish("work/a", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        publisher.publish("else/a", b"live", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(&*s.recv_publish().payload, b"live");
    s.expect_nothing(Duration::from_millis(300));
}

/// A-097, gaps G-19: a SUBSCRIBE asking for deletions (`saguin-deletions: true`) may
/// name a queue's form beside its other filters; the form is granted, and offered
/// jobs, as in any other SUBSCRIBE.
#[test]
fn the_form_beside_saguin_deletions_is_granted() {
    let broker = start();
    let mut w = Raw::connected(broker.addr, V5, "w");
    let mut properties = saguin::codec::Properties::default();
    properties.edit().user_properties = vec![("saguin-deletions".into(), "true".into())];
    w.send(&Packet::Subscribe(saguin::codec::Subscribe {
        packet_id: 2,
        properties,
        filters: vec![
            ("events/#".into(), opts(QoS::AtLeastOnce)),
            ("$saguin/queue/jobs".into(), opts(QoS::AtLeastOnce)),
        ],
    }));
    assert!(matches!(w.recv(), Packet::SubAck(a) if a.codes == [1, 1]));
    let mut producer = Raw::connected(broker.addr, V5, "p");
    assert_eq!(
        producer.publish("work/a", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(&*w.recv_offer().payload, b"job");
}
