//! Client-declared partitioning (RFC 0003 "Client-declared partitioning"): the
//! `saguin-filter` User Property of a SUBSCRIBE, read into a [`Slice`], and
//! [`topic_hash`], the constant of the protocol a slice is taken from.
//!
//! A declaration is `topic_hash(<partitions>, <index>)`, repeated for several
//! slices of one partition space (an OR). It applies to every filter of its
//! SUBSCRIBE and to nothing else, and is kept on each subscription it was made on
//! ([`crate::broker::session::Subscription`], [`crate::broker::cursor::ChannelSub`],
//! [`crate::broker::topic::SubEntry`]); every place that chooses a delivery asks
//! [`admits`].
//!
//! Architecture invariant: nothing here keeps state beyond the subscription. There is
//! no group, membership or group cursor (C-193): a member's cursor steps over a
//! record outside its slice as over one its filters do not match (C-198).

use std::fmt;

/// The SUBSCRIBE User Property declaring a slice.
pub const PROPERTY: &str = "saguin-filter";

/// The one function a declaration may call (C-180).
const FUNCTION: &str = "topic_hash";

/// The largest argument, the same on every platform (C-181, C-192).
pub const MAX_ARGUMENT: u32 = 2_147_483_647;

/// The accepted form, as every refusal states it (C-187).
const FORM: &str = "topic_hash(<partitions>, <index>)";

/// FNV-1a 64-bit over the topic's UTF-8 bytes (C-170).
pub fn fnv1a64(topic: &str) -> u64 {
    topic.bytes().fold(14_695_981_039_346_656_037, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(1_099_511_628_211)
    })
}

/// The mixing step applied to the FNV-1a value: splitmix64's finalizer (C-171).
pub fn mix(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(13_787_848_793_156_543_929);
    h ^= h >> 27;
    h = h.wrapping_mul(10_723_151_780_598_845_931);
    h ^ (h >> 31)
}

/// `topic_hash`: FNV-1a 64 then the mixing step, unseeded (C-170..C-173). A slice is
/// always taken from this value, never from the raw FNV-1a one (C-172).
pub fn topic_hash(topic: &str) -> u64 {
    mix(fnv1a64(topic))
}

/// One subscription's share of a partition space: the topics whose
/// `topic_hash mod partitions` is one of `indices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    partitions: u32,
    /// Sorted, without duplicates, each below `partitions`; never empty.
    indices: Box<[u32]>,
}

impl Slice {
    /// The partition count: a subscription has exactly one (C-197).
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The indices declared, sorted and without duplicates.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    /// A slice read back from a stored session: `None` unless `partitions` is not 0
    /// and `indices` are non-empty, sorted, distinct and each below it, as
    /// [`declared`] makes them.
    pub fn from_parts(partitions: u32, indices: Vec<u32>) -> Option<Slice> {
        let ordered = indices.windows(2).all(|w| w[0] < w[1]);
        let inside = indices.iter().all(|i| *i < partitions);
        (partitions > 0 && !indices.is_empty() && ordered && inside).then(|| Slice {
            partitions,
            indices: indices.into_boxed_slice(),
        })
    }

    /// Whether a message on `topic` lies in this slice (C-154, C-156).
    pub fn admits(&self, topic: &str) -> bool {
        let index = topic_hash(topic) % u64::from(self.partitions);
        // `index` < partitions <= u32::MAX, so the conversion always succeeds.
        u32::try_from(index).is_ok_and(|i| self.indices.binary_search(&i).is_ok())
    }
}

/// Whether a subscription declaring `slice` (or nothing) takes a message on
/// `topic`: the one check every delivery path asks. No declaration takes
/// everything the filter reaches (C-155, C-162).
pub fn admits(slice: Option<&Slice>, topic: &str) -> bool {
    slice.is_none_or(|s| s.admits(topic))
}

