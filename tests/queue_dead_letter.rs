//! Dead-lettering, expiry, backoff, the size bound and redriving, end to end (issue 6;
//! RFC 0003 "queue - Backoff", "At a size bound", "Dead-lettering", "Putting
//! dead-lettered work back"; RFC 0002 "The dead-letter channel").

mod common;

use std::time::{Duration, Instant};

use common::{Broker, Raw, opts, publish, user_property};
use saguin::codec::{ProtocolVersion::V5, QoS};

const CHANNELS: &str = "channels:
  jobs:
    type: queue
    filter: jobs/#
    retry:
      max_attempts: 2
  work:
    type: queue
    filter: iot/+/work/+
    retry:
      max_attempts: 1
  stale:
    type: queue
    filter: stale/#
    visibility_timeout: 1s
    job_expires_after: 2s
  brief:
    type: queue
    filter: brief/#
    visibility_timeout: 1s
    job_expires_after: 2s
    retry:
      max_attempts: 1
  slow:
    type: queue
    filter: slow/#
    retry:
      max_attempts: 5
      backoff: linear
      backoff_base: 1s
  small:
    type: queue
    filter: small/#
    max_bytes: 300B
";

fn start() -> Broker {
    Broker::start(CHANNELS)
}

fn worker(broker: &Broker, id: &str, queue: &str) -> Raw {
    let mut w = Raw::connected(broker.addr, V5, id);
    assert_eq!(
        w.subscribe(&format!("$saguin/queue/{queue}"), opts(QoS::AtLeastOnce)),
        [1]
    );
    w
}

fn put(broker: &Broker, topic: &str, payload: &[u8]) -> u8 {
    let mut p = Raw::connected(broker.addr, V5, "producer");
    p.publish(topic, payload, QoS::AtLeastOnce, false)
        .expect("QoS 1")
}

fn prop<'a>(p: &'a saguin::codec::Publish, key: &str) -> &'a str {
    user_property(p, key).unwrap_or_else(|| panic!("no {key} on {p:?}"))
}

/// C-088, C-118..C-132, A-216, A-218, C-041, C-133: the last return moves the job into jobs__dlq,
/// topic `jobs/__dlq/j1`, id, payload and own properties kept, every header set.
/// `jobs/#` gives `jobs/__dlq/j1`, and a plain filter on it is granted.
/// the dead letter carries `saguin-dlq-channel` and `saguin-dlq-offset`.
#[test]
fn exhausted_attempts_move_the_job_into_the_dead_letter_channel() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("jobs/__dlq/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut producer = Raw::connected(broker.addr, V5, "producer");
    let mut p = publish("jobs/j1", b"work", QoS::AtLeastOnce, false);
    p.properties.edit().user_properties = vec![
        ("own".into(), "kept".into()),
        ("saguin-id".into(), "job-1".into()),
    ];
    p.properties.edit().content_type = Some("text/plain".into());
    p.properties.edit().correlation_data = Some(b"mine".to_vec());
    assert_eq!(producer.publish_packet(p), Some(0));
    let mut w = worker(&broker, "w", "jobs");
    let before = now_ms();
    for n in ["1", "2"] {
        let offer = w.recv_offer();
        assert_eq!(prop(&offer, "saguin-attempt"), n);
        w.puback(&offer);
        w.answer(&offer, b"return");
    }
    let dead = reader.recv_publish();
    assert_eq!(&*dead.topic, "jobs/__dlq/j1");
    assert_eq!(&*dead.payload, b"work");
    assert_eq!(dead.properties.content_type.as_deref(), Some("text/plain"));
    assert_eq!(prop(&dead, "own"), "kept");
    // Gaps A-04: the publisher's Correlation Data rides into the dead letter.
    assert_eq!(
        dead.properties.correlation_data.as_deref(),
        Some(&b"mine"[..])
    );
    assert_eq!(prop(&dead, "saguin-id"), "job-1");
    assert_eq!(prop(&dead, "saguin-dlq-channel"), "jobs");
    assert_eq!(prop(&dead, "saguin-dlq-offset"), "0");
    assert_eq!(prop(&dead, "saguin-dlq-attempts"), "2");
    assert_eq!(prop(&dead, "saguin-dlq-reason"), "attempts_exhausted");
    let first: u64 = prop(&dead, "saguin-dlq-first").parse().expect("ms");
    let last: u64 = prop(&dead, "saguin-dlq-last").parse().expect("ms");
    let at: u64 = prop(&dead, "saguin-dlq-at").parse().expect("ms");
    // Attempt moments are kept on the owner's monotonic clock and told on the wall
    // clock: each clock's whole milliseconds can put one up to 2 ms early.
    assert!(before <= first + 2, "{before} {first}");
    assert!(
        first <= last && last <= at && at <= now_ms(),
        "{first} {last} {at}"
    );
    // Resolved out of the queue: nothing more is offered.
    w.expect_nothing(Duration::from_millis(400));
}

