//! SASL on the Kafka listener: the mechanisms (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`), the
//! PLAIN message parser, and one connection's authentication state, which decides which
//! requests it admits. SaslHandshake (KIP-43) picks the mechanism, SaslAuthenticate (KIP-152)
//! carries its tokens; until the exchange succeeds only ApiVersions, SaslHandshake and
//! SaslAuthenticate are admitted. PLAIN is checked by tern-auth's argon2 verifier, SCRAM by its
//! server over the password file's SCRAM credentials, both with its failed-login backoff: the
//! same users as MQTT.
//!
//! Knows no Kafka message type (that is `api/sasl_*.rs`) and never logs a password or an
//! attempted username.

use std::net::IpAddr;

use kafka_protocol::messages::ApiKey;
use serde::{Deserialize, Serialize};
use tern_auth::scram::{ScramError, ScramMechanism, ScramServer};
use tern_auth::{Refusal, Users};

/// Longest PLAIN message accepted (names and passwords beyond this are not real).
const MAX_PLAIN: usize = 4096;

/// A SASL mechanism the listener can offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Mechanism {
    /// RFC 4616: username and password in the clear (so only over TLS or loopback).
    Plain,
    /// RFC 5802/7677 SCRAM-SHA-256 or SCRAM-SHA-512.
    Scram(ScramMechanism),
}

impl Mechanism {
    /// The three, in the order of the default `sasl_mechanisms`.
    pub const ALL: [Self; 3] = [
        Self::Plain,
        Self::Scram(ScramMechanism::Sha256),
        Self::Scram(ScramMechanism::Sha512),
    ];

    /// The IANA/Kafka name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::Scram(scram) => scram.name(),
        }
    }

    /// The mechanism of a name, case-insensitively.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
    }
}

impl TryFrom<String> for Mechanism {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        Self::from_name(&name).ok_or_else(|| {
            format!("unknown SASL mechanism {name:?} (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
        })
    }
}

impl From<Mechanism> for String {
    fn from(mechanism: Mechanism) -> Self {
        mechanism.name().to_owned()
    }
}

/// Why a SASL exchange failed; the message goes to the client in SaslAuthenticate's
/// `error_message`, so it never says whether the user exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SaslError {
    #[error("malformed PLAIN message: {0}")]
    MalformedPlain(&'static str),
    #[error("PLAIN authorization id differs from the username")]
    PlainAuthzId,
    #[error("authentication failed: {0}")]
    Scram(ScramError),
    #[error("authentication failed: {0}")]
    Refused(Refusal),
    #[error("no password file is configured")]
    NoUsers,
}

/// PLAIN's `[authzid] NUL authcid NUL passwd` (RFC 4616): the username and the password. An
/// authorization id must be empty or the username (Kafka's rule).
pub fn parse_plain(message: &[u8]) -> Result<(String, String), SaslError> {
    if message.len() > MAX_PLAIN {
        return Err(SaslError::MalformedPlain("message too long"));
    }
    let text = std::str::from_utf8(message).map_err(|_| SaslError::MalformedPlain("not UTF-8"))?;
    let mut fields = text.split('\0');
    let (Some(authzid), Some(user), Some(password), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(SaslError::MalformedPlain(
            "expected authzid, username and password separated by NUL",
        ));
    };
    if user.is_empty() {
        return Err(SaslError::MalformedPlain("empty username"));
    }
    if password.is_empty() {
        return Err(SaslError::MalformedPlain("empty password"));
    }
    if !authzid.is_empty() && authzid != user {
        return Err(SaslError::PlainAuthzId);
    }
    Ok((user.to_owned(), password.to_owned()))
}

/// One connection's authentication.
#[derive(Debug)]
pub struct Session {
    state: State,
    /// A SaslHandshake v0 came: the tokens follow as bare frames (no Kafka header), before
    /// KIP-152's SaslAuthenticate.
    raw: bool,
}

#[derive(Debug)]
enum State {
    /// The listener requires no authentication: everything is admitted, anonymously.
    Open,
    /// Waiting for SaslHandshake.
    Start,
    /// The handshake chose this mechanism; waiting for its first token.
    Chosen(Mechanism),
    /// A SCRAM exchange waiting for client-final.
    Scram(ScramServer),
    Authenticated(String),
    /// The exchange failed; the connection closes after the answer.
    Failed,
}

/// What SaslHandshake got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    Chosen(Mechanism),
    /// Not one of the enabled mechanisms (UNSUPPORTED_SASL_MECHANISM); the connection closes
    /// after the answer.
    Unsupported,
    /// Not expected now: the listener has no SASL, or it was already done (ILLEGAL_SASL_STATE).
    Illegal,
}

/// What one SaslAuthenticate token led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this token back and wait for the next one.
    Continue(Vec<u8>),
    /// Authenticated; send this (possibly empty) last token.
    Done(Vec<u8>),
    /// SASL_AUTHENTICATION_FAILED with this message; the connection closes.
    Failed(SaslError),
    /// No handshake came first (ILLEGAL_SASL_STATE); the connection closes.
    Illegal,
}