/// Why a declaration, or a filter it was made on, is refused (0x83). Its `Display`
/// is the SUBACK's Reason String: it names the property and states the form
/// (C-187).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The value is empty (C-186).
    Empty,
    /// The value is not a call `name(...)` (C-185, C-191).
    NotACall,
    /// A call to a function other than `topic_hash` (C-180, C-185).
    UnknownFunction,
    /// A call with other than two arguments (C-185).
    Arity(usize),
    /// An argument that is not one or more decimal digits (C-182).
    NotANumber,
    /// An argument above 2147483647 (C-181, C-188).
    TooLarge,
    /// A partition count of 0 (C-181).
    NoPartitions,
    /// An index at or above the partition count (C-159).
    IndexTooHigh {
        /// The count declared.
        partitions: u32,
        /// The index declared.
        index: u32,
    },
    /// Two calls naming different partition counts (C-158).
    MixedCounts(u32, u32),
    /// A valid declaration on a `$share/...` filter (C-167).
    Shared,
    /// A valid declaration on a queue's form, `$saguin/queue/<name>` (C-168).
    Queue,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self {
            Refusal::Empty => "the value is empty".to_string(),
            Refusal::NotACall => "the value is not a call".to_string(),
            Refusal::UnknownFunction => {
                format!("the only function is {FUNCTION}, spelled exactly")
            }
            Refusal::Arity(n) => format!("{FUNCTION} takes two arguments, not {n}"),
            Refusal::NotANumber => {
                "an argument is not a number: decimal digits 0-9 only, no sign, 0x or exponent"
                    .to_string()
            }
            Refusal::TooLarge => {
                format!("an argument is too large: the largest is {MAX_ARGUMENT}")
            }
            Refusal::NoPartitions => "the partition count must be at least 1".to_string(),
            Refusal::IndexTooHigh { partitions, index } => format!(
                "index {index} is not below the partition count {partitions} (partitions come first)"
            ),
            Refusal::MixedCounts(a, b) => format!(
                "every call on one SUBSCRIBE must name the same partition count, not {a} and {b}"
            ),
            Refusal::Shared => {
                "a $share/ subscription already divides its stream between its members".to_string()
            }
            Refusal::Queue => "a queue already divides its work between its workers".to_string(),
        };
        write!(f, "{PROPERTY}: {why}; the accepted form is {FORM}")
    }
}

/// The slice a SUBSCRIBE's User Properties declare: `Ok(None)` when they carry no
/// `saguin-filter`, `Err` when any of them is malformed or they disagree, which
/// refuses every filter of the packet (C-161).
///
/// # Errors
///
/// The first [`Refusal`] found, in property order.
pub fn declared(user_properties: &[(String, String)]) -> Result<Option<Slice>, Refusal> {
    let mut partitions = None;
    let mut indices = Vec::new();
    for (_, value) in user_properties.iter().filter(|(k, _)| k == PROPERTY) {
        let (count, index) = parse(value)?;
        match partitions {
            Some(first) if first != count => return Err(Refusal::MixedCounts(first, count)),
            _ => partitions = Some(count),
        }
        indices.push(index);
    }
    let Some(partitions) = partitions else {
        return Ok(None);
    };
    indices.sort_unstable();
    indices.dedup(); // the same slice twice means that slice (C-157)
    Ok(Some(Slice {
        partitions,
        indices: indices.into_boxed_slice(),
    }))
}

/// Whether a valid declaration may be made on `filter`: refused on a shared
/// subscription and on a queue's form, decided by the prefix alone (C-167..C-169).
///
/// # Errors
///
/// [`Refusal::Shared`] or [`Refusal::Queue`].
pub fn allowed_on(filter: &str) -> Result<(), Refusal> {
    if filter.starts_with("$share/") {
        Err(Refusal::Shared)
    } else if filter.starts_with(crate::broker::queue::FORM_PREFIX) {
        Err(Refusal::Queue)
    } else {
        Ok(())
    }
}

