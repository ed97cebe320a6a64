//! `!include`: where it may be written, and reading the groups it names.
//!
//! `channels:` and `broker.storage.providers:` take either one mapping or a
//! list whose entries are each `!include <path>` or a mapping written in
//! place. Paths resolve against the including file; included files include
//! nothing; no globs. Anywhere else a tag is a finding.

use std::path::{Path, PathBuf};

use super::node::{self, Kind, Node};
use super::walk::Ctx;

/// The tag this loader reads.
pub(crate) const INCLUDE: &str = "!include";

/// One group of named entries and the file it was written in.
pub(crate) struct Group {
    /// The file, as findings name it.
    pub file: String,
    /// The mapping of names to settings.
    pub node: Node,
}

/// Reports every tag written where the loader does not read one. `lists`
/// are the key paths whose list entries may be `!include`.
pub(crate) fn check_tags(ctx: &mut Ctx, node: &Node, path: &str, lists: &[&str]) {
    if let Some(tag) = &node.tag {
        report_tag(ctx, node, path, tag, false);
    }
    check_inner_tags(ctx, node, path, lists);
}

/// [`check_tags`] below `node`, its own tag reported already. Walked in place: a
/// copy of each entry made to clear its tag cost a deep copy per level of nesting.
fn check_inner_tags(ctx: &mut Ctx, node: &Node, path: &str, lists: &[&str]) {
    match &node.kind {
        Kind::Map(entries) => {
            for (key, value) in entries {
                let child = super::walk::join(path, &key.name);
                check_tags(ctx, value, &child, lists);
            }
        }
        Kind::Seq(items) => {
            let allowed = lists.contains(&path);
            for (i, item) in items.iter().enumerate() {
                let child = format!("{path}[{i}]");
                match &item.tag {
                    Some(tag) if allowed && tag == INCLUDE => {}
                    Some(tag) => report_tag(ctx, item, &child, tag, allowed),
                    None => {}
                }
                check_inner_tags(ctx, item, &child, lists);
            }
        }
        _ => {}
    }
}

fn report_tag(ctx: &mut Ctx, node: &Node, path: &str, tag: &str, include_allowed_here: bool) {
    if tag.starts_with("tag:yaml.org,2002:") || tag.starts_with("!!") {
        return;
    }
    let text = if tag == INCLUDE {
        "is an !include where none may be written: !include names a file only as an entry of the channels: or broker.storage.providers: list; move these settings there, or write them in place".to_string()
    } else if include_allowed_here {
        format!(
            "is tagged {tag}, which Sagüin does not read; an entry here is !include <path> or channels written in place"
        )
    } else {
        format!("is tagged {tag}, which Sagüin does not read; remove the tag")
    };
    ctx.say(node.line, path, None, text);
}

/// Reads `channels:` or `broker.storage.providers:` into its groups.
/// `base` is the including file; `what` names the entries ("channels").
pub(crate) fn groups(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    base: &Path,
    what: &str,
) -> Vec<Group> {
    match &node.kind {
        Kind::Map(_) | Kind::Null => vec![Group {
            file: ctx.file.clone(),
            node: node.clone(),
        }],
        Kind::Seq(items) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let ipath = format!("{path}[{i}]");
                if item.tag.as_deref() == Some(INCLUDE) {
                    if let Some(g) = include(ctx, item, &ipath, base, what) {
                        out.push(g);
                    }
                } else if matches!(item.kind, Kind::Map(_)) {
                    out.push(Group {
                        file: ctx.file.clone(),
                        node: Node {
                            tag: None,
                            ..item.clone()
                        },
                    });
                } else if item.tag.is_none() {
                    ctx.bad(item, &ipath, format!("is neither !include <path> nor {what} written in place; write one of those"));
                }
            }
            out
        }
        _ => {
            ctx.bad(node, path, format!("is not a mapping of {what} nor a list of groups; write name: settings, or a list of !include <path>"));
            Vec::new()
        }
    }
}

fn include(ctx: &mut Ctx, item: &Node, path: &str, base: &Path, what: &str) -> Option<Group> {
    let Kind::Str(rel) = &item.kind else {
        ctx.bad(
            item,
            path,
            "is an !include without a path; write !include <path>, relative to this file",
        );
        return None;
    };
    if rel.trim().is_empty() {
        ctx.bad(
            item,
            path,
            "is an !include without a path; write !include <path>, relative to this file",
        );
        return None;
    }
    if rel.contains(['*', '?', '[']) {
        ctx.phrase(
            item.line,
            path,
            Some(format!("!include {rel:?}")),
            "is a glob, and Sagüin expands none: what the broker serves must not depend on a directory listing; name each file on its own line",
        );
        return None;
    }
    let target: PathBuf = match base.parent() {
        Some(dir) if Path::new(rel).is_relative() => dir.join(rel),
        _ => PathBuf::from(rel),
    };
    let display = target.display().to_string();
    let text = match node::read_file(&target) {
        Ok(t) => t,
        Err(e) => {
            ctx.phrase(
                item.line,
                path,
                Some(format!("!include {rel:?}")),
                format!("cannot be read as {display} ({e}); paths resolve against the including file's directory"),
            );
            return None;
        }
    };
    let saved = std::mem::replace(&mut ctx.file, display.clone());
    let result = match node::parse(&text) {
        Err(e) => {
            ctx.say(
                e.line,
                "the file",
                None,
                format!(
                    "is not valid YAML ({}); fix the syntax at that line",
                    e.message
                ),
            );
            None
        }
        Ok(root) => {
            if contains_include(&root) {
                ctx.say(
                    first_include_line(&root),
                    "!include",
                    None,
                    format!("is written in a file that is itself included from {saved}; includes do not nest - name this file's includes in the master file instead"),
                );
                None
            } else {
                check_tags(ctx, &root, "", &[]);
                if !matches!(root.kind, Kind::Map(_) | Kind::Null) {
                    ctx.bad(&root, "the file", format!("holds something other than {what}; an included file holds {what} by name and their settings, and nothing else"));
                    None
                } else {
                    Some(Group {
                        file: display,
                        node: root,
                    })
                }
            }
        }
    };
    ctx.file = saved;
    result
}

fn contains_include(node: &Node) -> bool {
    node.tag.as_deref() == Some(INCLUDE)
        || match &node.kind {
            Kind::Map(e) => e.iter().any(|(_, v)| contains_include(v)),
            Kind::Seq(items) => items.iter().any(contains_include),
            _ => false,
        }
}

fn first_include_line(node: &Node) -> u32 {
    if node.tag.as_deref() == Some(INCLUDE) {
        return node.line;
    }
    match &node.kind {
        Kind::Map(e) => e
            .iter()
            .map(|(_, v)| first_include_line(v))
            .find(|l| *l > 0)
            .unwrap_or(0),
        Kind::Seq(items) => items
            .iter()
            .map(first_include_line)
            .find(|l| *l > 0)
            .unwrap_or(0),
        _ => 0,
    }
}
