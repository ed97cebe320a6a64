//! The acl_file: read, checked against the channels, typed into an
//! [`crate::acl::Policy`] (RFC 0002 "What a client may do"). Every finding
//! names the acl_file, the line and the key, as the configuration's do.

use std::path::Path;

use super::node::{Kind, Node};
use super::walk::{self, Ctx, Fields};
use super::{ChannelType, Config, ConfigError, Finding};
use crate::acl::{
    Entry, EntryLimits, Feature, Features, Policy, Role, Rule, Subject, Verb, Verbs, globs_overlap,
    literal_count,
};
use crate::routing::{Router, filter};

/// The features `broker: features` would name (B-308).
const FEATURES: &[&str] = &["persistent", "will", "share", "retained", "qos2"];

/// Reads the acl_file `config` names: `Ok(None)` when it names none.
///
/// # Errors
/// Every finding at once: the file unreadable, YAML that does not parse, and
/// every rule of B-250..B-283 and B-318 the file breaks.
pub fn load(config: &Config) -> Result<Option<Policy>, ConfigError> {
    let Some(path) = &config.broker.mqtt.acl_file else {
        return Ok(None);
    };
    let text = super::node::read_file(path).map_err(|e| {
        ConfigError::new(vec![Finding {
            file: path.display().to_string(),
            line: 0,
            key: "the acl_file".into(),
            value: None,
            text: format!(
                " cannot be read: {e}; check broker.mqtt.acl_file and the file's permissions"
            ),
        }])
    })?;
    from_str(&text, path, config).map(Some)
}

/// Reads an acl_file's text as though it were the file at `path`.
///
/// # Errors
/// As [`load`].
pub fn from_str(text: &str, path: &Path, config: &Config) -> Result<Policy, ConfigError> {
    let mut ctx = Ctx::new(path.display().to_string());
    let root = super::parse_yaml(&mut ctx, text, "the acl_file")?;
    let reader = Reader {
        config,
        router: Router::new(config),
    };
    let policy = reader.read(&mut ctx, &root, path);
    if ctx.findings.is_empty() {
        Ok(policy)
    } else {
        Err(ConfigError::new(ctx.findings))
    }
}

struct Reader<'c> {
    config: &'c Config,
    router: Router,
}

const ROOT_KEYS: &[&str] = &["roles", "users"];
const RULE_KEYS: &[&str] = &["channel", "topic", "broker", "filter", "allow", "deny"];
const ENTRY_KEYS: &[&str] = &["roles", "client_ids", "limits"];

