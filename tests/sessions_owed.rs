//! What a persistent session is owed survives a restart (B-456..B-459; gaps G-14
//! "Broadcast"): a QoS 1/2 broadcast owed to a session that outlives its connection
//! is written once to the broadcast log of `broker.session.storage` before the
//! publisher's PUBACK, and the session's place in it is written at most
//! `ack_commit_interval` after it moves, and at a clean DISCONNECT or a graceful stop.
//! On sqlite that survives SIGKILL, on memory a graceful stop (B-455).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Broker, CHANNELS, Raw, connect, opts, temp_dir};
use saguin::codec::{self, Packet, ProtocolVersion::V5, QoS};

fn fresh_dir() -> PathBuf {
    let dir = temp_dir("sessions-owed");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    dir
}

/// CHANNELS with `broker.session.storage` naming `provider`.
fn config(provider: &str) -> String {
    CHANNELS.replace(
        "  id: channels-test\n",
        &format!("  id: channels-test\n  session:\n    storage: {provider}\n"),
    )
}

/// A CONNECT asking for a session of `expiry` seconds (MQTT 5).
fn persistent(client_id: &str, clean_start: bool, expiry: u32) -> codec::Connect {
    let mut c = connect(V5, client_id, clean_start);
    c.properties.session_expiry_interval = Some(expiry);
    c
}

fn with_receive_maximum(mut c: codec::Connect, max: u16) -> codec::Connect {
    c.properties.receive_maximum = Some(max);
    c
}

fn connected(broker: &Broker, c: codec::Connect) -> (Raw, bool) {
    let (raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0, "CONNACK {ack:?}");
    (raw, ack.session_present)
}

/// A subscriber `client_id` on `filter` at `qos`, away again (clean DISCONNECT).
fn subscribe_and_leave(broker: &Broker, client_id: &str, filter: &str, qos: QoS) {
    let (mut s, _) = connected(broker, persistent(client_id, true, 300));
    assert_eq!(s.subscribe(filter, opts(qos)), [qos as u8]);
    s.disconnect();
    broker.wait_log(&format!("{client_id} disconnected"));
}

/// Publishes `count` messages `topic` `prefix-N` at `qos`, each acknowledged 0x00.
fn publish_n(broker: &Broker, topic: &str, prefix: &str, count: usize, qos: QoS) {
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

fn kill(mut broker: Broker) -> PathBuf {
    broker.signal("KILL");
    broker.wait_exit();
    broker.stop_killed()
}

/// Receives `count` publishes, acknowledging each at its QoS whatever order the
/// broker's packets come in, and returns their payloads in order of arrival.
fn receive(raw: &mut Raw, count: usize) -> Vec<String> {
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
                got.push(String::from_utf8_lossy(&p.payload).into_owned());
            }
            Packet::PubRel(ack) => raw.send(&Packet::PubComp(codec::Ack::new(ack.packet_id, 0))),
            other => panic!("expected PUBLISH or PUBREL, got {other:?}"),
        }
    }
    got
}

/// Asserts no PUBLISH arrives within `wait`, completing the QoS 2 exchanges still
/// open.
fn nothing_more(raw: &mut Raw, wait: Duration) {
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

fn expected(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i}")).collect()
}

/// How many records the broadcast log holds in the sqlite file (read once the broker
/// is gone).
fn log_rows(dir: &Path) -> i64 {
    let db = rusqlite::Connection::open(dir.join("saguin.db")).expect("open the file");
    db.query_row(
        "SELECT count(*) FROM records r JOIN channels c ON c.id = r.channel_id \
         WHERE c.name = '$broadcast'",
        [],
        |row| row.get(0),
    )
    .expect("count the log")
}

/// B-456, B-455: QoS 1 broadcasts queued for a session that is away, each PUBACKed,
/// survive SIGKILL on sqlite and go out in order on resume.
#[test]
fn b456_owed_broadcasts_survive_sigkill_on_sqlite() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    subscribe_and_leave(&broker, "keeper", "news/#", QoS::AtLeastOnce);
    publish_n(&broker, "news/today", "owed", 3, QoS::AtLeastOnce);
    let dir = kill(broker);
    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, persistent("keeper", false, 300));
    assert!(present);
    assert_eq!(receive(&mut s, 3), expected("owed", 0..3));
    s.expect_nothing(Duration::from_millis(300));
}

