//! What an operator touches (issue 7): /health and /metrics over TCP and the Unix
//! socket, the pid file, SIGUSR1, connect_timeout against a slow-loris, and a flood
//! past max_connections.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Broker, Raw, WAIT, connect, http_get, tcp, temp_dir};
use saguin::codec::{ProtocolVersion::V5, QoS};

/// B-355: broker.operations serves /health and /metrics (tcp and unix doors).
#[test]
fn health_and_metrics_answer_over_tcp_and_the_unix_socket() {
    let dir = temp_dir("ops");
    let sock = dir.join("ops.sock");
    let yaml = common::config(&format!(
        "  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n      unix:\n        path: {}\n",
        sock.display()
    ));
    let broker = Broker::start_in(dir, &yaml);
    let addr = broker.ops_addr();
    let _client = Raw::connected(broker.addr, V5, "counted");
    let (status, body) = http_get(tcp(&addr), "/health");
    assert_eq!(status, 200);
    assert!(body.contains("\"status\":\"ok\""), "{body}");
    let (status, body) = http_get(tcp(&addr), "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("saguin_build_info{version=\""), "{body}");
    assert!(body.contains("broker_id=\"test\""), "{body}");
    assert!(body.contains("saguin_connections 1"), "{body}");
    assert!(
        body.contains("saguin_process_resident_memory_bytes"),
        "{body}"
    );
    let (status, _) = http_get(tcp(&addr), "/nope");
    assert_eq!(status, 404);
    let unix = UnixStream::connect(&sock).expect("connect to the unix socket");
    unix.set_read_timeout(Some(WAIT)).expect("timeout");
    let (status, body) = http_get(unix, "/health");
    assert_eq!((status, body.contains("ok")), (200, true));
}

/// B-528: at a stop the operations Unix socket is removed and its lock file kept,
/// as the MQTT doors' are; it was left behind.
#[test]
fn the_operations_socket_is_removed_at_a_stop_and_its_lock_kept_b528() {
    let dir = temp_dir("ops-stop");
    let sock = dir.join("ops.sock");
    let yaml = common::config(&format!(
        "  operations:\n    listen:\n      unix:\n        path: {}\n",
        sock.display()
    ));
    let broker = Broker::start_in(dir, &yaml);
    broker.wait_log("operations listening on");
    assert!(sock.exists());
    let dir = broker.stop();
    assert!(!sock.exists(), "the socket is left behind");
    assert!(dir.join("ops.sock.lock").exists(), "the lock file stays");
}

/// Sockets holding every place of one operations door (32, each sending nothing for
/// up to 5 s) do not starve another door: the local socket still answers /health.
#[test]
fn one_doors_idle_sockets_do_not_starve_another_door() {
    let dir = temp_dir("ops-starve");
    let sock = dir.join("ops.sock");
    let yaml = common::config(&format!(
        "  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n      unix:\n        path: {}\n",
        sock.display()
    ));
    let broker = Broker::start_in(dir, &yaml);
    let addr = broker.ops_addr();
    let idle: Vec<_> = (0..40).map(|_| tcp(&addr)).collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let unix = UnixStream::connect(&sock).expect("connect to the unix socket");
    unix.set_read_timeout(Some(WAIT)).expect("timeout");
    let (status, body) = http_get(unix, "/health");
    assert_eq!((status, body.contains("ok")), (200, true));
    drop(idle);
}

/// B-526: a socket whose lock is held refuses the start, naming the lock.
#[test]
fn a_second_broker_on_the_same_operations_socket_is_refused_naming_the_lock() {
    let dir = temp_dir("ops-lock");
    let sock = dir.join("ops.sock");
    let ops = format!(
        "  operations:\n    listen:\n      unix:\n        path: {}\n",
        sock.display()
    );
    let _first = Broker::start_in(dir.clone(), &common::config(&ops));
    let second_dir = temp_dir("ops-lock-2");
    let text = common::refused_at_startup(&second_dir, &common::config(&ops));
    assert!(text.contains("ops.sock.lock"), "{text}");
}

