//! The decisions: what one client's grants allow, asked of the route a topic
//! takes (RFC 0002 "Three rule kinds", "Grant-only, for records").

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use super::{EntryLimits, Feature, Features, Policy, Subject, Verb, Verbs, substitute};
use crate::codec::{Connect, ProtocolVersion, QoS, reason};
use crate::config::{ChannelType, Config};
use crate::routing::{Route, Router, filter};

/// The acl_file the broker holds: validated against the channels it started
/// with, swapped whole by [`Acl::reload`].
#[derive(Debug)]
pub struct Acl {
    config: Config,
    router: Router,
    current: RefCell<Rc<Policy>>,
    reloaded: Listeners,
}

/// What is told when a re-read swapped the policy.
#[derive(Default)]
struct Listeners(RefCell<Vec<Box<dyn Fn()>>>);

impl std::fmt::Debug for Listeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} reload listeners", self.0.borrow().len())
    }
}

impl Acl {
    /// Reads the acl_file `config` names, if it names one.
    ///
    /// # Errors
    /// Every finding of the file, as `--check-config` prints them.
    pub fn from_config(config: &Config) -> Result<Option<Rc<Acl>>, String> {
        let policy = crate::config::acl::load(config).map_err(|e| e.to_string())?;
        Ok(policy.map(|policy| {
            log::info!(
                "acl_file {}: {} users, {} roles",
                policy.path.display(),
                policy.user_count(),
                policy.roles.len()
            );
            Rc::new(Acl {
                config: config.clone(),
                router: Router::new(config),
                current: RefCell::new(Rc::new(policy)),
                reloaded: Listeners::default(),
            })
        }))
    }

    /// Reads the file again from the same path; one that does not load changes
    /// nothing (B-292). Returns (path, users, roles) now held.
    ///
    /// # Errors
    /// The findings, for the log.
    pub fn reload(&self) -> Result<(String, usize, usize), String> {
        let policy = crate::config::acl::load(&self.config)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the configuration names no acl_file".to_string())?;
        let said = (
            policy.path.display().to_string(),
            policy.user_count(),
            policy.roles.len(),
        );
        *self.current.borrow_mut() = Rc::new(policy);
        for tell in self.reloaded.0.borrow().iter() {
            tell();
        }
        Ok(said)
    }

    /// Calls `tell` after every re-read that swapped the policy: the server wakes
    /// every cursor, so a grant coming back is itself what resumes a stalled
    /// subscriber (B-294).
    pub fn on_reload(&self, tell: impl Fn() + 'static) {
        self.reloaded.0.borrow_mut().push(Box::new(tell));
    }

    /// The policy held now.
    pub fn policy(&self) -> Rc<Policy> {
        self.current.borrow().clone()
    }

    /// `user` (as its door proved it) with `client_id` under this policy, asked
    /// nothing yet: what [`Acl::admit`] answers once a CONNECT passes, and what a
    /// session restored at startup is asked as (B-290).
    pub fn principal(self: &Rc<Self>, user: &str, client_id: &str) -> Principal {
        Principal {
            acl: self.clone(),
            user: user.to_string(),
            client_id: Arc::from(client_id),
            cache: RefCell::new(None),
        }
    }

