//! `saguin --acl`: what a user name gets, as the broker decides it (RFC 0002
//! "Explaining a decision: --acl"). It reads the same [`Policy`] the broker
//! loads and resolves entries with the same [`Policy::entry_for`]; `%u` and
//! `%c` are put in by the same [`substitute`].

use serde_json::{Value, json};

use super::{Policy, Subject, substitute};
use crate::config::Config;

/// The header of the list form; it starts with `#`, so it is skipped when fed back.
pub const HEADER: &str = "# user\trole\tkind\tsubject\tverbs\trate\tbytes";

/// What scoping by `%c` is worth, said wherever a rule uses it (B-258).
pub const CLIENT_ID_NOTE: &str = "Note: %c is whatever the device typed. Scoping by it separates devices sharing a credential by convention, not by force - any of them may name another's id.";

/// One row of grants: a rule's spelling with the names put in.
struct Row {
    role: String,
    kind: &'static str,
    subject: String,
    verbs: Vec<&'static str>,
    denies: Vec<&'static str>,
}

/// What one user (and client id) gets.
struct Answer {
    rows: Vec<Row>,
    /// Rules granting nothing here, as the file writes them (a name holding
    /// `+`, `#` or `/`), with their role.
    withheld: Vec<(String, String)>,
    applied: Option<usize>,
    matched: Vec<usize>,
    client_id_allowed: Option<bool>,
}

fn answer(policy: &Policy, user: &str, client: Option<&str>) -> Answer {
    let matched: Vec<usize> = (0..policy.entries.len())
        .filter(|i| super::glob(&policy.entries[*i].pattern, user))
        .collect();
    let applied = policy
        .entry_for(user)
        .and_then(|e| policy.entries.iter().position(|x| x.pattern == e.pattern));
    let mut a = Answer {
        rows: Vec::new(),
        withheld: Vec::new(),
        applied,
        matched,
        client_id_allowed: None,
    };
    let Some(entry) = applied.map(|i| &policy.entries[i]) else {
        return a;
    };
    a.client_id_allowed = client.map(|c| Policy::client_id_allowed(entry, user, c));
    // Without a client id, %c is left standing (and said so in the paragraph form).
    let client = Some(client.unwrap_or("%c"));
    for role in entry.roles.iter().filter_map(|i| policy.roles.get(*i)) {
        for rule in &role.rules {
            let row = |kind, subject: String| Row {
                role: role.name.clone(),
                kind,
                subject,
                verbs: rule.verbs.words(),
                denies: Vec::new(),
            };
            let (name, spellings) = match &rule.subject {
                Subject::Sessions => {
                    a.rows.push(row("broker", "sessions".into()));
                    continue;
                }
                Subject::Features(denied) => {
                    let mut r = row("broker", "features".into());
                    r.denies = denied.words();
                    a.rows.push(r);
                    continue;
                }
                Subject::Channel {
                    name,
                    filters: None,
                } => {
                    a.rows.push(row("channel", name.clone()));
                    continue;
                }
                Subject::Channel {
                    name,
                    filters: Some(f),
                } => (Some(name), f),
                Subject::Topic { filters } => (None, filters),
            };
            let put: Option<Vec<String>> = spellings
                .iter()
                .map(|f| substitute(f, user, client))
                .collect();
            let Some(put) = put else {
                let written = spellings.join(",");
                a.withheld.push((role.name.clone(), written));
                continue;
            };
            for f in put {
                a.rows.push(match name {
                    Some(n) => row("channel", format!("{n} ({f})")),
                    None => row("topic", f),
                });
            }
        }
    }
    a
}

fn figure<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "no bound".to_string(), |v| v.to_string())
}

/// The figures `user` publishes at: its entry's `limits:`, else the broker's.
fn figures(policy: &Policy, config: &Config, user: &str) -> (Option<u32>, Option<u64>) {
    match policy
        .entry_for(user)
        .and_then(|e| e.limits)
        .filter(|_| !user.is_empty())
    {
        Some(l) => (l.publish_rate, l.publish_bytes),
        None => (
            config.broker.limits.publish_rate,
            config.broker.limits.publish_bytes,
        ),
    }
}

/// The list form's lines for one input line's user and client id.
fn list_rows(policy: &Policy, config: &Config, user: &str, client: Option<&str>) -> String {
    let (rate, bytes) = figures(policy, config, user);
    let (rate, bytes) = (figure(rate), figure(bytes));
    let a = answer(policy, user, client);
    if a.rows.is_empty() {
        return format!("{user}\t-\t-\t-\t-\t{rate}\t{bytes}\n");
    }
    let mut out = String::new();
    for r in &a.rows {
        let mut verbs = r.verbs.join(",");
        if !r.denies.is_empty() {
            verbs = format!("deny {}", r.denies.join(","));
        }
        out.push_str(&format!(
            "{user}\t{}\t{}\t{}\t{verbs}\t{rate}\t{bytes}\n",
            r.role, r.kind, r.subject
        ));
    }
    out
}

fn list_json(policy: &Policy, config: &Config, user: &str, client: Option<&str>) -> String {
    let (rate, bytes) = figures(policy, config, user);
    let a = answer(policy, user, client);
    let object = |role: Value, kind: Value, subject: Value, verbs: &[&str], denies: &[&str]| {
        json!({
            "user": user, "role": role, "kind": kind, "subject": subject,
            "verbs": verbs, "denies": denies,
            "publish_rate": rate, "publish_bytes": bytes,
        })
        .to_string()
    };
    if a.rows.is_empty() {
        return object(Value::Null, Value::Null, Value::Null, &[], &[]) + "\n";
    }
    a.rows
        .iter()
        .map(|r| {
            object(
                r.role.as_str().into(),
                r.kind.into(),
                r.subject.as_str().into(),
                &r.verbs,
                &r.denies,
            ) + "\n"
        })
        .collect()
}

