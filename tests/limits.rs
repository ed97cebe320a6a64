//! `broker.limits`, each with its refusal (issue 7; RFC 0002 "Publishing" 0x97,
//! the SUBACK table, "How long a client may go quiet", "How fast connections are
//! accepted").

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Broker, Raw, connect, opts};
use saguin::codec::{
    Packet,
    ProtocolVersion::{V5, V311},
    QoS,
};

#[test]
fn a_filter_past_max_subscriptions_is_refused_0x97_and_a_replacement_is_not() {
    let broker = Broker::start("  limits:\n    max_subscriptions: 2\n");
    let mut raw = Raw::connected(broker.addr, V5, "subs");
    assert_eq!(raw.subscribe("a", opts(QoS::AtMostOnce)), [0]);
    assert_eq!(raw.subscribe("b", opts(QoS::AtMostOnce)), [0]);
    assert_eq!(raw.subscribe("c", opts(QoS::AtMostOnce)), [0x97]);
    assert_eq!(
        raw.subscribe("a", opts(QoS::AtLeastOnce)),
        [1],
        "replacing one is not adding one"
    );
}

#[test]
fn a_channel_filter_past_max_subscriptions_is_never_served_and_the_suback_says_why_a149_b094() {
    let broker = Broker::start(
        "  limits:\n    max_subscriptions: 1\nchannels:\n  events:\n    type: append\n    filter: events/#\n",
    );
    let mut raw = Raw::connected(broker.addr, V5, "subs");
    assert_eq!(raw.subscribe("a", opts(QoS::AtMostOnce)), [0]);
    raw.send(&Packet::Subscribe(saguin::codec::Subscribe {
        packet_id: 2,
        properties: Default::default(),
        filters: vec![("events/#".into(), opts(QoS::AtLeastOnce))],
    }));
    let Packet::SubAck(ack) = raw.recv() else {
        panic!("expected SUBACK")
    };
    assert_eq!(ack.codes, [0x97]);
    let why = ack
        .properties
        .reason_string
        .clone()
        .expect("a Reason String");
    assert!(why.contains("limits.max_subscriptions"), "{why}");
    let mut publisher = Raw::connected(broker.addr, V5, "pub");
    assert_eq!(
        publisher.publish("events/x", b"1", QoS::AtLeastOnce, false),
        Some(0)
    );
    raw.expect_nothing(Duration::from_millis(300));
}

/// B-100, B-102, B-104: max_topic_levels bounds a publish (0x90) and a filter (0x8F,
/// 3.1.1 0x80, the rest of the packet answered), a shared filter measured after
/// `$share/<name>/`.
#[test]
fn max_topic_levels_bounds_publishes_and_filters_b100_b102_b104() {
    let broker = Broker::start("  limits:\n    max_topic_levels: 3\n");
    let mut raw = Raw::connected(broker.addr, V5, "levels");
    assert_eq!(raw.publish("a/b/c", b"x", QoS::AtLeastOnce, false), Some(0));
    assert_eq!(
        raw.publish("a/b/c/d", b"x", QoS::AtLeastOnce, false),
        Some(0x90)
    );
    raw.send(&Packet::Subscribe(saguin::codec::Subscribe {
        packet_id: 3,
        properties: Default::default(),
        filters: vec![
            ("a/b/c/d".into(), opts(QoS::AtMostOnce)),
            ("a/+/c".into(), opts(QoS::AtMostOnce)),
            ("$share/g/a/b/c".into(), opts(QoS::AtMostOnce)),
        ],
    }));
    let Packet::SubAck(ack) = raw.recv() else {
        panic!("expected SUBACK")
    };
    assert_eq!(ack.codes, [0x8F, 0, 0]);
    let mut old = Raw::connected(broker.addr, V311, "levels-311");
    assert_eq!(old.subscribe("a/b/c/#", opts(QoS::AtMostOnce)), [0x80]);
}

#[test]
fn user_properties_past_max_header_count_or_bytes_are_refused_0x97() {
    let broker = Broker::start("  limits:\n    max_header_count: 2\n    max_header_bytes: 64\n");
    let mut raw = Raw::connected(broker.addr, V5, "headers");
    let mut p = common::publish("h", b"x", QoS::AtLeastOnce, false);
    p.properties.edit().user_properties = vec![("a".into(), "1".into()), ("b".into(), "2".into())];
    assert_eq!(raw.publish_packet(p.clone()), Some(0));
    p.properties
        .edit()
        .user_properties
        .push(("c".into(), "3".into()));
    assert_eq!(raw.publish_packet(p.clone()), Some(0x97), "three headers");
    p.properties.edit().user_properties = vec![("k".into(), "v".repeat(80))];
    assert_eq!(raw.publish_packet(p), Some(0x97), "eighty bytes");
}

