//! Unit tests of the codec: one per failure class and rule, named by the behaviour they
//! pin and citing the spec rule (A-…) or MQTT conformance statement (MQTT-…) they check.

use std::sync::Arc;

use super::properties::id;
use super::*;

use DecodeError::{Malformed, Protocol, TopicNotUtf8, UnsupportedProtocol};
use ProtocolVersion::{V5, V311};

// ---- helpers -------------------------------------------------------------------------

/// A length-prefixed string or binary field.
fn s(bytes: &[u8]) -> Vec<u8> {
    let mut v = (bytes.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}

/// Concatenates parts.
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// A property block: length then the properties.
fn props(p: &[u8]) -> Vec<u8> {
    assert!(p.len() < 128);
    cat(&[&[p.len() as u8], p])
}

/// An MQTT 5 CONNECT body: flags, keep alive 60, `properties`, then `rest`.
fn connect5(flags: u8, properties: &[u8], rest: &[u8]) -> Vec<u8> {
    cat(&[&s(b"MQTT"), &[5, flags, 0, 60], &props(properties), rest])
}

/// An MQTT 3.1.1 CONNECT body: flags, keep alive 60, then `rest`.
fn connect4(flags: u8, rest: &[u8]) -> Vec<u8> {
    cat(&[&s(b"MQTT"), &[4, flags, 0, 60], rest])
}

/// The error class only: the field names may be reworded, the class may not.
fn class(e: DecodeError) -> DecodeError {
    match e {
        Malformed(_) => Malformed(""),
        Protocol(_) => Protocol(""),
        other => other,
    }
}

fn connect_err(body: &[u8]) -> (Option<ProtocolVersion>, DecodeError) {
    let e = decode_connect(0x10, body).unwrap_err();
    (e.protocol, class(e.error))
}

fn err(first_byte: u8, body: &[u8], version: ProtocolVersion) -> DecodeError {
    class(decode(first_byte, body, version).unwrap_err())
}

const M: DecodeError = Malformed("");
const P: DecodeError = Protocol("");

/// Encodes `packet`, reads its fixed header back and decodes it.
fn round_trip(packet: &Packet, version: ProtocolVersion) -> Packet {
    let mut out = Vec::new();
    encode(packet, version, &mut out);
    let h = read_fixed_header(&out).unwrap().unwrap();
    assert_eq!(h.header_len + h.remaining_length, out.len());
    let body = &out[h.header_len..];
    match packet {
        Packet::Connect(_) => {
            Packet::Connect(Box::new(decode_connect(h.first_byte, body).unwrap()))
        }
        _ => decode(h.first_byte, body, version).unwrap(),
    }
}

fn publish(topic: &str, qos: QoS, properties: Properties) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: Arc::from(topic),
        packet_id: (qos != QoS::AtMostOnce).then_some(1),
        properties,
        payload: Arc::from(&b"x"[..]),
    }
}

// ---- the reason-code table -----------------------------------------------------------

#[test]
fn malformed_is_0x81_protocol_is_0x82_and_the_rest_send_nothing() {
    assert_eq!(Malformed("x").reason_code(), Some(0x81));
    assert_eq!(Protocol("x").reason_code(), Some(0x82));
    assert_eq!(TopicNotUtf8.reason_code(), None);
    assert_eq!(UnsupportedProtocol(3).reason_code(), None);
    assert_eq!(reason::MALFORMED_PACKET, 0x81);
    assert_eq!(reason::PROTOCOL_ERROR, 0x82);
}

// ---- fixed header --------------------------------------------------------------------

#[test]
fn a_fixed_header_is_none_until_its_length_is_complete() {
    assert_eq!(read_fixed_header(&[]), Ok(None));
    assert_eq!(read_fixed_header(&[0x30]), Ok(None));
    assert_eq!(read_fixed_header(&[0x30, 0x80]), Ok(None));
    assert_eq!(read_fixed_header(&[0x30, 0xFF, 0xFF, 0xFF]), Ok(None));
    let h = read_fixed_header(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F, 9])
        .unwrap()
        .unwrap();
    assert_eq!(
        (h.first_byte, h.remaining_length, h.header_len),
        (0x30, 268_435_455, 5)
    );
    let h = read_fixed_header(&[0xC0, 0x00]).unwrap().unwrap();
    assert_eq!((h.remaining_length, h.header_len), (0, 2));
}

#[test]
fn a_remaining_length_over_four_bytes_is_malformed() {
    assert_eq!(
        class(read_fixed_header(&[0x30, 0x80, 0x80, 0x80, 0x80]).unwrap_err()),
        M
    );
}

#[test]
fn packet_type_0_is_malformed() {
    assert_eq!(class(read_fixed_header(&[0x00, 0x00]).unwrap_err()), M);
    assert_eq!(err(0x00, &[], V5), M);
}

