//! Topic names and topic filters: validation, matching, and the subscription index.
//!
//! Matching itself is `routing::filter::matches`, the one function that decides
//! whether a filter matches a topic (MQTT 5 section 4.7), for channels and
//! subscriptions alike.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Map;
use super::partition::Slice;
use crate::codec::SubscriptionOptions;

pub use crate::codec::valid_topic_filter as is_valid_filter;

/// The number of levels in a topic or filter.
pub fn level_count(name: &str) -> usize {
    name.bytes().filter(|&b| b == b'/').count() + 1
}

pub use crate::routing::filter::matches;

/// A subscription as the index keeps it: whose it is and how it asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubEntry {
    /// The subscription options the client asked for (QoS already granted).
    pub options: SubscriptionOptions,
    /// The Subscription Identifier it carried, if any.
    pub identifier: Option<u32>,
    /// The slice its SUBSCRIBE declared (`saguin-filter`); never on a group's member.
    pub slice: Option<Slice>,
}

/// A `$share/<name>/<filter>` group: its members in client-id order and whose turn
/// came last, so turns rotate in client-id order (RFC 0002 "Shared subscriptions").
#[derive(Debug, Default)]
pub struct SharedGroup {
    /// `<ShareName>/<filter>`: what a delivery held for the group names it by (B-447).
    pub key: Arc<str>,
    /// Members by client id.
    pub members: BTreeMap<Arc<str>, SubEntry>,
    /// The member that took the previous message.
    pub last: Option<Arc<str>>,
}

impl SharedGroup {
    /// The members in turn order, starting after the one that took the last message.
    pub fn turn_order(&self) -> impl Iterator<Item = (&Arc<str>, &SubEntry)> {
        let last = self.last.as_deref();
        let after = self
            .members
            .iter()
            .filter(move |(c, _)| last.is_none_or(|l| &***c > l));
        let before = self
            .members
            .iter()
            .filter(move |(c, _)| last.is_some_and(|l| &***c <= l));
        after.chain(before)
    }
}

#[derive(Debug, Default)]
struct Node {
    /// Children by level. `+` and `#` are kept apart, so that a publish, which asks
    /// for both at every level it walks, finds them without hashing a string.
    children: Map<Box<str>, Node>,
    plus: Option<Box<Node>>,
    hash: Option<Box<Node>>,
    subscribers: Map<Arc<str>, SubEntry>,
    groups: Map<Box<str>, SharedGroup>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty()
            && self.plus.is_none()
            && self.hash.is_none()
            && self.subscribers.is_empty()
            && self.groups.is_empty()
    }

    /// The child for one level of a filter.
    fn child(&self, level: &str) -> Option<&Node> {
        match level {
            "+" => self.plus.as_deref(),
            "#" => self.hash.as_deref(),
            _ => self.children.get(level),
        }
    }

    fn child_mut(&mut self, level: &str) -> Option<&mut Node> {
        match level {
            "+" => self.plus.as_deref_mut(),
            "#" => self.hash.as_deref_mut(),
            _ => self.children.get_mut(level),
        }
    }

    fn child_or_new(&mut self, level: &str) -> &mut Node {
        match level {
            "+" => self.plus.get_or_insert_with(Box::default),
            "#" => self.hash.get_or_insert_with(Box::default),
            _ => self.children.entry(level.into()).or_default(),
        }
    }

    fn remove_child(&mut self, level: &str) {
        match level {
            "+" => self.plus = None,
            "#" => self.hash = None,
            _ => drop(self.children.remove(level)),
        }
    }
}

/// What a publish to one topic reaches.
pub enum Target<'a> {
    /// An ordinary subscription of one client.
    Client(&'a Arc<str>, &'a SubEntry),
    /// A shared group; the caller picks the member.
    Group(&'a mut SharedGroup),
}

/// The subscription index: a trie over topic levels, `+` and `#` children of their own.
#[derive(Debug, Default)]
pub struct TopicTree {
    root: Node,
    /// Members of shared groups, across the tree.
    shared_members: usize,
}

