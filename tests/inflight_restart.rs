//! An outbound PUBLISH still unacknowledged when the broker stops gracefully goes
//! again, after the restart, under its ORIGINAL packet identifier with DUP set
//! (MQTT-4.4.0-1; the retained value sent on SUBSCRIBE too, C-219): for a session
//! that outlives its connection, the shutdown keeps which identifier went with which
//! broadcast log record or channel record (`broker::released`), and the record sent
//! again from the stored position (B-459) takes it; a new delivery never does. The
//! PUBREL half of the same rule is A-254 (`qos2_outbound.rs`).
//!
//! A crash (SIGKILL) keeps nothing of the kind: the record goes again with DUP from
//! the stored position (B-459) under whatever identifier is free.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::sessions::{
    config, connected, fresh_dir, kill, nothing_more, persistent, released_rows,
};
use common::{Broker, Raw, opts};
use saguin::codec::{self, Packet, ProtocolVersion, QoS};

/// Publishes `payload` to `topic` at QoS 2, `retain` as given, completed 0x00.
fn publish(broker: &Broker, topic: &str, payload: &[u8], retain: bool) {
    let mut p = Raw::connected(broker.addr, ProtocolVersion::V5, "publisher");
    assert_eq!(p.publish(topic, payload, QoS::ExactlyOnce, retain), Some(0));
    p.disconnect();
}

/// The CONNECT of the subscriber `sub`: a session of 300 s on MQTT 5, Clean Start as
/// given; on 3.1.1 always Clean Session 0, the session that outlives its connection.
fn sub_connect(protocol: ProtocolVersion, clean_start: bool) -> codec::Connect {
    match protocol {
        ProtocolVersion::V5 => persistent("sub", clean_start, 300),
        ProtocolVersion::V311 => common::connect(ProtocolVersion::V311, "sub", false),
    }
}

