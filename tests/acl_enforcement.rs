//! The acl_file enforced against the real binary over loopback (RFC 0002 "What a
//! client may do", req-0002b sections 22-29): publish, subscribe, the Will,
//! client_ids, queue consume, the `$saguin/` verbs, and SIGUSR1.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Broker, Raw, opts, publish};
use saguin::codec::ProtocolVersion::{self, V5, V311};
use saguin::codec::{Packet, QoS, Will};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/auth/clients.passwd"
);
const NOT_AUTHORIZED: u8 = 0x87;

/// Channels of every type beside the password file and the acl_file.
const EXTRA: &str = "    password_file: {dir}/clients.passwd
    acl_file: {dir}/acl.yaml
channels:
  events:
    type: append
    filter: iot/+/events/#
  state:
    type: latest
    filter: iot/+/state/+
  jobs:
    type: queue
    filter: jobs/+
";

/// alice writes her own events and broadcast alerts, and works jobs; bob reads
/// events (and may seek) and broadcast, and hangs clients up.
const ACL: &str = "roles:
  device:
    - channel: events
      filter: iot/%u/events/#
      allow: [write]
    - topic: alerts/%u/#
      allow: [write]
  worker:
    - channel: jobs
      allow: [write, consume]
  reader:
    - channel: events
      allow: [read, seek]
    - topic: \"#\"
      allow: [read]
  on-call:
    - broker: sessions
      allow: [disconnect]
users:
  alice: [device, worker]
  bob:
    roles: [reader, on-call]
    client_ids: \"%u*\"
";

fn start(name: &str, acl: &str) -> Broker {
    let dir = common::temp_dir(name);
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).expect("copy the password file");
    std::fs::write(dir.join("acl.yaml"), acl).expect("write the acl_file");
    Broker::start_in(dir, &common::config(EXTRA))
}

fn login(protocol: ProtocolVersion, client_id: &str, user: &str) -> saguin::codec::Connect {
    let mut c = common::connect(protocol, client_id, true);
    let password = if user == "alice" { "secret" } else { "hunter2" };
    c.username = Some(user.into());
    c.password = Some(password.as_bytes().to_vec());
    c
}

fn as_user(broker: &Broker, client_id: &str, user: &str) -> Raw {
    let (raw, ack) = Raw::handshake(broker.addr, login(V5, client_id, user));
    assert_eq!(ack.code, 0, "{user} as {client_id}: {ack:?}");
    raw
}

/// B-287, B-259, B-254, C-014: write on a channel narrowed by filter: with %u, and a
/// topic: rule for broadcast; anything else is PUBACK 0x87.
/// A-170: a publish the roles do not allow is 0x87.
#[test]
fn publishes_need_a_grant_on_their_route_b287() {
    let broker = start("publish", ACL);
    let mut alice = as_user(&broker, "alice-1", "alice");
    let q1 = QoS::AtLeastOnce;
    assert_eq!(
        alice.publish("iot/alice/events/door", b"1", q1, false),
        Some(0)
    );
    assert_eq!(
        alice.publish("iot/bob/events/door", b"1", q1, false),
        Some(NOT_AUTHORIZED)
    );
    assert_eq!(alice.publish("alerts/alice/fire", b"1", q1, false), Some(0));
    assert_eq!(
        alice.publish("alerts/bob/fire", b"1", q1, false),
        Some(NOT_AUTHORIZED)
    );
    // A channel its roles do not name (B-275: a topic: rule never reaches a channel).
    assert_eq!(
        alice.publish("iot/alice/state/x", b"1", q1, false),
        Some(NOT_AUTHORIZED)
    );
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(
        bob.publish("alerts/bob/fire", b"1", q1, false),
        Some(NOT_AUTHORIZED)
    );
    broker.wait_log("refused 0x87");
}

/// B-287: a refused QoS 0 publish is dropped; subscribers see nothing of it.
#[test]
fn a_refused_qos0_publish_is_dropped_b287() {
    let broker = start("qos0", ACL);
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.subscribe("alerts/#", opts(QoS::AtLeastOnce)), vec![1]);
    let mut alice = as_user(&broker, "alice-1", "alice");
    alice.publish("alerts/bob/fire", b"no", QoS::AtMostOnce, false);
    alice.publish("alerts/alice/fire", b"yes", QoS::AtMostOnce, false);
    let got = bob.recv_publish();
    assert_eq!(&*got.topic, "alerts/alice/fire");
    bob.expect_nothing(Duration::from_millis(300));
}

/// B-279, B-288: a subscription is granted whole: read on every channel it is
/// served from and a topic: rule where it matches broadcast; otherwise 0x87 in
/// that filter's place. A wrong shape is still 0x8F, never 0x87 (B-291).
/// A-150: a filter the roles do not allow is 0x87.
#[test]
fn subscriptions_are_granted_whole_or_refused_b279() {
    let broker = start("subscribe", ACL);
    let mut bob = as_user(&broker, "bob", "bob");
    let q1 = opts(QoS::AtLeastOnce);
    assert_eq!(bob.subscribe("iot/+/events/#", q1), vec![1]);
    assert_eq!(bob.subscribe("alerts/#", q1), vec![1]);
    // # reaches state, which bob may not read.
    assert_eq!(bob.subscribe("#", q1), vec![NOT_AUTHORIZED]);
    assert_eq!(bob.subscribe("iot/+/state/+", q1), vec![NOT_AUTHORIZED]);
    assert_eq!(bob.subscribe("a/#/b", q1), vec![0x8F]);
    let mut alice = as_user(&broker, "alice-1", "alice");
    assert_eq!(
        alice.subscribe("iot/alice/events/#", q1),
        vec![NOT_AUTHORIZED]
    );
    assert_eq!(alice.subscribe("alerts/alice/#", q1), vec![NOT_AUTHORIZED]);
    // A shared subscription is asked of its inner filter.
    assert_eq!(bob.subscribe("$share/g/alerts/#", q1), vec![1]);
    assert_eq!(
        alice.subscribe("$share/g/alerts/#", q1),
        vec![NOT_AUTHORIZED]
    );
}

fn will(topic: &str) -> Will {
    Will {
        topic: topic.into(),
        payload: b"gone".to_vec(),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: Default::default(),
    }
}

