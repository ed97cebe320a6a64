//! The shape of topic names and filters (MQTT 5 section 4.7), for the broker to judge:
//! the decoder refuses only what MQTT makes unreadable or a Protocol Error.

/// Whether `filter` is a topic filter at all: non-empty, `#` only as a whole last level,
/// `+` only as a whole level (MQTT-4.7.1-1, MQTT-4.7.1-2). `$share/` is not judged here.
///
/// ```
/// use saguin::codec::valid_topic_filter;
/// assert!(valid_topic_filter("a/+/c/#"));
/// assert!(!valid_topic_filter("a/b#"));
/// ```
pub fn valid_topic_filter(filter: &str) -> bool {
    if filter.is_empty() {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        let ok = match level {
            "#" => last,
            "+" => true,
            _ => !has_wildcard(level),
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Whether `text` holds `+` or `#`. By byte: both are ASCII, which no byte of a
/// multi-byte UTF-8 character can be, and it runs for every PUBLISH.
pub fn has_wildcard(text: &str) -> bool {
    text.bytes().any(|b| b == b'+' || b == b'#')
}

/// Whether `topic` may be published to: non-empty, no `+` or `#`, no U+0000
/// (MQTT-3.3.2-2, MQTT-4.7.3-1, MQTT-4.7.3-2).
pub fn valid_topic_name(topic: &str) -> bool {
    !topic.is_empty() && !has_wildcard(topic) && !topic.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_must_take_a_whole_level() {
        for ok in ["#", "+", "a/#", "+/+", "/", "a//b", "$SYS/#", "+/a/#"] {
            assert!(valid_topic_filter(ok), "{ok}");
        }
        for bad in ["", "a#", "#/a", "a+", "+a/b", "a/#/b", "##"] {
            assert!(!valid_topic_filter(bad), "{bad}");
        }
    }

    #[test]
    fn a_topic_name_has_no_wildcards() {
        assert!(valid_topic_name("a/b"));
        assert!(!valid_topic_name(""));
        assert!(!valid_topic_name("a/+"));
        assert!(!valid_topic_name("a/#"));
        assert!(!valid_topic_name("a\0b"));
        assert!(valid_topic_name("é/日本"));
    }
}
