//! A full session store (RFC 0002 "Every session's state", the full-store table;
//! B-465, B-469..B-473, B-476): sessions are charged against a memory provider's
//! `max_bytes`, the broadcast log gives way to everything else on its provider, and
//! what cannot be kept is said in MQTT's own signals and counted.

mod common;

use std::time::Duration;

use common::sessions::{
    connected, expected, fresh_dir, persistent, receive, subscribe_and_leave, with_receive_maximum,
};
use common::{Broker, Raw, opts};
use saguin::codec::{
    Packet,
    ProtocolVersion::{V5, V311},
    QoS,
};

/// A broker whose sessions and broadcast log share one small memory provider: about
/// eight 1000-byte messages fit the log (12KiB less the 3KiB reserve).
const TIGHT: &str = "broker:
  id: full-test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  operations:
    listen:
      unix:
        path: {dir}/ops.sock
  session:
    storage: tight
  limits:
    max_message_size: 2KiB
    max_header_bytes: 1KiB
  storage:
    default: tight
    default_retention_period: none
    default_retention_bytes: none
    providers:
      tight:
        type: memory
        max_bytes: 12KiB
        snapshot_dir: {dir}/snapshots
";

/// Publishes `count` 1000-byte QoS 1 messages `m-N`, each answered 0x00 though the
/// log is full (B-472: the loss is the sessions', not the publisher's).
fn flood(broker: &Broker, count: usize) {
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    for i in 0..count {
        let mut payload = format!("m-{i}").into_bytes();
        payload.resize(1000, b' ');
        assert_eq!(
            p.publish("news/x", &payload, QoS::AtLeastOnce, false),
            Some(0),
            "m-{i}"
        );
    }
    p.disconnect();
}

/// The value of the metrics line `name` (a full series name with its labels).
fn metric(broker: &Broker, name: &str) -> usize {
    let ops = broker.ops_socket();
    let (status, body) = common::http_get(ops, "/metrics");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} line in {body}"))
}

/// `saguin_session_deliveries_dropped_total{cause="storage_full"}`.
fn dropped_storage_full(broker: &Broker) -> usize {
    metric(
        broker,
        "saguin_session_deliveries_dropped_total{cause=\"storage_full\"}",
    )
}

/// B-472, B-474: with the log's provider full, the oldest messages owed to a session
/// that is away go to make room, each lost delivery counted, the publisher answered
/// 0x00 every time, and a warning logged naming the provider and the remedy; the
/// session resumes with the newest, in order.
#[test]
fn b472_a_full_log_gives_up_its_oldest_and_counts_them() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    subscribe_and_leave(&broker, "keeper", "news/#", QoS::AtLeastOnce);
    flood(&broker, 14);
    let warning = broker.wait_log("broadcast log on storage provider tight is full");
    assert!(warning.contains("a larger max_bytes"), "{warning}");
    let dropped = dropped_storage_full(&broker);
    assert!((1..14).contains(&dropped), "dropped {dropped}");
    let (mut s, present) = connected(&broker, persistent("keeper", false, 300));
    assert!(present);
    let kept = 14 - dropped;
    assert_eq!(receive(&mut s, kept), expected("m", dropped..14));
    s.expect_nothing(Duration::from_millis(300));
}

/// B-473: a message a session has on the wire unacknowledged is never given up for
/// room: after the flood and a graceful stop, the two it held unacknowledged come
/// back first, DUP set, then the newest.
#[test]
fn b473_what_is_on_the_wire_is_never_given_up_for_room() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    let (mut s, _) = connected(
        &broker,
        with_receive_maximum(persistent("busy", true, 300), 2),
    );
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    flood(&broker, 14);
    let held: Vec<String> = (0..2)
        .map(|_| {
            String::from_utf8_lossy(&s.recv_offer().payload)
                .trim_end()
                .to_string()
        })
        .collect();
    assert_eq!(held, expected("m", 0..2));
    let dropped = dropped_storage_full(&broker);
    assert!((1..12).contains(&dropped), "dropped {dropped}");
    let dir = broker.stop();
    drop(s);
    let broker = Broker::start_in(dir, TIGHT);
    let (mut s, present) = connected(
        &broker,
        with_receive_maximum(persistent("busy", false, 300), 20),
    );
    assert!(present);
    for want in ["m-0", "m-1"] {
        let p = s.recv_publish();
        assert_eq!(String::from_utf8_lossy(&p.payload).trim_end(), want);
        assert!(p.dup, "{want} was on the wire: DUP set");
    }
    let rest = 12 - dropped;
    assert_eq!(receive(&mut s, rest), expected("m", 14 - rest..14));
    s.expect_nothing(Duration::from_millis(300));
}

