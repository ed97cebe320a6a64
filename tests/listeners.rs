//! The MQTT doors: a Unix socket serves MQTT like TCP, its lock refuses a second
//! broker, and what this build cannot serve is refused at startup rather than left
//! silently closed or unchecked.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use common::{Broker, Raw, WAIT, opts, temp_dir};
use saguin::codec::{self, Packet, ProtocolVersion::V5, QoS};

#[test]
fn a_unix_socket_door_serves_mqtt_beside_tcp() {
    let dir = temp_dir("unix-door");
    let sock = dir.join("saguin.sock");
    let yaml = common::config(&format!("      unix:\n        path: {}\n", sock.display()));
    let broker = Broker::start_in(dir, &yaml);
    let unix = UnixStream::connect(&sock).expect("connect to the unix door");
    publish_over(unix, &broker);
    // B-175: each connection's line names its door.
    let tcp = broker.wait_log("over-tcp connected");
    assert!(tcp.ends_with("listener=broker.mqtt.listen.tcp"), "{tcp}");
    let unix = broker.wait_log("over-unix connected");
    assert!(unix.ends_with("listener=broker.mqtt.listen.unix"), "{unix}");
}

/// Connects over `unix`, publishes, and checks a TCP subscriber of `broker` hears it.
fn publish_over(mut unix: UnixStream, broker: &Broker) {
    let mut tcp = Raw::connected(broker.addr, V5, "over-tcp");
    tcp.subscribe("door/#", opts(QoS::AtLeastOnce));
    unix.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut out = Vec::new();
    codec::encode(
        &Packet::Connect(Box::new(common::connect(V5, "over-unix", true))),
        V5,
        &mut out,
    );
    codec::encode(
        &Packet::Publish(common::publish(
            "door/unix",
            b"hello",
            QoS::AtMostOnce,
            false,
        )),
        V5,
        &mut out,
    );
    unix.write_all(&out).expect("write");
    let mut head = [0u8; 2];
    unix.read_exact(&mut head).expect("CONNACK");
    assert_eq!(head[0], 0x20);
    let got = tcp.recv_publish();
    assert_eq!((&*got.topic, &*got.payload), ("door/unix", &b"hello"[..]));
}

#[test]
fn a_leftover_socket_is_replaced_and_anything_else_at_the_path_is_refused_untouched_b525_b527() {
    let dir = temp_dir("unix-leftover");
    std::fs::create_dir_all(&dir).expect("dir");
    let sock = dir.join("saguin.sock");
    let yaml = common::config(&format!("      unix:\n        path: {}\n", sock.display()));

    std::fs::write(&sock, b"an operator's file").expect("a regular file");
    let text = common::refused_at_startup(&dir, &yaml);
    assert!(text.contains("is not a socket"), "{text}");
    assert_eq!(
        std::fs::read(&sock).expect("still there"),
        b"an operator's file"
    );
    std::fs::remove_file(&sock).expect("remove");

    drop(std::os::unix::net::UnixListener::bind(&sock).expect("a leftover socket"));
    let broker = Broker::start_in(dir, &yaml);
    let unix = UnixStream::connect(&sock).expect("connect to the unix door");
    publish_over(unix, &broker);
    // B-175: each connection's line names its door.
    let tcp = broker.wait_log("over-tcp connected");
    assert!(tcp.ends_with("listener=broker.mqtt.listen.tcp"), "{tcp}");
    let unix = broker.wait_log("over-unix connected");
    assert!(unix.ends_with("listener=broker.mqtt.listen.unix"), "{unix}");
}

#[test]
fn an_abstract_unix_name_serves_without_a_lock_file_b529() {
    use std::os::linux::net::SocketAddrExt;
    let dir = temp_dir("unix-abstract");
    let name = format!("saguin-test-{}", std::process::id());
    let yaml = common::config(&format!("      unix:\n        path: \"@{name}\"\n"));
    let broker = Broker::start_in(dir.clone(), &yaml);
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
    let unix = UnixStream::connect_addr(&addr).expect("connect to the abstract door");
    publish_over(unix, &broker);
    // Nothing on disk: not in the broker's working directory, which it shares with
    // this test, nor beside its configuration.
    for place in [std::env::current_dir().expect("cwd"), dir] {
        for file in [format!("@{name}"), format!("@{name}.lock")] {
            assert!(
                !place.join(&file).exists(),
                "{}",
                place.join(&file).display()
            );
        }
    }
}

/// B-183, B-185: a host name passes --check-config, so a plain start serves on it.
#[test]
fn a_door_on_a_host_name_is_resolved_at_bind() {
    let yaml = common::config("").replace("127.0.0.1:0", "localhost:0");
    let broker = Broker::start_with(&yaml);
    assert!(broker.addr.ip().is_loopback(), "{}", broker.addr);
    let mut raw = Raw::connected(broker.addr, V5, "by-name");
    assert_eq!(raw.subscribe("x", opts(QoS::AtMostOnce)), [0]);
}

/// B-558: `--check-config --output` prints the resolved document even when a file
/// it names is missing, with the finding on stderr and a non-zero exit.
#[test]
fn check_config_output_prints_the_document_though_a_named_file_is_missing_b558() {
    let dir = temp_dir("output-missing");
    let yaml = common::config(&format!(
        "    password_file: {}/nowhere.passwd\n",
        dir.display()
    ));
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, yaml).expect("write the configuration");
    let out = common::run_saguin(&[
        "--check-config".as_ref(),
        path.as_os_str(),
        "--output".as_ref(),
    ]);
    assert!(!out.status.success());
    let document = String::from_utf8_lossy(&out.stdout);
    assert!(document.contains("broker:"), "{document}");
    let findings = String::from_utf8_lossy(&out.stderr);
    assert!(findings.contains("nowhere.passwd"), "{findings}");
}

