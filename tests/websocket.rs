//! MQTT over WebSocket (`broker.mqtt.listen.ws`): the upgrade, the `mqtt` subprotocol,
//! origin checks (B-160..B-168), binary framing, and the slot rules for ws sockets
//! (A-243, B-059), against the broker binary with tungstenite as the client.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{Broker, Raw, WAIT, connect, opts, publish};
use saguin::codec::{self, Packet, ProtocolVersion, QoS};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

const WS_DOOR: &str = "      ws:\n        address: 127.0.0.1:0\n";

/// The ws door's address, from the broker's log.
fn ws_addr(broker: &Broker) -> SocketAddr {
    let line = broker.wait_log("listening on ws://");
    line.split("ws://")
        .nth(1)
        .and_then(|a| a.trim().parse().ok())
        .expect("a ws address")
}

/// Opens a WebSocket to `addr` offering the `mqtt` subprotocol, with `origin` if any.
fn open(
    addr: SocketAddr,
    origin: Option<&str>,
) -> Result<(WebSocket<TcpStream>, Option<String>), tungstenite::Error> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    open_over(stream, addr, origin)
}

/// Upgrades `stream`, connected to `addr`, as [`open`] does.
fn open_over<S: std::io::Read + std::io::Write>(
    stream: S,
    addr: SocketAddr,
    origin: Option<&str>,
) -> Result<(WebSocket<S>, Option<String>), tungstenite::Error> {
    let mut request = format!("ws://{addr}/mqtt")
        .into_client_request()
        .expect("a request");
    let headers = request.headers_mut();
    headers.insert(
        "sec-websocket-protocol",
        "mqtt".parse().expect("a header value"),
    );
    if let Some(origin) = origin {
        headers.insert("origin", origin.parse().expect("a header value"));
    }
    let (ws, response) = tungstenite::client(request, stream).map_err(|e| match e {
        tungstenite::HandshakeError::Failure(e) => e,
        tungstenite::HandshakeError::Interrupted(_) => {
            tungstenite::Error::Io(std::io::ErrorKind::WouldBlock.into())
        }
    })?;
    let protocol = response
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok((ws, protocol))
}

/// A WebSocket MQTT client: packets out as binary messages, packets in from them.
struct WsClient {
    ws: WebSocket<TcpStream>,
    buf: Vec<u8>,
}

impl WsClient {
    fn connected(addr: SocketAddr, client_id: &str) -> WsClient {
        let (ws, _) = open(addr, None).expect("upgrade");
        let mut client = WsClient {
            ws,
            buf: Vec::new(),
        };
        client.send(&Packet::Connect(Box::new(connect(
            ProtocolVersion::V5,
            client_id,
            true,
        ))));
        match client.recv() {
            Packet::ConnAck(ack) => assert_eq!(ack.code, 0),
            other => panic!("expected CONNACK, got {other:?}"),
        }
        client
    }

    fn send(&mut self, packet: &Packet) {
        let mut out = Vec::new();
        codec::encode(packet, ProtocolVersion::V5, &mut out);
        self.ws.send(Message::binary(out)).expect("send");
    }

    fn recv(&mut self) -> Packet {
        loop {
            if let Some(header) = codec::read_fixed_header(&self.buf).expect("a header") {
                let total = header.header_len + header.remaining_length;
                if self.buf.len() >= total {
                    let packet = codec::decode(
                        header.first_byte,
                        &self.buf[header.header_len..total],
                        ProtocolVersion::V5,
                    )
                    .expect("a packet");
                    self.buf.drain(..total);
                    return packet;
                }
            }
            match self.ws.read().expect("a message") {
                Message::Binary(data) => self.buf.extend_from_slice(&data),
                other => panic!("expected a binary message, got {other:?}"),
            }
        }
    }
}

