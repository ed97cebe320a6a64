//! Which client ids may hold a stored position in the file, so that the Clean Start
//! of a client that never stored one does not wait on the writer thread for a
//! `DELETE` that finds nothing (gaps G-11: Clean Start discards stored positions).
//! That round trip was the largest part of a CONNECT's cost (BENCHMARKS.md, "The
//! twenty-third session").
//!
//! One bit per hash of a client id: set before a position of that id is queued for
//! writing, and at open for every client id the file holds positions of. A clear bit
//! proves the file has no row of that id; a set one - its own, or another id's that
//! hashes alike - costs the `DELETE` as before. Bits are never cleared, since two ids
//! may share one. 8 KiB whatever the number of clients.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

const BITS: u64 = 1 << 16;

/// The client ids that may hold a stored position.
pub(super) struct Positioned {
    words: Box<[AtomicU64]>,
}

impl Positioned {
    /// No client id holds a position.
    pub(super) fn new() -> Self {
        Self {
            words: (0..BITS / 64).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The word and the bit of `client_id`.
    fn bit(&self, client_id: &str) -> (&AtomicU64, u64) {
        let mut hasher = DefaultHasher::new();
        client_id.hash(&mut hasher);
        let bit = hasher.finish() % BITS;
        // `bit / 64` < BITS / 64, the words' length.
        (&self.words[(bit / 64) as usize], 1 << (bit % 64))
    }

    /// `client_id` may hold a position from now on; call before queueing its write.
    pub(super) fn mark(&self, client_id: &str) {
        let (word, mask) = self.bit(client_id);
        // Relaxed: the write it precedes is queued on a channel, which orders it.
        word.fetch_or(mask, Ordering::Relaxed);
    }

    /// Whether the file may hold a position of `client_id`; `false` proves it does not.
    pub(super) fn may_hold(&self, client_id: &str) -> bool {
        let (word, mask) = self.bit(client_id);
        word.load(Ordering::Relaxed) & mask != 0
    }
}

impl std::fmt::Debug for Positioned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set: u32 = self
            .words
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones())
            .sum();
        write!(f, "Positioned({set} of {BITS} bits set)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_held_once_marked_and_not_before() {
        let p = Positioned::new();
        assert!(!p.may_hold("sensor-1"));
        p.mark("sensor-1");
        assert!(p.may_hold("sensor-1"));
        // An unmarked id shares the one set bit with a chance of 1 in 65,536.
        let clear = (0..1000)
            .filter(|n| !p.may_hold(&format!("other-{n}")))
            .count();
        assert!(clear >= 990, "{clear} of 1000 unmarked ids clear");
    }

    #[test]
    fn marking_is_idempotent_and_needs_no_lock() {
        let p = std::sync::Arc::new(Positioned::new());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for n in 0..100 {
                        p.mark(&format!("t{t}-{n}"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!((0..4).all(|t| (0..100).all(|n| p.may_hold(&format!("t{t}-{n}")))));
    }
}
