//! append and latest channels end to end over MQTT (issue 5; RFC 0002 "Publishing",
//! "What a filter reaches"; gaps G-11, G-12, G-16, G-19).

mod common;

use std::time::Duration;

use common::{Broker, CHANNELS, Raw, connect, opts, start_with_channels as start, user_property};
use saguin::codec::{
    Connect, Disconnect, Packet,
    ProtocolVersion::{V5, V311},
    QoS,
};

/// C-202, C-232: SUBACK before the replay; records in offset order, received in that order.
/// A-009, A-071: `events` (no filter) claims events/...; no position replays from the floor.
#[test]
fn an_append_channel_replays_from_the_floor_with_saguin_properties_then_goes_live() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..3 {
        assert_eq!(
            publisher.publish(
                &format!("events/e{i}"),
                format!("r{i}").as_bytes(),
                QoS::AtLeastOnce,
                false
            ),
            Some(0)
        );
    }
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    let mut offsets = Vec::new();
    for i in 0..3 {
        let got = reader.recv_publish();
        assert_eq!(
            (&*got.topic, &*got.payload),
            (format!("events/e{i}").as_str(), format!("r{i}").as_bytes())
        );
        assert!(user_property(&got, "saguin-id").is_some_and(|id| !id.is_empty()));
        assert!(user_property(&got, "saguin-timestamp").is_some_and(|t| t.parse::<u64>().is_ok()));
        offsets.push(
            user_property(&got, "saguin-offset")
                .and_then(|o| o.parse::<u64>().ok())
                .expect("offset"),
        );
    }
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "offsets strictly increase: {offsets:?}"
    );
    publisher.publish("events/live", b"now", QoS::AtLeastOnce, false);
    assert_eq!(&*reader.recv_publish().payload, b"now");
}

#[test]
fn a_publishers_saguin_id_is_kept_and_other_saguin_properties_dropped() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let mut p = common::publish("events/id", b"x", QoS::AtLeastOnce, false);
    p.properties.edit().user_properties = vec![
        ("saguin-id".into(), "mine-1".into()),
        ("saguin-offset".into(), "999".into()),
        ("app".into(), "kept".into()),
    ];
    assert_eq!(publisher.publish_packet(p), Some(0));
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("events/id", opts(QoS::AtLeastOnce));
    let got = reader.recv_publish();
    assert_eq!(user_property(&got, "saguin-id"), Some("mine-1"));
    assert_eq!(user_property(&got, "app"), Some("kept"));
    assert_ne!(user_property(&got, "saguin-offset"), Some("999"));
    let offsets = got
        .properties
        .user_properties
        .iter()
        .filter(|(k, _)| k == "saguin-offset")
        .count();
    assert_eq!(offsets, 1);
}

#[test]
fn start_tail_serves_only_what_arrives_after_the_subscription() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("recent/old", b"old", QoS::AtLeastOnce, false);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("recent/#", opts(QoS::AtLeastOnce));
    reader.expect_nothing(Duration::from_millis(300));
    publisher.publish("recent/new", b"new", QoS::AtLeastOnce, false);
    assert_eq!(&*reader.recv_publish().payload, b"new");
}

/// A-077: Clean Start 0 with an expiry stores a position and resumes from it.
#[test]
fn a_durable_consumer_resumes_where_it_acknowledged_across_a_reconnect() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/1", b"1", QoS::AtLeastOnce, false);
    publisher.publish("events/2", b"2", QoS::AtLeastOnce, false);
    let mut c = connect(V5, "durable", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    assert_eq!(&*reader.recv_publish().payload, b"1");
    assert_eq!(&*reader.recv_publish().payload, b"2");
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    publisher.publish("events/3", b"3", QoS::AtLeastOnce, false);
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    assert_eq!(&*reader.recv_publish().payload, b"3");
    reader.expect_nothing(Duration::from_millis(300));
}

/// A-078: 3.1.1 publishes and subscribes; cleanSession=0 keeps a durable position.
#[test]
fn a_durable_consumer_resumes_its_stored_position_after_a_broker_restart() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V311, "producer");
    publisher.publish("events/a", b"a", QoS::AtLeastOnce, false);
    publisher.publish("events/b", b"b", QoS::AtLeastOnce, false);
    drop(publisher);
    let c = connect(V311, "keeper", false);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    assert_eq!(&*reader.recv_publish().payload, b"a");
    assert_eq!(&*reader.recv_publish().payload, b"b");
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    broker.wait_log("keeper disconnected");
    let dir = broker.stop();
    let broker = Broker::start_in(dir, CHANNELS);
    let mut publisher = Raw::connected(broker.addr, V311, "producer");
    publisher.publish("events/c", b"c", QoS::AtLeastOnce, false);
    // The session itself is kept now (B-455): resumed, its subscription is served
    // from the stored position without subscribing again.
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present, "the session survived the restart");
    assert_eq!(
        &*reader.recv_publish().payload,
        b"c",
        "the stored position survived the restart"
    );
    reader.expect_nothing(Duration::from_millis(300));
}

/// Clean Start discards a stored position, within a run and across a restart: the
/// sqlite provider reads whose positions the file holds when it opens, and skips the
/// deletion only for a client that never stored one (gaps G-11). A-071.
#[test]
fn clean_start_discards_a_stored_position() {
    let mut broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/x", b"x", QoS::AtLeastOnce, false);
    drop(publisher);
    for (id, restart) in [("forgetful", false), ("forgets-later", true)] {
        let mut c = connect(V5, id, false);
        c.properties.edit().session_expiry_interval = Some(600);
        let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
        reader.subscribe("events/#", opts(QoS::AtLeastOnce));
        assert_eq!(&*reader.recv_publish().payload, b"x");
        reader.send(&Packet::Disconnect(Disconnect::new(0)));
        std::thread::sleep(Duration::from_millis(200));
        if restart {
            broker = Broker::start_in(broker.stop(), CHANNELS);
        }
        c.clean_start = true;
        starts_at_the_floor(broker.addr, c, &format!("{id}, restart {restart}"));
    }
}

/// G-11, A-077: a Clean Start that takes a live durable consumer over discards its
/// positions after that connection wrote them on its way out, so the new session
/// starts at the floor.
#[test]
fn a_clean_start_taking_a_live_consumer_over_starts_at_the_floor() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/x", b"x", QoS::AtLeastOnce, false);
    let mut c = connect(V5, "taken-over", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    assert_eq!(&*reader.recv_publish().payload, b"x");
    std::thread::sleep(Duration::from_millis(100));
    c.clean_start = true;
    starts_at_the_floor(broker.addr, c, "taken over while connected");
    drop(reader);
}

/// G-17, MQTT-3.1.2-25: a channel record on the wire when the session's connection
/// ended, which the next connection's Maximum Packet Size does not take, is not
/// skipped: the consumer is told why (0x95) and its position stays.
#[test]
fn a_channel_record_too_large_for_the_resumed_connection_is_refused_0x95_not_skipped() {
    let broker = start();
    let mut c = connect(V5, "shrinking-reader", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/big", &[b'b'; 300], QoS::AtLeastOnce, false);
    let Packet::Publish(first) = reader.recv() else {
        panic!("expected PUBLISH");
    };
    assert_eq!(first.payload.len(), 300, "not acknowledged");
    drop(reader);
    std::thread::sleep(Duration::from_millis(100));
    let mut small = c.clone();
    small.properties.edit().maximum_packet_size = Some(200);
    let (mut reader, ack) = Raw::handshake(broker.addr, small);
    assert!(ack.session_present);
    assert_eq!(reader.expect_disconnect(), 0x95);
    let (mut reader, _) = Raw::handshake(broker.addr, c);
    assert_eq!(reader.recv_publish().payload.len(), 300, "still owed");
}

/// Connects as `c` and subscribes: no session is present and `events/x` is replayed,
/// the floor of the channel, whatever position the client once stored.
fn starts_at_the_floor(addr: std::net::SocketAddr, c: Connect, case: &str) {
    let (mut reader, ack) = Raw::handshake(addr, c);
    assert!(!ack.session_present, "{case}");
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    assert_eq!(
        &*reader.recv_publish().payload,
        b"x",
        "{case}: replayed from the floor, not resumed at a discarded position"
    );
}

#[test]
fn a_consumer_whose_session_lapsed_starts_again_at_the_floor_a079() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/x", b"x", QoS::AtLeastOnce, false);
    for (id, ending) in [("expires", None), ("ends-it", Some(0))] {
        let mut c = connect(V5, id, false);
        c.properties.edit().session_expiry_interval = Some(1);
        let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
        reader.subscribe("events/#", opts(QoS::AtLeastOnce));
        let got = reader.recv_publish();
        assert_eq!(&*got.payload, b"x");
        reader.puback(&got);
        // A session of 1 s that expires, or a DISCONNECT that ends it at once.
        let mut disconnect = Disconnect::new(0);
        disconnect.properties.edit().session_expiry_interval = ending;
        reader.send(&Packet::Disconnect(disconnect));
        std::thread::sleep(Duration::from_millis(2500));
        starts_at_the_floor(broker.addr, c, id);
    }
}

