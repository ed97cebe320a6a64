//! The MQTT listeners: accept sockets, run one task per connection, stop gracefully.
//!
//! Everything runs on one thread: a `LocalExecutor` drives every connection task, the
//! once-a-second housekeeping tick, and the shutdown. The broker's state is a
//! `RefCell` borrowed for one operation at a time, never across an await.

pub(crate) mod connection;
pub(crate) mod executor;
pub(crate) mod frame;
pub(crate) mod http;
mod proxy;
mod slots;
pub(crate) mod socket;
pub(crate) mod tls;
pub(crate) mod ws;

pub use proxy::admit;
pub use socket::{Door, Socket};
pub use tls::{TlsAcceptor, admit_socket, certificate_name};
pub use ws::OriginPolicy;

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use executor::LocalExecutor;

use crate::broker::{Broker, Settings};
use crate::codec::reason;

/// What every connection task shares: the broker's state and the settings.
#[derive(Debug)]
pub struct Shared {
    /// The broker's state.
    pub broker: RefCell<Broker>,
    /// The settings it runs with.
    pub settings: Settings,
    /// The acl_file it holds, when one is configured (re-read in place on SIGUSR1).
    pub acl: Option<Rc<crate::acl::Acl>>,
    next_link: Cell<u64>,
    active: Cell<usize>,
    slots: Rc<slots::Slots>,
    /// Closed when the broker starts stopping; every wait that must end then races it.
    stop_signal: (smol::channel::Sender<()>, smol::channel::Receiver<()>),
    stopping: Cell<bool>,
    /// Every connection's keep-alive watch, looked at by one ticker.
    keep_alive: connection::keep_alive::Watches,
}

impl Shared {
    /// The state a broker on `channels` shares, before any door is bound or anything
    /// spawned (`serve` starts from it; unit tests of a queue's owner too).
    pub(crate) fn new(
        settings: Settings,
        channels: crate::broker::channels::Channels,
        acl: Option<&Rc<crate::acl::Acl>>,
    ) -> Rc<Shared> {
        Rc::new(Shared {
            broker: RefCell::new(Broker::new(settings.clone(), channels, acl)),
            acl: acl.cloned(),
            next_link: Cell::new(0),
            active: Cell::new(0),
            slots: slots::Slots::new(settings.max_connections),
            stop_signal: smol::channel::bounded(1),
            keep_alive: connection::keep_alive::Watches::default(),
            settings,
            stopping: Cell::new(false),
        })
    }

    /// Whether the broker is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Connections open now, admitted or still in CONNECT.
    pub fn active_connections(&self) -> usize {
        self.active.get()
    }

    /// Slots of `max_connections` held now.
    pub fn slots_taken(&self) -> usize {
        self.slots.taken()
    }

    /// Resolves once the broker starts stopping.
    pub(crate) fn stopped(&self) -> impl std::future::Future<Output = ()> + use<> {
        let signal = self.stop_signal.1.clone();
        async move {
            let _ = signal.recv().await;
        }
    }

    pub(crate) fn next_link_id(&self) -> u64 {
        let id = self.next_link.get() + 1;
        self.next_link.set(id);
        id
    }
}

/// A re-read acl_file wakes every cursor, so a subscriber stalled for want of a
/// grant resumes as soon as the grant is back rather than at the channel's next
/// record (B-294).
fn wake_on_acl_reload(acl: Option<&Rc<crate::acl::Acl>>, shared: &Rc<Shared>) {
    let Some(acl) = acl else {
        return;
    };
    let shared = Rc::downgrade(shared);
    acl.on_reload(move || {
        if let Some(shared) = shared.upgrade() {
            shared.broker.borrow_mut().wake_every_cursor();
        }
    });
}

/// Counts a connection while it lives.
struct ActiveGuard(Rc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.set(self.0.active.get() - 1);
    }
}

