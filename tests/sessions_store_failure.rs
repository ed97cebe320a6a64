//! A session store that refuses a write (B-462..B-464): another process holds
//! sqlite's write lock past the broker's 5 s busy timeout, which is how a disk that
//! stops taking writes looks from the broker. The client is told, and nothing it was
//! told happened changes.

mod common;

use std::time::Duration;

use common::{Broker, CHANNELS, Raw, WriteLock, opts};
use saguin::codec::{
    self, Packet,
    ProtocolVersion::{V5, V311},
    QoS,
};

const STORAGE_ERROR: u8 = 0x83;

/// CHANNELS with `broker.session.storage` on the sqlite provider.
fn start() -> Broker {
    let dir = common::temp_dir("session-store-failure");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let yaml = CHANNELS.replace(
        "  id: channels-test\n",
        "  id: channels-test\n  session:\n    storage: local\n",
    );
    Broker::start_in(dir, &yaml)
}

fn persistent(protocol: codec::ProtocolVersion, client_id: &str) -> codec::Connect {
    let mut c = common::connect(protocol, client_id, false);
    if protocol == V5 {
        c.properties.edit().session_expiry_interval = Some(300);
    }
    c
}

/// How long an answer may take here: every refusal waits out the broker's 5 s busy
/// timeout first, and a loaded machine (the whole suite beside it) stretches that.
const BEHIND_THE_LOCK: Duration = Duration::from_secs(30);

fn connected(broker: &Broker, c: codec::Connect) -> Raw {
    let (mut raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0, "CONNACK {ack:?}");
    raw.set_timeout(BEHIND_THE_LOCK);
    raw
}

/// A CONNECT's answer, given [`BEHIND_THE_LOCK`] to come.
fn handshake(broker: &Broker, c: codec::Connect) -> codec::ConnAck {
    let mut raw = Raw::open(broker.addr, c.protocol);
    raw.set_timeout(BEHIND_THE_LOCK);
    raw.send(&Packet::Connect(Box::new(c)));
    match raw.recv() {
        Packet::ConnAck(ack) => ack,
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

fn unsubscribe(raw: &mut Raw, filter: &str) {
    raw.send(&Packet::Unsubscribe(codec::Unsubscribe {
        packet_id: 9,
        properties: Default::default(),
        filters: vec![filter.into()],
    }));
}

fn publish(broker: &Broker, topic: &str) {
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(p.publish(topic, b"x", QoS::AtLeastOnce, false), Some(0));
    p.disconnect();
}

/// B-462: a CONNECT whose session the store cannot write is refused 0x83, logged;
/// once the store takes writes again the same CONNECT is accepted.
#[test]
fn a_connect_the_store_refuses_is_answered_0x83_b462() {
    let broker = start();
    let lock = WriteLock::take(&broker);
    let ack = handshake(&broker, persistent(V5, "device"));
    assert_eq!(ack.code, STORAGE_ERROR, "{ack:?}");
    broker.wait_log("the session record of \"device\" could not be written");
    drop(lock);
    let (_, ack) = Raw::handshake(broker.addr, persistent(V5, "device"));
    assert_eq!((ack.code, ack.session_present), (0, false), "{ack:?}");
}

/// A SUBSCRIBE whose session the store cannot write is answered 0x83 and the filter
/// is given back: nothing published under it afterwards is delivered.
#[test]
fn a_subscribe_the_store_refuses_is_answered_0x83_and_not_kept() {
    let broker = start();
    let mut s = connected(&broker, persistent(V5, "subscriber"));
    let lock = WriteLock::take(&broker);
    assert_eq!(
        s.subscribe("news/#", opts(QoS::AtLeastOnce)),
        [STORAGE_ERROR]
    );
    drop(lock);
    publish(&broker, "news/today");
    s.expect_nothing(Duration::from_millis(300));
}

/// B-463: an UNSUBSCRIBE that cannot be stored is answered 0x83 per filter and the
/// client stays subscribed.
#[test]
fn an_unsubscribe_the_store_refuses_keeps_the_subscription_b463() {
    let broker = start();
    let mut s = connected(&broker, persistent(V5, "subscriber"));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    let lock = WriteLock::take(&broker);
    unsubscribe(&mut s, "news/#");
    match s.recv() {
        Packet::UnsubAck(ack) => assert_eq!(ack.codes, [STORAGE_ERROR]),
        other => panic!("expected UNSUBACK, got {other:?}"),
    }
    drop(lock);
    publish(&broker, "news/today");
    assert_eq!(&*s.recv_publish().topic, "news/today");
}

/// B-464: an MQTT 3.1.1 client, whose UNSUBACK has no code to refuse with, is
/// disconnected when its UNSUBSCRIBE cannot be stored.
#[test]
fn a_v311_unsubscribe_the_store_refuses_disconnects_b464() {
    let broker = start();
    let mut s = connected(&broker, persistent(V311, "old-timer"));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    let _lock = WriteLock::take(&broker);
    unsubscribe(&mut s, "news/#");
    assert!(
        s.read_to_close().is_empty(),
        "closed with no UNSUBACK written"
    );
}

/// B-457: a durable consumer's positions are written beside its read loop, not in
/// it. While a write waits on a store that does not take it (the broker's 5 s busy
/// timeout), the connection still answers its client: a PINGREQ is answered at
/// once, not after the write gives up.
#[test]
fn a_position_write_the_store_holds_up_does_not_stop_the_connection_b457() {
    let broker = start();
    publish(&broker, "events/a");
    let mut reader = connected(&broker, persistent(V5, "slow-store"));
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    let got = reader.recv_publish();
    let lock = WriteLock::take(&broker);
    // The position moves, and its write waits on the lock.
    reader.puback(&got);
    std::thread::sleep(Duration::from_millis(200));
    let asked = std::time::Instant::now();
    reader.send(&Packet::PingReq);
    assert!(
        matches!(reader.recv(), Packet::PingResp),
        "a PINGRESP comes"
    );
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "answered while the write waits (the busy timeout is 5 s), after {waited:?}"
    );
    drop(lock);
}
