//! MQTT topic filters as plain strings: checking, brace expansion, matching,
//! and the two questions routing asks of a pair of filters (do they share a
//! topic? does one hold every topic of the other?).
//!
//! Matching is exactly MQTT's: `+` is one whole level, `#` is the last level
//! and matches zero or more levels. Nothing here knows about channels.

/// The levels of a topic or filter (`a/b` is `["a", "b"]`; `""` is one empty level).
pub fn levels(s: &str) -> impl Iterator<Item = &str> {
    s.split('/')
}

/// Checks that `filter` is a topic filter MQTT accepts: non-empty, no NUL,
/// `+` and `#` each a whole level, and `#` only as the last level.
///
/// # Errors
/// What is wrong, phrased to follow the filter in a finding.
pub fn check(filter: &str) -> Result<(), String> {
    if filter.is_empty() {
        return Err("is empty; write a topic filter such as site/#".into());
    }
    if filter.contains('\0') {
        return Err("holds a NUL, which no topic can; remove it".into());
    }
    let parts: Vec<&str> = levels(filter).collect();
    for (i, level) in parts.iter().enumerate() {
        if *level == "#" {
            if i + 1 != parts.len() {
                return Err("has # before its last level; # may only be the last level".into());
            }
        } else if level.contains('#') {
            return Err(format!(
                "has {level:?}, where # takes less than a whole level; write # alone as the last level"
            ));
        } else if *level != "+" && level.contains('+') {
            return Err(format!(
                "has {level:?}, where + takes less than a whole level; write + alone as a level, or spell the level out"
            ));
        }
    }
    Ok(())
}

/// The most plain filters one braced filter may expand to.
pub const MAX_EXPANSION: usize = 1024;

