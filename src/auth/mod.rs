//! Who may connect: each door's [`Gate`] (its password file, whether it admits
//! clients with no user name, its TLS), and the SIGUSR1 re-read of every file a gate
//! reads ([`Reloader`]). The MQTT doors and the operations listener's doors have
//! gates of the same kind, read by one [`Gates::from_config`] and re-read by one
//! [`Reloader`]; only who counts as anonymous differs (`Files::mqtt_gate`,
//! `Files::operations_gate`).
//!
//! The decision at CONNECT, or at an operations request's `Authorization: Basic`
//! header, is [`Gate::admit`] (RFC 0002 "Who may connect", "Client certificates"):
//! 1. a verified client certificate that names somebody is the client's user name,
//!    and the password file is not consulted;
//! 2. a user name is checked against the door's password file; a wrong password and
//!    an unknown user are both refused, with 0x86 (3.1.1: 0x04), and only the log
//!    says which;
//! 3. a client with no user name, or one on a door with no file to check it against,
//!    is admitted only where the door admits anonymous clients.
//!
//! **Architecture invariant:** the files are read at startup and on SIGUSR1 only,
//! never at CONNECT; a connection checks against the copy the gate holds. A reload
//! is all-or-nothing across every password file and every certificate.

pub mod passwd;
mod password;

pub use password::{FileError, PasswordFile, Verdict};

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use crate::config::{self, Config};
use crate::server::TlsAcceptor;

/// What a door asks of a connection before it is admitted.
#[derive(Debug)]
pub struct Gate {
    /// The door's name as log lines and certificate errors give it
    /// (`broker.mqtt.listen.tcp`, `broker.mqtt.listen.tcp[fleet]`). Shared: every
    /// session through the door names it (B-175).
    pub door: Arc<str>,
    /// The password file that applies here: the door's own, else the broker's.
    pub passwords: Option<Rc<RefCell<PasswordFile>>>,
    /// Whether a client offering no user name is admitted.
    pub anonymous: bool,
    /// The door's TLS, when it carries a `tls` block.
    pub tls: Option<Rc<TlsAcceptor>>,
    /// Every connection opens with a PROXY v2 header (`proxy_protocol`, Unix doors
    /// only), whose SSL TLV may name the client as a certificate would
    /// (`crate::server::proxy`).
    pub proxy: bool,
    /// The acl_file the broker holds, on MQTT doors when one is configured: asked
    /// at CONNECT for `client_ids:` and the Will, then by the connection.
    pub acl: Option<Rc<crate::acl::Acl>>,
}

/// Who an admitted client is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Nobody: no user name, or none this door checks.
    Anonymous,
    /// A user the password file names, whose password matched.
    User(String),
    /// The name of a verified client certificate.
    Certificate(String),
}

/// Why a client is refused 0x86: what the log says and the wire does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No user name, on a door that admits nobody anonymous.
    Missing,
    /// A user name on a door with no password file, where anonymous clients are
    /// not admitted either: nothing could check it.
    Unchecked(String),
    /// A user name the password file does not hold.
    UnknownUser(String),
    /// A user the file holds, with the wrong password (or none).
    WrongPassword(String),
    /// A certificate name holding U+0000 or a control character.
    ControlCharacter,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Missing => f.write_str(
                "no user name, and this door does not admit anonymous clients (allow_anonymous)",
            ),
            Refusal::Unchecked(u) => write!(
                f,
                "user name {u:?} on a door with no password file, which admits nobody anonymous"
            ),
            Refusal::UnknownUser(u) => write!(f, "user {u:?} is not in the password file"),
            Refusal::WrongPassword(u) => write!(f, "wrong password for user {u:?}"),
            Refusal::ControlCharacter => f.write_str(
                "the certificate's name holds a control character, which could rewrite a log line or pass for another name",
            ),
        }
    }
}