/// B-289, C-259: a Will on a topic the client may not publish to is CONNACK 0x87 (3.1.1:
/// 0x05); one it may publish to connects.
/// A-241: a Will topic the roles may not publish to is 0x87 (3.1.1 0x05).
#[test]
fn a_will_the_client_may_not_publish_is_refused_b289() {
    let broker = start("will", ACL);
    for (protocol, code) in [(V5, NOT_AUTHORIZED), (V311, 0x05)] {
        let mut c = login(protocol, "alice-w", "alice");
        c.will = Some(will("alerts/bob/gone"));
        assert_eq!(Raw::handshake(broker.addr, c).1.code, code, "{protocol:?}");
        let mut c = login(protocol, "alice-w", "alice");
        c.will = Some(will("alerts/alice/gone"));
        assert_eq!(Raw::handshake(broker.addr, c).1.code, 0, "{protocol:?}");
    }
    broker.wait_log("its Will names \"alerts/bob/gone\"");
}

/// B-270, B-272: client_ids: "%u*" admits bob only under ids beginning bob; the
/// refusal is 0x86 (3.1.1 0x04), and the log says it was the client id.
#[test]
fn a_client_id_the_entry_does_not_admit_is_0x86_b270() {
    let broker = start("client-ids", ACL);
    assert_eq!(
        Raw::handshake(broker.addr, login(V5, "bob-2", "bob"))
            .1
            .code,
        0
    );
    assert_eq!(
        Raw::handshake(broker.addr, login(V5, "carol", "bob"))
            .1
            .code,
        0x86
    );
    assert_eq!(
        Raw::handshake(broker.addr, login(V311, "carol", "bob"))
            .1
            .code,
        0x04
    );
    broker.wait_log("client id \"carol\" is not one users: \"bob\"");
    // alice's entry has no client_ids: any id (B-272).
    assert_eq!(
        Raw::handshake(broker.addr, login(V5, "anything", "alice"))
            .1
            .code,
        0
    );
}

/// B-282: taking jobs is consume on the queue - its form and its response topic;
/// submitting is write. Structural refusals come first (B-286).
#[test]
fn a_queue_is_consumed_only_with_consume_b282() {
    let broker = start("queue", ACL);
    let q1 = opts(QoS::AtLeastOnce);
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(
        bob.subscribe("$saguin/queue/jobs", q1),
        vec![NOT_AUTHORIZED]
    );
    // The structural refusal wins over the missing grant: QoS 0 is 0x83.
    assert_eq!(
        bob.subscribe("$saguin/queue/jobs", opts(QoS::AtMostOnce)),
        vec![0x83]
    );
    assert_eq!(
        bob.answer_qos1("$saguin/queue/jobs/response", None, b"ack"),
        NOT_AUTHORIZED
    );
    assert_eq!(
        bob.publish("jobs/a", b"x", QoS::AtLeastOnce, false),
        Some(NOT_AUTHORIZED)
    );
    let mut alice = as_user(&broker, "alice-1", "alice");
    assert_eq!(alice.subscribe("$saguin/queue/jobs", q1), vec![1]);
    assert_eq!(
        alice.publish("jobs/a", b"work", QoS::AtLeastOnce, false),
        Some(0)
    );
    let offer = alice.recv_offer();
    assert_eq!(&*offer.payload, b"work");
}

