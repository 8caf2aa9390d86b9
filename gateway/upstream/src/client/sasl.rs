//! The client side of the SASL mechanisms `[upstream.sasl]` offers, for every upstream
//! connection: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, RFC 7677), on the key
//! derivation tern-auth's SCRAM server uses (one implementation of the RFC's formulas). It only
//! turns server messages into client messages and checks the server's final signature; it never
//! sends anything (SaslHandshake and SaslAuthenticate are `conn.rs`'s job).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use tern_auth::scram::{Keys, ScramMechanism};

use crate::config::{SaslMechanism, SaslSettings};

/// Why an exchange failed on the client side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SaslError {
    #[error("malformed SCRAM server message: {0}")]
    Malformed(&'static str),
    #[error("the server's SCRAM nonce does not extend ours")]
    Nonce,
    #[error("the server rejected the SCRAM exchange: {0}")]
    Rejected(String),
    #[error("the server's SCRAM signature is wrong (not the server that knows the password)")]
    ServerSignature,
    #[error("no random bytes for the SCRAM nonce")]
    Random,
}

/// Kafka's name of the mechanism.
pub fn mechanism_name(mechanism: SaslMechanism) -> &'static str {
    match mechanism {
        SaslMechanism::Plain => "PLAIN",
        SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
        SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
    }
}

/// PLAIN's single message: `\0user\0password`.
pub fn plain(settings: &SaslSettings) -> Vec<u8> {
    format!("\0{}\0{}", settings.username, settings.password).into_bytes()
}

/// One SCRAM exchange: `first()`, then `answer(server-first)`, then `verify(server-final)`.
#[derive(Debug)]
pub struct Scram {
    sha512: bool,
    password: String,
    first_bare: String,
    nonce: String,
    server_signature: Vec<u8>,
}

impl Scram {
    /// `client_nonce` must be fresh and random for every exchange.
    pub fn new(settings: &SaslSettings, client_nonce: &str) -> Self {
        let user = settings.username.replace('=', "=3D").replace(',', "=2C");
        Self {
            sha512: settings.mechanism == SaslMechanism::ScramSha512,
            password: settings.password.clone(),
            first_bare: format!("n={user},r={client_nonce}"),
            nonce: client_nonce.to_owned(),
            server_signature: Vec::new(),
        }
    }

    /// client-first-message.
    pub fn first(&self) -> Vec<u8> {
        format!("n,,{}", self.first_bare).into_bytes()
    }

    /// client-final-message for `server_first`.
    pub fn answer(&mut self, server_first: &[u8]) -> Result<Vec<u8>, SaslError> {
        let text =
            std::str::from_utf8(server_first).map_err(|_| SaslError::Malformed("not UTF-8"))?;
        let field = |name: &str| {
            text.split(',')
                .find_map(|part| part.strip_prefix(name))
                .ok_or(SaslError::Malformed(match name {
                    "r=" => "no nonce",
                    "s=" => "no salt",
                    _ => "no iteration count",
                }))
        };
        if let Some(error) = text.strip_prefix("e=") {
            return Err(SaslError::Rejected(error.to_owned()));
        }
        let nonce = field("r=")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(SaslError::Nonce);
        }
        let salt = BASE64
            .decode(field("s=")?)
            .map_err(|_| SaslError::Malformed("salt is not base64"))?;
        let iterations = field("i=")?
            .parse::<u32>()
            .ok()
            .and_then(std::num::NonZeroU32::new)
            .ok_or(SaslError::Malformed("bad iteration count"))?;
        let mechanism = if self.sha512 {
            ScramMechanism::Sha512
        } else {
            ScramMechanism::Sha256
        };
        let keys = Keys::derive(mechanism, self.password.as_bytes(), &salt, iterations);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.first_bare);
        let signature = mechanism.hmac_sign(&keys.stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = keys
            .client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        self.server_signature = mechanism.hmac_sign(&keys.server_key, auth_message.as_bytes());
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks server-final-message: the server proves it knows the password too.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), SaslError> {
        let text =
            std::str::from_utf8(server_final).map_err(|_| SaslError::Malformed("not UTF-8"))?;
        if let Some(error) = text.strip_prefix("e=") {
            return Err(SaslError::Rejected(error.to_owned()));
        }
        let verifier = text
            .split(',')
            .find_map(|part| part.strip_prefix("v="))
            .ok_or(SaslError::Malformed("no verifier"))?;
        let got = BASE64
            .decode(verifier)
            .map_err(|_| SaslError::Malformed("verifier is not base64"))?;
        if self.server_signature.is_empty() || got != self.server_signature {
            return Err(SaslError::ServerSignature);
        }
        Ok(())
    }
}

