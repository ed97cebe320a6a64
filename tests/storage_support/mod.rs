//! Helpers shared by the storage tests.
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::task::Poll;

use saguin::storage::{DeadLetter, NewRecord, RecordProperties, WindowRequest};

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("saguin-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A record with an id derived from its timestamp and payload length.
pub fn rec(topic: &str, payload: &[u8], ts: u64) -> NewRecord {
    NewRecord {
        message_id: format!("id-{ts}-{}", payload.len()),
        timestamp_ms: ts,
        topic: topic.into(),
        payload: payload.to_vec(),
        properties: RecordProperties::default(),
    }
}

/// A dead-letter move into `channel`, the topic taking `__dlq` after its first level
/// (as for the default filter `<queue>/#`).
pub fn to_dlq(channel: &str, topic: &str, ts: u64, props: Vec<(String, String)>) -> DeadLetter {
    let topic = match topic.split_once('/') {
        Some((first, rest)) => format!("{first}/__dlq/{rest}"),
        None => format!("{topic}/__dlq"),
    };
    DeadLetter {
        channel: channel.to_owned(),
        topic,
        timestamp_ms: ts,
        user_properties: props,
    }
}

/// Everything from offset 0.
pub fn all() -> WindowRequest {
    WindowRequest::new(0, 1024, u64::MAX)
}

/// Polls every future concurrently on the current task until all are done.
pub async fn join_all<T>(futs: Vec<impl Future<Output = T>>) -> Vec<T> {
    let mut tasks: Vec<_> = futs.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut results: Vec<Option<T>> = (0..tasks.len()).map(|_| None).collect();
    futures_lite::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, t) in tasks.iter_mut().enumerate() {
            if let Some(f) = t {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        results[i] = Some(v);
                        *t = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    results.into_iter().flatten().collect()
}
