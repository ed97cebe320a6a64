//! Client-declared partitioning end to end over MQTT (RFC 0003 "Client-declared
//! partitioning"; C-154..C-201): `saguin-filter` on SUBSCRIBE, its refusals on the
//! SUBACK, and the slice on broadcast, retained values, `append` and `latest`
//! channels and a resumed session.

mod common;

use std::time::Duration;

use common::{Broker, Raw, connect, opts, start_with_channels};
use saguin::broker::partition::topic_hash;
use saguin::codec::{
    Packet, Properties, PropertyValues, ProtocolVersion::V5, QoS, SubAck, Subscribe,
};

/// The four vector topics of RFC 0003 "The hash, in full" (C-174..C-177).
const VECTORS: [&str; 4] = [
    "iot/depot/events/dev-1",
    "iot/water/w-7/inspect",
    "orders/resize/thumbnails/42",
    "a",
];

/// What a quiet connection is given to show nothing more comes.
const QUIET: Duration = Duration::from_millis(300);

/// Subscribes to `filters` at QoS 1 in one SUBSCRIBE carrying one `saguin-filter`
/// per value in `declared`, and returns the SUBACK.
fn subscribe(
    raw: &mut Raw,
    filters: &[&str],
    declared: &[&str],
    identifier: Option<u32>,
) -> SubAck {
    let properties = Properties::from(PropertyValues {
        user_properties: declared
            .iter()
            .map(|v| ("saguin-filter".to_string(), v.to_string()))
            .collect(),
        subscription_identifiers: identifier.into_iter().collect(),
        ..PropertyValues::default()
    });
    raw.send(&Packet::Subscribe(Subscribe {
        packet_id: 7,
        properties,
        filters: filters
            .iter()
            .map(|f| (f.to_string(), opts(QoS::AtLeastOnce)))
            .collect(),
    }));
    match raw.recv() {
        Packet::SubAck(ack) => ack,
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

/// Publishes each topic at QoS 1, its payload the topic itself.
fn publish_all(publisher: &mut Raw, topics: &[&str], retain: bool) {
    for topic in topics {
        assert_eq!(
            publisher.publish(topic, topic.as_bytes(), QoS::AtLeastOnce, retain),
            Some(0),
            "{topic}"
        );
    }
}

/// Receives `n` publishes, then expects nothing more; their topics in arrival order.
fn receive(raw: &mut Raw, n: usize) -> Vec<String> {
    let got = (0..n)
        .map(|_| raw.recv_publish().topic.to_string())
        .collect();
    raw.expect_nothing(QUIET);
    got
}

/// The topics of `candidates` whose `topic_hash mod partitions` is `index`.
fn in_slice<'a>(candidates: &[&'a str], partitions: u64, index: u64) -> Vec<&'a str> {
    candidates
        .iter()
        .copied()
        .filter(|t| topic_hash(t) % partitions == index)
        .collect()
}

#[test]
fn c178_topic_hash_3_1_and_8_0_receive_dev_1_and_a_only() {
    let broker = Broker::start("");
    let mut thirds = Raw::connected(broker.addr, V5, "thirds");
    let mut eighths = Raw::connected(broker.addr, V5, "eighths");
    let mut everything = Raw::connected(broker.addr, V5, "everything");
    assert_eq!(
        subscribe(&mut thirds, &["#"], &["topic_hash(3, 1)"], None).codes,
        [1]
    );
    assert_eq!(
        subscribe(&mut eighths, &["#"], &["topic_hash(8, 0)"], None).codes,
        [1]
    );
    // C-155: no declaration, everything the filter reaches.
    assert_eq!(subscribe(&mut everything, &["#"], &[], None).codes, [1]);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    publish_all(&mut publisher, &VECTORS, false);
    assert_eq!(receive(&mut thirds, 2), ["iot/depot/events/dev-1", "a"]);
    assert_eq!(receive(&mut eighths, 2), ["iot/depot/events/dev-1", "a"]);
    assert_eq!(receive(&mut everything, 4), VECTORS);
}

