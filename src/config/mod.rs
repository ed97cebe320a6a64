//! The configuration file: read, validated, typed.
//!
//! [`load`] reads the YAML file named by `--config` (and every file it
//! `!include`s), checks every rule of RFC 0002 "Validation", and returns a
//! [`Config`] - or a [`ConfigError`] holding every finding at once, each
//! naming the file, the line, the key and what to write instead:
//!
//! ```text
//! configuration is invalid:
//! saguin.yaml:
//!   - line 3: broker.log_level "verbose": it is one of debug, info, warn or error; omit the key for info
//! ```
//!
//! For the command line: [`summary`] is `--check-config`'s "ok" text,
//! [`render`] is `--output` (a document that loads again unchanged),
//! [`Config::check_files`] opens every file the configuration names, and
//! [`Config::notes`] holds what `--check-config` says without failing.
//! `--route` is [`crate::routing`].
//!
//! # How it reads
//! `node` parses YAML into a tree that keeps each value's line and tag;
//! the readers in this module's files walk it key by key (`walk::Fields`),
//! so an unknown key, a key written twice and a bad value are each a
//! finding and reading carries on - one load reports everything.
//!
//! # Why serde-saphyr, and how it is used
//! serde_yaml is archived; its API-compatible forks carry no positions and
//! keep the last of a duplicated key silently. serde-saphyr 2.2 gives a
//! line for any value (`Spanned<T>`), exposes tags (`Tagged<T>`) so
//! `!include` can be accepted exactly where the spec allows it, and can
//! hand duplicate keys to the caller (`DuplicateKeyPolicy::PassThrough`),
//! which is how both lines of a key written twice are named. Its own
//! `include` feature is not enabled: it would allow `!include` anywhere.
//! A derived `Deserialize` for the typed configuration was not used because
//! it stops at the first error and cannot say what to write instead.
//!
//! # Architecture invariant
//! Only `config` knows YAML (and only `config::node` knows serde-saphyr).
//! A validated `Config` is a different type from the YAML: nothing past the
//! loader sees a brace, a `none`, a unit suffix or an `!include`. Durations
//! are `std::time::Duration`, sizes are byte counts, and every default is
//! applied before `load` returns. Channels are sorted by name: the file's
//! order decides nothing.

pub mod acl;
mod address;
mod blocks;
mod bridges;
mod channels;
mod error;
mod include;
mod limits;
mod listen;
mod node;
pub mod page_origin;
mod render;
mod storage;
mod units;
mod walk;

use std::path::{Path, PathBuf};

pub use address::ListenAddress;
pub use blocks::{Operations, Qos2, Retained, Session, Share};
pub use bridges::{Bridge, BridgeRule, Direction, Peer, PeerScheme};
pub use channels::{Backoff, Channel, ChannelType, QueueSettings, Retry, Start};
pub use error::{ConfigError, Finding};
pub use limits::Limits;
pub use listen::{Listeners, TcpDoor, Tls, TlsVersion, UnixDoor, WsDoor};
pub use render::{render, summary};
pub use storage::{CommitMode, MemorySettings, Provider, ProviderKind, SqliteSettings, Storage};
pub use units::{format_duration, format_size};

use node::{Kind, Node};
use walk::{Ctx, Fields};

/// Where something was defined: a file and a 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The file, as findings name it (included files relative to the master's directory).
    pub file: String,
    /// The line of its key.
    pub line: u32,
}

/// A filesystem path the configuration names, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFile {
    /// The key, e.g. `broker.mqtt.password_file`.
    pub key: String,
    /// The path as written.
    pub path: PathBuf,
    /// The configuration file it is written in.
    pub file: String,
    /// The line.
    pub line: u32,
}

/// A validated configuration: every default applied, every rule checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file `load` read, as given.
    pub source: PathBuf,
    /// The `broker:` block.
    pub broker: Broker,
    /// Every channel, sorted by name, each queue's `<name>__dlq` included
    /// (see [`Channel::dlq_of`]).
    pub channels: Vec<Channel>,
    /// Every bridge, sorted by name.
    pub bridges: Vec<Bridge>,
    /// Where `bridges:` is written, if it is: what a build that runs no bridges names
    /// when it refuses the file ([`crate::startup::refuse_unserved`]).
    pub bridges_at: Option<Origin>,
    /// What `--check-config` says without failing (an unused `$N` in a bridge topic).
    pub notes: Vec<String>,
    /// Every path the file names, for [`Config::check_files`].
    pub named_files: Vec<NamedFile>,
}

