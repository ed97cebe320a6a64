//! Held inbound QoS 2 publishes survive a restart (RFC 0002 "Exactly-once publishes:
//! broker.qos2"; B-441..B-443, gaps G-13 "Exactly once"): a session that outlives its
//! connection keeps each publish it was sent PUBREC for in the provider of the
//! channel it is for (or the broadcast log's, `broker.session.storage`), the PUBREL
//! writes the record and removes the held publish in one store operation, and what
//! a restart finds is handed back to the session that comes back - or dropped and
//! counted when it does not.

mod common;

use std::path::Path;
use std::time::Duration;

use common::sessions::{
    config, connected, fresh_dir, kill, nothing_more, persistent, receive, subscribe_and_leave,
};
use common::{Broker, Raw, opts};
use saguin::codec::{self, Packet, ProtocolVersion::V5, QoS};

const NOT_FOUND: u8 = 0x92;

/// Sends a QoS 2 PUBLISH with packet id `id` and returns its PUBREC's code.
fn pubrec(raw: &mut Raw, topic: &str, payload: &[u8], id: u16, dup: bool) -> u8 {
    let mut p = common::publish(topic, payload, QoS::ExactlyOnce, false);
    p.packet_id = Some(id);
    p.dup = dup;
    raw.send(&Packet::Publish(p));
    match raw.recv() {
        Packet::PubRec(ack) => {
            assert_eq!(ack.packet_id, id);
            ack.code
        }
        other => panic!("expected PUBREC, got {other:?}"),
    }
}

/// Sends PUBREL for `id` and returns its PUBCOMP's code.
fn pubrel(raw: &mut Raw, id: u16) -> u8 {
    raw.send(&Packet::PubRel(codec::Ack::new(id, 0)));
    match raw.recv() {
        Packet::PubComp(ack) => {
            assert_eq!(ack.packet_id, id);
            ack.code
        }
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
}

/// A count from the sqlite file, read once the broker is gone.
fn count(dir: &Path, sql: &str) -> i64 {
    let db = rusqlite::Connection::open(dir.join("saguin.db")).expect("open the file");
    db.query_row(sql, [], |row| row.get(0)).expect("count")
}

/// Held publishes in the sqlite file.
fn held_rows(dir: &Path) -> i64 {
    count(dir, "SELECT count(*) FROM held")
}

/// Records of channel `name` in the sqlite file.
fn records_of(dir: &Path, name: &str) -> i64 {
    count(
        dir,
        &format!(
            "SELECT count(*) FROM records r JOIN channels c ON c.id = r.channel_id \
             WHERE c.name = '{name}'"
        ),
    )
}

/// A reader of `filter` (a fresh clean session) gets exactly `want`, and nothing more.
fn read_exactly(broker: &Broker, client_id: &str, filter: &str, want: &[&str]) {
    let mut reader = Raw::connected(broker.addr, V5, client_id);
    assert_eq!(reader.subscribe(filter, opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(receive(&mut reader, want.len()), want);
    nothing_more(&mut reader, Duration::from_millis(400));
}

/// B-441, B-442, B-443 (sqlite, append channel): a held publish is in the channel's
/// provider from its PUBREC, survives SIGKILL, and is handed back to the resumed
/// session: its PUBREL completes it 0x00 and writes the record once; a second
/// PUBREL finds nothing (0x92).
#[test]
fn b443_held_publish_survives_sigkill_on_sqlite_channel() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut p, _) = connected(&broker, persistent("holder", true, 300));
    assert_eq!(pubrec(&mut p, "events/held", b"once", 7, false), 0);
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 1, "B-441: kept in the channel's provider");
    assert_eq!(
        records_of(&dir, "events"),
        0,
        "B-442: no record before PUBREL"
    );

    let broker = Broker::start_in(dir, &config("local"));
    let (mut p, present) = connected(&broker, persistent("holder", false, 300));
    assert!(present);
    assert_eq!(pubrel(&mut p, 7), 0, "B-443: handed back to the session");
    assert_eq!(pubrel(&mut p, 7), NOT_FOUND, "completed once");
    read_exactly(&broker, "reader", "events/#", &["once"]);
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 0, "B-442: released with the record");
    assert_eq!(records_of(&dir, "events"), 1, "exactly one record");
}

