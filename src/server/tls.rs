//! TLS on a tcp door, MQTT or operations: the certificate a door serves, the
//! authorities its client certificates are checked against, and the handshake a
//! connection makes before its CONNECT or its HTTP request (RFC 0002 "TLS on a
//! listener", "Client certificates").
//!
//! rustls with the ring provider. A door's `ServerConfig` is built once at startup and
//! shared by every handshake; SIGUSR1 swaps in a new one ([`TlsAcceptor::replace`]),
//! which handshakes from then on use while open connections keep theirs (B-188).
//!
//! **Architecture invariant:** the handshake runs in the connection's own task, inside
//! the same `connect_timeout` deadline as the CONNECT (B-062) - on an operations door,
//! the same deadline as the request head; the accept loop never waits on a client.

use std::cell::RefCell;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use futures_lite::future;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use smol::Async;

use super::socket::Socket;
use crate::config::{Tls, TlsVersion};

/// A door's TLS: what every handshake on it uses.
#[derive(Debug)]
pub struct TlsAcceptor {
    door: String,
    config: RefCell<Arc<ServerConfig>>,
    verifies_clients: bool,
}

impl TlsAcceptor {
    /// Reads the door's certificate, key and client CA.
    ///
    /// # Errors
    /// A file that cannot be read, holds no certificate or key, or a key that does
    /// not match its certificate: named with the door.
    pub fn load(door: &str, tls: &Tls) -> Result<TlsAcceptor, String> {
        let config = server_config(tls).map_err(|e| format!("{door}: {e}"))?;
        let acceptor = TlsAcceptor {
            door: door.to_string(),
            config: RefCell::new(config),
            verifies_clients: tls.client_ca_file.is_some(),
        };
        Ok(acceptor)
    }

    /// Reads the files again, into a configuration not yet in use.
    ///
    /// # Errors
    /// As [`TlsAcceptor::load`].
    pub fn read(&self, tls: &Tls) -> Result<Arc<ServerConfig>, String> {
        let door = &self.door;
        server_config(tls).map_err(|e| format!("{door}: {e}"))
    }

    /// Serves `config` to every handshake from now on.
    pub fn replace(&self, config: Arc<ServerConfig>) {
        *self.config.borrow_mut() = config;
    }

    /// Whether this door checks client certificates (it names a client CA).
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }

    /// The door's name.
    pub fn door(&self) -> &str {
        &self.door
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds a door's rustls configuration from its `tls` block.
fn server_config(tls: &Tls) -> Result<Arc<ServerConfig>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert_file)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| format!("cert_file {}: {e}", tls.cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "cert_file {}: holds no PEM certificate",
            tls.cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key_file)
        .map_err(|e| format!("key_file {}: {e}", tls.key_file.display()))?;
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::V1_2 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V1_3 => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?;
    let builder = match &tls.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("client_ca_file {}: {e}", path.display()))?;
            for ca in cas {
                roots
                    .add(ca)
                    .map_err(|e| format!("client_ca_file {}: {e}", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let verifier = if tls.require_certificate {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier
                .build()
                .map_err(|e| format!("client_ca_file {}: {e}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain.clone(), key).map_err(|e| {
        format!(
            "key_file {} does not serve cert_file {}: {e}",
            tls.key_file.display(),
            tls.cert_file.display()
        )
    })?;
    if let Some(expiry) = not_after(&chain[0]) {
        log::info!(
            "cert_file {}: certificate valid until {expiry}",
            tls.cert_file.display()
        );
    }
    Ok(Arc::new(config))
}

/// The socket a connection speaks MQTT (or, on an operations door, HTTP) on:
/// `stream` itself on a plain door, else the TLS stream once its handshake is made
/// (see [`handshake`]), with the client certificate's name.
pub async fn admit_socket(
    gate: &crate::auth::Gate,
    stream: Socket,
    deadline: Instant,
    peer: &str,
) -> Option<(Socket, Option<String>)> {
    match (&gate.tls, stream) {
        (None, stream) => Some((stream, None)),
        (Some(acceptor), Socket::Tcp(tcp)) => handshake(acceptor, tcp, deadline, peer).await,
        (Some(_), other) => Some((other, None)),
    }
}

/// Makes the handshake on a door carrying TLS, by `deadline`. Returns the socket to
/// speak MQTT on and the verified client certificate's name, if one was presented
/// and names somebody; `None` when the handshake failed (logged, socket closed).
pub async fn handshake(
    acceptor: &TlsAcceptor,
    stream: Async<TcpStream>,
    deadline: Instant,
    peer: &str,
) -> Option<(Socket, Option<String>)> {
    let config = acceptor.config.borrow().clone();
    let accept = futures_rustls::TlsAcceptor::from(config).accept(stream);
    let done = future::or(async { Some(accept.await) }, async {
        smol::Timer::at(deadline).await;
        None
    })
    .await;
    let tls = match done {
        Some(Ok(tls)) => tls,
        Some(Err(e)) => {
            log::info!("{peer}: TLS handshake on {} failed: {e}", acceptor.door);
            return None;
        }
        None => {
            log::debug!(
                "{peer}: TLS handshake on {} not done by its deadline",
                acceptor.door
            );
            return None;
        }
    };
    let name = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| {
            let name = certificate_name(leaf);
            if name.is_none() {
                log::warn!(
                    "{peer}: the client certificate on {} names nobody (no Common Name, no DNS name); treated as no certificate",
                    acceptor.door
                );
            }
            name
        });
    Some((Socket::Tls(Box::new(tls)), name))
}

/// A certificate's name: its Common Name, else its first DNS name, exactly as the
/// certificate states it (B-198); `None` when it has neither or cannot be read. An
/// empty one is none: it would be the anonymous identity (B-199, B-249).
pub fn certificate_name(der: &[u8]) -> Option<String> {
    use x509_cert::der::Decode;
    use x509_cert::ext::pkix::SubjectAltName;
    use x509_cert::ext::pkix::name::GeneralName;
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    let tbs = cert.tbs_certificate();
    if let Ok(Some(cn)) = tbs.subject().common_name()
        && !cn.value().is_empty()
    {
        return Some(cn.value().into_owned());
    }
    let (_, san) = tbs.get_extension::<SubjectAltName>().ok()??;
    san.0.iter().find_map(|name| match name {
        GeneralName::DnsName(dns) if !dns.as_str().is_empty() => Some(dns.to_string()),
        _ => None,
    })
}

/// When the certificate stops being valid, as RFC 3339.
fn not_after(der: &[u8]) -> Option<String> {
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    let seconds = cert
        .tbs_certificate()
        .validity()
        .not_after
        .to_unix_duration()
        .as_secs();
    let at = jiff::Timestamp::from_second(i64::try_from(seconds).ok()?).ok()?;
    Some(at.to_string())
}

/// The idle connection's TLS state, for [`Socket::poll_readable`]: whether rustls already
/// holds decrypted bytes the reader has not taken, which no socket readiness would
/// announce.
pub(crate) fn has_plaintext<D>(conn: &mut rustls::ConnectionCommon<D>) -> bool {
    conn.process_new_packets()
        .map_or(true, |state| state.plaintext_bytes_to_read() > 0)
}

/// Queues close_notify and writes what the socket takes now, without waiting.
pub(crate) fn close_notify<D>(io: &Async<TcpStream>, conn: &mut rustls::ConnectionCommon<D>) {
    conn.send_close_notify();
    let mut socket: &TcpStream = io.get_ref();
    while conn.wants_write() {
        match conn.write_tls(&mut socket) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}
