//! Reading a [`Node`] tree into typed values while collecting findings.
//!
//! Every reader records what is wrong and carries on, so one load reports
//! every finding. A reader returns `None` when the value was refused.

use std::path::PathBuf;
use std::time::Duration;

use super::error::Finding;
use super::node::{Key, Kind, Node};
use super::units::{parse_duration, parse_size};

/// Where findings are collected, and which file is being read.
pub(crate) struct Ctx {
    pub findings: Vec<Finding>,
    pub file: String,
    /// Every path the configuration names, for `Config::check_files`.
    pub paths: Vec<super::NamedFile>,
    /// What `--check-config` says without failing.
    pub notes: Vec<String>,
}

impl Ctx {
    pub fn new(file: String) -> Self {
        Ctx {
            findings: Vec::new(),
            file,
            paths: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Records `key value: text`.
    pub fn say(&mut self, line: u32, key: &str, value: Option<String>, text: impl AsRef<str>) {
        self.push(line, key, value, format!(": {}", text.as_ref()));
    }

    /// Records `key value text`, where `text` continues the sentence (" is longer than ...").
    pub fn phrase(&mut self, line: u32, key: &str, value: Option<String>, text: impl AsRef<str>) {
        self.push(line, key, value, format!(" {}", text.as_ref()));
    }

    /// Records a finding about a value.
    pub fn bad(&mut self, node: &Node, key: &str, text: impl AsRef<str>) {
        self.say(node.line, key, Some(node.show()), text);
    }

    fn push(&mut self, line: u32, key: &str, value: Option<String>, text: String) {
        self.findings.push(Finding {
            file: self.file.clone(),
            line,
            key: key.to_string(),
            value,
            text,
        });
    }
}

/// Joins a key path: `join("broker", "id")` is `broker.id`.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The keys of one mapping, taken one by one; what is left is unknown.
pub(crate) struct Fields<'a> {
    entries: &'a [(Key, Node)],
    used: Vec<bool>,
    path: String,
    known: &'static [&'static str],
    /// The line of the mapping itself.
    pub line: u32,
}

static EMPTY: [(Key, Node); 0] = [];

impl<'a> Fields<'a> {
    /// Opens `node` as a mapping accepting `known` keys. A null is an empty
    /// mapping; anything else is a finding and reads as empty.
    pub fn open(
        ctx: &mut Ctx,
        node: &'a Node,
        path: &str,
        known: &'static [&'static str],
    ) -> Fields<'a> {
        let entries: &'a [(Key, Node)] = match &node.kind {
            Kind::Map(entries) => entries,
            Kind::Null => &EMPTY,
            _ => {
                ctx.bad(
                    node,
                    path,
                    format!("is not a mapping; write {}", keys_hint(known)),
                );
                &EMPTY
            }
        };
        Fields {
            entries,
            used: vec![false; entries.len()],
            path: path.to_string(),
            known,
            line: node.line,
        }
    }

    /// An empty mapping, for a block that was not written.
    pub fn empty(path: &str, known: &'static [&'static str]) -> Fields<'a> {
        Fields {
            entries: &EMPTY,
            used: Vec::new(),
            path: path.to_string(),
            known,
            line: 0,
        }
    }

    /// The key path of `key` in this mapping.
    pub fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// Takes `key`, if written (the first spelling; a second is reported by `finish`).
    pub fn take(&mut self, key: &str) -> Option<&'a Node> {
        debug_assert!(
            self.known.contains(&key),
            "{key} is not in the known list of {}",
            self.path
        );
        self.mark(key)
    }

    /// Takes `key` whether or not it is known here (a refused key already reported).
    pub fn take_unchecked(&mut self, key: &str) -> Option<&'a Node> {
        self.mark(key)
    }

    fn mark(&mut self, key: &str) -> Option<&'a Node> {
        let idx = self.entries.iter().position(|(k, _)| k.name == key)?;
        self.used[idx] = true;
        Some(&self.entries[idx].1)
    }

    /// The line `key` is written on, if it is.
    pub fn key_line(&self, key: &str) -> Option<u32> {
        self.entries
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(k, _)| k.line)
    }

    /// Whether `key` is written.
    pub fn has(&self, key: &str) -> bool {
        self.entries.iter().any(|(k, _)| k.name == key)
    }

    /// Reports every unknown key and every key written twice.
    pub fn finish(self, ctx: &mut Ctx) {
        self.report(ctx, true);
    }

    /// Reports only keys written twice: for mappings whose keys are names
    /// the operator chose (channels, providers, bridges).
    pub fn finish_duplicates_only(self, ctx: &mut Ctx) {
        self.report(ctx, false);
    }

    fn report(self, ctx: &mut Ctx, unknown: bool) {
        for (i, (key, _)) in self.entries.iter().enumerate() {
            if let Some(first) = self.entries[..i].iter().find(|(k, _)| k.name == key.name) {
                ctx.say(
                    key.line,
                    &self.path(&key.name),
                    None,
                    format!(
                        "is written twice, on lines {} and {}; keep one",
                        first.0.line, key.line
                    ),
                );
                continue;
            }
            if unknown && !self.used[i] && !self.known.contains(&key.name.as_str()) {
                ctx.say(
                    key.line,
                    &self.path(&key.name),
                    None,
                    format!("is not a key Sagüin knows here; {}", keys_hint(self.known)),
                );
            }
        }
    }
}

