//! The queue counters on the operations listener's /metrics (issue 6; gaps section 4:
//! `saguin_queue_*`; A-193 `saguin_queue_retain_ignored_total`).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{Broker, Raw, opts};
use saguin::codec::{ProtocolVersion::V5, QoS};

const EXTRA: &str = "  operations:
    listen:
      unix:
        path: {dir}/ops.sock
channels:
  jobs:
    type: queue
    filter: jobs/#
    retry:
      max_attempts: 1
";

fn metrics(broker: &Broker) -> String {
    let mut s = UnixStream::connect(broker.dir.join("ops.sock")).expect("the ops socket");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

fn line_value(text: &str, prefix: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The counters move as jobs are offered, acknowledged, returned and dead-lettered, and
/// a retained publish into a queue is counted as ignored (C-214).
#[test]
fn queue_counters_follow_the_work() {
    let dir = common::temp_dir("queue-metrics");
    let broker = Broker::start_in(dir, &common::config(EXTRA));
    let mut p = Raw::connected(broker.addr, V5, "producer");
    assert_eq!(p.publish("jobs/1", b"1", QoS::AtLeastOnce, true), Some(0));
    assert_eq!(p.publish("jobs/2", b"2", QoS::AtLeastOnce, false), Some(0));
    let mut w = Raw::connected(broker.addr, V5, "w");
    assert_eq!(
        w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    let first = w.recv_offer();
    w.puback(&first);
    w.answer(&first, b"ack");
    let second = w.recv_offer();
    w.puback(&second);
    w.answer(&second, b"return");
    // Counted as the line is logged (a scrape is cached: one, once it is).
    broker.wait_log("returned by w");
    let text = metrics(&broker);
    let get =
        |prefix: &str| line_value(&text, prefix).unwrap_or_else(|| panic!("{prefix} in {text}"));
    assert_eq!(get("saguin_queue_delivered_total{channel=\"jobs\"}"), 2);
    assert_eq!(get("saguin_queue_acknowledged_total{channel=\"jobs\"}"), 1);
    assert_eq!(get("saguin_queue_returned_total{channel=\"jobs\"}"), 1);
    assert_eq!(
        get("saguin_queue_dead_lettered_total{channel=\"jobs\",reason=\"attempts_exhausted\"}"),
        1
    );
    assert_eq!(
        get("saguin_queue_retain_ignored_total{channel=\"jobs\"}"),
        1
    );
    assert_eq!(
        get("saguin_queue_depth{channel=\"jobs\",state=\"available\"}"),
        0
    );
}
