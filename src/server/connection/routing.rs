//! The storing half of a connection's channels: a publish routed to broadcast at
//! once or into its channel's provider, the retained store and the broadcast log,
//! and the reason code its publisher is answered with once the record is stored or
//! refused (DESIGN-NOTES 4).
//!
//! Architecture invariant: a channel publish is acknowledged only after its provider
//! reports the record stored.

use std::fmt;
use std::sync::Arc;

use crate::broker::Destination;
use crate::broker::channels::{ChannelId, Kind};
use crate::broker::held::HeldRef;
use crate::broker::metrics::Metrics;
use crate::broker::records::{self, now_ms};
use crate::broker::session::Message;
use crate::codec::reason;
use crate::server::Shared;
use crate::storage::{HeldKey, Provider, RecordState, StorageError};

/// Routes a publish: broadcast at once, or into its channel's provider, saying once
/// the record is stored or refused what its publisher is answered, and whether it
/// reached anybody first.
pub(crate) async fn route(shared: &Shared, message: Arc<Message>) -> Routed {
    match route_now(shared, message) {
        Routing::Waits(destination, message) => {
            route_to(shared, destination, message, &mut None).await
        }
        // A plain broadcast is handed out as it is routed.
        handed => Routed {
            code: route_rest(shared, handed).await,
            handed_out: true,
        },
    }
}

/// What became of a routed publish.
pub(crate) struct Routed {
    /// The reason code for its publisher.
    pub(crate) code: u8,
    /// It reached its subscribers, or its channel, whatever the code says: a
    /// broadcast is handed out before its log write can fail, and one routed again
    /// would reach every subscriber again. A retained value the retained store
    /// refuses, or a channel's record refused, reached nobody.
    pub(crate) handed_out: bool,
}

/// What routing a publish still waits for once [`route_now`] has done what it could.
pub(crate) enum Routing {
    /// Routed: the reason code for the publisher.
    Done(u8),
    /// Broadcast; deliveries owed to sessions that outlive their connection are
    /// written to the broadcast log before the publisher is answered (B-456).
    LogOwed,
    /// Nothing done yet: a channel's record or a retained value is stored first.
    Waits(Destination, Arc<Message>),
}

/// Routes a publish as far as it goes without waiting: an ordinary broadcast, the
/// common case, all the way, so that a connection handles it in place.
pub(crate) fn route_now(shared: &Shared, message: Arc<Message>) -> Routing {
    let destination = shared.broker.borrow().destination(&message.topic);
    if message.retain || destination != Destination::Broadcast {
        return Routing::Waits(destination, message);
    }
    let mut broker = shared.broker.borrow_mut();
    broker.publish(message);
    if broker.has_unlogged() {
        Routing::LogOwed
    } else {
        Routing::Done(reason::SUCCESS)
    }
}

/// Finishes what [`route_now`] left: the reason code for the publisher.
pub(crate) async fn route_rest(shared: &Shared, routing: Routing) -> u8 {
    match routing {
        Routing::Done(code) => code,
        Routing::LogOwed => log_owed_releasing(shared, None, &mut None).await,
        Routing::Waits(destination, message) => {
            route_to(shared, destination, message, &mut None).await.code
        }
    }
}

/// [`route`] for the PUBREL of a held QoS 2 publish kept in storage (B-442): the
/// record it becomes - a channel's, or the broadcast log's - is written in the same
/// store operation that removes it from `release`'s provider, which takes `release`.
/// What writes no record there (a broadcast owed to no session that outlives its
/// connection, a full log, a record on another provider since the configuration
/// moved its topic) is removed once the publish is handed on. A refusal removes
/// nothing, and leaves `release` in place: one of a broadcast handed out before its
/// log write failed too, which the caller forgets once the exchange completes.
pub(crate) async fn route_releasing(
    shared: &Shared,
    message: Arc<Message>,
    release: &mut Option<HeldRef>,
) -> Routed {
    let destination = shared.broker.borrow().destination(&message.topic);
    route_to(shared, destination, message, release).await
}

