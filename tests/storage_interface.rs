//! The interface channel code uses, run against both provider kinds: every test here
//! runs once on sqlite and once on memory, and must see the same answers.

mod storage_support;

use std::time::Duration;

use saguin::storage::{
    Attempts, ChannelKind, ChannelSettings, MemorySettings, Provider, ProviderSettings,
    RecordState, Retention, SqliteSettings, StorageError,
};
use storage_support::{all, rec, temp_dir, to_dlq};

fn both(tag: &str) -> Vec<Provider> {
    let dir = temp_dir(tag);
    let sqlite = SqliteSettings::new("disk", dir.join("s.db"), 64 << 20, 1 << 20);
    let memory = MemorySettings {
        name: "ram".into(),
        max_bytes: 64 << 20,
        reserve_bytes: 1 << 20,
        snapshot_dir: None,
    };
    vec![
        Provider::open(&ProviderSettings::Sqlite(sqlite)).unwrap(),
        Provider::open(&ProviderSettings::Memory(memory)).unwrap(),
    ]
}

fn queue() -> ChannelSettings {
    ChannelSettings {
        kind: ChannelKind::Queue {
            job_expires_after: None,
        },
        max_bytes: None,
        retention: Retention::default(),
    }
}

fn dlq() -> ChannelSettings {
    ChannelSettings {
        kind: ChannelKind::DeadLetter {
            queue: "jobs".into(),
        },
        max_bytes: None,
        retention: Retention::default(),
    }
}

fn latest(period: Option<Duration>, deletions: Option<Duration>) -> ChannelSettings {
    ChannelSettings {
        kind: ChannelKind::Latest {
            deletion_retention: deletions,
        },
        max_bytes: None,
        retention: Retention {
            period,
            bytes: None,
        },
    }
}

/// a latest channel holds one value per topic; an empty payload is a
/// deletion kept as a tombstone; replaced values free their bytes.
#[test]
fn latest_keeps_one_value_per_topic_and_deletions_as_tombstones() {
    for p in both("latest") {
        smol::block_on(async {
            p.open_channel("state", latest(None, None)).await.unwrap();
            p.append("state", rec("s/a", b"1", 1)).await.unwrap();
            p.append("state", rec("s/b", b"1", 2)).await.unwrap();
            p.append("state", rec("s/a", b"22", 3)).await.unwrap();
            p.append("state", rec("s/b", b"", 4)).await.unwrap();
            let w = p.read_window("state", all()).await.unwrap();
            let seen: Vec<_> = w
                .records
                .iter()
                .map(|r| (r.offset, r.topic.as_str(), r.state))
                .collect();
            assert_eq!(
                seen,
                vec![
                    (2, "s/a", RecordState::Stored),
                    (3, "s/b", RecordState::Deleted)
                ],
                "{}",
                p.name()
            );
            let s = p.stats("state").await.unwrap();
            assert_eq!(s.records, 2);
            assert_eq!(
                s.bytes,
                rec("s/a", b"22", 3).size() + rec("s/b", b"", 4).size()
            );
            assert_eq!((s.floor, s.head), (2, 4));
        });
    }
}

/// a point read asks the provider for one topic's record, which is the
/// topic's current value, the deletion that replaced it, or nothing; the same on both
/// providers, and an unknown channel is named as one.
#[test]
fn a_latest_channel_answers_for_one_topic() {
    for p in both("latest-one") {
        smol::block_on(async {
            p.open_channel("state", latest(None, None)).await.unwrap();
            p.open_channel("log", ChannelSettings::append())
                .await
                .unwrap();
            let name = p.name().to_owned();
            assert_eq!(p.latest("state", "s/a").await.unwrap(), None, "{name}");
            p.append("state", rec("s/a", b"1", 1)).await.unwrap();
            p.append("state", rec("s/b", b"1", 2)).await.unwrap();
            p.append("state", rec("s/a", b"22", 3)).await.unwrap();
            p.append("state", rec("s/b", b"", 4)).await.unwrap();
            p.append("log", rec("s/a", b"x", 5)).await.unwrap();
            let a = p
                .latest("state", "s/a")
                .await
                .unwrap()
                .expect("s/a is held");
            assert_eq!(
                (a.offset, a.payload.as_slice(), a.state),
                (2, &b"22"[..], RecordState::Stored),
                "{name}"
            );
            let b = p
                .latest("state", "s/b")
                .await
                .unwrap()
                .expect("s/b's deletion");
            assert_eq!((b.offset, b.state), (3, RecordState::Deleted), "{name}");
            assert_eq!(p.latest("state", "s/c").await.unwrap(), None, "{name}");
            assert_eq!(
                p.latest("log", "s/a").await.unwrap(),
                None,
                "{name}: no index"
            );
            let unknown = p.latest("nowhere", "s/a").await;
            assert!(
                matches!(unknown, Err(StorageError::UnknownChannel { .. })),
                "{name}: {unknown:?}"
            );
        });
    }
}

