//! Records: what a channel holds, and how large the spec says one is.

/// The publisher's MQTT properties a record keeps, as published.
///
/// Only what a delivery must carry again is kept; properties that belong to one hop
/// (topic alias, subscription identifiers) never reach storage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordProperties {
    /// Payload Format Indicator (0 or 1), if the publisher sent one.
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval in seconds, as published (the channel computes what remains).
    pub message_expiry_interval: Option<u32>,
    /// Content Type.
    pub content_type: Option<String>,
    /// Response Topic.
    pub response_topic: Option<String>,
    /// Correlation Data.
    pub correlation_data: Option<Vec<u8>>,
    /// User Properties, in order, repeats allowed.
    pub user_properties: Vec<(String, String)>,
}

/// A record as the channel hands it to a provider, before it has an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRecord {
    /// The Message ID (delivered as `saguin-id`); kept as given (C-145, C-148).
    pub message_id: String,
    /// Milliseconds since the Unix epoch on the broker's clock when it was accepted.
    pub timestamp_ms: u64,
    /// The topic it was published to, unchanged (C-060).
    pub topic: String,
    /// The payload. On a `latest` channel an empty payload is a deletion.
    pub payload: Vec<u8>,
    /// The publisher's properties.
    pub properties: RecordProperties,
}

impl NewRecord {
    /// The record's size as every size bound counts it (B-417, `store.RecordSize`).
    pub fn size(&self) -> u64 {
        record_size(
            &self.message_id,
            &self.topic,
            &self.payload,
            &self.properties.user_properties,
        )
    }
}

/// An inbound QoS 2 publish held between its PUBREC and its PUBREL (RFC 0002
/// "Exactly-once publishes", B-441), kept under (client id, packet id) by the
/// provider of the channel it is for, or of the broadcast log. `data` is opaque to
/// the provider (`broker::held` encodes it); `token` tells one exchange from a later
/// one reusing the packet identifier, so a late drop never removes the newer. The
/// broker keeps a released outbound QoS 2 exchange the same way, under an id no
/// client carries (`broker::released`, A-254).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The publishing client.
    pub client_id: String,
    /// Its packet identifier.
    pub packet_id: u16,
    /// Which exchange under that identifier.
    pub token: u64,
    /// The encoded message.
    pub data: Vec<u8>,
}

impl Held {
    /// What it counts against a provider's `max_bytes` (B-441).
    pub fn size(&self) -> u64 {
        held_size(&self.client_id, &self.data)
    }

    /// Its key.
    pub fn key(&self) -> HeldKey {
        HeldKey {
            client_id: self.client_id.clone(),
            packet_id: self.packet_id,
            token: self.token,
        }
    }
}

/// What a held publish costs beyond its client id and data: packet id and token.
const HELD_OVERHEAD: usize = 10;

/// The size of a held publish of `client_id` holding `data` (B-441).
pub fn held_size(client_id: &str, data: &[u8]) -> u64 {
    (client_id.len() + data.len() + HELD_OVERHEAD) as u64
}

/// One held publish, by its key: what a release or a drop names (B-442).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    /// The publishing client.
    pub client_id: String,
    /// Its packet identifier.
    pub packet_id: u16,
    /// Which exchange under that identifier.
    pub token: u64,
}

/// Where a job goes when it is dead-lettered, as the queue's owner decides it.
///
/// The move takes the record out of the queue and into `channel` in one step, keeping
/// its Message ID, payload and properties (C-124).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The dead-letter channel, `<queue>__dlq`.
    pub channel: String,
    /// The record's topic there: the queue's topic with `__dlq` inserted (RFC 0002
    /// "The dead-letter channel"), which routing knows and storage does not.
    pub topic: String,
    /// Its timestamp there (the move's time, so the dead-letter channel's retention
    /// counts from it).
    pub timestamp_ms: u64,
    /// User Properties appended to the publisher's (`saguin-dlq-*`).
    pub user_properties: Vec<(String, String)>,
}

impl DeadLetter {
    pub(crate) fn apply(self, rec: Record) -> NewRecord {
        let mut properties = rec.properties;
        properties.user_properties.extend(self.user_properties);
        NewRecord {
            message_id: rec.message_id,
            timestamp_ms: self.timestamp_ms,
            topic: self.topic,
            payload: rec.payload,
            properties,
        }
    }
}

/// What the provider knows about a stored record beyond its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// An ordinary record of an append or dead-letter channel, or a current value of a
    /// latest channel.
    Stored,
    /// A deletion on a latest channel (a tombstone, A-091): readers are never shown
    /// it as a value, but a reconnecting consumer may be told the topic was deleted.
    Deleted,
    /// A job on a queue and its delivery state.
    Job {
        /// The attempts spent so far, and when.
        attempts: Attempts,
        /// Not offered before this instant, milliseconds since the epoch (backoff).
        available_after_ms: u64,
    },
}

