//! PUBLISH over broadcast topics: acknowledgements, refusals (RFC 0002 "Publishing"),
//! topic aliases, exactly-once, and malformed input (RFC 0002 "A DISCONNECT from the
//! broker").

mod common;

use std::time::Duration;

use common::{Broker, Raw, opts, publish};
use saguin::codec::{
    Ack, Packet,
    ProtocolVersion::{V5, V311},
    QoS,
};

/// C-209: no subscribers is still 0x00, never 0x10.
/// A-162, A-164: success is 0x00, never 0x10.
#[test]
fn a_broadcast_nobody_hears_is_acknowledged_0x00_not_0x10() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "lonely");
    assert_eq!(
        raw.publish("nobody/listens", b"x", QoS::AtLeastOnce, false),
        Some(0x00)
    );
    assert_eq!(
        raw.publish("nobody/listens", b"x", QoS::ExactlyOnce, false),
        Some(0x00)
    );
}

/// A-140: the SUBACK grants the QoS asked.
#[test]
fn qos_0_1_2_are_delivered_at_the_lower_of_publish_and_subscription_qos() {
    let broker = Broker::start("");
    for protocol in [V5, V311] {
        let mut sub = Raw::connected(broker.addr, protocol, "sub");
        assert_eq!(sub.subscribe("t/#", opts(QoS::ExactlyOnce)), [2]);
        let mut sub1 = Raw::connected(broker.addr, protocol, "sub1");
        assert_eq!(sub1.subscribe("t/+", opts(QoS::AtLeastOnce)), [1]);
        let mut publisher = Raw::connected(broker.addr, protocol, "pub");
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
            publisher.publish("t/x", format!("{qos:?}").as_bytes(), qos, false);
            let got = sub.recv_publish();
            assert_eq!(
                (got.qos, &*got.topic, &*got.payload),
                (qos, "t/x", format!("{qos:?}").as_bytes())
            );
            let got = sub1.recv_publish();
            assert_eq!(got.qos, qos.min(QoS::AtLeastOnce));
        }
    }
}

/// A-172, A-173, A-174, A-175, A-198, A-199: reserved and oversized topics refused.
#[test]
fn reserved_spaces_are_refused_with_their_codes() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "p");
    assert_eq!(
        raw.publish("$share/g/t", b"x", QoS::AtLeastOnce, false),
        Some(0x90)
    );
    assert_eq!(
        raw.publish("$saguin/anything", b"x", QoS::AtLeastOnce, false),
        Some(0x90)
    );
    assert_eq!(
        raw.publish("$SYS/broker/x", b"x", QoS::AtLeastOnce, false),
        Some(0x87)
    );
    let deep = vec!["l"; 201].join("/");
    assert_eq!(
        raw.publish(&deep, b"x", QoS::AtLeastOnce, false),
        Some(0x90)
    );
    let long = "a".repeat(1025);
    assert_eq!(
        raw.publish(&long, b"x", QoS::AtLeastOnce, false),
        Some(0x90)
    );
    // Still connected: a refusal is an answer, not an ending.
    assert_eq!(raw.publish("ok", b"x", QoS::AtLeastOnce, false), Some(0x00));
}

/// A-176: only the lower-case `$share/` is refused; `$SHARE/x` and other spellings
/// are ordinary topics, accepted 0x00 (3.1.1: acknowledged, not closed).
#[test]
fn a_publish_to_a_non_lower_case_share_spelling_is_accepted_a176() {
    let broker = Broker::start("");
    for protocol in [V5, V311] {
        let mut raw = Raw::connected(broker.addr, protocol, "shouty");
        for topic in ["$SHARE/x", "$Share/g/t", "$sHaRe/g/t", "$SHARE"] {
            assert_eq!(
                raw.publish(topic, b"x", QoS::AtLeastOnce, false),
                Some(0),
                "{protocol:?} {topic}"
            );
        }
        if protocol == V5 {
            assert_eq!(
                raw.publish("$share/g/t", b"x", QoS::AtLeastOnce, false),
                Some(0x90),
                "the lower-case spelling stays refused"
            );
        }
    }
}

