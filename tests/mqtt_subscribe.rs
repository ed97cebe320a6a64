//! SUBSCRIBE: filters, options, retained delivery, and shared subscriptions
//! (RFC 0002 "Shared subscriptions" and the SUBACK table).

mod common;

use std::time::Duration;

use common::{Broker, Raw, connect, opts};
use saguin::codec::{
    Packet, Properties, PropertyValues,
    ProtocolVersion::{V5, V311},
    QoS, RetainHandling, Subscribe, SubscriptionOptions, Unsubscribe,
};

#[test]
fn wildcards_match_as_mqtt_says_and_dollar_topics_escape_leading_wildcards() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "wild");
    assert_eq!(sub.subscribe("#", opts(QoS::AtMostOnce)), [0]);
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("$dollar/x", b"hidden", QoS::AtLeastOnce, false);
    publisher.publish("a/b/c", b"seen", QoS::AtLeastOnce, false);
    assert_eq!(&*sub.recv_publish().payload, b"seen");
    sub.expect_nothing(Duration::from_millis(200));
}

#[test]
fn invalid_filters_get_0x8f_and_reserved_ones_0x87() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "s");
    for (filter, code) in [
        ("a/#/b", 0x8F),
        ("a+", 0x8F),
        ("$SYS/#", 0x87),
        ("$saguin/x", 0x87),
        ("$share/g/$SYS/#", 0x87),
        ("$share/g", 0x8F),
        ("$share//t", 0x8F),
        ("$share/g+/t", 0x8F),
        ("$share/g/$share/h/t", 0x8F),
        ("$SHARE/g/t", 0x8F),
    ] {
        assert_eq!(
            sub.subscribe(filter, opts(QoS::AtMostOnce)),
            [code],
            "{filter}"
        );
    }
    let deep = vec!["l"; 201].join("/");
    assert_eq!(sub.subscribe(&deep, opts(QoS::AtMostOnce)), [0x8F]);
    assert_eq!(
        sub.subscribe("fine/+", opts(QoS::AtLeastOnce)),
        [1],
        "still connected"
    );
}

#[test]
fn a_3_1_1_client_is_refused_shared_subscriptions_with_0x80() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V311, "old");
    assert_eq!(sub.subscribe("$share/g/t", opts(QoS::AtMostOnce)), [0x80]);
    assert_eq!(sub.subscribe("$SYS/#", opts(QoS::AtMostOnce)), [0x80]);
}

#[test]
fn a_shared_subscription_with_no_local_ends_the_connection_0x82() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "nl");
    let mut o = opts(QoS::AtMostOnce);
    o.no_local = true;
    sub.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        properties: Properties::default(),
        filters: vec![("$share/g/t".into(), o)],
    }));
    assert_eq!(sub.expect_disconnect(), 0x82);
}

#[test]
fn a_subscribe_with_no_filters_is_a_protocol_error() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "empty");
    sub.send_bytes(&[0x82, 0x03, 0x00, 0x01, 0x00]);
    assert_eq!(sub.expect_disconnect(), 0x82);
}

#[test]
fn retain_handling_3_is_a_protocol_error() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "rh3");
    sub.send_bytes(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b't', 0x30]);
    assert_eq!(sub.expect_disconnect(), 0x82);
}

#[test]
fn shared_groups_take_turns_in_client_id_order() {
    let broker = Broker::start("");
    let mut members: Vec<Raw> = ["m-b", "m-a", "m-c"]
        .iter()
        .map(|id| {
            let mut raw = Raw::connected(broker.addr, V5, id);
            assert_eq!(
                raw.subscribe("$share/grp/work/#", opts(QoS::AtLeastOnce)),
                [1]
            );
            raw
        })
        .collect();
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    for i in 0..6 {
        publisher.publish("work/x", format!("{i}").as_bytes(), QoS::AtLeastOnce, false);
    }
    // Client-id order is m-a, m-b, m-c: members[1], members[0], members[2].
    for (member, want) in [(1usize, ["0", "3"]), (0, ["1", "4"]), (2, ["2", "5"])] {
        for w in want {
            assert_eq!(
                &*members[member].recv_publish().payload,
                w.as_bytes(),
                "member {member}"
            );
        }
    }
}

