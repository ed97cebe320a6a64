//! Decoding: a fixed header, then one packet's body, into a [`Packet`].
//!
//! Every body is read through a bounded [`Reader`], and must be read to its last byte.
//! Which failure class a refusal falls in decides the reason code the broker sends, so
//! each check below says which one MQTT gives it.

use std::sync::Arc;

use super::error::{CONNECT_FLAG_ERRORS, ConnectError, DecodeError, USER_NAME};
use super::packet::{
    Ack, Auth, ConnAck, Connect, Disconnect, Packet, ProtocolVersion, Publish, QoS, RetainHandling,
    SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
};
use super::properties::{self, Allowed, Properties};
use super::reader::Reader;

use DecodeError::{Malformed, Protocol};

/// A fixed header: the first byte (type and flags) and the declared remaining length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedHeader {
    /// Packet type in the high nibble, flags in the low.
    pub first_byte: u8,
    /// The declared remaining length (bytes after the fixed header).
    pub remaining_length: usize,
    /// How many bytes the fixed header itself took (2..=5).
    pub header_len: usize,
}

/// Reads a fixed header from the start of `buf`; `Ok(None)` while more bytes are needed.
///
/// Only the header is looked at: the caller checks `remaining_length` against its limits
/// before it buffers the body. A non-minimal remaining length (`0x80 0x00`) is accepted.
///
/// # Errors
/// Malformed when the remaining length takes more than four bytes, or the packet type is 0.
pub fn read_fixed_header(buf: &[u8]) -> Result<Option<FixedHeader>, DecodeError> {
    let Some(&first_byte) = buf.first() else {
        return Ok(None);
    };
    if first_byte >> 4 == 0 {
        return Err(Malformed("packet type 0, which MQTT reserves"));
    }
    let mut remaining_length = 0usize;
    for i in 0..4 {
        let Some(&byte) = buf.get(1 + i) else {
            return Ok(None);
        };
        remaining_length |= usize::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some(FixedHeader {
                first_byte,
                remaining_length,
                header_len: 2 + i,
            }));
        }
    }
    Err(Malformed("remaining length longer than four bytes"))
}

/// Decodes the body of a CONNECT (`first_byte` is the fixed header's first byte).
///
/// Protocol name `MQTT` with level 4 or 5 is admitted; level 3 (`MQIsdp` or `MQTT`) and
/// every other level are [`DecodeError::UnsupportedProtocol`], the caller answering in
/// that protocol's vocabulary. An empty client id and an Authentication Method decode
/// fine: whether to admit them is the broker's call.
///
/// # Errors
/// The failure, with the protocol the CONNECT declared if it got that far: once the
/// level byte names 4 or 5, `protocol` is `Some`.
pub fn decode_connect(first_byte: u8, body: &[u8]) -> Result<Connect, ConnectError> {
    let before = |error| ConnectError {
        protocol: None,
        error,
    };
    match first_byte {
        0x10 => {}
        b if b >> 4 == 1 => return Err(before(Malformed("CONNECT fixed header flags"))),
        _ => return Err(before(Protocol("first packet is not a CONNECT"))),
    }
    let mut r = Reader::new(body);
    let protocol = protocol(&mut r).map_err(before)?;
    connect_body(&mut r, protocol).map_err(|error| ConnectError {
        protocol: Some(protocol),
        error,
    })
}

/// The protocol name and level.
fn protocol(r: &mut Reader<'_>) -> Result<ProtocolVersion, DecodeError> {
    let name = r.binary("protocol name")?;
    let level = r.u8("protocol level")?;
    match (name, level) {
        (b"MQTT", 4) => Ok(ProtocolVersion::V311),
        (b"MQTT", 5) => Ok(ProtocolVersion::V5),
        (b"MQTT" | b"MQIsdp", level) => Err(DecodeError::UnsupportedProtocol(level)),
        _ => Err(Malformed("protocol name is not MQTT")),
    }
}

