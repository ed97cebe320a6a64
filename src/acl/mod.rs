//! What a client may do: the acl_file (RFC 0002 "What a client may do:
//! authorization and the ACL file").
//!
//! The file is read and validated by `crate::config::acl` (only `config` knows
//! YAML) into a [`Policy`]: roles of rules, and `users:` entries matched by
//! pattern. This module holds that model and the decisions asked of it:
//!
//! - [`Policy::entry_for`]: which `users:` entry applies - the matching pattern
//!   spelling out the most literal characters (B-265, B-266);
//! - [`Policy::grants`]: that entry's roles with `%u` and `%c` put in, one pass,
//!   a rule whose name would hold `+`, `#` or `/` withheld (B-254..B-257);
//! - [`Grants`] (in `decide`): publish, subscribe, consume, seek, point read,
//!   catalogue and disconnect, each asked of the topic's route first, so a
//!   `channel:` rule governs only its channel's topics and a `topic:` rule only
//!   broadcast (B-275);
//! - [`Acl`]: the policy the broker holds, swapped whole on SIGUSR1 (B-292), and
//!   [`Principal`], one connection's view of it, which notices a swap at its next
//!   question.
//!
//! **Architecture invariants:** grant-only - default refuse, and any matching
//! rule of the applying entry's roles allows (B-284); nothing here widens a
//! structural refusal, which the connection decides before it asks (B-286).
//! Topics are matched by `routing::filter::matches` and routed by
//! `routing::Router`, the broker's own. The file is read at startup and on
//! SIGUSR1, never at CONNECT.

mod decide;
pub mod explain;

pub use decide::{Acl, Grants, Principal};

use std::path::PathBuf;

/// A verb a rule grants (B-280).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Put something in: publish to a channel or a broadcast topic, submit work.
    Write,
    /// Take something out: subscribe, a point read.
    Read,
    /// Move a consumer's position on an append channel.
    Seek,
    /// Remove a key from a latest channel.
    Delete,
    /// Take jobs from a queue, and answer them.
    Consume,
    /// Hang up another client (`broker: sessions` only).
    Disconnect,
}

impl Verb {
    /// Every verb, in the order the spec lists them.
    pub const ALL: [Verb; 6] = [
        Verb::Write,
        Verb::Read,
        Verb::Seek,
        Verb::Delete,
        Verb::Consume,
        Verb::Disconnect,
    ];

    /// The word the file writes.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Write => "write",
            Verb::Read => "read",
            Verb::Seek => "seek",
            Verb::Delete => "delete",
            Verb::Consume => "consume",
            Verb::Disconnect => "disconnect",
        }
    }

    /// The verb `word` names.
    pub fn parse(word: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.as_str() == word)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of verbs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verbs(u8);

impl Verbs {
    /// Adds `verb`.
    pub fn insert(&mut self, verb: Verb) {
        self.0 |= verb.bit();
    }

    /// Whether `verb` is held.
    pub fn has(self, verb: Verb) -> bool {
        self.0 & verb.bit() != 0
    }

    /// Whether no verb is held.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Both sets.
    pub fn union(self, other: Verbs) -> Verbs {
        Verbs(self.0 | other.0)
    }

    /// The words, in the spec's order.
    pub fn words(self) -> Vec<&'static str> {
        Verb::ALL
            .into_iter()
            .filter(|v| self.has(*v))
            .map(Verb::as_str)
            .collect()
    }
}

/// A feature MQTT gives every client, which a `broker: features` rule takes
/// away (B-308).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// A session outliving its connection.
    Persistent,
    /// A Last Will.
    Will,
    /// Shared subscriptions.
    Share,
    /// A retained value on a broadcast topic.
    Retained,
    /// Exactly-once delivery.
    Qos2,
}

impl Feature {
    /// Every feature, in the spec's order.
    pub const ALL: [Feature; 5] = [
        Feature::Persistent,
        Feature::Will,
        Feature::Share,
        Feature::Retained,
        Feature::Qos2,
    ];

    /// The word the file writes: the broker block that configures it.
    pub fn as_str(self) -> &'static str {
        match self {
            Feature::Persistent => "persistent",
            Feature::Will => "will",
            Feature::Share => "share",
            Feature::Retained => "retained",
            Feature::Qos2 => "qos2",
        }
    }

    /// The feature `word` names.
    pub fn parse(word: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.as_str() == word)
    }
}

/// A set of features denied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features(u8);

impl Features {
    /// Adds `feature`.
    pub fn insert(&mut self, feature: Feature) {
        self.0 |= 1 << (feature as u8);
    }