#[test]
fn a_shared_message_passes_over_a_member_too_small_for_it_a125_a126() {
    let broker = Broker::start("");
    let mut small = connect(V5, "m-a", true);
    small.properties.edit().maximum_packet_size = Some(64);
    let (mut small, _) = Raw::handshake(broker.addr, small);
    let mut large = Raw::connected(broker.addr, V5, "m-b");
    for member in [&mut small, &mut large] {
        assert_eq!(
            member.subscribe("$share/grp/work/#", opts(QoS::AtLeastOnce)),
            [1]
        );
    }
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    for i in 0..2u8 {
        publisher.publish("work/x", &[i; 500], QoS::AtLeastOnce, false);
    }
    for i in 0..2u8 {
        let got = large.recv_publish();
        assert_eq!(&*got.payload, &[i; 500][..]);
        large.puback(&got);
    }
    small.expect_nothing(Duration::from_millis(300));
    // What fits still takes turns.
    for i in 0..2u8 {
        publisher.publish("work/x", &[i], QoS::AtLeastOnce, false);
    }
    assert_eq!(&*small.recv_publish().payload, &[0u8][..]);
    assert_eq!(&*large.recv_publish().payload, &[1u8][..]);
}

#[test]
fn shared_subscriptions_get_no_retained_messages() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("r/t", b"kept", QoS::AtLeastOnce, true);
    let mut sub = Raw::connected(broker.addr, V5, "s");
    sub.subscribe("$share/g/r/#", opts(QoS::AtLeastOnce));
    sub.expect_nothing(Duration::from_millis(300));
}

#[test]
fn subscription_identifiers_come_back_on_deliveries() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "ids");
    let props = Properties::from(PropertyValues {
        subscription_identifiers: vec![7],
        ..PropertyValues::default()
    });
    sub.subscribe_with("ids/+", opts(QoS::AtMostOnce), props);
    let props = Properties::from(PropertyValues {
        subscription_identifiers: vec![9],
        ..PropertyValues::default()
    });
    sub.subscribe_with("ids/#", opts(QoS::AtMostOnce), props);
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("ids/x", b"x", QoS::AtMostOnce, false);
    let mut got = sub
        .recv_publish()
        .properties
        .subscription_identifiers
        .clone();
    got.sort_unstable();
    assert_eq!(
        got,
        [7, 9],
        "overlapping subscriptions: one delivery, both identifiers"
    );
    sub.expect_nothing(Duration::from_millis(200));
}

#[test]
fn no_local_withholds_a_clients_own_publishes() {
    let broker = Broker::start("");
    let mut me = Raw::connected(broker.addr, V5, "me");
    let mut o = opts(QoS::AtMostOnce);
    o.no_local = true;
    me.subscribe("echo", o);
    me.publish("echo", b"mine", QoS::AtMostOnce, false);
    me.expect_nothing(Duration::from_millis(200));
    let mut other = Raw::connected(broker.addr, V5, "other");
    other.publish("echo", b"theirs", QoS::AtMostOnce, false);
    assert_eq!(&*me.recv_publish().payload, b"theirs");
}

#[test]
fn retained_values_follow_the_suback_with_retain_set_and_zero_length_deletes() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("ret/a", b"A", QoS::AtLeastOnce, true);
    publisher.publish("ret/b", b"B", QoS::AtLeastOnce, true);
    publisher.publish("ret/b", b"", QoS::AtLeastOnce, true);
    let mut sub = Raw::connected(broker.addr, V311, "s");
    assert_eq!(sub.subscribe("ret/#", opts(QoS::AtLeastOnce)), [1]);
    let got = sub.recv_publish();
    assert!(got.retain);
    assert_eq!((&*got.topic, &*got.payload), ("ret/a", &b"A"[..]));
    sub.expect_nothing(Duration::from_millis(200));
    // A live publish is not marked retained for an ordinary subscriber.
    publisher.publish("ret/a", b"A2", QoS::AtLeastOnce, true);
    assert!(!sub.recv_publish().retain);
}

#[test]
fn retain_as_published_keeps_the_flag_on_live_deliveries() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "rap");
    let mut o = opts(QoS::AtMostOnce);
    o.retain_as_published = true;
    sub.subscribe("rap/t", o);
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("rap/t", b"x", QoS::AtMostOnce, true);
    assert!(sub.recv_publish().retain);
}