impl Session {
    /// A session that must authenticate (`required`) or one admitted anonymously.
    pub fn new(required: bool) -> Self {
        let state = if required { State::Start } else { State::Open };
        Self { state, raw: false }
    }

    /// Whether a request of `api` may be served now.
    pub fn admits(&self, api: ApiKey) -> bool {
        match self.state {
            State::Open | State::Authenticated(_) => true,
            State::Failed => false,
            State::Start | State::Chosen(_) | State::Scram(_) => matches!(
                api,
                ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
            ),
        }
    }

    /// The authenticated username; `None` on a listener without authentication.
    pub fn user(&self) -> Option<&str> {
        match &self.state {
            State::Authenticated(user) => Some(user),
            _ => None,
        }
    }

    /// Whether the exchange failed (the connection must close after its answer).
    pub fn failed(&self) -> bool {
        matches!(self.state, State::Failed)
    }

    /// Whether the next frame is a bare SASL token (after a SaslHandshake v0).
    pub fn raw_tokens(&self) -> bool {
        self.raw && matches!(self.state, State::Chosen(_) | State::Scram(_))
    }

    /// SaslHandshake: picks `name` among `enabled`; `raw` for v0, whose tokens come as bare
    /// frames.
    pub fn handshake(&mut self, name: &str, enabled: &[Mechanism], raw: bool) -> Handshake {
        if !matches!(self.state, State::Start) {
            self.fail_unless_open();
            return Handshake::Illegal;
        }
        match Mechanism::from_name(name).filter(|m| enabled.contains(m)) {
            Some(mechanism) => {
                self.state = State::Chosen(mechanism);
                self.raw = raw;
                Handshake::Chosen(mechanism)
            }
            None => {
                // KIP-43: the server answers with its mechanisms and closes.
                self.state = State::Failed;
                Handshake::Unsupported
            }
        }
    }

    /// SaslAuthenticate: one client token. `users` is `None` when no password file exists.
    pub async fn authenticate(
        &mut self,
        token: &[u8],
        users: Option<&Users>,
        peer: IpAddr,
    ) -> Step {
        let state = std::mem::replace(&mut self.state, State::Failed);
        let (step, next) = match (state, users) {
            (State::Open, _) => (Step::Illegal, State::Open),
            (State::Chosen(_) | State::Scram(_), None) => {
                (Step::Failed(SaslError::NoUsers), State::Failed)
            }
            (State::Chosen(Mechanism::Plain), Some(users)) => plain(token, users, peer).await,
            (State::Chosen(Mechanism::Scram(mechanism)), Some(users)) => {
                scram_first(ScramServer::new(mechanism), token, users, peer)
            }
            (State::Scram(server), Some(users)) => scram_final(server, token, users, peer),
            (State::Start | State::Authenticated(_) | State::Failed, _) => {
                (Step::Illegal, State::Failed)
            }
        };
        self.state = next;
        step
    }

    fn fail_unless_open(&mut self) {
        if !matches!(self.state, State::Open) {
            self.state = State::Failed;
        }
    }
}

/// PLAIN: the password on the verifier thread (which applies the backoff).
async fn plain(token: &[u8], users: &Users, peer: IpAddr) -> (Step, State) {
    let (user, password) = match parse_plain(token) {
        Ok(parsed) => parsed,
        Err(err) => {
            users.record(Some(peer), false);
            return (Step::Failed(err), State::Failed);
        }
    };
    match users.check_password(&user, password, Some(peer)).await {
        Ok(()) => (Step::Done(Vec::new()), State::Authenticated(user)),
        Err(refusal) => (Step::Failed(SaslError::Refused(refusal)), State::Failed),
    }
}

/// SCRAM client-first: server-first back, unless the address must wait.
fn scram_first(
    mut server: ScramServer,
    token: &[u8],
    users: &Users,
    peer: IpAddr,
) -> (Step, State) {
    if let Err(refusal) = users.admit(Some(peer)) {
        return (Step::Failed(SaslError::Refused(refusal)), State::Failed);
    }
    let mechanism = server.mechanism();
    match server.client_first(token, |user| users.scram_credential(user, mechanism)) {
        Ok(reply) => (Step::Continue(reply), State::Scram(server)),
        Err(err) => {
            users.record(Some(peer), false);
            (Step::Failed(SaslError::Scram(err)), State::Failed)
        }
    }
}

/// SCRAM client-final: server-final back when the proof holds; the outcome counts for the
/// backoff.
fn scram_final(
    mut server: ScramServer,
    token: &[u8],
    users: &Users,
    peer: IpAddr,
) -> (Step, State) {
    let outcome = server.client_final(token);
    users.record(Some(peer), outcome.is_ok());
    match outcome {
        Ok((user, reply)) => (Step::Done(reply), State::Authenticated(user)),
        Err(err) => (Step::Failed(SaslError::Scram(err)), State::Failed),
    }
}

#[cfg(test)]
mod test;
