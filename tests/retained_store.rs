//! The retained store for broadcast topics over real sockets and restarts (RFC 0002
//! "Retained messages on a broadcast topic", RFC 0003 "Retained messages"): the
//! retention period in memory and on reload, the provider's max_bytes as the one
//! bound, topics a channel claims after a restart, and retained Wills.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Broker, Raw, opts, temp_dir, user_property};
use saguin::codec::{self, Packet, ProtocolVersion::V5, QoS};

/// A broker on one sqlite provider (no max_bytes) in `{dir}`, with `broker` keys
/// (indented two spaces) and a top-level `channels` block appended.
fn config(broker: &str, channels: &str) -> String {
    format!(
        "broker:
  id: retained-test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  storage:
    default: local
    default_retention_period: none
    default_retention_bytes: none
    providers:
      local:
        type: sqlite
        file_path: {{dir}}/saguin.db
{broker}{channels}"
    )
}

/// Publishes a retained QoS 1 value and returns the PUBACK's code.
fn retain(raw: &mut Raw, topic: &str, payload: &[u8]) -> Option<u8> {
    raw.publish(topic, payload, QoS::AtLeastOnce, true)
}

/// Subscribes `client` to `filter` and returns every publish that arrives until
/// nothing more comes for 500 ms.
fn retained_values(broker: &Broker, client: &str, filter: &str) -> Vec<codec::Publish> {
    let mut reader = Raw::connected(broker.addr, V5, client);
    reader.subscribe(filter, opts(QoS::AtLeastOnce));
    let mut got = Vec::new();
    loop {
        match reader.expect_nothing_or_packet(Duration::from_millis(500)) {
            Ok(Packet::Publish(p)) => {
                if let Some(id) = p.packet_id {
                    reader.send(&Packet::PubAck(codec::Ack::new(id, 0)));
                }
                got.push(p);
            }
            Ok(other) => panic!("expected PUBLISH, got {other:?}"),
            Err(e) if e.contains("read:") => return got,
            Err(e) => panic!("the connection ended: {e}"),
        }
    }
}

fn topics(values: &[codec::Publish]) -> Vec<String> {
    let mut t: Vec<String> = values.iter().map(|p| p.topic.to_string()).collect();
    t.sort();
    t
}

/// B-430, C-244: a retained broadcast value carries none of a channel record's headers,
/// live or after a restart (its durable copy is a `$retained` record).
#[test]
fn retained_values_carry_no_saguin_headers_b430() {
    let yaml = config("", "");
    let broker = Broker::start_in(temp_dir("retained-headers"), &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(retain(&mut publisher, "plain/a", b"a"), Some(0));
    drop(publisher);
    let before = retained_values(&broker, "before", "plain/#");
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &yaml);
    let after = retained_values(&broker, "after", "plain/#");
    for value in before.iter().chain(&after) {
        assert!(value.retain);
        for header in ["saguin-id", "saguin-offset", "saguin-timestamp"] {
            assert_eq!(user_property(value, header), None, "{header}");
        }
    }
    assert_eq!((before.len(), after.len()), (1, 1));
}

