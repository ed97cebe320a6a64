//! The memory provider: max_bytes with the reserve, snapshots, the lock.

mod storage_support;

use std::path::Path;

use saguin::storage::{
    Attempts, ChannelKind, ChannelSettings, MemoryProvider, MemorySettings, RecordProperties,
    RecordState, Retention, StorageError, memory::snapshot_file_name,
};
use storage_support::{all, rec, temp_dir, to_dlq};

fn settings(dir: Option<&Path>, max_bytes: u64, reserve: u64) -> MemorySettings {
    MemorySettings {
        name: "ram".into(),
        max_bytes,
        reserve_bytes: reserve,
        snapshot_dir: dir.map(Path::to_owned),
    }
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

/// C-115, C-113, C-114: publishes stop at max_bytes less the reserve, exactly; the relieving
/// operations still work there, and resolution makes room again (C-110).
#[test]
fn publishes_stop_short_of_the_reserve_and_relief_still_works() {
    let one = rec("jobs/x", &[0; 87], 0).size(); // 100 bytes
    let p = MemoryProvider::open(&settings(None, 1000, 250)).unwrap();
    smol::block_on(async {
        p.open_channel("jobs", queue()).await.unwrap();
        p.open_channel("jobs__dlq", dlq()).await.unwrap();
        for n in 0..7 {
            p.append("jobs", rec("jobs/x", &[0; 87], n)).await.unwrap();
        }
        assert_eq!(p.used_bytes(), 7 * one);
        let e = p
            .append("jobs", rec("jobs/x", &[0; 87], 8))
            .await
            .unwrap_err();
        assert!(
            matches!(e, StorageError::ProviderFull { reserve: 250, .. }),
            "{e}"
        );
        assert_eq!(e.reason_code(), 0x97);
        // A smaller one that fits below the reserve is still taken: the bound is exact.
        let small = rec("j", b"", 9);
        assert!(small.size() < 100);
        p.append("jobs", small).await.unwrap();
        let spent = Attempts {
            count: 1,
            first_ms: Some(10),
            last_ms: Some(10),
        };
        p.store_attempts("jobs", 0, spent, 10).await.unwrap();
        let extra = vec![("saguin-dlq-offset".to_owned(), "0".to_owned())];
        p.dead_letter("jobs", 0, to_dlq("jobs__dlq", "jobs/x", 12, extra))
            .await
            .unwrap();
        assert!(p.used_bytes() > 7 * one, "the move used the reserve");
        p.set_position("w", "jobs__dlq", 1).await.unwrap();
        p.resolve("jobs", 1).await.unwrap();
        p.append("jobs", rec("jobs/x", &[0; 10], 11)).await.unwrap();
    });
}

/// B-505, C-211: a graceful shutdown writes one file per group (a queue and its dlq
/// share one) and a manifest; the next start loads records, states, properties,
/// positions and offsets, and offsets carry on from where they were.
#[test]
fn snapshot_round_trip_keeps_everything_and_offsets_carry_on() {
    let dir = temp_dir("snap");
    let props = RecordProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(30),
        content_type: Some("application/json".into()),
        response_topic: Some("r/t".into()),
        correlation_data: Some(vec![9, 8]),
        user_properties: vec![("a".into(), "b".into())],
    };
    let latest = ChannelSettings {
        kind: ChannelKind::Latest {
            deletion_retention: None,
        },
        max_bytes: None,
        retention: Retention::default(),
    };
    let before;
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        before = smol::block_on(async {
            p.open_channel("fleet.v2", ChannelSettings::append())
                .await
                .unwrap();
            p.open_channel("jobs", queue()).await.unwrap();
            p.open_channel("jobs__dlq", dlq()).await.unwrap();
            p.open_channel("state", latest.clone()).await.unwrap();
            let mut r = rec("fleet/1", b"hello", 5);
            r.properties = props.clone();
            p.append("fleet.v2", r).await.unwrap();
            p.append("fleet.v2", rec("fleet/2", b"x", 6)).await.unwrap();
            p.append("jobs", rec("jobs/1", b"w", 7)).await.unwrap();
            p.append("jobs", rec("jobs/2", b"w", 8)).await.unwrap();
            let one = Attempts {
                count: 1,
                first_ms: Some(5_000),
                last_ms: Some(5_000),
            };
            p.store_attempts("jobs", 1, one, 99).await.unwrap();
            let to = to_dlq("jobs__dlq", "jobs/1", 8, vec![]);
            p.dead_letter("jobs", 0, to).await.unwrap();
            p.append("state", rec("s/a", b"1", 9)).await.unwrap();
            p.append("state", rec("s/a", b"2", 10)).await.unwrap();
            p.set_position("client-1", "fleet.v2", 1).await.unwrap();
            (
                p.read_window("fleet.v2", all()).await.unwrap(),
                p.read_window("jobs", all()).await.unwrap(),
                p.used_bytes(),
            )
        });
        let report = p.write_snapshot(1234).unwrap();
        assert_eq!((report.files, report.channels, report.records), (3, 4, 5));
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "fleet%2Ev2.snap",
            "jobs.snap",
            "manifest.json",
            "saguin.lock",
            "state.snap"
        ]
    );
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    smol::block_on(async {
        p.open_channel("fleet.v2", ChannelSettings::append())
            .await
            .unwrap();
        p.open_channel("jobs", queue()).await.unwrap();
        p.open_channel("jobs__dlq", dlq()).await.unwrap();
        p.open_channel("state", latest).await.unwrap();
        assert_eq!(p.read_window("fleet.v2", all()).await.unwrap(), before.0);
        assert_eq!(
            p.read_window("fleet.v2", all()).await.unwrap().records[0].properties,
            props
        );
        let jobs = p.read_window("jobs", all()).await.unwrap();
        assert_eq!(jobs, before.1);
        assert_eq!(
            jobs.records[0].state,
            // C-129, C-130: an attempt's time is kept by the snapshot.
            RecordState::Job {
                attempts: Attempts {
                    count: 1,
                    first_ms: Some(5_000),
                    last_ms: Some(5_000)
                },
                available_after_ms: 99
            }
        );
        assert_eq!(p.used_bytes(), before.2);
        assert_eq!(p.position("client-1", "fleet.v2").await.unwrap(), Some(1));
        assert_eq!(
            p.read_window("jobs__dlq", all())
                .await
                .unwrap()
                .records
                .len(),
            1
        );
        // Offsets carry on; the latest index was rebuilt, so the value is replaced.
        assert_eq!(
            p.append("fleet.v2", rec("fleet/3", b"x", 11))
                .await
                .unwrap(),
            2
        );
        assert_eq!(p.append("jobs", rec("jobs/3", b"x", 11)).await.unwrap(), 2);
        p.append("state", rec("s/a", b"3", 11)).await.unwrap();
        assert_eq!(p.stats("state").await.unwrap().records, 1);
    });
}