/// Binds the MQTT doors: TCP addresses, WebSocket addresses with the pages they admit,
/// and Unix sockets (`(path, mode)`, each with its `<path>.lock`), each with its gate.
///
/// # Errors
/// The first door that cannot be bound, named.
pub fn bind_doors(
    tcp: &[(SocketAddr, Rc<crate::auth::Gate>)],
    ws: &[(SocketAddr, Rc<crate::auth::Gate>, Rc<OriginPolicy>)],
    unix: &[(std::path::PathBuf, u32, Rc<crate::auth::Gate>)],
) -> io::Result<Vec<Door>> {
    let mut doors = Vec::new();
    let addrs: Vec<SocketAddr> = tcp.iter().map(|(addr, _)| *addr).collect();
    for (listener, (_, gate)) in bind(&addrs)?.into_iter().zip(tcp) {
        doors.push(Door::Tcp(smol::Async::new(listener)?, gate.clone()));
    }
    let addrs: Vec<SocketAddr> = ws.iter().map(|(addr, _, _)| *addr).collect();
    for (listener, (_, gate, policy)) in bind(&addrs)?.into_iter().zip(ws) {
        doors.push(Door::Ws(
            smol::Async::new(listener)?,
            gate.clone(),
            policy.clone(),
        ));
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
            bind_one(*addr)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
        })
        .collect()
}

/// Binds `addr`; `[::]` (an empty host) takes IPv4 connections too, whatever
/// `net.ipv6.bindv6only` says, and falls back to `0.0.0.0` on a kernel built
/// without IPv6, as Go's `net.Listen` does.
fn bind_one(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
    if addr != SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, addr.port())) {
        return std::net::TcpListener::bind(addr);
    }
    let socket = match rustix::net::socket_with(
        AddressFamily::INET6,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    ) {
        Ok(socket) => socket,
        Err(rustix::io::Errno::AFNOSUPPORT) => {
            return std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
        }
        Err(e) => return Err(e.into()),
    };
    sockopt::set_socket_reuseaddr(&socket, true)?;
    sockopt::set_ipv6_v6only(&socket, false)?;
    rustix::net::bind(&socket, &addr)?;
    rustix::net::listen(&socket, 128)?;
    Ok(std::net::TcpListener::from(socket))
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
    bridges: Vec<crate::config::Bridge>,
    stop: impl std::future::Future<Output = ()> + 'static,
) -> io::Result<()> {
    let executor = Rc::new(LocalExecutor::new());
    let acl = doors.iter().find_map(|d| d.gate().acl.clone());
    let shared = Shared::new(settings, channels, acl.as_ref());
    smol::block_on(executor.run(async {
        // What the start decided about stored sessions (ended, a Will published, a
        // subscription dropped) is written before any client can connect.
        store_unstored(&shared).await;
        drop_lapsed_positions(&shared).await;
        sync_records(&shared).await;
        forget_held(&shared).await;
        wake_on_acl_reload(acl.as_ref(), &shared);
        let mut accepting = Vec::with_capacity(doors.len());
        for door in doors {
            log::info!("listening on {}", door.describe());
            accepting.push(executor.spawn(accept_loop(door, shared.clone(), executor.clone())));
        }
        let answering = operations.map(|ops| crate::ops::spawn(&executor, &shared, ops));
        executor.spawn(housekeeping(shared.clone())).detach();
        let watching = shared.clone();
        executor
            .spawn(async move { watching.keep_alive.tick().await })
            .detach();
        let (stop_sweeps, sweeps_stopped) = smol::channel::bounded(1);
        let providers = shared.broker.borrow().channels.providers();
        let sweeping = executor.spawn(crate::storage::run_sweeps(
            providers,
            sweeps,
            crate::broker::records::now_ms,
            sweeps_stopped,
        ));
        let owners = crate::broker::queue::owner::spawn(&executor, &shared);
        let bridging = crate::bridge::spawn(&executor, &shared, bridges);
        // A task of its own: the executor polls this body whenever any task is
        // scheduled, and polling the signal stream in place is a read syscall each time.
        executor.spawn(stop).await;
        // Dropping the accept tasks closes the listeners: a stopping broker admits
        // nothing more.
        drop(accepting);
        shared.slots.close();
        let _ = stop_sweeps.try_send(());
        sweeping.await;
        shutdown(&shared).await;
        // Each bridge was told by the shutdown's kick: it says DISCONNECT to its
        // peer and writes its outbound positions.
        let deadline = Instant::now() + Duration::from_secs(2);
        for bridge in bridging {
            futures_lite::future::or(bridge, async {
                smol::Timer::at(deadline).await;
            })
            .await;
        }
        store_unstored(&shared).await;
        // Once more for records the provider refused (C-285).
        sync_records(&shared).await;
        forget_held(&shared).await;
        keep_published(&shared).await;
        settle_queues(&shared, owners).await;
        let providers = shared.broker.borrow().channels.providers();
        let mut unclosed = Vec::new();
        for provider in providers {
            if let Err(e) = provider.close(crate::broker::records::now_ms()) {
                unclosed.push(format!("storage provider {}: {e}", provider.name()));
            }
        }
        // The operations doors last: `/health` says 503 through the stop. Cancelled
        // and waited for, so each door is dropped (its Unix socket removed) before
        // the executor stops running anything.
        for door in answering.into_iter().flatten() {
            door.cancel().await;
        }
        // A snapshot not written is the memory providers' records lost: the exit
        // says so to the supervisor, not only the log.
        if unclosed.is_empty() {
            Ok(())
        } else {
            Err(io::Error::other(unclosed.join("; ")))
        }
    }))
}