impl Reader<'_> {
    fn read(&self, ctx: &mut Ctx, root: &Node, path: &Path) -> Policy {
        let mut f = Fields::open(ctx, root, "", ROOT_KEYS);
        if let Some(line) = f.key_line("clients") {
            f.take_unchecked("clients");
            ctx.say(line, "clients", None, "is refused: its keys would be client ids, which nothing proves and no rule reads; write users: with user names (client_ids: on an entry ties one to client ids)");
        }
        let roles = match f.take("roles") {
            Some(n) => self.roles(ctx, n),
            None => Vec::new(),
        };
        let entries = match f.take("users") {
            Some(n) => users(ctx, n, &roles),
            None => {
                ctx.say(
                    f.line.max(1),
                    "users",
                    None,
                    "is missing; write users: giving roles to user-name patterns, such as \"device-*\": [sensor]",
                );
                Vec::new()
            }
        };
        f.finish(ctx);
        Policy {
            path: path.to_path_buf(),
            roles,
            entries,
        }
    }

    fn roles(&self, ctx: &mut Ctx, node: &Node) -> Vec<Role> {
        let Kind::Map(items) = &node.kind else {
            ctx.bad(
                node,
                "roles",
                "is not a mapping; write role names, each with a list of rules",
            );
            return Vec::new();
        };
        let mut dup = Fields::open(ctx, node, "roles", &[]);
        let mut roles = Vec::new();
        for (key, value) in items {
            dup.take_unchecked(&key.name);
            let path = walk::join("roles", &key.name);
            let rules = match &value.kind {
                Kind::Seq(rules) => rules
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| self.rule(ctx, r, &format!("{path}[{i}]")))
                    .collect(),
                _ => {
                    ctx.bad(value, &path, "is not a list of rules; write - channel: ..., - topic: ... or - broker: ... items with allow:");
                    Vec::new()
                }
            };
            roles.push(Role {
                name: key.name.clone(),
                rules,
            });
        }
        dup.finish_duplicates_only(ctx);
        roles
    }

    fn rule(&self, ctx: &mut Ctx, node: &Node, path: &str) -> Option<Rule> {
        let mut f = Fields::open(ctx, node, path, RULE_KEYS);
        let kinds: Vec<&str> = ["channel", "topic", "broker"]
            .into_iter()
            .filter(|k| f.has(k))
            .collect();
        let channel = f.take("channel");
        let topic = f.take("topic");
        let broker = f.take("broker");
        let filter_node = f.take("filter");
        let allow = f.take("allow");
        let deny = f.take("deny");
        f.finish(ctx);
        if kinds.len() != 1 {
            let what = if kinds.is_empty() {
                "names no subject; write channel:, topic: or broker:".to_string()
            } else {
                format!(
                    "names {}; a rule is about one - write one rule each",
                    walk::list_or(&kinds, "and")
                )
            };
            ctx.say(node.line, path, None, what);
            return None;
        }
        if let Some(b) = broker {
            return self.broker_rule(ctx, b, path, allow, deny, filter_node);
        }
        if let Some(d) = deny {
            ctx.bad(d, &walk::join(path, "deny"), "is written only on a broker: features rule; a rule here can only grant - list what it grants under allow:");
        }
        if let Some(c) = channel {
            return self.channel_rule(ctx, c, path, filter_node, allow);
        }
        let t = topic?;
        if let Some(fl) = filter_node {
            ctx.bad(fl, &walk::join(path, "filter"), "narrows a channel: rule only; a topic: rule is its own filter - write the narrower filter as its topic:");
        }
        let key = walk::join(path, "topic");
        let written = walk::string(ctx, t, &key)?;
        let max_levels = self.config.broker.limits.max_topic_levels;
        let filters = spellings(ctx, t, &key, &written, max_levels)?;
        let mut ok = true;
        for spelling in &filters {
            ok &= self.check_topic_rule(ctx, t, &key, spelling);
        }
        let verbs = verbs(
            ctx,
            allow,
            path,
            node.line,
            &[Verb::Write, Verb::Read],
            "topic:",
        )?;
        ok.then_some(Rule {
            subject: Subject::Topic { filters },
            verbs,
            line: node.line,
        })
    }

    /// B-277: a topic: rule wholly inside channels grants nothing on broadcast.
    fn check_topic_rule(&self, ctx: &mut Ctx, node: &Node, key: &str, spelling: &str) -> bool {
        let reach = self.router.reach(spelling);
        if reach.broadcast {
            return true;
        }
        let inside = self
            .config
            .channels
            .iter()
            .find(|c| c.filters.iter().any(|cf| filter::contains(cf, spelling)));
        match inside {
            Some(c) => ctx.say(
                node.line,
                key,
                None,
                format!(
                    "is refused: topic {spelling} is inside channel {}, whose filter is {}; write it as a channel rule",
                    c.name, c.filter
                ),
            ),
            None => ctx.say(
                node.line,
                key,
                None,
                format!(
                    "is refused: every topic {spelling} matches belongs to a channel ({}), so it grants nothing on broadcast; write channel rules",
                    reach.channels.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
                ),
            ),
        }
        false
    }

    fn channel_rule(
        &self,
        ctx: &mut Ctx,
        c: &Node,
        path: &str,
        filter_node: Option<&Node>,
        allow: Option<&Node>,
    ) -> Option<Rule> {
        let key = walk::join(path, "channel");
        let name = walk::string(ctx, c, &key)?;
        if name.contains('%') {
            ctx.bad(c, &key, "holds a %: %u and %c are put into filters, never into a channel's name, which is declared once for every client; narrow the channel with filter: instead");
            return None;
        }
        let Some(channel) = self.config.channel(&name) else {
            ctx.bad(c, &key, "is not a channel the configuration declares; declare it under channels:, or fix the name");
            return None;
        };
        let kind = channel.kind;
        let filters = match filter_node {
            None => None,
            Some(fl) => {
                let fkey = walk::join(path, "filter");
                let written = walk::string(ctx, fl, &fkey)?;
                let max_levels = self.config.broker.limits.max_topic_levels;
                let spellings = spellings(ctx, fl, &fkey, &written, max_levels)?;
                let mut ok = true;
                for s in &spellings {
                    let first = filter::levels(s).next().unwrap_or("");
                    if first == "+" || first == "#" {
                        ctx.bad(fl, &fkey, format!("begins with {first}; a channel rule's filter spells its first level out, as a channel's does"));
                        ok = false;
                        continue;
                    }
                    // B-260: %u and %c are ordinary levels here.
                    if !self.router.reach(s).channels.iter().any(|t| t.name == name) {
                        ctx.bad(fl, &fkey, format!("matches none of channel {name}'s topics (its filter is {}); it would grant nothing - write a filter inside the channel's", channel.filter));
                        ok = false;
                    }
                }
                if !ok {
                    return None;
                }
                Some(spellings)
            }
        };
        let (allowed, what): (&[Verb], &str) = match kind {
            ChannelType::Append => (&[Verb::Write, Verb::Read, Verb::Seek], "an append channel"),
            ChannelType::Latest => (&[Verb::Write, Verb::Read, Verb::Delete], "a latest channel"),
            ChannelType::Queue => (&[Verb::Write, Verb::Consume], "a queue"),
        };
        if kind == ChannelType::Queue
            && let Some(a) = allow
            && let Kind::Seq(items) = &a.kind
            && items
                .iter()
                .any(|i| i.scalar_text().as_deref() == Some("read"))
        {
            ctx.say(a.line, &walk::join(path, "allow"), Some("read".into()), "is refused on a queue: a queue cannot be watched - taking a job is consume, which drains it; its depth is a gauge on the metrics listener");
            return None;
        }
        let verbs = verbs(ctx, allow, path, c.line, allowed, what)?;
        Some(Rule {
            subject: Subject::Channel { name, filters },
            verbs,
            line: c.line,
        })
    }

    fn broker_rule(
        &self,
        ctx: &mut Ctx,
        b: &Node,
        path: &str,
        allow: Option<&Node>,
        deny: Option<&Node>,
        filter_node: Option<&Node>,
    ) -> Option<Rule> {
        let key = walk::join(path, "broker");
        if let Some(fl) = filter_node {
            ctx.bad(
                fl,
                &walk::join(path, "filter"),
                "narrows a channel: rule only; remove it",
            );
        }
        match walk::string(ctx, b, &key)?.as_str() {
            "sessions" => {
                if let Some(d) = deny {
                    ctx.bad(d, &walk::join(path, "deny"), "is written only on a broker: features rule; broker: sessions takes allow: [disconnect]");
                    return None;
                }
                let verbs = verbs(
                    ctx,
                    allow,
                    path,
                    b.line,
                    &[Verb::Disconnect],
                    "broker: sessions",
                )?;
                Some(Rule {
                    subject: Subject::Sessions,
                    verbs,
                    line: b.line,
                })
            }
            "features" => {
                if let Some(a) = allow {
                    ctx.bad(a, &walk::join(path, "allow"), "is refused on broker: features, which takes deny: and nothing else: every client has a feature until a role takes it away");
                    return None;
                }
                let Some(d) = deny else {
                    ctx.say(b.line, &walk::join(path, "deny"), None, format!("is missing, so the rule takes nothing away; write deny: with some of {}", FEATURES.join(", ")));
                    return None;
                };
                let denied = feature_list(ctx, d, &walk::join(path, "deny"))?;
                Some(Rule {
                    subject: Subject::Features(denied),
                    verbs: Verbs::default(),
                    line: b.line,
                })
            }
            _ => {
                ctx.bad(b, &key, "is sessions or features");
                None
            }
        }
    }
}

