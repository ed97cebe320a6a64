//! MQTT 5 properties: every one the standard defines, with its wire type, which packets
//! may carry it, and how it is read and written.

use super::encode::wire;
use super::error::DecodeError;
use super::reader::Reader;

/// The properties a packet carries: a pointer, null while there are none. Most packets
/// carry none, and every packet is moved a few times on its way through; inline, the
/// values made every packet 368 bytes to copy and drop field by field.
///
/// Reads see [`PropertyValues::NONE`] when there are none. Writes say which kind
/// they are: [`Properties::edit`] to add (it allocates the values the first time),
/// [`Properties::present_mut`] to take away (it never allocates). A `DerefMut` would
/// hide the allocation in every `properties.x.take()` on the publish path.
#[derive(Clone, Default)]
pub struct Properties(Option<Box<PropertyValues>>);

impl Properties {
    /// The values to add to, allocated if there are none yet.
    pub fn edit(&mut self) -> &mut PropertyValues {
        self.0.get_or_insert_with(Box::default)
    }

    /// The values to change, when there are any: for taking properties away.
    pub fn present_mut(&mut self) -> Option<&mut PropertyValues> {
        self.0.as_deref_mut()
    }

    /// Frees the values once nothing is left in them, so that what is cloned or
    /// moved on is one null pointer again.
    pub fn shed_if_empty(&mut self) {
        if self.0.as_deref() == Some(&PropertyValues::NONE) {
            self.0 = None;
        }
    }
}

impl From<PropertyValues> for Properties {
    fn from(values: PropertyValues) -> Properties {
        if values == PropertyValues::NONE {
            return Properties(None);
        }
        Properties(Some(Box::new(values)))
    }
}

impl std::ops::Deref for Properties {
    type Target = PropertyValues;
    fn deref(&self) -> &PropertyValues {
        static NONE: PropertyValues = PropertyValues::NONE;
        self.0.as_deref().unwrap_or(&NONE)
    }
}

impl PartialEq for Properties {
    fn eq(&self, other: &Properties) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for Properties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// Every property MQTT 5 defines, each absent until set. Which of them a packet may
/// carry is checked by the decoder; a property it may not carry is Malformed (0x81),
/// one sent twice is a Protocol Error (0x82).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PropertyValues {
    /// 0x01 Payload Format Indicator (byte, 0 or 1).
    pub payload_format_indicator: Option<u8>,
    /// 0x02 Message Expiry Interval (four-byte integer, seconds).
    pub message_expiry_interval: Option<u32>,
    /// 0x03 Content Type (UTF-8 string).
    pub content_type: Option<String>,
    /// 0x08 Response Topic (UTF-8 string).
    pub response_topic: Option<String>,
    /// 0x09 Correlation Data (binary data).
    pub correlation_data: Option<Vec<u8>>,
    /// 0x0B Subscription Identifier (variable byte integer, 1..=268_435_455); a PUBLISH
    /// from the server may carry several, every other packet at most one.
    pub subscription_identifiers: Vec<u32>,
    /// 0x11 Session Expiry Interval (four-byte integer, seconds).
    pub session_expiry_interval: Option<u32>,
    /// 0x12 Assigned Client Identifier (UTF-8 string).
    pub assigned_client_identifier: Option<String>,
    /// 0x13 Server Keep Alive (two-byte integer).
    pub server_keep_alive: Option<u16>,
    /// 0x15 Authentication Method (UTF-8 string).
    pub authentication_method: Option<String>,
    /// 0x16 Authentication Data (binary data).
    pub authentication_data: Option<Vec<u8>>,
    /// 0x17 Request Problem Information (byte, 0 or 1).
    pub request_problem_information: Option<u8>,
    /// 0x18 Will Delay Interval (four-byte integer, seconds).
    pub will_delay_interval: Option<u32>,
    /// 0x19 Request Response Information (byte, 0 or 1).
    pub request_response_information: Option<u8>,
    /// 0x1A Response Information (UTF-8 string).
    pub response_information: Option<String>,
    /// 0x1C Server Reference (UTF-8 string).
    pub server_reference: Option<String>,
    /// 0x1F Reason String (UTF-8 string).
    pub reason_string: Option<String>,
    /// 0x21 Receive Maximum (two-byte integer, never 0).
    pub receive_maximum: Option<u16>,
    /// 0x22 Topic Alias Maximum (two-byte integer).
    pub topic_alias_maximum: Option<u16>,
    /// 0x23 Topic Alias (two-byte integer, never 0).
    pub topic_alias: Option<u16>,
    /// 0x24 Maximum QoS (byte, 0 or 1).
    pub maximum_qos: Option<u8>,
    /// 0x25 Retain Available (byte, 0 or 1).
    pub retain_available: Option<u8>,
    /// 0x26 User Property (UTF-8 string pair), in order, repeats allowed.
    pub user_properties: Vec<(String, String)>,
    /// 0x27 Maximum Packet Size (four-byte integer, never 0).
    pub maximum_packet_size: Option<u32>,
    /// 0x28 Wildcard Subscription Available (byte, 0 or 1).
    pub wildcard_subscription_available: Option<u8>,
    /// 0x29 Subscription Identifier Available (byte, 0 or 1).
    pub subscription_identifier_available: Option<u8>,
    /// 0x2A Shared Subscription Available (byte, 0 or 1).
    pub shared_subscription_available: Option<u8>,
}