impl Config {
    /// The channel called `name`, derived dead-letter channels included.
    pub fn channel(&self, name: &str) -> Option<&Channel> {
        self.channels
            .binary_search_by(|c| c.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.channels[i])
    }

    /// Opens every file the configuration names for the broker to read -
    /// password files, the ACL file, certificates, keys and authorities -
    /// and reports every one that cannot be read, at once. Reads only.
    ///
    /// # Errors
    /// A [`ConfigError`] with one finding per unreadable file.
    pub fn check_files(&self) -> Result<(), ConfigError> {
        const READ: &[&str] = &[
            "password_file",
            "acl_file",
            "cert_file",
            "key_file",
            "client_ca_file",
            "ca_file",
        ];
        let mut findings = Vec::new();
        for nf in &self.named_files {
            let last = nf.key.rsplit('.').next().unwrap_or("");
            if !READ.contains(&last) || !nf.path.is_absolute() {
                continue;
            }
            // A directory opens like a file on Linux and fails only when it is read.
            let problem = match std::fs::File::open(&nf.path).and_then(|f| f.metadata()) {
                Err(e) => format!(
                    " cannot be read ({e}); make the file readable by the broker, or fix the path"
                ),
                Ok(m) if m.is_dir() => " is a directory; name the file in it".to_string(),
                Ok(_) => continue,
            };
            findings.push(Finding {
                file: nf.file.clone(),
                line: nf.line,
                key: nf.key.clone(),
                value: Some(format!("{:?}", nf.path.display().to_string())),
                text: problem,
            });
        }
        if findings.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::new(findings))
        }
    }
}

/// The `broker:` block.
#[derive(Debug, Clone, PartialEq)]
pub struct Broker {
    /// `broker.id`: what this broker is called. Required; never generated.
    pub id: String,
    /// `broker.log_level`. Default info.
    pub log_level: LogLevel,
    /// `broker.pid_file`: where the process writes its id, absolute; `None` for nowhere.
    pub pid_file: Option<PathBuf>,
    /// `broker.mqtt`: doors, authentication and protocol versions.
    pub mqtt: Mqtt,
    /// `broker.limits`, every limit with its default applied.
    pub limits: Limits,
    /// `broker.operations`; `None` when the block is absent (no operations listener).
    pub operations: Option<Operations>,
    /// `broker.storage`: providers, the default and default retention.
    pub storage: Storage,
    /// `broker.retained`, defaults applied.
    pub retained: Retained,
    /// `broker.qos2`, defaults applied.
    pub qos2: Qos2,
    /// `broker.share`, defaults applied.
    pub share: Share,
    /// `broker.session`, defaults applied.
    pub session: Session,
}

/// `broker.log_level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Every bridge attempt and a line per record.
    Debug,
    /// Startup, listeners, sweeps, connects (the default).
    Info,
    /// Refusals, unreachable peers, and the lines that clear them.
    Warn,
    /// Only what stopped working.
    Error,
}

impl LogLevel {
    /// The `log` crate's filter for this level.
    pub fn to_level_filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Error => log::LevelFilter::Error,
        }
    }

    /// The spelling in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// `broker.mqtt.min_protocol_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProtocolVersion {
    /// MQTT 3.1.1 and 5 are admitted (the default).
    V3_1_1,
    /// MQTT 5 only; a 3.1.1 CONNECT is refused with return code 0x01.
    V5,
}

/// `broker.mqtt`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mqtt {
    /// `broker.mqtt.listen`: the MQTT doors. With none named, tcp on `:1883`.
    pub listen: Listeners,
    /// `broker.mqtt.password_file`: absolute, Mosquitto's format.
    pub password_file: Option<PathBuf>,
    /// `broker.mqtt.allow_anonymous` as written; see [`Mqtt::anonymous_allowed`].
    pub allow_anonymous: Option<bool>,
    /// `broker.mqtt.min_protocol_version`. Default 3.1.1.
    pub min_protocol_version: ProtocolVersion,
    /// `broker.mqtt.acl_file`: absolute; `None` means every client may do everything.
    pub acl_file: Option<PathBuf>,
}

impl Mqtt {
    /// The addresses of the plain-TCP MQTT doors (no `tls` block), resolved
    /// when the host is empty or an IP literal. A door whose host is a name
    /// is left out: bind [`TcpDoor::address`]`.bind_string()` for those.
    pub fn plain_tcp_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.listen
            .tcp
            .iter()
            .filter(|d| d.tls.is_none())
            .filter_map(|d| d.address.socket_addr())
            .collect()
    }

    /// Whether a client offering no user name is admitted on a door that
    /// writes neither key: `allow_anonymous` if written, else "no password file".
    pub fn anonymous_allowed(&self) -> bool {
        self.allow_anonymous.unwrap_or(self.password_file.is_none())
    }
}