    /// Decides a CONNECT that authenticated as `user` (the empty string for an
    /// anonymous client, B-249), after authentication so a wrong password is
    /// still 0x86 whatever the name's roles deny (B-317): `client_ids:` (0x86,
    /// B-270); a Will under a features denial (will 0x87, retained 0x9A on a
    /// broadcast topic, qos2 0x9B; B-310, B-312, B-314) or on a topic the client
    /// may not publish to (0x87, B-289). A `persistent` denial makes the session
    /// end with the connection: an MQTT 5 client's Session Expiry Interval
    /// becomes 0 (and its CONNACK says so), a 3.1.1 client's session clean
    /// (B-309). Rules withheld because a name holds `+`, `#` or `/` are logged
    /// once, here (B-256).
    ///
    /// # Errors
    /// The reason code and what the log says.
    pub fn admit(
        self: &Rc<Self>,
        user: &str,
        connect: &mut Connect,
    ) -> Result<Principal, (u8, String)> {
        let client_id = connect.client_id.as_str();
        let policy = self.policy();
        if let Some(entry) = policy.entry_for(user)
            && !Policy::client_id_allowed(entry, user, client_id)
        {
            return Err((
                reason::BAD_USER_NAME_OR_PASSWORD,
                format!(
                    "client id {client_id:?} is not one users: {:?} (line {}) admits under client_ids:",
                    entry.pattern, entry.line
                ),
            ));
        }
        let principal = self.principal(user, client_id);
        let grants = principal.grants();
        for line in &grants.withheld {
            log::warn!(
                "{client_id:?} (user {user:?}): the rule on line {line} of the acl_file grants it nothing: the name it would put in holds +, # or / (or, for %c, the client id is empty)"
            );
        }
        if let Some(will) = &connect.will {
            let denied = |f: Feature| grants.denied.has(f);
            let broadcast = matches!(self.router.resolve(&will.topic), Route::Broadcast);
            let refusal = if denied(Feature::Will) {
                Some((reason::NOT_AUTHORIZED, "will"))
            } else if denied(Feature::Retained) && will.retain && broadcast {
                Some((reason::RETAIN_NOT_SUPPORTED, "retained"))
            } else if denied(Feature::Qos2) && will.qos == QoS::ExactlyOnce {
                Some((reason::QOS_NOT_SUPPORTED, "qos2"))
            } else {
                None
            };
            if let Some((code, feature)) = refusal {
                return Err((
                    code,
                    format!(
                        "its Will needs {feature}, which the acl_file takes away from user {user:?}"
                    ),
                ));
            }
            if !grants.may_publish(&self.router, &will.topic, will.payload.is_empty()) {
                return Err((
                    reason::NOT_AUTHORIZED,
                    format!(
                        "its Will names {:?}, which user {user:?} may not publish to",
                        will.topic
                    ),
                ));
            }
        }
        if grants.denied.has(Feature::Persistent) {
            match connect.protocol {
                ProtocolVersion::V5 => connect.properties.edit().session_expiry_interval = Some(0),
                ProtocolVersion::V311 => connect.clean_start = true,
            }
        }
        Ok(principal)
    }
}

impl Principal {
    /// The same client under the id the broker assigned it: `%c` names that id
    /// (MQTT-3.1.3-6), where the empty id of its CONNECT granted nothing.
    pub fn assigned(&self, client_id: &str) -> Principal {
        self.acl.principal(&self.user, client_id)
    }
}

/// One connection's identity under the acl_file: the proved name and the client
/// id, with the grants worked out for the policy held now (re-worked when a
/// SIGUSR1 swapped it, so a re-read applies at the next question).
#[derive(Debug)]
pub struct Principal {
    acl: Rc<Acl>,
    user: String,
    client_id: Arc<str>,
    cache: RefCell<Option<(Rc<Policy>, Rc<Grants>)>>,
}

impl Principal {
    /// The grants under the policy held now.
    pub fn grants(&self) -> Rc<Grants> {
        let policy = self.acl.policy();
        let mut cache = self.cache.borrow_mut();
        if let Some((held, grants)) = &*cache
            && Rc::ptr_eq(held, &policy)
        {
            return grants.clone();
        }
        let grants = Rc::new(Grants::of(&policy, &self.user, &self.client_id));
        *cache = Some((policy, grants.clone()));
        grants
    }

    /// Whether a publish to `topic` is granted (B-287); `empty` says its payload
    /// is zero-length, which on a latest channel is a deletion.
    pub fn may_publish(&self, topic: &str, empty: bool) -> bool {
        self.grants().may_publish(&self.acl.router, topic, empty)
    }

    /// Whether a delivery of `topic` may go to this client: `read` on its route,
    /// asked on every delivery (B-293).
    pub fn may_read(&self, topic: &str) -> bool {
        let grants = self.grants();
        match self.acl.router.resolve(topic) {
            Route::Channel { name, .. } => grants.channel_allows(name, topic, Verb::Read),
            Route::Broadcast => grants.rules.iter().any(|(g, v)| {
                v.has(Verb::Read) && matches!(g, Granted::Topic(f) if filter::matches(f, topic))
            }),
        }
    }

