//! TLS on an MQTT tcp door against the real binary: a client trusting the test
//! authority connects, a plain client does not, `min_version` is a floor, and with
//! `client_ca_file` a certificate's name is the client's user name (RFC 0002 "TLS on
//! a listener", "Client certificates"). Certificates are made per test with rcgen.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use common::Broker;
use common::tls::{BOTH, Ca, Tls, client, open, tls_dir};
use saguin::codec::{self, Packet, ProtocolVersion, ProtocolVersion::V5, ProtocolVersion::V311};

/// The door's `tls` block (and `extra` door keys), for `common::config`.
fn door(tls_extra: &str, door_extra: &str) -> String {
    format!(
        "        tls:\n          cert_file: {{dir}}/server.pem\n          key_file: {{dir}}/server-key.pem\n{tls_extra}{door_extra}"
    )
}

fn send(tls: &mut Tls, packets: &[Packet], protocol: ProtocolVersion) -> std::io::Result<()> {
    let mut out = Vec::new();
    for p in packets {
        codec::encode(p, protocol, &mut out);
    }
    tls.write_all(&out)?;
    tls.flush()
}

fn recv(tls: &mut Tls, protocol: ProtocolVersion) -> Result<Packet, String> {
    let mut head = [0u8; 2];
    tls.read_exact(&mut head).map_err(|e| e.to_string())?;
    assert!(head[1] < 128, "short packets only");
    let mut body = vec![0u8; usize::from(head[1])];
    tls.read_exact(&mut body).map_err(|e| e.to_string())?;
    codec::decode(head[0], &body, protocol).map_err(|e| e.to_string())
}

/// Handshakes and sends CONNECT; the CONNACK code, or why there was none.
fn connack(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    protocol: ProtocolVersion,
    user: Option<(&str, &str)>,
) -> Result<u8, String> {
    let mut tls = open(addr, config);
    let mut connect = common::connect(protocol, "tls-test", true);
    if let Some((u, p)) = user {
        connect.username = Some(u.into());
        connect.password = Some(p.as_bytes().to_vec());
    }
    send(&mut tls, &[Packet::Connect(Box::new(connect))], protocol).map_err(|e| e.to_string())?;
    match recv(&mut tls, protocol)? {
        Packet::ConnAck(ack) => Ok(ack.code),
        other => Err(format!("expected CONNACK, got {other:?}")),
    }
}

/// B-169: a tcp door with a tls block serves MQTT 5 and 3.1.1 to a client trusting
/// the authority that signed its certificate.
#[test]
fn a_tls_door_serves_a_client_that_trusts_its_authority_b169() {
    let ca = Ca::new("test-ca");
    let broker = Broker::start_in(tls_dir("tls-ok", &ca), &common::config(&door("", "")));
    assert_eq!(
        connack(broker.addr, client(&ca, None, BOTH), V5, None),
        Ok(0)
    );
    assert_eq!(
        connack(broker.addr, client(&ca, None, BOTH), V311, None),
        Ok(0)
    );
    let tls12 = client(&ca, None, &[&rustls::version::TLS12]);
    assert_eq!(connack(broker.addr, tls12, V5, None), Ok(0));
}

/// Packets rustls has already decrypted are read without waiting for the socket: a
/// large PUBLISH and a PINGREQ written together are both answered.
#[test]
fn bytes_rustls_holds_are_read_without_waiting_for_the_socket() {
    let ca = Ca::new("test-ca");
    let broker = Broker::start_in(tls_dir("tls-buffered", &ca), &common::config(&door("", "")));
    let mut tls = open(broker.addr, client(&ca, None, BOTH));
    let connect = common::connect(V5, "buffered", true);
    send(&mut tls, &[Packet::Connect(Box::new(connect))], V5).expect("CONNECT");
    assert!(matches!(recv(&mut tls, V5), Ok(Packet::ConnAck(a)) if a.code == 0));
    let big = common::publish("big/one", &[7u8; 10_000], codec::QoS::AtMostOnce, false);
    send(&mut tls, &[Packet::Publish(big), Packet::PingReq], V5).expect("write");
    assert!(matches!(recv(&mut tls, V5), Ok(Packet::PingResp)));
}

