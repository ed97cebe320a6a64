//! Encoding: a packet value to its bytes, for one protocol version.
//!
//! The encoder writes straight into the caller's buffer: the body first, then the
//! remaining length is inserted in front of it, so nothing is sized twice.

use super::packet::{
    Ack, Auth, ConnAck, Connect, Disconnect, Packet, ProtocolVersion, Publish, QoS, SubAck,
    Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe,
};
use super::properties::{self, Allowed, Properties};

/// Appends `packet`, encoded for a connection speaking `version`, to `out`. Fields the
/// protocol lacks (properties, reason codes on 3.1.1) are left out.
///
/// A CONNECT is encoded for the protocol it names itself. Properties a packet may not
/// carry are left out. The MQTT 5 short forms are used where they apply: PUBACK, PUBREC,
/// PUBREL, PUBCOMP, DISCONNECT and AUTH with code 0 and no properties carry no code.
///
/// Nothing is appended for an AUTH on 3.1.1 (that protocol has no such packet) or for a
/// packet whose remaining length would exceed MQTT's 268,435,455 bytes; a caller holding
/// a Maximum Packet Size compares `out.len()` before and after. Strings and binary
/// fields over 65,535 bytes are cut to that length (a string at a character boundary).
pub fn encode(packet: &Packet, version: ProtocolVersion, out: &mut Vec<u8>) {
    if let Packet::Publish(p) = packet {
        if encode_publish_header(p, version, out) {
            out.extend_from_slice(&p.payload);
        }
        return;
    }
    let start = out.len();
    out.push(first_byte(packet));
    let body = out.len();
    let written = write_body(packet, version, out);
    if !written || !wire::insert_length(out, body) {
        out.truncate(start);
    }
}

/// Appends a packet other than a PUBLISH as [`encode`] does, within the receiver's
/// Maximum Packet Size of `max_size` bytes: one that would be larger goes without its
/// Reason String and User Properties, which MQTT 5 has a sender drop rather than
/// exceed that size (MQTT-3.1.2-24; MQTT-3.2.2-19, -20, MQTT-3.4.2-2, -3 and the
/// same rule in every acknowledgement and DISCONNECT). What is left is required, and
/// goes as it is. A PUBLISH is the caller's to drop (MQTT-3.1.2-25).
pub fn encode_within(
    packet: &Packet,
    version: ProtocolVersion,
    max_size: usize,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    encode(packet, version, out);
    if out.len() - start <= max_size {
        return;
    }
    let mut bare = packet.clone();
    let properties = match &mut bare {
        Packet::ConnAck(p) => &mut p.properties,
        Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubRel(p) | Packet::PubComp(p) => {
            &mut p.properties
        }
        Packet::SubAck(p) => &mut p.properties,
        Packet::UnsubAck(p) => &mut p.properties,
        Packet::Disconnect(p) => &mut p.properties,
        Packet::Auth(p) => &mut p.properties,
        _ => return,
    };
    let Some(values) = properties.present_mut() else {
        return;
    };
    values.reason_string = None;
    values.user_properties.clear();
    properties.shed_if_empty();
    out.truncate(start);
    encode(&bare, version, out);
}

/// Appends everything of a PUBLISH but its payload: the fixed header, whose remaining
/// length counts the payload, and the variable header. The caller sends the payload
/// right after these bytes - from the message it belongs to, without copying it into
/// `out`. Encoded as [`encode`] does; `false`, with nothing appended, when the packet
/// would exceed MQTT's 268,435,455 bytes.
pub fn encode_publish_header(p: &Publish, version: ProtocolVersion, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    out.push(publish_first_byte(p));
    let body = out.len();
    publish_header(p, version == ProtocolVersion::V5, out);
    // The length goes in front of the variable header alone: the payload is not moved.
    if !wire::insert_length_counting(out, body, p.payload.len()) {
        out.truncate(start);
        return false;
    }
    true
}