impl PropertyValues {
    /// No property at all.
    pub const NONE: PropertyValues = PropertyValues {
        payload_format_indicator: None,
        message_expiry_interval: None,
        content_type: None,
        response_topic: None,
        correlation_data: None,
        subscription_identifiers: Vec::new(),
        session_expiry_interval: None,
        assigned_client_identifier: None,
        server_keep_alive: None,
        authentication_method: None,
        authentication_data: None,
        request_problem_information: None,
        will_delay_interval: None,
        request_response_information: None,
        response_information: None,
        server_reference: None,
        reason_string: None,
        receive_maximum: None,
        topic_alias_maximum: None,
        topic_alias: None,
        maximum_qos: None,
        retain_available: None,
        user_properties: Vec::new(),
        maximum_packet_size: None,
        wildcard_subscription_available: None,
        subscription_identifier_available: None,
        shared_subscription_available: None,
    };
}

/// The property identifiers MQTT 5 defines (section 2.2.2.2).
pub mod id {
    /// Payload Format Indicator.
    pub const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
    /// Message Expiry Interval.
    pub const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
    /// Content Type.
    pub const CONTENT_TYPE: u8 = 0x03;
    /// Response Topic.
    pub const RESPONSE_TOPIC: u8 = 0x08;
    /// Correlation Data.
    pub const CORRELATION_DATA: u8 = 0x09;
    /// Subscription Identifier.
    pub const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
    /// Session Expiry Interval.
    pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
    /// Assigned Client Identifier.
    pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
    /// Server Keep Alive.
    pub const SERVER_KEEP_ALIVE: u8 = 0x13;
    /// Authentication Method.
    pub const AUTHENTICATION_METHOD: u8 = 0x15;
    /// Authentication Data.
    pub const AUTHENTICATION_DATA: u8 = 0x16;
    /// Request Problem Information.
    pub const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
    /// Will Delay Interval.
    pub const WILL_DELAY_INTERVAL: u8 = 0x18;
    /// Request Response Information.
    pub const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
    /// Response Information.
    pub const RESPONSE_INFORMATION: u8 = 0x1A;
    /// Server Reference.
    pub const SERVER_REFERENCE: u8 = 0x1C;
    /// Reason String.
    pub const REASON_STRING: u8 = 0x1F;
    /// Receive Maximum.
    pub const RECEIVE_MAXIMUM: u8 = 0x21;
    /// Topic Alias Maximum.
    pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
    /// Topic Alias.
    pub const TOPIC_ALIAS: u8 = 0x23;
    /// Maximum QoS.
    pub const MAXIMUM_QOS: u8 = 0x24;
    /// Retain Available.
    pub const RETAIN_AVAILABLE: u8 = 0x25;
    /// User Property.
    pub const USER_PROPERTY: u8 = 0x26;
    /// Maximum Packet Size.
    pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
    /// Wildcard Subscription Available.
    pub const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
    /// Subscription Identifier Available.
    pub const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
    /// Shared Subscription Available.
    pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;
}