/// B-169, B-187: a client speaking plain MQTT to a TLS door gets no CONNACK.
#[test]
fn a_plain_client_on_a_tls_door_gets_no_connack() {
    let ca = Ca::new("test-ca");
    let broker = Broker::start_in(tls_dir("tls-plain", &ca), &common::config(&door("", "")));
    let mut raw = common::Raw::open(broker.addr, V5);
    raw.send(&Packet::Connect(Box::new(common::connect(
        V5, "plain", true,
    ))));
    let got = raw.read_to_close();
    assert!(
        got.first() != Some(&0x20),
        "a plain client was answered CONNACK: {got:02X?}"
    );
    broker.wait_log("TLS handshake on broker.mqtt.listen.tcp failed");
}

/// B-193: min_version 1.3 refuses a TLS 1.2-only client and serves a 1.3 one.
#[test]
fn min_version_is_a_floor_b193() {
    let ca = Ca::new("test-ca");
    let broker = Broker::start_in(
        tls_dir("tls-13", &ca),
        &common::config(&door("          min_version: 1.3\n", "")),
    );
    let tls12 = client(&ca, None, &[&rustls::version::TLS12]);
    assert!(connack(broker.addr, tls12, V5, None).is_err());
    assert_eq!(
        connack(broker.addr, client(&ca, None, BOTH), V5, None),
        Ok(0)
    );
}

/// B-195, B-197, B-198: with client_ca_file a certificate is required, and its
/// Common Name (or, with none, its first DNS name) is the user name: the password
/// file is not consulted, though the door admits nobody anonymous.
#[test]
fn mutual_tls_names_the_client_by_its_certificate_b195_b197_b198() {
    let ca = Ca::new("test-ca");
    let dir = tls_dir("mtls", &ca);
    let broker = Broker::start_in(
        dir,
        &common::config(&door(
            "          client_ca_file: {dir}/ca.pem\n",
            "        password_file: {dir}/clients.passwd\n",
        )),
    );
    let (device, _, _) = ca.sign(&[], Some("device-7"));
    assert_eq!(
        connack(broker.addr, client(&ca, Some(&device), BOTH), V5, None),
        Ok(0)
    );
    broker.wait_log("named \"device-7\" by its client certificate");
    // A wrong password beside the certificate does not matter: the file is not asked.
    assert_eq!(
        connack(
            broker.addr,
            client(&ca, Some(&device), BOTH),
            V311,
            Some(("alice", "nope"))
        ),
        Ok(0)
    );
    let (sensor, _, _) = ca.sign(&["sensor-9.fleet.example"], None);
    assert_eq!(
        connack(broker.addr, client(&ca, Some(&sensor), BOTH), V5, None),
        Ok(0)
    );
    broker.wait_log("named \"sensor-9.fleet.example\"");

    // No certificate, or one another authority signed: no handshake.
    assert!(connack(broker.addr, client(&ca, None, BOTH), V5, None).is_err());
    let other = Ca::new("other-ca");
    let (stranger, _, _) = other.sign(&[], Some("device-7"));
    assert!(connack(broker.addr, client(&ca, Some(&stranger), BOTH), V5, None).is_err());
}

/// B-200: a certificate whose name holds a control character is refused 0x86 (3.1.1:
/// 0x04) with a warning saying why.
#[test]
fn a_certificate_name_with_a_control_character_is_0x86_b200() {
    let ca = Ca::new("test-ca");
    let broker = Broker::start_in(
        tls_dir("mtls-control", &ca),
        &common::config(&door("          client_ca_file: {dir}/ca.pem\n", "")),
    );
    let (evil, _, _) = ca.sign(&[], Some("device-7\u{1b}[2J"));
    assert_eq!(
        connack(broker.addr, client(&ca, Some(&evil), BOTH), V5, None),
        Ok(0x86)
    );
    broker.wait_log("holds a control character");
    assert_eq!(
        connack(broker.addr, client(&ca, Some(&evil), BOTH), V311, None),
        Ok(0x04)
    );
}

