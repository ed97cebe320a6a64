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

impl DecodeError {
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
