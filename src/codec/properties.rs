//! MQTT 5 properties: every one the standard defines, with its wire type.

/// The properties a packet carries. Which of them a packet may carry is checked by the
/// decoder; a property it may not carry is Malformed (0x81), one sent twice is a
/// Protocol Error (0x82).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
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