/// Everything after the protocol level (MQTT 5 section 3.1.2.3 onwards).
fn connect_body(r: &mut Reader<'_>, protocol: ProtocolVersion) -> Result<Connect, DecodeError> {
    let v5 = protocol == ProtocolVersion::V5;
    let flags = r.u8("connect flags")?;
    if flags & 0x01 != 0 {
        return Err(Malformed(CONNECT_FLAG_ERRORS[0])); // MQTT-3.1.2-3, A-227
    }
    let has_will = flags & 0x04 != 0;
    let will_qos = QoS::from_bits((flags >> 3) & 0x03).ok_or(Malformed(CONNECT_FLAG_ERRORS[1]))?;
    let will_retain = flags & 0x20 != 0;
    if !has_will && will_qos != QoS::AtMostOnce {
        return Err(Malformed(CONNECT_FLAG_ERRORS[2])); // MQTT-3.1.2-11, A-229
    }
    if !has_will && will_retain {
        return Err(Protocol(CONNECT_FLAG_ERRORS[3])); // MQTT-3.1.2-13, A-231
    }
    let has_password = flags & 0x40 != 0;
    let has_username = flags & 0x80 != 0;
    if !v5 && has_password && !has_username {
        return Err(Protocol(CONNECT_FLAG_ERRORS[4])); // MQTT 3.1.1 MQTT-3.1.2-22
    }
    let keep_alive = r.u16("keep alive")?;
    let properties = if v5 {
        properties::read(r, Allowed::CONNECT)?
    } else {
        Properties::default()
    };
    if properties.authentication_data.is_some() && properties.authentication_method.is_none() {
        return Err(Protocol(
            "Authentication Data without an Authentication Method",
        ));
    }
    let client_id = r.utf8("client identifier")?.to_owned();
    let will = if has_will {
        let properties = if v5 {
            properties::read(r, Allowed::WILL)?
        } else {
            Properties::default()
        };
        let topic = r.topic("Will Topic")?.to_owned();
        let payload = r.binary("Will Payload")?.to_vec();
        Some(Will {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties,
        })
    } else {
        None
    };
    // U+0000 is let through: the broker refuses such a name 0x86, not 0x81.
    let username = if has_username {
        // Cut short, it is an unreadable CONNECT (closed, A-252); only bytes that are
        // not UTF-8 are the user name's own fault (0x04, A-230).
        let bytes = r.binary("user name length")?;
        Some(
            std::str::from_utf8(bytes)
                .map_err(|_| Malformed(USER_NAME))?
                .to_owned(),
        )
    } else {
        None
    };
    let password = if has_password {
        Some(r.binary("password")?.to_vec())
    } else {
        None
    };
    r.expect_empty("bytes after the last CONNECT field")?;
    Ok(Connect {
        protocol,
        clean_start: flags & 0x02 != 0,
        keep_alive,
        client_id,
        will,
        username,
        password,
        properties,
    })
}

/// Decodes any packet on a connection that speaks `version`. A CONNECT here is returned
/// as a packet so the caller can refuse a second one (a Protocol Error).
///
/// A PUBLISH may carry several Subscription Identifiers, as one from the server does;
/// one from a client may carry none (MQTT-3.3.4-6), which the broker checks.
///
/// # Errors
/// Malformed, Protocol, or TopicNotUtf8 as described on [`DecodeError`].
pub fn decode(
    first_byte: u8,
    body: &[u8],
    version: ProtocolVersion,
) -> Result<Packet, DecodeError> {
    let v5 = version == ProtocolVersion::V5;
    let kind = first_byte >> 4;
    let flags = first_byte & 0x0F;
    let required_flags = match kind {
        3 => flags, // PUBLISH: DUP, QoS and RETAIN, checked below
        6 | 8 | 10 => 0b0010,
        _ => 0,
    };
    if flags != required_flags {
        return Err(Malformed("fixed header flags MQTT reserves")); // MQTT-2.1.3-1
    }
    if kind == 1 {
        // A second CONNECT; one naming an unknown level is still just a second CONNECT.
        return match decode_connect(first_byte, body) {
            Ok(c) => Ok(Packet::Connect(Box::new(c))),
            Err(ConnectError {
                error: DecodeError::UnsupportedProtocol(_),
                ..
            }) => Err(Protocol("a second CONNECT")),
            Err(e) => Err(e.error),
        };
    }
    let mut r = Reader::new(body);
    let packet = match kind {
        2 => Packet::ConnAck(connack(&mut r, v5)?),
        3 => Packet::Publish(publish(flags, &mut r, v5)?),
        4 => Packet::PubAck(ack(&mut r, v5)?),
        5 => Packet::PubRec(ack(&mut r, v5)?),
        6 => Packet::PubRel(ack(&mut r, v5)?),
        7 => Packet::PubComp(ack(&mut r, v5)?),
        8 => Packet::Subscribe(subscribe(&mut r, v5)?),
        9 => Packet::SubAck(suback(&mut r, v5)?),
        10 => Packet::Unsubscribe(unsubscribe(&mut r, v5)?),
        11 => Packet::UnsubAck(unsuback(&mut r, v5)?),
        12 => Packet::PingReq,
        13 => Packet::PingResp,
        14 => {
            let (code, properties) = if v5 {
                code_and_properties(&mut r, Allowed::DISCONNECT)?
            } else {
                (0, Properties::default())
            };
            Packet::Disconnect(Disconnect { code, properties })
        }
        15 if v5 => {
            let (code, properties) = code_and_properties(&mut r, Allowed::AUTH)?;
            Packet::Auth(Auth { code, properties })
        }
        _ => return Err(Malformed("packet type MQTT reserves")),
    };
    r.expect_empty("bytes after the last field")?;
    Ok(packet)
}