/// A fresh client nonce: 24 random bytes, base64.
pub fn client_nonce() -> Result<String, ring::error::Unspecified> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 24];
    ring::rand::SystemRandom::new().fill(&mut bytes)?;
    Ok(BASE64.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(mechanism: SaslMechanism) -> SaslSettings {
        SaslSettings {
            mechanism,
            username: "user".into(),
            password: "pencil".into(),
            password_file: None,
            password_env: None,
        }
    }

    /// The SCRAM-SHA-256 example of RFC 7677, section 3.
    #[test]
    fn scram_sha_256_follows_rfc_7677() -> Result<(), SaslError> {
        let mut scram = Scram::new(
            &settings(SaslMechanism::ScramSha256),
            "rOprNGfwEbeRWgbNEkqO",
        );
        assert_eq!(scram.first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let final_message = scram.answer(server_first)?;
        assert_eq!(
            String::from_utf8_lossy(&final_message),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        scram.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")?;
        assert_eq!(
            scram.verify(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Err(SaslError::ServerSignature)
        );
        Ok(())
    }

    #[test]
    fn scram_refuses_foreign_nonces_errors_and_garbage() {
        let mut scram = Scram::new(&settings(SaslMechanism::ScramSha512), "abc");
        assert_eq!(
            scram.answer(b"r=xyz123,s=AAAA,i=4096"),
            Err(SaslError::Nonce)
        );
        assert_eq!(
            scram.answer(b"e=invalid-proof"),
            Err(SaslError::Rejected("invalid-proof".into()))
        );
        assert!(matches!(
            scram.answer(b"r=abcdef,s=AAAA,i=0"),
            Err(SaslError::Malformed(_))
        ));
        assert!(matches!(
            scram.answer(&[0xff, 0xfe]),
            Err(SaslError::Malformed(_))
        ));
        // No answer yet: any verifier is wrong.
        assert_eq!(scram.verify(b"v=AAAA"), Err(SaslError::ServerSignature));
    }

    /// Against tern's own SCRAM server (tern-auth), both mechanisms.
    #[test]
    fn scram_agrees_with_terns_server() -> Result<(), Box<dyn std::error::Error>> {
        use tern_auth::scram::{ScramCredential, ScramServer};
        for (mechanism, ours) in [
            (SaslMechanism::ScramSha256, ScramMechanism::Sha256),
            (SaslMechanism::ScramSha512, ScramMechanism::Sha512),
        ] {
            let stored = ScramCredential::generate(ours, "pencil")?;
            let mut server = ScramServer::new(ours);
            let nonce = client_nonce().map_err(|_| SaslError::Random)?;
            let mut client = Scram::new(&settings(mechanism), &nonce);
            let first = server.client_first(&client.first(), |_| Some(stored.clone()))?;
            let (user, last) = server.client_final(&client.answer(&first)?)?;
            assert_eq!(user, "user");
            client.verify(&last)?;
        }
        Ok(())
    }

    #[test]
    fn plain_and_names() -> Result<(), ring::error::Unspecified> {
        assert_eq!(plain(&settings(SaslMechanism::Plain)), b"\0user\0pencil");
        assert_eq!(mechanism_name(SaslMechanism::ScramSha512), "SCRAM-SHA-512");
        let (a, b) = (client_nonce()?, client_nonce()?);
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        Ok(())
    }
}
