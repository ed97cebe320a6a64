//! Queue figures for BENCHMARKS.md (issue 6; C-069). Ignored by default; run with
//! `cargo test --profile measure --test queue_bench -- --ignored --nocapture`.

mod common;

use std::time::{Duration, Instant};

use common::{Broker, Raw, opts, temp_dir};
use saguin::codec::{ProtocolVersion::V5, QoS};

fn config(storage: &str) -> String {
    format!(
        "broker:
  id: bench
  log_level: info
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:0
  storage:
    default: {storage}
    default_retention_period: none
    default_retention_bytes: none
    providers:
      disk:
        type: sqlite
        file_path: {{dir}}/saguin.db
      ram:
        type: memory
        max_bytes: 256MiB
        snapshot_dir: none
channels:
  jobs:
    type: queue
    filter: jobs/#
"
    )
}

fn backlog(broker: &Broker, n: usize) {
    let mut p = Raw::connected(broker.addr, V5, "producer");
    for i in 0..n {
        assert_eq!(
            p.publish(&format!("jobs/{i}"), b"job", QoS::AtLeastOnce, false),
            Some(0)
        );
    }
}

/// One worker doing no work: answers `ack` then acknowledges the PUBLISH, as Paho does.
fn drain(broker: &Broker, id: &str, receive_maximum: Option<u16>, jobs: usize) -> Duration {
    let mut w = Raw::connected_with_receive_maximum(broker.addr, id, receive_maximum);
    let started = Instant::now();
    assert_eq!(
        w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
        [1]
    );
    for _ in 0..jobs {
        let offer = w.recv_offer();
        w.answer(&offer, b"ack");
        w.puback(&offer);
    }
    started.elapsed()
}

/// C-069: a 300-job backlog drained by one worker, at Receive Maximum 1, 2 and unset.
#[test]
#[ignore]
fn drain_a_300_job_backlog() {
    for storage in ["disk", "ram"] {
        for rm in [Some(1), Some(2), None] {
            let mut runs = Vec::new();
            for run in 0..3 {
                let broker = Broker::start_in(temp_dir("bench"), &config(storage));
                backlog(&broker, 300);
                let took = drain(&broker, &format!("w{run}"), rm, 300);
                runs.push(took.as_millis());
            }
            println!("drain 300 storage={storage} receive_maximum={rm:?} ms={runs:?}");
        }
    }
}

/// Jobs per second with 1, 4 and 16 workers over a preloaded backlog.
#[test]
#[ignore]
fn throughput_by_worker_count() {
    const JOBS: usize = 3000;
    for storage in ["disk", "ram"] {
        for workers in [1usize, 4, 16] {
            let broker = Broker::start_in(temp_dir("bench"), &config(storage));
            backlog(&broker, JOBS);
            let addr = broker.addr;
            let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let finished = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
            let started = Instant::now();
            let handles: Vec<_> = (0..workers)
                .map(|i| {
                    let done = done.clone();
                    let finished = finished.clone();
                    std::thread::spawn(move || {
                        let mut w = Raw::connected(addr, V5, &format!("w{i}"));
                        assert_eq!(
                            w.subscribe("$saguin/queue/jobs", opts(QoS::AtLeastOnce)),
                            [1]
                        );
                        while done.load(std::sync::atomic::Ordering::SeqCst) < JOBS {
                            w.set_timeout(Duration::from_millis(500));
                            let Ok(saguin::codec::Packet::Publish(offer)) = w.try_recv() else {
                                continue;
                            };
                            w.answer(&offer, b"ack");
                            w.puback(&offer);
                            if done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == JOBS {
                                *finished.lock().expect("lock") = Some(Instant::now());
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("a worker thread");
            }
            let end = finished.lock().expect("lock").unwrap_or_else(Instant::now);
            let took = end - started;
            println!(
                "throughput storage={storage} workers={workers} jobs={JOBS} ms={} jobs_per_s={:.0}",
                took.as_millis(),
                JOBS as f64 / took.as_secs_f64()
            );
        }
    }
}
