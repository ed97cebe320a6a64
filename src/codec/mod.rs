//! The MQTT wire codec: bytes in, packets out, and back. No I/O and no state.
//!
//! A connection reads a fixed header with [`read_fixed_header`], checks the declared
//! remaining length against its limits *before* allocating anything, reads exactly that
//! many bytes, and hands them to [`decode_connect`] (first packet) or [`decode`].
//! Topic aliases, windows and sessions belong to the connection, not to the codec.
//!
//! Architecture invariant: the codec never allocates more than the declared remaining
//! length of the packet it reads, and never panics on any input.

mod decode;
mod encode;
mod error;
pub mod packet;
pub mod properties;
mod reader;

pub use decode::{decode, decode_connect, read_fixed_header, FixedHeader};
pub use encode::encode;
pub use error::{ConnectError, DecodeError};
pub use packet::*;
pub use properties::Properties;