/// B-318, B-319: a deny: list's words.
fn feature_list(ctx: &mut Ctx, node: &Node, key: &str) -> Option<Features> {
    let items = match &node.kind {
        Kind::Seq(items) if !items.is_empty() => items,
        _ => {
            let hint = format!(
                "is not a list of features; write some of {}",
                FEATURES.join(", ")
            );
            ctx.bad(node, key, hint);
            return None;
        }
    };
    let mut denied = Features::default();
    let mut ok = true;
    for item in items {
        let word = item.scalar_text().unwrap_or_default();
        match Feature::parse(&word) {
            _ if word == "retain" => {
                ctx.bad(
                    item,
                    key,
                    "is not a feature: the feature is retained; write retained",
                );
                ok = false;
            }
            None => {
                let hint = format!("is not a feature; the features are {}", FEATURES.join(", "));
                ctx.bad(item, key, hint);
                ok = false;
            }
            Some(f) if denied.has(f) => {
                ctx.bad(item, key, "is listed twice; keep one");
                ok = false;
            }
            Some(f) => denied.insert(f),
        }
    }
    ok.then_some(denied)
}

/// A rule filter's plain spellings: braces expanded first, each checked as an
/// MQTT topic filter (B-261, B-263). `%u` and `%c` stay in place.
fn spellings(
    ctx: &mut Ctx,
    node: &Node,
    key: &str,
    written: &str,
    max_levels: u32,
) -> Option<Vec<String>> {
    let expanded = match filter::expand_braces(written) {
        Ok(v) => v,
        Err(e) => {
            ctx.phrase(node.line, key, Some(node.show()), e);
            return None;
        }
    };
    let mut ok = true;
    for plain in &expanded {
        if let Err(e) = filter::check(plain) {
            let which = if plain == written {
                String::new()
            } else {
                format!(" (expanded to {plain})")
            };
            ctx.phrase(node.line, key, Some(node.show()), format!("{e}{which}"));
            ok = false;
            continue;
        }
        // As for a channel's filter (B-108): deeper, it could match nothing a client
        // may publish.
        let depth = filter::levels(plain).filter(|l| *l != "#").count() as u32;
        if depth > max_levels {
            ctx.phrase(
                node.line,
                key,
                Some(node.show()),
                format!("has {depth} levels, more than limits.max_topic_levels ({max_levels}); shorten it or raise the limit"),
            );
            ok = false;
        }
    }
    ok.then_some(expanded)
}

