//! Loading the configuration file: the typed values and their defaults
//! (RFC 0002 "Configuration"; requirement IDs B-… from req-0002b.md).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use saguin::config::{self, Config, ConfigError, LogLevel, ProtocolVersion};

/// A storage block on one line, appended at the broker's indentation so the
/// lines a test names are unchanged (broker.storage is required, B-492).
const STORAGE: &str = "  storage: {default: local, default_retention_period: 3d, default_retention_bytes: none, providers: {local: {type: memory, snapshot_dir: none}}}\n";

fn load(text: &str) -> Result<Config, ConfigError> {
    let only_broker = text
        .lines()
        .all(|l| l.starts_with(' ') || l.starts_with("broker:") || l.is_empty());
    let text = if only_broker && !text.contains("storage:") {
        format!("{text}{STORAGE}")
    } else {
        text.to_string()
    };
    config::from_str(&text, Path::new("saguin.yaml"))
}

fn ok(text: &str) -> Config {
    match load(text) {
        Ok(c) => c,
        Err(e) => panic!("expected a valid configuration, got:\n{e}"),
    }
}

/// Asserts exactly one finding mentions `key`, on `line`, and returns the report.
fn refused(text: &str, key: &str, line: u32) -> String {
    let err = match load(text) {
        Ok(_) => panic!("expected {key} to be refused"),
        Err(e) => e,
    };
    let hits: Vec<_> = err.findings().iter().filter(|f| f.key == key).collect();
    assert!(!hits.is_empty(), "no finding names {key}:\n{err}");
    assert!(
        hits.iter().any(|f| f.line == line),
        "no finding for {key} on line {line}:\n{err}"
    );
    err.to_string()
}

/// B-017: an absent log_level is info.
#[test]
fn b015_minimal_file_loads_from_disk_with_defaults() {
    let c = config::load(Path::new("tests/fixtures/config/minimal.yaml")).unwrap();
    assert_eq!(c.broker.id, "edge-1");
    assert_eq!(c.broker.log_level, LogLevel::Info);
    assert_eq!(c.broker.mqtt.min_protocol_version, ProtocolVersion::V3_1_1);
    assert_eq!(c.broker.pid_file, None);
}

/// B-015: broker.id is required, no default.
#[test]
fn b015_broker_id_is_required() {
    let report = refused("broker:\n  log_level: info\n", "broker.id", 1);
    assert!(report.contains("no default"), "{report}");
}

/// B-018, B-019: the invalid log_level finding, in the report's shape.
#[test]
fn b019_report_shape_names_file_key_value_and_remedy() {
    let err = load("broker:\n  id: edge-1\n  log_level: verbose\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "configuration is invalid:\nsaguin.yaml:\n  - line 3: broker.log_level \"verbose\": it is one of debug, info, warn or error; omit the key for info\n"
    );
}

/// B-017: debug, info, warn and error.
#[test]
fn b020_log_levels() {
    for (w, l) in [
        ("debug", LogLevel::Debug),
        ("info", LogLevel::Info),
        ("warn", LogLevel::Warn),
        ("error", LogLevel::Error),
    ] {
        assert_eq!(
            ok(&format!("broker:\n  id: a\n  log_level: {w}\n"))
                .broker
                .log_level,
            l
        );
    }
}

/// B-002, B-479: a top-level block other than broker, channels, bridges is refused.
#[test]
fn b479_unknown_key_is_a_finding_whatever_its_value() {
    refused("broker:\n  id: a\n  colour: ~\n", "broker.colour", 3);
    refused(
        "broker:\n  id: a\n  limits:\n    max_mesage_size: 1MiB\n",
        "broker.limits.max_mesage_size",
        4,
    );
    refused("broker:\n  id: a\nextra: 1\n", "extra", 3);
}

#[test]
fn key_written_twice_is_refused_naming_both_lines() {
    let report = refused(
        "broker:\n  id: a\n  log_level: info\n  log_level: debug\n",
        "broker.log_level",
        4,
    );
    assert!(report.contains("lines 3 and 4"), "{report}");
}

/// B-480: every finding is reported, not only the first.
#[test]
fn b480_every_finding_is_reported_at_once() {
    let err = load(
        "broker:\n  log_level: loud\n  limits:\n    max_topic_levels: 0\n    write_timeout: 5\n",
    )
    .unwrap_err();
    let keys: Vec<&str> = err.findings().iter().map(|f| f.key.as_str()).collect();
    for k in [
        "broker.id",
        "broker.log_level",
        "broker.limits.max_topic_levels",
        "broker.limits.write_timeout",
    ] {
        assert!(keys.contains(&k), "{k} missing from {keys:?}");
    }
}