/// B-034: the pid file is written after the handlers are installed - a SIGUSR1 sent
/// the moment it appears does not kill the broker (its default disposition would)
/// - and removed at a clean stop.
#[test]
fn a_signal_sent_as_soon_as_the_pid_file_appears_is_handled_b034() {
    let dir = temp_dir("pid-race");
    let pid_file = dir.join("saguin.pid");
    let yaml = common::config("").replace(
        "  id: test\n",
        &format!("  id: test\n  pid_file: {}\n", pid_file.display()),
    );
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, yaml).expect("config");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("--config")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start saguin");
    let pid = child.id();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{name}");
    };
    let started = Instant::now();
    while !pid_file.exists() {
        assert!(started.elapsed() < WAIT, "no pid file within {WAIT:?}");
        assert!(child.try_wait().expect("try_wait").is_none(), "exited");
        std::thread::sleep(Duration::from_micros(200));
    }
    signal("USR1");
    std::thread::sleep(Duration::from_millis(300));
    let alive = child.try_wait().expect("try_wait").is_none();
    if !alive {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(
        alive,
        "SIGUSR1 at the pid file's appearance ended the broker"
    );
    signal("TERM");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(!pid_file.exists(), "removed at a clean stop");
    let _ = std::fs::remove_dir_all(&dir);
}