/// B-441, B-442, B-443 (sqlite, broadcast): a held broadcast is kept in the
/// broadcast log's provider; after SIGKILL its PUBREL writes the one log record a
/// persistent subscriber is owed and removes the held publish in the same
/// transaction, and the subscriber gets it once.
#[test]
fn b442_held_broadcast_survives_sigkill_and_reaches_a_persistent_subscriber_once() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    subscribe_and_leave(&broker, "keeper", "news/#", QoS::ExactlyOnce);
    let (mut p, _) = connected(&broker, persistent("holder", true, 300));
    assert_eq!(pubrec(&mut p, "news/held", b"once", 9, false), 0);
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 1, "B-441: kept in broker.session.storage");
    assert_eq!(records_of(&dir, "$broadcast"), 0);

    let broker = Broker::start_in(dir, &config("local"));
    let (mut p, present) = connected(&broker, persistent("holder", false, 300));
    assert!(present);
    assert_eq!(pubrel(&mut p, 9), 0);
    // Killed right after the PUBCOMP: the release and the log record are one
    // transaction, so both are there or neither.
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 0, "B-442");
    assert_eq!(records_of(&dir, "$broadcast"), 1, "B-442");

    let broker = Broker::start_in(dir, &config("local"));
    let (mut s, present) = connected(&broker, persistent("keeper", false, 300));
    assert!(present);
    assert_eq!(receive(&mut s, 1), ["once"]);
    nothing_more(&mut s, Duration::from_millis(400));
    let (mut p, present) = connected(&broker, persistent("holder", false, 300));
    assert!(present);
    assert_eq!(pubrel(&mut p, 9), NOT_FOUND, "nothing held any more");
}

/// B-443 (memory provider): a held publish survives a graceful stop through the
/// snapshot, and its PUBREL completes it after the start.
#[test]
fn b443_held_publish_survives_a_graceful_stop_on_memory() {
    let broker = Broker::start_in(fresh_dir(), &config("volatile"));
    let (mut p, _) = connected(&broker, persistent("holder", true, 300));
    assert_eq!(pubrec(&mut p, "memlog/held", b"kept", 3, false), 0);
    assert_eq!(pubrec(&mut p, "news/held", b"broadcast", 4, false), 0);
    let dir = broker.stop();
    drop(p);
    assert!(
        dir.join("snapshots/held.qos2").exists(),
        "B-443: in the snapshot"
    );

    let broker = Broker::start_in(dir, &config("volatile"));
    let (mut p, present) = connected(&broker, persistent("holder", false, 300));
    assert!(present);
    let mut late = Raw::connected(broker.addr, V5, "listener");
    assert_eq!(late.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(pubrel(&mut p, 3), 0);
    assert_eq!(pubrel(&mut p, 4), 0);
    assert_eq!(pubrel(&mut p, 3), NOT_FOUND);
    assert_eq!(receive(&mut late, 1), ["broadcast"]);
    nothing_more(&mut late, Duration::from_millis(300));
    read_exactly(&broker, "reader", "memlog/#", &["kept"]);
    // Released: the next graceful stop keeps nothing held.
    let dir = broker.stop();
    assert!(!dir.join("snapshots/held.qos2").exists());
}

/// B-443: an exchange whose session does not come back (it expired while the
/// broker was stopped) is dropped at the start, logged and counted in
/// `saguin_qos2_abandoned_total`, and its record is never written.
#[test]
fn b443_held_publish_of_a_session_that_does_not_return_is_dropped_and_counted() {
    let yaml = config("local").replace(
        "  mqtt:\n",
        "  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\n  mqtt:\n",
    );
    let broker = Broker::start_in(fresh_dir(), &yaml);
    let (mut p, _) = connected(&broker, persistent("brief", true, 2));
    assert_eq!(pubrec(&mut p, "events/never", b"never", 5, false), 0);
    p.disconnect();
    broker.wait_log("brief disconnected");
    let dir = kill(broker);
    assert_eq!(held_rows(&dir), 1);
    std::thread::sleep(Duration::from_millis(2500));

    let broker = Broker::start_in(dir, &yaml);
    assert!(
        broker
            .startup
            .iter()
            .any(|l| l.contains("held QoS 2 publishes read back: 0 handed")
                && l.contains("1 dropped")),
        "the start says what it dropped: {:#?}",
        broker.startup
    );
    broker.assert_metric("saguin_qos2_abandoned_total 1");
    let (mut p, present) = connected(&broker, persistent("brief", false, 2));
    assert!(!present);
    assert_eq!(pubrel(&mut p, 5), NOT_FOUND);
    read_exactly(&broker, "reader", "events/#", &[]);
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 0, "forgotten at the start");
    assert_eq!(records_of(&dir, "events"), 0, "never written");
}