    /// Whether a subscription to `filter` (a shared one's inner filter) is
    /// granted whole (B-279).
    pub fn may_subscribe(&self, filter: &str) -> bool {
        self.grants().may_subscribe(&self.acl.router, filter)
    }

    /// Whether this client may take and answer jobs of queue `queue` (B-282): some
    /// rule on it grants `consume`, narrowed or not.
    pub fn may_consume(&self, queue: &str) -> bool {
        self.grants().on_channel(queue).has(Verb::Consume)
    }

    /// Whether this client may be offered the job of queue `queue` stored under
    /// `topic`: a rule whose filter matches the topic grants `consume` (B-253, B-259).
    pub fn may_consume_job(&self, queue: &str, topic: &str) -> bool {
        self.grants().channel_allows(queue, topic, Verb::Consume)
    }

    /// Whether this client may seek on append channel `channel` (B-282).
    pub fn may_seek(&self, channel: &str) -> bool {
        self.grants().on_channel(channel).has(Verb::Seek)
    }

    /// Whether a point read of `key` is granted: read on the latest channel
    /// holding it, the rule's filter matching the key (B-282).
    pub fn may_read_key(&self, key: &str) -> bool {
        let grants = self.grants();
        match self.acl.router.resolve(key) {
            Route::Channel { name, .. } => grants.channel_allows(name, key, Verb::Read),
            Route::Broadcast => false,
        }
    }

    /// The verbs this client holds on `channel`, for its catalogue answer (B-323).
    pub fn verbs_on(&self, channel: &str) -> Verbs {
        self.grants().on_channel(channel)
    }

    /// Whether a `broker: features` rule of this client's roles takes `feature`
    /// away: any role denying it denies it (B-285, B-316).
    pub fn denies(&self, feature: Feature) -> bool {
        self.grants().denied.has(feature)
    }

    /// Whether `topic` is broadcast (no channel holds it), for the `retained`
    /// denial, which only broadcast topics feel (B-312).
    pub fn is_broadcast(&self, topic: &str) -> bool {
        matches!(self.acl.router.resolve(topic), Route::Broadcast)
    }

    /// The publish figures this client is held to, when its entry carries
    /// `limits:` (B-115); `None` leaves the broker-wide ones.
    pub fn limits(&self) -> Option<EntryLimits> {
        self.grants().limits
    }

    /// Whether this client may hang others up (B-283, B-297).
    pub fn may_disconnect(&self) -> bool {
        self.grants().sessions.has(Verb::Disconnect)
    }
}

/// One rule with the client's names put in.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Granted {
    Channel {
        name: String,
        filter: Option<String>,
    },
    Topic(String),
}

/// What one client holds: its entry's roles with `%u` and `%c` put in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// The pattern of the entry in force, if any matched.
    pub entry: Option<String>,
    rules: Vec<(Granted, Verbs)>,
    sessions: Verbs,
    /// The features its roles take away.
    pub denied: Features,
    /// The entry's `limits:`, when it carries them.
    pub limits: Option<EntryLimits>,
    /// Lines of rules that grant nothing here, a name holding `+`, `#` or `/`.
    pub withheld: Vec<u32>,
}

