//! [`ConnError`]: why one MQTT connection ended, shared by the connection and the will it may
//! leave behind (a will is validated like a publish when CONNECT arrives). Only describes
//! failures; never decides what to send the client.

use std::sync::Arc;

use tern_log::LogError;

use super::codec::{CodecError, DisconnectReason};
use super::state::StateError;

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("protocol violation: {reason}")]
    Protocol {
        reason: &'static str,
        code: DisconnectReason,
    },
    #[error("log: {0}")]
    Log(#[from] LogError),
    #[error("MQTT state: {0}")]
    State(#[from] StateError),
    /// A publish was not stored (its append, retained update or QoS 2 mark failed).
    #[error("storing a publish: {0}")]
    Ingest(Arc<StateError>),
    #[error("the append task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("the previous connection of client id {client_id} did not let go")]
    Takeover { client_id: String },
}