#[test]
fn reserved_fixed_header_flags_are_malformed_a255() {
    // PUBREL, SUBSCRIBE and UNSUBSCRIBE need 0b0010 (MQTT-3.6.1-1, -3.8.1-1, -3.10.1-1).
    assert_eq!(err(0x60, &[0, 1], V5), M);
    assert_eq!(err(0x80, &cat(&[&[0, 1, 0], &s(b"a"), &[0]]), V5), M);
    assert_eq!(err(0xA0, &cat(&[&[0, 1, 0], &s(b"a")]), V5), M);
    // Every other type but PUBLISH needs 0 (MQTT-2.1.3-1).
    assert_eq!(err(0x41, &[0, 1], V5), M);
    assert_eq!(err(0xC1, &[], V311), M);
    assert_eq!(err(0xE8, &[], V5), M);
    assert_eq!(
        class(
            decode_connect(0x11, &connect5(2, &[], &s(b"c")))
                .unwrap_err()
                .error
        ),
        M
    );
}

// ---- CONNECT -------------------------------------------------------------------------

#[test]
fn a_plain_connect_decodes_on_both_versions() {
    let c = decode_connect(0x10, &connect5(0x02, &[], &s(b"client"))).unwrap();
    assert_eq!((c.protocol, c.clean_start, c.keep_alive), (V5, true, 60));
    assert_eq!(c.client_id, "client");
    let c = decode_connect(0x10, &connect4(0x00, &s(b"client"))).unwrap();
    assert_eq!((c.protocol, c.clean_start), (V311, false));
}

#[test]
fn the_empty_client_id_decodes_a237() {
    assert_eq!(
        decode_connect(0x10, &connect5(0x02, &[], &s(b"")))
            .unwrap()
            .client_id,
        ""
    );
    assert_eq!(
        decode_connect(0x10, &connect4(0x02, &s(b"")))
            .unwrap()
            .client_id,
        ""
    );
}

#[test]
fn mqtt_3_1_and_unknown_levels_are_unsupported_with_no_protocol_a226() {
    let level3 = cat(&[&s(b"MQIsdp"), &[3, 2, 0, 60], &s(b"c")]);
    assert_eq!(connect_err(&level3), (None, UnsupportedProtocol(3)));
    let level3 = cat(&[&s(b"MQTT"), &[3, 2, 0, 60], &s(b"c")]);
    assert_eq!(connect_err(&level3), (None, UnsupportedProtocol(3)));
    let level6 = cat(&[&s(b"MQTT"), &[6, 2, 0, 60], &s(b"c")]);
    assert_eq!(connect_err(&level6), (None, UnsupportedProtocol(6)));
}

#[test]
fn a_protocol_name_other_than_mqtt_is_malformed_with_no_protocol() {
    let body = cat(&[&s(b"HTTP"), &[5, 2, 0, 60], &props(&[]), &s(b"c")]);
    assert_eq!(connect_err(&body), (None, M));
    assert_eq!(connect_err(&[0, 4, b'M']), (None, M));
}

#[test]
fn a_first_packet_other_than_connect_is_a_protocol_error_with_no_protocol() {
    let e = decode_connect(0x30, &cat(&[&s(b"a"), b"x"])).unwrap_err();
    assert_eq!((e.protocol, class(e.error)), (None, P));
}

#[test]
fn the_connect_reserved_flag_is_malformed_a227() {
    assert_eq!(connect_err(&connect5(0x03, &[], &s(b"c"))), (Some(V5), M));
    assert_eq!(connect_err(&connect4(0x03, &s(b"c"))), (Some(V311), M));
}

#[test]
fn will_qos_3_is_malformed_a228() {
    let will = cat(&[&props(&[]), &s(b"w"), &s(b"p")]);
    assert_eq!(
        connect_err(&connect5(0x02 | 0x04 | 0x18, &[], &cat(&[&s(b"c"), &will]))),
        (Some(V5), M)
    );
    assert_eq!(
        connect_err(&connect4(
            0x02 | 0x04 | 0x18,
            &cat(&[&s(b"c"), &s(b"w"), &s(b"p")])
        )),
        (Some(V311), M)
    );
}

#[test]
fn will_qos_without_a_will_is_malformed_a229() {
    assert_eq!(
        connect_err(&connect5(0x02 | 0x08, &[], &s(b"c"))),
        (Some(V5), M)
    );
    assert_eq!(
        connect_err(&connect4(0x02 | 0x10, &s(b"c"))),
        (Some(V311), M)
    );
}

#[test]
fn will_retain_without_a_will_is_a_protocol_error_a231() {
    assert_eq!(
        connect_err(&connect5(0x02 | 0x20, &[], &s(b"c"))),
        (Some(V5), P)
    );
    assert_eq!(
        connect_err(&connect4(0x02 | 0x20, &s(b"c"))),
        (Some(V311), P)
    );
}

