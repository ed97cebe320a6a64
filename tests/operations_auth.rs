//! Who may read the operations listener, against the real binary (RFC 0002 "The
//! operations listener"): HTTP Basic against a Mosquitto password file on tcp and
//! unix doors, a door's own file over the block's, TLS with a required client
//! certificate, the loopback rule at startup, every door served, and SIGUSR1
//! re-reading the files. Only loopback traffic: a door bound to 0.0.0.0 is reached
//! at 127.0.0.1.

mod common;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use common::tls::{BOTH, Ca, client, open, tls_dir};
use common::{Broker, HttpAnswer, WAIT, tcp, try_http_get};

/// alice (`$7$`, password "secret") and bob (`$6$`, password "hunter2"), as
/// mosquitto_passwd wrote them.
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/auth/clients.passwd"
);

const ALICE: Option<(&str, &str)> = Some(("alice", "secret"));
const BOB: Option<(&str, &str)> = Some(("bob", "hunter2"));

/// The fixture's line for `user`, alone, as the password file `name` in `dir`.
fn file_of(dir: &Path, name: &str, users: &[&str]) -> PathBuf {
    let fixture = std::fs::read_to_string(FIXTURE).expect("the fixture");
    let lines: String = fixture
        .lines()
        .filter(|l| users.iter().any(|u| l.starts_with(&format!("{u}:"))))
        .map(|l| format!("{l}\n"))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, lines).expect("write a password file");
    path
}

/// The address of the next operations tcp door the log announces (`scheme` http or
/// https), reached over loopback even when it is bound to every interface.
fn ops_addr(broker: &Broker, scheme: &str) -> String {
    let needle = format!("operations listening on {scheme}://");
    let line = broker.wait_log(&needle);
    let addr = line.split(&needle).nth(1).expect("an address").trim();
    addr.replace("0.0.0.0:", "127.0.0.1:")
}

fn unix(path: &Path) -> UnixStream {
    let stream = UnixStream::connect(path).expect("connect to the operations socket");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    stream
}

fn get_tcp(addr: &str, path: &str, credentials: Option<(&str, &str)>) -> HttpAnswer {
    try_http_get(tcp(addr), path, credentials).expect("an HTTP answer")
}

fn get_unix(sock: &Path, path: &str, credentials: Option<(&str, &str)>) -> HttpAnswer {
    try_http_get(unix(sock), path, credentials).expect("an HTTP answer")
}

/// A 401 carrying the Basic challenge, and nothing of what was asked for.
fn assert_unauthorized(answer: &HttpAnswer) {
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(
        answer
            .head
            .contains("\r\nWWW-Authenticate: Basic realm=\"saguin\""),
        "{answer:?}"
    );
    assert!(!answer.body.contains("saguin_"), "{answer:?}");
}

/// The `broker.operations` block with `listen` (indented for a key of it) and the
/// block's own keys after it.
fn operations(listen: &str, block: &str) -> String {
    common::config(&format!("  operations:\n    listen:\n{listen}{block}"))
}

/// One operations tcp door at `address` serving `tls_dir`'s certificate, with
/// `tls_extra` keys in its `tls` block.
fn tls_door(address: &str, tls_extra: &str) -> String {
    operations(
        &format!(
            "      tcp:\n        address: {address}\n        tls:\n          cert_file: {{dir}}/server.pem\n          key_file: {{dir}}/server-key.pem\n{tls_extra}"
        ),
        "",
    )
}