/// C-121: with a filter carrying no `#` the level goes on the end; the dead letter is
/// read through the derived filter.
/// `+` keeps its value; read through an ordinary filter.
#[test]
fn a_filter_without_hash_appends_the_level() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("iot/+/work/+/__dlq", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(put(&broker, "iot/site/work/j1", b"w"), 0);
    let mut w = worker(&broker, "w", "work");
    let offer = w.recv_offer();
    w.answer(&offer, b"return");
    let dead = reader.recv_publish();
    assert_eq!(&*dead.topic, "iot/site/work/j1/__dlq");
}

/// C-135, C-136, C-140, A-08: a job nobody takes is dead-lettered `expired` by the
/// sweep, with no attempt spent and no first/last delivery time.
#[test]
fn a_job_past_job_expires_after_is_dead_lettered_expired() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("stale/__dlq/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(put(&broker, "stale/a", b"old"), 0);
    let dead = reader.recv_publish();
    assert_eq!(&*dead.topic, "stale/__dlq/a");
    assert_eq!(prop(&dead, "saguin-dlq-reason"), "expired");
    assert_eq!(prop(&dead, "saguin-dlq-attempts"), "0");
    assert!(user_property(&dead, "saguin-dlq-first").is_none());
    assert!(user_property(&dead, "saguin-dlq-last").is_none());
    // A worker arriving later finds nothing.
    let mut w = worker(&broker, "w", "stale");
    w.expect_nothing(Duration::from_millis(400));
}

