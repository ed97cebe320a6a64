//! The serving thread waits on async-io's reactor itself (issue 8,
//! `vendor/async-io/SAGUIN-PATCH.md`). Stock async-io's helper thread takes the
//! reactor after about 10 ms without traffic and then hands every socket event to
//! the serving thread through a futex wake; with the patch it stays parked while
//! the broker's one `block_on` runs.

mod common;

use std::time::Duration;

use common::{Broker, Raw, opts};
use saguin::codec::{ProtocolVersion::V5, QoS};

/// Context switches of the broker's "async-io" thread so far.
fn helper_switches(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the broker's threads");
    for task in tasks.map_while(Result::ok) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "async-io" {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).expect("thread status");
        return status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
    }
    panic!("the broker has no async-io thread");
}

#[test]
fn the_async_io_helper_stays_parked_while_traffic_with_pauses_is_served() {
    let broker = Broker::start("");
    let mut sub = Raw::connected(broker.addr, V5, "listener");
    assert_eq!(sub.subscribe("paced", opts(QoS::AtLeastOnce)), vec![1]);
    let mut publisher = Raw::connected(broker.addr, V5, "paced-publisher");
    let before = helper_switches(broker.pid());
    for n in 0..40u8 {
        assert_eq!(
            publisher.publish("paced", &[n], QoS::AtLeastOnce, false),
            Some(0)
        );
        assert_eq!(sub.recv_publish().payload.as_ref(), &[n]);
        // Longer than the ~10 ms of quiet after which stock async-io's helper
        // takes the reactor.
        std::thread::sleep(Duration::from_millis(15));
    }
    let switches = helper_switches(broker.pid()) - before;
    // Stock, the helper wakes several times in every pause and once for every
    // event it hands over: hundreds here.
    assert!(
        switches < 20,
        "async-io's helper thread switched {switches} times while the broker served 40 \
         publishes 15 ms apart: it is taking the reactor from the serving thread"
    );
}
