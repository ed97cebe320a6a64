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

/// subscription wildcards match as MQTT says.
/// a leading wildcard never matches a `$` topic.
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

/// shapes 0x8F, reserved 0x87, still connected.
/// `$SHARE` as a first level is 0x8F.
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

/// every refused filter's SUBACK carries a Reason String naming it, unless
/// Request Problem Information is 0, when the code comes alone.
#[test]
fn every_refused_filter_is_told_why_unless_problem_information_is_0_a184() {
    let broker = Broker::start("");
    for (id, asked) in [("talkative", None), ("quiet", Some(0u8))] {
        let mut c = connect(V5, id, true);
        c.properties.edit().request_problem_information = asked;
        let (mut raw, ack) = Raw::handshake(broker.addr, c);
        assert_eq!(ack.code, 0);
        let mut unread = Properties::default();
        unread.edit().user_properties = vec![("saguin-unknown".into(), "1".into())];
        for (filter, properties, code) in [
            ("$SYS/#", Properties::default(), 0x87),
            ("a/#/b", Properties::default(), 0x8F),
            ("t/#", unread, 0x83),
        ] {
            raw.send(&Packet::Subscribe(Subscribe {
                packet_id: 7,
                properties,
                filters: vec![(filter.into(), opts(QoS::AtMostOnce))],
            }));
            let ack = match raw.recv() {
                Packet::SubAck(ack) => ack,
                other => panic!("expected SUBACK, got {other:?}"),
            };
            assert_eq!(ack.codes, [code], "{id} {filter}");
            let why = ack.properties.reason_string.clone();
            match asked {
                None => assert!(why.is_some_and(|w| !w.is_empty()), "{id} {filter}"),
                Some(_) => assert_eq!(why, None, "{id} {filter}"),
            }
        }
    }
}

/// 3.1.1 refusals are 0x80 and the client may subscribe again.
#[test]
fn a_3_1_1_client_is_refused_shared_subscriptions_with_0x80() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V311, "old");
    assert_eq!(sub.subscribe("$share/g/t", opts(QoS::AtMostOnce)), [0x80]);
    assert_eq!(sub.subscribe("$SYS/#", opts(QoS::AtMostOnce)), [0x80]);
}

/// No Local on a shared subscription is DISCONNECT 0x82.
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

/// over broadcast a group gets every message, each to one member.
/// one member per message, turns in client-id order.
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

/// C-236: no retained value to a shared subscription.
/// a member whose Receive Maximum window is full is passed over; each message
/// goes to exactly one member, and the member takes its turn again once it acknowledges.
#[test]
fn a_shared_message_passes_over_a_member_whose_window_is_full_a123() {
    let broker = Broker::start("");
    let mut narrow = Raw::connected_with_receive_maximum(broker.addr, "m-a", Some(1));
    let mut wide = Raw::connected(broker.addr, V5, "m-b");
    for member in [&mut narrow, &mut wide] {
        assert_eq!(
            member.subscribe("$share/grp/work/#", opts(QoS::AtLeastOnce)),
            [1]
        );
    }
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("work/x", b"0", QoS::AtLeastOnce, false);
    let held = narrow.recv_offer();
    assert_eq!(&*held.payload, b"0");
    // m-a's one-message window is full: every turn of its goes to m-b.
    for i in 1..4 {
        publisher.publish("work/x", format!("{i}").as_bytes(), QoS::AtLeastOnce, false);
        assert_eq!(&*wide.recv_publish().payload, format!("{i}").as_bytes());
    }
    narrow.expect_nothing(Duration::from_millis(300));
    narrow.puback(&held);
    narrow.send(&Packet::PingReq);
    assert!(matches!(narrow.recv(), Packet::PingResp));
    publisher.publish("work/x", b"4", QoS::AtLeastOnce, false);
    assert_eq!(&*narrow.recv_publish().payload, b"4");
    wide.expect_nothing(Duration::from_millis(300));
}

/// a string that is not a topic filter, from a 3.1.1 client, closes the
/// connection with no SUBACK (3.1.1 has no code for it).
#[test]
fn an_invalid_filter_from_a_3_1_1_client_closes_with_no_suback_a156() {
    let broker = Broker::start("");
    for filter in ["a/#/b", "a+"] {
        let mut sub = Raw::connected(broker.addr, V311, "old");
        sub.send(&Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(filter.into(), opts(QoS::AtMostOnce))],
        }));
        sub.expect_closed_silently();
    }
}

