//! The sqlite provider: group commit, offsets, reads beside the writer, bounds, lock,
//! and a second process reading the live file.

mod storage_support;

use std::path::Path;
use std::time::{Duration, Instant};

use saguin::storage::{
    Attempts, ChannelKind, ChannelSettings, CommitMode, RecordProperties, RecordState, Retention,
    SqliteProvider, SqliteSettings, StorageError, WindowRequest,
};
use storage_support::{all, join_all, rec, temp_dir, to_dlq};

fn settings(dir: &Path) -> SqliteSettings {
    SqliteSettings::new("local", dir.join("saguin.db"), 64 << 20, 1 << 20)
}

#[test]
fn append_then_read_returns_records_and_properties_in_offset_order() {
    let dir = temp_dir("rw");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    smol::block_on(async {
        p.open_channel("events", ChannelSettings::append())
            .await
            .unwrap();
        let mut r = rec("events/a", b"one", 1);
        r.properties = RecordProperties {
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(60),
            content_type: Some("text/plain".into()),
            response_topic: Some("reply/here".into()),
            correlation_data: Some(vec![1, 2, 3]),
            user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
        };
        assert_eq!(p.append("events", r.clone()).await.unwrap(), 0);
        let second = rec("events/b", b"two", 2);
        assert_eq!(p.append("events", second.clone()).await.unwrap(), 1);
        let w = p.read_window("events", all()).await.unwrap();
        assert_eq!((w.floor, w.head, w.records.len()), (0, 2, 2));
        assert_eq!(w.records[0].properties, r.properties);
        assert_eq!(w.records[0].payload, b"one");
        assert_eq!(w.records[1].topic, "events/b");
        assert_eq!(w.records[0].state, RecordState::Stored);
        let s = p.stats("events").await.unwrap();
        assert_eq!(s.records, 2);
        assert_eq!(s.bytes, r.size() + second.size());
    });
}

#[test]
fn window_reads_are_bounded_by_count_and_bytes_but_always_make_progress() {
    let dir = temp_dir("window");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        for n in 0..10 {
            p.append("c", rec("c/x", &[0; 100], n)).await.unwrap();
        }
        let w = p
            .read_window("c", WindowRequest::new(3, 4, u64::MAX))
            .await
            .unwrap();
        let offs: Vec<u64> = w.records.iter().map(|r| r.offset).collect();
        assert_eq!(offs, vec![3, 4, 5, 6]);
        let w = p
            .read_window("c", WindowRequest::new(0, 100, 250))
            .await
            .unwrap();
        assert_eq!(w.records.len(), 2);
        let w = p
            .read_window("c", WindowRequest::new(0, 100, 1))
            .await
            .unwrap();
        assert_eq!(
            w.records.len(),
            1,
            "one record even when larger than the byte bound"
        );
    });
}

/// Invariant 9 / B-151: offsets are strictly increasing and never reused, across a
/// restart and after retention has removed everything.
#[test]
fn offsets_are_never_reused_across_restart_even_after_retention_empties_the_channel() {
    let dir = temp_dir("offsets");
    let chan = ChannelSettings {
        kind: ChannelKind::Append,
        max_bytes: None,
        retention: Retention {
            period: Some(Duration::from_secs(1)),
            bytes: None,
        },
    };
    {
        let p = SqliteProvider::open(&settings(&dir)).unwrap();
        smol::block_on(async {
            p.open_channel("c", chan.clone()).await.unwrap();
            for n in 0..5 {
                assert_eq!(p.append("c", rec("c/x", b"p", n)).await.unwrap(), n);
            }
            let swept = p.sweep_age(10_000).await.unwrap();
            assert_eq!(swept.records, 5);
            let s = p.stats("c").await.unwrap();
            assert_eq!((s.floor, s.head, s.records, s.bytes), (5, 5, 0, 0));
        });
    }
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    smol::block_on(async {
        p.open_channel("c", chan).await.unwrap();
        assert_eq!(p.append("c", rec("c/x", b"p", 20_000)).await.unwrap(), 5);
    });
}

