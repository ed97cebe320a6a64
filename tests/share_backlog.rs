//! A shared group's backlog is the group's (B-447; RFC 0002 "What a shared group is
//! owed: broker.share", "Shared subscriptions"): what no member could take when it came
//! is held for the group, and any member that can take it collects it - a member that
//! connects while the one it was held for stays away, a restart between included -
//! and a member whose session ends gives back what it had collected and not settled.

mod common;

use std::time::Duration;

use common::sessions::{
    config, connected, expected, fresh_dir, kill, nothing_more, persistent, publish_n, receive,
    subscribe_and_leave, with_receive_maximum,
};
use common::{Raw, opts};
use saguin::codec::{Packet, QoS};

const GROUP: &str = "$share/g/jobs/#";

/// Subscribes a connected member to the group, expecting QoS 1 granted.
fn join(member: &mut Raw) {
    assert_eq!(member.subscribe(GROUP, opts(QoS::AtLeastOnce)), [1]);
}

/// B-447: a member away with a session that outlives its connection holds what the
/// group is owed; another member that connects collects it, in order, and the away
/// member resuming is not sent it again.
#[test]
fn b447_another_member_collects_what_the_group_holds() {
    let broker = common::Broker::start_in(fresh_dir(), &config("local"));
    subscribe_and_leave(&broker, "away", GROUP, QoS::AtLeastOnce);
    publish_n(&broker, "jobs/1", "job", 4, QoS::AtLeastOnce);
    // A clean member with a window of one takes the backlog one at a time.
    let (mut other, _) = connected(
        &broker,
        with_receive_maximum(persistent("other", true, 0), 1),
    );
    join(&mut other);
    assert_eq!(receive(&mut other, 4), expected("job", 0..4));
    nothing_more(&mut other, Duration::from_millis(300));
    let (mut away, present) = connected(&broker, persistent("away", false, 300));
    assert!(present);
    nothing_more(&mut away, Duration::from_millis(500));
}

/// B-447: the held deliveries survive SIGKILL on sqlite as the group's: after the
/// restart a member other than the one they were held for collects them, and once it
/// has acknowledged them a second restart owes them to nobody.
#[test]
fn b447_after_sigkill_another_member_collects_the_backlog() {
    let broker = common::Broker::start_in(fresh_dir(), &config("local"));
    subscribe_and_leave(&broker, "away", GROUP, QoS::AtLeastOnce);
    subscribe_and_leave(&broker, "other", GROUP, QoS::AtLeastOnce);
    publish_n(&broker, "jobs/1", "job", 3, QoS::AtLeastOnce);
    let dir = kill(broker);
    let broker = common::Broker::start_in(dir, &config("local"));
    let (mut other, present) = connected(&broker, persistent("other", false, 300));
    assert!(present);
    assert_eq!(receive(&mut other, 3), expected("job", 0..3));
    nothing_more(&mut other, Duration::from_millis(300));
    other.disconnect();
    broker.wait_log("other disconnected");
    let dir = broker.stop();
    let broker = common::Broker::start_in(dir, &config("local"));
    for id in ["away", "other"] {
        let (mut member, present) = connected(&broker, persistent(id, false, 300));
        assert!(present, "{id}");
        nothing_more(&mut member, Duration::from_millis(300));
        member.disconnect();
    }
}