/// B-363: with the block's password file, a right password reads /health and
/// /metrics on the tcp door and on the unix door; a wrong password, an unknown user
/// and no credentials are 401 with the Basic challenge, whatever path they asked.
#[test]
fn basic_authentication_on_a_tcp_and_a_unix_door_b363() {
    let dir = common::temp_dir("ops-basic");
    let file = file_of(&dir, "operators.passwd", &["alice", "bob"]);
    let sock = dir.join("ops.sock");
    let yaml = operations(
        &format!(
            "      tcp:\n        address: 127.0.0.1:0\n      unix:\n        path: {}\n",
            sock.display()
        ),
        &format!("    password_file: {}\n", file.display()),
    );
    let broker = Broker::start_in(dir, &yaml);
    let addr = ops_addr(&broker, "http");
    let ok = get_tcp(&addr, "/health", ALICE);
    assert_eq!(ok.status, 200, "{ok:?}");
    assert!(ok.body.contains("\"status\":\"ok\""), "{ok:?}");
    let metrics = get_tcp(&addr, "/metrics", BOB);
    assert_eq!(metrics.status, 200, "{metrics:?}");
    assert!(metrics.body.contains("saguin_build_info"), "{metrics:?}");
    assert_unauthorized(&get_tcp(&addr, "/health", Some(("alice", "hunter2"))));
    broker.wait_log("wrong password for user \"alice\"");
    assert_unauthorized(&get_tcp(&addr, "/metrics", Some(("mallory", "secret"))));
    broker.wait_log("\"mallory\" is not in the password file");
    assert_unauthorized(&get_tcp(&addr, "/metrics", None));
    broker.wait_log("no credentials");
    assert_unauthorized(&get_tcp(&addr, "/nope", None));

    assert_eq!(get_unix(&sock, "/health", BOB).status, 200);
    assert_unauthorized(&get_unix(&sock, "/health", Some(("bob", "secret"))));
    assert_unauthorized(&get_unix(&sock, "/metrics", None));
}

/// B-363: a door's own password_file wins over the block's, on tcp and on unix
/// alike; a door naming none takes the block's.
#[test]
fn a_doors_own_password_file_wins_over_the_blocks_b363() {
    let dir = common::temp_dir("ops-own-file");
    let block = file_of(&dir, "block.passwd", &["alice"]);
    let own = file_of(&dir, "own.passwd", &["bob"]);
    let (own_sock, block_sock) = (dir.join("own.sock"), dir.join("block.sock"));
    let yaml = operations(
        &format!(
            "      tcp:\n        address: 127.0.0.1:0\n        password_file: {own}\n      unix:\n        - name: own\n          path: {}\n          password_file: {own}\n        - name: block\n          path: {}\n",
            own_sock.display(),
            block_sock.display(),
            own = own.display()
        ),
        &format!("    password_file: {}\n", block.display()),
    );
    let broker = Broker::start_in(dir, &yaml);
    let addr = ops_addr(&broker, "http");
    assert_eq!(get_tcp(&addr, "/health", BOB).status, 200);
    assert_unauthorized(&get_tcp(&addr, "/health", ALICE));
    assert_eq!(get_unix(&own_sock, "/health", BOB).status, 200);
    assert_unauthorized(&get_unix(&own_sock, "/health", ALICE));
    assert_eq!(get_unix(&block_sock, "/health", ALICE).status, 200);
    assert_unauthorized(&get_unix(&block_sock, "/health", BOB));
}

/// B-357, B-523: every unix door of a named list is served, each holding its own
/// `<path>.lock`; a door with no password file anywhere admits every reader (the
/// socket's permissions are its gate).
#[test]
fn every_unix_door_is_served_with_its_lock_b357_b523() {
    let dir = common::temp_dir("ops-two-unix");
    let (a, b) = (dir.join("a.sock"), dir.join("b.sock"));
    let yaml = operations(
        &format!(
            "      unix:\n        - name: agent\n          path: {}\n        - name: backup\n          path: {}\n",
            a.display(),
            b.display()
        ),
        "",
    );
    let broker = Broker::start_in(dir.clone(), &yaml);
    broker.wait_log(&format!("operations listening on {}", a.display()));
    broker.wait_log(&format!("operations listening on {}", b.display()));
    for sock in [&a, &b] {
        let answer = get_unix(sock, "/health", None);
        assert_eq!(answer.status, 200, "{}: {answer:?}", sock.display());
        assert!(Path::new(&format!("{}.lock", sock.display())).exists());
    }
    // A second broker finds the second socket held too.
    let second = common::temp_dir("ops-two-unix-2");
    let text = common::refused_at_startup(&second, &yaml);
    assert!(text.contains(".sock.lock"), "{text}");
}