/// An allow: list, each verb among `allowed` (B-280).
fn verbs(
    ctx: &mut Ctx,
    node: Option<&Node>,
    path: &str,
    line: u32,
    allowed: &[Verb],
    what: &str,
) -> Option<Verbs> {
    let key = walk::join(path, "allow");
    let words: Vec<&str> = allowed.iter().map(|v| v.as_str()).collect();
    let hint = format!("the verbs on {what} are {}", walk::list_or(&words, "and"));
    let Some(node) = node else {
        ctx.say(
            line,
            &key,
            None,
            format!("is missing, so the rule grants nothing; write allow: [...] - {hint}"),
        );
        return None;
    };
    let Kind::Seq(items) = &node.kind else {
        ctx.bad(
            node,
            &key,
            format!("is not a list; write allow: [...] - {hint}"),
        );
        return None;
    };
    if items.is_empty() {
        ctx.bad(
            node,
            &key,
            format!("is empty, so the rule grants nothing; {hint}"),
        );
        return None;
    }
    let mut verbs = Verbs::default();
    let mut ok = true;
    for item in items {
        let word = item.scalar_text().unwrap_or_default();
        match Verb::parse(&word).filter(|v| allowed.contains(v)) {
            Some(v) => verbs.insert(v),
            None if word == "disconnect" => {
                ctx.bad(item, &key, "is granted only by a broker: sessions rule, since hanging a client up is no act on a topic; write - broker: sessions with allow: [disconnect]");
                ok = false;
            }
            None => {
                ctx.bad(item, &key, format!("is not a verb here; {hint}"));
                ok = false;
            }
        }
    }
    ok.then_some(verbs)
}

