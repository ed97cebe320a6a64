//! Where a topic lands, and what a subscription filter reaches.
//!
//! One routing module, used by the broker and by `saguin --route` alike. A
//! [`Router`] is built once from the validated configuration and indexes the
//! channels' plain filters in a trie, so resolving a topic walks its levels
//! rather than scanning every filter.
//!
//! The rule ("Which channel a topic belongs to", RFC 0002): of the filters
//! matching a topic, the one that spells it out most exactly holds it.
//! Compared level by level from the left, at the first level that differs a
//! spelled-out level beats `+`, which beats `#`, and a filter that ends there
//! beats one continuing with `#`. The trie is searched in exactly that
//! preference order, so the first match found is the answer and the order of
//! the configuration file can never change it. A topic no filter matches is
//! broadcast.
//!
//! # Architecture invariant
//! Routing is decided here and nowhere else: nothing else matches channel filters.

pub mod explain;
pub mod filter;

use std::collections::HashMap;

use crate::config::{ChannelType, Config};

pub use explain::{explain, explain_json, explain_one, explain_one_json, read_subjects, table};

/// Where a topic lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// A channel holds it.
    Channel {
        /// The channel's name.
        name: &'a str,
        /// Its type.
        kind: ChannelType,
        /// The plain filter that claimed the topic (braces expanded).
        filter: &'a str,
    },
    /// No filter matches it.
    Broadcast,
}

/// What a subscriber of a filter is served from one channel it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serves {
    /// An append channel: records replayed from the subscriber's position.
    Replayed,
    /// A latest channel: current values on subscribe, then changes.
    Current,
    /// A queue: left out; its records leave only through `$saguin/queue/<name>`.
    Excluded,
}

impl Serves {
    /// The word `--route` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Serves::Replayed => "replayed",
            Serves::Current => "current",
            Serves::Excluded => "excluded",
        }
    }
}

/// One channel a filter touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touch<'a> {
    /// The channel's name.
    pub name: &'a str,
    /// Its type.
    pub kind: ChannelType,
    /// What the subscriber is served from it.
    pub serves: Serves,
}

/// What the broker decides about a subscription filter from the filter alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach<'a> {
    /// Every channel the filter touches, in the configuration's display order.
    pub channels: Vec<Touch<'a>>,
    /// Whether some topic the filter matches is broadcast.
    pub broadcast: bool,
    /// `Some(queue)` when the filter lies entirely inside that queue's filter
    /// and reaches nothing else: refused 0x8F (Topic Filter invalid).
    pub refused_inside_queue: Option<&'a str>,
}

/// Whether `filter` is the seek reply topic of a channel, which a client may
/// subscribe to (the reply is written to its socket either way): the one topic
/// under `$saguin/` besides a queue's form a SUBSCRIBE is granted, here so that
/// `--route` answers as the broker does.
pub fn is_seek_reply(filter: &str) -> bool {
    filter
        .strip_prefix("$saguin/consumer/")
        .and_then(|rest| rest.strip_suffix("/seek/reply"))
        .is_some_and(|channel| !channel.is_empty() && !channel.contains(['/', '+', '#']))
}

/// The channels' filters, indexed.
#[derive(Debug, Clone)]
pub struct Router {
    channels: Vec<Entry>,
    nodes: Vec<TrieNode>,
    /// The deepest channel filter, in levels.
    depth: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    kind: ChannelType,
    filters: Vec<String>,
    position: (usize, bool),
}

/// (channel index, filter index)
type Owner = (u32, u32);

/// A small multiply-rotate hash for level strings. The keys are the
/// operator's filters, fixed at startup, so a client choosing topics cannot
/// lengthen a probe chain: that depends on the table, not on the query.
#[derive(Debug, Clone, Copy, Default)]
struct LevelHasher(u64);

impl std::hash::Hasher for LevelHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Levels = HashMap<Box<str>, u32, std::hash::BuildHasherDefault<LevelHasher>>;

#[derive(Debug, Clone, Default)]
struct TrieNode {
    literal: Levels,
    plus: Option<u32>,
    /// A filter ending here.
    end: Option<Owner>,
    /// A filter ending here with `/#` (or `#` at the root).
    hash: Option<Owner>,
}