/// G-18: a seek to a time lands on the first record, in offset order, stamped at or
/// after it, asked of the provider in one read: a clock that stepped back leaves a
/// later offset with an earlier stamp, which a seek past it passes over. Past every
/// record: none, and the seek lands on the head.
#[test]
fn a_seek_to_a_time_finds_the_first_record_stamped_at_or_after_it() {
    for p in both("first-at") {
        smol::block_on(async {
            p.open_channel("log", ChannelSettings::append())
                .await
                .unwrap();
            let name = p.name().to_owned();
            assert_eq!(p.first_at("log", 0).await.unwrap(), None, "{name}: empty");
            for (i, ts) in [100, 200, 150, 300].into_iter().enumerate() {
                let offset = p.append("log", rec("log/a", b"x", ts)).await.unwrap();
                assert_eq!(offset, i as u64);
            }
            let at = |ms| p.first_at("log", ms);
            assert_eq!(at(0).await.unwrap(), Some(0), "{name}: before all");
            assert_eq!(at(100).await.unwrap(), Some(0), "{name}: exactly");
            assert_eq!(at(101).await.unwrap(), Some(1), "{name}");
            assert_eq!(at(201).await.unwrap(), Some(3), "{name}: 150 passed over");
            assert_eq!(at(301).await.unwrap(), None, "{name}: past all");
            let unknown = p.first_at("nowhere", 0).await;
            assert!(
                matches!(unknown, Err(StorageError::UnknownChannel { .. })),
                "{name}: {unknown:?}"
            );
        });
    }
}

/// Queue delivery state: attempts and available-after are kept per record; resolution
/// removes; the dead-letter move keeps the id, adds properties and takes a new offset in
/// the dead-letter channel (C-124, C-127).
#[test]
fn queue_delivery_state_and_the_dead_letter_move() {
    for p in both("queue") {
        smol::block_on(async {
            p.open_channel("jobs", queue()).await.unwrap();
            p.open_channel("jobs__dlq", dlq()).await.unwrap();
            for n in 0..3 {
                p.append("jobs", rec("jobs/x", b"work", n)).await.unwrap();
            }
            let mut attempts = Attempts::default();
            attempts.spend(1_000);
            p.store_attempts("jobs", 1, attempts, 500).await.unwrap();
            attempts.spend(2_000);
            p.store_attempts("jobs", 1, attempts, 900).await.unwrap();
            p.set_available_after("jobs", 2, 1234).await.unwrap();
            let w = p.read_window("jobs", all()).await.unwrap();
            assert_eq!(
                w.records[1].state,
                RecordState::Job {
                    // C-129, C-130: the count and both times as last stored.
                    attempts: Attempts {
                        count: 2,
                        first_ms: Some(1_000),
                        last_ms: Some(2_000)
                    },
                    available_after_ms: 900
                }
            );
            assert_eq!(
                w.records[2].state,
                RecordState::Job {
                    attempts: Attempts::default(),
                    available_after_ms: 1234
                }
            );
            p.resolve("jobs", 0).await.unwrap();
            let extra = vec![
                ("saguin-dlq-channel".to_owned(), "jobs".to_owned()),
                ("saguin-dlq-offset".to_owned(), "1".to_owned()),
            ];
            assert_eq!(
                p.dead_letter("jobs", 1, to_dlq("jobs__dlq", "jobs/x", 77, extra.clone()))
                    .await
                    .unwrap(),
                0
            );
            let q = p.read_window("jobs", all()).await.unwrap();
            assert_eq!(
                q.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
                vec![2]
            );
            let d = p.read_window("jobs__dlq", all()).await.unwrap();
            assert_eq!(d.records[0].message_id, "id-1-4");
            assert_eq!(d.records[0].properties.user_properties, extra);
            // RFC 0002 "The dead-letter channel": the topic the owner gave, counted as is.
            assert_eq!(d.records[0].topic, "jobs/__dlq/x");
            assert_eq!(d.records[0].timestamp_ms, 77);
            let ds = p.stats("jobs__dlq").await.unwrap();
            assert_eq!(ds.bytes, d.records[0].size());
            assert_eq!(d.records[0].state, RecordState::Stored);
            let s = p.stats("jobs").await.unwrap();
            assert_eq!((s.records, s.bytes), (1, rec("jobs/x", b"work", 2).size()));
            // A resolved record is gone: a second resolution says so.
            let e = p.resolve("jobs", 0).await.unwrap_err();
            assert!(
                matches!(e, StorageError::NoSuchRecord { offset: 0, .. }),
                "{e}"
            );
            // Job operations on an append channel are a caller defect, named.
            let none = Attempts::default();
            let e = p.store_attempts("jobs__dlq", 0, none, 0).await.unwrap_err();
            assert!(matches!(e, StorageError::WrongChannelKind { .. }), "{e}");
        });
    }
}