/// Which properties one kind of packet may carry (MQTT 5 section 2.2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allowed {
    /// Bit `n` set: property identifier `n` may appear.
    mask: u64,
    /// Whether Subscription Identifier may repeat (a PUBLISH from the server).
    repeat_subscription_identifier: bool,
}

const fn mask(ids: &[u8]) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < ids.len() {
        m |= 1 << ids[i];
        i += 1;
    }
    m
}

const fn allowed(ids: &[u8]) -> Allowed {
    Allowed {
        mask: mask(ids),
        repeat_subscription_identifier: false,
    }
}

impl Allowed {
    /// CONNECT.
    pub(crate) const CONNECT: Allowed = allowed(&[
        id::SESSION_EXPIRY_INTERVAL,
        id::AUTHENTICATION_METHOD,
        id::AUTHENTICATION_DATA,
        id::REQUEST_PROBLEM_INFORMATION,
        id::REQUEST_RESPONSE_INFORMATION,
        id::RECEIVE_MAXIMUM,
        id::TOPIC_ALIAS_MAXIMUM,
        id::USER_PROPERTY,
        id::MAXIMUM_PACKET_SIZE,
    ]);
    /// The Will Properties of a CONNECT.
    pub(crate) const WILL: Allowed = allowed(&[
        id::PAYLOAD_FORMAT_INDICATOR,
        id::MESSAGE_EXPIRY_INTERVAL,
        id::CONTENT_TYPE,
        id::RESPONSE_TOPIC,
        id::CORRELATION_DATA,
        id::WILL_DELAY_INTERVAL,
        id::USER_PROPERTY,
    ]);
    /// CONNACK.
    pub(crate) const CONNACK: Allowed = allowed(&[
        id::SESSION_EXPIRY_INTERVAL,
        id::ASSIGNED_CLIENT_IDENTIFIER,
        id::SERVER_KEEP_ALIVE,
        id::AUTHENTICATION_METHOD,
        id::AUTHENTICATION_DATA,
        id::RESPONSE_INFORMATION,
        id::SERVER_REFERENCE,
        id::REASON_STRING,
        id::RECEIVE_MAXIMUM,
        id::TOPIC_ALIAS_MAXIMUM,
        id::MAXIMUM_QOS,
        id::RETAIN_AVAILABLE,
        id::USER_PROPERTY,
        id::MAXIMUM_PACKET_SIZE,
        id::WILDCARD_SUBSCRIPTION_AVAILABLE,
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        id::SHARED_SUBSCRIPTION_AVAILABLE,
    ]);
    /// PUBLISH. Subscription Identifier may repeat: `decode` cannot tell which side sent
    /// it, and one from a client is a Protocol Error the broker checks (MQTT-3.3.4-6).
    pub(crate) const PUBLISH: Allowed = Allowed {
        mask: mask(&[
            id::PAYLOAD_FORMAT_INDICATOR,
            id::MESSAGE_EXPIRY_INTERVAL,
            id::CONTENT_TYPE,
            id::RESPONSE_TOPIC,
            id::CORRELATION_DATA,
            id::SUBSCRIPTION_IDENTIFIER,
            id::TOPIC_ALIAS,
            id::USER_PROPERTY,
        ]),
        repeat_subscription_identifier: true,
    };
    /// PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK.
    pub(crate) const ACK: Allowed = allowed(&[id::REASON_STRING, id::USER_PROPERTY]);
    /// SUBSCRIBE.
    pub(crate) const SUBSCRIBE: Allowed =
        allowed(&[id::SUBSCRIPTION_IDENTIFIER, id::USER_PROPERTY]);
    /// UNSUBSCRIBE.
    pub(crate) const UNSUBSCRIBE: Allowed = allowed(&[id::USER_PROPERTY]);
    /// DISCONNECT.
    pub(crate) const DISCONNECT: Allowed = allowed(&[
        id::SESSION_EXPIRY_INTERVAL,
        id::SERVER_REFERENCE,
        id::REASON_STRING,
        id::USER_PROPERTY,
    ]);
    /// AUTH.
    pub(crate) const AUTH: Allowed = allowed(&[
        id::AUTHENTICATION_METHOD,
        id::AUTHENTICATION_DATA,
        id::REASON_STRING,
        id::USER_PROPERTY,
    ]);