/// B-506: a snapshot file for a channel no longer configured is left unopened.
#[test]
fn a_channel_no_longer_configured_is_left_in_its_file() {
    let dir = temp_dir("snap-drop");
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        smol::block_on(async {
            p.open_channel("old", ChannelSettings::append())
                .await
                .unwrap();
            p.open_channel("kept", ChannelSettings::append())
                .await
                .unwrap();
            p.append("old", rec("old/x", b"x", 1)).await.unwrap();
            p.append("kept", rec("kept/x", b"x", 1)).await.unwrap();
        });
        p.write_snapshot(1).unwrap();
    }
    // Damage the file of the channel that is no longer configured: never read, no error.
    std::fs::write(dir.join(snapshot_file_name("old")), b"garbage").unwrap();
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    smol::block_on(async {
        p.open_channel("kept", ChannelSettings::append())
            .await
            .unwrap();
        assert_eq!(p.stats("kept").await.unwrap().records, 1);
    });
}

/// B-506, invariant 9 (gaps INV-9): a channel left out of one run's configuration is
/// still listed by that run's snapshot, so when it is configured again it comes back
/// with its records and its offsets carry on rather than starting again at 0.
#[test]
fn a_channel_left_out_for_a_run_comes_back_with_its_records_and_offsets() {
    let dir = temp_dir("snap-away");
    let open = |channels: &[&str]| {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        smol::block_on(async {
            for name in channels {
                p.open_channel(name, ChannelSettings::append())
                    .await
                    .unwrap();
            }
        });
        p
    };
    let p = open(&["away", "kept"]);
    smol::block_on(async {
        assert_eq!(p.append("away", rec("away/x", b"x", 1)).await.unwrap(), 0);
        assert_eq!(p.append("away", rec("away/x", b"y", 2)).await.unwrap(), 1);
        p.append("kept", rec("kept/x", b"x", 1)).await.unwrap();
    });
    p.write_snapshot(1).unwrap();
    drop(p);
    let p = open(&["kept"]);
    smol::block_on(async {
        p.append("kept", rec("kept/x", b"z", 3)).await.unwrap();
    });
    p.write_snapshot(2).unwrap();
    drop(p);
    let p = open(&["away", "kept"]);
    smol::block_on(async {
        assert_eq!(p.stats("away").await.unwrap().records, 2);
        assert_eq!(p.stats("kept").await.unwrap().records, 2);
        assert_eq!(p.append("away", rec("away/x", b"w", 4)).await.unwrap(), 2);
    });
}