#[test]
fn a_user_name_that_is_not_utf8_is_malformed_a230() {
    let rest = cat(&[&s(b"c"), &s(&[0xC3, 0x28])]);
    assert_eq!(connect_err(&connect5(0x82, &[], &rest)), (Some(V5), M));
    assert_eq!(connect_err(&connect4(0x82, &rest)), (Some(V311), M));
}

#[test]
fn a_user_name_holding_nul_decodes_for_the_broker_to_refuse_0x86_a239() {
    let c = decode_connect(0x10, &connect5(0x82, &[], &cat(&[&s(b"c"), &s(b"a\0b")]))).unwrap();
    assert_eq!(c.username.as_deref(), Some("a\0b"));
}

#[test]
fn a_client_id_holding_nul_or_bad_utf8_is_malformed_mqtt_1_5_4() {
    assert_eq!(connect_err(&connect5(0x02, &[], &s(b"a\0"))), (Some(V5), M));
    assert_eq!(
        connect_err(&connect5(0x02, &[], &s(&[0xFF]))),
        (Some(V5), M)
    );
}

#[test]
fn a_311_password_without_a_user_name_is_a_protocol_error_mqtt_3_1_2_22() {
    let rest = cat(&[&s(b"c"), &s(b"pw")]);
    assert_eq!(connect_err(&connect4(0x42, &rest)), (Some(V311), P));
    // MQTT 5 allows it (section 3.1.2.9).
    assert_eq!(
        decode_connect(0x10, &connect5(0x42, &[], &rest))
            .unwrap()
            .password,
        Some(b"pw".to_vec())
    );
}

#[test]
fn an_authentication_method_at_connect_decodes_for_the_broker_to_refuse_0x8c_a244() {
    let p = cat(&[
        &[id::AUTHENTICATION_METHOD],
        &s(b"SCRAM-SHA-1"),
        &[id::AUTHENTICATION_DATA],
        &s(b"x"),
    ]);
    let c = decode_connect(0x10, &connect5(0x02, &p, &s(b"c"))).unwrap();
    assert_eq!(
        c.properties.authentication_method.as_deref(),
        Some("SCRAM-SHA-1")
    );
}

#[test]
fn authentication_data_without_a_method_is_a_protocol_error() {
    let p = cat(&[&[id::AUTHENTICATION_DATA], &s(b"x")]);
    assert_eq!(connect_err(&connect5(0x02, &p, &s(b"c"))), (Some(V5), P));
}

#[test]
fn an_unreadable_mqtt5_connect_is_malformed_a250() {
    // A property the CONNECT may not carry.
    assert_eq!(
        connect_err(&connect5(0x02, &[id::TOPIC_ALIAS, 0, 1], &s(b"c"))),
        (Some(V5), M)
    );
    // An identifier MQTT does not define.
    assert_eq!(
        connect_err(&connect5(0x02, &[0x7F, 0], &s(b"c"))),
        (Some(V5), M)
    );
    // A length that runs past the packet.
    assert_eq!(
        connect_err(&connect5(0x02, &[], &[0, 9, b'c'])),
        (Some(V5), M)
    );
    assert_eq!(
        connect_err(&cat(&[&s(b"MQTT"), &[5, 2, 0, 60, 9], &s(b"c")])),
        (Some(V5), M)
    );
    // Bytes left after the last field.
    assert_eq!(
        connect_err(&connect5(0x02, &[], &cat(&[&s(b"c"), &[0]]))),
        (Some(V5), M)
    );
    assert_eq!(
        connect_err(&connect4(0x02, &cat(&[&s(b"c"), &[0]]))),
        (Some(V311), M)
    );
    // A property that stops short inside its block.
    assert_eq!(
        connect_err(&connect5(
            0x02,
            &[id::SESSION_EXPIRY_INTERVAL, 0, 0],
            &s(b"c")
        )),
        (Some(V5), M)
    );
}

#[test]
fn a_connect_property_twice_or_forbidden_is_a_protocol_error_a250() {
    let twice = [
        id::SESSION_EXPIRY_INTERVAL,
        0,
        0,
        0,
        1,
        id::SESSION_EXPIRY_INTERVAL,
        0,
        0,
        0,
        2,
    ];
    assert_eq!(
        connect_err(&connect5(0x02, &twice, &s(b"c"))),
        (Some(V5), P)
    );
    for bad in [
        &[id::RECEIVE_MAXIMUM, 0, 0][..],
        &[id::MAXIMUM_PACKET_SIZE, 0, 0, 0, 0],
        &[id::REQUEST_PROBLEM_INFORMATION, 2],
        &[id::REQUEST_RESPONSE_INFORMATION, 2],
    ] {
        assert_eq!(
            connect_err(&connect5(0x02, bad, &s(b"c"))),
            (Some(V5), P),
            "{bad:?}"
        );
    }
}