/// The next packet is a PUBLISH of `qos`, not acknowledged; returns it.
fn unanswered(raw: &mut Raw, qos: QoS) -> codec::Publish {
    match raw.recv() {
        Packet::Publish(p) => {
            assert_eq!(p.qos, qos, "{p:?}");
            p
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

/// Completes the exchange `id` at `qos`: PUBACK, or PUBREC, PUBREL, PUBCOMP.
fn complete(raw: &mut Raw, id: u16, qos: QoS) {
    if qos == QoS::AtLeastOnce {
        raw.send(&Packet::PubAck(codec::Ack::new(id, 0)));
        return;
    }
    raw.send(&Packet::PubRec(codec::Ack::new(id, 0)));
    match raw.recv() {
        Packet::PubRel(ack) => assert_eq!((ack.packet_id, ack.code), (id, 0)),
        other => panic!("expected PUBREL {id}, got {other:?}"),
    }
    raw.send(&Packet::PubComp(codec::Ack::new(id, 0)));
}

/// Two publishes to `news/w` the subscriber receives and completes, so the
/// exchanges that follow are not the first identifiers a fresh start hands out.
fn warm_up(broker: &Broker, s: &mut Raw) {
    for payload in [&b"w1"[..], b"w2"] {
        publish(broker, "news/w", payload, false);
        assert_eq!(&*s.recv_publish().payload, payload);
    }
}

/// What the broker sends a resumed session before it goes quiet: each PUBLISH by
/// payload.
fn sent_again(raw: &mut Raw, count: usize) -> BTreeMap<Vec<u8>, codec::Publish> {
    (0..count)
        .map(|_| match raw.recv() {
            Packet::Publish(p) => (p.payload.to_vec(), p),
            other => panic!("MQTT-4.4.0-1: expected the PUBLISH again, got {other:?}"),
        })
        .collect()
}

/// MQTT-4.4.0-1, B-459: a persistent subscriber at `qos` on a broadcast topic and on
/// append channel `channel` (of `provider`) is sent one of each and answers neither;
/// SIGTERM, start on the same files, resume with Clean Start 0: both come again with
/// DUP under their original packet identifiers; a new publish gets another; after
/// the exchanges complete nothing more comes, and (sqlite) nothing of them is left
/// in storage after one more stop.
fn same_ids_after_a_graceful_stop(
    provider: &str,
    channel: &str,
    protocol: ProtocolVersion,
    qos: QoS,
) {
    same_ids_after_graceful_stops(provider, channel, protocol, qos, 1);
}

/// [`same_ids_after_a_graceful_stop`], stopped `stops` times before the subscriber
/// comes back: a start the client does not come back to keeps the identifiers for
/// the next.
fn same_ids_after_graceful_stops(
    provider: &str,
    channel: &str,
    protocol: ProtocolVersion,
    qos: QoS,
    stops: usize,
) {
    let broker = Broker::start_in(fresh_dir(), &config(provider));
    let (mut s, _) = connected(&broker, sub_connect(protocol, true));
    assert_eq!(s.subscribe("news/#", opts(qos)), [qos as u8]);
    let filter = format!("{channel}/#");
    assert_eq!(s.subscribe(&filter, opts(qos)), [qos as u8]);
    warm_up(&broker, &mut s);
    publish(&broker, "news/a", b"broadcast", false);
    let broadcast = unanswered(&mut s, qos);
    publish(&broker, &format!("{channel}/a"), b"record", false);
    let record = unanswered(&mut s, qos);
    let ids = [broadcast.packet_id, record.packet_id].map(|id| id.expect("a packet id"));
    assert!(ids.iter().all(|id| *id > 2), "{ids:?}: after the warm-up's");
    let mut dir = broker.stop();
    drop(s);
    if provider == "local" {
        assert_eq!(
            released_rows(&dir),
            1,
            "one row for the session's exchanges"
        );
    }
    for _ in 1..stops {
        dir = Broker::start_in(dir, &config(provider)).stop();
    }

    let broker = Broker::start_in(dir, &config(provider));
    let (mut s, present) = connected(&broker, sub_connect(protocol, false));
    assert!(present, "Session Present 1");
    let again = sent_again(&mut s, 2);
    for (payload, id) in [(&b"broadcast"[..], ids[0]), (b"record", ids[1])] {
        let p = &again[payload];
        assert!(p.dup, "MQTT-4.4.0-1: DUP set on {p:?}");
        assert_eq!(p.qos, qos);
        assert_eq!(
            p.packet_id,
            Some(id),
            "MQTT-4.4.0-1: {:?} under its original packet identifier",
            String::from_utf8_lossy(payload)
        );
    }
    s.expect_nothing(Duration::from_millis(500));
    publish(&broker, "news/b", b"new", false);
    let new = unanswered(&mut s, qos);
    assert!(!new.dup);
    let new_id = new.packet_id.expect("a packet id");
    assert!(
        !ids.contains(&new_id),
        "a new delivery takes {new_id}, one kept"
    );
    for id in ids.into_iter().chain([new_id]) {
        complete(&mut s, id, qos);
    }
    nothing_more(&mut s, Duration::from_millis(600));
    s.disconnect();
    broker.wait_log("sub disconnected");
    let dir = broker.stop();
    if provider == "local" {
        assert_eq!(released_rows(&dir), 0, "nothing kept once completed");
    }
    let broker = Broker::start_in(dir, &config(provider));
    let (mut s, present) = connected(&broker, sub_connect(protocol, false));
    assert!(present);
    s.expect_nothing(Duration::from_millis(600));
}

#[test]
fn mqtt_4_4_0_1_v5_qos2_keeps_its_packet_ids_across_a_graceful_stop_sqlite() {
    same_ids_after_a_graceful_stop("local", "events", ProtocolVersion::V5, QoS::ExactlyOnce);
}

#[test]
fn mqtt_4_4_0_1_v5_qos1_keeps_its_packet_ids_across_a_graceful_stop_sqlite() {
    same_ids_after_a_graceful_stop("local", "events", ProtocolVersion::V5, QoS::AtLeastOnce);
}

#[test]
fn mqtt_4_4_0_1_v311_qos2_keeps_its_packet_ids_across_a_graceful_stop_sqlite() {
    same_ids_after_a_graceful_stop("local", "events", ProtocolVersion::V311, QoS::ExactlyOnce);
}

#[test]
fn mqtt_4_4_0_1_v5_qos2_keeps_its_packet_ids_across_a_graceful_stop_memory() {
    same_ids_after_a_graceful_stop("volatile", "memlog", ProtocolVersion::V5, QoS::ExactlyOnce);
}

#[test]
fn mqtt_4_4_0_1_v311_qos1_keeps_its_packet_ids_across_a_graceful_stop_memory() {
    same_ids_after_a_graceful_stop(
        "volatile",
        "memlog",
        ProtocolVersion::V311,
        QoS::AtLeastOnce,
    );
}

#[test]
fn mqtt_4_4_0_1_packet_ids_kept_across_two_graceful_stops_the_client_away_between() {
    same_ids_after_graceful_stops("local", "events", ProtocolVersion::V5, QoS::ExactlyOnce, 2);
}

/// C-219, MQTT-4.4.0-1: the retained value a SUBSCRIBE at QoS 1 sent a persistent
/// session, unacknowledged at a graceful stop, goes again after the restart with
/// RETAIN and DUP set under the same packet identifier.
#[test]
fn c219_a_retained_value_sent_on_subscribe_keeps_its_packet_id_across_a_graceful_stop() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    publish(&broker, "ret/a", b"retained", true);
    let (mut s, _) = connected(&broker, persistent("sub", true, 300));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    warm_up(&broker, &mut s);
    assert_eq!(s.subscribe("ret/#", opts(QoS::AtLeastOnce)), [1]);
    let first = unanswered(&mut s, QoS::AtLeastOnce);
    assert!(first.retain && &*first.payload == b"retained");
    let id = first.packet_id.expect("a packet id");
    let dir = broker.stop();
    drop(s);

    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, persistent("sub", false, 300));
    assert!(present);
    let again = unanswered(&mut s, QoS::AtLeastOnce);
    assert_eq!(&*again.payload, b"retained");
    assert!(again.retain, "C-219: RETAIN set");
    assert!(again.dup, "MQTT-4.4.0-1: DUP set");
    assert_eq!(
        again.packet_id,
        Some(id),
        "C-219: the same packet identifier"
    );
    complete(&mut s, id, QoS::AtLeastOnce);
    nothing_more(&mut s, Duration::from_millis(600));
}

/// B-459 after a crash: SIGKILL keeps no packet identifier (only a graceful stop
/// does), so the unacknowledged record comes again with DUP from the stored position,
/// under an identifier not asserted here. The stop before the crash had kept the
/// identifiers; the start between read and forgot them, so nothing stale is used.
#[test]
fn b459_after_sigkill_the_record_comes_again_with_dup_its_id_not_kept() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut s, _) = connected(&broker, persistent("sub", true, 300));
    assert_eq!(s.subscribe("news/#", opts(QoS::ExactlyOnce)), [2]);
    warm_up(&broker, &mut s);
    publish(&broker, "news/a", b"broadcast", false);
    unanswered(&mut s, QoS::ExactlyOnce);
    let dir = broker.stop();
    drop(s);
    assert_eq!(
        released_rows(&dir),
        1,
        "MQTT-4.4.0-1: kept at the graceful stop"
    );
    // Started: it listens once what the start read is forgotten in storage.
    let dir = kill(Broker::start_in(dir, &config("local")));
    assert_eq!(released_rows(&dir), 0, "read and forgotten at the start");

    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, persistent("sub", false, 300));
    assert!(present);
    let again = unanswered(&mut s, QoS::ExactlyOnce);
    assert_eq!(&*again.payload, b"broadcast");
    assert!(again.dup, "B-459: DUP set");
    let id = again.packet_id.expect("a packet id");
    complete(&mut s, id, QoS::ExactlyOnce);
    nothing_more(&mut s, Duration::from_millis(600));
}