/// B-505: a queue's file holds its dead letters too; a run that opens the queue alone
/// writes them back into it rather than dropping them.
#[test]
fn dead_letters_loaded_with_their_queue_but_not_opened_are_written_back() {
    let dir = temp_dir("snap-pending");
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    smol::block_on(async {
        p.open_channel("jobs", queue()).await.unwrap();
        p.open_channel("jobs__dlq", dlq()).await.unwrap();
        p.append("jobs", rec("jobs/x", b"x", 1)).await.unwrap();
        p.dead_letter("jobs", 0, to_dlq("jobs__dlq", "jobs/x", 2, Vec::new()))
            .await
            .unwrap();
    });
    p.write_snapshot(1).unwrap();
    drop(p);
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    smol::block_on(async { p.open_channel("jobs", queue()).await.unwrap() });
    p.write_snapshot(2).unwrap();
    drop(p);
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    smol::block_on(async {
        p.open_channel("jobs", queue()).await.unwrap();
        p.open_channel("jobs__dlq", dlq()).await.unwrap();
        assert_eq!(p.stats("jobs__dlq").await.unwrap().records, 1);
    });
}

/// A damaged snapshot is refused with an error naming the file and what to do.
#[test]
fn a_damaged_snapshot_is_refused_naming_the_file() {
    let dir = temp_dir("snap-bad");
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        smol::block_on(async {
            p.open_channel("c", ChannelSettings::append())
                .await
                .unwrap();
            p.append("c", rec("c/x", &[1; 500], 1)).await.unwrap();
        });
        p.write_snapshot(1).unwrap();
    }
    let file = dir.join("c.snap");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    let e = smol::block_on(p.open_channel("c", ChannelSettings::append())).unwrap_err();
    assert!(
        matches!(e, StorageError::Snapshot { ref path, .. } if *path == file),
        "{e}"
    );
    assert!(e.to_string().contains("move it aside"), "{e}");
}

/// B-502: `snapshot_dir: none` keeps nothing and writes nothing.
#[test]
fn snapshot_dir_none_keeps_nothing() {
    let p = MemoryProvider::open(&settings(None, 1 << 20, 1000)).unwrap();
    assert!(p.lock_path().is_none());
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        p.append("c", rec("c/x", b"x", 1)).await.unwrap();
    });
    assert_eq!(p.write_snapshot(1).unwrap().files, 0);
    let p = MemoryProvider::open(&settings(None, 1 << 20, 1000)).unwrap();
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        assert_eq!(p.stats("c").await.unwrap().head, 0);
    });
}

