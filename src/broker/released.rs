//! Outbound QoS 1 and 2 exchanges still on the wire, kept in storage (A-254;
//! MQTT-4.4.0-1: a resumed session sends them again under their packet identifiers).
//!
//! Released: when the client of a session that outlives its connection answers a
//! QoS 2 delivery that has an origin - a channel record or a broadcast log record -
//! with PUBREC, the exchange is written to `broker.session.storage` before its PUBREL
//! is sent: which packet identifier, and which record it was. After a restart the
//! session gets it back as `Inflight::Released`, so the PUBREL is sent again under
//! the same identifier and the record is not sent again as a new PUBLISH; a store
//! that cannot write it ends the connection (DISCONNECT 0x80) with the exchange still
//! published, sent again with DUP when the session resumes.
//!
//! Published: at a graceful stop (`server::keep_published`, after every connection
//! ended and wrote its positions) each such session's exchanges still
//! `Inflight::Published` whose delivery has an origin are written as one row of the
//! session, at most its Receive Maximum of them: which packet identifier went with
//! which record. At the start the row is read into the session
//! (`Session::kept_ids`) and forgotten in storage at once; the record, sent again
//! from the stored position (B-459), goes under its old identifier with DUP set,
//! and no new delivery takes one of those identifiers meanwhile. A crash (SIGKILL)
//! writes no such row: the record is sent again with DUP under a new identifier,
//! as before; so is it after a second stop that came after a crash.
//!
//! No storage interface of its own: a row is a held QoS 2 publish
//! (`Provider::put_held`, `drop_held`, `held`) kept under the client id with
//! [`PREFIX`] before it - a control character no client's id may carry - so it can
//! never be taken for an inbound publish of the client. A released exchange's row is
//! under its packet identifier; a session's published row under [`PUBLISHED_ROW`],
//! which no exchange uses. A released row's data is a version byte (1), the record's
//! offset and the channel's name (none: the broadcast log), as before published rows
//! were kept, so a broker of that time still reads it; a published row's is a version
//! byte (2), a kind byte, a count and for each exchange its packet identifier, record
//! offset and channel name (length-prefixed).

use super::INTERNAL;

/// The format of a released exchange's row.
const RELEASED_VERSION: u8 = 1;
/// The format of a session's published exchanges' row: a kind byte follows, so a
/// later kind needs no new version.
const VERSION: u8 = 2;
/// The kind byte of a session's published exchanges.
const PUBLISHED: u8 = 1;

/// The packet identifier a session's row of published exchanges is kept under: no
/// exchange has it (MQTT-2.2.1-3), so no released row is ever replaced by it.
pub const PUBLISHED_ROW: u16 = 0;

/// What begins the id a released exchange is stored under, before its client id.
pub const PREFIX: &str = "\u{1}released/";

/// The id the released exchanges of `client_id` are stored under.
pub fn stored_id(client_id: &str) -> String {
    format!("{PREFIX}{client_id}")
}

/// The client whose released exchange a held row is, if it is one.
pub fn client_of(stored_id: &str) -> Option<&str> {
    debug_assert!(PREFIX.starts_with(INTERNAL));
    stored_id.strip_prefix(PREFIX)
}

/// One exchange still published at a graceful stop: its packet identifier, the
/// channel of its record (`None`: the broadcast log) and the record's offset.
pub type Published = (u16, Option<String>, u64);

/// A row read back.
#[derive(Debug, PartialEq, Eq)]
pub enum Row {
    /// A released exchange: the channel (`None`: the broadcast log) and the record's
    /// offset.
    Released(Option<String>, u64),
    /// A session's exchanges still published when the broker stopped gracefully.
    Published(Vec<Published>),
}