/// U+0000, U+0001-U+001F and U+007F-U+009F: a name holding one is nobody's.
pub fn has_control(name: &str) -> bool {
    name.chars()
        .any(|c| matches!(c, '\0'..='\u{1F}' | '\u{7F}'..='\u{9F}'))
}

impl Gate {
    /// Decides whether a CONNECT with this user name and password, over a connection
    /// whose verified certificate names `certificate`, is admitted.
    ///
    /// # Errors
    /// The [`Refusal`], every one of which is answered 0x86 (3.1.1: 0x04).
    pub fn admit(
        &self,
        username: Option<&str>,
        password: Option<&[u8]>,
        certificate: Option<&str>,
    ) -> Result<Identity, Refusal> {
        if let Some(name) = certificate {
            if has_control(name) {
                return Err(Refusal::ControlCharacter);
            }
            return Ok(Identity::Certificate(name.to_string()));
        }
        let Some(user) = username else {
            return if self.anonymous {
                Ok(Identity::Anonymous)
            } else {
                Err(Refusal::Missing)
            };
        };
        let Some(file) = &self.passwords else {
            // Nothing to authenticate against: the name is not an identity.
            return if self.anonymous {
                Ok(Identity::Anonymous)
            } else {
                Err(Refusal::Unchecked(user.to_string()))
            };
        };
        match file.borrow().check(user, password.unwrap_or_default()) {
            Verdict::Good => Ok(Identity::User(user.to_string())),
            Verdict::WrongPassword => Err(Refusal::WrongPassword(user.to_string())),
            Verdict::UnknownUser => Err(Refusal::UnknownUser(user.to_string())),
        }
    }

    /// Whether a certificate may name a client here: one this door verifies
    /// itself, or one a proxy in front of it verified.
    fn names_by_certificate(&self) -> bool {
        self.proxy || self.tls.as_ref().is_some_and(|t| t.verifies_clients())
    }

    /// Whether a client with no certificate and no password file entry may still
    /// get in: anonymous clients, or named ones a file can admit.
    fn admits_somebody_without_a_certificate(&self) -> bool {
        self.anonymous
            || self
                .passwords
                .as_ref()
                .is_some_and(|f| !f.borrow().is_empty())
    }
}

/// Decides a decoded CONNECT at `gate`: 0x86 for every [`Refusal`] (the
/// connection maps it to 0x04 for 3.1.1) - the log says which it was, the wire
/// never does (B-226). Where an acl_file is held, the admitted client is then
/// asked of it (`crate::acl::Acl::admit`): a client id its entry's `client_ids:`
/// does not admit is 0x86 too (B-270), a Will it may not publish 0x87 (B-289).
/// `Ok` carries who was admitted.
///
/// # Errors
/// The CONNACK reason code.
pub fn check_connect(
    gate: &Gate,
    connect: &mut crate::codec::Connect,
    certificate: Option<String>,
    peer: &str,
) -> Result<Admitted, u8> {
    let verdict = gate.admit(
        connect.username.as_deref(),
        connect.password.as_deref(),
        certificate.as_deref(),
    );
    let name = match verdict {
        Ok(Identity::Anonymous) => String::new(),
        Ok(Identity::User(user)) => {
            log::debug!(
                "{peer}: {:?} authenticated as {user:?} on {}",
                connect.client_id,
                gate.door
            );
            user
        }
        Ok(Identity::Certificate(name)) => {
            log::debug!(
                "{peer}: {:?} named {name:?} by its client certificate on {}",
                connect.client_id,
                gate.door
            );
            name
        }
        Err(refusal @ Refusal::ControlCharacter) => {
            log::warn!("{peer}: refused on {}: {refusal}", gate.door);
            return Err(crate::codec::reason::BAD_USER_NAME_OR_PASSWORD);
        }
        Err(refusal) => {
            log::info!(
                "{peer}: {:?} refused on {}: {refusal}",
                connect.client_id,
                gate.door
            );
            return Err(crate::codec::reason::BAD_USER_NAME_OR_PASSWORD);
        }
    };
    let Some(acl) = &gate.acl else {
        return Ok(Admitted {
            user: name,
            principal: None,
        });
    };
    match acl.admit(&name, connect) {
        Ok(principal) => Ok(Admitted {
            user: name,
            principal: Some(Rc::new(principal)),
        }),
        Err((code, why)) => {
            log::info!(
                "{peer}: {:?} (user {name:?}) refused on {} by the acl_file: {why}",
                connect.client_id,
                gate.door
            );
            Err(code)
        }
    }
}

