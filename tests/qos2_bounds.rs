//! `broker.qos2` (B-438, B-439, A-167, A-264, A-269): how many exactly-once publishes
//! one client may hold before their PUBREL, and how long they are held.

mod common;

use std::time::Duration;

use common::{Broker, Raw, connect, opts, publish};
use saguin::codec::{Ack, Packet, ProtocolVersion::V5, QoS};

fn held(id: u16, payload: &[u8]) -> saguin::codec::Publish {
    let mut p = publish("q2/held", payload, QoS::ExactlyOnce, false);
    p.packet_id = Some(id);
    p
}

fn pubrec(raw: &mut Raw) -> Ack {
    match raw.recv() {
        Packet::PubRec(ack) => ack,
        other => panic!("expected PUBREC, got {other:?}"),
    }
}

fn pubcomp(raw: &mut Raw) -> Ack {
    match raw.recv() {
        Packet::PubComp(ack) => ack,
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
}

#[test]
fn past_max_inflight_per_client_a_qos2_publish_gets_pubrec_0x97_and_the_connection_stays() {
    // A-167, B-439: the next is refused on its PUBREC before ownership is taken; once
    // one of the client's own exchanges completes, the next is accepted.
    let broker = Broker::start("  qos2:\n    max_inflight_per_client: 3\n");
    let mut sub = Raw::connected(broker.addr, V5, "q2-sub");
    // At QoS 1 the subscriber's own exchanges stay out of the way of the count.
    sub.subscribe("q2/held", opts(QoS::AtLeastOnce));
    let mut raw = Raw::connected(broker.addr, V5, "q2-pub");
    for id in 1..=3 {
        raw.send(&Packet::Publish(held(id, b"kept")));
        assert_eq!(pubrec(&mut raw).code, 0, "publish {id} is held");
    }
    raw.send(&Packet::Publish(held(4, b"refused")));
    let refused = pubrec(&mut raw);
    assert_eq!((refused.packet_id, refused.code), (4, 0x97));
    // Refused means not owned: its PUBREL finds nothing and nothing is delivered.
    raw.send(&Packet::PubRel(Ack::new(4, 0)));
    assert_eq!(pubcomp(&mut raw).code, 0x92);
    raw.send(&Packet::PubRel(Ack::new(1, 0)));
    assert_eq!(pubcomp(&mut raw).code, 0);
    assert_eq!(&*sub.recv_publish().payload, b"kept");
    raw.send(&Packet::Publish(held(5, b"room again")));
    assert_eq!(
        pubrec(&mut raw).code,
        0,
        "one exchange completed: room for one"
    );
    for id in [2, 3, 5] {
        raw.send(&Packet::PubRel(Ack::new(id, 0)));
        assert_eq!(pubcomp(&mut raw).code, 0);
    }
    let payloads: Vec<Vec<u8>> = (0..3)
        .map(|_| sub.recv_publish().payload.to_vec())
        .collect();
    assert_eq!(
        payloads,
        [b"kept".to_vec(), b"kept".to_vec(), b"room again".to_vec()]
    );
    sub.expect_nothing(Duration::from_millis(200));
}

#[test]
fn by_default_the_21st_unreleased_qos2_publish_is_refused_0x97() {
    // B-438: max_inflight_per_client defaults to 20, inside the advertised window.
    let broker = Broker::start("");
    let (mut raw, ack) = Raw::handshake(broker.addr, connect(V5, "twenty", true));
    assert_eq!(ack.properties.receive_maximum, Some(32));
    for id in 1..=20 {
        raw.send(&Packet::Publish(held(id, b"x")));
        assert_eq!(pubrec(&mut raw).code, 0);
    }
    raw.send(&Packet::Publish(held(21, b"x")));
    assert_eq!(pubrec(&mut raw).code, 0x97);
}

/// B-445: QoS 2 state on /metrics: the publishes held until their PUBREL, the
/// abandoned count and the configured per-client bound.
#[test]
fn qos2_state_is_exposed_as_metrics_b445() {
    let broker = Broker::start(
        "  qos2:\n    max_inflight_per_client: 7\n  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\n",
    );
    let mut raw = Raw::connected(broker.addr, V5, "q2-metered");
    for id in 1..=3 {
        raw.send(&Packet::Publish(held(id, b"held")));
        assert_eq!(pubrec(&mut raw).code, 0);
    }
    raw.send(&Packet::PubRel(Ack::new(1, 0)));
    assert_eq!(pubcomp(&mut raw).code, 0);
    // One scrape: the answer is kept for min_scrape_interval.
    let ops = broker.ops_socket();
    let (status, body) = common::http_get(ops, "/metrics");
    assert_eq!(status, 200);
    for line in [
        "saguin_qos2_held 2",
        "saguin_qos2_abandoned_total 0",
        "saguin_qos2_max_inflight_per_client 7",
    ] {
        assert!(body.lines().any(|l| l == line), "no {line:?} in {body}");
    }
}

/// B-440: past expires_after the held publish is dropped; a late PUBREL gets 0x92.
#[test]
fn a_held_qos2_publish_is_abandoned_after_expires_after_and_its_late_pubrel_gets_0x92() {
    // an exchange that outlived broker.qos2.expires_after is gone.
    let broker = Broker::start("  qos2:\n    expires_after: 1s\n");
    let mut sub = Raw::connected(broker.addr, V5, "late-sub");
    sub.subscribe("q2/held", opts(QoS::ExactlyOnce));
    let mut raw = Raw::connected(broker.addr, V5, "late-pub");
    raw.send(&Packet::Publish(held(7, b"too late")));
    assert_eq!(pubrec(&mut raw).code, 0);
    broker.wait_log("QoS 2 publishes abandoned");
    raw.send(&Packet::PubRel(Ack::new(7, 0)));
    assert_eq!(pubcomp(&mut raw).code, 0x92);
    sub.expect_nothing(Duration::from_millis(200));
}