/// B-253, B-259: a `consume` rule narrowed by `filter:` gives the jobs under it alone:
/// a job is offered only to a worker a rule lets take its topic, and waits for one.
#[test]
fn a_narrowed_consume_rule_is_offered_only_the_jobs_under_its_filter_b253() {
    let acl = "roles:
  submitter:
    - channel: jobs
      allow: [write]
  own-jobs:
    - channel: jobs
      filter: jobs/%u
      allow: [consume]
users:
  alice: [submitter, own-jobs]
  bob: [submitter, own-jobs]
";
    let broker = start("queue-narrowed", acl);
    let q1 = opts(QoS::AtLeastOnce);
    let mut alice = as_user(&broker, "alice-1", "alice");
    assert_eq!(alice.subscribe("$saguin/queue/jobs", q1), vec![1]);
    assert_eq!(
        alice.publish("jobs/bob", b"for bob", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        alice.publish("jobs/alice", b"for alice", QoS::AtLeastOnce, false),
        Some(0)
    );
    let offer = alice.recv_offer();
    assert_eq!(&*offer.payload, b"for alice", "the job behind goes on");
    alice.puback(&offer);
    alice.answer(&offer, b"ack");
    // Free again, and bob's job still waits: it is not alice's to take.
    alice.expect_nothing(std::time::Duration::from_millis(600));
    let mut bob = as_user(&broker, "bob-1", "bob");
    assert_eq!(bob.subscribe("$saguin/queue/jobs", q1), vec![1]);
    assert_eq!(&*bob.recv_offer().payload, b"for bob");
}

/// B-293, A-004: a leading wildcard's read grant does not reach a `$` topic, the
/// retained value sent at SUBSCRIBE included: every delivery is asked.
#[test]
fn a_retained_value_on_a_dollar_topic_is_not_sent_under_a_hash_grant_b293() {
    let acl = "roles:
  dev-writer:
    - topic: \"$dev/#\"
      allow: [write]
  everything:
    - topic: \"#\"
      allow: [read]
users:
  alice: [dev-writer]
  bob: [everything]
";
    let broker = start("dollar-retained", acl);
    let mut alice = as_user(&broker, "alice-1", "alice");
    assert_eq!(
        alice.publish("$dev/x", b"kept", QoS::AtLeastOnce, true),
        Some(0)
    );
    let mut bob = as_user(&broker, "bob-1", "bob");
    bob.subscribe("$dev/#", opts(QoS::AtLeastOnce));
    bob.expect_nothing(std::time::Duration::from_millis(300));
}

fn verb(raw: &mut Raw, topic: &str, payload: &[u8]) -> u8 {
    let mut p = publish(topic, payload, QoS::AtLeastOnce, false);
    p.properties.edit().response_topic = Some("me/answer".into());
    raw.publish_packet(p).expect("QoS 1 is acknowledged")
}

/// B-282, B-283, B-297: seek rides on seek, a point read on read of the latest
/// channel, a hang-up on broker: sessions.
#[test]
fn saguin_verbs_ride_on_the_channel_verbs_b282_b297() {
    let broker = start("verbs", ACL);
    let mut alice = as_user(&broker, "alice-1", "alice");
    assert_eq!(
        verb(&mut alice, "$saguin/consumer/events/seek", b"0"),
        NOT_AUTHORIZED
    );
    assert_eq!(
        verb(&mut alice, "$saguin/kv/get", b"iot/a/state/x"),
        NOT_AUTHORIZED
    );
    assert_eq!(
        verb(&mut alice, "$saguin/sessions/disconnect", b"bob"),
        NOT_AUTHORIZED
    );
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(verb(&mut bob, "$saguin/consumer/events/seek", b"0"), 0);
    assert_eq!(&*bob.recv_publish().topic, "me/answer");
    assert_eq!(
        verb(&mut bob, "$saguin/kv/get", b"iot/a/state/x"),
        NOT_AUTHORIZED
    );
    assert_eq!(verb(&mut bob, "$saguin/sessions/disconnect", b"alice-1"), 0);
    assert_eq!(alice.expect_disconnect(), 0x98);
}

fn catalogue(raw: &mut Raw, name: &str) -> String {
    assert_eq!(verb(raw, &format!("$saguin/catalogue/{name}"), b""), 0);
    loop {
        match raw.recv() {
            Packet::Publish(p) if &*p.topic == "me/answer" => {
                return String::from_utf8_lossy(&p.payload).into_owned();
            }
            Packet::Publish(_) => {}
            other => panic!("expected the answer, got {other:?}"),
        }
    }
}

/// B-323, B-324, B-325: the catalogue lists the verbs held, a channel held nothing
/// on is the empty reply, and a narrowed grant still learns the whole filter.
#[test]
fn the_catalogue_is_scoped_to_the_verbs_held_b324() {
    let broker = start("catalogue", ACL);
    let mut bob = as_user(&broker, "bob", "bob");
    let events: serde_json::Value = serde_json::from_str(&catalogue(&mut bob, "events")).unwrap();
    assert_eq!(events["verbs"], serde_json::json!(["read", "seek"]));
    assert_eq!(catalogue(&mut bob, "state"), "");
    assert_eq!(catalogue(&mut bob, "no-such"), "");
    let mut alice = as_user(&broker, "alice-1", "alice");
    let events: serde_json::Value = serde_json::from_str(&catalogue(&mut alice, "events")).unwrap();
    assert_eq!(events["verbs"], serde_json::json!(["write"]));
    assert_eq!(events["filter"], "iot/+/events/#");
}

/// B-328: the catalogue answers from the grants as they stand at the request: after a
/// SIGUSR1 re-read, the same connection is told its new verbs.
#[test]
fn the_catalogue_answers_from_the_acl_file_as_reread_b328() {
    let broker = start("catalogue-reload", ACL);
    let mut bob = as_user(&broker, "bob", "bob");
    let events: serde_json::Value = serde_json::from_str(&catalogue(&mut bob, "events")).unwrap();
    assert_eq!(events["verbs"], serde_json::json!(["read", "seek"]));
    assert_eq!(catalogue(&mut bob, "state"), "");
    std::fs::write(
        broker.dir.join("acl.yaml"),
        ACL.replace(
            "    - channel: events\n      allow: [read, seek]\n",
            "    - channel: state\n      allow: [read]\n",
        ),
    )
    .unwrap();
    broker.signal("USR1");
    broker.wait_log("re-read:");
    assert_eq!(catalogue(&mut bob, "events"), "");
    let state: serde_json::Value = serde_json::from_str(&catalogue(&mut bob, "state")).unwrap();
    assert_eq!(state["verbs"], serde_json::json!(["read"]));
}

/// B-028, B-292, B-233: SIGUSR1 re-reads the acl_file; an open connection's next publish
/// is asked of the new file. A file that does not load changes nothing.
#[test]
fn sigusr1_rereads_the_acl_file_for_open_connections_b292() {
    let broker = start("reload", ACL);
    let mut alice = as_user(&broker, "alice-1", "alice");
    let q1 = QoS::AtLeastOnce;
    assert_eq!(
        alice.publish("iot/alice/events/a", b"1", q1, false),
        Some(0)
    );
    let path: PathBuf = broker.dir.join("acl.yaml");
    std::fs::write(
        &path,
        ACL.replace("alice: [device, worker]", "alice: [worker]"),
    )
    .unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    assert_eq!(
        alice.publish("iot/alice/events/a", b"1", q1, false),
        Some(NOT_AUTHORIZED)
    );
    // A broken file: logged, and the grants stay as they were.
    std::fs::write(
        &path,
        "roles:\n  r:\n    - channel: jobs\n      allow: [read]\nusers:\n  alice: [r]\n",
    )
    .unwrap();
    broker.signal("USR1");
    broker.wait_log("keeps the grants it had");
    assert_eq!(alice.publish("jobs/x", b"1", q1, false), Some(0));
    assert_eq!(
        alice.publish("iot/alice/events/a", b"1", q1, false),
        Some(NOT_AUTHORIZED)
    );
}

/// B-293, B-294: what waited for a session while its client was away is asked of
/// the acl_file again once it is re-read: broadcasts it may no longer read are
/// dropped, and its channel stalls on the records rather than skipping them, to go
/// on when the grant comes back.
#[test]
fn what_waits_for_a_session_is_asked_again_after_a_reread_b293_b294() {
    let broker = start("reread-owed", ACL);
    let mut c = login(V5, "bob-away", "bob");
    c.clean_start = false;
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut bob, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(bob.subscribe("alerts/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(bob.subscribe("iot/+/events/#", opts(QoS::AtLeastOnce)), [1]);
    bob.disconnect();
    let mut alice = as_user(&broker, "alice-1", "alice");
    for i in 0..5 {
        let q1 = QoS::AtLeastOnce;
        assert_eq!(
            alice.publish(&format!("alerts/alice/{i}"), b"a", q1, false),
            Some(0)
        );
        let topic = format!("iot/alice/events/{i}");
        assert_eq!(alice.publish(&topic, b"e", q1, false), Some(0));
    }
    let path: PathBuf = broker.dir.join("acl.yaml");
    let narrowed = ACL.replace(
        "    - channel: events\n      allow: [read, seek]\n    - topic: \"#\"\n",
        "    - topic: \"elsewhere/#\"\n",
    );
    assert_ne!(narrowed, ACL);
    std::fs::write(&path, narrowed).unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    let (mut bob, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    bob.expect_nothing(Duration::from_millis(500));
    std::fs::write(&path, ACL).unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    for i in 0..5 {
        let p = bob.recv_publish();
        assert_eq!(
            &*p.topic,
            format!("iot/alice/events/{i}"),
            "stalled, not skipped"
        );
    }
    bob.expect_nothing(Duration::from_millis(300));
}

/// B-279, MQTT-4.7.2-1: a `topic: "#"` read grants no filter on a `$` topic, which
/// it can never deliver: the SUBSCRIBE is refused 0x87 rather than granted and silent.
#[test]
fn a_wildcard_read_grants_no_dollar_filter_b279() {
    let broker = start("dollar-filter", ACL);
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(
        bob.subscribe("$foo/#", opts(QoS::AtMostOnce)),
        [NOT_AUTHORIZED]
    );
    assert_eq!(bob.subscribe("foo/#", opts(QoS::AtMostOnce)), [0]);
}

/// B-282, MQTT-3.1.3-6: `%c` names the client id the broker assigned to a CONNECT
/// that brought none; the empty id granted nothing for the whole connection.
#[test]
fn percent_c_names_an_assigned_client_id() {
    let acl = "roles:\n  own:\n    - topic: t/%c/#\n      allow: [write]\nusers:\n  alice: [own]\n";
    let broker = start("assigned-id", acl);
    let (mut alice, ack) = Raw::handshake(broker.addr, login(V5, "", "alice"));
    let id = ack
        .properties
        .assigned_client_identifier
        .clone()
        .expect("an assigned id");
    let q1 = QoS::AtLeastOnce;
    assert_eq!(
        alice.publish(&format!("t/{id}/x"), b"1", q1, false),
        Some(0)
    );
    assert_eq!(
        alice.publish("t/other/x", b"1", q1, false),
        Some(NOT_AUTHORIZED)
    );
}

/// B-247 and a finding of the acl_file (B-117) stop the broker at startup.
#[test]
fn a_contradiction_or_a_bad_acl_file_stops_the_broker() {
    let dir = common::temp_dir("refused");
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).unwrap();
    std::fs::write(
        dir.join("acl.yaml"),
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  alice:\n    roles: [r]\n    limits:\n      publish_rate: 0\n",
    )
    .unwrap();
    let yaml = |extra: &str| common::config(extra).replace("{dir}", &dir.display().to_string());
    let said = common::refused_at_startup(&dir, &yaml(EXTRA));
    assert!(said.contains("users.alice.limits.publish_rate 0"), "{said}");
    let anonymous = EXTRA.replace("    acl_file:", "    allow_anonymous: true\n    acl_file:");
    std::fs::write(
        dir.join("acl.yaml"),
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  alice: [r]\n",
    )
    .unwrap();
    let said = common::refused_at_startup(&dir, &yaml(&anonymous));
    assert!(said.contains("allow_anonymous"), "{said}");
}

/// alice may do everything on broadcast, but her role takes features away.
fn features_acl(denied: &str) -> String {
    format!(
        "roles:\n  all:\n    - topic: \"#\"\n      allow: [write, read]\n    - channel: events\n      allow: [write, read]\n  less:\n    - broker: features\n      deny: [{denied}]\nusers:\n  alice: [all, less]\n  bob: [all]\n"
    )
}

/// B-310, B-317: will denied - a CONNECT with a Will is 0x87 (3.1.1 0x05), one
/// without connects; a wrong password is still 0x86 whatever is denied.
/// A-240: a Will under a `will` denial is 0x87 (3.1.1 0x05).
#[test]
fn a_denied_will_is_refused_at_connect_b310() {
    let broker = start("deny-will", &features_acl("will"));
    for (protocol, code) in [(V5, NOT_AUTHORIZED), (V311, 0x05)] {
        let mut c = login(protocol, "alice-w", "alice");
        c.will = Some(will("alerts/x"));
        assert_eq!(Raw::handshake(broker.addr, c).1.code, code, "{protocol:?}");
        let c = login(protocol, "alice-w", "alice");
        assert_eq!(Raw::handshake(broker.addr, c).1.code, 0, "{protocol:?}");
    }
    let mut c = login(V5, "alice-w", "alice");
    c.password = Some(b"wrong".to_vec());
    c.will = Some(will("alerts/x"));
    assert_eq!(Raw::handshake(broker.addr, c).1.code, 0x86);
    // B-285, B-316: bob's roles deny nothing.
    let mut c = login(V5, "bob", "bob");
    c.will = Some(will("alerts/x"));
    assert_eq!(Raw::handshake(broker.addr, c).1.code, 0);
}

/// B-309: persistent denied - MQTT 5 is told Session Expiry Interval 0, and the
/// session does not survive; 3.1.1's session is made clean.
/// A-274: a `persistent` denial is told Session Expiry Interval 0.
#[test]
fn a_denied_persistent_session_ends_with_the_connection_b309() {
    let broker = start("deny-persistent", &features_acl("persistent"));
    let mut c = login(V5, "alice-p", "alice");
    c.clean_start = false;
    c.properties.edit().session_expiry_interval = Some(3600);
    let (raw, ack) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(ack.code, 0);
    assert_eq!(ack.properties.session_expiry_interval, Some(0));
    raw.disconnect();
    let (_raw, ack) = Raw::handshake(broker.addr, c);
    assert!(
        !ack.session_present,
        "the session ended with the connection"
    );
    let mut c = login(V311, "alice-q", "alice");
    c.clean_start = false;
    let (raw, _) = Raw::handshake(broker.addr, c.clone());
    raw.disconnect();
    assert!(!Raw::handshake(broker.addr, c).1.session_present);
}

/// B-309, MQTT-3.14.2-2: a client denied `persistent` that asked for a lasting session
/// may say so again on its DISCONNECT: its CONNECT's value was not 0, so that is no
/// Protocol Error. The session still ends with the connection, and a DISCONNECT 0x00
/// withdraws its Will.
#[test]
fn a_denied_persistent_session_may_name_its_expiry_on_disconnect_b309() {
    let broker = start("deny-persistent-disconnect", &features_acl("persistent"));
    let mut watcher = as_user(&broker, "watcher", "bob");
    assert_eq!(watcher.subscribe("alerts/#", opts(QoS::AtLeastOnce)), [1]);
    let mut c = login(V5, "alice-d", "alice");
    c.clean_start = false;
    c.properties.edit().session_expiry_interval = Some(3600);
    c.will = Some(will("alerts/gone"));
    let (mut raw, ack) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(ack.properties.session_expiry_interval, Some(0));
    let mut bye = saguin::codec::Disconnect::new(0);
    bye.properties.edit().session_expiry_interval = Some(3600);
    raw.send(&Packet::Disconnect(bye));
    raw.expect_closed_silently();
    watcher.expect_nothing(Duration::from_millis(300));
    c.will = None;
    assert!(!Raw::handshake(broker.addr, c).1.session_present);
}

/// B-311: share denied - Shared Subscription Available 0, and a $share/ filter
/// anyway is DISCONNECT 0x9E.
/// A-137, A-277: Shared Subscription Available 0, then DISCONNECT 0x9E.
#[test]
fn a_denied_share_is_a_protocol_error_b311() {
    let broker = start("deny-share", &features_acl("share"));
    let (mut raw, ack) = Raw::handshake(broker.addr, login(V5, "alice-s", "alice"));
    assert_eq!(ack.properties.shared_subscription_available, Some(0));
    assert_eq!(raw.subscribe("alerts/#", opts(QoS::AtLeastOnce)), vec![1]);
    raw.send(&Packet::Subscribe(saguin::codec::Subscribe {
        packet_id: 2,
        properties: Default::default(),
        filters: vec![("$share/g/alerts/#".into(), opts(QoS::AtLeastOnce))],
    }));
    assert_eq!(raw.expect_disconnect(), 0x9E);
}

/// B-312, B-313, B-434, C-246, C-247, C-262: retained denied - a retained broadcast publish is DISCONNECT 0x9A
/// (3.1.1: closed); on a channel's topic nothing changes and Retain Available
/// stays 1; a retained Will aimed at broadcast is 0x9A (3.1.1 0x05).
/// A-195: a retained broadcast under a `retained` denial is DISCONNECT 0x9A.
/// A-196, A-248, A-276: channel topics untouched; retained Will 0x9A/0x05; Retain Available 1.
#[test]
fn a_denied_retained_value_on_broadcast_is_0x9a_b312() {
    let broker = start("deny-retained", &features_acl("retained"));
    let (mut raw, ack) = Raw::handshake(broker.addr, login(V5, "alice-r", "alice"));
    assert_eq!(ack.properties.retain_available, Some(1));
    assert_eq!(
        raw.publish("iot/a/events/x", b"1", QoS::AtLeastOnce, true),
        Some(0)
    );
    raw.send(&Packet::Publish(publish(
        "alerts/x",
        b"1",
        QoS::AtLeastOnce,
        true,
    )));
    assert_eq!(raw.expect_disconnect(), 0x9A);
    let (mut old, _) = Raw::handshake(broker.addr, login(V311, "alice-r3", "alice"));
    old.send(&Packet::Publish(publish(
        "alerts/x",
        b"1",
        QoS::AtLeastOnce,
        true,
    )));
    old.expect_closed_silently();
    for (protocol, code) in [(V5, 0x9A), (V311, 0x05)] {
        let mut c = login(protocol, "alice-rw", "alice");
        let mut w = will("alerts/x");
        w.retain = true;
        c.will = Some(w);
        assert_eq!(Raw::handshake(broker.addr, c).1.code, code, "{protocol:?}");
    }
}

/// B-314, B-315: qos2 denied - Maximum QoS 1, a QoS 2 subscription granted 1, a
/// QoS 2 publish DISCONNECT 0x9B (3.1.1: closed), a QoS 2 Will 0x9B (3.1.1 0x05).
/// A-141, A-197, A-271: Maximum QoS 1, granted 1, a QoS 2 publish DISCONNECT 0x9B.
/// A-249: a QoS 2 Will under a `qos2` denial is CONNACK 0x9B (3.1.1 0x05).
#[test]
fn a_denied_qos2_is_capped_and_refused_b314() {
    let broker = start("deny-qos2", &features_acl("qos2"));
    let (mut raw, ack) = Raw::handshake(broker.addr, login(V5, "alice-2", "alice"));
    assert_eq!(ack.properties.maximum_qos, Some(1));
    assert_eq!(raw.subscribe("alerts/#", opts(QoS::ExactlyOnce)), vec![1]);
    raw.send(&Packet::Publish(publish(
        "alerts/x",
        b"1",
        QoS::ExactlyOnce,
        false,
    )));
    assert_eq!(raw.expect_disconnect(), 0x9B);
    let (mut old, _) = Raw::handshake(broker.addr, login(V311, "alice-23", "alice"));
    assert_eq!(old.subscribe("alerts/#", opts(QoS::ExactlyOnce)), vec![1]);
    old.send(&Packet::Publish(publish(
        "alerts/x",
        b"1",
        QoS::ExactlyOnce,
        false,
    )));
    old.expect_closed_silently();
    for (protocol, code) in [(V5, 0x9B), (V311, 0x05)] {
        let mut c = login(protocol, "alice-2w", "alice");
        let mut w = will("alerts/x");
        w.qos = QoS::ExactlyOnce;
        c.will = Some(w);
        assert_eq!(Raw::handshake(broker.addr, c).1.code, code, "{protocol:?}");
    }
}

/// B-314: a qos2 denial that arrives with a re-read acl_file holds a subscription
/// granted QoS 2 before it to QoS 1 on delivery.
#[test]
fn a_qos2_denial_read_later_caps_what_was_granted_before_b314() {
    let acl = features_acl("qos2");
    let broker = start("deny-qos2-later", &acl);
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.subscribe("alerts/#", opts(QoS::ExactlyOnce)), vec![2]);
    std::fs::write(
        broker.dir.join("acl.yaml"),
        acl.replace(
            "  alice: [all, less]\n  bob: [all]\n",
            "  alice: [all]\n  bob: [all, less]\n",
        ),
    )
    .unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    let mut publisher = as_user(&broker, "alice-2", "alice");
    assert_eq!(
        publisher.publish("alerts/x", b"1", QoS::ExactlyOnce, false),
        Some(0)
    );
    let got = bob.recv_publish();
    assert_eq!((&*got.payload, got.qos), (&b"1"[..], QoS::AtLeastOnce));
}

/// B-290, C-264: a Will is asked again, as its client, when it fires: after a re-read
/// that took the grant away it is logged and not published; before, it is.
#[test]
fn a_will_is_asked_again_when_it_fires_b290() {
    let broker = start("will-fires", ACL);
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.subscribe("alerts/#", opts(QoS::AtLeastOnce)), vec![1]);
    let armed = |id: &str| {
        let mut c = login(V5, id, "alice");
        c.will = Some(will("alerts/alice/gone"));
        let (raw, ack) = Raw::handshake(broker.addr, c);
        assert_eq!(ack.code, 0);
        raw
    };
    drop(armed("alice-1"));
    assert_eq!(&*bob.recv_publish().topic, "alerts/alice/gone");
    let alice = armed("alice-2");
    let acl = ACL.replace("    - topic: alerts/%u/#\n      allow: [write]\n", "");
    std::fs::write(broker.dir.join("acl.yaml"), acl).unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    drop(alice);
    broker.wait_log("is not published");
    bob.expect_nothing(Duration::from_millis(300));
}

/// B-115, B-116, B-119: the applying entry's limits: replace the broker-wide
/// figures (here: none) for its users; another user is not held to them.
#[test]
fn an_entrys_limits_replace_the_broker_wide_figures_b115() {
    let acl = ACL.replace(
        "  alice: [device, worker]\n",
        "  alice:\n    roles: [device, worker]\n    limits:\n      publish_rate: 2\n",
    );
    let broker = start("limits", &acl);
    let mut alice = as_user(&broker, "alice-1", "alice");
    let q1 = QoS::AtLeastOnce;
    let codes: Vec<Option<u8>> = (0..4)
        .map(|_| alice.publish("alerts/alice/x", b"1", q1, false))
        .collect();
    assert!(codes.contains(&Some(0x97)), "{codes:?}");
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.subscribe("alerts/#", opts(q1)), vec![1]);
    let mut bob_pub = as_user(&broker, "bob-2", "bob");
    for _ in 0..4 {
        // bob may not write alerts: 0x87 every time, never 0x97 - no bound for bob.
        assert_eq!(
            bob_pub.publish("alerts/bob/x", b"1", q1, false),
            Some(NOT_AUTHORIZED)
        );
    }
}