/// B-520: a second broker on the same snapshot directory refuses, naming saguin.lock.
#[test]
fn a_second_provider_on_the_same_directory_is_refused_naming_the_lock() {
    let dir = temp_dir("snap-lock");
    let first = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    let e = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap_err();
    assert_eq!(
        e,
        StorageError::Locked {
            provider: "ram".into(),
            lock: dir.join("saguin.lock")
        }
    );
    drop(first);
    MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
}

/// B-467: a snapshot written under a larger bound is loaded whole, and publishes are
/// refused until there is room.
#[test]
fn a_snapshot_over_a_smaller_bound_loads_whole_and_refuses_publishes() {
    let dir = temp_dir("snap-over");
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        smol::block_on(async {
            p.open_channel("c", ChannelSettings::append())
                .await
                .unwrap();
            for n in 0..10 {
                p.append("c", rec("c/x", &[0; 995], n)).await.unwrap();
            }
        });
        p.write_snapshot(1).unwrap();
    }
    let p = MemoryProvider::open(&settings(Some(&dir), 6000, 1000)).unwrap();
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        assert_eq!(p.stats("c").await.unwrap().records, 10);
        let e = p.append("c", rec("c/x", b"x", 11)).await.unwrap_err();
        assert_eq!(e.reason_code(), 0x97);
    });
}

/// B-443, B-491, B-505: a channel named `held` has a snapshot file of its own beside
/// the held QoS 2 publishes; both come back. They once shared `held.snap`, and the
/// next start refused the file as "not a held-publishes file".
#[test]
fn a_channel_named_held_and_the_held_publishes_both_survive_a_snapshot() {
    let dir = temp_dir("snap-held");
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        smol::block_on(async {
            p.open_channel("held", ChannelSettings::append())
                .await
                .unwrap();
            p.append("held", rec("held/1", b"kept", 5)).await.unwrap();
            let held = saguin::storage::Held {
                client_id: "pub".into(),
                packet_id: 7,
                token: 1,
                data: b"exchange".to_vec(),
            };
            p.put_held(held).await.unwrap();
        });
        p.write_snapshot(1234).unwrap();
    }
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).expect("starts again");
    smol::block_on(async {
        p.open_channel("held", ChannelSettings::append())
            .await
            .unwrap();
        let window = p.read_window("held", all()).await.unwrap();
        assert_eq!(window.records.len(), 1, "{window:?}");
        assert_eq!(&*window.records[0].payload, b"kept");
        let held = p.held().await.unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!(
            (held[0].packet_id, &held[0].data[..]),
            (7, &b"exchange"[..])
        );
    });
}

/// B-443: held publishes an earlier version wrote to `held.snap` are read at the
/// next start, and the file is removed by the next snapshot so they never come back.
#[test]
fn held_publishes_where_an_earlier_version_wrote_them_are_read_once() {
    let dir = temp_dir("snap-held-before");
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        let held = saguin::storage::Held {
            client_id: "pub".into(),
            packet_id: 9,
            token: 1,
            data: b"old".to_vec(),
        };
        smol::block_on(p.put_held(held)).unwrap();
        p.write_snapshot(1).unwrap();
    }
    std::fs::rename(dir.join("held.qos2"), dir.join("held.snap")).unwrap();
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        let held = smol::block_on(p.held()).unwrap();
        assert_eq!(held.len(), 1);
        p.write_snapshot(2).unwrap();
    }
    assert!(!dir.join("held.snap").exists());
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    assert_eq!(
        smol::block_on(p.held()).unwrap().len(),
        1,
        "once, from held.qos2"
    );
}

