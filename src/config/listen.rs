//! Listener blocks: `broker.mqtt.listen` and `broker.operations.listen`.
//!
//! A kind with one door is a mapping named after its kind; a kind with
//! several is a list whose entries carry a `name`.

use std::path::PathBuf;

use super::address::{ListenAddress, address};
use super::node::{Kind, Node};
use super::walk::{self, Ctx, Fields};

/// TLS on a tcp or ws door (or an operations tcp door).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// The certificate chain served, absolute.
    pub cert_file: PathBuf,
    /// Its private key, absolute.
    pub key_file: PathBuf,
    /// Authorities trusted for client certificates; present means mutual TLS.
    pub client_ca_file: Option<PathBuf>,
    /// Whether every client must present a certificate (only with client_ca_file; default true there).
    pub require_certificate: bool,
    /// The lowest TLS version accepted. Default 1.2.
    pub min_version: TlsVersion,
}

impl Tls {
    /// Whether every client must present a certificate the client CA verifies: the
    /// one TLS setting that authenticates somebody (`require_certificate: false`
    /// and a block with no `client_ca_file` do not, B-362).
    pub fn requires_certificate(&self) -> bool {
        self.client_ca_file.is_some() && self.require_certificate
    }
}

/// `tls.min_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2 (the default).
    V1_2,
    /// TLS 1.3.
    V1_3,
}

/// An MQTT door over TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpDoor {
    /// The door's name: its kind for a single mapping, else its `name:`.
    pub name: String,
    /// Where it listens.
    pub address: ListenAddress,
    /// TLS, when the door carries a `tls` block.
    pub tls: Option<Tls>,
    /// This door's own password file, which wins over broker.mqtt.password_file.
    pub password_file: Option<PathBuf>,
    /// This door's own allow_anonymous, which wins over the broker's.
    pub allow_anonymous: Option<bool>,
}

/// An MQTT door over WebSocket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsDoor {
    /// The door's name.
    pub name: String,
    /// Where it listens.
    pub address: ListenAddress,
    /// TLS, when the door carries a `tls` block.
    pub tls: Option<Tls>,
    /// This door's own password file.
    pub password_file: Option<PathBuf>,
    /// This door's own allow_anonymous.
    pub allow_anonymous: Option<bool>,
    /// A page's origin must be the request's own. Default true.
    pub same_origin: bool,
    /// Origins admitted (`scheme://host[:port]`); empty checks nothing.
    pub allowed_origins: Vec<String>,
}

/// A door on a Unix socket (MQTT or operations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixDoor {
    /// The door's name.
    pub name: String,
    /// The socket's path (absolute), or an abstract name beginning with `@`.
    pub path: PathBuf,
    /// The socket file's permissions. Default 0o660.
    pub mode: u32,
    /// Read a PROXY v2 header from every connection. Default false.
    pub proxy_protocol: bool,
    /// This door's own password file.
    pub password_file: Option<PathBuf>,
    /// This door's own allow_anonymous (always `None` on an operations door).
    pub allow_anonymous: Option<bool>,
}

/// The doors of one listener block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listeners {
    /// TCP doors.
    pub tcp: Vec<TcpDoor>,
    /// WebSocket doors (always empty for the operations listener).
    pub ws: Vec<WsDoor>,
    /// Unix socket doors.
    pub unix: Vec<UnixDoor>,
    /// True when nothing was written and the default `tcp :1883` was applied.
    pub defaulted: bool,
}

impl Listeners {
    /// The default when no MQTT listener is named: tcp on `:1883`, every interface.
    pub fn default_mqtt() -> Self {
        Listeners {
            tcp: vec![TcpDoor {
                name: "tcp".into(),
                address: ListenAddress {
                    host: String::new(),
                    port: 1883,
                    written: ":1883".into(),
                },
                tls: None,
                password_file: None,
                allow_anonymous: None,
            }],
            ws: Vec::new(),
            unix: Vec::new(),
            defaulted: true,
        }
    }
}

/// Which listener block is being read: the keys differ.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Block {
    Mqtt,
    Operations,
}

const TCP_MQTT: &[&str] = &["name", "address", "tls", "password_file", "allow_anonymous"];
const WS_MQTT: &[&str] = &[
    "name",
    "address",
    "tls",
    "password_file",
    "allow_anonymous",
    "same_origin",
    "allowed_origins",
];
const UNIX_MQTT: &[&str] = &[
    "name",
    "path",
    "mode",
    "proxy_protocol",
    "password_file",
    "allow_anonymous",
];
const TCP_OPS: &[&str] = &["name", "address", "tls", "password_file"];
const UNIX_OPS: &[&str] = &["name", "path", "mode", "proxy_protocol", "password_file"];
const TLS_KEYS: &[&str] = &[
    "cert_file",
    "key_file",
    "client_ca_file",
    "require_certificate",
    "min_version",
];

