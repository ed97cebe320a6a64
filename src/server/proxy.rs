//! PROXY protocol v2 on a Unix door with `proxy_protocol: true` (RFC 0002 "Behind a
//! proxy that terminated TLS", B-234..B-244), MQTT and operations alike.
//!
//! A proxy in front of the socket writes one header the moment it connects: the
//! client's real address and, in the SSL TLV, whether the client presented a
//! certificate, whether the proxy verified it, and its Common Name. [`admit`] reads
//! that header before anything else on the connection (before the CONNECT, before
//! the HTTP request), within [`HEADER_TIMEOUT`] fixed (B-237), and answers as
//! [`super::tls::admit_socket`] does for a door without it: the socket to speak on
//! and the name a verified certificate gives the client. That name goes to the same
//! `Gate::admit` a certificate this broker verified itself goes to (B-240, B-244).
//!
//! The header is read exactly: 16 bytes, then the length those declare, never a
//! byte past it, so what the client sent after it is still in the socket for the
//! frame reader or the request reader, whether it came in the same write or later.
//!
//! **Architecture invariants:** nothing larger than [`MAX_HEADER`] is ever buffered,
//! the length is checked before the body is read. A name is believed only when the
//! SSL TLV says TLS, a certificate presented, and verify result 0 (B-241); there is
//! no DNS-name fallback, because the header carries none (B-240).

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use futures_lite::future;
use smol::io::AsyncReadExt;

use super::Shared;
use super::socket::Socket;
use crate::auth::Gate;

/// The longest header read, signature included: nginx's and HAProxy's are a few
/// hundred bytes; anything longer is refused rather than buffered.
pub const MAX_HEADER: usize = 4096;
/// How long a connection may take to send its header (B-237): a proxy writes it the
/// moment it connects, so only a peer that is not a proxy takes longer.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The v2 signature, the 12 bytes every v2 header opens with.
const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Signature, version and command, family and transport, length.
const PREFIX: usize = 16;
/// How a v1 header opens.
const V1: &[u8] = b"PROXY ";

const COMMAND_LOCAL: u8 = 0x0;
const COMMAND_PROXY: u8 = 0x1;

const TLV_CRC32C: u8 = 0x03;
const TLV_SSL: u8 = 0x20;
const SSL_COMMON_NAME: u8 = 0x22;

/// PP2_CLIENT_SSL: the client connected over TLS.
const CLIENT_SSL: u8 = 0x01;
/// PP2_CLIENT_CERT_CONN: it presented a certificate on this connection.
const CLIENT_CERT_CONN: u8 = 0x02;
/// PP2_CLIENT_CERT_SESS: it presented one on the TLS session this resumed.
const CLIENT_CERT_SESS: u8 = 0x04;

/// What a header says about the client.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// The client's address, for log lines (B-239); `None` for a LOCAL header or
    /// an unspecified family.
    pub client: Option<String>,
    /// The SSL TLV, when the proxy sent one.
    pub ssl: Option<Ssl>,
}

/// The SSL TLV: what the proxy knows of the client's TLS.
#[derive(Debug, PartialEq, Eq)]
pub struct Ssl {
    /// The client flags (`PP2_CLIENT_*`).
    pub client: u8,
    /// The proxy's verify result: 0 is verified.
    pub verify: u32,
    /// The certificate's Common Name, when the proxy sent one.
    pub common_name: Option<String>,
}

impl Ssl {
    /// Whether the client spoke TLS and presented a certificate.
    fn presented(&self) -> bool {
        self.client & CLIENT_SSL != 0 && self.client & (CLIENT_CERT_CONN | CLIENT_CERT_SESS) != 0
    }
}

