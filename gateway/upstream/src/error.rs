//! [`UpstreamError`]: why forwarding stopped or could not start, one structured variant per
//! cause, for the status map, the log and the binary's exit. It owns no behaviour: the modules
//! that meet a failure build the variant that names it.

use std::path::PathBuf;
use std::sync::Arc;

use tern_log::LogError;

use crate::client::ClientError;

/// Why forwarding stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    #[error("cannot connect to Kafka at {bootstrap}: {source}")]
    Connect {
        bootstrap: String,
        /// Shared: a connect that failed is answered again for a short while without trying.
        #[source]
        source: Arc<ClientError>,
    },
    #[error("Kafka {op} on {topic}: {message}")]
    Kafka {
        op: &'static str,
        topic: String,
        message: String,
    },
    /// The connection failed or was lost (not an answer from a broker): it is dropped, and the
    /// link is probed again soon ([`UpstreamError::is_unreachable`]).
    #[error("Kafka {op} on {topic}: connection lost: {message}")]
    Unreachable {
        op: &'static str,
        topic: String,
        message: String,
    },
    /// A request to the cluster failed: a broker's refusal, or a lost connection
    /// ([`ClientError::is_unreachable`]).
    #[error("Kafka {op} on {topic}: {source}")]
    Client {
        op: &'static str,
        topic: String,
        #[source]
        source: ClientError,
    },
    #[error(
        "upstream topic {topic} is missing and cannot be created ({source}); create it with as \
         many partitions as the edge topic"
    )]
    MissingTopic {
        topic: String,
        #[source]
        source: ClientError,
    },
    /// `tern fleet status` found no status topic.
    #[error(
        "the fleet status topic {topic} does not exist: no gateway has sent a status record to this cluster"
    )]
    NoStatusTopic { topic: String },
    #[error(
        "upstream {topic}/{partition}: the record at offset {offset} was not mirrored from this \
         edge partition (no matching tern-topic/tern-partition/tern-offset headers)"
    )]
    NotMirrored {
        topic: String,
        partition: u32,
        offset: u64,
    },
    #[error(
        "upstream holds {topic}/{partition} up to edge offset {upstream_next}, but the edge log \
         ends at {edge_end}: was the data directory replaced?"
    )]
    AheadOfEdge {
        topic: String,
        partition: u32,
        upstream_next: u64,
        edge_end: u64,
    },
    #[error("edge log {op}: {source}")]
    Edge { op: &'static str, source: LogError },
    #[error(
        "shared upstream topic {topic} has {upstream} partitions, fewer than the {edge} of the \
         edge topic (the group offsets are named by edge partition); add partitions to it"
    )]
    TooFewPartitions {
        topic: String,
        upstream: u32,
        edge: u32,
    },
    #[error("consumer group {group}: {op}: {source}")]
    Group {
        op: &'static str,
        group: String,
        #[source]
        source: ClientError,
    },
    /// Shared mode's transaction failed: the session ends, and the next one starts a new
    /// incarnation (InitProducerId), which aborts the open transaction.
    #[error("transactional producer {transactional_id}: {op}: {source}")]
    Transaction {
        op: &'static str,
        transactional_id: String,
        #[source]
        source: ClientError,
    },
    #[error("downstream into edge topic {topic}: {message}")]
    Downstream { topic: String, message: String },
    #[error("upstream TLS: CA file {path}: {message}")]
    Tls { path: PathBuf, message: String },
}

impl UpstreamError {
    /// Whether Kafka could not be reached at all (no broker answered), as opposed to a broker's
    /// refusal: the driver probes again at a short bounded interval instead of backing off.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Unreachable { .. } => true,
            Self::Group { source, .. }
            | Self::Client { source, .. }
            | Self::Transaction { source, .. } => source.is_unreachable(),
            _ => false,
        }
    }
}
