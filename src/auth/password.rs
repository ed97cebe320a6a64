//! Mosquitto's password file: `user:hash` lines, the hash `$6$` or `$7$`.
//!
//! - `$6$<salt>$<hash>`: **one** SHA-512 of password‖salt (not sha512-crypt).
//! - `$7$<iterations>$<salt>$<hash>`: PBKDF2-HMAC-SHA512 over the password.
//!
//! Salt and hash are standard base64 with padding, as `mosquitto_passwd` writes
//! them. A line is checked when the file is read, so a file Sagüin cannot
//! understand stops the broker (or a reload) naming the file and the line, rather
//! than being found out as a failed password later (RFC 0002 "Who may connect").

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::{digest, pbkdf2};

/// A stored hash, as one line of the file holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hash {
    /// `$6$`: SHA-512(password ‖ salt).
    Sha512 { salt: Vec<u8>, hash: Vec<u8> },
    /// `$7$`: PBKDF2-HMAC-SHA512.
    Pbkdf2 {
        iterations: NonZeroU32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
}

impl Hash {
    fn verify(&self, password: &[u8]) -> bool {
        match self {
            Hash::Sha512 { salt, hash } => {
                let mut ctx = digest::Context::new(&digest::SHA512);
                ctx.update(password);
                ctx.update(salt);
                constant_time_eq(ctx.finish().as_ref(), hash)
            }
            Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => pbkdf2::verify(
                pbkdf2::PBKDF2_HMAC_SHA512,
                *iterations,
                salt,
                password,
                hash,
            )
            .is_ok(),
        }
    }
}

/// Compares two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// What checking a user name and password found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The password matches the user's line.
    Good,
    /// The user has a line and the password does not match it.
    WrongPassword,
    /// No line names the user.
    UnknownUser,
}

/// A password file as read: every user and their hash.
#[derive(Debug, Clone)]
pub struct PasswordFile {
    path: PathBuf,
    users: HashMap<String, Hash>,
    /// The first user's name, whose hash an unknown user's password is checked
    /// against: it costs what the file's own lines cost (B-226).
    decoy: Option<String>,
}

/// A password file that could not be read or understood: the file, the line
/// (0 when the file itself could not be read) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The file.
    pub path: PathBuf,
    /// The line, counting from 1; 0 for the file as a whole.
    pub line: usize,
    /// What is wrong and what to do.
    pub reason: String,
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "password file {}: {}", self.path.display(), self.reason)
        } else {
            write!(
                f,
                "password file {} line {}: {}",
                self.path.display(),
                self.line,
                self.reason
            )
        }
    }
}

impl std::error::Error for FileError {}

/// A hash to check a password against when the file names nobody.
const DECOY: &str = "$7$101$d8lzYk/jadQqomzf$FEzKg7gLzq43vLjcHPUO7hyj5F44Z8cOJkGBj/sIhYVM88tXKUnhEcTBeFkRu+kIAwf9Iy+GU/FTQRexYWYH5w==";

impl PasswordFile {
    /// Reads the file at `path`.
    ///
    /// # Errors
    /// The file cannot be read, or a line is not `user:$6$…` / `user:$7$…` as
    /// Mosquitto writes it, or a user is named on two lines (both lines named).
    pub fn load(path: &Path) -> Result<PasswordFile, FileError> {
        let text = std::fs::read_to_string(path).map_err(|e| FileError {
            path: path.to_path_buf(),
            line: 0,
            reason: format!("cannot be read: {e}"),
        })?;
        PasswordFile::parse(path, &text)
    }

