//! `saguin --passwd`: lists, adds and deletes users of a Mosquitto-format password
//! file (RFC 0002 "CLI: --passwd", B-559..B-563). It reads and writes only the file
//! it is given and consults no configuration.
//!
//! The file is rewritten whole, through a temporary file in the same directory that
//! is renamed over it, so a broker re-reading it on SIGUSR1 never sees half of it. A
//! new file is mode 0600; an existing one keeps its mode and owner.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::PasswordFile;
use super::password::hash_line;

/// What `--passwd` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `list <file>`: the users, one per line.
    List,
    /// `add <file> <user> [password]`: a new user, or a new password for one.
    Add {
        /// The user.
        user: String,
        /// The password; `None` prompts twice with echo off (B-560).
        password: Option<String>,
    },
    /// `delete <file> <user>`.
    Delete {
        /// The user.
        user: String,
    },
}

impl Command {
    /// Reads `verb` and the operands after the file.
    ///
    /// # Errors
    /// A verb or a number of operands the command does not take, said as usage.
    pub fn parse(verb: &str, rest: &[String]) -> Result<Command, String> {
        match (verb, rest) {
            ("list", []) => Ok(Command::List),
            ("add", [user]) => Ok(Command::Add {
                user: user.clone(),
                password: None,
            }),
            ("add", [user, password]) => Ok(Command::Add {
                user: user.clone(),
                password: Some(password.clone()),
            }),
            ("delete", [user]) => Ok(Command::Delete { user: user.clone() }),
            _ => Err(USAGE.to_string()),
        }
    }
}

/// How `--passwd` is written.
pub const USAGE: &str = "usage: saguin --passwd list <file>\n       saguin --passwd add <file> <user> [password]\n       saguin --passwd delete <file> <user>";

/// Runs `command` on the password file at `path`; what to print on success.
///
/// # Errors
/// The file cannot be read, understood or written, or the user name or password
/// cannot be stored; the message names the file and what to do.
pub fn run(path: &Path, command: Command) -> Result<String, String> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: cannot be read: {e}", path.display())),
    };
    let text = existing.as_deref().unwrap_or("");
    // The file must be one Sagüin and mosquitto read, before anything is changed.
    let file = PasswordFile::parse(path, text).map_err(|e| e.to_string())?;
    match command {
        Command::List => {
            if existing.is_none() {
                return Err(format!("{}: no such file", path.display()));
            }
            let mut users: Vec<&str> = file.users().collect();
            users.sort_unstable();
            Ok(users.iter().map(|u| format!("{u}\n")).collect())
        }
        Command::Add { user, password } => {
            check_user(&user)?;
            let password = match password {
                Some(password) => password,
                None => prompt_twice(&user)?,
            };
            if password.is_empty() {
                return Err(
                    "an empty password is refused: nobody should be admitted by one".into(),
                );
            }
            let line = hash_line(&user, password.as_bytes())?;
            let replaced = file.users().any(|u| u == user);
            let mut lines = without_user(text, &user);
            lines.push(line);
            write(path, &lines, existing.is_some())?;
            Ok(format!(
                "{}: {} {user}\n",
                path.display(),
                if replaced {
                    "changed the password of"
                } else {
                    "added"
                }
            ))
        }
        Command::Delete { user } => {
            if existing.is_none() {
                return Err(format!("{}: no such file", path.display()));
            }
            if !file.users().any(|u| u == user) {
                return Err(format!("{}: names no user {user:?}", path.display()));
            }
            write(path, &without_user(text, &user), true)?;
            Ok(format!("{}: deleted {user}\n", path.display()))
        }
    }
}

/// A user name a line can hold and a client can send.
fn check_user(user: &str) -> Result<(), String> {
    if user.is_empty() {
        return Err("a user name cannot be empty".into());
    }
    if user.contains(':') || user.chars().any(char::is_control) {
        return Err(format!(
            "user name {user:?} holds ':' or a control character, which a password file line cannot carry"
        ));
    }
    Ok(())
}

/// The file's lines, but for `user`'s.
fn without_user(text: &str, user: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| l.split_once(':').is_none_or(|(u, _)| u != user))
        .map(str::to_string)
        .collect()
}

/// Asks for the password twice, echo off (B-560).
fn prompt_twice(user: &str) -> Result<String, String> {
    let ask = |prompt: &str| {
        rpassword::prompt_password(prompt).map_err(|e| {
            format!("cannot read a password from the terminal: {e}; give it as the last operand")
        })
    };
    let first = ask(&format!("Password for {user}: "))?;
    let second = ask("Again: ")?;
    if first != second {
        return Err("the two passwords differ; nothing was changed".into());
    }
    Ok(first)
}

/// Replaces the file with `lines`: a new one is 0600, an existing one keeps its
/// mode and owner (B-563).
fn write(path: &Path, lines: &[String], existed: bool) -> Result<(), String> {
    let fail = |what: &str, e: std::io::Error| format!("{}: cannot {what}: {e}", path.display());
    let kept = if existed {
        Some(std::fs::metadata(path).map_err(|e| fail("be read", e))?)
    } else {
        None
    };
    let mode = kept
        .as_ref()
        .map_or(0o600, |m| m.permissions().mode() & 0o7777);
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{file_name}.saguin-{}", std::process::id()));
    let result = (|| {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temp)
            .map_err(|e| fail("be written", e))?;
        // The umask may have narrowed the mode the file was created with.
        out.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| fail("keep its mode", e))?;
        if let Some(meta) = &kept {
            std::os::unix::fs::fchown(&out, Some(meta.uid()), Some(meta.gid()))
                .map_err(|e| fail("keep its owner", e))?;
        }
        let mut body = lines.join("\n");
        if !body.is_empty() {
            body.push('\n');
        }
        out.write_all(body.as_bytes())
            .and_then(|()| out.sync_all())
            .map_err(|e| fail("be written", e))?;
        std::fs::rename(&temp, path).map_err(|e| fail("be replaced", e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_refused_for_anything_else() {
        assert_eq!(Command::parse("list", &[]), Ok(Command::List));
        assert!(Command::parse("list", &["x".into()]).is_err());
        assert!(Command::parse("scope", &["x".into()]).is_err());
        assert!(Command::parse("add", &[]).is_err());
    }

    #[test]
    fn a_user_name_with_a_colon_or_control_is_refused() {
        assert!(check_user("a:b").is_err());
        assert!(check_user("a\nb").is_err());
        assert!(check_user("").is_err());
        assert!(check_user("device-7").is_ok());
    }

    #[test]
    fn only_the_named_users_line_goes() {
        let text = "alice:$7$x\n# a comment\nbob:$6$y\n";
        assert_eq!(
            without_user(text, "alice"),
            ["# a comment".to_string(), "bob:$6$y".to_string()]
        );
    }
}