/// B-473: when everything in the log is on the wire unacknowledged, nothing can go,
/// and the new message is not kept: the session is not sent it, and it is counted.
#[test]
fn b473_a_message_nothing_can_make_room_for_is_not_kept() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    let (mut s, _) = connected(
        &broker,
        with_receive_maximum(persistent("slow", true, 300), 50),
    );
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    flood(&broker, 14);
    let mut got = Vec::new();
    while let Ok(Packet::Publish(p)) = s.expect_nothing_or_packet(Duration::from_millis(500)) {
        got.push(String::from_utf8_lossy(&p.payload).trim_end().to_string());
    }
    let dropped = dropped_storage_full(&broker);
    assert!(dropped >= 1, "dropped {dropped}");
    assert_eq!(
        got,
        expected("m", 0..14 - dropped),
        "the oldest kept, the rest not"
    );
}

/// B-418, B-465, B-469: sessions are charged against the memory provider (3,500 bytes and
/// more each, here about 9KiB usable): two persistent sessions fit, the third CONNECT
/// is accepted with Session Expiry Interval 0 in its CONNACK, counted, and its
/// session is not there after it disconnects.
/// a memory session provider's `max_bytes` bounds how many sessions are held.
#[test]
fn b469_a_session_the_store_has_no_room_for_ends_with_its_connection() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    for id in ["one", "two"] {
        let (raw, ack) = Raw::handshake(broker.addr, persistent(id, true, 300));
        assert_eq!(ack.code, 0);
        assert_eq!(ack.properties.session_expiry_interval, None, "{id} granted");
        raw.disconnect();
    }
    let (raw, ack) = Raw::handshake(broker.addr, persistent("three", true, 300));
    assert_eq!(ack.code, 0, "accepted");
    assert_eq!(
        ack.properties.session_expiry_interval,
        Some(0),
        "told it ends"
    );
    raw.disconnect();
    broker.wait_log("three disconnected");
    assert_eq!(
        metric(
            &broker,
            "saguin_sessions_dropped_total{cause=\"storage_full\"}"
        ),
        1
    );
    let (_, present) = connected(&broker, persistent("two", false, 300));
    assert!(present, "a session that fitted is kept");
}

/// B-466: sessions filling a memory provider leave only as they expire: retention
/// (1s here, swept every second) frees none of their room, and the session that
/// expires does.
#[test]
fn b466_sessions_leave_a_full_provider_only_as_they_expire() {
    let yaml = TIGHT.replace(
        "default_retention_period: none",
        "default_retention_period: 1s",
    );
    let broker = Broker::start_in(fresh_dir(), &yaml);
    let granted = |id: &str, expiry: u32| {
        let (raw, ack) = Raw::handshake(broker.addr, persistent(id, true, expiry));
        assert_eq!(ack.code, 0, "{id} accepted");
        raw.disconnect();
        broker.wait_log(&format!("{id} disconnected"));
        ack.properties.session_expiry_interval != Some(0)
    };
    assert!(granted("brief", 3), "brief fits");
    let brief_gone = std::time::Instant::now() + Duration::from_secs(3);
    assert!(granted("long", 300), "long fits");
    // Older than the retention period and swept over: still holding their room.
    std::thread::sleep(Duration::from_millis(1800));
    assert!(!granted("third", 300), "no room while both sessions live");
    std::thread::sleep(brief_gone.saturating_duration_since(std::time::Instant::now()));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        granted("fourth", 300),
        "brief expired and gave its room back"
    );
}