/// every refused filter is counted under the code Sagüin decided, a 3.1.1
/// client's included, though it was sent 0x80.
#[test]
fn a_refusal_sent_to_a_3_1_1_client_as_0x80_is_counted_under_its_own_code_a159() {
    let dir = common::temp_dir("refused-metric");
    let extra = "  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\n";
    let broker = Broker::start_in(dir, &common::config(extra));
    let mut old = Raw::connected(broker.addr, V311, "old");
    assert_eq!(old.subscribe("$SYS/#", opts(QoS::AtMostOnce)), [0x80]);
    let deep = vec!["l"; 201].join("/");
    assert_eq!(old.subscribe(&deep, opts(QoS::AtMostOnce)), [0x80]);
    // A shared subscription, which 3.1.1 does not have: 0x8F (RFC 0002's SUBACK table).
    assert_eq!(old.subscribe("$share/g/t", opts(QoS::AtMostOnce)), [0x80]);
    let mut new = Raw::connected(broker.addr, V5, "new");
    assert_eq!(new.subscribe("$SYS/#", opts(QoS::AtMostOnce)), [0x87]);
    broker.assert_metric("saguin_subscriptions_refused_total{code=\"0x87\"} 2");
    broker.assert_metric("saguin_subscriptions_refused_total{code=\"0x8F\"} 2");
}

/// no ShareName is reserved: groups named after Sagüin's own words are
/// granted and served.
#[test]
fn no_share_name_is_reserved_a115() {
    let broker = Broker::start("");
    let names = [
        "saguin", "$saguin", "queue", "SYS", "share", "consumer", "__dlq",
    ];
    let mut member = Raw::connected(broker.addr, V5, "member");
    for (i, name) in names.iter().enumerate() {
        let filter = format!("$share/{name}/names/{i}");
        assert_eq!(
            member.subscribe(&filter, opts(QoS::AtLeastOnce)),
            [1],
            "{filter}"
        );
    }
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    for (i, name) in names.iter().enumerate() {
        let topic = format!("names/{i}");
        publisher.publish(&topic, name.as_bytes(), QoS::AtLeastOnce, false);
        assert_eq!(&*member.recv_publish().payload, name.as_bytes(), "{name}");
    }
}

/// a group is served nothing published before it began.
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

/// C-216, C-217, C-218, C-237, C-232: SUBACK first, stored value with RETAIN, empty deletes, live flag cleared.
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

/// C-237: Retain As Published carries the publisher's flag live.
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
        broker.wait_log(&format!("{id} disconnected"));
        c
    };
    let member = away("member", "$share/g/jobs/#");
    let own = away("own", "jobs/#");
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    assert_eq!(
        publisher.publish("jobs/1", b"stale", QoS::AtLeastOnce, false),
        Some(0)
    );
    // Past the period, the housekeeping second that sweeps it.
    broker.wait_log("1 shared group deliveries dropped");
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

/// C-215: one retained value per broadcast topic: a second retained publish replaces
/// the first, and a new subscriber is sent only the newest.
#[test]
fn a_retained_publish_replaces_the_topics_previous_value_c215() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("rep/t", b"old", QoS::AtLeastOnce, true);
    publisher.publish("rep/t", b"new", QoS::AtLeastOnce, true);
    let mut sub = Raw::connected(broker.addr, V5, "s");
    assert_eq!(sub.subscribe("rep/#", opts(QoS::AtLeastOnce)), [1]);
    let got = sub.recv_publish();
    assert_eq!((&*got.payload, got.retain), (&b"new"[..], true));
    sub.expect_nothing(Duration::from_millis(300));
}

/// C-234: retained values are sent at SUBSCRIBE, never at connect: a session resumed
/// without subscribing again is sent none.
#[test]
fn a_resumed_session_is_sent_no_retained_value_at_connect_c234() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("kept/t", b"v", QoS::AtLeastOnce, true);
    let mut c = connect(V5, "resumer", false);
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut sub, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(sub.subscribe("kept/#", opts(QoS::AtLeastOnce)), [1]);
    assert!(sub.recv_publish().retain, "sent at the SUBSCRIBE");
    sub.disconnect();
    let (mut sub, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    sub.expect_nothing(Duration::from_millis(500));
}

/// `$share` in any case but lower is refused 0x8F, as a first level and
/// as the start of a shared subscription's inner filter; the lower-case form is granted.
#[test]
fn share_spelled_in_any_other_case_is_refused_0x8f_a132_a135() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "s");
    for filter in [
        "$share/g/$SHARE/h/t",
        "$share/g/$Share/h/t",
        "$share/g/$sHaRe",
        "$SHARE/g/t",
        "$Share/g/events/#",
        "$sHARE/g/#",
        "$share",
        "$SHARE",
    ] {
        assert_eq!(
            sub.subscribe(filter, opts(QoS::AtMostOnce)),
            [0x8F],
            "{filter}"
        );
    }
    assert_eq!(sub.subscribe("$share/g/t", opts(QoS::AtMostOnce)), [0]);
    // A first level that only begins with the word is an ordinary one.
    assert_eq!(sub.subscribe("$shares/t", opts(QoS::AtMostOnce)), [0]);
    assert_eq!(sub.subscribe("$SHARED/#", opts(QoS::AtMostOnce)), [0]);
}

