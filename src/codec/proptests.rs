//! Property-based tests: any valid packet of either version survives
//! encode → read_fixed_header → decode unchanged, and no bytes at all make the decoder
//! panic.

use std::sync::Arc;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use super::properties::{Allowed, id};
use super::*;

use ProtocolVersion::{V5, V311};

/// A UTF-8 string MQTT admits: no U+0000, any other character.
fn string() -> impl Strategy<Value = String> {
    vec(
        any::<char>().prop_filter("no U+0000", |c| *c != '\0'),
        0..12,
    )
    .prop_map(String::from_iter)
}

/// A topic name: non-empty, no wildcard.
fn topic_name() -> impl Strategy<Value = String> {
    vec(
        any::<char>().prop_filter("no NUL or wildcard", |c| !matches!(c, '\0' | '+' | '#')),
        1..12,
    )
    .prop_map(String::from_iter)
}

/// A topic filter: non-empty; its shape is the broker's to judge, not the codec's.
fn topic_filter() -> impl Strategy<Value = String> {
    vec(
        any::<char>().prop_filter("no U+0000", |c| *c != '\0'),
        1..12,
    )
    .prop_map(String::from_iter)
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..24)
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

fn flag() -> impl Strategy<Value = Option<u8>> {
    option::of(0u8..=1)
}

fn nonzero_u16() -> impl Strategy<Value = Option<u16>> {
    option::of(1u16..)
}

/// Every property, each with a value its definition allows.
fn any_properties() -> impl Strategy<Value = Properties> {
    let a = (
        flag(),
        option::of(any::<u32>()),
        option::of(string()),
        option::of(topic_name()), // a Response Topic is a topic name (MQTT-3.3.2-14)
        option::of(bytes()),
        vec(1u32..=268_435_455, 0..3),
        option::of(any::<u32>()),
        option::of(string()),
        option::of(any::<u16>()),
        option::of(string()),
    );
    let b = (
        option::of(bytes()),
        flag(),
        option::of(any::<u32>()),
        flag(),
        option::of(string()),
        option::of(string()),
        option::of(string()),
        nonzero_u16(),
        option::of(any::<u16>()),
        nonzero_u16(),
    );
    let c = (
        flag(),
        flag(),
        vec((string(), string()), 0..3),
        option::of(1u32..),
        flag(),
        flag(),
        flag(),
    );
    (a, b, c).prop_map(|(a, b, c)| {
        Properties::from(PropertyValues {
            payload_format_indicator: a.0,
            message_expiry_interval: a.1,
            content_type: a.2,
            response_topic: a.3,
            correlation_data: a.4,
            subscription_identifiers: a.5,
            session_expiry_interval: a.6,
            assigned_client_identifier: a.7,
            server_keep_alive: a.8,
            authentication_method: a.9,
            authentication_data: b.0,
            request_problem_information: b.1,
            will_delay_interval: b.2,
            request_response_information: b.3,
            response_information: b.4,
            server_reference: b.5,
            reason_string: b.6,
            receive_maximum: b.7,
            topic_alias_maximum: b.8,
            topic_alias: b.9,
            maximum_qos: c.0,
            retain_available: c.1,
            user_properties: c.2,
            maximum_packet_size: c.3,
            wildcard_subscription_available: c.4,
            subscription_identifier_available: c.5,
            shared_subscription_available: c.6,
        })
    })
}

