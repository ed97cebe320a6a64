//! Decoding. (Stub signatures; the implementation lands with the codec work.)

use super::error::{ConnectError, DecodeError};
use super::packet::{Connect, Packet, ProtocolVersion};

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
/// # Errors
/// Malformed when the remaining length takes more than four bytes, or the packet type is 0.
pub fn read_fixed_header(buf: &[u8]) -> Result<Option<FixedHeader>, DecodeError> {
    let _ = buf;
    unimplemented!()
}

/// Decodes the body of a CONNECT (`first_byte` is the fixed header's first byte).
///
/// # Errors
/// The failure, with the protocol the CONNECT declared if it got that far.
pub fn decode_connect(first_byte: u8, body: &[u8]) -> Result<Connect, ConnectError> {
    let _ = (first_byte, body);
    unimplemented!()
}

/// Decodes any packet on a connection that speaks `version`. A CONNECT here is returned
/// as a packet so the caller can refuse a second one (a Protocol Error).
///
/// # Errors
/// Malformed, Protocol, or TopicNotUtf8 as described on [`DecodeError`].
pub fn decode(first_byte: u8, body: &[u8], version: ProtocolVersion) -> Result<Packet, DecodeError> {
    let _ = (first_byte, body, version);
    unimplemented!()
}
