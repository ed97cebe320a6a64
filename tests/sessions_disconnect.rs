//! `$saguin/sessions/disconnect` (RFC 0002 "Hanging up a client", B-296..B-307): an
//! operator hangs a client up; only the connection ends.

mod common;

use std::time::Duration;

use common::{Broker, Raw, connect, opts, publish};
use saguin::codec::{Packet, ProtocolVersion::V5, ProtocolVersion::V311, QoS};

/// Publishes a hang-up of `target` at QoS 1 with a Response Topic (or none); the
/// PUBACK code.
fn hang_up(operator: &mut Raw, target: &str, response: Option<&str>) -> u8 {
    let mut p = publish(
        "$saguin/sessions/disconnect",
        target.as_bytes(),
        QoS::AtLeastOnce,
        false,
    );
    p.properties.edit().response_topic = response.map(str::to_string);
    p.properties.edit().correlation_data = Some(b"req-1".to_vec());
    operator.publish_packet(p).expect("a PUBACK")
}

/// The one-word outcome on the Response Topic.
fn outcome(operator: &mut Raw) -> String {
    let reply = operator.recv_publish();
    assert_eq!(&*reply.topic, "ops/reply");
    assert_eq!(
        reply.properties.correlation_data.as_deref(),
        Some(&b"req-1"[..])
    );
    String::from_utf8_lossy(&reply.payload).into_owned()
}

/// the target gets DISCONNECT 0x98 and resumes its session.
#[test]
fn an_operator_hangs_up_a_client_which_gets_0x98_and_keeps_its_session() {
    // B-296, B-298, B-303, B-304, B-306.
    let broker = Broker::start("");
    let mut operator = Raw::connected(broker.addr, V5, "operator");
    operator.subscribe("ops/reply", opts(QoS::AtLeastOnce));
    let mut device = connect(V5, "device-7", false);
    device.properties.edit().session_expiry_interval = Some(600);
    let (mut device_conn, _) = Raw::handshake(broker.addr, device.clone());
    device_conn.subscribe("cmd/device-7", opts(QoS::AtLeastOnce));

    assert_eq!(hang_up(&mut operator, "device-7", Some("ops/reply")), 0);
    assert_eq!(outcome(&mut operator), "hung-up");
    assert_eq!(device_conn.expect_disconnect(), 0x98);

    // The session stays: what was published while away is delivered on return.
    assert_eq!(
        operator.publish("cmd/device-7", b"reboot", QoS::AtLeastOnce, false),
        Some(0)
    );
    let (mut back, ack) = Raw::handshake(broker.addr, device);
    assert!(ack.session_present, "the session was kept");
    assert_eq!(&*back.recv_publish().payload, b"reboot");
}

#[test]
fn a_client_that_keeps_publishing_is_still_hung_up_and_nobody_else_waits_b299() {
    use std::io::{Read, Write};
    let broker = Broker::start("");
    let mut operator = Raw::connected(broker.addr, V5, "operator");
    operator.subscribe("ops/reply", opts(QoS::AtLeastOnce));
    let mut flood = std::net::TcpStream::connect(broker.addr).expect("connect");
    let mut bytes = Vec::new();
    let hello = Packet::Connect(Box::new(connect(V5, "flooder", true)));
    saguin::codec::encode(&hello, V5, &mut bytes);
    flood.write_all(&bytes).expect("CONNECT");
    flood
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut connack = [0u8; 3];
    flood.read_exact(&mut connack).expect("CONNACK");
    let mut burst = Vec::new();
    for _ in 0..100 {
        let p = Packet::Publish(publish("flood/x", &[7; 100], QoS::AtMostOnce, false));
        saguin::codec::encode(&p, V5, &mut burst);
    }
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Until the broker closes it: a write fails, or a read sees the end.
        flood
            .set_write_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        while flood.write_all(&burst).is_ok() {}
        let _ = done.send(());
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(hang_up(&mut operator, "flooder", Some("ops/reply")), 0);
    assert_eq!(outcome(&mut operator), "hung-up");
    operator.send(&Packet::PingReq);
    assert!(matches!(operator.recv(), Packet::PingResp));
    ended
        .recv_timeout(Duration::from_secs(10))
        .expect("the flooding client's connection ended");
}

#[test]
fn nobody_connected_under_the_id_is_no_such_client() {
    let broker = Broker::start("");
    let mut operator = Raw::connected(broker.addr, V5, "operator");
    operator.subscribe("ops/reply", opts(QoS::AtLeastOnce));
    assert_eq!(hang_up(&mut operator, "ghost", Some("ops/reply")), 0);
    assert_eq!(outcome(&mut operator), "no-such-client");
}

#[test]
fn a_request_without_response_topic_or_target_or_naming_itself_is_0x83_and_hangs_nobody_up() {
    // B-297, B-300.
    let broker = Broker::start("");
    let mut operator = Raw::connected(broker.addr, V5, "operator");
    let mut device = Raw::connected(broker.addr, V5, "device-8");
    assert_eq!(hang_up(&mut operator, "device-8", None), 0x83);
    assert_eq!(hang_up(&mut operator, "", Some("ops/reply")), 0x83);
    assert_eq!(hang_up(&mut operator, "operator", Some("ops/reply")), 0x83);
    device.expect_nothing(Duration::from_millis(200));
    assert_eq!(
        device.publish("still/here", b"x", QoS::AtLeastOnce, false),
        Some(0)
    );
}

#[test]
fn a_311_target_is_closed_with_nothing_sent_and_a_311_requester_ends_its_own_connection() {
    // B-302, B-304.
    let broker = Broker::start("");
    let mut operator = Raw::connected(broker.addr, V5, "operator");
    operator.subscribe("ops/reply", opts(QoS::AtLeastOnce));
    let mut old = Raw::connected(broker.addr, V311, "old-device");
    assert_eq!(hang_up(&mut operator, "old-device", Some("ops/reply")), 0);
    assert_eq!(outcome(&mut operator), "hung-up");
    old.expect_closed_silently();

    let mut requester = Raw::connected(broker.addr, V311, "old-operator");
    let target = Raw::connected(broker.addr, V5, "kept");
    requester.send(&Packet::Publish(publish(
        "$saguin/sessions/disconnect",
        b"kept",
        QoS::AtLeastOnce,
        false,
    )));
    requester.expect_closed_silently();
    let mut target = target;
    target.expect_nothing(Duration::from_millis(200));
}
