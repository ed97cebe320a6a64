//! Hostile and confused clients, many of them: each connection sends a random run of
//! well-formed packets of both versions - a CONNECT or none, then PUBLISHes to
//! channels, queues and `$saguin/` topics, SUBSCRIBEs with odd filters and
//! properties, acknowledgements for identifiers never used, topic aliases, AUTH,
//! a second CONNECT, DISCONNECTs with any code - and goes, politely or not. The
//! broker must answer each as it sees fit and stay whole: a bystander's publish and
//! subscription keep working throughout, and nothing panics. Deterministic: the same
//! runs on every machine (the brief: "no other client or record is harmed").

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

#[path = "common/mutate.rs"]
mod mutate;

use common::{Raw, opts, start_with_channels};
use mutate::Rng;
use saguin::codec::{
    self, Ack, Auth, Connect, Disconnect, Packet, Properties, PropertyValues, ProtocolVersion,
    Publish, QoS, RetainHandling, Subscribe, SubscriptionOptions, Unsubscribe, Will,
};

const TOPICS: &[&str] = &[
    "a/b",
    "events/x",
    "events/y/z",
    "state/x",
    "state/y",
    "work/1/todo",
    "work/1/todo/__dlq",
    "work/__dlq/1",
    "recent/x",
    "memlog/x",
    "$saguin/queue/jobs",
    "$saguin/queue/jobs/response",
    "$saguin/kv/get",
    "$saguin/kv/get/state/x",
    "$saguin/consumer/events/seek",
    "$SYS/x",
    "",
    "a/+/b",
    "#",
    "é/ü",
    "a\u{0}b",
];

const FILTERS: &[&str] = &[
    "#",
    "+/+",
    "a/#",
    "events/#",
    "state/#",
    "state/+",
    "recent/#",
    "memlog/#",
    "work/+/todo",
    "work/+/todo/__dlq",
    "$share/g/a/#",
    "$share/g/events/#",
    "$share//a",
    "$share/g",
    "$saguin/queue/jobs",
    "$saguin/queue/nope",
    "$saguin/kv/get/#",
    "$SYS/#",
    "a/#/b",
    "",
    "+",
];

const CLIENT_IDS: &[&str] = &["c0", "c1", "c2", "c3", "", "w/1", "é", "worker"];

const USER_PROPERTIES: &[(&str, &str)] = &[
    ("saguin-filter", "topic_hash(4, 1)"),
    ("saguin-filter", "topic_hash(0, 0)"),
    ("saguin-filter", "nonsense"),
    ("saguin-deletions", "true"),
    ("saguin-deletions", "no"),
    ("saguin-id", "01a22f6c-1b14-7652-8424-f2874ff321a8"),
    ("saguin-offset", "7"),
    ("k", "v"),
];

/// A topic: one that names something most of the time, one that cannot be
/// published to (the last five) now and then.
fn topic(rng: &mut Rng) -> &'static str {
    let ordinary = TOPICS.len() - 5;
    let end = if rng.below(6) == 0 {
        TOPICS.len()
    } else {
        ordinary
    };
    TOPICS[rng.below(end)]
}