/// C-019, C-025: a channel far past its retention is swept in chunks of 8,192
/// records, each a transaction of its own with the producers' batches between them,
/// and every chunk is taken before the sweep answers: an append log by age, a latest
/// channel's values by age and an append log by size alike.
#[test]
fn a_sweep_past_one_chunk_removes_everything_due() {
    const N: u64 = 2 * 8_192 + 5;
    let dir = temp_dir("chunks");
    let p = SqliteProvider::open(&SqliteSettings::new(
        "local",
        dir.join("saguin.db"),
        256 << 20,
        1 << 20,
    ))
    .unwrap();
    let aged = Retention {
        period: Some(Duration::from_secs(1)),
        bytes: None,
    };
    let log = ChannelSettings {
        retention: aged,
        ..ChannelSettings::append()
    };
    let state = ChannelSettings {
        kind: ChannelKind::Latest {
            deletion_retention: None,
        },
        max_bytes: None,
        retention: aged,
    };
    let sized = ChannelSettings {
        retention: Retention {
            period: None,
            bytes: Some(1_000),
        },
        ..ChannelSettings::append()
    };
    smol::block_on(async {
        for (name, settings) in [("log", log), ("state", state), ("sized", sized)] {
            p.open_channel(name, settings).await.unwrap();
            let appends = (0..N).map(|n| {
                let topic = format!("{name}/{n}");
                let p = &p;
                async move { p.append(name, rec(&topic, b"p", 1_000 + n)).await }
            });
            for r in join_all(appends.collect()).await {
                r.unwrap();
            }
        }
        let aged = p.sweep_age(100_000_000).await.unwrap();
        assert_eq!(aged.records, 2 * N, "every aged record of both channels");
        for name in ["log", "state"] {
            let s = p.stats(name).await.unwrap();
            assert_eq!((s.records, s.floor, s.head), (0, N, N), "{name}");
        }
        let sized = p.sweep_size().await.unwrap();
        let s = p.stats("sized").await.unwrap();
        assert_eq!(sized.records + s.records, N);
        assert!(s.bytes <= 1_000, "under retention_bytes: {s:?}");
        assert!(sized.records > 8_192, "more than one chunk: {sized:?}");
    });
}

/// The write-ahead log does not keep the largest burst it ever held: 24 MiB written
/// while a reader holds the checkpoint back grows it past that; once the reader is
/// gone, a checkpoint and the next write cut it back to at most 8 MiB.
#[test]
fn the_write_ahead_log_is_cut_back_after_a_burst() {
    let dir = temp_dir("wal-limit");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    let wal = dir.join("saguin.db-wal");
    let payload = vec![7u8; 64 << 10];
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        p.append("c", rec("c/x", b"first", 0)).await.unwrap();
        let reader = rusqlite::Connection::open(dir.join("saguin.db")).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM records", [], |r| r.get(0))
            .unwrap();
        for n in 0..384 {
            p.append("c", rec("c/x", &payload, n)).await.unwrap();
        }
        let grown = std::fs::metadata(&wal).unwrap().len();
        assert!(grown > 20 << 20, "the burst grew the log: {grown}");
        reader.execute_batch("COMMIT").unwrap();
        drop(reader);
        // Enough commits for an automatic checkpoint to run and the log to start over.
        for n in 0..64 {
            p.append("c", rec("c/x", &payload, n)).await.unwrap();
        }
        let after = std::fs::metadata(&wal).unwrap().len();
        assert!(after <= 8 << 20, "cut back: {after} after {grown}");
    });
}

/// B-139, B-140: with the keys absent, publishes arriving during a commit go into the
/// next transaction together, so concurrent publishers need far fewer commits.
#[test]
fn collecting_without_waiting_groups_concurrent_publishes() {
    let dir = temp_dir("collect");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        let before = p.writer_stats();
        let futs: Vec<_> = (0..600)
            .map(|n| p.append("c", rec("c/x", b"payload", n)))
            .collect();
        let mut offs: Vec<u64> = join_all(futs)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        offs.sort();
        assert_eq!(offs, (0..600).collect::<Vec<_>>());
        let after = p.writer_stats();
        let commits = after.commits - before.commits;
        assert_eq!(after.appended - before.appended, 600);
        assert!(
            commits < 100,
            "600 concurrent publishes took {commits} commits"
        );
        // B-140: at most 256 records a transaction.
        assert!(
            commits >= 3,
            "600 publishes in {commits} commits exceeds 256 a commit"
        );
    });
}

