//! A persistent session's record across a broker restart (B-454, B-455, B-460,
//! B-463; C-278..C-283; gaps G-10 "Sessions"): kept by `broker.session.storage`, on
//! sqlite across a crash and on memory across a graceful stop. What a session is owed
//! across a restart (the broadcast log, B-456..B-459) is `tests/sessions_owed.rs`.

mod common;

use std::time::{Duration, Instant};

use common::sessions::{config, connected, fresh_dir, kill, persistent};
use common::{Broker, Raw, WAIT, connect, opts};
use saguin::codec::{
    self, Packet, Properties, PropertyValues,
    ProtocolVersion::{V5, V311},
    QoS,
};

/// Publishes one QoS 1 message from a client of its own.
fn publish(broker: &Broker, topic: &str, payload: &[u8]) {
    let mut p = Raw::connected(broker.addr, V5, "publisher");
    assert_eq!(p.publish(topic, payload, QoS::AtLeastOnce, false), Some(0));
    p.disconnect();
}

/// Resumes `client_id` after a restart and checks that, without subscribing again,
/// it is sent a publish to `topic`.
fn resumes_and_receives(broker: &Broker, c: codec::Connect, topic: &str) -> Raw {
    let (mut raw, present) = connected(broker, c);
    assert!(present, "the session came back (Session Present 1)");
    publish(broker, topic, b"after");
    let got = raw.recv_publish();
    assert_eq!(got.topic.as_ref() as &str, topic);
    assert_eq!(&got.payload[..], b"after");
    raw
}

/// B-454, B-455 (sqlite: a crash): a session subscribed to a broadcast topic, its
/// SUBACK sent, survives SIGKILL and is served again without subscribing.
#[test]
fn a_session_on_sqlite_survives_sigkill() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut s, present) = connected(&broker, persistent("keeper", true, 300));
    assert!(!present);
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    let dir = kill(broker);
    drop(s);
    let broker = Broker::start_in(dir, &config("local"));
    resumes_and_receives(&broker, persistent("keeper", false, 300), "news/today");
}

/// [`config`] on sqlite with `limits` (lines of `broker.limits`, indented four).
fn limited(limits: &str) -> String {
    config("local").replace(
        "  log_level: debug\n",
        &format!("  log_level: debug\n  limits:\n{limits}"),
    )
}

/// UNSUBSCRIBE `filters`; the UNSUBACK's codes.
fn unsubscribe(raw: &mut Raw, packet_id: u16, filters: &[&str]) -> Vec<u8> {
    raw.send(&Packet::Unsubscribe(codec::Unsubscribe {
        packet_id,
        properties: Properties::default(),
        filters: filters.iter().map(|f| f.to_string()).collect(),
    }));
    match raw.recv() {
        Packet::UnsubAck(ack) => ack.codes,
        other => panic!("expected UNSUBACK, got {other:?}"),
    }
}

/// B-098: a restored session holding more filters than a lowered max_subscriptions
/// keeps them all; a new filter is refused 0x97 until UNSUBSCRIBE brings it under.
#[test]
fn a_restored_session_over_a_lowered_max_subscriptions_keeps_its_filters_b098() {
    let broker = Broker::start_in(fresh_dir(), &limited("    max_subscriptions: 10\n"));
    let (mut s, _) = connected(&broker, persistent("many-filters", true, 300));
    for f in ["f/1", "f/2", "f/3", "f/4"] {
        assert_eq!(s.subscribe(f, opts(QoS::AtLeastOnce)), [1]);
    }
    let dir = kill(broker);
    drop(s);
    let broker = Broker::start_in(dir, &limited("    max_subscriptions: 2\n"));
    let (mut s, present) = connected(&broker, persistent("many-filters", false, 300));
    assert!(present);
    for f in ["f/1", "f/2", "f/3", "f/4"] {
        publish(&broker, f, b"kept");
        assert_eq!(&*s.recv_publish().topic, f, "every filter kept");
    }
    assert_eq!(s.subscribe("f/5", opts(QoS::AtLeastOnce)), [0x97]);
    assert_eq!(unsubscribe(&mut s, 20, &["f/1", "f/2"]), [0, 0]);
    assert_eq!(
        s.subscribe("f/5", opts(QoS::AtLeastOnce)),
        [0x97],
        "at 2 of 2"
    );
    assert_eq!(unsubscribe(&mut s, 21, &["f/3"]), [0]);
    assert_eq!(s.subscribe("f/5", opts(QoS::AtLeastOnce)), [1], "under it");
}

