//! Sessions, takeover, keepalive, Last Will, and stopping the broker.

mod common;

use std::time::{Duration, Instant};

use common::{Broker, Raw, connect, opts};
use saguin::codec::{
    Disconnect, Packet, Properties, PropertyValues,
    ProtocolVersion::{V5, V311},
    QoS, Will,
};

#[test]
fn a_resumed_session_keeps_its_subscriptions_and_what_it_was_owed() {
    let broker = Broker::start("");
    for protocol in [V5, V311] {
        let mut c = connect(protocol, "durable", false);
        c.properties.edit().session_expiry_interval = Some(300);
        let (mut sub, ack) = Raw::handshake(broker.addr, c.clone());
        assert!(!ack.session_present || protocol == V311);
        sub.subscribe("owed/#", opts(QoS::AtLeastOnce));
        drop(sub);
        broker.wait_log("durable disconnected");
        let mut publisher = Raw::connected(broker.addr, V5, "p");
        publisher.publish("owed/1", b"while away", QoS::AtLeastOnce, false);
        let (mut sub, ack) = Raw::handshake(broker.addr, c);
        assert!(ack.session_present);
        assert_eq!(&*sub.recv_publish().payload, b"while away");
        sub.send(&Packet::Disconnect(Disconnect::new(0)));
    }
}

#[test]
fn clean_start_discards_the_old_session() {
    let broker = Broker::start("");
    let mut c = connect(V5, "fresh", false);
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut sub, _) = Raw::handshake(broker.addr, c.clone());
    sub.subscribe("gone/#", opts(QoS::AtLeastOnce));
    drop(sub);
    c.clean_start = true;
    let (mut sub, ack) = Raw::handshake(broker.addr, c);
    assert!(!ack.session_present);
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("gone/1", b"x", QoS::AtLeastOnce, false);
    sub.expect_nothing(Duration::from_millis(200));
}

/// the existing connection is told 0x8E.
#[test]
fn a_second_connection_with_the_same_client_id_takes_over_0x8e() {
    let broker = Broker::start("");
    let mut first = Raw::connected(broker.addr, V5, "twin");
    let _second = Raw::connected(broker.addr, V5, "twin");
    assert_eq!(first.expect_disconnect(), 0x8E);
    let line = broker.wait_log("twin disconnected");
    assert!(
        line.ends_with("0x8E: another connection took this client id"),
        "{line}"
    );
}

#[test]
fn a_silent_client_is_disconnected_after_one_and_a_half_keepalives() {
    let broker = Broker::start("");
    let mut c = connect(V5, "sleepy", true);
    c.keep_alive = 1;
    let (mut raw, _) = Raw::handshake(broker.addr, c);
    let started = Instant::now();
    assert_eq!(raw.expect_disconnect(), 0x8D);
    let waited = started.elapsed();
    // 1.5 s and at most a keepalive tick (250 ms) late, with room for a loaded
    // machine: a broker waiting twice the grace (3 s) is caught.
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_millis(2900),
        "{waited:?}"
    );
    let line = broker.wait_log("sleepy disconnected");
    assert!(
        line.contains("ended by the broker, 0x8D: nothing received"),
        "{line}"
    );
}