/// A-182: a refused QoS 1 publish from 3.1.1 is closed, never acknowledged.
#[test]
fn a_3_1_1_refusal_closes_the_connection_instead_of_acknowledging() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V311, "p311");
    raw.send(&Packet::Publish(publish(
        "$SYS/x",
        b"x",
        QoS::AtLeastOnce,
        false,
    )));
    raw.expect_closed_silently();
}

#[test]
fn a_refused_qos0_publish_is_dropped_without_closing_on_3_1_1_as_on_5_a183() {
    let broker = Broker::start("");
    for protocol in [V311, V5] {
        let mut raw = Raw::connected(broker.addr, protocol, "quiet-refusal");
        raw.send(&Packet::Publish(publish(
            "$SYS/x",
            b"x",
            QoS::AtMostOnce,
            false,
        )));
        raw.send(&Packet::PingReq);
        assert!(
            matches!(raw.recv(), Packet::PingResp),
            "{protocol:?} still connected"
        );
    }
}

#[test]
fn saguin_properties_a_client_sets_never_reach_broadcast_subscribers_c017_c249() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "sub");
    sub.subscribe("news/#", opts(QoS::AtLeastOnce));
    let props = vec![
        ("saguin-schema".to_string(), "x".to_string()),
        ("saguin-id".into(), "mine".into()),
        ("saguin-id".into(), "second".into()),
        ("foo".into(), "bar".into()),
    ];
    let mut p = publish("news/a", b"x", QoS::AtLeastOnce, false);
    p.properties.edit().user_properties = props.clone();
    let mut publisher = Raw::connected(broker.addr, V5, "pub");
    assert_eq!(publisher.publish_packet(p), Some(0));
    let kept = |got: &saguin::codec::Publish| got.properties.user_properties.clone();
    let want = vec![
        ("saguin-id".to_string(), "mine".to_string()),
        ("foo".into(), "bar".into()),
    ];
    assert_eq!(kept(&sub.recv_publish()), want);

    let mut c = common::connect(V5, "will", true);
    c.will = Some(saguin::codec::Will {
        topic: "news/will".into(),
        payload: b"gone".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: saguin::codec::Properties::from(saguin::codec::PropertyValues {
            user_properties: props,
            ..Default::default()
        }),
    });
    let (raw, _) = Raw::handshake(broker.addr, c);
    drop(raw);
    assert_eq!(kept(&sub.recv_publish()), want);
}

/// A-181: Payload Format Indicator 1 with bad UTF-8 is 0x99.
#[test]
fn payload_format_utf8_with_bad_bytes_is_refused_0x99() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "pfi");
    let mut p = publish("t", &[0xFF, 0xFE], QoS::AtLeastOnce, false);
    p.properties.edit().payload_format_indicator = Some(1);
    assert_eq!(raw.publish_packet(p), Some(0x99));
}

/// A-258: an alias never registered is DISCONNECT 0x82.
#[test]
fn topic_aliases_register_and_resolve_and_an_unknown_one_is_a_protocol_error() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "alias-sub");
    sub.subscribe("alias/#", opts(QoS::AtMostOnce));
    let mut raw = Raw::connected(broker.addr, V5, "alias-pub");
    let mut p = publish("alias/long/topic", b"1", QoS::AtMostOnce, false);
    p.properties.edit().topic_alias = Some(3);
    raw.publish_packet(p);
    assert_eq!(&*sub.recv_publish().topic, "alias/long/topic");
    let mut p = publish("", b"2", QoS::AtMostOnce, false);
    p.properties.edit().topic_alias = Some(3);
    raw.publish_packet(p);
    let got = sub.recv_publish();
    assert_eq!(
        (&*got.topic, &*got.payload),
        ("alias/long/topic", &b"2"[..])
    );
    let mut p = publish("", b"3", QoS::AtMostOnce, false);
    p.properties.edit().topic_alias = Some(4);
    raw.publish_packet(p);
    assert_eq!(raw.expect_disconnect(), 0x82);
}