/// B-034: written, and removed on a clean stop.
#[test]
fn the_pid_file_is_written_and_removed_on_a_clean_stop() {
    let dir = temp_dir("pid");
    let pid_file = dir.join("saguin.pid");
    let yaml = common::config("").replace(
        "  id: test\n",
        &format!("  id: test\n  pid_file: {}\n", pid_file.display()),
    );
    let broker = Broker::start_in(dir, &yaml);
    let written = std::fs::read_to_string(&pid_file).expect("the pid file");
    assert_eq!(written.trim(), broker.pid().to_string());
    let dir = broker.stop();
    assert!(!dir.join("saguin.pid").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// B-033: a pid file that cannot be written stops the broker, naming it.
#[test]
fn a_pid_file_that_cannot_be_written_stops_the_broker_b033() {
    let dir = temp_dir("pid-missing");
    let pid_file = dir.join("no-such-dir").join("saguin.pid");
    let yaml = common::config("").replace(
        "  id: test\n",
        &format!("  id: test\n  pid_file: {}\n", pid_file.display()),
    );
    let text = common::refused_at_startup(&dir, &yaml);
    assert!(text.contains("saguin.pid"), "{text}");
}

/// B-028, B-030: SIGUSR1 re-reads log_level; a file that does not parse changes
/// nothing and the broker serves on.
/// B-029: the line says the level moved from and to, and what is startup-only.
#[test]
fn sigusr1_rereads_the_log_level_and_says_what_changed() {
    let dir = temp_dir("usr1");
    let yaml = common::config("").replace("log_level: debug", "log_level: info");
    let broker = Broker::start_in(dir.clone(), &yaml);
    std::fs::write(
        dir.join("saguin.yaml"),
        yaml.replace("log_level: info", "log_level: debug"),
    )
    .expect("edit");
    broker.signal("USR1");
    let line = broker.wait_log("SIGUSR1");
    assert!(
        line.contains("info -> debug") && line.contains("startup only"),
        "{line}"
    );
    std::fs::write(dir.join("saguin.yaml"), "broker: [unfinished").expect("edit");
    broker.signal("USR1");
    broker.wait_log("nothing changed");
    let mut raw = Raw::connected(broker.addr, V5, "still-serving");
    assert_eq!(raw.publish("t", b"x", QoS::AtLeastOnce, false), Some(0));
}

/// B-020: at `error` the broker logs only what stopped working: connects,
/// disconnects and refusals given to clients write nothing.
#[test]
fn at_error_connects_and_refusals_log_nothing_b020() {
    let dir = temp_dir("at-error");
    let yaml = common::config("").replace("log_level: debug", "log_level: info");
    let broker = Broker::start_in(dir.clone(), &yaml);
    let marker = Raw::connected(broker.addr, V5, "marker");
    broker.wait_log("marker connected");
    let edit = |level: &str| {
        std::fs::write(
            dir.join("saguin.yaml"),
            yaml.replace("log_level: info", &format!("log_level: {level}")),
        )
        .expect("edit");
        broker.signal("USR1");
    };
    edit("error");
    // B-029: the change is said before it silences warnings.
    broker.wait_log("SIGUSR1: log_level info -> error");
    marker.disconnect();
    let mut refused = connect(V5, "", false);
    refused.clean_start = false;
    assert_eq!(Raw::handshake(broker.addr, refused).1.code, 0x85);
    let mut raw = Raw::connected(broker.addr, V5, "quiet");
    assert_eq!(
        raw.publish("$SYS/x", b"x", QoS::AtLeastOnce, false),
        Some(0x87)
    );
    assert_eq!(raw.publish("t", b"x", QoS::AtLeastOnce, false), Some(0));
    assert_eq!(
        raw.subscribe("$SYS/#", common::opts(QoS::AtMostOnce)),
        [0x87]
    );
    raw.disconnect();
    edit("info");
    let lines = broker.wait_log_lines("SIGUSR1: log_level error -> info");
    assert_eq!(lines.len(), 1, "logged at error:\n{}", lines.join("\n"));
}

/// B-014: SIGUSR1 applies a file whose channels, listener address and storage
/// changed, and none of them changes: the old door serves, the channel keeps its
/// records.
#[test]
fn sigusr1_never_changes_channels_addresses_or_storage_b014() {
    let dir = temp_dir("usr1-startup-only");
    let yaml = common::config("channels:\n  events:\n    type: append\n")
        .replace("log_level: debug", "log_level: info");
    let broker = Broker::start_in(dir.clone(), &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "before");
    assert_eq!(
        publisher.publish("events/1", b"kept", QoS::AtLeastOnce, false),
        Some(0)
    );
    let edited = yaml
        .replace("channels:\n  events:\n    type: append\n", "")
        .replace("address: 127.0.0.1:0", "address: 127.0.0.1:1")
        .replace("max_bytes: 64MiB", "max_bytes: 32MiB")
        .replace("log_level: info", "log_level: debug");
    assert!(!edited.contains("channels:"), "{edited}");
    std::fs::write(dir.join("saguin.yaml"), edited).expect("edit");
    broker.signal("USR1");
    let line = broker.wait_log("SIGUSR1: log_level");
    assert!(
        line.contains("info -> debug"),
        "the edited file was read: {line}"
    );
    // The door the broker started with still serves, and events/ is still a channel:
    // a new subscriber is replayed the record it stored.
    let mut reader = Raw::connected(broker.addr, V5, "after");
    assert_eq!(
        reader.subscribe("events/#", common::opts(QoS::AtLeastOnce)),
        [1]
    );
    let p = reader.recv_publish();
    assert_eq!(&*p.topic, "events/1");
    assert_eq!(&p.payload[..], b"kept");
}

/// B-022: at info the broker logs its start, its listeners, connects and
/// disconnects, and not one line per record.
#[test]
fn at_info_connects_are_logged_and_records_are_not_b022() {
    let yaml = common::config("channels:\n  events:\n    type: append\n")
        .replace("log_level: debug", "log_level: info");
    let broker = Broker::start_with(&yaml);
    let startup = broker.startup.join("\n");
    assert!(startup.contains("starting as test"), "{startup}");
    assert!(startup.contains(" INFO  test] listening on "), "{startup}");
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    for filter in ["events/#", "b/#"] {
        assert_eq!(
            reader.subscribe(filter, common::opts(QoS::AtLeastOnce)),
            [1]
        );
    }
    let mut publisher = Raw::connected(broker.addr, V5, "writer");
    for i in 0..20 {
        for topic in ["events/x", "b/x"] {
            let payload = format!("{i}");
            assert_eq!(
                publisher.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, false),
                Some(0)
            );
            reader.recv_publish();
        }
    }
    publisher.disconnect();
    reader.disconnect();
    let lines = broker.wait_log_lines("reader disconnected");
    let all = lines.join("\n");
    assert!(
        startup.contains("retention: ") || all.contains("retention: "),
        "the retention sweeps' schedule:\n{startup}\n{all}"
    );
    for said in [
        "reader connected",
        "writer connected",
        "writer disconnected",
    ] {
        assert!(all.contains(said), "{said:?} not in:\n{all}");
    }
    assert!(
        lines.len() < 10 && !all.contains("events/x") && !all.contains("b/x"),
        "40 records went through:\n{all}"
    );
}

/// B-063: after the CONNECT, keepalive governs and connect_timeout no longer does.
#[test]
fn after_connect_the_keepalive_governs_not_connect_timeout_b063() {
    let broker = Broker::start("  limits:\n    connect_timeout: 1s\n");
    let mut c = connect(V5, "quiet", true);
    c.keep_alive = 30;
    let (mut raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0);
    std::thread::sleep(Duration::from_millis(2500));
    raw.send(&saguin::codec::Packet::PingReq);
    assert!(matches!(raw.recv(), saguin::codec::Packet::PingResp));
}

/// B-063: a socket with no CONNECT is closed at connect_timeout, nothing written.
#[test]
fn a_socket_that_never_sends_connect_is_closed_at_connect_timeout() {
    let broker = Broker::start("  limits:\n    connect_timeout: 1s\n");
    let mut silent = TcpStream::connect(broker.addr).expect("connect");
    silent.set_read_timeout(Some(WAIT)).expect("timeout");
    let started = Instant::now();
    let mut other = Raw::connected(broker.addr, V5, "unaffected");
    assert_eq!(other.publish("t", b"x", QoS::AtLeastOnce, false), Some(0));
    let mut buf = [0u8; 8];
    let n = silent.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed with nothing written");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[test]
fn a_flood_past_max_connections_is_told_server_busy_and_the_admitted_keep_working() {
    let broker = Broker::start("  limits:\n    max_connections: 4\n");
    let mut admitted: Vec<Raw> = (0..4)
        .map(|i| Raw::connected(broker.addr, V5, &format!("in-{i}")))
        .collect();
    let (_busy, ack) = Raw::handshake(broker.addr, connect(V5, "one-too-many", true));
    assert_eq!(ack.code, 0x89);
    // Far past the budget: closed at once, nothing written.
    let flood: Vec<TcpStream> = (0..40)
        .filter_map(|_| TcpStream::connect(broker.addr).ok())
        .collect();
    assert_eq!(
        admitted[0].publish("still", b"up", QoS::AtLeastOnce, false),
        Some(0)
    );
    drop(flood);
    admitted.truncate(1);
}

/// B-052: a socket past the limit that sends a CONNECT's first byte and then no
/// readable length, without end, is closed; it cannot keep the refusal reading.
#[test]
fn a_socket_past_max_connections_streaming_an_unreadable_connect_is_closed() {
    let broker = Broker::start("  limits:\n    max_connections: 1\n");
    let mut admitted = Raw::connected(broker.addr, V5, "in");
    let mut hostile = TcpStream::connect(broker.addr).expect("connect");
    hostile
        .set_write_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let junk = [0xFF; 4096];
    let mut closed = false;
    // 0x10 and a Remaining Length that never ends: at most 64 MiB are offered.
    let _ = hostile.write_all(&[0x10]);
    for _ in 0..16 * 1024 {
        match hostile.write_all(&junk) {
            Ok(()) => {}
            // A broker that stops reading without closing is not one that closed.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("the broker stopped reading the socket but did not close it")
            }
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    assert!(
        closed,
        "the broker kept reading 64 MiB of an unreadable CONNECT"
    );
    assert_eq!(
        admitted.publish("still", b"up", QoS::AtLeastOnce, false),
        Some(0)
    );
}

/// B-366: a scrape sooner than min_scrape_interval gets the previous answer.
#[test]
fn metrics_report_channels_and_refusals_and_a_sooner_scrape_gets_the_previous_answer() {
    let dir = temp_dir("ops-channels");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let yaml = common::CHANNELS.replace(
        "  log_level: debug\n",
        "  log_level: debug\n  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n",
    );
    let broker = Broker::start_in(dir, &yaml);
    let addr = broker.ops_addr();
    let mut raw = Raw::connected(broker.addr, V5, "metered");
    assert_eq!(
        raw.publish("events/one", b"x", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        raw.publish("$SYS/x", b"x", QoS::AtLeastOnce, false),
        Some(0x87)
    );
    assert_eq!(
        raw.subscribe("work/+/todo", common::opts(QoS::AtLeastOnce)),
        [0x8F]
    );
    let (_, first) = http_get(tcp(&addr), "/metrics");
    assert!(
        first.contains("saguin_channel_records{channel=\"events\"} 1"),
        "{first}"
    );
    assert!(
        first.contains(
            "saguin_channel_info{channel=\"jobs\",type=\"queue\",filter=\"work/+/todo\"} 1"
        ),
        "{first}"
    );
    assert!(
        first.contains("saguin_subscriptions_refused_total{code=\"0x8F\"} 1"),
        "{first}"
    );
    assert!(
        first.contains("saguin_provider_bytes_used{provider=\"local\"}"),
        "{first}"
    );
    assert!(
        first.contains("saguin_provider_bytes_max{provider=\"volatile\"} 67108864"),
        "{first}"
    );
    assert_eq!(
        raw.publish("events/two", b"y", QoS::AtLeastOnce, false),
        Some(0)
    );
    let (_, second) = http_get(tcp(&addr), "/metrics");
    assert_eq!(
        first, second,
        "within min_scrape_interval the previous answer is served"
    );
}

#[test]
fn health_is_503_naming_the_provider_while_a_provider_cannot_write() {
    // Issue 7: 200 while every provider is writable, 503 with the reason otherwise.
    let dir = temp_dir("ops-health");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let yaml = common::CHANNELS.replace(
        "  log_level: debug\n",
        "  log_level: debug\n  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n",
    );
    let broker = Broker::start_in(dir.clone(), &yaml);
    let addr = broker.ops_addr();
    let (status, body) = http_get(tcp(&addr), "/health");
    assert_eq!(status, 200, "{body}");

    // The memory provider's snapshot directory disappears: its shutdown snapshot
    // has nowhere to go.
    std::fs::remove_dir_all(dir.join("snapshots")).expect("remove the snapshot dir");
    let (status, body) = http_get(tcp(&addr), "/health");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"status\":\"unavailable\""), "{body}");
    assert!(
        body.contains("storage provider volatile") && body.contains("snapshots"),
        "{body}"
    );
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir again");
    let (status, body) = http_get(tcp(&addr), "/health");
    assert_eq!(status, 200, "healthy again once it can write: {body}");

    // The sqlite file is deleted under the running broker.
    std::fs::remove_file(dir.join("saguin.db")).expect("remove the database");
    let (status, body) = http_get(tcp(&addr), "/health");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("storage provider local") && body.contains("saguin.db is gone"),
        "{body}"
    );
    // Broadcast goes on meanwhile: only what needs the provider is affected.
    let mut raw = Raw::connected(broker.addr, V5, "unharmed");
    assert_eq!(
        raw.publish("plain/topic", b"x", QoS::AtLeastOnce, false),
        Some(0)
    );
}

fn ops_broker(name: &str) -> (Broker, String) {
    let dir = temp_dir(name);
    let yaml =
        common::config("  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n");
    let broker = Broker::start_in(dir, &yaml);
    let addr = broker.ops_addr();
    (broker, addr)
}

/// B-359: with no broker.operations block no operations door opens: none is
/// announced before the first client is served, and nothing is at a socket path.
#[test]
fn no_operations_block_opens_no_operations_listener_b359() {
    let dir = temp_dir("ops-none");
    let broker = Broker::start_in(dir.clone(), &common::config(""));
    assert!(
        !broker.startup.iter().any(|l| l.contains("operations")),
        "{:?}",
        broker.startup
    );
    let _probe = Raw::connected(broker.addr, V5, "ops-probe");
    let lines = broker.wait_log_lines("ops-probe connected");
    assert!(
        !lines.iter().any(|l| l.contains("operations listening")),
        "{lines:?}"
    );
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("the broker's directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["saguin.yaml"]);
}

/// C-197 (gaps §4): `/v1/operations/subscriptions?client=` lists a session's
/// subscriptions with their options and their one partition space each: the slice a
/// `saguin-filter` declared, or count 1, index 0 for a subscription that declared none.
#[test]
fn the_operations_listener_reports_each_subscriptions_partition_space_c197() {
    let (broker, addr) = ops_broker("ops-subscriptions");
    let mut c = Raw::connected(broker.addr, V5, "dev/7 a");
    let sliced = saguin::codec::Properties::from(saguin::codec::PropertyValues {
        user_properties: vec![
            ("saguin-filter".into(), "topic_hash(4, 1)".into()),
            ("saguin-filter".into(), "topic_hash(4, 3)".into()),
        ],
        subscription_identifiers: vec![9],
        ..Default::default()
    });
    assert_eq!(
        c.subscribe_with("fleet/+/temp", common::opts(QoS::AtLeastOnce), sliced),
        [1]
    );
    assert_eq!(c.subscribe("alerts/#", common::opts(QoS::AtMostOnce)), [0]);

    let (status, body) = http_get(tcp(&addr), "/v1/operations/subscriptions?client=dev%2F7+a");
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(answer["client"], "dev/7 a");
    assert_eq!(answer["connected"], true);
    let subs = answer["subscriptions"].as_array().expect("a list");
    assert_eq!(subs.len(), 2, "{body}");
    assert_eq!(subs[0]["filter"], "alerts/#");
    assert_eq!(subs[0]["qos"], 0);
    assert_eq!(
        subs[0]["partitions"],
        serde_json::json!({"count": 1, "indices": [0]})
    );
    assert_eq!(subs[1]["filter"], "fleet/+/temp");
    assert_eq!(subs[1]["qos"], 1);
    assert_eq!(subs[1]["identifier"], 9);
    assert_eq!(
        subs[1]["partitions"],
        serde_json::json!({"count": 4, "indices": [1, 3]})
    );

    let (status, body) = http_get(tcp(&addr), "/v1/operations/subscriptions?client=nobody");
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("no session is held for client id \\\"nobody\\\""),
        "{body}"
    );
    let (status, body) = http_get(tcp(&addr), "/v1/operations/subscriptions");
    assert_eq!(status, 400, "{body}");
    let (status, body) = http_get(tcp(&addr), "/v1/operations/acl?user=alice");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no acl_file is configured"), "{body}");
    // B-175: an anonymous client's session is listed with no user, under its door.
    let (status, body) = http_get(tcp(&addr), "/v1/operations/users");
    assert_eq!(status, 200, "{body}");
    let users: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let session = &users["sessions"][0];
    assert_eq!(session["client"], "dev/7 a", "{body}");
    assert_eq!(session["user"], serde_json::Value::Null, "{body}");
    assert_eq!(session["listener"], "broker.mqtt.listen.tcp", "{body}");
    assert_eq!(session["subscriptions"], 2, "{body}");
}

/// B-175: a durable anonymous session is listed with no user after a crash too: the
/// record its CONNECT stored names nobody, not a user called "".
#[test]
fn a_restored_anonymous_session_is_listed_with_no_user_b175() {
    let yaml = common::CHANNELS.replace(
        "  id: channels-test\n",
        "  id: channels-test\n  session:\n    storage: local\n  operations:\n    listen:\n      \
         tcp:\n        address: 127.0.0.1:0\n",
    );
    let broker = Broker::start_in(temp_dir("ops-users-restored"), &yaml);
    let mut connect = common::connect(V5, "keeper", false);
    connect.properties.edit().session_expiry_interval = Some(600);
    // Still connected when the broker dies: what is restored is the CONNECT's record.
    let (_c, _) = Raw::handshake(broker.addr, connect);
    let broker = Broker::start_in(common::sessions::kill(broker), &yaml);
    let (status, body) = http_get(tcp(&broker.ops_addr()), "/v1/operations/users");
    assert_eq!(status, 200, "{body}");
    let users: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let session = &users["sessions"][0];
    assert_eq!(session["client"], "keeper", "{body}");
    assert_eq!(session["connected"], false, "{body}");
    assert_eq!(session["user"], serde_json::Value::Null, "{body}");
}

/// C-018: a channel's filter is readable from `saguin_channel_info`, so a consumer
/// can check that a schema pointer lies inside a registry's filter; a filter with
/// braces is one series per filter it expands to.
#[test]
fn saguin_channel_info_names_each_channels_filter_c018() {
    let yaml = common::config(
        "  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\nchannels:\n  registry:\n    type: latest\n    filter: iot/+/schemas/#\n  states:\n    type: latest\n    filter: site/+/{state,location,state}\n",
    );
    let broker = Broker::start_with(&yaml);
    // A filter an alternative repeats is one series: a page with two alike is one
    // Prometheus refuses.
    let (_, body) = http_get(broker.ops_socket(), "/metrics");
    let state = "saguin_channel_info{channel=\"states\",type=\"latest\",filter=\"site/+/state\"} 1";
    assert_eq!(body.lines().filter(|l| *l == state).count(), 1, "{body}");
    broker.assert_metric(
        "saguin_channel_info{channel=\"registry\",type=\"latest\",filter=\"iot/+/schemas/#\"} 1",
    );
    broker.assert_metric(
        "saguin_channel_info{channel=\"states\",type=\"latest\",filter=\"site/+/state\"} 1",
    );
    broker.assert_metric(
        "saguin_channel_info{channel=\"states\",type=\"latest\",filter=\"site/+/location\"} 1",
    );
}

/// C-031 (C-028's arithmetic at 30s): the start states both sweep intervals.
#[test]
fn the_start_states_both_sweep_intervals_c031() {
    let broker =
        Broker::start("channels:\n  events:\n    type: append\n    retention_period: 30s\n");
    let line = broker
        .startup
        .iter()
        .find(|l| l.contains("retention: "))
        .cloned()
        .unwrap_or_else(|| broker.wait_log("retention: "));
    assert!(
        line.contains("size sweep every 5s") && line.contains("age sweep every 3s"),
        "{line}"
    );
}
