//! Where retained values are written through to, so they survive a restart: a latest
//! channel of the broker's own (`$retained`, a name no configuration can spell) on the
//! provider `broker.retained.storage` names. The in-memory store serves every
//! SUBSCRIBE; this one is written before the publish is acknowledged and read once at
//! startup.
//!
//! At startup a stored value is settled by where its topic routes now (RFC 0002
//! "Retained messages on a broadcast topic"): broadcast, it is loaded; claimed by a
//! latest channel, it is moved into that channel (A-052, B-435); claimed by an append,
//! queue or dead-letter channel, it is discarded (B-436). Either way it leaves
//! `$retained`, so no topic is held in both places (B-426).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::channels::{ChannelId, Channels, Kind};
use crate::broker::records::{self, now_ms};
use crate::broker::session::Message;
use crate::storage::{
    ChannelKind, ChannelSettings, NewRecord, Provider, Record, RecordProperties, Retention,
    StorageError,
};

/// The channel name retained values are kept under.
pub const CHANNEL: &str = "$retained";
/// The User Property a stored value keeps its QoS in (stripped when loaded or moved).
const QOS_PROPERTY: &str = "saguin-retained-qos";

/// The durable half of the retained store.
#[derive(Debug)]
pub struct Durable {
    /// The provider holding the values.
    pub provider: Arc<Provider>,
    /// The broadcast values found at startup, handed to the in-memory store once.
    pub loaded: Vec<Loaded>,
}

/// A value read back at startup and when it was stored.
#[derive(Debug)]
pub struct Loaded {
    /// The value as it was published.
    pub message: Arc<Message>,
    /// When it was stored (the record's timestamp), in milliseconds since the epoch.
    pub stored_ms: u64,
    /// The record it is.
    pub offset: u64,
}

/// What startup did with the values of topics a channel now claims, per channel.
#[derive(Debug, Default)]
struct Claimed {
    /// Records still to settle, by channel.
    by_channel: BTreeMap<ChannelId, Vec<Record>>,
}

impl Durable {
    /// Opens the retained channel on `provider`, reads every value it holds, and
    /// settles those whose topics a channel in `channels` now claims.
    ///
    /// # Errors
    /// The provider refused the channel or could not be read, or a latest channel's
    /// provider has no room for the values moved into it (B-437), named.
    pub async fn open(
        provider: Arc<Provider>,
        retention_period: Option<Duration>,
        channels: &Channels,
    ) -> Result<Durable, String> {
        let settings = ChannelSettings {
            kind: ChannelKind::Latest {
                deletion_retention: Some(Duration::ZERO),
            },
            max_bytes: None,
            retention: Retention {
                period: retention_period,
                bytes: None,
            },
        };
        provider
            .open_channel(CHANNEL, settings)
            .await
            .map_err(|e| format!("broker.retained: {e}"))?;
        let now = now_ms();
        let mut loaded = Vec::new();
        let mut dead = Vec::new();
        let mut claimed = Claimed::default();
        for record in read_all(&provider).await? {
            let offset = record.offset;
            match channels.resolve(&record.topic) {
                Some(id) => claimed.by_channel.entry(id).or_default().push(record),
                None => match alive(&record, retention_period, now)
                    .then(|| from_stored(record, now))
                    .flatten()
                {
                    Some(value) => loaded.push(value),
                    None => dead.push(offset),
                },
            }
        }
        // Either clock removes a value silently (C-239, C-243); one left behind is
        // found dead again at the next start.
        for &offset in &dead {
            remove(&provider, offset).await;
        }
        log::info!(
            "retained store: {} values loaded from {}, {} past their expiry removed",
            loaded.len(),
            provider.name(),
            dead.len()
        );
        claimed
            .settle(&provider, channels, retention_period, now)
            .await?;
        Ok(Durable { provider, loaded })
    }
}

/// Every value `$retained` holds, tombstones left out.
async fn read_all(provider: &Provider) -> Result<Vec<Record>, String> {
    let mut all = Vec::new();
    provider
        .scan_stored(CHANNEL, |r| all.push(r))
        .await
        .map_err(|e| format!("broker.retained: {e}"))?;
    Ok(all)
}

/// Whether a stored value is still owed to anyone at `now_ms`: neither its Message
/// Expiry nor the store's `retention_period` has run out since its timestamp (B-431).
fn alive(record: &Record, period: Option<Duration>, now_ms: u64) -> bool {
    let expiry = record
        .properties
        .message_expiry_interval
        .map(|s| u64::from(s) * 1000);
    let period = period.map(|p| u64::try_from(p.as_millis()).unwrap_or(u64::MAX));
    [expiry, period]
        .into_iter()
        .flatten()
        .all(|life| record.timestamp_ms.saturating_add(life) > now_ms)
}

impl Claimed {
    /// Moves into latest channels what they now claim and discards the rest, deleting
    /// every one from `$retained`, and says once what went where (B-435, B-436).
    async fn settle(
        self,
        provider: &Provider,
        channels: &Channels,
        period: Option<Duration>,
        now: u64,
    ) -> Result<(), String> {
        let mut said = Vec::new();
        for (id, records) in self.by_channel {
            let channel = channels.get(id);
            let (live, dead): (Vec<Record>, Vec<Record>) =
                records.into_iter().partition(|r| alive(r, period, now));
            // Expired or aged values are removed silently, as either clock removes them.
            for record in &dead {
                delete(provider, &record.topic).await;
            }
            if live.is_empty() {
                continue;
            }
            let count = live.len();
            if channel.kind == Kind::Latest {
                move_into(provider, &channel.name, &channel.provider, live).await?;
                said.push(format!(
                    "{count} moved into latest channel {}",
                    channel.name
                ));
            } else {
                for record in &live {
                    delete(provider, &record.topic).await;
                }
                said.push(format!(
                    "{count} discarded for {} channel {}",
                    kind_name(channel.kind),
                    channel.name
                ));
            }
        }
        if !said.is_empty() {
            log::info!(
                "retained store: values whose topics a channel now claims: {}",
                said.join(", ")
            );
        }
        Ok(())
    }
}

