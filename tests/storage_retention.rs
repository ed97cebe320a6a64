//! The sweep loop: both sweeps at startup, then on their own clocks, on both kinds.

mod storage_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use saguin::storage::{
    ChannelKind, ChannelSettings, MemorySettings, Provider, ProviderSettings, Retention,
    RetentionSchedule, SqliteSettings, run_sweeps,
};
use storage_support::{rec, temp_dir};

fn providers(tag: &str) -> Vec<Arc<Provider>> {
    let dir = temp_dir(tag);
    let sqlite = SqliteSettings::new("disk", dir.join("s.db"), 64 << 20, 1 << 20);
    let memory = MemorySettings {
        name: "ram".into(),
        max_bytes: 64 << 20,
        reserve_bytes: 1 << 20,
        snapshot_dir: None,
    };
    vec![
        Arc::new(Provider::open(&ProviderSettings::Sqlite(sqlite)).unwrap()),
        Arc::new(Provider::open(&ProviderSettings::Memory(memory)).unwrap()),
    ]
}

/// C-023: the age sweep interval is a tenth of the period (10 s → 1 s).
/// C-030: both sweeps run once at startup; C-024: the age sweep then runs on its own
/// timer, so a channel nobody writes to still ages out; C-022: the size sweep brings a
/// channel back under retention_bytes.
#[test]
fn sweeps_run_at_startup_and_then_on_their_own_clock() {
    let ps = providers("sweeps");
    let aged = ChannelSettings {
        kind: ChannelKind::Append,
        max_bytes: None,
        retention: Retention {
            period: Some(Duration::from_secs(10)),
            bytes: None,
        },
    };
    let sized = ChannelSettings {
        kind: ChannelKind::Append,
        max_bytes: None,
        retention: Retention {
            period: None,
            bytes: Some(1),
        },
    };
    let clock = Arc::new(AtomicU64::new(100_000));
    smol::block_on(async {
        for p in &ps {
            p.open_channel("aged", aged.clone()).await.unwrap();
            p.open_channel("sized", sized.clone()).await.unwrap();
            p.append("aged", rec("a/x", b"old", 50_000)).await.unwrap();
            p.append("aged", rec("a/x", b"new", 95_000)).await.unwrap();
            p.append("sized", rec("s/x", b"1", 1)).await.unwrap();
            p.append("sized", rec("s/x", b"2", 2)).await.unwrap();
        }
        let schedule = RetentionSchedule::for_channels([&aged, &sized], []);
        assert_eq!(schedule.age_interval, Duration::from_secs(1));
        let (stop_tx, stop_rx) = smol::channel::bounded(1);
        let c = clock.clone();
        let sweeper = smol::spawn(run_sweeps(
            ps.clone(),
            schedule,
            move || c.load(Ordering::SeqCst),
            stop_rx,
        ));
        smol::Timer::after(Duration::from_millis(200)).await;
        for p in &ps {
            assert_eq!(
                p.stats("aged").await.unwrap().records,
                1,
                "{} at startup",
                p.name()
            );
            // Size sweep brings it under 1 byte: nothing can stay.
            assert_eq!(p.stats("sized").await.unwrap().records, 0, "{}", p.name());
        }
        // Time passes with no writes; the next age tick removes the second record.
        clock.store(106_000, Ordering::SeqCst);
        smol::Timer::after(Duration::from_millis(1300)).await;
        for p in &ps {
            let s = p.stats("aged").await.unwrap();
            assert_eq!((s.records, s.floor, s.head), (0, 2, 2), "{}", p.name());
        }
        stop_tx.send(()).await.unwrap();
        sweeper.await;
    });
}