async fn accept_loop(door: Door, shared: Rc<Shared>, executor: Rc<LocalExecutor>) {
    let mut pace = shared.settings.max_connect_rate.map(ConnectPace::new);
    let mut accepted: u32 = 0;
    loop {
        // A full accept queue never makes `accept` wait: without a rate to pace it,
        // a flood of connections would keep the thread here.
        accepted = accepted.wrapping_add(1);
        if accepted.is_multiple_of(ACCEPTS_PER_TURN) {
            futures_lite::future::yield_now().await;
        }
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
        let arrived = Instant::now();
        shared.active.set(shared.active.get() + 1);
        let guard = ActiveGuard(shared.clone());
        // A ws socket gets a slot or nothing: no overflow place, nothing written (B-059).
        let websocket = door.websocket().cloned();
        let (shared, gate) = (shared.clone(), door.gate().clone());
        // Spawned as the future itself, the guard held beside it: an async block
        // around it would keep the connection's future twice (`executor.rs`).
        match shared.slots.admit() {
            slots::Admission::Slot(slot) => {
                let serving = connection::run(stream, peer, shared, slot, gate, websocket);
                executor.spawn_holding(serving, guard).detach();
            }
            slots::Admission::Wait(place, handed) if websocket.is_none() => {
                let waiting = wait_for_slot(stream, peer, shared, gate, arrived, place, handed);
                executor.spawn_holding(waiting, guard).detach();
            }
            slots::Admission::Wait(..) | slots::Admission::Full => {
                log::debug!("{peer}: closed at once: every slot and overflow place is taken");
                shared
                    .broker
                    .borrow()
                    .metrics
                    .refuse_connection("overflow budget full");
            }
        }
    }
}

/// Connections a door accepts before it lets the other tasks run (the operations
/// listener's doors too).
pub(crate) const ACCEPTS_PER_TURN: u32 = 32;

