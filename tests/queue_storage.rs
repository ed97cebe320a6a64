//! The dead-letter move with its rewritten topic, on both provider kinds (issue 6;
//! C-118, C-119, C-123, C-124).

mod storage_support;

use saguin::storage::{
    ChannelKind, ChannelSettings, MemorySettings, Provider, ProviderSettings, RecordState,
    Retention, SqliteSettings,
};
use storage_support::{all, rec, temp_dir};

fn both() -> Vec<Provider> {
    let dir = temp_dir("queue-storage");
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

fn settings(kind: ChannelKind) -> ChannelSettings {
    ChannelSettings {
        kind,
        max_bytes: None,
        retention: Retention::default(),
    }
}

/// The move takes the job out of the queue and writes it into the dead-letter channel
/// under the topic it is given, id, payload and headers kept, in one step.
#[test]
fn dead_letter_to_writes_the_rewritten_topic() {
    for p in both() {
        smol::block_on(async {
            p.open_channel(
                "jobs",
                settings(ChannelKind::Queue {
                    job_expires_after: None,
                }),
            )
            .await
            .unwrap();
            p.open_channel(
                "jobs__dlq",
                settings(ChannelKind::DeadLetter {
                    queue: "jobs".into(),
                }),
            )
            .await
            .unwrap();
            let offset = p.append("jobs", rec("jobs/j1", b"work", 5)).await.unwrap();
            let extra = vec![("saguin-dlq-reason".to_owned(), "expired".to_owned())];
            let at = p
                .dead_letter_to(
                    "jobs",
                    offset,
                    "jobs__dlq",
                    Some("jobs/__dlq/j1".into()),
                    extra.clone(),
                )
                .await
                .unwrap();
            assert!(
                p.read_window("jobs", all())
                    .await
                    .unwrap()
                    .records
                    .is_empty()
            );
            let d = p.read_window("jobs__dlq", all()).await.unwrap();
            let r = &d.records[0];
            assert_eq!(r.offset, at);
            assert_eq!(r.topic, "jobs/__dlq/j1");
            assert_eq!(r.message_id, "id-5-4");
            assert_eq!(r.payload, b"work");
            assert_eq!(r.properties.user_properties, extra);
            assert_eq!(r.state, RecordState::Stored);
        });
    }
}