/// B-109: a restored session keeps a filter deeper than a lowered max_topic_levels,
/// and UNSUBSCRIBE is never checked against the limit.
#[test]
fn a_restored_session_keeps_a_filter_deeper_than_a_lowered_limit_b109() {
    // The configuration's own filters go to four levels (`work/+/todo/__dlq`).
    let broker = Broker::start_in(fresh_dir(), &limited("    max_topic_levels: 6\n"));
    let (mut s, _) = connected(&broker, persistent("deep-filter", true, 300));
    assert_eq!(s.subscribe("a/b/c/d/#", opts(QoS::AtLeastOnce)), [1]);
    let dir = kill(broker);
    drop(s);
    let broker = Broker::start_in(dir, &limited("    max_topic_levels: 4\n"));
    let (mut s, present) = connected(&broker, persistent("deep-filter", false, 300));
    assert!(present);
    // `a/b/c/d/#` has five levels, and matches `a/b/c/d`, which has four.
    publish(&broker, "a/b/c/d", b"kept");
    assert_eq!(
        &*s.recv_publish().topic,
        "a/b/c/d",
        "the deep filter was kept"
    );
    assert_eq!(
        s.subscribe("a/b/c/d/#", opts(QoS::AtLeastOnce)),
        [0x8F],
        "a new SUBSCRIBE is checked"
    );
    // Its UNSUBSCRIBE is not: it is removed, and one never held is 0x11, not 0x8F.
    assert_eq!(
        unsubscribe(&mut s, 30, &["a/b/c/d/#", "v/w/x/y/z"]),
        [0, 0x11]
    );
    publish(&broker, "a/b/c/d", b"gone");
    s.expect_nothing(Duration::from_millis(300));
}

/// B-455 (memory: a graceful stop): the snapshot keeps the session.
#[test]
fn a_session_on_memory_survives_a_graceful_stop() {
    let broker = Broker::start_in(fresh_dir(), &config("volatile"));
    let (mut s, _) = connected(&broker, persistent("keeper", true, 300));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    s.disconnect();
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &config("volatile"));
    resumes_and_receives(&broker, persistent("keeper", false, 300), "news/today");
}

/// B-455 with MQTT 3.1.1: cleanSession 0 is a session that never expires.
#[test]
fn a_v311_clean_session_0_survives_sigkill() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut s, _) = connected(&broker, connect(V311, "old-timer", false));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    let dir = kill(broker);
    let broker = Broker::start_in(dir, &config("local"));
    resumes_and_receives(&broker, connect(V311, "old-timer", false), "news/v311");
}

/// Gaps G-10 "A start ends sessions": a session whose expiry passed while the broker
/// was stopped is gone after the restart.
#[test]
fn a_session_that_expired_while_stopped_is_gone() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut s, _) = connected(&broker, persistent("brief", true, 1));
    assert_eq!(s.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    s.disconnect();
    broker.wait_log("brief disconnected");
    let dir = kill(broker);
    std::thread::sleep(Duration::from_millis(1500));
    let broker = Broker::start_in(dir, &config("local"));
    let (_, present) = connected(&broker, persistent("brief", false, 300));
    assert!(!present, "the expired session did not come back");
}

/// the Session Expiry Interval a DISCONNECT sends governs the session from then
/// on, across a restart: lengthened it outlives its CONNECT's interval, shortened it
/// ends on the new one.
#[test]
fn a_disconnects_session_expiry_governs_across_a_restart_a038() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut longer, _) = connected(&broker, persistent("lengthened", true, 1));
    assert_eq!(longer.subscribe("news/l", opts(QoS::AtLeastOnce)), [1]);
    let mut bye = codec::Disconnect::new(0);
    bye.properties.edit().session_expiry_interval = Some(600);
    longer.send(&Packet::Disconnect(bye));
    let _ = longer.read_to_close();
    let (mut shorter, _) = connected(&broker, persistent("shortened", true, 600));
    assert_eq!(shorter.subscribe("news/s", opts(QoS::AtLeastOnce)), [1]);
    let mut bye = codec::Disconnect::new(0);
    bye.properties.edit().session_expiry_interval = Some(1);
    shorter.send(&Packet::Disconnect(bye));
    let _ = shorter.read_to_close();
    // Past both records being written, and past the 1 s either would end on.
    std::thread::sleep(Duration::from_millis(1500));
    let dir = kill(broker);
    std::thread::sleep(Duration::from_millis(1000));
    let broker = Broker::start_in(dir, &config("local"));
    let (_, present) = connected(&broker, persistent("shortened", false, 600));
    assert!(!present, "expiry 1 s from the DISCONNECT ran out");
    resumes_and_receives(&broker, persistent("lengthened", false, 600), "news/l");
}

