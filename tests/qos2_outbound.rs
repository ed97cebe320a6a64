//! An outbound QoS 2 exchange's PUBREC survives a restart (A-254; MQTT-4.4.0-1 for
//! the PUBREL): for a session that outlives its connection, the PUBREC of a delivery
//! from the broadcast log or a channel is written to `broker.session.storage` before
//! the PUBREL goes, so after SIGKILL the resumed session gets the PUBREL again under
//! the same packet identifier and never the PUBLISH a second time; a store that
//! cannot write it ends the connection with DISCONNECT 0x80 and no PUBREL, and the
//! PUBLISH comes again with DUP when the session resumes.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::sessions::{
    config, connected, fresh_dir, kill, nothing_more, persistent, released_rows,
};
use common::{Broker, Raw, WriteLock, opts};
use saguin::codec::{self, Packet, ProtocolVersion::V5, QoS};

/// Publishes `payload` to `topic` at QoS 2, completed 0x00.
fn publish(broker: &Broker, topic: &str, payload: &[u8]) {
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(p.publish(topic, payload, QoS::ExactlyOnce, false), Some(0));
    p.disconnect();
}

/// The next packet is a QoS 2 PUBLISH of `payload`; returns it.
fn published(raw: &mut Raw, payload: &[u8]) -> codec::Publish {
    match raw.recv() {
        Packet::Publish(p) => {
            assert_eq!(p.qos, QoS::ExactlyOnce);
            assert_eq!(&*p.payload, payload);
            p
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

/// Sends PUBREC for `id` and expects its PUBREL.
fn pubrec(raw: &mut Raw, id: u16) {
    raw.send(&Packet::PubRec(codec::Ack::new(id, 0)));
    expect_pubrel(raw, id);
}

fn expect_pubrel(raw: &mut Raw, id: u16) {
    match raw.recv() {
        Packet::PubRel(ack) => assert_eq!((ack.packet_id, ack.code), (id, 0)),
        other => panic!("expected PUBREL {id}, got {other:?}"),
    }
}

/// A persistent subscriber on `filter` at QoS 2, still connected.
fn subscriber(broker: &Broker, filter: &str) -> Raw {
    let (mut s, _) = connected(broker, persistent("sub", true, 300));
    assert_eq!(s.subscribe(filter, opts(QoS::ExactlyOnce)), [2]);
    s
}

/// Resumes the subscriber's session after a restart: Session Present 1, and the
/// PUBREL of `id` comes again (MQTT-4.4.0-1) - not the PUBLISH.
fn resumed(broker: &Broker, id: u16) -> Raw {
    let (mut s, present) = connected(broker, persistent("sub", false, 300));
    assert!(present, "Session Present 1");
    expect_pubrel(&mut s, id);
    s
}

/// A persistent subscriber on `filter` gets a QoS 2 publish to `topic` and answers
/// PUBREC, gets PUBREL and does not answer it; then SIGKILL. Returns the directory
/// and the exchange's packet identifier; the exchange is kept there.
fn released_then_killed(filter: &str, topic: &str) -> (PathBuf, u16) {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let mut s = subscriber(&broker, filter);
    publish(&broker, topic, b"once");
    let id = published(&mut s, b"once").packet_id.expect("a packet id");
    pubrec(&mut s, id);
    let dir = kill(broker);
    drop(s);
    assert_eq!(released_rows(&dir), 1, "A-254: kept before the PUBREL");
    (dir, id)
}

/// The subscriber `s`, its exchanges completed, leaves: nothing of them stays in
/// storage, and after one more restart its session has nothing to send again.
fn nothing_after_restart(broker: Broker, s: Raw) {
    s.disconnect();
    broker.wait_log("sub disconnected");
    let dir = kill(broker);
    assert_eq!(released_rows(&dir), 0, "forgotten after their PUBCOMP");
    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, persistent("sub", false, 300));
    assert!(present);
    s.expect_nothing(Duration::from_millis(600));
}

/// A-254 (sqlite, broadcast log): a PUBREC the subscriber sent before SIGKILL is
/// kept; the resumed session is sent PUBREL under the same packet identifier and
/// never the PUBLISH again; after PUBCOMP nothing more, and the kept row goes.
#[test]
fn a254_a_broadcast_pubrec_survives_sigkill_and_its_pubrel_comes_again() {
    let (dir, id) = released_then_killed("news/#", "news/a");
    let broker = Broker::start_in(dir, &config("local"));
    let mut s = resumed(&broker, id);
    s.send(&Packet::PubComp(codec::Ack::new(id, 0)));
    s.expect_nothing(Duration::from_millis(600));
    nothing_after_restart(broker, s);
}

/// A-254 (sqlite, append channel): the channel record whose PUBREC came, its
/// position not yet past it, is not read again as a PUBLISH after SIGKILL; its PUBREL
/// comes again, and a new delivery gets another packet identifier.
#[test]
fn a254_a_channel_pubrec_survives_sigkill_and_its_record_is_not_sent_again() {
    let (dir, id) = released_then_killed("events/#", "events/a");
    let broker = Broker::start_in(dir, &config("local"));
    let mut s = resumed(&broker, id);
    s.expect_nothing(Duration::from_millis(600));
    publish(&broker, "events/b", b"next");
    let next = published(&mut s, b"next").packet_id.expect("a packet id");
    assert_ne!(next, id, "a new exchange never takes a released one's id");
    s.send(&Packet::PubComp(codec::Ack::new(id, 0)));
    pubrec(&mut s, next);
    s.send(&Packet::PubComp(codec::Ack::new(next, 0)));
    nothing_more(&mut s, Duration::from_millis(600));
    nothing_after_restart(broker, s);
}

/// a PUBREC the store cannot record is answered DISCONNECT 0x80 and no
/// PUBREL; the exchange resumes with the session: the PUBLISH comes again with DUP
/// under the same packet identifier (MQTT-4.4.0-1), and completes.
#[test]
fn a254_a_pubrec_the_store_cannot_record_gets_disconnect_0x80_and_no_pubrel() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let mut s = subscriber(&broker, "news/#");
    publish(&broker, "news/a", b"once");
    let first = published(&mut s, b"once");
    let id = first.packet_id.expect("a packet id");
    assert!(!first.dup);

    let lock = WriteLock::take(&broker);
    s.set_timeout(Duration::from_secs(20));
    s.send(&Packet::PubRec(codec::Ack::new(id, 0)));
    match s.recv() {
        Packet::Disconnect(d) => assert_eq!(d.code, 0x80, "A-254"),
        other => panic!("A-254: expected DISCONNECT 0x80 and no PUBREL, got {other:?}"),
    }
    drop(lock);
    drop(s);

    let (mut s, present) = connected(&broker, persistent("sub", false, 300));
    assert!(present, "the session outlives the refused PUBREC");
    let again = published(&mut s, b"once");
    assert!(again.dup, "MQTT-4.4.0-1: sent again with DUP");
    assert_eq!(again.packet_id, Some(id));
    pubrec(&mut s, id);
    s.send(&Packet::PubComp(codec::Ack::new(id, 0)));
    nothing_more(&mut s, Duration::from_millis(600));
}

/// A-254 (memory provider): released exchanges of the broadcast log and of a channel
/// of the memory provider survive a graceful stop through the snapshot; their PUBRELs
/// come again and their PUBLISHes do not.
#[test]
fn a254_released_exchanges_survive_a_graceful_stop_on_memory() {
    let broker = Broker::start_in(fresh_dir(), &config("volatile"));
    let mut s = subscriber(&broker, "news/#");
    assert_eq!(s.subscribe("memlog/#", opts(QoS::ExactlyOnce)), [2]);
    publish(&broker, "news/a", b"once");
    let news = published(&mut s, b"once").packet_id.expect("a packet id");
    publish(&broker, "memlog/a", b"kept");
    let memlog = published(&mut s, b"kept").packet_id.expect("a packet id");
    pubrec(&mut s, news);
    pubrec(&mut s, memlog);
    let dir = broker.stop();
    drop(s);
    assert!(dir.join("snapshots/held.qos2").exists(), "A-254: kept");

    let broker = Broker::start_in(dir, &config("volatile"));
    let (mut s, present) = connected(&broker, persistent("sub", false, 300));
    assert!(present);
    let mut ids = [0; 2];
    for id in &mut ids {
        match s.recv() {
            Packet::PubRel(ack) => *id = ack.packet_id,
            other => panic!("MQTT-4.4.0-1: expected PUBREL, got {other:?}"),
        }
    }
    ids.sort_unstable();
    let mut want = [news, memlog];
    want.sort_unstable();
    assert_eq!(ids, want, "the same packet identifiers");
    s.expect_nothing(Duration::from_millis(600));
    for id in ids {
        s.send(&Packet::PubComp(codec::Ack::new(id, 0)));
    }
    s.expect_nothing(Duration::from_millis(300));
    s.disconnect();
    broker.wait_log("sub disconnected");
    let dir = broker.stop();
    assert!(!dir.join("snapshots/held.qos2").exists(), "forgotten");
}

/// A-254 on MQTT 3.1.1, which has no DISCONNECT to send: a PUBREC the store cannot
/// record closes the connection with no PUBREL, and the resumed session sends the
/// PUBLISH again with DUP.
#[test]
fn a254_a_v311_pubrec_the_store_cannot_record_closes_with_no_pubrel() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let v311 = || common::connect(codec::ProtocolVersion::V311, "sub", false);
    let (mut s, _) = connected(&broker, v311());
    assert_eq!(s.subscribe("news/#", opts(QoS::ExactlyOnce)), [2]);
    publish(&broker, "news/a", b"once");
    let id = published(&mut s, b"once").packet_id.expect("a packet id");

    let lock = WriteLock::take(&broker);
    s.set_timeout(Duration::from_secs(20));
    s.send(&Packet::PubRec(codec::Ack::new(id, 0)));
    s.expect_closed_silently();
    drop(lock);

    let (mut s, present) = connected(&broker, v311());
    assert!(present);
    let again = published(&mut s, b"once");
    assert!(again.dup, "MQTT-4.4.0-1: sent again with DUP");
    assert_eq!(again.packet_id, Some(id));
}

