//! The MQTT listeners: accept sockets, run one task per connection, stop gracefully.
//!
//! Everything runs on one thread: a `LocalExecutor` drives every connection task, the
//! once-a-second housekeeping tick, and the shutdown. The broker's state is a
//! `RefCell` borrowed for one operation at a time, never across an await.

mod connection;
mod frame;

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use smol::LocalExecutor;
use smol::net::TcpListener;

use crate::broker::{Broker, Settings};
use crate::codec::reason;

/// What every connection task shares.
/// What every connection task shares: the broker's state and the settings.
#[derive(Debug)]
pub struct Shared {
    /// The broker's state.
    pub broker: RefCell<Broker>,
    /// The settings it runs with.
    pub settings: Settings,
    next_link: Cell<u64>,
    active: Cell<usize>,
    stopping: Cell<bool>,
}

impl Shared {
    /// Whether the broker is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Connections open now, admitted or still in CONNECT.
    pub fn active_connections(&self) -> usize {
        self.active.get()
    }

    fn next_link_id(&self) -> u64 {
        let id = self.next_link.get() + 1;
        self.next_link.set(id);
        id
    }
}

/// Counts a connection while it lives.
struct ActiveGuard(Rc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.set(self.0.active.get() - 1);
    }
}

/// Binds every address; a port in use is reported naming the address.
///
/// # Errors
/// The first address that cannot be bound.
pub fn bind(addrs: &[SocketAddr]) -> io::Result<Vec<std::net::TcpListener>> {
    addrs
        .iter()
        .map(|addr| {
            std::net::TcpListener::bind(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
        })
        .collect()
}

/// The operations listener's bound doors and settings.
#[derive(Debug)]
pub struct OpsDoors {
    /// Where and how it serves.
    pub settings: crate::ops::OpsSettings,
    /// Bound TCP listeners.
    pub tcp: Vec<std::net::TcpListener>,
    /// The bound Unix socket.
    pub unix: Option<crate::ops::UnixDoor>,
}

/// Serves MQTT on `listeners` until `stop` resolves, then disconnects every client
/// (MQTT 5 clients get DISCONNECT 0x8B) and returns.
///
/// # Errors
/// A listener that fails to register with the reactor.
pub fn serve(
    settings: Settings,
    listeners: Vec<std::net::TcpListener>,
    channels: crate::broker::channels::Channels,
    operations: Option<OpsDoors>,
    stop: impl std::future::Future<Output = ()>,
) -> io::Result<()> {
    let executor = Rc::new(LocalExecutor::new());
    let shared = Rc::new(Shared {
        broker: RefCell::new(Broker::new(settings.clone(), channels)),
        settings,
        next_link: Cell::new(0),
        active: Cell::new(0),
        stopping: Cell::new(false),
    });
    smol::block_on(executor.run(async {
        for listener in listeners {
            let listener = TcpListener::try_from(listener)?;
            log::info!("listening on {}", listener.local_addr()?);
            executor
                .spawn(accept_loop(listener, shared.clone(), executor.clone()))
                .detach();
        }
        if let Some(ops) = operations {
            crate::ops::spawn(&executor, &shared, &ops.settings, ops.tcp, ops.unix)?;
        }
        executor.spawn(housekeeping(shared.clone())).detach();
        crate::broker::queue::owner::spawn(&executor, &shared);
        stop.await;
        shutdown(&shared).await;
        store_unstored(&shared).await;
        let providers = shared.broker.borrow().channels.providers();
        for provider in providers {
            if let Err(e) = provider.close(crate::broker::records::now_ms()) {
                log::error!("storage provider {}: {e}", provider.name());
            }
        }
        Ok(())
    }))
}

async fn accept_loop(
    listener: TcpListener,
    shared: Rc<Shared>,
    executor: Rc<LocalExecutor<'static>>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: back off rather than spin.
                log::warn!("accept failed: {e}");
                smol::Timer::after(Duration::from_millis(100)).await;
                continue;
            }
        };
        if shared.stopping.get() {
            continue;
        }
        let _ = stream.set_nodelay(true);
        shared.active.set(shared.active.get() + 1);
        let guard = ActiveGuard(shared.clone());
        let over_limit = shared.active.get() > shared.settings.max_connections;
        let task_shared = shared.clone();
        executor
            .spawn(async move {
                connection::run(stream, peer, task_shared, over_limit).await;
                drop(guard);
            })
            .detach();
    }
}

async fn housekeeping(shared: Rc<Shared>) {
    loop {
        smol::Timer::after(Duration::from_secs(1)).await;
        shared.broker.borrow_mut().tick(Instant::now());
        store_unstored(&shared).await;
    }
}

/// Stores the Wills that fired into channels.
pub(crate) async fn store_unstored(shared: &Shared) {
    let unstored = shared.broker.borrow_mut().take_unstored();
    for (channel, message) in unstored {
        let code = connection::store(shared, channel, message).await;
        if code != 0 {
            log::warn!("a Will bound for a channel was refused 0x{code:02X}");
        }
    }
}

async fn shutdown(shared: &Shared) {
    log::info!("stopping: disconnecting {} clients", shared.active.get());
    shared.stopping.set(true);
    for link in shared.broker.borrow().links() {
        link.kick(reason::SERVER_SHUTTING_DOWN);
    }
    let deadline = Instant::now()
        + shared
            .settings
            .write_timeout
            .unwrap_or(Duration::from_secs(5));
    while shared.active.get() > 0 && Instant::now() < deadline {
        smol::Timer::after(Duration::from_millis(10)).await;
    }
}
