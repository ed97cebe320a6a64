//! Encoding. (Stub signature; the implementation lands with the codec work.)

use super::packet::{Packet, ProtocolVersion};

/// Appends `packet`, encoded for a connection speaking `version`, to `out`. Fields the
/// protocol lacks (properties, reason codes on 3.1.1) are left out.
pub fn encode(packet: &Packet, version: ProtocolVersion, out: &mut Vec<u8>) {
    let _ = (packet, version, out);
    unimplemented!()
}