/// B-141: `publish_commit_interval: none` is a transaction per publish.
#[test]
fn per_publish_mode_commits_once_per_record() {
    let dir = temp_dir("perpublish");
    let mut s = settings(&dir);
    s.commit = CommitMode::PerPublish;
    let p = SqliteProvider::open(&s).unwrap();
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        let before = p.writer_stats().commits;
        let futs: Vec<_> = (0..50)
            .map(|n| p.append("c", rec("c/x", b"x", n)))
            .collect();
        for r in join_all(futs).await {
            r.unwrap();
        }
        assert_eq!(p.writer_stats().commits - before, 50);
    });
}

/// B-142, B-143: with an interval, a batch closes on the count at once, or at the
/// interval with whatever it has.
#[test]
fn interval_mode_closes_on_count_or_on_interval() {
    let dir = temp_dir("interval");
    let mut s = settings(&dir);
    s.commit = CommitMode::Interval {
        interval: Duration::from_secs(1),
        max_records: 8,
    };
    let p = SqliteProvider::open(&s).unwrap();
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        let t = Instant::now();
        p.append("c", rec("c/x", b"x", 0)).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(290),
            "lone publisher: {:?}",
            t.elapsed()
        );
        let before = p.writer_stats().commits;
        let t = Instant::now();
        let futs: Vec<_> = (0..8).map(|n| p.append("c", rec("c/x", b"x", n))).collect();
        for r in join_all(futs).await {
            r.unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "full batch: {:?}",
            t.elapsed()
        );
        assert_eq!(p.writer_stats().commits - before, 1);
    });
}

/// B-150, B-153, B-154: reads do not wait behind a publisher waiting out a 1s interval,
/// on read connections and on the write connection alike.
#[test]
fn reads_do_not_wait_behind_a_collecting_publisher() {
    for read_connections in [2, 0] {
        let dir = temp_dir("readbeside");
        let mut s = settings(&dir);
        s.read_connections = read_connections;
        s.commit = CommitMode::Interval {
            interval: Duration::from_secs(1),
            max_records: 64,
        };
        let p = SqliteProvider::open(&s).unwrap();
        smol::block_on(async {
            p.open_channel("c", ChannelSettings::append())
                .await
                .unwrap();
            let publish = p.append("c", rec("c/x", b"x", 0));
            let read = async {
                smol::Timer::after(Duration::from_millis(50)).await;
                let t = Instant::now();
                let w = p.read_window("c", all()).await.unwrap();
                (t.elapsed(), w.records.len())
            };
            let (offset, (took, seen)) = futures_lite::future::zip(publish, read).await;
            offset.unwrap();
            assert_eq!(seen, 0, "the read saw nothing uncommitted");
            assert!(
                took < Duration::from_millis(500),
                "read_connections {read_connections}: read took {took:?}"
            );
        });
    }
}

/// C-021, A-178, C-109, C-110: a channel's max_bytes refuses exactly, with 0x97, and
/// resolution makes room again.
#[test]
fn channel_max_bytes_refuses_the_publish_that_would_exceed_it() {
    let dir = temp_dir("chanmax");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    let r = rec("q/x", &[0; 90], 0);
    let size = r.size();
    smol::block_on(async {
        let chan = ChannelSettings {
            kind: ChannelKind::Queue {
                job_expires_after: None,
            },
            max_bytes: Some(size * 2),
            retention: Retention::default(),
        };
        p.open_channel("q", chan).await.unwrap();
        p.append("q", r.clone()).await.unwrap();
        p.append("q", r.clone()).await.unwrap();
        let e = p.append("q", r.clone()).await.unwrap_err();
        assert!(matches!(e, StorageError::ChannelFull { .. }), "{e}");
        assert_eq!(e.reason_code(), 0x97);
        p.resolve("q", 0).await.unwrap();
        assert_eq!(p.append("q", r).await.unwrap(), 2);
    });
}

