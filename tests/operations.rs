//! What an operator touches (issue 7): /health and /metrics over TCP and the Unix
//! socket, the pid file, SIGUSR1, connect_timeout against a slow-loris, and a flood
//! past max_connections.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Broker, Raw, WAIT, connect, http_get, tcp, temp_dir};
use saguin::codec::{ProtocolVersion::V5, QoS};

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
        if hostile.write_all(&junk).is_err() {
            closed = true;
            break;
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
        first.contains("saguin_channel_info{channel=\"jobs\",type=\"queue\"} 1"),
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