#[test]
fn c156_two_indices_are_an_or() {
    let broker = Broker::start("");
    let mut member = Raw::connected(broker.addr, V5, "member");
    let ack = subscribe(
        &mut member,
        &["#"],
        &["topic_hash(8, 4)", "topic_hash(8, 0)"],
        None,
    );
    assert_eq!(ack.codes, [1]);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    publish_all(&mut publisher, &VECTORS, false);
    // mod 8: dev-1 0, w-7/inspect 4, thumbnails/42 1, a 0 (C-174..C-177).
    assert_eq!(
        receive(&mut member, 3),
        ["iot/depot/events/dev-1", "iot/water/w-7/inspect", "a"]
    );
}

#[test]
fn c161_c187_a_malformed_declaration_refuses_every_filter_with_a_reason_string() {
    let broker = Broker::start("");
    let mut client = Raw::connected(broker.addr, V5, "client");
    let ack = subscribe(
        &mut client,
        &["iot/#", "a", "orders/#"],
        &["topic_hash(+3, 0)"],
        None,
    );
    assert_eq!(ack.codes, [0x83, 0x83, 0x83]);
    let why = ack
        .properties
        .reason_string
        .clone()
        .expect("a Reason String");
    assert!(why.contains("saguin-filter"), "{why}");
    assert!(why.contains("topic_hash(<partitions>, <index>)"), "{why}");
    assert!(why.contains("not a number"), "{why}");

    // C-188: too large is another sentence.
    let ack = subscribe(
        &mut client,
        &["iot/#"],
        &["topic_hash(2147483648, 0)"],
        None,
    );
    assert_eq!(ack.codes, [0x83]);
    let large = ack
        .properties
        .reason_string
        .clone()
        .expect("a Reason String");
    assert!(large.contains("too large"), "{large}");
    assert_ne!(large, why);

    // C-158: different counts; C-186: an empty value; C-180: the spelling.
    let cases: [&[&str]; 4] = [
        &["topic_hash(4, 0)", "topic_hash(6, 1)"],
        &[""],
        &["TOPIC_HASH(3, 0)"],
        &["topic_hash(1, 8)"],
    ];
    for declared in cases {
        let ack = subscribe(&mut client, &["iot/#", "a"], declared, None);
        assert_eq!(ack.codes, [0x83, 0x83], "{declared:?}");
        assert!(ack.properties.reason_string.is_some(), "{declared:?}");
    }

    // Nothing was granted: a publish reaches nobody, and the connection stands.
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    publish_all(&mut publisher, &VECTORS, false);
    client.expect_nothing(QUIET);
}

#[test]
fn c189_request_problem_information_0_gets_the_code_alone() {
    let broker = Broker::start("");
    let mut c = connect(V5, "quiet", true);
    c.properties.edit().request_problem_information = Some(0);
    let (mut client, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0);
    let ack = subscribe(&mut client, &["iot/#"], &["topic_hash(3)"], None);
    assert_eq!(ack.codes, [0x83]);
    assert_eq!(ack.properties.reason_string, None);
}

#[test]
fn c167_c168_shared_and_queue_forms_are_refused_alone_and_the_rest_sliced() {
    let broker = start_with_channels();
    let mut client = Raw::connected(broker.addr, V5, "client");
    let ack = subscribe(
        &mut client,
        &["$share/g/iot/#", "$saguin/queue/jobs", "iot/#"],
        &["topic_hash(3, 1)"],
        None,
    );
    assert_eq!(ack.codes, [0x83, 0x83, 1]);
    let why = ack
        .properties
        .reason_string
        .clone()
        .expect("a Reason String");
    assert!(why.contains("saguin-filter"), "{why}");
    assert!(why.contains("topic_hash(<partitions>, <index>)"), "{why}");
    // The shared refusal has its own sentence.
    let ack = subscribe(
        &mut client,
        &["$share/g/iot/#"],
        &["topic_hash(3, 1)"],
        None,
    );
    assert_eq!(ack.codes, [0x83]);
    let shared = ack
        .properties
        .reason_string
        .clone()
        .expect("a Reason String");
    assert!(shared.contains("$share/"), "{shared}");
    assert_ne!(shared, why);

    // The filter granted beside them carries the declaration (C-160).
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    publish_all(&mut publisher, &VECTORS[..2], false);
    assert_eq!(receive(&mut client, 1), ["iot/depot/events/dev-1"]);
}