/// Clean Start 1 (G-10), DISCONNECT with expiry 0, and UNSUBSCRIBE (B-463) are what a
/// restart finds.
#[test]
fn clean_start_expiry_zero_and_unsubscribe_are_kept_across_a_restart() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    // Replaced by a Clean Start: present after the restart, with no subscription.
    let (mut a, _) = connected(&broker, persistent("replaced", true, 300));
    assert_eq!(a.subscribe("news/a", opts(QoS::AtLeastOnce)), [1]);
    a.disconnect();
    let (a, present) = connected(&broker, persistent("replaced", true, 300));
    assert!(!present);
    a.disconnect();
    // Ended by its DISCONNECT's expiry 0.
    let (mut b, _) = connected(&broker, persistent("ended", true, 300));
    assert_eq!(b.subscribe("news/b", opts(QoS::AtLeastOnce)), [1]);
    let mut bye = codec::Disconnect::new(0);
    bye.properties.edit().session_expiry_interval = Some(0);
    b.send(&Packet::Disconnect(bye));
    let _ = b.read_to_close();
    // One filter of two unsubscribed.
    let (mut c, _) = connected(&broker, persistent("narrowed", true, 300));
    assert_eq!(c.subscribe("news/c1", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(c.subscribe("news/c2", opts(QoS::AtLeastOnce)), [1]);
    c.send(&Packet::Unsubscribe(codec::Unsubscribe {
        packet_id: 2,
        properties: Properties::default(),
        filters: vec!["news/c2".into()],
    }));
    match c.recv() {
        Packet::UnsubAck(ack) => assert_eq!(ack.codes, [0]),
        other => panic!("expected UNSUBACK, got {other:?}"),
    }
    let dir = kill(broker);
    drop(c);

    let broker = Broker::start_in(dir, &config("local"));
    let (mut a, present) = connected(&broker, persistent("replaced", false, 300));
    assert!(present, "the session the Clean Start began is kept");
    let (_, present) = connected(&broker, persistent("ended", false, 300));
    assert!(!present, "a DISCONNECT with expiry 0 ended it");
    let (mut c, present) = connected(&broker, persistent("narrowed", false, 300));
    assert!(present);
    publish(&broker, "news/a", b"a");
    publish(&broker, "news/c2", b"c2");
    publish(&broker, "news/c1", b"c1");
    let got = c.recv_publish();
    assert_eq!(&got.payload[..], b"c1", "news/c2 was unsubscribed");
    a.expect_nothing(Duration::from_millis(300));
}

/// B-460, C-278, C-279: a Will waiting out its delay when the broker is killed is
/// published after the restart once what was left of the delay runs out.
#[test]
fn a_delayed_will_fires_after_a_crash_when_its_delay_runs_out() {
    const DELAY: u64 = 3;
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let mut c = persistent("mortal", true, 300);
    let properties = Properties::from(PropertyValues {
        will_delay_interval: Some(DELAY as u32),
        ..PropertyValues::default()
    });
    c.will = Some(codec::Will {
        topic: "gone/mortal".into(),
        payload: b"bye".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties,
    });
    let (raw, _) = connected(&broker, c);
    drop(raw); // no DISCONNECT: the Will is owed after its delay
    let dropped = Instant::now();
    broker.wait_log("mortal disconnected");
    let dir = kill(broker);

    let broker = Broker::start_in(dir, &config("local"));
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    assert_eq!(watcher.subscribe("gone/#", opts(QoS::AtLeastOnce)), [1]);
    let got = watcher.recv_publish();
    assert_eq!(got.topic.as_ref() as &str, "gone/mortal");
    assert_eq!(&got.payload[..], b"bye");
    let waited = dropped.elapsed();
    assert!(
        waited >= Duration::from_secs(DELAY) - Duration::from_millis(500) && waited < WAIT,
        "published {waited:?} after the connection ended, its delay {DELAY}s"
    );
}

/// C-281, MQTT-3.1.2-10: a delayed Will that has gone leaves its session's record,
/// so a restart does not publish it again.
#[test]
fn a_delayed_will_that_went_is_not_published_again_after_a_restart() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut watcher, _) = connected(&broker, persistent("watcher", true, 300));
    assert_eq!(watcher.subscribe("gone/#", opts(QoS::AtLeastOnce)), [1]);
    let mut c = persistent("mortal", true, 300);
    c.will = Some(codec::Will {
        topic: "gone/mortal".into(),
        payload: b"bye".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Properties::from(PropertyValues {
            will_delay_interval: Some(1),
            ..PropertyValues::default()
        }),
    });
    let (raw, _) = connected(&broker, c);
    drop(raw);
    assert_eq!(&watcher.recv_publish().payload[..], b"bye");
    watcher.disconnect();
    broker.wait_log("watcher disconnected");
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &config("local"));
    let (mut watcher, present) = connected(&broker, persistent("watcher", false, 300));
    assert!(present);
    watcher.expect_nothing(Duration::from_millis(1500));
}