/// C-113, gaps A-02: the moves into the dead-letter channel may use the reserve but
/// not pass `max_bytes` itself: past it a move is refused and leaves the job as it
/// was. Each move grows the record (a longer topic, the headers), and with nothing
/// refusing them `used` ran past the bound without limit.
#[test]
fn dead_letter_moves_use_the_reserve_but_never_pass_max_bytes() {
    let p = MemoryProvider::open(&settings(None, 2000, 500)).unwrap();
    smol::block_on(async {
        p.open_channel("jobs", queue()).await.unwrap();
        p.open_channel("jobs__dlq", dlq()).await.unwrap();
        let mut jobs = 0;
        while p
            .append("jobs", rec("jobs/x", &[0; 20], jobs))
            .await
            .is_ok()
        {
            jobs += 1;
        }
        let headers = || {
            (0..4)
                .map(|n| (format!("saguin-dlq-h{n}"), "0123456789".to_owned()))
                .collect::<Vec<_>>()
        };
        let mut refused = None;
        for offset in 0..jobs {
            let to = to_dlq("jobs__dlq", "jobs/x", 1, headers());
            match p.dead_letter("jobs", offset, to).await {
                Ok(_) => assert!(p.used_bytes() <= 2000, "{}", p.used_bytes()),
                Err(e) => {
                    assert_eq!(e.reason_code(), 0x97, "{e}");
                    refused = Some(offset);
                    break;
                }
            }
        }
        let refused = refused.expect("a move past max_bytes was refused");
        assert!(refused > 0, "the reserve is used first");
        let left = p.read_window("jobs", all()).await.unwrap();
        assert_eq!(left.records[0].offset, refused, "the job is left as it was");
    });
}

/// A snapshot holding one offset twice (damaged, or written by hand) is refused
/// naming the file: loaded, the record was counted twice and held once, and the
/// channel's bytes never came back down.
#[test]
fn a_snapshot_repeating_an_offset_is_refused() {
    let dir = temp_dir("snap-repeat");
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        smol::block_on(async {
            p.open_channel("c", ChannelSettings::append())
                .await
                .unwrap();
            p.append("c", rec("c/x", b"a", 7)).await.unwrap();
            p.append("c", rec("c/x", b"b", 8)).await.unwrap();
        });
        p.write_snapshot(1).unwrap();
    }
    let file = dir.join("c.snap");
    let mut bytes = std::fs::read(&file).unwrap();
    // The second record: offset 1, then its message id "id-8-1".
    let mut second = 1u64.to_be_bytes().to_vec();
    second.extend(6u64.to_be_bytes());
    second.extend(b"id-8-1");
    let at = bytes
        .windows(second.len())
        .position(|w| w == second.as_slice())
        .expect("the second record");
    bytes[at..at + 8].copy_from_slice(&0u64.to_be_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    let e = smol::block_on(p.open_channel("c", ChannelSettings::append())).unwrap_err();
    assert!(e.to_string().contains("out of order"), "{e}");
}

/// The same for a head no channel reaches but close to the end of the range: its
/// next appends would wrap the offsets to 0.
#[test]
fn a_snapshot_whose_head_nears_the_end_of_the_offsets_is_refused() {
    let dir = temp_dir("snap-head");
    {
        let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
        smol::block_on(async {
            p.open_channel("c", ChannelSettings::append())
                .await
                .unwrap();
            p.append("c", rec("c/x", b"a", 7)).await.unwrap();
        });
        p.write_snapshot(1).unwrap();
    }
    let file = dir.join("c.snap");
    let mut bytes = std::fs::read(&file).unwrap();
    // The channel's head (1) after its name "c", then one record.
    let mut head = 1u64.to_be_bytes().to_vec();
    head.insert(0, b'c');
    let at = bytes
        .windows(head.len())
        .position(|w| w == head.as_slice())
        .expect("the channel's head")
        + 1;
    bytes[at..at + 8].copy_from_slice(&(u64::MAX - 1).to_be_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let p = MemoryProvider::open(&settings(Some(&dir), 1 << 20, 1000)).unwrap();
    let e = smol::block_on(p.open_channel("c", ChannelSettings::append())).unwrap_err();
    assert!(e.to_string().contains("end of the offset range"), "{e}");
}
