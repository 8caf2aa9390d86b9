//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): the key derivation both ends share
//! (tern-upstream's client uses it too), the credential a server stores per user (salt,
//! iteration count, StoredKey, ServerKey: never the password), and the server side of one
//! exchange. HMAC, SHA-2 and PBKDF2 come from ring.
//!
//! The server never sees enough to log in as the user: a stolen credential lets an attacker
//! pose as the server, not as the client. Unknown users get a made-up salt so the exchange
//! fails at the proof, like a wrong password, and timing or the first answer tells no names.
//! Pure computation; never does I/O and never logs.

use std::num::NonZeroU32;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::rand::SecureRandom;
use ring::{digest, hmac, pbkdf2};

/// Iteration count of new credentials: Kafka's default and RFC 7677's minimum.
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// Iteration counts accepted from a password file (Kafka's bounds).
const ITERATIONS: std::ops::RangeInclusive<u32> = 4096..=16384;
/// Bytes of salt in new credentials.
const SALT_LEN: usize = 16;
/// Longest client message accepted (a username of 65535 escaped bytes would need more; SASL
/// usernames beyond a few hundred bytes are not real).
const MAX_MESSAGE: usize = 4096;

/// The two SCRAM mechanisms tern serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    /// Both, in the order they are written to the password file.
    pub const ALL: [Self; 2] = [Self::Sha256, Self::Sha512];

    /// The IANA/Kafka name: `SCRAM-SHA-256`, `SCRAM-SHA-512`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "SCRAM-SHA-256",
            Self::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism of a name, case-insensitively.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Self::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Self::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Self::Sha256 => hmac::HMAC_SHA256,
            Self::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Self::Sha256 => &digest::SHA256,
            Self::Sha512 => &digest::SHA512,
        }
    }

    /// Length of a key, a proof and a signature.
    pub fn key_len(self) -> usize {
        self.digest().output_len()
    }

    /// `HMAC(key, message)`.
    pub fn hmac_sign(self, key: &[u8], message: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(self.hmac(), key), message)
            .as_ref()
            .to_vec()
    }

    /// `H(data)`.
    pub fn hash(self, data: &[u8]) -> Vec<u8> {
        digest::digest(self.digest(), data).as_ref().to_vec()
    }
}

/// The keys RFC 5802 derives from a password: the client's and the two a server stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    pub client_key: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl Keys {
    /// SaltedPassword = PBKDF2(password, salt, iterations); ClientKey, StoredKey, ServerKey.
    pub fn derive(
        mechanism: ScramMechanism,
        password: &[u8],
        salt: &[u8],
        iterations: NonZeroU32,
    ) -> Self {
        let mut salted = vec![0u8; mechanism.key_len()];
        pbkdf2::derive(mechanism.pbkdf2(), iterations, salt, password, &mut salted);
        let client_key = mechanism.hmac_sign(&salted, b"Client Key");
        Self {
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac_sign(&salted, b"Server Key"),
            client_key,
        }
    }
}

/// Why a credential could not be made or an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("SCRAM channel binding is not supported")]
    ChannelBinding,
    #[error("the SCRAM authorization id differs from the username")]
    AuthzId,
    #[error("the SCRAM nonce is not the one of this exchange")]
    Nonce,
    #[error("invalid SCRAM proof (wrong password or unknown user)")]
    InvalidProof,
    #[error("SCRAM message out of order")]
    OutOfOrder,
    #[error("no random bytes")]
    Random,
}

/// What a server stores for one user and mechanism.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub mechanism: ScramMechanism,
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// A credential for `password` with a fresh random salt and [`DEFAULT_ITERATIONS`].
    pub fn generate(mechanism: ScramMechanism, password: &str) -> Result<Self, ScramError> {
        let mut salt = vec![0u8; SALT_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut salt)
            .map_err(|_| ScramError::Random)?;
        Ok(Self::derive(mechanism, password, salt, DEFAULT_ITERATIONS))
    }

    /// The credential for `password`, `salt` and `iterations` (clamped to at least 1).
    pub fn derive(
        mechanism: ScramMechanism,
        password: &str,
        salt: Vec<u8>,
        iterations: u32,
    ) -> Self {
        let rounds = NonZeroU32::new(iterations).unwrap_or(NonZeroU32::MIN);
        let keys = Keys::derive(mechanism, password.as_bytes(), &salt, rounds);
        Self {
            mechanism,
            salt,
            iterations,
            stored_key: keys.stored_key,
            server_key: keys.server_key,
        }
    }

    /// The password file's form: `$scram-sha-256$i=4096$<salt>$<StoredKey>$<ServerKey>`
    /// (standard base64).
    pub fn encode(&self) -> String {
        format!(
            "${}$i={}${}${}${}",
            self.mechanism.name().to_ascii_lowercase(),
            self.iterations,
            BASE64.encode(&self.salt),
            BASE64.encode(&self.stored_key),
            BASE64.encode(&self.server_key)
        )
    }

    /// Parses [`ScramCredential::encode`]'s form.
    pub fn decode(text: &str) -> Result<Self, String> {
        let mut parts = text.split('$');
        let (Some(""), Some(name), Some(iterations), Some(salt), Some(stored), Some(server), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err("expected $scram-sha-…$i=N$salt$stored_key$server_key".to_owned());
        };
        let mechanism = ScramMechanism::from_name(name)
            .ok_or_else(|| format!("{name} is not a SCRAM mechanism tern knows"))?;
        let iterations = iterations
            .strip_prefix("i=")
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| ITERATIONS.contains(n))
            .ok_or_else(|| {
                format!(
                    "iteration count must be i=N with N in {}..={}",
                    ITERATIONS.start(),
                    ITERATIONS.end()
                )
            })?;
        let bytes = |what: &str, text: &str| {
            BASE64
                .decode(text)
                .map_err(|_| format!("{what} is not base64"))
        };
        let salt = bytes("salt", salt)?;
        let stored_key = bytes("stored key", stored)?;
        let server_key = bytes("server key", server)?;
        if salt.is_empty() {
            return Err("empty salt".to_owned());
        }
        if stored_key.len() != mechanism.key_len() || server_key.len() != mechanism.key_len() {
            return Err(format!("{} keys are {} bytes", name, mechanism.key_len()));
        }
        Ok(Self {
            mechanism,
            salt,
            iterations,
            stored_key,
            server_key,
        })
    }
}

