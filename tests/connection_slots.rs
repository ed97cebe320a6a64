//! Connection slots and the overflow budget (RFC 0002 §"limits.connect_timeout,
//! connection slots and the overflow budget", A-242, A-243, B-047..B-056), over real
//! sockets against the broker binary.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Broker, Raw, WAIT, connect};
use saguin::codec::{self, Packet, ProtocolVersion, QoS};

const ONE_SLOT: &str = "  limits:\n    max_connections: 1\n";

/// The CONNECT of `client_id` in `protocol`, as bytes on the wire.
fn connect_bytes(protocol: ProtocolVersion, client_id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    codec::encode(
        &Packet::Connect(Box::new(connect(protocol, client_id, true))),
        protocol,
        &mut out,
    );
    out
}

#[test]
fn past_max_connections_an_mqtt5_client_is_told_0x89_and_a_311_client_0x03() {
    // A-242, B-051: a socket that found an overflow place gets Server busy in the
    // protocol its CONNECT opened with.
    let broker = Broker::start(ONE_SLOT);
    let mut admitted = Raw::connected(broker.addr, ProtocolVersion::V5, "holder");
    let (_, ack) = Raw::handshake(broker.addr, connect(ProtocolVersion::V5, "five", true));
    assert_eq!(ack.code, 0x89, "MQTT 5: Server busy");
    let mut old = Raw::open(broker.addr, ProtocolVersion::V311);
    old.send_bytes(&connect_bytes(ProtocolVersion::V311, "three"));
    assert_eq!(
        old.read_to_close(),
        [0x20, 0x02, 0x00, 0x03],
        "3.1.1: Server unavailable"
    );
    assert_eq!(
        admitted.publish("still", b"up", QoS::AtLeastOnce, false),
        Some(0),
        "the admitted client is unharmed"
    );
}

/// B-174: max_connections is one count across every door of every kind: a client
/// on the tcp door takes the one slot from the unix door too.
#[test]
fn max_connections_is_one_count_across_every_door_b174() {
    let dir = common::temp_dir("slots-doors");
    let yaml = common::config(&format!(
        "      unix:\n        path: {{dir}}/m.sock\n{ONE_SLOT}"
    ));
    let broker = Broker::start_in(dir.clone(), &yaml);
    let unix_connect = || {
        let mut s = std::os::unix::net::UnixStream::connect(dir.join("m.sock")).expect("unix");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        std::io::Write::write_all(&mut s, &connect_bytes(ProtocolVersion::V311, "unix"))
            .expect("write");
        let mut head = [0u8; 4];
        s.read_exact(&mut head).expect("a CONNACK");
        head
    };
    let holder = Raw::connected(broker.addr, ProtocolVersion::V5, "holder");
    assert_eq!(
        unix_connect(),
        [0x20, 0x02, 0x00, 0x03],
        "Server unavailable"
    );
    holder.disconnect();
    broker.wait_log("holder disconnected");
    assert_eq!(unix_connect(), [0x20, 0x02, 0x00, 0x00], "the slot is free");
}

#[test]
fn a_silent_socket_in_the_overflow_budget_is_closed_long_before_connect_timeout() {
    // B-052: every socket not admitted is closed within 100 ms of arrival; the
    // connect_timeout (10 s by default) is not what closes it.
    let broker = Broker::start(ONE_SLOT);
    let _admitted = Raw::connected(broker.addr, ProtocolVersion::V5, "holder");
    let mut silent = TcpStream::connect(broker.addr).expect("connect");
    silent.set_read_timeout(Some(WAIT)).expect("timeout");
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = silent.read_to_end(&mut rest);
    assert!(rest.is_empty(), "closed with nothing written: {rest:02X?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed by the overflow deadline, not connect_timeout: {:?}",
        started.elapsed()
    );
}