/// [`route_releasing`] once the publish's destination is known.
async fn route_to(
    shared: &Shared,
    destination: Destination,
    message: Arc<Message>,
    release: &mut Option<HeldRef>,
) -> Routed {
    let code = match destination {
        Destination::Broadcast => {
            let written = if message.retain {
                match write_retained(shared, &message).await {
                    Ok(offset) => offset,
                    Err(code) => {
                        return Routed {
                            code,
                            handed_out: false,
                        };
                    }
                }
            } else {
                None
            };
            // Kept only when there is something to release: the log's record is told
            // apart by the message it carries.
            let mine = release.is_some().then(|| message.clone());
            {
                let mut broker = shared.broker.borrow_mut();
                match written {
                    Some(offset) => {
                        broker.publish(message.clone());
                        broker.retained_written_at(&message, offset);
                    }
                    None => broker.publish(message),
                }
            }
            // Only a broadcast owed to a session that outlives its connection waits
            // here; every other costs this one branch.
            if shared.broker.borrow().has_unlogged() {
                log_owed_releasing(shared, mine.as_ref(), release).await
            } else {
                reason::SUCCESS
            }
        }
        Destination::Channel(id) => store(shared, id, message, release).await,
    };
    let routed = Routed {
        code,
        handed_out: code < 0x80 || destination == Destination::Broadcast,
    };
    if code >= 0x80 {
        return routed;
    }
    let Some(rest) = release.take() else {
        return routed;
    };
    log::debug!(
        "the held QoS 2 publish {} of {:?} wrote no record of provider {}: released on \
         its own",
        rest.key.packet_id,
        rest.key.client_id,
        rest.provider.name()
    );
    if let Err(e) = rest.provider.drop_held(rest.key.clone()).await {
        log::error!(
            "storage provider {}: the released QoS 2 publish {} of {:?} could not be \
             removed, and comes back after a restart: {e}",
            rest.provider.name(),
            rest.key.packet_id,
            rest.key.client_id
        );
    }
    routed
}

/// Writes the broadcasts owed to sessions that outlive their connection to the
/// broadcast log, once each however many sessions are owed it, and then hands the
/// sessions their deliveries (B-456): what the publisher's PUBACK waits for. A full
/// provider is the sessions' loss, not the publisher's (B-472, B-473): the oldest
/// records go to make room, and a message nothing can make room for is not kept,
/// both counted, and the publisher told 0x00. Any other failure is logged and
/// counted, the deliveries kept in memory only, and the publisher told 0x83 (RFC
/// 0002: "the broadcast log's ... could not keep the record").
pub(crate) async fn log_owed(shared: &Shared) -> u8 {
    log_owed_releasing(shared, None, &mut None).await
}

/// [`log_owed`], the record of `mine` releasing the held QoS 2 publish `release`
/// names when the log's provider keeps it (B-442), which takes `release`.
async fn log_owed_releasing(
    shared: &Shared,
    mine: Option<&Arc<Message>>,
    release: &mut Option<HeldRef>,
) -> u8 {
    let (pending, provider) = {
        let mut broker = shared.broker.borrow_mut();
        (broker.take_unlogged(), broker.session_store())
    };
    let mut code = reason::SUCCESS;
    for pending in pending {
        let written = match &provider {
            Some(provider) => {
                let key = release
                    .as_ref()
                    .filter(|r| {
                        mine.is_some_and(|m| Arc::ptr_eq(m, &pending.message))
                            && std::ptr::eq(&*r.provider, &**provider)
                    })
                    .map(|r| r.key.clone());
                let released = key.is_some();
                let written = append_making_room(shared, provider, &pending, key).await;
                if released && written.is_ok() {
                    *release = None;
                }
                written
            }
            None => Err(StorageError::io(
                "",
                "log a broadcast",
                "no session provider",
            )),
        };
        match written {
            Ok(offset) => shared.broker.borrow_mut().logged(pending, Some(offset)),
            Err(e) if e.is_full() => shared.broker.borrow_mut().not_kept(pending),
            Err(e) => {
                log::error!(
                    "a broadcast to {:?} owed to {} sessions could not be logged, and is \
                     kept in memory only: {e}",
                    pending.message.topic,
                    pending.owed.len()
                );
                shared.broker.borrow().metrics.storage_failed(&e);
                code = reason::IMPLEMENTATION_SPECIFIC_ERROR;
                shared.broker.borrow_mut().logged(pending, None);
            }
        }
    }
    code
}