/// C-276: a Will waiting out its delay is stored once, on its session's record in
/// the `broker.session.storage` provider, and nowhere else in the file.
#[test]
fn a_waiting_will_is_stored_once_on_the_session_record_c276() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let mut c = persistent("waiting", true, 300);
    c.will = Some(codec::Will {
        topic: "gone/waiting".into(),
        payload: b"bye".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Properties::from(PropertyValues {
            will_delay_interval: Some(60),
            ..PropertyValues::default()
        }),
    });
    let (raw, _) = connected(&broker, c);
    drop(raw);
    broker.wait_log("waiting disconnected");
    let dir = broker.stop();
    let db = rusqlite::Connection::open(dir.join("saguin.db")).expect("open the db");
    let count = |sql: &str| -> i64 { db.query_row(sql, [], |row| row.get(0)).expect(sql) };
    assert_eq!(
        count("SELECT count(*) FROM sessions WHERE instr(record, 'gone/waiting') > 0"),
        1,
        "on the session's record"
    );
    assert_eq!(
        count("SELECT count(*) FROM records WHERE topic = 'gone/waiting'"),
        0,
        "no record of its own"
    );
    assert_eq!(count("SELECT count(*) FROM held"), 0, "nothing held for it");
}

/// B-455 with a channel: a restored session's channel subscription opens its cursor
/// when the session is resumed, so a record published after the restart is served
/// without subscribing again.
#[test]
fn a_restored_channel_subscription_is_served_on_resume() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut s, _) = connected(&broker, persistent("consumer", true, 300));
    assert_eq!(s.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    let dir = kill(broker);
    let broker = Broker::start_in(dir, &config("local"));
    resumes_and_receives(&broker, persistent("consumer", false, 300), "events/after");
}

fn with_will(mut c: codec::Connect, topic: &str) -> codec::Connect {
    c.will = Some(codec::Will {
        topic: topic.into(),
        payload: b"offline".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: true,
        properties: Properties::default(),
    });
    c
}

/// C-282, C-287: a broker stopping is not a device dying. No Will is published at
/// the stop; a persistent session keeps its Will due at no moment, published when the
/// session expires at the running broker unless a CONNECT replaces it; a session that
/// ended with its connection takes its Will with it.
#[test]
fn a_graceful_stop_publishes_no_will_and_the_restored_session_keeps_it_c282() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let held: Vec<Raw> = [
        with_will(persistent("expires", true, 4), "status/expires"),
        with_will(persistent("returns", true, 4), "status/returns"),
        with_will(persistent("clean", true, 0), "status/clean"),
    ]
    .into_iter()
    .map(|c| connected(&broker, c).0)
    .collect();
    let dir = broker.stop();
    drop(held);
    let broker = Broker::start_in(dir, &config("local"));
    // Each Will is retained: one published at the stop would be served here.
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    assert_eq!(watcher.subscribe("status/#", opts(QoS::AtLeastOnce)), [1]);
    let (_back, present) = connected(&broker, persistent("returns", false, 4));
    assert!(present, "the session came back");
    let got = watcher.recv_publish();
    assert_eq!(
        (got.topic.as_ref() as &str, &got.payload[..], got.retain),
        ("status/expires", &b"offline"[..], false),
        "published live, when its session expired"
    );
    watcher.expect_nothing(Duration::from_millis(1500));
}

/// C-288: a device connected at the stop whose session expiry passes while the
/// broker is down has its session ended at the next start, and its Will, which
/// carries no due moment, is not published.
#[test]
fn a_session_that_expired_during_the_outage_ends_without_its_will_c288() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (held, _) = connected(
        &broker,
        with_will(persistent("outage", true, 1), "status/outage"),
    );
    let dir = broker.stop();
    drop(held);
    std::thread::sleep(Duration::from_millis(2500));
    let broker = Broker::start_in(dir, &config("local"));
    // The Will is retained: one published at the start would be served here.
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    assert_eq!(watcher.subscribe("status/#", opts(QoS::AtLeastOnce)), [1]);
    watcher.expect_nothing(Duration::from_millis(1500));
    let (_back, present) = connected(&broker, persistent("outage", false, 1));
    assert!(!present, "the session ended at the start");
}