/// A level no filter spells: channel filters cannot hold a NUL.
const FRESH: &str = "\0";

impl Router {
    /// Builds the index from a validated configuration (derived `__dlq` channels included).
    pub fn new(config: &Config) -> Router {
        Router::from_channels(config.channels.iter().map(|c| {
            (
                c.name.clone(),
                c.kind,
                c.filters.clone(),
                (c.position, c.dlq_of.is_some()),
            )
        }))
    }

    /// Builds the index from `(name, type, plain filters, display position)`.
    /// Filters must be distinct across channels (the loader refuses duplicates);
    /// a repeated one keeps its first owner.
    pub fn from_channels(
        channels: impl IntoIterator<Item = (String, ChannelType, Vec<String>, (usize, bool))>,
    ) -> Router {
        let mut r = Router {
            channels: Vec::new(),
            nodes: vec![TrieNode::default()],
            depth: 0,
        };
        for (name, kind, filters, position) in channels {
            let ci = r.channels.len() as u32;
            for (fi, f) in filters.iter().enumerate() {
                r.insert(f, (ci, fi as u32));
                r.depth = r.depth.max(filter::levels(f).count());
            }
            r.channels.push(Entry {
                name,
                kind,
                filters,
                position,
            });
        }
        r
    }

    fn insert(&mut self, filter: &str, owner: Owner) {
        let mut node = 0u32;
        for level in filter::levels(filter) {
            if level == "#" {
                self.nodes[node as usize].hash.get_or_insert(owner);
                return;
            }
            let next = if level == "+" {
                self.nodes[node as usize].plus
            } else {
                self.nodes[node as usize].literal.get(level).copied()
            };
            node = match next {
                Some(n) => n,
                None => {
                    let n = self.nodes.len() as u32;
                    self.nodes.push(TrieNode::default());
                    let parent = &mut self.nodes[node as usize];
                    if level == "+" {
                        parent.plus = Some(n);
                    } else {
                        parent.literal.insert(level.into(), n);
                    }
                    n
                }
            };
        }
        self.nodes[node as usize].end.get_or_insert(owner);
    }