    /// Whether `feature` is in the set.
    pub fn has(self, feature: Feature) -> bool {
        self.0 & (1 << (feature as u8)) != 0
    }

    /// Both sets.
    pub fn union(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }

    /// The words, in the spec's order.
    pub fn words(self) -> Vec<&'static str> {
        Feature::ALL
            .into_iter()
            .filter(|f| self.has(*f))
            .map(Feature::as_str)
            .collect()
    }
}

/// What a rule is about (B-253).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A `channel:` rule: topics that resolve to this channel, narrowed by
    /// `filter:` when written (its braces expanded; `%u`/`%c` still in place).
    Channel {
        /// The channel's name, as `channels:` declares it (or a derived `__dlq`).
        name: String,
        /// The plain spellings of `filter:`; `None` for the whole channel.
        filters: Option<Vec<String>>,
    },
    /// A `topic:` rule: broadcast topics its spellings match.
    Topic {
        /// The plain spellings (braces expanded; `%u`/`%c` still in place).
        filters: Vec<String>,
    },
    /// `broker: sessions`: hanging up clients.
    Sessions,
    /// `broker: features`: what it takes away (its `deny:`); it grants nothing.
    Features(Features),
}

/// One rule of a role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// What it is about.
    pub subject: Subject,
    /// What it grants.
    pub verbs: Verbs,
    /// Its line in the acl_file.
    pub line: u32,
}

/// A role: a name and its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// The name `users:` gives it by.
    pub name: String,
    /// Its rules, in the file's order.
    pub rules: Vec<Rule>,
}

/// One `users:` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The user-name pattern: `*` is any run of characters (B-251).
    pub pattern: String,
    /// Indexes into [`Policy::roles`]; never empty (B-252).
    pub roles: Vec<usize>,
    /// `client_ids:` patterns (`*`, `%u`); `None` admits any client id (B-272).
    pub client_ids: Option<Vec<String>>,
    /// `limits:`, replacing the broker-wide figures for the users this entry
    /// applies to (B-114, B-115); `None` leaves them the broker-wide ones.
    pub limits: Option<EntryLimits>,
    /// Its line in the acl_file.
    pub line: u32,
}

/// An entry's `limits:`: the figures its users publish at, instead of
/// `broker.limits`' (up or down). An unwritten figure is no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryLimits {
    /// Messages a second.
    pub publish_rate: Option<u32>,
    /// Bytes a second.
    pub publish_bytes: Option<u64>,
}

/// A loaded, validated acl_file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The file it was read from.
    pub path: PathBuf,
    /// Every role, in the file's order.
    pub roles: Vec<Role>,
    /// Every `users:` entry, in the file's order.
    pub entries: Vec<Entry>,
}

/// Whether `name` is matched by `pattern`, `*` standing for any run of
/// characters (none included). Linear backtracking, at most
/// `pattern.len() * name.len()` steps.
pub fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// How many characters of `pattern` are spelled out (not `*`): the entry with
/// the most wins (B-265).
pub fn literal_count(pattern: &str) -> usize {
    pattern.chars().filter(|c| *c != '*').count()
}

/// Whether some name is matched by both patterns (`*` only), which is what makes
/// two entries of equal exactness ambiguous (B-267).
pub fn globs_overlap(a: &str, b: &str) -> bool {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // reach[i][j]: the prefixes a[..i] and b[..j] can spell the same text.
    let mut reach = vec![vec![false; b.len() + 1]; a.len() + 1];
    reach[0][0] = true;
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            if !reach[i][j] {
                continue;
            }
            let (x, y) = (a.get(i), b.get(j));
            if x == Some(&'*') {
                reach[i + 1][j] = true; // a's star spells nothing more
                if j < b.len() {
                    reach[i][j + 1] = true; // a's star takes b's next character or star
                }
            }
            if y == Some(&'*') {
                reach[i][j + 1] = true;
                if i < a.len() {
                    reach[i + 1][j] = true;
                }
            }
            if let (Some(x), Some(y)) = (x, y)
                && x == y
                && *x != '*'
            {
                reach[i + 1][j + 1] = true;
            }
        }
    }
    reach[a.len()][b.len()]
}

/// Why a name cannot be put into a rule: it holds a wildcard or a level
/// separator, which a filter would read as syntax (B-256).
pub fn unsafe_name(name: &str) -> bool {
    name.contains(['+', '#', '/'])
}