#[test]
fn c164_retained_values_handed_to_a_new_subscriber_honour_the_slice() {
    let broker = Broker::start("");
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    publish_all(&mut publisher, &VECTORS, true);
    let mut member = Raw::connected(broker.addr, V5, "member");
    assert_eq!(
        subscribe(&mut member, &["#"], &["topic_hash(3, 1)"], None).codes,
        [1]
    );
    let mut got = Vec::new();
    for _ in 0..2 {
        let p = member.recv_publish();
        assert!(p.retain, "a retained value carries RETAIN");
        got.push(p.topic.to_string());
    }
    member.expect_nothing(QUIET);
    got.sort();
    assert_eq!(got, ["a", "iot/depot/events/dev-1"]);
}

#[test]
fn c163_a_declared_and_an_undeclared_subscription_get_the_union_once() {
    let broker = Broker::start("");
    let mut client = Raw::connected(broker.addr, V5, "client");
    // Two packets: the declaration applies to the first only (C-160).
    assert_eq!(
        subscribe(&mut client, &["#"], &["topic_hash(3, 1)"], Some(1)).codes,
        [1]
    );
    assert_eq!(subscribe(&mut client, &["iot/#"], &[], Some(2)).codes, [1]);
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    publish_all(&mut publisher, &VECTORS, false);
    let mut got = Vec::new();
    for _ in 0..3 {
        let p = client.recv_publish();
        let mut ids = p.properties.subscription_identifiers.clone();
        ids.sort_unstable();
        got.push((p.topic.to_string(), ids));
    }
    client.expect_nothing(QUIET);
    assert_eq!(
        got,
        [
            ("iot/depot/events/dev-1".to_string(), vec![1, 2]),
            ("iot/water/w-7/inspect".to_string(), vec![2]),
            ("a".to_string(), vec![1]),
        ]
    );
}

#[test]
fn c200_a_resumed_session_keeps_its_declaration_and_c201_a_new_one_does_not() {
    let broker = Broker::start("");
    let mut c = connect(V5, "member", true);
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut member, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(
        subscribe(&mut member, &["#"], &["topic_hash(3, 1)"], None).codes,
        [1]
    );
    member.disconnect();

    // QoS 1 while away is held for the session: only its slice.
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    publish_all(&mut publisher, &VECTORS, false);
    c.clean_start = false;
    let (mut member, ack) = Raw::handshake(broker.addr, c.clone());
    assert!(ack.session_present);
    assert_eq!(receive(&mut member, 2), ["iot/depot/events/dev-1", "a"]);

    // Live, after the resume, with no new SUBSCRIBE.
    publish_all(&mut publisher, &VECTORS, false);
    assert_eq!(receive(&mut member, 2), ["iot/depot/events/dev-1", "a"]);
    member.disconnect();

    // A session begun new has no subscription, so no declaration either.
    c.clean_start = true;
    let (mut member, ack) = Raw::handshake(broker.addr, c);
    assert!(!ack.session_present);
    assert_eq!(subscribe(&mut member, &["#"], &[], None).codes, [1]);
    publish_all(&mut publisher, &VECTORS, false);
    assert_eq!(receive(&mut member, 4), VECTORS);
}

/// Twelve topics of the `events` append channel, and the ones in slice 0 of 2.
fn events_topics() -> Vec<String> {
    (0..12).map(|i| format!("events/e{i}")).collect()
}