    /// Whether property `id` may appear.
    pub(crate) fn permits(self, id: u8) -> bool {
        id < 64 && self.mask & (1 << id) != 0
    }
}

/// Error texts naming each property, so a failure reads as what to fix.
macro_rules! property_names {
    ($($id:path => $name:literal,)*) => {
        /// "X on a packet that may not carry it": Malformed (MQTT 5 section 2.2.2.2).
        fn not_allowed(pid: u32) -> &'static str {
            match u8::try_from(pid) {
                $(Ok($id) => concat!($name, " on a packet that may not carry it"),)*
                _ => "unknown property identifier",
            }
        }
        /// "X sent twice": a Protocol Error.
        fn twice(pid: u8) -> &'static str {
            match pid {
                $($id => concat!($name, " sent twice"),)*
                _ => "property sent twice",
            }
        }
    };
}

property_names! {
    id::PAYLOAD_FORMAT_INDICATOR => "Payload Format Indicator",
    id::MESSAGE_EXPIRY_INTERVAL => "Message Expiry Interval",
    id::CONTENT_TYPE => "Content Type",
    id::RESPONSE_TOPIC => "Response Topic",
    id::CORRELATION_DATA => "Correlation Data",
    id::SUBSCRIPTION_IDENTIFIER => "Subscription Identifier",
    id::SESSION_EXPIRY_INTERVAL => "Session Expiry Interval",
    id::ASSIGNED_CLIENT_IDENTIFIER => "Assigned Client Identifier",
    id::SERVER_KEEP_ALIVE => "Server Keep Alive",
    id::AUTHENTICATION_METHOD => "Authentication Method",
    id::AUTHENTICATION_DATA => "Authentication Data",
    id::REQUEST_PROBLEM_INFORMATION => "Request Problem Information",
    id::WILL_DELAY_INTERVAL => "Will Delay Interval",
    id::REQUEST_RESPONSE_INFORMATION => "Request Response Information",
    id::RESPONSE_INFORMATION => "Response Information",
    id::SERVER_REFERENCE => "Server Reference",
    id::REASON_STRING => "Reason String",
    id::RECEIVE_MAXIMUM => "Receive Maximum",
    id::TOPIC_ALIAS_MAXIMUM => "Topic Alias Maximum",
    id::TOPIC_ALIAS => "Topic Alias",
    id::MAXIMUM_QOS => "Maximum QoS",
    id::RETAIN_AVAILABLE => "Retain Available",
    id::USER_PROPERTY => "User Property",
    id::MAXIMUM_PACKET_SIZE => "Maximum Packet Size",
    id::WILDCARD_SUBSCRIPTION_AVAILABLE => "Wildcard Subscription Available",
    id::SUBSCRIPTION_IDENTIFIER_AVAILABLE => "Subscription Identifier Available",
    id::SHARED_SUBSCRIPTION_AVAILABLE => "Shared Subscription Available",
}

/// Stores a once-only property; a second one is a Protocol Error.
fn once<T>(slot: &mut Option<T>, value: T, pid: u8) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DecodeError::Protocol(twice(pid)));
    }
    *slot = Some(value);
    Ok(())
}