    /// Where `topic` lands: the channel whose filter spells it out most exactly, or broadcast.
    pub fn resolve(&self, topic: &str) -> Route<'_> {
        match self.find(0, Some(topic)) {
            Some((ci, fi)) => {
                let e = &self.channels[ci as usize];
                Route::Channel {
                    name: &e.name,
                    kind: e.kind,
                    filter: &e.filters[fi as usize],
                }
            }
            None => Route::Broadcast,
        }
    }

    fn find(&self, node: u32, rest: Option<&str>) -> Option<Owner> {
        let n = &self.nodes[node as usize];
        let Some(rest) = rest else {
            // The topic ends here: a filter ending here beats one continuing with #.
            return n.end.or(n.hash);
        };
        let (level, tail) = match rest.split_once('/') {
            Some((l, t)) => (l, Some(t)),
            None => (rest, None),
        };
        if let Some(&c) = n.literal.get(level)
            && let Some(o) = self.find(c, tail)
        {
            return Some(o);
        }
        if let Some(c) = n.plus
            && let Some(o) = self.find(c, tail)
        {
            return Some(o);
        }
        n.hash
    }

    /// Whether some topic matched by the plain filter `f` routes to `want`
    /// (`None` for broadcast). Wildcard levels are replaced by a level no
    /// channel filter spells: if any topic of `f` routes there, so does that one.
    fn reaches(&self, f: &str, want: Option<u32>, depth: usize) -> bool {
        let (head, tail) = match f.strip_suffix("#") {
            Some(h) => (h.strip_suffix('/').unwrap_or(h), true),
            None => (f, false),
        };
        let mut base: Vec<&str> = if head.is_empty() {
            Vec::new()
        } else {
            filter::levels(head).collect()
        };
        for l in base.iter_mut() {
            if *l == "+" {
                *l = FRESH;
            }
        }
        let extra = if tail { depth + 1 } else { 0 };
        for k in 0..=extra {
            let mut levels = base.clone();
            levels.extend(std::iter::repeat_n(FRESH, k));
            if levels.is_empty() {
                continue;
            }
            let topic = levels.join("/");
            let got = self.find(0, Some(&topic)).map(|(c, _)| c);
            if got == want {
                return true;
            }
        }
        false
    }

    /// Every channel a subscription filter touches - those holding some topic
    /// it matches - what each would serve, and the refusal that depends on
    /// the filter alone (a plain filter inside a queue's filter: 0x8F).
    pub fn reach(&self, sub: &str) -> Reach<'_> {
        let depth = self.depth.max(filter::levels(sub).count());
        // Only the filters the trie says intersect `sub` are asked the exact question.
        let mut candidates: Vec<Owner> = Vec::new();
        self.intersecting(0, Some(sub), &mut candidates);
        candidates.sort_unstable();
        candidates.dedup();
        let mut touched: Vec<(u32, &Entry)> = Vec::new();
        for (ci, fi) in candidates {
            if touched.last().is_some_and(|(c, _)| *c == ci) {
                continue;
            }
            let e = &self.channels[ci as usize];
            let cf = &e.filters[fi as usize];
            if filter::intersection(sub, cf).is_some_and(|i| self.reaches(&i, Some(ci), depth)) {
                touched.push((ci, e));
            }
        }
        touched.sort_by_key(|(_, e)| e.position);
        let broadcast = self.reaches(sub, None, depth);
        let refused_inside_queue =
            if broadcast || touched.iter().any(|(_, e)| e.kind != ChannelType::Queue) {
                None
            } else {
                touched
                    .iter()
                    .find(|(_, e)| e.filters.iter().any(|qf| filter::contains(qf, sub)))
                    .map(|(_, e)| e.name.as_str())
            };
        Reach {
            channels: touched
                .into_iter()
                .map(|(_, e)| Touch {
                    name: &e.name,
                    kind: e.kind,
                    serves: match e.kind {
                        ChannelType::Append => Serves::Replayed,
                        ChannelType::Latest => Serves::Current,
                        ChannelType::Queue => Serves::Excluded,
                    },
                })
                .collect(),
            broadcast,
            refused_inside_queue,
        }
    }

    /// Collects every filter in the trie that shares a topic with the
    /// subscription filter `rest` (the remaining levels from `node`).
    fn intersecting(&self, node: u32, rest: Option<&str>, out: &mut Vec<Owner>) {
        let n = &self.nodes[node as usize];
        let Some(rest) = rest else {
            // The subscription ends here: a filter ending here, or going on with #.
            out.extend(n.end);
            out.extend(n.hash);
            return;
        };
        let (level, tail) = match rest.split_once('/') {
            Some((l, t)) => (l, Some(t)),
            None => (rest, None),
        };
        if level == "#" {
            self.subtree(node, out);
            return;
        }
        // A channel filter's # here matches whatever the subscription goes on with.
        out.extend(n.hash);
        if level == "+" {
            for &c in n.literal.values() {
                self.intersecting(c, tail, out);
            }
        } else if let Some(&c) = n.literal.get(level) {
            self.intersecting(c, tail, out);
        }
        if let Some(c) = n.plus {
            self.intersecting(c, tail, out);
        }
    }

    fn subtree(&self, node: u32, out: &mut Vec<Owner>) {
        let n = &self.nodes[node as usize];
        out.extend(n.end);
        out.extend(n.hash);
        for &c in n.literal.values() {
            self.subtree(c, out);
        }
        if let Some(c) = n.plus {
            self.subtree(c, out);
        }
    }

    /// Every channel with its plain filters, in display order.
    pub fn channels(&self) -> Vec<(&str, ChannelType, &[String])> {
        let mut v: Vec<&Entry> = self.channels.iter().collect();
        v.sort_by_key(|e| e.position);
        v.into_iter()
            .map(|e| (e.name.as_str(), e.kind, e.filters.as_slice()))
            .collect()
    }

    /// The type of the channel called `name`.
    pub fn kind_of(&self, name: &str) -> Option<ChannelType> {
        self.channels
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.kind)
    }
}