/// B-293, B-294: deliveries are asked too. After a re-read takes bob's read away,
/// a broadcast is not delivered to him and his channel cursor stalls rather than
/// skipping; the re-read that gives the grant back wakes it, and he reads every
/// record he missed, in order.
#[test]
fn a_reread_applies_to_deliveries_and_a_channel_stalls_b293_b294() {
    let broker = start("deliveries", ACL);
    let q1 = QoS::AtLeastOnce;
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.subscribe("alerts/#", opts(q1)), vec![1]);
    assert_eq!(bob.subscribe("iot/+/events/#", opts(q1)), vec![1]);
    let mut alice = as_user(&broker, "alice-1", "alice");
    assert_eq!(
        alice.publish("iot/alice/events/e", b"1", q1, false),
        Some(0)
    );
    assert_eq!(&*bob.recv_publish().payload, b"1");
    let path = broker.dir.join("acl.yaml");
    let without = ACL.replace(
        "    - channel: events\n      allow: [read, seek]\n    - topic: \"#\"\n      allow: [read]\n",
        "    - channel: jobs\n      allow: [write]\n",
    );
    assert_ne!(without, ACL);
    std::fs::write(&path, &without).unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    assert_eq!(alice.publish("alerts/alice/a", b"x", q1, false), Some(0));
    assert_eq!(
        alice.publish("iot/alice/events/e", b"2", q1, false),
        Some(0)
    );
    assert_eq!(
        alice.publish("iot/alice/events/e", b"3", q1, false),
        Some(0)
    );
    bob.expect_nothing(Duration::from_millis(300));
    std::fs::write(&path, ACL).unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    // The grant coming back is itself what wakes the cursor: no new record needed.
    let got: Vec<Vec<u8>> = (0..2)
        .map(|_| bob.recv_publish().payload.to_vec())
        .collect();
    assert_eq!(got, [b"2".to_vec(), b"3".to_vec()]);
    assert_eq!(
        alice.publish("iot/alice/events/e", b"4", q1, false),
        Some(0)
    );
    assert_eq!(&*bob.recv_publish().payload, b"4");
}