/// a `saguin-` User Property Sagüin does not read refuses every filter of the
/// SUBSCRIBE 0x83, and none of them is subscribed.
#[test]
fn an_unread_saguin_property_refuses_every_filter_of_the_packet_a143() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "s");
    let mut unread = Properties::default();
    unread.edit().user_properties = vec![("saguin-unknown".into(), "1".into())];
    sub.send(&Packet::Subscribe(Subscribe {
        packet_id: 3,
        properties: unread,
        filters: vec![
            ("t/a".into(), opts(QoS::AtLeastOnce)),
            ("t/b".into(), opts(QoS::AtMostOnce)),
            ("$share/g/t/c".into(), opts(QoS::AtLeastOnce)),
        ],
    }));
    match sub.recv() {
        Packet::SubAck(ack) => assert_eq!(ack.codes, [0x83, 0x83, 0x83]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    for topic in ["t/a", "t/b", "t/c"] {
        assert_eq!(
            publisher.publish(topic, b"x", QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    sub.expect_nothing(Duration::from_millis(300));
}

/// A-156, MQTT-3.8.3-4: a SUBSCRIBE that ends the connection grants none of its
/// filters, not even those before the one that ended it.
#[test]
fn a_subscribe_that_ends_the_connection_leaves_nothing_in_the_session_a156() {
    let broker = Broker::start("");
    let cases: [(_, &str, SubscriptionOptions); 2] = [
        (V311, "bad#", opts(QoS::AtLeastOnce)),
        (
            V5,
            "$share/g/x",
            SubscriptionOptions {
                no_local: true,
                ..opts(QoS::AtLeastOnce)
            },
        ),
    ];
    for (protocol, bad, bad_options) in cases {
        let id = format!("kept-{protocol:?}");
        let mut c = connect(protocol, &id, false);
        if protocol == V5 {
            c.properties.edit().session_expiry_interval = Some(600);
        }
        let (mut raw, _) = Raw::handshake(broker.addr, c);
        raw.send(&Packet::Subscribe(Subscribe {
            packet_id: 3,
            properties: Properties::default(),
            filters: vec![
                ("ok/t".into(), opts(QoS::AtLeastOnce)),
                (bad.into(), bad_options),
            ],
        }));
        match raw.try_recv() {
            Err(_) => {}
            Ok(Packet::Disconnect(d)) => assert_eq!(d.code, 0x82),
            Ok(other) => panic!("{protocol:?}: expected the connection to end, got {other:?}"),
        }
        let mut again = connect(protocol, &id, false);
        if protocol == V5 {
            again.properties.edit().session_expiry_interval = Some(600);
        }
        let (mut raw, _) = Raw::handshake(broker.addr, again);
        let mut publisher = Raw::connected(broker.addr, V5, "p");
        publisher.publish("ok/t", b"never granted", QoS::AtLeastOnce, false);
        raw.expect_nothing(Duration::from_millis(300));
    }
}

/// MQTT-3.8.4-3: a filter named many times in one SUBSCRIBE is one subscription; every
/// copy gets its code and each retained value comes once, not once per copy.
#[test]
fn a_filter_repeated_in_one_subscribe_is_granted_once() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    for topic in ["r/1", "r/2", "r/3"] {
        publisher.publish(topic, topic.as_bytes(), QoS::AtLeastOnce, true);
    }
    let mut sub = Raw::connected(broker.addr, V5, "many");
    let mut filters = vec![("r/#".to_string(), opts(QoS::AtMostOnce)); 5_000];
    filters.push(("r/#".into(), opts(QoS::AtLeastOnce)));
    filters.push(("$SYS/x".into(), opts(QoS::AtLeastOnce)));
    sub.send(&Packet::Subscribe(Subscribe {
        packet_id: 9,
        properties: Properties::default(),
        filters,
    }));
    let Packet::SubAck(ack) = sub.recv() else {
        panic!("expected SUBACK")
    };
    assert_eq!(ack.codes.len(), 5_002);
    assert!(
        ack.codes[..5_001].iter().all(|&c| c == 1),
        "the last copy's QoS 1"
    );
    assert_eq!(ack.codes[5_001], 0x87);
    let mut topics: Vec<_> = (0..3)
        .map(|_| sub.recv_publish().topic.to_string())
        .collect();
    topics.sort();
    assert_eq!(topics, ["r/1", "r/2", "r/3"]);
    sub.expect_nothing(Duration::from_millis(300));
    // MQTT-3.8.4-5, as a sequence: the first copy (Retain Handling 0) is sent the
    // retained values, whatever the last (2) asks.
    let mut seq = Raw::connected(broker.addr, V5, "sequence");
    let never = SubscriptionOptions {
        retain_handling: RetainHandling::Never,
        ..opts(QoS::AtLeastOnce)
    };
    seq.send(&Packet::Subscribe(Subscribe {
        packet_id: 3,
        properties: Properties::default(),
        filters: vec![
            ("r/#".into(), opts(QoS::AtLeastOnce)),
            ("r/#".into(), never),
        ],
    }));
    assert!(matches!(seq.recv(), Packet::SubAck(a) if a.codes == [1, 1]));
    for _ in 0..3 {
        assert!(seq.recv_publish().retain);
    }
    seq.expect_nothing(Duration::from_millis(300));
}
