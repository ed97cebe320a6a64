//! Helpers for the tests of persistent sessions across a restart
//! (`sessions_restart.rs`, `sessions_owed.rs`, `sessions_full.rs`).

use std::path::PathBuf;
use std::time::Duration;

use saguin::codec::{self, Packet, ProtocolVersion::V5, QoS};

use super::{Broker, CHANNELS, Raw, connect, opts, temp_dir};

/// A fresh directory with a `snapshots` directory in it.
pub fn fresh_dir() -> PathBuf {
    let dir = temp_dir("sessions");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    dir
}

/// [`CHANNELS`] with `broker.session.storage` naming `provider`.
pub fn config(provider: &str) -> String {
    CHANNELS.replace(
        "  id: channels-test\n",
        &format!("  id: channels-test\n  session:\n    storage: {provider}\n"),
    )
}

/// A CONNECT asking for a session of `expiry` seconds (MQTT 5).
pub fn persistent(client_id: &str, clean_start: bool, expiry: u32) -> codec::Connect {
    let mut c = connect(V5, client_id, clean_start);
    c.properties.edit().session_expiry_interval = Some(expiry);
    c
}

/// `c` with a Receive Maximum.
pub fn with_receive_maximum(mut c: codec::Connect, max: u16) -> codec::Connect {
    c.properties.edit().receive_maximum = Some(max);
    c
}

/// Connects, expecting CONNACK 0x00; returns the connection and Session Present.
pub fn connected(broker: &Broker, c: codec::Connect) -> (Raw, bool) {
    let (raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0, "CONNACK {ack:?}");
    (raw, ack.session_present)
}

/// The broker's own exchange rows in the sqlite file of `dir` (`broker::released`:
/// released ones, A-254, and the packet identifiers a graceful stop kept,
/// MQTT-4.4.0-1), read once the broker is gone.
pub fn released_rows(dir: &std::path::Path) -> i64 {
    let db = rusqlite::Connection::open(dir.join("saguin.db")).expect("open the file");
    db.query_row(
        "SELECT count(*) FROM held WHERE substr(client_id, 1, 10) = char(1) || 'released/'",
        [],
        |row| row.get(0),
    )
    .expect("count")
}

/// SIGKILLs the broker and keeps its directory for a restart.
pub fn kill(mut broker: Broker) -> PathBuf {
    broker.signal("KILL");
    broker.wait_exit();
    broker.stop_killed()
}

/// A subscriber `client_id` on `filter` at `qos`, away again (clean DISCONNECT).
pub fn subscribe_and_leave(broker: &Broker, client_id: &str, filter: &str, qos: QoS) {
    let (mut s, _) = connected(broker, persistent(client_id, true, 300));
    assert_eq!(s.subscribe(filter, opts(qos)), [qos as u8]);
    s.disconnect();
    broker.wait_log(&format!("{client_id} disconnected"));
}

/// Publishes `count` messages `prefix-N` to `topic` at `qos`, each acknowledged 0x00.
pub fn publish_n(broker: &Broker, topic: &str, prefix: &str, count: usize, qos: QoS) {
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    for i in 0..count {
        let payload = format!("{prefix}-{i}");
        let acknowledged = (qos != QoS::AtMostOnce).then_some(0);
        assert_eq!(
            p.publish(topic, payload.as_bytes(), qos, false),
            acknowledged
        );
    }
    p.disconnect();
}

/// Receives `count` publishes, acknowledging each at its QoS whatever order the
/// broker's packets come in, and returns their payloads (trailing spaces trimmed) in
/// order of arrival.
pub fn receive(raw: &mut Raw, count: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < count {
        match raw.recv() {
            Packet::Publish(p) => {
                match (p.qos, p.packet_id) {
                    (QoS::AtLeastOnce, Some(id)) => {
                        raw.send(&Packet::PubAck(codec::Ack::new(id, 0)))
                    }
                    (QoS::ExactlyOnce, Some(id)) => {
                        raw.send(&Packet::PubRec(codec::Ack::new(id, 0)))
                    }
                    _ => {}
                }
                got.push(String::from_utf8_lossy(&p.payload).trim_end().to_string());
            }
            Packet::PubRel(ack) => raw.send(&Packet::PubComp(codec::Ack::new(ack.packet_id, 0))),
            other => panic!("expected PUBLISH or PUBREL, got {other:?}"),
        }
    }
    got
}

/// Asserts no PUBLISH arrives within `wait`, completing the QoS 2 exchanges still
/// open.
pub fn nothing_more(raw: &mut Raw, wait: Duration) {
    loop {
        match raw.expect_nothing_or_packet(wait) {
            Ok(Packet::PubRel(ack)) => {
                raw.send(&Packet::PubComp(codec::Ack::new(ack.packet_id, 0)))
            }
            Ok(other) => panic!("expected nothing more, got {other:?}"),
            Err(e) => {
                assert!(e.contains("read:"), "{e}");
                return;
            }
        }
    }
}

/// `prefix-N` for each N of `range`.
pub fn expected(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i}")).collect()
}