/// A secret of this process: made-up salts for unknown users come from it, so they are stable
/// for a name (as a real salt would be) and unpredictable.
fn decoy_secret() -> &'static [u8; 32] {
    static SECRET: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| {
        let mut bytes = [0u8; 32];
        // Without the OS random source the salt is still per-user; only its predictability
        // across restarts changes.
        let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
        bytes
    })
}

/// A credential no password matches, for a user the server does not know.
fn decoy(mechanism: ScramMechanism, user: &str) -> ScramCredential {
    let salt = mechanism.hmac_sign(decoy_secret(), user.as_bytes());
    let unmatchable = mechanism.hmac_sign(decoy_secret(), b"no such user");
    ScramCredential {
        mechanism,
        salt: salt.get(..SALT_LEN).unwrap_or(&salt).to_vec(),
        iterations: DEFAULT_ITERATIONS,
        stored_key: unmatchable.clone(),
        server_key: unmatchable,
    }
}

/// The first client message, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    /// The gs2 header (`n,,` or `n,a=user,`), which the final message must echo.
    pub gs2_header: String,
    /// The username, unescaped.
    pub user: String,
    pub nonce: String,
    /// `client-first-message-bare`, part of the AuthMessage.
    pub bare: String,
}

/// Unescapes a SCRAM `saslname` (`=2C` is `,`, `=3D` is `=`; any other `=` is an error).
fn unescape(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(rest.get(..at).unwrap_or_default());
        let code = rest.get(at..at + 3);
        match code {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in the username")),
        }
        rest = rest.get(at + 3..).unwrap_or_default();
    }
    out.push_str(rest);
    Ok(out)
}

fn valid_nonce(nonce: &str) -> bool {
    !nonce.is_empty()
        && nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

fn text(message: &[u8]) -> Result<&str, ScramError> {
    if message.len() > MAX_MESSAGE {
        return Err(ScramError::Malformed("message too long"));
    }
    std::str::from_utf8(message).map_err(|_| ScramError::Malformed("not UTF-8"))
}

impl ClientFirst {
    /// Parses `gs2-header client-first-message-bare`.
    pub fn parse(message: &[u8]) -> Result<Self, ScramError> {
        let text = text(message)?;
        let (flag, rest) = text
            .split_once(',')
            .ok_or(ScramError::Malformed("no gs2 header"))?;
        match flag {
            "n" | "y" => {}
            flag if flag.starts_with("p=") => return Err(ScramError::ChannelBinding),
            _ => return Err(ScramError::Malformed("bad channel-binding flag")),
        }
        let (authzid_raw, bare) = rest
            .split_once(',')
            .ok_or(ScramError::Malformed("no gs2 header"))?;
        let authzid = match authzid_raw {
            "" => None,
            a => Some(unescape(
                a.strip_prefix("a=")
                    .ok_or(ScramError::Malformed("bad authorization id"))?,
            )?),
        };
        let mut fields = bare.split(',');
        let user = match fields.next() {
            Some(field) if field.starts_with("m=") => {
                return Err(ScramError::Malformed(
                    "mandatory extensions are not supported",
                ));
            }
            Some(field) => unescape(
                field
                    .strip_prefix("n=")
                    .ok_or(ScramError::Malformed("no username"))?,
            )?,
            None => return Err(ScramError::Malformed("no username")),
        };
        let nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .filter(|n| valid_nonce(n))
            .ok_or(ScramError::Malformed("no valid nonce"))?;
        if user.is_empty() {
            return Err(ScramError::Malformed("empty username"));
        }
        if authzid.is_some_and(|a| a != user) {
            return Err(ScramError::AuthzId);
        }
        Ok(Self {
            gs2_header: format!("{flag},{authzid_raw},"),
            user,
            nonce: nonce.to_owned(),
            bare: bare.to_owned(),
        })
    }
}

/// The final client message, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFinal {
    /// The decoded `c=` attribute.
    pub channel_binding: Vec<u8>,
    pub nonce: String,
    pub proof: Vec<u8>,
    /// Everything before `,p=`, part of the AuthMessage.
    pub without_proof: String,
}