/// B-456, B-455: on a memory provider what is owed survives a graceful stop, QoS 2
/// included.
#[test]
fn b456_owed_broadcasts_survive_a_graceful_stop_on_memory() {
    let broker = Broker::start_in(fresh_dir(), &config("volatile"));
    subscribe_and_leave(&broker, "keeper", "news/#", QoS::ExactlyOnce);
    publish_n(&broker, "news/one", "q1", 2, QoS::AtLeastOnce);
    publish_n(&broker, "news/two", "q2", 2, QoS::ExactlyOnce);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &config("volatile"));
    let (mut s, present) = connected(&broker, persistent("keeper", false, 300));
    assert!(present);
    let mut want = expected("q1", 0..2);
    want.extend(expected("q2", 0..2));
    assert_eq!(receive(&mut s, 4), want);
    nothing_more(&mut s, Duration::from_millis(300));
}

/// B-456: one log record per message however many sessions are owed it, none for a
/// QoS 0 publish or one only clean sessions hear; B-458 and the deletion of what no
/// session needs: once every session acknowledged its messages and left cleanly, the
/// log is empty after the next start's first tick.
#[test]
fn b456_one_log_record_per_message_and_none_once_acknowledged() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    for id in ["a", "b", "c"] {
        subscribe_and_leave(&broker, id, "fleet/#", QoS::AtLeastOnce);
    }
    let mut clean = Raw::connected(broker.addr, V5, "clean-listener");
    assert_eq!(clean.subscribe("other/#", opts(QoS::AtLeastOnce)), [1]);
    publish_n(&broker, "fleet/x", "m", 2, QoS::AtLeastOnce);
    publish_n(&broker, "fleet/x", "zero", 1, QoS::AtMostOnce);
    publish_n(&broker, "other/x", "clean", 1, QoS::AtLeastOnce);
    assert_eq!(receive(&mut clean, 1), ["clean-0"]);
    let dir = kill(broker);
    assert_eq!(
        log_rows(&dir),
        2,
        "two messages, three sessions, one record each"
    );

    let broker = Broker::start_in(dir, &config("local"));
    for id in ["a", "b", "c"] {
        let (mut s, present) = connected(&broker, persistent(id, false, 300));
        assert!(present);
        assert_eq!(receive(&mut s, 2), expected("m", 0..2), "{id}");
        s.expect_nothing(Duration::from_millis(200));
        s.disconnect();
        broker.wait_log(&format!("{id} disconnected"));
    }
    // Housekeeping deletes what nobody needs within a tick or two.
    std::thread::sleep(Duration::from_millis(2500));
    let dir = kill(broker);
    assert_eq!(
        log_rows(&dir),
        0,
        "every record acknowledged by every session"
    );
    // And nothing is sent again.
    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, persistent("a", false, 300));
    assert!(present);
    s.expect_nothing(Duration::from_millis(500));
}

/// B-457: acknowledgements of a connected session are written within
/// `ack_commit_interval` by the timer though the connection then sits idle: after a
/// SIGKILL only the message it never acknowledged comes back.
#[test]
fn b457_acknowledgements_are_written_within_the_interval_though_idle() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut s, _) = connected(&broker, persistent("steady", true, 300));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    publish_n(&broker, "news/a", "live", 3, QoS::AtLeastOnce);
    assert_eq!(receive(&mut s, 3), expected("live", 0..3));
    publish_n(&broker, "news/b", "unacknowledged", 1, QoS::AtLeastOnce);
    let _ = s.recv_offer();
    // Well past the default 200 ms, nothing else waking the connection.
    std::thread::sleep(Duration::from_millis(800));
    let dir = kill(broker);
    drop(s);
    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, persistent("steady", false, 300));
    assert!(present);
    assert_eq!(receive(&mut s, 1), ["unacknowledged-0"]);
    s.expect_nothing(Duration::from_millis(500));
}

/// B-458: a clean DISCONNECT stores the acknowledgements at once, whatever the
/// interval (set to its 1 s maximum here): killed right after, the session is sent
/// only what was published while it was away.
#[test]
fn b458_a_clean_disconnect_stores_acknowledgements_at_once() {
    let yaml = config("local").replace(
        "  session:\n    storage: local\n",
        "  session:\n    storage: local\n    ack_commit_interval: 1s\n",
    );
    let broker = Broker::start_in(fresh_dir(), &yaml);
    let (mut s, _) = connected(&broker, persistent("tidy", true, 300));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    publish_n(&broker, "news/a", "live", 3, QoS::AtLeastOnce);
    assert_eq!(receive(&mut s, 3), expected("live", 0..3));
    s.disconnect();
    broker.wait_log("tidy disconnected");
    publish_n(&broker, "news/a", "away", 1, QoS::AtLeastOnce);
    let dir = kill(broker);
    let broker = Broker::start_in(dir, &yaml);
    let (mut s, present) = connected(&broker, persistent("tidy", false, 300));
    assert!(present);
    assert_eq!(receive(&mut s, 1), ["away-0"]);
    s.expect_nothing(Duration::from_millis(500));
}

