//! Relay across bridges (RFC 0002 "Loops, and what stops one"): which way a link was
//! dialled decides whether a record goes onward, and re-origination is how a broker
//! meant to relay does so. Four Sagüins on loopback; `tests/bridges.rs` has the rest.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Broker, Raw, opts};
use saguin::codec::{ProtocolVersion::V5, QoS};

/// A broker with `bridges` (a `bridges:` block, or nothing) after the smallest
/// configuration.
fn broker(bridges: &str) -> Broker {
    Broker::start_with(&format!("{}{bridges}", common::config("")))
}

/// Waits until `broker` has logged a line containing each of `needles`, in any order.
fn wait_for_all(broker: &Broker, needles: &[&str]) {
    let mut left: Vec<&str> = needles.to_vec();
    while !left.is_empty() {
        let line = broker.wait_log("bridge ");
        left.retain(|n| !line.contains(n));
    }
}

fn out_rule(name: &str, peer: SocketAddr, client_id: &str, filters: &[&str]) -> String {
    let mut s =
        format!("  {name}:\n    peer: tcp://{peer}\n    client_id: {client_id}\n    topics:\n");
    for f in filters {
        let topic = f.replace('#', "$#");
        s.push_str(&format!(
            "      - filter: {f}\n        topic: {topic}\n        direction: out\n"
        ));
    }
    s
}

/// B-401, C-231: a record a peer's out rule pushed here is an ordinary client
/// publish, so this broker's out rule forwards it onward; a record this broker's
/// in rule pulled in is never forwarded, and relaying it takes re-publishing it as
/// this broker's own (re-origination).
#[test]
fn a_pushed_record_is_relayed_and_a_pulled_one_only_when_republished_b401_c231() {
    let cloud = broker("");
    let pulled_from = broker("");
    let hub = broker(&format!(
        "bridges:\n{}  pull:\n    peer: tcp://{}\n    client_id: hub-pull\n    topics:\n      - filter: p/#\n        topic: p/$#\n        direction: in\n",
        out_rule("cloud", cloud.addr, "hub-up", &["t/#", "p/#"]),
        pulled_from.addr
    ));
    wait_for_all(&hub, &["bridge cloud: connected", "bridge pull: SUBACK"]);
    let pusher = broker(&format!(
        "bridges:\n{}",
        out_rule("hub", hub.addr, "edge-up", &["t/#"])
    ));
    pusher.wait_log("bridge hub: connected");

    let mut at_cloud = Raw::connected(cloud.addr, V5, "cloud-reader");
    assert_eq!(at_cloud.subscribe("#", opts(QoS::AtLeastOnce)), [1]);
    let mut at_hub = Raw::connected(hub.addr, V5, "relay");
    assert_eq!(at_hub.subscribe("p/#", opts(QoS::AtLeastOnce)), [1]);

    // Pushed by the edge's own out rule: onward to the cloud.
    let mut device = Raw::connected(pusher.addr, V5, "device");
    assert_eq!(
        device.publish("t/x", b"pushed", QoS::AtLeastOnce, false),
        Some(0)
    );
    let got = at_cloud.recv_publish();
    assert_eq!((&*got.topic, &*got.payload), ("t/x", &b"pushed"[..]));

    // Pulled in by the hub's in rule: kept at the hub, stopped there.
    let mut far = Raw::connected(pulled_from.addr, V5, "far-device");
    assert_eq!(
        far.publish("p/x", b"pulled", QoS::AtLeastOnce, false),
        Some(0)
    );
    let arrived = at_hub.recv_publish();
    assert_eq!(
        (&*arrived.topic, &*arrived.payload),
        ("p/x", &b"pulled"[..])
    );
    at_cloud.expect_nothing(Duration::from_millis(800));

    // Re-originated: published again at the hub as the relay's own, it goes onward.
    assert_eq!(
        at_hub.publish("p/x", &arrived.payload, QoS::AtLeastOnce, false),
        Some(0)
    );
    let relayed = at_cloud.recv_publish();
    assert_eq!(
        (&*relayed.topic, &*relayed.payload),
        ("p/x", &b"pulled"[..])
    );
}