/// Clears what `allowed` does not admit, as a valid packet of that kind would hold.
fn only(mut p: Properties, allowed: Allowed) -> Properties {
    fn keep<T>(slot: &mut Option<T>, allowed: Allowed, pid: u8) {
        if !allowed.permits(pid) {
            *slot = None;
        }
    }
    let Some(v) = p.present_mut() else {
        return p;
    };
    keep(
        &mut v.payload_format_indicator,
        allowed,
        id::PAYLOAD_FORMAT_INDICATOR,
    );
    keep(
        &mut v.message_expiry_interval,
        allowed,
        id::MESSAGE_EXPIRY_INTERVAL,
    );
    keep(&mut v.content_type, allowed, id::CONTENT_TYPE);
    keep(&mut v.response_topic, allowed, id::RESPONSE_TOPIC);
    keep(&mut v.correlation_data, allowed, id::CORRELATION_DATA);
    if !allowed.permits(id::SUBSCRIPTION_IDENTIFIER) {
        v.subscription_identifiers.clear();
    } else if allowed != Allowed::PUBLISH {
        v.subscription_identifiers.truncate(1);
    }
    keep(
        &mut v.session_expiry_interval,
        allowed,
        id::SESSION_EXPIRY_INTERVAL,
    );
    keep(
        &mut v.assigned_client_identifier,
        allowed,
        id::ASSIGNED_CLIENT_IDENTIFIER,
    );
    keep(&mut v.server_keep_alive, allowed, id::SERVER_KEEP_ALIVE);
    keep(
        &mut v.authentication_method,
        allowed,
        id::AUTHENTICATION_METHOD,
    );
    keep(&mut v.authentication_data, allowed, id::AUTHENTICATION_DATA);
    keep(
        &mut v.request_problem_information,
        allowed,
        id::REQUEST_PROBLEM_INFORMATION,
    );
    keep(&mut v.will_delay_interval, allowed, id::WILL_DELAY_INTERVAL);
    keep(
        &mut v.request_response_information,
        allowed,
        id::REQUEST_RESPONSE_INFORMATION,
    );
    keep(
        &mut v.response_information,
        allowed,
        id::RESPONSE_INFORMATION,
    );
    keep(&mut v.server_reference, allowed, id::SERVER_REFERENCE);
    keep(&mut v.reason_string, allowed, id::REASON_STRING);
    keep(&mut v.receive_maximum, allowed, id::RECEIVE_MAXIMUM);
    keep(&mut v.topic_alias_maximum, allowed, id::TOPIC_ALIAS_MAXIMUM);
    keep(&mut v.topic_alias, allowed, id::TOPIC_ALIAS);
    keep(&mut v.maximum_qos, allowed, id::MAXIMUM_QOS);
    keep(&mut v.retain_available, allowed, id::RETAIN_AVAILABLE);
    keep(&mut v.maximum_packet_size, allowed, id::MAXIMUM_PACKET_SIZE);
    keep(
        &mut v.wildcard_subscription_available,
        allowed,
        id::WILDCARD_SUBSCRIPTION_AVAILABLE,
    );
    keep(
        &mut v.subscription_identifier_available,
        allowed,
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    );
    keep(
        &mut v.shared_subscription_available,
        allowed,
        id::SHARED_SUBSCRIPTION_AVAILABLE,
    );
    p.shed_if_empty();
    p
}

/// Properties a packet of kind `allowed` may carry on `version` (none on 3.1.1).
fn properties(version: ProtocolVersion, allowed: Allowed) -> BoxedStrategy<Properties> {
    match version {
        V311 => Just(Properties::default()).boxed(),
        V5 => any_properties().prop_map(move |p| only(p, allowed)).boxed(),
    }
}

/// A reason code: any byte on MQTT 5, always 0 on 3.1.1 where there is none.
fn code(version: ProtocolVersion) -> BoxedStrategy<u8> {
    match version {
        V311 => Just(0).boxed(),
        V5 => any::<u8>().boxed(),
    }
}

fn will(version: ProtocolVersion) -> impl Strategy<Value = Will> {
    (
        topic_name(),
        bytes(),
        qos(),
        any::<bool>(),
        properties(version, Allowed::WILL),
    )
        .prop_map(|(topic, payload, qos, retain, properties)| Will {
            topic,
            payload,
            qos,
            retain,
            properties,
        })
}

