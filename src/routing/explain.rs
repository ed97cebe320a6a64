//! `saguin --route`: the answers as text, tab-separated or JSON.
//!
//! Every answer comes from [`Router::resolve`] and [`Router::reach`], the
//! functions the broker calls; nothing here decides anything.

use serde_json::{Value, json};

use super::{Route, Router};

/// A shared subscription: `$share/<ShareName>/<filter>`, served what is
/// published after the group began, split across it; never a queue's records.
fn shared(router: &Router, subject: &str, rest: &str) -> Vec<Line> {
    let Some((name, inner)) = rest.split_once('/') else {
        return refused(subject, "0x8F: write $share/<ShareName>/<filter>");
    };
    if name.is_empty() || crate::codec::has_wildcard(name) || inner.is_empty() {
        return refused(
            subject,
            "0x8F: write $share/<ShareName>/<filter>, a name holding no + or #",
        );
    }
    if inner.to_ascii_lowercase().starts_with("$share") {
        return refused(subject, "0x8F: the filter inside begins $share again");
    }
    // The first level, as the broker compares it: `$SYSTEM/x` is no reserved space.
    let first = inner.split('/').next().unwrap_or_default();
    if first == "$SYS" || first == "$saguin" {
        return refused(
            subject,
            "0x87: a reserved space is never delivered to a group",
        );
    }
    if let Err(e) = super::filter::check(inner) {
        return refused(
            subject,
            &format!("0x8F: {}", e.split(';').next().unwrap_or(&e)),
        );
    }
    let reach = router.reach(inner);
    let mut out: Vec<Line> = reach
        .channels
        .iter()
        .map(|t| {
            let why = match t.kind {
                crate::config::ChannelType::Append => "shared: new records only",
                crate::config::ChannelType::Latest => "shared: changes only",
                crate::config::ChannelType::Queue => "excluded",
            };
            (
                subject.to_string(),
                Some(t.name.to_string()),
                t.kind.as_str().into(),
                Some(why.into()),
            )
        })
        .collect();
    if out.is_empty() {
        out.push((
            subject.to_string(),
            None,
            "broadcast".into(),
            Some("shared".into()),
        ));
    }
    out
}

/// The header of the tab-separated form (it begins with `#`, so a kept run
/// can be fed back in).
pub const HEADER: &str = "# topic-or-filter\tchannel\ttype\twhy";

/// One answer line: subject, channel (`None` for `-`), type, why (`None` for `-`).
type Line = (String, Option<String>, String, Option<String>);

fn is_filter(s: &str) -> bool {
    crate::codec::has_wildcard(s)
}

fn refused(s: &str, why: &str) -> Vec<Line> {
    vec![(s.to_string(), None, "refused".into(), Some(why.into()))]
}

fn answer(router: &Router, subject: &str) -> Vec<Line> {
    let s = subject.to_string();
    if subject.to_ascii_lowercase().starts_with("$share/") && !subject.starts_with("$share/") {
        return refused(
            subject,
            "0x8F: $share is spelled in lower case and no other",
        );
    }
    if let Some(rest) = subject.strip_prefix("$share/") {
        return shared(router, subject, rest);
    }
    if subject.starts_with("$SYS/") || subject == "$SYS" {
        return refused(subject, "0x87: $SYS/ is the broker's own reserved space");
    }
    if super::is_seek_reply(subject) {
        return vec![(
            s,
            None,
            "reply".into(),
            Some("the answers to this client's seeks, written to it alone".into()),
        )];
    }
    if (subject.starts_with("$saguin/") || subject == "$saguin")
        && !subject.starts_with("$saguin/queue/")
    {
        return refused(
            subject,
            "0x87: $saguin/ is reserved; only a queue's form and a seek reply are subscribable there",
        );
    }
    if let Some(rest) = subject.strip_prefix("$saguin/queue/") {
        return match router.kind_of(rest) {
            Some(crate::config::ChannelType::Queue) => {
                vec![(
                    s,
                    Some(rest.to_string()),
                    "queue".into(),
                    Some("worker form".into()),
                )]
            }
            _ => vec![(
                s,
                None,
                "refused".into(),
                Some("0x8F: not a queue's form".into()),
            )],
        };
    }
    if !is_filter(subject) {
        return vec![match router.resolve(subject) {
            Route::Channel { name, kind, filter } => (
                s,
                Some(name.into()),
                kind.as_str().into(),
                Some(filter.into()),
            ),
            Route::Broadcast => (s, None, "broadcast".into(), None),
        }];
    }
    if let Err(e) = super::filter::check(subject) {
        return vec![(
            s,
            None,
            "refused".into(),
            Some(format!("0x8F: {}", e.split(';').next().unwrap_or(&e))),
        )];
    }
    let reach = router.reach(subject);
    if let Some(q) = reach.refused_inside_queue {
        return vec![(
            s,
            Some(q.into()),
            "queue".into(),
            Some(format!(
                "refused 0x8F: inside the queue; subscribe to $saguin/queue/{q}"
            )),
        )];
    }
    if reach.channels.is_empty() {
        return vec![(s, None, "broadcast".into(), None)];
    }
    reach
        .channels
        .iter()
        .map(|t| {
            (
                s.clone(),
                Some(t.name.to_string()),
                t.kind.as_str().into(),
                Some(t.serves.as_str().into()),
            )
        })
        .collect()
}