/// A client [`check_connect`] admitted.
#[derive(Debug)]
pub struct Admitted {
    /// The name its door proved: a user name, a certificate's; empty for anonymous.
    pub user: String,
    /// Its standing under the acl_file, when one is held.
    pub principal: Option<Rc<crate::acl::Principal>>,
}

/// The gates of every door, in the order the configuration lists them: the MQTT
/// doors' and the operations listener's, read together so one [`Reloader`] re-reads
/// all their files.
#[derive(Debug)]
pub struct Gates {
    /// One per `broker.mqtt.listen.tcp` door.
    pub tcp: Vec<Rc<Gate>>,
    /// One per `broker.mqtt.listen.unix` door.
    pub unix: Vec<Rc<Gate>>,
    /// One per `broker.mqtt.listen.ws` door, with the pages it admits (re-read on
    /// SIGUSR1 from the configuration itself, by the caller that re-reads it).
    pub ws: Vec<(Rc<Gate>, Rc<crate::server::OriginPolicy>)>,
    /// One per `broker.operations.listen.tcp` door.
    pub ops_tcp: Vec<Rc<Gate>>,
    /// One per `broker.operations.listen.unix` door.
    pub ops_unix: Vec<Rc<Gate>>,
    /// What SIGUSR1 re-reads.
    pub reloader: Reloader,
}

/// Where the MQTT doors are configured, for their names.
const MQTT_LISTEN: &str = "broker.mqtt.listen";
/// Where the operations doors are configured.
const OPS_LISTEN: &str = "broker.operations.listen";

/// The name B-175 gives a door: its kind alone for the mapping form, the kind and
/// the name in brackets for one of several (`listen` is where its block is).
fn door_name(listen: &str, kind: &str, name: &str) -> String {
    if name == kind {
        format!("{listen}.{kind}")
    } else {
        format!("{listen}.{kind}[{name}]")
    }
}

/// What reading the gates' files found wrong, each finding once however many doors
/// name its file: all of them are reported, not the first (B-480).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings(pub Vec<String>);

impl Findings {
    fn add(&mut self, finding: String) {
        if !self.0.contains(&finding) {
            self.0.push(finding);
        }
    }
}

impl std::fmt::Display for Findings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("\n  - "))
    }
}

/// The files the gates read, each once however many doors name it: what the
/// [`Reloader`] re-reads. A file that does not read is a finding, and the gates
/// built meanwhile are never served.
#[derive(Default)]
struct Files {
    passwords: Vec<Rc<RefCell<PasswordFile>>>,
    certificates: Vec<(config::Tls, Rc<TlsAcceptor>)>,
    acl: Option<Rc<crate::acl::Acl>>,
    found: Findings,
}

impl Files {
    /// The password file at `path`, read at its first mention.
    fn passwords(&mut self, path: &Path) -> Option<Rc<RefCell<PasswordFile>>> {
        if let Some(f) = self.passwords.iter().find(|f| f.borrow().path() == path) {
            return Some(f.clone());
        }
        let loaded = match PasswordFile::load(path) {
            Ok(loaded) => loaded,
            Err(e) => {
                self.found.add(e.to_string());
                return None;
            }
        };
        log::info!("password file {}: {} users", path.display(), loaded.len());
        let f = Rc::new(RefCell::new(loaded));
        self.passwords.push(f.clone());
        Some(f)
    }