#[test]
fn an_mqtt_client_over_websocket_publishes_and_subscribes_beside_tcp_clients() {
    let broker = Broker::start(WS_DOOR);
    let addr = ws_addr(&broker);
    let (_, protocol) = open(addr, None).expect("upgrade");
    assert_eq!(
        protocol.as_deref(),
        Some("mqtt"),
        "the subprotocol is echoed"
    );

    let mut ws = WsClient::connected(addr, "browser");
    let sub = codec::Subscribe {
        packet_id: 1,
        filters: vec![("plant/#".into(), opts(QoS::AtLeastOnce))],
        properties: Default::default(),
    };
    ws.send(&Packet::Subscribe(sub));
    assert!(matches!(ws.recv(), Packet::SubAck(a) if a.codes == [1]));

    let mut tcp = Raw::connected(broker.addr, ProtocolVersion::V5, "plc");
    tcp.subscribe("hmi/#", opts(QoS::AtLeastOnce));
    assert_eq!(
        tcp.publish("plant/pump", b"on", QoS::AtLeastOnce, false),
        Some(0)
    );
    match ws.recv() {
        Packet::Publish(p) => {
            assert_eq!((&*p.topic, &*p.payload), ("plant/pump", &b"on"[..]));
            ws.send(&Packet::PubAck(codec::Ack::new(
                p.packet_id.expect("QoS 1"),
                0,
            )));
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
    // A large payload reaches a WebSocket subscriber whole (its headers and payload
    // leave in separate writes, so in separate messages).
    let big_down = vec![3u8; 40 * 1024];
    assert_eq!(
        tcp.publish("plant/big", &big_down, QoS::AtMostOnce, false),
        None
    );
    match ws.recv() {
        Packet::Publish(p) => {
            assert_eq!((&*p.topic, p.payload.len()), ("plant/big", big_down.len()))
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
    // A 64 KiB payload crosses in one message the other way.
    let big = vec![7u8; 64 * 1024];
    let mut p = publish("hmi/screen", &big, QoS::AtLeastOnce, false);
    p.packet_id = Some(9);
    ws.send(&Packet::Publish(p));
    assert!(matches!(ws.recv(), Packet::PubAck(a) if a.code == 0));
    assert_eq!(tcp.recv_publish().payload.len(), big.len());
}

#[test]
fn a_page_from_another_origin_is_refused_403_and_one_without_origin_is_admitted() {
    // B-160: same_origin (the default) wants the page's scheme, host and port to be
    // the request's own; B-164: no Origin header is admitted.
    let broker = Broker::start(WS_DOOR);
    let addr = ws_addr(&broker);
    match open(addr, Some("http://evil.example:80")) {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 403),
        other => panic!("expected a 403, got {:?}", other.map(|_| ())),
    }
    // B-167: logged at warn with its origin.
    let line = broker.wait_log("WebSocket upgrade");
    assert!(
        line.contains("WARN") && line.contains("evil.example"),
        "{line}"
    );
    assert!(open(addr, Some(&format!("http://{addr}"))).is_ok());
    assert!(
        open(addr, Some(&format!("https://{addr}"))).is_err(),
        "scheme"
    );
    assert!(open(addr, None).is_ok());
}

/// B-028: SIGUSR1 re-reads the ws door's allowed_origins.
#[test]
fn allowed_origins_admit_only_the_listed_pages_and_sigusr1_rereads_them() {
    // B-161, B-165, B-168.
    let dir = common::temp_dir("ws-origins");
    let door = "      ws:\n        address: 127.0.0.1:0\n        same_origin: false\n        allowed_origins: [\"https://hmi.example\"]\n";
    let yaml = common::config(door);
    let broker = Broker::start_in(dir.clone(), &yaml);
    let addr = ws_addr(&broker);
    assert!(open(addr, Some("https://hmi.example")).is_ok());
    assert!(open(addr, Some("https://hmi.example:443")).is_ok());
    assert!(
        open(addr, Some("https://hmi.example:8443")).is_err(),
        "another port is another origin"
    );
    assert!(open(addr, Some("https://other.example")).is_err());
    std::fs::write(
        dir.join("saguin.yaml"),
        yaml.replace("https://hmi.example", "https://other.example"),
    )
    .expect("edit");
    broker.signal("USR1");
    broker.wait_log("SIGUSR1: log_level");
    assert!(open(addr, Some("https://other.example")).is_ok());
    assert!(open(addr, Some("https://hmi.example")).is_err());
}

#[test]
fn a_text_message_ends_the_connection() {
    // MQTT-6.0.0-1: MQTT travels in binary messages.
    let broker = Broker::start(WS_DOOR);
    let addr = ws_addr(&broker);
    let mut client = WsClient::connected(addr, "texter");
    client
        .ws
        .send(Message::text("not mqtt"))
        .expect("send text");
    let ended = (0..10).any(|_| match client.ws.read() {
        Ok(_) => false,
        // A read that timed out is a connection still open, not an ended one.
        Err(tungstenite::Error::Io(e)) if timed_out(&e) => {
            panic!("the connection was not ended within {WAIT:?}")
        }
        Err(_) => true,
    });
    assert!(ended, "the broker closes the connection");
}

#[test]
fn past_max_connections_a_ws_socket_is_closed_with_nothing_written() {
    // A-243, B-059: a ws socket gets a slot at accept or nothing: no overflow place,
    // no HTTP answer.
    let broker = Broker::start(&format!("{WS_DOOR}  limits:\n    max_connections: 1\n"));
    let addr = ws_addr(&broker);
    let _holder = Raw::connected(broker.addr, ProtocolVersion::V5, "holder");
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let _ = std::io::Write::write_all(
        &mut stream,
        b"GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    );
    let mut answer = Vec::new();
    // Closed, or reset: either ends the read; a read that timed out does not.
    if let Err(e) = stream.read_to_end(&mut answer) {
        assert!(!timed_out(&e), "not closed within {WAIT:?}");
    }
    assert!(answer.is_empty(), "nothing written: {answer:?}");
}

/// Whether a read gave up for time rather than ended.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

#[test]
fn a_request_that_is_no_upgrade_is_refused_and_the_broker_serves_on() {
    let broker = Broker::start(WS_DOOR);
    let addr = ws_addr(&broker);
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    std::io::Write::write_all(&mut stream, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
    std::thread::sleep(Duration::from_millis(50));
    let _ = WsClient::connected(addr, "after");
}

/// B-060: an otherwise valid upgrade over HTTP/1.0 is refused 505.
#[test]
fn an_upgrade_over_http_1_0_is_refused_505_b060() {
    let broker = Broker::start(WS_DOOR);
    let addr = ws_addr(&broker);
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let request = format!(
        "GET /mqtt HTTP/1.0\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
    );
    std::io::Write::write_all(&mut stream, request.as_bytes()).expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 505"), "{answer}");
    std::thread::sleep(Duration::from_millis(50));
    let _ = WsClient::connected(addr, "after");
}

#[test]
fn a_ws_door_with_tls_serves_wss_and_its_same_origin_is_https() {
    // B-160, B-169: on a TLS listener a same-origin page is https.
    use common::tls::{BOTH, Ca, client, tls_dir};
    let ca = Ca::new("test-ca");
    let door = "      ws:\n        address: 127.0.0.1:0\n        tls:\n          cert_file: {dir}/server.pem\n          key_file: {dir}/server-key.pem\n";
    let broker = Broker::start_in(tls_dir("wss", &ca), &common::config(door));
    let addr = ws_addr(&broker);
    let config = client(&ca, None, BOTH);
    let https = format!("https://{addr}");
    let (mut ws, protocol) = open_over(common::tls::open(addr, config.clone()), addr, Some(&https))
        .expect("upgrade over TLS");
    assert_eq!(protocol.as_deref(), Some("mqtt"));
    let mut out = Vec::new();
    codec::encode(
        &Packet::Connect(Box::new(connect(ProtocolVersion::V5, "wss", true))),
        ProtocolVersion::V5,
        &mut out,
    );
    ws.send(Message::binary(out)).expect("send CONNECT");
    match ws.read().expect("CONNACK") {
        Message::Binary(data) => {
            let header = codec::read_fixed_header(&data)
                .expect("a header")
                .expect("whole");
            let body = &data[header.header_len..header.header_len + header.remaining_length];
            match codec::decode(header.first_byte, body, ProtocolVersion::V5) {
                Ok(Packet::ConnAck(ack)) => assert_eq!(ack.code, 0),
                other => panic!("expected CONNACK, got {other:?}"),
            }
        }
        other => panic!("expected a binary message, got {other:?}"),
    }
    let http = format!("http://{addr}");
    assert!(
        open_over(common::tls::open(addr, config), addr, Some(&http)).is_err(),
        "an http page is not this TLS door's own origin"
    );
}

/// Runs `write` in a loop on one thread, discarding whatever comes back on another,
/// until the broker closes the socket or `for_at_most` passes; returns whether the
/// broker closed it.
fn flood(
    stream: &TcpStream,
    bytes: Vec<u8>,
    for_at_most: Duration,
) -> std::thread::JoinHandle<bool> {
    use std::io::Write;
    let mut reader = stream.try_clone().expect("clone");
    std::thread::spawn(move || {
        let mut sink = [0u8; 4096];
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    });
    let mut writer = stream.try_clone().expect("clone");
    std::thread::spawn(move || {
        let until = std::time::Instant::now() + for_at_most;
        while std::time::Instant::now() < until {
            if writer.write_all(&bytes).is_err() {
                return true;
            }
        }
        false
    })
}

/// B-062, B-063: a peer streaming WebSocket pings before its CONNECT holds up no
/// other client, and is still closed at connect_timeout.
#[test]
fn a_peer_streaming_pings_before_connect_holds_up_nobody_b062() {
    let broker = Broker::start(&format!("{WS_DOOR}  limits:\n    connect_timeout: 1s\n"));
    let addr = ws_addr(&broker);
    let (ws, _) = open(addr, None).expect("upgrade");
    // Masked pings with no payload, a thousand to a write.
    let pings = [0x89u8, 0x80, 0, 0, 0, 0].repeat(1000);
    let flooding = flood(ws.get_ref(), pings, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let mut other = Raw::connected(broker.addr, ProtocolVersion::V5, "bystander");
    other.send(&Packet::PingReq);
    assert!(matches!(other.recv(), Packet::PingResp));
    assert!(
        flooding.join().expect("the flood"),
        "closed at connect_timeout"
    );
}

/// B-044, B-045: a ws subscriber's backlog written at once is not one WebSocket
/// message past the write bound (max_message_size + 64 KiB), which would end the
/// connection: a resumed session is sent its 1,000 queued publishes whole.
#[test]
fn a_resumed_ws_session_gets_a_backlog_larger_than_a_message_bound() {
    let broker = Broker::start(&format!(
        "{WS_DOOR}  limits:\n    max_message_size: 4KiB\n    session_queue_bytes: 1MiB\n"
    ));
    let addr = ws_addr(&broker);
    let session = |clean| {
        let (ws, _) = open(addr, None).expect("upgrade");
        let mut client = WsClient {
            ws,
            buf: Vec::new(),
        };
        let mut c = connect(ProtocolVersion::V5, "slow-page", clean);
        c.properties.edit().session_expiry_interval = Some(600);
        client.send(&Packet::Connect(Box::new(c)));
        assert!(matches!(client.recv(), Packet::ConnAck(a) if a.code == 0));
        client
    };
    let mut ws = session(true);
    ws.send(&Packet::Subscribe(codec::Subscribe {
        packet_id: 1,
        filters: vec![("feed/#".into(), opts(QoS::AtLeastOnce))],
        properties: Default::default(),
    }));
    assert!(matches!(ws.recv(), Packet::SubAck(_)));
    ws.send(&Packet::Disconnect(codec::Disconnect::new(0)));
    drop(ws);
    let mut publisher = Raw::connected(broker.addr, ProtocolVersion::V5, "feeder");
    for i in 0..1000u32 {
        publisher.publish("feed/x", &[i as u8; 100], QoS::AtLeastOnce, false);
    }
    let mut ws = session(false);
    for _ in 0..1000 {
        match ws.recv() {
            Packet::Publish(_) => {}
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
}

/// B-065: a stop does not wait out an upgrade request that never comes.
#[test]
fn a_stopping_broker_ends_a_silent_upgrade_at_once() {
    let broker = Broker::start(&format!("{WS_DOOR}  limits:\n    connect_timeout: 30s\n"));
    let silent = TcpStream::connect(ws_addr(&broker)).expect("connect");
    std::thread::sleep(Duration::from_millis(100));
    let started = std::time::Instant::now();
    broker.stop();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "stopped without waiting for the silent upgrade: {:?}",
        started.elapsed()
    );
    drop(silent);
}

/// RFC 6455 5.5.1: the broker answers a Close frame with one, and ends a connection
/// of its own accord (here DISCONNECT 0x81 for a malformed packet) with one too, so a
/// browser sees a clean close rather than 1006.
#[test]
fn a_ws_connection_ends_with_a_close_frame_either_way() {
    let broker = Broker::start(WS_DOOR);
    let addr = ws_addr(&broker);
    let closed_with_frame = |client: &mut WsClient| {
        (0..10).any(|_| match client.ws.read() {
            Ok(Message::Close(_)) => true,
            Ok(_) => false,
            Err(tungstenite::Error::ConnectionClosed) => false,
            Err(e) => panic!("no Close frame before the end: {e}"),
        })
    };
    let mut leaving = WsClient::connected(addr, "leaving");
    leaving.ws.close(None).expect("send Close");
    assert!(closed_with_frame(&mut leaving), "the Close is answered");

    let mut malformed = WsClient::connected(addr, "malformed");
    // A PUBLISH whose topic length runs past its remaining length.
    malformed
        .ws
        .send(Message::binary(vec![0x30, 0x03, 0x00, 0x09, b'x']))
        .expect("send");
    match malformed.recv() {
        Packet::Disconnect(d) => assert_eq!(d.code, 0x81),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
    assert!(closed_with_frame(&mut malformed), "DISCONNECT, then Close");
}

/// a packet past max_message_size in one WebSocket message is told 0x95, as
/// over TCP, though the WebSocket layer refuses the message before the packet is read.
#[test]
fn an_oversize_packet_in_one_ws_message_is_told_0x95() {
    let broker = Broker::start(&format!(
        "{WS_DOOR}  limits:\n    max_message_size: 256KiB\n    max_connect_size: 100KiB\n"
    ));
    let mut client = WsClient::connected(ws_addr(&broker), "oversize");
    let mut out = Vec::new();
    let p = publish("big", &vec![0u8; 400 * 1024], QoS::AtMostOnce, false);
    codec::encode(&Packet::Publish(p), ProtocolVersion::V5, &mut out);
    client.ws.send(Message::binary(out)).expect("send");
    match client.recv() {
        Packet::Disconnect(d) => assert_eq!(d.code, 0x95),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
}