/// B-196: require_certificate: false lets a client without a certificate through
/// the handshake, to the password file.
#[test]
fn without_a_required_certificate_the_password_file_answers_b196() {
    let ca = Ca::new("test-ca");
    let broker = Broker::start_in(
        tls_dir("mtls-optional", &ca),
        &common::config(&door(
            "          client_ca_file: {dir}/ca.pem\n          require_certificate: false\n",
            "        password_file: {dir}/clients.passwd\n",
        )),
    );
    let plain = || client(&ca, None, BOTH);
    assert_eq!(connack(broker.addr, plain(), V5, None), Ok(0x86));
    assert_eq!(
        connack(broker.addr, plain(), V5, Some(("alice", "secret"))),
        Ok(0)
    );
    assert_eq!(
        connack(broker.addr, plain(), V311, Some(("alice", "nope"))),
        Ok(0x04)
    );
    let (device, _, _) = ca.sign(&[], Some("device-7"));
    assert_eq!(
        connack(broker.addr, client(&ca, Some(&device), BOTH), V5, None),
        Ok(0)
    );
}

/// B-187, B-190: a key that does not match its certificate stops the broker naming
/// the door.
#[test]
fn a_key_not_matching_its_certificate_stops_the_broker_b187() {
    let ca = Ca::new("test-ca");
    let dir = tls_dir("tls-mismatch", &ca);
    let (_, _, other_key) = ca.sign(&["localhost"], None);
    std::fs::write(dir.join("server-key.pem"), other_key).expect("write");
    let yaml = common::config(&door("", "")).replace("{dir}", &dir.display().to_string());
    let out = common::refused_at_startup(&dir, &yaml);
    assert!(out.contains("broker.mqtt.listen.tcp: key_file"), "{out}");
}

/// B-028, B-188: SIGUSR1 serves a renewed certificate to the next handshake.
#[test]
fn sigusr1_serves_a_renewed_certificate_b188() {
    let old = Ca::new("old-ca");
    let dir = tls_dir("tls-renew", &old);
    let broker = Broker::start_in(dir.clone(), &common::config(&door("", "")));
    let new = Ca::new("new-ca");
    assert!(connack(broker.addr, client(&new, None, BOTH), V5, None).is_err());
    let (_, cert, key) = new.sign(&["localhost", "127.0.0.1"], Some("broker"));
    std::fs::write(dir.join("server.pem"), cert).expect("write");
    std::fs::write(dir.join("server-key.pem"), key).expect("write");
    broker.signal("USR1");
    broker.wait_log("certificates re-read");
    assert_eq!(
        connack(broker.addr, client(&new, None, BOTH), V5, None),
        Ok(0)
    );
}

/// B-189: a client CA replaced on SIGUSR1 refuses, from the next handshake, a
/// certificate only the old authority signed, and admits one the new one signed.
#[test]
fn a_client_ca_replaced_on_sigusr1_refuses_what_only_the_old_one_signed_b189() {
    let ca = Ca::new("test-ca");
    let dir = tls_dir("mtls-reload", &ca);
    let broker = Broker::start_in(
        dir.clone(),
        &common::config(&door("          client_ca_file: {dir}/ca.pem\n", "")),
    );
    let (old_device, _, _) = ca.sign(&[], Some("device-old"));
    assert_eq!(
        connack(broker.addr, client(&ca, Some(&old_device), BOTH), V5, None),
        Ok(0)
    );
    let new_ca = Ca::new("new-client-ca");
    std::fs::write(dir.join("ca.pem"), new_ca.pem()).expect("write");
    broker.signal("USR1");
    broker.wait_log("certificates re-read");
    assert!(connack(broker.addr, client(&ca, Some(&old_device), BOTH), V5, None).is_err());
    let (new_device, _, _) = new_ca.sign(&[], Some("device-new"));
    assert_eq!(
        connack(broker.addr, client(&ca, Some(&new_device), BOTH), V5, None),
        Ok(0)
    );
}

/// B-191: each listener whose certificate is reloaded logs the new one's expiry.
#[test]
fn each_reloaded_certificate_logs_its_expiry_b191() {
    let ca = Ca::new("test-ca");
    let dir = tls_dir("tls-expiry", &ca);
    let (_, cert, key) = ca.sign(&["localhost"], Some("second"));
    std::fs::write(dir.join("second.pem"), cert).expect("write");
    std::fs::write(dir.join("second-key.pem"), key).expect("write");
    let yaml = common::config("").replace(
        "      tcp:\n        address: 127.0.0.1:0\n",
        "      tcp:\n        - name: one\n          address: 127.0.0.1:0\n          tls:\n            cert_file: {dir}/server.pem\n            key_file: {dir}/server-key.pem\n        - name: two\n          address: 127.0.0.1:0\n          tls:\n            cert_file: {dir}/second.pem\n            key_file: {dir}/second-key.pem\n",
    );
    let broker = Broker::start_in(dir.clone(), &yaml);
    for (file, year) in [("server", 2031), ("second", 2032)] {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.not_after = rcgen::date_time_ymd(year, 7, 9);
        let cert = params.self_signed(&key).expect("self-signed");
        std::fs::write(dir.join(format!("{file}.pem")), cert.pem()).expect("write");
        std::fs::write(dir.join(format!("{file}-key.pem")), key.serialize_pem()).expect("write");
    }
    broker.signal("USR1");
    let lines = broker.wait_log_lines("certificates re-read").join("\n");
    for (file, year) in [("server", 2031), ("second", 2032)] {
        let want = format!("{file}.pem: certificate valid until {year}-07-09");
        assert!(lines.contains(&want), "no {want:?} in\n{lines}");
    }
}