/// The packet type and flags: fixed by the type except for PUBLISH.
fn first_byte(packet: &Packet) -> u8 {
    match packet {
        Packet::Connect(_) => 0x10,
        Packet::ConnAck(_) => 0x20,
        Packet::Publish(p) => publish_first_byte(p),
        Packet::PubAck(_) => 0x40,
        Packet::PubRec(_) => 0x50,
        Packet::PubRel(_) => 0x62,
        Packet::PubComp(_) => 0x70,
        Packet::Subscribe(_) => 0x82,
        Packet::SubAck(_) => 0x90,
        Packet::Unsubscribe(_) => 0xA2,
        Packet::UnsubAck(_) => 0xB0,
        Packet::PingReq => 0xC0,
        Packet::PingResp => 0xD0,
        Packet::Disconnect(_) => 0xE0,
        Packet::Auth(_) => 0xF0,
    }
}

/// PUBLISH's first byte: DUP, QoS and RETAIN in the flags. DUP is never set at QoS 0
/// (MQTT-3.3.1-2), whatever a delivery downgraded from QoS 1 or 2 remembers.
fn publish_first_byte(p: &Publish) -> u8 {
    let dup = p.dup && p.qos != QoS::AtMostOnce;
    0x30 | u8::from(dup) << 3 | (p.qos as u8) << 1 | u8::from(p.retain)
}

/// Writes the body after the fixed header; `false` when the packet has no encoding.
fn write_body(packet: &Packet, version: ProtocolVersion, out: &mut Vec<u8>) -> bool {
    let v5 = version == ProtocolVersion::V5;
    match packet {
        Packet::Connect(c) => connect(c, out),
        Packet::ConnAck(c) => connack(c, v5, out),
        Packet::Publish(p) => {
            publish_header(p, v5, out);
            out.extend_from_slice(&p.payload);
        }
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            ack(a, v5, out)
        }
        Packet::Subscribe(s) => subscribe(s, v5, out),
        Packet::SubAck(s) => suback(s, v5, out),
        Packet::Unsubscribe(u) => unsubscribe(u, v5, out),
        Packet::UnsubAck(u) => unsuback(u, v5, out),
        Packet::PingReq | Packet::PingResp => {}
        Packet::Disconnect(Disconnect { code, properties }) => {
            if v5 {
                code_and_properties(*code, properties, Allowed::DISCONNECT, out);
            }
        }
        Packet::Auth(Auth { code, properties }) => {
            if !v5 {
                return false;
            }
            code_and_properties(*code, properties, Allowed::AUTH, out);
        }
    }
    true
}

fn connect(c: &Connect, out: &mut Vec<u8>) {
    let v5 = c.protocol == ProtocolVersion::V5;
    wire::put_str(out, "MQTT");
    out.push(c.protocol.level());
    let mut flags = u8::from(c.clean_start) << 1;
    if let Some(w) = &c.will {
        flags |= 0x04 | (w.qos as u8) << 3 | u8::from(w.retain) << 5;
    }
    flags |= u8::from(c.password.is_some()) << 6 | u8::from(c.username.is_some()) << 7;
    out.push(flags);
    out.extend_from_slice(&c.keep_alive.to_be_bytes());
    if v5 {
        properties::write(&c.properties, Allowed::CONNECT, out);
    }
    wire::put_str(out, &c.client_id);
    if let Some(w) = &c.will {
        if v5 {
            properties::write(&w.properties, Allowed::WILL, out);
        }
        wire::put_str(out, &w.topic);
        wire::put_binary(out, &w.payload);
    }
    if let Some(u) = &c.username {
        wire::put_str(out, u);
    }
    if let Some(p) = &c.password {
        wire::put_binary(out, p);
    }
}

fn connack(c: &ConnAck, v5: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(&[u8::from(c.session_present), c.code]);
    if v5 {
        properties::write(&c.properties, Allowed::CONNACK, out);
    }
}

/// A PUBLISH's variable header: topic, packet identifier, properties.
fn publish_header(p: &Publish, v5: bool, out: &mut Vec<u8>) {
    wire::put_str(out, &p.topic);
    if p.qos as u8 > 0 {
        out.extend_from_slice(&p.packet_id.unwrap_or(0).to_be_bytes());
    }
    if v5 {
        properties::write(&p.properties, Allowed::PUBLISH, out);
    }
}

fn ack(a: &Ack, v5: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(&a.packet_id.to_be_bytes());
    if v5 {
        code_and_properties(a.code, &a.properties, Allowed::ACK, out);
    }
}