/// C-113, C-115, B-419, C-114: the provider bounds its file in pages and keeps a reserve that
/// publishes may not use and the relieving operations may.
#[test]
fn provider_max_bytes_refuses_publishes_but_not_the_dead_letter_move() {
    let dir = temp_dir("provmax");
    let mut s = settings(&dir);
    s.max_bytes = 600 * 1024;
    s.reserve_bytes = 200 * 1024;
    let p = SqliteProvider::open(&s).unwrap();
    smol::block_on(async {
        let q = ChannelSettings {
            kind: ChannelKind::Queue {
                job_expires_after: None,
            },
            max_bytes: None,
            retention: Retention::default(),
        };
        p.open_channel("q", q).await.unwrap();
        let dlq = ChannelSettings {
            kind: ChannelKind::DeadLetter { queue: "q".into() },
            max_bytes: None,
            retention: Retention::default(),
        };
        p.open_channel("q__dlq", dlq).await.unwrap();
        let mut stored = 0u64;
        let err = loop {
            match p.append("q", rec("q/x", &[7; 4000], stored)).await {
                Ok(_) => stored += 1,
                Err(e) => break e,
            }
            assert!(stored < 1000, "never refused");
        };
        assert!(matches!(err, StorageError::ProviderFull { .. }), "{err}");
        assert_eq!(err.reason_code(), 0x97);
        assert!(stored > 50, "only {stored} stored before the bound");
        // The reserve is untouched by publishes: pages in use stay below it.
        let used = p.writer_stats().used_bytes;
        assert!(
            used > 50 * 4000 && used <= s.max_bytes - s.reserve_bytes,
            "{used}"
        );
        let one = Attempts {
            count: 1,
            first_ms: Some(10),
            last_ms: Some(10),
        };
        p.store_attempts("q", 0, one, 0).await.unwrap();
        let moved = p
            .dead_letter(
                "q",
                0,
                to_dlq(
                    "q__dlq",
                    "q/x",
                    9,
                    vec![("saguin-dlq-offset".into(), "0".into())],
                ),
            )
            .await
            .unwrap();
        assert_eq!(moved, 0);
        p.set_position("client", "q__dlq", 1).await.unwrap();
        let w = p.read_window("q__dlq", all()).await.unwrap();
        assert_eq!(w.records[0].properties.user_properties.len(), 1);
        assert_eq!(
            w.records[0].message_id, "id-0-4000",
            "C-124: the id is kept"
        );
        assert_eq!(p.position("client", "q__dlq").await.unwrap(), Some(1));
    });
}

/// C-115, B-419: a record's Correlation Data, Content Type and Response Topic take
/// pages though its counted size leaves them out; publishes carrying them still
/// stop short of the reserve, which stays for what frees room.
#[test]
fn records_with_large_properties_stop_short_of_the_reserve() {
    let dir = temp_dir("provmax-props");
    let mut s = settings(&dir);
    s.max_bytes = 600 * 1024;
    s.reserve_bytes = 200 * 1024;
    let p = SqliteProvider::open(&s).unwrap();
    smol::block_on(async {
        p.open_channel("log", ChannelSettings::append())
            .await
            .unwrap();
        let mut stored = 0u64;
        let err = loop {
            let mut r = rec("log/x", b"", stored);
            r.properties.correlation_data = Some(vec![7; 30_000]);
            r.properties.content_type = Some("c".repeat(20_000));
            match p.append("log", r).await {
                Ok(_) => stored += 1,
                Err(e) => break e,
            }
            assert!(stored < 1000, "never refused");
        };
        assert!(matches!(err, StorageError::ProviderFull { .. }), "{err}");
        let used = p.writer_stats().used_bytes;
        assert!(
            used <= s.max_bytes - s.reserve_bytes,
            "{used} of {}",
            s.max_bytes
        );
        // The reserve is there for what relieves the store.
        p.set_position("client", "log", 1).await.unwrap();
    });
}

/// C-115, B-471: session records are refused 0x97 at the provider's bound less its
/// reserve, as publishes and held QoS 2 publishes are, rather than growing the file
/// into the room kept for what frees it.
#[test]
fn session_records_stop_short_of_the_reserve() {
    let dir = temp_dir("sessmax");
    let mut s = settings(&dir);
    s.max_bytes = 600 * 1024;
    s.reserve_bytes = 200 * 1024;
    let p = SqliteProvider::open(&s).unwrap();
    smol::block_on(async {
        let record = "r".repeat(4000);
        let mut stored = 0u64;
        let err = loop {
            match p
                .put_session(&format!("client-{stored}"), record.clone())
                .await
            {
                Ok(()) => stored += 1,
                Err(e) => break e,
            }
            assert!(stored < 1000, "never refused");
        };
        assert!(matches!(err, StorageError::ProviderFull { .. }), "{err}");
        assert_eq!(err.reason_code(), 0x97);
        assert!(stored > 50, "only {stored} stored before the bound");
        let used = p.writer_stats().used_bytes;
        assert!(used <= s.max_bytes - s.reserve_bytes, "{used}");
        // What frees room still works at the bound.
        p.delete_session("client-0").await.unwrap();
    });
}