/// Gaps G-13: a DUP re-send of a held publish after the restart gets the same PUBREC
/// and is not kept twice; its PUBREL still yields exactly one record (B-442).
#[test]
fn g13_a_dup_resend_after_a_restart_is_answered_and_kept_once() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut p, _) = connected(&broker, persistent("holder", true, 300));
    assert_eq!(pubrec(&mut p, "events/dup", b"one", 11, false), 0);
    assert_eq!(pubrec(&mut p, "events/dup", b"one", 11, true), 0);
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 1);

    let broker = Broker::start_in(dir, &config("local"));
    let (mut p, present) = connected(&broker, persistent("holder", false, 300));
    assert!(present);
    assert_eq!(pubrec(&mut p, "events/dup", b"one", 11, true), 0);
    assert_eq!(pubrel(&mut p, 11), 0);
    assert_eq!(pubrel(&mut p, 11), NOT_FOUND);
    read_exactly(&broker, "reader", "events/#", &["one"]);
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 0);
    assert_eq!(records_of(&dir, "events"), 1);
}

/// A Clean Start ends the session and its held exchanges leave storage with it; a
/// clean session's QoS 2 keeps nothing in storage at all (it is held in memory,
/// as before).
#[test]
fn b441_a_clean_start_drops_held_publishes_and_clean_sessions_store_none() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut p, _) = connected(&broker, persistent("holder", true, 300));
    assert_eq!(pubrec(&mut p, "events/a", b"a", 1, false), 0);
    drop(p);
    let (mut p, present) = connected(&broker, persistent("holder", true, 300));
    assert!(!present);
    assert_eq!(pubrel(&mut p, 1), NOT_FOUND);
    let mut clean = Raw::connected(broker.addr, V5, "clean");
    assert_eq!(pubrec(&mut clean, "events/b", b"b", 2, false), 0);
    let dir = kill(broker);
    drop((p, clean));
    assert_eq!(held_rows(&dir), 0);
    assert_eq!(records_of(&dir, "events"), 0);
}

/// A-269 with B-441: a held publish abandoned after `broker.qos2.expires_after` is
/// deleted from storage too, and its late PUBREL is answered 0x92.
#[test]
fn b441_an_abandoned_held_publish_leaves_storage() {
    let yaml = config("local").replace("  mqtt:\n", "  qos2:\n    expires_after: 1s\n  mqtt:\n");
    let broker = Broker::start_in(fresh_dir(), &yaml);
    let (mut p, _) = connected(&broker, persistent("slow", true, 300));
    assert_eq!(pubrec(&mut p, "events/late", b"late", 2, false), 0);
    broker.wait_log("QoS 2 publishes abandoned");
    assert_eq!(pubrel(&mut p, 2), NOT_FOUND);
    // The tick that abandoned it forgets it in storage right after: watched in the
    // file beside the broker (WAL).
    common::wait_until("the abandoned publish gone from storage", || {
        held_rows(&broker.dir) == 0
    });
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 0);
    assert_eq!(records_of(&dir, "events"), 0);
}

/// The retained store on `small` (1 MiB), sessions and held publishes on `sessions`.
const RETAINED_SMALL: &str = "broker:
  id: release-room
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  session:
    storage: sessions
  limits:
    max_message_size: 64KiB
    session_queue_bytes: 8MiB
  storage:
    default: small
    default_retention_period: none
    default_retention_bytes: none
    providers:
      small:
        type: memory
        max_bytes: 1MiB
        snapshot_dir: none
      sessions:
        type: memory
        max_bytes: 1MiB
        snapshot_dir: none
