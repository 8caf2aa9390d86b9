//! Fleet status in the datacenter: each gateway's status record, keyed by gateway id, in one
//! compacted topic of the upstream cluster (`[upstream.status]`), so the latest status of every
//! gateway is one read away even for gateways behind NAT. [`StatusPublisher`] sends a record
//! (the gateway's binary composes its JSON, docs/fleet.md has the format); [`read_statuses`]
//! reads the whole topic back and keeps the last record of each gateway (`tern fleet status`).
//! It never reads or writes the edge log.

use std::collections::BTreeMap;

use tern_log::{Record, StoredRecord};

use crate::bandwidth::Class;
use crate::config::{Codec, UpstreamConfig, ValueFormat};
use crate::error::UpstreamError;
use crate::follower::{Cluster, Follower};
use crate::kafka::{KafkaUpstream, UpstreamPartition};
use crate::provenance::Provenance;

/// The topic configs of a status topic tern creates: compacted (the latest record of each
/// gateway stays, older ones go), stamped with the arrival time.
pub const STATUS_TOPIC_CONFIGS: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("message.timestamp.type", "LogAppendTime"),
];
/// The edge topic name a status record claims in its `tern-topic` header: no edge topic has it
/// (names starting with `__` are never forwarded).
pub const STATUS_SOURCE_TOPIC: &str = "__status";
/// The longest a Fetch of the status topic waits at the leader.
const FETCH_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Sends this gateway's status records.
#[derive(Debug)]
pub struct StatusPublisher {
    kafka: KafkaUpstream,
    topic: String,
    partitions: u32,
    replication: u16,
    source: Provenance,
    /// Records sent since start: the `tern-offset` of the next.
    sent: u64,
    /// The handle on the gateway's partition of the topic once open (its leader connection is
    /// kept between records; dropped after an error).
    handle: Option<UpstreamPartition>,
}

impl StatusPublisher {
    /// A publisher for `gateway` over `config`'s cluster; connects on the first record.
    pub fn new(config: &UpstreamConfig, gateway: &str) -> Result<Self, UpstreamError> {
        Ok(Self {
            kafka: KafkaUpstream::new(config)?,
            topic: config.status.topic.clone(),
            partitions: config.status.partitions,
            replication: config.replication_factor,
            source: Provenance {
                gateway: gateway.to_owned(),
                topic: STATUS_SOURCE_TOPIC.to_owned(),
                partition: 0,
            },
            sent: 0,
            handle: None,
        })
    }

    /// Sends `value` keyed by the gateway id, creating the topic (compacted) when it is missing,
    /// to the partition Kafka's partitioner picks for the key, over a kept leader connection.
    /// Never retries: the caller sends the next status at its next turn.
    pub async fn publish(&mut self, value: Vec<u8>) -> Result<(), UpstreamError> {
        let handle = match self.handle.take() {
            Some(handle) => handle,
            None => self.open().await?,
        };
        let record = StoredRecord {
            offset: self.sent,
            record: Record {
                timestamp_ms: tern_core::time::now_ms(),
                key: Some(self.source.gateway.clone().into_bytes().into()),
                value: value.into(),
                headers: tern_log::Headers::new(),
            },
        };
        handle
            .produce(&[record], &self.source, Codec::None, ValueFormat::Raw)
            .await?;
        self.handle = Some(handle);
        self.sent += 1;
        Ok(())
    }

    /// Creates the topic (compacted) when it is missing and opens the gateway's partition.
    async fn open(&self) -> Result<UpstreamPartition, UpstreamError> {
        self.kafka
            .ensure_topic_configured(
                &self.topic,
                self.partitions,
                self.replication,
                STATUS_TOPIC_CONFIGS,
            )
            .await?;
        let count = self.kafka.partition_count(&self.topic).await?;
        let partition = tern_partitioner::partition_for_key(self.source.gateway.as_bytes(), count);
        self.kafka
            .live_partition(&self.topic, partition, Class::High)
            .await
    }
}

/// The last status record of one gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayStatus {
    pub gateway: String,
    pub value: Vec<u8>,
    /// When the record reached Kafka (the topic's `LogAppendTime`), ms since the epoch.
    pub received_ms: i64,
}

/// Every gateway's last status record in `config.status.topic`, by gateway id: the whole topic
/// read from its start to its end, partition by partition (a later record of a key replaces an
/// earlier one; a record without a key or with an empty value, a tombstone, removes it).
pub async fn read_statuses(config: &UpstreamConfig) -> Result<Vec<GatewayStatus>, UpstreamError> {
    let kafka = KafkaUpstream::new(config)?;
    let topic = &config.status.topic;
    let partitions = kafka.partition_count(topic).await?;
    if partitions == 0 {
        return Err(UpstreamError::NoStatusTopic {
            topic: topic.clone(),
        });
    }
    let mut last: BTreeMap<String, GatewayStatus> = BTreeMap::new();
    for partition in 0..partitions {
        let handle = kafka.partition(topic, partition).await?;
        let (mut next, end) = (handle.start_offset().await?, handle.end_offset().await?);
        while next < end {
            let fetched = handle.fetch_committed(next, FETCH_WAIT).await?;
            for record in fetched.records {
                let Some(key) = record.key else { continue };
                let gateway = String::from_utf8_lossy(&key).into_owned();
                match record.value.filter(|v| !v.is_empty()) {
                    Some(value) => {
                        let status = GatewayStatus {
                            gateway: gateway.clone(),
                            value,
                            received_ms: record.timestamp_ms,
                        };
                        last.insert(gateway, status);
                    }
                    None => {
                        last.remove(&gateway);
                    }
                }
            }
            if fetched.next <= next {
                break;
            }
            next = fetched.next;
        }
    }
    Ok(last.into_values().collect())
}