/// B-470, B-471: with the store full, a SUBSCRIBE that would add a filter is
/// refused 0x97 (3.1.1: 0x80), from a persistent session and from a clean one alike,
/// and the subscriptions held go on matching.
/// 0x97 on an added filter (3.1.1 0x80).
#[test]
fn b470_b471_a_full_store_refuses_new_filters_and_serves_the_old() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    // 3,503 bytes a session, 802 a one-level filter: 8,610 of 9,216.
    let (mut one, _) = connected(&broker, persistent("one", true, 300));
    assert_eq!(one.subscribe("a1", opts(QoS::AtLeastOnce)), [1]);
    let (mut two, _) = connected(&broker, persistent("two", true, 300));
    assert_eq!(two.subscribe("a2", opts(QoS::AtLeastOnce)), [1]);
    // Full now: a four-level filter is 2.6KiB more.
    assert_eq!(two.subscribe("b/2/x/y", opts(QoS::AtLeastOnce)), [0x97]);
    let mut clean = Raw::connected(broker.addr, V5, "clean");
    assert_eq!(clean.subscribe("c/1/x/y", opts(QoS::AtLeastOnce)), [0x97]);
    let (mut old, ack) = Raw::handshake(broker.addr, common::connect(V311, "old", true));
    assert_eq!(ack.code, 0);
    assert_eq!(old.subscribe("d/1/x/y", opts(QoS::AtLeastOnce)), [0x80]);
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(p.publish("a2", b"still", QoS::AtLeastOnce, false), Some(0));
    assert_eq!(receive(&mut two, 1), ["still"]);
    two.expect_nothing(Duration::from_millis(200));
}

/// a SUBSCRIBE the full store has no room for is 0x97 on every filter it would
/// add or change, the change included, and the session stays as it was.
#[test]
fn a_full_store_refuses_every_filter_the_packet_would_add_or_change_a147() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    let (mut one, _) = connected(&broker, persistent("one", true, 300));
    assert_eq!(one.subscribe("a1", opts(QoS::AtLeastOnce)), [1]);
    let (mut two, _) = connected(&broker, persistent("two", true, 300));
    assert_eq!(two.subscribe("a2", opts(QoS::AtLeastOnce)), [1]);
    two.send(&Packet::Subscribe(saguin::codec::Subscribe {
        packet_id: 2,
        properties: Default::default(),
        filters: vec![
            ("a2".into(), opts(QoS::ExactlyOnce)),
            ("b/2/x/y".into(), opts(QoS::AtLeastOnce)),
        ],
    }));
    let Packet::SubAck(ack) = two.recv() else {
        panic!("expected SUBACK")
    };
    assert_eq!(ack.codes, [0x97, 0x97]);
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(
        p.publish("b/2/x/y", b"no", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(p.publish("a2", b"still", QoS::ExactlyOnce, false), Some(0));
    let got = two.recv_publish();
    assert_eq!((&*got.payload, got.qos), (&b"still"[..], QoS::AtLeastOnce));
    two.expect_nothing(Duration::from_millis(200));
    // Every filter a SUBACK refuses is counted under its code (RFC 0002 metrics).
    broker.assert_metric("saguin_subscriptions_refused_total{code=\"0x97\"} 2");
}

/// a group's share is kept in its first lasting member's record, in the same
/// write: with no room for it the whole packet is 0x97, its plain filter too, and the
/// group holds nothing for that member.
#[test]
fn a_group_the_full_store_has_no_room_for_refuses_the_whole_packet_a148() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    let (one, _) = connected(&broker, persistent("one", true, 300));
    let (mut two, _) = connected(&broker, persistent("two", true, 300));
    assert_eq!(two.subscribe("a2", opts(QoS::AtLeastOnce)), [1]);
    two.send(&Packet::Subscribe(saguin::codec::Subscribe {
        packet_id: 2,
        properties: Default::default(),
        filters: vec![
            ("$share/g/jobs/#".into(), opts(QoS::AtLeastOnce)),
            ("c".into(), opts(QoS::AtLeastOnce)),
        ],
    }));
    let Packet::SubAck(ack) = two.recv() else {
        panic!("expected SUBACK")
    };
    assert_eq!(ack.codes, [0x97, 0x97]);
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(p.publish("jobs/1", b"no", QoS::AtLeastOnce, false), Some(0));
    assert_eq!(p.publish("c", b"no", QoS::AtLeastOnce, false), Some(0));
    assert_eq!(p.publish("a2", b"still", QoS::AtLeastOnce, false), Some(0));
    assert_eq!(&*two.recv_publish().payload, b"still");
    two.expect_nothing(Duration::from_millis(200));
    // The plain filter alone fits: it was the group's share that had no room.
    assert_eq!(two.subscribe("c", opts(QoS::AtLeastOnce)), [1]);
    drop(one);
}

