//! MQTT client authentication: the password file (`user:argon2id-PHC-string` per line, managed
//! with `tern passwd FILE USER`) and the anonymous-access policy (by default anonymous clients
//! are accepted only on a loopback listener). Verification runs on the blocking pool, at most
//! two at a time, so a CONNECT flood cannot take the RAM argon2 needs many times over. Never
//! logs or keeps a plaintext password.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

/// Argon2id cost for new hashes: 7 MiB, 5 passes (an OWASP-recommended setting that fits a Pi).
const MEMORY_KIB: u32 = 7 * 1024;
const PASSES: u32 = 5;
/// Concurrent verifications.
const VERIFIERS: usize = 2;

/// When clients without a username are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Anonymous {
    /// Only when the listener is bound to a loopback address.
    #[default]
    Loopback,
    Always,
    Never,
}

/// Why the password file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
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
    #[error("{path}:{line}: {reason}")]
    Malformed {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("invalid user name {user:?}: {reason}")]
    InvalidUser { user: String, reason: &'static str },
    #[error("cannot hash the password: {reason}")]
    Hash { reason: String },
}

/// The outcome of a CONNECT's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Unknown user or wrong password.
    BadCredentials,
    /// No username where anonymous access is not allowed.
    NotAuthorized,
}

/// Loaded users and the anonymous policy of one listener.
#[derive(Debug, Clone)]
pub struct Authenticator {
    users: Arc<HashMap<String, String>>,
    anonymous: bool,
    verifiers: Arc<Semaphore>,
}

impl Authenticator {
    /// `anonymous` is the policy already applied to the listener's address.
    pub fn new(password_file: Option<&Path>, anonymous: bool) -> Result<Self, AuthError> {
        let users = match password_file {
            Some(path) => load(path)?,
            None => HashMap::new(),
        };
        Ok(Self {
            users: Arc::new(users),
            anonymous,
            verifiers: Arc::new(Semaphore::new(VERIFIERS)),
        })
    }

    /// Checks a CONNECT's username and password.
    pub async fn verify(&self, username: Option<&str>, password: Option<&str>) -> Verdict {
        let Some(username) = username else {
            return if self.anonymous {
                Verdict::Accepted
            } else {
                Verdict::NotAuthorized
            };
        };
        let Some(phc) = self.users.get(username).cloned() else {
            return Verdict::BadCredentials;
        };
        let password = password.unwrap_or_default().to_owned();
        let Ok(_permit) = self.verifiers.acquire().await else {
            return Verdict::BadCredentials;
        };
        let checked = tokio::task::spawn_blocking(move || check(&phc, &password)).await;
        match checked {
            Ok(true) => Verdict::Accepted,
            _ => Verdict::BadCredentials,
        }
    }
}

fn check(phc: &str, password: &str) -> bool {
    PasswordHash::new(phc)
        .and_then(|hash| Argon2::default().verify_password(password.as_bytes(), &hash))
        .is_ok()
}

fn load(path: &Path) -> Result<HashMap<String, String>, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut users = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let malformed = |reason: &str| AuthError::Malformed {
            path: path.to_owned(),
            line: i + 1,
            reason: reason.to_owned(),
        };
        let (user, phc) = line
            .split_once(':')
            .ok_or_else(|| malformed("expected user:hash"))?;
        PasswordHash::new(phc).map_err(|_| malformed("the hash is not a PHC string"))?;
        users.insert(user.to_owned(), phc.to_owned());
    }
    Ok(users)
}

/// Adds or replaces `user` in the password file at `path` (created if missing).
pub fn set_password(path: &Path, user: &str, password: &str) -> Result<(), AuthError> {
    if user.is_empty() || user.contains([':', '\n', '\r']) {
        return Err(AuthError::InvalidUser {
            user: user.to_owned(),
            reason: "must be non-empty without ':' or line breaks",
        });
    }
    let params = Params::new(MEMORY_KIB, PASSES, 1, None).map_err(|err| AuthError::Hash {
        reason: err.to_string(),
    })?;
    let salt = SaltString::generate(&mut OsRng);
    let phc = Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password(password.as_bytes(), &salt)
        .map_err(|err| AuthError::Hash {
            reason: err.to_string(),
        })?
        .to_string();
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(AuthError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let prefix = format!("{user}:");
    let mut lines: Vec<String> = existing
        .lines()
        .filter(|line| !line.starts_with(&prefix))
        .map(str::to_owned)
        .collect();
    lines.push(format!("{user}:{phc}"));
    let write = |source| AuthError::Write {
        path: path.to_owned(),
        source,
    };
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, lines.join("\n") + "\n").map_err(write)?;
    std::fs::rename(&temp, path).map_err(write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passwords_verify_and_anonymous_follows_the_policy() {
        let dir = std::env::temp_dir().join(format!("tern-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("passwd");
        set_password(&file, "alice", "s3cret").expect("set");
        set_password(&file, "bob", "other").expect("set");
        set_password(&file, "alice", "changed").expect("replace");
        let text = std::fs::read_to_string(&file).expect("read");
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains("changed"), "no plaintext in the file");

        let auth = Authenticator::new(Some(&file), false).expect("load");
        assert_eq!(
            auth.verify(Some("alice"), Some("changed")).await,
            Verdict::Accepted
        );
        assert_eq!(
            auth.verify(Some("alice"), Some("s3cret")).await,
            Verdict::BadCredentials
        );
        assert_eq!(
            auth.verify(Some("eve"), Some("x")).await,
            Verdict::BadCredentials
        );
        assert_eq!(auth.verify(None, None).await, Verdict::NotAuthorized);
        let open = Authenticator::new(None, true).expect("no file");
        assert_eq!(open.verify(None, None).await, Verdict::Accepted);
        assert!(set_password(&file, "a:b", "x").is_err());
        std::fs::write(&file, "broken line\n").expect("write");
        assert!(matches!(
            Authenticator::new(Some(&file), false),
            Err(AuthError::Malformed { line: 1, .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
