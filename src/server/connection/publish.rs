//! An inbound PUBLISH and its PUBREL: topic aliases, the topic and quota checks,
//! the QoS 2 exchange held until released, and the answer (PUBACK or PUBREC).

use std::sync::Arc;
use std::time::Instant;

use super::routing::{Routing, not_stored, route_now, route_releasing, route_rest, with_room};
use super::verbs::{self, Verb};
use super::{Conn, End, check_topic_name, over_header_limits, refusal};
use crate::broker::session::{HeldQos2, Message};
use crate::codec::{Packet, ProtocolVersion, Publish, QoS, reason};

/// What a publish waits for once `Conn::accept_publish` has done what needs no
/// waiting: for an ordinary broadcast at QoS 0 or 1, nothing.
pub(super) enum PublishStep {
    /// A `$saguin/...` verb, to perform and answer.
    Verb(Verb),
    /// A QoS 2 publish, to keep in storage, or measure against its channel's
    /// `max_bytes`, before its PUBREC.
    StoreHeld(u16, Arc<Message>),
    /// The rest of its routing: a channel's store, a retained write, the log.
    Route(Routing),
}

/// What a publish's quota check came to (`Conn::check_quota`).
enum Quota {
    Within,
    /// Refused 0x97; `rate` when by the client's publish rate rather than its
    /// headers.
    Over {
        rate: bool,
    },
}

/// What holding an inbound QoS 2 publish came to (`Conn::hold_qos2`).
enum Hold {
    /// Answered now with this PUBREC code (held in memory, a DUP, or refused).
    Answer(u8),
    /// To be kept in storage before its PUBREC (B-441), or measured against its
    /// channel's `max_bytes` first (`store_held`).
    Store(Arc<Message>),
}

/// Whether one more inbound QoS 2 exchange under `packet_id` may be held beside what
/// `session` holds: `Ok(None)` when it may. `Ok(Some(code))` answers it at once - a DUP
/// re-send of one held gets its PUBREC again and is not applied twice (gaps G-13), one
/// past `broker.qos2.max_inflight` is refused 0x97 and the connection stays.
/// `Err(code)` ends the connection: past the Receive Maximum the broker gave (0x93).
pub(super) fn qos2_room(
    session: &crate::broker::session::Session,
    packet_id: u16,
    settings: &crate::broker::Settings,
    metrics: &crate::broker::metrics::Metrics,
) -> Result<Option<u8>, u8> {
    if session.incoming.contains_key(&packet_id) {
        return Ok(Some(reason::SUCCESS));
    }
    if session.incoming.len() >= usize::from(settings.receive_maximum) {
        return Err(reason::RECEIVE_MAXIMUM_EXCEEDED);
    }
    if session.incoming.len() >= settings.qos2_max_inflight {
        metrics.refuse_publish("inflight allowance exceeded");
        return Ok(Some(reason::QUOTA_EXCEEDED));
    }
    Ok(None)
}

impl Conn {
    /// For a QoS 2 publish the broker acts on at once (a queue's answer, a `$saguin/`
    /// verb): `Some` when it is answered already - a DUP of one held, or no room -
    /// and must not be acted on again.
    pub(super) fn qos2_answered_already(&mut self, publish: &Publish) -> Option<Result<(), End>> {
        let id = publish
            .packet_id
            .filter(|_| publish.qos == QoS::ExactlyOnce)?;
        let shared = self.shared.clone();
        let room = shared
            .broker
            .borrow_mut()
            .session_and_metrics(&self.client_id, self.link.id)
            .map(|(s, metrics)| qos2_room(s, id, &shared.settings, metrics));
        match room {
            Some(Err(code)) => Some(Err(self.refuse(code))),
            Some(Ok(Some(code))) => Some(self.answer_publish(publish, code)),
            Some(Ok(None)) | None => None,
        }
    }

    /// Holds a QoS 2 publish acted on at once with nothing to release: its PUBREL
    /// only completes the exchange (0x00), and a DUP of it is answered, not redone.
    pub(super) fn hold_acted_on(&mut self, publish: &Publish) {
        if let Some(id) = publish
            .packet_id
            .filter(|_| publish.qos == QoS::ExactlyOnce)
        {
            let held = HeldQos2 {
                since: Instant::now(),
                message: None,
                stored: None,
            };
            self.with_session(|s| s.incoming.insert(id, held));
        }
    }

