//! PROXY protocol v2 headers built by hand, byte by byte from the specification
//! (haproxy's proxy-protocol.txt, section 2.2), as nginx and HAProxy send them: for
//! the broker's tests and for the parser's own unit tests, which include this file.
#![allow(dead_code)]

/// The 12 bytes every v2 header opens with.
pub const SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];

/// PP2_CLIENT_SSL | PP2_CLIENT_CERT_CONN: TLS, with a certificate on this connection.
pub const TLS_WITH_CERTIFICATE: u8 = 0x01 | 0x02;

/// A v2 header being built.
#[derive(Debug, Clone)]
pub struct V2 {
    version_command: u8,
    family: u8,
    addresses: Vec<u8>,
    tlvs: Vec<u8>,
    crc: Option<bool>,
}

impl V2 {
    /// A PROXY header for a TCP over IPv4 client at `ip:port`, to 192.0.2.1:8883.
    pub fn tcp4(ip: [u8; 4], port: u16) -> V2 {
        let mut addresses = ip.to_vec();
        addresses.extend([192, 0, 2, 1]);
        addresses.extend(port.to_be_bytes());
        addresses.extend(8883u16.to_be_bytes());
        V2 {
            version_command: 0x21,
            family: 0x11,
            addresses,
            tlvs: Vec::new(),
            crc: None,
        }
    }

    /// A PROXY header for a TCP over IPv6 client at `[ip]:port`, to [2001:db8::1]:8883.
    pub fn tcp6(ip: [u8; 16], port: u16) -> V2 {
        let mut addresses = ip.to_vec();
        let mut to = [0u8; 16];
        to[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        to[15] = 1;
        addresses.extend(to);
        addresses.extend(port.to_be_bytes());
        addresses.extend(8883u16.to_be_bytes());
        V2 {
            version_command: 0x21,
            family: 0x21,
            addresses,
            tlvs: Vec::new(),
            crc: None,
        }
    }

    /// A LOCAL header (a proxy's own health check): no addresses.
    pub fn local() -> V2 {
        V2 {
            version_command: 0x20,
            family: 0x00,
            addresses: Vec::new(),
            tlvs: Vec::new(),
            crc: None,
        }
    }

    /// With the version and command byte replaced (for refusals).
    pub fn version_command(mut self, byte: u8) -> V2 {
        self.version_command = byte;
        self
    }

    /// With a TLV appended.
    pub fn tlv(mut self, kind: u8, value: &[u8]) -> V2 {
        self.tlvs.extend(tlv(kind, value));
        self
    }

    /// With an authority TLV (the SNI the client asked for).
    pub fn authority(self, host: &str) -> V2 {
        self.tlv(0x02, host.as_bytes())
    }

    /// With an SSL TLV as nginx sends it: client flags, verify result, then
    /// version, Common Name (when given), cipher, signature and key algorithm.
    pub fn ssl(self, client: u8, verify: u32, common_name: Option<&str>) -> V2 {
        let mut value = vec![client];
        value.extend(verify.to_be_bytes());
        value.extend(tlv(0x21, b"TLSv1.3"));
        if let Some(name) = common_name {
            value.extend(tlv(0x22, name.as_bytes()));
        }
        value.extend(tlv(0x23, b"TLS_AES_256_GCM_SHA384"));
        value.extend(tlv(0x24, b"ecdsa-with-SHA256"));
        value.extend(tlv(0x25, b"id-ecPublicKey"));
        self.tlv(0x20, &value)
    }

    /// With a CRC32C TLV last, correct when `right`, one bit off otherwise.
    pub fn crc(mut self, right: bool) -> V2 {
        self.crc = Some(right);
        self
    }

    /// The header's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut tlvs = self.tlvs.clone();
        if self.crc.is_some() {
            tlvs.extend(tlv(0x03, &[0, 0, 0, 0]));
        }
        let length = u16::try_from(self.addresses.len() + tlvs.len()).unwrap_or(u16::MAX);
        let mut out = SIGNATURE.to_vec();
        out.push(self.version_command);
        out.push(self.family);
        out.extend(length.to_be_bytes());
        out.extend(&self.addresses);
        out.extend(tlvs);
        if let Some(right) = self.crc {
            let crc = crc32c(&out) ^ u32::from(!right);
            let at = out.len() - 4;
            out[at..].copy_from_slice(&crc.to_be_bytes());
        }
        out
    }
}

fn tlv(kind: u8, value: &[u8]) -> Vec<u8> {
    let length = u16::try_from(value.len()).unwrap_or(u16::MAX);
    let mut out = vec![kind];
    out.extend(length.to_be_bytes());
    out.extend(value);
    out
}

/// CRC32C (Castagnoli) through a 256-entry table, written apart from the broker's
/// bit-by-bit one so that each checks the other.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|mut c| {
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
            c
        })
        .collect();
    !bytes.iter().fold(!0u32, |crc, &b| {
        table[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8)
    })
}
