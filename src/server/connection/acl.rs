//! The connection's questions to the acl_file (`crate::acl`), each `true` where
//! no acl_file is held (B-245). Asked after the structural checks, so a grant
//! can never widen a refusal (B-286), and on every publish and subscribe, so a
//! SIGUSR1 re-read applies to a connection already open (B-292).

use super::Conn;

impl Conn {
    /// A publish to `topic`: `write` on its channel, or a `topic:` rule (B-287).
    pub(super) fn may_publish(&self, topic: &str) -> bool {
        self.acl.as_ref().is_none_or(|p| p.may_publish(topic))
    }

    /// A subscription filter, granted whole or refused (B-279, B-288). The seek
    /// reply topic is this connection's own and asks nothing.
    pub(super) fn may_subscribe(&self, filter: &str) -> bool {
        filter.starts_with("$saguin/") || self.acl.as_ref().is_none_or(|p| p.may_subscribe(filter))
    }

    /// Logs a filter refused for want of a grant, and answers its SUBACK code.
    pub(super) fn not_granted(&self, filter: &str) -> u8 {
        log::info!(
            "{}: {} refused filter {filter:?} 0x87: the acl_file does not grant it whole",
            self.peer,
            self.client_id
        );
        crate::codec::reason::NOT_AUTHORIZED
    }

    /// Taking jobs from, and answering on, queue `queue` (B-282).
    pub(super) fn may_consume(&self, queue: &str) -> bool {
        self.acl.as_ref().is_none_or(|p| p.may_consume(queue))
    }

    /// A seek on append channel `channel` (B-282).
    pub(super) fn may_seek(&self, channel: &str) -> bool {
        self.acl.as_ref().is_none_or(|p| p.may_seek(channel))
    }

    /// A point read of `key` (B-282).
    pub(super) fn may_read_key(&self, key: &str) -> bool {
        self.acl.as_ref().is_none_or(|p| p.may_read_key(key))
    }

    /// `$saguin/sessions/disconnect` (B-283, B-306).
    pub(super) fn may_disconnect(&self) -> bool {
        self.acl.as_ref().is_none_or(|p| p.may_disconnect())
    }

    /// The verbs this client holds on `channel` out of `all` (the channel's
    /// own), for its catalogue answer (B-323, B-324).
    pub(super) fn verbs_held(&self, channel: &str, all: &[&'static str]) -> Vec<&'static str> {
        match &self.acl {
            None => all.to_vec(),
            Some(p) => {
                let held = p.verbs_on(channel).words();
                all.iter().copied().filter(|v| held.contains(v)).collect()
            }
        }
    }
}