/// B-476: a session record that finds the provider full takes its room from the
/// broadcast log first: with the log filling the provider, a new persistent session
/// is granted as asked.
#[test]
fn b476_a_session_record_takes_its_room_from_the_log() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    subscribe_and_leave(&broker, "keeper", "news/#", QoS::AtLeastOnce);
    // The log fills what the session left, and more of it is given up.
    flood(&broker, 8);
    broker.wait_log("broadcast log on storage provider tight is full");
    // Without room taken from the log, it would be cut to expiry 0 (B-469).
    let (_, ack) = Raw::handshake(broker.addr, persistent("newcomer", true, 300));
    assert_eq!(ack.code, 0);
    assert_eq!(
        ack.properties.session_expiry_interval, None,
        "granted as asked"
    );
    // Metrics are computed at most once a minute: one read, at the end.
    assert!(dropped_storage_full(&broker) >= 1);
}

/// B-424: to make room the provider gives up only its broadcast log: channel records
/// on it take their room from the log, and once the log holds nothing the next
/// record is refused 0x97 rather than an older record given up; broadcasts after it
/// are not kept, and a reader still replays every record the channel took.
#[test]
fn b424_room_is_taken_from_the_log_never_from_a_channels_records() {
    let yaml = format!("{TIGHT}channels:\n  ev:\n    type: append\n    filter: ev/#\n");
    let broker = Broker::start_in(fresh_dir(), &yaml);
    subscribe_and_leave(&broker, "keeper", "news/#", QoS::AtLeastOnce);
    flood(&broker, 8);
    broker.wait_log("broadcast log on storage provider tight is full");
    let mut p = Raw::connected(broker.addr, V5, "recorder");
    let mut taken = 0;
    loop {
        let mut payload = format!("ev-{taken}").into_bytes();
        payload.resize(1000, b' ');
        match p.publish("ev/x", &payload, QoS::AtLeastOnce, false) {
            Some(0) => taken += 1,
            Some(0x97) => break,
            other => panic!("ev-{taken}: {other:?}"),
        }
        assert!(taken < 20, "the provider never filled");
    }
    // The log had filled what the session left: every record took its room from it.
    assert!(taken >= 2, "room was taken from the log: {taken} records");
    p.disconnect();
    flood(&broker, 3);
    let (mut keeper, present) = connected(&broker, persistent("keeper", false, 300));
    assert!(present);
    keeper.expect_nothing(Duration::from_millis(300));
    keeper.disconnect();
    broker.wait_log("keeper disconnected");
    // The keeper's session ends, so a new filter has room again (B-470).
    let (keeper, _) = connected(&broker, persistent("keeper", true, 0));
    keeper.disconnect();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(reader.subscribe("ev/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(receive(&mut reader, taken), expected("ev", 0..taken));
    reader.expect_nothing(Duration::from_millis(300));
}

/// B-461: a CONNECT carrying a Will the full store has no room for is refused 0x97,
/// its Reason String naming what filled, and counted as "session store full"
/// (without a Will it would be accepted ending with its connection, B-469).
#[test]
fn b461_a_will_the_store_has_no_room_for_is_refused_0x97() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    for id in ["one", "two"] {
        let (raw, _) = connected(&broker, persistent(id, true, 300));
        raw.disconnect();
    }
    let mut c = persistent("willing", true, 300);
    c.will = Some(saguin::codec::Will {
        topic: "gone/willing".into(),
        payload: b"bye".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: saguin::codec::Properties::default(),
    });
    let (_, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0x97);
    let why = ack.properties.reason_string.clone().unwrap_or_default();
    assert!(why.contains("tight") && why.contains("Will"), "{why}");
    assert_eq!(
        metric(
            &broker,
            "saguin_connections_refused_total{reason=\"session store full\"}"
        ),
        1
    );
}

/// a Will the full store has no room for is 0x97 on MQTT 5 and 0x05 on 3.1.1,
/// where the same CONNECT without the Will is accepted.
#[test]
fn a_will_the_store_has_no_room_for_is_0x05_on_3_1_1_a246() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    for id in ["one", "two"] {
        let (raw, _) = connected(&broker, persistent(id, true, 300));
        raw.disconnect();
    }
    let will = saguin::codec::Will {
        topic: "gone/old".into(),
        payload: b"bye".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: saguin::codec::Properties::default(),
    };
    let mut c = common::connect(V311, "old-willing", false);
    c.will = Some(will.clone());
    assert_eq!(Raw::handshake(broker.addr, c).1.code, 0x05);
    let mut c = persistent("new-willing", true, 300);
    c.will = Some(will);
    assert_eq!(Raw::handshake(broker.addr, c).1.code, 0x97);
    let (_raw, ack) = Raw::handshake(broker.addr, common::connect(V311, "old-willing", false));
    assert_eq!(ack.code, 0, "without the Will it is accepted");
}