fn tsv(line: &Line) -> String {
    format!(
        "{}\t{}\t{}\t{}",
        line.0,
        line.1.as_deref().unwrap_or("-"),
        line.2,
        line.3.as_deref().unwrap_or("-")
    )
}

/// One answer as JSON, fields in the spec's order.
#[derive(serde::Serialize)]
struct Answer<'a> {
    subject: &'a str,
    channel: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'a str,
    why: Option<&'a str>,
}

fn object(line: &Line) -> String {
    let a = Answer {
        subject: &line.0,
        channel: line.1.as_deref(),
        kind: &line.2,
        why: line.3.as_deref(),
    };
    serde_json::to_string(&a).unwrap_or_default()
}

/// The subjects in `input`, one a line: blank lines skipped, a line starting
/// with `#` followed by anything is a comment, and a line that is only `#`
/// is the filter `#`.
pub fn read_subjects(input: &str) -> Vec<String> {
    input
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !(l.starts_with('#') && l.trim() != "#"))
        .map(|l| l.split('\t').next().unwrap_or(l).trim().to_string())
        .collect()
}

/// The tab-separated answer for a list of subjects, under [`HEADER`].
pub fn explain(router: &Router, subjects: &[String]) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    for s in subjects {
        for line in answer(router, s) {
            out.push_str(&tsv(&line));
            out.push('\n');
        }
    }
    out
}

/// One JSON object per answer line, no header, `null` for `-`.
pub fn explain_json(router: &Router, subjects: &[String]) -> String {
    let mut out = String::new();
    for s in subjects {
        for line in answer(router, s) {
            out.push_str(&object(&line));
            out.push('\n');
        }
    }
    out
}

/// The answer for one subject given as an operand: its lines, then the
/// routing table every filter expanded to.
pub fn explain_one(router: &Router, subject: &str) -> String {
    let mut out = explain(router, &[subject.to_string()]);
    out.push('\n');
    out.push_str(&table(router));
    out
}

/// One JSON object for one subject: its answers and the routing table.
pub fn explain_one_json(router: &Router, subject: &str) -> String {
    let answers: Vec<Value> = answer(router, subject)
        .iter()
        .map(|l| json!({ "channel": l.1, "type": l.2, "why": l.3 }))
        .collect();
    let table: Vec<Value> = router
        .channels()
        .into_iter()
        .flat_map(|(name, kind, filters)| {
            filters
                .iter()
                .map(move |f| json!({ "filter": f, "channel": name, "type": kind.as_str() }))
        })
        .collect();
    let mut v = json!({ "subject": subject, "answers": answers, "table": table });
    if let [only] = answers.as_slice() {
        for k in ["channel", "type", "why"] {
            v[k] = only[k].clone();
        }
    }
    format!("{v}\n")
}

/// The routing table: every plain filter (braces expanded) and the channel it places.
pub fn table(router: &Router) -> String {
    let mut out = String::from("# filter\tchannel\ttype\n");
    for (name, kind, filters) in router.channels() {
        for f in filters {
            out.push_str(&format!("{f}\t{name}\t{}\n", kind.as_str()));
        }
    }
    out
}