/// A-265, A-272: 16 aliases at most; 17 is DISCONNECT 0x94.
#[test]
fn a_topic_alias_above_sixteen_is_refused_0x94() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "alias17");
    let mut p = publish("t", b"x", QoS::AtMostOnce, false);
    p.properties.edit().topic_alias = Some(17);
    raw.publish_packet(p);
    assert_eq!(raw.expect_disconnect(), 0x94);
}

#[test]
fn a_wildcard_in_a_publish_topic_is_a_protocol_error() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "wild");
    // PUBLISH QoS 0, topic "a/+".
    raw.send_bytes(&[0x30, 0x06, 0x00, 0x03, b'a', b'/', b'+', 0x00]);
    assert_eq!(raw.expect_disconnect(), 0x82);
}

/// MQTT-3.1.2-24, MQTT-3.4.2-2, MQTT-3.9.2-1: nothing sent exceeds the client's
/// Maximum Packet Size. A refusal that would is sent without its Reason String; a
/// client without the bound gets the Reason String.
#[test]
fn an_acknowledgement_sheds_its_reason_string_to_fit_the_maximum_packet_size() {
    let broker = Broker::start("");
    let refusal_of = |max: Option<u32>, client: &str| {
        let mut c = common::connect(V5, client, true);
        c.properties.edit().maximum_packet_size = max;
        let (mut raw, ack) = Raw::handshake(broker.addr, c);
        assert_eq!(ack.code, 0);
        raw.send(&Packet::Publish(publish(
            "$SYS/x",
            b"x",
            QoS::AtLeastOnce,
            false,
        )));
        let Packet::PubAck(puback) = raw.recv() else {
            panic!("expected PUBACK");
        };
        raw.send(&Packet::Subscribe(saguin::codec::Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![("$SYS/#".into(), opts(QoS::AtMostOnce))],
        }));
        let Packet::SubAck(suback) = raw.recv() else {
            panic!("expected SUBACK");
        };
        (Packet::PubAck(puback), Packet::SubAck(suback))
    };
    let (puback, suback) = refusal_of(None, "unbounded");
    for packet in [&puback, &suback] {
        assert!(reason_string(packet).is_some(), "{packet:?}");
    }
    let (puback, suback) = refusal_of(Some(24), "bounded");
    for packet in [&puback, &suback] {
        assert_eq!(reason_string(packet), None, "{packet:?}");
        let mut bytes = Vec::new();
        saguin::codec::encode(packet, V5, &mut bytes);
        assert!(bytes.len() <= 24, "{} bytes: {packet:?}", bytes.len());
    }
    let Packet::PubAck(ack) = puback else {
        unreachable!()
    };
    assert_eq!(ack.code, 0x87);
}

fn reason_string(packet: &Packet) -> Option<String> {
    match packet {
        Packet::PubAck(a) => a.properties.reason_string.clone(),
        Packet::SubAck(a) => a.properties.reason_string.clone(),
        _ => None,
    }
}

/// MQTT 5 sections 4.3.2 and 4.3.3: an answer its exchange may not get - a PUBACK to
/// a QoS 2 PUBLISH, a PUBREC to a QoS 1 one, a PUBCOMP before any PUBREL - ends the
/// connection with a Protocol Error, as mosquitto ends it.
#[test]
fn an_acknowledgement_of_the_wrong_kind_is_a_protocol_error() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "answer-pub");
    type Answer = fn(Ack) -> Packet;
    let wrong: [(QoS, Answer); 3] = [
        (QoS::ExactlyOnce, Packet::PubAck),
        (QoS::AtLeastOnce, Packet::PubRec),
        (QoS::ExactlyOnce, Packet::PubComp),
    ];
    for (qos, answer) in wrong {
        let mut sub = Raw::connected(broker.addr, V5, "wrong-answer");
        sub.subscribe("answer/#", opts(qos));
        assert_eq!(publisher.publish("answer/x", b"x", qos, false), Some(0));
        let Packet::Publish(got) = sub.recv() else {
            panic!("expected PUBLISH");
        };
        let id = got.packet_id.expect("a packet identifier");
        sub.send(&answer(Ack::new(id, 0)));
        assert_eq!(
            sub.expect_disconnect(),
            0x82,
            "{qos:?} answered {:?}",
            answer(Ack::new(id, 0))
        );
    }
}