/// B-187: a certificate that cannot be read stops the broker naming the door.
#[test]
fn a_tls_door_with_an_unreadable_certificate_is_refused_at_startup_naming_it() {
    let dir = temp_dir("tls-door");
    std::fs::write(dir.join("cert.pem"), "x").expect("cert");
    std::fs::write(dir.join("key.pem"), "x").expect("key");
    let yaml = common::config("").replace(
        "        address: 127.0.0.1:0\n",
        &format!(
            "        address: 127.0.0.1:0\n        tls:\n          cert_file: {0}/cert.pem\n          key_file: {0}/key.pem\n",
            dir.display()
        ),
    );
    let text = common::refused_at_startup(&dir, &yaml);
    assert!(text.contains("broker.mqtt.listen.tcp: cert_file"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_acl_file_that_does_not_load_stops_the_broker_naming_the_file() {
    let dir = temp_dir("acl");
    std::fs::write(dir.join("clients.passwd"), "").expect("password file");
    std::fs::write(dir.join("acl.yaml"), "").expect("acl file");
    let yaml = common::config(&format!(
        "    password_file: {0}/clients.passwd\n    acl_file: {0}/acl.yaml\n",
        dir.display()
    ));
    let text = common::refused_at_startup(&dir, &yaml);
    // An empty acl_file grants nobody anything and says so, naming itself.
    assert!(text.contains("acl.yaml:"), "{text}");
    assert!(text.contains("users: is missing"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A bridge the broker would not run: its ca_file holds no certificate (B-210).
/// `{dir}` is replaced by the test's directory, `{ca}` by that file.
const BRIDGED: &str = "broker:
  id: bridged
  storage:
    default: local
    default_retention_period: none
    default_retention_bytes: none
    providers:
      local:
        type: sqlite
        file_path: {dir}/data/saguin.db
      volatile:
        type: memory
        max_bytes: 64MiB
        snapshot_dir: {dir}/snapshots
  retained:
    storage: local
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
channels:
  alerts:
    type: latest
    filter: alerts/#
    storage: volatile
bridges:
  head-office:
    peer: wss://127.0.0.1:1/mqtt
    client_id: vessel-07
    ca_file: {ca}
    topics:
      - filter: alerts/#
        direction: both
";

/// [`BRIDGED`] for `dir`, its ca_file written in a directory of its own.
fn bridged(dir: &std::path::Path) -> String {
    let ca = temp_dir("bridge-ca").join("ca.pem");
    std::fs::write(&ca, "no certificate here\n").expect("ca.pem");
    BRIDGED
        .replace("{dir}", &dir.display().to_string())
        .replace("{ca}", &ca.display().to_string())
}

/// The refusal, naming the bridge and its ca_file at the line the bridge is written on.
fn names_bridges_at_its_line(text: &str, path: &std::path::Path) {
    let line = BRIDGED
        .lines()
        .position(|l| l == "  head-office:")
        .map(|i| i + 1)
        .expect("BRIDGED writes head-office:");
    let at = format!("{}:{line}: bridges.head-office: ca_file", path.display());
    assert!(text.contains(&at), "expected {at:?} in:\n{text}");
}

/// B-185, B-210: a bridge this build cannot run (a ca_file with no certificate) is
/// refused by a plain start and by --check-config (with and without --output) alike,
/// in the same words, naming the key and its line; --route still explains where
/// topics land.
#[test]
fn an_unusable_bridge_is_refused_at_startup_and_by_check_config_alike() {
    let dir = temp_dir("bridge");
    let path = dir.join("saguin.yaml");
    let yaml = bridged(&dir);
    std::fs::write(&path, &yaml).expect("config");
    let started = common::run_saguin(&[std::ffi::OsStr::new("--config"), path.as_os_str()]);
    assert_eq!(started.status.code(), Some(2), "{started:?}");
    let refusal = String::from_utf8_lossy(&started.stderr).to_string();
    names_bridges_at_its_line(&refusal, &path);
    for output in [false, true] {
        let mut args = vec![std::ffi::OsStr::new("--check-config"), path.as_os_str()];
        if output {
            args.push(std::ffi::OsStr::new("--output"));
        }
        let check = common::run_saguin(&args);
        assert_eq!(check.status.code(), Some(2), "--output {output}: {check:?}");
        assert_eq!(
            String::from_utf8_lossy(&check.stderr),
            refusal,
            "--output {output}: the same refusal as the start"
        );
        assert!(
            !String::from_utf8_lossy(&check.stdout).contains(": ok"),
            "{check:?}"
        );
    }
    let route = common::run_saguin(&[
        std::ffi::OsStr::new("--route"),
        path.as_os_str(),
        std::ffi::OsStr::new("alerts/fire"),
    ]);
    assert!(route.status.success(), "{route:?}");
    assert!(
        String::from_utf8_lossy(&route.stdout).contains("alerts"),
        "{route:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// B-185: a start refused for its bridges opens no provider: no sqlite file or its
/// directory, no snapshot directory, no lock, nothing for `$retained`.
#[test]
fn a_start_refused_for_its_bridge_creates_no_provider_file() {
    let dir = temp_dir("bridge-nothing");
    let text = common::refused_at_startup(&dir, &bridged(&dir));
    names_bridges_at_its_line(&text, &dir.join("saguin.yaml"));
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("the test's directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["saguin.yaml"], "only the configuration is there");
    let _ = std::fs::remove_dir_all(dir);
}
