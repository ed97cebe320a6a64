//! Feeds arbitrary bytes to the codec the way a connection does: fixed header, then
//! the first packet as a CONNECT, every packet on both protocol versions.
//!
//! Two properties are checked: nothing panics, and whatever decodes re-encodes to bytes
//! that decode to the same packet (the decoder and encoder agree on every field).
#![no_main]

use libfuzzer_sys::fuzz_target;
// The codec is compiled into the target straight from its source: it depends on
// nothing, so the fuzz build needs none of the broker's dependencies (SQLite, TLS),
// which keeps a cold CI build to seconds rather than minutes.
#[path = "../../src/codec/mod.rs"]
#[allow(dead_code, missing_docs)]
mod codec;

use codec::{Packet, ProtocolVersion, decode, decode_connect, encode, read_fixed_header};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let mut first = true;
    while let Ok(Some(header)) = read_fixed_header(rest) {
        let end = header.header_len.saturating_add(header.remaining_length);
        let Some(body) = rest.get(header.header_len..end) else {
            break;
        };
        if first {
            if let Ok(connect) = decode_connect(header.first_byte, body) {
                let version = connect.protocol;
                check_round_trip(&Packet::Connect(Box::new(connect)), version);
            }
            first = false;
        }
        for version in [ProtocolVersion::V311, ProtocolVersion::V5] {
            if let Ok(packet) = decode(header.first_byte, body, version) {
                check_round_trip(&packet, version);
            }
        }
        rest = &rest[end..];
    }
});

/// Encodes `packet` and decodes it again: it must come back unchanged.
fn check_round_trip(packet: &Packet, version: ProtocolVersion) {
    let mut out = Vec::new();
    encode(packet, version, &mut out);
    let header = read_fixed_header(&out)
        .expect("an encoded fixed header reads")
        .expect("an encoded fixed header is complete");
    assert_eq!(header.header_len + header.remaining_length, out.len());
    let body = &out[header.header_len..];
    let again = match packet {
        Packet::Connect(_) => decode_connect(header.first_byte, body)
            .map(|c| Packet::Connect(Box::new(c)))
            .map_err(|e| e.error),
        _ => decode(header.first_byte, body, version),
    };
    assert_eq!(again.as_ref(), Ok(packet), "re-encoded as {out:02x?}");
}