#[test]
fn a_value_is_not_served_past_retention_period_nor_after_a_restart_b431_c239_c242() {
    let yaml = config("  retained:\n    retention_period: 2s\n", "");
    let broker = Broker::start_in(temp_dir("retained-period"), &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(retain(&mut publisher, "aged/a", b"a"), Some(0));
    let fresh = retained_values(&broker, "early", "aged/#");
    assert_eq!(topics(&fresh), ["aged/a"]);
    // No publisher expiry: none is delivered, the operator's period is not told (C-242).
    assert_eq!(fresh[0].properties.message_expiry_interval, None);
    std::thread::sleep(Duration::from_millis(3_500));
    assert!(retained_values(&broker, "late", "aged/#").is_empty());

    // Stored, then the broker stopped before the period ran out: the value ages on
    // disk while nothing runs, and is not loaded once past it (B-431).
    assert_eq!(retain(&mut publisher, "aged/b", b"b"), Some(0));
    drop(publisher);
    let dir = broker.stop();
    std::thread::sleep(Duration::from_millis(3_000));
    let broker = Broker::start_in(dir, &yaml);
    assert!(retained_values(&broker, "after-restart", "aged/#").is_empty());
}

#[test]
fn an_unbounded_provider_takes_more_than_16_mib_of_retained_values_b432_c220() {
    let yaml = config(
        "  limits:\n    max_message_size: 2MiB\n    session_queue_bytes: 64MiB\n",
        "",
    );
    let broker = Broker::start_in(temp_dir("retained-big"), &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    let payload = vec![b'x'; 1 << 20];
    for i in 0..20 {
        assert_eq!(
            retain(&mut publisher, &format!("big/{i:02}"), &payload),
            Some(0),
            "value {i} of 1 MiB"
        );
    }
    drop(publisher);
    assert_eq!(retained_values(&broker, "reader", "big/#").len(), 20);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &yaml);
    assert_eq!(retained_values(&broker, "after", "big/#").len(), 20);
}

/// Sessions are kept apart: a session store that shares the full provider refuses
/// every new subscription (B-471), the readers' included.
#[test]
fn a_value_refused_0x97_at_max_bytes_does_not_come_back_after_a_restart_b432_c220() {
    let yaml = "broker:
  id: retained-full
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  limits:
    max_message_size: 64KiB
    session_queue_bytes: 8MiB
  session:
    storage: sessions
  storage:
    default: small
    default_retention_period: none
    default_retention_bytes: none
    providers:
      small:
        type: memory
        max_bytes: 1MiB
        snapshot_dir: {dir}/snapshots
      sessions:
        type: memory
        max_bytes: 1MiB
        snapshot_dir: none
";
    let dir = temp_dir("retained-full");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    let payload = vec![b'x'; 50 << 10];
    let mut kept = Vec::new();
    let mut refused = None;
    for i in 0..40 {
        let topic = format!("full/{i:02}");
        match retain(&mut publisher, &topic, &payload) {
            Some(0) => kept.push(topic),
            code => {
                assert_eq!(code, Some(0x97), "{topic}");
                refused = Some(topic);
                break;
            }
        }
    }
    let refused = refused.expect("a 1 MiB provider refuses a value before 2 MB");
    assert!(!kept.is_empty());
    drop(publisher);
    assert_eq!(topics(&retained_values(&broker, "reader", "full/#")), kept);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, yaml);
    let after = topics(&retained_values(&broker, "after", "full/#"));
    assert!(!after.contains(&refused), "{refused} came back");
    assert_eq!(after, kept, "existing values are kept");
}

/// The channels added over formerly broadcast topics at the second start.
const CLAIMING: &str = "channels:
  state:
    type: latest
    filter: dev/+/state
  events:
    type: append
    filter: log/#
";

#[test]
fn a_retained_value_a_new_channel_claims_is_moved_or_discarded_at_startup_a052_b426_b435_b436() {
    let dir = temp_dir("retained-claimed");
    let before = config("", "");
    let broker = Broker::start_in(dir, &before);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(retain(&mut publisher, "dev/1/state", b"v1"), Some(0));
    assert_eq!(retain(&mut publisher, "log/x", b"old"), Some(0));
    assert_eq!(retain(&mut publisher, "plain/kept", b"k"), Some(0));
    drop(publisher);
    let dir = broker.stop();

    let after = config("", CLAIMING);
    let broker = Broker::start_in(dir, &after);
    let line = broker
        .startup
        .iter()
        .find(|l| l.contains("values whose topics a channel now claims"))
        .unwrap_or_else(|| panic!("no startup line: {:?}", broker.startup));
    assert!(
        line.contains("1 moved into latest channel state")
            && line.contains("1 discarded for append channel events"),
        "{line}"
    );
    let check = |broker: &Broker, round: &str| {
        let state = retained_values(broker, &format!("state-{round}"), "dev/+/state");
        assert_eq!(
            state.len(),
            1,
            "exactly one value, from the channel: {state:?}"
        );
        assert_eq!(&*state[0].payload, b"v1");
        assert!(state[0].retain, "current state carries RETAIN");
        assert!(user_property(&state[0], "saguin-offset").is_some());
        let log = retained_values(broker, &format!("log-{round}"), "log/#");
        assert!(
            log.iter().all(|p| !p.retain && &*p.payload != b"old"),
            "the old value is neither retained nor an event: {log:?}"
        );
        let plain = retained_values(broker, &format!("plain-{round}"), "plain/#");
        assert_eq!(topics(&plain), ["plain/kept"]);
    };
    check(&broker, "first");
    // Moved once: the next start finds it in the channel alone.
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &after);
    check(&broker, "second");
}