/// B-106: a dead letter may be one level deeper than max_topic_levels: `stale/a`
/// (two levels, the limit) becomes `stale/__dlq/a` (three), and it is kept - read
/// live, and replayed to a reader arriving later.
#[test]
fn a_dead_letter_one_level_past_max_topic_levels_is_kept_b106() {
    let broker = Broker::start(
        "  limits:\n    max_topic_levels: 2\nchannels:\n  stale:\n    type: queue\n    filter: stale/#\n    visibility_timeout: 1s\n    job_expires_after: 2s\n",
    );
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(reader.subscribe("#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(put(&broker, "stale/a", b"old"), 0);
    let dead = reader.recv_publish();
    assert_eq!(&*dead.topic, "stale/__dlq/a");
    assert_eq!(prop(&dead, "saguin-dlq-reason"), "expired");
    let mut late = Raw::connected(broker.addr, V5, "late");
    assert_eq!(late.subscribe("#", opts(QoS::AtLeastOnce)), [1]);
    let replayed = late.recv_publish();
    assert_eq!(&*replayed.topic, "stale/__dlq/a");
    assert_eq!(&*replayed.payload, b"old");
}

/// C-141: the sweep never takes a job that is out with a worker; it expires when handed
/// back instead (C-139: checked at the offer).
#[test]
fn a_job_out_with_a_worker_is_not_expired_until_it_comes_back() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("stale/__dlq/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut w = worker(&broker, "w", "stale");
    assert_eq!(put(&broker, "stale/b", b"held"), 0);
    let offer = w.recv_offer();
    reader.expect_nothing(Duration::from_millis(2600));
    w.answer(&offer, b"return");
    let dead = reader.recv_publish();
    assert_eq!(prop(&dead, "saguin-dlq-reason"), "expired");
    assert_eq!(prop(&dead, "saguin-dlq-attempts"), "1");
}

/// C-135: a job returned on its last attempt after it expired goes as `expired`,
/// whatever its attempt count says.
#[test]
fn a_job_out_of_attempts_and_of_time_is_dead_lettered_expired_c135() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("brief/__dlq/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut w = worker(&broker, "w", "brief");
    assert_eq!(put(&broker, "brief/b", b"held"), 0);
    let offer = w.recv_offer();
    reader.expect_nothing(Duration::from_millis(2600));
    w.answer(&offer, b"return");
    let dead = reader.recv_publish();
    assert_eq!(prop(&dead, "saguin-dlq-reason"), "expired");
    assert_eq!(prop(&dead, "saguin-dlq-attempts"), "1");
}

/// C-093, C-096, C-105: a returned job waits its gap (1s after attempt 1) and the job
/// behind it is offered meanwhile.
/// C-107, C-206: the waiting job holds no worker (the one worker takes the next), and
/// the later offset resolves before the earlier one.
#[test]
fn a_job_in_its_backoff_gap_is_skipped_not_waited_on() {
    let broker = start();
    assert_eq!(put(&broker, "slow/a", b"a"), 0);
    assert_eq!(put(&broker, "slow/b", b"b"), 0);
    let mut w = worker(&broker, "w", "slow");
    let a = w.recv_offer();
    assert_eq!(&*a.payload, b"a");
    w.puback(&a);
    let returned = Instant::now();
    w.answer(&a, b"return");
    let b = w.recv_offer();
    assert_eq!(&*b.payload, b"b");
    w.puback(&b);
    w.answer(&b, b"ack");
    let again = w.recv_offer();
    let waited = returned.elapsed();
    assert_eq!(&*again.payload, b"a");
    // Lease times are whole milliseconds: the gap may end up to 1 ms before a clock
    // read in between two of them would say.
    assert!(
        waited >= Duration::from_millis(999) && waited < Duration::from_millis(2000),
        "waited {waited:?}"
    );
}

/// B-420, C-109, C-110, C-111: at max_bytes a publish is refused 0x97; an ack frees the room.
/// a channel at its max_bytes refuses 0x97.
#[test]
fn a_full_queue_refuses_0x97_until_an_ack_frees_room() {
    let broker = start();
    let payload = [b'x'; 100];
    let mut accepted = 0;
    while put(&broker, &format!("small/{accepted}"), &payload) == 0 {
        accepted += 1;
        assert!(accepted < 10, "max_bytes never refused");
    }
    assert!(accepted >= 1);
    let mut w = worker(&broker, "w", "small");
    let offer = w.recv_offer();
    w.puback(&offer);
    w.answer(&offer, b"ack");
    broker.wait_log("acknowledged by w");
    assert_eq!(put(&broker, "small/again", &payload), 0);
}

/// C-144, C-145, C-147, C-146: republishing a dead letter with its saguin-id to the
/// job's own topic makes a new job with the same id, attempt 1, and no dlq headers.
#[test]
fn redriving_a_dead_letter_keeps_its_id() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("iot/+/work/+/__dlq", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(put(&broker, "iot/s/work/j9", b"again"), 0);
    let mut w = worker(&broker, "w", "work");
    let offer = w.recv_offer();
    let id = prop(&offer, "saguin-id").to_string();
    w.answer(&offer, b"return");
    let dead = reader.recv_publish();
    let mut redrive = Raw::connected(broker.addr, V5, "redriver");
    let topic = dead
        .topic
        .strip_suffix("/__dlq")
        .expect("the level is on the end");
    let mut p = publish(topic, &dead.payload, QoS::AtLeastOnce, false);
    p.properties.edit().user_properties = dead.properties.user_properties.clone();
    assert_eq!(redrive.publish_packet(p), Some(0));
    let again = w.recv_offer();
    assert_eq!(prop(&again, "saguin-id"), id);
    assert_eq!(prop(&again, "saguin-attempt"), "1");
    assert_ne!(prop(&again, "saguin-offset"), prop(&offer, "saguin-offset"));
    assert!(user_property(&again, "saguin-dlq-reason").is_none());
}

/// C-106: the gap is honoured to within one 200ms tick: a returned job with a 1s
/// gap is offered again no sooner than 1s and within a tick of it (plus slack for a
/// loaded machine).
#[test]
fn a_gap_is_honoured_to_within_one_tick_c106() {
    let broker = start();
    assert_eq!(put(&broker, "slow/only", b"o"), 0);
    let mut w = worker(&broker, "w", "slow");
    for _ in 0..3 {
        let offer = w.recv_offer();
        w.puback(&offer);
        let returned = Instant::now();
        w.answer(&offer, b"return");
        let again = w.recv_offer();
        let waited = returned.elapsed();
        assert_eq!(&*again.payload, b"o");
        w.puback(&again);
        w.answer(&again, b"ack");
        // Attempt 1's gap is 1s (linear, 1s base); lease times are whole milliseconds.
        assert!(
            waited >= Duration::from_millis(999) && waited < Duration::from_millis(2000),
            "waited {waited:?}"
        );
        assert_eq!(put(&broker, "slow/only", b"o"), 0);
    }
}

/// C-149: a redriven job that fails again is dead-lettered again, with fresh
/// `saguin-dlq-*` values and new offsets in the queue and the dead-letter channel.
#[test]
fn a_redriven_job_that_fails_again_is_dead_lettered_again_c149() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("iot/+/work/+/__dlq", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(put(&broker, "iot/s/work/j9", b"again"), 0);
    let mut w = worker(&broker, "w", "work");
    let offer = w.recv_offer();
    w.puback(&offer);
    w.answer(&offer, b"return");
    let first = reader.recv_publish();
    let mut redrive = Raw::connected(broker.addr, V5, "redriver");
    let mut p = publish("iot/s/work/j9", &first.payload, QoS::AtLeastOnce, false);
    p.properties.edit().user_properties = first.properties.user_properties.clone();
    assert_eq!(redrive.publish_packet(p), Some(0));
    let again = w.recv_offer();
    w.puback(&again);
    w.answer(&again, b"return");
    let second = reader.recv_publish();
    assert_eq!(&*second.topic, "iot/s/work/j9/__dlq");
    assert_eq!(prop(&second, "saguin-id"), prop(&first, "saguin-id"));
    assert_eq!(prop(&second, "saguin-dlq-reason"), "attempts_exhausted");
    assert_eq!(prop(&second, "saguin-dlq-attempts"), "1");
    assert_eq!(
        prop(&second, "saguin-dlq-offset"),
        prop(&again, "saguin-offset"),
        "the redriven job's own queue offset"
    );
    assert_ne!(
        prop(&second, "saguin-dlq-offset"),
        prop(&first, "saguin-dlq-offset"),
        "a new offset in the queue"
    );
    assert_ne!(
        prop(&second, "saguin-offset"),
        prop(&first, "saguin-offset"),
        "a new offset in the dead-letter channel"
    );
    for key in ["saguin-dlq-first", "saguin-dlq-last", "saguin-dlq-at"] {
        let before: u64 = prop(&first, key).parse().expect("ms");
        let now: u64 = prop(&second, key).parse().expect("ms");
        assert!(now >= before, "{key}: {now} after {before}");
    }
    let second_first: u64 = prop(&second, "saguin-dlq-first").parse().expect("ms");
    let first_dead: u64 = prop(&first, "saguin-dlq-at").parse().expect("ms");
    assert!(
        second_first >= first_dead,
        "the second attempt history starts with the redriven job"
    );
    assert_eq!(
        second
            .properties
            .user_properties
            .iter()
            .filter(|(k, _)| k.starts_with("saguin-dlq-reason"))
            .count(),
        1,
        "one fresh set, not the old one carried beside it"
    );
}

/// C-134, C-143: the dead-letter channel is an append channel: a reader arriving later
/// replays it from the floor, and `#` reads dead letters among everything else.
/// replayed through `#` like any append channel.
#[test]
fn dead_letters_replay_like_any_append_channel() {
    let broker = start();
    assert_eq!(put(&broker, "iot/s/work/j1", b"w"), 0);
    let mut w = worker(&broker, "w", "work");
    let offer = w.recv_offer();
    w.answer(&offer, b"return");
    std::thread::sleep(Duration::from_millis(300));
    let mut late = Raw::connected(broker.addr, V5, "late");
    assert_eq!(late.subscribe("#", opts(QoS::AtLeastOnce)), [1]);
    let dead = late.recv_publish();
    assert_eq!(&*dead.topic, "iot/s/work/j1/__dlq");
    assert_eq!(prop(&dead, "saguin-dlq-channel"), "work");
}

/// B-026: an acknowledgement for a superseded delivery and a dead-lettered job are
/// logged at warn.
#[test]
fn a_superseded_ack_and_a_dead_letter_are_logged_at_warn_b026() {
    let broker = start();
    assert_eq!(put(&broker, "jobs/j1", b"w"), 0);
    let mut w = worker(&broker, "w", "jobs");
    let first = w.recv_offer();
    w.puback(&first);
    w.answer(&first, b"return");
    let second = w.recv_offer();
    w.puback(&second);
    w.answer(&first, b"ack"); // the first delivery's id: superseded by the second
    let lines = broker.wait_log_lines("ignored: it is not the current delivery");
    let superseded = lines.last().cloned().unwrap_or_default();
    // B-022, B-023: a line per job offered, leased and returned, at debug only.
    for needle in ["offered to w", "leased to w", "returned by w"] {
        let line = lines.iter().find(|l| l.contains(needle));
        assert!(
            line.is_some_and(|l| l.contains(" DEBUG ")),
            "{needle}: {line:?}"
        );
    }
    w.answer(&second, b"return");
    let dead = broker.wait_log("dead-lettered");
    // Once the job is gone, a late answer for it is warned of too.
    w.answer(&second, b"ack");
    let gone = broker.wait_log("resolved or dead-lettered");
    assert!(
        superseded.contains("WARN") && dead.contains("WARN") && gone.contains("WARN"),
        "{superseded}\n{dead}\n{gone}"
    );
}

/// RFC 0002: the dead-letter channel refuses publishes 0x87.
#[test]
fn the_dead_letter_channel_refuses_publishes() {
    let broker = start();
    let mut p = Raw::connected(broker.addr, V5, "p");
    assert_eq!(
        p.publish("jobs/__dlq/x", b"forged", QoS::AtLeastOnce, false),
        Some(0x87)
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// C-111..C-113, C-115 on a memory provider at its bound: publishes are refused 0x97,
/// while counting an attempt, returning and the dead-letter move (which grows the
/// record by its headers) go through on the reserve; an ack makes room again.
#[test]
fn a_provider_at_its_bound_still_dead_letters_and_frees_room_by_ack() {
    let yaml = "broker:
  id: reserve
  log_level: debug
  limits:
    max_message_size: 1KiB
    max_header_bytes: 512B
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  storage:
    default: tight
    default_retention_period: none
    default_retention_bytes: none
    providers:
      tight:
        type: memory
        max_bytes: 4KiB
        snapshot_dir: none
channels:
  jobs:
    type: queue
    filter: jobs/#
    retry:
      max_attempts: 1
";
    let broker = Broker::start_with(yaml);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.subscribe("jobs/__dlq/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    let payload = [b'x'; 400];
    let mut accepted = 0;
    loop {
        match put(&broker, &format!("jobs/{accepted}"), &payload) {
            0 => accepted += 1,
            0x97 => break,
            other => panic!("unexpected 0x{other:02X}"),
        }
        assert!(accepted < 20, "the bound never refused");
    }
    let mut w = worker(&broker, "w", "jobs");
    let first = w.recv_offer();
    w.puback(&first);
    w.answer(&first, b"return");
    let dead = reader.recv_publish();
    assert_eq!(prop(&dead, "saguin-dlq-reason"), "attempts_exhausted");
    let second = w.recv_offer();
    w.puback(&second);
    w.answer(&second, b"ack");
    broker.wait_log("acknowledged by w");
    assert_eq!(put(&broker, "jobs/again", &payload), 0);
}

/// C-212, C-266: a Will into a full queue is accepted at CONNECT (the acl_file is the
/// only refusal a Will meets); when it fires and the queue refuses it 0x97, that is
/// logged and nothing more: the broker serves on and the queue holds what it held.
#[test]
fn a_will_refused_by_a_full_queue_when_it_fires_is_only_logged_c212_c266() {
    let broker = Broker::start(&format!(
        "  operations:\n    listen:\n      unix:\n        path: {{dir}}/ops.sock\n{CHANNELS}"
    ));
    let payload = [b'x'; 100];
    let mut accepted = 0;
    while put(&broker, &format!("small/{accepted}"), &payload) == 0 {
        accepted += 1;
        assert!(accepted < 10, "max_bytes never refused");
    }
    let mut c = common::connect(V5, "dies", true);
    c.will = Some(saguin::codec::Will {
        topic: "small/will".into(),
        payload: payload.to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    });
    let (raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0);
    drop(raw);
    broker.wait_log("a Will to \"small/will\" was refused 0x97");
    // C-267: a Will the channel refused was not published.
    broker.assert_metric("saguin_wills_published_total 0");
    let mut w = worker(&broker, "w", "small");
    for _ in 0..accepted {
        let offer = w.recv_offer();
        assert_ne!(&*offer.topic, "small/will");
        w.puback(&offer);
        w.answer(&offer, b"ack");
    }
    w.expect_nothing(Duration::from_millis(300));
}