    /// Resolves a topic alias (MQTT 5 section 3.3.2.3.4) into the publish's topic.
    fn resolve_alias(&mut self, publish: &mut Publish) -> Result<(), End> {
        let Some(alias) = (publish.properties.present_mut()).and_then(|p| p.topic_alias.take())
        else {
            if publish.topic.is_empty() {
                return Err(self.refuse(reason::PROTOCOL_ERROR));
            }
            return Ok(());
        };
        let protocol = self.protocol;
        let aliases = self.aliases.get_or_insert_with(Default::default);
        let Some(slot) = alias
            .checked_sub(1)
            .and_then(|i| aliases.get_mut(usize::from(i)))
        else {
            return Err(refusal(protocol, reason::TOPIC_ALIAS_INVALID));
        };
        if publish.topic.is_empty() {
            match slot {
                Some(topic) => publish.topic = topic.clone(),
                None => return Err(refusal(protocol, reason::PROTOCOL_ERROR)),
            }
        } else {
            *slot = Some(publish.topic.clone());
        }
        Ok(())
    }

    /// Handles a publish as far as it goes without waiting, and says what is left:
    /// `None` once it is answered (or dropped, at QoS 0).
    pub(super) fn accept_publish(
        &mut self,
        publish: &mut Publish,
    ) -> Result<Option<PublishStep>, End> {
        // A Subscription Identifier is the server's to send (MQTT-3.3.4-6).
        if !publish.properties.subscription_identifiers.is_empty() {
            return Err(self.refuse(reason::PROTOCOL_ERROR));
        }
        self.resolve_alias(publish)?;
        // A re-send of an exchange held already gets its PUBREC again before anything
        // is asked of it: it is no new work, and a refusal now (the rate, an acl_file
        // re-read, a full queue mailbox) would end an exchange whose message stays
        // held, to be routed at the PUBREL of the next message under its identifier
        // (MQTT-4.3.3-10, gaps G-13).
        if self.holds_exchange(publish) {
            return self.answer_publish(publish, reason::SUCCESS).map(|()| None);
        }
        if let Some(end) = self.features_refuse_publish(publish) {
            return Err(end);
        }
        // Spent before anything is asked of the topic: a queue's answers and the
        // `$saguin/` verbs are messages against the rate like any other (B-112, B-120).
        if let Quota::Over { rate } = self.check_quota(publish) {
            self.log_refused(publish, reason::QUOTA_EXCEEDED, rate);
            return self
                .answer_publish(publish, reason::QUOTA_EXCEEDED)
                .map(|()| None);
        }
        if let Some(answered) = self.queue_response(publish) {
            return answered.map(|()| None);
        }
        if let Some(verb) = Verb::of(&publish.topic) {
            // A 3.1.1 client cannot name a Response Topic: asking to hang somebody up
            // ends its own connection, whatever the QoS (B-302).
            if matches!(verb, Verb::HangUp) && self.protocol == ProtocolVersion::V311 {
                return Err(End::Close);
            }
            // A point read or a catalogue question at QoS 0 has no PUBACK to carry
            // its refusals, so it is dropped unread (C-005, B-327).
            if publish.qos == QoS::AtMostOnce && verb.needs_acknowledgement() {
                return Ok(None);
            }
            return Ok(Some(PublishStep::Verb(verb)));
        }
        let shared = self.shared.clone();
        let settings = &shared.settings;
        let refused = |label| {
            shared.broker.borrow().metrics.refuse_publish(label);
        };
        let code = match check_topic_name(&publish.topic, settings) {
            Err(code) => {
                refused(if code == reason::NOT_AUTHORIZED {
                    "not authorized"
                } else {
                    "topic name invalid"
                });
                code
            }
            Ok(())
                if publish.properties.payload_format_indicator == Some(1)
                    && std::str::from_utf8(&publish.payload).is_err() =>
            {
                refused("payload format invalid");
                reason::PAYLOAD_FORMAT_INVALID
            }
            Ok(()) => reason::SUCCESS,
        };
        // Asked after the rate, which spends before any authorization (B-120).
        let code = match self.authorize_publish(code, publish) {
            // Into a dead-letter channel, refused on the PUBREC, before anything is
            // held: at the PUBREL it would hold the message for a
            // retry that can never succeed. QoS 0 and 1 are refused as they are
            // stored (`routing::store`), the topic resolved once.
            reason::SUCCESS
                if publish.qos == QoS::ExactlyOnce
                    && shared
                        .broker
                        .borrow()
                        .channels
                        .is_dead_letter(&publish.topic) =>
            {
                refused("not authorized");
                reason::NOT_AUTHORIZED
            }
            code => code,
        };
        if code != reason::SUCCESS {
            self.log_refused(publish, code, false);
            return self.answer_publish(publish, code).map(|()| None);
        }
        let code = if publish.qos == QoS::ExactlyOnce {
            let packet_id = publish.packet_id.unwrap_or(0);
            match self.hold_qos2(publish, packet_id)? {
                Hold::Answer(code) => code,
                Hold::Store(message) => {
                    return Ok(Some(PublishStep::StoreHeld(packet_id, message)));
                }
            }
        } else {
            match route_now(&self.shared, Arc::new(self.message_from(publish))) {
                Routing::Done(code) => code,
                routing => return Ok(Some(PublishStep::Route(routing))),
            }
        };
        self.answer_publish(publish, code).map(|()| None)
    }

