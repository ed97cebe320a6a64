//! The channels the configuration names, as the broker runs them: each with its
//! provider, and the sessions reading it (woken when a record lands).
//!
//! Architecture invariant: which channel a topic belongs to is asked of
//! [`crate::routing::Router`] and nothing else.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::config::ChannelType;
use crate::routing::{Route, Router};
use crate::storage::Provider;

/// An index into [`Channels`]: 32 bits, so a delivery carries its record in 16 bytes.
pub type ChannelId = u32;

/// What a channel is, as the publish and delivery paths tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A durable log; `tail` says where a reader with no position starts.
    Append {
        /// `start: tail`.
        tail: bool,
    },
    /// One current value per topic.
    Latest,
    /// Work for one worker at a time.
    Queue,
    /// A queue's derived `<queue>__dlq`: read like an append channel, written only by
    /// its queue.
    DeadLetter,
}

impl Kind {
    /// The type's name as the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Append { .. } | Kind::DeadLetter => "append",
            Kind::Latest => "latest",
            Kind::Queue => "queue",
        }
    }
}

/// One channel.
#[derive(Debug)]
pub struct Channel {
    /// Its name.
    pub name: Arc<str>,
    /// What it is.
    pub kind: Kind,
    /// Its filter as the configuration wrote it, braces and all.
    pub filter: Arc<str>,
    /// The provider holding its records.
    pub provider: Arc<Provider>,
    /// Client ids of the sessions with a cursor on it.
    pub readers: HashSet<Arc<str>>,
    /// A queue's settings; `None` on other kinds.
    pub queue: Option<super::queue::Policy>,
    /// How old a value, or a deletion, may be and still be served.
    pub max_age: MaxAge,
    /// Its own `max_bytes` (append, dead-letter and queue channels): what a QoS 2
    /// publish is measured against before it is held.
    pub max_bytes: Option<u64>,
}

/// A latest channel's `retention_period` and `deletion_retention_period`, in ms: a
/// value older than the first is never served, not on a SUBSCRIBE, not to a resuming
/// reader, not to a point read, even before the sweep removes it (gaps G-19: "a stale
/// reading is worse than none"); a deletion older than the second is not sent either,
/// to a reader or across a bridge (C-225). No bound on the other kinds, whose readers
/// are told of the floor instead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaxAge {
    /// For values.
    pub values: Option<u64>,
    /// For deletions.
    pub deletions: Option<u64>,
}

impl MaxAge {
    /// Whether `record`, a value or a deletion, is too old to serve at `now_ms`.
    pub fn passed(self, record: &crate::storage::Record, now_ms: u64) -> bool {
        let age = match record.state {
            crate::storage::RecordState::Deleted => self.deletions,
            _ => self.values,
        };
        age.is_some_and(|age| record.timestamp_ms.saturating_add(age) <= now_ms)
    }
}

/// Every channel and the routing table over their filters.
#[derive(Debug)]
pub struct Channels {
    /// Where retained broadcast values are kept (`broker.retained.storage`).
    pub retained: Option<super::retained::Durable>,
    /// Where sessions are kept (`broker.session.storage`).
    pub sessions: Option<SessionStore>,
    router: Router,
    list: Vec<Channel>,
    by_name: HashMap<Arc<str>, ChannelId>,
    /// Whether any channel has a `max_bytes` of its own: with none, a QoS 2 publish
    /// is not resolved to ask (`bounded`).
    any_bounded: bool,
}

impl Channels {
    /// No channels: every topic is broadcast.
    pub fn none() -> Channels {
        Channels::new(Router::from_channels(std::iter::empty()), Vec::new())
    }

    /// The channels, with the router built from the same configuration.
    pub fn new(router: Router, list: Vec<Channel>) -> Channels {
        let by_name = list
            .iter()
            .zip(0..)
            .map(|(c, i)| (c.name.clone(), i))
            .collect();
        let any_bounded = list.iter().any(|c| c.max_bytes.is_some());
        Channels {
            retained: None,
            sessions: None,
            router,
            list,
            by_name,
            any_bounded,
        }
    }

    /// Whether a publish to `topic` goes to a channel with a `max_bytes` of its own.
    pub fn bounded(&self, topic: &str) -> bool {
        self.any_bounded
            && self
                .resolve(topic)
                .is_some_and(|id| self.get(id).max_bytes.is_some())
    }

    /// Where a publish to `topic` goes: `Some` channel, or `None` for broadcast.
    pub fn resolve(&self, topic: &str) -> Option<ChannelId> {
        match self.router.resolve(topic) {
            Route::Channel { name, .. } => self.by_name.get(name).copied(),
            Route::Broadcast => None,
        }
    }