#[test]
fn a_will_carries_will_properties_only() {
    let will_with = |p: &[u8]| cat(&[&s(b"c"), &props(p), &s(b"w/t"), &s(b"bye")]);
    let c = decode_connect(
        0x10,
        &connect5(
            0x06,
            &[],
            &will_with(&[id::WILL_DELAY_INTERVAL, 0, 0, 0, 5]),
        ),
    )
    .unwrap();
    let w = c.will.unwrap();
    assert_eq!(
        (
            w.topic.as_str(),
            &w.payload[..],
            w.properties.will_delay_interval
        ),
        ("w/t", &b"bye"[..], Some(5))
    );
    // Session Expiry is a CONNECT property, not a Will one.
    assert_eq!(
        connect_err(&connect5(
            0x06,
            &[],
            &will_with(&[id::SESSION_EXPIRY_INTERVAL, 0, 0, 0, 5])
        )),
        (Some(V5), M)
    );
    // Payload Format Indicator 2 is a forbidden value.
    assert_eq!(
        connect_err(&connect5(
            0x06,
            &[],
            &will_with(&[id::PAYLOAD_FORMAT_INDICATOR, 2])
        )),
        (Some(V5), P)
    );
}

#[test]
fn a_will_topic_that_is_not_utf8_closes_with_nothing_sent() {
    let rest = cat(&[&s(b"c"), &props(&[]), &s(&[0xFF]), &s(b"bye")]);
    assert_eq!(
        connect_err(&connect5(0x06, &[], &rest)),
        (Some(V5), TopicNotUtf8)
    );
}

#[test]
fn a_second_connect_decodes_as_a_packet_for_the_broker_to_refuse() {
    let body = connect5(0x02, &[], &s(b"c"));
    assert!(matches!(decode(0x10, &body, V5), Ok(Packet::Connect(_))));
    let level3 = cat(&[&s(b"MQIsdp"), &[3, 2, 0, 60], &s(b"c")]);
    assert_eq!(err(0x10, &level3, V5), P);
}

// ---- PUBLISH -------------------------------------------------------------------------

#[test]
fn a_publish_with_both_qos_bits_is_malformed_a255() {
    assert_eq!(err(0x36, &cat(&[&s(b"a"), &[0, 1], &props(&[])]), V5), M);
    assert_eq!(err(0x36, &cat(&[&s(b"a"), &[0, 1]]), V311), M);
}

#[test]
fn a_wildcard_in_a_publish_topic_is_a_protocol_error_a188() {
    for topic in [&b"a/+"[..], b"#", b"a/#"] {
        assert_eq!(err(0x30, &cat(&[&s(topic), &props(&[])]), V5), P);
        assert_eq!(err(0x30, &s(topic), V311), P);
    }
}

#[test]
fn a_publish_topic_that_is_not_utf8_closes_with_nothing_sent_a189() {
    assert_eq!(
        err(0x30, &cat(&[&s(&[b'a', 0xFF]), &props(&[])]), V5),
        TopicNotUtf8
    );
    assert_eq!(err(0x30, &s(&[0xED, 0xA0, 0x80]), V311), TopicNotUtf8); // a surrogate
}

#[test]
fn a_publish_topic_holding_nul_is_malformed_mqtt_1_5_4_2() {
    assert_eq!(err(0x30, &cat(&[&s(b"a\0"), &props(&[])]), V5), M);
}

#[test]
fn a_publish_with_qos_and_packet_id_0_is_a_protocol_error_mqtt_2_2_1_3() {
    assert_eq!(err(0x32, &cat(&[&s(b"a"), &[0, 0], &props(&[])]), V5), P);
    assert_eq!(err(0x34, &cat(&[&s(b"a"), &[0, 0]]), V311), P);
}

#[test]
fn a_publish_topic_length_past_the_packet_is_malformed_a255() {
    assert_eq!(err(0x30, &[0, 10, b'a'], V5), M);
    assert_eq!(err(0x32, &cat(&[&s(b"a"), &[0]]), V311), M);
}

#[test]
fn a_publish_property_it_may_not_carry_is_malformed_a255() {
    let p = props(&[id::SESSION_EXPIRY_INTERVAL, 0, 0, 0, 1]);
    assert_eq!(err(0x30, &cat(&[&s(b"a"), &p]), V5), M);
}

#[test]
fn a_publish_property_twice_or_forbidden_is_a_protocol_error_a257() {
    let cases: [&[u8]; 5] = [
        &[id::PAYLOAD_FORMAT_INDICATOR, 2],
        &[id::TOPIC_ALIAS, 0, 0],
        &[id::SUBSCRIPTION_IDENTIFIER, 0],
        &[
            id::MESSAGE_EXPIRY_INTERVAL,
            0,
            0,
            0,
            1,
            id::MESSAGE_EXPIRY_INTERVAL,
            0,
            0,
            0,
            1,
        ],
        &[id::TOPIC_ALIAS, 0, 1, id::TOPIC_ALIAS, 0, 1],
    ];
    for p in cases {
        assert_eq!(err(0x30, &cat(&[&s(b"a"), &props(p)]), V5), P, "{p:?}");
    }
}