/// B-295: a worker that lost consume is offered nothing; the job waits, its
/// attempt unspent, and goes out as attempt 1 once the grant is back.
#[test]
fn a_worker_without_consume_is_offered_nothing_b295() {
    let broker = start("offers", ACL);
    let q1 = QoS::AtLeastOnce;
    let mut alice = as_user(&broker, "alice-w", "alice");
    assert_eq!(alice.subscribe("$saguin/queue/jobs", opts(q1)), vec![1]);
    let path = broker.dir.join("acl.yaml");
    let taken = ACL
        .replace("  alice: [device, worker]\n", "  alice: [device]\n")
        .replace(
            "roles: [reader, on-call]",
            "roles: [reader, on-call, worker]",
        );
    std::fs::write(&path, &taken).unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    let mut submitter = as_user(&broker, "bob-submit", "bob");
    assert_eq!(submitter.publish("jobs/a", b"work", q1, false), Some(0));
    alice.expect_nothing(Duration::from_millis(500));
    std::fs::write(&path, ACL).unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    let offer = alice.recv_offer();
    assert_eq!(&*offer.payload, b"work");
    assert_eq!(common::user_property(&offer, "saguin-attempt"), Some("1"));
}

/// B-295: a worker whose consume goes between the offer and its PUBACK gives the
/// job back with its attempt unspent; it went to the lease, an attempt spent and the
/// job held until its visibility timeout.
#[test]
fn an_offer_acknowledged_after_consume_is_taken_gives_the_job_back_unspent_b295() {
    let broker = start("offer-withdrawn", ACL);
    let q1 = QoS::AtLeastOnce;
    let mut alice = as_user(&broker, "alice-w", "alice");
    assert_eq!(alice.subscribe("$saguin/queue/jobs", opts(q1)), vec![1]);
    let mut submitter = as_user(&broker, "alice-submit", "alice");
    assert_eq!(submitter.publish("jobs/a", b"work", q1, false), Some(0));
    let Packet::Publish(offer) = alice.recv() else {
        panic!("an offer")
    };
    let path = broker.dir.join("acl.yaml");
    std::fs::write(
        &path,
        ACL.replace("  alice: [device, worker]\n", "  alice: [device]\n"),
    )
    .unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    alice.puback(&offer);
    broker.wait_log("may no longer consume it");
    std::fs::write(&path, ACL).unwrap();
    broker.signal("USR1");
    broker.wait_log("acl_file");
    let again = alice.recv_offer();
    assert_eq!(&*again.payload, b"work");
    assert_eq!(common::user_property(&again, "saguin-attempt"), Some("1"));
}