    /// Whether `topic` lands in a dead-letter channel, which takes records from its
    /// queue alone: a publish or a Will there is refused before anything is held.
    pub fn is_dead_letter(&self, topic: &str) -> bool {
        self.resolve(topic)
            .is_some_and(|id| self.get(id).kind == Kind::DeadLetter)
    }

    /// The channels a subscription filter touches, queues left out (a queue's records
    /// leave only through its own form), and whether the filter lies wholly inside a
    /// queue's filter (refused 0x8F).
    pub fn reach(&self, filter: &str) -> (Vec<ChannelId>, Option<String>) {
        let reach = self.router.reach(filter);
        let ids = reach
            .channels
            .iter()
            .filter(|t| t.kind != ChannelType::Queue)
            .filter_map(|t| self.by_name.get(t.name).copied())
            .collect();
        (ids, reach.refused_inside_queue.map(str::to_string))
    }

    /// The channel `id`.
    pub fn get(&self, id: ChannelId) -> &Channel {
        &self.list[id as usize]
    }

    /// The channel `id`, mutably.
    pub fn get_mut(&mut self, id: ChannelId) -> &mut Channel {
        &mut self.list[id as usize]
    }

    /// The channel called `name`.
    pub fn by_name(&self, name: &str) -> Option<ChannelId> {
        self.by_name.get(name).copied()
    }

    /// Every channel.
    pub fn iter(&self) -> impl Iterator<Item = (ChannelId, &Channel)> {
        (0..).zip(&self.list)
    }

    /// Every distinct provider.
    pub fn providers(&self) -> Vec<Arc<Provider>> {
        let mut seen: Vec<Arc<Provider>> = Vec::new();
        let retained = self.retained.iter().map(|r| &r.provider);
        let sessions = self.sessions.iter().map(|s| &s.provider);
        let all = self.list.iter().map(|c| &c.provider);
        for provider in all.chain(retained).chain(sessions) {
            if !seen.iter().any(|p| Arc::ptr_eq(p, provider)) {
                seen.push(provider.clone());
            }
        }
        seen
    }
}

/// The provider `broker.session.storage` names, and the sessions it held at startup.
#[derive(Debug)]
pub struct SessionStore {
    /// The provider.
    pub provider: Arc<Provider>,
    /// The records read at startup, taken by [`super::Broker::new`].
    pub loaded: Vec<super::stored::Restored>,
    /// The broadcast log read at startup, taken by [`super::Broker::new`] (B-456).
    pub log: Vec<super::broadcast_log::Entry>,
    /// The held QoS 2 publishes every provider kept, read at startup
    /// ([`SessionStore::read_held`]) and taken by [`super::Broker::new`] (B-443).
    pub held: Vec<(Arc<Provider>, crate::storage::Held)>,
}

impl SessionStore {
    /// Reads every session record `provider` holds, each with its position in the
    /// broadcast log, and the log; a damaged record is logged and skipped, never fatal.
    ///
    /// # Errors
    /// The provider could not be read at all.
    pub async fn open(provider: Arc<Provider>) -> Result<SessionStore, String> {
        let rows = provider.sessions().await.map_err(|e| {
            format!(
                "broker.session.storage: the sessions of {} could not be read: {e}",
                provider.name()
            )
        })?;
        let mut loaded = Vec::with_capacity(rows.len());
        for (client_id, text) in rows {
            match super::stored::SessionRecord::decode(&client_id, &text) {
                Ok(record) => loaded.push(record),
                Err(why) => log::error!(
                    "storage provider {}: the stored session of {client_id:?} is damaged and \
                     skipped: {why}",
                    provider.name()
                ),
            }
        }
        let log = super::broadcast_log::open(&provider, super::records::now_ms()).await?;
        for record in &mut loaded {
            record.log_position = provider
                .position(&record.client_id, super::broadcast_log::CHANNEL)
                .await
                .map_err(|e| {
                    format!(
                        "broker.session.storage: the broadcast log position of {:?} could \
                         not be read: {e}",
                        record.client_id
                    )
                })?;
        }
        Ok(SessionStore {
            provider,
            loaded,
            log,
            held: Vec::new(),
        })
    }

    /// Reads the held QoS 2 publishes of every provider in `providers` (B-443).
    ///
    /// # Errors
    /// A provider that could not be read.
    pub async fn read_held(&mut self, providers: &[Arc<Provider>]) -> Result<(), String> {
        for provider in providers {
            let held = provider.held().await.map_err(|e| {
                format!(
                    "storage provider {}: the held QoS 2 publishes could not be read: {e}",
                    provider.name()
                )
            })?;
            self.held
                .extend(held.into_iter().map(|h| (provider.clone(), h)));
        }
        Ok(())
    }
}