    /// A door's TLS, when it carries a `tls` block.
    fn tls(&mut self, door: &str, tls: Option<&config::Tls>) -> Option<Rc<TlsAcceptor>> {
        let tls = tls?;
        match TlsAcceptor::load(door, tls) {
            Ok(acceptor) => {
                let acceptor = Rc::new(acceptor);
                self.certificates.push((tls.clone(), acceptor.clone()));
                Some(acceptor)
            }
            Err(e) => {
                self.found.add(e);
                None
            }
        }
    }

    /// An MQTT door's gate: its own file, else the broker's; anonymous clients as
    /// its own `allow_anonymous`, else the broker's, else "no file" (B-222 … B-224).
    fn mqtt_gate(
        &mut self,
        mqtt: &config::Mqtt,
        door: String,
        own_file: Option<&PathBuf>,
        own_anonymous: Option<bool>,
        tls: Option<&config::Tls>,
        proxy: bool,
    ) -> Rc<Gate> {
        let tls = self.tls(&door, tls);
        let path = own_file.or(mqtt.password_file.as_ref());
        // A door naming its own file does not inherit the broker's answer (B-222).
        let anonymous = if own_file.is_some() {
            own_anonymous.unwrap_or(false)
        } else {
            own_anonymous
                .or(mqtt.allow_anonymous)
                .unwrap_or(path.is_none())
        };
        Rc::new(Gate {
            door: door.into(),
            passwords: path.and_then(|p| self.passwords(p)),
            anonymous,
            tls,
            proxy,
            acl: self.acl.clone(),
        })
    }

    /// An operations door's gate (RFC 0002 "The operations listener"): its own file,
    /// else the block's (B-363). A door with a file or a required client certificate
    /// admits only the operators they name; one with neither authenticates nobody
    /// and admits every reader, which the configuration allows only on loopback and
    /// the Unix socket, whose permissions are then the gate (B-361).
    fn operations_gate(
        &mut self,
        ops: &config::Operations,
        door: String,
        own_file: Option<&PathBuf>,
        tls: Option<&config::Tls>,
        proxy: bool,
    ) -> Rc<Gate> {
        let path = own_file.or(ops.password_file.as_ref());
        let certificate = tls.is_some_and(config::Tls::requires_certificate);
        let tls = self.tls(&door, tls);
        Rc::new(Gate {
            door: door.into(),
            passwords: path.and_then(|p| self.passwords(p)),
            anonymous: path.is_none() && !certificate,
            tls,
            proxy,
            acl: None,
        })
    }
}