impl ClientFinal {
    /// Parses `c=…,r=…[,extensions],p=…`.
    pub fn parse(message: &[u8]) -> Result<Self, ScramError> {
        let text = text(message)?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof"))?;
        let mut fields = without_proof.split(',');
        let channel_binding = fields
            .next()
            .and_then(|f| f.strip_prefix("c="))
            .and_then(|c| BASE64.decode(c).ok())
            .ok_or(ScramError::Malformed("no channel binding"))?;
        let nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .filter(|n| valid_nonce(n))
            .ok_or(ScramError::Malformed("no valid nonce"))?;
        let proof = BASE64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("proof is not base64"))?;
        Ok(Self {
            channel_binding,
            nonce: nonce.to_owned(),
            proof,
            without_proof: without_proof.to_owned(),
        })
    }
}

/// Equal in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The server side of one SCRAM exchange.
#[derive(Debug)]
pub struct ScramServer {
    mechanism: ScramMechanism,
    state: State,
}

#[derive(Debug)]
enum State {
    First,
    Final(Box<Pending>),
    Done,
}

/// What the final message is checked against.
#[derive(Debug)]
struct Pending {
    first: ClientFirst,
    credential: ScramCredential,
    known: bool,
    server_first: String,
    nonce: String,
}

impl ScramServer {
    pub fn new(mechanism: ScramMechanism) -> Self {
        Self {
            mechanism,
            state: State::First,
        }
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Answers client-first with server-first; `lookup` finds the user's credential for this
    /// mechanism (`None`: unknown user or none stored, which fails later at the proof).
    pub fn client_first(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Vec<u8>, ScramError> {
        let mut nonce = [0u8; 18];
        ring::rand::SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| ScramError::Random)?;
        self.client_first_with_nonce(message, &BASE64.encode(nonce), lookup)
    }

    /// [`ScramServer::client_first`] with a given server nonce (the RFC's test vectors).
    pub fn client_first_with_nonce(
        &mut self,
        message: &[u8],
        server_nonce: &str,
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.state, State::First) {
            return Err(ScramError::OutOfOrder);
        }
        self.state = State::Done;
        let first = ClientFirst::parse(message)?;
        let found = lookup(&first.user).filter(|c| c.mechanism == self.mechanism);
        let known = found.is_some();
        let credential = found.unwrap_or_else(|| decoy(self.mechanism, &first.user));
        let nonce = format!("{}{server_nonce}", first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&credential.salt),
            credential.iterations
        );
        let reply = server_first.clone().into_bytes();
        self.state = State::Final(Box::new(Pending {
            first,
            credential,
            known,
            server_first,
            nonce,
        }));
        Ok(reply)
    }

    /// Checks client-final: on success the authenticated username and server-final
    /// (`v=ServerSignature`). Any error ends the exchange.
    pub fn client_final(&mut self, message: &[u8]) -> Result<(String, Vec<u8>), ScramError> {
        let State::Final(pending) = std::mem::replace(&mut self.state, State::Done) else {
            return Err(ScramError::OutOfOrder);
        };
        let Pending {
            first,
            credential,
            known,
            server_first,
            nonce,
        } = *pending;
        let last = ClientFinal::parse(message)?;
        if last.channel_binding != first.gs2_header.as_bytes() {
            return Err(ScramError::Malformed(
                "channel binding differs from the gs2 header",
            ));
        }
        // Kafka's rule: the final nonce must end with the exchange's (client + server) nonce.
        // librdkafka 2.x repeats the client nonce in front of it, and Kafka accepts that; the
        // server's random part is still required, and the proof covers what was sent.
        if !last.nonce.ends_with(&nonce) {
            return Err(ScramError::Nonce);
        }
        let auth_message = format!("{},{server_first},{}", first.bare, last.without_proof);
        let m = self.mechanism;
        let signature = m.hmac_sign(&credential.stored_key, auth_message.as_bytes());
        if last.proof.len() != signature.len() {
            return Err(ScramError::InvalidProof);
        }
        let client_key: Vec<u8> = last
            .proof
            .iter()
            .zip(&signature)
            .map(|(p, s)| p ^ s)
            .collect();
        if !same(&m.hash(&client_key), &credential.stored_key) || !known {
            return Err(ScramError::InvalidProof);
        }
        let server_signature = m.hmac_sign(&credential.server_key, auth_message.as_bytes());
        let reply = format!("v={}", BASE64.encode(server_signature)).into_bytes();
        Ok((first.user, reply))
    }
}

#[cfg(test)]
mod test;