    /// Reads a password file from text, as though it were the file at `path`.
    ///
    /// # Errors
    /// As [`PasswordFile::load`], for the text.
    pub fn parse(path: &Path, text: &str) -> Result<PasswordFile, FileError> {
        let mut users: HashMap<String, Hash> = HashMap::new();
        let mut lines_of: HashMap<String, usize> = HashMap::new();
        let mut decoy = None;
        for (i, line) in text.lines().enumerate() {
            let number = i + 1;
            let fail = |reason: String| FileError {
                path: path.to_path_buf(),
                line: number,
                reason,
            };
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = line.split_once(':') else {
                return Err(fail(
                    "is not user:hash; write it with mosquitto_passwd or saguin --passwd".into(),
                ));
            };
            if user.is_empty() {
                return Err(fail("names no user before the ':'".into()));
            }
            let hash = parse_hash(hash).map_err(fail)?;
            if let Some(first) = lines_of.get(user) {
                return Err(fail(format!(
                    "names user {user:?} again (first on line {first}); only one password could ever be checked, so delete one of the two lines"
                )));
            }
            lines_of.insert(user.to_string(), number);
            users.insert(user.to_string(), hash);
            decoy.get_or_insert_with(|| user.to_string());
        }
        Ok(PasswordFile {
            path: path.to_path_buf(),
            users,
            decoy,
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many users it names.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether it names nobody.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The users it names, in no particular order.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    /// Checks `password` for `user`, in constant time for a given hash. An unknown
    /// user's password is checked against the file's first line, so that it costs
    /// what a known user's does: how long the answer takes does not say which names
    /// exist (B-226; the answer is 0x86 either way).
    pub fn check(&self, user: &str, password: &[u8]) -> Verdict {
        match self.users.get(user) {
            Some(hash) if hash.verify(password) => Verdict::Good,
            Some(_) => Verdict::WrongPassword,
            None => {
                match self.decoy.as_ref().and_then(|d| self.users.get(d)) {
                    Some(decoy) => {
                        let _ = decoy.verify(password);
                    }
                    None => {
                        if let Ok(decoy) = parse_hash(DECOY) {
                            let _ = decoy.verify(password);
                        }
                    }
                }
                Verdict::UnknownUser
            }
        }
    }
}

/// Iterations of PBKDF2 in a line Sagüin writes (B-562; mosquitto 2.1 writes as many).
const WRITE_ITERATIONS: NonZeroU32 = match NonZeroU32::new(1000) {
    Some(n) => n,
    None => unreachable!(),
};
/// Salt bytes in a line Sagüin writes: mosquitto 2.0's length, which every version
/// of it reads.
const WRITE_SALT: usize = 12;

/// A `$7$` line for `user`, as `mosquitto_passwd` writes one: PBKDF2-HMAC-SHA512, a
/// fresh salt, base64 with padding.
///
/// # Errors
/// The system's random source failed.
pub fn hash_line(user: &str, password: &[u8]) -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; WRITE_SALT];
    ring::rand::SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| "the system's random source failed; no salt could be made".to_string())?;
    let mut hash = [0u8; digest::SHA512_OUTPUT_LEN];
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA512,
        WRITE_ITERATIONS,
        &salt,
        password,
        &mut hash,
    );
    Ok(format!(
        "{user}:$7${WRITE_ITERATIONS}${}${}",
        STANDARD.encode(salt),
        STANDARD.encode(hash)
    ))
}