/// A-079: a session restored at a start and left to expire without being resumed -
/// so it never opened a cursor - takes its stored positions with it too.
#[test]
fn a_restored_session_that_expires_unresumed_takes_its_positions_with_it_a079() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/x", b"x", QoS::AtLeastOnce, false);
    drop(publisher);
    let mut c = connect(V5, "restored-away", false);
    c.properties.edit().session_expiry_interval = Some(2);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    assert_eq!(&*reader.recv_publish().payload, b"x");
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    broker.wait_log("restored-away disconnected");
    let broker = Broker::start_in(broker.stop(), CHANNELS);
    std::thread::sleep(Duration::from_millis(3500));
    starts_at_the_floor(broker.addr, c, "expired after a restart, never resumed");
}

/// RFC 0002 "latest", G-19: a durable consumer of a latest channel resuming after a
/// restart is sent only what changed, as it is after a reconnect: a resumption is no
/// SUBSCRIBE, so no current-state pass goes again.
#[test]
fn a_latest_consumer_resuming_after_a_restart_is_sent_only_what_changed() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/a", b"1", QoS::AtLeastOnce, false);
    publisher.publish("state/b", b"2", QoS::AtLeastOnce, false);
    drop(publisher);
    let mut c = connect(V5, "state-watcher", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("state/#", opts(QoS::AtLeastOnce));
    let mut seen: Vec<Vec<u8>> = (0..2)
        .map(|_| reader.recv_publish().payload.to_vec())
        .collect();
    seen.sort();
    assert_eq!(seen, [b"1".to_vec(), b"2".to_vec()]);
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    broker.wait_log("state-watcher disconnected");
    let broker = Broker::start_in(broker.stop(), CHANNELS);
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    reader.expect_nothing(Duration::from_millis(500));
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/b", b"3", QoS::AtLeastOnce, false);
    let got = reader.recv_publish();
    assert_eq!(
        (&*got.topic, &*got.payload, got.retain),
        ("state/b", &b"3"[..], false)
    );
}

/// C-232: the SUBACK is written before the current-state pass.
/// A-081, A-086: a publish replaces the value; a 3.1.1 subscriber is served.
#[test]
fn a_latest_channel_serves_current_values_with_retain_and_an_empty_publish_deletes() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/a", b"1", QoS::AtLeastOnce, false);
    publisher.publish("state/a", b"2", QoS::AtLeastOnce, false);
    publisher.publish("state/b", b"x", QoS::AtLeastOnce, false);
    publisher.publish("state/c", b"gone", QoS::AtLeastOnce, false);
    publisher.publish("state/c", b"", QoS::AtLeastOnce, false);
    let mut reader = Raw::connected(broker.addr, V311, "watcher");
    reader.subscribe("state/#", opts(QoS::AtLeastOnce));
    let mut got = Vec::new();
    for _ in 0..2 {
        let p = reader.recv_publish();
        assert!(p.retain, "the current-state pass carries RETAIN");
        got.push((p.topic.to_string(), p.payload.to_vec()));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("state/a".to_string(), b"2".to_vec()),
            ("state/b".to_string(), b"x".to_vec())
        ]
    );
    reader.expect_nothing(Duration::from_millis(300));
    publisher.publish("state/a", b"3", QoS::AtLeastOnce, false);
    let live = reader.recv_publish();
    assert_eq!(
        (&*live.topic, &*live.payload, live.retain),
        ("state/a", &b"3"[..], false)
    );
}

/// Receives `n` publishes: (topic, payload, RETAIN), sorted.
fn state(reader: &mut Raw, n: usize) -> Vec<(String, String, bool)> {
    let mut got: Vec<_> = (0..n)
        .map(|_| {
            let p = reader.recv_publish();
            let payload = String::from_utf8_lossy(&p.payload).into_owned();
            (p.topic.to_string(), payload, p.retain)
        })
        .collect();
    got.sort();
    got
}

fn current(topic: &str, payload: &str) -> (String, String, bool) {
    (topic.to_string(), payload.to_string(), true)
}

/// A-086: MQTT 5 filters touching the channel (`state/a`, `state/#`) are served.
#[test]
fn every_subscribe_to_a_latest_channel_is_shown_its_current_state_a083_a065() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/a", b"a1", QoS::AtMostOnce, false);
    publisher.publish("state/b", b"b1", QoS::AtLeastOnce, false);
    // A second SUBSCRIBE joins the cursor the first opened, which has read past b.
    let mut reader = Raw::connected(broker.addr, V5, "second-filter");
    reader.subscribe("state/a", opts(QoS::AtLeastOnce));
    assert_eq!(state(&mut reader, 1), [current("state/a", "a1")]);
    reader.subscribe("state/b", opts(QoS::AtLeastOnce));
    assert_eq!(state(&mut reader, 1), [current("state/b", "b1")]);
    reader.expect_nothing(Duration::from_millis(300));

    // A durable consumer subscribing again from a stored position: the state below
    // it as current state, and what changed since as it is.
    let mut c = connect(V5, "durable-dashboard", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut dash, _) = Raw::handshake(broker.addr, c.clone());
    dash.subscribe("state/#", opts(QoS::AtLeastOnce));
    for p in [dash.recv_publish(), dash.recv_publish()] {
        dash.puback(&p);
    }
    dash.send(&Packet::Disconnect(Disconnect::new(0)));
    std::thread::sleep(Duration::from_millis(100));
    publisher.publish("state/b", b"b2", QoS::AtLeastOnce, false);
    let (mut dash, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    let changed = dash.recv_publish();
    assert_eq!((&*changed.topic, changed.retain), ("state/b", false));
    dash.puback(&changed);
    dash.expect_nothing(Duration::from_millis(300));
    dash.subscribe("state/#", opts(QoS::AtLeastOnce));
    assert_eq!(
        state(&mut dash, 2),
        [current("state/a", "a1"), current("state/b", "b2")]
    );
    dash.expect_nothing(Duration::from_millis(300));
}

#[test]
fn retain_handling_and_retain_as_published_on_a_latest_channel_a085_c235() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/a", b"a1", QoS::AtLeastOnce, true);
    let mut reader = Raw::connected(broker.addr, V5, "rh");
    let mut never = opts(QoS::AtLeastOnce);
    never.retain_handling = saguin::codec::RetainHandling::Never;
    never.retain_as_published = true;
    reader.subscribe("state/#", never);
    reader.expect_nothing(Duration::from_millis(300));
    // Live, published with RETAIN, to a Retain As Published subscription: a record
    // keeps no publisher's flag, so only current state ever carries RETAIN.
    publisher.publish("state/a", b"a2", QoS::AtLeastOnce, true);
    let live = reader.recv_publish();
    assert_eq!((&*live.payload, live.retain), (&b"a2"[..], false));
    let mut if_new = opts(QoS::AtLeastOnce);
    if_new.retain_handling = saguin::codec::RetainHandling::OnNewSubscribe;
    reader.subscribe("state/#", if_new);
    reader.expect_nothing(Duration::from_millis(300));
    reader.subscribe("state/a", if_new);
    assert_eq!(state(&mut reader, 1), [current("state/a", "a2")]);
}

