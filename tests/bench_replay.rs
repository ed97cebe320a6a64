//! Replay throughput (issue 5): records a second delivered to one QoS 1 consumer
//! catching up on a channel, from sqlite and from memory, beside live broadcast QoS 1
//! throughput through the same client. A measurement, not a test: it asserts only
//! that everything arrived, and runs on demand:
//!
//!     cargo test --release --test bench_replay -- --ignored --nocapture
//!
//! `SAGUIN_REPLAY_RECORDS` sets the record count (default 100000).

mod common;

use std::time::Instant;

use common::{Raw, opts, start_with_channels};
use saguin::codec::{Ack, Packet, ProtocolVersion::V5, QoS};

fn records() -> u32 {
    std::env::var("SAGUIN_REPLAY_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// Publishes `n` QoS 1 records of 128 bytes, keeping 256 unacknowledged.
fn fill(publisher: &mut Raw, prefix: &str, n: u32) {
    let payload = [b'x'; 128];
    let mut in_flight = 0u32;
    for i in 0..n {
        let mut p = common::publish(
            &format!("{prefix}/{}", i % 64),
            &payload,
            QoS::AtLeastOnce,
            false,
        );
        p.packet_id = Some(u16::try_from(i % 60_000 + 1).expect("fits"));
        publisher.send(&Packet::Publish(p));
        in_flight += 1;
        while in_flight >= 256 {
            if let Packet::PubAck(_) = publisher.recv() {
                in_flight -= 1;
            }
        }
    }
    while in_flight > 0 {
        if let Packet::PubAck(_) = publisher.recv() {
            in_flight -= 1;
        }
    }
}

/// Receives `n` QoS 1 publishes, acknowledging each, and returns records a second.
fn drain(reader: &mut Raw, n: u32) -> f64 {
    let started = Instant::now();
    for _ in 0..n {
        match reader.recv() {
            Packet::Publish(p) => {
                if let Some(id) = p.packet_id {
                    reader.send(&Packet::PubAck(Ack::new(id, 0)));
                }
            }
            other => panic!("{other:?}"),
        }
    }
    f64::from(n) / started.elapsed().as_secs_f64()
}

#[test]
#[ignore = "a benchmark; run with --ignored --nocapture"]
fn replay_throughput_from_sqlite_and_memory_beside_broadcast() {
    let n = records();
    let broker = start_with_channels();
    let mut publisher = Raw::connected(broker.addr, V5, "filler");
    let mut report = Vec::new();
    for (name, prefix) in [
        ("append on sqlite", "events"),
        ("append on memory", "memlog"),
    ] {
        fill(&mut publisher, prefix, n);
        let mut reader = Raw::connected(broker.addr, V5, &format!("replayer-{prefix}"));
        reader.subscribe(&format!("{prefix}/#"), opts(QoS::AtLeastOnce));
        report.push((name, drain(&mut reader, n)));
    }
    let mut subscriber = Raw::connected(broker.addr, V5, "live");
    subscriber.subscribe("live/#", opts(QoS::AtLeastOnce));
    let filler = std::thread::spawn({
        let addr = broker.addr;
        move || {
            let mut publisher = Raw::connected(addr, V5, "live-publisher");
            fill(&mut publisher, "live", n);
        }
    });
    report.push(("broadcast QoS 1, live", drain(&mut subscriber, n)));
    filler.join().expect("publisher");
    println!("\n| {n} records of 128 B to one QoS 1 consumer | records/s |\n|---|---|");
    for (name, rate) in report {
        println!("| {name} | {rate:.0} |");
    }
}
