//! Stored before acknowledged, over MQTT (issue 4 "Faults and proof"): every record a
//! PUBACK acknowledged survives SIGKILL on sqlite, with no offset reused; on memory,
//! everything survives SIGTERM through the snapshot.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Broker, CHANNELS, Raw, opts, temp_dir, user_property};
use saguin::codec::{Packet, ProtocolVersion::V5, QoS};

/// Publishes `count` QoS 1 records, record `n` under packet id `n + 1`, pipelined,
/// and returns the numbers whose PUBACK came back 0x00 before the connection ended.
fn publish_until_killed(broker: &Broker, count: u16) -> Vec<u16> {
    let mut raw = Raw::connected(broker.addr, V5, "durable-producer");
    for n in 0..count {
        let topic = format!("events/n{n}");
        let mut p = common::publish(&topic, n.to_string().as_bytes(), QoS::AtLeastOnce, false);
        p.packet_id = Some(n + 1);
        if !raw.try_send(&Packet::Publish(p)) {
            break; // killed mid-stream
        }
    }
    let mut acked = Vec::new();
    while let Ok(packet) = raw.try_recv() {
        if let Packet::PubAck(ack) = packet {
            assert_eq!(ack.code, 0);
            acked.push(ack.packet_id - 1);
        }
    }
    acked
}

