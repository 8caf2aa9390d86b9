//! Forwarding the edge log upstream to the datacenter's Kafka. Mirror mode: every edge
//! partition has a follower partition upstream that catches up exactly once, in order, after
//! every outage (see `forwarder.rs` for the protocol). Shared mode: many gateways write into one
//! topic per edge topic, at least once, with progress in a consumer group (`shared/`, `group/`).
//! This module owns the `[[upstream]]` settings, the error type, upstream topic names and the
//! per-partition metrics. Only `kafka.rs` imports the Kafka client, and only `group/` speaks
//! Kafka's group-offset requests itself; nothing here appends to the edge log or answers devices.

use std::path::PathBuf;

mod bandwidth;
mod config;
mod edge;
mod forwarder;
mod group;
mod kafka;
mod metrics;
mod shared;

pub use bandwidth::BURST as BANDWIDTH_BURST;
pub use config::{
    Codec, Mode, SaslMechanism, SaslSettings, SharedKey, TlsSettings, UpstreamConfig, ValueFormat,
};
pub use edge::{EdgeLog, EdgeLogError, EdgeRecord};
pub use forwarder::{PartitionStatus, StatusMap, run};
pub use group::frame as kafka_frame;
pub use group::wire::Commit;
pub use group::{GroupClient, GroupError};
pub use kafka::{H_DECODE_ERROR, H_GATEWAY, H_OFFSET, H_PARTITION, H_TOPIC, KafkaUpstream};
pub use metrics::UpstreamMetrics;
pub use shared::partitioner::partition_for;
pub use shared::{group_client, shared_topic};

/// Why forwarding stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    #[error("cannot connect to Kafka at {bootstrap}: {message}")]
    Connect { bootstrap: String, message: String },
    #[error("Kafka {op} on {topic}: {message}")]
    Kafka {
        op: &'static str,
        topic: String,
        message: String,
    },
    #[error(
        "upstream topic {topic} is missing and cannot be created ({reason}); create it with as \
         many partitions as the edge topic"
    )]
    MissingTopic { topic: String, reason: String },
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
    Edge {
        op: &'static str,
        source: EdgeLogError,
    },
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
        source: GroupError,
    },
    #[error("upstream TLS: CA file {path}: {message}")]
    Tls { path: PathBuf, message: String },
}

/// Where an upstream record came from: its `tern-*` headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub gateway: String,
    pub topic: String,
    pub partition: u32,
}

/// `{prefix}{gateway}.{edge_topic}`.
pub fn upstream_topic(prefix: &str, gateway: &str, edge_topic: &str) -> String {
    format!("{prefix}{gateway}.{edge_topic}")
}

/// The gateway id: configured, else the host name (characters Kafka refuses become `-`).
pub fn gateway_id(config: &UpstreamConfig) -> String {
    if let Some(id) = &config.gateway_id {
        return id.clone();
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if rc == 0 {
        String::from_utf8_lossy(&buf[..len]).into_owned()
    } else {
        String::new()
    };
    let id: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if id.is_empty() { "tern".to_owned() } else { id }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_topic_names_follow_the_mirror_scheme() {
        assert_eq!(
            upstream_topic("tern.", "pi-7", "sensors"),
            "tern.pi-7.sensors"
        );
    }

    #[test]
    fn gateway_id_prefers_the_configured_one_and_is_a_valid_topic_part() {
        let config = UpstreamConfig {
            gateway_id: Some("gw1".into()),
            ..UpstreamConfig::default()
        };
        assert_eq!(gateway_id(&config), "gw1");
        let host = gateway_id(&UpstreamConfig::default());
        assert!(config::check_topic_part(&host).is_ok(), "{host}");
        assert!(!host.is_empty());
    }
}
