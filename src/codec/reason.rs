//! Every MQTT 5 reason code (section 2.4), by name, so no code is a bare number.
//!
//! MQTT reuses some numbers under different names depending on the packet (0x00 is
//! Success, Normal disconnection and Granted QoS 0); each name is its own constant.

/// 0x00 Success (CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK, AUTH).
pub const SUCCESS: u8 = 0x00;
/// 0x00 Normal disconnection (DISCONNECT).
pub const NORMAL_DISCONNECTION: u8 = 0x00;
/// 0x00 Granted QoS 0 (SUBACK).
pub const GRANTED_QOS_0: u8 = 0x00;
/// 0x01 Granted QoS 1 (SUBACK).
pub const GRANTED_QOS_1: u8 = 0x01;
/// 0x02 Granted QoS 2 (SUBACK).
pub const GRANTED_QOS_2: u8 = 0x02;
/// 0x04 Disconnect with Will Message (DISCONNECT).
pub const DISCONNECT_WITH_WILL_MESSAGE: u8 = 0x04;
/// 0x10 No matching subscribers (PUBACK, PUBREC).
pub const NO_MATCHING_SUBSCRIBERS: u8 = 0x10;
/// 0x11 No subscription existed (UNSUBACK).
pub const NO_SUBSCRIPTION_EXISTED: u8 = 0x11;
/// 0x18 Continue authentication (AUTH).
pub const CONTINUE_AUTHENTICATION: u8 = 0x18;
/// 0x19 Re-authenticate (AUTH).
pub const RE_AUTHENTICATE: u8 = 0x19;
/// 0x80 Unspecified error.
pub const UNSPECIFIED_ERROR: u8 = 0x80;
/// 0x81 Malformed Packet.
pub const MALFORMED_PACKET: u8 = 0x81;
/// 0x82 Protocol Error.
pub const PROTOCOL_ERROR: u8 = 0x82;
/// 0x83 Implementation specific error.
pub const IMPLEMENTATION_SPECIFIC_ERROR: u8 = 0x83;
/// 0x84 Unsupported Protocol Version (CONNACK).
pub const UNSUPPORTED_PROTOCOL_VERSION: u8 = 0x84;
/// 0x85 Client Identifier not valid (CONNACK).
pub const CLIENT_IDENTIFIER_NOT_VALID: u8 = 0x85;
/// 0x86 Bad User Name or Password (CONNACK).
pub const BAD_USER_NAME_OR_PASSWORD: u8 = 0x86;
/// 0x87 Not authorized.
pub const NOT_AUTHORIZED: u8 = 0x87;
/// 0x88 Server unavailable (CONNACK).
pub const SERVER_UNAVAILABLE: u8 = 0x88;
/// 0x89 Server busy.
pub const SERVER_BUSY: u8 = 0x89;
/// 0x8A Banned (CONNACK).
pub const BANNED: u8 = 0x8A;
/// 0x8B Server shutting down (DISCONNECT).
pub const SERVER_SHUTTING_DOWN: u8 = 0x8B;
/// 0x8C Bad authentication method.
pub const BAD_AUTHENTICATION_METHOD: u8 = 0x8C;
/// 0x8D Keep Alive timeout (DISCONNECT).
pub const KEEP_ALIVE_TIMEOUT: u8 = 0x8D;
/// 0x8E Session taken over (DISCONNECT).
pub const SESSION_TAKEN_OVER: u8 = 0x8E;
/// 0x8F Topic Filter invalid.
pub const TOPIC_FILTER_INVALID: u8 = 0x8F;
/// 0x90 Topic Name invalid.
pub const TOPIC_NAME_INVALID: u8 = 0x90;
/// 0x91 Packet Identifier in use.
pub const PACKET_IDENTIFIER_IN_USE: u8 = 0x91;
/// 0x92 Packet Identifier not found.
pub const PACKET_IDENTIFIER_NOT_FOUND: u8 = 0x92;
/// 0x93 Receive Maximum exceeded (DISCONNECT).
pub const RECEIVE_MAXIMUM_EXCEEDED: u8 = 0x93;
/// 0x94 Topic Alias invalid (DISCONNECT).
pub const TOPIC_ALIAS_INVALID: u8 = 0x94;
/// 0x95 Packet too large.
pub const PACKET_TOO_LARGE: u8 = 0x95;
/// 0x96 Message rate too high (DISCONNECT).
pub const MESSAGE_RATE_TOO_HIGH: u8 = 0x96;
/// 0x97 Quota exceeded.
pub const QUOTA_EXCEEDED: u8 = 0x97;
/// 0x98 Administrative action (DISCONNECT).
pub const ADMINISTRATIVE_ACTION: u8 = 0x98;
/// 0x99 Payload format invalid.
pub const PAYLOAD_FORMAT_INVALID: u8 = 0x99;
/// 0x9A Retain not supported.
pub const RETAIN_NOT_SUPPORTED: u8 = 0x9A;
/// 0x9B QoS not supported.
pub const QOS_NOT_SUPPORTED: u8 = 0x9B;
/// 0x9C Use another server.
pub const USE_ANOTHER_SERVER: u8 = 0x9C;
/// 0x9D Server moved.
pub const SERVER_MOVED: u8 = 0x9D;
/// 0x9E Shared Subscriptions not supported.
pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0x9E;
/// 0x9F Connection rate exceeded.
pub const CONNECTION_RATE_EXCEEDED: u8 = 0x9F;
/// 0xA0 Maximum connect time (DISCONNECT).
pub const MAXIMUM_CONNECT_TIME: u8 = 0xA0;
/// 0xA1 Subscription Identifiers not supported.
pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: u8 = 0xA1;
/// 0xA2 Wildcard Subscriptions not supported.
pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0xA2;

/// The MQTT 3.1.1 CONNACK return codes (section 3.2.2.3).
pub mod v311 {
    /// 0x00 Connection Accepted.
    pub const ACCEPTED: u8 = 0x00;
    /// 0x01 Connection Refused, unacceptable protocol version.
    pub const UNACCEPTABLE_PROTOCOL_VERSION: u8 = 0x01;
    /// 0x02 Connection Refused, identifier rejected.
    pub const IDENTIFIER_REJECTED: u8 = 0x02;
    /// 0x03 Connection Refused, Server unavailable.
    pub const SERVER_UNAVAILABLE: u8 = 0x03;
    /// 0x04 Connection Refused, bad user name or password.
    pub const BAD_USER_NAME_OR_PASSWORD: u8 = 0x04;
    /// 0x05 Connection Refused, not authorized.
    pub const NOT_AUTHORIZED: u8 = 0x05;
    /// 0x80 Failure, in a SUBACK.
    pub const SUBACK_FAILURE: u8 = 0x80;
}