fn keys_hint(known: &[&str]) -> String {
    match known.len() {
        0 => "this block takes no keys".to_string(),
        _ => format!("the keys are {}", list_or(known, "and")),
    }
}

/// `a, b and c`.
pub(crate) fn list_or(items: &[&str], word: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} {word} {last}", init.join(", ")),
    }
}

/// A string scalar; a number is taken as its text (`id: 7` is "7"), a
/// boolean or null is refused.
pub(crate) fn string(ctx: &mut Ctx, node: &Node, key: &str) -> Option<String> {
    match &node.kind {
        Kind::Str(s) => Some(s.clone()),
        Kind::Int(_) | Kind::Float(_) => node.scalar_text(),
        _ => {
            ctx.bad(node, key, "is not text; write a string");
            None
        }
    }
}

/// `true` or `false`.
pub(crate) fn boolean(ctx: &mut Ctx, node: &Node, key: &str) -> Option<bool> {
    match &node.kind {
        Kind::Bool(b) => Some(*b),
        _ => {
            ctx.bad(node, key, "is true or false");
            None
        }
    }
}

/// Whether a scalar is the word `none`.
pub(crate) fn is_none_word(node: &Node) -> bool {
    matches!(&node.kind, Kind::Str(s) if s == "none")
}

/// A whole number from `min` to `max`.
pub(crate) fn uint(ctx: &mut Ctx, node: &Node, key: &str, min: u64, max: u64) -> Option<u64> {
    let n = match &node.kind {
        Kind::Int(i) => *i,
        Kind::Str(s) if s.trim().parse::<i128>().is_ok() => s.trim().parse::<i128>().unwrap_or(-1),
        _ => {
            ctx.bad(
                node,
                key,
                format!("is not a whole number; write one from {min} to {max}"),
            );
            return None;
        }
    };
    if n < min as i128 || n > max as i128 {
        ctx.bad(
            node,
            key,
            format!("is out of range; write a whole number from {min} to {max}"),
        );
        return None;
    }
    Some(n as u64)
}