/// MQTT-3.3.4-6: a Subscription Identifier is the server's to send; one in a client's
/// PUBLISH is a Protocol Error, and nothing is delivered.
#[test]
fn a_subscription_identifier_in_a_client_publish_is_a_protocol_error() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "subid-sub");
    sub.subscribe("subid/#", opts(QoS::AtMostOnce));
    let mut raw = Raw::connected(broker.addr, V5, "subid-pub");
    // PUBLISH QoS 0 to "subid/x" with properties 0x0B 5 (Subscription Identifier).
    let mut packet = vec![0x30, 0x0D, 0x00, 0x07];
    packet.extend_from_slice(b"subid/x");
    packet.extend_from_slice(&[0x02, 0x0B, 0x05, b'!']);
    raw.send_bytes(&packet);
    assert_eq!(raw.expect_disconnect(), 0x82);
    sub.expect_nothing(Duration::from_millis(200));
}

#[test]
fn a_publish_with_both_qos_bits_is_malformed() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "qos3");
    raw.send_bytes(&[0x36, 0x06, 0x00, 0x01, b't', 0x00, 0x01, 0x00]);
    assert_eq!(raw.expect_disconnect(), 0x81);
}

#[test]
fn a_topic_that_is_not_utf8_closes_with_nothing_sent() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "utf8");
    raw.send_bytes(&[0x30, 0x05, 0x00, 0x02, 0xC3, 0x28, 0x00]);
    raw.expect_closed_silently();
}

/// A-190: refused 0x95 on the declared length alone.
#[test]
fn a_packet_over_the_maximum_packet_size_is_refused_0x95_from_its_header() {
    let broker = Broker::start(
        "  limits:\n    max_message_size: 1KiB\n    max_connect_size: 1KiB\n    session_queue_bytes: 1MiB\n",
    );
    let mut raw = Raw::connected(broker.addr, V5, "big");
    // Declares 2000 bytes and sends only the header: refused on the declaration.
    raw.send_bytes(&[0x30, 0xD0, 0x0F]);
    assert_eq!(raw.expect_disconnect(), 0x95);
}

#[test]
fn qos2_exchanges_beyond_the_receive_maximum_are_refused_0x93() {
    // A-264: with broker.qos2's own bound above the window, the window answers.
    let broker = Broker::start("  qos2:\n    max_inflight_per_client: 100\n");
    let mut raw = Raw::connected(broker.addr, V5, "flood");
    for id in 1..=32u16 {
        let mut p = publish("q2", b"x", QoS::ExactlyOnce, false);
        p.packet_id = Some(id);
        raw.send(&Packet::Publish(p));
        assert!(matches!(raw.recv(), Packet::PubRec(_)));
    }
    let mut p = publish("q2", b"x", QoS::ExactlyOnce, false);
    p.packet_id = Some(33);
    raw.send(&Packet::Publish(p));
    assert_eq!(raw.expect_disconnect(), 0x93);
}

#[test]
fn a_qos2_publish_is_delivered_once_at_its_pubrel_even_if_sent_twice() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "q2sub");
    sub.subscribe("q2/t", opts(QoS::ExactlyOnce));
    let mut raw = Raw::connected(broker.addr, V5, "q2pub");
    let p = publish("q2/t", b"once", QoS::ExactlyOnce, false);
    raw.send(&Packet::Publish(p.clone()));
    assert!(matches!(raw.recv(), Packet::PubRec(_)));
    let mut dup = p;
    dup.dup = true;
    raw.send(&Packet::Publish(dup));
    assert!(matches!(raw.recv(), Packet::PubRec(_)));
    sub.expect_nothing(Duration::from_millis(200));
    raw.send(&Packet::PubRel(Ack::new(1, 0)));
    assert!(matches!(raw.recv(), Packet::PubComp(a) if a.code == 0));
    assert_eq!(&*sub.recv_publish().payload, b"once");
    sub.expect_nothing(Duration::from_millis(200));
    raw.send(&Packet::PubRel(Ack::new(1, 0)));
    // A-184: the refusal says why.
    assert!(matches!(raw.recv(), Packet::PubComp(a)
        if a.code == 0x92 && a.properties.reason_string.is_some()));
}