#[test]
fn a_publish_may_carry_several_subscription_identifiers_and_user_properties() {
    let p = cat(&[
        &[
            id::SUBSCRIPTION_IDENTIFIER,
            1,
            id::SUBSCRIPTION_IDENTIFIER,
            0xFF,
            0x01,
        ],
        &[id::USER_PROPERTY],
        &s(b"k"),
        &s(b"v"),
        &[id::USER_PROPERTY],
        &s(b"k"),
        &s(b"w"),
    ]);
    let Ok(Packet::Publish(p)) = decode(0x30, &cat(&[&s(b"a"), &props(&p), b"pay"]), V5) else {
        panic!("not a publish")
    };
    assert_eq!(p.properties.subscription_identifiers, [1, 255]);
    assert_eq!(p.properties.user_properties.len(), 2);
    assert_eq!(&p.payload[..], b"pay");
}

#[test]
fn a_non_topic_string_that_is_not_utf8_is_malformed() {
    let p = cat(&[&[id::CONTENT_TYPE], &s(&[0xFF])]);
    assert_eq!(err(0x30, &cat(&[&s(b"a"), &props(&p)]), V5), M);
}

#[test]
fn an_empty_topic_needs_a_topic_alias() {
    assert_eq!(err(0x30, &cat(&[&s(b""), &props(&[])]), V5), P);
    assert_eq!(err(0x30, &s(b""), V311), P);
    let aliased = decode(0x30, &cat(&[&s(b""), &props(&[id::TOPIC_ALIAS, 0, 3])]), V5);
    assert!(matches!(aliased, Ok(Packet::Publish(p)) if p.properties.topic_alias == Some(3)));
}

// ---- acknowledgements, DISCONNECT, AUTH ------------------------------------------------

#[test]
fn mqtt5_acks_of_remaining_length_2_mean_success_with_no_properties() {
    for first in [0x40, 0x50, 0x62, 0x70] {
        let p = decode(first, &[0, 9], V5).unwrap();
        let (Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a)) = p
        else {
            panic!("not an ack")
        };
        assert_eq!(a, Ack::new(9, 0));
    }
    assert_eq!(
        decode(0x40, &[0, 9, 0x10], V5).unwrap(),
        Packet::PubAck(Ack::new(9, 0x10))
    );
}

#[test]
fn the_encoder_writes_the_short_forms() {
    let mut out = Vec::new();
    encode(&Packet::PubAck(Ack::new(1, 0)), V5, &mut out);
    assert_eq!(out, [0x40, 2, 0, 1]);
    out.clear();
    encode(&Packet::PubRel(Ack::new(1, 0x92)), V5, &mut out);
    assert_eq!(out, [0x62, 3, 0, 1, 0x92]);
    out.clear();
    encode(&Packet::Disconnect(Disconnect::new(0)), V5, &mut out);
    assert_eq!(out, [0xE0, 0]);
    out.clear();
    encode(&Packet::Disconnect(Disconnect::new(0x8B)), V5, &mut out);
    assert_eq!(out, [0xE0, 1, 0x8B]);
    out.clear();
    encode(&Packet::Disconnect(Disconnect::new(0x8B)), V311, &mut out);
    assert_eq!(out, [0xE0, 0]);
    out.clear();
    encode(&Packet::PubAck(Ack::new(1, 0x10)), V311, &mut out);
    assert_eq!(out, [0x40, 2, 0, 1]);
}

#[test]
fn mqtt5_disconnect_of_remaining_length_0_is_normal() {
    assert_eq!(
        decode(0xE0, &[], V5).unwrap(),
        Packet::Disconnect(Disconnect::new(0))
    );
    assert_eq!(
        decode(0xE0, &[0x04], V5).unwrap(),
        Packet::Disconnect(Disconnect::new(4))
    );
}

#[test]
fn mqtt311_packets_have_no_codes_or_properties() {
    assert_eq!(err(0x40, &[0, 1, 0], V311), M);
    assert_eq!(err(0xE0, &[0], V311), M);
    assert_eq!(err(0xC0, &[0], V311), M);
    assert_eq!(err(0xB0, &[0, 1, 0], V311), M);
    assert_eq!(
        decode(0xB0, &[0, 1], V311).unwrap(),
        Packet::UnsubAck(UnsubAck {
            packet_id: 1,
            properties: Properties::default(),
            codes: vec![]
        })
    );
}

#[test]
fn an_ack_property_it_may_not_carry_is_malformed() {
    assert_eq!(
        err(
            0x40,
            &cat(&[&[0, 1, 0], &props(&[id::TOPIC_ALIAS, 0, 1])]),
            V5
        ),
        M
    );
    assert_eq!(
        err(0xE0, &cat(&[&[0], &props(&[id::TOPIC_ALIAS, 0, 1])]), V5),
        M
    );
}