/// A size; `min`/`max` in bytes.
pub(crate) fn size(ctx: &mut Ctx, node: &Node, key: &str, min: u64, max: u64) -> Option<u64> {
    let parsed = match &node.kind {
        Kind::Int(i) if *i >= 0 => u64::try_from(*i).map_err(|_| "is too large".to_string()),
        Kind::Str(s) => parse_size(s),
        _ => Err(
            "is not a size; write a whole number and one of KiB, MiB or GiB, such as 128KiB".into(),
        ),
    };
    match parsed {
        Err(e) => {
            ctx.phrase(node.line, key, Some(node.show()), e);
            None
        }
        Ok(0) if min > 0 => {
            ctx.bad(
                node,
                key,
                format!(
                    "is zero; write a size of at least {}",
                    super::units::format_size(min)
                ),
            );
            None
        }
        Ok(n) if n < min || n > max => {
            ctx.bad(
                node,
                key,
                format!(
                    "is out of range; write a size from {} to {}",
                    super::units::format_size(min),
                    super::units::format_size(max)
                ),
            );
            None
        }
        Ok(n) => Some(n),
    }
}

/// What a duration key accepts.
#[derive(Clone, Copy)]
pub(crate) struct DurationRule {
    /// Milliseconds are honoured (one of the five sub-second keys).
    pub millis: bool,
    pub min: Duration,
    pub max: Duration,
}

impl DurationRule {
    /// Whole seconds, from 1s to `max`.
    pub const fn seconds(max: Duration) -> Self {
        DurationRule {
            millis: false,
            min: Duration::from_secs(1),
            max,
        }
    }
}

/// A duration under `rule`.
pub(crate) fn duration(
    ctx: &mut Ctx,
    node: &Node,
    key: &str,
    rule: DurationRule,
) -> Option<Duration> {
    let text = match &node.kind {
        Kind::Str(s) => s.clone(),
        Kind::Int(i) => format!("{i}"),
        _ => {
            ctx.bad(node, key, "is not a duration; write a whole number and one unit from ms, s, m, h and d, such as 30s");
            return None;
        }
    };
    let parsed = match parse_duration(&text) {
        Ok(p) => p,
        Err(e) => {
            ctx.phrase(node.line, key, Some(node.show()), e);
            return None;
        }
    };
    if parsed.millis && !rule.millis {
        ctx.phrase(
            node.line,
            key,
            Some(node.show()),
            "is held in whole seconds; write it in s, m, h or d",
        );
        return None;
    }
    if parsed.value.is_zero() {
        ctx.phrase(
            node.line,
            key,
            Some(node.show()),
            format!(
                "is zero, which has no meaning here; write at least {}",
                super::units::format_duration(rule.min)
            ),
        );
        return None;
    }
    if parsed.value < rule.min || parsed.value > rule.max {
        ctx.bad(
            node,
            key,
            format!(
                "is out of range; write a duration from {} to {}",
                super::units::format_duration(rule.min),
                super::units::format_duration(rule.max)
            ),
        );
        return None;
    }
    Some(parsed.value)
}

/// An absolute path (`what` says what it names, for the message).
pub(crate) fn abs_path(ctx: &mut Ctx, node: &Node, key: &str) -> Option<PathBuf> {
    let s = string(ctx, node, key)?;
    if s.is_empty() {
        ctx.bad(node, key, "is empty; write an absolute path");
        return None;
    }
    if s.contains('\0') {
        ctx.bad(node, key, "holds a NUL; write an absolute path");
        return None;
    }
    let p = PathBuf::from(&s);
    ctx.paths.push(super::NamedFile {
        key: key.to_string(),
        path: p.clone(),
        file: ctx.file.clone(),
        line: node.line,
    });
    if !p.is_absolute() {
        ctx.bad(
            node,
            key,
            format!(
                "is relative; write an absolute path, such as /etc/saguin/{}",
                s.trim_start_matches("./")
            ),
        );
        return None;
    }
    Some(p)
}

/// A value that may be the word `none`: `Some(None)` for none.
pub(crate) fn or_none<T>(
    ctx: &mut Ctx,
    node: &Node,
    key: &str,
    read: impl FnOnce(&mut Ctx, &Node, &str) -> Option<T>,
) -> Option<Option<T>> {
    if is_none_word(node) {
        Some(None)
    } else {
        read(ctx, node, key).map(Some)
    }
}
