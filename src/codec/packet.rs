//! The packets of MQTT 3.1.1 (protocol level 4) and MQTT 5 (level 5), as plain values.
//!
//! One type serves both protocols: fields MQTT 3.1.1 lacks (properties, reason codes)
//! are simply empty or zero when that protocol is spoken, and the encoder leaves them out.

use std::sync::Arc;

use super::properties::Properties;

/// The protocol a connection speaks, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolVersion {
    /// MQTT 3.1.1, protocol level 4.
    V311,
    /// MQTT 5, protocol level 5.
    V5,
}

impl ProtocolVersion {
    /// The protocol level byte of a CONNECT.
    pub fn level(self) -> u8 {
        match self {
            ProtocolVersion::V311 => 4,
            ProtocolVersion::V5 => 5,
        }
    }
}

/// Quality of service of a publish or a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QoS {
    /// At most once.
    AtMostOnce = 0,
    /// At least once.
    AtLeastOnce = 1,
    /// Exactly once.
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS a two-bit field names, or `None` for the reserved value 3.
    pub fn from_bits(bits: u8) -> Option<QoS> {
        match bits {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// Any MQTT control packet.
#[derive(Debug, Clone, PartialEq)]
pub enum Packet {
    /// CONNECT (1).
    Connect(Box<Connect>),
    /// CONNACK (2).
    ConnAck(ConnAck),
    /// PUBLISH (3).
    Publish(Publish),
    /// PUBACK (4).
    PubAck(Ack),
    /// PUBREC (5).
    PubRec(Ack),
    /// PUBREL (6).
    PubRel(Ack),
    /// PUBCOMP (7).
    PubComp(Ack),
    /// SUBSCRIBE (8).
    Subscribe(Subscribe),
    /// SUBACK (9).
    SubAck(SubAck),
    /// UNSUBSCRIBE (10).
    Unsubscribe(Unsubscribe),
    /// UNSUBACK (11).
    UnsubAck(UnsubAck),
    /// PINGREQ (12).
    PingReq,
    /// PINGRESP (13).
    PingResp,
    /// DISCONNECT (14).
    Disconnect(Disconnect),
    /// AUTH (15), MQTT 5 only.
    Auth(Auth),
}

/// CONNECT: the first packet of every connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Connect {
    /// The protocol the client speaks from here on.
    pub protocol: ProtocolVersion,
    /// Clean Start (MQTT 5) / cleanSession (3.1.1).
    pub clean_start: bool,
    /// Keep Alive in seconds; 0 turns it off.
    pub keep_alive: u16,
    /// The client identifier, possibly empty.
    pub client_id: String,
    /// The Will, if the client armed one.
    pub will: Option<Will>,
    /// User Name.
    pub username: Option<String>,
    /// Password (binary data).
    pub password: Option<Vec<u8>>,
    /// CONNECT properties (MQTT 5).
    pub properties: Properties,
}

/// The Last Will a CONNECT carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Will {
    /// Will Topic.
    pub topic: String,
    /// Will Payload.
    pub payload: Vec<u8>,
    /// Will QoS.
    pub qos: QoS,
    /// Will Retain.
    pub retain: bool,
    /// Will properties (MQTT 5).
    pub properties: Properties,
}

/// CONNACK.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnAck {
    /// Session Present.
    pub session_present: bool,
    /// MQTT 5 reason code, or the 3.1.1 return code (0..=5) on a 3.1.1 connection.
    pub code: u8,
    /// CONNACK properties (MQTT 5).
    pub properties: Properties,
}

/// PUBLISH.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// DUP flag.
    pub dup: bool,
    /// QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic Name; empty when a topic alias stands in for it.
    pub topic: Arc<str>,
    /// Packet Identifier, present exactly when QoS > 0.
    pub packet_id: Option<u16>,
    /// PUBLISH properties (MQTT 5).
    pub properties: Properties,
    /// Application payload, shared between every subscriber it goes to.
    pub payload: Arc<[u8]>,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Ack {
    /// Packet Identifier.
    pub packet_id: u16,
    /// Reason code (MQTT 5); 0 on 3.1.1.
    pub code: u8,
    /// Properties (MQTT 5): Reason String and User Properties.
    pub properties: Properties,
}

impl Ack {
    /// An acknowledgement with a reason code and no properties.
    pub fn new(packet_id: u16, code: u8) -> Ack {
        Ack {
            packet_id,
            code,
            properties: Properties::default(),
        }
    }
}

/// Retain Handling subscription option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainHandling {
    /// 0: send retained messages at the time of the subscribe.
    OnSubscribe = 0,
    /// 1: send them only if the subscription did not already exist.
    OnNewSubscribe = 1,
    /// 2: never send them.
    Never = 2,
}

/// Subscription options of one filter in a SUBSCRIBE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriptionOptions {
    /// Maximum QoS.
    pub qos: QoS,
    /// No Local (MQTT 5).
    pub no_local: bool,
    /// Retain As Published (MQTT 5).
    pub retain_as_published: bool,
    /// Retain Handling (MQTT 5).
    pub retain_handling: RetainHandling,
}

impl SubscriptionOptions {
    /// Options as a 3.1.1 client gets them: only the QoS is its to choose.
    pub fn with_qos(qos: QoS) -> SubscriptionOptions {
        SubscriptionOptions {
            qos,
            no_local: false,
            retain_as_published: false,
            retain_handling: RetainHandling::OnSubscribe,
        }
    }
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscribe {
    /// Packet Identifier.
    pub packet_id: u16,
    /// Properties (MQTT 5): Subscription Identifier and User Properties.
    pub properties: Properties,
    /// The filters, never empty once decoded (an empty list is a Protocol Error).
    pub filters: Vec<(String, SubscriptionOptions)>,
}

/// SUBACK.
#[derive(Debug, Clone, PartialEq)]
pub struct SubAck {
    /// Packet Identifier.
    pub packet_id: u16,
    /// Properties (MQTT 5).
    pub properties: Properties,
    /// One reason code per filter (3.1.1: 0, 1, 2 or 0x80).
    pub codes: Vec<u8>,
}

/// UNSUBSCRIBE.
#[derive(Debug, Clone, PartialEq)]
pub struct Unsubscribe {
    /// Packet Identifier.
    pub packet_id: u16,
    /// Properties (MQTT 5).
    pub properties: Properties,
    /// The filters, never empty once decoded.
    pub filters: Vec<String>,
}

/// UNSUBACK.
#[derive(Debug, Clone, PartialEq)]
pub struct UnsubAck {
    /// Packet Identifier.
    pub packet_id: u16,
    /// Properties (MQTT 5).
    pub properties: Properties,
    /// One reason code per filter (MQTT 5); empty on 3.1.1.
    pub codes: Vec<u8>,
}

/// DISCONNECT.
#[derive(Debug, Clone, PartialEq)]
pub struct Disconnect {
    /// Reason code (MQTT 5); 0 on 3.1.1.
    pub code: u8,
    /// Properties (MQTT 5).
    pub properties: Properties,
}

impl Disconnect {
    /// A DISCONNECT with a reason code and no properties.
    pub fn new(code: u8) -> Disconnect {
        Disconnect {
            code,
            properties: Properties::default(),
        }
    }
}

/// AUTH (MQTT 5).
#[derive(Debug, Clone, PartialEq)]
pub struct Auth {
    /// Reason code.
    pub code: u8,
    /// Properties.
    pub properties: Properties,
}