/// MQTT-3.3.1-2: DUP on a QoS 0 PUBLISH is malformed (0x81), as mosquitto has it.
#[test]
fn dup_on_a_qos0_publish_is_malformed() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "dup0");
    // PUBLISH, DUP set, QoS 0: topic "t", no properties, payload "x".
    raw.send_bytes(&[0x38, 0x05, 0x00, 0x01, b't', 0x00, b'x']);
    assert_eq!(raw.expect_disconnect(), 0x81);
}

/// A-259: an AUTH packet ends the connection with DISCONNECT 0x82.
#[test]
fn an_auth_packet_is_answered_with_a_protocol_error() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "auth");
    raw.send_bytes(&[0xF0, 0x00]);
    assert_eq!(raw.expect_disconnect(), 0x82);
}

#[test]
fn garbage_and_half_packets_harm_no_other_client() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "bystander");
    sub.subscribe("still/#", opts(QoS::AtLeastOnce));
    let mut bad = Raw::connected(broker.addr, V5, "garbage");
    bad.send_bytes(&[0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]);
    assert_eq!(bad.expect_disconnect(), 0x81);
    let mut half = Raw::connected(broker.addr, V5, "half");
    half.send_bytes(&[0x32, 0x20, 0x00]);
    drop(half);
    let mut raw = Raw::connected(broker.addr, V5, "after");
    assert_eq!(
        raw.publish("still/here", b"ok", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(&*sub.recv_publish().payload, b"ok");
}

/// Large and small publishes back to back, in one write and split across writes, reach
/// a subscriber whole and in order: the reader sizes its reads by the last packet
/// (server/frame.rs) and must still find every packet's edge. C-205: in publish order.
#[test]
fn large_and_small_publishes_in_any_split_arrive_whole_and_in_order() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "edges-sub");
    assert_eq!(sub.subscribe("edges/#", opts(QoS::AtMostOnce)), [0]);
    let mut publisher = Raw::connected(broker.addr, V311, "edges-pub");
    let sizes = [20_000usize, 30_000, 10, 70_000, 5, 16_384, 16_384, 1];
    let payload = |i: usize, n: usize| -> Vec<u8> { (0..n).map(|k| (k * 7 + i) as u8).collect() };
    let mut bytes = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let p = publish(
            &format!("edges/{i}"),
            &payload(i, n),
            QoS::AtMostOnce,
            false,
        );
        saguin::codec::encode(&Packet::Publish(p), V311, &mut bytes);
    }
    // All of it in one write, then again cut at awkward places with pauses between.
    publisher.send_bytes(&bytes);
    for piece in [
        &bytes[..3],
        &bytes[3..20_010],
        &bytes[20_010..50_100],
        &bytes[50_100..],
    ] {
        std::thread::sleep(Duration::from_millis(20));
        publisher.send_bytes(piece);
    }
    for _ in 0..2 {
        for (i, &n) in sizes.iter().enumerate() {
            let p = sub.recv_publish();
            assert_eq!(&*p.topic, format!("edges/{i}"));
            assert!(*p.payload == *payload(i, n), "payload {i} of {n} bytes");
        }
    }
}

