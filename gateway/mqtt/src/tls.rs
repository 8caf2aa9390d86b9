//! TLS for the `[mqtt.tls]` listener (settings in `config.rs`; the PEM files and the rustls
//! configuration, client-certificate verification included, are tern-auth's `tls`), the handshake of one accepted socket, and the verified
//! certificate's identity (subject CN, else its first DNS/e-mail/URI SAN) as the MQTT username
//! when `use_identity_as_username` is set. Knows nothing of the broker or connections; never
//! reads MQTT bytes and never accepts an unverified certificate's identity.

use std::net::SocketAddr;
use std::time::Duration;

use tern_auth::tls::{ClientCa, server_config};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use x509_cert::der::Decode;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

use super::config::TlsConfig;

const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const SUBJECT_ALT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");

pub use tern_auth::tls::TlsError;

/// A configured TLS acceptor.
pub struct TlsServer {
    acceptor: TlsAcceptor,
    identity_as_username: bool,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer")
            .field("identity_as_username", &self.identity_as_username)
            .finish_non_exhaustive()
    }
}

impl TlsServer {
    /// Reads the PEM files and builds the rustls server configuration (tern-auth's loader,
    /// shared with the Kafka listener).
    pub fn load(config: &TlsConfig) -> Result<Self, TlsError> {
        let client_ca = config.client_ca.as_deref().map(|path| ClientCa {
            path,
            required: config.require_client_cert,
        });
        let server = server_config(&config.cert, &config.key, client_ca)?;
        Ok(Self {
            acceptor: TlsAcceptor::from(server),
            identity_as_username: config.use_identity_as_username,
        })
    }
}

/// The TLS handshake of one accepted socket, within `limit`, and the client certificate's
/// identity when it becomes the username. `None` (logged) when the client cannot be served.
pub async fn handshake(
    tls: &TlsServer,
    socket: TcpStream,
    peer: SocketAddr,
    limit: Duration,
) -> Option<(TlsStream<TcpStream>, Option<String>)> {
    let stream = match tokio::time::timeout(limit, tls.acceptor.accept(socket)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::info!(%peer, %err, "TLS handshake failed");
            return None;
        }
        Err(_) => {
            tracing::info!(%peer, "TLS handshake timed out");
            return None;
        }
    };
    if !tls.identity_as_username {
        return Some((stream, None));
    }
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(<[_]>::first);
    match leaf.and_then(|cert| identity(cert)) {
        Some(name) => Some((stream, Some(name))),
        None => {
            tracing::warn!(%peer, "client certificate has no usable CN or SAN; refused");
            None
        }
    }
}

/// The certificate's subject CN, else its first DNS name, e-mail address or URI SAN.
pub fn identity(cert: &[u8]) -> Option<String> {
    let cert = x509_cert::Certificate::from_der(cert).ok()?;
    let tbs = &cert.tbs_certificate;
    let common_name = tbs
        .subject
        .0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .filter(|atv| atv.oid == COMMON_NAME)
        .find_map(|atv| attribute_text(&atv.value));
    common_name
        .or_else(|| {
            let extension = tbs
                .extensions
                .as_ref()?
                .iter()
                .find(|e| e.extn_id == SUBJECT_ALT_NAME)?;
            let names = SubjectAltName::from_der(extension.extn_value.as_bytes()).ok()?;
            names.0.into_iter().find_map(|name| match name {
                GeneralName::DnsName(text)
                | GeneralName::Rfc822Name(text)
                | GeneralName::UniformResourceIdentifier(text) => Some(text.to_string()),
                _ => None,
            })
        })
        .filter(|name| !name.is_empty() && !name.contains(':'))
}

fn attribute_text(value: &x509_cert::attr::AttributeValue) -> Option<String> {
    use x509_cert::der::asn1::{Ia5StringRef, PrintableStringRef, Utf8StringRef};
    value
        .decode_as::<Utf8StringRef<'_>>()
        .map(|s| s.as_str().to_owned())
        .or_else(|_| {
            value
                .decode_as::<PrintableStringRef<'_>>()
                .map(|s| s.as_str().to_owned())
        })
        .or_else(|_| {
            value
                .decode_as::<Ia5StringRef<'_>>()
                .map(|s| s.as_str().to_owned())
        })
        .ok()
}

#[cfg(test)]
mod test;