fn qos(rng: &mut Rng) -> QoS {
    match rng.below(3) {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

fn packet_id(rng: &mut Rng) -> u16 {
    match rng.below(4) {
        0 => 1,
        1 => 2,
        2 => u16::MAX,
        _ => rng.next() as u16,
    }
}

fn small(rng: &mut Rng, values: &[u32]) -> u32 {
    values[rng.below(values.len())]
}

/// MQTT 5 properties: mostly none or ordinary ones, so a run goes deep before
/// anything ends it; one time in `odd_one_in`, edge values that refuse or close.
fn properties(rng: &mut Rng, odd_one_in: usize) -> Properties {
    let mut p = PropertyValues::default();
    if rng.below(odd_one_in) == 0 {
        for _ in 0..=rng.below(3) {
            match rng.below(9) {
                0 => p.topic_alias = Some(small(rng, &[0, 65535]) as u16),
                1 => p.payload_format_indicator = Some(small(rng, &[1, 2]) as u8),
                2 => p.response_topic = Some((*rng.pick(TOPICS)).to_owned()),
                3 => p
                    .subscription_identifiers
                    .push(small(rng, &[0, 268_435_455])),
                4 => p.receive_maximum = Some(0),
                5 => p.maximum_packet_size = Some(small(rng, &[0, 1, 20])),
                6 => p.authentication_method = Some("SCRAM-SHA-1".into()),
                7 => p.message_expiry_interval = Some(u32::MAX),
                _ => p.session_expiry_interval = Some(u32::MAX),
            }
        }
        return p.into();
    }
    for _ in 0..rng.below(3) {
        match rng.below(8) {
            0 => p.topic_alias = Some(small(rng, &[1, 2, 3]) as u16),
            1 => p.message_expiry_interval = Some(small(rng, &[1, 60])),
            2 => p.response_topic = Some("replies/x".into()),
            3 => p.correlation_data = Some(vec![7; rng.below(40)]),
            4 => {
                let (k, v) = rng.pick(USER_PROPERTIES);
                p.user_properties.push(((*k).into(), (*v).into()));
            }
            5 => p.session_expiry_interval = Some(small(rng, &[0, 2, 300])),
            6 => p.receive_maximum = Some(small(rng, &[1, 5, 65535]) as u16),
            _ => p.topic_alias_maximum = Some(small(rng, &[0, 10]) as u16),
        }
    }
    p.into()
}

fn payload(rng: &mut Rng) -> Vec<u8> {
    let len = small(rng, &[0, 1, 10, 200, 5000]) as usize;
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ 0xC3)
        .collect()
}

fn connect(rng: &mut Rng, protocol: ProtocolVersion) -> Connect {
    let will = (rng.below(4) == 0).then(|| Will {
        topic: (*rng.pick(TOPICS)).to_owned(),
        payload: payload(rng),
        qos: qos(rng),
        retain: rng.below(2) == 0,
        properties: if protocol == ProtocolVersion::V5 {
            properties(rng, 8)
        } else {
            Properties::default()
        },
    });
    Connect {
        protocol,
        clean_start: rng.below(2) == 0,
        keep_alive: small(rng, &[0, 1, 60]) as u16,
        client_id: (*rng.pick(CLIENT_IDS)).to_owned(),
        will,
        username: (rng.below(12) == 0).then(|| "someone".to_owned()),
        password: (rng.below(16) == 0).then(|| b"secret".to_vec()),
        properties: if protocol == ProtocolVersion::V5 {
            properties(rng, 8)
        } else {
            Properties::default()
        },
    }
}

/// One packet of any kind a client may send, fields anywhere in their range.
fn packet(rng: &mut Rng, protocol: ProtocolVersion) -> Packet {
    let v5 = protocol == ProtocolVersion::V5;
    let props = |rng: &mut Rng| {
        if v5 {
            properties(rng, 12)
        } else {
            Properties::default()
        }
    };
    match rng.below(16) {
        0..=4 => {
            let qos = qos(rng);
            Packet::Publish(Publish {
                dup: rng.below(4) == 0,
                qos,
                retain: rng.below(3) == 0,
                topic: topic(rng).into(),
                packet_id: (qos != QoS::AtMostOnce).then(|| packet_id(rng)),
                properties: props(rng),
                payload: payload(rng).into(),
            })
        }
        5 | 6 => Packet::Subscribe(Subscribe {
            packet_id: packet_id(rng),
            properties: props(rng),
            filters: (0..=rng.below(3))
                .map(|_| {
                    let options = SubscriptionOptions {
                        qos: qos(rng),
                        no_local: v5 && rng.below(3) == 0,
                        retain_as_published: v5 && rng.below(3) == 0,
                        retain_handling: match rng.below(3) {
                            0 => RetainHandling::OnSubscribe,
                            1 => RetainHandling::OnNewSubscribe,
                            _ => RetainHandling::Never,
                        },
                    };
                    ((*rng.pick(FILTERS)).to_owned(), options)
                })
                .collect(),
        }),
        7 => Packet::Unsubscribe(Unsubscribe {
            packet_id: packet_id(rng),
            properties: props(rng),
            filters: vec![(*rng.pick(FILTERS)).to_owned()],
        }),
        8 => Packet::PubAck(Ack::new(packet_id(rng), 0)),
        9 => Packet::PubRec(Ack::new(packet_id(rng), 0)),
        10 => Packet::PubRel(Ack::new(packet_id(rng), 0)),
        11 => Packet::PubComp(Ack::new(packet_id(rng), 0)),
        12 => Packet::PingReq,
        13 => Packet::Connect(Box::new(connect(rng, protocol))),
        14 if v5 => Packet::Auth(Auth {
            code: small(rng, &[0, 0x18, 0x19]) as u8,
            properties: props(rng),
        }),
        _ => {
            let mut d = Disconnect::new(small(rng, &[0, 4, 0x80, 0x8E]) as u8);
            if v5 {
                d.properties.edit().session_expiry_interval = (rng.below(2) == 0).then_some(0);
            }
            Packet::Disconnect(d)
        }
    }
}

/// Reads whatever the broker sent within `wait`, to keep its writes flowing.
fn drain(stream: &mut TcpStream, wait: Duration) {
    let _ = stream.set_read_timeout(Some(wait));
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

#[test]
fn random_runs_of_packets_from_many_clients_leave_the_broker_whole() {
    let broker = start_with_channels();
    let mut watcher = Raw::connected(broker.addr, ProtocolVersion::V5, "bystander-watch");
    watcher.subscribe("bystander/#", opts(QoS::AtLeastOnce));
    let mut bystander = Raw::connected(broker.addr, ProtocolVersion::V311, "bystander-pub");
    let (runs, mut rng) = mutate::cases_and_rng(160, 0xC4A0_5EED);
    for run in 0..runs {
        let protocol = if rng.below(3) == 0 {
            ProtocolVersion::V311
        } else {
            ProtocolVersion::V5
        };
        let mut stream = TcpStream::connect_timeout(&broker.addr, common::WAIT).expect("connect");
        let _ = stream.set_nodelay(true);
        let mut bytes = Vec::new();
        if rng.below(10) != 0 {
            codec::encode(
                &Packet::Connect(Box::new(connect(&mut rng, protocol))),
                protocol,
                &mut bytes,
            );
        }
        for _ in 0..=rng.below(25) {
            codec::encode(&packet(&mut rng, protocol), protocol, &mut bytes);
        }
        // All at once, or a packet's worth at a time; the broker may close midway.
        if rng.below(2) == 0 {
            let _ = stream.write_all(&bytes);
        } else {
            for chunk in bytes.chunks(64) {
                if stream.write_all(chunk).is_err() {
                    break;
                }
            }
        }
        drain(&mut stream, Duration::from_millis(30));
        if rng.below(2) == 0 {
            let _ = stream.shutdown(Shutdown::Both);
        }
        drop(stream);
        if run % 10 == 9 {
            let payload = format!("still here after run {run}");
            assert_eq!(
                bystander.publish(
                    "bystander/ping",
                    payload.as_bytes(),
                    QoS::AtLeastOnce,
                    false
                ),
                Some(0),
                "after run {run}"
            );
            let got = watcher.recv_publish();
            assert_eq!(&*got.payload, payload.as_bytes(), "after run {run}");
            watcher.puback(&got);
        }
    }
    // A newcomer is served as on a fresh broker.
    let mut late = Raw::connected(broker.addr, ProtocolVersion::V5, "bystander-late");
    late.subscribe("bystander/late", opts(QoS::AtMostOnce));
    bystander.publish("bystander/late", b"hello", QoS::AtLeastOnce, false);
    assert_eq!(&*late.recv_publish().payload, b"hello");
}

/// One thread serves every connection: a client that keeps its socket full of
/// publishes must not keep a bystander from connecting and being answered.
#[test]
fn a_client_that_never_stops_sending_holds_up_nobody() {
    let broker = common::Broker::start("");
    let mut flooder = Raw::connected(broker.addr, ProtocolVersion::V5, "flooder");
    let mut burst = Vec::new();
    // Six bytes a publish: more packets than a debug build reads in the time.
    for _ in 0..10_000 {
        let p = common::publish("n", &[], QoS::AtMostOnce, false);
        codec::encode(&Packet::Publish(p), ProtocolVersion::V5, &mut burst);
    }
    let stream = flooder.stream.try_clone().expect("clone");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut stream = stream;
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while !stopped.load(std::sync::atomic::Ordering::Relaxed)
            && std::time::Instant::now() < until
            && stream.write_all(&burst).is_ok()
        {}
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut bystander = Raw::connected(broker.addr, ProtocolVersion::V5, "bystander");
    bystander.send(&Packet::PingReq);
    assert!(matches!(bystander.recv(), Packet::PingResp));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().expect("the writer");
    flooder.send(&Packet::PingReq);
    while !matches!(flooder.recv(), Packet::PingResp) {}
}