/// The four ASCII whitespace characters, the only ones ignored (C-184).
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Reads one `topic_hash(<partitions>, <index>)` (C-180..C-186, C-191).
fn parse(value: &str) -> Result<(u32, u32), Refusal> {
    if value.is_empty() {
        return Err(Refusal::Empty);
    }
    let Some((name, rest)) = value.split_once('(') else {
        return Err(Refusal::NotACall);
    };
    let Some((arguments, after)) = rest.split_once(')') else {
        return Err(Refusal::NotACall);
    };
    let name = name.trim_matches(is_space);
    if name.is_empty() || !after.chars().all(is_space) {
        return Err(Refusal::NotACall);
    }
    if name != FUNCTION {
        return Err(Refusal::UnknownFunction);
    }
    if arguments.trim_matches(is_space).is_empty() {
        return Err(Refusal::Arity(0));
    }
    let arguments: Vec<&str> = arguments.split(',').collect();
    let [partitions, index] = arguments[..] else {
        return Err(Refusal::Arity(arguments.len()));
    };
    let partitions = argument(partitions)?;
    let index = argument(index)?;
    if partitions == 0 {
        return Err(Refusal::NoPartitions);
    }
    if index >= partitions {
        return Err(Refusal::IndexTooHigh { partitions, index });
    }
    Ok((partitions, index))
}