impl Gates {
    /// Reads every password file and certificate the MQTT and operations doors name.
    ///
    /// # Errors
    /// Every file that cannot be read or understood, naming the file and line (a
    /// password file or the acl_file) or the door (a certificate).
    pub fn from_config(config: &Config) -> Result<Gates, Findings> {
        let mqtt = &config.broker.mqtt;
        let mut files = Files::default();
        match crate::acl::Acl::from_config(config) {
            Ok(acl) => files.acl = acl,
            Err(e) => files.found.add(e),
        }
        let mut tcp = Vec::new();
        for d in &mqtt.listen.tcp {
            let door = door_name(MQTT_LISTEN, "tcp", &d.name);
            let (own, tls) = (d.password_file.as_ref(), d.tls.as_ref());
            tcp.push(files.mqtt_gate(mqtt, door, own, d.allow_anonymous, tls, false));
        }
        let mut ws = Vec::new();
        for d in &mqtt.listen.ws {
            let door = door_name(MQTT_LISTEN, "ws", &d.name);
            let policy = crate::server::OriginPolicy::new(
                &d.name,
                door.clone(),
                d.tls.is_some(),
                d.same_origin,
                &d.allowed_origins,
            );
            let (own, tls) = (d.password_file.as_ref(), d.tls.as_ref());
            let gate = files.mqtt_gate(mqtt, door, own, d.allow_anonymous, tls, false);
            ws.push((gate, Rc::new(policy)));
        }
        let mut unix = Vec::new();
        for d in &mqtt.listen.unix {
            let door = door_name(MQTT_LISTEN, "unix", &d.name);
            let own = d.password_file.as_ref();
            let proxy = d.proxy_protocol;
            unix.push(files.mqtt_gate(mqtt, door, own, d.allow_anonymous, None, proxy));
        }
        let (mut ops_tcp, mut ops_unix) = (Vec::new(), Vec::new());
        if let Some(ops) = &config.broker.operations {
            for d in &ops.listen.tcp {
                let door = door_name(OPS_LISTEN, "tcp", &d.name);
                let own = d.password_file.as_ref();
                ops_tcp.push(files.operations_gate(ops, door, own, d.tls.as_ref(), false));
            }
            for d in &ops.listen.unix {
                let door = door_name(OPS_LISTEN, "unix", &d.name);
                let own = d.password_file.as_ref();
                let proxy = d.proxy_protocol;
                ops_unix.push(files.operations_gate(ops, door, own, None, proxy));
            }
        }
        if !files.found.0.is_empty() {
            return Err(files.found);
        }
        let ws_gates: Vec<Rc<Gate>> = ws.iter().map(|(gate, _)| gate.clone()).collect();
        let gates: Vec<Rc<Gate>> = [&tcp, &unix, &ws_gates, &ops_tcp, &ops_unix]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        Ok(Gates {
            tcp,
            unix,
            ws,
            ops_tcp,
            ops_unix,
            reloader: Reloader {
                files: files.passwords,
                certificates: files.certificates,
                gates,
                acl: files.acl,
            },
        })
    }
}

/// Re-reads, on SIGUSR1, every password file and certificate the broker started
/// with, from the same paths (B-228, B-188).
#[derive(Debug)]
pub struct Reloader {
    files: Vec<Rc<RefCell<PasswordFile>>>,
    certificates: Vec<(config::Tls, Rc<TlsAcceptor>)>,
    gates: Vec<Rc<Gate>>,
    acl: Option<Rc<crate::acl::Acl>>,
}

impl Reloader {
    /// Reads everything again and swaps it in only if every file loaded (B-229,
    /// B-190); otherwise logs at error and keeps what was held.
    pub fn reload(&self) {
        match self.try_reload() {
            Ok(users) => log::warn!(
                "SIGUSR1: {} password files re-read ({users} users), {} certificates re-read",
                self.files.len(),
                self.certificates.len()
            ),
            Err(e) => {
                log::error!("SIGUSR1: {e}; every password file and certificate kept as it was")
            }
        }
        // The acl_file on its own: a file that does not load changes nothing, and
        // one that does applies to open connections at their next question (B-292).
        if let Some(acl) = &self.acl {
            match acl.reload() {
                Ok((path, users, roles)) => {
                    log::warn!("SIGUSR1: acl_file {path} re-read: {users} users, {roles} roles")
                }
                Err(e) => log::error!(
                    "SIGUSR1: the acl_file does not load, so every client keeps the grants it had:\n{e}"
                ),
            }
        }
    }

    fn try_reload(&self) -> Result<usize, String> {
        let mut fresh = Vec::new();
        for f in &self.files {
            let path = f.borrow().path().to_path_buf();
            fresh.push(PasswordFile::load(&path).map_err(|e| e.to_string())?);
        }
        let mut configs = Vec::new();
        for (tls, acceptor) in &self.certificates {
            configs.push(acceptor.read(tls)?);
        }
        // A file naming nobody on a door admitting nobody else would lock it shut.
        for gate in &self.gates {
            let Some(file) = &gate.passwords else {
                continue;
            };
            let index = self.files.iter().position(|f| Rc::ptr_eq(f, file));
            let empty = index.is_some_and(|i| fresh[i].is_empty());
            if empty && !gate.anonymous && !gate.names_by_certificate() {
                return Err(format!(
                    "password file {} names nobody, and {} admits nobody else",
                    file.borrow().path().display(),
                    gate.door
                ));
            }
        }
        let mut users = 0;
        for (slot, loaded) in self.files.iter().zip(fresh) {
            users += loaded.len();
            *slot.borrow_mut() = loaded;
        }
        for ((_, acceptor), config) in self.certificates.iter().zip(configs) {
            acceptor.replace(config);
        }
        Ok(users)
    }
}

