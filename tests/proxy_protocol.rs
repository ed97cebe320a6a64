//! PROXY protocol v2 on Unix doors (`proxy_protocol: true`, RFC 0002 "Behind a proxy
//! that terminated TLS", B-234..B-244), against the real binary over real Unix
//! sockets: the header read first and exactly, refused when missing, v1, damaged or
//! late; the client's address in the log; the SSL TLV's Common Name admitted as a
//! verified certificate's would be, on MQTT and operations doors alike. The headers
//! are built by hand (`common::proxy`).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::proxy::{TLS_WITH_CERTIFICATE, V2};
use common::{Broker, WAIT};
use saguin::codec::{self, Packet, ProtocolVersion::V5};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/auth/clients.passwd"
);
const BAD_USER_NAME_OR_PASSWORD: u8 = 0x86;

/// A broker with one MQTT unix door reading PROXY headers, with `door_extra` keys
/// (indented for the door) and `extra` after the MQTT block; `{dir}` holds a copy
/// of the password fixture as `clients.passwd`. Returns the broker and the socket.
fn start(name: &str, door_extra: &str, extra: &str) -> (Broker, PathBuf) {
    let dir = common::temp_dir(name);
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).expect("copy the password file");
    let sock = dir.join("mqtt.sock");
    let yaml = common::config(&format!(
        "      unix:\n        path: {}\n        proxy_protocol: true\n{door_extra}{extra}",
        sock.display()
    ));
    (Broker::start_in(dir, &yaml), sock)
}

/// The door's own password file and no anonymous clients.
const PASSWORDS: &str = "        password_file: {dir}/clients.passwd\n";

fn unix(sock: &Path) -> UnixStream {
    let stream = UnixStream::connect(sock).expect("connect to the unix door");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    stream
}

/// An MQTT 5 CONNECT's bytes, with a user name and password when given.
fn connect_bytes(client_id: &str, credentials: Option<(&str, &str)>) -> Vec<u8> {
    let mut connect = common::connect(V5, client_id, true);
    if let Some((user, password)) = credentials {
        connect.username = Some(user.into());
        connect.password = Some(password.as_bytes().to_vec());
    }
    let mut out = Vec::new();
    codec::encode(&Packet::Connect(Box::new(connect)), V5, &mut out);
    out
}

/// The first packet the broker answers with, or `None` when it closes first.
fn answer(stream: &mut UnixStream) -> Option<Packet> {
    let mut buf = Vec::new();
    loop {
        if let Ok(Some(h)) = codec::read_fixed_header(&buf) {
            let total = h.header_len + h.remaining_length;
            if buf.len() >= total {
                let body = &buf[h.header_len..total];
                return Some(codec::decode(h.first_byte, body, V5).expect("a packet"));
            }
        }
        let mut chunk = [0u8; 512];
        match stream.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // Closed with our bytes unread: the kernel says so with a reset.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("no answer and no close within {WAIT:?}: {e}"),
        }
    }
}