/// Reads a `listen` block. `written` is false when the block is absent.
pub(crate) fn read(
    ctx: &mut Ctx,
    node: Option<&Node>,
    path: &str,
    block: Block,
) -> (Listeners, Vec<DoorLine>) {
    let kinds: &'static [&'static str] = match block {
        Block::Mqtt => &["tcp", "ws", "unix"],
        Block::Operations => &["tcp", "unix"],
    };
    let mut out = Listeners::default();
    let mut lines = Vec::new();
    let Some(node) = node else {
        return (out, lines);
    };
    let mut f = Fields::open(ctx, node, path, kinds);
    for kind in kinds {
        let Some(n) = f.take(kind) else { continue };
        let kpath = f.path(kind);
        let entries: Vec<(Option<usize>, &Node)> = match &n.kind {
            Kind::Seq(items) => items
                .iter()
                .enumerate()
                .map(|(i, x)| (Some(i), x))
                .collect(),
            _ => vec![(None, n)],
        };
        let listed = entries.len() > 1;
        let first = lines.len();
        let mut nameless = Vec::new();
        for (idx, door) in entries {
            let dpath = match idx {
                Some(i) => format!("{kpath}[{i}]"),
                None => kpath.clone(),
            };
            if !read_door(ctx, door, &dpath, kind, listed, block, &mut out, &mut lines) {
                nameless.push(lines.len() - 1);
            }
        }
        refuse_nameless(ctx, kind, &lines[first..], &nameless, first);
    }
    f.finish(ctx);
    check_names(ctx, &lines);
    (out, lines)
}

/// Where a door was written, for findings that compare doors.
#[derive(Debug, Clone)]
pub(crate) struct DoorLine {
    pub name: String,
    /// What the door binds: a TCP address or a Unix path.
    pub bind: Option<Bind>,
    /// The line of its address or path.
    pub bind_line: u32,
    pub path: String,
    pub line: u32,
    pub file: String,
}

/// What a door binds, for clash checks across listeners.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    Tcp(ListenAddress),
    Unix(PathBuf),
}

/// A door written without a name among several of its kind, quoting the others
/// (B-176): which name is whose is what the finding asks the operator to settle.
fn refuse_nameless(
    ctx: &mut Ctx,
    kind: &str,
    doors: &[DoorLine],
    nameless: &[usize],
    first: usize,
) {
    for &at in nameless {
        let door = &doors[at - first];
        let others: Vec<String> = doors
            .iter()
            .filter(|d| d.path != door.path)
            .map(|d| match d.name.as_str() {
                "" => format!("{} (line {}, no name either)", d.path, d.line),
                name => format!("{} (line {}, named {name:?})", d.path, d.line),
            })
            .collect();
        let text = format!(
            "is one of several {kind} doors and has no name, beside {}; write `name:` with a name unique across the listener's doors",
            others.join(" and ")
        );
        ctx.say(door.line, &door.path, None, text);
    }
}

/// Two doors of one listener sharing a name, each named with its line.
pub(crate) fn check_names(ctx: &mut Ctx, doors: &[DoorLine]) {
    for (i, door) in doors.iter().enumerate() {
        if door.name.is_empty() {
            continue;
        }
        if let Some(first) = doors[..i].iter().find(|d| d.name == door.name) {
            let text = format!(
                "is named {:?}, as {} ({} line {}) is; give each door of this listener its own name",
                door.name, first.path, first.file, first.line
            );
            let saved = std::mem::replace(&mut ctx.file, door.file.clone());
            ctx.say(door.line, &door.path, None, text);
            ctx.file = saved;
        }
    }
}