/// Why a connection's header was refused; each closes the connection (B-236).
#[derive(Debug)]
pub enum ProxyError {
    /// A v1 header (B-238).
    V1,
    /// The first bytes are not a PROXY header: the client reached the socket
    /// directly, or the proxy sends none.
    NotProxy(u8),
    /// The peer closed before its header was whole.
    Closed,
    /// No whole header within [`HEADER_TIMEOUT`] (B-237).
    TimedOut,
    /// A version other than 2 after the v2 signature.
    Version(u8),
    /// A command other than LOCAL and PROXY.
    Command(u8),
    /// A declared length putting the header over [`MAX_HEADER`].
    TooLong(usize),
    /// A field that cannot be read, named.
    Malformed(&'static str),
    /// The CRC32C TLV does not match the header's bytes.
    Crc {
        /// What the header says.
        declared: u32,
        /// What its bytes give.
        computed: u32,
    },
    /// The socket failed.
    Io(io::Error),
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyError::V1 => f.write_str(
                "a PROXY v1 header (PROXY TCP4 ...), which carries no certificate: proxy_protocol \
                 reads v2 only; configure the proxy to send v2 (nginx: proxy_protocol v2, not on; \
                 HAProxy: send-proxy-v2)",
            ),
            ProxyError::NotProxy(first) => write!(
                f,
                "no PROXY v2 header (the connection began with byte 0x{first:02X}): proxy_protocol \
                 is set on this door, so every connection must come through a proxy sending v2"
            ),
            ProxyError::Closed => f.write_str("closed before its PROXY v2 header was whole"),
            ProxyError::TimedOut => write!(
                f,
                "no whole PROXY v2 header within {}s of connecting",
                HEADER_TIMEOUT.as_secs()
            ),
            ProxyError::Version(v) => write!(f, "a PROXY header of version {v}; only 2 is read"),
            ProxyError::Command(c) => write!(
                f,
                "a PROXY v2 header with command {c}, neither LOCAL (0) nor PROXY (1)"
            ),
            ProxyError::TooLong(n) => write!(
                f,
                "a PROXY v2 header of {n} bytes, over the {MAX_HEADER} read here; have the proxy \
                 send fewer TLVs"
            ),
            ProxyError::Malformed(what) => write!(f, "a malformed PROXY v2 header: {what}"),
            ProxyError::Crc { declared, computed } => write!(
                f,
                "a PROXY v2 header whose CRC32C TLV says 0x{declared:08X} where its bytes give \
                 0x{computed:08X}: damaged on the way"
            ),
            ProxyError::Io(e) => write!(f, "reading its PROXY v2 header failed: {e}"),
        }
    }
}

/// The socket a connection on `gate`'s door speaks on, and the name a verified
/// certificate gives its client: on a door with `proxy_protocol`, read from its
/// PROXY v2 header, with `peer` replaced by the client's address (B-239); on any
/// other door, [`super::tls::admit_socket`]. `None` when the connection is refused
/// (logged; the caller closes it). A stopping broker stops waiting for a header.
pub async fn admit(
    gate: &Gate,
    mut stream: Socket,
    deadline: Instant,
    peer: &mut String,
    shared: &Shared,
) -> Option<(Socket, Option<String>)> {
    if !gate.proxy {
        return super::tls::admit_socket(gate, stream, deadline, peer).await;
    }
    let deadline = deadline.min(Instant::now() + HEADER_TIMEOUT);
    let read = future::or(read_header(&mut stream), async {
        future::or(
            async {
                smol::Timer::at(deadline).await;
            },
            shared.stopped(),
        )
        .await;
        Err(ProxyError::TimedOut)
    });
    let header = match read.await.and_then(|bytes| parse(&bytes)) {
        Ok(header) => header,
        Err(e) => {
            refused(peer, &gate.door, &e, shared.stopping());
            return None;
        }
    };
    if let Some(client) = &header.client {
        log::debug!(
            "{peer}: the PROXY header on {} names client {client}",
            gate.door
        );
        *peer = client.clone();
    }
    let name = vouched_name(&header, peer, &gate.door);
    // A proxy door is a Unix door, which never carries TLS of its own.
    Some((stream, name))
}

/// Logs a refused header at the level its cause deserves.
fn refused(peer: &str, door: &str, e: &ProxyError, stopping: bool) {
    match e {
        ProxyError::TimedOut if stopping => {}
        ProxyError::Closed | ProxyError::TimedOut | ProxyError::Io(_) => {
            log::info!("{peer}: closed on {door}: {e}")
        }
        _ => log::warn!("{peer}: refused on {door}: {e}"),
    }
}

/// The certificate name the header vouches for, if it is to be believed (B-240,
/// B-241), saying in the log which it was (B-242).
fn vouched_name(header: &Header, peer: &str, door: &str) -> Option<String> {
    let ssl = header.ssl.as_ref().filter(|ssl| ssl.presented())?;
    if ssl.verify != 0 {
        log::info!(
            "{peer}: the proxy could not verify this client's certificate on {door}, so it names \
             nobody (the password file, or anonymous where allowed, decides): verify_result={}",
            ssl.verify
        );
        return None;
    }
    // An empty name is no name: it would be the anonymous identity (B-249, B-199).
    let Some(name) = ssl.common_name.as_ref().filter(|n| !n.is_empty()) else {
        log::warn!(
            "{peer}: the proxy verified this client's certificate on {door} but sent no Common \
             Name, so it names nobody (a proxy's name has no DNS-name fallback); treated as no \
             certificate"
        );
        return None;
    };
    if crate::auth::has_control(name) {
        // Shown escaped: the gate refuses it, and it must not rewrite this line.
        log::info!("{peer}: a proxy named this client on {door}: principal={name:?}");
    } else {
        log::info!("{peer}: a proxy named this client on {door}: principal={name}");
    }
    Some(name.clone())
}