/// The CONNACK code a connection writing `bytes` gets; `None` when closed unanswered.
fn connack(sock: &Path, bytes: &[u8]) -> Option<u8> {
    let mut stream = unix(sock);
    stream.write_all(bytes).expect("write");
    match answer(&mut stream)? {
        Packet::ConnAck(ack) => Some(ack.code),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

fn then(header: &V2, connect: &[u8]) -> Vec<u8> {
    let mut bytes = header.bytes();
    bytes.extend_from_slice(connect);
    bytes
}

/// B-234, B-239: a header then a CONNECT, in separate writes, is admitted, and the
/// log names the client's address rather than the socket.
#[test]
fn a_header_then_connect_is_admitted_and_logged_as_the_client_b234_b239() {
    let (broker, sock) = start("proxy-plain", "", "");
    let mut stream = unix(&sock);
    stream
        .write_all(&V2::tcp4([203, 0, 113, 7], 51234).bytes())
        .expect("header");
    std::thread::sleep(Duration::from_millis(50));
    stream
        .write_all(&connect_bytes("behind", None))
        .expect("connect");
    assert!(matches!(answer(&mut stream), Some(Packet::ConnAck(ack)) if ack.code == 0));
    broker.wait_log("203.0.113.7:51234: behind connected");
}

/// B-234: the bytes after the header belong to MQTT whichever write carries them:
/// a CONNECT in the header's own write, and a header split across two writes.
#[test]
fn bytes_after_the_header_are_the_mqtt_stream_b234() {
    let (_broker, sock) = start("proxy-writes", "", "");
    let header = V2::tcp4([10, 1, 2, 3], 4000).authority("mqtt.example.net");
    assert_eq!(
        connack(&sock, &then(&header, &connect_bytes("one-write", None))),
        Some(0)
    );

    let mut stream = unix(&sock);
    let bytes = then(&header, &connect_bytes("split", None));
    stream.write_all(&bytes[..7]).expect("the first part");
    std::thread::sleep(Duration::from_millis(100));
    stream.write_all(&bytes[7..20]).expect("the second part");
    std::thread::sleep(Duration::from_millis(100));
    stream.write_all(&bytes[20..]).expect("the rest");
    assert!(matches!(answer(&mut stream), Some(Packet::ConnAck(ack)) if ack.code == 0));
}

/// B-236: a CONNECT with no header in front is closed with nothing written.
#[test]
fn a_connection_without_a_header_is_closed_b236() {
    let (broker, sock) = start("proxy-missing", "", "");
    assert_eq!(connack(&sock, &connect_bytes("direct", None)), None);
    let line = broker.wait_log("no PROXY v2 header");
    assert!(line.contains("broker.mqtt.listen.unix"), "{line}");
}

/// B-238: a v1 header is refused, the log naming the setting and v2.
#[test]
fn a_v1_header_is_refused_naming_the_setting_b238() {
    let (broker, sock) = start("proxy-v1", "", "");
    let mut bytes = b"PROXY TCP4 198.51.100.1 192.0.2.1 40000 8883\r\n".to_vec();
    bytes.extend(connect_bytes("v1", None));
    assert_eq!(connack(&sock, &bytes), None);
    let line = broker.wait_log("PROXY v1 header");
    assert!(line.contains("proxy_protocol"), "{line}");
    assert!(line.contains("proxy_protocol v2"), "{line}");
}

/// B-243: a damaged header is refused: a wrong CRC32C, a version other than 2.
#[test]
fn a_damaged_header_is_refused_b243() {
    let (broker, sock) = start("proxy-damaged", "", "");
    let connect = connect_bytes("damaged", None);
    let wrong_crc = V2::tcp4([10, 0, 0, 9], 1).crc(false);
    assert_eq!(connack(&sock, &then(&wrong_crc, &connect)), None);
    broker.wait_log("CRC32C");
    let version_3 = V2::local().version_command(0x31);
    assert_eq!(connack(&sock, &then(&version_3, &connect)), None);
    broker.wait_log("version 3");
}

/// B-237: a connection that has not sent its whole header within 5 s is closed,
/// silent or halfway through, though connect_timeout (10 s) has not passed.
#[test]
fn no_header_within_five_seconds_is_closed_b237() {
    let (_broker, sock) = start("proxy-slow", "", "");
    let opened = Instant::now();
    let mut silent = unix(&sock);
    let mut halfway = unix(&sock);
    halfway
        .write_all(&V2::tcp4([10, 0, 0, 1], 2).bytes()[..20])
        .expect("half a header");
    for stream in [&mut silent, &mut halfway] {
        let mut rest = Vec::new();
        let read = stream.read_to_end(&mut rest);
        assert!(read.is_ok() && rest.is_empty(), "{read:?} {rest:?}");
    }
    let took = opened.elapsed();
    assert!(
        took >= Duration::from_millis(4500) && took < Duration::from_secs(7),
        "{took:?}"
    );
}

/// B-240, B-242: on a door with a password file and no anonymous clients, a
/// verified Common Name is the client's name, as nginx sends it (authority TLV,
/// every SSL sub-TLV, CRC32C, B-243); no password asked.
#[test]
fn a_verified_common_name_is_admitted_as_that_name_b240_b242_b243() {
    let (broker, sock) = start("proxy-cn", PASSWORDS, "");
    let header = V2::tcp4([198, 51, 100, 7], 40000)
        .authority("mqtt.example.net")
        .ssl(TLS_WITH_CERTIFICATE, 0, Some("device-7"))
        .crc(true);
    assert_eq!(
        connack(&sock, &then(&header, &connect_bytes("d7", None))),
        Some(0)
    );
    let line = broker.wait_log("a proxy named this client");
    assert!(line.contains("principal=device-7"), "{line}");
    assert!(line.contains("198.51.100.7:40000"), "{line}");
    broker.wait_log("named \"device-7\" by its client certificate");
}

/// B-241, B-242: a certificate the proxy could not verify names nobody: with no
/// credentials the door refuses 0x86; with a right password the file admits.
#[test]
fn an_unverified_certificate_names_nobody_b241_b242() {
    let (broker, sock) = start("proxy-unverified", PASSWORDS, "");
    let header = V2::tcp4([198, 51, 100, 8], 40001).ssl(TLS_WITH_CERTIFICATE, 21, Some("device-7"));
    assert_eq!(
        connack(&sock, &then(&header, &connect_bytes("u1", None))),
        Some(BAD_USER_NAME_OR_PASSWORD)
    );
    let line = broker.wait_log("the proxy could not verify this client's certificate");
    assert!(line.contains("verify_result=21"), "{line}");
    let alice = connect_bytes("u2", Some(("alice", "secret")));
    assert_eq!(connack(&sock, &then(&header, &alice)), Some(0));
}

/// B-241: without the TLS and certificate flags a Common Name is not believed,
/// and a LOCAL header names nobody either.
#[test]
fn a_name_without_the_certificate_flags_or_in_a_local_header_is_nobody_b241() {
    let (_broker, sock) = start("proxy-flags", PASSWORDS, "");
    let connect = connect_bytes("f", None);
    let tls_only = V2::tcp4([10, 0, 0, 3], 3).ssl(0x01, 0, Some("device-7"));
    let certificate_only = V2::tcp4([10, 0, 0, 3], 3).ssl(0x02, 0, Some("device-7"));
    // An empty Common Name is no name: it would be the anonymous identity (B-199).
    let empty_name = V2::tcp4([10, 0, 0, 3], 3).ssl(TLS_WITH_CERTIFICATE, 0, Some(""));
    for header in [tls_only, certificate_only, empty_name, V2::local()] {
        assert_eq!(
            connack(&sock, &then(&header, &connect)),
            Some(BAD_USER_NAME_OR_PASSWORD),
            "{header:?}"
        );
    }
}

/// An operations door with `{dir}/ops.sock` reading PROXY headers, with `door_extra`.
fn operations(door_extra: &str) -> String {
    format!(
        "  operations:\n    listen:\n      unix:\n        path: {{dir}}/ops.sock\n        proxy_protocol: true\n{door_extra}"
    )
}

/// An operations request behind `header`: the HTTP answer, or an error when the
/// connection was closed unanswered.
fn ops_get(sock: &Path, header: Option<&V2>) -> std::io::Result<common::HttpAnswer> {
    let mut stream = unix(sock);
    if let Some(header) = header {
        stream.write_all(&header.bytes())?;
    }
    common::try_http_get(stream, "/health", None)
}

/// B-244: the operations socket reads the header before the request; a request
/// without one is closed unanswered.
#[test]
fn the_operations_socket_reads_the_header_first_b244() {
    let (broker, _) = start("proxy-ops", "", &operations(""));
    let sock = broker.dir.join("ops.sock");
    let header = V2::tcp4([10, 9, 8, 7], 6543);
    let answer = ops_get(&sock, Some(&header)).expect("an answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        ops_get(&sock, None).is_err(),
        "a request with no header is answered"
    );
}

/// B-244: on an operations door with a password file, a Common Name the proxy
/// verified admits the request as a client certificate would; one it could not
/// verify does not (401).
#[test]
fn the_operations_socket_believes_a_name_by_the_same_rule_b244() {
    let (broker, _) = start("proxy-ops-cn", "", &operations(PASSWORDS));
    let sock = broker.dir.join("ops.sock");
    let verified = V2::tcp4([10, 9, 8, 7], 1).ssl(TLS_WITH_CERTIFICATE, 0, Some("monitor"));
    let answer = ops_get(&sock, Some(&verified)).expect("an answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    broker.wait_log("principal=monitor");
    let unverified = V2::tcp4([10, 9, 8, 7], 2).ssl(TLS_WITH_CERTIFICATE, 2, Some("monitor"));
    let answer = ops_get(&sock, Some(&unverified)).expect("an answer");
    assert_eq!(answer.status, 401, "{answer:?}");
    broker.wait_log("verify_result=2");
}

/// RFC 0002 "TLS on a listener": a name from a proxy holding a control character
/// is nobody's, refused 0x86 as a certificate's would be, and logged escaped.
#[test]
fn a_proxy_name_holding_a_control_character_is_refused_b240() {
    let (broker, sock) = start("proxy-control", "", "");
    let header = V2::tcp4([10, 0, 0, 4], 4).ssl(TLS_WITH_CERTIFICATE, 0, Some("dev\u{1b}[2J"));
    assert_eq!(
        connack(&sock, &then(&header, &connect_bytes("c", None))),
        Some(BAD_USER_NAME_OR_PASSWORD)
    );
    let line = broker.wait_log("a proxy named this client");
    assert!(line.contains(r#"principal="dev\u{1b}[2J""#), "{line}");
    broker.wait_log("holds a control character");
}