impl TopicTree {
    /// Adds or replaces a client's subscription; `share` names its group for
    /// `$share/<name>/<filter>`. Returns whether the subscription already existed.
    pub fn insert(
        &mut self,
        filter: &str,
        share: Option<&str>,
        client: &Arc<str>,
        entry: SubEntry,
    ) -> bool {
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = node.child_or_new(level);
        }
        match share {
            None => node.subscribers.insert(client.clone(), entry).is_some(),
            Some(name) => {
                let existed = node
                    .groups
                    .entry(name.into())
                    .or_insert_with(|| SharedGroup {
                        key: Arc::from(format!("{name}/{filter}")),
                        ..SharedGroup::default()
                    })
                    .members
                    .insert(client.clone(), entry)
                    .is_some();
                self.shared_members += usize::from(!existed);
                existed
            }
        }
    }

    /// Removes a client's subscription; returns whether it existed.
    pub fn remove(&mut self, filter: &str, share: Option<&str>, client: &str) -> bool {
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = Self::remove_at(&mut self.root, &levels, share, client);
        if removed && share.is_some() {
            self.shared_members -= 1;
        }
        removed
    }

    /// Another client subscribed to exactly `filter` (not shared) whose declared
    /// slice has a partition count other than `partitions`, with that count (C-195).
    /// Only the identical filter string is compared (C-196).
    pub fn partition_disagreement(
        &self,
        filter: &str,
        client: &str,
        partitions: u32,
    ) -> Option<(Arc<str>, u32)> {
        let mut node = &self.root;
        for level in filter.split('/') {
            node = node.child(level)?;
        }
        node.subscribers.iter().find_map(|(other, entry)| {
            let theirs = entry.slice.as_ref()?.partitions();
            (&**other != client && theirs != partitions).then(|| (other.clone(), theirs))
        })
    }

    /// The members of group `$share/<name>/<filter>` and their subscriptions, if it
    /// has any.
    pub fn group_members(&self, filter: &str, name: &str) -> Vec<(Arc<str>, SubEntry)> {
        let mut node = &self.root;
        for level in filter.split('/') {
            let Some(child) = node.child(level) else {
                return Vec::new();
            };
            node = child;
        }
        node.groups
            .get(name)
            .map(|g| {
                let members = g.members.iter();
                members.map(|(c, e)| (c.clone(), e.clone())).collect()
            })
            .unwrap_or_default()
    }

    /// Whether any shared group has a member.
    pub fn has_shared_groups(&self) -> bool {
        self.shared_members > 0
    }

    fn remove_at(node: &mut Node, levels: &[&str], share: Option<&str>, client: &str) -> bool {
        let Some((first, rest)) = levels.split_first() else {
            return match share {
                None => node.subscribers.remove(client).is_some(),
                Some(name) => {
                    let Some(group) = node.groups.get_mut(name) else {
                        return false;
                    };
                    let removed = group.members.remove(client).is_some();
                    if group.members.is_empty() {
                        node.groups.remove(name);
                    }
                    removed
                }
            };
        };
        let Some(child) = node.child_mut(first) else {
            return false;
        };
        let removed = Self::remove_at(child, rest, share, client);
        if child.is_empty() {
            node.remove_child(first);
        }
        removed
    }

    /// Calls `visit` for every subscription and group whose filter matches `topic`;
    /// returns how many places they came from (a node's subscriptions, each group).
    /// From one place, no client is visited twice.
    pub fn for_each_match(&mut self, topic: &str, mut visit: impl FnMut(Target<'_>)) -> usize {
        let dollar = topic.starts_with('$');
        Self::walk(&mut self.root, Some(topic), dollar, &mut visit)
    }

    /// Visits the subscribers below `node` that match `levels`, the topic's levels
    /// not yet walked, still joined by '/' (`None` once every level is walked): no
    /// list of levels is built for a publish.
    fn walk(
        node: &mut Node,
        levels: Option<&str>,
        dollar_root: bool,
        visit: &mut impl FnMut(Target<'_>),
    ) -> usize {
        let wildcards_allowed = !dollar_root;
        let mut places = 0;
        if wildcards_allowed && let Some(hash) = node.hash.as_deref_mut() {
            places += Self::visit_node(hash, visit);
        }
        let Some(levels) = levels else {
            return places + Self::visit_node(node, visit);
        };
        let (first, rest) = match levels.split_once('/') {
            Some((first, rest)) => (first, Some(rest)),
            None => (levels, None),
        };
        if wildcards_allowed && let Some(plus) = node.plus.as_deref_mut() {
            places += Self::walk(plus, rest, false, visit);
        }
        if let Some(exact) = node.children.get_mut(first) {
            places += Self::walk(exact, rest, false, visit);
        }
        places
    }

    fn visit_node(node: &mut Node, visit: &mut impl FnMut(Target<'_>)) -> usize {
        for (client, entry) in &node.subscribers {
            visit(Target::Client(client, entry));
        }
        for group in node.groups.values_mut() {
            visit(Target::Group(group));
        }
        usize::from(!node.subscribers.is_empty()) + node.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::QoS;

    /// `#` only as the last level.
    #[test]
    fn filters_follow_mqtt_4_7_1() {
        for good in ["a", "a/b", "+", "#", "a/+/c", "a/#", "+/+", "/", "$SYS/#"] {
            assert!(is_valid_filter(good), "{good}");
        }
        for bad in ["", "a/#/c", "a+", "a/b#", "#/", "a/+b"] {
            assert!(!is_valid_filter(bad), "{bad}");
        }
    }

    #[test]
    fn levels_are_counted_as_split_on_slash_counts_them() {
        for name in ["", "a", "/", "a/b", "//", "a//b/", "é/日本/x"] {
            assert_eq!(level_count(name), name.split('/').count(), "{name:?}");
        }
    }

    /// subscription matching is MQTT's; `+` one level, `#` the parent too.
    /// a leading wildcard never matches `$SYS/`.
    #[test]
    fn hash_matches_the_parent_level_and_dollar_topics_need_a_literal_first_level() {
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("a/+", "a/b"));
        assert!(!matches("a/+", "a/b/c"));
        assert!(!matches("#", "$SYS/x"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
        assert!(matches("+/+", "/x"));
    }

    #[test]
    fn the_tree_agrees_with_matches() {
        let filters = [
            "a/#", "a/+", "+/b", "#", "a/b", "$SYS/#", "+/+/+", "a/b/#", "+", "/+", "a/+/b",
        ];
        // Empty levels (a leading, trailing or doubled '/') are levels too.
        let topics = [
            "a", "a/b", "a/b/c", "x/b", "$SYS/b", "$SYS", "/b", "/", "a/", "a//b", "//",
        ];
        let mut tree = TopicTree::default();
        let entry = SubEntry {
            options: SubscriptionOptions::with_qos(QoS::AtMostOnce),
            identifier: None,
            slice: None,
        };
        for f in filters {
            tree.insert(f, None, &Arc::from(f), entry.clone());
        }
        for t in topics {
            let mut got = Vec::new();
            tree.for_each_match(t, |target| {
                if let Target::Client(c, _) = target {
                    got.push(c.to_string());
                }
            });
            got.sort();
            let mut want: Vec<String> = filters
                .iter()
                .filter(|f| matches(f, t))
                .map(|f| f.to_string())
                .collect();
            want.sort();
            assert_eq!(got, want, "topic {t}");
        }
        for f in filters {
            assert!(tree.remove(f, None, f));
        }
        assert!(tree.root.is_empty());
    }

    #[test]
    fn only_the_identical_filter_is_compared_for_partition_counts_c195_c196() {
        let declared = |value: &str| SubEntry {
            options: SubscriptionOptions::with_qos(QoS::AtMostOnce),
            identifier: None,
            slice: crate::broker::partition::declared(&[(
                "saguin-filter".to_string(),
                value.to_string(),
            )])
            .ok()
            .flatten(),
        };
        let mut tree = TopicTree::default();
        tree.insert(
            "iot/+/events",
            None,
            &Arc::from("one"),
            declared("topic_hash(3, 0)"),
        );
        tree.insert(
            "iot/site-a/events",
            None,
            &Arc::from("two"),
            declared("topic_hash(4, 0)"),
        );
        assert_eq!(
            tree.partition_disagreement("iot/site-a/events", "two", 4),
            None,
            "overlapping filters may differ on purpose"
        );
        assert_eq!(tree.partition_disagreement("iot/+/events", "one", 3), None);
        assert_eq!(
            tree.partition_disagreement("iot/+/events", "three", 4),
            Some((Arc::from("one"), 3))
        );
        assert_eq!(tree.partition_disagreement("nowhere", "three", 4), None);
    }

    /// turns rotate in client-id order from the last taker.
    #[test]
    fn shared_groups_rotate_in_client_id_order() {
        let mut group = SharedGroup::default();
        let entry = SubEntry {
            options: SubscriptionOptions::with_qos(QoS::AtMostOnce),
            identifier: None,
            slice: None,
        };
        for c in ["c", "a", "b"] {
            group.members.insert(Arc::from(c), entry.clone());
        }
        let order: Vec<&str> = group.turn_order().map(|(c, _)| &**c).collect();
        assert_eq!(order, ["a", "b", "c"]);
        group.last = Some(Arc::from("a"));
        let order: Vec<&str> = group.turn_order().map(|(c, _)| &**c).collect();
        assert_eq!(order, ["b", "c", "a"]);
    }
}
