//! The MQTT listeners: accept sockets, run one task per connection, stop gracefully.
//!
//! Everything runs on one thread: a `LocalExecutor` drives every connection task, the
//! once-a-second housekeeping tick, and the shutdown. The broker's state is a
//! `RefCell` borrowed for one operation at a time, never across an await.

mod connection;
mod frame;
mod socket;
mod tls;

pub use socket::{Door, Socket};
pub use tls::{TlsAcceptor, admit_socket, certificate_name};

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use smol::LocalExecutor;

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

/// Binds the MQTT doors: TCP addresses and Unix sockets (`(path, mode)`, each with its
/// `<path>.lock`), each with its gate.
///
/// # Errors
/// The first door that cannot be bound, named.
pub fn bind_doors(
    tcp: &[(SocketAddr, Rc<crate::auth::Gate>)],
    unix: &[(std::path::PathBuf, u32, Rc<crate::auth::Gate>)],
) -> io::Result<Vec<Door>> {
    let mut doors = Vec::new();
    let addrs: Vec<SocketAddr> = tcp.iter().map(|(addr, _)| *addr).collect();
    for (listener, (_, gate)) in bind(&addrs)?.into_iter().zip(tcp) {
        doors.push(Door::Tcp(smol::Async::new(listener)?, gate.clone()));
    }
    for (path, mode, gate) in unix {
        let door = crate::ops::bind_unix(path, *mode)?;
        let listener = smol::Async::new(door.listener()?)?;
        doors.push(Door::Unix(listener, door, gate.clone()));
    }
    Ok(doors)
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

/// Serves MQTT on `listeners` until `stop` resolves, then disconnects every client
/// (MQTT 5 clients get DISCONNECT 0x8B) and returns.
///
/// # Errors
/// A listener that fails to register with the reactor.
pub fn serve(
    settings: Settings,
    doors: Vec<Door>,
    channels: crate::broker::channels::Channels,
    sweeps: crate::storage::RetentionSchedule,
    operations: Option<crate::ops::OpsDoors>,
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
        let mut accepting = Vec::with_capacity(doors.len());
        for door in doors {
            log::info!("listening on {}", door.describe());
            accepting.push(executor.spawn(accept_loop(door, shared.clone(), executor.clone())));
        }
        if let Some(ops) = operations {
            crate::ops::spawn(&executor, &shared, ops)?;
        }
        executor.spawn(housekeeping(shared.clone())).detach();
        let (stop_sweeps, sweeps_stopped) = smol::channel::bounded(1);
        let providers = shared.broker.borrow().channels.providers();
        let sweeping = executor.spawn(crate::storage::run_sweeps(
            providers,
            sweeps,
            crate::broker::records::now_ms,
            sweeps_stopped,
        ));
        crate::broker::queue::owner::spawn(&executor, &shared);
        stop.await;
        // Dropping the accept tasks closes the listeners: a stopping broker admits
        // nothing more.
        drop(accepting);
        let _ = stop_sweeps.try_send(());
        sweeping.await;
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

async fn accept_loop(door: Door, shared: Rc<Shared>, executor: Rc<LocalExecutor<'static>>) {
    let mut pace = shared.settings.max_connect_rate.map(ConnectPace::new);
    loop {
        if let Some(pace) = &mut pace {
            // Over the rate a connection waits in the kernel's accept queue; it is
            // not refused (RFC 0002 "max_connect_rate").
            pace.wait().await;
        }
        let (stream, peer) = match door.accept().await {
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
        shared.active.set(shared.active.get() + 1);
        let guard = ActiveGuard(shared.clone());
        // Past max_connections, an overflow budget of min(max_connections, 32) sockets
        // is read far enough to be told 0x89 Server busy; past that, a socket is
        // closed at once with nothing read or written (RFC 0002 "connect_timeout").
        let max = shared.settings.max_connections;
        if shared.active.get() > max + max.min(32) {
            log::debug!("{peer}: closed at once: connections and the overflow budget are full");
            drop(guard);
            continue;
        }
        let over_limit = shared.active.get() > max;
        let task_shared = shared.clone();
        let gate = door.gate().clone();
        executor
            .spawn(async move {
                connection::run(stream, peer, task_shared, over_limit, gate).await;
                drop(guard);
            })
            .detach();
    }
}

/// `max_connect_rate` for one listener: a token bucket refilling at the rate and
/// holding twice it, so bursts of up to twice the rate pass at once.
struct ConnectPace {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl ConnectPace {
    fn new(rate: u32) -> ConnectPace {
        let rate = f64::from(rate.max(1));
        ConnectPace {
            rate,
            tokens: 2.0 * rate,
            last: Instant::now(),
        }
    }

    async fn wait(&mut self) {
        loop {
            let now = Instant::now();
            let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(2.0 * self.rate);
            self.last = now;
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
                return;
            }
            smol::Timer::after(Duration::from_secs_f64((1.0 - self.tokens) / self.rate)).await;
        }
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
