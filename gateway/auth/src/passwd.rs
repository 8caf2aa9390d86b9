//! The password file: one `user:$argon2id$v=19$m=..,t=..,p=..$salt$hash` line per user (PHC
//! strings), optionally followed by the user's SCRAM credentials
//! (`:$scram-sha-256$i=4096$salt$StoredKey$ServerKey:$scram-sha-512$…`, see `scram.rs`), `#`
//! comments and blank lines kept as they are. Parsing, argon2 hashing and verification, and the
//! atomic rewrite behind `tern passwd`: tern-core's `fs::write_atomic` on an `Fs` (temp file,
//! fdatasync, rename, fsync of the directory; mode 0600 for a new file, an existing file's
//! owner, group and mode kept), so the power-cut simulation covers it; it never opens a file
//! itself. Lines without SCRAM credentials (files of older tern versions) stay valid: they serve
//! MQTT and Kafka's PLAIN, and SCRAM logins of those users fail until the password is set again.
//!
//! Verifying is slow and memory-hungry by design: callers must run it on a blocking thread,
//! never on the async reactor. Never logs or stores a plain password.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use password_hash::rand_core::OsRng;
use tern_core::fs::{Fs, NewFile, RealFs, write_atomic};

use super::scram::{ScramCredential, ScramMechanism};

/// Argon2id memory cost of new hashes, in KiB (OWASP's 7 MiB / 5 passes profile: a Pi-class
/// gateway must not spend tens of MiB per CONNECT). Verifications run one at a time in one
/// buffer of this size (`verifier.rs`).
pub(crate) const MEMORY_KIB: u32 = 7 * 1024;
/// Argon2id passes of new hashes.
const PASSES: u32 = 5;
/// Largest memory cost accepted from a file, in KiB; more could exhaust a small gateway's RAM.
const MAX_MEMORY_KIB: u32 = 64 * 1024;

/// Why a password file could not be read, parsed or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PasswdError {
    #[error("cannot read password file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write password file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("invalid username {user:?}: {message}")]
    BadUser { user: String, message: &'static str },
    #[error("invalid password: {message}")]
    BadPassword { message: &'static str },
    #[error("cannot hash the password: {message}")]
    Hash { message: String },
    #[error("no user {user:?} in {path}")]
    NoSuchUser { user: String, path: PathBuf },
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    /// A comment or blank line, kept verbatim.
    Other(String),
    User {
        name: String,
        secrets: Secrets,
    },
}

/// What the file holds for one user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secrets {
    /// The argon2 PHC string (MQTT passwords, SASL PLAIN).
    pub hash: String,
    /// SCRAM credentials, at most one per mechanism.
    pub scram: Vec<ScramCredential>,
}

impl Secrets {
    /// The argon2 hash and both SCRAM credentials of `password`.
    pub fn new(password: &str) -> Result<Self, PasswdError> {
        let scram = ScramMechanism::ALL
            .into_iter()
            .map(|m| ScramCredential::generate(m, password))
            .collect::<Result<_, _>>()
            .map_err(|err| PasswdError::Hash {
                message: err.to_string(),
            })?;
        Ok(Self {
            hash: hash_password(password)?,
            scram,
        })
    }

    /// The credential for `mechanism`, if stored.
    pub fn scram(&self, mechanism: ScramMechanism) -> Option<&ScramCredential> {
        self.scram.iter().find(|c| c.mechanism == mechanism)
    }

    fn parse(fields: &str) -> Result<Self, String> {
        let mut fields = fields.split(':');
        let hash = fields.next().unwrap_or_default();
        check_hash(hash)?;
        let mut scram: Vec<ScramCredential> = Vec::new();
        for field in fields {
            let credential = ScramCredential::decode(field)?;
            if scram.iter().any(|c| c.mechanism == credential.mechanism) {
                return Err(format!("{} given twice", credential.mechanism.name()));
            }
            scram.push(credential);
        }
        Ok(Self {
            hash: hash.to_owned(),
            scram,
        })
    }