#[test]
fn a_client_over_its_publish_rate_is_refused_0x97_and_the_budget_survives_a_reconnect() {
    let broker = Broker::start("  limits:\n    publish_rate: 5\n");
    let mut raw = Raw::connected(broker.addr, V5, "chatty");
    let codes: Vec<_> = (0..8)
        .map(|_| raw.publish("r", b"x", QoS::AtLeastOnce, false))
        .collect();
    assert!(codes.iter().take(5).all(|c| *c == Some(0)), "{codes:?}");
    assert!(codes.contains(&Some(0x97)), "{codes:?}");
    drop(raw);
    let mut again = Raw::connected(broker.addr, V5, "chatty");
    again.send(&Packet::Publish(common::publish(
        "r",
        b"x",
        QoS::AtLeastOnce,
        false,
    )));
    let Packet::PubAck(ack) = again.recv() else {
        panic!("expected PUBACK")
    };
    assert_eq!(ack.code, 0x97, "a reconnect does not refill it");
    let why = ack.properties.reason_string.clone().unwrap_or_default();
    assert!(why.contains("publish rate exceeded"), "A-187: {why}");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        again.publish("r", b"x", QoS::AtLeastOnce, false),
        Some(0),
        "it refills with time"
    );
}

#[test]
fn max_keepalive_answers_a_longer_or_zero_keepalive_with_server_keep_alive() {
    let broker = Broker::start("  limits:\n    max_keepalive: 30s\n");
    for asked in [0u16, 600] {
        let mut c = connect(V5, "ka", true);
        c.keep_alive = asked;
        let (_raw, ack) = Raw::handshake(broker.addr, c);
        assert_eq!(ack.properties.server_keep_alive, Some(30), "asked {asked}");
    }
    let mut c = connect(V5, "ka", true);
    c.keep_alive = 10;
    let (_raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(
        ack.properties.server_keep_alive, None,
        "inside the ceiling is left alone"
    );
}

#[test]
fn a_311_client_keeps_the_keepalive_it_asked_for_under_max_keepalive_b076() {
    let broker = Broker::start("  limits:\n    max_keepalive: 1s\n");
    for asked in [0u16, 60] {
        let mut c = connect(V311, "ka311", true);
        c.keep_alive = asked;
        let (mut raw, _) = Raw::handshake(broker.addr, c);
        // Past 1.5 times the ceiling, silent: a ceiling it was never told of would
        // have cut it off by now.
        std::thread::sleep(Duration::from_millis(2000));
        raw.send(&Packet::PingReq);
        assert!(
            matches!(raw.recv(), Packet::PingResp),
            "keepalive {asked} kept"
        );
    }
}

#[test]
fn connections_over_max_connect_rate_wait_in_the_accept_queue_rather_than_being_refused() {
    let broker = Broker::start("  limits:\n    max_connect_rate: 5\n");
    let started = Instant::now();
    // The bucket holds 10 (twice the rate); 15 connections need a second more.
    let clients: Vec<Raw> = (0..15)
        .map(|i| Raw::connected(broker.addr, V5, &format!("r{i}")))
        .collect();
    let took = started.elapsed();
    assert_eq!(clients.len(), 15, "every one admitted");
    assert!(took >= Duration::from_millis(700), "{took:?}");
    drop(TcpStream::connect(broker.addr));
}

#[test]
fn a_subscriber_that_stops_reading_is_hung_up_at_write_timeout_and_the_publisher_never_waits() {
    let broker = Broker::start(
        "  limits:\n    write_timeout: 1s\n    max_message_size: 256KiB\n    max_connect_size: 100KiB\n",
    );
    let mut deaf = Raw::connected(broker.addr, V5, "deaf");
    assert_eq!(deaf.subscribe("flood/#", opts(QoS::AtMostOnce)), [0]);
    // From here on `deaf` reads nothing, so its socket buffers fill.
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    let payload = vec![b'x'; 200 * 1024];
    let started = Instant::now();
    for _ in 0..100 {
        assert_eq!(
            publisher.publish("flood/x", &payload, QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let took = started.elapsed();
    broker.wait_log("write_timeout passed");
    assert!(
        took < Duration::from_secs(10),
        "the publisher was held: {took:?}"
    );
    drop(deaf);
}

#[test]
fn a_full_session_gives_up_its_oldest_broadcast_and_the_publisher_is_never_refused() {
    let broker = Broker::start(
        "  limits:\n    max_message_size: 128KiB\n    max_connect_size: 100KiB\n    session_queue_bytes: 1MiB\n",
    );
    let mut c = connect(V5, "slow", true);
    c.properties.edit().receive_maximum = Some(1);
    let (mut slow, _) = Raw::handshake(broker.addr, c);
    slow.subscribe("full/#", opts(QoS::AtLeastOnce));
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    for i in 0..30u8 {
        let mut payload = vec![b'x'; 100 * 1024];
        payload[0] = i;
        assert_eq!(
            publisher.publish("full/x", &payload, QoS::AtLeastOnce, false),
            Some(0),
            "never refused"
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut got = Vec::new();
    while let Ok(saguin::codec::Packet::Publish(p)) =
        slow.expect_nothing_or_packet(Duration::from_millis(500))
    {
        got.push(p.payload[0]);
        if let Some(id) = p.packet_id {
            slow.send(&saguin::codec::Packet::PubAck(saguin::codec::Ack::new(
                id, 0,
            )));
        }
    }
    assert_eq!(got.first(), Some(&0), "the one on the wire stays: {got:?}");
    assert_eq!(got.last(), Some(&29), "the newest are kept: {got:?}");
    assert!(got.len() < 30 && got.len() >= 5, "{got:?}");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
}