/// B-199: a verified certificate with neither a Common Name nor a DNS name (an IP
/// address only) names nobody: the client goes on as if it had none, to the password
/// file, and that is logged.
#[test]
fn a_certificate_naming_nobody_falls_through_to_the_password_file_b199() {
    let ca = Ca::new("test-ca");
    let broker = Broker::start_in(
        tls_dir("mtls-nameless", &ca),
        &common::config(&door(
            "          client_ca_file: {dir}/ca.pem\n",
            "        password_file: {dir}/clients.passwd\n",
        )),
    );
    let (nameless, _, _) = ca.sign(&["10.0.0.7"], None);
    let with_it = || client(&ca, Some(&nameless), BOTH);
    assert_eq!(connack(broker.addr, with_it(), V5, None), Ok(0x86));
    broker.wait_log("names nobody");
    assert_eq!(
        connack(broker.addr, with_it(), V5, Some(("alice", "secret"))),
        Ok(0)
    );
}

/// A client trusting only `ca_pem` (PEM), with `resolver` answering any certificate
/// request.
fn client_trusting(
    ca_pem: &str,
    resolver: Arc<dyn rustls::client::ResolvesClientCert>,
) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("a CA"))
        .expect("trust the CA");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(BOTH)
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_cert_resolver(resolver);
    Arc::new(config)
}

/// Notes whether the server asked for a client certificate; offers none.
#[derive(Debug, Default)]
struct AskedForCertificate(std::sync::atomic::AtomicBool);