";

/// a PUBREL whose release finds the retained store's provider full (filled
/// after the PUBREC) is DISCONNECT 0x97 and the message stays held; the PUBREL sent
/// again on the next connection completes it once there is room.
#[test]
fn a_pubrel_refused_for_room_is_disconnect_0x97_and_completes_later_a268() {
    let broker = Broker::start_with(RETAINED_SMALL);
    let payload = vec![b'h'; 50 << 10];
    let (mut releaser, _) = connected(&broker, persistent("releaser", true, 300));
    let mut held = common::publish("full/held", &payload, QoS::ExactlyOnce, true);
    held.packet_id = Some(3);
    releaser.send(&Packet::Publish(held));
    match releaser.recv() {
        Packet::PubRec(ack) => assert_eq!(ack.code, 0),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    let mut filler = Raw::connected(broker.addr, V5, "filler");
    let mut filled = Vec::new();
    for i in 0..40 {
        let topic = format!("full/{i:02}");
        match filler.publish(&topic, &payload, QoS::AtLeastOnce, true) {
            Some(0) => filled.push(topic),
            code => {
                assert_eq!(code, Some(0x97), "{topic}");
                break;
            }
        }
    }
    assert!(filled.len() < 40, "the retained store filled");
    releaser.send(&Packet::PubRel(codec::Ack::new(3, 0)));
    assert_eq!(releaser.expect_disconnect(), 0x97);
    for topic in &filled[..3] {
        assert_eq!(filler.publish(topic, b"", QoS::AtLeastOnce, true), Some(0));
    }
    let (mut again, present) = connected(&broker, persistent("releaser", false, 300));
    assert!(present, "the session and its held publish are kept");
    assert_eq!(pubrel(&mut again, 3), 0, "released now there is room");
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(reader.subscribe("full/held", opts(QoS::AtLeastOnce)), [1]);
    let value = reader.recv_publish();
    assert!(value.retain && value.payload.len() == payload.len());
}

/// A-268, the channel half. A session that outlives its connection stores its held
/// publish in the channel's provider before the PUBREC (B-441), so the room the
/// release needs is taken then: a provider filled after the PUBREC does not refuse
/// the PUBREL. A session that ends with its connection holds it in memory only, and
/// its PUBREL into the filled channel is DISCONNECT 0x97; the value is not served.
#[test]
fn a_pubrel_into_a_channel_filled_after_the_pubrec_a268() {
    let yaml = format!(
        "{RETAINED_SMALL}channels:\n  state:\n    type: latest\n    filter: state/#\n    storage: small\n"
    );
    let broker = Broker::start_with(&yaml);
    let payload = vec![b'h'; 50 << 10];
    let (mut stored, _) = connected(&broker, persistent("stored", true, 300));
    let (mut in_memory, _) = connected(&broker, persistent("in-memory", true, 0));
    assert_eq!(pubrec(&mut stored, "state/stored", &payload, 3, false), 0);
    assert_eq!(
        pubrec(&mut in_memory, "state/in-memory", &payload, 4, false),
        0
    );
    let mut filler = Raw::connected(broker.addr, V5, "filler");
    let mut filled = 0;
    while filled < 40 {
        match filler.publish(
            &format!("state/{filled:02}"),
            &payload,
            QoS::AtLeastOnce,
            false,
        ) {
            Some(0) => filled += 1,
            code => {
                assert_eq!(code, Some(0x97), "after {filled}");
                break;
            }
        }
    }
    assert!(filled < 40, "the channel's provider filled");
    assert_eq!(
        pubrel(&mut stored, 3),
        0,
        "its room was taken at the PUBREC"
    );
    in_memory.send(&Packet::PubRel(codec::Ack::new(4, 0)));
    assert_eq!(in_memory.expect_disconnect(), 0x97);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("state/stored", opts(QoS::AtLeastOnce)),
        [1]
    );
    let value = reader.recv_publish();
    assert!(value.retain && value.payload.len() == payload.len());
    assert_eq!(
        reader.subscribe("state/in-memory", opts(QoS::AtLeastOnce)),
        [1]
    );
    reader.expect_nothing(Duration::from_millis(300));
}