/// RFC 0002 "Shared subscriptions": a member whose session ends with its connection
/// gives back what it had collected and not acknowledged; the member it was held for
/// is sent it on resuming, DUP set as it may have been seen.
/// what the group handed a member whose session ends is given back.
#[test]
fn b447_what_a_clean_member_collected_and_did_not_settle_goes_back_to_the_group() {
    let broker = common::Broker::start_in(fresh_dir(), &config("local"));
    subscribe_and_leave(&broker, "away", GROUP, QoS::AtLeastOnce);
    publish_n(&broker, "jobs/1", "job", 2, QoS::AtLeastOnce);
    let (mut clean, _) = connected(&broker, persistent("clean", true, 0));
    join(&mut clean);
    for want in expected("job", 0..2) {
        match clean.recv() {
            Packet::Publish(p) => assert_eq!(String::from_utf8_lossy(&p.payload), want),
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
    drop(clean); // no PUBACK, no DISCONNECT
    broker.wait_log("clean disconnected");
    let (mut away, present) = connected(&broker, persistent("away", false, 300));
    assert!(present);
    let mut got = Vec::new();
    while got.len() < 2 {
        match away.recv() {
            Packet::Publish(p) => {
                assert!(p.dup, "given back after it went out once: {p:?}");
                if let Some(id) = p.packet_id {
                    away.send(&Packet::PubAck(saguin::codec::Ack::new(id, 0)));
                }
                got.push(String::from_utf8_lossy(&p.payload).to_string());
            }
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
    assert_eq!(got, expected("job", 0..2));
    nothing_more(&mut away, Duration::from_millis(300));
}

/// B-448: what a group's last member that outlives its connection held, with only
/// clean members left to give it to and none of them connected, is dropped and
/// counted when that session ends.
/// what the group handed a member whose session ends is counted when nobody takes it.
#[test]
fn b448_a_backlog_with_nobody_left_to_hold_it_is_dropped_and_counted() {
    let yaml = config("local").replace(
        "  session:\n",
        "  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\n  session:\n",
    );
    let broker = common::Broker::start_in(fresh_dir(), &yaml);
    let (mut brief, _) = connected(&broker, persistent("brief", true, 1));
    join(&mut brief);
    brief.disconnect();
    broker.wait_log("brief disconnected");
    publish_n(&broker, "jobs/1", "job", 2, QoS::AtLeastOnce);
    // The session expires a second later, at the next housekeeping tick.
    std::thread::sleep(Duration::from_millis(2500));
    broker.assert_metric("saguin_session_deliveries_dropped_total{cause=\"no_shared_member\"} 2");
}

/// B-447, MQTT-3.3.4-3: a collected delivery goes as the collecting member
/// subscribed, at its granted QoS and with its Subscription Identifier, not as the
/// member it was held for did.
#[test]
fn b447_a_collected_delivery_goes_as_the_collector_subscribed() {
    let broker = common::Broker::start_in(fresh_dir(), &config("local"));
    subscribe_and_leave(&broker, "away", GROUP, QoS::ExactlyOnce);
    publish_n(&broker, "jobs/1", "job", 1, QoS::ExactlyOnce);
    let (mut other, _) = connected(&broker, persistent("other", true, 0));
    let properties = saguin::codec::Properties::from(saguin::codec::PropertyValues {
        subscription_identifiers: vec![7],
        ..Default::default()
    });
    assert_eq!(
        other.subscribe_with(GROUP, opts(QoS::AtLeastOnce), properties),
        [1]
    );
    let publish = other.recv_publish();
    assert_eq!(&*publish.payload, b"job-0");
    assert_eq!(publish.qos, QoS::AtLeastOnce);
    assert_eq!(publish.properties.subscription_identifiers, [7]);
    nothing_more(&mut other, Duration::from_millis(300));
}

/// a channel's records are held for the group as broadcast is: a member away
/// whose session outlives its connection holds them, and another member that connects
/// collects them, in order.
#[test]
fn a_groups_channel_records_are_held_like_its_broadcast_a127() {
    let broker = common::Broker::start_in(fresh_dir(), &config("local"));
    subscribe_and_leave(&broker, "away", "$share/g/events/#", QoS::AtLeastOnce);
    publish_n(&broker, "events/1", "record", 3, QoS::AtLeastOnce);
    let (mut other, _) = connected(&broker, persistent("other", true, 0));
    assert_eq!(
        other.subscribe("$share/g/events/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(receive(&mut other, 3), expected("record", 0..3));
    nothing_more(&mut other, Duration::from_millis(300));
}

/// a group with no member whose session outlives its connection drops what no
/// member can take, each drop counted `no_shared_member`: here its one member's window
/// (Receive Maximum 1) is full, and what was dropped never comes later.
#[test]
fn a_group_with_no_lasting_member_drops_what_nobody_can_take_a128() {
    let yaml = config("local").replace(
        "  session:\n",
        "  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\n  session:\n",
    );
    let broker = common::Broker::start_in(fresh_dir(), &yaml);
    let (mut clean, _) = connected(
        &broker,
        with_receive_maximum(persistent("clean", true, 0), 1),
    );
    join(&mut clean);
    publish_n(&broker, "jobs/1", "job", 3, QoS::AtLeastOnce);
    let first = clean.recv_publish();
    assert_eq!(&*first.payload, b"job-0");
    broker.assert_metric("saguin_session_deliveries_dropped_total{cause=\"no_shared_member\"} 2");
    clean.puback(&first);
    nothing_more(&mut clean, Duration::from_millis(300));
}

/// an expired session leaves every shared group it belonged to: a new session
/// under its client id, which never joined, is sent none of the group's messages, and
/// the member left takes them all.
#[test]
fn an_expired_session_leaves_its_shared_groups_a130() {
    let broker = common::Broker::start_in(fresh_dir(), &config("local"));
    let (mut brief, _) = connected(&broker, persistent("brief", true, 1));
    join(&mut brief);
    brief.disconnect();
    broker.wait_log("brief disconnected");
    // The session expires a second later, at the next housekeeping tick.
    std::thread::sleep(Duration::from_millis(2500));
    let (mut again, present) = connected(&broker, persistent("brief", false, 0));
    assert!(!present, "the session expired");
    let (mut other, _) = connected(&broker, persistent("other", true, 0));
    join(&mut other);
    publish_n(&broker, "jobs/1", "job", 2, QoS::AtLeastOnce);
    assert_eq!(receive(&mut other, 2), expected("job", 0..2));
    nothing_more(&mut again, Duration::from_millis(300));
}

/// A-127, B-449: a member granted QoS 0 does not hold the group's QoS 1 backlog,
/// which it would keep at QoS 0, that is not at all: the next lasting member holds it,
/// and collects it when it comes back.
#[test]
fn a_qos0_member_is_passed_over_as_the_holder_of_a_qos1_backlog() {
    let broker = common::Broker::start_in(fresh_dir(), &config("local"));
    subscribe_and_leave(&broker, "a-qos0", GROUP, QoS::AtMostOnce);
    subscribe_and_leave(&broker, "b-qos1", GROUP, QoS::AtLeastOnce);
    publish_n(&broker, "jobs/1", "job", 2, QoS::AtLeastOnce);
    let (mut b, present) = connected(&broker, persistent("b-qos1", false, 300));
    assert!(present);
    assert_eq!(receive(&mut b, 2), expected("job", 0..2));
}

/// a member whose Maximum Packet Size a message passes does not hold it
/// for the group, where it was discarded on the spot: the next lasting member does.
#[test]
fn a_member_the_message_is_too_large_for_does_not_hold_it() {
    let broker = common::Broker::start_in(fresh_dir(), &config("local"));
    let mut small = persistent("a-small", true, 300);
    small.properties.edit().maximum_packet_size = Some(200);
    let (mut a, _) = connected(&broker, small);
    join(&mut a);
    subscribe_and_leave(&broker, "b-away", GROUP, QoS::AtLeastOnce);
    let mut p = Raw::connected(broker.addr, saguin::codec::ProtocolVersion::V5, "big");
    assert_eq!(
        p.publish("jobs/big", &[b'x'; 5000], QoS::AtLeastOnce, false),
        Some(0)
    );
    nothing_more(&mut a, Duration::from_millis(300));
    let (mut b, present) = connected(&broker, persistent("b-away", false, 300));
    assert!(present);
    let got = b.recv_publish();
    assert_eq!((&*got.topic, got.payload.len()), ("jobs/big", 5000));
}