#[test]
fn c165_an_append_replay_and_its_live_records_honour_the_slice() {
    let broker = start_with_channels();
    let topics = events_topics();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let wanted = in_slice(&topics, 2, 0);
    assert!(
        (1..topics.len()).contains(&wanted.len()),
        "the topics fall on both sides: {wanted:?}"
    );
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publish_all(&mut publisher, &topics, false);
    let mut c = connect(V5, "member", true);
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut member, _) = Raw::handshake(broker.addr, c.clone());
    assert_eq!(
        subscribe(&mut member, &["events/#"], &["topic_hash(2, 0)"], None).codes,
        [1]
    );
    assert_eq!(receive(&mut member, wanted.len()), wanted, "the replay");
    publish_all(&mut publisher, &topics, false);
    assert_eq!(receive(&mut member, wanted.len()), wanted, "live records");

    // From its stored position, after a resume with no new SUBSCRIBE (C-200).
    member.disconnect();
    publish_all(&mut publisher, &topics, false);
    c.clean_start = false;
    let (mut member, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    assert_eq!(
        receive(&mut member, wanted.len()),
        wanted,
        "after the resume"
    );
}

#[test]
fn c198_c199_the_position_steps_over_records_outside_the_slice_and_widening_recovers_none() {
    let broker = start_with_channels();
    let topics = events_topics();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let wanted = in_slice(&topics, 2, 1);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publish_all(&mut publisher, &topics, false);
    let mut member = Raw::connected(broker.addr, V5, "member");
    assert_eq!(
        subscribe(&mut member, &["events/#"], &["topic_hash(2, 1)"], None).codes,
        [1]
    );
    assert_eq!(receive(&mut member, wanted.len()), wanted);
    // Widened: the same filter again with no declaration replaces the subscription,
    // and the cursor is already past what slice 1 stepped over.
    assert_eq!(subscribe(&mut member, &["events/#"], &[], None).codes, [1]);
    member.expect_nothing(QUIET);
    publish_all(&mut publisher, &topics, false);
    assert_eq!(receive(&mut member, topics.len()), topics);
}

#[test]
fn c166_a_latest_channel_slices_its_current_state_pass_and_its_changes() {
    let broker = start_with_channels();
    let keys: Vec<String> = (0..10).map(|i| format!("state/k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let wanted = in_slice(&keys, 3, 2);
    assert!(
        !wanted.is_empty() && wanted.len() < keys.len(),
        "{wanted:?}"
    );
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publish_all(&mut publisher, &keys, false);
    let mut member = Raw::connected(broker.addr, V5, "member");
    assert_eq!(
        subscribe(&mut member, &["state/#"], &["topic_hash(3, 2)"], None).codes,
        [1]
    );
    let mut pass = Vec::new();
    for _ in 0..wanted.len() {
        let p = member.recv_publish();
        assert!(p.retain, "the current-state pass carries RETAIN");
        pass.push(p.topic.to_string());
    }
    member.expect_nothing(QUIET);
    pass.sort();
    let mut sorted = wanted.clone();
    sorted.sort_unstable();
    assert_eq!(pass, sorted, "the current-state pass");
    publish_all(&mut publisher, &keys, false);
    assert_eq!(receive(&mut member, wanted.len()), wanted, "later changes");
}

#[test]
fn c195_two_clients_on_one_filter_with_different_counts_are_logged_by_name() {
    let broker = Broker::start("");
    let mut first = Raw::connected(broker.addr, V5, "member-one");
    let mut second = Raw::connected(broker.addr, V5, "member-two");
    assert_eq!(
        subscribe(&mut first, &["iot/+/events/#"], &["topic_hash(3, 0)"], None).codes,
        [1]
    );
    assert_eq!(
        subscribe(
            &mut second,
            &["iot/+/events/#"],
            &["topic_hash(4, 1)"],
            None
        )
        .codes,
        [1]
    );
    let line = broker.wait_log("partitions on \"iot/+/events/#\"");
    assert!(
        line.contains("member-one") && line.contains("member-two"),
        "{line}"
    );
}
