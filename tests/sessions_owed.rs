//! What a persistent session is owed survives a restart (B-456..B-459; gaps G-14
//! "Broadcast"): a QoS 1/2 broadcast owed to a session that outlives its connection
//! is written once to the broadcast log of `broker.session.storage` before the
//! publisher's PUBACK, and the session's place in it is written at most
//! `ack_commit_interval` after it moves, and at a clean DISCONNECT or a graceful stop.
//! On sqlite that survives SIGKILL, on memory a graceful stop (B-455).

mod common;

use std::path::Path;
use std::time::Duration;

use common::sessions::{
    config, connected, expected, fresh_dir, kill, nothing_more, persistent, publish_n, receive,
    subscribe_and_leave, with_receive_maximum,
};
use common::{Broker, Raw, opts};
use saguin::codec::{self, Packet, ProtocolVersion::V5, QoS};

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

/// B-156: the broadcast log is read on the write connection, never a read-only one:
/// a sqlite provider holding only the session store and its log (no channel, the
/// retained store elsewhere), with `read_connections: 1`, reads the log back at
/// startup and hands the resumed session what it is owed with only its write
/// connection open on the file.
#[test]
fn the_broadcast_log_is_read_on_the_write_connection_b156() {
    let yaml = "broker:
  id: b156
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  session:
    storage: local
  retained:
    storage: volatile
  storage:
    default: volatile
    default_retention_period: 7d
    default_retention_bytes: none
    providers:
      local:
        type: sqlite
        file_path: {dir}/saguin.db
        read_connections: 1
      volatile:
        type: memory
        max_bytes: 64MiB
        snapshot_dir: none
";
    let broker = Broker::start_in(fresh_dir(), yaml);
    subscribe_and_leave(&broker, "keeper", "news/#", QoS::AtLeastOnce);
    publish_n(&broker, "news/today", "owed", 2, QoS::AtLeastOnce);
    let dir = kill(broker);
    let broker = Broker::start_in(dir.clone(), yaml);
    let (mut s, present) = connected(&broker, persistent("keeper", false, 300));
    assert!(present);
    assert_eq!(receive(&mut s, 2), expected("owed", 0..2));
    let file = dir.join("saguin.db");
    let opened = std::fs::read_dir(format!("/proc/{}/fd", broker.pid()))
        .expect("the broker's descriptors")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| *target == file)
        .count();
    assert_eq!(
        opened,
        1,
        "{} opened more than the write connection",
        file.display()
    );
}

/// B-456, B-455, C-210: QoS 1 broadcasts queued for a session that is away, each PUBACKed,
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