/// Reads the whole header and not a byte more.
async fn read_header(stream: &mut Socket) -> Result<Vec<u8>, ProxyError> {
    let mut header = vec![0u8; PREFIX];
    let mut filled = 0;
    while filled < PREFIX {
        let n = stream
            .read(&mut header[filled..])
            .await
            .map_err(ProxyError::Io)?;
        if n == 0 {
            return Err(ProxyError::Closed);
        }
        filled += n;
        // Refuse as soon as the bytes cannot open a v2 header: an MQTT client's
        // CONNECT is one byte, and it may send nothing more until answered.
        check_prefix(&header[..filled])?;
    }
    let length = declared_length(&header)?;
    header.resize(PREFIX + length, 0);
    stream
        .read_exact(&mut header[PREFIX..])
        .await
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => ProxyError::Closed,
            _ => ProxyError::Io(e),
        })?;
    Ok(header)
}

/// Whether `seen`, the first bytes of a connection, can still open a v2 header.
///
/// # Errors
/// A v1 header, or bytes that open no PROXY header at all.
fn check_prefix(seen: &[u8]) -> Result<(), ProxyError> {
    let Some(&first) = seen.first() else {
        return Ok(());
    };
    if first == V1[0] {
        let n = seen.len().min(V1.len());
        return match (seen[..n] == V1[..n], n == V1.len()) {
            (true, true) => Err(ProxyError::V1),
            (true, false) => Ok(()),
            (false, _) => Err(ProxyError::NotProxy(first)),
        };
    }
    let n = seen.len().min(SIGNATURE.len());
    if seen[..n] == SIGNATURE[..n] {
        Ok(())
    } else {
        Err(ProxyError::NotProxy(first))
    }
}

/// The length the 16-byte `prefix` declares for the rest of the header.
///
/// # Errors
/// A version other than 2, an unknown command, or a header over [`MAX_HEADER`].
fn declared_length(prefix: &[u8]) -> Result<usize, ProxyError> {
    let (Some(&version_command), Some(length)) = (prefix.get(12), prefix.get(14..PREFIX)) else {
        return Err(ProxyError::Malformed("shorter than its 16-byte opening"));
    };
    if version_command >> 4 != 2 {
        return Err(ProxyError::Version(version_command >> 4));
    }
    let command = version_command & 0x0F;
    if command != COMMAND_LOCAL && command != COMMAND_PROXY {
        return Err(ProxyError::Command(command));
    }
    let length = usize::from(u16::from_be_bytes([length[0], length[1]]));
    if PREFIX + length > MAX_HEADER {
        return Err(ProxyError::TooLong(PREFIX + length));
    }
    Ok(length)
}

/// Reads a whole header: addresses, the SSL TLV, and the CRC32C TLV, checked when
/// present (B-243). Other TLVs (ALPN, authority, unique id, ...) are skipped. A LOCAL
/// header (the proxy's own health check) names no address and nobody.
///
/// # Errors
/// A field that cannot be read, a length that disagrees, a repeated SSL or CRC32C
/// TLV, or a CRC32C that does not match.
pub fn parse(header: &[u8]) -> Result<Header, ProxyError> {
    check_prefix(header.get(..PREFIX).unwrap_or(header))?;
    let length = declared_length(header)?;
    let block = &header[PREFIX..];
    if block.len() != length {
        return Err(ProxyError::Malformed("its length disagrees with its bytes"));
    }
    if header[12] & 0x0F == COMMAND_LOCAL {
        return Ok(Header::default());
    }
    let (client, mut rest) = address(header[13] >> 4, block)?;
    let mut parsed = Header { client, ssl: None };
    let mut crc = None;
    while !rest.is_empty() {
        let at = header.len() - rest.len();
        let (kind, value, after) = tlv(rest)?;
        match kind {
            TLV_CRC32C => {
                let Ok(bytes) = <[u8; 4]>::try_from(value) else {
                    return Err(ProxyError::Malformed("a CRC32C TLV not 4 bytes long"));
                };
                if crc.replace((u32::from_be_bytes(bytes), at + 3)).is_some() {
                    return Err(ProxyError::Malformed("two CRC32C TLVs"));
                }
            }
            TLV_SSL => {
                let read = ssl(value)?;
                if parsed.ssl.replace(read).is_some() {
                    return Err(ProxyError::Malformed("two SSL TLVs"));
                }
            }
            _ => {}
        }
        rest = after;
    }
    if let Some((declared, at)) = crc {
        // The checksum covers the whole header with its own value as zeros.
        let mut zeroed = header.to_vec();
        zeroed[at..at + 4].fill(0);
        let computed = crc32c(&zeroed);
        if computed != declared {
            return Err(ProxyError::Crc { declared, computed });
        }
    }
    Ok(parsed)
}

