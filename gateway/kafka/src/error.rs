//! `KafkaError`: why the Kafka listener could not start. Errors of single requests never leave
//! their connection (see `api::ApiError`).

use std::net::SocketAddr;

/// Why the Kafka listener could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    #[error("cannot listen for Kafka clients on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("[kafka_listener.tls]: {0}")]
    Tls(#[from] tern_auth::tls::TlsError),
}