/// B-169, B-198, B-361: a TLS door requiring a client certificate may bind every
/// interface; a client without a certificate gets no answer, and one whose
/// certificate the client CA signed is the operator its Common Name names.
#[test]
fn a_required_client_certificate_authenticates_the_operator_b169_b198_b361() {
    let ca = Ca::new("ops-ca");
    let dir = tls_dir("ops-mtls", &ca);
    let yaml = tls_door("0.0.0.0:0", "          client_ca_file: {dir}/ca.pem\n");
    let broker = Broker::start_in(dir, &yaml);
    let addr: std::net::SocketAddr = ops_addr(&broker, "https").parse().expect("address");
    let refused = try_http_get(open(addr, client(&ca, None, BOTH)), "/health", None);
    assert!(
        refused.as_ref().is_err() || refused.as_ref().is_ok_and(|a| a.status == 401),
        "a client with no certificate was answered: {refused:?}"
    );
    let (operator, _, _) = ca.sign(&[], Some("operator-1"));
    let tls = open(addr, client(&ca, Some(&operator), BOTH));
    let answer = try_http_get(tls, "/metrics", None).expect("an HTTP answer over TLS");
    assert_eq!(answer.status, 200, "{answer:?}");
    broker.wait_log("from \"operator-1\"");
    // B-198: no Common Name, so the first DNS name is the operator.
    let (dns_only, _, _) = ca.sign(&["scraper.example"], None);
    let tls = open(addr, client(&ca, Some(&dns_only), BOTH));
    let answer = try_http_get(tls, "/health", None).expect("an HTTP answer over TLS");
    assert_eq!(answer.status, 200, "{answer:?}");
    broker.wait_log("from \"scraper.example\"");
}

/// B-361, B-362: a tcp door on a non-loopback address that authenticates nobody is
/// refused at startup, naming the key; `require_certificate: false` does not count;
/// the rule is asked of each door, so a door with its own file may bind every
/// interface beside one that may not.
#[test]
fn a_non_loopback_door_that_authenticates_nobody_is_refused_b361_b362() {
    let dir = common::temp_dir("ops-loopback");
    let open_door = operations("      tcp:\n        address: 0.0.0.0:0\n", "");
    let text = common::refused_at_startup(&dir, &open_door);
    assert!(
        text.contains("broker.operations.listen.tcp.address") && text.contains("not loopback"),
        "{text}"
    );
    let optional = operations(
        "      tcp:\n        address: 0.0.0.0:0\n        tls:\n          cert_file: /etc/saguin/ops.pem\n          key_file: /etc/saguin/ops-key.pem\n          client_ca_file: /etc/saguin/ca.pem\n          require_certificate: false\n",
        "",
    );
    let text = common::refused_at_startup(&dir, &optional);
    assert!(
        text.contains("broker.operations.listen.tcp.address") && text.contains("not loopback"),
        "{text}"
    );
    let file = file_of(&dir, "own.passwd", &["alice"]);
    let per_door = operations(
        &format!(
            "      tcp:\n        - name: guarded\n          address: 0.0.0.0:0\n          password_file: {}\n        - name: bare\n          address: 0.0.0.0:0\n",
            file.display()
        ),
        "",
    );
    let text = common::refused_at_startup(&dir, &per_door);
    assert!(
        text.contains("broker.operations.listen.tcp[1].address")
            && !text.contains("broker.operations.listen.tcp[0].address"),
        "{text}"
    );
}

/// B-361: the same door with a password file of its own starts, and over loopback
/// it answers the operators the file names and nobody else.
#[test]
fn a_non_loopback_door_with_a_password_file_starts_b361() {
    let dir = common::temp_dir("ops-routable");
    let file = file_of(&dir, "own.passwd", &["alice"]);
    let yaml = operations(
        &format!(
            "      tcp:\n        address: 0.0.0.0:0\n        password_file: {}\n",
            file.display()
        ),
        "",
    );
    let broker = Broker::start_in(dir, &yaml);
    let addr = ops_addr(&broker, "http");
    assert_eq!(get_tcp(&addr, "/health", ALICE).status, 200);
    assert_unauthorized(&get_tcp(&addr, "/health", None));
}

/// B-028, B-228: SIGUSR1 re-reads the operations password file from the path the broker
/// started with: a user added is admitted and a user removed is refused from the
/// next request.
#[test]
fn sigusr1_rereads_the_operations_password_file_b228() {
    let dir = common::temp_dir("ops-usr1");
    let file = file_of(&dir, "operators.passwd", &["alice"]);
    let sock = dir.join("ops.sock");
    let yaml = operations(
        &format!("      unix:\n        path: {}\n", sock.display()),
        &format!("    password_file: {}\n", file.display()),
    );
    let broker = Broker::start_in(dir.clone(), &yaml);
    assert_eq!(get_unix(&sock, "/health", ALICE).status, 200);
    assert_unauthorized(&get_unix(&sock, "/health", BOB));
    file_of(&dir, "operators.passwd", &["bob"]);
    broker.signal("USR1");
    broker.wait_log("password files re-read");
    assert_eq!(get_unix(&sock, "/health", BOB).status, 200);
    assert_unauthorized(&get_unix(&sock, "/health", ALICE));
}

