//! The MQTT 3.1.1/5.0 server: accepts device connections, turns publishes into log records
//! (acknowledged only once durable) and serves subscriptions from the log. The only module that
//! imports `rumqttd`, and only for its packet codecs (in `codec.rs`). It reaches storage only
//! through `tern_log::LogPort`, so unit tests run it on `tern_log::MemoryLog`.

mod admission;
mod auth;
mod broker;
mod clip;
/// Public only for tern-bench's `mqtt/wire.rs` tests, which are being removed; private after.
mod codec;
mod config;
mod connection;
mod error;
mod ingest;
mod listener;
mod message;
mod metrics;
mod outcome;
mod queued;
mod replay;
mod retained;
mod router;
mod session;
mod shared;
mod state;
mod tasks;
mod tls;
mod topic;
mod unclaimed;
mod will;

use std::net::SocketAddr;

pub use broker::Broker;
pub use config::auth::{Access, Anonymous};
pub use config::{MqttConfig, RouteConfig, RouteKey};
pub use listener::MqttListener;
pub use metrics::MqttMetrics;
pub use outcome::COMMAND_HEADER;

/// Why the MQTT server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MqttError {
    #[error("cannot listen for MQTT on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("MQTT authentication: {0}")]
    Auth(#[from] tern_auth::AuthError),
    #[error("MQTT TLS listener: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("cannot open MQTT state in the log: {0}")]
    Log(#[from] tern_log::LogError),
}
