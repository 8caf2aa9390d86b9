//! What every listener shares about who may do what: whether anonymous clients are let in,
//! the password file's users (when configured) and the topic ACL, replaceable on SIGHUP. The
//! MQTT listener's CONNECT and the Kafka listener's SASL exchange decide with it; one instance
//! serves both, so they share one verifier thread, one backoff table and one set of rules.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::acl::{Acl, AclConfig, Client, Want};
use super::users::{AuthError, Users};

/// When anonymous clients (no username, or no password file to check it against) are let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "AnonymousText", into = "AnonymousText")]
pub enum Anonymous {
    /// Only on listeners bound to a loopback address (the default, like Mosquitto's).
    #[default]
    Loopback,
    /// On every listener (`allow_anonymous = true`).
    Always,
    /// Never, not even on loopback (`allow_anonymous = false`).
    Never,
}

/// How `allow_anonymous` is written: `"loopback"`, `true` (or `"always"`), `false` (or
/// `"never"`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum AnonymousText {
    Flag(bool),
    Word(String),
}

impl TryFrom<AnonymousText> for Anonymous {
    type Error = String;

    fn try_from(text: AnonymousText) -> Result<Self, String> {
        match text {
            AnonymousText::Flag(true) => Ok(Self::Always),
            AnonymousText::Flag(false) => Ok(Self::Never),
            AnonymousText::Word(word) => match word.as_str() {
                "loopback" => Ok(Self::Loopback),
                "always" => Ok(Self::Always),
                "never" => Ok(Self::Never),
                _ => Err(format!(
                    "expected true, false, \"loopback\", \"always\" or \"never\", got {word:?}"
                )),
            },
        }
    }
}

impl From<Anonymous> for AnonymousText {
    fn from(value: Anonymous) -> Self {
        match value {
            Anonymous::Loopback => Self::Word("loopback".to_owned()),
            Anonymous::Always => Self::Flag(true),
            Anonymous::Never => Self::Flag(false),
        }
    }
}

impl Anonymous {
    /// Whether an anonymous client may connect through a listener bound to a loopback address
    /// (`listener_loopback`) or to any other address.
    pub fn allows(self, listener_loopback: bool) -> bool {
        match self {
            Self::Loopback => listener_loopback,
            Self::Always => true,
            Self::Never => false,
        }
    }
}

/// Anonymous policy, users and rules.
#[derive(Debug)]
pub struct Security {
    anonymous: Anonymous,
    users: Option<Users>,
    /// Replaced whole by [`Security::set_acl`] (SIGHUP).
    acl: RwLock<Arc<Acl>>,
    /// Whether `acl` has rules: without any, every check passes without taking the lock
    /// (two checks per publish: issue #29).
    active: AtomicBool,
}

impl Security {
    /// Loads the password file (which must exist and parse when given).
    pub fn load(
        password_file: Option<&Path>,
        anonymous: Anonymous,
        acl: &[AclConfig],
    ) -> Result<Self, AuthError> {
        let acl = Acl::new(acl.to_vec());
        Ok(Self {
            anonymous,
            users: password_file.map(Users::load).transpose()?,
            active: AtomicBool::new(acl.is_active()),
            acl: RwLock::new(Arc::new(acl)),
        })
    }

    pub fn anonymous(&self) -> Anonymous {
        self.anonymous
    }

    /// The password file's users; `None` when no file is configured.
    pub fn users(&self) -> Option<&Users> {
        self.users.as_ref()
    }

    /// Replaces the ACL rules (a reload); checks already made stand.
    pub fn set_acl(&self, acl: &[AclConfig]) {
        let acl = Acl::new(acl.to_vec());
        let mut current = self.acl.write().unwrap_or_else(|e| e.into_inner());
        self.active.store(acl.is_active(), Ordering::Release);
        *current = Arc::new(acl);
    }

    /// Whether the client may do `want` on `topic`.
    pub fn allows(&self, user: Option<&str>, client_id: &str, want: Want, topic: &str) -> bool {
        if !self.acl_active() {
            return true;
        }
        let acl = self.acl.read().unwrap_or_else(|e| e.into_inner());
        acl.allows(Client { user, client_id }, want, topic)
    }

    /// Whether any ACL rule is configured (so deliveries need checking).
    pub fn acl_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}
