//! TLS for tests: an authority made with rcgen, certificates it signs written as
//! PEM files, and a rustls client trusting it (`tls_listener.rs`, `operations_auth.rs`).

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use super::WAIT;

/// An authority and what it signed, written as PEM files into a directory.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
}

/// A certificate and its key, as a client presents them.
pub struct Pair {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-signed CA");
        Ca {
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    pub fn pem(&self) -> String {
        pem("CERTIFICATE", &self.der)
    }

    /// Signs a leaf with these SANs and, when given, this Common Name.
    pub fn sign(&self, sans: &[&str], cn: Option<&str>) -> (Pair, String, String) {
        let key = KeyPair::generate().expect("key");
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("params");
        params.distinguished_name = DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        let pair = Pair {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        };
        (pair, cert.pem(), key.serialize_pem())
    }
}

pub fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("ascii"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// A directory with `ca.pem`, `server.pem` and `server-key.pem` (the server's names:
/// localhost and 127.0.0.1).
pub fn tls_dir(name: &str, ca: &Ca) -> PathBuf {
    let dir = super::temp_dir(name);
    let (_, cert, key) = ca.sign(&["localhost", "127.0.0.1"], Some("broker"));
    std::fs::write(dir.join("ca.pem"), ca.pem()).expect("ca.pem");
    std::fs::write(dir.join("server.pem"), cert).expect("server.pem");
    std::fs::write(dir.join("server-key.pem"), key).expect("server-key.pem");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/auth/clients.passwd"
        ),
        dir.join("clients.passwd"),
    )
    .expect("password file");
    dir
}

/// A TLS client's configuration trusting `ca`, presenting `pair` if given.
pub fn client(
    ca: &Ca,
    pair: Option<&Pair>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der.clone()).expect("trust the CA");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("versions")
    .with_root_certificates(roots);
    let config = match pair {
        Some(p) => builder
            .with_client_auth_cert(p.chain.clone(), p.key.clone_key())
            .expect("client certificate"),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

pub const BOTH: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

pub type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

pub fn open(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Tls {
    let sock = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
    sock.set_read_timeout(Some(WAIT)).expect("timeout");
    let conn = rustls::ClientConnection::new(config, ServerName::try_from("localhost").unwrap())
        .expect("client connection");
    rustls::StreamOwned::new(conn, sock)
}
