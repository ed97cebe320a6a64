//! Retention sweeps on the broker's clock (RFC 0003 "When retention removes").
//!
//! Retention is never applied by the write that exceeds it (C-019): two sweeps remove
//! behind the producer, silently. The size sweep runs on a fixed, frequent interval; the
//! age sweep at a tenth of the shortest deadline any channel configured (every
//! `retention_period` and every queue's `job_expires_after`), floored at one second.
//! Both run once at startup, and neither interval is configurable (C-025 to C-030).
//!
//! An append or dead-letter log ages as a prefix: everything below the first record
//! young enough to keep goes, so the records above the floor stay contiguous. (A clock
//! stepped back can therefore shield older records until the newer one ages.) A latest
//! channel's values age one by one, each by its own timestamp; a queue never ages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::FutureExt;

use super::provider::Provider;
use super::settings::{ChannelKind, ChannelSettings};

/// How often the size sweep runs: the most a channel sits above its `retention_bytes`.
pub const SIZE_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The age sweep's floor, which is also its interval when nothing sets a deadline.
pub const AGE_SWEEP_FLOOR: Duration = Duration::from_secs(1);

/// The two sweep intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionSchedule {
    /// Size sweep interval ([`SIZE_SWEEP_INTERVAL`]).
    pub size_interval: Duration,
    /// Age sweep interval: a tenth of the shortest deadline, at least one second.
    pub age_interval: Duration,
}

impl RetentionSchedule {
    /// The schedule for these channels (C-026). `extra_deadlines` are deadlines kept
    /// outside channels that the same sweep enforces (e.g. `broker.retained`'s period).
    pub fn for_channels<'a>(
        channels: impl IntoIterator<Item = &'a ChannelSettings>,
        extra_deadlines: impl IntoIterator<Item = Duration>,
    ) -> RetentionSchedule {
        let from_channels = channels.into_iter().flat_map(|c| {
            let period = c.effective_retention().period;
            let job = match c.kind {
                ChannelKind::Queue { job_expires_after } => job_expires_after,
                _ => None,
            };
            period.into_iter().chain(job)
        });
        let shortest = from_channels.chain(extra_deadlines).min();
        RetentionSchedule {
            size_interval: SIZE_SWEEP_INTERVAL,
            age_interval: shortest.map_or(AGE_SWEEP_FLOOR, |d| (d / 10).max(AGE_SWEEP_FLOOR)),
        }
    }

    /// The startup log line stating both intervals.
    pub fn describe(&self) -> String {
        format!(
            "retention: size sweep every {:?}, age sweep every {:?} (a tenth of the shortest deadline, at least 1s)",
            self.size_interval, self.age_interval
        )
    }
}

/// Runs both sweeps over `providers`: once now, then on their intervals, until `stop`
/// yields or closes. `now_ms` is the broker's clock in milliseconds since the epoch.
/// A sweep that fails is logged and tried again at its next tick.
pub async fn run_sweeps(
    providers: Vec<Arc<Provider>>,
    schedule: RetentionSchedule,
    now_ms: impl Fn() -> u64,
    stop: smol::channel::Receiver<()>,
) {
    log::info!("{}", schedule.describe());
    let mut next_size = Instant::now();
    let mut next_age = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_size {
            for p in &providers {
                report(p, "size", p.sweep_size().await);
            }
            next_size = now + schedule.size_interval;
        }
        if now >= next_age {
            for p in &providers {
                report(p, "age", p.sweep_age(now_ms()).await);
            }
            next_age = now + schedule.age_interval;
        }
        let wake = next_size.min(next_age);
        let stopped = async {
            let _ = stop.recv().await;
            true
        }
        .or(async {
            smol::Timer::at(wake).await;
            false
        })
        .await;
        if stopped {
            return;
        }
    }
}

fn report(
    p: &Provider,
    which: &str,
    r: Result<super::record::SweepReport, super::error::StorageError>,
) {
    match r {
        Ok(r) if r.records > 0 => log::info!(
            "storage provider {}: {which} sweep removed {} records ({} bytes)",
            p.name(),
            r.records,
            r.bytes
        ),
        Ok(_) => {}
        Err(e) => log::warn!("{which} sweep: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::settings::Retention;

    fn append(period: Option<Duration>) -> ChannelSettings {
        ChannelSettings {
            kind: ChannelKind::Append,
            max_bytes: None,
            retention: Retention {
                period,
                bytes: None,
            },
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    /// C-028: a shortest deadline of 30 days sweeps every 3 days.
    #[test]
    fn thirty_day_retention_sweeps_every_three_days() {
        let s = RetentionSchedule::for_channels(&[append(Some(30 * DAY)), append(None)], []);
        assert_eq!(s.age_interval, 3 * DAY);
        assert_eq!(s.size_interval, SIZE_SWEEP_INTERVAL);
    }

    /// C-026: a queue's job_expires_after counts, and the result is floored at 1s.
    #[test]
    fn job_expiry_counts_and_the_interval_is_floored_at_one_second() {
        let q = ChannelSettings {
            kind: ChannelKind::Queue {
                job_expires_after: Some(Duration::from_secs(60)),
            },
            max_bytes: None,
            // A queue's retention is never applied, so it is not a deadline.
            retention: Retention {
                period: Some(Duration::from_secs(2)),
                bytes: None,
            },
        };
        let s = RetentionSchedule::for_channels(&[append(Some(DAY)), q], []);
        assert_eq!(s.age_interval, Duration::from_secs(6));
        let s = RetentionSchedule::for_channels(&[append(Some(Duration::from_secs(5)))], []);
        assert_eq!(s.age_interval, AGE_SWEEP_FLOOR);
    }

    /// C-027: no deadline anywhere sweeps every second.
    #[test]
    fn no_deadline_sweeps_every_second() {
        let s = RetentionSchedule::for_channels(&[append(None)], []);
        assert_eq!(s.age_interval, Duration::from_secs(1));
        assert!(s.describe().contains("1s"));
    }
}
