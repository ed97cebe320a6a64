//! The MQTT wire codec: bytes in, packets out, and back. No I/O and no state.
//!
//! A connection reads a fixed header with [`read_fixed_header`], checks the declared
//! remaining length against its limits *before* allocating anything, reads exactly that
//! many bytes, and hands them to [`decode_connect`] (first packet) or [`decode`].
//! Topic aliases, windows and sessions belong to the connection, not to the codec.
//!
//! Every body is read through a bounded reader (`reader.rs`) that names the field it
//! stopped on; which class a refusal falls in ([`DecodeError`]) decides the reason code
//! the broker answers with: Malformed 0x81, Protocol 0x82, or a closed connection.
//!
//! Architecture invariant: the codec never allocates more than the declared remaining
//! length of the packet it reads (and one fixed-size set of property values, when the
//! packet carries any), and never panics on any input.

mod decode;
mod encode;
mod error;
pub mod packet;
pub mod properties;
mod reader;
pub mod reason;
mod topic;

pub use decode::{FixedHeader, decode, decode_connect, read_fixed_header};
pub use encode::{encode, encode_publish_header, encode_within};
pub use error::{ConnectError, DecodeError};
pub use packet::*;
pub use properties::{Properties, PropertyValues};
pub use topic::{has_wildcard, valid_topic_filter, valid_topic_name};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