/// A byte property whose only values are 0 and 1; anything else is a Protocol Error.
fn flag_byte(r: &mut Reader<'_>, name: &'static str, bad: &'static str) -> Result<u8, DecodeError> {
    match r.u8(name)? {
        b @ (0 | 1) => Ok(b),
        _ => Err(DecodeError::Protocol(bad)),
    }
}

/// A two-byte property that may not be 0 (a Protocol Error).
fn nonzero_u16(
    r: &mut Reader<'_>,
    name: &'static str,
    bad: &'static str,
) -> Result<u16, DecodeError> {
    match r.u16(name)? {
        0 => Err(DecodeError::Protocol(bad)),
        v => Ok(v),
    }
}

/// Reads a Property Length and the properties it covers, refusing any `allowed` lacks.
///
/// # Errors
/// Malformed for a property the packet may not carry, an unknown identifier or a length
/// past the packet; Protocol for a once-only property twice or a forbidden value.
pub(crate) fn read(r: &mut Reader<'_>, allowed: Allowed) -> Result<Properties, DecodeError> {
    let len = r.varint("property length")?;
    let mut r = r.sub(len as usize, "property length")?;
    let mut p = Properties::default();
    while !r.is_empty() {
        let pid = r.varint("property identifier")?;
        let pid = match u8::try_from(pid) {
            Ok(pid) if allowed.permits(pid) => pid,
            _ => return Err(DecodeError::Malformed(not_allowed(pid))),
        };
        read_one(&mut r, pid, allowed, p.edit())?;
    }
    Ok(p)
}