/// Reads and validates the configuration file at `path`, and every file it includes.
///
/// # Errors
/// A [`ConfigError`] carrying every finding: unreadable files, YAML that does
/// not parse, unknown keys, keys written twice, and every rule of RFC 0002
/// "Validation" the file breaks.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let display = path.display().to_string();
    let text = node::read_file(path).map_err(|e| {
        ConfigError::new(vec![Finding {
            file: display.clone(),
            line: 0,
            key: "the file".into(),
            value: None,
            text: format!(" cannot be read: {e}; check the path given to --config"),
        }])
    })?;
    from_str(&text, path)
}

/// Reads a configuration from text, as though it were the file at `path`
/// (which names it in findings and anchors relative `!include`s).
///
/// # Errors
/// As [`load`].
pub fn from_str(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let mut ctx = Ctx::new(path.display().to_string());
    let root = parse_yaml(&mut ctx, text, "the file")?;
    let config = read_root(&mut ctx, &root, path);
    if ctx.findings.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::new(ctx.findings))
    }
}

/// Parses a YAML document, or fails with the one finding saying where it does
/// not parse (`what` names the file: "the file", "the acl_file").
pub(crate) fn parse_yaml(ctx: &mut Ctx, text: &str, what: &str) -> Result<Node, ConfigError> {
    node::parse(text).map_err(|e| {
        let text = format!(
            "is not valid YAML ({}); fix the syntax at that line",
            e.message
        );
        ctx.say(e.line, what, None, text);
        ConfigError::new(std::mem::take(&mut ctx.findings))
    })
}

const ROOT_KEYS: &[&str] = &["broker", "channels", "bridges"];
const BROKER_KEYS: &[&str] = &[
    "id",
    "log_level",
    "pid_file",
    "mqtt",
    "operations",
    "storage",
    "retained",
    "limits",
    "qos2",
    "share",
    "session",
];
const MQTT_KEYS: &[&str] = &[
    "listen",
    "password_file",
    "allow_anonymous",
    "min_protocol_version",
    "acl_file",
];

fn read_root(ctx: &mut Ctx, root: &Node, path: &Path) -> Config {
    include::check_tags(ctx, root, "", &["channels", "broker.storage.providers"]);
    let empty = Node {
        kind: Kind::Map(Vec::new()),
        line: root.line,
        tag: None,
    };
    let root = match root.kind {
        Kind::Map(_) | Kind::Null => root,
        _ => {
            ctx.bad(root, "the file", "is not a mapping; write a broker: block, and channels: and bridges: where there are any");
            &empty
        }
    };
    let mut f = Fields::open(ctx, root, "", ROOT_KEYS);
    let null = Node {
        kind: Kind::Null,
        line: 0,
        tag: None,
    };
    let broker_node = f.take("broker");
    if broker_node.is_none() {
        ctx.say(
            0,
            "broker",
            None,
            "is missing; write a broker: block with at least id: and storage:",
        );
    }
    let mut doors = Vec::new();
    let broker = read_broker(ctx, broker_node.unwrap_or(&null), path, &mut doors);
    let channels = match f.take("channels") {
        Some(n) => channels::read(ctx, n, path, &broker.storage, &broker.limits),
        None => Vec::new(),
    };
    let bridges_at = f.key_line("bridges").map(|line| Origin {
        file: path.display().to_string(),
        line,
    });
    let bridges = match f.take("bridges") {
        Some(n) => bridges::read(ctx, n, &broker.limits),
        None => Vec::new(),
    };
    let mut notes = render::substitution_notes(&channels, &bridges);
    f.finish(ctx);
    address::check_binds(ctx, &doors);
    notes.append(&mut ctx.notes);
    for p in broker.storage.providers.keys() {
        let named = channels.iter().any(|c| &c.storage == p)
            || &broker.retained.storage == p
            || &broker.session.storage == p;
        if !named {
            notes.push(format!(
                "provider {p} is named by no channel, nor by broker.retained or broker.session: it is inert, and nothing is created for it"
            ));
        }
    }
    Config {
        source: path.to_path_buf(),
        broker,
        channels,
        bridges,
        bridges_at,
        notes,
        named_files: std::mem::take(&mut ctx.paths),
    }
}