/// Reads one door into `out` and `lines`; false if it is one of several of its kind
/// and written without a name.
#[allow(clippy::too_many_arguments)]
fn read_door(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    kind: &'static str,
    listed: bool,
    block: Block,
    out: &mut Listeners,
    lines: &mut Vec<DoorLine>,
) -> bool {
    let known = match (block, kind) {
        (Block::Mqtt, "tcp") => TCP_MQTT,
        (Block::Mqtt, "ws") => WS_MQTT,
        (Block::Mqtt, _) => UNIX_MQTT,
        (Block::Operations, "tcp") => TCP_OPS,
        (Block::Operations, _) => UNIX_OPS,
    };
    let mut f = Fields::open(ctx, node, path, known);
    let named = f.has("name") || !listed;
    let name = match f.take("name") {
        Some(n) => {
            let name = walk::string(ctx, n, &f.path("name")).unwrap_or_default();
            // Doors are told apart by name (at a re-read too): a blank one names none.
            if name.trim().is_empty() {
                let text = "is empty; give the door a name unique across the listener's doors";
                ctx.say(n.line, &f.path("name"), None, text);
            }
            name
        }
        // Refused by the caller, which knows the other doors (B-176).
        None if listed => String::new(),
        None => kind.to_string(),
    };
    let password_file = f
        .take("password_file")
        .and_then(|n| walk::abs_path(ctx, n, &f.path("password_file")));
    let allow_anonymous = if block == Block::Operations && f.has("allow_anonymous") {
        let line = f.key_line("allow_anonymous").unwrap_or(node.line);
        ctx.say(line, &f.path("allow_anonymous"), None, "is refused on the operations listener: it would open /metrics to whoever reaches it; remove the key and give the door a password_file, a client certificate or the Unix socket");
        // Consume it so it is not reported a second time as unknown.
        let _ = f.take_unchecked("allow_anonymous");
        None
    } else if block == Block::Mqtt {
        f.take("allow_anonymous")
            .and_then(|n| walk::boolean(ctx, n, &f.path("allow_anonymous")))
    } else {
        None
    };
    lines.push(DoorLine {
        name: name.clone(),
        bind: None,
        bind_line: node.line,
        path: path.to_string(),
        line: node.line,
        file: ctx.file.clone(),
    });
    match kind {
        "tcp" | "ws" => {
            let address = match f.take("address") {
                Some(n) => address(ctx, n, &f.path("address")),
                None => {
                    ctx.say(node.line, &f.path("address"), None, "is missing; a listener block with no address is a mistake rather than a default; write host:port, such as 0.0.0.0:1883");
                    None
                }
            };
            let tls = f.take("tls").and_then(|n| tls(ctx, n, &f.path("tls")));
            if let (Some(a), Some(l)) = (&address, lines.last_mut()) {
                l.bind = Some(Bind::Tcp(a.clone()));
                l.bind_line = f.key_line("address").unwrap_or(l.line);
            }
            let address = address.unwrap_or(ListenAddress {
                host: String::new(),
                port: 0,
                written: String::new(),
            });
            if kind == "tcp" {
                out.tcp.push(TcpDoor {
                    name,
                    address,
                    tls,
                    password_file,
                    allow_anonymous,
                });
            } else {
                let same_origin = f
                    .take("same_origin")
                    .and_then(|n| walk::boolean(ctx, n, &f.path("same_origin")))
                    .unwrap_or(true);
                let allowed_origins = f
                    .take("allowed_origins")
                    .map(|n| origins(ctx, n, &f.path("allowed_origins")))
                    .unwrap_or_default();
                out.ws.push(WsDoor {
                    name,
                    address,
                    tls,
                    password_file,
                    allow_anonymous,
                    same_origin,
                    allowed_origins,
                });
            }
        }
        _ => {
            let path_v = match f.take("path") {
                Some(n) => unix_path(ctx, n, &f.path("path")),
                None => {
                    ctx.say(node.line, &f.path("path"), None, "is missing; a Unix socket with no path is a mistake rather than a default; write an absolute path, such as /run/saguin/saguin.sock");
                    None
                }
            };
            if let (Some(p), Some(l)) = (&path_v, lines.last_mut()) {
                l.bind = Some(Bind::Unix(p.clone()));
                l.bind_line = f.key_line("path").unwrap_or(l.line);
            }
            let mode = f
                .take("mode")
                .and_then(|n| mode(ctx, n, &f.path("mode")))
                .unwrap_or(0o660);
            let proxy_protocol = f
                .take("proxy_protocol")
                .and_then(|n| walk::boolean(ctx, n, &f.path("proxy_protocol")))
                .unwrap_or(false);
            out.unix.push(UnixDoor {
                name,
                path: path_v.unwrap_or_default(),
                mode,
                proxy_protocol,
                password_file,
                allow_anonymous,
            });
        }
    }
    f.finish(ctx);
    named
}