fn read_one(
    r: &mut Reader<'_>,
    pid: u8,
    allowed: Allowed,
    p: &mut PropertyValues,
) -> Result<(), DecodeError> {
    use DecodeError::Protocol;
    match pid {
        id::PAYLOAD_FORMAT_INDICATOR => {
            let v = flag_byte(
                r,
                "Payload Format Indicator",
                "Payload Format Indicator above 1",
            )?;
            once(&mut p.payload_format_indicator, v, pid)
        }
        id::MESSAGE_EXPIRY_INTERVAL => {
            let v = r.u32("Message Expiry Interval")?;
            once(&mut p.message_expiry_interval, v, pid)
        }
        id::CONTENT_TYPE => {
            let v = r.utf8("Content Type")?.to_owned();
            once(&mut p.content_type, v, pid)
        }
        id::RESPONSE_TOPIC => {
            let v = r.utf8("Response Topic")?;
            // A topic name: replies are published to it (MQTT-3.3.2-14, MQTT-4.7.3-1).
            if v.is_empty() || super::topic::has_wildcard(v) {
                return Err(Protocol("Response Topic empty or with a wildcard"));
            }
            once(&mut p.response_topic, v.to_owned(), pid)
        }
        id::CORRELATION_DATA => {
            let v = r.binary("Correlation Data")?.to_vec();
            once(&mut p.correlation_data, v, pid)
        }
        id::SUBSCRIPTION_IDENTIFIER => {
            let v = r.varint("Subscription Identifier")?;
            if v == 0 {
                return Err(Protocol("Subscription Identifier of 0"));
            }
            if !allowed.repeat_subscription_identifier && !p.subscription_identifiers.is_empty() {
                return Err(Protocol(twice(pid)));
            }
            p.subscription_identifiers.push(v);
            Ok(())
        }
        id::SESSION_EXPIRY_INTERVAL => {
            let v = r.u32("Session Expiry Interval")?;
            once(&mut p.session_expiry_interval, v, pid)
        }
        id::ASSIGNED_CLIENT_IDENTIFIER => {
            let v = r.utf8("Assigned Client Identifier")?.to_owned();
            once(&mut p.assigned_client_identifier, v, pid)
        }
        id::SERVER_KEEP_ALIVE => {
            let v = r.u16("Server Keep Alive")?;
            once(&mut p.server_keep_alive, v, pid)
        }
        id::AUTHENTICATION_METHOD => {
            let v = r.utf8("Authentication Method")?.to_owned();
            once(&mut p.authentication_method, v, pid)
        }
        id::AUTHENTICATION_DATA => {
            let v = r.binary("Authentication Data")?.to_vec();
            once(&mut p.authentication_data, v, pid)
        }
        id::REQUEST_PROBLEM_INFORMATION => {
            let v = flag_byte(
                r,
                "Request Problem Information",
                "Request Problem Information above 1",
            )?;
            once(&mut p.request_problem_information, v, pid)
        }
        id::WILL_DELAY_INTERVAL => {
            let v = r.u32("Will Delay Interval")?;
            once(&mut p.will_delay_interval, v, pid)
        }
        id::REQUEST_RESPONSE_INFORMATION => {
            let v = flag_byte(
                r,
                "Request Response Information",
                "Request Response Information above 1",
            )?;
            once(&mut p.request_response_information, v, pid)
        }
        id::RESPONSE_INFORMATION => {
            let v = r.utf8("Response Information")?.to_owned();
            once(&mut p.response_information, v, pid)
        }
        id::SERVER_REFERENCE => {
            let v = r.utf8("Server Reference")?.to_owned();
            once(&mut p.server_reference, v, pid)
        }
        id::REASON_STRING => {
            let v = r.utf8("Reason String")?.to_owned();
            once(&mut p.reason_string, v, pid)
        }
        id::RECEIVE_MAXIMUM => {
            let v = nonzero_u16(r, "Receive Maximum", "Receive Maximum of 0")?;
            once(&mut p.receive_maximum, v, pid)
        }
        id::TOPIC_ALIAS_MAXIMUM => {
            let v = r.u16("Topic Alias Maximum")?;
            once(&mut p.topic_alias_maximum, v, pid)
        }
        id::TOPIC_ALIAS => {
            let v = nonzero_u16(r, "Topic Alias", "Topic Alias of 0")?;
            once(&mut p.topic_alias, v, pid)
        }
        id::MAXIMUM_QOS => {
            let v = flag_byte(r, "Maximum QoS", "Maximum QoS above 1")?;
            once(&mut p.maximum_qos, v, pid)
        }
        id::RETAIN_AVAILABLE => {
            let v = flag_byte(r, "Retain Available", "Retain Available above 1")?;
            once(&mut p.retain_available, v, pid)
        }
        id::USER_PROPERTY => {
            let k = r.utf8("User Property name")?.to_owned();
            let v = r.utf8("User Property value")?.to_owned();
            p.user_properties.push((k, v));
            Ok(())
        }
        id::MAXIMUM_PACKET_SIZE => match r.u32("Maximum Packet Size")? {
            0 => Err(Protocol("Maximum Packet Size of 0")),
            v => once(&mut p.maximum_packet_size, v, pid),
        },
        id::WILDCARD_SUBSCRIPTION_AVAILABLE => {
            let v = flag_byte(
                r,
                "Wildcard Subscription Available",
                "Wildcard Subscription Available above 1",
            )?;
            once(&mut p.wildcard_subscription_available, v, pid)
        }
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
            let v = flag_byte(
                r,
                "Subscription Identifier Available",
                "Subscription Identifier Available above 1",
            )?;
            once(&mut p.subscription_identifier_available, v, pid)
        }
        id::SHARED_SUBSCRIPTION_AVAILABLE => {
            let v = flag_byte(
                r,
                "Shared Subscription Available",
                "Shared Subscription Available above 1",
            )?;
            once(&mut p.shared_subscription_available, v, pid)
        }
        // `read` admits only identifiers some allow-list holds, all matched above.
        _ => Err(DecodeError::Malformed(not_allowed(u32::from(pid)))),
    }
}