/// one position per (client id, channel).
#[test]
fn consumer_positions_are_kept_per_client_and_channel() {
    for p in both("positions") {
        smol::block_on(async {
            p.open_channel("a", ChannelSettings::append())
                .await
                .unwrap();
            p.open_channel("b", ChannelSettings::append())
                .await
                .unwrap();
            p.set_position("c1", "a", 5).await.unwrap();
            p.set_position("c1", "a", 7).await.unwrap();
            p.set_position("c1", "b", 1).await.unwrap();
            p.set_position("c2", "a", 3).await.unwrap();
            assert_eq!(p.position("c1", "a").await.unwrap(), Some(7));
            assert_eq!(p.position("c2", "a").await.unwrap(), Some(3));
            assert_eq!(p.position("c2", "b").await.unwrap(), None);
            p.drop_positions("c1").await.unwrap();
            assert_eq!(p.position("c1", "b").await.unwrap(), None);
            assert_eq!(p.position("c2", "a").await.unwrap(), Some(3));
        });
    }
}

/// C-019, C-020, C-024: the age sweep removes what is past retention_period, silently,
/// with no write needed to notice; the floor moves up.
#[test]
fn age_sweep_removes_records_past_the_retention_period() {
    for p in both("age") {
        smol::block_on(async {
            let chan = ChannelSettings {
                kind: ChannelKind::Append,
                max_bytes: None,
                retention: Retention {
                    period: Some(Duration::from_secs(10)),
                    bytes: None,
                },
            };
            p.open_channel("c", chan).await.unwrap();
            for ts in [1_000, 2_000, 15_000] {
                p.append("c", rec("c/x", b"x", ts)).await.unwrap();
            }
            let r = p.sweep_age(20_000).await.unwrap();
            assert_eq!(r.records, 2, "{}", p.name());
            let s = p.stats("c").await.unwrap();
            assert_eq!((s.floor, s.head, s.records), (2, 3, 1));
            assert_eq!(p.sweep_age(20_000).await.unwrap().records, 0);
        });
    }
}