fn connack(r: &mut Reader<'_>, v5: bool) -> Result<ConnAck, DecodeError> {
    let flags = r.u8("acknowledge flags")?;
    if flags & 0xFE != 0 {
        return Err(Malformed("CONNACK reserved flags set"));
    }
    let code = r.u8("reason code")?;
    let properties = if v5 {
        properties::read(r, Allowed::CONNACK)?
    } else {
        Properties::default()
    };
    Ok(ConnAck {
        session_present: flags == 1,
        code,
        properties,
    })
}

fn publish(flags: u8, r: &mut Reader<'_>, v5: bool) -> Result<Publish, DecodeError> {
    let qos = QoS::from_bits((flags >> 1) & 0x03).ok_or(Malformed("PUBLISH QoS of 3"))?; // MQTT-3.3.1-4, A-255
    let dup = flags & 0x08 != 0;
    if dup && qos == QoS::AtMostOnce {
        return Err(Malformed("DUP set on a QoS 0 PUBLISH")); // MQTT-3.3.1-2, as mosquitto
    }
    let topic = r.topic("topic name")?;
    if super::topic::has_wildcard(topic) {
        return Err(Protocol("wildcard in a PUBLISH topic name")); // MQTT-3.3.2-2, A-188
    }
    let packet_id = if qos == QoS::AtMostOnce {
        None
    } else {
        Some(nonzero_packet_id(r)?)
    };
    let properties = if v5 {
        properties::read(r, Allowed::PUBLISH)?
    } else {
        Properties::default()
    };
    if topic.is_empty() && properties.topic_alias.is_none() {
        return Err(Protocol("empty topic name without a Topic Alias")); // MQTT 5 section 3.3.2.1
    }
    Ok(Publish {
        dup,
        qos,
        retain: flags & 0x01 != 0,
        topic: Arc::from(topic),
        packet_id,
        properties,
        payload: Arc::from(r.rest()),
    })
}

/// The packet identifier of a PUBLISH (QoS > 0), SUBSCRIBE or UNSUBSCRIBE, which may not
/// be 0 (MQTT-2.2.1-3).
fn nonzero_packet_id(r: &mut Reader<'_>) -> Result<u16, DecodeError> {
    match r.u16("packet identifier")? {
        0 => Err(Protocol("packet identifier 0")),
        id => Ok(id),
    }
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP: on MQTT 5 a remaining length of 2 means code 0.
fn ack(r: &mut Reader<'_>, v5: bool) -> Result<Ack, DecodeError> {
    let packet_id = r.u16("packet identifier")?;
    let (code, properties) = if v5 {
        code_and_properties(r, Allowed::ACK)?
    } else {
        (0, Properties::default())
    };
    Ok(Ack {
        packet_id,
        code,
        properties,
    })
}

/// An MQTT 5 reason code and properties, either of which the short forms leave out:
/// no code means 0x00, no Property Length means no properties.
fn code_and_properties(
    r: &mut Reader<'_>,
    allowed: Allowed,
) -> Result<(u8, Properties), DecodeError> {
    if r.is_empty() {
        return Ok((0, Properties::default()));
    }
    let code = r.u8("reason code")?;
    if r.is_empty() {
        return Ok((code, Properties::default()));
    }
    Ok((code, properties::read(r, allowed)?))
}

fn subscribe(r: &mut Reader<'_>, v5: bool) -> Result<Subscribe, DecodeError> {
    let packet_id = nonzero_packet_id(r)?;
    let properties = if v5 {
        properties::read(r, Allowed::SUBSCRIBE)?
    } else {
        Properties::default()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = topic_filter(r)?;
        let byte = r.u8("subscription options")?;
        let options = if v5 {
            options_v5(byte)?
        } else {
            options_v311(byte)?
        };
        filters.push((filter.to_owned(), options));
    }
    if filters.is_empty() {
        return Err(Protocol("SUBSCRIBE with no topic filters")); // MQTT-3.8.3-2, A-157
    }
    Ok(Subscribe {
        packet_id,
        properties,
        filters,
    })
}

/// A topic filter in a SUBSCRIBE or UNSUBSCRIBE. An empty one is a field the client did
/// not send, a Protocol Error (MQTT-4.7.3-1, RFC 0002); its shape is the broker's to judge.
fn topic_filter<'a>(r: &mut Reader<'a>) -> Result<&'a str, DecodeError> {
    let filter = r.topic("topic filter")?;
    if filter.is_empty() {
        return Err(Protocol("zero-length topic filter"));
    }
    Ok(filter)
}