#[test]
fn an_auth_packet_decodes_on_mqtt5_for_the_broker_to_answer_a259() {
    assert_eq!(
        decode(0xF0, &[], V5).unwrap(),
        Packet::Auth(Auth {
            code: 0,
            properties: Properties::default()
        })
    );
    let p = cat(&[
        &[0x18],
        &props(&cat(&[&[id::AUTHENTICATION_METHOD], &s(b"m")])),
    ]);
    assert!(matches!(decode(0xF0, &p, V5), Ok(Packet::Auth(a)) if a.code == 0x18));
    // MQTT 3.1.1 reserves packet type 15.
    assert_eq!(err(0xF0, &[], V311), M);
}

#[test]
fn a_311_suback_carries_only_0_1_2_or_0x80() {
    assert_eq!(
        decode(0x90, &[0, 1, 0, 1, 2, 0x80], V311).unwrap(),
        Packet::SubAck(SubAck {
            packet_id: 1,
            properties: Properties::default(),
            codes: vec![0, 1, 2, 0x80]
        })
    );
    assert_eq!(err(0x90, &[0, 1, 0x87], V311), M);
}

#[test]
fn a_connack_with_reserved_flags_is_malformed() {
    assert_eq!(err(0x20, &[2, 0], V311), M);
    assert_eq!(err(0x20, &[0x80, 0, 0], V5), M);
}

// ---- SUBSCRIBE and UNSUBSCRIBE ---------------------------------------------------------

fn subscribe5(options: u8) -> Vec<u8> {
    cat(&[&[0, 1], &props(&[]), &s(b"a/+"), &[options]])
}

#[test]
fn retain_handling_3_is_a_protocol_error_a256() {
    assert_eq!(err(0x82, &subscribe5(0x30), V5), P);
}

#[test]
fn subscription_qos_3_is_a_protocol_error_on_mqtt5_and_malformed_on_311() {
    assert_eq!(err(0x82, &subscribe5(0x03), V5), P);
    assert_eq!(err(0x82, &cat(&[&[0, 1], &s(b"a"), &[3]]), V311), M);
}

#[test]
fn reserved_subscription_option_bits_are_malformed_mqtt_3_8_3_5() {
    assert_eq!(err(0x82, &subscribe5(0x40), V5), M);
    assert_eq!(err(0x82, &subscribe5(0x80), V5), M);
    assert_eq!(err(0x82, &cat(&[&[0, 1], &s(b"a"), &[0x04]]), V311), M);
}

#[test]
fn mqtt5_subscription_options_decode() {
    let Ok(Packet::Subscribe(sub)) = decode(0x82, &subscribe5(0x2E), V5) else {
        panic!()
    };
    let o = sub.filters[0].1;
    assert_eq!(
        (o.qos, o.no_local, o.retain_as_published, o.retain_handling),
        (QoS::ExactlyOnce, true, true, RetainHandling::Never)
    );
}

#[test]
fn a_subscribe_with_no_filters_is_a_protocol_error_a157() {
    assert_eq!(err(0x82, &cat(&[&[0, 1], &props(&[])]), V5), P);
    assert_eq!(err(0x82, &[0, 1], V311), P);
    assert_eq!(err(0xA2, &cat(&[&[0, 1], &props(&[])]), V5), P);
    assert_eq!(err(0xA2, &[0, 1], V311), P);
}

#[test]
fn a_zero_length_topic_filter_is_a_protocol_error() {
    assert_eq!(
        err(0x82, &cat(&[&[0, 1], &props(&[]), &s(b""), &[0]]), V5),
        P
    );
    assert_eq!(err(0xA2, &cat(&[&[0, 1], &s(b"")]), V311), P);
}

#[test]
fn a_topic_filter_that_is_not_utf8_closes_with_nothing_sent() {
    assert_eq!(
        err(0x82, &cat(&[&[0, 1], &props(&[]), &s(&[0xFF]), &[0]]), V5),
        TopicNotUtf8
    );
    assert_eq!(
        err(0xA2, &cat(&[&[0, 1], &s(&[0xC0, 0x80])]), V311),
        TopicNotUtf8
    );
}

#[test]
fn a_filter_without_its_options_byte_is_malformed() {
    assert_eq!(err(0x82, &cat(&[&[0, 1], &props(&[]), &s(b"a")]), V5), M);
}

#[test]
fn a_subscribe_carries_one_subscription_identifier() {
    let two = [
        id::SUBSCRIPTION_IDENTIFIER,
        1,
        id::SUBSCRIPTION_IDENTIFIER,
        2,
    ];
    assert_eq!(
        err(0x82, &cat(&[&[0, 1], &props(&two), &s(b"a"), &[0]]), V5),
        P
    );
    let one = decode(
        0x82,
        &cat(&[&[0, 1], &props(&two[..2]), &s(b"a"), &[0]]),
        V5,
    );
    assert!(
        matches!(one, Ok(Packet::Subscribe(s)) if s.properties.subscription_identifiers == [1])
    );
}