/// A subscriber that reads only after its socket is full still gets every byte, in
/// order: what the socket did not take at once is written when it can, from where
/// the last write stopped — with the small payloads copied into the connection's
/// buffer and the large ones written from the message.
#[test]
fn a_subscriber_that_reads_late_gets_every_publish_whole_and_in_order() {
    let broker = Broker::start(
        "  limits:\n    session_queue_bytes: 64MiB\n    max_message_size: 256KiB\n    write_timeout: 30s\n",
    );
    let mut late = Raw::connected(broker.addr, V5, "late");
    assert_eq!(late.subscribe("late/#", opts(QoS::AtMostOnce)), [0]);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    // Far more than the kernel holds for a socket nobody reads (a few MiB).
    const COUNT: u32 = 480;
    let payload = |i: u32| {
        let len = if i.is_multiple_of(2) { 40 * 1024 } else { 700 };
        let mut p = (0..len).map(|b| (b as u32 ^ i) as u8).collect::<Vec<u8>>();
        p[..4].copy_from_slice(&i.to_be_bytes());
        p
    };
    for i in 0..COUNT {
        assert_eq!(
            publisher.publish("late/x", &payload(i), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    for i in 0..COUNT {
        let got = late.recv_publish();
        let want = payload(i);
        assert!(
            *got.payload == *want,
            "publish {i} arrived damaged or out of order"
        );
    }
    late.expect_nothing(Duration::from_millis(200));
}

/// C-011: a publisher's Content Type and Payload Format Indicator reach every
/// subscriber unchanged, on broadcast and from a channel.
#[test]
fn content_type_and_payload_format_are_carried_on_every_delivery_c011() {
    let broker = Broker::start("channels:\n  log:\n    type: append\n    filter: log/#\n");
    let mut a = Raw::connected(broker.addr, V5, "a");
    let mut b = Raw::connected(broker.addr, V5, "b");
    for sub in [&mut a, &mut b] {
        assert_eq!(sub.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
        assert_eq!(sub.subscribe("log/#", opts(QoS::AtLeastOnce)), [1]);
    }
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    for topic in ["news/t", "log/t"] {
        let mut p = publish(topic, b"text", QoS::AtLeastOnce, false);
        p.properties.edit().content_type = Some("text/plain; charset=utf-8".into());
        p.properties.edit().payload_format_indicator = Some(1);
        assert_eq!(publisher.publish_packet(p), Some(0));
        for sub in [&mut a, &mut b] {
            let got = sub.recv_publish();
            assert_eq!(&*got.topic, topic);
            assert_eq!(
                got.properties.content_type.as_deref(),
                Some("text/plain; charset=utf-8")
            );
            assert_eq!(got.properties.payload_format_indicator, Some(1));
        }
    }
}

/// C-012, C-013: a `schema` User Property is delivered untouched like any other, and
/// payloads are opaque: a "schema" in a registry channel and records that match it in
/// no way are stored and delivered byte for byte.
#[test]
fn a_schema_property_and_any_payload_pass_through_untouched_c012_c013() {
    let broker = Broker::start(
        "channels:\n  registry:\n    type: latest\n    filter: schemas/#\n  log:\n    type: append\n    filter: log/#\n",
    );
    let mut sub = Raw::connected(broker.addr, V5, "reader");
    for filter in ["schemas/#", "log/#", "news/#"] {
        assert_eq!(sub.subscribe(filter, opts(QoS::AtLeastOnce)), [1]);
    }
    let mut publisher = Raw::connected(broker.addr, V5, "writer");
    let not_a_schema: &[u8] = b"{ this is not JSON, Avro or anything \xff\x00";
    assert_eq!(
        publisher.publish("schemas/reading/v1", not_a_schema, QoS::AtLeastOnce, false),
        Some(0)
    );
    let got = sub.recv_publish();
    assert_eq!(&*got.payload, not_a_schema);
    let props = vec![
        ("before".to_string(), "1".to_string()),
        ("schema".into(), "schemas/reading/v1".into()),
        ("schema".into(), "not even a topic +/#".into()),
        ("after".into(), "2".into()),
    ];
    let payload: &[u8] = &[0xff, 0xfe, 0x00, b'{', 0x80];
    for topic in ["log/r", "news/r"] {
        let mut p = publish(topic, payload, QoS::AtLeastOnce, false);
        p.properties.edit().user_properties = props.clone();
        assert_eq!(publisher.publish_packet(p), Some(0), "{topic}");
        let got = sub.recv_publish();
        assert_eq!(&*got.topic, topic);
        assert_eq!(&*got.payload, payload, "{topic}: the payload as published");
        let delivered: Vec<_> = got
            .properties
            .user_properties
            .iter()
            .filter(|(k, _)| !k.starts_with("saguin-"))
            .cloned()
            .collect();
        assert_eq!(delivered, props, "{topic}: in order, unaltered");
    }
}

/// A-163: a successful QoS 1 PUBACK to a 3.1.1 client is the two-byte form, no code.
#[test]
fn a_3_1_1_puback_carries_no_reason_code_a163() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V311, "p311");
    raw.send(&Packet::Publish(publish(
        "t",
        b"x",
        QoS::AtLeastOnce,
        false,
    )));
    raw.send_bytes(&[0xE0, 0x00]);
    assert_eq!(raw.read_to_close(), [0x40, 0x02, 0x00, 0x01]);
}

/// A-182: a refused QoS 2 publish from a 3.1.1 client is not acknowledged: closed.
#[test]
fn a_refused_qos2_publish_from_3_1_1_is_closed_unacknowledged_a182() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V311, "p311");
    raw.send(&Packet::Publish(publish(
        "$SYS/x",
        b"x",
        QoS::ExactlyOnce,
        false,
    )));
    raw.expect_closed_silently();
}

