//! Outbound QoS 2 exchanges released and not yet completed, kept in storage
//! (A-254; MQTT-4.4.0-1 for the PUBREL).
//!
//! When the client of a session that outlives its connection answers a QoS 2
//! delivery that has an origin - a channel record or a broadcast log record - with
//! PUBREC, the exchange is written to `broker.session.storage` before its PUBREL is
//! sent: which packet identifier, and which record it was. After a restart the
//! session gets it back as `Inflight::Released`, so the PUBREL is sent again under
//! the same identifier and the record is not sent again as a new PUBLISH; a store
//! that cannot write it ends the connection (DISCONNECT 0x80) with the exchange still
//! published, sent again with DUP when the session resumes.
//!
//! No storage interface of its own: the row is a held QoS 2 publish
//! (`Provider::put_held`, `drop_held`, `held`) kept under the client id with
//! [`PREFIX`] before it - a control character no client's id may carry - so it can
//! never be taken for an inbound publish of the client. Its data is a version byte,
//! the record's offset, and the channel's name (none: the broadcast log).

use super::INTERNAL;

/// The format of what is stored.
const VERSION: u8 = 1;

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

/// What is stored for the record at `offset` of `channel` (`None`: the broadcast log).
pub fn encode(channel: Option<&str>, offset: u64) -> Vec<u8> {
    let name = channel.unwrap_or_default();
    let mut out = Vec::with_capacity(9 + name.len());
    out.push(VERSION);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// A released exchange read back: the channel (`None`: the broadcast log) and the
/// record's offset.
///
/// # Errors
/// What is wrong with data that does not read back (damaged, or a newer format).
pub fn decode(data: &[u8]) -> Result<(Option<String>, u64), String> {
    let (offset, name) = super::held::unframe(VERSION, data)?;
    let name = std::str::from_utf8(name).map_err(|_| "a channel name that is not UTF-8")?;
    let channel = (!name.is_empty()).then(|| name.to_owned());
    Ok((channel, offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_exchange_reads_back_as_it_was_kept_a254() {
        let data = encode(Some("orders"), 42);
        assert_eq!(decode(&data), Ok((Some("orders".to_owned()), 42)));
        assert_eq!(decode(&encode(None, 7)), Ok((None, 7)));
        assert!(decode(&data[..5]).is_err());
        assert!(decode(&[2, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert_eq!(client_of(&stored_id("c/1")), Some("c/1"));
        assert_eq!(client_of("c/1"), None);
    }
}
