//! The verbs under `$saguin/`: point reads of a latest channel and a consumer's seek
//! (gaps G-01, G-18; RFC 0002 "Publishing" 0x83 / 0x90).

mod common;

use std::time::Duration;

use common::{Broker, Raw, connect, opts, start_with_channels as start, user_property};
use saguin::codec::{
    Packet,
    ProtocolVersion::{V5, V311},
    Publish, QoS,
};

/// A QoS 1 request on `topic` whose answer goes to `response`.
fn request(topic: &str, payload: &[u8], response: &str) -> Publish {
    let mut p = common::publish(topic, payload, QoS::AtLeastOnce, false);
    p.properties.edit().response_topic = Some(response.to_string());
    p
}

fn get(key: &str, response: Option<&str>) -> Publish {
    let mut p = common::publish("$saguin/kv/get", key.as_bytes(), QoS::AtLeastOnce, false);
    p.properties.edit().response_topic = response.map(str::to_string);
    p.properties.edit().correlation_data = Some(b"ask-1".to_vec());
    p
}

/// A-209: the payload is the topic, read from its latest channel.
/// A-087: the stored value carries its age and position (`saguin-timestamp`, `-offset`).
#[test]
fn a_point_read_answers_the_current_value_with_its_age_and_position() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/pump", b"on", QoS::AtLeastOnce, false);
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    assert_eq!(
        asker.publish_packet(get("state/pump", Some("replies/me"))),
        Some(0)
    );
    let reply = asker.recv_publish();
    assert_eq!(
        (&*reply.topic, &*reply.payload, reply.qos, reply.retain),
        ("replies/me", &b"on"[..], QoS::AtMostOnce, false)
    );
    assert_eq!(
        reply.properties.correlation_data.as_deref(),
        Some(&b"ask-1"[..])
    );
    assert!(user_property(&reply, "saguin-offset").is_some());
    assert!(user_property(&reply, "saguin-timestamp").is_some());
}

#[test]
fn a_point_read_of_an_absent_key_answers_an_empty_payload() {
    let broker = start();
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    assert_eq!(
        asker.publish_packet(get("state/never", Some("replies/me"))),
        Some(0)
    );
    let reply = asker.recv_publish();
    assert!(reply.payload.is_empty());
    assert_eq!(
        reply.properties.correlation_data.as_deref(),
        Some(&b"ask-1"[..])
    );
    assert!(reply.properties.user_properties.is_empty());
}

#[test]
fn a_point_read_without_correlation_data_is_answered_with_the_key_as_its_correlation_c007() {
    let broker = start();
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    let mut request = get("state/never", Some("replies/me"));
    request.properties.edit().correlation_data = None;
    assert_eq!(asker.publish_packet(request), Some(0));
    let reply = asker.recv_publish();
    assert_eq!(
        reply.properties.correlation_data.as_deref(),
        Some(&b"state/never"[..])
    );
}

#[test]
fn a_point_read_at_qos0_is_dropped_unanswered_c005() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/pump", b"on", QoS::AtLeastOnce, false);
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    let mut request = get("state/pump", Some("replies/me"));
    request.qos = QoS::AtMostOnce;
    request.packet_id = None;
    asker.send(&Packet::Publish(request));
    asker.expect_nothing(Duration::from_millis(300));
}