/// Appends `pending` to the broadcast log, giving up its oldest records while the
/// provider is full and one can go (B-472; B-478: a sqlite provider frees room by
/// the page, so several may go for one message).
async fn append_making_room(
    shared: &Shared,
    provider: &Provider,
    pending: &crate::broker::broadcast_log::Pending,
    release: Option<HeldKey>,
) -> Result<u64, StorageError> {
    use crate::broker::broadcast_log::{CHANNEL, record};
    with_room(shared, provider, || {
        provider.append_releasing(CHANNEL, record(pending, now_ms()), release.clone())
    })
    .await
}

/// Runs `write` on `provider` and, while it finds the provider full and that
/// provider keeps the broadcast log, gives up the log's oldest record it can for
/// room and runs it again: any write finding the provider full takes its room from
/// the log first, and is refused only when the log has nothing left to give (B-476).
/// A channel's own `max_bytes` never makes the log give room (B-477).
pub(crate) async fn with_room<T, F>(
    shared: &Shared,
    provider: &Provider,
    mut write: impl FnMut() -> F,
) -> Result<T, StorageError>
where
    F: std::future::Future<Output = Result<T, StorageError>>,
{
    loop {
        match write().await {
            Err(e @ StorageError::ProviderFull { .. }) => {
                if !give_room(shared, provider).await {
                    return Err(e);
                }
            }
            done => return done,
        }
    }
}

/// Gives up the broadcast log's oldest record that can go and deletes it; false when
/// `provider` does not keep the log or nothing in it can go.
async fn give_room(shared: &Shared, provider: &Provider) -> bool {
    use crate::broker::broadcast_log::CHANNEL;
    let keeps_log = shared
        .broker
        .borrow()
        .session_store()
        .is_some_and(|p| std::ptr::eq(&*p, provider));
    if !keeps_log {
        return false;
    }
    let Some(offset) = shared.broker.borrow_mut().give_up_oldest_logged() else {
        return false;
    };
    match provider.resolve(CHANNEL, offset).await {
        Ok(()) | Err(StorageError::NoSuchRecord { .. }) => true,
        Err(e) => {
            log::error!("broadcast log record {offset} not deleted for room: {e}");
            false
        }
    }
}

/// Deletes the broadcast log's records no session needs any more.
pub(crate) async fn drop_unneeded_log(shared: &Shared) {
    let (unneeded, provider) = {
        let mut broker = shared.broker.borrow_mut();
        (broker.take_log_unneeded(), broker.session_store())
    };
    let Some(provider) = provider else {
        return;
    };
    for offset in unneeded {
        match provider
            .resolve(crate::broker::broadcast_log::CHANNEL, offset)
            .await
        {
            Ok(()) | Err(StorageError::NoSuchRecord { .. }) => {}
            Err(e) => log::error!("broadcast log record {offset} not deleted: {e}"),
        }
    }
}

/// Writes a retained broadcast through to `broker.retained.storage` before it is
/// acknowledged: the record it is there, if there is a store; `Err(code)` refuses
/// the publish (0x97 for room, 0x83 otherwise).
async fn write_retained(shared: &Shared, message: &Message) -> Result<Option<u64>, u8> {
    let Some(provider) = shared
        .broker
        .borrow()
        .channels
        .retained
        .as_ref()
        .map(|d| d.provider.clone())
    else {
        return Ok(None);
    };
    let write = || crate::broker::retained::write_through(&provider, message);
    match with_room(shared, &provider, write).await {
        Ok(offset) => Ok(Some(offset)),
        Err(e) => Err(not_stored(
            &shared.broker.borrow().metrics,
            &e,
            format_args!("retained value of {:?}", message.topic),
        )),
    }
}