    fn render(&self, out: &mut String) {
        out.push_str(&self.hash);
        for credential in &self.scram {
            out.push(':');
            out.push_str(&credential.encode());
        }
    }
}

/// A parsed password file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PasswordFile {
    lines: Vec<Line>,
}

impl PasswordFile {
    /// Parses the text of `path`; errors name the line.
    pub fn parse(text: &str, path: &Path) -> Result<Self, PasswdError> {
        let mut lines = Vec::new();
        let mut seen = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let error = |message: String| PasswdError::Parse {
                path: path.to_owned(),
                line: i + 1,
                message,
            };
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                lines.push(Line::Other(raw.to_owned()));
                continue;
            }
            let (name, fields) = trimmed
                .split_once(':')
                .ok_or_else(|| error("expected user:hash".to_owned()))?;
            check_user(name).map_err(|e| error(e.to_string()))?;
            let secrets = Secrets::parse(fields).map_err(error)?;
            if let Some(first) = seen.insert(name.to_owned(), i + 1) {
                return Err(error(format!("user {name:?} already on line {first}")));
            }
            lines.push(Line::User {
                name: name.to_owned(),
                secrets,
            });
        }
        Ok(Self { lines })
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, PasswdError> {
        Self::load_from(&RealFs, path)
    }

    /// Reads and parses `path` on `fs`.
    pub fn load_from(fs: &dyn Fs, path: &Path) -> Result<Self, PasswdError> {
        let read = |source| PasswdError::Read {
            path: path.to_owned(),
            source,
        };
        let bytes = fs.read(path).map_err(read)?;
        let text = String::from_utf8(bytes)
            .map_err(|err| read(std::io::Error::new(std::io::ErrorKind::InvalidData, err)))?;
        Self::parse(&text, path)
    }

    /// The users and their secrets.
    pub fn users(&self) -> HashMap<String, Secrets> {
        self.lines
            .iter()
            .filter_map(|line| match line {
                Line::User { name, secrets } => Some((name.clone(), secrets.clone())),
                Line::Other(_) => None,
            })
            .collect()
    }

    /// Sets `user`'s secrets, replacing their line or appending one.
    pub fn set(&mut self, user: &str, secrets: Secrets) -> Result<(), PasswdError> {
        check_user(user)?;
        for line in &mut self.lines {
            if let Line::User { name, secrets: old } = line {
                if name == user {
                    *old = secrets;
                    return Ok(());
                }
            }
        }
        self.lines.push(Line::User {
            name: user.to_owned(),
            secrets,
        });
        Ok(())
    }

    /// Removes `user`'s line; false if there was none.
    pub fn remove(&mut self, user: &str) -> bool {
        let before = self.lines.len();
        self.lines
            .retain(|line| !matches!(line, Line::User { name, .. } if name == user));
        self.lines.len() != before
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut text = String::new();
        for line in &self.lines {
            match line {
                Line::Other(raw) => text.push_str(raw),
                Line::User { name, secrets } => {
                    text.push_str(name);
                    text.push(':');
                    secrets.render(&mut text);
                }
            }
            text.push('\n');
        }
        text
    }

    /// Replaces `path` on `fs` whole or not at all (`write_atomic` with [`NewFile::Private`]:
    /// temp file of mode 0600 in the same directory, fdatasync, rename, fsync of the
    /// directory). A crash leaves either the old or the new file, never a mix. When `path`
    /// exists, the new file gets its owner, group and mode first (a packaged `root:tern 0640`
    /// file stays readable by the service after `sudo tern passwd`).
    pub fn save(&self, fs: &dyn Fs, path: &Path) -> Result<(), PasswdError> {
        write_atomic(fs, path, self.render().as_bytes(), NewFile::Private).map_err(|source| {
            PasswdError::Write {
                path: path.to_owned(),
                source,
            }
        })
    }
}