/// Connects `client` with a retained QoS 1 Will to `topic`, then drops the socket so
/// the Will fires.
fn die_with_will(broker: &Broker, client: &str, topic: &str, payload: &[u8]) {
    let mut connect = common::connect(V5, client, true);
    connect.will = Some(codec::Will {
        topic: topic.into(),
        payload: payload.to_vec(),
        qos: QoS::AtLeastOnce,
        retain: true,
        properties: codec::Properties::default(),
    });
    let (raw, ack) = Raw::handshake(broker.addr, connect);
    assert_eq!(ack.code, 0);
    drop(raw);
}

#[test]
fn a_retained_will_is_written_through_and_survives_a_restart_c248() {
    let yaml = config("", "");
    let broker = Broker::start_in(temp_dir("retained-will"), &yaml);
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("will/#", opts(QoS::AtLeastOnce));
    die_with_will(&broker, "dying", "will/dying", b"gone");
    assert_eq!(&*watcher.recv_publish().payload, b"gone");
    drop(watcher);
    let dir = broker.stop();

    let broker = Broker::start_in(dir, &yaml);
    let got = retained_values(&broker, "reader", "will/#");
    assert_eq!(got.len(), 1);
    assert_eq!((&*got[0].payload, got[0].retain), (&b"gone"[..], true));

    // An empty retained Will deletes the value, durably too.
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("will/#", opts(QoS::AtLeastOnce));
    assert_eq!(&*watcher.recv_publish().payload, b"gone");
    die_with_will(&broker, "dying", "will/dying", b"");
    assert!(watcher.recv_publish().payload.is_empty());
    drop(watcher);
    let dir: PathBuf = broker.stop();
    let broker = Broker::start_in(dir, &yaml);
    assert!(retained_values(&broker, "after", "will/#").is_empty());
}

/// The topics `$retained` holds a live value for in the sqlite file under `dir` (the
/// broker stopped), sorted.
fn stored_topics(dir: &std::path::Path) -> Vec<String> {
    let db = rusqlite::Connection::open(dir.join("saguin.db")).expect("open the db");
    let mut query = db
        .prepare(
            "SELECT r.topic FROM records r JOIN latest l \
             ON l.channel_id = r.channel_id AND l.record_offset = r.record_offset \
             JOIN channels c ON c.id = r.channel_id \
             WHERE c.name = '$retained' AND length(r.payload) > 0 ORDER BY r.topic",
        )
        .expect("query");
    let rows = query.query_map([], |row| row.get(0)).expect("rows");
    rows.map(|r| r.expect("a topic")).collect()
}

/// Publishes a retained QoS 1 value with a Message Expiry Interval of `secs`.
fn retain_expiring(raw: &mut Raw, topic: &str, secs: u32) -> Option<u8> {
    let mut p = common::publish(topic, b"v", QoS::AtLeastOnce, true);
    p.properties.edit().message_expiry_interval = Some(secs);
    raw.publish_packet(p)
}

