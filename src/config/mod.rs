//! The configuration file: read, validated, typed.
//!
//! [`load`] reads the YAML file named by `--config` (and every file it
//! `!include`s), checks every rule of RFC 0002 "Validation", and returns a
//! [`Config`] - or a [`ConfigError`] holding every finding at once, each
//! naming the file, the line, the key and what to write instead.
//!
//! How it works: [`node`] parses YAML (serde-saphyr, the only module that
//! knows YAML) into a tree that keeps each value's line and tag. The readers
//! in this module walk that tree key by key, so an unknown key, a key
//! written twice and a bad value are each a finding and reading carries on.
//! A validated `Config` is a different type from the YAML: nothing past the
//! loader sees a brace, a `none` or an `!include`.
//!
//! # Architecture invariant
//! Only `config` knows YAML. Durations are `std::time::Duration`, sizes are
//! byte counts, and every default is applied before `load` returns.

mod error;
mod limits;
mod listen;
mod node;
mod units;
mod walk;

use std::path::{Path, PathBuf};

pub use error::{ConfigError, Finding};
pub use limits::Limits;
pub use listen::{ListenAddress, Listeners, TcpDoor, Tls, TlsVersion, UnixDoor, WsDoor};
pub use units::{format_duration, format_size};

use node::Node;
use walk::{Ctx, Fields};

/// A validated configuration: every default applied, every rule checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file `load` read, as given.
    pub source: PathBuf,
    /// The `broker:` block.
    pub broker: Broker,
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
    let text = std::fs::read_to_string(path).map_err(|e| {
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
    let root = match node::parse(text) {
        Ok(n) => n,
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
            return Err(ConfigError::new(ctx.findings));
        }
    };
    let config = read_root(&mut ctx, &root, path);
    if ctx.findings.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::new(ctx.findings))
    }
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
    let mut f = Fields::open(ctx, root, "", ROOT_KEYS);
    let broker = match f.take("broker") {
        Some(n) => read_broker(ctx, n),
        None => {
            ctx.say(
                0,
                "broker",
                None,
                "is missing; write a broker: block with at least id:",
            );
            read_broker(
                ctx,
                &Node {
                    kind: node::Kind::Null,
                    line: 0,
                    tag: None,
                },
            )
        }
    };
    // Channels and bridges are read by their own modules (see issue 3, part 2).
    let _ = f.take("channels");
    let _ = f.take("bridges");
    f.finish(ctx);
    Config {
        source: path.to_path_buf(),
        broker,
    }
}

fn read_broker(ctx: &mut Ctx, node: &Node) -> Broker {
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
    let mqtt = read_mqtt(ctx, f.take("mqtt"));
    let limits = match f.take("limits") {
        Some(n) => {
            let fields = Fields::open(ctx, n, "broker.limits", limits::KEYS);
            limits::read(ctx, fields)
        }
        None => limits::read(ctx, Fields::empty("broker.limits", limits::KEYS)),
    };
    for key in [
        "operations",
        "storage",
        "retained",
        "qos2",
        "share",
        "session",
    ] {
        let _ = f.take(key);
    }
    f.finish(ctx);
    Broker {
        id,
        log_level,
        pid_file,
        mqtt,
        limits,
    }
}

fn read_mqtt(ctx: &mut Ctx, node: Option<&Node>) -> Mqtt {
    let null = Node {
        kind: node::Kind::Null,
        line: 0,
        tag: None,
    };
    let mut f = Fields::open(ctx, node.unwrap_or(&null), "broker.mqtt", MQTT_KEYS);
    let listen_node = f.take("listen");
    let (mut listen, _doors) =
        listen::read(ctx, listen_node, "broker.mqtt.listen", listen::Block::Mqtt);
    if listen.tcp.is_empty() && listen.ws.is_empty() && listen.unix.is_empty() {
        listen = Listeners::default_mqtt();
    }
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
    let acl_file = f
        .take("acl_file")
        .and_then(|n| walk::abs_path(ctx, n, "broker.mqtt.acl_file"));
    f.finish(ctx);
    Mqtt {
        listen,
        password_file,
        allow_anonymous,
        min_protocol_version,
        acl_file,
    }
}