fn connect(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let fields = (
        any::<bool>(),
        any::<u16>(),
        string(),
        option::of(will(version)),
        option::of(string()),
        option::of(bytes()),
        properties(version, Allowed::CONNECT),
    );
    fields.prop_map(
        move |(clean_start, keep_alive, client_id, will, username, password, mut properties)| {
            // Authentication Data needs a method, and a 3.1.1 password needs a user name.
            if properties.authentication_data.is_some()
                && properties.authentication_method.is_none()
            {
                properties.edit().authentication_method = Some("m".into());
            }
            let username = if version == V311 && password.is_some() {
                username.or(Some("u".into()))
            } else {
                username
            };
            Packet::Connect(Box::new(Connect {
                protocol: version,
                clean_start,
                keep_alive,
                client_id,
                will,
                username,
                password,
                properties,
            }))
        },
    )
}

fn publish(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let fields = (
        any::<bool>(),
        qos(),
        any::<bool>(),
        topic_name(),
        1u16..,
        properties(version, Allowed::PUBLISH),
        vec(any::<u8>(), 0..64),
    );
    fields.prop_map(|(dup, qos, retain, topic, id, properties, payload)| {
        Packet::Publish(Publish {
            dup: dup && qos != QoS::AtMostOnce, // MQTT-3.3.1-2
            qos,
            retain,
            topic: Arc::from(topic),
            packet_id: (qos != QoS::AtMostOnce).then_some(id),
            properties,
            payload: Arc::from(payload),
        })
    })
}

fn ack(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    (
        0u8..4,
        any::<u16>(),
        code(version),
        properties(version, Allowed::ACK),
    )
        .prop_map(|(kind, packet_id, code, properties)| {
            let a = Ack {
                packet_id,
                code,
                properties,
            };
            match kind {
                0 => Packet::PubAck(a),
                1 => Packet::PubRec(a),
                2 => Packet::PubRel(a),
                _ => Packet::PubComp(a),
            }
        })
}

fn options(version: ProtocolVersion) -> BoxedStrategy<SubscriptionOptions> {
    match version {
        V311 => qos().prop_map(SubscriptionOptions::with_qos).boxed(),
        V5 => {
            let rh = prop_oneof![
                Just(RetainHandling::OnSubscribe),
                Just(RetainHandling::OnNewSubscribe),
                Just(RetainHandling::Never)
            ];
            (qos(), any::<bool>(), any::<bool>(), rh)
                .prop_map(|(qos, no_local, retain_as_published, retain_handling)| {
                    SubscriptionOptions {
                        qos,
                        no_local,
                        retain_as_published,
                        retain_handling,
                    }
                })
                .boxed()
        }
    }
}

fn subscribe(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    (
        1u16..,
        properties(version, Allowed::SUBSCRIBE),
        vec((topic_filter(), options(version)), 1..4),
    )
        .prop_map(|(packet_id, properties, filters)| {
            Packet::Subscribe(Subscribe {
                packet_id,
                properties,
                filters,
            })
        })
}

fn suback(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let codes = match version {
        V311 => vec(prop_oneof![Just(0u8), Just(1), Just(2), Just(0x80)], 1..4).boxed(),
        V5 => vec(any::<u8>(), 1..4).boxed(),
    };
    (any::<u16>(), properties(version, Allowed::ACK), codes).prop_map(
        |(packet_id, properties, codes)| {
            Packet::SubAck(SubAck {
                packet_id,
                properties,
                codes,
            })
        },
    )
}

fn unsubscribe(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    (
        1u16..,
        properties(version, Allowed::UNSUBSCRIBE),
        vec(topic_filter(), 1..4),
    )
        .prop_map(|(packet_id, properties, filters)| {
            Packet::Unsubscribe(Unsubscribe {
                packet_id,
                properties,
                filters,
            })
        })
}

fn unsuback(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let codes = match version {
        V311 => Just(Vec::new()).boxed(),
        V5 => vec(any::<u8>(), 1..4).boxed(),
    };
    (any::<u16>(), properties(version, Allowed::ACK), codes).prop_map(
        |(packet_id, properties, codes)| {
            Packet::UnsubAck(UnsubAck {
                packet_id,
                properties,
                codes,
            })
        },
    )
}