#[test]
fn yaml_syntax_error_names_the_line() {
    let err = load("broker:\n  id: a\n  limits: [1, 2\n").unwrap_err();
    assert!(err.findings()[0].line > 0, "{err}");
}

/// B-213, B-217: "3.1.1" or "5", quoted or not; anything else refused.
#[test]
fn b217_min_protocol_version_quoted_or_not() {
    assert_eq!(
        ok("broker:\n  id: a\n  mqtt:\n    min_protocol_version: 5\n")
            .broker
            .mqtt
            .min_protocol_version,
        ProtocolVersion::V5
    );
    assert_eq!(
        ok("broker:\n  id: a\n  mqtt:\n    min_protocol_version: \"5\"\n")
            .broker
            .mqtt
            .min_protocol_version,
        ProtocolVersion::V5
    );
    assert_eq!(
        ok("broker:\n  id: a\n  mqtt:\n    min_protocol_version: 3.1.1\n")
            .broker
            .mqtt
            .min_protocol_version,
        ProtocolVersion::V3_1_1
    );
    refused(
        "broker:\n  id: a\n  mqtt:\n    min_protocol_version: 3.1\n",
        "broker.mqtt.min_protocol_version",
        4,
    );
    refused(
        "broker:\n  id: a\n  mqtt:\n    min_protocol_version: 4\n",
        "broker.mqtt.min_protocol_version",
        4,
    );
}

/// B-516: no MQTT listener named is tcp :1883 on every interface (IPv6 and IPv4).
#[test]
fn b486_no_listener_named_means_tcp_1883() {
    let c = ok("broker:\n  id: a\n");
    let want: SocketAddr = "[::]:1883".parse().unwrap();
    assert_eq!(c.broker.mqtt.plain_tcp_addrs(), vec![want]);
    assert!(c.broker.mqtt.listen.defaulted);
}

/// B-171, B-516, B-221: the unix mapping form is the door named `unix`; naming it
/// turns the :1883 default off; its mode defaults to 0660.
#[test]
fn b486_one_unix_listener_turns_the_default_off() {
    let c = ok(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      unix:\n        path: /run/saguin/s.sock\n",
    );
    assert!(c.broker.mqtt.plain_tcp_addrs().is_empty());
    assert_eq!(c.broker.mqtt.listen.unix[0].mode, 0o660);
    assert_eq!(c.broker.mqtt.listen.unix[0].name, "unix");
}