/// Removes from `broker.retained.storage` the values that died since the last tick
/// (C-239).
pub(crate) async fn remove_dead_retained(shared: &Shared) {
    let (dead, provider) = {
        let mut broker = shared.broker.borrow_mut();
        let provider = broker
            .channels
            .retained
            .as_ref()
            .map(|d| d.provider.clone());
        (broker.take_dead_retained(), provider)
    };
    let Some(provider) = provider else {
        return;
    };
    for offset in dead {
        crate::broker::retained::durable::remove(&provider, offset).await;
    }
}

/// Stores `message` in channel `id` (RFC 0002 "Publishing").
pub(super) async fn store(
    shared: &Shared,
    id: ChannelId,
    message: Arc<Message>,
    release: &mut Option<HeldRef>,
) -> u8 {
    let (provider, name, kind) = {
        let broker = shared.broker.borrow();
        let channel = broker.channels.get(id);
        (channel.provider.clone(), channel.name.clone(), channel.kind)
    };
    if kind == Kind::DeadLetter {
        // It takes its records from its queue alone, and the refusal is
        // logged like every other.
        log::info!(
            "publish to {:?} refused 0x87: {name} is a dead-letter channel, written by its queue alone",
            message.topic
        );
        shared
            .broker
            .borrow()
            .metrics
            .refuse_publish("not authorized");
        return reason::NOT_AUTHORIZED;
    }
    // Only a shared group is handed the record itself; everyone else reads it from
    // the channel, so the copy is made only when a group exists.
    // A queue's owner is handed every job it stores.
    let wants_copy = kind == Kind::Queue || shared.broker.borrow().has_shared_groups();
    let mut landed = None;
    // The held publish is released with the record when they share a provider.
    let key = release
        .as_ref()
        .filter(|r| Arc::ptr_eq(&r.provider, &provider))
        .map(|r| r.key.clone());
    let released = key.is_some();
    // Built again only when a full provider gave room and it is tried again (B-476).
    let append = || {
        let record = records::to_record(&message, now_ms());
        landed = wants_copy.then(|| record.clone());
        provider.append_releasing(&name, record, key.clone())
    };
    let appended = with_room(shared, &provider, append).await;
    if released && appended.is_ok() {
        *release = None;
    }
    match appended {
        Ok(offset) => {
            let stored = landed.map(|landed| crate::storage::Record {
                offset,
                message_id: landed.message_id,
                timestamp_ms: landed.timestamp_ms,
                topic: landed.topic,
                payload: landed.payload,
                properties: landed.properties,
                state: RecordState::Stored,
            });
            if kind == Kind::Queue {
                return match stored {
                    Some(stored) => {
                        let job = crate::storage::Record {
                            state: RecordState::Job {
                                attempts: crate::storage::Attempts::default(),
                                available_after_ms: 0,
                            },
                            ..stored
                        };
                        super::queue::stored(shared, id, job, message.retain)
                    }
                    None => reason::SUCCESS,
                };
            }
            // A latest channel's deletion is shown to nothing reading the channel
            // (RFC 0002 "latest"), a shared group included.
            let deletion = kind == Kind::Latest && message.payload.is_empty();
            let delivered = stored
                .filter(|_| !deletion)
                .map(|record| Arc::new(records::from_record(record, message.qos, now_ms())));
            shared.broker.borrow_mut().landed(id, delivered);
            reason::SUCCESS
        }
        Err(e) => not_stored(
            &shared.broker.borrow().metrics,
            &e,
            format_args!("a record for {:?} on channel {name}", message.topic),
        ),
    }
}

/// What a publisher is answered when what it sent could not be stored (`what`
/// names it in the log): the error's own reason code. At a bound that is 0x97, a
/// refusal logged at info and counted as a refused publish; otherwise 0x83, a
/// storage failure logged as an error and counted as one.
pub(super) fn not_stored(metrics: &Metrics, e: &StorageError, what: fmt::Arguments<'_>) -> u8 {
    if e.is_full() {
        log::info!("{what} refused 0x97: {e}");
        metrics.refuse_publish("quota exceeded");
    } else {
        log::error!("{what} not stored: {e}");
        metrics.storage_failed(e);
    }
    e.reason_code()
}
