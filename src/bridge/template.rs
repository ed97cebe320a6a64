//! A rule's topic template applied to a topic its filter matched (RFC 0002
//! "Bridges"): `$1`, `$2` … for the filter's `+` levels in order, `$#` for its `#`
//! tail (B-391); an empty tail takes its separator with it (B-392). One function
//! for both directions, so a topic into the reserved `$` space is dropped the same
//! way whichever way it was going (B-394).
//!
//! Filters and templates are checked at load (`config::bridges::check_template`):
//! here a template's `$#` is always its whole last level and every `$N` names a `+`
//! the filter has. There is no regular expression anywhere (B-396): a `+` is one
//! level by construction.

/// Why a topic a rule's filter matched produced nothing to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmappable {
    /// The topic, or what the template made of it, is empty (B-393).
    Empty,
    /// What the template made of it lies in the reserved `$` space (B-394).
    Reserved(String),
    /// What the template made of it is longer than a topic may be on the wire
    /// (65,535 bytes, MQTT-1.5.4): sent, it would arrive cut into another topic.
    TooLong(usize),
}

impl std::fmt::Display for Unmappable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unmappable::Empty => write!(f, "it maps to an empty topic"),
            Unmappable::Reserved(t) => write!(f, "it maps to {t:?}, in the reserved $ space"),
            Unmappable::TooLong(n) => {
                write!(
                    f,
                    "it maps to a topic of {n} bytes, longer than MQTT allows"
                )
            }
        }
    }
}

/// A filter's `+` levels and its `#` tail, as [`captures`] finds them.
type Captured<'t> = (Vec<&'t str>, Option<&'t str>);

/// What `filter` captures of `topic`: its `+` levels in order and its `#` tail
/// (`None` when `#` matched zero levels, `Some("")` when it matched one empty
/// level); `None` when the filter does not match. A filter starting with a
/// wildcard matches no `$` topic (MQTT-4.7.2-1).
pub fn captures<'t>(filter: &str, topic: &'t str) -> Option<Captured<'t>> {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return None;
    }
    let mut plus = Vec::new();
    let mut rest = Some(topic);
    for level in filter.split('/') {
        if level == "#" {
            return Some((plus, rest));
        }
        let current = rest?;
        let (head, tail) = match current.split_once('/') {
            Some((h, t)) => (h, Some(t)),
            None => (current, None),
        };
        if level == "+" {
            plus.push(head);
        } else if level != head {
            return None;
        }
        rest = tail;
    }
    rest.is_none().then_some((plus, None))
}

/// The topic `template` makes of `topic`, which `filter` matched; `None` when the
/// filter does not match it. A `both` rule has no template and maps a topic to
/// itself (B-389).
pub fn map(
    filter: &str,
    template: Option<&str>,
    topic: &str,
) -> Option<Result<String, Unmappable>> {
    let (plus, tail) = captures(filter, topic)?;
    let mapped = match template {
        None => topic.to_string(),
        Some(template) => substitute(template, &plus, tail),
    };
    Some(check(mapped))
}

/// Applies the substitutions; the `$#` level with its separator goes when the `#`
/// matched no level (B-392). One empty level is a level: `fleet/` maps to
/// `readings/`, not to what `fleet` maps to.
fn substitute(template: &str, plus: &[&str], tail: Option<&str>) -> String {
    let mut out = String::with_capacity(template.len() + tail.map_or(0, str::len));
    let mut levels = template.split('/').peekable();
    while let Some(level) = levels.next() {
        if level == "$#" {
            match tail {
                None => {
                    if out.ends_with('/') {
                        out.pop();
                    }
                }
                Some(tail) => out.push_str(tail),
            }
        } else {
            expand_level(level, plus, &mut out);
        }
        if levels.peek().is_some() {
            out.push('/');
        }
    }
    out
}

fn expand_level(level: &str, plus: &[&str], out: &mut String) {
    let mut chars = level.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let digits: String = level[i + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        for _ in 0..digits.len() {
            chars.next();
        }
        let n: usize = digits.parse().unwrap_or(0);
        // Checked at load: every $N names one of the filter's + levels.
        if let Some(value) = n.checked_sub(1).and_then(|i| plus.get(i)) {
            out.push_str(value);
        }
    }
}