/// The attempts a job has spent (C-085) and when, which its dead letter tells
/// (`saguin-dlq-first`, `-last`: C-129, C-130), across restarts too. Storage keeps
/// the times as milliseconds since the epoch; a queue's owner as the moments of its
/// own clock (`T`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts<T = u64> {
    /// How many.
    pub count: u32,
    /// When the first was spent: `None` before it, or when it was spent by a version
    /// that kept no times (the header is then left out rather than guessed).
    pub first_ms: Option<T>,
    /// When the last was spent.
    pub last_ms: Option<T>,
}

impl<T> Default for Attempts<T> {
    fn default() -> Self {
        Attempts {
            count: 0,
            first_ms: None,
            last_ms: None,
        }
    }
}

impl<T: Copy> Attempts<T> {
    /// Spends one at `at`.
    pub fn spend(&mut self, at: T) {
        if self.count == 0 {
            self.first_ms = Some(at);
        }
        self.count = self.count.saturating_add(1);
        self.last_ms = Some(at);
    }

    /// The same attempts with each time read on another clock (`onto`).
    #[must_use]
    pub fn retimed<U>(self, onto: impl Fn(T) -> U) -> Attempts<U> {
        Attempts {
            count: self.count,
            first_ms: self.first_ms.map(&onto),
            last_ms: self.last_ms.map(&onto),
        }
    }
}

/// A stored record with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Position in its channel: strictly increasing, never reused.
    pub offset: u64,
    /// The Message ID.
    pub message_id: String,
    /// Milliseconds since the epoch when it was accepted.
    pub timestamp_ms: u64,
    /// The topic it was published to.
    pub topic: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// The publisher's properties.
    pub properties: RecordProperties,
    /// Tombstone, job, or ordinary.
    pub state: RecordState,
}

impl Record {
    /// The record's size as every size bound counts it (B-417).
    pub fn size(&self) -> u64 {
        record_size(
            &self.message_id,
            &self.topic,
            &self.payload,
            &self.properties.user_properties,
        )
    }

    pub(crate) fn from_new(offset: u64, new: NewRecord, state: RecordState) -> Record {
        Record {
            offset,
            message_id: new.message_id,
            timestamp_ms: new.timestamp_ms,
            topic: new.topic,
            payload: new.payload,
            properties: new.properties,
            state,
        }
    }
}

/// `store.RecordSize`: payload + topic + message id + each User Property's key and value,
/// in bytes (B-417, gaps.md section 3).
pub fn record_size(
    message_id: &str,
    topic: &str,
    payload: &[u8],
    user_properties: &[(String, String)],
) -> u64 {
    let props: usize = user_properties.iter().map(|(k, v)| k.len() + v.len()).sum();
    (payload.len() + topic.len() + message_id.len() + props) as u64
}

/// A bounded window of a channel, read in one snapshot (B-155).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Window {
    /// The lowest offset the channel still holds, or `head` when it holds none.
    pub floor: u64,
    /// The offset the next record will get.
    pub head: u64,
    /// Records at or above the requested offset, in offset order.
    pub records: Vec<Record>,
}

/// What a window read asks for. Both bounds hold; at least one record is returned when
/// one exists, however large, so a reader always makes progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRequest {
    /// First offset wanted (records below the floor are gone; reading starts at the floor).
    pub from: u64,
    /// At most this many records (capped at [`MAX_WINDOW_RECORDS`]).
    pub max_records: usize,
    /// At most about this many bytes of records, counted by [`record_size`].
    pub max_bytes: u64,
}

/// The largest window any read returns, whatever it asks for.
pub const MAX_WINDOW_RECORDS: usize = 1024;

impl WindowRequest {
    /// A window of at most `max_records` records and `max_bytes` bytes from `from`.
    pub fn new(from: u64, max_records: usize, max_bytes: u64) -> WindowRequest {
        WindowRequest {
            from,
            max_records: max_records.clamp(1, MAX_WINDOW_RECORDS),
            max_bytes,
        }
    }
}

/// Counts for one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelStats {
    /// Lowest offset held, or `head` if none.
    pub floor: u64,
    /// Next offset to be assigned.
    pub head: u64,
    /// Records held (tombstones included).
    pub records: u64,
    /// Bytes held, counted by [`record_size`].
    pub bytes: u64,
}

/// What a retention sweep removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepReport {
    /// Records removed.
    pub records: u64,
    /// Bytes removed, counted by [`record_size`].
    pub bytes: u64,
}

impl SweepReport {
    pub(crate) fn add(&mut self, other: SweepReport) {
        self.records += other.records;
        self.bytes += other.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// B-417: payload + topic + message id + each user property's key and value.
    #[test]
    fn record_size_counts_payload_topic_id_and_user_properties() {
        let r = NewRecord {
            message_id: "id-1".into(),
            timestamp_ms: 0,
            topic: "a/b".into(),
            payload: vec![0; 10],
            properties: RecordProperties {
                content_type: Some("not counted".into()),
                user_properties: vec![("k".into(), "vv".into()), ("kk".into(), "v".into())],
                ..Default::default()
            },
        };
        assert_eq!(r.size(), 10 + 3 + 4 + 3 + 3);
    }
}