/// A-254 after a seek: the consumer seeks its channel past a record whose exchange
/// is released and not completed, then SIGKILL. The stored position has passed the
/// record, but the exchange was never completed: the resumed session is sent its
/// PUBREL again under the same packet identifier (MQTT-4.4.0-1), and the record is
/// not sent again.
#[test]
fn a254_a_released_exchange_a_seek_passed_gets_its_pubrel_after_sigkill() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let mut s = subscriber(&broker, "events/#");
    publish(&broker, "events/a", b"once");
    let id = published(&mut s, b"once").packet_id.expect("a packet id");
    pubrec(&mut s, id);
    assert_eq!(
        s.publish(
            "$saguin/consumer/events/seek",
            b"1",
            QoS::AtLeastOnce,
            false
        ),
        Some(0),
        "the seek past the record is stored"
    );
    let dir = kill(broker);
    drop(s);
    assert_eq!(released_rows(&dir), 1, "A-254: kept before the PUBREL");
    let broker = Broker::start_in(dir, &config("local"));
    let mut s = resumed(&broker, id);
    s.expect_nothing(Duration::from_millis(600));
    s.send(&Packet::PubComp(codec::Ack::new(id, 0)));
    nothing_more(&mut s, Duration::from_millis(600));
    nothing_after_restart(broker, s);
}