/// Logs a gate that admits nobody, which the configuration check cannot see
/// (an empty password file): at startup this is a warning, not a refusal.
pub fn warn_closed_doors(gates: &Gates) {
    for gate in &gates.reloader.gates {
        if !gate.admits_somebody_without_a_certificate() && !gate.names_by_certificate() {
            log::warn!(
                "{}: its password file names nobody and it admits nobody anonymous, so nobody can connect there",
                gate.door
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn gate(file: Option<&str>, anonymous: bool) -> Gate {
        Gate {
            door: "broker.mqtt.listen.tcp".into(),
            passwords: file.map(|text| {
                Rc::new(RefCell::new(
                    PasswordFile::parse(Path::new("/p"), text).unwrap(),
                ))
            }),
            anonymous,
            tls: None,
            proxy: false,
            acl: None,
        }
    }

    const ALICE: &str = "alice:$7$101$d8lzYk/jadQqomzf$FEzKg7gLzq43vLjcHPUO7hyj5F44Z8cOJkGBj/sIhYVM88tXKUnhEcTBeFkRu+kIAwf9Iy+GU/FTQRexYWYH5w==";

    /// B-226: a wrong credential and a missing one are both refused; the refusal
    /// says which.
    #[test]
    fn wrong_and_missing_are_both_refused() {
        let g = gate(Some(ALICE), false);
        assert_eq!(
            g.admit(Some("alice"), Some(b"secret"), None),
            Ok(Identity::User("alice".into()))
        );
        assert_eq!(
            g.admit(Some("alice"), Some(b"nope"), None),
            Err(Refusal::WrongPassword("alice".into()))
        );
        assert_eq!(
            g.admit(Some("alice"), None, None),
            Err(Refusal::WrongPassword("alice".into()))
        );
        assert_eq!(
            g.admit(Some("mallory"), Some(b"secret"), None),
            Err(Refusal::UnknownUser("mallory".into()))
        );
        assert_eq!(g.admit(None, None, None), Err(Refusal::Missing));
    }

    /// B-224: allow_anonymous true beside a file still checks named clients.
    #[test]
    fn mixed_mode_checks_names_and_admits_the_rest() {
        let g = gate(Some(ALICE), true);
        assert_eq!(g.admit(None, None, None), Ok(Identity::Anonymous));
        assert!(g.admit(Some("alice"), Some(b"nope"), None).is_err());
    }

    /// B-197, B-200: a certificate's name is the user name, the file unconsulted;
    /// one holding a control character is nobody's.
    #[test]
    fn certificate_names_the_client() {
        let g = gate(Some(ALICE), false);
        assert_eq!(
            g.admit(Some("alice"), Some(b"nope"), Some("device-7")),
            Ok(Identity::Certificate("device-7".into()))
        );
        assert_eq!(
            g.admit(None, None, Some("dev\u{1b}[2J")),
            Err(Refusal::ControlCharacter)
        );
        assert_eq!(
            g.admit(None, None, Some("dev\u{85}")),
            Err(Refusal::ControlCharacter)
        );
    }

    #[test]
    fn names_of_doors() {
        assert_eq!(
            door_name(MQTT_LISTEN, "tcp", "tcp"),
            "broker.mqtt.listen.tcp"
        );
        assert_eq!(
            door_name(MQTT_LISTEN, "tcp", "fleet"),
            "broker.mqtt.listen.tcp[fleet]"
        );
        assert_eq!(
            door_name(OPS_LISTEN, "unix", "agent"),
            "broker.operations.listen.unix[agent]"
        );
    }
}