/// A-066, A-106: the queue's own filter 0x8F; a crossing one granted, never a job.
#[test]
fn a_plain_filter_inside_a_queue_is_refused_and_a_wide_one_never_sees_the_queue() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "nosy");
    assert_eq!(
        reader.subscribe("work/+/todo", opts(QoS::AtLeastOnce)),
        [0x8F]
    );
    assert_eq!(reader.subscribe("work/#", opts(QoS::AtLeastOnce)), [1]);
    let mut publisher = Raw::connected(broker.addr, V311, "producer");
    assert_eq!(
        publisher.publish("work/w1/todo", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    publisher.publish("work/w1/other", b"broadcast", QoS::AtLeastOnce, false);
    assert_eq!(&*reader.recv_publish().payload, b"broadcast");
    reader.expect_nothing(Duration::from_millis(300));
}

#[test]
fn a_dead_letter_channel_refuses_publishes_0x87() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        publisher.publish("work/w1/todo/__dlq", b"x", QoS::AtLeastOnce, false),
        Some(0x87)
    );
    // A-166: at QoS 2 the refusal is on the PUBREC, and nothing is held for a PUBREL.
    assert_eq!(
        publisher.publish("work/w1/todo/__dlq", b"x", QoS::ExactlyOnce, false),
        Some(0x87)
    );
    publisher.send(&Packet::PubRel(saguin::codec::Ack::new(1, 0)));
    assert!(matches!(publisher.recv(), Packet::PubComp(a) if a.code == 0x92));
}

/// A-116, A-118: a group on an append channel gets new records only, no replay.
#[test]
fn shared_groups_on_an_append_channel_get_new_records_only_split_across_members() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/before", b"old", QoS::AtLeastOnce, false);
    let mut a = Raw::connected(broker.addr, V5, "g-a");
    let mut b = Raw::connected(broker.addr, V5, "g-b");
    a.subscribe("$share/g/events/#", opts(QoS::AtLeastOnce));
    b.subscribe("$share/g/events/#", opts(QoS::AtLeastOnce));
    publisher.publish("events/n1", b"n1", QoS::AtLeastOnce, false);
    publisher.publish("events/n2", b"n2", QoS::AtLeastOnce, false);
    let got_a = a.recv_publish();
    let got_b = b.recv_publish();
    assert_eq!((&*got_a.payload, &*got_b.payload), (&b"n1"[..], &b"n2"[..]));
    assert!(user_property(&got_a, "saguin-offset").is_some());
    a.expect_nothing(Duration::from_millis(200));
}

/// A durable consumer reads half a channel, the broker restarts under it, and it
/// resumes with the other half: on sqlite and on memory (its snapshot).
fn resume_after_restart_mid_read(prefix: &str) {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..4 {
        let topic = format!("{prefix}/{i}");
        assert_eq!(
            publisher.publish(&topic, format!("{i}").as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    drop(publisher);
    // Receive Maximum 1: one record on the wire at a time, so after two
    // acknowledgements exactly two are unread.
    let mut c = connect(V5, "mid-read", false);
    c.properties.edit().session_expiry_interval = Some(3600);
    c.properties.edit().receive_maximum = Some(1);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe(&format!("{prefix}/#"), opts(QoS::AtLeastOnce));
    assert_eq!(&*reader.recv_publish().payload, b"0");
    assert_eq!(&*reader.recv_publish().payload, b"1");
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    broker.wait_log("mid-read disconnected");
    let dir = broker.stop();
    let broker = Broker::start_in(dir, CHANNELS);
    // The session is kept (B-455): resumed, it reads on without subscribing again.
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present, "the session survived the restart");
    assert_eq!(&*reader.recv_publish().payload, b"2");
    assert_eq!(&*reader.recv_publish().payload, b"3");
    reader.expect_nothing(Duration::from_millis(200));
}

/// B-457: positions acknowledged and then followed by silence are written within
/// `ack_commit_interval`, not at the client's next packet, so SIGKILL loses none.
#[test]
fn positions_are_written_within_ack_commit_interval_of_an_idle_consumer_b457() {
    let dir = common::temp_dir("ack-commit");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let yaml = CHANNELS.replace(
        "  storage:\n",
        "  session:\n    ack_commit_interval: 50ms\n  storage:\n",
    );
    let mut broker = Broker::start_in(dir, &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..6 {
        let topic = format!("events/{i}");
        publisher.publish(&topic, format!("{i}").as_bytes(), QoS::AtLeastOnce, false);
    }
    let mut c = connect(V5, "idle-reader", false);
    c.properties.edit().session_expiry_interval = Some(3600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    for _ in 0..6 {
        let p = reader.recv_publish();
        reader.puback(&p);
    }
    // Silent from here: no packet of the reader's wakes its connection.
    std::thread::sleep(Duration::from_millis(400));
    broker.signal("KILL");
    let _ = broker.wait_exit();
    let dir = broker.stop_killed();
    let broker = Broker::start_in(dir, &yaml);
    let (mut reader, _) = Raw::handshake(broker.addr, c);
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    reader.expect_nothing(Duration::from_millis(500));
}

#[test]
fn a_durable_consumer_resumes_mid_read_across_a_restart_on_sqlite() {
    resume_after_restart_mid_read("events");
}

#[test]
fn a_durable_consumer_resumes_mid_read_across_a_restart_on_memory() {
    resume_after_restart_mid_read("memlog");
}

/// C-213: a retained publish to an append channel is an ordinary record.
#[test]
fn retained_on_a_channels_topic_is_just_a_record_and_not_kept_twice() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        publisher.publish("events/r", b"once", QoS::AtLeastOnce, true),
        Some(0)
    );
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("events/r", opts(QoS::AtLeastOnce));
    let got = reader.recv_publish();
    assert_eq!(&*got.payload, b"once");
    assert!(
        user_property(&got, "saguin-offset").is_some(),
        "served from the channel"
    );
    reader.expect_nothing(Duration::from_millis(300));
}

/// A-116, A-120: a group on a latest channel gets changes only; A-070: `#` served from both.
#[test]
fn shared_groups_on_a_latest_channel_get_changes_only_and_a_filter_over_two_channels_gets_both() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/old", b"before", QoS::AtLeastOnce, false);
    let mut member = Raw::connected(broker.addr, V5, "member");
    member.subscribe("$share/g/state/#", opts(QoS::AtLeastOnce));
    member.expect_nothing(Duration::from_millis(300));
    publisher.publish("state/new", b"after", QoS::AtLeastOnce, false);
    assert_eq!(&*member.recv_publish().payload, b"after");
    // A deletion is shown to nothing reading the channel, a group included.
    publisher.publish("state/old", b"", QoS::AtLeastOnce, false);
    member.expect_nothing(Duration::from_millis(300));
    publisher.publish("state/old", b"again", QoS::AtLeastOnce, false);
    assert_eq!(&*member.recv_publish().payload, b"again");
    // `#` touches every append and latest channel; each serves it on its own.
    publisher.publish("events/e", b"E", QoS::AtLeastOnce, false);
    let mut wide = Raw::connected(broker.addr, V5, "wide");
    wide.subscribe("#", opts(QoS::AtLeastOnce));
    let mut got: Vec<Vec<u8>> = (0..3)
        .map(|_| wide.recv_publish().payload.to_vec())
        .collect();
    got.sort();
    assert_eq!(got, [b"E".to_vec(), b"after".to_vec(), b"again".to_vec()]);
}

/// The channels of RFC 0002 "The topic space", on memory.
const WATER: &str = "channels:
  water-location:
    type: latest
    filter: iot/water/+/location/#
  water-measurement:
    type: append
    filter: iot/water/+/+/#
  weather-measurement:
    type: append
    filter: iot/weather/+/{data,events}
  inspections:
    type: queue
    filter: iot/water/+/inspect
";

/// One delivery: (topic, payload, RETAIN, whether it is a channel record).
type Served = (String, String, bool, bool);

/// Receives `n` publishes, sorted.
fn served(reader: &mut Raw, n: usize) -> Vec<Served> {
    let mut got: Vec<Served> = (0..n)
        .map(|_| {
            let p = reader.recv_publish();
            let record = user_property(&p, "saguin-offset").is_some();
            let payload = String::from_utf8_lossy(&p.payload).into_owned();
            (p.topic.to_string(), payload, p.retain, record)
        })
        .collect();
    got.sort();
    got
}

/// Current state of a latest channel: RETAIN set, a record.
fn state_of(topic: &str, payload: &str) -> Served {
    (topic.into(), payload.into(), true, true)
}

/// An append record, replayed or live.
fn record(topic: &str, payload: &str) -> Served {
    (topic.into(), payload.into(), false, true)
}

/// Live broadcast: no RETAIN, no offset.
fn broadcast(topic: &str, payload: &str) -> Served {
    (topic.into(), payload.into(), false, false)
}

/// A-057, A-058, A-059, A-060, A-061, A-062, A-063 (A-047, A-067, A-068, A-070, A-071,
/// A-075): on the example channels every subscription is served from each channel it
/// touches under that channel's semantics - latest as current state with RETAIN, append
/// replayed, broadcast live - and never a queue's record.
#[test]
fn the_water_example_serves_each_record_under_its_own_channel_a057_a063() {
    let broker = Broker::start(WATER);
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    for (topic, payload) in [
        ("iot/water/w-7/location", "loc-7"),
        ("iot/water/w-8/location", "loc-8"),
        ("iot/water/w-7/flow", "flow-1"),
        ("iot/water/w-7/flow", "flow-2"),
        ("iot/water/w-8/flow", "flow-8"),
        ("iot/water/w-7/inspect", "job"),
        ("iot/weather/st-3/data", "data"),
    ] {
        assert_eq!(
            producer.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0),
            "{topic}"
        );
    }
    let q = opts(QoS::AtLeastOnce);
    // A-059: one device's location, as current state.
    let mut one = Raw::connected(broker.addr, V5, "one-device");
    assert_eq!(one.subscribe("iot/water/w-7/location", q), [1]);
    assert_eq!(
        served(&mut one, 1),
        [state_of("iot/water/w-7/location", "loc-7")]
    );
    // A-060: every device's location.
    let mut every = Raw::connected(broker.addr, V5, "every-device");
    assert_eq!(every.subscribe("iot/water/+/location/#", q), [1]);
    assert_eq!(
        served(&mut every, 2),
        [
            state_of("iot/water/w-7/location", "loc-7"),
            state_of("iot/water/w-8/location", "loc-8")
        ]
    );
    // A-061: the location as state, the readings replayed, not the inspection job.
    let mut device = Raw::connected(broker.addr, V5, "device");
    assert_eq!(device.subscribe("iot/water/w-7/#", q), [1]);
    assert_eq!(
        served(&mut device, 3),
        [
            record("iot/water/w-7/flow", "flow-1"),
            record("iot/water/w-7/flow", "flow-2"),
            state_of("iot/water/w-7/location", "loc-7")
        ]
    );
    // A-062: a topic no channel claims: nothing on subscribing, then live broadcast.
    let mut raw = Raw::connected(broker.addr, V5, "raw-data");
    assert_eq!(raw.subscribe("iot/weather/st-3/data/raw", q), [1]);
    // A-063, A-067: `#` at QoS 0 is granted 0x00 and served every non-queue channel.
    let mut all = Raw::connected(broker.addr, V5, "everything");
    assert_eq!(all.subscribe("#", opts(QoS::AtMostOnce)), [0]);
    assert_eq!(
        served(&mut all, 6),
        [
            record("iot/water/w-7/flow", "flow-1"),
            record("iot/water/w-7/flow", "flow-2"),
            state_of("iot/water/w-7/location", "loc-7"),
            record("iot/water/w-8/flow", "flow-8"),
            state_of("iot/water/w-8/location", "loc-8"),
            record("iot/weather/st-3/data", "data")
        ]
    );
    // A-068: a filter matching no topic and no channel is granted.
    let mut none = Raw::connected(broker.addr, V5, "nothing-yet");
    assert_eq!(none.subscribe("no/such/+/topic", q), [1]);
    for quiet in [
        &mut one,
        &mut every,
        &mut device,
        &mut raw,
        &mut all,
        &mut none,
    ] {
        quiet.expect_nothing(Duration::from_millis(200));
    }
    // Live: broadcast beneath the device and under the weather topic, a new reading.
    for (topic, payload) in [
        ("iot/water/w-7", "bare"),
        ("iot/weather/st-3/data/raw", "raw"),
        ("iot/water/w-7/flow", "flow-3"),
    ] {
        assert_eq!(
            producer.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0),
            "{topic}"
        );
    }
    assert_eq!(
        served(&mut device, 2),
        [
            broadcast("iot/water/w-7", "bare"),
            record("iot/water/w-7/flow", "flow-3")
        ]
    );
    assert_eq!(
        served(&mut raw, 1),
        [broadcast("iot/weather/st-3/data/raw", "raw")]
    );
    assert_eq!(
        served(&mut all, 3),
        [
            broadcast("iot/water/w-7", "bare"),
            record("iot/water/w-7/flow", "flow-3"),
            broadcast("iot/weather/st-3/data/raw", "raw")
        ]
    );
    for quiet in [&mut one, &mut every, &mut device, &mut raw, &mut all] {
        quiet.expect_nothing(Duration::from_millis(200));
    }
}