#[test]
fn a_subscribe_with_packet_id_0_is_a_protocol_error_mqtt_2_2_1_3() {
    assert_eq!(
        err(0x82, &cat(&[&[0, 0], &props(&[]), &s(b"a"), &[0]]), V5),
        P
    );
}

// ---- encoder -------------------------------------------------------------------------

#[test]
fn a_311_connect_encodes_byte_exact() {
    let c = Connect {
        protocol: V311,
        clean_start: true,
        keep_alive: 60,
        client_id: "c".into(),
        will: None,
        username: Some("u".into()),
        password: Some(b"p".to_vec()),
        properties: Properties::default(),
    };
    let mut out = Vec::new();
    encode(&Packet::Connect(Box::new(c)), V311, &mut out);
    assert_eq!(
        out,
        cat(&[
            &[0x10, 19],
            &s(b"MQTT"),
            &[4, 0xC2, 0, 60],
            &s(b"c"),
            &s(b"u"),
            &s(b"p")
        ])
    );
}

#[test]
fn the_encoder_leaves_out_properties_the_packet_may_not_carry() {
    let properties = Properties::from(PropertyValues {
        topic_alias: Some(1),
        reason_string: Some("r".into()),
        ..PropertyValues::default()
    });
    let mut out = Vec::new();
    encode(
        &Packet::PubAck(Ack {
            packet_id: 1,
            code: 0x10,
            properties,
        }),
        V5,
        &mut out,
    );
    assert_eq!(
        out,
        cat(&[&[0x40, 8, 0, 1, 0x10, 4, id::REASON_STRING], &s(b"r")])
    );
}

#[test]
fn the_encoder_writes_nothing_for_auth_on_311() {
    let mut out = vec![1];
    encode(
        &Packet::Auth(Auth {
            code: 0,
            properties: Properties::default(),
        }),
        V311,
        &mut out,
    );
    assert_eq!(out, [1]);
}

#[test]
fn an_overlong_string_is_cut_at_a_character_boundary() {
    let topic = "é".repeat(40_000); // 80,000 bytes
    let mut out = Vec::new();
    encode(
        &Packet::Publish(publish(&topic, QoS::AtMostOnce, Properties::default())),
        V311,
        &mut out,
    );
    let h = read_fixed_header(&out).unwrap().unwrap();
    let Ok(Packet::Publish(p)) = decode(h.first_byte, &out[h.header_len..], V311) else {
        panic!()
    };
    assert_eq!(p.topic.len(), 65_534);
}

#[test]
fn a_publish_with_properties_round_trips() {
    let properties = Properties::from(PropertyValues {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(30),
        content_type: Some("text/plain".into()),
        response_topic: Some("r".into()),
        correlation_data: Some(vec![1, 2]),
        subscription_identifiers: vec![5, 268_435_455],
        topic_alias: Some(2),
        user_properties: vec![("a".into(), "b".into())],
        ..PropertyValues::default()
    });
    let p = Packet::Publish(publish("t", QoS::ExactlyOnce, properties));
    assert_eq!(round_trip(&p, V5), p);
}

// ---- the fuzzer's seed streams ---------------------------------------------------------

/// Decodes a stream of packets the way a connection does; the first must be a CONNECT.
fn decode_stream(mut bytes: &[u8], version: ProtocolVersion) -> Vec<Packet> {
    let mut packets = Vec::new();
    while !bytes.is_empty() {
        let h = read_fixed_header(bytes).unwrap().unwrap();
        let body = &bytes[h.header_len..h.header_len + h.remaining_length];
        packets.push(if packets.is_empty() {
            Packet::Connect(Box::new(decode_connect(h.first_byte, body).unwrap()))
        } else {
            decode(h.first_byte, body, version)
                .unwrap_or_else(|e| panic!("{:02x}: {e}", h.first_byte))
        });
        bytes = &bytes[h.header_len + h.remaining_length..];
    }
    packets
}

#[test]
fn the_fuzz_seed_streams_decode_whole() {
    let client5 = decode_stream(include_bytes!("../../fuzz/seeds/codec/mqtt5-client"), V5);
    assert_eq!(client5.len(), 7);
    let Packet::Connect(c) = &client5[0] else {
        panic!()
    };
    let will = c.will.as_ref().unwrap();
    assert_eq!(
        (will.qos, will.retain, will.properties.will_delay_interval),
        (QoS::AtLeastOnce, true, Some(5))
    );
    assert_eq!(
        decode_stream(include_bytes!("../../fuzz/seeds/codec/mqtt5-server"), V5).len(),
        10
    );
    assert_eq!(
        decode_stream(include_bytes!("../../fuzz/seeds/codec/mqtt311"), V311).len(),
        13
    );
    let e =
        decode_connect(0x10, &include_bytes!("../../fuzz/seeds/codec/mqtt31")[2..]).unwrap_err();
    assert_eq!((e.protocol, e.error), (None, UnsupportedProtocol(3)));
}