/// A socket holding an overflow place waits up to `OVERFLOW_WAIT` for a slot (B-049);
/// one that gets none is told Server busy, and every socket not admitted is closed
/// within `OVERFLOW_CLOSE` of arrival, or `connect_timeout` when sooner (B-052).
async fn wait_for_slot(
    stream: socket::Socket,
    peer: String,
    shared: Rc<Shared>,
    gate: Rc<crate::auth::Gate>,
    arrived: Instant,
    place: slots::Place,
    handed: smol::channel::Receiver<slots::Slot>,
) {
    const OVERFLOW_WAIT: Duration = Duration::from_millis(50);
    const OVERFLOW_CLOSE: Duration = Duration::from_millis(100);
    let waited = futures_lite::future::or(async { handed.recv().await.ok() }, async {
        smol::Timer::at(arrived + OVERFLOW_WAIT).await;
        None
    })
    .await;
    place.stop_waiting();
    if let Some(slot) = waited.or_else(|| handed.try_recv().ok()) {
        drop(place);
        connection::run(stream, peer, shared, slot, gate, None).await;
        return;
    }
    if shared.stopping.get() {
        return; // a stopping broker ends every wait at once (B-055)
    }
    let deadline = arrived + OVERFLOW_CLOSE.min(shared.settings.connect_timeout);
    connection::refuse_busy(stream, &peer, &shared, &gate, deadline, place).await;
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
        connection::remove_dead_retained(&shared).await;
        store_unstored(&shared).await;
        drop_lapsed_positions(&shared).await;
        sync_records(&shared).await;
        forget_held(&shared).await;
        connection::drop_unneeded_log(&shared).await;
    }
}

/// Writes again, or deletes, the stored records of sessions that changed or ended
/// other than on a client's packet: an expiry, a connection's end, a start (B-455).
pub(crate) async fn sync_records(shared: &Shared) {
    let work = shared.broker.borrow_mut().take_record_work();
    for client_id in work {
        // Read and sent in one step: the record is what the broker holds now.
        let record = shared.broker.borrow().record_of(&client_id, &[]);
        let landed = write_session_record(shared, &client_id, record)
            .await
            .is_ok();
        let before = shared
            .broker
            .borrow_mut()
            .record_written(&client_id, landed);
        // A refused write stays in memory and is tried on every tick and as the
        // broker stops (C-285); the line that clears the error is an error too (B-024).
        if landed && before {
            log::error!("the session record of {client_id:?} is written at last");
        }
    }
}

/// Writes `client_id`'s record to `broker.session.storage`, or deletes it when
/// `record` is `None`: the one place a session record is written. A failure is logged
/// and counted; the caller decides what the client is told.
///
/// # Errors
/// What the provider refused.
pub(crate) async fn write_session_record(
    shared: &Shared,
    client_id: &str,
    record: Option<crate::broker::stored::Encoded>,
) -> Result<(), crate::storage::StorageError> {
    let Some(provider) = shared.broker.borrow().session_store() else {
        return Ok(());
    };
    let result = match record {
        // A full provider takes the record's room from the broadcast log (B-476).
        Some(record) => {
            let put = || provider.put_session(client_id, record.text.clone(), record.charge);
            connection::with_room(shared, &provider, put).await
        }
        None => provider.delete_session(client_id).await,
    };
    if let Err(e) = &result {
        let broker = shared.broker.borrow();
        // Said once; the retries of C-285 are counted, not logged again.
        if broker.record_refused(client_id) {
            log::debug!("the session record of {client_id:?} is still refused: {e}");
        } else {
            log::error!("the session record of {client_id:?} could not be written: {e}");
        }
        broker.metrics.storage_failed(e);
    }
    result
}

/// Forgets in storage the held QoS 2 publishes that were abandoned after
/// `broker.qos2.expires_after`, whose session ended, whose session did not come
/// back at the start (B-443), or whose exchange completed without a record. Each
/// names its exchange, so one a client has opened since under the same packet
/// identifier is left alone. One the store refuses is tried again at the next
/// call: left, a restart would bring its publish back.
pub(crate) async fn forget_held(shared: &Shared) {
    let forget = shared.broker.borrow_mut().take_held_forget();
    for held in forget {
        if let Err(e) = held.provider.drop_held(held.key.clone()).await {
            log::error!(
                "storage provider {}: the held QoS 2 publish {} of {:?} could not be \
                 removed, and is tried again: {e}",
                held.provider.name(),
                held.key.packet_id,
                crate::broker::shown(&held.key.client_id)
            );
            shared.broker.borrow_mut().forget_held(held);
        }
    }
}