/// Expands `{a,b}` levels into every combination of plain filters.
///
/// # Errors
/// A brace holding `/`, an empty brace or an empty alternative, an
/// unbalanced brace, or more than [`MAX_EXPANSION`] combinations.
pub fn expand_braces(filter: &str) -> Result<Vec<String>, String> {
    // A `/` inside braces is refused before splitting into levels.
    let mut depth = 0usize;
    for c in filter.chars() {
        match c {
            '{' => {
                depth += 1;
                if depth > 1 {
                    return Err(
                        "has a brace inside a brace; write each level's alternatives in one {a,b}"
                            .into(),
                    );
                }
            }
            '}' => {
                if depth == 0 {
                    return Err("has a } with no { before it".into());
                }
                depth -= 1;
            }
            '/' if depth > 0 => {
                return Err("has a / inside braces; an alternative is one level, never a subtree - write one filter per subtree".into());
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("has a { that is never closed".into());
    }
    let mut out = vec![String::new()];
    for (i, level) in levels(filter).enumerate() {
        let alternatives: Vec<String> = if level.contains('{') {
            if !(level.starts_with('{') && level.ends_with('}')) || level.matches('{').count() > 1 {
                return Err(format!(
                    "has {level:?}; braces take a whole level, such as {{data,events}}"
                ));
            }
            let inner = &level[1..level.len() - 1];
            if inner.is_empty() {
                return Err(
                    "has an empty brace {}; write at least one alternative, or remove the braces"
                        .into(),
                );
            }
            let alts: Vec<String> = inner.split(',').map(str::to_string).collect();
            if alts.iter().any(String::is_empty) {
                return Err(format!(
                    "has an empty alternative in {level:?}; remove the extra comma"
                ));
            }
            alts
        } else {
            vec![level.to_string()]
        };
        if out.len().saturating_mul(alternatives.len()) > MAX_EXPANSION {
            return Err(format!(
                "expands to more than {MAX_EXPANSION} filters; split it across channels, or use + for that level"
            ));
        }
        let mut next = Vec::with_capacity(out.len() * alternatives.len());
        for prefix in &out {
            for alt in &alternatives {
                next.push(if i == 0 {
                    alt.clone()
                } else {
                    format!("{prefix}/{alt}")
                });
            }
        }
        out = next;
    }
    Ok(out)
}

/// Whether `filter` holds a brace.
pub fn has_braces(filter: &str) -> bool {
    filter.contains('{') || filter.contains('}')
}

/// Whether `filter` matches `topic`, as MQTT says (no `$` special case:
/// callers that need MQTT-4.7.2-1 apply it themselves).
pub fn matches(filter: &str, topic: &str) -> bool {
    // A leading wildcard never matches a topic beginning with `$` (MQTT-4.7.2-1).
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut f = levels(filter);
    let mut t = levels(topic);
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether some topic is matched by both filters.
pub fn intersects(a: &str, b: &str) -> bool {
    intersection(a, b).is_some()
}

/// The filter matching exactly the topics both `a` and `b` match, if any.
pub fn intersection(a: &str, b: &str) -> Option<String> {
    let a: Vec<&str> = levels(a).collect();
    let b: Vec<&str> = levels(b).collect();
    let mut out: Vec<&str> = Vec::new();
    let mut i = 0;
    loop {
        match (a.get(i).copied(), b.get(i).copied()) {
            (Some("#"), _) => {
                out.extend(&b[i.min(b.len())..]);
                break;
            }
            (_, Some("#")) => {
                out.extend(&a[i.min(a.len())..]);
                break;
            }
            (Some(x), Some(y)) => {
                if x == "+" {
                    out.push(y);
                } else if y == "+" || x == y {
                    out.push(x);
                } else {
                    return None;
                }
            }
            (None, None) => break,
            // One ended and the other goes on with something other than `#`.
            _ => return None,
        }
        i += 1;
    }
    // `a/#` against `a`: `#` matches zero levels, so the intersection is `a`.
    Some(out.join("/"))
}

/// Whether every topic `inner` matches, `outer` matches too. A wildcard first level
/// matches no topic starting with `$` (MQTT-4.7.2-1), so `#` does not hold `$x/#`.
pub fn contains(outer: &str, inner: &str) -> bool {
    let o: Vec<&str> = levels(outer).collect();
    let n: Vec<&str> = levels(inner).collect();
    if matches!(o.first(), Some(&("#" | "+"))) && n.first().is_some_and(|l| l.starts_with('$')) {
        return false;
    }
    for i in 0.. {
        match (o.get(i).copied(), n.get(i).copied()) {
            (Some("#"), _) => return true,
            (None, None) => return true,
            (Some(_), Some("#")) => return false,
            (Some("+"), Some(_)) => {}
            (Some(x), Some(y)) if x == y => {}
            _ => return false,
        }
    }
    false
}

/// The dead-letter filter of a queue filter: `__dlq` inserted where the
/// filter carries its `#`, or appended where it carries none.
pub fn dlq_filter(queue_filter: &str) -> String {
    match queue_filter.strip_suffix("/#") {
        Some(head) => format!("{head}/__dlq/#"),
        None if queue_filter == "#" => "__dlq/#".into(),
        None => format!("{queue_filter}/__dlq"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// one plain filter per alternative.
    #[test]
    fn a014_a019_braces_expand_to_every_combination() {
        assert_eq!(
            expand_braces("iot/weather/+/{data,events}").unwrap(),
            ["iot/weather/+/data", "iot/weather/+/events"]
        );
        assert_eq!(expand_braces("x/{a,b}/{c,d}").unwrap().len(), 4);
        assert!(expand_braces("x/{a/b}").is_err());
        assert!(expand_braces("x/{}").is_err());
        assert!(expand_braces("x/{a,}").is_err());
        assert!(expand_braces("x/{,b}").is_err());
        assert!(expand_braces("x/{a,,b}").is_err());
    }

    /// channel filters match as MQTT says.
    #[test]
    fn a005_a007_matching_is_mqtt() {
        assert!(matches("iot/water/+/location/#", "iot/water/w-7/location"));
        assert!(!matches("iot/weather/+/data", "iot/weather/st-3/data/raw"));
        assert!(matches("#", "a/b"));
        assert!(!matches("a/+", "a"));
    }

    #[test]
    fn pairs_of_filters() {
        assert!(intersects("iot/water/w-7/#", "iot/water/+/+/#"));
        assert!(intersects("a", "a/#"));
        assert!(!intersects("a/b", "a/c"));
        assert_eq!(
            intersection("iot/+/x", "iot/w/+").as_deref(),
            Some("iot/w/x")
        );
        assert!(contains("iot/water/+/inspect", "iot/water/w-7/inspect"));
        assert!(!contains("iot/water/+/inspect", "iot/#"));
        assert!(contains("jobs/#", "jobs/__dlq/#"));
        // MQTT-4.7.2-1: a wildcard first level matches no `$` topic.
        assert!(!contains("#", "$foo/#"));
        assert!(!contains("+/x", "$foo/x"));
        assert!(contains("$foo/#", "$foo/x"));
        assert!(contains("#", "+/x"));
    }

    #[test]
    fn dead_letter_filters_follow_the_table() {
        assert_eq!(
            dlq_filter("iot/water/+/inspect"),
            "iot/water/+/inspect/__dlq"
        );
        assert_eq!(dlq_filter("iot/water/+/+"), "iot/water/+/+/__dlq");
        assert_eq!(
            dlq_filter("iot/water/+/inspect/#"),
            "iot/water/+/inspect/__dlq/#"
        );
        assert_eq!(dlq_filter("jobs/#"), "jobs/__dlq/#");
    }

    /// wildcards are whole levels; `#` only last.
    #[test]
    fn b543_wildcards_take_whole_levels() {
        assert!(check("fleet/a+b/#").is_err());
        assert!(check("a/#/b").is_err());
        assert!(check("a/b#").is_err());
        assert!(check("a/+/#").is_ok());
    }
}