/// Splits an input line into a user name and an optional client id; `None`
/// for a blank line or a `#` comment (the header included).
fn read_line(line: &str) -> Option<(&str, Option<&str>)> {
    let line = line.trim_end_matches('\r');
    if line.trim().is_empty() || line.starts_with('#') {
        return None;
    }
    match line.split_once(['\t', ' ']) {
        Some((user, client)) => {
            let client = client.trim();
            Some((user, (!client.is_empty()).then_some(client)))
        }
        None => Some((line, None)),
    }
}

/// The list form over `input` (user names, one a line, a client id optional).
pub fn explain_list(policy: &Policy, config: &Config, input: &str, as_json: bool) -> String {
    let mut out = if as_json {
        String::new()
    } else {
        format!("{HEADER}\n")
    };
    for (user, client) in input.lines().filter_map(read_line) {
        out.push_str(&if as_json {
            list_json(policy, config, user, client)
        } else {
            list_rows(policy, config, user, client)
        });
    }
    out
}

/// The answer when the configuration names no acl_file (B-340, B-345).
pub fn explain_unrestricted(config: &Config, as_json: bool) -> String {
    if as_json {
        return json!({"acl_file": null, "everything_allowed": true}).to_string() + "\n";
    }
    format!(
        "{} names no acl_file: every authenticated client may do anything.\n",
        config.source.display()
    )
}

/// The single-user object (B-343, B-344).
pub fn explain_one_json(policy: &Policy, user: &str, client: Option<&str>) -> String {
    let a = answer(policy, user, client);
    let pattern = |i: &usize| policy.entries[*i].pattern.as_str();
    let grants: Vec<Value> = a
        .rows
        .iter()
        .map(|r| {
            json!({"role": r.role, "kind": r.kind, "subject": r.subject,
                   "verbs": r.verbs, "denies": r.denies})
        })
        .collect();
    let withheld: Vec<Value> = a
        .withheld
        .iter()
        .map(|(role, written)| json!({"role": role, "subject": written}))
        .collect();
    json!({
        "user": user,
        "acl_file": policy.path.display().to_string(),
        "pattern_applied": a.applied.as_ref().map(pattern),
        "patterns_matched": a.matched.iter().map(pattern).collect::<Vec<_>>(),
        "patterns_in_file": policy.entries.iter().map(|e| e.pattern.as_str()).collect::<Vec<_>>(),
        "grants": grants,
        "grants_withheld": withheld,
        "client_id_allowed": a.client_id_allowed,
    })
    .to_string()
        + "\n"
}

/// The paragraph form for one user (B-329..B-333, B-258).
pub fn explain_one(policy: &Policy, user: &str, client: Option<&str>) -> String {
    let a = answer(policy, user, client);
    let mut out = format!("user {user:?}");
    if let Some(c) = client {
        out.push_str(&format!(", client id {c:?}"));
    }
    out.push_str(&format!(" under {}:\n", policy.path.display()));
    let Some(applied) = a.applied.map(|i| &policy.entries[i]) else {
        out.push_str("  no users: pattern matches this name: it is granted nothing.\n");
        return out;
    };
    out.push_str(&format!(
        "  entry in force: users.{} (line {}), roles {}\n",
        applied.pattern,
        applied.line,
        applied
            .roles
            .iter()
            .filter_map(|i| policy.roles.get(*i))
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Some(l) = applied.limits {
        out.push_str(&format!(
            "  limits: publish_rate {}, publish_bytes {} (the entry's, instead of broker.limits)\n",
            figure(l.publish_rate),
            figure(l.publish_bytes)
        ));
    }
    for i in a
        .matched
        .iter()
        .filter(|i| policy.entries[**i].pattern != applied.pattern)
    {
        let e = &policy.entries[*i];
        out.push_str(&format!(
            "  shadowed: users.{} (line {}) matches too and contributes nothing\n",
            e.pattern, e.line
        ));
        if e.limits.is_some() && applied.limits.is_none() {
            out.push_str(&format!(
                "    users.{} carries limits: and the entry in force does not, so this user publishes at the broker-wide figures, not that entry's\n",
                e.pattern
            ));
        }
    }
    match a.client_id_allowed {
        Some(true) => out.push_str("  client_ids: this client id is admitted\n"),
        Some(false) => out.push_str(
            "  client_ids: this client id is NOT admitted - the connection is refused 0x86\n",
        ),
        None => {}
    }
    out.push_str("  grants:\n");
    for r in &a.rows {
        let what = if r.denies.is_empty() {
            r.verbs.join(",")
        } else {
            format!("deny {}", r.denies.join(","))
        };
        out.push_str(&format!(
            "    {}\t{}\t{}\t{what}\n",
            r.role, r.kind, r.subject
        ));
    }
    for (role, written) in &a.withheld {
        out.push_str(&format!(
            "  withheld: role {role}'s rule on {written} grants nothing here: the name it would put in holds +, # or /\n"
        ));
    }
    if policy.uses_client_id() {
        if client.is_none() {
            out.push_str("  A rule here uses %c and no client id was given, so %c is left standing and those grants match nothing; give the client id after the user name.\n");
        }
        out.push_str(&format!("  {CLIENT_ID_NOTE}\n"));
    }
    out
}