impl Grants {
    /// Works out the grants of `user` connected as `client_id`.
    pub fn of(policy: &Policy, user: &str, client_id: &str) -> Grants {
        let Some(entry) = policy.entry_for(user) else {
            return Grants::default();
        };
        let mut g = Grants {
            entry: Some(entry.pattern.clone()),
            // An anonymous client publishes at the broker-wide figures, whatever
            // entry its empty name falls under (B-113).
            limits: entry.limits.filter(|_| !user.is_empty()),
            ..Grants::default()
        };
        let client = Some(client_id);
        for role in entry.roles.iter().filter_map(|i| policy.roles.get(*i)) {
            for rule in &role.rules {
                let spellings: &[String] = match &rule.subject {
                    Subject::Sessions => {
                        g.sessions = g.sessions.union(rule.verbs);
                        continue;
                    }
                    Subject::Features(denied) => {
                        g.denied = g.denied.union(*denied);
                        continue;
                    }
                    Subject::Channel {
                        name,
                        filters: None,
                    } => {
                        let whole = Granted::Channel {
                            name: name.clone(),
                            filter: None,
                        };
                        g.rules.push((whole, rule.verbs));
                        continue;
                    }
                    Subject::Channel {
                        filters: Some(f), ..
                    } => f,
                    Subject::Topic { filters } => filters,
                };
                // One substitution refused withholds the whole rule (B-256).
                let put: Option<Vec<String>> = spellings
                    .iter()
                    .map(|f| substitute(f, user, client))
                    .collect();
                let Some(put) = put else {
                    g.withheld.push(rule.line);
                    continue;
                };
                for f in put {
                    let granted = match &rule.subject {
                        Subject::Channel { name, .. } => Granted::Channel {
                            name: name.clone(),
                            filter: Some(f),
                        },
                        _ => Granted::Topic(f),
                    };
                    g.rules.push((granted, rule.verbs));
                }
            }
        }
        g
    }

    /// Every verb held on `channel` by some rule, narrowed or not.
    fn on_channel(&self, channel: &str) -> Verbs {
        self.rules
            .iter()
            .filter(|(g, _)| matches!(g, Granted::Channel { name, .. } if name == channel))
            .fold(Verbs::default(), |acc, (_, v)| acc.union(*v))
    }

    /// Whether some rule on `channel` whose filter matches `topic` grants `verb`.
    pub fn channel_allows(&self, channel: &str, topic: &str, verb: Verb) -> bool {
        self.rules.iter().any(|(g, v)| {
            v.has(verb)
                && matches!(g, Granted::Channel { name, filter: f }
                    if name == channel && f.as_deref().is_none_or(|f| filter::matches(f, topic)))
        })
    }

    /// Whether a publish to `topic` is granted: `write` on the channel it
    /// resolves to - `delete` for a zero-length payload on a latest channel,
    /// which removes the key - or a `topic:` rule when it is broadcast (B-275,
    /// B-280).
    pub fn may_publish(&self, router: &Router, topic: &str, empty: bool) -> bool {
        match router.resolve(topic) {
            Route::Channel {
                name,
                kind: ChannelType::Latest,
                ..
            } if empty => self.channel_allows(name, topic, Verb::Delete),
            Route::Channel { name, .. } => self.channel_allows(name, topic, Verb::Write),
            Route::Broadcast => self.rules.iter().any(|(g, v)| {
                v.has(Verb::Write) && matches!(g, Granted::Topic(f) if filter::matches(f, topic))
            }),
        }
    }

    /// Whether a subscription is granted whole (B-279): `read` on every channel it
    /// is served from, by rules covering its part of that channel, and a `topic:`
    /// rule covering it where it can match broadcast topics. A queue it touches
    /// serves it nothing (its records leave only through `$saguin/queue/<name>`),
    /// so asks nothing of it.
    pub fn may_subscribe(&self, router: &Router, sub: &str) -> bool {
        let reach = router.reach(sub);
        for touch in &reach.channels {
            if touch.kind == ChannelType::Queue {
                continue;
            }
            let Some((_, _, plain)) = router.channels().into_iter().find(|c| c.0 == touch.name)
            else {
                return false;
            };
            let covered = plain
                .iter()
                .filter_map(|cf| filter::intersection(sub, cf))
                .all(|part| {
                    self.rules.iter().any(|(g, v)| {
                        v.has(Verb::Read)
                            && matches!(g, Granted::Channel { name, filter: f }
                                if name == touch.name
                                    && f.as_deref().is_none_or(|f| filter::contains(f, &part)))
                    })
                });
            if !covered {
                return false;
            }
        }
        !reach.broadcast
            || self.rules.iter().any(|(g, v)| {
                v.has(Verb::Read) && matches!(g, Granted::Topic(f) if filter::contains(f, sub))
            })
    }
}