/// C-239: a publisher's Message Expiry removes the stored value, not only the one in
/// memory - on the running broker's tick, and at a start for one that died while it
/// was stopped - so values that die do not fill the provider. A value that replaced
/// one with an expiry is not touched by it.
#[test]
fn a_value_past_its_message_expiry_is_removed_from_storage_c239() {
    let yaml = config("", "");
    let broker = Broker::start_in(temp_dir("retained-expiry-stored"), &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(retain_expiring(&mut publisher, "dies/a", 1), Some(0));
    assert_eq!(retain(&mut publisher, "dies/b", b"b"), Some(0));
    assert_eq!(retain_expiring(&mut publisher, "dies/c", 1), Some(0));
    assert_eq!(retain(&mut publisher, "dies/c", b"c"), Some(0));
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(
        topics(&retained_values(&broker, "r", "dies/#")),
        ["dies/b", "dies/c"]
    );
    drop(publisher);
    let dir = broker.stop();
    assert_eq!(stored_topics(&dir), ["dies/b", "dies/c"]);

    let broker = Broker::start_in(dir, &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(retain_expiring(&mut publisher, "dies/d", 1), Some(0));
    drop(publisher);
    let dir = broker.stop();
    assert_eq!(stored_topics(&dir), ["dies/b", "dies/c", "dies/d"]);
    std::thread::sleep(Duration::from_millis(1_500));
    let broker = Broker::start_in(dir, &yaml);
    let said = "retained store: 2 values loaded from local, 1 past their expiry removed";
    assert!(
        broker.startup.iter().any(|line| line.contains(said)),
        "{:#?}",
        broker.startup
    );
    let dir = broker.stop();
    assert_eq!(stored_topics(&dir), ["dies/b", "dies/c"]);
}

/// C-216, C-220, MQTT-3.3.1-6/-7: on sqlite at its bound, a retained value is still
/// replaced by one no larger, and deleted by a zero-length publish: neither adds.
#[test]
fn a_full_sqlite_store_still_takes_updates_and_deletions() {
    let yaml = config(
        "  limits:\n    max_message_size: 64KiB\n    session_queue_bytes: 8MiB\n",
        "",
    )
    .replace(
        "        file_path: {dir}/saguin.db\n",
        "        file_path: {dir}/saguin.db\n        max_bytes: 2MiB\n",
    );
    let broker = Broker::start_in(temp_dir("retained-full-sqlite"), &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    let payload = vec![b'x'; 50 << 10];
    let mut kept = Vec::new();
    for i in 0..80 {
        let topic = format!("full/{i:02}");
        match retain(&mut publisher, &topic, &payload) {
            Some(0) => kept.push(topic),
            code => {
                assert_eq!(code, Some(0x97), "{topic}");
                break;
            }
        }
    }
    assert!(kept.len() > 2 && kept.len() < 80, "{} kept", kept.len());
    assert_eq!(
        retain(&mut publisher, &kept[0], &payload),
        Some(0),
        "an update"
    );
    assert_eq!(retain(&mut publisher, &kept[1], b""), Some(0), "a deletion");
    let values = retained_values(&broker, "reader", "full/#");
    assert_eq!(values.len(), kept.len() - 1);
}

/// A-052 ("never in neither"): a start that moves retained values into a latest
/// channel on a memory provider and then fails (its port taken) writes the memory
/// snapshot on its way out. The moved values were gone with the process: deleted
/// from the retained store, never written to the snapshot.
#[test]
fn a_start_that_fails_after_moving_retained_values_keeps_them_a052() {
    let dir = temp_dir("retained-failed-start");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, &config("", ""));
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(retain(&mut publisher, "dev/1/state", b"v1"), Some(0));
    drop(publisher);
    let dir = broker.stop();
    let claiming = config("", "channels:\n  state:\n    type: latest\n    filter: dev/+/state\n    storage: volatile\n")
        .replace(
            "        file_path: {dir}/saguin.db\n",
            "        file_path: {dir}/saguin.db\n      volatile:\n        type: memory\n        max_bytes: 16MiB\n        snapshot_dir: {dir}/snapshots\n",
        )
        .replace("{dir}", &dir.display().to_string());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("its address").port();
    let busy = claiming.replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let said = common::refused_at_startup(&dir, &busy);
    assert!(said.contains("1 moved into latest channel state"), "{said}");
    drop(taken);
    let broker = Broker::start_in(dir, &claiming);
    let state = retained_values(&broker, "reader", "dev/+/state");
    assert_eq!(state.len(), 1, "the moved value is kept: {state:?}");
    assert_eq!(&*state[0].payload, b"v1");
}
