//! Append throughput at the provider, the shape of RFC 0002's table: each publisher
//! awaits its record's completion (its "PUBACK") before sending the next 128-byte record.
//!
//! Run with one command:
//!
//! ```sh
//! cargo test --release --test storage_bench -- --ignored --nocapture
//! ```
//!
//! This measures storage alone (no sockets, no codec), so its figures are an upper bound
//! on the broker's; what it shows is the shape: a transaction per publish is flat, and
//! collecting without waiting grows with the publishers.

mod storage_support;

use std::cell::Cell;
use std::time::{Duration, Instant};

use saguin::storage::{
    ChannelSettings, CommitMode, MemorySettings, Provider, ProviderSettings, SqliteSettings,
};
use storage_support::{rec, temp_dir};

const RUN: Duration = Duration::from_millis(1500);

fn provider(kind: &str, publishers: usize) -> Provider {
    let dir = temp_dir("bench");
    let mut s = SqliteSettings::new("bench", dir.join("bench.db"), 1 << 30, 1 << 20);
    let settings = match kind {
        "sqlite, keys absent" => ProviderSettings::Sqlite(s),
        "sqlite, interval none" => {
            s.commit = CommitMode::PerPublish;
            ProviderSettings::Sqlite(s)
        }
        "sqlite, 2ms + count=publishers" => {
            s.commit = CommitMode::Interval {
                interval: Duration::from_millis(2),
                max_records: publishers.max(2),
            };
            ProviderSettings::Sqlite(s)
        }
        _ => ProviderSettings::Memory(MemorySettings {
            name: "bench".into(),
            max_bytes: 1 << 30,
            reserve_bytes: 1 << 20,
            snapshot_dir: None,
        }),
    };
    Provider::open(&settings).unwrap()
}

fn rate(kind: &str, publishers: usize) -> f64 {
    let p = provider(kind, publishers);
    let done = Cell::new(0u64);
    let ex = smol::LocalExecutor::new();
    let (p, done_ref) = (&p, &done);
    smol::block_on(ex.run(async {
        p.open_channel("bench", ChannelSettings::append())
            .await
            .unwrap();
        let start = Instant::now();
        let tasks: Vec<_> = (0..publishers)
            .map(|n| {
                ex.spawn(async move {
                    let mut i = 0u64;
                    while start.elapsed() < RUN {
                        p.append("bench", rec("bench/x", &[n as u8; 128], i))
                            .await
                            .unwrap();
                        done_ref.set(done_ref.get() + 1);
                        i += 1;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        done.get() as f64 / start.elapsed().as_secs_f64()
    }))
}

#[test]
#[ignore = "benchmark: cargo test --release --test storage_bench -- --ignored --nocapture"]
fn append_throughput() {
    let kinds = [
        "sqlite, interval none",
        "sqlite, keys absent",
        "sqlite, 2ms + count=publishers",
        "memory",
    ];
    println!("| publishers | {} |", kinds.join(" | "));
    println!("|---|{}", "---|".repeat(kinds.len()));
    for publishers in [1, 8, 32, 256] {
        let cells: Vec<String> = kinds
            .iter()
            .map(|k| format!("{:.0}/s", rate(k, publishers)))
            .collect();
        println!("| {publishers} | {} |", cells.join(" | "));
    }
}
