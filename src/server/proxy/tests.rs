//! The header parser against headers built by hand (`tests/common/proxy.rs`, shared
//! with the tests that drive the broker binary).

#[path = "../../../tests/common/proxy.rs"]
mod build;

use super::*;
use build::{TLS_WITH_CERTIFICATE, V2};

fn client(header: &V2) -> Option<String> {
    parse(&header.bytes())
        .map(|h| h.client)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn crc32c_matches_the_check_value_both_ways() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(build::crc32c(b"123456789"), 0xE306_9283);
}

/// B-239: the client's address, IPv4 and IPv6; a LOCAL header names none.
#[test]
fn addresses_name_the_client_b239() {
    assert_eq!(
        client(&V2::tcp4([203, 0, 113, 7], 51234)).as_deref(),
        Some("203.0.113.7:51234")
    );
    let mut ip = [0u8; 16];
    ip[..2].copy_from_slice(&[0x20, 0x01]);
    ip[15] = 9;
    assert_eq!(client(&V2::tcp6(ip, 1)).as_deref(), Some("[2001::9]:1"));
    assert_eq!(parse(&V2::local().bytes()).ok(), Some(Header::default()));
}

/// B-243: addresses, an authority TLV, the SSL TLV with every sub-TLV nginx sends,
/// and a CRC32C: all read, the Common Name kept.
#[test]
fn an_nginx_header_is_read_whole_b243() {
    let header = V2::tcp4([10, 0, 0, 1], 4000)
        .authority("mqtt.example.net")
        .ssl(TLS_WITH_CERTIFICATE, 0, Some("device-7"))
        .crc(true);
    let parsed = parse(&header.bytes()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        parsed.ssl,
        Some(Ssl {
            client: TLS_WITH_CERTIFICATE,
            verify: 0,
            common_name: Some("device-7".into()),
        })
    );
    assert!(parsed.ssl.as_ref().is_some_and(Ssl::presented));
}

#[test]
fn a_wrong_crc32c_is_refused() {
    let header = V2::tcp4([10, 0, 0, 1], 4000).crc(false);
    assert!(matches!(
        parse(&header.bytes()),
        Err(ProxyError::Crc { .. })
    ));
}

/// B-238, B-236: a v1 header and bytes that are no header are told apart as soon
/// as the first bytes allow.
#[test]
fn first_bytes_tell_v1_and_no_header_apart_b236_b238() {
    assert!(check_prefix(b"PROX").is_ok());
    assert!(matches!(check_prefix(b"PROXY TCP4 "), Err(ProxyError::V1)));
    assert!(matches!(
        check_prefix(&[0x10, 0x20]),
        Err(ProxyError::NotProxy(0x10))
    ));
    assert!(matches!(
        check_prefix(b"PUT"),
        Err(ProxyError::NotProxy(b'P'))
    ));
    assert!(check_prefix(&build::SIGNATURE[..5]).is_ok());
    assert!(check_prefix(&[]).is_ok());
}

#[test]
fn version_command_and_length_are_checked_before_the_body() {
    let v1_after_signature = V2::local().version_command(0x11).bytes();
    assert!(matches!(
        declared_length(&v1_after_signature),
        Err(ProxyError::Version(1))
    ));
    let unknown_command = V2::local().version_command(0x22).bytes();
    assert!(matches!(
        declared_length(&unknown_command),
        Err(ProxyError::Command(2))
    ));
    let long = V2::tcp4([1, 2, 3, 4], 5)
        .tlv(0x04, &[0; MAX_HEADER])
        .bytes();
    assert!(matches!(
        declared_length(&long),
        Err(ProxyError::TooLong(_))
    ));
}

#[test]
fn truncated_and_repeated_fields_are_malformed() {
    let mut short = V2::tcp4([1, 2, 3, 4], 5).ssl(1, 0, Some("x")).bytes();
    // Declared one byte longer than the TLV that is there.
    let declared = u16::from_be_bytes([short[14], short[15]]) + 1;
    short[14..16].copy_from_slice(&declared.to_be_bytes());
    short.push(0x20);
    assert!(matches!(parse(&short), Err(ProxyError::Malformed(_))));
    let twice = V2::tcp4([1, 2, 3, 4], 5)
        .ssl(TLS_WITH_CERTIFICATE, 0, Some("a"))
        .ssl(TLS_WITH_CERTIFICATE, 0, Some("b"));
    assert!(matches!(
        parse(&twice.bytes()),
        Err(ProxyError::Malformed(_))
    ));
    let not_utf8 = V2::tcp4([1, 2, 3, 4], 5).ssl(TLS_WITH_CERTIFICATE, 0, None);
    let mut bytes = not_utf8.bytes();
    // An SSL TLV whose last sub-TLV (the key algorithm) is made a CN of bad bytes.
    let at = bytes.len() - (3 + b"id-ecPublicKey".len());
    bytes[at] = 0x22;
    bytes[at + 3] = 0xFF;
    assert!(matches!(parse(&bytes), Err(ProxyError::Malformed(_))));
}

/// B-241: flags without a certificate, or without TLS, vouch for nobody.
#[test]
fn only_tls_with_a_certificate_is_presented_b241() {
    let ssl = |client| Ssl {
        client,
        verify: 0,
        common_name: Some("n".into()),
    };
    assert!(ssl(0x01 | 0x04).presented());
    assert!(!ssl(0x01).presented());
    assert!(!ssl(0x02).presented());
    let header = Header {
        client: None,
        ssl: Some(ssl(0x01)),
    };
    assert_eq!(vouched_name(&header, "p", "d"), None);
    let unverified = Header {
        client: None,
        ssl: Some(Ssl {
            verify: 21,
            ..ssl(TLS_WITH_CERTIFICATE)
        }),
    };
    assert_eq!(vouched_name(&unverified, "p", "d"), None);
    let verified = Header {
        client: None,
        ssl: Some(ssl(TLS_WITH_CERTIFICATE)),
    };
    assert_eq!(vouched_name(&verified, "p", "d").as_deref(), Some("n"));
}

proptest::proptest! {
    /// Whatever follows a valid opening, the parser answers and never panics; the
    /// prefix check never panics on any first bytes either.
    #[test]
    fn any_header_is_answered_without_panicking(
        family in 0u8..=0xFF,
        command in 0u8..=0x0F,
        body in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
    ) {
        let mut header = build::SIGNATURE.to_vec();
        header.push(0x20 | command);
        header.push(family);
        let length = u16::try_from(body.len()).unwrap_or(u16::MAX);
        header.extend(length.to_be_bytes());
        header.extend(&body);
        let _ = parse(&header);
        let _ = check_prefix(&body);
    }
}