/// Usernames: 1..=65535 bytes of UTF-8 (MQTT's limit), no `:`, whitespace or control characters.
fn check_user(user: &str) -> Result<(), PasswdError> {
    let message = if user.is_empty() {
        "must not be empty"
    } else if user.len() > usize::from(u16::MAX) {
        "longer than 65535 bytes"
    } else if user.contains(':') {
        "must not contain ':'"
    } else if user.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "must not contain whitespace or control characters"
    } else {
        return Ok(());
    };
    Err(PasswdError::BadUser {
        user: user.to_owned(),
        message,
    })
}

/// Accepts argon2 PHC strings whose memory cost a gateway can afford.
fn check_hash(hash: &str) -> Result<(), String> {
    let parsed = PasswordHash::new(hash).map_err(|err| format!("not a PHC hash string: {err}"))?;
    if Algorithm::try_from(parsed.algorithm).is_err() {
        return Err(format!("{} is not an argon2 algorithm", parsed.algorithm));
    }
    let params =
        Params::try_from(&parsed).map_err(|err| format!("bad argon2 parameters: {err}"))?;
    if params.m_cost() > MAX_MEMORY_KIB {
        return Err(format!(
            "memory cost {} KiB exceeds the {MAX_MEMORY_KIB} KiB limit",
            params.m_cost()
        ));
    }
    Ok(())
}

/// Hashes `password` with argon2id and a fresh random salt.
pub fn hash_password(password: &str) -> Result<String, PasswdError> {
    let failed = |err: argon2::password_hash::Error| PasswdError::Hash {
        message: err.to_string(),
    };
    let params = Params::new(MEMORY_KIB, PASSES, 1, None).map_err(|err| PasswdError::Hash {
        message: err.to_string(),
    })?;
    let salt = SaltString::generate(&mut OsRng);
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(failed)
}

/// Whether `password` matches the PHC `hash` (using the hash's own parameters). Slow: call
/// from a blocking thread.
pub fn verify_password(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| {
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// `tern passwd FILE USER`: sets (`password = Some`) or deletes (`None`) a user's line,
/// creating the file if needed. Blocking (argon2, fsyncs): never call it on the runtime.
pub fn update(path: &Path, user: &str, password: Option<&str>) -> Result<(), PasswdError> {
    update_on(&RealFs, path, user, password)
}

/// [`update`] on `fs`.
pub fn update_on(
    fs: &dyn Fs,
    path: &Path,
    user: &str,
    password: Option<&str>,
) -> Result<(), PasswdError> {
    let mut file = match PasswordFile::load_from(fs, path) {
        Ok(file) => file,
        Err(PasswdError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound && password.is_some() =>
        {
            PasswordFile::default()
        }
        Err(err) => return Err(err),
    };
    match password {
        Some(password) => {
            if password.is_empty() {
                return Err(PasswdError::BadPassword {
                    message: "must not be empty",
                });
            }
            file.set(user, Secrets::new(password)?)?;
        }
        None => {
            if !file.remove(user) {
                return Err(PasswdError::NoSuchUser {
                    user: user.to_owned(),
                    path: path.to_owned(),
                });
            }
        }
    }
    file.save(fs, path)
}

/// Reads the new password: prompted twice without echo on a terminal, else the first line of
/// standard input (without its line ending).
pub fn read_password() -> Result<String, PasswdError> {
    use std::io::IsTerminal;
    let stdin_failed = |source| PasswdError::Read {
        path: PathBuf::from("<stdin>"),
        source,
    };
    if std::io::stdin().is_terminal() {
        let first = rpassword::prompt_password("Password: ").map_err(stdin_failed)?;
        let again = rpassword::prompt_password("Repeat password: ").map_err(stdin_failed)?;
        if first != again {
            return Err(PasswdError::BadPassword {
                message: "the two entries differ",
            });
        }
        return Ok(first);
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(stdin_failed)?;
    let line = line.strip_suffix('\n').unwrap_or(&line);
    Ok(line.strip_suffix('\r').unwrap_or(line).to_owned())
}

#[cfg(test)]
mod test;