/// One argument: ASCII digits, leading zeros allowed, at most [`MAX_ARGUMENT`]
/// (C-181..C-183, C-188).
fn argument(text: &str) -> Result<u32, Refusal> {
    let digits = text.trim_matches(is_space);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Refusal::NotANumber);
    }
    let mut n: u32 = 0;
    for b in digits.bytes() {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u32::from(b - b'0')))
            .filter(|n| *n <= MAX_ARGUMENT)
            .ok_or(Refusal::TooLarge)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(value: &str) -> Result<Option<Slice>, Refusal> {
        declared(&[(PROPERTY.to_string(), value.to_string())])
    }

    fn slice(partitions: u32, indices: &[u32]) -> Slice {
        Slice {
            partitions,
            indices: indices.into(),
        }
    }

    /// (topic, FNV-1a-64, mixed, mod 3, mod 8): C-174..C-177.
    const VECTORS: [(&str, u64, u64, u64, u64); 4] = [
        (
            "iot/depot/events/dev-1",
            9_321_193_355_118_713_112,
            16_961_261_177_379_703_000,
            1,
            0,
        ),
        (
            "iot/water/w-7/inspect",
            14_147_658_934_179_859_562,
            16_406_880_391_913_018_636,
            2,
            4,
        ),
        (
            "orders/resize/thumbnails/42",
            15_020_795_679_369_718_730,
            10_596_179_872_049_748_585,
            0,
            1,
        ),
        (
            "a",
            12_638_187_200_555_641_996,
            198_367_012_849_983_736,
            1,
            0,
        ),
    ];

    #[test]
    fn the_test_vectors_hold_for_both_halves_c174_to_c177() {
        for (topic, fnv, mixed, mod3, mod8) in VECTORS {
            assert_eq!(fnv1a64(topic), fnv, "FNV-1a of {topic}");
            assert_eq!(topic_hash(topic), mixed, "mixed hash of {topic}");
            assert_eq!(topic_hash(topic) % 3, mod3, "{topic} mod 3");
            assert_eq!(topic_hash(topic) % 8, mod8, "{topic} mod 8");
        }
    }

    #[test]
    fn slices_come_from_the_mixed_value_c172_c178() {
        let three_one = slice(3, &[1]);
        let eight_zero = slice(8, &[0]);
        let taken: Vec<&str> = VECTORS
            .iter()
            .map(|v| v.0)
            .filter(|t| three_one.admits(t))
            .collect();
        assert_eq!(taken, ["iot/depot/events/dev-1", "a"]);
        let taken: Vec<&str> = VECTORS
            .iter()
            .map(|v| v.0)
            .filter(|t| eight_zero.admits(t))
            .collect();
        assert_eq!(taken, ["iot/depot/events/dev-1", "a"]);
        // An FNV-only hash would put this topic in slice 2 of 3.
        assert_eq!(fnv1a64("orders/resize/thumbnails/42") % 3, 2);
        assert!(!slice(3, &[2]).admits("orders/resize/thumbnails/42"));
    }

    #[test]
    fn a_doubled_identifier_still_spreads_over_four_slices_c179() {
        let mut mixed = [0u32; 4];
        let mut raw = [0u32; 4];
        for i in 0..4000 {
            let t = format!("devices/device-{i}/messages/devicebound/device-{i}");
            mixed[(topic_hash(&t) % 4) as usize] += 1;
            raw[(fnv1a64(&t) % 4) as usize] += 1;
        }
        assert!(mixed.iter().all(|n| (900..=1100).contains(n)), "{mixed:?}");
        assert!(
            raw.contains(&0),
            "FNV-1a alone leaves slices empty: {raw:?}"
        );
    }

    #[test]
    fn no_declaration_takes_everything_and_one_partition_too_c155_c190() {
        assert_eq!(declared(&[("other".into(), "x".into())]), Ok(None));
        assert!(admits(None, "anything"));
        let all = one("topic_hash(1, 0)").ok().flatten();
        assert!(VECTORS.iter().all(|v| admits(all.as_ref(), v.0)));
    }

    #[test]
    fn several_declarations_are_an_or_and_a_repeat_is_that_slice_c156_c157() {
        let props = |values: &[&str]| -> Vec<(String, String)> {
            values
                .iter()
                .map(|v| (PROPERTY.to_string(), v.to_string()))
                .collect()
        };
        let got = declared(&props(&["topic_hash(8, 5)", "topic_hash(8, 1)"]));
        assert_eq!(got, Ok(Some(slice(8, &[1, 5]))));
        let got = declared(&props(&["topic_hash(8, 1)", "topic_hash(8,1)"]));
        assert_eq!(got, Ok(Some(slice(8, &[1]))));
        let s = slice(8, &[0, 4]);
        assert!(s.admits("iot/depot/events/dev-1") && s.admits("iot/water/w-7/inspect"));
        assert!(!s.admits("orders/resize/thumbnails/42"));
    }

    #[test]
    fn different_partition_counts_are_refused_c158() {
        let props = vec![
            (PROPERTY.to_string(), "topic_hash(4, 0)".to_string()),
            (PROPERTY.to_string(), "topic_hash(6, 1)".to_string()),
        ];
        assert_eq!(declared(&props), Err(Refusal::MixedCounts(4, 6)));
    }

    #[test]
    fn accepted_spellings_c183_c184() {
        assert_eq!(one("topic_hash(08, 01)"), Ok(Some(slice(8, &[1]))));
        assert_eq!(
            one(" \t\r\ntopic_hash \n( 3 ,\t2 ) \r\n"),
            Ok(Some(slice(3, &[2])))
        );
        assert_eq!(one("topic_hash(3,0)"), Ok(Some(slice(3, &[0]))));
        assert_eq!(
            one("topic_hash(2147483647, 2147483646)"),
            Ok(Some(slice(MAX_ARGUMENT, &[MAX_ARGUMENT - 1])))
        );
    }

    #[test]
    fn every_refusal_row_c158_to_c191() {
        let rows: [(&str, Refusal); 25] = [
            ("", Refusal::Empty),                                          // C-186
            ("TOPIC_HASH(3, 0)", Refusal::UnknownFunction),                // C-180
            ("Topic_hash(3, 0)", Refusal::UnknownFunction),                // C-180
            ("fnv(3, 0)", Refusal::UnknownFunction),                       // C-185
            ("topic_hash(0, 0)", Refusal::NoPartitions),                   // C-181
            ("topic_hash(2147483648, 0)", Refusal::TooLarge),              // C-181
            ("topic_hash(3, 99999999999999999999999)", Refusal::TooLarge), // C-188
            ("topic_hash(+3, 0)", Refusal::NotANumber),                    // C-182
            ("topic_hash(-3, 0)", Refusal::NotANumber),                    // C-182
            ("topic_hash(0x3, 0)", Refusal::NotANumber),                   // C-182
            ("topic_hash(3e0, 0)", Refusal::NotANumber),                   // C-182
            ("topic_hash(3, )", Refusal::NotANumber),                      // C-182
            ("topic_hash(3,\u{a0}0)", Refusal::NotANumber),                // C-184
            ("topic_hash(3 0, 1)", Refusal::NotANumber),                   // C-184
            ("\u{a0}topic_hash(3, 0)", Refusal::UnknownFunction),          // C-184
            (
                "topic_hash(1, 8)",
                Refusal::IndexTooHigh {
                    partitions: 1,
                    index: 8,
                },
            ), // C-159
            (
                "topic_hash(3, 3)",
                Refusal::IndexTooHigh {
                    partitions: 3,
                    index: 3,
                },
            ), // C-159
            ("topic_hash(3)", Refusal::Arity(1)),                          // C-185
            ("topic_hash( )", Refusal::Arity(0)),                          // C-185
            ("topic_hash(3, 0, 1)", Refusal::Arity(3)),                    // C-185
            ("topic_hash", Refusal::NotACall),                             // C-185
            ("   ", Refusal::NotACall),                                    // C-186
            ("topic_hash(3, 0) || topic_hash(3, 1)", Refusal::NotACall),   // C-191
            ("$topic_hash % 3 == 0", Refusal::NotACall),                   // C-191
            ("topic_hash(3, 0", Refusal::NotACall),                        // C-185
        ];
        for (value, refusal) in rows {
            assert_eq!(one(value), Err(refusal), "{value:?}");
        }
    }

    #[test]
    fn a_malformed_call_beside_a_good_one_refuses_the_whole_declaration_c161() {
        let props = vec![
            (PROPERTY.to_string(), "topic_hash(3, 0)".to_string()),
            (PROPERTY.to_string(), "topic_hash(3, x)".to_string()),
        ];
        assert_eq!(declared(&props), Err(Refusal::NotANumber));
    }

    #[test]
    fn every_reason_names_the_property_and_the_form_and_numbers_differ_c187_c188() {
        let all = [
            Refusal::Empty,
            Refusal::NotACall,
            Refusal::UnknownFunction,
            Refusal::Arity(3),
            Refusal::NotANumber,
            Refusal::TooLarge,
            Refusal::NoPartitions,
            Refusal::IndexTooHigh {
                partitions: 1,
                index: 8,
            },
            Refusal::MixedCounts(4, 6),
            Refusal::Shared,
            Refusal::Queue,
        ];
        for refusal in &all {
            let text = refusal.to_string();
            assert!(text.contains("saguin-filter"), "{text}");
            assert!(text.contains("topic_hash(<partitions>, <index>)"), "{text}");
        }
        assert_ne!(
            Refusal::NotANumber.to_string(),
            Refusal::TooLarge.to_string()
        );
        assert!(Refusal::TooLarge.to_string().contains("too large"));
        assert!(Refusal::NotANumber.to_string().contains("not a number"));
    }

    #[test]
    fn shared_and_queue_forms_are_refused_by_prefix_c167_to_c169() {
        assert_eq!(allowed_on("$share/g/iot/#"), Err(Refusal::Shared));
        assert_eq!(
            allowed_on("$saguin/queue/nothing-here"),
            Err(Refusal::Queue)
        );
        assert_eq!(allowed_on("iot/#"), Ok(()));
        assert_eq!(allowed_on("#"), Ok(()));
    }
}
