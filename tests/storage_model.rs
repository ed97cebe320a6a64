//! Both kinds behind one interface must answer alike: random sequences of operations
//! are run on a sqlite and a memory provider side by side, and every answer and every
//! channel's contents are compared.

mod storage_support;

use std::time::Duration;

use proptest::prelude::*;
use saguin::storage::{
    Attempts, ChannelKind, ChannelSettings, MemorySettings, Provider, ProviderSettings, Retention,
    SqliteSettings,
};
use storage_support::{all, rec, temp_dir, to_dlq};

#[derive(Debug, Clone)]
enum Op {
    Append {
        channel: usize,
        topic: u8,
        len: usize,
        ts: u64,
    },
    Attempt {
        offset: u64,
        after: u64,
    },
    Resolve {
        offset: u64,
    },
    DeadLetter {
        offset: u64,
    },
    Position {
        client: u8,
        channel: usize,
        offset: u64,
    },
    /// Clean Start or a lapsed session (gaps G-11, A-079): the positions the client
    /// stored, before a restart or since, are gone from every channel.
    DropPositions {
        client: u8,
    },
    SweepAge {
        now: u64,
    },
    SweepSize,
    /// Graceful restart: sqlite closes and reopens; memory snapshots and loads.
    Restart,
}

const CHANNELS: [&str; 4] = ["log", "state", "jobs", "jobs__dlq"];

fn settings() -> Vec<ChannelSettings> {
    let retention = Retention {
        period: Some(Duration::from_secs(50)),
        bytes: Some(600),
    };
    vec![
        ChannelSettings {
            kind: ChannelKind::Append,
            max_bytes: Some(2_000),
            retention,
        },
        ChannelSettings {
            kind: ChannelKind::Latest {
                deletion_retention: Some(Duration::from_secs(20)),
            },
            max_bytes: None,
            retention,
        },
        ChannelSettings {
            kind: ChannelKind::Queue {
                job_expires_after: None,
            },
            max_bytes: Some(1_000),
            retention: Retention::default(),
        },
        ChannelSettings {
            kind: ChannelKind::DeadLetter {
                queue: "jobs".into(),
            },
            max_bytes: None,
            retention,
        },
    ]
}

/// Some attempts spent, derived from `after` so both providers are told the same.
fn attempts(after: u64) -> Attempts {
    let mut attempts = Attempts::default();
    for n in 0..after % 4 {
        attempts.spend(after + n);
    }
    attempts
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, 0..4u8, 0..120usize, 0..200_000u64)
            .prop_map(|(channel, topic, len, ts)| Op::Append { channel, topic, len, ts }),
        2 => (0..12u64, 0..1000u64).prop_map(|(offset, after)| Op::Attempt { offset, after }),
        2 => (0..12u64).prop_map(|offset| Op::Resolve { offset }),
        1 => (0..12u64).prop_map(|offset| Op::DeadLetter { offset }),
        1 => (0..3u8, 0..4usize, 0..20u64)
            .prop_map(|(client, channel, offset)| Op::Position { client, channel, offset }),
        1 => (0..4u8).prop_map(|client| Op::DropPositions { client }),
        1 => (0..300_000u64).prop_map(|now| Op::SweepAge { now }),
        1 => Just(Op::SweepSize),
        1 => Just(Op::Restart),
    ]
}

async fn apply(p: &Provider, op: &Op) -> String {
    match op {
        Op::Append {
            channel,
            topic,
            len,
            ts,
        } => {
            let name = CHANNELS[*channel];
            let r = rec(&format!("{name}/{topic}"), &vec![7; *len], *ts);
            format!("{:?}", p.append(name, r).await.map_err(|e| e.reason_code()))
        }
        Op::Attempt { offset, after } => {
            format!(
                "{:?}",
                p.store_attempts("jobs", *offset, attempts(*after), *after)
                    .await
            )
        }
        Op::Resolve { offset } => format!("{:?}", p.resolve("jobs", *offset).await),
        Op::DeadLetter { offset } => {
            let extra = vec![("saguin-dlq-offset".to_owned(), offset.to_string())];
            format!(
                "{:?}",
                p.dead_letter("jobs", *offset, to_dlq("jobs__dlq", "jobs/x", 5, extra))
                    .await
            )
        }
        Op::Position {
            client,
            channel,
            offset,
        } => {
            let c = format!("c{client}");
            p.set_position(&c, CHANNELS[*channel], *offset)
                .await
                .unwrap();
            format!("{:?}", p.position(&c, CHANNELS[*channel]).await)
        }
        Op::DropPositions { client } => {
            let c = format!("c{client}");
            p.drop_positions(&c).await.unwrap();
            let mut left = Vec::new();
            for channel in CHANNELS {
                left.push(p.position(&c, channel).await.unwrap());
            }
            format!("{left:?}")
        }
        Op::SweepAge { now } => format!("{:?}", p.sweep_age(*now).await),
        Op::SweepSize => format!("{:?}", p.sweep_size().await),
        Op::Restart => unreachable!("handled by the test"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn sqlite_and_memory_answer_alike(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = temp_dir("model");
        let sqlite_settings = ProviderSettings::Sqlite(SqliteSettings::new(
            "p", dir.join("m.db"), 64 << 20, 1 << 20,
        ));
        let memory_settings = ProviderSettings::Memory(MemorySettings {
            name: "p".into(),
            max_bytes: 64 << 20,
            reserve_bytes: 1 << 20,
            snapshot_dir: Some(dir.join("snap")),
        });
        let open = |s: &ProviderSettings| {
            let p = Provider::open(s).unwrap();
            smol::block_on(async {
                for (name, c) in CHANNELS.iter().zip(settings()) {
                    p.open_channel(name, c).await.unwrap();
                }
            });
            p
        };
        let mut sqlite = open(&sqlite_settings);
        let mut memory = open(&memory_settings);
        for (step, op) in ops.iter().enumerate() {
            if let Op::Restart = op {
                sqlite.close(0).unwrap();
                memory.close(0).unwrap();
                drop((sqlite, memory));
                sqlite = open(&sqlite_settings);
                memory = open(&memory_settings);
            }
            smol::block_on(async {
                if let Op::Restart = op {
                    return Ok(());
                }
                let a = apply(&sqlite, op).await;
                let b = apply(&memory, op).await;
                prop_assert_eq!(&a, &b, "step {} {:?}", step, op);
                for name in CHANNELS {
                    let (wa, wb) = (
                        sqlite.read_window(name, all()).await.unwrap(),
                        memory.read_window(name, all()).await.unwrap(),
                    );
                    prop_assert_eq!(&wa, &wb, "step {} {:?} channel {}", step, op, name);
                    let (sa, sb) = (
                        sqlite.stats(name).await.unwrap(),
                        memory.stats(name).await.unwrap(),
                    );
                    prop_assert_eq!(sa, sb, "step {} {:?} channel {}", step, op, name);
                }
                Ok(())
            })?;
        }
    }
}