/// What is stored for the record at `offset` of `channel` (`None`: the broadcast log).
pub fn encode(channel: Option<&str>, offset: u64) -> Vec<u8> {
    let name = channel.unwrap_or_default();
    let mut out = Vec::with_capacity(9 + name.len());
    out.push(RELEASED_VERSION);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// What is stored for a session's exchanges still published: each packet identifier,
/// its record's channel (`None`: the broadcast log) and offset. A channel name longer
/// than a u16 counts (none is: names are topics) is left out.
pub fn encode_published<'a>(
    exchanges: impl IntoIterator<Item = (u16, Option<&'a str>, u64)>,
) -> Vec<u8> {
    let mut body = Vec::new();
    let mut count: u16 = 0;
    for (packet_id, channel, offset) in exchanges {
        let name = channel.unwrap_or_default();
        let (Ok(len), Some(next)) = (u16::try_from(name.len()), count.checked_add(1)) else {
            continue;
        };
        count = next;
        body.extend_from_slice(&packet_id.to_be_bytes());
        body.extend_from_slice(&offset.to_be_bytes());
        body.extend_from_slice(&len.to_be_bytes());
        body.extend_from_slice(name.as_bytes());
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&[VERSION, PUBLISHED]);
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A row read back: version 1 is a released exchange, version 2 published ones.
///
/// # Errors
/// What is wrong with data that does not read back (damaged, or a newer format).
pub fn decode(data: &[u8]) -> Result<Row, String> {
    match data.first() {
        Some(&RELEASED_VERSION) => {
            let (offset, name) = super::held::unframe(RELEASED_VERSION, data)?;
            Ok(Row::Released(channel(name)?, offset))
        }
        Some(&VERSION) => match data.get(1) {
            Some(&PUBLISHED) => decode_published(data.get(2..).unwrap_or_default()),
            Some(kind) => Err(format!("kind {kind}, this broker reads {PUBLISHED}")),
            None => Err("truncated".to_string()),
        },
        Some(found) => Err(format!(
            "format {found}, this broker reads {RELEASED_VERSION} and {VERSION}"
        )),
        None => Err("empty".to_string()),
    }
}

/// The channel a stored name says: none when empty (the broadcast log).
fn channel(name: &[u8]) -> Result<Option<String>, String> {
    let name = std::str::from_utf8(name).map_err(|_| "a channel name that is not UTF-8")?;
    Ok((!name.is_empty()).then(|| name.to_owned()))
}

/// A published row's body: a count, then each exchange.
fn decode_published(data: &[u8]) -> Result<Row, String> {
    let (count, mut rest) = data.split_first_chunk::<2>().ok_or("truncated")?;
    let count = u16::from_be_bytes(*count);
    let mut exchanges = Vec::new();
    for _ in 0..count {
        let (id, after) = rest.split_first_chunk::<2>().ok_or("truncated")?;
        let (offset, after) = after.split_first_chunk::<8>().ok_or("truncated")?;
        let (len, after) = after.split_first_chunk::<2>().ok_or("truncated")?;
        let len = usize::from(u16::from_be_bytes(*len));
        let name = after.get(..len).ok_or("truncated")?;
        rest = after.get(len..).unwrap_or_default();
        let packet_id = u16::from_be_bytes(*id);
        if packet_id == 0 {
            return Err("packet identifier 0".to_string());
        }
        exchanges.push((packet_id, channel(name)?, u64::from_be_bytes(*offset)));
    }
    if !rest.is_empty() {
        return Err("bytes past the last exchange".to_string());
    }
    Ok(Row::Published(exchanges))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_exchange_reads_back_as_it_was_kept_a254() {
        let data = encode(Some("orders"), 42);
        assert_eq!(
            decode(&data),
            Ok(Row::Released(Some("orders".to_owned()), 42))
        );
        assert_eq!(decode(&encode(None, 7)), Ok(Row::Released(None, 7)));
        assert!(decode(&data[..5]).is_err());
        assert!(decode(&[3, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(
            decode(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err(),
            "no kind 0"
        );
        assert!(decode(&[]).is_err());
        assert_eq!(client_of(&stored_id("c/1")), Some("c/1"));
        assert_eq!(client_of("c/1"), None);
    }

    #[test]
    fn a_version_1_row_is_a_released_exchange() {
        let mut v1 = vec![1];
        v1.extend_from_slice(&9u64.to_be_bytes());
        v1.extend_from_slice(b"jobs");
        assert_eq!(decode(&v1), Ok(Row::Released(Some("jobs".to_owned()), 9)));
    }

    #[test]
    fn published_exchanges_read_back_as_they_were_kept_mqtt_4_4_0_1() {
        let data = encode_published([(3, Some("orders"), 42), (9, None, 7)]);
        let back = vec![(3, Some("orders".to_owned()), 42), (9, None, 7)];
        assert_eq!(decode(&data), Ok(Row::Published(back)));
        assert_eq!(
            decode(&encode_published([])),
            Ok(Row::Published(Vec::new()))
        );
        for cut in 1..data.len() {
            assert!(decode(&data[..cut]).is_err(), "{cut}");
        }
        let mut longer = data.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        let zero = encode_published([(0, None, 1)]);
        assert!(decode(&zero).is_err());
    }
}
