//! Unit tests of the codec: one per failure class and rule, named by the behaviour they
//! pin and citing the spec rule (A-…) or MQTT conformance statement (MQTT-…) they check.

use std::sync::Arc;

use super::*;

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

#[test]
fn a_qos1_publish_round_trips_on_both_versions() {
    for version in [ProtocolVersion::V311, ProtocolVersion::V5] {
        let p = Packet::Publish(Publish {
            dup: true,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: Arc::from("a/b"),
            packet_id: Some(7),
            properties: Properties::default(),
            payload: Arc::from(&b"hello"[..]),
        });
        assert_eq!(round_trip(&p, version), p);
    }
}
