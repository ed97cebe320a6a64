//! The thin handle the broker keeps to a connection: wake it, or tell it to end.

use std::cell::Cell;

/// Shared between a connection task and the session it holds. The broker never
/// writes to a socket; it queues deliveries on the session and wakes the connection.
#[derive(Debug)]
pub struct ConnLink {
    /// Unique per connection, so a session can tell which connection holds it.
    pub id: u64,
    wake: smol::channel::Sender<()>,
    kick: Cell<Option<u8>>,
}

impl ConnLink {
    /// A link and the receiver its connection task waits on.
    pub fn new(id: u64) -> (ConnLink, smol::channel::Receiver<()>) {
        let (wake, woken) = smol::channel::bounded(1);
        (
            ConnLink {
                id,
                wake,
                kick: Cell::new(None),
            },
            woken,
        )
    }

    /// Wakes the connection to write what its session has queued.
    pub fn wake(&self) {
        // Full means a wake-up is already pending, which is all a wake-up says.
        let _ = self.wake.try_send(());
    }

    /// Tells the connection to end with `reason` (a DISCONNECT reason code).
    pub fn kick(&self, reason: u8) {
        self.kick.set(Some(reason));
        self.wake();
    }

    /// The reason the connection was told to end with, if it was.
    pub fn kicked(&self) -> Option<u8> {
        self.kick.get()
    }
}
