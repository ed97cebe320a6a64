//! Why a packet could not be decoded. The split matters: each class has its own
//! reason code (RFC 0002 "A DISCONNECT from the broker").

use super::packet::ProtocolVersion;

/// A packet the codec refused. Each variant names the field it stopped on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Unreadable bytes: a length past the end, bytes left over, reserved flags, a
    /// property the packet may not carry, invalid UTF-8 outside a topic. Reason 0x81.
    Malformed(&'static str),
    /// A rule MQTT calls a Protocol Error: a property twice, Receive Maximum 0,
    /// Retain Handling 3, a wildcard in a PUBLISH topic, a SUBSCRIBE with no filters. 0x82.
    Protocol(&'static str),
    /// A topic name or filter that is not valid UTF-8: the connection closes, nothing sent.
    TopicNotUtf8,
    /// A CONNECT naming a protocol level other than 4 or 5 (the level is carried).
    UnsupportedProtocol(u8),
}

/// The CONNECT flag combinations a 3.1.1 CONNACK refuses 0x05 rather than closing:
/// the reserved flag, Will QoS 3, a Will QoS or Will Retain without a Will, a
/// password without a user name (A-227..A-229, A-231, A-232).
pub(crate) const CONNECT_FLAG_ERRORS: [&str; 5] = [
    "CONNECT reserved flag set",
    "Will QoS of 3",
    "Will QoS set without a Will",
    "Will Retain set without a Will",
    "password without a user name",
];

/// The field a CONNECT's user name is read as.
pub(crate) const USER_NAME: &str = "user name";

impl DecodeError {
    /// The 3.1.1 CONNACK return code for an unreadable 3.1.1 CONNECT: 0x04 for a user
    /// name that is not UTF-8, 0x05 for a flag error, and `None` (closed with
    /// nothing written) for anything else.
    pub fn v311_connect_code(&self) -> Option<u8> {
        match self {
            DecodeError::Malformed(field) if *field == USER_NAME => Some(0x04),
            DecodeError::Malformed(what) | DecodeError::Protocol(what)
                if CONNECT_FLAG_ERRORS.contains(what) =>
            {
                Some(0x05)
            }
            _ => None,
        }
    }

    /// The MQTT 5 reason code for this failure, or `None` where the connection closes
    /// with nothing sent.
    pub fn reason_code(&self) -> Option<u8> {
        match self {
            DecodeError::Malformed(_) => Some(0x81),
            DecodeError::Protocol(_) => Some(0x82),
            DecodeError::TopicNotUtf8 | DecodeError::UnsupportedProtocol(_) => None,
        }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Malformed(field) => write!(f, "malformed packet: {field}"),
            DecodeError::Protocol(rule) => write!(f, "protocol error: {rule}"),
            DecodeError::TopicNotUtf8 => write!(f, "topic is not valid UTF-8"),
            DecodeError::UnsupportedProtocol(level) => {
                write!(f, "unsupported protocol level {level}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// A CONNECT that could not be decoded, with the protocol it declared if it got that
/// far: the refusal is answered in that protocol's vocabulary, or not at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    /// The protocol the CONNECT declared, `None` if it failed before saying.
    pub protocol: Option<ProtocolVersion>,
    /// What went wrong.
    pub error: DecodeError,
}