/// Keeps, at a graceful stop, the packet identifiers of the exchanges still published
/// for sessions that outlive their connection (`broker::released`, MQTT-4.4.0-1):
/// one row per session, written after every connection ended and wrote its
/// positions, so the records sent again from those positions (B-459) go under the
/// same identifiers. A row the provider refuses is logged: that session's records
/// go again under new identifiers, as after a crash.
async fn keep_published(shared: &Shared) {
    let Some(provider) = shared.broker.borrow().session_store() else {
        return;
    };
    let rows = shared.broker.borrow_mut().published_to_keep();
    for row in rows {
        let client = row.client_id.clone();
        if let Err(e) = provider.put_held(row).await {
            log::error!(
                "storage provider {}: the packet identifiers on the wire to {:?} not kept, \
                 sent again under new ones: {e}",
                provider.name(),
                crate::broker::shown(&client)
            );
        }
    }
}

/// Discards the channel positions of sessions that lapsed.
pub(crate) async fn drop_lapsed_positions(shared: &Shared) {
    let lapsed = shared.broker.borrow_mut().take_lapsed();
    if lapsed.is_empty() {
        return;
    }
    let providers = shared.broker.borrow().channels.providers();
    for client_id in lapsed {
        for provider in &providers {
            if let Err(e) = provider.drop_positions(&client_id).await {
                log::error!("positions of the lapsed session {client_id:?} not discarded: {e}");
            }
        }
    }
}

/// Sends the Wills that fired and must be stored first (into a channel, or a retained
/// broadcast value) down the ordinary publish path (C-248).
pub(crate) async fn store_unstored(shared: &Shared) {
    let (unstored, owners) = shared.broker.borrow_mut().take_unstored();
    for message in unstored {
        let topic = message.topic.clone();
        let code = connection::route(shared, message).await.code;
        if code < 0x80 {
            shared.broker.borrow().metrics.will_published(); // C-267
        } else {
            log::warn!("a Will to {topic:?} was refused 0x{code:02X}");
        }
    }
    // A plain broadcast Will owed to sessions that outlive their connection went out
    // at once, and waits for its log write here (B-456).
    if shared.broker.borrow().has_unlogged() {
        connection::log_owed(shared).await;
    }
    shared.broker.borrow_mut().wills_stored(owners);
}

/// Lets every queue owner apply what its mailbox still holds (answers already
/// PUBACKed, workers that left) before storage closes, within `write_timeout`.
async fn settle_queues(shared: &Shared, owners: Vec<smol::Task<()>>) {
    shared.broker.borrow().queues.close();
    let settled = async {
        for owner in owners {
            owner.await;
        }
        true
    };
    let limit = shared
        .settings
        .write_timeout
        .unwrap_or(Duration::from_secs(5));
    let timeout = async {
        smol::Timer::after(limit).await;
        false
    };
    if !futures_lite::future::or(settled, timeout).await {
        log::warn!("stopping: queue owners did not settle within {limit:?}");
    }
}

async fn shutdown(shared: &Shared) {
    log::info!("stopping: disconnecting {} clients", shared.active.get());
    shared.stopping.set(true);
    shared.stop_signal.0.close();
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
    // What was settled since the last tick leaves the broadcast log now: a shared
    // group's delivery one member collected is still at or above the position of the
    // member it was held for, which has no connection to move it (B-447).
    shared.broker.borrow_mut().count_released();
    connection::drop_unneeded_log(shared).await;
}