/// Puts `user` for `%u` and `client` for `%c` into `template`, in one pass: a
/// name holding `%c` is put in as written (B-257). `None` when a name that
/// would be put in is unsafe ([`unsafe_name`]) or, for `%c`, not given.
pub fn substitute(template: &str, user: &str, client: Option<&str>) -> Option<String> {
    let mut out = String::with_capacity(template.len());
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.peek() {
                Some('u') => {
                    chars.next();
                    if unsafe_name(user) {
                        return None;
                    }
                    out.push_str(user);
                    continue;
                }
                Some('c') => {
                    chars.next();
                    let client = client.filter(|c| !c.is_empty() && !unsafe_name(c))?;
                    out.push_str(client);
                    continue;
                }
                _ => {}
            }
        }
        out.push(c);
    }
    Some(out)
}

impl Policy {
    /// The entry whose pattern matches `user` with the most literal characters,
    /// if any does (B-265). Ties were refused at load (B-267).
    pub fn entry_for(&self, user: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .filter(|e| glob(&e.pattern, user))
            .max_by_key(|e| literal_count(&e.pattern))
    }

    /// Whether `entry` admits `client_id` (B-269..B-274): absent `client_ids:`
    /// admits any; `%u` is the proved name, and a name holding `*` is never put
    /// in, so such a pattern admits nobody under that name.
    pub fn client_id_allowed(entry: &Entry, user: &str, client_id: &str) -> bool {
        let Some(patterns) = &entry.client_ids else {
            return true;
        };
        patterns.iter().any(|p| {
            if p.contains("%u") && user.contains('*') {
                return false;
            }
            glob(&p.replace("%u", user), client_id)
        })
    }

    /// The number of users: entries.
    pub fn user_count(&self) -> usize {
        self.entries.len()
    }

    /// Whether some rule uses `%c`.
    pub fn uses_client_id(&self) -> bool {
        self.roles.iter().flat_map(|r| &r.rules).any(|r| {
            let filters = match &r.subject {
                Subject::Channel {
                    filters: Some(f), ..
                } => f.as_slice(),
                Subject::Topic { filters } => filters.as_slice(),
                _ => &[],
            };
            filters.iter().any(|f| f.contains("%c"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// B-113, B-249: an anonymous client's name is empty, so `*` gives it its
    /// roles, but it publishes at the broker-wide figures.
    #[test]
    fn anonymous_takes_the_roles_of_star_but_not_its_limits_b113() {
        let policy = Policy {
            path: PathBuf::from("/acl.yaml"),
            roles: vec![Role {
                name: "r".into(),
                rules: vec![Rule {
                    subject: Subject::Sessions,
                    verbs: {
                        let mut v = Verbs::default();
                        v.insert(Verb::Disconnect);
                        v
                    },
                    line: 3,
                }],
            }],
            entries: vec![Entry {
                pattern: "*".into(),
                roles: vec![0],
                client_ids: None,
                limits: Some(EntryLimits {
                    publish_rate: Some(5),
                    publish_bytes: None,
                }),
                line: 6,
            }],
        };
        let anonymous = Grants::of(&policy, "", "c");
        assert_eq!(anonymous.entry.as_deref(), Some("*"));
        assert_eq!(anonymous.limits, None);
        assert!(Grants::of(&policy, "u", "c").limits.is_some());
    }

    #[test]
    fn glob_is_any_run_b251() {
        assert!(glob("device-*", "device-7"));
        assert!(glob("*-7", "device-7"));
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "aXXbYc"));
        assert!(!glob("a*b", "ac"));
        assert!(!glob("device-7", "device-77"));
    }

    #[test]
    fn the_most_literal_pattern_wins_b266() {
        assert!(literal_count("device-7") > literal_count("device-*"));
        assert!(literal_count("device-*") > literal_count("*-7"));
    }

    #[test]
    fn overlapping_patterns_b267() {
        assert!(globs_overlap("a*", "*b"));
        assert!(globs_overlap("*", "x"));
        assert!(!globs_overlap("a*", "b*"));
        assert!(!globs_overlap("ab", "ac"));
        assert!(globs_overlap("a*c", "*b*"));
        assert!(!globs_overlap("*a", "*b"));
    }

    #[test]
    fn substitution_is_one_pass_and_withholds_syntax_b256_b257() {
        assert_eq!(
            substitute("iot/%u/health/%c", "north", Some("n-1")).as_deref(),
            Some("iot/north/health/n-1")
        );
        assert_eq!(
            substitute("a/%u", "x%c", Some("y")).as_deref(),
            Some("a/x%c")
        );
        assert_eq!(substitute("a/%c", "u", Some("#")), None);
        assert_eq!(substitute("a/%u", "a/b", None), None);
        assert_eq!(substitute("a/%c", "u", None), None);
        assert_eq!(substitute("a/%x", "u", None).as_deref(), Some("a/%x"));
    }
}