#[test]
fn retain_handling_1_sends_only_on_a_new_subscription_and_2_never() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("rh/t", b"v", QoS::AtLeastOnce, true);
    let mut sub = Raw::connected(broker.addr, V5, "s");
    let on_new = SubscriptionOptions {
        retain_handling: RetainHandling::OnNewSubscribe,
        ..opts(QoS::AtMostOnce)
    };
    sub.subscribe("rh/t", on_new);
    assert_eq!(&*sub.recv_publish().payload, b"v");
    sub.subscribe("rh/t", on_new);
    sub.expect_nothing(Duration::from_millis(200));
    let never = SubscriptionOptions {
        retain_handling: RetainHandling::Never,
        ..opts(QoS::AtMostOnce)
    };
    sub.subscribe("rh/#", never);
    sub.expect_nothing(Duration::from_millis(200));
}

#[test]
fn retained_message_expiry_is_honoured_and_the_remaining_interval_sent() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    let mut p = common::publish("exp/long", b"x", QoS::AtLeastOnce, true);
    p.properties.edit().message_expiry_interval = Some(100);
    publisher.publish_packet(p);
    let mut p = common::publish("exp/short", b"y", QoS::AtLeastOnce, true);
    p.properties.edit().message_expiry_interval = Some(1);
    publisher.publish_packet(p);
    std::thread::sleep(Duration::from_millis(2100));
    let mut sub = Raw::connected(broker.addr, V5, "s");
    sub.subscribe("exp/#", opts(QoS::AtMostOnce));
    let got = sub.recv_publish();
    assert_eq!(&*got.topic, "exp/long");
    let left = got
        .properties
        .message_expiry_interval
        .expect("remaining expiry");
    assert!((90..100).contains(&left), "{left}");
    sub.expect_nothing(Duration::from_millis(200));
}

#[test]
fn unsubscribe_stops_deliveries_and_reports_what_did_not_exist() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "u");
    sub.subscribe("u/t", opts(QoS::AtMostOnce));
    sub.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 2,
        properties: Properties::default(),
        filters: vec!["u/t".into(), "never".into()],
    }));
    match sub.recv() {
        Packet::UnsubAck(ack) => assert_eq!(ack.codes, [0x00, 0x11]),
        other => panic!("{other:?}"),
    }
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("u/t", b"x", QoS::AtLeastOnce, false);
    sub.expect_nothing(Duration::from_millis(200));
}

/// B-446: a delivery held for a shared group because no member could take it waits
/// `broker.share.expires_after` at most: it is dropped and counted while its member is
/// away. What came later is still owed, and so is everything a session's own
/// subscription holds.
#[test]
fn a_groups_backlog_is_dropped_after_share_expires_after() {
    let dir = common::temp_dir("share-expiry");
    let extra = "  share:\n    expires_after: 1s\n  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\n";
    let broker = Broker::start_in(dir, &common::config(extra));
    let away = |id: &str, filter: &str| {
        let mut c = connect(V5, id, false);
        c.properties.edit().session_expiry_interval = Some(300);
        let (mut raw, _) = Raw::handshake(broker.addr, c.clone());
        assert_eq!(raw.subscribe(filter, opts(QoS::AtLeastOnce)), [1]);
        drop(raw);
        c
    };
    let member = away("member", "$share/g/jobs/#");
    let own = away("own", "jobs/#");
    std::thread::sleep(Duration::from_millis(200));
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    assert_eq!(
        publisher.publish("jobs/1", b"stale", QoS::AtLeastOnce, false),
        Some(0)
    );
    // Past the period and the housekeeping second that sweeps it.
    std::thread::sleep(Duration::from_millis(2600));
    broker.assert_metric("saguin_shares_dropped_total{cause=\"expired\"} 1");
    assert_eq!(
        publisher.publish("jobs/2", b"fresh", QoS::AtLeastOnce, false),
        Some(0)
    );

    let (mut raw, ack) = Raw::handshake(broker.addr, member);
    assert!(ack.session_present);
    assert_eq!(&*raw.recv_publish().payload, b"fresh");
    raw.expect_nothing(Duration::from_millis(300));

    let (mut raw, _) = Raw::handshake(broker.addr, own);
    assert_eq!(&*raw.recv_publish().payload, b"stale");
    assert_eq!(&*raw.recv_publish().payload, b"fresh");
}