/// B-458 at a graceful stop, memory provider: what was acknowledged is not sent
/// again; what was on the wire and not acknowledged goes again with DUP set
/// (MQTT-4.4.0-1), then what was never sent.
#[test]
fn b458_a_graceful_stop_stores_acknowledgements_and_resends_the_unacknowledged_with_dup() {
    let broker = Broker::start_in(fresh_dir(), &config("volatile"));
    let (mut s, _) = connected(
        &broker,
        with_receive_maximum(persistent("window", true, 300), 2),
    );
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    publish_n(&broker, "news/a", "m", 5, QoS::AtLeastOnce);
    let first = s.recv_publish(); // acknowledged
    assert_eq!(&first.payload[..], b"m-0");
    let held = s.recv_offer(); // on the wire, never acknowledged
    assert_eq!(&held.payload[..], b"m-1");
    let _ = s.recv_offer(); // m-2, unacknowledged too: the window is 2
    let dir = broker.stop();
    drop(s);
    let broker = Broker::start_in(dir, &config("volatile"));
    let (mut s, present) = connected(
        &broker,
        with_receive_maximum(persistent("window", false, 300), 10),
    );
    assert!(present);
    let again = s.recv_publish();
    assert_eq!(&again.payload[..], b"m-1");
    assert!(again.dup, "on the wire before the stop: DUP set");
    let rest = receive(&mut s, 3);
    assert_eq!(rest, expected("m", 2..5));
    s.expect_nothing(Duration::from_millis(300));
}

/// B-459: after SIGKILL a session is sent again at most its Receive Maximum of what
/// it had acknowledged: with a window of 2 and a 1 s interval, however fast it
/// acknowledges, at most 2 of the 20 messages it took come back (DUP set), before the
/// one it never acknowledged.
#[test]
fn b459_after_sigkill_at_most_receive_maximum_messages_are_sent_again() {
    let yaml = config("local").replace(
        "  session:\n    storage: local\n",
        "  session:\n    storage: local\n    ack_commit_interval: 1s\n",
    );
    let broker = Broker::start_in(fresh_dir(), &yaml);
    let (mut s, _) = connected(
        &broker,
        with_receive_maximum(persistent("fast", true, 300), 2),
    );
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    publish_n(&broker, "news/a", "m", 20, QoS::AtLeastOnce);
    assert_eq!(receive(&mut s, 20), expected("m", 0..20));
    publish_n(&broker, "news/b", "last", 1, QoS::AtLeastOnce);
    assert_eq!(&s.recv_offer().payload[..], b"last-0");
    let dir = kill(broker);
    drop(s);
    let broker = Broker::start_in(dir, &yaml);
    let (mut s, present) = connected(
        &broker,
        with_receive_maximum(persistent("fast", false, 300), 30),
    );
    assert!(present);
    let mut again = Vec::new();
    loop {
        let p = s.recv_publish();
        let payload = String::from_utf8_lossy(&p.payload).into_owned();
        if payload == "last-0" {
            break;
        }
        assert!(p.dup, "{payload} was sent before: DUP set");
        again.push(payload);
    }
    assert!(again.len() <= 2, "sent again: {again:?}");
    // Whatever came back is the tail of what was acknowledged, in order.
    assert_eq!(again, expected("m", 20 - again.len()..20));
    s.expect_nothing(Duration::from_millis(300));
}

/// B-456 with a clean session beside it: the clean session is served as before and
/// nothing of it is logged (the log holds the persistent session's messages only).
#[test]
fn b456_a_clean_sessions_deliveries_are_not_logged() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let mut clean = Raw::connected(broker.addr, V5, "clean");
    assert_eq!(clean.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    publish_n(&broker, "news/a", "m", 3, QoS::AtLeastOnce);
    assert_eq!(receive(&mut clean, 3), expected("m", 0..3));
    let dir = kill(broker);
    assert_eq!(log_rows(&dir), 0);
}

/// A broker whose sessions and broadcast log share one small memory provider: about
/// eight 1000-byte messages fit the log (12KiB less the 3KiB reserve).
const TIGHT: &str = "broker:
  id: full-test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  operations:
    listen:
      unix:
        path: {dir}/ops.sock
  session:
    storage: tight
  limits:
    max_message_size: 2KiB
    max_header_bytes: 1KiB
  storage:
    default: tight
    default_retention_period: none
    default_retention_bytes: none
    providers:
      tight:
        type: memory
        max_bytes: 12KiB
        snapshot_dir: {dir}/snapshots