/// B-467, B-468: a snapshot restored over a smaller `max_bytes` is loaded whole and
/// said once at start, naming the provider and how much of it the sessions hold
/// (here: a session's record and the broadcast log it is owed).
#[test]
fn b468_a_snapshot_over_the_bound_says_how_much_the_sessions_hold() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    subscribe_and_leave(&broker, "away", "news/#", QoS::AtLeastOnce);
    flood(&broker, 5);
    let dir = broker.stop();
    let smaller = TIGHT.replace("max_bytes: 12KiB", "max_bytes: 6KiB");
    let broker = Broker::start_in(dir, &smaller);
    // Said while the broker starts, before it listens.
    let line = broker
        .startup
        .iter()
        .find(|l| l.contains("the snapshot holds"))
        .cloned()
        .unwrap_or_else(|| broker.wait_log("the snapshot holds"));
    assert!(line.contains("storage provider tight"), "{line}");
    let held = |what: &str| -> u64 {
        let at = line
            .find(what)
            .unwrap_or_else(|| panic!("{what:?} in {line}"));
        line[at + what.len()..]
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a number after {what:?} in {line}"))
    };
    let (total, sessions) = (held("the snapshot holds "), held("the sessions hold "));
    // All the provider holds is the session's: its record and the log it is owed.
    assert!(
        sessions == total && total > 3 * 1000,
        "1000-byte messages owed: {line}"
    );
    let (mut away, present) = connected(&broker, persistent("away", false, 300));
    assert!(present, "restored whole");
    // B-467: loaded whole, nothing in it dropped. The start's rewrite of the session
    // record, charged its text until then, was refused for room: the broadcast log
    // was given up to make some, and the resume was cut to end with its connection.
    // The log kept the newest three of the first run (B-472).
    assert_eq!(receive(&mut away, 3), expected("m", 2..5));
    assert_eq!(dropped_storage_full(&broker), 0);
    away.disconnect();
    let (_, present) = connected(&broker, persistent("away", false, 300));
    assert!(present, "the session still lasts");
}