impl rustls::client::ResolvesClientCert for AskedForCertificate {
    fn resolve(
        &self,
        _hints: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        None
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// B-194: without client_ca_file a TLS door does not ask for a client certificate;
/// with one (not required) it does, so the probe can tell.
#[test]
fn without_client_ca_file_no_certificate_is_requested_b194() {
    for (client_ca, asked) in [
        ("", false),
        (
            "          client_ca_file: {dir}/ca.pem\n          require_certificate: false\n",
            true,
        ),
    ] {
        let ca = Ca::new("test-ca");
        let broker = Broker::start_in(
            tls_dir("tls-no-request", &ca),
            &common::config(&door(client_ca, "")),
        );
        let probe = Arc::new(AskedForCertificate::default());
        let config = client_trusting(&ca.pem(), probe.clone());
        assert_eq!(connack(broker.addr, config, V5, None), Ok(0), "{client_ca}");
        assert_eq!(
            probe.0.load(std::sync::atomic::Ordering::SeqCst),
            asked,
            "asked for a certificate with {client_ca:?}"
        );
    }
}

/// B-192: a cert_file holding the leaf and its intermediate serves both: a client
/// trusting only the root connects, where the leaf alone is not enough.
#[test]
fn a_cert_file_holding_the_chain_serves_the_whole_chain_b192() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let root_key = KeyPair::generate().expect("key");
    let mut root = CertificateParams::new(Vec::<String>::new()).expect("params");
    root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root.distinguished_name.push(DnType::CommonName, "root");
    let root_pem = root.self_signed(&root_key).expect("root").pem();
    let root = Issuer::new(root, root_key);
    let mid_key = KeyPair::generate().expect("key");
    let mut mid = CertificateParams::new(Vec::<String>::new()).expect("params");
    mid.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    mid.distinguished_name
        .push(DnType::CommonName, "intermediate");
    let mid_pem = mid.signed_by(&mid_key, &root).expect("intermediate").pem();
    let mid = Issuer::new(mid, mid_key);
    let leaf_key = KeyPair::generate().expect("key");
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("params")
        .signed_by(&leaf_key, &mid)
        .expect("leaf")
        .pem();
    for (cert_file, serves) in [(format!("{leaf}{mid_pem}"), true), (leaf.clone(), false)] {
        let dir = common::temp_dir("tls-chain");
        std::fs::write(dir.join("server.pem"), cert_file).expect("write");
        std::fs::write(dir.join("server-key.pem"), leaf_key.serialize_pem()).expect("write");
        let broker = Broker::start_in(dir, &common::config(&door("", "")));
        let config = client_trusting(&root_pem, Arc::new(AskedForCertificate::default()));
        let answer = connack(broker.addr, config, V5, None);
        assert_eq!(answer.is_ok(), serves, "chain served {serves}: {answer:?}");
    }
}

/// Interoperability: Debian's mosquitto_pub publishes over the TLS door with
/// `--cafile`, and with `--cert`/`--key` where the door asks for a certificate.
#[test]
fn mosquitto_pub_publishes_over_tls_with_cafile() {
    let tool = Path::new("/usr/bin/mosquitto_pub");
    if !tool.exists() {
        eprintln!("skipped: /usr/bin/mosquitto_pub is not installed");
        return;
    }
    let ca = Ca::new("test-ca");
    let dir = tls_dir("tls-mosquitto", &ca);
    let (_, cert, key) = ca.sign(&[], Some("device-7"));
    std::fs::write(dir.join("device.pem"), cert).expect("write");
    std::fs::write(dir.join("device-key.pem"), key).expect("write");
    let broker = Broker::start_in(
        dir.clone(),
        &common::config(&door("          client_ca_file: {dir}/ca.pem\n", "")),
    );
    let port = broker.addr.port().to_string();
    let status = std::process::Command::new(tool)
        .args(["-h", "localhost", "-p", &port, "-V", "mqttv5", "-q", "1"])
        .args(["-t", "tls/hello", "-m", "hi", "-i", "mosq-tls"])
        .arg("--cafile")
        .arg(dir.join("ca.pem"))
        .arg("--cert")
        .arg(dir.join("device.pem"))
        .arg("--key")
        .arg(dir.join("device-key.pem"))
        .status()
        .expect("run mosquitto_pub");
    assert!(status.success(), "mosquitto_pub over TLS: {status}");
    broker.wait_log("named \"device-7\" by its client certificate");
}

/// B-551, B-552, B-185: a certificate file that is readable but not PEM fails
/// `--check-config` as it fails a start, and the refused start opens no storage.
#[test]
fn a_certificate_that_is_not_pem_is_refused_before_storage_is_opened() {
    let dir = common::temp_dir("not-pem");
    std::fs::write(dir.join("cert.pem"), "not a certificate\n").expect("write");
    std::fs::write(dir.join("key.pem"), "not a key\n").expect("write");
    let yaml = format!(
        "broker:\n  id: t\n  storage:\n    default: disk\n    default_retention_period: none\n    default_retention_bytes: none\n    providers:\n      disk:\n        type: sqlite\n        file_path: {d}/saguin.db\n  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n        tls:\n          cert_file: {d}/cert.pem\n          key_file: {d}/key.pem\n",
        d = dir.display()
    );
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, &yaml).expect("write");
    let out = common::run_saguin(&[std::ffi::OsStr::new("--check-config"), path.as_os_str()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("cert"), "{said}");
    let started = common::refused_at_startup(&dir, &yaml);
    assert!(
        !dir.join("saguin.db").exists(),
        "storage was opened:\n{started}"
    );
}

/// B-065: a stop does not wait out a TLS handshake that never comes (connect_timeout
/// here 30 s, and 5 s for the writes of connected clients).
#[test]
fn a_stopping_broker_ends_a_tls_handshake_at_once() {
    let ca = Ca::new("test-ca");
    let yaml = common::config(&format!(
        "{}  limits:\n    connect_timeout: 30s\n",
        door("", "")
    ));
    let broker = Broker::start_in(tls_dir("tls-stop", &ca), &yaml);
    let silent = std::net::TcpStream::connect(broker.addr).expect("connect");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let started = std::time::Instant::now();
    broker.stop();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "stopped without waiting for the silent handshake: {:?}",
        started.elapsed()
    );
    drop(silent);
}