/// Reads the part after `user:`.
fn parse_hash(text: &str) -> Result<Hash, String> {
    let decode = |what: &str, b64: &str| {
        STANDARD
            .decode(b64)
            .map_err(|e| format!("its {what} is not standard base64 ({e})"))
    };
    if text.starts_with("$argon2") {
        return Err("holds an argon2 hash, which Sagüin does not read; write the password again with mosquitto_passwd (it writes $7$) or saguin --passwd".into());
    }
    let fields: Vec<&str> = text.split('$').collect();
    match fields.as_slice() {
        ["", "6", salt, hash] => {
            let salt = decode("salt", salt)?;
            let hash = decode("hash", hash)?;
            if hash.len() != digest::SHA512_OUTPUT_LEN {
                return Err(format!(
                    "its $6$ hash is {} bytes, where SHA-512 makes 64",
                    hash.len()
                ));
            }
            Ok(Hash::Sha512 { salt, hash })
        }
        ["", "7", iterations, salt, hash] => {
            let iterations = iterations
                .parse::<u32>()
                .ok()
                .and_then(NonZeroU32::new)
                .ok_or_else(|| {
                    format!("its $7$ iteration count {iterations:?} is not a positive number")
                })?;
            let salt = decode("salt", salt)?;
            let hash = decode("hash", hash)?;
            if hash.is_empty() {
                return Err("its $7$ hash is empty".into());
            }
            Ok(Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            })
        }
        ["", kind, ..] => Err(format!(
            "holds a ${kind}$ hash; Sagüin reads $6$ (SHA-512) and $7$ (PBKDF2-SHA512) as mosquitto_passwd writes them"
        )),
        _ => Err("holds a password that is not hashed; hash it with mosquitto_passwd -U or saguin --passwd".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Written by Debian's mosquitto_passwd 2.0.11: `-H sha512` and the default.
    const SIX: &str = "alice:$6$mPmUfZJ7sW/PEBl4$oMr1jAqK3CzUQhnOVRh3/zGlt5kLacw3yghB0GqsuP8h/TYzNT5O7+UEzJy2zxGt47V3aK8c0G4GSd6gkRAsTA==";
    const SEVEN: &str = "alice:$7$101$d8lzYk/jadQqomzf$FEzKg7gLzq43vLjcHPUO7hyj5F44Z8cOJkGBj/sIhYVM88tXKUnhEcTBeFkRu+kIAwf9Iy+GU/FTQRexYWYH5w==";

    fn file(text: &str) -> Result<PasswordFile, FileError> {
        PasswordFile::parse(Path::new("/etc/saguin/clients.passwd"), text)
    }

    /// B-226: an unknown user's password is checked against the file's first line,
    /// which costs what the file's own lines do, and is still refused.
    #[test]
    fn an_unknown_user_is_checked_against_the_first_line() {
        let text = format!("{SEVEN}\n{}\n", SIX.replace("alice", "bob"));
        let f = file(&text).unwrap();
        assert_eq!(f.decoy.as_deref(), Some("alice"));
        assert_eq!(f.check("mallory", b"secret"), Verdict::UnknownUser);
        assert_eq!(
            file("").unwrap().check("mallory", b"x"),
            Verdict::UnknownUser
        );
    }

    /// B-230: a $7$ line as mosquitto_passwd writes it.
    #[test]
    fn pbkdf2_line_verifies() {
        let f = file(SEVEN).unwrap();
        assert_eq!(f.check("alice", b"secret"), Verdict::Good);
        assert_eq!(f.check("alice", b"secreT"), Verdict::WrongPassword);
        assert_eq!(f.check("bob", b"secret"), Verdict::UnknownUser);
    }

    /// B-230: a $6$ line is one SHA-512 of password and salt.
    #[test]
    fn sha512_line_verifies() {
        let f = file(SIX).unwrap();
        assert_eq!(f.check("alice", b"secret"), Verdict::Good);
        assert_eq!(f.check("alice", b""), Verdict::WrongPassword);
    }

    /// B-231: argon2id is refused naming the line.
    #[test]
    fn argon2_is_refused_naming_the_line() {
        let e = file("# users\n\nbob:$argon2id$v=19$m=65536,t=3,p=1$c2FsdA$aGFzaA\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().contains("line 3"), "{e}");
        assert!(e.reason.contains("argon2"), "{e}");
    }

    /// B-232: a user on two lines is refused naming both.
    #[test]
    fn duplicate_user_names_both_lines() {
        let e = file(&format!("{SEVEN}\n{SIX}\n")).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("line 1"), "{e}");
    }

    #[test]
    fn malformed_lines_are_named() {
        for bad in [
            "alice",
            "alice:secret",
            ":$6$c2FsdA==$aGFzaA==",
            "alice:$6$c2FsdA==$aGFzaA==",
            "alice:$7$0$c2FsdA==$aGFzaA==",
            "alice:$7$101$!!!$aGFzaA==",
            "alice:$5$c2FsdA==$aGFzaA==",
        ] {
            let e = file(bad).unwrap_err();
            assert_eq!(e.line, 1, "{bad}: {e}");
        }
    }

    #[test]
    fn comments_blank_lines_and_crlf_are_read() {
        let f = file(&format!("# a comment\r\n\r\n{SEVEN}\r\n")).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f.check("alice", b"secret"), Verdict::Good);
    }
}