/// B-248: a door beside the acl_file that identifies nobody (here a plain ws door
/// with no password file) is warned about when the broker starts.
#[test]
fn a_door_nothing_identifies_is_warned_about_at_startup_b248() {
    use std::io::BufRead;
    let dir = common::temp_dir("b248");
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).unwrap();
    let acl = "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  alice: [r]\n";
    std::fs::write(dir.join("acl.yaml"), acl).unwrap();
    let extra = "        password_file: {dir}/clients.passwd\n      ws:\n        address: 127.0.0.1:0\n    acl_file: {dir}/acl.yaml\n";
    let yaml = common::config(extra).replace("{dir}", &dir.display().to_string());
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("--config")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut warned = false;
    for line in std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
    {
        warned |= line.contains("WARN") && line.contains("admits clients nothing identifies");
        if line.contains("listening on") || line.contains("ERROR") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(warned, "no startup warning for the ws door");
}

/// B-280: on a latest channel a zero-length payload removes the key, which is
/// delete rather than write; a value is write.
#[test]
fn removing_a_key_needs_delete_b280() {
    let acl = "roles:\n  writer:\n    - channel: state\n      allow: [write]\n  keeper:\n    - channel: state\n      allow: [write, delete]\nusers:\n  alice: [writer]\n  bob: [keeper]\n";
    let broker = start("delete", acl);
    let q1 = QoS::AtLeastOnce;
    let mut alice = as_user(&broker, "alice-1", "alice");
    assert_eq!(alice.publish("iot/a/state/k", b"v", q1, false), Some(0));
    assert_eq!(
        alice.publish("iot/a/state/k", b"", q1, false),
        Some(NOT_AUTHORIZED)
    );
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.publish("iot/a/state/k", b"", q1, false), Some(0));
}