    /// What `accept_publish` left: performed, stored or routed, then answered.
    pub(super) async fn finish_publish(
        &mut self,
        publish: Publish,
        step: PublishStep,
    ) -> Result<(), End> {
        let code = match step {
            PublishStep::Verb(verb) => return self.answer_verb(verb, &publish).await,
            PublishStep::StoreHeld(packet_id, message) => {
                Box::pin(self.store_held(packet_id, message)).await
            }
            PublishStep::Route(routing) => route_rest(&self.shared, routing).await,
        };
        self.answer_publish(&publish, code)
    }

    /// Performs a `$saguin/...` verb and answers it: its code, and the reply to its
    /// Response Topic if it has one.
    async fn answer_verb(&mut self, verb: Verb, publish: &Publish) -> Result<(), End> {
        if let Some(answered) = self.qos2_answered_already(publish) {
            return answered;
        }
        let (code, reply) = self.perform(verb, publish).await;
        if code == reason::SUCCESS {
            self.hold_acted_on(publish);
        }
        if code != reason::SUCCESS {
            log::info!(
                "{}: {} {:?} refused 0x{code:02X}",
                self.peer,
                self.client_id,
                publish.topic
            );
            let label = match code {
                reason::NOT_AUTHORIZED => "not authorized",
                reason::TOPIC_NAME_INVALID => "topic name invalid",
                _ => "implementation specific error",
            };
            self.shared.broker.borrow().metrics.refuse_publish(label); // C-006
        }
        self.answer_publish(publish, code)?;
        if let Some(reply) = reply {
            self.queue_packet(&verbs::reply_packet(reply));
        }
        Ok(())
    }

    /// The publish quota (RFC 0002 "How fast one client may publish"; max_header_count,
    /// max_header_bytes): 0x97 before routing or storage, counted by label.
    fn check_quota(&mut self, publish: &Publish) -> Quota {
        let settings = &self.shared.settings;
        let mut broker = self.shared.broker.borrow_mut();
        let (label, why, rate) = if over_header_limits(&publish.properties, settings) {
            (
                "quota exceeded",
                "limits.max_header_count or max_header_bytes",
                false,
            )
        } else if !broker.spend_publish_budget(
            &self.client_id,
            publish.payload.len(),
            Instant::now(),
        ) {
            (
                "publish rate exceeded",
                "limits.publish_rate or publish_bytes",
                true,
            )
        } else {
            return Quota::Within;
        };
        broker.metrics.refuse_publish(label);
        drop(broker);
        // Which bound refused, not only that one did.
        self.puback_reason = Some(format!("{label}: over {why}").into());
        Quota::Over { rate }
    }

    /// Logs a refused publish, whatever its QoS; one over its rate (`rate`) at
    /// debug, since such a client refuses itself many times a second (B-123).
    fn log_refused(&self, publish: &Publish, code: u8, rate: bool) {
        let level = if rate {
            log::Level::Debug
        } else {
            log::Level::Info
        };
        log::log!(
            level,
            "{}: publish by {} to {:?} refused 0x{code:02X}",
            self.peer,
            self.client_id,
            publish.topic
        );
    }

    /// Answers a publish with `code`: PUBACK or PUBREC, and on 3.1.1 a refusal closes
    /// the connection, since its acknowledgements carry no code. At QoS 0 nothing is
    /// sent and nothing closes, on 3.1.1 as on MQTT 5 (A-183, B-122, B-287).
    /// Whether `publish` is a QoS 2 exchange this session holds already.
    fn holds_exchange(&self, publish: &Publish) -> bool {
        let Some(id) = publish
            .packet_id
            .filter(|_| publish.qos == QoS::ExactlyOnce)
        else {
            return false;
        };
        self.with_session(|s| s.incoming.contains_key(&id))
            .unwrap_or(false)
    }

