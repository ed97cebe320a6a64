//! Bridges (RFC 0002 "Bridges"): a Sagüin started as a user starts it, bridged to
//! Debian's mosquitto, to a second Sagüin, or to a peer the test plays itself over
//! a loopback socket, every packet spoken with the crate's codec.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Broker, Raw, WAIT, temp_dir, user_property};
use saguin::codec::{
    ConnAck, Packet, Properties, PropertyValues, ProtocolVersion::V5, Publish, QoS,
    SubscriptionOptions,
};

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("an ephemeral port")
}

/// Debian's mosquitto on a loopback port, killed when dropped.
struct Mosquitto {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Mosquitto {
    /// Starts mosquitto on `port`; its sessions are saved in its directory at a
    /// SIGTERM and read back at the next start on the same directory.
    fn start(port: u16, dir: PathBuf) -> Mosquitto {
        let conf = dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n",
                dir.display()
            ),
        )
        .expect("mosquitto.conf");
        // Started as root, mosquitto runs as its own user, which must write here.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
                .expect("chmod the mosquitto directory");
        }
        let child = Command::new("/usr/sbin/mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Mosquitto { child, addr, dir }
    }

    /// Stops it with SIGTERM (its sessions saved) and waits for it to exit.
    fn stop(mut self) -> (u16, PathBuf) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + WAIT;
        while self.child.try_wait().ok().flatten().is_none() {
            assert!(Instant::now() < deadline, "mosquitto did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
        (self.addr.port(), self.dir.clone())
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that keeps its session (Clean Start 0, a day's expiry).
fn persistent(addr: SocketAddr, client_id: &str) -> Raw {
    let mut c = common::connect(V5, client_id, false);
    c.properties.edit().session_expiry_interval = Some(86_400);
    let (raw, ack) = Raw::handshake(addr, c);
    assert_eq!(ack.code, 0, "CONNACK {ack:?}");
    raw
}

/// `config(extra)` with a channels block and a bridge appended.
fn bridged(broker_extra: &str, rest: &str) -> String {
    format!("{}{rest}", common::config(broker_extra))
}

/// A broker on one sqlite file in its directory, so its channels and positions
/// outlive a restart; its `channels:` and `bridges:` follow.
/// How long a test waits for a link to come back after its peer restarts: the redial
/// backoff doubles from 0.5 s with jitter (the fifth try 11.6-19.4 s after the peer
/// went), so a peer back a few seconds late can be redialled past `WAIT`.
const REDIAL_WAIT: Duration = Duration::from_secs(40);

const SQLITE: &str = "broker:
  id: edge
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  storage:
    default: local
    default_retention_period: none
    default_retention_bytes: none
    providers:
      local:
        type: sqlite
        file_path: {dir}/saguin.db
";

/// A publish with one User Property.
fn with_property(topic: &str, payload: &[u8], key: &str, value: &str) -> Publish {
    let mut p = common::publish(topic, payload, QoS::AtLeastOnce, false);
    p.properties
        .edit()
        .user_properties
        .push((key.into(), value.into()));
    p
}

/// B-375, B-380, B-391, B-368, B-370, B-371, B-402, B-390: an in rule subscribes at the
/// peer and stores what arrives through the publish path, mapped by its template,
/// into the channel the mapped topic resolves to; a saguin-id it came with is kept,
/// one that came without is minted.
/// Waits until the bridge has logged the peer taking one record under each of
/// `topics` (local topic names, a name once per record): a record still
/// unacknowledged when the link goes is rightly sent again, so a test that stops
/// the peer or the broker waits for the acknowledgements first.
fn wait_taken(broker: &Broker, topics: &[&str]) {
    let mut left: Vec<String> = topics.iter().map(|t| format!("{t:?}")).collect();
    while !left.is_empty() {
        let line = broker.wait_log("the peer took ");
        if let Some(at) = left.iter().position(|t| line.ends_with(t.as_str())) {
            left.remove(at);
        }
    }
}

#[test]
fn an_in_rule_brings_a_peer_publish_into_the_channel_its_topic_resolves_to() {
    let peer = Mosquitto::start(free_port(), temp_dir("mosq-in"));
    let yaml = bridged(
        "",
        &format!(
            "channels:
  readings:
    type: append
    filter: readings/#
bridges:
  head-office:
    peer: tcp://{}
    client_id: edge-in
    topics:
      - filter: fleet/+/telemetry/#
        topic: readings/$1/$#
        direction: in
",
            peer.addr
        ),
    );
    let broker = Broker::start_with(&yaml);
    broker.wait_log("bridge head-office: SUBACK");
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("readings/#", common::opts(QoS::AtLeastOnce));
    let mut publisher = Raw::connected(peer.addr, V5, "device");
    let first = with_property(
        "fleet/v7/telemetry/hold/psi",
        b"41",
        "saguin-id",
        "id-from-far",
    );
    assert_eq!(publisher.publish_packet(first), Some(0));
    assert_eq!(
        publisher.publish("fleet/v8/telemetry/deck", b"42", QoS::AtLeastOnce, false),
        Some(0)
    );
    let got = reader.recv_publish();
    assert_eq!(&*got.topic, "readings/v7/hold/psi");
    assert_eq!(&*got.payload, b"41");
    assert_eq!(user_property(&got, "saguin-id"), Some("id-from-far"));
    assert!(
        user_property(&got, "saguin-offset").is_some(),
        "stored in the channel: {got:?}"
    );
    let got = reader.recv_publish();
    assert_eq!(&*got.topic, "readings/v8/deck");
    let minted = user_property(&got, "saguin-id").expect("a minted saguin-id");
    assert!(minted.len() >= 32 && minted != "id-from-far", "{minted}");
}

/// B-380, B-381, B-382, B-385, B-370, B-377: an out rule carries broadcast topics
/// live and drains an append channel; after the peer restarts, the channel resumes
/// at its position - nothing sent twice, nothing skipped - while what was published
/// on a broadcast topic during the outage is gone. A queue under the filter is never
/// read.
#[test]
fn an_out_rule_drains_an_append_channel_across_an_outage_and_lets_broadcast_go() {
    let port = free_port();
    let peer = Mosquitto::start(port, temp_dir("mosq-out"));
    let mut far = persistent(peer.addr, "far-reader");
    far.subscribe("site/#", common::opts(QoS::AtLeastOnce));
    let yaml = bridged(
        "",
        &format!(
            "channels:
  events:
    type: append
    filter: events/#
  jobs:
    type: queue
    filter: events/jobs/+
bridges:
  hub:
    peer: tcp://{}
    client_id: edge-out
    topics:
      - filter: events/#
        topic: site/events/$#
        direction: out
      - filter: live/#
        topic: site/live/$#
        direction: out
",
            peer.addr
        ),
    );
    let broker = Broker::start_with(&yaml);
    broker.wait_log("bridge hub: connected to");
    let mut local = Raw::connected(broker.addr, V5, "local");
    for n in 1..=3 {
        let payload = format!("e{n}");
        assert_eq!(
            local.publish("events/a", payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    assert_eq!(
        local.publish("events/jobs/1", b"job", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        local.publish("live/x", b"now", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let p = far.recv_publish();
        if p.topic.starts_with("site/events/") {
            assert!(user_property(&p, "saguin-id").is_some(), "B-370: {p:?}");
            assert!(
                user_property(&p, "saguin-offset").is_none(),
                "offsets never cross"
            );
        }
        seen.push(format!(
            "{} {}",
            p.topic,
            String::from_utf8_lossy(&p.payload)
        ));
    }
    let events: Vec<&String> = seen
        .iter()
        .filter(|s| s.starts_with("site/events/"))
        .collect();
    assert_eq!(
        events,
        ["site/events/a e1", "site/events/a e2", "site/events/a e3"]
    );
    assert!(seen.contains(&"site/live/x now".to_string()), "{seen:?}");
    drop(far);
    wait_taken(&broker, &["events/a", "events/a", "events/a", "live/x"]);

    // The peer goes; the channel grows and a broadcast passes meanwhile.
    let (port_again, dir) = peer.stop();
    broker.wait_log("bridge hub: link to");
    assert_eq!(
        local.publish("events/a", b"e4", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        local.publish("live/x", b"missed", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        local.publish("events/a", b"e5", QoS::AtLeastOnce, false),
        Some(0)
    );
    let peer = Mosquitto::start(port_again, dir);
    broker.wait_log_for("up again after", REDIAL_WAIT);
    let mut far = persistent(peer.addr, "far-reader");
    let mut after = Vec::new();
    while after.len() < 2 {
        let p = far.recv_publish();
        after.push(format!(
            "{} {}",
            p.topic,
            String::from_utf8_lossy(&p.payload)
        ));
    }
    assert_eq!(after, ["site/events/a e4", "site/events/a e5"]);
    match far.expect_nothing_or_packet(Duration::from_millis(700)) {
        Err(e) if e.contains("read:") => {}
        other => panic!(
            "nothing more crosses (no resend, no broadcast from the outage, no job): {other:?}"
        ),
    }
}

/// B-024, B-025, B-378, gaps §4 `saguin_bridge_connected`: a peer that cannot be
/// reached is said once at warn, each attempt only at debug; the first connection
/// info unless it retracts that warning; the link going is one line and its return
/// one line with how long it was down; the gauge says the link is up.
#[test]
fn the_link_is_logged_once_each_way_and_its_gauge_follows_it() {
    let port = free_port();
    let yaml = bridged(
        "  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n",
        &format!(
            "bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-log
    topics:
      - filter: a/#
        direction: both
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let ops = broker.ops_addr();
    let metrics = || common::http_get(common::tcp(&ops), "/metrics").1;
    let mut lines = broker.wait_log_lines("cannot reach");
    // Attempts go on, each at debug only.
    lines.extend(broker.wait_log_lines("attempt to reach"));
    let peer = Mosquitto::start(port, temp_dir("mosq-log"));
    lines.extend(broker.wait_log_lines("bridge hub: connected to"));
    let said = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(said("cannot reach"), 1, "once at warn: {lines:?}");
    assert!(said("attempt to reach") >= 2, "{lines:?}");
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("attempt to reach"))
            .all(|l| l.contains("DEBUG")),
        "{lines:?}"
    );
    let connected = lines.last().expect("a line");
    assert!(
        connected.contains("WARN") && connected.contains("unreachable"),
        "it retracts a warning, at warn: {connected}"
    );
    // One scrape: the answer is kept for min_scrape_interval (60s at least).
    let scraped = metrics();
    assert!(
        scraped.contains("saguin_bridge_connected{bridge=\"hub\"} 1"),
        "{scraped}"
    );
    // The out rule's session is the broker's own, not a client's: neither a session
    // nor a subscription in the clients' gauges.
    for gauge in ["saguin_sessions 0", "saguin_subscriptions 0"] {
        assert!(scraped.contains(gauge), "{gauge} in:\n{scraped}");
    }
    let (port, dir) = peer.stop();
    let down = broker.wait_log("bridge hub: link to");
    assert!(down.contains("WARN") && down.contains("down"), "{down}");
    std::thread::sleep(Duration::from_millis(600));
    let _peer = Mosquitto::start(port, dir);
    let lines = broker.wait_log_lines("up again after");
    let up = lines.last().expect("a line");
    assert!(up.contains("WARN") && up.contains("s down"), "{up}");
    assert!(
        !lines.iter().any(
            |l| l.contains("cannot reach") || l.contains("link to 127") && l.contains(" down:")
        ),
        "one line when it goes, one when it returns: {lines:?}"
    );
}

/// Where the peer the test plays listens: a loopback listener and its port.
fn peer_listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    (listener, port)
}

/// A `bridges:` block linking, as `client_id`, to the peer the test plays on
/// `port`, with `rules` (the `topics:` list's YAML).
fn to_test_peer(port: u16, client_id: &str, rules: &str) -> String {
    format!(
        "bridges:\n  hub:\n    peer: tcp://127.0.0.1:{port}\n    client_id: {client_id}\n    topics:\n{rules}"
    )
}

/// The peer, played by the test: accepts the bridge's connection and answers its
/// CONNECT.
fn accept_bridge(listener: &TcpListener, session_present: bool) -> (Raw, saguin::codec::Connect) {
    accept_bridge_with(listener, session_present, Properties::default())
}

/// [`accept_bridge`], the CONNACK carrying `properties`.
fn accept_bridge_with(
    listener: &TcpListener,
    session_present: bool,
    properties: Properties,
) -> (Raw, saguin::codec::Connect) {
    // Polled, so a bridge that never dials fails the test within WAIT.
    listener.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + WAIT;
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    Instant::now() < deadline,
                    "the bridge did not dial within {WAIT:?}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    stream.set_nonblocking(false).expect("blocking");
    let mut peer = Raw::on(stream, V5);
    let connect = match peer.recv() {
        Packet::Connect(c) => *c,
        other => panic!("expected CONNECT, got {other:?}"),
    };
    peer.send(&Packet::ConnAck(ConnAck {
        session_present,
        code: 0,
        properties,
    }));
    (peer, connect)
}

/// The SUBSCRIBE the bridge sends, answered.
fn expect_subscribe(peer: &mut Raw) -> Vec<(String, SubscriptionOptions)> {
    match peer.recv() {
        Packet::Subscribe(s) => {
            let codes = vec![2; s.filters.len()];
            peer.send(&Packet::SubAck(saguin::codec::SubAck {
                packet_id: s.packet_id,
                properties: Properties::default(),
                codes,
            }));
            s.filters
        }
        other => panic!("expected SUBSCRIBE, got {other:?}"),
    }
}

/// The next PUBLISH the bridge sends the peer, answering PINGREQs meanwhile.
fn next_publish(peer: &mut Raw) -> Publish {
    loop {
        match peer.recv() {
            Packet::Publish(p) => return p,
            Packet::PingReq => peer.send(&Packet::PingResp),
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
}

/// The PUBACK for `packet_id`, skipping PINGREQs.
fn expect_puback(peer: &mut Raw, packet_id: u16) {
    loop {
        match peer.recv() {
            Packet::PubAck(ack) => {
                assert_eq!(ack.packet_id, packet_id);
                return;
            }
            Packet::PingReq => peer.send(&Packet::PingResp),
            other => panic!("expected PUBACK, got {other:?}"),
        }
    }
}

/// MQTT-3.1.2-24: a record is measured against the peer's Maximum Packet Size with
/// the topic its template gives it: one the longer topic pushes over is not sent
/// (the peer would end the link), and the next that fits goes.
#[test]
fn an_out_record_is_measured_with_the_topic_it_goes_out_under() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        "",
        &format!(
            "bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-size
    topics:
      - filter: out/#
        topic: a-long-prefix-the-peer-is-given-0123456789/$#
        direction: out
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let limit = Properties::from(PropertyValues {
        maximum_packet_size: Some(100),
        ..PropertyValues::default()
    });
    let (mut peer, _) = accept_bridge_with(&listener, false, limit);
    broker.wait_log("bridge hub: connected to");
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    // 75 bytes at most under out/x, 111 under the long topic.
    assert_eq!(
        publisher.publish("out/x", &[b'b'; 40], QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        publisher.publish("out/y", b"s", QoS::AtLeastOnce, false),
        Some(0)
    );
    let first = next_publish(&mut peer);
    assert_eq!(
        (&*first.topic, &*first.payload),
        ("a-long-prefix-the-peer-is-given-0123456789/y", &b"s"[..])
    );
}

/// B-376, B-403, B-412 (inbound), B-212, B-375, B-400, B-402, B-373, B-377, A-267, C-226: the CONNECT keeps
/// a session for session_expiry with the configured Receive Maximum and no
/// credentials; the SUBSCRIBE is the filter verbatim with No Local; a record is
/// acknowledged once stored; its redelivery with DUP after the link dropped is
/// acknowledged again and not stored twice; a reconnect without the session is a
/// warning; DISCONNECT 0x95 stops the link for good.
#[test]
fn the_bridge_speaks_to_a_peer_as_the_rfc_says() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        "",
        &format!(
            "channels:
  readings:
    type: append
    filter: readings/#
bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-raw
    session_expiry: 2h
    receive_maximum: 7
    ack_interval: 20ms
    topics:
      - filter: fleet/{{a,b}}/#
        topic: readings/$#
        direction: in
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let (mut peer, connect) = accept_bridge(&listener, false);
    assert!(!connect.clean_start, "B-376");
    assert_eq!(connect.client_id, "edge-raw");
    assert_eq!(
        connect.properties.session_expiry_interval,
        Some(7200),
        "B-376"
    );
    assert_eq!(connect.properties.receive_maximum, Some(7), "B-403");
    assert!(
        connect.username.is_none() && connect.password.is_none(),
        "B-212"
    );
    let filters = expect_subscribe(&mut peer);
    let names: Vec<&str> = filters.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        names,
        ["fleet/a/#", "fleet/b/#"],
        "B-375: verbatim, braces expanded"
    );
    assert!(
        filters
            .iter()
            .all(|(_, o)| o.no_local && o.retain_as_published),
        "B-400"
    );

    // B-377: warned at the first link too, where an edge box down for longer than
    // session_expiry comes back to no session.
    let first = broker.wait_log("kept no session");
    assert!(first.contains("very first time"), "{first}");
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("readings/#", common::opts(QoS::AtLeastOnce));
    let mut record = common::publish("fleet/a/x", b"once", QoS::AtLeastOnce, false);
    record.packet_id = Some(9);
    peer.send(&Packet::Publish(record.clone()));
    expect_puback(&mut peer, 9);
    let got = reader.recv_publish();
    assert_eq!((&*got.topic, &*got.payload), ("readings/x", &b"once"[..]));

    // The link drops before the peer saw... as far as it knows: it redelivers.
    drop(peer);
    let (mut peer, _) = accept_bridge(&listener, false);
    let again = broker.wait_log("kept no session"); // B-377
    assert!(!again.contains("very first time"), "{again}");
    expect_subscribe(&mut peer);
    record.dup = true;
    peer.send(&Packet::Publish(record));
    expect_puback(&mut peer, 9);
    let mut fresh = common::publish("fleet/b/y", b"next", QoS::AtLeastOnce, false);
    fresh.packet_id = Some(10);
    peer.send(&Packet::Publish(fresh));
    expect_puback(&mut peer, 10);
    let got = reader.recv_publish();
    assert_eq!(
        &*got.payload, b"next",
        "B-373: the DUP redelivery was not stored again"
    );
    // QoS 2: PUBREC once stored, PUBCOMP at the PUBREL.
    let mut exactly = common::publish("fleet/b/z", b"two", QoS::ExactlyOnce, false);
    exactly.packet_id = Some(11);
    peer.send(&Packet::Publish(exactly));
    loop {
        match peer.recv() {
            Packet::PubRec(ack) if ack.packet_id == 11 => break,
            Packet::PingReq => peer.send(&Packet::PingResp),
            other => panic!("expected PUBREC, got {other:?}"),
        }
    }
    assert_eq!(&*reader.recv_publish().payload, b"two");
    peer.send(&Packet::PubRel(saguin::codec::Ack::new(11, 0)));
    match peer.recv() {
        Packet::PubComp(ack) => assert_eq!(ack.packet_id, 11),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }

    // 0x95 stops the link; no dial follows.
    peer.send(&Packet::Disconnect(saguin::codec::Disconnect::new(0x95)));
    broker.wait_log("link to");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        listener.accept().is_err(),
        "the stopped link is not dialled again"
    );
}

const OPS: &str = "  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n";

/// B-393, B-394, B-395, B-407, B-408, B-100, B-105, A-191: what no rule covers, what
/// a rule maps to nothing or into the reserved `$` space, and what Sagüin would
/// refuse whatever the channel - a topic too deep, a dead-letter channel's topic,
/// which takes records from its queue alone - are dropped with a warning,
/// acknowledged to the peer (it is finished with there) and counted by cause; the
/// link carries on.
#[test]
fn records_the_bridge_cannot_store_are_dropped_with_a_warning_and_counted() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        &format!("{OPS}  limits:\n    max_topic_levels: 4\n"),
        &format!(
            "channels:
  jobs:
    type: queue
    filter: work/+/todo
bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-drops
    topics:
      - filter: dl/#
        topic: work/$#
        direction: in
      - filter: in/+/x
        topic: $1/y
        direction: in
      - filter: zero/#
        topic: $#
        direction: in
      - filter: deep/#
        topic: d/$#
        direction: in
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let ops = broker.ops_addr();
    let (mut peer, _) = accept_bridge(&listener, false);
    expect_subscribe(&mut peer);
    let mut reader = Raw::connected(broker.addr, V5, "reader");
    reader.subscribe("d/#", common::opts(QoS::AtLeastOnce));
    let sent = [
        ("nothing/here", "no_rule"),
        ("in/$saguin/x", "unmappable"),
        ("zero", "unmappable"),
        ("deep/1/2/3/4", "never_accepted"),
        ("dl/a/todo/__dlq", "never_accepted"),
    ];
    for (n, (topic, cause)) in sent.iter().enumerate() {
        let id = n as u16 + 1;
        let mut p = common::publish(topic, b"v", QoS::AtLeastOnce, false);
        p.packet_id = Some(id);
        peer.send(&Packet::Publish(p));
        expect_puback(&mut peer, id);
        let warned = broker.wait_log(&format!("({cause})"));
        assert!(
            warned.contains("WARN") && warned.contains(topic),
            "{warned}"
        );
    }
    let mut p = common::publish("deep/ok", b"kept", QoS::AtLeastOnce, false);
    p.packet_id = Some(9);
    peer.send(&Packet::Publish(p));
    expect_puback(&mut peer, 9);
    assert_eq!(&*reader.recv_publish().topic, "d/ok");
    let metrics = common::http_get(common::tcp(&ops), "/metrics").1;
    for (cause, n) in [("no_rule", 1), ("unmappable", 2), ("never_accepted", 2)] {
        let line = format!("saguin_bridge_unstored_total{{bridge=\"hub\",cause=\"{cause}\"}} {n}");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
}

/// B-402, B-404, B-405, B-406: a record the local channel refuses is not
/// acknowledged; QoS 0 records past one Receive Maximum waiting behind it are
/// dropped and counted; the link still notices it has gone and is dialled again, and
/// the redelivered record is still held unacknowledged rather than dropped or
/// remembered as stored.
#[test]
fn a_refused_record_stays_unacknowledged_and_the_link_still_notices_it_went() {
    let (listener, port) = peer_listener();
    let dir = temp_dir("bridge-full");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let yaml = format!(
        "broker:
  id: bridge-full
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  operations:
    listen:
      tcp:
        address: 127.0.0.1:0
  limits:
    max_message_size: 64KiB
  storage:
    default: small
    default_retention_period: none
    default_retention_bytes: none
    providers:
      small:
        type: memory
        max_bytes: 1MiB
        snapshot_dir: {{dir}}/snapshots
channels:
  fill:
    type: append
    filter: fill/#
bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-full
    receive_maximum: 2
    topics:
      - filter: fill/#
        direction: both
"
    );
    let broker = Broker::start_in(dir, &yaml);
    let ops = broker.ops_addr();
    let (mut peer, _) = accept_bridge(&listener, false);
    expect_subscribe(&mut peer);
    let mut local = Raw::connected(broker.addr, V5, "filler");
    let payload = vec![b'x'; 50 << 10];
    let full = (0..40).any(|i| {
        local.publish(&format!("fill/{i}"), &payload, QoS::AtLeastOnce, false) == Some(0x97)
    });
    assert!(full, "the channel never filled");
    let mut record = common::publish("fill/from-peer", &payload, QoS::AtLeastOnce, false);
    record.packet_id = Some(5);
    peer.send(&Packet::Publish(record.clone()));
    let unacknowledged = |peer: &mut Raw| loop {
        match peer.expect_nothing_or_packet(Duration::from_millis(700)) {
            Err(e) if e.contains("read:") => return,
            Ok(Packet::Publish(p)) => {
                // The out half of the both rule carries the local records out.
                peer.send(&Packet::PubAck(saguin::codec::Ack::new(
                    p.packet_id.unwrap_or(0),
                    0,
                )));
            }
            Ok(Packet::PingReq) => peer.send(&Packet::PingResp),
            other => panic!("B-402: no PUBACK while the channel refuses: {other:?}"),
        }
    };
    unacknowledged(&mut peer);
    for n in 0..5 {
        let topic = format!("fill/qos0/{n}");
        peer.send(&Packet::Publish(common::publish(
            &topic,
            &payload,
            QoS::AtMostOnce,
            false,
        )));
    }
    broker.wait_log("\"fill/qos0/4\" dropped");
    drop(peer);
    let down = broker.wait_log("bridge hub: link to");
    assert!(down.contains("down"), "B-404: {down}");
    // The gauge falls with the link though the worker is still held by the store;
    // the next dial waits on the listener's backlog for a CONNACK the test has not
    // sent yet. One scrape: the answer is kept for min_scrape_interval.
    let metrics = common::http_get(common::tcp(&ops), "/metrics").1;
    for line in [
        "saguin_bridge_unstored_total{bridge=\"hub\",cause=\"queue_full\"} 3",
        "saguin_bridge_connected{bridge=\"hub\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    let (mut peer, _) = accept_bridge(&listener, true);
    expect_subscribe(&mut peer);
    record.dup = true;
    peer.send(&Packet::Publish(record));
    unacknowledged(&mut peer);
}

/// B-380, B-389, B-370, B-399, B-400: two Sagüins, one both rule: each side's
/// record crosses once, keeping its saguin-id, and nothing comes back.
#[test]
fn a_both_rule_between_two_saguins_crosses_each_way_once_keeping_the_saguin_id() {
    let latest = "channels:\n  alerts:\n    type: latest\n    filter: alerts/#\n";
    let hub = Broker::start_with(&bridged("", latest));
    let edge = Broker::start_with(&bridged(
        "",
        &format!(
            "{latest}bridges:
  hub:
    peer: tcp://{}
    client_id: edge-both
    topics:
      - filter: alerts/#
        direction: both
",
            hub.addr
        ),
    ));
    edge.wait_log("bridge hub: SUBACK");
    let mut at_hub = Raw::connected(hub.addr, V5, "hub-reader");
    at_hub.subscribe("alerts/#", common::opts(QoS::AtLeastOnce));
    let mut at_edge = Raw::connected(edge.addr, V5, "edge-reader");
    at_edge.subscribe("alerts/#", common::opts(QoS::AtLeastOnce));

    let mut edge_client = Raw::connected(edge.addr, V5, "edge-device");
    assert_eq!(
        edge_client.publish("alerts/e", b"from-edge", QoS::AtLeastOnce, false),
        Some(0)
    );
    let here = at_edge.recv_publish();
    let there = at_hub.recv_publish();
    assert_eq!(
        (&*there.topic, &*there.payload),
        ("alerts/e", &b"from-edge"[..])
    );
    let id = user_property(&here, "saguin-id").expect("an id");
    assert_eq!(
        user_property(&there, "saguin-id"),
        Some(id),
        "B-370: one identity"
    );
    assert_ne!(
        user_property(&there, "saguin-offset"),
        None,
        "stored at the hub at its own offset"
    );

    let mut hub_client = Raw::connected(hub.addr, V5, "hub-device");
    assert_eq!(
        hub_client.publish("alerts/h", b"from-hub", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(&*at_hub.recv_publish().payload, b"from-hub");
    assert_eq!(&*at_edge.recv_publish().payload, b"from-hub");
    // Nothing echoes: not the edge's record back to the edge (No Local at the hub),
    // not the hub's back to the hub (the mark on what the edge pulled in).
    for reader in [&mut at_hub, &mut at_edge] {
        match reader.expect_nothing_or_packet(Duration::from_millis(800)) {
            Err(e) if e.contains("read:") => {}
            other => panic!("B-399/B-400: nothing crosses twice: {other:?}"),
        }
    }
}

/// B-397, B-398: `--check-config` now passes a file with a tcp bridge and says
/// where each rule lands, a queue it crosses included.
#[test]
fn check_config_says_where_each_rule_lands() {
    let dir = temp_dir("bridge-check");
    let path = dir.join("saguin.yaml");
    let yaml = bridged(
        "",
        "channels:
  events:
    type: append
    filter: iot/+/events/#
  jobs:
    type: queue
    filter: iot/+/jobs/+
bridges:
  head-office:
    peer: tcp://127.0.0.1:1
    client_id: vessel-07
    topics:
      - filter: iot/#
        direction: both
",
    );
    std::fs::write(&path, yaml).expect("config");
    let out = common::run_saguin(&[std::ffi::OsStr::new("--check-config"), path.as_os_str()]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("bridge \"head-office\", both \"iot/#\": lands in events (append), jobs__dlq (append); crosses jobs (queue), never served"),
        "{said}"
    );
}

/// B-203, B-206, B-209, B-211: a tls:// peer checked against ca_file; the bridge's
/// certificate is read at every handshake, so a pair the hub refuses, replaced on
/// disk by one it accepts, is presented at the next reconnect with no signal.
#[test]
fn a_tls_bridge_presents_the_pair_on_disk_at_each_handshake() {
    use common::tls::{Ca, tls_dir};
    let ca = Ca::new("estate");
    let dir = tls_dir("bridge-tls", &ca);
    let hub_yaml = common::config(
        "        tls:\n          cert_file: {dir}/server.pem\n          key_file: {dir}/server-key.pem\n          client_ca_file: {dir}/ca.pem\n",
    );
    let hub = Broker::start_in(dir.clone(), &hub_yaml);
    let stranger = Ca::new("stranger");
    let (_, cert, key) = stranger.sign(&[], Some("vessel-07"));
    let edge_dir = temp_dir("bridge-tls-edge");
    std::fs::write(edge_dir.join("bridge.pem"), cert).expect("cert");
    std::fs::write(edge_dir.join("bridge-key.pem"), key).expect("key");
    std::fs::write(edge_dir.join("ca.pem"), ca.pem()).expect("ca");
    let edge = Broker::start_in(
        edge_dir.clone(),
        &bridged(
            "",
            &format!(
                "bridges:
  hub:
    peer: tls://127.0.0.1:{}
    client_id: vessel-07
    ca_file: {{dir}}/ca.pem
    cert_file: {{dir}}/bridge.pem
    key_file: {{dir}}/bridge-key.pem
    topics:
      - filter: up/#
        direction: out
        topic: fleet/$#
",
                hub.addr.port()
            ),
        ),
    );
    edge.wait_log("bridge hub: cannot reach");
    let (_, cert, key) = ca.sign(&[], Some("vessel-07"));
    std::fs::write(edge_dir.join("bridge.pem"), cert).expect("cert");
    std::fs::write(edge_dir.join("bridge-key.pem"), key).expect("key");
    let connected = edge.wait_log("bridge hub: connected to");
    assert!(connected.contains("unreachable"), "{connected}");
    hub.wait_log("vessel-07 connected (V5");
}

/// Receives `n` publishes as "topic payload" lines, acknowledging each.
fn lines_of(reader: &mut Raw, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let p = reader.recv_publish();
            format!("{} {}", p.topic, String::from_utf8_lossy(&p.payload))
        })
        .collect()
}

/// Asserts nothing more arrives within a moment.
fn nothing_more(reader: &mut Raw, why: &str) {
    match reader.expect_nothing_or_packet(Duration::from_millis(700)) {
        Err(e) if e.contains("read:") => {}
        other => panic!("{why}: {other:?}"),
    }
}

/// B-382, B-383, B-386, C-224: an out rule's position in an append channel outlives a
/// restart of Sagüin itself; a latest channel is carried as it changes, never as a
/// pass over its current state, and what changed while the link was down crosses as
/// the newest value per topic, a deletion included.
#[test]
fn out_rules_resume_after_a_restart_and_carry_a_latest_channel_newest_per_topic() {
    let peer = Mosquitto::start(free_port(), temp_dir("mosq-restart"));
    let mut far = persistent(peer.addr, "far-reader");
    far.subscribe("site/#", common::opts(QoS::AtLeastOnce));
    let dir = temp_dir("bridge-restart");
    let yaml = format!(
        "{SQLITE}channels:
  events:
    type: append
    filter: events/#
  state:
    type: latest
    filter: state/#
bridges:
  hub:
    peer: tcp://{}
    client_id: edge-restart
    topics:
      - filter: events/#
        topic: site/events/$#
        direction: out
      - filter: state/#
        topic: site/state/$#
        direction: out
",
        peer.addr
    );
    // A value set before the rule ever ran is current state, not a change: it
    // never crosses.
    let broker = Broker::start_in(
        dir.clone(),
        yaml.split("bridges:").next().unwrap_or_default(),
    );
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("state/old", b"before", QoS::AtLeastOnce, false),
        Some(0)
    );
    drop(local);
    let dir = broker.stop();

    let broker = Broker::start_in(dir, &yaml);
    broker.wait_log("bridge hub: connected to");
    let mut local = Raw::connected(broker.addr, V5, "local");
    for payload in ["e1", "e2"] {
        assert_eq!(
            local.publish("events/a", payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    assert_eq!(
        lines_of(&mut far, 2),
        ["site/events/a e1", "site/events/a e2"]
    );
    wait_taken(&broker, &["events/a", "events/a"]);
    drop(local);
    let dir = broker.stop();

    let broker = Broker::start_in(dir, &yaml);
    broker.wait_log("bridge hub: connected to");
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("events/a", b"e3", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        lines_of(&mut far, 1),
        ["site/events/a e3"],
        "B-382: resumed, nothing re-sent"
    );
    nothing_more(&mut far, "the latest channel's state is no change");

    // The peer goes; the latest channel changes three times on one topic, once on
    // another, and a third value is deleted.
    assert_eq!(
        local.publish("state/gone", b"soon", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(lines_of(&mut far, 1), ["site/state/gone soon"]);
    drop(far);
    wait_taken(&broker, &["state/gone"]);
    let (port, mosq_dir) = peer.stop();
    broker.wait_log("bridge hub: link to");
    for (topic, payload) in [
        ("state/a", "v1"),
        ("state/a", "v2"),
        ("state/b", "w1"),
        ("state/a", "v3"),
        ("state/gone", ""),
    ] {
        assert_eq!(
            local.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let peer = Mosquitto::start(port, mosq_dir);
    broker.wait_log_for("up again after", REDIAL_WAIT);
    let mut far = persistent(peer.addr, "far-reader");
    let wanted = ["site/state/a v3", "site/state/b w1", "site/state/gone "];
    let mut got = Vec::new();
    while !wanted.iter().all(|w| got.iter().any(|g| g == w)) {
        let line = lines_of(&mut far, 1).remove(0);
        // "gone soon" may come again: its PUBACK can be in flight when the peer
        // goes, and an unacknowledged record is sent again (at least once).
        assert!(
            wanted.contains(&line.as_str()) || line == "site/state/gone soon",
            "B-386: only the newest per topic crosses: {line} after {got:?}"
        );
        got.push(line);
        assert!(got.len() <= 4, "{got:?}");
    }
    nothing_more(&mut far, "B-386: the newest per topic, once");
}

/// B-372, C-226: the RETAIN flag crosses both ways: a retained publish at the peer is kept
/// here as a retained value, and one published here is kept retained at the peer.
#[test]
fn the_retain_flag_crosses_both_ways() {
    let peer = Mosquitto::start(free_port(), temp_dir("mosq-retain"));
    let yaml = bridged(
        "",
        &format!(
            "bridges:
  hub:
    peer: tcp://{}
    client_id: edge-retain
    topics:
      - filter: down/#
        topic: here/$#
        direction: in
      - filter: up/#
        topic: there/$#
        direction: out
",
            peer.addr
        ),
    );
    let broker = Broker::start_with(&yaml);
    broker.wait_log("bridge hub: SUBACK");
    let mut device = Raw::connected(peer.addr, V5, "device");
    assert_eq!(
        device.publish("down/x", b"kept", QoS::AtLeastOnce, true),
        Some(0)
    );
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("up/y", b"also", QoS::AtLeastOnce, true),
        Some(0)
    );
    let here = retained_within_wait(broker.addr, "here/#", "no retained value here");
    assert!(here.retain && &*here.topic == "here/x", "{here:?}");
    let there = retained_within_wait(peer.addr, "there/#", "no retained value at the peer");
    assert!(there.retain && &*there.topic == "there/y", "{there:?}");
}

/// The retained value a new subscriber to `filter` is sent, if one comes within
/// 300 ms (a live delivery, RETAIN clear, is not one).
fn retained_at(addr: SocketAddr, filter: &str) -> Option<Publish> {
    let mut late = Raw::connected(addr, V5, "late");
    late.subscribe(filter, common::opts(QoS::AtLeastOnce));
    match late.expect_nothing_or_packet(Duration::from_millis(300)) {
        Ok(Packet::Publish(p)) if p.retain => Some(p),
        _ => None,
    }
}

/// [`retained_at`], asked again until one comes or `WAIT` passes.
fn retained_within_wait(addr: SocketAddr, filter: &str, why: &str) -> Publish {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(p) = retained_at(addr, filter) {
            return p;
        }
        assert!(Instant::now() < deadline, "{why}");
    }
}

/// An in rule bringing `down/#` here as `here/#` and an out rule sending `here/#`
/// back as `back/#`, on one link to a mosquitto peer.
fn in_and_out_over_here(client_id: &str) -> (Mosquitto, Broker) {
    let peer = Mosquitto::start(free_port(), temp_dir(client_id));
    let yaml = bridged(
        "",
        &format!(
            "bridges:
  hub:
    peer: tcp://{}
    client_id: {client_id}
    topics:
      - filter: down/#
        topic: here/$#
        direction: in
      - filter: here/#
        topic: back/$#
        direction: out
",
            peer.addr
        ),
    );
    let broker = Broker::start_with(&yaml);
    broker.wait_log("bridge hub: SUBACK");
    (peer, broker)
}

/// C-223: a retained value that arrived over a bridge is kept here retained and
/// never sent out over a bridge, though an out rule's filter covers its topic; a
/// value published here on the same topics is.
#[test]
fn a_retained_value_that_came_over_a_bridge_never_leaves_over_one_c223() {
    let (peer, broker) = in_and_out_over_here("edge-c223");
    let mut watcher = Raw::connected(peer.addr, V5, "watcher");
    assert_eq!(
        watcher.subscribe("back/#", common::opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut device = Raw::connected(peer.addr, V5, "device");
    assert_eq!(
        device.publish("down/x", b"from afar", QoS::AtLeastOnce, true),
        Some(0)
    );
    let here = retained_within_wait(broker.addr, "here/x", "the bridged value is not kept here");
    assert_eq!((&*here.payload, here.retain), (&b"from afar"[..], true));
    no_publish_within(
        &mut watcher,
        Duration::from_millis(800),
        "a bridged retained value went back out",
    );
    // The control: the same out rule carries what is published here.
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("here/y", b"local", QoS::AtLeastOnce, true),
        Some(0)
    );
    let p = watcher.recv_publish();
    assert_eq!((&*p.topic, &*p.payload), ("back/y", &b"local"[..]));
}

/// C-230: a record arriving over a bridge takes the ordinary publish path: a
/// retained zero-length publish at the peer deletes the retained value here.
#[test]
fn a_zero_length_retained_publish_over_a_bridge_deletes_the_value_here_c230() {
    let (peer, broker) = in_and_out_over_here("edge-c230");
    let mut device = Raw::connected(peer.addr, V5, "device");
    assert_eq!(
        device.publish("down/gone", b"soon", QoS::AtLeastOnce, true),
        Some(0)
    );
    retained_within_wait(
        broker.addr,
        "here/gone",
        "the bridged value is not kept here",
    );
    assert_eq!(
        device.publish("down/gone", b"", QoS::AtLeastOnce, true),
        Some(0)
    );
    let deadline = Instant::now() + WAIT;
    while retained_at(broker.addr, "here/gone").is_some() {
        assert!(
            Instant::now() < deadline,
            "the zero-length publish did not delete the value"
        );
    }
}

/// B-387, B-388, B-412 (outbound): an out rule sends one record at a time per topic and at most
/// min(peer Receive Maximum, receive_maximum) altogether; a refusal stops the rule,
/// and the refused record is offered again from the position.
#[test]
fn an_out_rule_keeps_one_record_per_topic_in_flight_within_the_window() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        "",
        &format!(
            "channels:
  events:
    type: append
    filter: ev/#
bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-window
    receive_maximum: 3
    topics:
      - filter: ev/#
        topic: far/$#
        direction: out
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let mut local = Raw::connected(broker.addr, V5, "local");
    for (topic, payload) in [
        ("ev/a", "a1"),
        ("ev/a", "a2"),
        ("ev/b", "b1"),
        ("ev/c", "c1"),
        ("ev/d", "d1"),
    ] {
        assert_eq!(
            local.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let (mut peer, _) = accept_bridge(&listener, false);
    let take = |peer: &mut Raw| -> (u16, String) {
        let p = next_publish(peer);
        (
            p.packet_id.unwrap_or(0),
            String::from_utf8_lossy(&p.payload).into_owned(),
        )
    };
    let first: Vec<(u16, String)> = (0..3).map(|_| take(&mut peer)).collect();
    let payloads: Vec<&str> = first.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(
        payloads,
        ["a1", "b1", "c1"],
        "a2 waits behind a1; d1 past the window"
    );
    nothing_more(&mut peer, "three in flight at most");
    peer.send(&Packet::PubAck(saguin::codec::Ack::new(first[0].0, 0)));
    let (a2, payload) = take(&mut peer);
    assert_eq!(payload, "a2", "a1 settled: its topic's next");
    // The peer refuses c1: the rule stops, then offers c1 again from its position.
    peer.send(&Packet::PubAck(saguin::codec::Ack::new(first[2].0, 0x97)));
    broker.wait_log("the peer refused \"ev/c\" 0x97");
    peer.send(&Packet::PubAck(saguin::codec::Ack::new(first[1].0, 0)));
    peer.send(&Packet::PubAck(saguin::codec::Ack::new(a2, 0)));
    let mut again = Vec::new();
    while !again.contains(&"c1".to_string()) || !again.contains(&"d1".to_string()) {
        let (id, payload) = take(&mut peer);
        peer.send(&Packet::PubAck(saguin::codec::Ack::new(id, 0)));
        again.push(payload);
        assert!(again.len() < 10, "{again:?}");
    }
    assert!(
        !again.contains(&"a1".to_string()),
        "a settled record is not re-sent: {again:?}"
    );
}

/// B-107: a record the peer refuses 0x90 (its topic is one the peer never takes) is
/// counted peer_refused and skipped: the rule goes on, and it is not offered again.
#[test]
fn a_record_the_peer_refuses_0x90_is_skipped_and_counted() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        OPS,
        &format!(
            "channels:
  events:
    type: append
    filter: ev/#
bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-0x90
    topics:
      - filter: ev/#
        topic: far/$#
        direction: out
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let ops = broker.ops_addr();
    let mut local = Raw::connected(broker.addr, V5, "local");
    for payload in ["first", "second"] {
        assert_eq!(
            local.publish("ev/a", payload.as_bytes(), QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    let (mut peer, _) = accept_bridge(&listener, false);
    let first = next_publish(&mut peer);
    assert_eq!(&*first.payload, b"first");
    peer.send(&Packet::PubAck(saguin::codec::Ack::new(
        first.packet_id.unwrap_or(0),
        0x90,
    )));
    let second = next_publish(&mut peer);
    assert_eq!(&*second.payload, b"second", "the rule went on at once");
    peer.send(&Packet::PubAck(saguin::codec::Ack::new(
        second.packet_id.unwrap_or(0),
        0,
    )));
    nothing_more(&mut peer, "the refused record is not offered again");
    let metrics = common::http_get(common::tcp(&ops), "/metrics").1;
    let line = "saguin_bridge_unstored_total{bridge=\"hub\",cause=\"peer_refused\"} 1";
    assert!(metrics.contains(line), "{line} in:\n{metrics}");
}

/// B-210: a bridge's TLS file that does not make a client configuration stops the
/// broker at startup, before any listener opens, naming the bridge and its line.
#[test]
fn a_bridge_ca_file_that_holds_no_certificate_stops_the_start() {
    let dir = temp_dir("bridge-bad-ca");
    std::fs::write(dir.join("ca.pem"), "not a certificate\n").expect("ca.pem");
    let yaml = bridged(
        "",
        &format!(
            "bridges:
  hub:
    peer: tls://127.0.0.1:1
    client_id: edge-bad
    ca_file: {}/ca.pem
    topics:
      - filter: a/#
        direction: both
",
            dir.display()
        ),
    );
    let said = common::refused_at_startup(&dir, &yaml);
    let line = yaml
        .lines()
        .position(|l| l == "  hub:")
        .map(|i| i + 1)
        .expect("the bridge's line");
    assert!(
        said.contains(&format!("saguin.yaml:{line}: bridges.hub: ca_file")),
        "{said}"
    );
    assert!(!said.contains("listening on"), "{said}");
}

/// B-367, B-380: a ws:// peer is dialled with the `mqtt` subprotocol, and records
/// cross both ways over it as over tcp://.
#[test]
fn a_ws_bridge_carries_both_ways() {
    let hub = Broker::start("      ws:\n        address: 127.0.0.1:0\n");
    carries_both_ways_over(&hub, "ws", "", temp_dir("bridge-ws"));
}

/// B-203, B-367: a wss:// peer: TLS checked against ca_file, then the WebSocket.
#[test]
fn a_wss_bridge_carries_both_ways() {
    use common::tls::{Ca, tls_dir};
    let ca = Ca::new("estate");
    let dir = tls_dir("bridge-wss", &ca);
    let hub = Broker::start_in(
        dir.clone(),
        &common::config(
            "      ws:\n        address: 127.0.0.1:0\n        tls:\n          cert_file: {dir}/server.pem\n          key_file: {dir}/server-key.pem\n",
        ),
    );
    let ca_file = format!("    ca_file: {}/ca.pem\n", dir.display());
    carries_both_ways_over(&hub, "wss", &ca_file, temp_dir("bridge-wss-edge"));
}

/// Bridges a new Sagüin to `hub`'s ws door over `scheme`, one rule each way, and
/// sees a record cross each way.
fn carries_both_ways_over(hub: &Broker, scheme: &str, keys: &str, dir: PathBuf) {
    let ws = hub.wait_log("listening on ws://");
    let ws = ws
        .split("ws://")
        .nth(1)
        .expect("a ws address")
        .trim()
        .to_string();
    let edge = Broker::start_in(
        dir,
        &bridged(
            "",
            &format!(
                "bridges:
  hub:
    peer: {scheme}://{ws}/mqtt
    client_id: edge-ws
{keys}    topics:
      - filter: down/#
        topic: here/$#
        direction: in
      - filter: up/#
        topic: there/$#
        direction: out
"
            ),
        ),
    );
    edge.wait_log("bridge hub: SUBACK");
    let mut at_hub = Raw::connected(hub.addr, V5, "hub-reader");
    at_hub.subscribe("there/#", common::opts(QoS::AtLeastOnce));
    let mut at_edge = Raw::connected(edge.addr, V5, "edge-reader");
    at_edge.subscribe("here/#", common::opts(QoS::AtLeastOnce));
    let mut hub_client = Raw::connected(hub.addr, V5, "hub-device");
    assert_eq!(
        hub_client.publish("down/a", b"in", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(lines_of(&mut at_edge, 1), ["here/a in"]);
    let mut edge_client = Raw::connected(edge.addr, V5, "edge-device");
    assert_eq!(
        edge_client.publish("up/b", b"out", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(lines_of(&mut at_hub, 1), ["there/b out"]);
}

/// RFC 0003 "Retained messages", B-372, C-228, C-229: a peer that keeps no retained
/// messages is sent a retained value with the flag down, said once per link in the
/// log, with nothing configured for it.
#[test]
fn a_peer_without_retained_messages_gets_the_value_with_the_flag_down() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        "",
        &format!(
            "bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-noretain
    topics:
      - filter: up/#
        topic: far/$#
        direction: out
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let properties = Properties::from(PropertyValues {
        retain_available: Some(0),
        ..PropertyValues::default()
    });
    let (mut peer, _) = accept_bridge_with(&listener, false, properties);
    broker.wait_log("keeps no retained messages");
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("up/v", b"value", QoS::AtLeastOnce, true),
        Some(0)
    );
    let p = next_publish(&mut peer);
    assert_eq!(&*p.topic, "far/v");
    assert!(!p.retain, "{p:?}");
}

/// RFC 0002 "Hanging up a client": a bridge's outbound rule is the broker's own
/// session, not a client's; a hang-up naming it is answered no-such-client and the
/// rule goes on carrying.
#[test]
fn an_outbound_rule_cannot_be_hung_up() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        "",
        &format!(
            "bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-hang
    topics:
      - filter: up/#
        direction: both
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let (mut peer, _) = accept_bridge(&listener, false);
    expect_subscribe(&mut peer);
    let mut operator = Raw::connected(broker.addr, V5, "operator");
    operator.subscribe("ops/reply", common::opts(QoS::AtLeastOnce));
    let mut p = common::publish(
        "$saguin/sessions/disconnect",
        "\u{1}bridge/hub/out/up/#/up/#".as_bytes(),
        QoS::AtLeastOnce,
        false,
    );
    p.properties.edit().response_topic = Some("ops/reply".into());
    assert_eq!(operator.publish_packet(p), Some(0));
    assert_eq!(&*operator.recv_publish().payload, b"no-such-client");
    assert_eq!(
        operator.publish("up/still", b"x", QoS::AtLeastOnce, false),
        Some(0)
    );
    let carried = next_publish(&mut peer);
    assert_eq!(&*carried.topic, "up/still");
}

/// B-384, B-388: a peer refusing one rule's record holds that rule alone: another
/// rule's records go on crossing meanwhile, and the refused one is offered again.
#[test]
fn a_refusal_holds_one_rule_and_no_other() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        "",
        &format!(
            "channels:
  events:
    type: append
    filter: ev/#
bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-rules
    topics:
      - filter: ev/a/#
        topic: far/a/$#
        direction: out
      - filter: ev/b/#
        topic: far/b/$#
        direction: out
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("ev/a/x", b"a1", QoS::AtLeastOnce, false),
        Some(0)
    );
    let (mut peer, _) = accept_bridge(&listener, false);
    let a1 = next_publish(&mut peer);
    assert_eq!(&*a1.payload, b"a1");
    let refused_at = Instant::now();
    peer.send(&Packet::PubAck(saguin::codec::Ack::new(
        a1.packet_id.unwrap_or(0),
        0x97,
    )));
    broker.wait_log("the peer refused \"ev/a/x\" 0x97");
    assert_eq!(
        local.publish("ev/b/y", b"b1", QoS::AtLeastOnce, false),
        Some(0)
    );
    let b1 = next_publish(&mut peer);
    assert_eq!(&*b1.payload, b"b1", "the other rule goes on");
    assert!(
        refused_at.elapsed() < Duration::from_secs(1),
        "within the pause"
    );
    peer.send(&Packet::PubAck(saguin::codec::Ack::new(
        b1.packet_id.unwrap_or(0),
        0,
    )));
    let again = next_publish(&mut peer);
    assert_eq!(&*again.payload, b"a1", "offered again from its position");
}

/// A malformed packet from the peer ends the link, logged, and the bridge dials
/// again: never a panic.
#[test]
fn a_malformed_packet_from_the_peer_ends_the_link_and_the_bridge_dials_again() {
    let (listener, port) = peer_listener();
    let yaml = bridged(
        "",
        &format!(
            "bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-garbage
    topics:
      - filter: a/#
        direction: in
        topic: b/$#
"
        ),
    );
    let broker = Broker::start_with(&yaml);
    let (mut peer, _) = accept_bridge(&listener, false);
    expect_subscribe(&mut peer);
    // A PUBLISH whose topic claims 65535 bytes of a two-byte body.
    peer.send_bytes(&[0x32, 0x02, 0xFF, 0xFF]);
    let down = broker.wait_log("bridge hub: link to");
    assert!(down.contains("does not decode"), "{down}");
    let (mut peer, connect) = accept_bridge(&listener, false);
    assert_eq!(connect.client_id, "edge-garbage");
    expect_subscribe(&mut peer);
}

/// B-383: an out rule whose topic is edited is a new reader: it starts where a new
/// reader of the channel starts (the floor of an append channel), while the rule as
/// it was would have resumed past what it had carried.
#[test]
fn an_edited_out_rule_is_a_new_reader() {
    let (listener, port) = peer_listener();
    let yaml = |topic: &str| {
        format!(
            "{SQLITE}channels:
  events:
    type: append
    filter: ev/#
bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-edited
    topics:
      - filter: ev/#
        topic: {topic}/$#
        direction: out
"
        )
    };
    let carried = |peer: &mut Raw| {
        let p = next_publish(peer);
        peer.send(&Packet::PubAck(saguin::codec::Ack::new(
            p.packet_id.unwrap_or(0),
            0,
        )));
        format!("{} {}", p.topic, String::from_utf8_lossy(&p.payload))
    };
    let broker = Broker::start_in(temp_dir("bridge-edited"), &yaml("one"));
    let (mut peer, _) = accept_bridge(&listener, false);
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("ev/x", b"e1", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(carried(&mut peer), "one/x e1");
    wait_taken(&broker, &["ev/x"]);
    drop(local);
    let dir = broker.stop();
    drop(peer);

    // The same rule resumes past e1.
    let broker = Broker::start_in(dir, &yaml("one"));
    let (mut peer, _) = accept_bridge(&listener, true);
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("ev/x", b"e2", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(carried(&mut peer), "one/x e2");
    wait_taken(&broker, &["ev/x"]);
    drop(local);
    let dir = broker.stop();
    drop(peer);

    // Edited, it is a new reader from the floor.
    let _edge = Broker::start_in(dir, &yaml("two"));
    let (mut peer, _) = accept_bridge(&listener, true);
    assert_eq!(carried(&mut peer), "two/x e1");
    assert_eq!(carried(&mut peer), "two/x e2");
}

/// B-384, second half: retention passing an out rule's position while its link is
/// down is logged and counted against that rule alone, and the rule goes on at the
/// channel's floor; a client consumer's gauge is not charged for it.
#[test]
fn retention_passing_an_out_rule_position_is_counted_against_that_rule() {
    let port = free_port();
    let peer = Mosquitto::start(port, temp_dir("mosq-gap"));
    let mut far = persistent(peer.addr, "far-gap");
    far.subscribe("site/#", common::opts(QoS::AtLeastOnce));
    let yaml = format!(
        "{SQLITE}  operations:
    listen:
      tcp:
        address: 127.0.0.1:0
channels:
  short:
    type: append
    filter: short/#
    retention_period: 1s
  kept:
    type: append
    filter: kept/#
bridges:
  hub:
    peer: tcp://{}
    client_id: edge-gap
    topics:
      - filter: short/#
        topic: site/short/$#
        direction: out
      - filter: kept/#
        topic: site/kept/$#
        direction: out
",
        peer.addr
    );
    let broker = Broker::start_with(&yaml);
    let ops = broker.ops_addr();
    broker.wait_log("bridge hub: connected to");
    let mut local = Raw::connected(broker.addr, V5, "local");
    local.publish("short/a", b"crossed", QoS::AtLeastOnce, false);
    assert_eq!(&*far.recv_publish().payload, b"crossed");
    drop(far);
    wait_taken(&broker, &["short/a"]);

    let (port_again, dir) = peer.stop();
    broker.wait_log("bridge hub: link to");
    for n in 0..3 {
        local.publish(
            "short/a",
            format!("lost {n}").as_bytes(),
            QoS::AtLeastOnce,
            false,
        );
    }
    local.publish("kept/a", b"kept", QoS::AtLeastOnce, false);
    // The age sweep runs every second; the three go a second after they were written.
    // Watched in the file beside the broker (WAL): a sweep can come seconds late on
    // a busy machine.
    let db = rusqlite::Connection::open(broker.dir.join("saguin.db")).expect("open the db");
    common::wait_until("the age sweep removing the channel's records", || {
        db.query_row(
            "SELECT count(*) FROM records r JOIN channels c ON c.id = r.channel_id \
             WHERE c.name = 'short'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .ok()
            == Some(0)
    });
    drop(db);
    let peer = Mosquitto::start(port_again, dir);
    let line = broker.wait_log_for("no longer holds offsets", REDIAL_WAIT);
    assert!(
        line.contains("bridge/hub/out/short/#") && !line.contains('\u{1}'),
        "{line}"
    );
    let mut far = persistent(peer.addr, "far-gap");
    assert_eq!(&*far.recv_publish().payload, b"kept");
    local.publish("short/a", b"after", QoS::AtLeastOnce, false);
    assert_eq!(
        &*far.recv_publish().payload,
        b"after",
        "the rule goes on at the floor"
    );
    let metrics = common::http_get(common::tcp(&ops), "/metrics").1;
    let counted = "saguin_bridge_gap_records_total{bridge=\"hub\",filter=\"short/#\"} 3";
    assert!(metrics.contains(counted), "{counted} in:\n{metrics}");
    assert!(
        !metrics.contains("saguin_bridge_gap_records_total{bridge=\"hub\",filter=\"kept/#\"}")
            && !metrics.contains("saguin_consumer_gap_records_total{channel=\"short\"}"),
        "the other rule and client consumers are not charged:\n{metrics}"
    );
}

/// Asserts the bridge sends the peer no PUBLISH within `wait`, answering PINGREQs.
fn no_publish_within(peer: &mut Raw, wait: Duration, why: &str) {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        match peer.expect_nothing_or_packet(left) {
            Err(e) if e.contains("read:") => return,
            Ok(Packet::PingReq) => peer.send(&Packet::PingResp),
            other => panic!("{why}: {other:?}"),
        }
    }
}

/// A link that asks the peer for its stored set only on a new subscription, and
/// sends none of ours (C-222, C-227).
fn no_stored_pass(peer: &mut Raw, why: &str) {
    let filters = expect_subscribe(peer);
    assert!(
        filters
            .iter()
            .all(|(_, o)| o.retain_handling == saguin::codec::RetainHandling::OnNewSubscribe),
        "{filters:?}"
    );
    no_publish_within(peer, Duration::from_millis(800), why);
}

/// C-222, C-227: an out rule carries what is published while it runs and never a
/// stored pass: a retained value stored before it ran is not sent at the first
/// connection, and nothing already carried is sent again when the link is dialled
/// again; inbound, every SUBSCRIBE asks Retain Handling 1 (no stored set re-sent).
#[test]
fn an_out_rule_never_sends_the_stored_retained_set_c222_c227() {
    let (listener, port) = peer_listener();
    let rules = format!(
        "bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-pass
    topics:
      - filter: up/#
        topic: far/$#
        direction: out
      - filter: down/#
        topic: here/$#
        direction: in
"
    );
    let broker = Broker::start_in(temp_dir("bridge-no-pass"), SQLITE);
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("up/old", b"stored", QoS::AtLeastOnce, true),
        Some(0)
    );
    drop(local);
    let dir = broker.stop();
    let broker = Broker::start_in(dir, &format!("{SQLITE}{rules}"));
    let (mut peer, _) = accept_bridge(&listener, false);
    // Inbound: the peer's stored set is asked for only on a new subscription.
    no_stored_pass(&mut peer, "a stored value went out");
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("up/new", b"live", QoS::AtLeastOnce, true),
        Some(0)
    );
    let p = next_publish(&mut peer);
    assert_eq!(
        (&*p.topic, &*p.payload, p.retain),
        ("far/new", &b"live"[..], true)
    );
    peer.puback(&p);
    wait_taken(&broker, &["up/new"]);
    drop(peer);
    let (mut peer, _) = accept_bridge(&listener, true);
    no_stored_pass(&mut peer, "the link's return re-shipped a retained value");
}

/// C-225: an out rule never sends a latest value its channel's retention removed
/// while the link was down; a value still kept crosses when it returns.
#[test]
fn a_value_retention_removed_while_the_link_was_down_never_crosses_c225() {
    let port = free_port();
    let peer = Mosquitto::start(port, temp_dir("mosq-c225"));
    let mut far = persistent(peer.addr, "far-c225");
    far.subscribe("site/#", common::opts(QoS::AtLeastOnce));
    let yaml = format!(
        "{SQLITE}channels:
  short:
    type: latest
    filter: short/#
    retention_period: 1s
  kept:
    type: latest
    filter: kept/#
bridges:
  hub:
    peer: tcp://{}
    client_id: edge-c225
    topics:
      - filter: short/#
        topic: site/short/$#
        direction: out
      - filter: kept/#
        topic: site/kept/$#
        direction: out
",
        peer.addr
    );
    let broker = Broker::start_with(&yaml);
    broker.wait_log("bridge hub: connected to");
    drop(far);
    std::thread::sleep(Duration::from_millis(300));
    let (port_again, dir) = peer.stop();
    broker.wait_log("bridge hub: link to");
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("short/a", b"stale", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(
        local.publish("kept/a", b"fresh", QoS::AtLeastOnce, false),
        Some(0)
    );
    // The age sweep runs every second; the value goes a second after it was written.
    std::thread::sleep(Duration::from_millis(3000));
    let peer = Mosquitto::start(port_again, dir);
    let mut far = persistent(peer.addr, "far-c225");
    far.set_timeout(REDIAL_WAIT);
    let p = far.recv_publish();
    assert_eq!((&*p.topic, &*p.payload), ("site/kept/a", &b"fresh"[..]));
    no_publish_within(
        &mut far,
        Duration::from_millis(800),
        "a value retention removed crossed",
    );
}

/// C-225, gaps G-19: a deletion crosses to the peer however long the link was down,
/// while the channel keeps it (deletion_retention_period): a latest value's
/// retention_period ages values, not deletions. One older than the period was
/// skipped, and the peer kept the value for ever.
#[test]
fn a_deletion_older_than_the_values_period_still_crosses_c225() {
    let peer = Mosquitto::start(free_port(), temp_dir("mosq-old-deletion"));
    let mut far = persistent(peer.addr, "far-reader");
    far.subscribe("site/#", common::opts(QoS::AtLeastOnce));
    let yaml = format!(
        "{SQLITE}channels:
  state:
    type: latest
    filter: state/#
    retention_period: 2s
bridges:
  hub:
    peer: tcp://{}
    client_id: edge-old-deletion
    topics:
      - filter: state/#
        topic: site/state/$#
        direction: out
",
        peer.addr
    );
    let broker = Broker::start_in(temp_dir("bridge-old-deletion"), &yaml);
    broker.wait_log("bridge hub: connected to");
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.publish("state/gone", b"soon", QoS::AtLeastOnce, false),
        Some(0)
    );
    assert_eq!(lines_of(&mut far, 1), ["site/state/gone soon"]);
    drop(far);
    wait_taken(&broker, &["state/gone"]);
    let (port, mosq_dir) = peer.stop();
    broker.wait_log("bridge hub: link to");
    assert_eq!(
        local.publish("state/gone", b"", QoS::AtLeastOnce, false),
        Some(0)
    );
    std::thread::sleep(Duration::from_millis(2500));
    let peer = Mosquitto::start(port, mosq_dir);
    broker.wait_log_for("up again after", REDIAL_WAIT);
    let mut far = persistent(peer.addr, "far-reader");
    assert_eq!(lines_of(&mut far, 1), ["site/state/gone "]);
}

/// B-402, B-405: a retained record from the peer that the retained store refuses
/// (its provider full) reached nobody, so it stays unacknowledged, to be offered
/// again, as a channel's refused record does. It was acknowledged and lost: taken
/// for a broadcast handed out before a refusal.
#[test]
fn a_retained_record_the_retained_store_refuses_stays_unacknowledged() {
    let (listener, port) = peer_listener();
    let dir = temp_dir("bridge-retained-full");
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let yaml = format!(
        "broker:
  id: bridge-retained-full
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  limits:
    max_message_size: 64KiB
  storage:
    default: small
    default_retention_period: none
    default_retention_bytes: none
    providers:
      small:
        type: memory
        max_bytes: 1MiB
        snapshot_dir: {{dir}}/snapshots
bridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-retained-full
    topics:
      - filter: r/#
        topic: r/$#
        direction: in
"
    );
    let broker = Broker::start_in(dir, &yaml);
    let (mut peer, _) = accept_bridge(&listener, false);
    expect_subscribe(&mut peer);
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    assert_eq!(
        watcher.subscribe("r/from-peer", common::opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut local = Raw::connected(broker.addr, V5, "filler");
    let payload = vec![b'x'; 50 << 10];
    let full = (0..40)
        .any(|i| local.publish(&format!("r/{i}"), &payload, QoS::AtLeastOnce, true) == Some(0x97));
    assert!(full, "the retained store never filled");
    let mut record = common::publish("r/from-peer", &payload, QoS::AtLeastOnce, true);
    record.packet_id = Some(5);
    peer.send(&Packet::Publish(record));
    loop {
        match peer.expect_nothing_or_packet(Duration::from_millis(1500)) {
            Err(e) if e.contains("read:") => break,
            Ok(Packet::PingReq) => peer.send(&Packet::PingResp),
            other => panic!("no PUBACK while the retained store refuses: {other:?}"),
        }
    }
    watcher.expect_nothing(Duration::from_millis(200));
}

/// MQTT 5 3.1.2.11.4, 4.13.1: a peer that sends a packet over the Maximum Packet
/// Size the bridge told it is told DISCONNECT 0x95 before the link drops; it was
/// dropped without a word.
#[test]
fn a_peer_over_the_maximum_packet_size_is_told_0x95() {
    let (listener, port) = peer_listener();
    let yaml = format!(
        "{SQLITE}  limits:\n    max_message_size: 16KiB\nbridges:
  hub:
    peer: tcp://127.0.0.1:{port}
    client_id: edge-too-large
    topics:
      - filter: r/#
        topic: r/$#
        direction: in
"
    );
    let broker = Broker::start_in(temp_dir("bridge-too-large"), &yaml);
    let (mut peer, connect) = accept_bridge(&listener, false);
    assert_eq!(connect.properties.maximum_packet_size, Some(16 << 10));
    expect_subscribe(&mut peer);
    let mut record = common::publish("r/big", &[b'x'; 32 << 10], QoS::AtLeastOnce, false);
    record.packet_id = Some(3);
    peer.send(&Packet::Publish(record));
    assert_eq!(peer.expect_disconnect(), 0x95);
    broker.wait_log("over max_message_size");
}

/// B-370, B-380: a link goes on reading what its peer sends while a write to the
/// peer waits. Here the peer takes nothing for a while (a congested uplink, or a
/// peer blocked writing to us, which is how two busy brokers on a `both` link
/// stopped each other until the write gave up and the link dropped): its PUBLISH
/// reaches the local subscriber meanwhile, and is acknowledged behind what waited.
#[test]
fn a_link_reads_what_its_peer_sends_while_a_write_to_it_waits() {
    let (listener, port) = peer_listener();
    // A peer that buffers little, as a far end behind a slow uplink does; a record
    // larger than the broker's send buffer (4 MiB at most) waits on it.
    rustix::net::sockopt::set_socket_recv_buffer_size(&listener, 64 << 10).expect("SO_RCVBUF");
    let rules = "      - filter: events/#\n        topic: events/$#\n        direction: out
      - filter: cmd/#\n        topic: cmd/$#\n        direction: in\n";
    let channels = "channels:\n  events:\n    type: append\n    filter: events/#\n";
    let yaml = bridged(
        "  limits:\n    max_message_size: 12MiB\n",
        &format!("{channels}{}", to_test_peer(port, "edge-duplex", rules)),
    );
    let broker = Broker::start_with(&yaml);
    let (mut peer, _) = accept_bridge(&listener, false);
    expect_subscribe(&mut peer);
    broker.wait_log("bridge hub: connected to");
    let mut local = Raw::connected(broker.addr, V5, "local");
    assert_eq!(
        local.subscribe("cmd/#", common::opts(QoS::AtLeastOnce)),
        [1]
    );
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    let payload = vec![b'x'; 8 << 20];
    let records = 2;
    // One topic each: a topic has one record in flight at a time (B-387).
    for n in 0..records {
        assert_eq!(
            publisher.publish(&format!("events/{n}"), &payload, QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    // A record taken for the peer: 8 MiB, which no socket buffer here holds while
    // the peer reads nothing, so the link's write now waits.
    broker.wait_log("record(s) out");
    let mut command = common::publish("cmd/go", b"now", QoS::AtLeastOnce, false);
    command.packet_id = Some(1);
    peer.send(&Packet::Publish(command));
    let got = local.recv_publish();
    assert_eq!((&*got.topic, &*got.payload), ("cmd/go", &b"now"[..]));
    // The peer reads again: every record, and the PUBACK for its PUBLISH among them.
    let mut acked = false;
    let mut seen = 0;
    while seen < records || !acked {
        match peer.recv() {
            Packet::Publish(p) => {
                assert_eq!(p.payload.len(), payload.len());
                if let Some(id) = p.packet_id {
                    peer.send(&Packet::PubAck(saguin::codec::Ack::new(id, 0)));
                }
                seen += 1;
            }
            Packet::PubAck(ack) => {
                assert_eq!(ack.packet_id, 1);
                acked = true;
            }
            Packet::PingReq => peer.send(&Packet::PingResp),
            other => panic!("expected PUBLISH or PUBACK, got {other:?}"),
        }
    }
}

/// A PINGREQ the peer never answers gives the link up a keep alive after it was
/// written, however much else the link goes on writing: a peer gone silent behind
/// a path that still takes bytes (the kernel's buffers) is found out, where a
/// deadline moved on by every later write never came.
#[test]
fn a_peer_that_never_answers_a_pingreq_is_given_up_while_records_still_flow() {
    let (listener, port) = peer_listener();
    let rule = "      - filter: live/#\n        topic: live/$#\n        direction: out\n";
    let yaml = bridged("", &to_test_peer(port, "edge-silent", rule));
    let broker = Broker::start_with(&yaml);
    let keep_alive = Properties::from(PropertyValues {
        server_keep_alive: Some(2),
        ..PropertyValues::default()
    });
    let (_peer, _) = accept_bridge_with(&listener, false, keep_alive);
    // The CONNACK is sent: the link opens after this.
    let connected = Instant::now();
    broker.wait_log("bridge hub: connected to");
    let mut publisher = Raw::connected(broker.addr, V5, "publisher");
    // The peer reads nothing from here on; a record every 100 ms meanwhile, for as
    // long as the test waits for the link to go.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let until = Instant::now() + WAIT;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                publisher.publish("live/t", b"tick", QoS::AtMostOnce, false);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let lost = broker.wait_log("bridge hub: link to");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(lost.contains("no PINGRESP within 2s"), "{lost}");
        // The PINGREQ goes 1.5 s after the link opened, and is given its 2 s from
        // being written: not from anything earlier.
        let after = connected.elapsed();
        assert!(
            after >= Duration::from_millis(2800),
            "given up after {after:?}"
        );
    });
}
