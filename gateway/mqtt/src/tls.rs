//! TLS listeners (`[mqtt.tls]`): rustls with the ring provider, the server certificate chain and
//! key from PEM files, optional client-certificate verification against a CA, and the verified
//! certificate's identity (subject CN, else its first DNS/e-mail/URI SAN) as the MQTT username
//! when `use_identity_as_username` is set. Owns the transport step between `accept` and the MQTT
//! connection; never reads MQTT bytes and never accepts an unverified certificate's identity.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use x509_cert::der::Decode;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

use super::auth::Origin;
use super::broker::Broker;
use super::connection;
use tern_core::InvalidConfig;
use tern_core::shutdown::Shutdown;
use tern_log::LogPort;

const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const SUBJECT_ALT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");

/// `[mqtt.tls]`: a second, TLS-only MQTT listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Address of the TLS listener.
    #[serde(default = "default_tls_listen")]
    pub listen: SocketAddr,
    /// PEM file with the server certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM file with the server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM file of CA certificates that sign client certificates; none = no client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: refuse clients without a valid certificate (false: verify it only
    /// when one is presented).
    #[serde(default = "yes")]
    pub require_client_cert: bool,
    /// The client certificate's CN (else first SAN) becomes the username; no password needed.
    #[serde(default)]
    pub use_identity_as_username: bool,
}

fn default_tls_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8883))
}

fn yes() -> bool {
    true
}

impl TlsConfig {
    /// Checks relations the types cannot express.
    pub fn validate(&self, plain_listen: SocketAddr) -> Result<(), InvalidConfig> {
        let invalid =
            |key: &str, message: &str| tern_core::invalid(&format!("mqtt.tls.{key}"), message);
        if self.listen == plain_listen && self.listen.port() != 0 {
            return Err(invalid("listen", "is already the plain MQTT listener"));
        }
        if self.use_identity_as_username && !(self.client_ca.is_some() && self.require_client_cert)
        {
            return Err(invalid(
                "use_identity_as_username",
                "needs client_ca and require_client_cert = true",
            ));
        }
        Ok(())
    }
}

/// Why a TLS listener could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("cannot read {what} from {path}: {message}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// How connections arrive at one listener.
#[derive(Debug)]
pub struct Transport {
    /// The listener is bound to a loopback address (anonymous clients may be allowed).
    pub loopback: bool,
    pub tls: Option<TlsServer>,
}

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
    /// Reads the PEM files and builds the rustls server configuration.
    pub fn load(config: &TlsConfig) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &config.client_ca {
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs(path, "client CA certificates")? {
                    roots.add(cert)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = if config.require_client_cert {
                    verifier
                } else {
                    verifier.allow_unauthenticated()
                };
                builder.with_client_cert_verifier(verifier.build()?)
            }
            None => builder.with_no_client_auth(),
        };
        let certs = read_certs(&config.cert, "the certificate chain")?;
        let key = PrivateKeyDer::from_pem_file(&config.key).map_err(|err| TlsError::Pem {
            what: "the private key",
            path: config.key.clone(),
            message: err.to_string(),
        })?;
        let server = builder.with_single_cert(certs, key)?;
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            identity_as_username: config.use_identity_as_username,
        })
    }
}

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let failed = |message: String| TlsError::Pem {
        what,
        path: path.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|err| failed(err.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| failed(err.to_string()))?;
    if certs.is_empty() {
        return Err(failed("no CERTIFICATE block".to_owned()));
    }
    Ok(certs)
}

/// Runs one accepted socket: the TLS handshake (within the connect timeout) if the listener
/// has TLS, then the MQTT connection.
pub async fn serve_socket<S: LogPort>(
    broker: Arc<Broker<S>>,
    socket: TcpStream,
    peer: SocketAddr,
    transport: Arc<Transport>,
    shutdown: Shutdown,
) {
    let mut origin = Origin {
        loopback_listener: transport.loopback,
        cert_identity: None,
    };
    let Some(tls) = &transport.tls else {
        connection::serve(broker, socket, peer, origin, shutdown).await;
        return;
    };
    let limit = broker.config.connect_timeout.0;
    let stream = match tokio::time::timeout(limit, tls.acceptor.accept(socket)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::info!(%peer, %err, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "TLS handshake timed out");
            return;
        }
    };
    if tls.identity_as_username {
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(<[_]>::first);
        match leaf.and_then(|cert| identity(cert)) {
            Some(name) => origin.cert_identity = Some(name),
            None => {
                tracing::warn!(%peer, "client certificate has no usable CN or SAN; refused");
                return;
            }
        }
    }
    connection::serve(broker, stream, peer, origin, shutdown).await;
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
#[path = "tls_test.rs"]
mod tests;