/// A memory provider whose 12 KiB (less the 3 KiB reserve) hold the session records
/// and the held publishes.
const TIGHT: &str = "broker:
  id: held-tight
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
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

/// B-441: held publishes count against their provider's `max_bytes`: past it the
/// next is refused on its PUBREC (0x97) with the connection left alone, and a
/// release gives the room back.
#[test]
fn b441_held_publishes_count_against_the_providers_max_bytes() {
    let broker = Broker::start_in(fresh_dir(), TIGHT);
    let (mut p, _) = connected(&broker, persistent("big", true, 300));
    let payload = vec![b'x'; 1000];
    let mut accepted = Vec::new();
    let refused = (1..=12u16).find(|&id| {
        let code = pubrec(&mut p, "news/big", &payload, id, false);
        if code == 0 {
            accepted.push(id);
        }
        code != 0
    });
    let refused = refused.expect("the provider fills before 12 KiB of held publishes");
    assert!(!accepted.is_empty(), "some fit");
    assert_eq!(
        pubrec(&mut p, "news/big", &payload, refused, false),
        0x97,
        "B-441: still full"
    );
    assert_eq!(pubrel(&mut p, accepted[0]), 0);
    assert_eq!(
        pubrec(&mut p, "news/big", &payload, refused, false),
        0,
        "the release gave its room back"
    );
}

/// A sqlite file from before held publishes were kept (no `held` table) opens as it
/// is and takes them: the table is created if it does not exist.
#[test]
fn b441_a_file_without_the_held_table_opens_and_keeps_them() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let dir = kill(broker);
    {
        let db = rusqlite::Connection::open(dir.join("saguin.db")).expect("open the file");
        db.execute_batch("DROP TABLE held").expect("drop the table");
    }
    let broker = Broker::start_in(dir, &config("local"));
    let (mut p, _) = connected(&broker, persistent("holder", true, 300));
    assert_eq!(pubrec(&mut p, "events/old", b"old", 1, false), 0);
    let dir = kill(broker);
    drop(p);
    assert_eq!(held_rows(&dir), 1);
}

/// a QoS 2 publish past its channel's own `max_bytes` is refused on
/// its PUBREC (0x97) with nothing held, on either provider and for a session that
/// keeps its exchanges in storage as for one that ends with its connection: a PUBREL
/// for it is told 0x92 and the connection stays, where it was held and the PUBREL
/// ended the connection 0x97.
#[test]
fn a_qos2_publish_past_its_channels_max_bytes_is_refused_on_the_pubrec() {
    for provider in ["local", "volatile"] {
        let yaml = format!(
            "{}  capped:\n    type: append\n    storage: {provider}\n    max_bytes: 2KiB\n",
            config("local")
        );
        let broker = Broker::start_in(fresh_dir(), &yaml);
        let mut filler = connected(&broker, persistent("filler", true, 0)).0;
        let payload = vec![b'x'; 500];
        let mut stored = 0;
        while filler.publish("capped/a", &payload, QoS::AtLeastOnce, false) == Some(0) {
            stored += 1;
            assert!(stored < 5, "{provider}: 2 KiB takes at most four");
        }
        assert!(stored >= 2, "{provider}: some fit");
        let mut kept = connected(&broker, persistent("kept", true, 300)).0;
        for (p, session) in [(&mut kept, "kept"), (&mut filler, "passing")] {
            let case = format!("{provider}, {session}");
            assert_eq!(
                pubrec(p, "capped/a", &payload, 7, false),
                0x97,
                "{case}: A-166 on the PUBREC"
            );
            assert_eq!(pubrel(p, 7), NOT_FOUND, "{case}: nothing held");
        }
        for (p, id) in [(&mut kept, 8), (&mut filler, 9)] {
            assert_eq!(
                pubrec(p, "capped/a", b"", id, false),
                0,
                "{provider}: it fits"
            );
            assert_eq!(pubrel(p, id), 0);
        }
    }
}