fn tls(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Tls> {
    let mut f = Fields::open(ctx, node, path, TLS_KEYS);
    let cert = f
        .take("cert_file")
        .and_then(|n| walk::abs_path(ctx, n, &f.path("cert_file")));
    let key = f
        .take("key_file")
        .and_then(|n| walk::abs_path(ctx, n, &f.path("key_file")));
    for (k, v) in [("cert_file", &cert), ("key_file", &key)] {
        if v.is_none() && !f.has(k) {
            ctx.say(
                node.line,
                &f.path(k),
                None,
                "is missing; a tls block names both cert_file and key_file, as absolute paths",
            );
        }
    }
    let client_ca_file = f
        .take("client_ca_file")
        .and_then(|n| walk::abs_path(ctx, n, &f.path("client_ca_file")));
    let require = f
        .take("require_certificate")
        .map(|n| (n, walk::boolean(ctx, n, &f.path("require_certificate"))));
    if let (Some((n, _)), None) = (&require, &client_ca_file)
        && !f.has("client_ca_file")
    {
        ctx.bad(n, &f.path("require_certificate"), "names no authority to check certificates against, so nothing would be demanded; write client_ca_file beside it, or remove the key");
    }
    let min_version = match f.take("min_version") {
        None => TlsVersion::V1_2,
        Some(n) => match n.scalar_text().as_deref() {
            Some("1.2") => TlsVersion::V1_2,
            Some("1.3") => TlsVersion::V1_3,
            _ => {
                ctx.bad(
                    n,
                    &f.path("min_version"),
                    "is 1.2 or 1.3; omit the key for 1.2",
                );
                TlsVersion::V1_2
            }
        },
    };
    f.finish(ctx);
    Some(Tls {
        cert_file: cert?,
        key_file: key?,
        client_ca_file,
        require_certificate: require.and_then(|(_, b)| b).unwrap_or(true),
        min_version,
    })
}

fn origins(ctx: &mut Ctx, node: &Node, path: &str) -> Vec<String> {
    let Kind::Seq(items) = &node.kind else {
        ctx.bad(
            node,
            path,
            "is a list of origins, such as [https://dashboard.example.com]",
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let key = format!("{path}[{i}]");
        let Some(s) = walk::string(ctx, item, &key) else {
            continue;
        };
        match check_origin(&s) {
            Ok(()) => out.push(s),
            Err(e) => ctx.bad(item, &key, e),
        }
    }
    out
}

fn check_origin(s: &str) -> Result<(), &'static str> {
    if s == "null" {
        return Err("cannot be listed: a sandboxed frame on any site sends it; remove it");
    }
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err("is not an origin; write scheme://host or scheme://host:port");
    };
    if !matches!(scheme, "http" | "https") {
        return Err("is not an origin; write http:// or https:// followed by a host");
    }
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', '*']) {
        return Err(
            "is an origin and nothing else: no path, query, user name or wildcard; write scheme://host[:port]",
        );
    }
    // What the door compares is what parses here: an entry it could not read would
    // be dropped, and an empty list admits every page.
    if super::page_origin::PageOrigin::parse(s).is_none() {
        return Err(
            "is not scheme://host[:port] with a port of 0-65535 (an IPv6 host in [brackets])",
        );
    }
    Ok(())
}

fn unix_path(ctx: &mut Ctx, node: &Node, key: &str) -> Option<PathBuf> {
    let s = walk::string(ctx, node, key)?;
    if s.contains('\0') {
        ctx.bad(node, key, "holds a NUL; write an absolute path");
        return None;
    }
    if s.starts_with('@') && s.len() > 1 {
        return Some(PathBuf::from(s));
    }
    let last = s.rsplit('/').next().unwrap_or("");
    if matches!(last, "" | "." | "..") {
        ctx.bad(
            node,
            key,
            "does not end in a file name; write a path such as /run/saguin/saguin.sock",
        );
        return None;
    }
    walk::abs_path(ctx, node, key)
}

fn mode(ctx: &mut Ctx, node: &Node, key: &str) -> Option<u32> {
    let text = node.scalar_text().unwrap_or_default();
    let ok = (3..=4).contains(&text.len()) && text.chars().all(|c| ('0'..='7').contains(&c));
    match u32::from_str_radix(&text, 8) {
        Ok(m) if ok && matches!(node.kind, Kind::Str(_)) => Some(m),
        _ => {
            ctx.bad(
                node,
                key,
                "is an octal mode written as a quoted string, such as \"0660\"",
            );
            None
        }
    }
}