/// A sqlite provider keeping sessions, beside the password file and the acl_file.
const KEPT: &str = "broker:
  id: acl-restart
  log_level: debug
  storage:
    default: local
    default_retention_period: none
    default_retention_bytes: none
    providers:
      local:
        type: sqlite
        file_path: {dir}/saguin.db
  mqtt:
    password_file: {dir}/clients.passwd
    acl_file: {dir}/acl.yaml
    listen:
      tcp:
        address: 127.0.0.1:0
";

/// alice reads only `feed/public/#` and may write her status; bob writes and reads
/// everything broadcast.
const FEED_ACL: &str = "roles:
  device:
    - topic: feed/public/#
      allow: [read]
    - topic: status/%u
      allow: [write]
  admin:
    - topic: \"#\"
      allow: [read, write]
users:
  alice: [device]
  bob: [admin]
";

fn start_kept(dir: PathBuf) -> Broker {
    Broker::start_in(dir, KEPT)
}

fn persistent_login(client_id: &str, user: &str, expiry: u32) -> saguin::codec::Connect {
    let mut c = login(V5, client_id, user);
    c.clean_start = false;
    c.properties.edit().session_expiry_interval = Some(expiry);
    c
}

/// B-290 after a restart: a session read back from storage is asked as the client it
/// was stored as, under the acl_file the broker starts with. While it is away it is
/// queued only what that client may read now - a restored session asked as nobody
/// would be owed every topic its filter matches.
#[test]
fn a_restored_session_is_owed_only_what_its_user_may_read_b290() {
    let dir = common::temp_dir("acl-restart-read");
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).expect("copy the password file");
    let wide = FEED_ACL.replace("topic: feed/public/#", "topic: feed/#");
    std::fs::write(dir.join("acl.yaml"), wide).expect("write the acl_file");
    let broker = start_kept(dir);
    let (mut alice, ack) = Raw::handshake(broker.addr, persistent_login("alice-1", "alice", 300));
    assert_eq!(ack.code, 0, "{ack:?}");
    assert_eq!(alice.subscribe("feed/#", opts(QoS::AtLeastOnce)), [1]);
    let dir = broker.stop();
    drop(alice);
    std::fs::write(dir.join("acl.yaml"), FEED_ACL).expect("narrow the acl_file");

    let broker = start_kept(dir);
    let mut bob = as_user(&broker, "bob", "bob");
    let q1 = QoS::AtLeastOnce;
    assert_eq!(bob.publish("feed/secret", b"no", q1, false), Some(0));
    assert_eq!(bob.publish("feed/public/news", b"yes", q1, false), Some(0));
    let (mut alice, ack) = Raw::handshake(broker.addr, persistent_login("alice-1", "alice", 300));
    assert!(ack.session_present, "the session came back: {ack:?}");
    let got = alice.recv_publish();
    assert_eq!(
        (got.topic.as_ref() as &str, &got.payload[..]),
        ("feed/public/news", &b"yes"[..])
    );
    alice.expect_nothing(Duration::from_millis(500));
}

/// B-290 after a restart: a restored Will is authorized again, as its client, when it
/// fires; the acl_file edited while the broker was down withholds it.
#[test]
fn a_restored_will_is_asked_again_when_it_fires_b290() {
    let dir = common::temp_dir("acl-restart-will");
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).expect("copy the password file");
    std::fs::write(dir.join("acl.yaml"), FEED_ACL).expect("write the acl_file");
    let broker = start_kept(dir);
    let mut c = persistent_login("alice-1", "alice", 2);
    c.will = Some(Will {
        topic: "status/alice".into(),
        payload: b"offline".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    });
    let (alice, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0, "{ack:?}");
    let dir = broker.stop(); // a stop publishes no Will; the session keeps it (C-282)
    drop(alice);
    let revoked = FEED_ACL.replace("    - topic: status/%u\n      allow: [write]\n", "");
    std::fs::write(dir.join("acl.yaml"), revoked).expect("rewrite the acl_file");

    let broker = start_kept(dir);
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.subscribe("status/#", opts(QoS::AtLeastOnce)), [1]);
    // The session expires 2 s after the restart and its Will is due then.
    broker.wait_log("the acl_file no longer lets it publish there");
    bob.expect_nothing(Duration::from_millis(300));
}