    pub(super) fn answer_publish(&mut self, publish: &Publish, code: u8) -> Result<(), End> {
        let Some(packet_id) = publish.packet_id else {
            self.puback_reason = None;
            return Ok(());
        };
        if code >= 0x80 && self.protocol == ProtocolVersion::V311 {
            return Err(End::Close);
        }
        let why = self.puback_reason.take();
        let ack = self.ack(packet_id, code, why.as_deref());
        let packet = match publish.qos {
            QoS::ExactlyOnce => Packet::PubRec(ack),
            _ => Packet::PubAck(ack),
        };
        self.queue_packet(&packet);
        Ok(())
    }

    fn message_from(&self, publish: &Publish) -> Message {
        Message::published(
            publish.topic.clone(),
            publish.payload.clone(),
            (publish.qos, publish.retain),
            publish.properties.clone(),
            self.client_id.clone(),
            Instant::now(),
        )
    }

    /// Holds a QoS 2 publish on the session until its PUBREL, in memory, or says it
    /// is to be kept in storage first (`store_held`); a DUP re-send of one held is
    /// answered again. Past Receive Maximum the connection ends.
    fn hold_qos2(&mut self, publish: &Publish, packet_id: u16) -> Result<Hold, End> {
        let shared = self.shared.clone();
        let settings = &shared.settings;
        let mut broker = shared.broker.borrow_mut();
        let bounded = broker.channels.bounded(&publish.topic);
        let Some((session, metrics)) = broker.session_and_metrics(&self.client_id, self.link.id)
        else {
            // Another connection holds the client id now: nothing can be held for
            // a PUBREL here (A-168; 3.1.1 closes, as every refusal does).
            return Ok(Hold::Answer(reason::UNSPECIFIED_ERROR));
        };
        match qos2_room(session, packet_id, settings, metrics) {
            Ok(None) => {}
            Ok(Some(code)) => return Ok(Hold::Answer(code)),
            Err(code) => return Err(self.refuse(code)),
        }
        // Held until PUBREL, so a retransmission is never delivered twice; the
        // message is built only for a publish that is kept.
        let message = Arc::new(self.message_from(publish));
        if (session.stored && session.keeps_owed_in_log()) || bounded {
            // Its session outlives the connection: kept in storage before the
            // PUBREC (B-441). Or its channel has a max_bytes to measure it against.
            return Ok(Hold::Store(message));
        }
        let held = HeldQos2 {
            since: Instant::now(),
            message: Some(message),
            stored: None,
        };
        session.incoming.insert(packet_id, held);
        Ok(Hold::Answer(reason::SUCCESS))
    }

    /// Measures a QoS 2 publish against its channel's own `max_bytes` (0x97), keeps
    /// it, for a session that outlives its connection, in the provider of the
    /// channel it is for or the broadcast log's (B-441), before its PUBREC, and then
    /// holds it on the session; the PUBREC's code. A full provider takes room from
    /// the broadcast log first (B-476), then refuses 0x97.
    async fn store_held(&mut self, packet_id: u16, message: Arc<Message>) -> u8 {
        let shared = self.shared.clone();
        let (provider, token, bounded, kept) = {
            let mut broker = shared.broker.borrow_mut();
            let (provider, bounded) = match broker.destination(&message.topic) {
                crate::broker::Destination::Channel(id) => {
                    let c = broker.channels.get(id);
                    let bounded = c.max_bytes.map(|max| (c.name.clone(), max));
                    (Some(c.provider.clone()), bounded)
                }
                crate::broker::Destination::Broadcast => (broker.session_store(), None),
            };
            let kept = (broker.session_of(&self.client_id, self.link.id))
                .is_some_and(|s| s.stored && s.keeps_owed_in_log());
            (provider, broker.held_token(), bounded, kept)
        };
        let what = || {
            format!(
                "{}: QoS 2 publish {packet_id} by {} to {:?}",
                self.peer, self.client_id, message.topic
            )
        };
        if let (Some((channel, max_bytes)), Some(provider)) = (bounded, &provider)
            && let Err(e) = fits_channel(provider, &channel, max_bytes, &message).await
        {
            return not_stored(
                &shared.broker.borrow().metrics,
                &e,
                format_args!("{}", what()),
            );
        }
        let since = Instant::now();
        let Some(provider) = provider.filter(|_| kept) else {
            // Nothing to keep it in, or a session that ends with its connection:
            // held in memory, as for any other session.
            let held = HeldQos2 {
                since,
                message: Some(message),
                stored: None,
            };
            return match self.with_session(|s| s.incoming.insert(packet_id, held)) {
                Some(_) => reason::SUCCESS,
                // Taken over while it was measured.
                None => reason::UNSPECIFIED_ERROR,
            };
        };
        let held = crate::storage::Held {
            client_id: self.client_id.to_string(),
            packet_id,
            token,
            data: crate::broker::held::encode(&message, crate::broker::records::now_ms()),
        };
        let key = held.key();
        let put = || provider.put_held(held.clone());
        let written = with_room(&shared, &provider, put).await;
        let mut broker = shared.broker.borrow_mut();
        match written {
            Ok(()) => {
                let stored = crate::broker::held::StoredHeld {
                    provider: provider.clone(),
                    token,
                };
                let held = HeldQos2 {
                    since,
                    message: Some(message),
                    stored: Some(stored),
                };
                if let Some(session) = broker.session_of(&self.client_id, self.link.id) {
                    session.incoming.insert(packet_id, held);
                    return reason::SUCCESS;
                }
                // Taken over while it was written: nothing here can release it.
                broker.forget_held(crate::broker::held::HeldRef { provider, key });
                reason::UNSPECIFIED_ERROR
            }
            Err(e) => not_stored(&broker.metrics, &e, format_args!("{}", what())),
        }
    }

