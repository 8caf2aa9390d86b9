//! Server TLS settings shared by the listeners (`[mqtt.tls]`, `[kafka_listener.tls]`): rustls
//! with the ring provider, the certificate chain and key from PEM files, and optional
//! client-certificate verification against a CA. Each listener does its own handshakes and
//! decides what a client certificate means; this module only reads files and builds the
//! rustls configuration.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

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

/// Client certificates a listener asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClientCa<'a> {
    /// PEM file of the CA certificates that sign client certificates.
    pub path: &'a Path,
    /// Whether a client without a certificate is refused.
    pub required: bool,
}

/// Reads the PEM files and builds the rustls server configuration.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<ClientCa<'_>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca.path, "client CA certificates")? {
                roots.add(cert)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if ca.required {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(verifier.build()?)
        }
        None => builder.with_no_client_auth(),
    };
    let certs = read_certs(cert, "the certificate chain")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|err| TlsError::Pem {
        what: "the private key",
        path: key.to_owned(),
        message: err.to_string(),
    })?;
    Ok(Arc::new(builder.with_single_cert(certs, key)?))
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