#[test]
fn a_packet_without_properties_is_small_to_move() {
    // Every packet is moved a few times between the socket and its handler, and a
    // routed message is held once per publish: properties are a pointer, null when none.
    assert_eq!(size_of::<Properties>(), size_of::<usize>());
    assert!(size_of::<Packet>() <= 64, "{}", size_of::<Packet>());
    let mut none = Properties::default();
    assert!(
        none.present_mut().is_none(),
        "taking away allocates nothing"
    );
    let mut emptied = Properties::from(PropertyValues {
        reason_string: Some("x".into()),
        ..PropertyValues::default()
    });
    emptied.edit().reason_string = None;
    assert_eq!(emptied, none, "no property at all, however it came to be");
    emptied.shed_if_empty();
    assert!(
        emptied.present_mut().is_none(),
        "an emptied set of values is freed"
    );
    assert_eq!(
        Properties::from(PropertyValues::default()).present_mut(),
        None,
        "made from no values, nothing is allocated"
    );
    let (mut short, mut emptied_out) = (Vec::new(), Vec::new());
    encode(&Packet::PubAck(Ack::new(7, 0x10)), V5, &mut short);
    let ack = Ack {
        properties: emptied,
        ..Ack::new(7, 0x10)
    };
    encode(&Packet::PubAck(ack), V5, &mut emptied_out);
    assert_eq!(emptied_out, short, "an emptied set is sent as none");
}

#[test]
fn an_acknowledgement_over_the_maximum_packet_size_sheds_its_reason_string_and_user_properties() {
    // MQTT-3.1.2-24, MQTT-3.4.2-2, MQTT-3.4.2-3.
    let ack = Packet::PubAck(Ack {
        properties: Properties::from(PropertyValues {
            reason_string: Some("a long explanation of the refusal".into()),
            user_properties: vec![("k".into(), "v".into())],
            ..PropertyValues::default()
        }),
        ..Ack::new(7, 0x87)
    });
    let mut whole = Vec::new();
    encode(&ack, V5, &mut whole);
    let mut within = Vec::new();
    encode_within(&ack, V5, whole.len(), &mut within);
    assert_eq!(within, whole, "what fits goes whole");
    let mut shed = vec![0xAA];
    encode_within(&ack, V5, whole.len() - 1, &mut shed);
    let mut bare = vec![0xAA];
    encode(&Packet::PubAck(Ack::new(7, 0x87)), V5, &mut bare);
    assert_eq!(
        shed, bare,
        "appended after what was there, with neither property"
    );
    // What is left is required: it goes even over a bound too small for it.
    let mut tiny = Vec::new();
    encode_within(&Packet::PubAck(Ack::new(7, 0x87)), V5, 2, &mut tiny);
    assert_eq!(tiny, [0x40, 0x03, 0x00, 0x07, 0x87]);
}

#[test]
fn a_311_user_name_cut_short_is_closed_with_nothing_written_a252() {
    // The flag says a user name follows; the body ends inside its length.
    let e = decode_connect(0x10, &cat(&[&connect4(0x82, &s(b"c")), &[0]])).unwrap_err();
    assert_eq!(e.error.v311_connect_code(), None);
    // Bytes that are not UTF-8 are the user name's own fault: 0x04 (A-230).
    let rest = cat(&[&s(b"c"), &s(&[0xC3, 0x28])]);
    let e = decode_connect(0x10, &connect4(0x82, &rest)).unwrap_err();
    assert_eq!(e.error.v311_connect_code(), Some(0x04));
}

#[test]
fn dup_on_a_qos0_publish_is_malformed_and_never_written_mqtt_3_3_1_2() {
    assert_eq!(err(0x38, &cat(&[&s(b"a"), &props(&[])]), V5), M);
    assert_eq!(err(0x38, &s(b"a"), V311), M);
    let publish = Publish {
        dup: true,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: Arc::from("a"),
        packet_id: None,
        properties: Properties::default(),
        payload: Arc::from(&b"x"[..]),
    };
    let mut out = Vec::new();
    encode(&Packet::Publish(publish), V5, &mut out);
    assert_eq!(out[0], 0x30);
}

#[test]
fn a_response_topic_empty_or_with_a_wildcard_is_a_protocol_error_mqtt_3_3_2_14() {
    for topic in [&b""[..], b"r/#", b"r/+/x"] {
        let mut p = vec![id::RESPONSE_TOPIC];
        p.extend_from_slice(&s(topic));
        assert_eq!(err(0x30, &cat(&[&s(b"a"), &props(&p)]), V5), P);
    }
    let mut p = vec![id::RESPONSE_TOPIC];
    p.extend_from_slice(&s(b"r/me"));
    assert!(decode(0x30, &cat(&[&s(b"a"), &props(&p)]), V5).is_ok());
}
