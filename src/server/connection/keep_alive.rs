//! The keep-alive watch (MQTT-3.1.2-24): a client silent for one and a half times
//! its Keep Alive is disconnected.
//!
//! One timer per connection, re-armed only when it fires: arming a timer wakes the
//! reactor, and doing it for every packet would cost every packet a wake-up.

use std::time::{Duration, Instant};

use smol::Timer;

pub(super) struct KeepAlive {
    /// One and a half times the negotiated Keep Alive.
    grace: Duration,
    heard_at: Instant,
    timer: Timer,
}

impl KeepAlive {
    pub(super) fn new(grace: Duration) -> KeepAlive {
        let now = Instant::now();
        KeepAlive {
            grace,
            heard_at: now,
            timer: Timer::at(now + grace),
        }
    }

    /// The client sent something: its silence starts again now.
    pub(super) fn heard(&mut self) {
        self.heard_at = Instant::now();
    }

    /// Resolves once the client has been silent for the whole grace.
    pub(super) async fn expired(&mut self) {
        loop {
            (&mut self.timer).await;
            let due = self.heard_at + self.grace;
            if Instant::now() >= due {
                return;
            }
            self.timer.set_at(due);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_heard_pushes_the_expiry_back() {
        smol::block_on(async {
            let grace = Duration::from_millis(60);
            let started = Instant::now();
            let mut watch = KeepAlive::new(grace);
            Timer::after(Duration::from_millis(40)).await;
            watch.heard();
            watch.expired().await;
            assert!(started.elapsed() >= Duration::from_millis(100));
        });
    }
}