/// A-184: every refused PUBACK and PUBREC carries a Reason String, unless Request
/// Problem Information is 0, when the code comes alone.
#[test]
fn every_refusal_carries_a_reason_string_unless_problem_information_is_0_a184() {
    let broker = Broker::start("  limits:\n    max_header_count: 1\n");
    for (id, asked) in [("talkative", None), ("quiet", Some(0u8))] {
        let mut c = common::connect(V5, id, true);
        c.properties.edit().request_problem_information = asked;
        let (mut raw, ack) = Raw::handshake(broker.addr, c);
        assert_eq!(ack.code, 0);
        let mut refusals = vec![
            (publish("$SYS/x", b"x", QoS::AtLeastOnce, false), 0x87),
            (publish("$saguin/x", b"x", QoS::AtLeastOnce, false), 0x90),
            (publish("$SYS/x", b"x", QoS::ExactlyOnce, false), 0x87),
        ];
        let mut p = publish("t", &[0xFF], QoS::AtLeastOnce, false);
        p.properties.edit().payload_format_indicator = Some(1);
        refusals.push((p, 0x99));
        let mut p = publish("t", b"x", QoS::AtLeastOnce, false);
        p.properties.edit().user_properties =
            vec![("a".into(), "1".into()), ("b".into(), "2".into())];
        refusals.push((p, 0x97));
        for (p, code) in refusals {
            let topic = p.topic.clone();
            raw.send(&Packet::Publish(p));
            let ack = match raw.recv() {
                Packet::PubAck(ack) | Packet::PubRec(ack) => ack,
                other => panic!("expected PUBACK or PUBREC, got {other:?}"),
            };
            assert_eq!(ack.code, code, "{id} {topic}");
            let why = ack.properties.reason_string.clone();
            match asked {
                None => assert!(why.is_some_and(|w| !w.is_empty()), "{id} {topic}"),
                Some(_) => assert_eq!(why, None, "{id} {topic}"),
            }
        }
    }
}

/// A-185: a refused publish is logged whatever its QoS, QoS 0 included.
#[test]
fn a_refused_publish_is_logged_at_every_qos_a185() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "logged");
    raw.publish("$SYS/zero", b"x", QoS::AtMostOnce, false);
    broker.wait_log("\"$SYS/zero\" refused 0x87");
    raw.publish("$SYS/one", b"x", QoS::AtLeastOnce, false);
    broker.wait_log("\"$SYS/one\" refused 0x87");
    raw.publish("$saguin/two", b"x", QoS::ExactlyOnce, false);
    broker.wait_log("\"$saguin/two\" refused 0x90");
}

/// A-258: a new connection starts with no topic aliases: one registered on the previous
/// connection of the same client id and session is a protocol error.
#[test]
fn an_alias_from_a_previous_connection_is_a_protocol_error_a258() {
    let broker = Broker::start("");
    let mut c = common::connect(V5, "aliaser", false);
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut raw, _) = Raw::handshake(broker.addr, c.clone());
    let mut p = publish("alias/t", b"1", QoS::AtLeastOnce, false);
    p.properties.edit().topic_alias = Some(3);
    assert_eq!(raw.publish_packet(p), Some(0));
    raw.disconnect();
    let (mut raw, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    let mut p = publish("", b"2", QoS::AtLeastOnce, false);
    p.properties.edit().topic_alias = Some(3);
    raw.send(&Packet::Publish(p));
    assert_eq!(raw.expect_disconnect(), 0x82);
}