/// The name the configuration gives a channel's type, dead-letter channels by theirs.
fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::DeadLetter => "dead-letter",
        other => other.as_str(),
    }
}

/// Appends each value to the latest channel `name` on `target`, then deletes it from
/// `$retained`: a value is in both places for a moment, never in neither.
///
/// # Errors
/// `target` has no room (B-437), or refused the write, naming the channel, the
/// provider and how many values were not moved.
async fn move_into(
    provider: &Provider,
    name: &str,
    target: &Provider,
    records: Vec<Record>,
) -> Result<(), String> {
    let total = records.len();
    for (done, record) in records.into_iter().enumerate() {
        let topic = record.topic.clone();
        let left = total - done;
        match target.append(name, as_channel_record(record)).await {
            Ok(_) => delete(provider, &topic).await,
            Err(e @ (StorageError::ChannelFull { .. } | StorageError::ProviderFull { .. })) => {
                return Err(format!(
                    "broker.retained: {left} retained values for topics latest channel {name} \
                     now claims cannot be moved into it: provider {} has no room ({e}); raise \
                     its max_bytes, or move the channel to a provider with room",
                    target.name()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "broker.retained: {left} retained values for topics latest channel {name} \
                     now claims were not moved into it on provider {}: {e}",
                    target.name()
                ));
            }
        }
    }
    Ok(())
}

/// A stored value as the latest channel keeps it: its Message ID, timestamp (so its
/// age and expiry still count from its publish), topic, payload and properties, less
/// the QoS only `$retained` needs.
fn as_channel_record(record: Record) -> NewRecord {
    let mut properties = record.properties;
    properties
        .user_properties
        .retain(|(k, _)| k != QOS_PROPERTY);
    NewRecord {
        message_id: record.message_id,
        timestamp_ms: record.timestamp_ms,
        topic: record.topic,
        payload: record.payload,
        properties,
    }
}

/// Deletes `topic`'s value from `$retained`. A failure is logged: the value is then
/// settled again at the next start.
async fn delete(provider: &Provider, topic: &str) {
    let tombstone = NewRecord {
        message_id: uuid::Uuid::now_v7().to_string(),
        timestamp_ms: now_ms(),
        topic: topic.to_string(),
        payload: Vec::new(),
        properties: RecordProperties::default(),
    };
    if let Err(e) = provider.append(CHANNEL, tombstone).await {
        log::error!("retained store: the value of {topic:?} was not deleted from {CHANNEL}: {e}");
    }
}

/// Writes `message` (a retained broadcast) through to `provider`; an empty payload
/// deletes the topic's value. Returns the record it is.
///
/// # Errors
/// The provider's refusal.
pub async fn write_through(provider: &Provider, message: &Message) -> Result<u64, StorageError> {
    let mut record = records::to_record(message, now_ms());
    record
        .properties
        .user_properties
        .push((QOS_PROPERTY.into(), (message.qos as u8).to_string()));
    provider.append(CHANNEL, record).await
}

/// Removes the value that is the record at `offset` from `$retained`, as its expiry
/// or the operator's period removes it (C-239). A record a newer value replaced is
/// gone already, so this never takes a value that is still live.
pub async fn remove(provider: &Provider, offset: u64) {
    match provider.resolve(CHANNEL, offset).await {
        Ok(()) | Err(StorageError::NoSuchRecord { .. }) => {}
        Err(e) => log::error!(
            "retained store: an expired value (record {offset}) was not removed from \
             {CHANNEL} on {}: {e}",
            provider.name()
        ),
    }
}

/// A stored value as the message it was, with when it was stored; nothing if its
/// Message Expiry has run out.
fn from_stored(record: Record, now_ms: u64) -> Option<Loaded> {
    use crate::codec::QoS;
    let p = record.properties;
    let expires_ms = p
        .message_expiry_interval
        .map(|s| record.timestamp_ms + u64::from(s) * 1000);
    if expires_ms.is_some_and(|at| at <= now_ms) {
        return None;
    }
    let mut qos = QoS::AtMostOnce;
    let mut user_properties = Vec::with_capacity(p.user_properties.len());
    for (k, v) in p.user_properties {
        if k == QOS_PROPERTY {
            qos = v
                .parse()
                .ok()
                .and_then(QoS::from_bits)
                .unwrap_or(QoS::AtMostOnce);
        } else if !k.starts_with(records::RESERVED_PREFIX) {
            // A publisher's own `saguin-` properties never reach storage; these are ours.
            user_properties.push((k, v));
        }
    }
    let properties = crate::storage::RecordProperties {
        user_properties,
        ..p
    };
    let expires_at = expires_ms.map(|at| Instant::now() + Duration::from_millis(at - now_ms));
    let message = records::stored_message(
        record.topic,
        record.payload,
        properties,
        (qos, true),
        Arc::from(""),
        expires_at,
    );
    Some(Loaded {
        message: Arc::new(message),
        stored_ms: record.timestamp_ms,
        offset: record.offset,
    })
}