";

/// Publishes `count` 1000-byte QoS 1 messages `m-N`, each answered 0x00 though the
/// log is full (B-472: the loss is the sessions', not the publisher's).
fn flood(broker: &Broker, count: usize) {
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    for i in 0..count {
        let mut payload = format!("m-{i}").into_bytes();
        payload.resize(1000, b' ');
        assert_eq!(
            p.publish("news/x", &payload, QoS::AtLeastOnce, false),
            Some(0),
            "m-{i}"
        );
    }
    p.disconnect();
}

fn trimmed(payloads: Vec<String>) -> Vec<String> {
    payloads
        .into_iter()
        .map(|p| p.trim_end().to_string())
        .collect()
}

/// `saguin_session_deliveries_dropped_total{cause="storage_full"}`.
fn dropped_storage_full(broker: &Broker) -> usize {
    let ops =
        std::os::unix::net::UnixStream::connect(broker.dir.join("ops.sock")).expect("ops socket");
    let (status, body) = common::http_get(ops, "/metrics");
    assert_eq!(status, 200);
    let line = "saguin_session_deliveries_dropped_total{cause=\"storage_full\"} ";
    body.lines()
        .find_map(|l| l.strip_prefix(line))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no storage_full line in {body}"))
}

/// B-472, B-474: with the log's provider full, the oldest messages owed to a session
/// that is away go to make room, each lost delivery counted, the publisher answered
/// 0x00 every time, and a warning logged naming the provider and the remedy; the
/// session resumes with the newest, in order.
#[test]
fn b472_a_full_log_gives_up_its_oldest_and_counts_them() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    subscribe_and_leave(&broker, "keeper", "news/#", QoS::AtLeastOnce);
    flood(&broker, 14);
    let warning = broker.wait_log("broadcast log on storage provider tight is full");
    assert!(warning.contains("a larger max_bytes"), "{warning}");
    let dropped = dropped_storage_full(&broker);
    assert!((1..14).contains(&dropped), "dropped {dropped}");
    let (mut s, present) = connected(&broker, persistent("keeper", false, 300));
    assert!(present);
    let kept = 14 - dropped;
    assert_eq!(trimmed(receive(&mut s, kept)), expected("m", dropped..14));
    s.expect_nothing(Duration::from_millis(300));
}

/// B-473: a message a session has on the wire unacknowledged is never given up for
/// room: after the flood and a graceful stop, the two it held unacknowledged come
/// back first, DUP set, then the newest.
#[test]
fn b473_what_is_on_the_wire_is_never_given_up_for_room() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    let (mut s, _) = connected(
        &broker,
        with_receive_maximum(persistent("busy", true, 300), 2),
    );
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    flood(&broker, 14);
    let held: Vec<String> = (0..2)
        .map(|_| {
            String::from_utf8_lossy(&s.recv_offer().payload)
                .trim_end()
                .to_string()
        })
        .collect();
    assert_eq!(held, expected("m", 0..2));
    let dropped = dropped_storage_full(&broker);
    assert!((1..12).contains(&dropped), "dropped {dropped}");
    let dir = broker.stop();
    drop(s);
    let broker = Broker::start_in(dir, TIGHT);
    let (mut s, present) = connected(
        &broker,
        with_receive_maximum(persistent("busy", false, 300), 20),
    );
    assert!(present);
    for want in ["m-0", "m-1"] {
        let p = s.recv_publish();
        assert_eq!(String::from_utf8_lossy(&p.payload).trim_end(), want);
        assert!(p.dup, "{want} was on the wire: DUP set");
    }
    let rest = 12 - dropped;
    assert_eq!(trimmed(receive(&mut s, rest)), expected("m", 14 - rest..14));
    s.expect_nothing(Duration::from_millis(300));
}

/// B-473: when everything in the log is on the wire unacknowledged, nothing can go,
/// and the new message is not kept: the session is not sent it, and it is counted.
#[test]
fn b473_a_message_nothing_can_make_room_for_is_not_kept() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    let (mut s, _) = connected(
        &broker,
        with_receive_maximum(persistent("slow", true, 300), 50),
    );
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    flood(&broker, 14);
    let mut got = Vec::new();
    while let Ok(Packet::Publish(p)) = s.expect_nothing_or_packet(Duration::from_millis(500)) {
        got.push(String::from_utf8_lossy(&p.payload).trim_end().to_string());
    }
    let dropped = dropped_storage_full(&broker);
    assert!(dropped >= 1, "dropped {dropped}");
    assert_eq!(
        got,
        expected("m", 0..14 - dropped),
        "the oldest kept, the rest not"
    );
}
