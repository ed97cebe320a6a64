//! The YAML document as a tree that remembers where each value was written.
//!
//! Only this module knows serde-saphyr. The rest of `config` walks [`Node`]s,
//! so it can report every finding at once, each with its line, rather than
//! stopping at the first error a derived `Deserialize` would raise.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Spanned, Tagged};

/// A value read from a YAML file, with the line it starts on and its tag.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    /// What the value is.
    pub kind: Kind,
    /// The 1-based line the value starts on (0 when unknown).
    pub line: u32,
    /// A local tag such as `!include`, when one was written.
    pub tag: Option<String>,
}

/// The shapes a YAML value takes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// `~`, `null` or nothing at all.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer.
    Int(i128),
    /// A number with a fraction.
    Float(f64),
    /// Any other scalar.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in the order written; keys written twice are kept, so
    /// the caller can name both lines.
    Map(Vec<(Key, Node)>),
}

/// A mapping key with its line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Key {
    /// The key as written.
    pub name: String,
    /// The 1-based line it is written on.
    pub line: u32,
}

/// A parse failure: the line (when known) and the parser's message.
#[derive(Debug, Clone)]
pub(crate) struct ParseError {
    pub line: u32,
    pub message: String,
}

/// Events aliases may replay across one file's parse.
const MAX_REPLAYED_EVENTS: usize = 50_000;

/// The most a configuration file, an included file or an acl_file may hold.
pub(crate) const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reads a file the configuration is made of, whole, up to [`MAX_FILE_BYTES`].
///
/// # Errors
/// The file's, or one saying it is larger than that.
pub(crate) fn read_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "it is larger than {} MiB, more than any configuration needs",
            MAX_FILE_BYTES >> 20
        )));
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8 text"))
}

/// Parses a whole YAML document.
pub(crate) fn parse(text: &str) -> Result<Node, ParseError> {
    let mut options = serde_saphyr::Options::default();
    // Duplicates are detected by the walker so every one is reported with both lines.
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::PassThrough;
    options.legacy_octal_numbers = false;
    options.leading_zero_numbers_as_strings = true;
    // A configuration repeats a block by alias a handful of times: a file of a few
    // lines whose aliases nest would otherwise replay a million events into memory.
    options.alias_limits.max_total_replayed_events = MAX_REPLAYED_EVENTS;
    if text.trim().is_empty() {
        return Ok(Node {
            kind: Kind::Map(Vec::new()),
            line: 1,
            tag: None,
        });
    }
    serde_saphyr::from_str_with_options::<Node>(text, options).map_err(|e| ParseError {
        line: e.location().map(|l| l.line() as u32).unwrap_or(0),
        message: first_line(&e.without_snippet().to_string()),
    })
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

impl Node {
    /// The value as a short string for a finding: strings quoted, others bare.
    pub fn show(&self) -> String {
        match &self.kind {
            Kind::Null => "null".into(),
            Kind::Bool(b) => format!("{b}"),
            Kind::Int(i) => format!("{i}"),
            Kind::Float(f) => format!("{f}"),
            Kind::Str(s) => format!("{s:?}"),
            Kind::Seq(_) => "(a list)".into(),
            Kind::Map(_) => "(a mapping)".into(),
        }
    }

    /// A scalar's text, as YAML would have read it: `None` for lists and mappings.
    pub fn scalar_text(&self) -> Option<String> {
        match &self.kind {
            Kind::Null => None,
            Kind::Bool(b) => Some(format!("{b}")),
            Kind::Int(i) => Some(format!("{i}")),
            Kind::Float(f) => Some(format!("{f}")),
            Kind::Str(s) => Some(s.clone()),
            Kind::Seq(_) | Kind::Map(_) => None,
        }
    }
}

/// The inner value, before its span and tag are attached.
struct Raw(Kind);

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<Tagged<Raw>>::deserialize(d)?;
        let Tagged(Raw(kind), tag) = spanned.value;
        Ok(Node {
            kind,
            line: spanned.referenced.line() as u32,
            tag,
        })
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw(Kind::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw(Kind::Int(v.into())))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw(Kind::Int(v.into())))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Raw, E> {
        Ok(Raw(Kind::Int(v)))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Raw, E> {
        Ok(Raw(match i128::try_from(v) {
            Ok(i) => Kind::Int(i),
            Err(_) => Kind::Str(v.to_string()),
        }))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw(Kind::Float(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw(Kind::Str(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Raw, E> {
        Ok(Raw(Kind::Str(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw(Kind::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw(Kind::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        Raw::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Raw(Kind::Seq(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyText>>()? {
            let mut value = map.next_value::<Node>()?;
            // A block value is reported at its key: "broker:" rather than the
            // first line inside it, which is where a missing key belongs.
            if matches!(value.kind, Kind::Map(_) | Kind::Seq(_)) || value.line == 0 {
                value.line = key.referenced.line() as u32;
            }
            entries.push((
                Key {
                    name: key.value.0,
                    line: key.referenced.line() as u32,
                },
                value,
            ));
        }
        Ok(Raw(Kind::Map(entries)))
    }
}

/// A mapping key read as the text written (`5:` is the key "5", `NO:` the key "NO",
/// never `false`): keys name channels, providers and users.
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_string(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = KeyText;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText, E> {
        Ok(KeyText(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<KeyText, E> {
        Ok(KeyText(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<KeyText, E> {
        Ok(KeyText("null".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_text_written() {
        let n = parse("NO: 1\n'off': 2\n0x1F: 3\n1e3: 4\n5: 5\ntrue: 6\n").unwrap();
        let Kind::Map(entries) = &n.kind else {
            panic!("{n:?}")
        };
        let names: Vec<_> = entries.iter().map(|(k, _)| k.name.as_str()).collect();
        assert_eq!(names, ["NO", "off", "0x1F", "1e3", "5", "true"]);
    }

    #[test]
    fn lines_tags_and_duplicates_survive() {
        let text = "a: 1\nb:\n  - !include x.yaml\n  - c: \"3.1.1\"\na: 2\nmode: 0660\nv: 3.1.1\n";
        let n = parse(text).unwrap();
        let Kind::Map(entries) = &n.kind else {
            panic!("{n:?}")
        };
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[0].0.name, "a");
        assert_eq!((entries[2].0.name.as_str(), entries[2].0.line), ("a", 5));
        let Kind::Seq(items) = &entries[1].1.kind else {
            panic!()
        };
        assert_eq!(items[0].tag.as_deref(), Some("!include"));
        assert_eq!(items[0].kind, Kind::Str("x.yaml".into()));
        assert_eq!(items[0].line, 3);
        assert_eq!(entries[3].1.kind, Kind::Str("0660".into()));
        assert_eq!(entries[4].1.kind, Kind::Str("3.1.1".into()));
    }
}