/// MQTT 5 Subscription Options (section 3.8.3.1).
fn options_v5(byte: u8) -> Result<SubscriptionOptions, DecodeError> {
    if byte & 0xC0 != 0 {
        return Err(Malformed("reserved subscription option bits set")); // MQTT-3.8.3-5
    }
    let qos = QoS::from_bits(byte & 0x03).ok_or(Protocol("subscription Maximum QoS of 3"))?;
    let retain_handling = match (byte >> 4) & 0x03 {
        0 => RetainHandling::OnSubscribe,
        1 => RetainHandling::OnNewSubscribe,
        2 => RetainHandling::Never,
        _ => return Err(Protocol("Retain Handling 3")),
    };
    Ok(SubscriptionOptions {
        qos,
        no_local: byte & 0x04 != 0,
        retain_as_published: byte & 0x08 != 0,
        retain_handling,
    })
}

/// MQTT 3.1.1 Requested QoS: six reserved bits and a QoS (MQTT-3-8.3-4 of 3.1.1).
fn options_v311(byte: u8) -> Result<SubscriptionOptions, DecodeError> {
    if byte & 0xFC != 0 {
        return Err(Malformed("reserved subscription option bits set"));
    }
    let qos = QoS::from_bits(byte).ok_or(Malformed("requested QoS of 3"))?;
    Ok(SubscriptionOptions::with_qos(qos))
}

fn suback(r: &mut Reader<'_>, v5: bool) -> Result<SubAck, DecodeError> {
    let packet_id = r.u16("packet identifier")?;
    let properties = if v5 {
        properties::read(r, Allowed::ACK)?
    } else {
        Properties::default()
    };
    let codes = r.rest().to_vec();
    if !v5 && codes.iter().any(|c| !matches!(c, 0 | 1 | 2 | 0x80)) {
        return Err(Malformed("SUBACK return code MQTT 3.1.1 reserves"));
    }
    if codes.is_empty() {
        return Err(Protocol("SUBACK with no reason codes"));
    }
    Ok(SubAck {
        packet_id,
        properties,
        codes,
    })
}

fn unsubscribe(r: &mut Reader<'_>, v5: bool) -> Result<Unsubscribe, DecodeError> {
    let packet_id = nonzero_packet_id(r)?;
    let properties = if v5 {
        properties::read(r, Allowed::UNSUBSCRIBE)?
    } else {
        Properties::default()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        filters.push(topic_filter(r)?.to_owned());
    }
    if filters.is_empty() {
        return Err(Protocol("UNSUBSCRIBE with no topic filters")); // MQTT-3.10.3-2
    }
    Ok(Unsubscribe {
        packet_id,
        properties,
        filters,
    })
}

fn unsuback(r: &mut Reader<'_>, v5: bool) -> Result<UnsubAck, DecodeError> {
    let packet_id = r.u16("packet identifier")?;
    if !v5 {
        return Ok(UnsubAck {
            packet_id,
            properties: Properties::default(),
            codes: Vec::new(),
        });
    }
    let properties = properties::read(r, Allowed::ACK)?;
    let codes = r.rest().to_vec();
    if codes.is_empty() {
        return Err(Protocol("UNSUBACK with no reason codes"));
    }
    Ok(UnsubAck {
        packet_id,
        properties,
        codes,
    })
}