    pub(super) async fn on_pubrel(&mut self, packet_id: u16) -> Result<(), End> {
        let held = self
            .with_session(|s| s.incoming.remove(&packet_id))
            .flatten();
        let code = match held {
            Some(HeldQos2 {
                since,
                message: Some(message),
                stored,
            }) => {
                // Kept in storage: the record is written as one operation with the
                // release (B-442).
                let mut release = stored.as_ref().map(|s| s.at(&self.client_id, packet_id));
                let routed = route_releasing(&self.shared, message.clone(), &mut release).await;
                if routed.code >= 0x80 {
                    // The message stays held, and a PUBREL on the next connection
                    // completes it (RFC 0002 "A DISCONNECT from the broker"). But a
                    // broadcast handed out before its log write failed has reached
                    // its subscribers: its exchange is done, and that PUBREL only
                    // completes it, forgetting the stored copy (G-13: once per
                    // exchange). The store failing, the copy is left until then.
                    if routed.handed_out && stored.is_some() {
                        log::warn!(
                            "{}: QoS 2 publish {packet_id} of {} reached its subscribers \
                             but not the broadcast log; its stored copy goes when the PUBREL \
                             comes again, and a restart before then brings it back",
                            self.peer,
                            self.client_id
                        );
                    }
                    let held = HeldQos2 {
                        since,
                        message: (!routed.handed_out).then_some(message),
                        stored,
                    };
                    self.with_session(|s| s.incoming.insert(packet_id, held));
                    return Err(self.refuse(routed.code));
                }
                routed.code
            }
            Some(HeldQos2 {
                message: None,
                stored,
                ..
            }) => {
                if let Some(stored) = stored {
                    let forget = stored.at(&self.client_id, packet_id);
                    self.shared.broker.borrow_mut().forget_held(forget);
                }
                reason::SUCCESS
            }
            // Never held, or abandoned after broker.qos2.expires_after.
            None => reason::PACKET_IDENTIFIER_NOT_FOUND,
        };
        self.queue_packet(&Packet::PubComp(self.ack(packet_id, code, None)));
        Ok(())
    }
}

/// Whether `message` fits its channel's own `max_bytes` as the channel stands now: a
/// QoS 2 publish past it is refused on its PUBREC, where at the
/// PUBREL it could only end the connection with the message still held. One that
/// fills the channel between the two is still refused at the PUBREL; a failed read
/// lets it through, for the PUBREL's write to say what is wrong.
async fn fits_channel(
    provider: &crate::storage::Provider,
    channel: &str,
    max_bytes: u64,
    message: &Message,
) -> Result<(), crate::storage::StorageError> {
    let size = crate::broker::records::to_record(message, 0).size();
    let Ok(stats) = provider.stats(channel).await else {
        return Ok(());
    };
    crate::storage::StorageError::check_channel_room(channel, Some(max_bytes), stats.bytes, size, 0)
}