fn check(mapped: String) -> Result<String, Unmappable> {
    if mapped.is_empty() {
        Err(Unmappable::Empty)
    } else if mapped.starts_with('$') {
        Err(Unmappable::Reserved(mapped))
    } else if mapped.len() > usize::from(u16::MAX) {
        Err(Unmappable::TooLong(mapped.len()))
    } else {
        Ok(mapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(
        filter: &str,
        template: Option<&str>,
        topic: &str,
    ) -> Option<Result<String, Unmappable>> {
        map(filter, template, topic)
    }

    #[test]
    fn the_rfc_table_b391() {
        let t = "fleet/vessel-07/telemetry/hold/psi";
        let cases = [
            (
                "fleet/+/telemetry/#",
                "readings/telemetry/$1/$#",
                "readings/telemetry/vessel-07/hold/psi",
            ),
            (
                "fleet/+/telemetry/#",
                "readings/telemetry/$#",
                "readings/telemetry/hold/psi",
            ),
            (
                "fleet/#",
                "readings/$#",
                "readings/vessel-07/telemetry/hold/psi",
            ),
        ];
        for (filter, template, want) in cases {
            assert_eq!(
                mapped(filter, Some(template), t),
                Some(Ok(want.to_string()))
            );
        }
    }

    #[test]
    fn captures_reorder_b391() {
        assert_eq!(
            mapped(
                "fleet/+/telemetry/+",
                Some("telemetry/$2/$1"),
                "fleet/v7/telemetry/psi"
            ),
            Some(Ok("telemetry/psi/v7".into()))
        );
        assert_eq!(
            mapped("a/+/b", Some("x-$1-y/z"), "a/q/b"),
            Some(Ok("x-q-y/z".into()))
        );
    }

    /// MQTT-1.5.4, B-394: a mapping longer than a topic may be on the wire is not
    /// sent, where the encoder would cut it into another topic.
    #[test]
    fn a_mapping_past_65535_bytes_is_unmappable() {
        let level = "l".repeat(40_000);
        assert_eq!(
            mapped("a/+/#", Some("x/$1/$1/$#"), &format!("a/{level}/b")),
            Some(Err(Unmappable::TooLong(80_005)))
        );
        assert!(matches!(
            mapped("a/+/#", Some("x/$1/$#"), &format!("a/{level}/b")),
            Some(Ok(_))
        ));
    }

    #[test]
    fn a_hash_matching_zero_levels_takes_its_separator_b392() {
        assert_eq!(
            mapped(
                "fleet/+/telemetry/#",
                Some("readings/telemetry/$1/$#"),
                "fleet/vessel-07/telemetry"
            ),
            Some(Ok("readings/telemetry/vessel-07".into()))
        );
        assert_eq!(
            mapped("fleet/#", Some("$#"), "fleet"),
            Some(Err(Unmappable::Empty))
        );
        // One empty level is a level, kept apart from none (B-392).
        assert_eq!(
            mapped("fleet/#", Some("readings/$#"), "fleet/"),
            Some(Ok("readings/".into()))
        );
        assert_eq!(
            mapped("fleet/#", Some("readings/$#"), "fleet"),
            Some(Ok("readings".into()))
        );
    }

    #[test]
    fn a_reserved_result_is_unmappable_b394() {
        assert_eq!(
            mapped("in/+", Some("$1/x"), "in/$saguin"),
            Some(Err(Unmappable::Reserved("$saguin/x".into())))
        );
    }

    #[test]
    fn both_maps_a_topic_to_itself_and_no_match_is_none_b389() {
        assert_eq!(
            mapped("alerts/#", None, "alerts/a"),
            Some(Ok("alerts/a".into()))
        );
        assert_eq!(mapped("alerts/#", None, "other/a"), None);
        assert_eq!(mapped("a/+", None, "a/b/c"), None);
        assert_eq!(mapped("#", None, "$SYS/x"), None);
        assert_eq!(mapped("a/b", None, "a/b"), Some(Ok("a/b".into())));
    }
}