fn read_broker(
    ctx: &mut Ctx,
    node: &Node,
    path: &Path,
    doors: &mut Vec<listen::DoorLine>,
) -> Broker {
    let mut f = Fields::open(ctx, node, "broker", BROKER_KEYS);
    let id = match f.take("id") {
        Some(n) => {
            match walk::string(ctx, n, "broker.id") {
                Some(s) if s.trim().is_empty() => {
                    ctx.bad(n, "broker.id", "is empty; write the name this broker's log lines should carry, such as edge-1");
                    s
                }
                Some(s) => s,
                None => String::new(),
            }
        }
        None => {
            ctx.say(f.line, "broker.id", None, "is missing and has no default; write the name this broker's log lines should carry, such as id: edge-1");
            String::new()
        }
    };
    let log_level = match f.take("log_level") {
        None => LogLevel::Info,
        Some(n) => match n.scalar_text().as_deref() {
            Some("debug") => LogLevel::Debug,
            Some("info") => LogLevel::Info,
            Some("warn") => LogLevel::Warn,
            Some("error") => LogLevel::Error,
            _ => {
                ctx.bad(
                    n,
                    "broker.log_level",
                    "it is one of debug, info, warn or error; omit the key for info",
                );
                LogLevel::Info
            }
        },
    };
    let pid_file = f
        .take("pid_file")
        .and_then(|n| walk::abs_path(ctx, n, "broker.pid_file"));
    let limits = match f.take("limits") {
        Some(n) => {
            let fields = Fields::open(ctx, n, "broker.limits", limits::KEYS);
            limits::read(ctx, fields)
        }
        None => limits::read(ctx, Fields::empty("broker.limits", limits::KEYS)),
    };
    let mqtt = read_mqtt(ctx, f.take("mqtt"), doors);
    let operations = f.take("operations").map(|n| {
        let (ops, ops_doors) = blocks::operations(ctx, n);
        doors.extend(ops_doors);
        ops
    });
    let storage = storage::read(ctx, f.take("storage"), f.line, path, &limits);
    let retained = blocks::retained(ctx, f.take("retained"), &storage);
    let qos2 = blocks::qos2(ctx, f.take("qos2"));
    let share = blocks::share(ctx, f.take("share"));
    let session = blocks::session(ctx, f.take("session"), &storage);
    f.finish(ctx);
    Broker {
        id,
        log_level,
        pid_file,
        mqtt,
        limits,
        operations,
        storage,
        retained,
        qos2,
        share,
        session,
    }
}

fn read_mqtt(ctx: &mut Ctx, node: Option<&Node>, doors: &mut Vec<listen::DoorLine>) -> Mqtt {
    let null = Node {
        kind: Kind::Null,
        line: 0,
        tag: None,
    };
    let node = node.unwrap_or(&null);
    let mut f = Fields::open(ctx, node, "broker.mqtt", MQTT_KEYS);
    let listen_node = f.take("listen");
    let (mut listen, mqtt_doors) =
        listen::read(ctx, listen_node, "broker.mqtt.listen", listen::Block::Mqtt);
    if listen.tcp.is_empty() && listen.ws.is_empty() && listen.unix.is_empty() {
        if let Some(n) = listen_node.filter(|n| !matches!(n.kind, Kind::Null)) {
            if ctx
                .findings
                .iter()
                .all(|x| !x.key.starts_with("broker.mqtt.listen"))
            {
                ctx.say(
                    n.line,
                    "broker.mqtt.listen",
                    None,
                    "names no door; write tcp:, ws: or unix:, or remove listen: for tcp on :1883",
                );
            }
        } else {
            listen = Listeners::default_mqtt();
            // Written nowhere, and bound all the same: another door on :1883 clashes.
            doors.extend(listen.tcp.iter().map(|door| {
                listen::DoorLine {
                    name: door.name.clone(),
                    bind: Some(listen::Bind::Tcp(door.address.clone())),
                    bind_line: 0,
                    path:
                        "the default MQTT door (tcp on :1883, as broker.mqtt.listen is not written)"
                            .into(),
                    line: 0,
                    file: ctx.file.clone(),
                }
            }));
        }
    }
    doors.extend(mqtt_doors.iter().cloned());
    let password_file = f
        .take("password_file")
        .and_then(|n| walk::abs_path(ctx, n, "broker.mqtt.password_file"));
    let allow_anonymous = f
        .take("allow_anonymous")
        .and_then(|n| walk::boolean(ctx, n, "broker.mqtt.allow_anonymous"));
    let min_protocol_version = match f.take("min_protocol_version") {
        None => ProtocolVersion::V3_1_1,
        Some(n) => match n.scalar_text().as_deref() {
            Some("3.1.1") => ProtocolVersion::V3_1_1,
            Some("5") => ProtocolVersion::V5,
            _ => {
                ctx.bad(
                    n,
                    "broker.mqtt.min_protocol_version",
                    "it is \"3.1.1\" or 5; omit the key for 3.1.1",
                );
                ProtocolVersion::V3_1_1
            }
        },
    };
    let acl_node = f.take("acl_file");
    let acl_file = acl_node.and_then(|n| walk::abs_path(ctx, n, "broker.mqtt.acl_file"));
    let anon_line = f.key_line("allow_anonymous");
    f.finish(ctx);
    let mqtt = Mqtt {
        listen,
        password_file,
        allow_anonymous,
        min_protocol_version,
        acl_file,
    };
    check_auth(
        ctx,
        &mqtt,
        &mqtt_doors,
        acl_node.map(|n| n.line),
        anon_line.unwrap_or(node.line),
    );
    mqtt
}