/// The users: block (B-250..B-252, B-265..B-273).
fn users(ctx: &mut Ctx, node: &Node, roles: &[Role]) -> Vec<Entry> {
    let Kind::Map(items) = &node.kind else {
        ctx.bad(node, "users", "is not a mapping; write user-name patterns, each with its roles, such as \"device-*\": [sensor]");
        return Vec::new();
    };
    let mut dup = Fields::open(ctx, node, "users", &[]);
    let mut entries: Vec<Entry> = Vec::new();
    for (key, value) in items {
        dup.take_unchecked(&key.name);
        let path = walk::join("users", &key.name);
        let (roles_node, client_ids, limits) = match &value.kind {
            Kind::Map(_) => {
                let mut f = Fields::open(ctx, value, &path, ENTRY_KEYS);
                let limits = f.take("limits").map(|n| entry_limits(ctx, n, &path));
                let r = f.take("roles");
                let c = f.take("client_ids").map(|n| client_ids(ctx, n, &path));
                f.finish(ctx);
                (r, c.flatten(), limits)
            }
            _ => (Some(value), None, None),
        };
        let role_ids = entry_roles(ctx, roles_node, &path, key.line, roles);
        if let Some(role_ids) = role_ids {
            entries.push(Entry {
                pattern: key.name.clone(),
                roles: role_ids,
                client_ids,
                limits,
                line: key.line,
            });
        }
    }
    dup.finish_duplicates_only(ctx);
    // B-267: two patterns of equal exactness that can match one name.
    for (i, a) in entries.iter().enumerate() {
        for b in &entries[i + 1..] {
            if literal_count(&a.pattern) == literal_count(&b.pattern)
                && globs_overlap(&a.pattern, &b.pattern)
            {
                ctx.say(b.line, &walk::join("users", &b.pattern), None, format!(
                    "and users.{} (line {}) spell out as many characters and can both match one user name, so nothing would decide which applies; make one of them more exact",
                    a.pattern, a.line
                ));
            }
        }
    }
    entries
}

fn entry_roles(
    ctx: &mut Ctx,
    node: Option<&Node>,
    path: &str,
    line: u32,
    roles: &[Role],
) -> Option<Vec<usize>> {
    let key = walk::join(path, "roles");
    let items = match node.map(|n| &n.kind) {
        Some(Kind::Seq(items)) if !items.is_empty() => items,
        Some(Kind::Str(_)) => {
            let node = node?;
            ctx.bad(node, &key, "is not a list; write [role] even for one role");
            return None;
        }
        _ => {
            ctx.say(line, &key, None, "is missing or empty: an entry with no roles grants nothing, and every entry is the whole statement about its users; name its roles, or remove the entry");
            return None;
        }
    };
    let mut ids = Vec::new();
    for item in items {
        let name = item.scalar_text().unwrap_or_default();
        match roles.iter().position(|r| r.name == name) {
            Some(i) => ids.push(i),
            None => {
                ctx.bad(
                    item,
                    &key,
                    "names a role roles: does not define; define it, or fix the name",
                );
                return None;
            }
        }
    }
    Some(ids)
}

/// An entry's limits: publish_rate and publish_bytes, each refused at 0 as
/// broker.limits' are (B-114, B-117).
fn entry_limits(ctx: &mut Ctx, node: &Node, path: &str) -> EntryLimits {
    const KEYS: &[&str] = &["publish_rate", "publish_bytes"];
    let key = walk::join(path, "limits");
    let mut f = Fields::open(ctx, node, &key, KEYS);
    let mut l = EntryLimits::default();
    if let Some(n) = f.take("publish_rate") {
        let k = f.path("publish_rate");
        l.publish_rate = super::limits::rate(ctx, n, &k, u64::from(u32::MAX)).map(|v| v as u32);
    }
    if let Some(n) = f.take("publish_bytes") {
        let k = f.path("publish_bytes");
        if matches!(n.kind, Kind::Int(0)) {
            ctx.bad(n, &k, "is zero, which would refuse every publish; write a size of at least 1, or remove the key for no bound");
        } else {
            l.publish_bytes = walk::size(ctx, n, &k, 1, u64::MAX);
        }
    }
    f.finish(ctx);
    l
}

/// client_ids: one pattern or a list; none at all is refused (B-273).
fn client_ids(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Vec<String>> {
    let key = walk::join(path, "client_ids");
    let nobody = "admits no client id, so every device holding this credential would be refused; write a pattern such as \"%u\" or \"north-*\", or remove the key to admit any";
    match &node.kind {
        Kind::Seq(items) if items.is_empty() => {
            ctx.bad(node, &key, nobody);
            None
        }
        Kind::Seq(items) => items
            .iter()
            .map(|i| walk::string(ctx, i, &key))
            .collect::<Option<Vec<_>>>(),
        Kind::Null => {
            ctx.say(node.line, &key, None, nobody);
            None
        }
        _ => walk::string(ctx, node, &key).map(|s| vec![s]),
    }
}