/// Writes a Property Length and every property `allowed` admits, in identifier order.
/// A property the packet may not carry is left out rather than sent malformed.
pub(crate) fn write(p: &Properties, allowed: Allowed, out: &mut Vec<u8>) {
    if p.0.is_none() {
        out.push(0); // a Property Length of 0
        return;
    }
    let start = out.len();
    let ok = |pid| allowed.permits(pid);
    let byte = |out: &mut Vec<u8>, pid: u8, v: Option<u8>| {
        if let Some(v) = v.filter(|_| ok(pid)) {
            out.extend_from_slice(&[pid, v]);
        }
    };
    let two = |out: &mut Vec<u8>, pid: u8, v: Option<u16>| {
        if let Some(v) = v.filter(|_| ok(pid)) {
            out.push(pid);
            out.extend_from_slice(&v.to_be_bytes());
        }
    };
    let four = |out: &mut Vec<u8>, pid: u8, v: Option<u32>| {
        if let Some(v) = v.filter(|_| ok(pid)) {
            out.push(pid);
            out.extend_from_slice(&v.to_be_bytes());
        }
    };
    let string = |out: &mut Vec<u8>, pid: u8, v: &Option<String>| {
        if let Some(v) = v.as_deref().filter(|_| ok(pid)) {
            out.push(pid);
            wire::put_str(out, v);
        }
    };
    let binary = |out: &mut Vec<u8>, pid: u8, v: &Option<Vec<u8>>| {
        if let Some(v) = v.as_deref().filter(|_| ok(pid)) {
            out.push(pid);
            wire::put_binary(out, v);
        }
    };
    byte(
        out,
        id::PAYLOAD_FORMAT_INDICATOR,
        p.payload_format_indicator,
    );
    four(out, id::MESSAGE_EXPIRY_INTERVAL, p.message_expiry_interval);
    string(out, id::CONTENT_TYPE, &p.content_type);
    string(out, id::RESPONSE_TOPIC, &p.response_topic);
    binary(out, id::CORRELATION_DATA, &p.correlation_data);
    if ok(id::SUBSCRIPTION_IDENTIFIER) {
        let n = if allowed.repeat_subscription_identifier {
            usize::MAX
        } else {
            1
        };
        for &v in p.subscription_identifiers.iter().take(n) {
            out.push(id::SUBSCRIPTION_IDENTIFIER);
            wire::put_varint(out, v);
        }
    }
    four(out, id::SESSION_EXPIRY_INTERVAL, p.session_expiry_interval);
    string(
        out,
        id::ASSIGNED_CLIENT_IDENTIFIER,
        &p.assigned_client_identifier,
    );
    two(out, id::SERVER_KEEP_ALIVE, p.server_keep_alive);
    string(out, id::AUTHENTICATION_METHOD, &p.authentication_method);
    binary(out, id::AUTHENTICATION_DATA, &p.authentication_data);
    byte(
        out,
        id::REQUEST_PROBLEM_INFORMATION,
        p.request_problem_information,
    );
    four(out, id::WILL_DELAY_INTERVAL, p.will_delay_interval);
    byte(
        out,
        id::REQUEST_RESPONSE_INFORMATION,
        p.request_response_information,
    );
    string(out, id::RESPONSE_INFORMATION, &p.response_information);
    string(out, id::SERVER_REFERENCE, &p.server_reference);
    string(out, id::REASON_STRING, &p.reason_string);
    two(out, id::RECEIVE_MAXIMUM, p.receive_maximum);
    two(out, id::TOPIC_ALIAS_MAXIMUM, p.topic_alias_maximum);
    two(out, id::TOPIC_ALIAS, p.topic_alias);
    byte(out, id::MAXIMUM_QOS, p.maximum_qos);
    byte(out, id::RETAIN_AVAILABLE, p.retain_available);
    if ok(id::USER_PROPERTY) {
        for (k, v) in &p.user_properties {
            out.push(id::USER_PROPERTY);
            wire::put_str(out, k);
            wire::put_str(out, v);
        }
    }
    four(out, id::MAXIMUM_PACKET_SIZE, p.maximum_packet_size);
    byte(
        out,
        id::WILDCARD_SUBSCRIPTION_AVAILABLE,
        p.wildcard_subscription_available,
    );
    byte(
        out,
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        p.subscription_identifier_available,
    );
    byte(
        out,
        id::SHARED_SUBSCRIPTION_AVAILABLE,
        p.shared_subscription_available,
    );
    wire::insert_length(out, start);
}