/// The client's address from the address block of `family`, and the TLVs after it.
fn address(family: u8, block: &[u8]) -> Result<(Option<String>, &[u8]), ProxyError> {
    const INET: usize = 12;
    const INET6: usize = 36;
    const UNIX: usize = 216;
    let size = match family {
        0x0 => return Ok((None, block)),
        0x1 => INET,
        0x2 => INET6,
        0x3 => UNIX,
        _ => return Err(ProxyError::Malformed("an unknown address family")),
    };
    let Some((addresses, tlvs)) = block.split_at_checked(size) else {
        return Err(ProxyError::Malformed(
            "shorter than its address family's addresses",
        ));
    };
    let client = match family {
        0x1 => {
            let ip: [u8; 4] = addresses[..4].try_into().unwrap_or_default();
            let port = u16::from_be_bytes([addresses[8], addresses[9]]);
            Some(SocketAddr::from((Ipv4Addr::from(ip), port)).to_string())
        }
        0x2 => {
            let ip: [u8; 16] = addresses[..16].try_into().unwrap_or_default();
            let port = u16::from_be_bytes([addresses[32], addresses[33]]);
            Some(SocketAddr::from((Ipv6Addr::from(ip), port)).to_string())
        }
        _ => {
            // A path, NUL-padded: shown escaped, so it cannot rewrite a log line.
            let path = &addresses[..108];
            let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
            let path = String::from_utf8_lossy(&path[..end])
                .escape_debug()
                .to_string();
            (!path.is_empty()).then(|| format!("unix:{path}"))
        }
    };
    Ok((client, tlvs))
}

/// One TLV off the front of `bytes`: its type, its value and what follows.
fn tlv(bytes: &[u8]) -> Result<(u8, &[u8], &[u8]), ProxyError> {
    let [kind, high, low, rest @ ..] = bytes else {
        return Err(ProxyError::Malformed(
            "a TLV shorter than its type and length",
        ));
    };
    let length = usize::from(u16::from_be_bytes([*high, *low]));
    let Some((value, after)) = rest.split_at_checked(length) else {
        return Err(ProxyError::Malformed("a TLV longer than the header"));
    };
    Ok((*kind, value, after))
}

/// The SSL TLV: client flags, verify result, then sub-TLVs, of which the Common
/// Name is read and version, cipher, signature and key algorithm skipped.
fn ssl(value: &[u8]) -> Result<Ssl, ProxyError> {
    let [client, a, b, c, d, rest @ ..] = value else {
        return Err(ProxyError::Malformed(
            "an SSL TLV shorter than its flags and verify result",
        ));
    };
    let mut ssl = Ssl {
        client: *client,
        verify: u32::from_be_bytes([*a, *b, *c, *d]),
        common_name: None,
    };
    let mut rest = rest;
    while !rest.is_empty() {
        let (kind, value, after) = tlv(rest)?;
        if kind == SSL_COMMON_NAME {
            let name = std::str::from_utf8(value)
                .map_err(|_| ProxyError::Malformed("an SSL Common Name that is not UTF-8"))?;
            if ssl.common_name.replace(name.to_string()).is_some() {
                return Err(ProxyError::Malformed("two SSL Common Names"));
            }
        }
        rest = after;
    }
    Ok(ssl)
}

/// CRC32C (Castagnoli), as the CRC32C TLV carries it: bit by bit, since a header is
/// at most [`MAX_HEADER`] bytes and read once per connection.
pub fn crc32c(bytes: &[u8]) -> u32 {
    const POLY: u32 = 0x82F6_3B78; // 0x1EDC6F41, reflected
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = 0u32.wrapping_sub(crc & 1);
            crc = (crc >> 1) ^ (POLY & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests;
