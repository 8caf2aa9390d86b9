//! Forwarding the edge log upstream to the datacenter's Kafka. Mirror mode: every edge
//! partition has a follower partition upstream that catches up exactly once, in order, after
//! every outage (`mirror.rs` has the protocol). Shared mode: many gateways write into one topic
//! per edge topic, with progress in a consumer group committed with the records in one Kafka
//! transaction, exactly once for `read_committed` consumers (`shared/`, `group.rs`, `txn.rs`). Both
//! run their partition sessions through `driver.rs`, started by `supervisor.rs`. Kafka is spoken
//! by one client, `client/` (on kafka-protocol), the only module that opens Kafka connections;
//! `kafka/` puts it behind the `follower.rs` traits and `group.rs` keeps shared mode's
//! coordinator connection. The downstream (`downstream/`) reads commands from the same cluster
//! into one edge topic, exactly once; it is the only part that appends to the edge log. Nothing
//! here answers devices.
//!
//! This file only declares the modules and re-exports what other crates use (and the types
//! of the `[[upstream]]` settings' fields).

mod ablation;
mod backlog;
mod bandwidth;
mod client;
mod config;
pub mod downstream;
mod driver;
mod error;
mod fleet;
mod follower;
mod group;
mod kafka;
mod live;
mod metrics;
mod mirror;
mod producer;
mod provenance;
mod shared;
mod supervisor;
mod txn;

pub use ablation::Ablation;
pub use backlog::{Backlog, Backlogs, backlogs};
pub use bandwidth::BURST as BANDWIDTH_BURST;
pub use bandwidth::Class;
pub use client::frame as kafka_frame;
pub use client::group::Commit;
pub use client::{ClientError, SaslError, api_name as kafka_api_name};
pub use config::{
    Codec, CommandStart, CommandsConfig, DEFAULT_TOPIC_CONFIGS, Mode, SaslMechanism, SaslSettings,
    SharedKey, StatusConfig, TlsSettings, TopicConfigValue, UpstreamConfig, ValueFormat,
};
pub use driver::{PartitionStatus, StatusMap};
pub use error::UpstreamError;
pub use fleet::{GatewayStatus, STATUS_TOPIC_CONFIGS, StatusPublisher, read_statuses};
pub use follower::next_edge_offset;
pub use group::GroupClient;
pub use kafka::KafkaUpstream;
pub use metrics::{DownstreamMetrics, UpstreamMetrics};
pub use provenance::{Provenance, gateway_id, upstream_topic};
pub use shared::{group_client, shared_topic};
pub use supervisor::{run, run_ablated};

/// The follower port, its in-memory fake and the contract suite they and the Kafka client
/// share, for other crates' tests (the e2e suite runs the contract on a real cluster).
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::follower::{Cluster, Follower, contract, fake};
}