/// An MQTT 5 reason code and properties, each left out when it says nothing: no
/// properties at all with code 0, no Property Length with none to carry.
fn code_and_properties(code: u8, props: &Properties, allowed: Allowed, out: &mut Vec<u8>) {
    let no_properties = *props == Properties::default();
    if code == 0 && no_properties {
        return;
    }
    out.push(code);
    if !no_properties {
        properties::write(props, allowed, out);
    }
}

fn subscribe(s: &Subscribe, v5: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(&s.packet_id.to_be_bytes());
    if v5 {
        properties::write(&s.properties, Allowed::SUBSCRIBE, out);
    }
    for (filter, options) in &s.filters {
        wire::put_str(out, filter);
        out.push(if v5 {
            options_byte(options)
        } else {
            options.qos as u8
        });
    }
}

/// The MQTT 5 Subscription Options byte (section 3.8.3.1).
fn options_byte(o: &SubscriptionOptions) -> u8 {
    o.qos as u8
        | u8::from(o.no_local) << 2
        | u8::from(o.retain_as_published) << 3
        | (o.retain_handling as u8) << 4
}

fn suback(s: &SubAck, v5: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(&s.packet_id.to_be_bytes());
    if v5 {
        properties::write(&s.properties, Allowed::ACK, out);
    }
    out.extend_from_slice(&s.codes);
}

fn unsubscribe(u: &Unsubscribe, v5: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(&u.packet_id.to_be_bytes());
    if v5 {
        properties::write(&u.properties, Allowed::UNSUBSCRIBE, out);
    }
    for filter in &u.filters {
        wire::put_str(out, filter);
    }
}

fn unsuback(u: &UnsubAck, v5: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(&u.packet_id.to_be_bytes());
    if v5 {
        properties::write(&u.properties, Allowed::ACK, out);
        out.extend_from_slice(&u.codes);
    }
}

/// The primitive wire types, written.
pub(crate) mod wire {
    /// The largest value a variable byte integer holds (MQTT 5 section 1.5.5).
    pub(crate) const VARINT_MAX: usize = 268_435_455;

    /// A variable byte integer; values above [`VARINT_MAX`] are written as it.
    pub(crate) fn put_varint(out: &mut Vec<u8>, value: u32) {
        let (bytes, n) = varint(value);
        out.extend_from_slice(&bytes[..n]);
    }

    /// The bytes of a variable byte integer and how many of them are used.
    fn varint(value: u32) -> ([u8; 4], usize) {
        let mut v = value.min(VARINT_MAX as u32);
        let mut bytes = [0u8; 4];
        let mut n = 0;
        loop {
            let byte = (v & 0x7F) as u8;
            v >>= 7;
            if v == 0 {
                bytes[n] = byte;
                return (bytes, n + 1);
            }
            bytes[n] = byte | 0x80;
            n += 1;
        }
    }

    /// A UTF-8 Encoded String, cut at a character boundary to 65,535 bytes.
    pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
        let mut end = s.len().min(usize::from(u16::MAX));
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        put_binary(out, &s.as_bytes()[..end]);
    }

    /// Binary Data, cut to 65,535 bytes.
    pub(crate) fn put_binary(out: &mut Vec<u8>, b: &[u8]) {
        let b = &b[..b.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(b.len() as u16).to_be_bytes());
        out.extend_from_slice(b);
    }

    /// Inserts, at `start`, the variable byte integer length of everything after it.
    /// `false` (and a clamped length) when that length is over [`VARINT_MAX`].
    pub(crate) fn insert_length(out: &mut Vec<u8>, start: usize) -> bool {
        insert_length_counting(out, start, 0)
    }

    /// As [`insert_length`], counting `more` bytes the caller sends after `out`.
    pub(crate) fn insert_length_counting(out: &mut Vec<u8>, start: usize, more: usize) -> bool {
        let len = (out.len() - start).saturating_add(more);
        let (bytes, n) = varint(u32::try_from(len).unwrap_or(u32::MAX));
        // Appended and rotated into place: what follows `start` is a header's few
        // bytes, and `splice` costs more than moving them (every delivery pays it).
        out.extend_from_slice(&bytes[..n]);
        out[start..].rotate_right(n);
        len <= VARINT_MAX
    }
}