/// Any valid packet of `version`.
fn packet(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    let connack = (
        any::<bool>(),
        any::<u8>(),
        properties(version, Allowed::CONNACK),
    )
        .prop_map(|(session_present, code, properties)| {
            Packet::ConnAck(ConnAck {
                session_present,
                code,
                properties,
            })
        });
    let disconnect = (code(version), properties(version, Allowed::DISCONNECT))
        .prop_map(|(code, properties)| Packet::Disconnect(Disconnect { code, properties }));
    let common = prop_oneof![
        connect(version),
        connack,
        publish(version),
        ack(version),
        subscribe(version),
        suback(version),
        unsubscribe(version),
        unsuback(version),
        Just(Packet::PingReq),
        Just(Packet::PingResp),
        disconnect,
    ];
    match version {
        V311 => common.boxed(),
        V5 => {
            let auth = (any::<u8>(), properties(V5, Allowed::AUTH))
                .prop_map(|(code, properties)| Packet::Auth(Auth { code, properties }));
            prop_oneof![10 => common, 1 => auth].boxed()
        }
    }
}

fn version() -> impl Strategy<Value = ProtocolVersion> {
    prop_oneof![Just(V311), Just(V5)]
}

fn versioned_packet() -> impl Strategy<Value = (ProtocolVersion, Packet)> {
    version().prop_flat_map(|v| packet(v).prop_map(move |p| (v, p)))
}

/// Decodes one whole packet from `bytes`, as a connection would.
fn decode_all(bytes: &[u8], version: ProtocolVersion) -> Result<Packet, DecodeError> {
    let h = read_fixed_header(bytes)?.ok_or(DecodeError::Malformed("incomplete"))?;
    let body = bytes
        .get(h.header_len..h.header_len + h.remaining_length)
        .ok_or(DecodeError::Malformed("short"))?;
    if h.first_byte >> 4 == 1 {
        decode_connect(h.first_byte, body)
            .map(|c| Packet::Connect(Box::new(c)))
            .map_err(|e| e.error)
    } else {
        decode(h.first_byte, body, version)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn every_valid_packet_round_trips((version, packet) in versioned_packet()) {
        let mut out = vec![0xAA]; // the encoder appends, never overwrites
        encode(&packet, version, &mut out);
        let h = read_fixed_header(&out[1..]).unwrap().unwrap();
        prop_assert_eq!(1 + h.header_len + h.remaining_length, out.len());
        prop_assert_eq!(decode_all(&out[1..], version), Ok(packet));
    }

    #[test]
    fn a_publish_header_then_its_payload_is_the_whole_publish((version, packet) in versioned_packet()) {
        if let Packet::Publish(p) = &packet {
            let mut whole = Vec::new();
            encode(&packet, version, &mut whole);
            let mut split = vec![0xAA]; // appended, never overwritten
            prop_assert!(encode_publish_header(p, version, &mut split));
            split.extend_from_slice(&p.payload);
            prop_assert_eq!(&split[1..], &whole[..]);
        }
    }

    #[test]
    fn a_fixed_header_is_none_on_every_short_prefix((version, packet) in versioned_packet()) {
        let mut out = Vec::new();
        encode(&packet, version, &mut out);
        let h = read_fixed_header(&out).unwrap().unwrap();
        for end in 0..h.header_len {
            prop_assert_eq!(read_fixed_header(&out[..end]), Ok(None));
        }
    }

    #[test]
    fn no_bytes_make_the_decoder_panic(first_byte in any::<u8>(), body in vec(any::<u8>(), 0..64)) {
        for version in [V311, V5] {
            let _ = decode(first_byte, &body, version);
        }
        let _ = decode_connect(first_byte, &body);
        let _ = read_fixed_header(&body);
    }

    #[test]
    fn no_mutation_of_a_valid_packet_makes_the_decoder_panic(
        (version, packet) in versioned_packet(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut out = Vec::new();
        encode(&packet, version, &mut out);
        for (at, byte) in flips {
            let i = at.index(out.len());
            out[i] = byte;
        }
        if let Ok(Some(h)) = read_fixed_header(&out) {
            let body = &out[h.header_len.min(out.len())..];
            let _ = decode(h.first_byte, body, version);
            let _ = decode_connect(h.first_byte, body);
        }
    }
}