/// B-416, C-022: the size sweep removes the oldest records until the channel is under
/// retention_bytes; publishes over it are never refused (C-020).
#[test]
fn size_sweep_removes_oldest_until_under_retention_bytes() {
    for p in both("size") {
        smol::block_on(async {
            let one = rec("c/x", &[0; 95], 0).size(); // 100 bytes
            let chan = ChannelSettings {
                kind: ChannelKind::Append,
                max_bytes: None,
                retention: Retention {
                    period: None,
                    bytes: Some(one * 3 + one / 2),
                },
            };
            p.open_channel("c", chan).await.unwrap();
            for ts in 0..10 {
                p.append("c", rec("c/x", &[0; 95], ts)).await.unwrap();
            }
            assert_eq!(
                p.stats("c").await.unwrap().records,
                10,
                "over, until the sweep"
            );
            let r = p.sweep_size().await.unwrap();
            assert_eq!((r.records, r.bytes), (7, 7 * one), "{}", p.name());
            let s = p.stats("c").await.unwrap();
            assert_eq!((s.floor, s.records, s.bytes), (7, 3, 3 * one));
        });
    }
}

/// B-423: on a latest channel the period deletes values of quiet topics and
/// deletion_retention_period deletes tombstones; C-108: a queue is never swept.
#[test]
fn latest_expiry_and_tombstone_retention_and_queues_never_swept() {
    for p in both("latest-age") {
        smol::block_on(async {
            let l = latest(
                Some(Duration::from_secs(100)),
                Some(Duration::from_secs(10)),
            );
            p.open_channel("state", l).await.unwrap();
            let q = ChannelSettings {
                retention: Retention {
                    period: Some(Duration::from_secs(1)),
                    bytes: Some(1),
                },
                ..queue()
            };
            p.open_channel("jobs", q).await.unwrap();
            p.append("state", rec("s/quiet", b"v", 0)).await.unwrap();
            p.append("state", rec("s/gone", b"", 50_000)).await.unwrap();
            p.append("state", rec("s/fresh", b"v", 95_000))
                .await
                .unwrap();
            p.append("jobs", rec("jobs/x", b"work", 0)).await.unwrap();
            let r = p.sweep_age(101_000).await.unwrap();
            assert_eq!(r.records, 2, "{}", p.name());
            p.sweep_size().await.unwrap();
            let w = p.read_window("state", all()).await.unwrap();
            let topics: Vec<_> = w.records.iter().map(|r| r.topic.as_str()).collect();
            assert_eq!(topics, vec!["s/fresh"]);
            assert_eq!(p.stats("jobs").await.unwrap().records, 1);
            // A topic whose value expired can be set again.
            p.append("state", rec("s/quiet", b"again", 102_000))
                .await
                .unwrap();
            assert_eq!(p.stats("state").await.unwrap().records, 2);
        });
    }
}

#[test]
fn an_unopened_channel_is_named_in_the_error() {
    for p in both("unknown") {
        smol::block_on(async {
            let e = p.append("nope", rec("n/x", b"x", 0)).await.unwrap_err();
            assert!(matches!(e, StorageError::UnknownChannel { .. }));
            assert!(e.to_string().contains("nope"));
        });
    }
}

/// The provider is shared between tasks on a multi-threaded executor: it is Send + Sync
/// and its futures are Send, so channel code can `spawn` them.
#[test]
fn providers_and_their_futures_can_cross_threads() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    for p in both("send") {
        send_sync(&p);
        let c = ChannelSettings::append();
        send(&p.open_channel("c", c));
        send(&p.append("c", rec("c/x", b"x", 0)));
        send(&p.read_window("c", all()));
        send(&p.dead_letter("q", 0, to_dlq("d", "q/x", 0, vec![])));
        send(&p.sweep_age(0));
    }
}

/// C-021: a latest channel's own max_bytes counts the value a publish replaces as
/// freed, on both providers alike: a new value for a topic at the bound is taken, a
/// value for another topic is not.
#[test]
fn a_latest_value_replacing_one_at_the_channels_bound_is_taken() {
    for p in both("latest-bound") {
        smol::block_on(async {
            let bounded = ChannelSettings {
                max_bytes: Some(rec("state/a", b"one", 1).size()),
                ..latest(None, None)
            };
            p.open_channel("state", bounded).await.unwrap();
            p.append("state", rec("state/a", b"one", 1)).await.unwrap();
            let replaced = p.append("state", rec("state/a", b"two", 2)).await;
            assert!(replaced.is_ok(), "{}: {replaced:?}", p.name());
            let other = p.append("state", rec("state/b", b"one", 3)).await;
            assert!(
                matches!(other, Err(StorageError::ChannelFull { .. })),
                "{}: {other:?}",
                p.name()
            );
        });
    }
}

