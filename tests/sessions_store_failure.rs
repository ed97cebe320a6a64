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

/// A session that outlives its connection, subscribed to `filter` at QoS 1 and gone.
fn subscribe_and_leave(broker: &Broker, client_id: &str, filter: &str) {
    let mut s = connected(broker, persistent(V5, client_id));
    assert_eq!(s.subscribe(filter, opts(QoS::AtLeastOnce)), [1]);
    s.disconnect();
}

/// Publishes `once` to `topic` at QoS 2 under packet id `id`, expecting PUBREC 0x00:
/// held until its PUBREL.
fn held_qos2(p: &mut Raw, topic: &str, id: u16) {
    let mut held = common::publish(topic, b"once", QoS::ExactlyOnce, false);
    held.packet_id = Some(id);
    p.send(&Packet::Publish(held));
    match p.recv() {
        Packet::PubRec(ack) => assert_eq!(ack.code, 0),
        other => panic!("expected PUBREC, got {other:?}"),
    }
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

/// the store's failure at CONNECT is 0x03 Server unavailable for 3.1.1, a
/// Will in the record it could not write included.
#[test]
fn a_v311_connect_the_store_refuses_is_answered_0x03_a234() {
    let broker = start();
    let lock = WriteLock::take(&broker);
    let mut c = persistent(V311, "old-device");
    c.will = Some(codec::Will {
        topic: "gone/old-device".into(),
        payload: b"bye".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    });
    let ack = handshake(&broker, c.clone());
    assert_eq!((ack.code, ack.session_present), (0x03, false), "{ack:?}");
    drop(lock);
    assert_eq!(handshake(&broker, c).code, 0);
}

/// a PUBREL whose release the store cannot write (not for room) is DISCONNECT
/// 0x83 and the message stays held: once the store takes writes again, the PUBREL
/// sent on the next connection completes it, and the record is written once.
#[test]
fn a_pubrel_the_store_cannot_release_is_disconnect_0x83_and_stays_held_a260() {
    let broker = start();
    let mut p = connected(&broker, persistent(V5, "releaser"));
    held_qos2(&mut p, "events/held", 7);
    let lock = WriteLock::take(&broker);
    p.send(&Packet::PubRel(codec::Ack::new(7, 0)));
    assert_eq!(p.expect_disconnect(), STORAGE_ERROR);
    drop(lock);
    let (mut again, ack) = Raw::handshake(broker.addr, persistent(V5, "releaser"));
    assert!(ack.code == 0 && ack.session_present, "{ack:?}");
    again.send(&Packet::PubRel(codec::Ack::new(7, 0)));
    match again.recv() {
        Packet::PubComp(ack) => assert_eq!(ack.code, 0, "still held, now released"),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(&*reader.recv_publish().payload, b"once");
    reader.expect_nothing(Duration::from_millis(300));
}

/// G-13, G-14, A-260: a QoS 2 broadcast whose PUBREL's broadcast-log write fails
/// has already reached its live subscribers. The publisher is told DISCONNECT 0x83,
/// and the exchange is done: the PUBREL it sends again on its next connection is
/// answered PUBCOMP 0x00 without handing the message out a second time, and the
/// stored copy is forgotten. It stayed held, and was routed again to every
/// subscriber.
#[test]
fn a_qos2_broadcast_whose_log_write_fails_is_not_handed_out_twice() {
    let broker = start();
    // A session that outlives its connection is owed it: the log is written.
    subscribe_and_leave(&broker, "sleeper", "news/#");
    let mut live = Raw::connected(broker.addr, V5, "live");
    assert_eq!(live.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    let mut p = connected(&broker, persistent(V5, "announcer"));
    held_qos2(&mut p, "news/a", 7);
    let lock = WriteLock::take(&broker);
    p.send(&Packet::PubRel(codec::Ack::new(7, 0)));
    assert_eq!(&*live.recv_publish().payload, b"once");
    assert_eq!(p.expect_disconnect(), STORAGE_ERROR);
    drop(lock);
    let db = rusqlite::Connection::open(broker.dir.join("saguin.db")).expect("open the db");
    let held_rows = || {
        db.query_row(
            "SELECT count(*) FROM held WHERE client_id = 'announcer'",
            [],
            |row| row.get::<_, i64>(0),
        )
        .expect("count")
    };
    assert_eq!(held_rows(), 1, "kept until the exchange completes");
    let (mut again, ack) = Raw::handshake(broker.addr, persistent(V5, "announcer"));
    assert!(ack.code == 0 && ack.session_present, "{ack:?}");
    again.send(&Packet::PubRel(codec::Ack::new(7, 0)));
    match again.recv() {
        Packet::PubComp(ack) => assert_eq!(ack.code, 0, "the exchange completes"),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    live.expect_nothing(Duration::from_millis(500));
    // Its stored copy is forgotten with it, so a restart cannot bring it back.
    common::wait_until("the held copy forgotten", || held_rows() == 0);
    // The session it was owed to keeps it in memory, and gets it once.
    let mut sleeper = connected(&broker, persistent(V5, "sleeper"));
    assert_eq!(&*sleeper.recv_publish().payload, b"once");
    sleeper.expect_nothing(Duration::from_millis(500));
}

/// a Clean Start whose ending of what it replaces the store refuses
/// (here the old session's channel positions, on a sqlite provider, while the
/// session record is on a memory one) is refused CONNACK 0x83: Sagüin ends it before
/// the CONNACK, so the DISCONNECT 0x83 after one never has to be sent.
#[test]
fn a_clean_start_whose_old_positions_cannot_be_discarded_gets_0x83_a261() {
    let dir = common::temp_dir("discard-refused");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let yaml = CHANNELS.replace(
        "  id: channels-test\n",
        "  id: channels-test\n  session:\n    storage: volatile\n  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\n",
    );
    let broker = Broker::start_in(dir, &yaml);
    publish(&broker, "events/a");
    let mut reader = connected(&broker, persistent(V5, "consumer"));
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    reader.recv_publish();
    reader.disconnect();
    let lock = WriteLock::take(&broker);
    let mut raw = Raw::open(broker.addr, V5);
    raw.set_timeout(BEHIND_THE_LOCK);
    raw.send(&Packet::Connect(Box::new(fresh_consumer())));
    let ack = match raw.recv() {
        Packet::ConnAck(ack) => ack,
        other => panic!("expected CONNACK, got {other:?}"),
    };
    drop(lock);
    assert_eq!(ack.code, STORAGE_ERROR, "{ack:?}");
    // Counted as the storage failure it is (B-462).
    broker.assert_metric("saguin_storage_errors_total 1");
    // The next CONNECT begins the session again.
    let (_, ack) = Raw::handshake(broker.addr, fresh_consumer());
    assert_eq!((ack.code, ack.session_present), (0, false));
}

fn fresh_consumer() -> saguin::codec::Connect {
    let mut fresh = persistent(V5, "consumer");
    fresh.clean_start = true;
    fresh
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

/// B-470: a SUBSCRIBE the store refuses leaves a channel subscription it would have
/// changed served as before: its cursor reads the channel on.
#[test]
fn a_refused_resubscribe_leaves_a_channel_subscription_served_b470() {
    let broker = start();
    let mut s = connected(&broker, persistent(V5, "reader"));
    assert_eq!(s.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    let lock = WriteLock::take(&broker);
    s.send(&Packet::Subscribe(codec::Subscribe {
        packet_id: 2,
        properties: Default::default(),
        filters: vec![("events/#".into(), opts(QoS::ExactlyOnce))],
    }));
    match s.recv() {
        Packet::SubAck(ack) => assert_eq!(ack.codes, [STORAGE_ERROR]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    drop(lock);
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(
        p.publish("events/x", b"on", QoS::AtLeastOnce, false),
        Some(0)
    );
    let got = s.recv_publish();
    assert_eq!((&*got.payload, got.qos), (&b"on"[..], QoS::AtLeastOnce));
}

/// a SUBSCRIBE the store fails to keep (not for room) is 0x83 on every filter it
/// would add or change, and the session stays as it was: the held filter keeps its
/// QoS, the new one is not subscribed.
#[test]
fn a_subscribe_the_store_fails_refuses_every_filter_it_would_add_or_change_a146() {
    let broker = start();
    let mut s = connected(&broker, persistent(V5, "subscriber"));
    assert_eq!(s.subscribe("news/a", opts(QoS::AtLeastOnce)), [1]);
    let lock = WriteLock::take(&broker);
    s.send(&Packet::Subscribe(codec::Subscribe {
        packet_id: 2,
        properties: Default::default(),
        filters: vec![
            ("news/a".into(), opts(QoS::ExactlyOnce)),
            ("news/b".into(), opts(QoS::AtLeastOnce)),
        ],
    }));
    match s.recv() {
        Packet::SubAck(ack) => assert_eq!(ack.codes, [STORAGE_ERROR, STORAGE_ERROR]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    drop(lock);
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(p.publish("news/b", b"no", QoS::AtLeastOnce, false), Some(0));
    assert_eq!(
        p.publish("news/a", b"still", QoS::ExactlyOnce, false),
        Some(0)
    );
    let got = s.recv_publish();
    assert_eq!((&*got.payload, got.qos), (&b"still"[..], QoS::AtLeastOnce));
    s.expect_nothing(Duration::from_millis(300));
}

/// B-463: an UNSUBSCRIBE that cannot be stored is answered 0x83 per filter and the
/// client stays subscribed.
/// UNSUBACK 0x83 and the filter stays subscribed.
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

/// A-169, broadcast log half: a QoS 1 broadcast owed to a session that outlives its
/// connection, which the broadcast log cannot keep, is PUBACK 0x83, and the broker
/// says so in its log. Sessions that end with their connection had it at once, and
/// one that outlives its connection is not denied it either: it waits in memory (gone
/// with a crash, as the 0x83 warned the publisher) and comes before the next, which
/// the log keeps.
#[test]
fn a_broadcast_the_log_cannot_keep_is_puback_0x83_and_kept_in_memory_only_a169() {
    let broker = start();
    subscribe_and_leave(&broker, "subscriber", "news/#");
    let mut p = connected(&broker, common::connect(V5, "publisher", true));
    let lock = WriteLock::take(&broker);
    assert_eq!(
        p.publish("news/unlogged", b"memory", QoS::AtLeastOnce, false),
        Some(STORAGE_ERROR)
    );
    broker.wait_log("could not be logged, and is kept in memory only");
    drop(lock);
    assert_eq!(
        p.publish("news/logged", b"stored", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut s = connected(&broker, persistent(V5, "subscriber"));
    for (topic, payload) in [
        ("news/unlogged", &b"memory"[..]),
        ("news/logged", b"stored"),
    ] {
        let got = s.recv_publish();
        assert_eq!((&*got.topic, &*got.payload), (topic, payload));
    }
    s.expect_nothing(Duration::from_millis(300));
}

/// B-470, A-083: a re-SUBSCRIBE the store refuses leaves the filter it would have
/// replaced owed what its own SUBSCRIBE was: the rest of a latest channel's state
/// still comes. The refusal took the pending state pass with it.
#[test]
fn a_refused_resubscribe_leaves_the_state_pass_it_would_replace() {
    let broker = start();
    common::fill_state(broker.addr, 300);
    let mut c = persistent(V5, "pending");
    c.properties.edit().receive_maximum = Some(1);
    let mut s = connected(&broker, c);
    let first = common::shut_window_on_state(&mut s);
    assert_eq!(s.subscribe("state/#", opts(QoS::AtLeastOnce)), [1]);
    refused_behind_the_lock(&broker, &mut s, "state/#", QoS::AtLeastOnce);
    s.puback(&first);
    assert_eq!(
        state_topics(&mut s),
        300,
        "the rest of the state pass was dropped"
    );
}

/// Gaps G-17, B-087: a current value of a state pass left unacknowledged, resent to a
/// client that now takes smaller packets, is refused 0x95 as a queued one is; it was
/// dropped without a word, the pass having read past it.
#[test]
fn a_current_value_too_large_to_resend_is_0x95_not_dropped() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/a", b"x", QoS::AtLeastOnce, false);
    publisher.publish("state/big", &[b'b'; 2048], QoS::AtLeastOnce, false);
    let c = persistent(V5, "shrinks");
    let mut s = connected(&broker, c.clone());
    assert_eq!(s.subscribe("state/a", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(&*s.recv_publish().payload, b"x");
    // Joining the cursor, state/# is shown the channel's state by a pass.
    assert_eq!(s.subscribe("state/#", opts(QoS::AtLeastOnce)), [1]);
    loop {
        let Packet::Publish(p) = s.recv() else {
            panic!("a PUBLISH")
        };
        if &*p.topic == "state/big" {
            assert!(p.retain);
            break;
        }
        s.puback(&p);
    }
    drop(s);
    let mut smaller = c;
    smaller.properties.edit().maximum_packet_size = Some(1024);
    let (mut s, ack) = Raw::handshake(broker.addr, smaller);
    assert!(ack.session_present);
    assert_eq!(s.expect_disconnect(), 0x95);
}

/// B-470: a refused re-SUBSCRIBE of a shared filter leaves the state pass of the
/// client's own subscription to the same inner filter alone: a shared subscription
/// owns no pass. Its undo took that pass with it.
#[test]
fn a_refused_shared_resubscribe_leaves_the_own_state_pass() {
    let broker = start();
    common::fill_state(broker.addr, 300);
    let mut c = persistent(V5, "pending-shared");
    c.properties.edit().receive_maximum = Some(1);
    let mut s = connected(&broker, c);
    assert_eq!(s.subscribe("$share/g/state/#", opts(QoS::AtLeastOnce)), [1]);
    let first = common::shut_window_on_state(&mut s);
    assert_eq!(s.subscribe("state/#", opts(QoS::AtLeastOnce)), [1]);
    refused_behind_the_lock(&broker, &mut s, "$share/g/state/#", QoS::AtMostOnce);
    s.puback(&first);
    assert_eq!(
        state_topics(&mut s),
        300,
        "the own subscription's state pass was dropped"
    );
}

/// SUBSCRIBEs `filter` again at `qos` while another connection holds the store's
/// write lock, and expects it refused 0x83.
fn refused_behind_the_lock(broker: &Broker, s: &mut Raw, filter: &str, qos: QoS) {
    let lock = WriteLock::take(broker);
    s.send(&Packet::Subscribe(codec::Subscribe {
        packet_id: 2,
        properties: Default::default(),
        filters: vec![(filter.into(), opts(qos))],
    }));
    match s.recv() {
        Packet::SubAck(ack) => assert_eq!(ack.codes, [STORAGE_ERROR]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    drop(lock);
}

/// How many distinct `state/` topics arrive before none comes for 2 s.
fn state_topics(s: &mut Raw) -> usize {
    let drained = common::drain(s, Duration::from_secs(2));
    let topics: std::collections::BTreeSet<_> = drained.iter().map(|p| p.topic.clone()).collect();
    topics.len()
}
