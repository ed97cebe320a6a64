//! The connection's questions to the acl_file (`crate::acl`), each `true` where
//! no acl_file is held (B-245). Asked after the structural checks, so a grant
//! can never widen a refusal (B-286), and on every publish and subscribe, so a
//! SIGUSR1 re-read applies to a connection already open (B-292).

use super::{Conn, End};
use crate::acl::Feature;
use crate::codec::{Properties, ProtocolVersion, Publish, QoS, Subscribe, reason};

impl Conn {
    /// A publish: `write` on its channel (`delete` for a zero-length payload on a
    /// latest channel), or a `topic:` rule (B-287).
    pub(super) fn may_publish(&self, publish: &Publish) -> bool {
        let empty = publish.payload.is_empty();
        self.acl
            .as_ref()
            .is_none_or(|p| p.may_publish(&publish.topic, empty))
    }

    /// The PUBACK code of a publish that passed every other check (`code`
    /// 0x00) once the acl_file is asked: 0x87, counted as "not authorized",
    /// where no rule grants `write` on its route (B-287).
    pub(super) fn authorize_publish(&self, code: u8, publish: &Publish) -> u8 {
        if code != reason::SUCCESS || self.may_publish(publish) {
            return code;
        }
        let broker = self.shared.broker.borrow();
        broker.metrics.refuse_publish("not authorized");
        reason::NOT_AUTHORIZED
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

    /// Hands the session this client's principal, for the publish figures of its
    /// entry (B-115, B-116), and its armed Will, so the Will is asked again when
    /// it fires (B-290).
    pub(super) fn bind_acl_to_session(&self) {
        let Some(acl) = &self.acl else {
            return;
        };
        self.with_session(|s| {
            s.principal = Some(acl.clone());
            if let Some(will) = &mut s.will {
                will.asker = Some(acl.clone());
            }
        });
    }

    fn denies(&self, feature: Feature) -> bool {
        self.acl.as_ref().is_some_and(|p| p.denies(feature))
    }

    /// What an MQTT 5 CONNACK says under a features denial: Session Expiry
    /// Interval 0 (persistent, B-309), Shared Subscription Available 0 (share,
    /// B-311), Maximum QoS 1 (qos2, B-314). Retain Available stays 1 (B-312).
    pub(super) fn features_in_connack(&self, properties: &mut Properties) {
        if self.denies(Feature::Persistent) {
            properties.edit().session_expiry_interval = Some(0);
        }
        if self.denies(Feature::Share) {
            properties.edit().shared_subscription_available = Some(0);
        }
        if self.denies(Feature::Qos2) {
            properties.edit().maximum_qos = Some(1);
        }
    }

    /// A publish a features denial ends the connection over, as a broker without
    /// the feature would: QoS 2 is 0x9B (B-314, B-315), a retained publish to a
    /// broadcast topic 0x9A (B-312, B-313); a 3.1.1 connection is closed.
    pub(super) fn features_refuse_publish(&self, publish: &Publish) -> Option<End> {
        let acl = self.acl.as_ref()?;
        let code = if publish.qos == QoS::ExactlyOnce && acl.denies(Feature::Qos2) {
            reason::QOS_NOT_SUPPORTED
        } else if publish.retain
            && acl.denies(Feature::Retained)
            && acl.is_broadcast(&publish.topic)
        {
            reason::RETAIN_NOT_SUPPORTED
        } else {
            return None;
        };
        log::info!(
            "{}: {} published {:?} with a feature the acl_file takes away (0x{code:02X})",
            self.peer,
            self.client_id,
            publish.topic
        );
        Some(self.refuse(code))
    }

    /// A SUBSCRIBE under a features denial: QoS 2 is granted 1 (B-314, B-315); a
    /// `$share/` filter from an MQTT 5 client told Shared Subscription Available
    /// 0 is a Protocol Error, 0x9E (B-311).
    pub(super) fn features_on_subscribe(&self, subscribe: &mut Subscribe) -> Result<(), End> {
        if self.acl.is_none() {
            return Ok(());
        }
        if self.protocol == ProtocolVersion::V5
            && self.denies(Feature::Share)
            && subscribe
                .filters
                .iter()
                .any(|(f, _)| f.starts_with("$share/"))
        {
            log::info!(
                "{}: {} subscribed to a $share/ filter, which the acl_file takes away (0x9E)",
                self.peer,
                self.client_id
            );
            return Err(End::Broker(reason::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED));
        }
        if self.denies(Feature::Qos2) {
            for (_, options) in &mut subscribe.filters {
                options.qos = options.qos.min(QoS::AtLeastOnce);
            }
        }
        Ok(())
    }
}
