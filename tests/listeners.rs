//! The MQTT doors: a Unix socket serves MQTT like TCP, its lock refuses a second
//! broker, and what this build cannot serve is refused at startup rather than left
//! silently closed or unchecked.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use common::{Broker, Raw, WAIT, opts, temp_dir};
use saguin::codec::{self, Packet, ProtocolVersion::V5, QoS};

/// two channels with one filter stop the start as the configuration
/// loads, naming both channels, before any door is bound.
#[test]
fn two_channels_with_one_filter_are_refused_before_any_door_opens_a012_a049() {
    let dir = temp_dir("same-filter");
    let sock = dir.join("saguin.sock");
    let yaml = common::config(&format!(
        "      unix:\n        path: {}\nchannels:\n  first:\n    type: append\n    filter: site/#\n  second:\n    type: latest\n    filter: site/#\n",
        sock.display()
    ));
    let text = common::refused_at_startup(&dir, &yaml);
    assert!(
        text.contains("channels.second.filter") && text.contains("as channel first"),
        "{text}"
    );
    assert!(!text.contains("listening on"), "{text}");
    assert!(!sock.exists(), "no door was bound");
}

/// B-524: with nothing at the path and the lock free, the socket is created.
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

/// B-221, B-360: an MQTT Unix door and an operations Unix door that write no `mode`
/// are created 0660.
#[test]
fn unix_sockets_written_without_a_mode_are_0660_b221_b360() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("unix-mode");
    let (mqtt, ops) = (dir.join("m.sock"), dir.join("o.sock"));
    let yaml = common::config(&format!(
        "      unix:\n        path: {}\n  operations:\n    listen:\n      unix:\n        path: {}\n",
        mqtt.display(),
        ops.display()
    ));
    let broker = Broker::start_in(dir, &yaml);
    broker.wait_log(&format!("operations listening on {}", ops.display()));
    for sock in [&mqtt, &ops] {
        let mode = std::fs::metadata(sock)
            .expect("the socket")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o660, "{}: {mode:o}", sock.display());
    }
}

/// B-480, B-481: a configuration with two findings is refused whole, both reported
/// at once, before any door opens: nothing listens, no socket or lock is created.
#[test]
fn an_invalid_configuration_starts_nothing_and_reports_every_finding_b480_b481() {
    let dir = temp_dir("invalid-whole");
    let sock = dir.join("m.sock");
    let yaml = common::config(&format!("      unix:\n        path: {}\n", sock.display())).replace(
        "  log_level: debug\n",
        "  log_level: loud\n  colour: blue\n",
    );
    let text = common::refused_at_startup(&dir, &yaml);
    assert!(text.contains("broker.log_level"), "{text}");
    assert!(text.contains("broker.colour"), "{text}");
    assert!(!text.contains("listening on"), "{text}");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("the test's directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["saguin.yaml"], "no socket, no lock");
}

/// B-552: a plain start names every unreadable file (a password file, a certificate
/// and its key) in one message.
#[test]
fn a_start_reports_every_unreadable_named_file_at_once_b552() {
    let dir = temp_dir("unreadable-all");
    let yaml = common::config(&format!(
        "    password_file: {0}/nowhere.passwd\n",
        dir.display()
    ))
    .replace(
        "        address: 127.0.0.1:0\n",
        &format!(
            "        address: 127.0.0.1:0\n        tls:\n          cert_file: {0}/no-cert.pem\n          key_file: {0}/no-key.pem\n",
            dir.display()
        ),
    );
    let text = common::refused_at_startup(&dir, &yaml);
    for file in ["nowhere.passwd", "no-cert.pem", "no-key.pem"] {
        assert!(text.contains(file), "{file} not in:\n{text}");
    }
    assert_eq!(
        text.matches("configuration is invalid").count(),
        1,
        "one message:\n{text}"
    );
}

/// B-549: `--check-config` on a file naming a sqlite provider, a snapshot directory,
/// an MQTT and an operations Unix socket and a pid file creates none of them and
/// exits 0; the same file with one finding exits non-zero.
#[test]
fn check_config_creates_nothing_and_fails_on_a_finding_b549() {
    let dir = temp_dir("check-nothing");
    let yaml = common::CHANNELS
        .replace("{dir}", &dir.display().to_string())
        .replace(
            "  log_level: debug\n",
            &format!(
                "  log_level: debug\n  pid_file: {0}/saguin.pid\n  operations:\n    listen:\n      unix:\n        path: {0}/o.sock\n",
                dir.display()
            ),
        )
        .replace(
            "        address: 127.0.0.1:0\n",
            &format!(
                "        address: 127.0.0.1:0\n      unix:\n        path: {}/m.sock\n",
                dir.display()
            ),
        );
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, &yaml).expect("write the configuration");
    let out = common::run_saguin(&["--check-config".as_ref(), path.as_os_str()]);
    assert!(out.status.success(), "{out:?}");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("the test's directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["saguin.yaml"], "--check-config created something");
    std::fs::write(
        &path,
        yaml.replace("  log_level: debug\n", "  log_level: loud\n"),
    )
    .expect("write the configuration");
    let out = common::run_saguin(&["--check-config".as_ref(), path.as_os_str()]);
    assert!(!out.status.success(), "{out:?}");
}

/// B-548: with no `--config` the broker refuses to start, though the working
/// directory holds a valid `saguin.yaml`.
#[test]
fn no_config_option_is_refused_whatever_the_working_directory_holds_b548() {
    let dir = temp_dir("no-config");
    std::fs::write(dir.join("saguin.yaml"), common::config("")).expect("a valid file");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
        .current_dir(&dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run saguin");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx.recv_timeout(WAIT).unwrap_or_else(|_| {
        let _ = std::process::Command::new("kill")
            .arg("-KILL")
            .arg(pid.to_string())
            .status();
        panic!("saguin started without --config");
    });
    let out = out.expect("its output");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--config"),
        "{out:?}"
    );
}

/// B-555: `--output` beside `--config` (without `--check-config`) is refused; the
/// broker does not start.
#[test]
fn output_without_check_config_is_refused_b555() {
    let dir = temp_dir("output-alone");
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, common::config("")).expect("a valid file");
    let out = common::run_saguin(&["--config".as_ref(), path.as_os_str(), "--output".as_ref()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--output"),
        "{out:?}"
    );
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

/// B-516: a door with no host is on every interface, IPv6 as well as IPv4, as
/// `net.Listen` and mosquitto read it; an IPv4 peer is named as such, not as
/// `::ffff:127.0.0.1`.
#[test]
fn a_door_with_no_host_takes_ipv4_and_ipv6_peers_b516() {
    let yaml = common::config("    allow_anonymous: true\n").replace("127.0.0.1:0", ":0");
    let broker = Broker::start_with(&yaml);
    let port = broker.addr.port();
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut raw = Raw::connected(v4, V5, "over-v4");
    assert_eq!(raw.subscribe("x", opts(QoS::AtMostOnce)), [0]);
    let line = broker.wait_log("over-v4 connected");
    assert!(line.contains("] 127.0.0.1:"), "{line}");
    // A machine whose loopback has no IPv6 address cannot show the other half.
    let loopback_v6 = std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|t| {
        t.lines()
            .any(|l| l.starts_with("00000000000000000000000000000001"))
    });
    if loopback_v6 {
        let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
        let mut raw = Raw::connected(v6, V5, "over-v6");
        assert_eq!(raw.subscribe("x", opts(QoS::AtMostOnce)), [0]);
    }
}