/// B-441, B-442: a held QoS 2 publish is kept under (client id, packet id) and
/// counted against the provider's bytes; an append naming it releases it in the same
/// operation, a refused append releases nothing, and a drop naming another exchange
/// (an older token) leaves the one held alone.
#[test]
fn b442_held_publishes_are_released_with_the_record_they_become() {
    use saguin::storage::Held;
    for p in both("held") {
        smol::block_on(async {
            let small = ChannelSettings {
                max_bytes: Some(rec("log/x", b"fits", 1).size()),
                ..ChannelSettings::append()
            };
            p.open_channel("log", small).await.unwrap();
            let held = |id: u16, token: u64| Held {
                client_id: "c".into(),
                packet_id: id,
                token,
                data: vec![7; 100],
            };
            let before = p.used_bytes();
            p.put_held(held(1, 10)).await.unwrap();
            p.put_held(held(2, 20)).await.unwrap();
            if p.name() == "ram" {
                assert_eq!(p.used_bytes(), before + 2 * held(1, 10).size());
            }
            assert_eq!(p.held().await.unwrap(), vec![held(1, 10), held(2, 20)]);
            // Another exchange under id 2: left alone.
            p.drop_held(held(2, 19).key()).await.unwrap();
            let offset = p
                .append_releasing("log", rec("log/x", b"fits", 1), Some(held(1, 10).key()))
                .await
                .unwrap();
            assert_eq!(offset, 0);
            assert_eq!(p.held().await.unwrap(), vec![held(2, 20)], "{}", p.name());
            // Refused at the channel's bound: nothing released.
            let refused = p
                .append_releasing("log", rec("log/x", b"too much", 2), Some(held(2, 20).key()))
                .await;
            assert!(matches!(refused, Err(StorageError::ChannelFull { .. })));
            assert_eq!(p.held().await.unwrap(), vec![held(2, 20)], "{}", p.name());
            p.drop_held(held(2, 20).key()).await.unwrap();
            assert!(p.held().await.unwrap().is_empty());
            if p.name() == "ram" {
                assert_eq!(p.used_bytes(), before + rec("log/x", b"fits", 1).size());
            }
        });
    }
}

/// B-442: at its bound a provider still takes the record that releases a held
/// publish - it frees about what it takes - while a plain publish is refused.
#[test]
fn b442_a_release_is_taken_at_the_bound_that_refuses_a_publish() {
    use saguin::storage::Held;
    let dir = temp_dir("held-bound");
    let sqlite = SqliteSettings::new("disk", dir.join("s.db"), 256 << 10, 16 << 10);
    let memory = MemorySettings {
        name: "ram".into(),
        max_bytes: 64 << 10,
        reserve_bytes: 8 << 10,
        snapshot_dir: None,
    };
    for settings in [
        ProviderSettings::Sqlite(sqlite),
        ProviderSettings::Memory(memory),
    ] {
        let p = Provider::open(&settings).unwrap();
        smol::block_on(async {
            p.open_channel("log", ChannelSettings::append())
                .await
                .unwrap();
            let held = |id: u16| Held {
                client_id: "c".into(),
                packet_id: id,
                token: 1,
                data: vec![7; 2000],
            };
            let mut kept = Vec::new();
            for id in 0..1000u16 {
                match p.put_held(held(id)).await {
                    Ok(()) => kept.push(id),
                    Err(StorageError::ProviderFull { .. }) => break,
                    Err(e) => panic!("{}: {e}", p.name()),
                }
            }
            assert!(!kept.is_empty(), "{}", p.name());
            let record = || rec("log/x", &[1; 1900], 1);
            assert!(
                matches!(
                    p.append("log", record()).await,
                    Err(StorageError::ProviderFull { .. })
                ),
                "{}: a plain publish is refused at the bound",
                p.name()
            );
            p.append_releasing("log", record(), Some(held(kept[0]).key()))
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", p.name()));
            assert_eq!(p.held().await.unwrap().len(), kept.len() - 1);
        });
    }
}