/// A-064: a filter over two durable channels gets each channel's records as its own
/// delivery, with that channel's offsets and its own stored position: acknowledging
/// one channel's record moves nothing in the other, across a restart.
#[test]
fn a_filter_over_two_append_channels_keeps_a_position_in_each_a064() {
    let broker = start();
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    producer.publish("events/a", b"e1", QoS::AtLeastOnce, false);
    producer.publish("memlog/a", b"m1", QoS::AtLeastOnce, false);
    let mut c = connect(V5, "two-channels", false);
    c.properties.edit().session_expiry_interval = Some(3600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(reader.subscribe("+/a", opts(QoS::AtLeastOnce)), [1]);
    let mut got = [reader.recv_offer(), reader.recv_offer()];
    got.sort_by(|a, b| a.payload.cmp(&b.payload));
    let [e1, m1] = got;
    assert_eq!((&*e1.payload, &*m1.payload), (&b"e1"[..], &b"m1"[..]));
    for p in [&e1, &m1] {
        assert_eq!(
            user_property(p, "saguin-offset"),
            Some("0"),
            "each channel's own offsets"
        );
    }
    reader.puback(&e1);
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    let _ = reader.read_to_close();
    producer.publish("events/a", b"e2", QoS::AtLeastOnce, false);
    producer.publish("memlog/a", b"m2", QoS::AtLeastOnce, false);
    drop(producer);
    let broker = Broker::start_in(broker.stop(), CHANNELS);
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    let mut again: Vec<Vec<u8>> = (0..3)
        .map(|_| reader.recv_publish().payload.to_vec())
        .collect();
    again.sort();
    assert_eq!(
        again,
        [b"e2".to_vec(), b"m1".to_vec(), b"m2".to_vec()],
        "events resumed past e1, memlog at m1"
    );
    reader.expect_nothing(Duration::from_millis(300));
}

/// A-074, A-080, A-094: append, latest and queue channels take PUBLISH at QoS 0, 1 and
/// 2 from MQTT 5 and 3.1.1 clients alike, each stored once.
#[test]
fn every_channel_type_takes_qos_0_1_and_2_from_both_protocols_a074_a080_a094() {
    let broker = start();
    let mut tags = Vec::new();
    for protocol in [V5, V311] {
        let mut p = Raw::connected(broker.addr, protocol, &format!("producer-{protocol:?}"));
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
            let tag = format!("{protocol:?}-{qos:?}");
            for topic in [
                format!("events/{tag}"),
                format!("state/{tag}"),
                format!("work/{tag}/todo"),
            ] {
                let want = (qos != QoS::AtMostOnce).then_some(0);
                assert_eq!(
                    p.publish(&topic, tag.as_bytes(), qos, false),
                    want,
                    "{topic}"
                );
            }
            tags.push(tag);
        }
    }
    tags.sort();
    let payloads = |raw: &mut Raw| {
        let mut got: Vec<String> = (0..6)
            .map(|_| String::from_utf8_lossy(&raw.recv_publish().payload).into_owned())
            .collect();
        got.sort();
        got
    };
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(payloads(&mut reader), tags, "append");
    assert_eq!(reader.subscribe("state/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(payloads(&mut reader), tags, "latest");
    reader.expect_nothing(Duration::from_millis(300));
    let mut worker = Raw::connected(broker.addr, V5, "worker");
    assert_eq!(
        worker.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut jobs = Vec::new();
    for _ in 0..6 {
        let offer = worker.recv_offer();
        worker.puback(&offer);
        worker.answer(&offer, b"ack");
        jobs.push(String::from_utf8_lossy(&offer.payload).into_owned());
    }
    jobs.sort();
    assert_eq!(jobs, tags, "queue");
    worker.expect_nothing(Duration::from_millis(300));
}

/// A-119: a shared subscription creates no stored position and moves none - the same
/// client's ordinary subscription's included, across a restart.
#[test]
fn a_shared_subscription_never_creates_or_moves_a_position_a119() {
    let broker = start();
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    // Creates none: records acknowledged through the group leave no position behind.
    let mut c = connect(V5, "member", false);
    c.properties.edit().session_expiry_interval = Some(3600);
    let (mut member, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(
        member.subscribe("$share/g/events/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    producer.publish("events/1", b"1", QoS::AtLeastOnce, false);
    assert_eq!(&*member.recv_publish().payload, b"1");
    member.send(&Packet::Disconnect(Disconnect::new(0)));
    let _ = member.read_to_close();
    let (mut member, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    assert_eq!(member.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(
        &*member.recv_publish().payload,
        b"1",
        "replayed from the floor: the group stored no position"
    );
    member.send(&Packet::Disconnect(Disconnect::new(0)));
    let _ = member.read_to_close();
    // Moves none: the group's acknowledgement leaves the ordinary position where it was.
    let with_id = |id: u32| {
        let mut p = saguin::codec::Properties::default();
        p.edit().subscription_identifiers = vec![id];
        p
    };
    let mut c = connect(V5, "both", false);
    c.properties.edit().session_expiry_interval = Some(3600);
    let (mut both, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(
        both.subscribe_with("events/#", opts(QoS::AtLeastOnce), with_id(1)),
        [1]
    );
    let replayed = both.recv_publish();
    assert_eq!(
        (
            &*replayed.payload,
            &replayed.properties.subscription_identifiers[..]
        ),
        (&b"1"[..], &[1][..])
    );
    assert_eq!(
        both.subscribe_with("$share/h/events/#", opts(QoS::AtLeastOnce), with_id(2)),
        [1]
    );
    producer.publish("events/2", b"2", QoS::AtLeastOnce, false);
    drop(producer);
    let offers = [both.recv_offer(), both.recv_offer()];
    let shared = offers
        .iter()
        .find(|p| p.properties.subscription_identifiers == [2])
        .expect("the group's delivery");
    assert!(
        offers
            .iter()
            .any(|p| p.properties.subscription_identifiers == [1] && &*p.payload == b"2"),
        "the ordinary delivery"
    );
    both.puback(shared);
    both.send(&Packet::Disconnect(Disconnect::new(0)));
    let _ = both.read_to_close();
    let broker = Broker::start_in(broker.stop(), CHANNELS);
    let (mut both, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    let again = both.recv_publish();
    assert_eq!(
        (
            &*again.payload,
            &again.properties.subscription_identifiers[..]
        ),
        (&b"2"[..], &[1][..]),
        "the ordinary subscription's position did not move with the group's PUBACK"
    );
    both.expect_nothing(Duration::from_millis(300));
}

/// A-088: a reconnecting latest consumer is sent only the values that changed.
#[test]
fn a_reconnecting_durable_latest_consumer_is_sent_only_what_changed() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/a", b"a1", QoS::AtLeastOnce, false);
    publisher.publish("state/b", b"b1", QoS::AtLeastOnce, false);
    let mut c = connect(V5, "dashboard", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("state/#", opts(QoS::AtLeastOnce));
    reader.recv_publish();
    reader.recv_publish();
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    std::thread::sleep(Duration::from_millis(100));
    publisher.publish("state/b", b"b2", QoS::AtLeastOnce, false);
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    let got = reader.recv_publish();
    assert_eq!((&*got.topic, &*got.payload), ("state/b", &b"b2"[..]));
    reader.expect_nothing(Duration::from_millis(300));
}

#[test]
fn a_qos2_publish_into_a_channel_is_stored_once_at_its_pubrel() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let p = common::publish("events/q2", b"exactly", QoS::ExactlyOnce, false);
    publisher.send(&Packet::Publish(p.clone()));
    assert!(matches!(publisher.recv(), Packet::PubRec(a) if a.code == 0));
    let mut dup = p;
    dup.dup = true;
    publisher.send(&Packet::Publish(dup));
    assert!(matches!(publisher.recv(), Packet::PubRec(a) if a.code == 0));
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    reader.expect_nothing(Duration::from_millis(300));
    publisher.send(&Packet::PubRel(saguin::codec::Ack::new(1, 0)));
    assert!(matches!(publisher.recv(), Packet::PubComp(a) if a.code == 0));
    assert_eq!(&*reader.recv_publish().payload, b"exactly");
    reader.expect_nothing(Duration::from_millis(300));
}

#[test]
fn no_local_withholds_a_clients_own_records_from_its_channel_subscription() {
    let broker = start();
    let mut me = Raw::connected(broker.addr, V5, "self-publisher");
    let mut o = opts(QoS::AtLeastOnce);
    o.no_local = true;
    me.subscribe("events/#", o);
    assert_eq!(
        me.publish("events/mine", b"mine", QoS::AtLeastOnce, false),
        Some(0)
    );
    me.expect_nothing(Duration::from_millis(300));
    let mut other = Raw::connected(broker.addr, V5, "other-publisher");
    other.publish("events/theirs", b"theirs", QoS::AtLeastOnce, false);
    let got = me.recv_publish();
    assert_eq!(&*got.payload, b"theirs");
    assert!(
        user_property(&got, "saguin-origin").is_none(),
        "the origin is kept, never delivered"
    );
}

#[test]
fn a_subscription_asking_saguin_deletions_is_told_of_a_deletion_and_others_are_not() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/gone-before", b"x", QoS::AtLeastOnce, false);
    publisher.publish("state/gone-before", b"", QoS::AtLeastOnce, false);
    let mut asks = Raw::connected(broker.addr, V5, "asks");
    let props = saguin::codec::Properties::from(saguin::codec::PropertyValues {
        user_properties: vec![("saguin-deletions".into(), "true".into())],
        ..saguin::codec::PropertyValues::default()
    });
    assert_eq!(
        asks.subscribe_with("state/#", opts(QoS::AtLeastOnce), props),
        [1]
    );
    let mut plain = Raw::connected(broker.addr, V5, "plain");
    plain.subscribe("state/#", opts(QoS::AtLeastOnce));
    asks.expect_nothing(Duration::from_millis(200));
    publisher.publish("state/x", b"on", QoS::AtLeastOnce, false);
    publisher.publish("state/x", b"", QoS::AtLeastOnce, false);
    assert_eq!(&*asks.recv_publish().payload, b"on");
    let deletion = asks.recv_publish();
    assert_eq!((&*deletion.topic, deletion.payload.len()), ("state/x", 0));
    assert_eq!(&*plain.recv_publish().payload, b"on");
    plain.expect_nothing(Duration::from_millis(300));
    let bad = saguin::codec::Properties::from(saguin::codec::PropertyValues {
        user_properties: vec![("saguin-deletions".into(), "yes".into())],
        ..saguin::codec::PropertyValues::default()
    });
    assert_eq!(
        plain.subscribe_with("state/y", opts(QoS::AtLeastOnce), bad),
        [0x83]
    );
}

/// A durable consumer away while retention took what it had not read goes on at the
/// floor; the gap is logged and counted against its channel (gaps G-11).
#[test]
fn retention_passing_a_consumer_position_is_logged_and_counted_g11() {
    let yaml = "broker:
  id: gaps
  log_level: info
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  operations:
    listen:
      tcp:
        address: 127.0.0.1:0
  storage:
    default: local
    default_retention_period: none
    default_retention_bytes: none
    providers:
      local:
        type: sqlite
        file_path: {dir}/saguin.db
channels:
  short:
    type: append
    retention_period: 1s
";
    let broker = Broker::start_with(yaml);
    let ops = broker.ops_addr();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let mut c = connect(V5, "away", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("short/#", opts(QoS::AtLeastOnce));
    publisher.publish("short/a", b"read", QoS::AtLeastOnce, false);
    let got = reader.recv_publish();
    reader.puback(&got);
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    // Away once the broker has closed: otherwise the publishes below can be handled
    // before the DISCONNECT, and "lost 0" is delivered to the still-connected reader.
    reader.expect_closed_silently();
    for n in 0..3 {
        publisher.publish(
            "short/a",
            format!("lost {n}").as_bytes(),
            QoS::AtLeastOnce,
            false,
        );
    }
    // The age sweep runs every second; the three go a second after they were written
    // (acknowledged, so stored). Waited for rather than slept on: under emulation on
    // a busy machine a sweep can come seconds late. All four go, "read" included.
    let mut removed = 0;
    while removed < 4 {
        let line = broker.wait_log("age sweep removed");
        let count = line
            .split("removed ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u32>().ok());
        removed += count.unwrap_or_else(|| panic!("a count in {line}"));
    }
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    publisher.publish("short/a", b"after", QoS::AtLeastOnce, false);
    assert_eq!(
        &*reader.recv_publish().payload,
        b"after",
        "it goes on at the floor"
    );
    let line = broker.wait_log("no longer holds offsets");
    assert!(
        line.contains("away") && line.contains("channel short"),
        "{line}"
    );
    let metrics = common::http_get(common::tcp(&ops), "/metrics").1;
    let counted = "saguin_consumer_gap_records_total{channel=\"short\"} 3";
    assert!(metrics.contains(counted), "{counted} in:\n{metrics}");
}

/// gaps G-19: `saguin-deletions` is not kept for a resumed session, whether it was
/// held in memory or restored at a start: the SUBSCRIBE that wants deletions asks
/// again.
#[test]
fn a_resumed_session_is_told_of_deletions_only_once_it_asks_again_g19() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let asking = || {
        saguin::codec::Properties::from(saguin::codec::PropertyValues {
            user_properties: vec![("saguin-deletions".into(), "true".into())],
            ..saguin::codec::PropertyValues::default()
        })
    };
    let mut c = connect(V5, "resumes", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(
        reader.subscribe_with("state/#", opts(QoS::AtLeastOnce), asking()),
        [1]
    );
    reader.send(&Packet::Disconnect(Disconnect::new(0)));
    reader.expect_closed_silently(); // away before the session is resumed
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    publisher.publish("state/r", b"on", QoS::AtLeastOnce, false);
    publisher.publish("state/r", b"", QoS::AtLeastOnce, false);
    let got = reader.recv_publish();
    assert_eq!(&*got.payload, b"on");
    reader.puback(&got);
    reader.expect_nothing(Duration::from_millis(300));
    // A value first, so the SUBSCRIBE's current-state pass shows it: once it has
    // arrived the pass is over, and the deletion after it can only come live. (A
    // publish racing the pass may be shown as state or not at all, A-085.)
    publisher.publish("state/r", b"again", QoS::AtLeastOnce, false);
    let live = reader.recv_publish();
    reader.puback(&live);
    assert_eq!((&*live.payload, live.retain), (&b"again"[..], false));
    assert_eq!(
        reader.subscribe_with("state/#", opts(QoS::AtLeastOnce), asking()),
        [1]
    );
    let state = reader.recv_publish();
    reader.puback(&state);
    assert_eq!((&*state.payload, state.retain), (&b"again"[..], true));
    publisher.publish("state/r", b"", QoS::AtLeastOnce, false);
    let deleted = reader.recv_publish();
    reader.puback(&deleted);
    assert_eq!(
        (&*deleted.payload, deleted.retain),
        (&b""[..], false),
        "asked again, told again"
    );
}

/// C-045: a filter narrower than a queue's filter (inside it) is refused 0x8F, and
/// takes no share of the queue's jobs.
#[test]
fn a_filter_narrower_than_a_queues_filter_is_refused_0x8f_c045() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "nosy");
    assert_eq!(
        reader.subscribe("work/w1/todo", opts(QoS::AtLeastOnce)),
        [0x8F]
    );
    let mut publisher = Raw::connected(broker.addr, V311, "producer");
    assert_eq!(
        publisher.publish("work/w1/todo", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    reader.expect_nothing(Duration::from_millis(300));
}

/// C-208: two publishes with the same saguin-id are two records, at two offsets.
#[test]
fn the_same_saguin_id_twice_is_two_records_c208() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for payload in [b"first", b"again"] {
        let mut p = common::publish("events/dup", payload, QoS::AtLeastOnce, false);
        p.properties.edit().user_properties = vec![("saguin-id".into(), "same-1".into())];
        assert_eq!(publisher.publish_packet(p), Some(0));
    }
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("events/dup", opts(QoS::AtLeastOnce));
    let (a, b) = (reader.recv_publish(), reader.recv_publish());
    assert_eq!((&*a.payload, &*b.payload), (&b"first"[..], &b"again"[..]));
    assert_eq!(user_property(&a, "saguin-id"), Some("same-1"));
    assert_eq!(user_property(&b, "saguin-id"), Some("same-1"));
    assert_ne!(
        user_property(&a, "saguin-offset"),
        user_property(&b, "saguin-offset")
    );
    reader.expect_nothing(Duration::from_millis(300));
}

/// C-213: a retained publish to a latest channel's topic is accepted and is that
/// channel's record, served once from the channel and not kept as a retained value.
#[test]
fn a_retained_publish_to_a_latest_channel_is_an_ordinary_record_c213() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        publisher.publish("state/r", b"v1", QoS::AtLeastOnce, true),
        Some(0)
    );
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("state/r", opts(QoS::AtLeastOnce));
    let got = reader.recv_publish();
    assert_eq!(&*got.payload, b"v1");
    assert!(
        user_property(&got, "saguin-offset").is_some(),
        "served from the channel"
    );
    reader.expect_nothing(Duration::from_millis(300));
}

/// C-252, C-250: a Will on a channel's topic is stored there, with its properties: a
/// subscriber arriving after it fired is served it from the channel.
#[test]
fn a_will_on_a_channel_is_stored_with_its_properties_c252_c250() {
    let broker = start();
    let mut c = connect(V5, "dies", true);
    let mut properties = saguin::codec::Properties::default();
    properties.edit().content_type = Some("text/plain".into());
    properties.edit().user_properties = vec![("k".into(), "v".into())];
    c.will = Some(saguin::codec::Will {
        topic: "events/will".into(),
        payload: b"gone".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties,
    });
    let (raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0);
    drop(raw); // no DISCONNECT: the Will fires
    std::thread::sleep(Duration::from_millis(500));
    let mut reader = Raw::connected(broker.addr, V5, "late-reader");
    reader.subscribe("events/will", opts(QoS::AtLeastOnce));
    let got = reader.recv_publish();
    assert_eq!(&*got.payload, b"gone");
    assert!(user_property(&got, "saguin-offset").is_some(), "a record");
    assert_eq!(got.properties.content_type.as_deref(), Some("text/plain"));
    assert_eq!(user_property(&got, "k"), Some("v"));
}

/// A-165: on latest and queue channels too, a QoS 2 publish is held at its PUBREC and
/// written to the channel only at its PUBREL.
#[test]
fn a_qos2_publish_to_a_latest_or_queue_channel_is_written_at_its_pubrel_a165() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for (id, topic) in [(1u16, "state/a"), (2, "work/w1/todo")] {
        let mut p = common::publish(topic, topic.as_bytes(), QoS::ExactlyOnce, false);
        p.packet_id = Some(id);
        publisher.send(&Packet::Publish(p));
        assert!(matches!(publisher.recv(), Packet::PubRec(a) if a.code == 0));
    }
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(reader.subscribe("state/#", opts(QoS::AtLeastOnce)), [1]);
    let mut worker = Raw::connected(broker.addr, V5, "worker");
    assert_eq!(
        worker.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    reader.expect_nothing(Duration::from_millis(300));
    worker.expect_nothing(Duration::from_millis(100));
    publisher.send(&Packet::PubRel(saguin::codec::Ack::new(1, 0)));
    assert!(matches!(publisher.recv(), Packet::PubComp(a) if a.code == 0));
    assert_eq!(&*reader.recv_publish().payload, b"state/a");
    worker.expect_nothing(Duration::from_millis(300));
    publisher.send(&Packet::PubRel(saguin::codec::Ack::new(2, 0)));
    assert!(matches!(publisher.recv(), Packet::PubComp(a) if a.code == 0));
    assert_eq!(&*worker.recv_offer().payload, b"work/w1/todo");
}

/// A-266: a channel's record, or a queue's job, over the Maximum Packet Size of the
/// subscriber or worker it is for ends that connection with DISCONNECT 0x95.
#[test]
fn a_record_or_job_over_the_recipients_maximum_packet_size_is_disconnect_0x95_a266() {
    let broker = start();
    let small = |id: &str| {
        let mut c = connect(V5, id, true);
        c.properties.edit().maximum_packet_size = Some(64);
        let (raw, ack) = Raw::handshake(broker.addr, c);
        assert_eq!(ack.code, 0);
        raw
    };
    let mut reader = small("reader");
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    let mut worker = small("worker");
    assert_eq!(
        worker.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        publisher.publish("events/big", &[b'x'; 500], QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(reader.expect_disconnect(), 0x95);
    assert_eq!(
        publisher.publish("work/w1/todo", &[b'x'; 500], QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(worker.expect_disconnect(), 0x95);
}

/// B-149: one record per connection at a time: a broadcast sent behind a channel
/// publish whose store is held up is not delivered until that store is done.
#[test]
fn the_next_publish_waits_for_the_previous_to_be_stored_b149() {
    let broker = start();
    let mut listener = Raw::connected(broker.addr, V5, "listener");
    assert_eq!(listener.subscribe("b/#", opts(QoS::AtMostOnce)), [0]);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let lock = common::WriteLock::take(&broker);
    publisher.send(&Packet::Publish(common::publish(
        "events/1",
        b"stored",
        QoS::AtLeastOnce,
        false,
    )));
    publisher.send(&Packet::Publish(common::publish(
        "b/x",
        b"behind",
        QoS::AtMostOnce,
        false,
    )));
    listener.expect_nothing(Duration::from_millis(1000));
    publisher.expect_nothing(Duration::from_millis(100)); // the store is held up
    drop(lock);
    match publisher.recv() {
        Packet::PubAck(ack) => assert_eq!(ack.code, 0),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    assert_eq!(&*listener.recv_publish().payload, b"behind");
}

/// A-185, A-222: a publish whose topic lands in a dead-letter channel is answered 0x87
/// and logged like every other refusal, at each QoS.
#[test]
fn a_publish_refused_by_a_dead_letter_channel_is_logged_a185() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for (qos, topic) in [
        (QoS::AtMostOnce, "work/w0/todo/__dlq"),
        (QoS::AtLeastOnce, "work/w1/todo/__dlq"),
        (QoS::ExactlyOnce, "work/w2/todo/__dlq"),
    ] {
        let answer = publisher.publish(topic, b"x", qos, false);
        if qos != QoS::AtMostOnce {
            assert_eq!(answer, Some(0x87), "{qos:?}");
        }
        broker.wait_log(&format!("{topic:?} refused 0x87"));
    }
}

/// C-235, MQTT-3.3.1-11: a subscription with Retain Handling 2 that joins a latest
/// channel's cursor while an earlier one is still reading the stored state is shown
/// none of it.
#[test]
fn retain_handling_2_joining_a_cursor_still_reading_state_is_shown_none_of_it() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..150 {
        for half in ["a", "b"] {
            let topic = format!("state/{half}/{i}");
            publisher.publish(&topic, &[b'v'; 10 * 1024], QoS::AtLeastOnce, false);
        }
    }
    let mut reader = Raw::connected(broker.addr, V5, "late-joiner");
    let subscribe = |packet_id, filter: &str, handling, id| {
        let mut properties = saguin::codec::Properties::default();
        properties.edit().subscription_identifiers = vec![id];
        let options = saguin::codec::SubscriptionOptions {
            retain_handling: handling,
            ..opts(QoS::AtMostOnce)
        };
        Packet::Subscribe(saguin::codec::Subscribe {
            packet_id,
            properties,
            filters: vec![(filter.into(), options)],
        })
    };
    // Both at once: 3 MiB of state is more than the session holds, so the first
    // subscription's reading is still going when the second joins.
    let mut both = Vec::new();
    for p in [
        subscribe(1, "state/#", saguin::codec::RetainHandling::OnSubscribe, 1),
        subscribe(2, "state/b/#", saguin::codec::RetainHandling::Never, 7),
    ] {
        saguin::codec::encode(&p, V5, &mut both);
    }
    reader.send_bytes(&both);
    let mut state = 0;
    loop {
        match reader.expect_nothing_or_packet(Duration::from_millis(700)) {
            Ok(Packet::Publish(p)) => {
                assert!(p.retain, "only state so far");
                assert_eq!(
                    p.properties.subscription_identifiers,
                    [1],
                    "{} went to the Retain Handling 2 subscription",
                    p.topic
                );
                state += 1;
            }
            Ok(Packet::SubAck(_)) => {}
            Ok(other) => panic!("{other:?}"),
            Err(_) => break,
        }
    }
    assert_eq!(state, 300);
    publisher.publish("state/b/new", b"live", QoS::AtLeastOnce, false);
    let live = reader.recv_publish();
    assert_eq!(live.properties.subscription_identifiers, [1, 7]);
}

/// B-087: a QoS 0 reader replaying more than its session's bound is served the whole
/// channel: each window read as the one before is written, with nothing else (no
/// acknowledgement, no publish) to wake it.
#[test]
fn a_qos0_replay_larger_than_the_session_bound_is_served_whole() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..300u32 {
        let topic = format!("events/{i}");
        publisher.publish(&topic, &[b'e'; 10 * 1024], QoS::AtLeastOnce, false);
    }
    let mut reader = Raw::connected(broker.addr, V5, "replayer");
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtMostOnce)), [0]);
    for i in 0..300u32 {
        let p = reader.recv_publish();
        assert_eq!(&*p.topic, format!("events/{i}"));
    }
}

/// G-11: changing a filter keeps the position: a durable reader that acknowledged
/// records, unsubscribed and subscribed again inside ack_commit_interval (1 s) is not sent
/// them again.
#[test]
fn unsubscribing_and_subscribing_again_keeps_the_position_reached_g11() {
    let dir = common::temp_dir("resubscribe-position");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let yaml = CHANNELS.replace(
        "  storage:\n",
        "  session:\n    ack_commit_interval: 1s\n  storage:\n",
    );
    let broker = Broker::start_in(dir, &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..5u32 {
        publisher.publish(&format!("events/{i}"), b"e", QoS::AtLeastOnce, false);
    }
    let mut c = connect(V5, "steady-reader", true);
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut reader, _) = Raw::handshake(broker.addr, c);
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    for _ in 0..5 {
        let p = reader.recv_publish();
        reader.puback(&p);
    }
    reader.send(&Packet::Unsubscribe(saguin::codec::Unsubscribe {
        packet_id: 9,
        properties: Default::default(),
        filters: vec!["events/#".into()],
    }));
    assert!(matches!(reader.recv(), Packet::UnsubAck(_)));
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    reader.expect_nothing(Duration::from_millis(500));
}

/// A-064, A-073: each channel a subscription reaches is read in turn: one holding a
/// large backlog does not keep another's record waiting behind all of it.
#[test]
fn one_channels_backlog_does_not_hold_up_another_channels_record() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..300u32 {
        publisher.publish(
            &format!("events/{i}"),
            &[b'e'; 10 * 1024],
            QoS::AtLeastOnce,
            false,
        );
    }
    publisher.publish("memlog/one", b"m", QoS::AtLeastOnce, false);
    let mut reader = Raw::connected(broker.addr, V5, "everything");
    assert_eq!(reader.subscribe("#", opts(QoS::AtLeastOnce)), [1]);
    let mut events_before = 0;
    loop {
        let p = reader.recv_publish();
        reader.puback(&p);
        if p.topic.starts_with("memlog/") {
            break;
        }
        events_before += 1;
    }
    assert!(
        events_before < 300,
        "memlog's record came after all of events"
    );
}

/// MQTT-3.10.4-2, C-232: a latest channel's state still owed to a filter stops when
/// the filter is unsubscribed: after the UNSUBACK only what was already queued for
/// it arrives, not the rest of the channel's values.
#[test]
fn an_unsubscribed_filter_is_sent_no_more_of_its_state_pass() {
    let broker = start();
    common::fill_state(broker.addr, 600);
    let mut reader = Raw::connected_with_receive_maximum(broker.addr, "leaver", Some(1));
    let first = common::shut_window_on_state(&mut reader);
    // The state/# pass fills half the 4 MiB bound (some 200 values) and waits.
    assert_eq!(reader.subscribe("state/#", opts(QoS::AtLeastOnce)), [1]);
    reader.send(&Packet::Unsubscribe(saguin::codec::Unsubscribe {
        packet_id: 9,
        properties: Default::default(),
        filters: vec!["state/#".into()],
    }));
    let got = reader.recv();
    assert!(matches!(got, Packet::UnsubAck(_)), "{got:?}");
    reader.puback(&first);
    let after = common::drain(&mut reader, Duration::from_millis(500)).len();
    assert!(
        (1..=260).contains(&after),
        "{after} values after the UNSUBACK"
    );
}

/// B-083, B-087, RFC 0002 "How much a session may hold" (a latest value stays
/// pending): the current values a state pass shows a filter are kept as a channel's
/// records are. Broadcasts pushing the session past its bound once gave them up
/// first, the oldest in the queue, and the pass had already read past them.
#[test]
fn a_state_pass_is_not_given_up_for_broadcasts_at_the_session_bound() {
    let broker = start();
    common::fill_state(broker.addr, 300);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let mut reader = Raw::connected_with_receive_maximum(broker.addr, "pending", Some(1));
    let first = common::shut_window_on_state(&mut reader);
    assert_eq!(reader.subscribe("state/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(reader.subscribe("news/#", opts(QoS::AtMostOnce)), [0]);
    for i in 0..400u32 {
        publisher.publish(
            &format!("news/{i}"),
            &[b'n'; 10 * 1024],
            QoS::AtMostOnce,
            false,
        );
    }
    publisher.publish("news/last", b"x", QoS::AtLeastOnce, false);
    reader.puback(&first);
    let mut state = std::collections::BTreeSet::new();
    for p in common::drain(&mut reader, Duration::from_millis(1000)) {
        if p.topic.starts_with("state/") {
            assert!(p.retain, "{}", p.topic);
            state.insert(p.topic.to_string());
        }
    }
    assert_eq!(state.len(), 300, "current values given up at the bound");
}

/// RFC 0002 "Changing a filter" (reachable by nothing), A-053: a latest channel's
/// value whose topic its edited filter no longer matches is not served. It came
/// with RETAIN after the topic's real current value, a retained broadcast now.
#[test]
fn a_value_left_behind_by_a_filter_edit_is_not_served_a053() {
    let yaml = CHANNELS.replace(
        "  state:\n    type: latest\n    storage: volatile\n",
        "  state:\n    type: latest\n    filter: state/#\n",
    );
    assert_ne!(yaml, CHANNELS);
    let dir = common::temp_dir("filter-edit");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/room/1", b"old", QoS::AtLeastOnce, false);
    drop(publisher);
    let dir = broker.stop();
    let edited = yaml.replace("    filter: state/#\n", "    filter: state/device/#\n");
    let broker = Broker::start_in(dir, &edited);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/room/1", b"new", QoS::AtLeastOnce, true);
    publisher.publish("state/device/1", b"dev", QoS::AtLeastOnce, false);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(reader.subscribe("state/#", opts(QoS::AtLeastOnce)), [1]);
    let mut got = Vec::new();
    while let Ok(Packet::Publish(p)) = reader.expect_nothing_or_packet(Duration::from_millis(500)) {
        reader.puback(&p);
        got.push((
            p.topic.to_string(),
            String::from_utf8_lossy(&p.payload).into_owned(),
        ));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("state/device/1".to_string(), "dev".to_string()),
            ("state/room/1".to_string(), "new".to_string())
        ]
    );
}

/// G-12, A-077: where a durable consumer on a `start: tail` channel starts is stored
/// before its SUBACK. A record published after the SUBACK and acknowledged reaches
/// it after a SIGKILL; with the start not yet written the resumed cursor opened at
/// the new head, past the record.
#[test]
fn a_tail_consumer_killed_right_after_its_suback_resumes_where_it_began() {
    let dir = common::temp_dir("tail-start-stored");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let mut broker = Broker::start_in(dir, CHANNELS);
    let mut c = connect(V5, "tail-device", false);
    c.properties.edit().session_expiry_interval = Some(3600);
    let (mut device, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(device.subscribe("recent/#", opts(QoS::AtLeastOnce)), [1]);
    let mut publisher = Raw::connected(broker.addr, V5, "commander");
    assert_eq!(
        publisher.publish("recent/cmd", b"reboot", QoS::AtLeastOnce, false),
        Some(0)
    );
    // Delivered, not acknowledged, when the broker dies.
    assert!(matches!(device.recv(), Packet::Publish(_)));
    broker.signal("KILL");
    broker.wait_exit();
    let dir = broker.stop_killed();
    let broker = Broker::start_in(dir, CHANNELS);
    let (mut device, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    assert_eq!(&*device.recv_publish().payload, b"reboot");
}

/// MQTT-3.14.4-3, C-284: DISCONNECT 0x00 discards the Will as it is read. A client
/// that says goodbye and connects again while its old connection still waits on
/// storage (here the position write its last PUBACK made) is not reported dead.
#[test]
fn a_will_withdrawn_by_disconnect_is_not_published_by_a_takeover_while_the_old_connection_finishes()
{
    // Sessions on the memory provider, `events` on sqlite: the old connection's
    // position write waits on the lock, the new CONNECT's record does not.
    let yaml = CHANNELS
        .replace("default: local", "default: volatile")
        .replace(
            "  events:\n    type: append\n",
            "  events:\n    type: append\n    storage: local\n",
        );
    let dir = common::temp_dir("will-withdrawn");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, &yaml);
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    assert_eq!(watcher.subscribe("gone/#", opts(QoS::AtLeastOnce)), [1]);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        publisher.publish("events/1", b"r", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut c = connect(V5, "leaver", false);
    c.properties.edit().session_expiry_interval = Some(3600);
    c.will = Some(saguin::codec::Will {
        topic: "gone/leaver".into(),
        payload: b"dead".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    });
    let (mut leaver, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(leaver.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    let lock = common::WriteLock::take(&broker);
    // Acknowledged: its position waits on the held write lock.
    assert_eq!(&*leaver.recv_publish().payload, b"r");
    leaver.send(&Packet::Disconnect(Disconnect::new(0)));
    let (_again, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    watcher.expect_nothing(Duration::from_millis(1500));
    drop(lock);
}

/// C-137, gaps G-16: a channel's record outlives its publisher's expiry, in a shared
/// group's hands too. A member away while it expires gets it when it comes back,
/// without a Message Expiry Interval and with `saguin-expires`; it was dropped.
#[test]
fn a_groups_channel_record_outlives_its_expiry_c137() {
    let broker = start();
    let mut member = connect(V5, "g-away", false);
    member.properties.edit().session_expiry_interval = Some(600);
    let (mut m, _) = Raw::handshake(broker.addr, member.clone());
    assert_eq!(
        m.subscribe("$share/g/events/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    m.disconnect();
    broker.wait_log("g-away disconnected");
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let mut p = common::publish("events/brief", b"brief", QoS::AtLeastOnce, false);
    p.properties.edit().message_expiry_interval = Some(1);
    assert_eq!(publisher.publish_packet(p), Some(0));
    std::thread::sleep(Duration::from_millis(2200));
    let (mut m, ack) = Raw::handshake(broker.addr, member);
    assert!(ack.session_present);
    let got = m.recv_publish();
    assert_eq!(&*got.payload, b"brief");
    assert_eq!(got.properties.message_expiry_interval, None);
    assert!(user_property(&got, "saguin-expires").is_some());
}

/// C-225, A-092: a deletion older than `deletion_retention_period` is not sent, even
/// before a sweep removes it: a durable reader asking for deletions that comes back
/// after the period is not told of one, as an aged value is not served (G-19).
#[test]
fn a_deletion_older_than_deletion_retention_period_is_not_sent_c225() {
    let yaml = CHANNELS.replace(
        "  state:\n    type: latest\n",
        "  state:\n    type: latest\n    deletion_retention_period: 2s\n",
    );
    assert_ne!(yaml, CHANNELS);
    let dir = common::temp_dir("aged-deletion");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, &yaml);
    let deletions = || {
        saguin::codec::Properties::from(saguin::codec::PropertyValues {
            user_properties: vec![("saguin-deletions".into(), "true".into())],
            ..saguin::codec::PropertyValues::default()
        })
    };
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        publisher.publish("state/z", b"on", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut c = connect(V5, "keeper-d", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c);
    reader.subscribe_with("state/#", opts(QoS::AtLeastOnce), deletions());
    assert_eq!(&*reader.recv_publish().payload, b"on");
    // Its position is kept past the UNSUBSCRIBE, and read on from at the next (G-11).
    reader.send(&Packet::Unsubscribe(saguin::codec::Unsubscribe {
        packet_id: 7,
        filters: vec!["state/#".into()],
        properties: Default::default(),
    }));
    assert!(matches!(reader.recv(), Packet::UnsubAck(_)));
    assert_eq!(
        publisher.publish("state/z", b"", QoS::AtLeastOnce, false),
        Some(0)
    );
    std::thread::sleep(Duration::from_millis(2500));
    reader.subscribe_with("state/#", opts(QoS::AtLeastOnce), deletions());
    reader.expect_nothing(Duration::from_millis(500));
}