/// MQTT-3.1.2-4, gaps G-10: a broadcast the log keeps for an away session is that
/// session's. Its client starting a new session (Clean Start, a new expiry) discards
/// it, and it is not handed to the new session at a restart, though the record stays
/// in the log for another session still owed it; that one gets it.
#[test]
fn a_replaced_sessions_owed_broadcasts_are_not_handed_to_its_successor_after_a_restart() {
    for provider in ["local", "volatile"] {
        let broker = Broker::start_in(fresh_dir(), &config(provider));
        subscribe_and_leave(&broker, "replaced", "news/#", QoS::AtLeastOnce);
        subscribe_and_leave(&broker, "other", "news/#", QoS::AtLeastOnce);
        publish_n(&broker, "news/today", "owed", 1, QoS::AtLeastOnce);
        // A new session under the same id, subscribed to nothing, away again.
        let (fresh, present) = connected(&broker, persistent("replaced", true, 300));
        assert!(!present);
        fresh.disconnect();
        broker.wait_log("replaced disconnected");
        let dir = broker.stop();
        let broker = Broker::start_in(dir, &config(provider));
        let (mut resumed, present) = connected(&broker, persistent("replaced", false, 300));
        assert!(present, "{provider}");
        nothing_more(&mut resumed, Duration::from_millis(500));
        let (mut other, present) = connected(&broker, persistent("other", false, 300));
        assert!(present, "{provider}");
        assert_eq!(receive(&mut other, 1), expected("owed", 0..1), "{provider}");
    }
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
    // Housekeeping deletes what nobody needs within a tick or two: watched in the
    // file beside the broker (WAL).
    common::wait_until("the acknowledged log records deleted", || {
        log_rows(&broker.dir) == 0
    });
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

/// MQTT-3.3.4-9 at a resume: a client that comes back with a lower Receive Maximum
/// than it had on the wire is sent again only that many; the rest follow as it
/// settles, each under the packet identifier it had and DUP set (MQTT-4.4.0-1), then
/// what was never sent. A broadcast at QoS 1 here, a channel's record at QoS 2 below.
#[test]
fn a_resume_with_a_lower_receive_maximum_is_sent_again_only_that_many() {
    let yaml = config("volatile");
    resume_with_a_lower_receive_maximum(&yaml, "news/#", "news/a", QoS::AtLeastOnce);
}

#[test]
fn a_channels_records_at_qos2_resume_within_a_lower_receive_maximum() {
    let yaml = config("volatile");
    resume_with_a_lower_receive_maximum(&yaml, "events/#", "events/a", QoS::ExactlyOnce);
}

/// With no session storage, a broadcast on the wire has no log record to name it:
/// it keeps its identifier all the same.
#[test]
fn unlogged_broadcasts_at_qos2_resume_within_a_lower_receive_maximum() {
    let yaml = common::CHANNELS;
    resume_with_a_lower_receive_maximum(yaml, "news/#", "news/a", QoS::ExactlyOnce);
}

fn resume_with_a_lower_receive_maximum(yaml: &str, filter: &str, topic: &str, qos: QoS) {
    let broker = Broker::start_in(fresh_dir(), yaml);
    let (mut s, _) = connected(
        &broker,
        with_receive_maximum(persistent("shrink", true, 300), 6),
    );
    assert_eq!(s.subscribe(filter, opts(qos)), [qos as u8]);
    publish_n(&broker, topic, "m", 8, qos);
    let first: Vec<_> = (0..6).map(|_| s.recv_offer()).collect(); // none settled
    drop(s);
    broker.wait_log("shrink disconnected");
    let (mut s, present) = connected(
        &broker,
        with_receive_maximum(persistent("shrink", false, 300), 2),
    );
    assert!(present);
    let mut open: std::collections::VecDeque<_> = (0..2).map(|_| s.recv_offer()).collect();
    s.expect_nothing(Duration::from_millis(300)); // a window of 2 is full
    let mut got = Vec::new();
    while let Some(oldest) = open.pop_front() {
        let id = oldest.packet_id.expect("QoS 1 or 2");
        if qos == QoS::AtLeastOnce {
            s.send(&Packet::PubAck(codec::Ack::new(id, 0)));
        } else {
            s.send(&Packet::PubRec(codec::Ack::new(id, 0)));
            assert!(matches!(s.recv(), Packet::PubRel(a) if a.packet_id == id));
            s.send(&Packet::PubComp(codec::Ack::new(id, 0)));
        }
        got.push(oldest);
        if got.len() + open.len() < 8 {
            open.push_back(s.recv_offer());
        }
    }
    let payloads: Vec<_> = got
        .iter()
        .map(|p| String::from_utf8_lossy(&p.payload))
        .collect();
    assert_eq!(payloads, expected("m", 0..8));
    for (again, before) in got.iter().zip(&first) {
        assert!(again.dup, "on the wire before: DUP set");
        assert_eq!(
            again.packet_id, before.packet_id,
            "MQTT-4.4.0-1: its identifier"
        );
    }
    assert!(!got[6].dup && !got[7].dup, "never sent before");
    s.expect_nothing(Duration::from_millis(300));
}

/// MQTT-3.1.2-25 beside MQTT-3.3.4-9: what a resume cannot send again for the new
/// Maximum Packet Size is done with, and the room it leaves goes to the next
/// exchange owed, before anything queued (MQTT-4.6.0-5), not left waiting for an
/// acknowledgement that will never come.
#[test]
fn a_resend_too_large_for_the_new_connection_gives_its_room_to_the_next() {
    let broker = Broker::start_in(fresh_dir(), &config("volatile"));
    let (mut s, _) = connected(
        &broker,
        with_receive_maximum(persistent("shrunk", true, 300), 5),
    );
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    let big = "m".repeat(2_000);
    for i in 0..8 {
        let payload = if i == 2 || i == 3 {
            big.clone()
        } else {
            format!("m-{i}")
        };
        assert_eq!(
            p.publish("news/a", payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    for _ in 0..5 {
        s.recv_offer(); // none acknowledged
    }
    drop(s);
    broker.wait_log("shrunk disconnected");
    let mut c = with_receive_maximum(persistent("shrunk", false, 300), 2);
    c.properties.edit().maximum_packet_size = Some(1_000);
    let (mut s, present) = connected(&broker, c);
    assert!(present);
    let window = [s.recv_offer(), s.recv_offer()];
    // Both settled at once: the next two owed are both too large, and nothing else
    // is on the wire for the client to answer.
    let mut both = Vec::new();
    for p in &window {
        let id = p.packet_id.expect("QoS 1");
        codec::encode(&Packet::PubAck(codec::Ack::new(id, 0)), V5, &mut both);
    }
    s.send_bytes(&both);
    let payloads: Vec<_> = window.iter().map(|p| p.payload.to_vec()).collect();
    assert_eq!(payloads, [b"m-0".to_vec(), b"m-1".to_vec()]);
    assert_eq!(receive(&mut s, 4), ["m-4", "m-5", "m-6", "m-7"]);
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

/// RFC 0003 "Retained messages" (MQTT-4.4.0-1): a retained value sent on SUBSCRIBE
/// at QoS 1 to a session that outlives its connection is kept in the broadcast log
/// for that session alone; unacknowledged at a SIGKILL, it is sent again after the
/// restart with RETAIN and DUP set.
#[test]
fn a_retained_value_sent_on_subscribe_is_kept_until_acknowledged() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(
        p.publish("status/a", b"on", QoS::AtLeastOnce, true),
        Some(0)
    );
    p.disconnect();
    let (mut s, _) = connected(&broker, persistent("late", true, 300));
    assert_eq!(s.subscribe("status/#", opts(QoS::AtLeastOnce)), [1]);
    let first = s.recv_offer();
    assert!(first.retain);
    let dir = kill(broker);
    drop(s);
    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, persistent("late", false, 300));
    assert!(present);
    let again = s.recv_publish();
    assert_eq!(
        (&again.payload[..], again.retain, again.dup),
        (&b"on"[..], true, true)
    );
    s.expect_nothing(Duration::from_millis(300));
}

/// B-447: a shared group's delivery held for its only member, away with a session
/// that outlives its connection, is in the broadcast log with its
/// `broker.share.expires_after` deadline, and survives SIGKILL: the member resuming
/// after the restart is sent it.
#[test]
fn b447_a_groups_held_delivery_survives_sigkill() {
    let yaml = config("local").replace(
        "  session:\n",
        "  share:\n    expires_after: 60s\n  session:\n",
    );
    let broker = Broker::start_in(fresh_dir(), &yaml);
    subscribe_and_leave(&broker, "member", "$share/g/tasks/#", QoS::AtLeastOnce);
    publish_n(&broker, "tasks/1", "job", 2, QoS::AtLeastOnce);
    let dir = kill(broker);
    let broker = Broker::start_in(dir, &yaml);
    let (mut s, present) = connected(&broker, persistent("member", false, 300));
    assert!(present);
    assert_eq!(receive(&mut s, 2), expected("job", 0..2));
    s.expect_nothing(Duration::from_millis(300));
}

/// INV-13, B-045: one SUBSCRIBE of many overlapping filters gathers no more retained
/// values than its session could hold: with 100 retained values of 1 KiB and a
/// 16 KiB bound, seven filters that each match all of them used to put 700 copies
/// into the broadcast log of a session that outlives its connection.
#[test]
fn retained_values_gathered_for_one_subscribe_stop_at_the_session_bound() {
    let yaml = config("local").replace(
        "  id: channels-test\n",
        "  id: channels-test\n  limits:\n    max_message_size: 16KiB\n    max_connect_size: 8KiB\n    session_queue_bytes: 16KiB\n",
    );
    let broker = Broker::start_in(fresh_dir(), &yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "retainer");
    for i in 0..100 {
        let topic = format!("kept/{i}");
        assert_eq!(
            publisher.publish(&topic, &[b'r'; 1024], QoS::AtLeastOnce, true),
            Some(0)
        );
    }
    let (mut s, _) = connected(&broker, persistent("gatherer", true, 300));
    // Seven filters, each matching every value: 700 copies asked for.
    let filters = ["kept/#", "kept/+", "+/+", "#", "+/#", "kept/+/#", "+/+/#"];
    let subscribe = saguin::codec::Subscribe {
        packet_id: 1,
        filters: filters
            .iter()
            .map(|f| (f.to_string(), opts(QoS::AtLeastOnce)))
            .collect(),
        properties: Default::default(),
    };
    s.send(&saguin::codec::Packet::Subscribe(subscribe));
    let mut received = 0;
    loop {
        match s.expect_nothing_or_packet(Duration::from_millis(500)) {
            Ok(saguin::codec::Packet::Publish(_)) => received += 1,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    assert!(received > 0);
    let dir = broker.stop();
    // How many records the log was ever given: its next offset. The bound's worth
    // (16 of about 1.1 KiB each) and one more, not 700.
    let db = rusqlite::Connection::open(dir.join("saguin.db")).expect("open the file");
    let written: i64 = db
        .query_row(
            "SELECT next_offset FROM channels WHERE name = '$broadcast'",
            [],
            |row| row.get(0),
        )
        .expect("the log's next offset");
    assert!(written <= 20, "{written} log records for one SUBSCRIBE");
}