/// B-187, B-175: a key that does not serve its certificate stops the broker before
/// a port opens, naming the operations door.
#[test]
fn a_bad_certificate_on_an_operations_door_stops_the_broker_naming_it_b187() {
    let ca = Ca::new("ops-ca");
    let dir = tls_dir("ops-mismatch", &ca);
    let (_, _, other_key) = ca.sign(&["localhost"], None);
    std::fs::write(dir.join("server-key.pem"), other_key).expect("write");
    let yaml = tls_door("127.0.0.1:0", "").replace("{dir}", &dir.display().to_string());
    let text = common::refused_at_startup(&dir, &yaml);
    assert!(
        text.contains("broker.operations.listen.tcp: key_file"),
        "{text}"
    );
}

/// B-188: SIGUSR1 serves a renewed certificate on an operations TLS door to the
/// next handshake.
#[test]
fn sigusr1_serves_a_renewed_certificate_on_an_operations_door_b188() {
    let old = Ca::new("old-ca");
    let dir = tls_dir("ops-renew", &old);
    let yaml = tls_door("127.0.0.1:0", "");
    let broker = Broker::start_in(dir.clone(), &yaml);
    let addr: std::net::SocketAddr = ops_addr(&broker, "https").parse().expect("address");
    let new = Ca::new("new-ca");
    assert!(try_http_get(open(addr, client(&new, None, BOTH)), "/health", None).is_err());
    let ok = try_http_get(open(addr, client(&old, None, BOTH)), "/health", None);
    assert_eq!(ok.expect("an answer").status, 200);
    let (_, cert, key) = new.sign(&["localhost", "127.0.0.1"], Some("broker"));
    std::fs::write(dir.join("server.pem"), cert).expect("write");
    std::fs::write(dir.join("server-key.pem"), key).expect("write");
    broker.signal("USR1");
    broker.wait_log("1 certificates re-read");
    let renewed = try_http_get(open(addr, client(&new, None, BOTH)), "/health", None);
    assert_eq!(renewed.expect("an answer").status, 200);
}

/// Requests answered at once are bounded (32, across every door): a socket past
/// them is closed at once with nothing written, and a place given back serves the
/// next request.
#[test]
fn requests_answered_at_once_are_bounded() {
    let dir = common::temp_dir("ops-bounded");
    let sock = dir.join("ops.sock");
    let yaml = operations(
        &format!("      unix:\n        path: {}\n", sock.display()),
        "",
    );
    let broker = Broker::start_in(dir, &yaml);
    broker.wait_log("operations listening on");
    let mut idle: Vec<UnixStream> = (0..32).map(|_| unix(&sock)).collect();
    // The broker has taken every idle socket once a request behind them is answered
    // or refused; poll until the 33rd is refused.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let mut extra = unix(&sock);
        let mut buf = [0u8; 64];
        let _ = std::io::Write::write_all(&mut extra, b"GET /health HTTP/1.1\r\n\r\n");
        match std::io::Read::read(&mut extra, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => assert!(std::time::Instant::now() < deadline, "never refused"),
        }
    }
    broker.wait_log("closed at once");
    idle.truncate(31);
    let deadline = std::time::Instant::now() + WAIT;
    while try_http_get(unix(&sock), "/health", None)
        .map(|a| a.status)
        .ok()
        != Some(200)
    {
        assert!(std::time::Instant::now() < deadline, "no place came back");
    }
    // The place was the one given back: the 31 others are still held, where a
    // broker that freed none would have served this only once the request timeout
    // (5 s) closed them all.
    for (n, socket) in idle.iter_mut().enumerate() {
        socket
            .set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .expect("timeout");
        let mut buf = [0u8; 1];
        match std::io::Read::read(socket, &mut buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            other => panic!("idle socket {n} was let go ({other:?}), not held"),
        }
    }
}