/// B-005, B-171, B-172: door keys; a mapping is named after its kind, a list by `name`.
#[test]
fn b005_listener_shapes_mapping_and_named_list() {
    let c = ok("broker:
  id: a
  mqtt:
    listen:
      tcp:
        - name: local
          address: 127.0.0.1:1883
          allow_anonymous: true
        - name: fleet
          address: 0.0.0.0:8883
          tls:
            cert_file: /etc/saguin/tls/cert.pem
            key_file: /etc/saguin/tls/key.pem
      ws:
        address: 0.0.0.0:8083
");
    let l = &c.broker.mqtt.listen;
    assert_eq!(l.tcp.len(), 2);
    assert_eq!(l.tcp[1].name, "fleet");
    assert!(l.tcp[1].tls.is_some());
    assert_eq!(l.ws[0].name, "ws");
    assert!(l.ws[0].same_origin);
    // Only the plain door is a plain-TCP MQTT address.
    assert_eq!(
        c.broker.mqtt.plain_tcp_addrs(),
        vec!["127.0.0.1:1883".parse::<SocketAddr>().unwrap()]
    );
}

#[test]
fn b168_listener_without_address_or_path_is_refused() {
    refused(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        allow_anonymous: true\n",
        "broker.mqtt.listen.tcp.address",
        5,
    );
    refused(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      unix:\n        mode: \"0600\"\n",
        "broker.mqtt.listen.unix.path",
        5,
    );
}

#[test]
fn b170_two_doors_one_name_are_refused() {
    refused(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        - name: x\n          address: :1\n        - name: x\n          address: :2\n",
        "broker.mqtt.listen.tcp[1]",
        8,
    );
}

#[test]
fn a_one_entry_list_without_a_name_is_named_after_its_kind_b172() {
    let c = ok(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        - address: 127.0.0.1:1883\n      unix:\n        - path: /run/saguin/s.sock\n",
    );
    assert_eq!(c.broker.mqtt.listen.tcp[0].name, "tcp");
    assert_eq!(c.broker.mqtt.listen.unix[0].name, "unix");
}

/// B-176: a nameless door among several is refused quoting the doors concerned (RFC
/// 0002: "by name with both doors quoted").
#[test]
fn a_nameless_door_among_several_is_refused_quoting_both_b176() {
    let report = refused(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        - address: 127.0.0.1:1883\n        - name: fleet\n          address: 127.0.0.1:1884\n",
        "broker.mqtt.listen.tcp[0]",
        6,
    );
    assert!(report.contains("fleet"), "{report}");
}

/// B-178: door names are unique among the MQTT doors and among the operations doors
/// separately: an MQTT door and an operations door may share one, two operations
/// doors may not.
#[test]
fn door_names_are_unique_per_listener_not_across_them_b178() {
    let c = ok("broker:
  id: a
  mqtt:
    listen:
      tcp:
        - name: main
          address: 127.0.0.1:1883
        - name: spare
          address: 127.0.0.1:1884
  operations:
    listen:
      tcp:
        - name: main
          address: 127.0.0.1:9090
        - name: spare
          address: 127.0.0.1:9091
");
    let ops = c.broker.operations.as_ref().expect("the operations block");
    assert_eq!(c.broker.mqtt.listen.tcp[0].name, "main");
    assert_eq!(ops.listen.tcp[0].name, "main");
    let report = refused(
        "broker:\n  id: a\n  operations:\n    listen:\n      tcp:\n        - name: unix\n          address: 127.0.0.1:9090\n        - name: b\n          address: 127.0.0.1:9091\n      unix:\n        path: /run/o.sock\n",
        "broker.operations.listen.unix",
        10,
    );
    assert!(report.contains("unix"), "{report}");
}

/// B-181: hosts compare as addresses and Unix paths cleaned; a host name is not
/// resolved, so `localhost` and `127.0.0.1` on one port pass the check.
#[test]
fn doors_compare_addresses_and_cleaned_paths_but_resolve_no_name_b181() {
    refused(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:1883\n      ws:\n        address: \"[::ffff:127.0.0.1]:1883\"\n",
        "broker.mqtt.listen.ws.address",
        8,
    );
    refused(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      unix:\n        path: /x/r.sock\n  operations:\n    listen:\n      unix:\n        path: /x/./r.sock\n",
        "broker.operations.listen.unix.path",
        10,
    );
    ok(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        address: localhost:1883\n      ws:\n        address: 127.0.0.1:1883\n",
    );
}

/// B-182: a port with leading zeros or a `+` is its number, and ports compare as
/// numbers; a service name is read from /etc/services where it lists one.
#[test]
fn ports_read_as_numbers_and_compare_numerically_b182() {
    let c = ok(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:032010\n      ws:\n        address: \"127.0.0.1:+32011\"\n",
    );
    assert_eq!(c.broker.mqtt.listen.tcp[0].address.port, 32010);
    assert_eq!(c.broker.mqtt.listen.ws[0].address.port, 32011);
    refused(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        address: \"127.0.0.1:+1883\"\n      ws:\n        address: 127.0.0.1:01883\n",
        "broker.mqtt.listen.ws.address",
        8,
    );
    refused(
        "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:65536\n",
        "broker.mqtt.listen.tcp.address",
        6,
    );
    let services = std::fs::read_to_string("/etc/services").unwrap_or_default();
    let lists_http = services.lines().any(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some("http") && words.next() == Some("80/tcp")
    });
    if lists_http {
        let c = ok(
            "broker:\n  id: a\n  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:http\n",
        );
        assert_eq!(c.broker.mqtt.listen.tcp[0].address.port, 80);
    }
}

/// B-008, B-046, B-064, B-069, B-070, B-073, B-079, B-092, B-099: the limits' defaults.
/// max_client_id_length 256, max_session_expiry 30d.
#[test]
fn b008_limits_defaults() {
    let l = ok("broker:\n  id: a\n").broker.limits;
    assert_eq!(l.max_message_size, 1 << 20);
    assert_eq!(l.max_connect_size, 100 * 1024);
    assert_eq!(l.max_client_id_length, 256);
    assert_eq!(l.max_session_expiry, Duration::from_secs(30 * 86400));
    assert_eq!(l.max_topic_length, 1024);
    assert_eq!(l.max_topic_levels, 200);
    assert_eq!(l.max_keepalive, None);
    assert_eq!(l.max_connections, 10_000);
    assert_eq!(l.session_queue_bytes, 1 << 20);
    assert_eq!(l.write_timeout, Some(Duration::from_secs(5)));
    assert_eq!(l.connect_timeout, Duration::from_secs(10));
    assert_eq!(l.max_subscriptions, 10_000);
    assert_eq!(l.max_header_count, 32);
    assert_eq!(l.max_header_bytes, 8 * 1024);
    assert_eq!(l.publish_rate, None);
    assert_eq!(l.publish_bytes, None);
    assert_eq!(l.max_connect_rate, Some(500));
}

/// B-008, B-013: every limits key, sizes and durations with their units.
#[test]
fn b008_limits_spec_example_reads() {
    let l = ok("broker:
  id: a
  limits:
    max_message_size: 1MiB
    max_topic_length: 1024
    max_client_id_length: 256
    max_header_count: 32
    max_header_bytes: 8KiB
    max_connections: 10000
    max_subscriptions: 10000
    max_topic_levels: 200
    max_session_expiry: 30d
    max_keepalive: none
    publish_rate: 200
    publish_bytes: 128KiB
    write_timeout: 5s
    connect_timeout: 10s
    max_connect_size: 100KiB
    max_connect_rate: 500
    session_queue_bytes: 1MiB
")
    .broker
    .limits;
    assert_eq!(l.publish_rate, Some(200));
    assert_eq!(l.publish_bytes, Some(128 * 1024));
}

/// B-069: max_connect_size's default and ceiling.
#[test]
fn b069_max_connect_size_defaults_to_max_message_size_when_smaller_and_never_exceeds_it() {
    let l = ok("broker:\n  id: a\n  limits:\n    max_message_size: 64KiB\n")
        .broker
        .limits;
    assert_eq!(l.max_connect_size, 64 * 1024);
    refused(
        "broker:\n  id: a\n  limits:\n    max_message_size: 64KiB\n    max_connect_size: 100KiB\n",
        "broker.limits.max_connect_size",
        5,
    );
}

/// B-079, B-090: session_queue_bytes' default and floor.
#[test]
fn b079_b090_session_queue_bytes_default_and_floor() {
    let l = ok("broker:\n  id: a\n  limits:\n    max_message_size: 4MiB\n")
        .broker
        .limits;
    assert_eq!(l.session_queue_bytes, 4 << 20);
    refused(
        "broker:\n  id: a\n  limits:\n    session_queue_bytes: none\n",
        "broker.limits.session_queue_bytes",
        4,
    );
    refused(
        "broker:\n  id: a\n  limits:\n    session_queue_bytes: 512KiB\n",
        "broker.limits.session_queue_bytes",
        4,
    );
}

/// below 23 refused, 23 accepted.
#[test]
fn a033_client_id_length_below_23_is_refused() {
    refused(
        "broker:\n  id: a\n  limits:\n    max_client_id_length: 22\n",
        "broker.limits.max_client_id_length",
        4,
    );
    assert_eq!(
        ok("broker:\n  id: a\n  limits:\n    max_client_id_length: 23\n")
            .broker
            .limits
            .max_client_id_length,
        23
    );
}

/// `none` refused for max_session_expiry.
#[test]
fn a035_max_session_expiry_refuses_none() {
    refused(
        "broker:\n  id: a\n  limits:\n    max_session_expiry: none\n",
        "broker.limits.max_session_expiry",
        4,
    );
    // 2^32-1 seconds is MQTT's "never" by another name.
    refused(
        "broker:\n  id: a\n  limits:\n    max_session_expiry: 4294967295s\n",
        "broker.limits.max_session_expiry",
        4,
    );
}

/// B-073, B-077: max_keepalive is a duration; past 65535 s refused, not truncated.
/// B-078: the over-range finding's exact wording.
#[test]
fn b078_max_keepalive_over_65535_seconds_reads_as_the_spec_says() {
    let report = refused(
        "broker:\n  id: a\n  limits:\n    max_keepalive: 20h\n",
        "broker.limits.max_keepalive",
        4,
    );
    assert!(
        report.contains("broker.limits.max_keepalive \"20h\" is longer than MQTT can express, which is 65535 seconds or about 18 hours; write `none` for no ceiling"),
        "{report}"
    );
    assert_eq!(
        ok("broker:\n  id: a\n  limits:\n    max_keepalive: 5m\n")
            .broker
            .limits
            .max_keepalive,
        Some(Duration::from_secs(300))
    );
}

/// B-064: connect_timeout in whole seconds, `none` refused.
#[test]
fn b064_connect_timeout_refuses_none_and_milliseconds() {
    refused(
        "broker:\n  id: a\n  limits:\n    connect_timeout: none\n",
        "broker.limits.connect_timeout",
        4,
    );
    refused(
        "broker:\n  id: a\n  limits:\n    connect_timeout: 500ms\n",
        "broker.limits.connect_timeout",
        4,
    );
}

/// B-046: write_timeout takes ms and `none`.
#[test]
fn b518_write_timeout_accepts_milliseconds_and_none() {
    assert_eq!(
        ok("broker:\n  id: a\n  limits:\n    write_timeout: 250ms\n")
            .broker
            .limits
            .write_timeout,
        Some(Duration::from_millis(250))
    );
    assert_eq!(
        ok("broker:\n  id: a\n  limits:\n    write_timeout: none\n")
            .broker
            .limits
            .write_timeout,
        None
    );
}

/// B-097, B-110: max_subscriptions and max_topic_levels below 1 refused.
#[test]
fn b096_b105_counts_below_one_are_refused() {
    refused(
        "broker:\n  id: a\n  limits:\n    max_subscriptions: 0\n",
        "broker.limits.max_subscriptions",
        4,
    );
    refused(
        "broker:\n  id: a\n  limits:\n    max_topic_levels: 0\n",
        "broker.limits.max_topic_levels",
        4,
    );
}

#[test]
fn b118_publish_rate_zero_is_refused_not_unset() {
    refused(
        "broker:\n  id: a\n  limits:\n    publish_rate: 0\n",
        "broker.limits.publish_rate",
        4,
    );
    refused(
        "broker:\n  id: a\n  limits:\n    publish_bytes: 0\n",
        "broker.limits.publish_bytes",
        4,
    );
}

/// B-517: a compound duration (1h30m) is refused.
#[test]
fn b513_durations_take_one_unit() {
    let report = refused(
        "broker:\n  id: a\n  limits:\n    max_session_expiry: 1h30m\n",
        "broker.limits.max_session_expiry",
        4,
    );
    assert!(report.contains("90m"), "{report}");
}

#[test]
fn a_file_that_is_not_a_mapping_says_so() {
    let err = config::from_str("- a\n- b\n", Path::new("saguin.yaml")).unwrap_err();
    assert!(err.findings().iter().any(|f| f.key == "the file"), "{err}");
}

#[test]
fn log_level_maps_to_the_log_crate() {
    assert_eq!(LogLevel::Warn.to_level_filter(), log::LevelFilter::Warn);
}

/// A storage block with defaults that are not `none`, and two providers, so an
/// inherited value and a default can be told apart from a written one.
const TWO_PROVIDERS: &str = "  storage:
    default: local
    default_retention_period: 3d
    default_retention_bytes: 5GiB
    providers:
      local: {type: sqlite, file_path: /var/lib/saguin/s.db}
      mem: {type: memory, snapshot_dir: none}
";

/// B-356: every operations key loads: tcp address, tls and password_file; unix path,
/// mode, password_file and proxy_protocol; the block's password_file and
/// min_scrape_interval.
#[test]
fn every_operations_key_loads_b356() {
    let c = ok("broker:
  id: a
  operations:
    password_file: /etc/saguin/ops.passwd
    min_scrape_interval: 2m
    listen:
      tcp:
        address: 127.0.0.1:9090
        password_file: /etc/saguin/tcp.passwd
        tls:
          cert_file: /etc/saguin/c.pem
          key_file: /etc/saguin/k.pem
      unix:
        path: /run/saguin/o.sock
        mode: \"0600\"
        password_file: /etc/saguin/unix.passwd
        proxy_protocol: true
");
    let ops = c.broker.operations.as_ref().expect("the operations block");
    assert_eq!(
        ops.password_file.as_deref(),
        Some(Path::new("/etc/saguin/ops.passwd"))
    );
    assert_eq!(ops.min_scrape_interval, Duration::from_secs(120));
    let tcp = &ops.listen.tcp[0];
    assert_eq!(tcp.address.written, "127.0.0.1:9090");
    assert_eq!(
        tcp.password_file.as_deref(),
        Some(Path::new("/etc/saguin/tcp.passwd"))
    );
    assert_eq!(
        tcp.tls.as_ref().map(|t| t.cert_file.clone()),
        Some("/etc/saguin/c.pem".into())
    );
    let unix = &ops.listen.unix[0];
    assert_eq!(unix.path, Path::new("/run/saguin/o.sock"));
    assert_eq!(unix.mode, 0o600);
    assert!(unix.proxy_protocol);
    assert_eq!(
        unix.password_file.as_deref(),
        Some(Path::new("/etc/saguin/unix.passwd"))
    );
}

/// B-410: a bridge writing none of them gets session_expiry 1d, receive_maximum 20
/// and ack_interval 5ms.
#[test]
fn bridge_defaults_b410() {
    let c = ok(&format!(
        "broker:\n  id: a\n{STORAGE}bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics: [{{filter: a/#, direction: both}}]\n"
    ));
    let b = &c.bridges[0];
    assert_eq!(b.session_expiry, Duration::from_secs(86_400));
    assert_eq!(b.receive_maximum, 20);
    assert_eq!(b.ack_interval, Duration::from_millis(5));
}

/// B-421: a queue's dlq_ keys are copied onto its `<queue>__dlq` channel, which takes
/// the queue's provider, not the default one.
#[test]
fn a_dead_letter_channel_takes_its_queues_dlq_keys_and_provider_b421() {
    let c = ok(&format!(
        "broker:\n  id: a\n{TWO_PROVIDERS}channels:\n  q:\n    type: queue\n    filter: q/#\n    storage: mem\n    dlq_retention_period: 30d\n    dlq_retention_bytes: 1GiB\n"
    ));
    let dlq = c.channel("q__dlq").expect("the derived channel");
    assert_eq!(dlq.storage, "mem");
    assert_eq!(dlq.retention_period, Some(Duration::from_secs(30 * 86_400)));
    assert_eq!(dlq.retention_bytes, Some(1 << 30));
}

/// B-422: the storage defaults apply to a channel that states none of its own, a
/// channel's own value wins, and `none` is accepted for both.
#[test]
fn storage_retention_defaults_apply_where_a_channel_states_none_b422() {
    let c = ok(&format!(
        "broker:\n  id: a\n{TWO_PROVIDERS}channels:\n  plain:\n    type: append\n  own:\n    type: append\n    retention_period: 1d\n    retention_bytes: 1GiB\n"
    ));
    let plain = c.channel("plain").expect("plain");
    assert_eq!(
        plain.retention_period,
        Some(Duration::from_secs(3 * 86_400))
    );
    assert_eq!(plain.retention_bytes, Some(5 << 30));
    let own = c.channel("own").expect("own");
    assert_eq!(own.retention_period, Some(Duration::from_secs(86_400)));
    assert_eq!(own.retention_bytes, Some(1 << 30));
    let c = ok(&format!(
        "broker:\n  id: a\n{}channels:\n  plain:\n    type: append\n",
        TWO_PROVIDERS
            .replace(
                "default_retention_period: 3d",
                "default_retention_period: none"
            )
            .replace(
                "default_retention_bytes: 5GiB",
                "default_retention_bytes: none"
            )
    ));
    let plain = c.channel("plain").expect("plain");
    assert_eq!(
        (plain.retention_period, plain.retention_bytes),
        (None, None)
    );
}

/// B-425, B-451: with no retained or session block, both are kept by
/// broker.storage.default, retained values for ever (not the channels' default
/// period) and acknowledgements committed every 200ms.
#[test]
fn retained_and_session_blocks_are_optional_b425_b451() {
    let c = ok(&format!("broker:\n  id: a\n{TWO_PROVIDERS}"));
    assert_eq!(c.broker.retained.storage, "local");
    assert_eq!(c.broker.retained.retention_period, None);
    assert_eq!(c.broker.session.storage, "local");
    assert_eq!(
        c.broker.session.ack_commit_interval,
        Duration::from_millis(200)
    );
}

/// B-510: a queue without job_expires_after has none: its work never expires.
#[test]
fn job_expires_after_has_no_default_b510() {
    let c = ok(&format!(
        "broker:\n  id: a\n{TWO_PROVIDERS}channels:\n  q:\n    type: queue\n    filter: q/#\n"
    ));
    let q = c
        .channel("q")
        .and_then(|q| q.queue.as_ref())
        .expect("a queue");
    assert_eq!(q.job_expires_after, None);
}
