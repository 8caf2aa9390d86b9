//! Who may connect and what they may touch: the CONNECT decision (password file, anonymous
//! access per listener, TLS client-certificate identity, the will topic's ACL) and the topic
//! ACL checks connections ask for on PUBLISH, SUBSCRIBE and delivery.
//!
//! The users, the verifier thread, the failed-login backoff and the rules are tern-auth's
//! [`Security`], shared with the Kafka listener; this module only maps its answers to CONNACK
//! codes. Never logs a password, an attempted username or message contents.

use std::net::IpAddr;
use std::sync::Arc;

use tern_auth::{AuthError, Refusal, Security};

use super::codec::{ConnAckCode, Connect};
use super::config::auth::{AclConfig, AuthConfig};

/// What a connection wants to do with a topic.
pub use tern_auth::Want;

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

/// The authentication and authorization state shared by all connections.
#[derive(Debug)]
pub struct Auth {
    security: Arc<Security>,
}

impl Auth {
    /// Loads the password file (which must exist and parse when configured).
    pub fn load(config: &AuthConfig, acl: &[AclConfig]) -> Result<Self, AuthError> {
        let security =
            Security::load(config.password_file.as_deref(), config.allow_anonymous, acl)?;
        Ok(Self {
            security: Arc::new(security),
        })
    }

    /// The shared state, for the other listeners of the same users and rules.
    pub fn security(&self) -> Arc<Security> {
        Arc::clone(&self.security)
    }

    /// Replaces the ACL rules (a reload); checks already made stand.
    pub fn set_acl(&self, acl: &[AclConfig]) {
        self.security.set_acl(acl);
    }

    /// Decides a CONNECT: the authenticated username (`None` = anonymous), or the CONNACK
    /// refusal code.
    pub async fn authenticate(
        &self,
        connect: &Connect,
        origin: &Origin,
    ) -> Result<Option<String>, ConnAckCode> {
        let users = self.security.users();
        let user = match (&origin.cert_identity, &connect.username, users) {
            (Some(identity), _, _) => Some(identity.clone()),
            (None, Some(user), Some(users)) => {
                let password = connect.password.clone().unwrap_or_default();
                users
                    .check_password(user, password, origin.peer)
                    .await
                    .map_err(|refusal| match refusal {
                        Refusal::Throttled => ConnAckCode::ConnectionRateExceeded,
                        _ => ConnAckCode::BadUserNamePassword,
                    })?;
                Some(user.clone())
            }
            (None, _, _) if self.security.anonymous().allows(origin.loopback_listener) => None,
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
        self.security.allows(user, client_id, want, topic)
    }

    /// Whether any ACL rule is configured (so deliveries need checking).
    pub fn acl_active(&self) -> bool {
        self.security.acl_active()
    }
}

#[cfg(test)]
mod test;