/// B-520, B-522: a second broker on the same file refuses to start, naming the lock,
/// and the lock goes with its holder.
#[test]
fn a_second_provider_on_the_same_file_is_refused_naming_the_lock() {
    let dir = temp_dir("lock");
    let first = SqliteProvider::open(&settings(&dir)).unwrap();
    let err = SqliteProvider::open(&settings(&dir)).unwrap_err();
    let lock = dir.join("saguin.db.lock");
    assert_eq!(
        err,
        StorageError::Locked {
            provider: "local".into(),
            lock: lock.clone()
        }
    );
    assert!(err.to_string().contains(&lock.display().to_string()));
    drop(first);
    SqliteProvider::open(&settings(&dir)).unwrap();
}

/// B-521, C-221: another process reads the live database (what `sqlite3` would do).
#[test]
fn another_process_reads_the_database_while_the_provider_has_it_open() {
    let dir = temp_dir("external");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    smol::block_on(async {
        p.open_channel("events", ChannelSettings::append())
            .await
            .unwrap();
        for n in 0..3 {
            p.append("events", rec("events/x", b"hello", n))
                .await
                .unwrap();
        }
    });
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "external_reader", "--nocapture"])
        .env("SAGUIN_EXTERNAL_DB", dir.join("saguin.db"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("EXTERNAL events 3"), "{stdout}");
    drop(p);
}

/// Run by the test above in a child process: a plain read-only rusqlite connection.
#[test]
#[ignore = "helper run in a child process by another test"]
fn external_reader() {
    let Ok(path) = std::env::var("SAGUIN_EXTERNAL_DB") else {
        return;
    };
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(&path, flags).unwrap();
    let n: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM records JOIN channels ON channels.id = records.channel_id \
             WHERE channels.name = 'events'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    println!("EXTERNAL events {n}");
}

/// A refusal inside a batch does not undo its neighbours: ten concurrent publishes into
/// a channel with room for five are five stored and five refused (C-021).
#[test]
fn a_refused_publish_does_not_undo_the_rest_of_its_batch() {
    let dir = temp_dir("batchrefusal");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    let r = rec("c/x", &[0; 93], 0);
    smol::block_on(async {
        let chan = ChannelSettings {
            kind: ChannelKind::Append,
            max_bytes: Some(r.size() * 5),
            retention: Retention::default(),
        };
        p.open_channel("c", chan).await.unwrap();
        let futs: Vec<_> = (0..10).map(|_| p.append("c", r.clone())).collect();
        let results = join_all(futs).await;
        let ok: Vec<u64> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        assert_eq!(ok, vec![0, 1, 2, 3, 4]);
        assert!(
            results[5..]
                .iter()
                .all(|r| matches!(r, Err(StorageError::ChannelFull { .. })))
        );
        let s = p.stats("c").await.unwrap();
        assert_eq!((s.records, s.bytes, s.head), (5, 5 * r.size(), 5));
    });
}

/// B-157, B-159: the log is forced to disk one flush_interval after a commit, once, and
/// an idle provider forces nothing.
#[test]
fn the_log_is_flushed_after_writes_and_never_when_idle() {
    let dir = temp_dir("flush");
    let mut s = settings(&dir);
    s.flush_interval = Duration::from_millis(50);
    let p = SqliteProvider::open(&s).unwrap();
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        smol::Timer::after(Duration::from_millis(200)).await;
        assert_eq!(p.writer_stats().flushes, 0, "idle: nothing to force");
        p.append("c", rec("c/x", b"x", 0)).await.unwrap();
        smol::Timer::after(Duration::from_millis(200)).await;
        assert_eq!(p.writer_stats().flushes, 1);
        smol::Timer::after(Duration::from_millis(200)).await;
        assert_eq!(p.writer_stats().flushes, 1, "idle again");
    });
}