/// B-320 (gaps §4): `/v1/operations/acl?user=&client=` answers what `saguin --acl
/// FILE USER CLIENT --json` does, from the acl_file the broker holds - SIGUSR1's
/// re-read included.
#[test]
fn the_operations_listener_explains_the_acl_file_it_holds_b320() {
    let dir = common::temp_dir("ops-acl");
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).expect("copy the password file");
    std::fs::write(dir.join("acl.yaml"), ACL).expect("write the acl_file");
    let ops = "  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n";
    let extra = EXTRA.replace("channels:\n", &format!("{ops}channels:\n"));
    let broker = Broker::start_in(dir, &common::config(&extra));
    let addr = broker.ops_addr();
    let config = broker.dir.join("saguin.yaml");
    let cli = |user: &str, client: &str| {
        let out = common::run_saguin(&[
            "--acl".as_ref(),
            config.as_os_str(),
            user.as_ref(),
            client.as_ref(),
            "--json".as_ref(),
        ]);
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        serde_json::from_str::<serde_json::Value>(&text).expect("JSON from the CLI")
    };
    let http = |query: &str| {
        let (status, body) =
            common::http_get(common::tcp(&addr), &format!("/v1/operations/acl?{query}"));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).expect("JSON from the listener")
    };
    assert_eq!(http("user=bob&client=bob-2"), cli("bob", "bob-2"));
    let before = http("user=alice&client=alice-1");
    assert_eq!(before, cli("alice", "alice-1"));

    // Re-read: alice loses her roles, and the listener says so at once.
    std::fs::write(
        broker.dir.join("acl.yaml"),
        ACL.replace("  alice: [device, worker]\n", "  alice: [device]\n"),
    )
    .expect("rewrite the acl_file");
    broker.signal("USR1");
    broker.wait_log("acl_file");
    let after = http("user=alice&client=alice-1");
    assert_eq!(after, cli("alice", "alice-1"));
    assert_ne!(after, before, "the worker role is gone");
    let (status, _) = common::http_get(common::tcp(&addr), "/v1/operations/acl");
    assert_eq!(status, 400);

    // B-175: /v1/operations/users names each session's user and door.
    let _alice = as_user(&broker, "alice-1", "alice");
    let (status, body) = common::http_get(common::tcp(&addr), "/v1/operations/users");
    assert_eq!(status, 200, "{body}");
    let users: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        users["sessions"],
        serde_json::json!([{
            "client": "alice-1",
            "user": "alice",
            "listener": "broker.mqtt.listen.tcp",
            "connected": true,
            "session_expiry": 0,
            "subscriptions": 0,
        }])
    );
}

/// C-015: read alone on a latest channel allows point reads and subscriptions and
/// refuses publishes and deletions.
#[test]
fn read_alone_on_a_latest_channel_reads_and_never_writes_c015() {
    let acl = "roles:\n  writer:\n    - channel: state\n      allow: [write, delete]\n  viewer:\n    - channel: state\n      allow: [read]\nusers:\n  alice: [writer]\n  bob: [viewer]\n";
    let broker = start("read-only", acl);
    let q1 = QoS::AtLeastOnce;
    let mut alice = as_user(&broker, "alice-1", "alice");
    assert_eq!(alice.publish("iot/a/state/k", b"v", q1, false), Some(0));
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(verb(&mut bob, "$saguin/kv/get", b"iot/a/state/k"), 0);
    assert_eq!(&*bob.recv_publish().payload, b"v");
    assert_eq!(bob.subscribe("iot/+/state/+", opts(q1)), vec![1]);
    assert_eq!(&*bob.recv_publish().payload, b"v");
    assert_eq!(
        bob.publish("iot/a/state/k", b"w", q1, false),
        Some(NOT_AUTHORIZED)
    );
    assert_eq!(
        bob.publish("iot/a/state/k", b"", q1, false),
        Some(NOT_AUTHORIZED)
    );
    bob.expect_nothing(Duration::from_millis(300));
}

/// C-016: a nested registry (`iot/+/schemas/+`, narrowed to `iot/%u/schemas/+`) is
/// governed exactly as one at `schemas/#` (narrowed to `schemas/%u/#`): the user's own
/// keys written and point-read, another user's refused both ways.
#[test]
fn a_nested_registry_is_governed_like_one_at_the_top_c016() {
    let dir = common::temp_dir("nested-registry");
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).expect("copy the password file");
    let acl = "roles:
  publisher:
    - channel: top
      filter: \"schemas/%u/#\"
      allow: [read, write]
    - channel: nested
      filter: \"iot/%u/schemas/+\"
      allow: [read, write]
users:
  alice: [publisher]
  bob: [publisher]
";
    std::fs::write(dir.join("acl.yaml"), acl).expect("write the acl_file");
    let extra = "    password_file: {dir}/clients.passwd
    acl_file: {dir}/acl.yaml
channels:
  top:
    type: latest
    filter: schemas/#
  nested:
    type: latest
    filter: iot/+/schemas/+
";
    let broker = Broker::start_in(dir, &common::config(extra));
    let q1 = QoS::AtLeastOnce;
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.publish("schemas/bob/v1", b"b", q1, false), Some(0));
    assert_eq!(bob.publish("iot/bob/schemas/v1", b"b", q1, false), Some(0));
    let mut alice = as_user(&broker, "alice-1", "alice");
    for (own, other) in [
        ("schemas/alice/v1", "schemas/bob/v1"),
        ("iot/alice/schemas/v1", "iot/bob/schemas/v1"),
    ] {
        assert_eq!(alice.publish(own, b"a", q1, false), Some(0), "{own}");
        assert_eq!(
            alice.publish(other, b"a", q1, false),
            Some(NOT_AUTHORIZED),
            "{other}"
        );
        assert_eq!(
            verb(&mut alice, "$saguin/kv/get", own.as_bytes()),
            0,
            "{own}"
        );
        let got = alice.recv_publish();
        assert_eq!((&*got.topic, &*got.payload), ("me/answer", &b"a"[..]));
        assert_eq!(
            verb(&mut alice, "$saguin/kv/get", other.as_bytes()),
            NOT_AUTHORIZED,
            "{other}"
        );
    }
    alice.expect_nothing(Duration::from_millis(300));
}

/// C-245: retained denied - a retained broadcast publish at QoS 0 is DISCONNECT 0x9A
/// too, and the value is not stored.
#[test]
fn a_denied_retained_value_is_0x9a_at_qos0_and_not_stored_c245() {
    let broker = start("deny-retained-qos0", &features_acl("retained"));
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let mut raw = as_user(&broker, "alice-r", "alice");
        raw.send(&Packet::Publish(publish("alerts/x", b"1", qos, true)));
        assert_eq!(raw.expect_disconnect(), 0x9A, "{qos:?}");
    }
    let mut bob = as_user(&broker, "bob", "bob");
    assert_eq!(bob.subscribe("alerts/#", opts(QoS::AtLeastOnce)), vec![1]);
    bob.expect_nothing(Duration::from_millis(300));
}