#[test]
fn every_acknowledged_record_survives_sigkill_on_sqlite_with_no_offset_reused() {
    let dir = temp_dir("sigkill");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir.clone(), CHANNELS);
    let pid = broker.pid();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    });
    let acked = publish_until_killed(&broker, 20_000);
    killer.join().expect("killer");
    let dir = {
        let mut broker = broker;
        let _ = broker.wait_exit();
        broker.stop_killed()
    };
    let broker = Broker::start_in(dir, CHANNELS);
    // After the restart the channel takes new records at offsets never used before.
    let mut producer = Raw::connected(broker.addr, V5, "after");
    assert_eq!(
        producer.publish("events/after", b"after", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut reader = Raw::connected(broker.addr, V5, "auditor");
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    let mut stored = HashSet::new();
    let mut offsets = HashSet::new();
    loop {
        let got = reader.recv_publish();
        let offset = user_property(&got, "saguin-offset")
            .expect("offset")
            .to_string();
        assert!(offsets.insert(offset), "an offset was reused");
        if &*got.payload == b"after" {
            break;
        }
        stored.insert(String::from_utf8_lossy(&got.payload).to_string());
    }
    let lost: Vec<u16> = acked
        .iter()
        .copied()
        .filter(|n| !stored.contains(&n.to_string()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged records lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    eprintln!(
        "{} acknowledged before SIGKILL, all {} present after restart",
        acked.len(),
        stored.len()
    );
}

#[test]
fn a_memory_channel_survives_sigterm_through_its_snapshot() {
    let dir = temp_dir("memory-sigterm");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir.clone(), CHANNELS);
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    for topic in ["state/a", "state/b"] {
        assert_eq!(
            producer.publish(topic, topic.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    drop(producer);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, CHANNELS);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("state/#", opts(QoS::AtLeastOnce));
    let mut got: Vec<String> = (0..2)
        .map(|_| reader.recv_publish().topic.to_string())
        .collect();
    got.sort();
    assert_eq!(got, ["state/a", "state/b"]);
}

#[test]
fn retained_broadcast_values_survive_a_restart_and_a_deletion_stays_deleted() {
    let dir = temp_dir("retained-restart");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, CHANNELS);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let mut p = common::publish("plain/kept", b"value", QoS::AtLeastOnce, true);
    p.properties.edit().content_type = Some("text/plain".into());
    assert_eq!(publisher.publish_packet(p), Some(0));
    assert_eq!(
        publisher.publish("plain/gone", b"x", QoS::AtLeastOnce, true),
        Some(0)
    );
    assert_eq!(
        publisher.publish("plain/gone", b"", QoS::AtLeastOnce, true),
        Some(0)
    );
    drop(publisher);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, CHANNELS);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("plain/#", opts(QoS::AtLeastOnce));
    let got = reader.recv_publish();
    assert_eq!(
        (&*got.topic, &*got.payload, got.retain, got.qos),
        ("plain/kept", &b"value"[..], true, QoS::AtLeastOnce)
    );
    assert_eq!(got.properties.content_type.as_deref(), Some("text/plain"));
    assert!(user_property(&got, "saguin-retained-qos").is_none());
    reader.expect_nothing(Duration::from_millis(300));
}

/// A-169: a record the channel's storage cannot keep is PUBACK 0x83.
#[test]
fn a_failing_disk_answers_0x83_and_the_broker_keeps_serving() {
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("prlimit not installed; skipped");
        return;
    }
    let dir = temp_dir("failing-disk");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    // Files may not grow past 2 MB, and SIGXFSZ is ignored so the write fails instead.
    let wrapper = r#"trap "" XFSZ; exec prlimit --fsize=2000000 "$@""#;
    let broker = Broker::start_under(dir, CHANNELS, Some(wrapper));
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    let payload = vec![b'x'; 64 * 1024];
    let mut refused = None;
    for i in 0..200 {
        match publisher.publish(&format!("events/{i}"), &payload, QoS::AtLeastOnce, false) {
            Some(0) => {}
            code => {
                refused = code;
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some(0x83),
        "a write the disk refused is 0x83, not success and not 0x97"
    );
    assert_eq!(
        publisher.publish("plain/still", b"up", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut other = Raw::connected(broker.addr, V5, "other");
    assert_eq!(
        other.publish("plain/also", b"up", QoS::AtLeastOnce, false),
        Some(0)
    );
}

/// A-051: after a filter edit, new records route by the new filter: a topic the
/// narrowed latest filter no longer claims is broadcast, one it still claims a record.
#[test]
fn after_a_filter_edit_new_records_route_by_the_new_filter_a051() {
    let dir = temp_dir("filter-edit");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, CHANNELS);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("state/+/deep", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        producer.publish("state/x/deep", b"before", QoS::AtLeastOnce, false),
        Some(0)
    );
    let got = reader.recv_publish();
    assert_eq!(&*got.payload, b"before");
    assert!(user_property(&got, "saguin-offset").is_some(), "a record");
    drop((reader, producer));
    let narrowed = CHANNELS.replace(
        "  state:\n    type: latest\n",
        "  state:\n    type: latest\n    filter: state/+\n",
    );
    assert_ne!(narrowed, CHANNELS);
    let broker = Broker::start_in(broker.stop(), &narrowed);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("state/+/deep", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(reader.subscribe("state/y", opts(QoS::AtLeastOnce)), [1]);
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    for (topic, payload) in [("state/x/deep", "after"), ("state/y", "kept")] {
        assert_eq!(
            producer.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let mut got: Vec<(String, bool)> = (0..2)
        .map(|_| {
            let p = reader.recv_publish();
            let record = user_property(&p, "saguin-offset").is_some();
            (String::from_utf8_lossy(&p.payload).into_owned(), record)
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [("after".to_string(), false), ("kept".to_string(), true)],
        "state/x/deep is broadcast now; state/y is still the channel's"
    );
    reader.expect_nothing(Duration::from_millis(300));
}

/// A-053, A-050: a latest channel's filter narrowed while the broker was stopped moves
/// nothing; the start counts the stored values its filter no longer reaches and says
/// so, naming one, and the value whose topic it still reaches is served as before.
#[test]
fn a_narrowed_latest_filter_is_counted_at_startup_a053() {
    let dir = temp_dir("latest-narrowed");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, CHANNELS);
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    for topic in ["state/a", "state/b/deep", "state/c/deep"] {
        assert_eq!(
            producer.publish(topic, b"v", QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    drop(producer);
    let dir = broker.stop();
    let narrowed = CHANNELS.replace(
        "  state:\n    type: latest\n",
        "  state:\n    type: latest\n    filter: state/+\n",
    );
    assert_ne!(narrowed, CHANNELS);
    let broker = Broker::start_in(dir, &narrowed);
    let line = broker
        .startup
        .iter()
        .find(|l| l.contains("no longer reaches"))
        .expect("the start counts what the narrowed filter left behind");
    assert!(
        line.contains("latest channel state: 2 stored values")
            && line.contains("\"state/+\"")
            && line.contains("\"state/b/deep\""),
        "{line}"
    );
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("state/+", opts(QoS::AtLeastOnce));
    assert_eq!(&*reader.recv_publish().topic, "state/a");
    reader.expect_nothing(Duration::from_millis(300));
}

/// A-055: a point read of a topic the narrowed filter no longer reaches answers that it
/// names no latest channel (0x90, nothing sent), though its orphaned value is still
/// stored; a topic the filter still reaches is answered as before.
#[test]
fn a_point_read_of_a_topic_no_latest_channel_claims_now_is_0x90_a055() {
    let dir = temp_dir("latest-orphan-read");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = Broker::start_in(dir, CHANNELS);
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    for (topic, value) in [("state/a", "kept"), ("state/b/deep", "orphan")] {
        assert_eq!(
            producer.publish(topic, value.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    drop(producer);
    let dir = broker.stop();
    let narrowed = CHANNELS.replace(
        "  state:\n    type: latest\n",
        "  state:\n    type: latest\n    filter: state/+\n",
    );
    assert_ne!(narrowed, CHANNELS);
    let broker = Broker::start_in(dir, &narrowed);
    let get = |key: &str| {
        let mut p = common::publish("$saguin/kv/get", key.as_bytes(), QoS::AtLeastOnce, false);
        p.properties.edit().response_topic = Some("replies/me".into());
        p
    };
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    // The Reason String says so, not that the topic is malformed (gaps G-01).
    asker.send(&Packet::Publish(get("state/b/deep")));
    match asker.recv() {
        Packet::PubAck(ack) => {
            assert_eq!(ack.code, 0x90);
            let why = ack.properties.reason_string.as_deref().unwrap_or("");
            assert!(why.contains("names no latest channel"), "{why}");
        }
        other => panic!("expected PUBACK, got {other:?}"),
    }
    asker.expect_nothing(Duration::from_millis(300));
    assert_eq!(asker.publish_packet(get("state/a")), Some(0));
    assert_eq!(&*asker.recv_publish().payload, b"kept");
}

/// A memory provider whose snapshot cannot be written at a stop (its directory gone,
/// a file in its place) says so with the exit status, not only in the log: the
/// supervisor learns the records are lost. It exited 0.
#[test]
fn a_snapshot_that_cannot_be_written_at_a_stop_exits_non_zero() {
    let dir = temp_dir("snapshot-unwritable");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let mut broker = Broker::start_in(dir.clone(), CHANNELS);
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        producer.publish("memlog/a", b"kept?", QoS::AtLeastOnce, false),
        Some(0)
    );
    std::fs::remove_dir_all(dir.join("snapshots")).expect("remove the directory");
    std::fs::write(dir.join("snapshots"), b"not a directory").expect("a file in its place");
    broker.signal("TERM");
    let status = broker.wait_exit();
    assert!(!status.success(), "{status:?}");
    broker.wait_log("storage provider volatile");
}