/// B-154: a window read on a read connection does not queue behind a write in progress.
/// Another connection holds the write lock; the provider's append waits for it, and a
/// read answers meanwhile.
#[test]
fn a_read_answers_while_a_write_is_held_up() {
    let dir = temp_dir("readwhilewrite");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    smol::block_on(async {
        p.open_channel("c", ChannelSettings::append())
            .await
            .unwrap();
        p.append("c", rec("c/x", b"first", 0)).await.unwrap();
    });
    let blocker = rusqlite::Connection::open(dir.join("saguin.db")).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    smol::block_on(async {
        let write = p.append("c", rec("c/x", b"second", 1));
        let read = async {
            smol::Timer::after(Duration::from_millis(100)).await;
            let t = Instant::now();
            let w = p.read_window("c", all()).await.unwrap();
            let took = t.elapsed();
            blocker.execute_batch("ROLLBACK").unwrap();
            (took, w.records.len())
        };
        let (written, (took, seen)) = futures_lite::future::zip(write, read).await;
        assert_eq!(written.unwrap(), 1);
        assert_eq!(seen, 1);
        assert!(took < Duration::from_millis(500), "read took {took:?}");
    });
}

/// C-129, C-130: a file written before jobs kept their attempts' times is given the
/// columns at open, keeping its jobs; an attempt counted before then has no time
/// (its header is left out rather than guessed), and the times are stored from then.
#[test]
fn a_file_from_before_attempt_times_gets_them_and_keeps_its_jobs() {
    let dir = temp_dir("attempt-times");
    let queue = ChannelSettings {
        kind: ChannelKind::Queue {
            job_expires_after: None,
        },
        max_bytes: None,
        retention: Retention::default(),
    };
    {
        let p = SqliteProvider::open(&settings(&dir)).unwrap();
        smol::block_on(async {
            p.open_channel("q", queue.clone()).await.unwrap();
            p.append("q", rec("q/a", b"job", 1)).await.unwrap();
        });
    }
    // The file as the earlier version left it: one attempt spent, no time columns.
    let c = rusqlite::Connection::open(dir.join("saguin.db")).unwrap();
    c.execute_batch(
        "UPDATE records SET attempts = 1; \
         ALTER TABLE records DROP COLUMN first_attempt_ms; \
         ALTER TABLE records DROP COLUMN last_attempt_ms;",
    )
    .unwrap();
    drop(c);
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    let job = |w: saguin::storage::Window| w.records[0].state;
    smol::block_on(async {
        p.open_channel("q", queue).await.unwrap();
        let before = job(p.read_window("q", all()).await.unwrap());
        let legacy = Attempts {
            count: 1,
            ..Attempts::default()
        };
        assert_eq!(
            before,
            RecordState::Job {
                attempts: legacy,
                available_after_ms: 0
            }
        );
        // The next attempt, as the owner counts one whose first time is unknown.
        let spent = Attempts {
            count: 2,
            first_ms: None,
            last_ms: Some(777),
        };
        p.store_attempts("q", 0, spent, 0).await.unwrap();
        let after = job(p.read_window("q", all()).await.unwrap());
        assert_eq!(
            after,
            RecordState::Job {
                attempts: spent,
                available_after_ms: 0
            }
        );
    });
}

/// A database written by a newer schema is refused, saying what to do.
#[test]
fn a_database_from_a_newer_version_is_refused() {
    let dir = temp_dir("version");
    let path = dir.join("saguin.db");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(c);
    let e = SqliteProvider::open(&settings(&dir)).unwrap_err();
    assert!(e.to_string().contains("newer Sagüin"), "{e}");
}