/// An assigned client id is never one a restored session holds: the counter starts
/// again at every start, and a Clean Start under a taken id would end that session.
#[test]
fn an_assigned_client_id_never_takes_a_restored_sessions_id() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut first, ack) = Raw::handshake(broker.addr, persistent("", true, 300));
    let assigned = ack
        .properties
        .assigned_client_identifier
        .clone()
        .expect("an assigned id");
    assert_eq!(first.subscribe("news/#", opts(QoS::AtLeastOnce)), [1]);
    drop(first);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &config("local"));
    let (_second, ack) = Raw::handshake(broker.addr, persistent("", true, 300));
    let other = ack
        .properties
        .assigned_client_identifier
        .clone()
        .expect("an assigned id");
    assert_ne!(other, assigned);
    resumes_and_receives(&broker, persistent(&assigned, false, 300), "news/x");
}

/// C-280: a session holding a subscription the configuration now refuses - a filter
/// a queue channel has since claimed - is ended at the start rather than restored
/// without it: its Will, waiting out its delay, is published then, and its client is
/// told Session Present 0.
#[test]
fn a_session_the_configuration_now_refuses_is_ended_at_the_start_c280() {
    let before = config("local").replace("  jobs:\n    type: queue\n    filter: work/+/todo\n", "");
    assert_ne!(before, config("local"));
    let broker = Broker::start_in(fresh_dir(), &before);
    let mut c = with_will(persistent("worker-7", true, 300), "status/worker-7");
    if let Some(will) = &mut c.will {
        will.properties.edit().will_delay_interval = Some(60);
    }
    let (mut s, _) = connected(&broker, c);
    assert_eq!(s.subscribe("work/+/todo", opts(QoS::AtLeastOnce)), [1]);
    drop(s); // no DISCONNECT: the Will waits out its delay
    broker.wait_log("worker-7 disconnected");
    let dir = broker.stop();

    let broker = Broker::start_in(dir, &config("local"));
    assert!(
        broker
            .startup
            .iter()
            .any(|l| l.contains("session worker-7 ended at the start")
                && l.contains("\"work/+/todo\"")),
        "{:#?}",
        broker.startup
    );
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    assert_eq!(watcher.subscribe("status/#", opts(QoS::AtLeastOnce)), [1]);
    let got = watcher.recv_publish();
    assert_eq!(
        (got.topic.as_ref() as &str, &got.payload[..], got.retain),
        ("status/worker-7", &b"offline"[..], true),
        "the Will was published when the start ended its session"
    );
    let (_back, present) = connected(&broker, persistent("worker-7", false, 300));
    assert!(!present, "the session was ended");
}

/// C-284, C-285: a clean DISCONNECT withdraws the Will from the session's record; a
/// store that refuses the withdrawal (here another process holds sqlite's write lock
/// past the broker's 5 s busy timeout) does not lose it: it is kept in memory and
/// written again every second until it lands, so a crash afterwards publishes no Will
/// the client withdrew.
#[test]
fn a_refused_will_withdrawal_is_written_again_until_it_lands_c285() {
    let broker = Broker::start_in(fresh_dir(), &config("local"));
    let (mut raw, _) = connected(
        &broker,
        with_will(persistent("careful", true, 3), "status/careful"),
    );
    let db = rusqlite::Connection::open(broker.dir.join("saguin.db")).expect("open the db");
    db.execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    // The Will is withdrawn. The broker closes the socket only once the store has
    // refused, after sqlite's 5 s busy timeout: given more than the usual wait.
    raw.set_timeout(Duration::from_secs(30));
    raw.disconnect();
    broker.wait_log("the session record of \"careful\" could not be written");
    db.execute_batch("COMMIT")
        .expect("give the write lock back");
    broker.wait_log("the session record of \"careful\" is written at last");
    let dir = kill(broker);

    // Had the withdrawal been lost, the record would still hold the Will, published
    // when the restored session expires 3 s after the start.
    let broker = Broker::start_in(dir, &config("local"));
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    assert_eq!(watcher.subscribe("status/#", opts(QoS::AtLeastOnce)), [1]);
    watcher.expect_nothing(Duration::from_secs(4));
}