/// What the broker sends a client is not the client speaking: a subscriber that only
/// receives is still disconnected after one and a half keepalives (MQTT-3.1.2-24).
#[test]
fn a_client_that_only_receives_is_still_disconnected_after_its_keepalive() {
    let broker = Broker::start("");
    let mut c = connect(V5, "listener", true);
    c.keep_alive = 1;
    let (mut listener, _) = Raw::handshake(broker.addr, c);
    listener.subscribe("chatter/#", opts(QoS::AtMostOnce));
    let started = Instant::now();
    let mut talker = Raw::connected(broker.addr, V5, "talker");
    let publishing = std::thread::spawn(move || {
        for _ in 0..30 {
            if !talker.try_send(&Packet::Publish(common::publish(
                "chatter/now",
                b"hi",
                QoS::AtMostOnce,
                false,
            ))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut delivered = 0;
    let code = loop {
        match listener.recv() {
            Packet::Publish(_) => delivered += 1,
            Packet::Disconnect(d) => break d.code,
            other => panic!("expected PUBLISH or DISCONNECT, got {other:?}"),
        }
    };
    let waited = started.elapsed();
    assert_eq!(code, 0x8D);
    assert!(
        delivered >= 5,
        "only {delivered} deliveries before the DISCONNECT"
    );
    assert!(
        (Duration::from_millis(1400)..Duration::from_millis(2900)).contains(&waited),
        "{waited:?}"
    );
    publishing.join().expect("the publishing thread");
}

/// a DISCONNECT turning expiry 0 into non-zero is a Protocol Error.
#[test]
fn disconnect_may_not_turn_a_zero_session_expiry_into_a_kept_session() {
    let broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "zero");
    let mut d = Disconnect::new(0);
    d.properties.edit().session_expiry_interval = Some(60);
    raw.send(&Packet::Disconnect(d));
    assert_eq!(raw.expect_disconnect(), 0x82);
}

/// a DISCONNECT's Session Expiry Interval above the cap is kept as the cap, and
/// the client is told nothing.
/// a session whose client is away is kept for its whole capped expiry, no longer.
#[test]
fn a_disconnect_expiry_over_the_cap_is_kept_as_the_cap_untold_a040() {
    let broker = Broker::start("  limits:\n    max_session_expiry: 2s\n");
    for id in ["capped-a", "capped-b"] {
        let mut c = connect(V5, id, false);
        c.properties.edit().session_expiry_interval = Some(2);
        let (mut raw, ack) = Raw::handshake(broker.addr, c);
        assert_eq!(ack.code, 0);
        let mut d = Disconnect::new(0);
        d.properties.edit().session_expiry_interval = Some(600);
        raw.send(&Packet::Disconnect(d));
        assert!(raw.read_to_close().is_empty(), "{id}: nothing is sent back");
    }
    let resume = |id: &str| {
        let (_raw, ack) = Raw::handshake(broker.addr, connect(V5, id, false));
        ack.session_present
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(resume("capped-a"), "the DISCONNECT kept the session");
    std::thread::sleep(Duration::from_millis(3200));
    assert!(
        !resume("capped-b"),
        "600 s was kept as the 2 s cap: the session expired"
    );
}

fn with_will(
    protocol: saguin::codec::ProtocolVersion,
    id: &str,
    topic: &str,
    delay: Option<u32>,
    expiry: u32,
) -> saguin::codec::Connect {
    let mut c = connect(protocol, id, expiry == 0);
    c.properties.edit().session_expiry_interval = Some(expiry);
    let properties = Properties::from(PropertyValues {
        will_delay_interval: delay,
        ..PropertyValues::default()
    });
    c.will = Some(Will {
        topic: topic.into(),
        payload: b"gone".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties,
    });
    c
}

#[test]
fn the_will_is_published_on_an_abnormal_close_and_not_on_disconnect() {
    let broker = Broker::start("");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    for protocol in [V5, V311] {
        let (raw, _) = Raw::handshake(
            broker.addr,
            with_will(protocol, "dies", "wills/dies", None, 0),
        );
        drop(raw); // no DISCONNECT
        let got = watcher.recv_publish();
        assert_eq!((&*got.topic, &*got.payload), ("wills/dies", &b"gone"[..]));

        let (mut raw, _) = Raw::handshake(
            broker.addr,
            with_will(protocol, "polite", "wills/polite", None, 0),
        );
        raw.send(&Packet::Disconnect(Disconnect::new(0)));
        watcher.expect_nothing(Duration::from_millis(300));
    }
    // Only 0x00 withdraws the Will (MQTT-3.1.2-10): 0x04 asks for it, and a client
    // ending on an error of its own (0x80, 0x83) still owes it.
    for (client, code) in [("asks", 0x04), ("failed", 0x80), ("refuses", 0x83)] {
        let topic = format!("wills/{client}");
        let (mut raw, _) = Raw::handshake(broker.addr, with_will(V5, client, &topic, None, 0));
        raw.send(&Packet::Disconnect(Disconnect::new(code)));
        assert_eq!(
            &*watcher.recv_publish().topic,
            topic,
            "DISCONNECT 0x{code:02X}"
        );
    }
}

/// C-269: a delayed Will is held and published when the delay expires.
#[test]
fn a_will_delay_is_cancelled_by_a_resuming_connection_and_otherwise_fires() {
    let broker = Broker::start("");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    let c = with_will(V5, "flaky", "wills/flaky", Some(2), 60);
    let (raw, _) = Raw::handshake(broker.addr, c.clone());
    drop(raw);
    std::thread::sleep(Duration::from_millis(500));
    let (raw, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    watcher.expect_nothing(Duration::from_millis(2500));
    drop(raw);
    let started = Instant::now();
    assert_eq!(&*watcher.recv_publish().topic, "wills/flaky");
    assert!(started.elapsed() >= Duration::from_millis(1000));
}

#[test]
fn a_clean_start_ends_the_session_and_publishes_its_waiting_will_c271() {
    let broker = Broker::start("");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    let c = with_will(V5, "restarts", "wills/restarts", Some(30), 60);
    let (raw, _) = Raw::handshake(broker.addr, c);
    drop(raw);
    // The Will waits out its 30 s delay; a Clean Start ends the session it belongs to.
    watcher.expect_nothing(Duration::from_millis(300));
    let (_fresh, ack) = Raw::handshake(broker.addr, connect(V5, "restarts", true));
    assert!(!ack.session_present);
    let got = watcher.recv_publish();
    assert_eq!(
        (&*got.topic, &*got.payload),
        ("wills/restarts", &b"gone"[..])
    );
}

/// C-270: a refused CONNECT for the same client id is not a connection, and does
/// not cancel the Will waiting out its delay.
#[test]
fn a_refused_connect_does_not_cancel_a_waiting_will_c270() {
    let broker = Broker::start("");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    let (raw, _) = Raw::handshake(
        broker.addr,
        with_will(V5, "waits", "wills/waits", Some(1), 60),
    );
    drop(raw);
    // Refused 0x90 for its own Will: the waiting one still fires.
    let mut refused = with_will(V5, "waits", "$SYS/x", None, 60);
    refused.clean_start = false;
    assert_eq!(Raw::handshake(broker.addr, refused).1.code, 0x90);
    assert_eq!(&*watcher.recv_publish().topic, "wills/waits");
}

/// C-273: a delay longer than the session: the Will goes when the session expires.
#[test]
fn a_will_never_outlives_its_session() {
    let broker = Broker::start("");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    // Delay 30s, session 1s: the session ends first and takes the Will with it.
    let (raw, _) = Raw::handshake(
        broker.addr,
        with_will(V5, "short", "wills/short", Some(30), 1),
    );
    drop(raw);
    let started = Instant::now();
    assert_eq!(&*watcher.recv_publish().topic, "wills/short");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// shutting down is DISCONNECT 0x8B.
#[test]
fn sigterm_tells_mqtt5_clients_0x8b_and_the_broker_exits() {
    let mut broker = Broker::start("");
    let mut raw = Raw::connected(broker.addr, V5, "staying");
    broker.signal("TERM");
    assert_eq!(raw.expect_disconnect(), 0x8B);
    assert!(broker.wait_exit().success());
}

/// B-031: SIGHUP neither reloads nor stops the broker, and says so at warn.
#[test]
fn sighup_is_logged_and_ignored() {
    let broker = Broker::start("");
    broker.signal("HUP");
    let line = broker.wait_log("SIGHUP ignored");
    assert!(line.contains(" WARN "), "{line}");
    let mut raw = Raw::connected(broker.addr, V5, "after-hup");
    assert_eq!(raw.publish("t", b"x", QoS::AtLeastOnce, false), Some(0));
}

/// C-272: a session that ends with its connection (Clean Start and no expiry, or
/// 3.1.1 Clean Session 1) publishes its Will at the disconnect, whatever its delay.
#[test]
fn a_will_of_a_session_ending_with_its_connection_ignores_its_delay_c272() {
    let broker = Broker::start("");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    for protocol in [V5, V311] {
        let (raw, ack) = Raw::handshake(
            broker.addr,
            with_will(protocol, "brief", "wills/brief", Some(30), 0),
        );
        assert_eq!(ack.code, 0);
        drop(raw);
        let started = Instant::now();
        assert_eq!(&*watcher.recv_publish().topic, "wills/brief");
        assert!(started.elapsed() < Duration::from_secs(3), "{protocol:?}");
    }
}

/// C-273, C-274 (scaled from 1 h / 1 min to 1 h / 2 s): the granted expiry, capped by
/// `limits.max_session_expiry`, ends the session and publishes the delayed Will.
#[test]
fn a_delayed_will_goes_when_the_capped_session_expires_c274() {
    let broker = Broker::start("  limits:\n    max_session_expiry: 2s\n");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    let (raw, ack) = Raw::handshake(
        broker.addr,
        with_will(V5, "capped", "wills/capped", Some(120), 3600),
    );
    assert_eq!(ack.properties.session_expiry_interval, Some(2));
    drop(raw);
    let started = Instant::now();
    assert_eq!(&*watcher.recv_publish().topic, "wills/capped");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

/// C-263: a retained `offline` Will into a latest channel replaces that topic's
/// current value when it fires (the availability pattern).
#[test]
fn a_retained_offline_will_replaces_the_latest_value_c263() {
    let broker = Broker::start("channels:\n  status:\n    type: latest\n    filter: status/#\n");
    let mut c = connect(V5, "device-7", true);
    c.will = Some(Will {
        topic: "status/device-7".into(),
        payload: b"offline".to_vec(),
        qos: QoS::AtLeastOnce,
        retain: true,
        properties: Properties::default(),
    });
    let (mut device, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0);
    assert_eq!(
        device.publish("status/device-7", b"online", QoS::AtLeastOnce, true),
        Some(0)
    );
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    assert_eq!(watcher.subscribe("status/#", opts(QoS::AtLeastOnce)), [1]);
    assert_eq!(&*watcher.recv_publish().payload, b"online");
    drop(device); // no DISCONNECT: the Will fires
    assert_eq!(&*watcher.recv_publish().payload, b"offline");
    let mut late = Raw::connected(broker.addr, V5, "late");
    assert_eq!(late.subscribe("status/#", opts(QoS::AtLeastOnce)), [1]);
    let current = late.recv_publish();
    assert_eq!(
        (&*current.topic, &*current.payload),
        ("status/device-7", &b"offline"[..]),
        "the Will is the topic's current value"
    );
    late.expect_nothing(Duration::from_millis(300));
}

/// C-267, C-277: `saguin_wills_waiting` counts the Wills waiting out a delay, and
/// `saguin_wills_published_total` each Will published.
#[test]
fn will_gauges_count_waiting_and_published_wills_c267_c277() {
    let broker =
        Broker::start("  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\n");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    for id in ["patient-1", "patient-2"] {
        let (raw, _) = Raw::handshake(
            broker.addr,
            with_will(V5, id, &format!("wills/{id}"), Some(60), 300),
        );
        drop(raw);
        broker.wait_log(&format!("{id} disconnected"));
    }
    let (raw, _) = Raw::handshake(
        broker.addr,
        with_will(V5, "prompt", "wills/prompt", None, 0),
    );
    drop(raw);
    assert_eq!(&*watcher.recv_publish().topic, "wills/prompt");
    // One scrape: the answer is kept for min_scrape_interval.
    let ops = broker.ops_socket();
    let (status, body) = common::http_get(ops, "/metrics");
    assert_eq!(status, 200);
    for line in ["saguin_wills_waiting 2", "saguin_wills_published_total 1"] {
        assert!(body.lines().any(|l| l == line), "no {line:?} in {body}");
    }
}

/// C-275: a Will delay asked on a session that ends with its connection is said in
/// the log, naming the client, the interval and the fix.
#[test]
fn a_will_delay_on_a_session_ending_with_its_connection_is_logged_c275() {
    let broker = Broker::start("");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    let (raw, ack) = Raw::handshake(
        broker.addr,
        with_will(V5, "hasty", "wills/hasty", Some(45), 0),
    );
    assert_eq!(ack.code, 0);
    drop(raw);
    assert_eq!(&*watcher.recv_publish().topic, "wills/hasty");
    // Whatever was said about it was said before this marker's line.
    Raw::connected(broker.addr, V5, "marker").disconnect();
    let lines = broker.wait_log_lines("marker disconnected");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("hasty") && l.contains("45") && l.contains("Session Expiry")),
        "no line naming hasty, 45 and the fix:\n{}",
        lines.join("\n")
    );
}

/// C-250: a Will's Content Type, Payload Format Indicator, Message Expiry Interval,
/// Response Topic, Correlation Data and User Properties are delivered with it.
#[test]
fn a_wills_properties_are_delivered_with_it_c250() {
    let broker = Broker::start("");
    let mut watcher = Raw::connected(broker.addr, V5, "watcher");
    watcher.subscribe("wills/#", opts(QoS::AtLeastOnce));
    let mut c = with_will(V5, "rich", "wills/rich", None, 0);
    if let Some(will) = &mut c.will {
        let p = will.properties.edit();
        p.content_type = Some("text/plain".into());
        p.payload_format_indicator = Some(1);
        p.message_expiry_interval = Some(600);
        p.response_topic = Some("replies/rich".into());
        p.correlation_data = Some(b"corr".to_vec());
        p.user_properties = vec![("k".into(), "v".into())];
    }
    let (raw, ack) = Raw::handshake(broker.addr, c);
    assert_eq!(ack.code, 0);
    drop(raw);
    let got = watcher.recv_publish();
    let p = &got.properties;
    assert_eq!(p.content_type.as_deref(), Some("text/plain"));
    assert_eq!(p.payload_format_indicator, Some(1));
    assert!(
        p.message_expiry_interval
            .is_some_and(|s| s <= 600 && s > 590)
    );
    assert_eq!(p.response_topic.as_deref(), Some("replies/rich"));
    assert_eq!(p.correlation_data.as_deref(), Some(&b"corr"[..]));
    assert_eq!(common::user_property(&got, "k"), Some("v"));
}

/// MQTT-3.1.2-25: an exchange re-sent to a resumed session that the new connection's
/// Maximum Packet Size no longer takes is not sent, and is done with as though it
/// had been; what follows goes as usual.
#[test]
fn a_resend_over_the_new_maximum_packet_size_is_not_sent() {
    let broker = Broker::start("");
    let mut c = connect(V5, "shrinks", false);
    c.properties.edit().session_expiry_interval = Some(300);
    let (mut sub, _) = Raw::handshake(broker.addr, c.clone());
    sub.subscribe("big/#", opts(QoS::AtLeastOnce));
    let mut publisher = Raw::connected(broker.addr, V5, "p");
    publisher.publish("big/a", &[b'b'; 200], QoS::AtLeastOnce, false);
    let Packet::Publish(first) = sub.recv() else {
        panic!("expected PUBLISH");
    };
    assert_eq!(first.payload.len(), 200, "not acknowledged");
    drop(sub);
    std::thread::sleep(Duration::from_millis(100));
    c.properties.edit().maximum_packet_size = Some(100);
    let (mut sub, ack) = Raw::handshake(broker.addr, c);
    assert!(ack.session_present);
    publisher.publish("big/b", b"small", QoS::AtLeastOnce, false);
    let got = sub.recv_publish();
    assert_eq!((&*got.topic, &*got.payload), ("big/b", &b"small"[..]));
    sub.expect_nothing(Duration::from_millis(200));
}