/// MQTT-4.6.0-5 (3.1.1 §4.6): what one publisher sent to one topic reaches a
/// subscriber in that order, what is sent again included. After a graceful stop the
/// first two go again under their kept identifiers and the third takes a free one
/// below them; when the connection drops before any is acknowledged, the next
/// connection gets all three again in the order they were first sent, which the
/// identifiers no longer tell (nor do they once they wrap past 65,535).
#[test]
fn a_resumed_session_gets_its_exchanges_again_in_the_order_they_were_sent() {
    let v5 = ProtocolVersion::V5;
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut s, _) = connected(&broker, sub_connect(v5, true));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    warm_up(&broker, &mut s);
    for payload in [&b"one"[..], b"two"] {
        publish(&broker, "news/a", payload, false);
        unanswered(&mut s, QoS::AtLeastOnce);
    }
    let dir = broker.stop();
    drop(s);
    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, sub_connect(v5, false));
    assert!(present, "Session Present 1");
    let kept: Vec<u16> = (0..2)
        .filter_map(|_| unanswered(&mut s, QoS::AtLeastOnce).packet_id)
        .collect();
    publish(&broker, "news/a", b"three", false);
    let third = unanswered(&mut s, QoS::AtLeastOnce)
        .packet_id
        .expect("an id");
    assert!(
        kept.iter().all(|id| third < *id),
        "the case: a new identifier ({third}) below the kept ones ({kept:?})"
    );
    drop(s);
    broker.wait_log("sub disconnected");
    let (mut s, present) = connected(&broker, sub_connect(v5, false));
    assert!(present);
    let order: Vec<Vec<u8>> = (0..3)
        .map(|_| unanswered(&mut s, QoS::AtLeastOnce).payload.to_vec())
        .collect();
    assert_eq!(order, [&b"one"[..], b"two", b"three"], "MQTT-4.6.0-5");
}