#[test]
fn a_socket_arriving_while_the_overflow_budget_is_full_is_closed_with_nothing_written() {
    // A-243, B-053: max_connections 1 makes a budget of one place. The first socket
    // past the slot takes it (for at most 100 ms); the next, arriving at once behind
    // it, is closed without a CONNACK even though it sends a well-formed CONNECT. On a
    // machine so loaded that the place was already given back, the second socket is
    // told 0x89 instead; that is retried, and one silent close is required.
    let broker = Broker::start(ONE_SLOT);
    let mut admitted = Raw::connected(broker.addr, ProtocolVersion::V5, "holder");
    let mut silent_closes = 0;
    for attempt in 0..5 {
        let placed = TcpStream::connect(broker.addr).expect("connect");
        let mut shut_out = Raw::open(broker.addr, ProtocolVersion::V5);
        let _ = shut_out.try_send(&Packet::Connect(Box::new(connect(
            ProtocolVersion::V5,
            "shut-out",
            true,
        ))));
        let answer = shut_out.read_to_close();
        drop(placed);
        if answer.is_empty() {
            silent_closes += 1;
            break;
        }
        assert_eq!(
            answer.get(..4),
            Some(&[0x20, 0x03, 0x00, 0x89][..]),
            "attempt {attempt}: only Server busy may be written"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        silent_closes, 1,
        "a socket past the budget is closed silently"
    );
    assert_eq!(
        admitted.publish("still", b"up", QoS::AtLeastOnce, false),
        Some(0)
    );
}

#[test]
fn a_client_that_disconnects_frees_its_slot_for_the_next_at_once() {
    // B-056: the slot is released on reading the client's DISCONNECT, so a socket
    // waiting in the overflow budget (B-049) or arriving next is admitted.
    let broker = Broker::start(ONE_SLOT);
    for round in 0..5 {
        let holder = Raw::connected(broker.addr, ProtocolVersion::V5, &format!("h{round}"));
        holder.disconnect();
        let (_, ack) = Raw::handshake(
            broker.addr,
            connect(ProtocolVersion::V5, &format!("next{round}"), true),
        );
        assert_eq!(ack.code, 0, "round {round}: the freed slot is taken");
    }
}

#[test]
fn a_refused_connect_gives_its_slot_back_before_the_connack() {
    // B-056: a CONNECT refused for its own reasons frees the slot as the broker
    // decides, so a retry with a good CONNECT is admitted straight away.
    let broker = Broker::start(ONE_SLOT);
    for round in 0..5 {
        let mut bad = connect(ProtocolVersion::V5, &format!("bad{round}"), true);
        bad.properties.edit().authentication_method = Some("SCRAM-SHA-1".into());
        let (_, ack) = Raw::handshake(broker.addr, bad);
        assert_eq!(ack.code, 0x8C, "Bad authentication method");
    }
    let (_, ack) = Raw::handshake(broker.addr, connect(ProtocolVersion::V5, "good", true));
    assert_eq!(ack.code, 0);
}

#[test]
fn a_stopping_broker_closes_a_socket_short_of_its_connect_at_once() {
    // B-065: shutdown does not wait out connect_timeout (here 30 s) nor the 5 s it
    // gives connected clients to take their DISCONNECT.
    let broker = Broker::start("  limits:\n    connect_timeout: 30s\n");
    let mut silent = TcpStream::connect(broker.addr).expect("connect");
    silent.set_read_timeout(Some(WAIT)).expect("timeout");
    // Time for the broker to accept it (the accept loop takes it at once).
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    broker.stop();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "stopped without waiting for the silent socket: {:?}",
        started.elapsed()
    );
    let mut rest = Vec::new();
    let _ = silent.read_to_end(&mut rest);
    assert!(rest.is_empty(), "closed with nothing written: {rest:02X?}");
}

#[test]
fn a_connection_taken_over_gives_its_slot_back_before_its_last_write_which_write_timeout_bounds() {
    // B-058: "deaf" stops reading with its socket full. A new connection takes its
    // client id over; the old one owes a DISCONNECT 0x8E it cannot write. Its slot is
    // already free, so a third client is admitted under max_connections 2, and the old
    // socket is closed once write_timeout (4 s) passes without its reader.
    let broker = Broker::start(
        "  limits:\n    max_connections: 2\n    write_timeout: 4s\n    max_message_size: 256KiB\n    max_connect_size: 100KiB\n",
    );
    let mut deaf = Raw::connected(broker.addr, ProtocolVersion::V5, "deaf");
    assert_eq!(
        deaf.subscribe("flood/#", common::opts(QoS::AtMostOnce)),
        [0]
    );
    let mut publisher = Raw::connected(broker.addr, ProtocolVersion::V5, "publisher");
    let payload = vec![b'x'; 200 * 1024];
    for _ in 0..40 {
        assert_eq!(
            publisher.publish("flood/x", &payload, QoS::AtLeastOnce, false),
            Some(0)
        );
    }
    publisher.disconnect();
    let taken_over = Instant::now();
    let (_new_deaf, ack) = Raw::handshake(broker.addr, connect(ProtocolVersion::V5, "deaf", true));
    assert_eq!(ack.code, 0, "the takeover is admitted");
    let (_third, ack) = Raw::handshake(broker.addr, connect(ProtocolVersion::V5, "third", true));
    assert_eq!(
        ack.code, 0,
        "the old connection's slot was given back before its last write"
    );
    assert!(
        taken_over.elapsed() < Duration::from_secs(4),
        "admitted before write_timeout: {:?}",
        taken_over.elapsed()
    );
    broker.wait_log("deaf disconnected: ended by the broker, 0x8E");
    let ended = taken_over.elapsed();
    assert!(
        ended >= Duration::from_secs(3),
        "the last write waited for its reader: {ended:?}"
    );
    drop(deaf);
}