/// A-029: a channel's name, not its filter, builds its verbs: the seek topic, the
/// queue's form and response topic, and the dead-letter channel's name.
/// A-225: the dead-letter channel's seek is `$saguin/consumer/<name>__dlq/seek`.
#[test]
fn a_channels_name_not_its_filter_builds_its_verbs_a029() {
    let broker = common::Broker::start(
        "channels:\n  readings:\n    type: append\n    filter: iot/water/+/flow\n  inspections:\n    type: queue\n    filter: iot/water/+/inspect\n",
    );
    let mut client = Raw::connected(broker.addr, V5, "client");
    for (channel, code) in [("readings", 0), ("inspections__dlq", 0), ("iot", 0x90)] {
        let topic = format!("$saguin/consumer/{channel}/seek");
        let seek = common::publish(&topic, b"0", QoS::AtLeastOnce, false);
        client.send(&Packet::Publish(seek));
        // The PUBACK and, when the seek is taken, its answer on the reply topic.
        let (mut acked, mut answered) = (None, code != 0);
        while acked.is_none() || !answered {
            match client.recv() {
                Packet::PubAck(ack) => acked = Some(ack.code),
                Packet::Publish(answer) => {
                    assert_eq!(*answer.topic, *format!("{topic}/reply"));
                    answered = true;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(acked, Some(code), "{topic}");
    }
    let mut worker = Raw::connected(broker.addr, V5, "worker");
    assert_eq!(
        worker.subscribe("$saguin/queue/iot", opts(QoS::AtLeastOnce)),
        [0x8F]
    );
    assert_eq!(
        worker.subscribe("$saguin/queue/inspections", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(
        client.publish("iot/water/w-7/inspect", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    let offer = worker.recv_offer();
    worker.puback(&offer);
    assert_eq!(
        offer.properties.response_topic.as_deref(),
        Some("$saguin/queue/inspections/response")
    );
    let correlation = offer.properties.correlation_data.clone();
    assert_eq!(
        worker.answer_qos1("$saguin/queue/inspections/response", correlation, b"ack"),
        0
    );
}

#[test]
fn a_seek_naming_no_append_channel_says_which_it_names_a207() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    let mut reasons = Vec::new();
    for channel in ["nosuch", "state", "jobs"] {
        let topic = format!("$saguin/consumer/{channel}/seek");
        reader.send(&Packet::Publish(common::publish(
            &topic,
            b"0",
            QoS::AtLeastOnce,
            false,
        )));
        let Packet::PubAck(ack) = reader.recv() else {
            panic!("expected PUBACK")
        };
        assert_eq!(ack.code, 0x90, "{channel}");
        let why = ack
            .properties
            .reason_string
            .clone()
            .expect("a Reason String");
        assert!(why.contains(channel), "{why}");
        reasons.push(why);
    }
    assert!(reasons[0].contains("no channel"), "{reasons:?}");
    assert!(reasons[1].contains("latest"), "{reasons:?}");
    assert!(reasons[2].contains("queue"), "{reasons:?}");
}

/// C-002, C-004: an empty key or no Response Topic is 0x83, nothing answered.
#[test]
fn point_reads_are_refused_on_the_puback_with_the_spec_codes() {
    let broker = start();
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    assert_eq!(
        asker.publish_packet(get("state/pump", None)),
        Some(0x83),
        "no Response Topic"
    );
    assert_eq!(
        asker.publish_packet(get("", Some("r"))),
        Some(0x83),
        "empty key"
    );
    assert_eq!(
        asker.publish_packet(get("events/x", Some("r"))),
        Some(0x90),
        "an append channel"
    );
    assert_eq!(
        asker.publish_packet(get("nowhere/x", Some("r"))),
        Some(0x90),
        "broadcast"
    );
    assert_eq!(
        asker.publish_packet(get("state/+", Some("r"))),
        Some(0x90),
        "a wildcard"
    );
    // C-003, B-103: a key over max_topic_levels (200) or max_topic_length (1024).
    let deep = format!("state/{}", vec!["l"; 200].join("/"));
    assert_eq!(
        asker.publish_packet(get(&deep, Some("r"))),
        Some(0x90),
        "too deep"
    );
    let long = format!("state/{}", "k".repeat(1024));
    assert_eq!(
        asker.publish_packet(get(&long, Some("r"))),
        Some(0x90),
        "too long"
    );
    asker.expect_nothing(Duration::from_millis(200));
}

/// A-206: the reply goes to the seek's Response Topic.
#[test]
fn a_seek_to_an_offset_replays_from_there_and_answers_on_the_response_topic() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..4 {
        publisher.publish(
            &format!("events/{i}"),
            format!("{i}").as_bytes(),
            QoS::AtLeastOnce,
            false,
        );
    }
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    let offsets: Vec<String> = (0..4)
        .map(|_| {
            user_property(&reader.recv_publish(), "saguin-offset")
                .expect("offset")
                .to_string()
        })
        .collect();
    let mut seek = request(
        "$saguin/consumer/events/seek",
        offsets[2].as_bytes(),
        "me/seek",
    );
    seek.properties.edit().correlation_data = Some(b"s1".to_vec());
    reader.send(&Packet::Publish(seek));
    // The PUBACK, the answer, then the replay from offset 2.
    let mut saw_ack = false;
    let mut saw_answer = false;
    let mut replayed = Vec::new();
    while replayed.len() < 2 {
        match reader.recv() {
            Packet::PubAck(ack) => {
                assert_eq!(ack.code, 0);
                saw_ack = true;
            }
            Packet::Publish(p) if &*p.topic == "me/seek" => {
                assert_eq!(&*p.payload, offsets[2].as_bytes());
                saw_answer = true;
            }
            Packet::Publish(p) => {
                if let Some(id) = p.packet_id {
                    reader.send(&Packet::PubAck(saguin::codec::Ack::new(id, 0)));
                }
                replayed.push(p.payload.to_vec());
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(saw_ack && saw_answer);
    assert_eq!(replayed, [b"2".to_vec(), b"3".to_vec()]);
}

/// A-206: with no Response Topic the reply goes to `.../seek/reply`.
#[test]
fn a_seek_by_time_and_the_3_1_1_reply_topic() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/old", b"old", QoS::AtLeastOnce, false);
    std::thread::sleep(Duration::from_millis(1100));
    let (mut reader, _) = Raw::handshake(broker.addr, connect(V311, "old-reader", false));
    assert_eq!(
        reader.subscribe("$saguin/consumer/events/seek/reply", opts(QoS::AtMostOnce)),
        [0]
    );
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    assert_eq!(&*reader.recv_publish().payload, b"old");
    let now = jiff_now();
    publisher.publish("events/new", b"new", QoS::AtLeastOnce, false);
    assert_eq!(&*reader.recv_publish().payload, b"new");
    assert_eq!(
        reader.publish(
            "$saguin/consumer/events/seek",
            now.as_bytes(),
            QoS::AtLeastOnce,
            false
        ),
        Some(0)
    );
    let answer = reader.recv_publish();
    assert_eq!(&*answer.topic, "$saguin/consumer/events/seek/reply");
    assert_eq!(
        &*reader.recv_publish().payload,
        b"new",
        "replayed from the first record at or after the time"
    );
}

/// A-208: not an offset or a time, or outside the channel: 0x83.
#[test]
fn a_seek_outside_the_channel_or_not_a_position_is_refused_0x83() {
    let broker = start();
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    assert_eq!(
        reader.publish(
            "$saguin/consumer/events/seek",
            b"999999",
            QoS::AtLeastOnce,
            false
        ),
        Some(0x83)
    );
    assert_eq!(
        reader.publish(
            "$saguin/consumer/events/seek",
            b"yesterday",
            QoS::AtLeastOnce,
            false
        ),
        Some(0x83)
    );
    assert_eq!(
        reader.publish(
            "$saguin/consumer/events/seek",
            b"2999-01-01T00:00:00Z",
            QoS::AtLeastOnce,
            false
        ),
        Some(0x83)
    );
    assert_eq!(
        reader.publish("$saguin/consumer/state/seek", b"0", QoS::AtLeastOnce, false),
        Some(0x90),
        "not an append channel"
    );
}

/// G-18: a time before 1970 is before every record, so the seek lands on the floor and
/// replays the channel, as a seek to 0 does; only a time in the future is refused.
#[test]
fn a_seek_to_a_time_before_1970_replays_from_the_floor_g18() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/a", b"a", QoS::AtLeastOnce, false);
    let mut reader = Raw::connected(broker.addr, V5, "early-reader");
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    assert_eq!(&*reader.recv_publish().payload, b"a");
    assert_eq!(
        reader.publish(
            "$saguin/consumer/events/seek",
            b"1969-12-31T00:00:00Z",
            QoS::AtLeastOnce,
            false
        ),
        Some(0)
    );
    let mut got: Vec<(String, Vec<u8>)> = (0..2)
        .map(|_| {
            let p = reader.recv_publish();
            (p.topic.to_string(), p.payload.to_vec())
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("$saguin/consumer/events/seek/reply".into(), b"0".to_vec()),
            ("events/a".into(), b"a".to_vec()),
        ],
        "the floor told, and replayed from it"
    );
}

/// Now, in RFC 3339.
fn jiff_now() -> String {
    jiff::Timestamp::now().to_string()
}

fn ask_catalogue(asker: &mut Raw, name: &str) -> (Option<u8>, Option<Publish>) {
    let mut p = request(&format!("$saguin/catalogue/{name}"), b"", "me/catalogue");
    p.properties.edit().correlation_data = Some(b"c1".to_vec());
    let code = asker.publish_packet(p);
    let reply = (code == Some(0)).then(|| asker.recv_publish());
    (code, reply)
}

/// B-321, B-326: Response Topic and Correlation Data echoed; PUBACK 0x00 answered
/// (channel or empty reply), 0x90 for a name holding `/`.
#[test]
fn the_catalogue_says_what_a_channel_is_and_nothing_about_one_that_does_not_exist() {
    let broker = start();
    let mut asker = Raw::connected(broker.addr, V5, "library");
    let (code, reply) = ask_catalogue(&mut asker, "jobs");
    assert_eq!(code, Some(0));
    let reply = reply.expect("an answer");
    assert_eq!(
        reply.properties.correlation_data.as_deref(),
        Some(&b"c1"[..])
    );
    let answer: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(answer["name"], "jobs");
    assert_eq!(answer["type"], "queue");
    assert_eq!(answer["filter"], "work/+/todo");
    assert_eq!(answer["pin"], "$saguin/queue/jobs");
    assert_eq!(answer["verbs"], serde_json::json!(["write", "consume"]));
    let (_, reply) = ask_catalogue(&mut asker, "events");
    let answer: serde_json::Value =
        serde_json::from_slice(&reply.expect("answer").payload).expect("JSON");
    assert_eq!(
        (answer["type"].as_str(), answer.get("pin")),
        (Some("append"), None)
    );
    let (code, reply) = ask_catalogue(&mut asker, "no-such-channel");
    assert_eq!(code, Some(0));
    assert!(reply.expect("the empty reply").payload.is_empty());
    let (code, _) = ask_catalogue(&mut asker, "a/b");
    assert_eq!(code, Some(0x90));
}

/// A-212: the catalogue takes a channel of every type, the derived dead-letter one
/// included, and answers with its type and filter.
#[test]
fn the_catalogue_answers_every_channel_type_with_its_type_and_filter_a212() {
    let broker = start();
    let mut asker = Raw::connected(broker.addr, V5, "every-type");
    for (name, kind, filter) in [
        ("events", "append", "events/#"),
        ("state", "latest", "state/#"),
        ("jobs", "queue", "work/+/todo"),
        ("jobs__dlq", "append", "work/+/todo/__dlq"),
    ] {
        let (code, reply) = ask_catalogue(&mut asker, name);
        assert_eq!(code, Some(0), "{name}");
        let reply = reply.expect("an answer");
        let answer: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
        assert_eq!(
            (answer["type"].as_str(), answer["filter"].as_str()),
            (Some(kind), Some(filter)),
            "{name}: {answer}"
        );
    }
}

/// A-203: nothing is delivered under `$saguin/` but a queue's form and a seek's reply
/// topic: a verb whose Response Topic names another `$saguin/` topic is refused 0x83,
/// unperformed and unanswered; the seek reply topic stays a Response Topic a seek
/// may name.
#[test]
fn no_answer_is_delivered_on_a_reserved_topic_other_than_the_two_a203() {
    let broker = start();
    let mut asker = Raw::connected(broker.addr, V5, "reserved-answer");
    for reserved in ["$saguin/kv/get", "$saguin/queue/jobs", "$saguin/x"] {
        let p = request("$saguin/catalogue/events", b"", reserved);
        assert_eq!(asker.publish_packet(p), Some(0x83), "{reserved}");
        asker.expect_nothing(Duration::from_millis(200));
    }
    let seek = request(
        "$saguin/consumer/events/seek",
        b"0",
        "$saguin/consumer/events/seek/reply",
    );
    assert_eq!(asker.publish_packet(seek), Some(0));
    assert_eq!(
        &*asker.recv_publish().topic,
        "$saguin/consumer/events/seek/reply"
    );
}

/// B-321, B-322, B-326: without a Response Topic the catalogue is 0x83 and answers
/// nothing; the answer goes to the asker alone, though another client subscribes to
/// the Response Topic and the asker does not.
#[test]
fn the_catalogue_needs_a_response_topic_and_answers_the_asker_alone_b322_b326() {
    let broker = start();
    let mut listener = Raw::connected(broker.addr, V5, "listener");
    assert_eq!(listener.subscribe("me/#", opts(QoS::AtLeastOnce)), [1]);
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    let bare = common::publish("$saguin/catalogue/events", b"", QoS::AtLeastOnce, false);
    assert_eq!(asker.publish_packet(bare), Some(0x83));
    asker.expect_nothing(Duration::from_millis(300));
    let (code, reply) = ask_catalogue(&mut asker, "events");
    assert_eq!(code, Some(0));
    let reply = reply.expect("the answer, with no subscription");
    assert_eq!(&*reply.topic, "me/catalogue");
    let answer: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(answer["name"], "events");
    listener.expect_nothing(Duration::from_millis(300));
}

/// C-001: a point read is answered from latest channels only: an append channel's
/// record is not returned and a queue's job is neither taken nor changed.
#[test]
fn a_point_read_never_returns_an_append_record_nor_touches_a_queue_job_c001() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(
        publisher.publish("events/x", b"logged", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        publisher.publish("work/a/todo", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    assert_eq!(
        asker.publish_packet(get("events/x", Some("replies/me"))),
        Some(0x90)
    );
    assert_eq!(
        asker.publish_packet(get("work/a/todo", Some("replies/me"))),
        Some(0x90)
    );
    asker.expect_nothing(Duration::from_millis(300));
    // The job is still there, untaken: its first attempt goes to a worker.
    let mut worker = Raw::connected(broker.addr, V5, "worker");
    assert_eq!(
        worker.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    let offer = worker.recv_offer();
    assert_eq!(&*offer.payload, b"job");
    assert_eq!(user_property(&offer, "saguin-attempt"), Some("1"));
}

/// C-008: the reply goes to the asking connection alone, which needs no subscription;
/// a client subscribed to the same Response Topic is sent nothing.
#[test]
fn a_point_read_reply_goes_to_the_asker_alone_c008() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/pump", b"on", QoS::AtLeastOnce, false);
    let mut eavesdropper = Raw::connected(broker.addr, V5, "eavesdropper");
    assert_eq!(
        eavesdropper.subscribe("replies/#", opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    assert_eq!(
        asker.publish_packet(get("state/pump", Some("replies/me"))),
        Some(0)
    );
    let reply = asker.recv_publish();
    assert_eq!((&*reply.topic, &*reply.payload), ("replies/me", &b"on"[..]));
    eavesdropper.expect_nothing(Duration::from_millis(300));
}

/// A producer that set `state/pump` to "on", and an asker whose point read said so.
fn pump_read_as_on(broker: &Broker) -> (Raw, Raw) {
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/pump", b"on", QoS::AtLeastOnce, false);
    let mut asker = Raw::connected(broker.addr, V5, "asker");
    assert_eq!(
        asker.publish_packet(get("state/pump", Some("replies/me"))),
        Some(0)
    );
    assert_eq!(&*asker.recv_publish().payload, b"on");
    (publisher, asker)
}

/// C-009: a point read subscribes nobody: a later publish to the key read is not
/// delivered to the asker.
#[test]
fn a_point_read_does_not_subscribe_the_asker_c009() {
    let broker = start();
    let (mut publisher, mut asker) = pump_read_as_on(&broker);
    assert_eq!(
        publisher.publish("state/pump", b"off", QoS::AtLeastOnce, false),
        Some(0)
    );
    asker.expect_nothing(Duration::from_millis(300));
}

/// C-010: a zero-length publish deletes a latest topic's value: a point read after
/// it answers the empty payload, not the deleted value.
#[test]
fn a_zero_length_publish_deletes_what_a_point_read_returns_c010() {
    let broker = start();
    let (mut publisher, mut asker) = pump_read_as_on(&broker);
    assert_eq!(
        publisher.publish("state/pump", b"", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        asker.publish_packet(get("state/pump", Some("replies/me"))),
        Some(0)
    );
    let reply = asker.recv_publish();
    assert!(reply.payload.is_empty(), "{reply:?}");
}

/// A-200, A-201, A-202: in `$saguin/` a queue's form and a seek's reply topic are the
/// only subscribable topics and are refused as publish topics (0x90); the five
/// publish-only topics are refused as subscriptions.
#[test]
fn the_reserved_space_splits_into_publish_only_and_subscribe_only_topics_a200_a202() {
    let broker = start();
    let mut client = Raw::connected(broker.addr, V5, "client");
    assert_eq!(
        client.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    assert_eq!(
        client.subscribe("$saguin/consumer/events/seek/reply", opts(QoS::AtMostOnce)),
        [0]
    );
    for topic in ["$saguin/queue/jobs", "$saguin/consumer/events/seek/reply"] {
        assert_eq!(
            client.publish(topic, b"0", QoS::AtLeastOnce, false),
            Some(0x90),
            "{topic}"
        );
    }
    for topic in [
        "$saguin/consumer/events/seek",
        "$saguin/queue/jobs/response",
        "$saguin/kv/get",
        "$saguin/sessions/disconnect",
        "$saguin/catalogue/events",
    ] {
        let code = client.subscribe(topic, opts(QoS::AtLeastOnce));
        assert!(code.len() == 1 && code[0] >= 0x80, "{topic}: {code:?}");
    }
}

/// A-205, A-206, A-208: a seek without a Response Topic is answered on the seeker's
/// own connection under `.../seek/reply`, and nobody else subscribed there (or to `#`)
/// sees it; a refused seek is 0x83 with a Response Topic too.
#[test]
fn a_seek_reply_goes_to_the_seeker_alone_a205() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("events/x", b"x", QoS::AtLeastOnce, false);
    let mut other = Raw::connected(broker.addr, V5, "other");
    assert_eq!(
        other.subscribe("$saguin/consumer/events/seek/reply", opts(QoS::AtMostOnce)),
        [0]
    );
    assert_eq!(other.subscribe("#", opts(QoS::AtMostOnce)), [0]);
    let mut seeker = Raw::connected(broker.addr, V5, "seeker");
    assert_eq!(
        seeker.subscribe("$saguin/consumer/events/seek/reply", opts(QoS::AtMostOnce)),
        [0]
    );
    assert_eq!(seeker.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    let offset = user_property(&seeker.recv_publish(), "saguin-offset")
        .expect("offset")
        .to_string();
    assert_eq!(&*other.recv_publish().topic, "events/x");
    seeker.send(&Packet::Publish(common::publish(
        "$saguin/consumer/events/seek",
        offset.as_bytes(),
        QoS::AtLeastOnce,
        false,
    )));
    let (mut acked, mut replied, mut replayed) = (false, false, false);
    while !(acked && replied && replayed) {
        match seeker.recv() {
            Packet::PubAck(ack) => {
                assert_eq!(ack.code, 0);
                acked = true;
            }
            Packet::Publish(p) if &*p.topic == "$saguin/consumer/events/seek/reply" => {
                replied = true;
            }
            Packet::Publish(p) => {
                assert_eq!(&*p.topic, "events/x");
                if let Some(id) = p.packet_id {
                    seeker.send(&Packet::PubAck(saguin::codec::Ack::new(id, 0)));
                }
                replayed = true;
            }
            other => panic!("{other:?}"),
        }
    }
    other.expect_nothing(Duration::from_millis(300));
    let refused = request("$saguin/consumer/events/seek", b"999999", "me/seek");
    assert_eq!(seeker.publish_packet(refused), Some(0x83));
}

/// MQTT-3.1.2-24, -25: a point read's reply larger than the asker's Maximum Packet
/// Size is not sent (the PUBACK stands); one that fits still is.
#[test]
fn a_reply_over_the_askers_maximum_packet_size_is_not_sent() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/big", &[b'x'; 2048], QoS::AtLeastOnce, false);
    publisher.publish("state/small", b"ok", QoS::AtLeastOnce, false);
    let mut c = connect(V5, "small-asker", true);
    c.properties.edit().maximum_packet_size = Some(256);
    let (mut asker, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0);
    assert_eq!(
        asker.publish_packet(get("state/big", Some("r/me"))),
        Some(0)
    );
    asker.expect_nothing(Duration::from_millis(300));
    assert_eq!(
        asker.publish_packet(get("state/small", Some("r/me"))),
        Some(0)
    );
    assert_eq!(&*asker.recv_publish().payload, b"ok");
}

/// MQTT-3.3.2-14, MQTT-4.7.3-1: a Response Topic is a topic name; one with a wildcard
/// or none at all is a Protocol Error, never a topic a reply is published to.
#[test]
fn a_response_topic_with_a_wildcard_or_empty_is_a_protocol_error() {
    let broker = start();
    for (id, response) in [("wild", "r/#"), ("plus", "r/+/x"), ("empty", "")] {
        let mut asker = Raw::connected(broker.addr, V5, id);
        asker.send(&Packet::Publish(get("state/pump", Some(response))));
        assert_eq!(asker.expect_disconnect(), 0x82, "{response:?}");
    }
}

/// The broker's resident memory, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Invariant 13: a client that sends many point reads at once and reads nothing has
/// at most a session's bound of answers kept for it; the rest of its requests wait
/// in its socket.
#[test]
fn point_reads_sent_at_once_are_answered_within_a_sessions_bound() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish(
        "state/big",
        &vec![b'v'; 512 * 1024],
        QoS::AtLeastOnce,
        false,
    );
    let before = rss_kib(broker.pid());
    let mut asker = Raw::connected(broker.addr, V5, "greedy");
    let mut burst = Vec::new();
    for i in 0..300u16 {
        let mut p = get("state/big", Some("r/me"));
        p.packet_id = Some(i + 1);
        saguin::codec::encode(&Packet::Publish(p), V5, &mut burst);
    }
    asker.send_bytes(&burst);
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss_kib(broker.pid()).saturating_sub(before);
    // One read of requests (4 KiB, some 80 of them) asks for 40 MiB of answers; the
    // bound is session_queue_bytes (1 MiB).
    assert!(grown < 16 * 1024, "grew by {grown} KiB");
    // Read, it is answered in full.
    let mut replies = 0;
    while replies < 300 {
        if let Packet::Publish(p) = asker.recv() {
            assert_eq!(p.payload.len(), 512 * 1024);
            replies += 1;
        }
    }
}

/// MQTT 4.3.3: a point read at QoS 2 completes as an exchange: PUBREC 0x00, the
/// reply, and PUBCOMP 0x00 at its PUBREL; a DUP before the PUBREL is answered, not
/// read again.
#[test]
fn a_qos2_point_read_completes_its_exchange() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("state/pump", b"on", QoS::AtLeastOnce, false);
    let mut asker = Raw::connected(broker.addr, V5, "asker2");
    let mut p = get("state/pump", Some("r/me"));
    p.qos = QoS::ExactlyOnce;
    p.packet_id = Some(5);
    asker.send(&Packet::Publish(p.clone()));
    let mut pubrec = 0;
    let mut replies = 0;
    for _ in 0..2 {
        match asker.recv() {
            Packet::PubRec(a) => pubrec = a.code + 1,
            Packet::Publish(r) => replies += usize::from(&*r.payload == b"on"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((pubrec, replies), (1, 1));
    p.dup = true;
    asker.send(&Packet::Publish(p));
    assert!(matches!(asker.recv(), Packet::PubRec(a) if a.code == 0));
    asker.send(&Packet::PubRel(saguin::codec::Ack::new(5, 0)));
    assert!(matches!(asker.recv(), Packet::PubComp(a) if a.code == 0));
    asker.expect_nothing(Duration::from_millis(200));
}

/// G-18: a seek before any SUBSCRIBE sets the position the subscription then starts
/// at, for a session that ends with its connection too.
#[test]
fn a_seek_before_subscribing_sets_where_the_subscription_starts_g18() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..10u32 {
        publisher.publish(&format!("events/{i}"), b"e", QoS::AtLeastOnce, false);
    }
    let mut reader = Raw::connected(broker.addr, V5, "seeker");
    let seek = request("$saguin/consumer/events/seek", b"5", "r/seek");
    assert_eq!(reader.publish_packet(seek), Some(0));
    assert_eq!(&*reader.recv_publish().topic, "r/seek");
    assert_eq!(reader.subscribe("events/#", opts(QoS::AtLeastOnce)), [1]);
    let first = reader.recv_publish();
    assert_eq!(
        user_property(&first, "saguin-offset"),
        Some("5"),
        "{first:?}"
    );
}

/// Gaps G-19 ("a value older than retention_period is never served, even before the
/// sweep removes it"), RFC 0002 "Retention is stated once": with the age sweep held
/// off (another connection holds the sqlite write lock), a latest value past its
/// period is shown neither to a SUBSCRIBE nor to a point read.
#[test]
fn a_latest_value_past_its_period_is_not_served_before_the_sweep() {
    let yaml = common::CHANNELS.to_string()
        + "  fresh:\n    type: latest\n    filter: fresh/#\n    retention_period: 1s\n";
    let broker = Broker::start_with(&yaml);
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    publisher.publish("fresh/a", b"stale", QoS::AtLeastOnce, false);
    let lock = common::WriteLock::take(&broker);
    std::thread::sleep(Duration::from_millis(1500));
    let mut reader = Raw::connected(broker.addr, V5, "late");
    assert_eq!(reader.subscribe("fresh/#", opts(QoS::AtLeastOnce)), [1]);
    reader.expect_nothing(Duration::from_millis(500));
    assert_eq!(
        reader.publish_packet(get("fresh/a", Some("replies/late"))),
        Some(0)
    );
    let reply = reader.recv_publish();
    assert_eq!(&*reply.topic, "replies/late");
    assert!(reply.payload.is_empty(), "the stale value was read");
    drop(lock);
}

/// A-208, INV-18: a seek whose position the store cannot write is refused 0x83 and
/// moves nothing. It restarted delivery from the offset sought while the client was
/// told it failed.
#[test]
fn a_seek_the_store_refuses_moves_nothing() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..3 {
        publisher.publish(&format!("events/{i}"), b"e", QoS::AtLeastOnce, false);
    }
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    for _ in 0..3 {
        reader.recv_publish();
    }
    let lock = common::WriteLock::take(&broker);
    reader.set_timeout(Duration::from_secs(30));
    let seek = request("$saguin/consumer/events/seek", b"0", "me/seek");
    reader.send(&Packet::Publish(seek));
    match reader.recv() {
        Packet::PubAck(ack) => assert_eq!(ack.code, 0x83),
        other => panic!("expected PUBACK 0x83, got {other:?}"),
    }
    drop(lock);
    reader.expect_nothing(Duration::from_millis(500));
}

/// G-18, G-11: a seek back over records still on the wire. Their late PUBACKs settle
/// nothing: the position stays at the seek until the records read again from there
/// are acknowledged, so a consumer that leaves first resumes at the seek. The old
/// PUBACKs used to settle the replayed offsets and store the position past them.
#[test]
fn a_late_puback_of_a_record_sent_before_a_seek_back_does_not_settle_its_replay() {
    let broker = start();
    let mut publisher = Raw::connected(broker.addr, V5, "producer");
    for i in 0..4 {
        let topic = format!("events/{i}");
        assert_eq!(
            publisher.publish(&topic, format!("{i}").as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let mut c = connect(V5, "seeker", false);
    c.properties.edit().session_expiry_interval = Some(600);
    let (mut reader, _) = Raw::handshake(broker.addr, c.clone());
    reader.subscribe("events/#", opts(QoS::AtLeastOnce));
    // Read, not acknowledged: every record on the wire.
    let mut first = Vec::new();
    while first.len() < 4 {
        if let Packet::Publish(p) = reader.recv() {
            first.push((p.packet_id.expect("QoS 1"), p.payload.to_vec()));
        }
    }
    let floor = floor_of_events(&broker);
    let seek = common::publish(
        "$saguin/consumer/events/seek",
        floor.as_bytes(),
        QoS::AtLeastOnce,
        false,
    );
    reader.send(&Packet::Publish(seek));
    // The seek's PUBACK and reply, and the replay, none acknowledged.
    let mut replayed = 0;
    while replayed < 4 {
        if let Packet::Publish(p) = reader.recv()
            && p.topic.starts_with("events/")
        {
            replayed += 1;
        }
    }
    // Now the PUBACKs of what was sent before the seek.
    for (id, _) in &first {
        reader.send(&Packet::PubAck(saguin::codec::Ack::new(*id, 0)));
    }
    reader.disconnect();
    broker.wait_log("seeker disconnected");
    // What is kept is the stored position, not the session's memory of the wire.
    let broker = Broker::start_in(broker.stop(), common::CHANNELS);
    let (mut reader, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    let again: Vec<Vec<u8>> = (0..4)
        .map(|_| reader.recv_publish().payload.to_vec())
        .collect();
    assert_eq!(
        again,
        [b"0".to_vec(), b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]
    );
}

/// The floor of `events` as a seek names it: its first record's offset.
fn floor_of_events(broker: &Broker) -> String {
    let mut peek = Raw::connected(broker.addr, V5, "peek");
    peek.subscribe("events/#", opts(QoS::AtLeastOnce));
    user_property(&peek.recv_publish(), "saguin-offset")
        .expect("an offset")
        .to_string()
}
