//! The password file's users at run time: re-read when its modification time or size changes
//! (so `tern passwd` needs no restart; a file that stops parsing keeps the previous users),
//! argon2 verifications on the one verifier thread (`verifier.rs`), the failed-login backoff
//! per address (`backoff.rs`), and SCRAM credentials for the SASL listeners.
//!
//! Never logs a password or an attempted username.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use super::backoff::Backoff;
use super::passwd::{PasswdError, PasswordFile, Secrets};
use super::scram::{ScramCredential, ScramMechanism};
use super::verifier::{Memory, Verifier};

/// Why a login was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Wrong password, unknown user, or no credential of the mechanism.
    #[error("bad username or password")]
    BadCredentials,
    /// The address failed too often and must wait; no password was checked.
    #[error("too many failed logins from this address")]
    Throttled,
}

/// The users of the password file, shared by every listener.
#[derive(Debug)]
pub struct Users {
    path: PathBuf,
    state: Mutex<Loaded>,
    verifier: Verifier,
    backoff: Backoff,
}

#[derive(Debug)]
struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    users: HashMap<String, Secrets>,
}

/// Why the users could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error(transparent)]
    Passwd(#[from] PasswdError),
    #[error("cannot start the password verifier thread: {0}")]
    Verifier(std::io::Error),
}

impl Users {
    /// Reads `path` (which must exist and parse) and starts the verifier thread.
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let stamp = stamp(path);
        let users = PasswordFile::load(path)?.users();
        let scram = users.values().filter(|s| !s.scram.is_empty()).count();
        tracing::info!(path = %path.display(), users = users.len(), with_scram = scram, "password file loaded");
        let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
        if mode & 0o077 != 0 {
            tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "password file is readable by other users; tern passwd writes it with mode 0600");
        }
        Ok(Self {
            path: path.to_owned(),
            state: Mutex::new(Loaded { stamp, users }),
            verifier: Verifier::start().map_err(AuthError::Verifier)?,
            backoff: Backoff::default(),
        })
    }

    /// Verifies `password` (argon2, on the verifier thread) unless `peer` must wait after
    /// failed logins; counts the outcome for `peer`.
    pub async fn check_password(
        &self,
        user: &str,
        password: String,
        peer: Option<IpAddr>,
    ) -> Result<(), Refusal> {
        self.admit(peer)?;
        let hash = self.hash_for(user);
        let ok = match hash {
            Some((hash, known)) => {
                self.verifier
                    .run(move |memory: &mut Memory| memory.verify(&hash, &password) && known)
                    .await
            }
            None => false,
        };
        self.record(peer, ok);
        if ok {
            Ok(())
        } else {
            Err(Refusal::BadCredentials)
        }
    }

    /// `Err(Throttled)` while `peer` must wait before its next login attempt is checked.
    pub fn admit(&self, peer: Option<IpAddr>) -> Result<(), Refusal> {
        match peer {
            Some(peer) if self.backoff.admit(peer).is_err() => Err(Refusal::Throttled),
            _ => Ok(()),
        }
    }

    /// Counts a login attempt's outcome for `peer` (a SCRAM exchange ends outside this type).
    pub fn record(&self, peer: Option<IpAddr>, ok: bool) {
        match (ok, peer) {
            (true, Some(peer)) => self.backoff.succeeded(peer),
            (false, Some(peer)) => self.backoff.failed(peer),
            (_, None) => {}
        }
    }

    /// `user`'s SCRAM credential for `mechanism`, if the file holds one.
    pub fn scram_credential(
        &self,
        user: &str,
        mechanism: ScramMechanism,
    ) -> Option<ScramCredential> {
        let state = self.refreshed();
        let credential = state.users.get(user)?.scram(mechanism).cloned();
        if credential.is_none() {
            tracing::info!(
                mechanism = mechanism.name(),
                "a user of the password file has no SCRAM credential; `tern passwd` writes one when the password is set again"
            );
        }
        credential
    }

    /// The hash to verify against: `user`'s, or any other (an unknown user costs the same time
    /// as a known one, so timing tells no names) with `false`.
    fn hash_for(&self, user: &str) -> Option<(String, bool)> {
        let state = self.refreshed();
        match state.users.get(user) {
            Some(secrets) => Some((secrets.hash.clone(), true)),
            None => state.users.values().next().map(|s| (s.hash.clone(), false)),
        }
    }

    fn refreshed(&self) -> std::sync::MutexGuard<'_, Loaded> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = stamp(&self.path);
        if now != state.stamp {
            match PasswordFile::load(&self.path) {
                Ok(file) => {
                    state.users = file.users();
                    state.stamp = now;
                    tracing::info!(path = %self.path.display(), users = state.users.len(), "password file reloaded");
                }
                Err(err) => tracing::warn!(%err, "keeping the previous password file"),
            }
        }
        state
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}