/// RFC 0004 "Group commit" as gaps.md proposes it: a publish is taken before consumer
/// positions already queued, so acknowledgements never hold a publisher up. Another
/// connection holds the write lock while 3000 position writes and then one publish
/// queue up; once it lets go, the publish goes in the next transaction, ahead of all
/// but the positions already taken into the first and the background share.
#[test]
fn a_publish_is_taken_before_queued_position_writes() {
    type Task<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;
    let dir = temp_dir("lanes");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    smol::block_on(p.open_channel("c", ChannelSettings::append())).unwrap();
    let blocker = rusqlite::Connection::open(dir.join("saguin.db")).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let done = std::cell::RefCell::new(Vec::new());
    let (go_tx, go_rx) = smol::channel::bounded::<()>(1);
    let (p, done_ref) = (&p, &done);
    let mut tasks: Vec<Task<'_>> = vec![Box::pin(async move {
        go_rx.recv().await.unwrap();
        p.append("c", rec("c/x", b"x", 0)).await.unwrap();
        done_ref.borrow_mut().push("publish");
    })];
    for n in 0..3000u64 {
        tasks.push(Box::pin(async move {
            p.set_position(&format!("client-{n}"), "c", n)
                .await
                .unwrap();
            done_ref.borrow_mut().push("position");
        }));
    }
    tasks.push(Box::pin(async {
        go_tx.send(()).await.unwrap();
        smol::Timer::after(Duration::from_millis(300)).await;
        blocker.execute_batch("ROLLBACK").unwrap();
    }));
    smol::block_on(join_all(tasks));
    let order = done.borrow();
    assert_eq!(order.len(), 3001);
    let at = order.iter().position(|s| *s == "publish").unwrap();
    // The first batch (up to 1024 writes) was taken before the publish came; each
    // batch after it also takes a share of 16 position writes (B-457), so a few may
    // go ahead - but never the 3000 queued.
    assert!(
        at <= 1280,
        "the publish completed after {at} position writes"
    );
}

/// B-457, gaps "Group commit" (the rest in turns): position writes are taken while
/// publishers keep the urgent lane from ever emptying. They once waited until the
/// publishers stopped, and so did a Clean Start's CONNACK on its positions' deletion.
/// Another connection holds the write lock until 3000 publishers have each queued an
/// append and the position write has queued behind them.
#[test]
fn position_writes_are_taken_while_publishers_keep_the_writer_busy() {
    type Task<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;
    let dir = temp_dir("lanes-share");
    let p = SqliteProvider::open(&settings(&dir)).unwrap();
    smol::block_on(p.open_channel("c", ChannelSettings::append())).unwrap();
    let blocker = rusqlite::Connection::open(dir.join("saguin.db")).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let stop = std::cell::Cell::new(false);
    let written = std::cell::Cell::new(None);
    let (p, stop, written) = (&p, &stop, &written);
    let mut tasks: Vec<Task<'_>> = (0..3000u64)
        .map(|n| -> Task<'_> {
            Box::pin(async move {
                while !stop.get() {
                    p.append("c", rec("c/x", b"x", n)).await.unwrap();
                }
            })
        })
        .collect();
    tasks.push(Box::pin(async move {
        smol::Timer::after(Duration::from_millis(100)).await;
        let wrote = p.set_position("reader", "c", 1);
        let timeout = async {
            smol::Timer::after(Duration::from_secs(10)).await;
            Err(StorageError::Closed {
                provider: "timeout".into(),
            })
        };
        let got = futures_lite::FutureExt::or(wrote, timeout).await;
        written.set(Some(got.is_ok()));
        stop.set(true);
    }));
    tasks.push(Box::pin(async {
        smol::Timer::after(Duration::from_millis(300)).await;
        blocker.execute_batch("ROLLBACK").unwrap();
    }));
    smol::block_on(join_all(tasks));
    assert_eq!(
        written.get(),
        Some(true),
        "the position was not written within 10 s of busy publishing"
    );
}

/// A file_path naming another program's database is refused, naming its tables, and
/// left as it was found: not switched to WAL, not given Sagüin's tables or version.
#[test]
fn another_programs_database_is_refused_and_left_as_it_was() {
    let dir = temp_dir("foreign");
    let path = dir.join("saguin.db");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch("CREATE TABLE sessions(id INTEGER); CREATE TABLE invoices(n INTEGER);")
        .unwrap();
    drop(c);
    let e = SqliteProvider::open(&settings(&dir)).unwrap_err();
    assert!(e.to_string().contains("invoices"), "{e}");
    let c = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    let tables: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!((version, mode.as_str(), tables), (0, "delete", 2));
}

/// The same for another program's database that numbers its own schema with
/// user_version, as migration tools do.
#[test]
fn another_programs_versioned_database_is_refused_and_left_as_it_was() {
    let dir = temp_dir("foreign-versioned");
    let path = dir.join("saguin.db");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch("CREATE TABLE users(x INTEGER); PRAGMA user_version = 1;")
        .unwrap();
    drop(c);
    let e = SqliteProvider::open(&settings(&dir)).unwrap_err();
    assert!(e.to_string().contains("users"), "{e}");
    let c = rusqlite::Connection::open(&path).unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
}