/// The authentication rules that span the broker and its doors.
fn check_auth(
    ctx: &mut Ctx,
    m: &Mqtt,
    doors: &[listen::DoorLine],
    acl_line: Option<u32>,
    anon_line: u32,
) {
    // (door path, line, own password file, own allow_anonymous, names a client CA, requires a certificate)
    let mut each: Vec<(String, u32, bool, Option<bool>, bool, bool)> = Vec::new();
    let line_of = |name: &str, kind: &str| {
        doors
            .iter()
            .find(|d| d.name == name && d.path.contains(kind))
            .map(|d| (d.path.clone(), d.line))
            .unwrap_or_default()
    };
    // tcp and ws doors carry the same authentication keys.
    let tls_keys =
        |name: &str, kind: &str, password_file: bool, anon: Option<bool>, tls: Option<&Tls>| {
            let (p, l) = line_of(name, kind);
            let names_ca = tls.is_some_and(|t| t.client_ca_file.is_some());
            (
                p,
                l,
                password_file,
                anon,
                names_ca,
                names_ca && tls.is_some_and(|t| t.require_certificate),
            )
        };
    for d in &m.listen.tcp {
        each.push(tls_keys(
            &d.name,
            "tcp",
            d.password_file.is_some(),
            d.allow_anonymous,
            d.tls.as_ref(),
        ));
    }
    for d in &m.listen.ws {
        each.push(tls_keys(
            &d.name,
            "ws",
            d.password_file.is_some(),
            d.allow_anonymous,
            d.tls.as_ref(),
        ));
    }
    for d in &m.listen.unix {
        let (p, l) = line_of(&d.name, "unix");
        each.push((
            p,
            l,
            d.password_file.is_some(),
            d.allow_anonymous,
            false,
            false,
        ));
    }
    for (path, line, own_file, own_anon, client_ca, _) in &each {
        let has_file = *own_file || m.password_file.is_some();
        let anon = if *own_file {
            *own_anon
        } else {
            own_anon.or(m.allow_anonymous)
        };
        if anon == Some(false) && !has_file && !client_ca {
            let key = if own_anon.is_some() {
                format!("{path}.allow_anonymous")
            } else {
                "broker.mqtt.allow_anonymous".into()
            };
            let l = if own_anon.is_some() { *line } else { anon_line };
            ctx.say(l, &key, Some("false".into()), "with no password file is a broker nothing can connect to; name a password_file, or remove the key");
        }
    }
    if let Some(acl_line) = acl_line {
        let authenticates = m.password_file.is_some() || each.iter().any(|e| e.2 || e.4);
        if !authenticates {
            ctx.say(acl_line, "broker.mqtt.acl_file", None, "is refused: nothing authenticates clients, so every rule would be about anonymous users; name a password_file or give a listener tls.client_ca_file");
        }
        if m.allow_anonymous == Some(true) {
            ctx.say(anon_line, "broker.mqtt.allow_anonymous", Some("true".into()), "is refused beside an acl_file: the ACL names users, and an anonymous client has none; remove it");
        }
        for (path, line, own_file, own_anon, _, requires_cert) in &each {
            if !own_file && m.password_file.is_none() && !requires_cert {
                ctx.notes.push(format!(
                    "{path} (line {line}) has no password file and does not require a client certificate, so beside the acl_file it admits clients nothing identifies - their name is empty and a * pattern under users: matches it"
                ));
            }
            if *own_anon == Some(true) {
                ctx.say(*line, &format!("{path}.allow_anonymous"), Some("true".into()), "is refused beside an acl_file: the ACL names users, and an anonymous client has none; remove it");
            }
        }
    }
}
