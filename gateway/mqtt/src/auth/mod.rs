//! Who may connect and what they may touch: the CONNECT decision (password file, anonymous
//! access per listener, TLS client-certificate identity, the will topic's ACL) and the topic
//! ACL checks connections ask for on PUBLISH, SUBSCRIBE and delivery.
//!
//! Password verification (argon2, slow by design) runs on the one verifier thread
//! (`verifier.rs`), one at a time in one reusable buffer, never on the reactor; an address
//! with repeated failures waits before its next password is checked (`backoff.rs`). The
//! password file is re-read when it changes, so `tern passwd` takes effect without a restart.
//! Never logs a password, an attempted username or message contents.

pub mod acl;
mod backoff;
pub mod passwd;
mod verifier;

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use self::acl::{Acl, Client, Want};
use self::backoff::Backoff;
use self::passwd::{PasswdError, PasswordFile};
use self::verifier::{Memory, Verifier};
use super::codec::{ConnAckCode, Connect};
use super::config::auth::{AclConfig, Anonymous, AuthConfig};

/// How a connection reached tern, as far as authentication cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The listener is bound to a loopback address.
    pub loopback_listener: bool,
    /// The verified client certificate's identity, when the TLS listener uses it as username.
    pub cert_identity: Option<String>,
    /// The client's address, for the failed-login backoff (`None`: not tracked).
    pub peer: Option<IpAddr>,
}

/// Why authentication could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error(transparent)]
    Passwd(#[from] PasswdError),
    #[error("cannot start the password verifier thread: {0}")]
    Verifier(std::io::Error),
}

/// The authentication and authorization state shared by all connections.
#[derive(Debug)]
pub struct Auth {
    anonymous: Anonymous,
    passwords: Option<(Arc<Passwords>, Verifier)>,
    /// Replaced whole by [`Auth::set_acl`] (SIGHUP).
    acl: RwLock<Arc<Acl>>,
    backoff: Backoff,
}

impl Auth {
    /// Loads the password file (which must exist and parse when configured).
    pub fn load(config: &AuthConfig, acl: &[AclConfig]) -> Result<Self, AuthError> {
        let passwords = match &config.password_file {
            Some(path) => {
                let verifier = Verifier::start().map_err(AuthError::Verifier)?;
                Some((Arc::new(Passwords::load(path)?), verifier))
            }
            None => None,
        };
        Ok(Self {
            anonymous: config.allow_anonymous,
            passwords,
            acl: RwLock::new(Arc::new(Acl::new(acl.to_vec()))),
            backoff: Backoff::default(),
        })
    }

    /// Replaces the ACL rules (a reload); checks already made stand.
    pub fn set_acl(&self, acl: &[AclConfig]) {
        *self.acl.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Acl::new(acl.to_vec()));
    }

    fn acl(&self) -> Arc<Acl> {
        Arc::clone(&self.acl.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Decides a CONNECT: the authenticated username (`None` = anonymous), or the CONNACK
    /// refusal code.
    pub async fn authenticate(
        &self,
        connect: &Connect,
        origin: &Origin,
    ) -> Result<Option<String>, ConnAckCode> {
        let user = match (&origin.cert_identity, &connect.username, &self.passwords) {
            (Some(identity), _, _) => Some(identity.clone()),
            (None, Some(user), Some(passwords)) => {
                let password = connect.password.clone().unwrap_or_default();
                self.check_password(passwords, user, password, origin.peer)
                    .await?;
                Some(user.clone())
            }
            (None, _, _) if self.anonymous.allows(origin.loopback_listener) => None,
            (None, _, _) => return Err(ConnAckCode::NotAuthorized),
        };
        let will_denied = connect.will.as_ref().is_some_and(|will| {
            let topic = String::from_utf8_lossy(&will.topic);
            !self.allows(user.as_deref(), &connect.client_id, Want::Publish, &topic)
        });
        if will_denied {
            return Err(ConnAckCode::NotAuthorized);
        }
        Ok(user)
    }

    /// Whether the client may do `want` on `topic`.
    pub fn allows(&self, user: Option<&str>, client_id: &str, want: Want, topic: &str) -> bool {
        self.acl().allows(Client { user, client_id }, want, topic)
    }

    /// Whether any ACL rule is configured (so deliveries need checking).
    pub fn acl_active(&self) -> bool {
        self.acl().is_active()
    }

    /// Verifies `password` unless `peer` must wait after failed logins; counts the outcome.
    async fn check_password(
        &self,
        (passwords, verifier): &(Arc<Passwords>, Verifier),
        user: &str,
        password: String,
        peer: Option<IpAddr>,
    ) -> Result<(), ConnAckCode> {
        if peer.is_some_and(|peer| self.backoff.admit(peer).is_err()) {
            return Err(ConnAckCode::ConnectionRateExceeded);
        }
        let passwords = passwords.clone();
        let user = user.to_owned();
        let ok = verifier
            .run(move |memory| passwords.verify(&user, &password, memory))
            .await;
        match (ok, peer) {
            (true, Some(peer)) => self.backoff.succeeded(peer),
            (false, Some(peer)) => self.backoff.failed(peer),
            (_, None) => {}
        }
        if ok {
            Ok(())
        } else {
            Err(ConnAckCode::BadUserNamePassword)
        }
    }
}

/// The password file's users, re-read when its modification time or size changes.
#[derive(Debug)]
struct Passwords {
    path: PathBuf,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    users: HashMap<String, String>,
}

impl Passwords {
    fn load(path: &Path) -> Result<Self, PasswdError> {
        let stamp = stamp(path);
        let users = PasswordFile::load(path)?.users();
        tracing::info!(path = %path.display(), users = users.len(), "password file loaded");
        let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
        if mode & 0o077 != 0 {
            tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "password file is readable by other users; tern passwd writes it with mode 0600");
        }
        Ok(Self {
            path: path.to_owned(),
            state: Mutex::new(Loaded { stamp, users }),
        })
    }

    /// Blocking: may re-read the file, then runs argon2 in `memory`.
    fn verify(&self, user: &str, password: &str, memory: &mut Memory) -> bool {
        let (hash, known) = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            self.refresh(&mut state);
            match state.users.get(user) {
                Some(hash) => (hash.clone(), true),
                // Unknown users cost the same time as known ones, so timing tells no names.
                None => match state.users.values().next() {
                    Some(any) => (any.clone(), false),
                    None => return false,
                },
            }
        };
        memory.verify(&hash, password) && known
    }

    fn refresh(&self, state: &mut Loaded) {
        let now = stamp(&self.path);
        if now == state.stamp {
            return;
        }
        match PasswordFile::load(&self.path) {
            Ok(file) => {
                state.users = file.users();
                state.stamp = now;
                tracing::info!(path = %self.path.display(), users = state.users.len(), "password file reloaded");
            }
            Err(err) => tracing::warn!(%err, "keeping the previous password file"),
        }
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

#[cfg(test)]
mod test;
