//! The serving thread waits on async-io's reactor itself (issue 8,
//! `vendor/async-io/SAGUIN-PATCH.md`). Stock async-io's helper thread takes the
//! reactor after about 10 ms without traffic and then hands every socket event to
//! the serving thread through a futex wake; with the patch it stays parked while
//! the broker's one `block_on` runs. And each reactor wait is one `epoll_pwait`
//! (`vendor/polling/SAGUIN-PATCH.md`): stock polling also armed a timerfd and read
//! and re-armed its notifier eventfd around every wait.

mod common;

use std::time::{Duration, Instant};

use common::{Broker, Raw, opts};
use saguin::codec::{ProtocolVersion::V5, QoS};

/// Context switches of the broker's "async-io" thread so far. The thread names
/// itself once it first runs, which on a loaded machine can be after the broker
/// already serves: it is looked for for up to 10 s.
fn helper_switches(pid: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(switches) = named_thread_switches(pid, "async-io") {
            return switches;
        }
        assert!(
            Instant::now() < deadline,
            "the broker has no async-io thread"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Context switches of the thread of `pid` named `name`, if it has one.
fn named_thread_switches(pid: u32, name: &str) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the broker's threads");
    for task in tasks.map_while(Result::ok) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        return Some(
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum(),
        );
    }
    None
}

/// `read(2)` calls the broker has made so far (`syscr` in `/proc/PID/io`). Sockets
/// are read with `recvfrom`, which it does not count.
fn read_calls(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("the broker's I/O counts");
    io.lines()
        .find_map(|l| l.strip_prefix("syscr:")?.trim().parse().ok())
        .expect("a syscr line")
}

/// A publisher and a subscriber at QoS 1, and 40 publishes 15 ms apart: every one
/// is a reactor wait of its own.
fn serve_paced(broker: &Broker, topic: &str, mut between: impl FnMut()) {
    let mut sub = Raw::connected(broker.addr, V5, &format!("{topic}-listener"));
    assert_eq!(sub.subscribe(topic, opts(QoS::AtLeastOnce)), vec![1]);
    let mut publisher = Raw::connected(broker.addr, V5, &format!("{topic}-publisher"));
    between();
    for n in 0..40u8 {
        assert_eq!(
            publisher.publish(topic, &[n], QoS::AtLeastOnce, false),
            Some(0)
        );
        assert_eq!(sub.recv_publish().payload.as_ref(), &[n]);
        std::thread::sleep(Duration::from_millis(15));
    }
}

/// How much `count` (read from the broker's process) grows while it serves
/// [`serve_paced`] traffic on `topic`.
fn grown_over_paced(topic: &str, count: fn(u32) -> u64) -> u64 {
    let broker = Broker::start("");
    let mut before = 0;
    serve_paced(&broker, topic, || before = count(broker.pid()));
    count(broker.pid()) - before
}

#[test]
fn a_reactor_wait_reads_no_notifier() {
    let reads = grown_over_paced("reads", read_calls);
    // Stock polling reads its eventfd after every wait: at least one a publish.
    assert!(
        reads < 20,
        "the broker made {reads} read(2) calls while it served 40 publishes 15 ms apart: \
         the reactor is clearing its notifier on every wait"
    );
}

#[test]
fn the_async_io_helper_stays_parked_while_traffic_with_pauses_is_served() {
    // 15 ms is longer than the ~10 ms of quiet after which stock async-io's helper
    // takes the reactor.
    let switches = grown_over_paced("paced", helper_switches);
    // Stock, the helper wakes several times in every pause and once for every
    // event it hands over: hundreds here.
    assert!(
        switches < 20,
        "async-io's helper thread switched {switches} times while the broker served 40 \
         publishes 15 ms apart: it is taking the reactor from the serving thread"
    );
}
