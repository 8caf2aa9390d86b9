//! Shared-mode forwarding: many gateways write into one upstream topic per edge topic,
//! `{topic_prefix}{topic}`, each record in the partition Kafka's partitioner picks for its
//! `shared_key`, with the same `tern-*` headers as mirror mode so consumers can deduplicate.
//! Delivery is at least once: progress is the consumer-group offset (group
//! `{topic_prefix}{gateway_id}` by default) of upstream topic `{topic_prefix}{topic}`, partition
//! = the edge partition, holding the next edge offset to forward; it is committed after every
//! produced batch and read back (OffsetFetch) when a session starts, so records after the last
//! commit may be sent again. The local cursor still holds edge retention back and is the
//! fallback when the group has no offset. It never appends to the edge log and never reads
//! records back from Kafka.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;

use tern_core::shutdown::Shutdown;
use tern_log::{LogPort, StoredRecord};

use crate::client::group::Commit;
use crate::client::{ClientError, Settings};
use crate::config::{Mode, UpstreamConfig};
use crate::driver::{self, StatusMap, edge_error, resume_within, run_sessions};
use crate::error::UpstreamError;
use crate::follower::{Cluster, Follower};
use crate::group::GroupClient;
use crate::kafka::tls_config;
use crate::provenance::Provenance;

pub mod partitioner;

/// `{prefix}{edge_topic}`: the upstream topic every gateway shares.
pub fn shared_topic(prefix: &str, edge_topic: &str) -> String {
    format!("{prefix}{edge_topic}")
}

/// The group client for `config` in shared mode (`None` in mirror mode).
pub fn group_client(
    config: &UpstreamConfig,
    gateway: &str,
) -> Result<Option<Arc<GroupClient>>, UpstreamError> {
    if config.mode != Mode::Shared {
        return Ok(None);
    }
    let tls = config.tls.as_ref().map(tls_config).transpose()?;
    let group = config
        .group
        .clone()
        .unwrap_or_else(|| format!("{}{gateway}", config.topic_prefix));
    let settings = Settings {
        bootstrap: config.bootstrap.clone(),
        tls,
        sasl: config.sasl.clone(),
    };
    Ok(Some(Arc::new(GroupClient::new(settings, group))))
}

/// Forwards one edge partition into the shared topic.
#[derive(Debug)]
pub struct SharedForwarder<L, C> {
    config: UpstreamConfig,
    kafka: Arc<C>,
    group: Arc<GroupClient>,
    log: L,
    edge_partitions: u32,
    source: Provenance,
    status: StatusMap,
    topic: String,
}

impl<L: LogPort, C: Cluster> SharedForwarder<L, C> {
    pub fn new(
        config: &UpstreamConfig,
        kafka: &Arc<C>,
        group: &Arc<GroupClient>,
        log: &L,
        edge_partitions: u32,
        source: Provenance,
        status: &StatusMap,
    ) -> Self {
        Self {
            topic: shared_topic(&config.topic_prefix, &source.topic),
            config: config.clone(),
            kafka: Arc::clone(kafka),
            group: Arc::clone(group),
            log: log.clone(),
            edge_partitions,
            source,
            status: Arc::clone(status),
        }
    }

    /// The cursor holding this partition's progress in the log's cursor store.
    fn cursor_name(&self) -> String {
        format!("upstream:{}", self.topic)
    }

    /// Sessions until shutdown, with doubling backoff after failures.
    pub async fn run(self, mut shutdown: Shutdown) {
        let (config, source, status) = (&self.config, &self.source, &self.status);
        let interrupted = "shared forwarding interrupted";
        run_sessions(config, source, status, &mut shutdown, interrupted, || {
            self.session()
        })
        .await;
    }

    /// One session: make sure the topic is usable, resume from the group offset, then produce
    /// and commit batch after batch until an error or until the log closes.
    async fn session(&self) -> Result<(), UpstreamError> {
        let partitions = self.prepare_topic().await?;
        let (topic, partition) = (&self.source.topic, self.source.partition);
        let mut next = self.resume().await?;
        driver::connected(&self.status, &self.source, next);
        let mut upstream = BTreeMap::new();
        let mut durable_end = self
            .log
            .subscribe(topic, partition)
            .map_err(|e| edge_error("subscribe", e))?;
        let max_bytes = usize::try_from(self.config.max_batch_bytes.0).unwrap_or(usize::MAX);
        loop {
            let batch = self
                .log
                .read(topic, partition, next, max_bytes)
                .map_err(|e| edge_error("read", e))?;
            let Some(last) = batch.last().map(|r| r.offset) else {
                if durable_end.changed().await.is_err() {
                    return Ok(());
                }
                continue;
            };
            let (count, bytes) = (
                batch.len(),
                batch.iter().map(|r| r.record.size()).sum::<usize>(),
            );
            for (index, records) in self.split(batch, partitions) {
                let target = match upstream.entry(index) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => {
                        entry.insert(self.kafka.partition(&self.topic, index).await?)
                    }
                };
                self.produce(target, &records).await?;
            }
            next = last + 1;
            self.commit(next).await?;
            driver::forwarded(&self.status, &self.source, next, count, bytes);
        }
    }

    /// Creates the shared topic if needed; its partition count, which must cover every edge
    /// partition because the group offsets are named by edge partition.
    async fn prepare_topic(&self) -> Result<u32, UpstreamError> {
        let wanted = self
            .config
            .shared_partitions
            .unwrap_or(self.edge_partitions)
            .max(self.edge_partitions);
        self.kafka
            .ensure_topic(&self.topic, wanted, self.config.replication_factor)
            .await?;
        let partitions = self.kafka.partition_count(&self.topic).await?;
        if partitions < self.edge_partitions {
            return Err(UpstreamError::TooFewPartitions {
                topic: self.topic.clone(),
                upstream: partitions,
                edge: self.edge_partitions,
            });
        }
        Ok(partitions)
    }

    /// Where to resume: the group's committed offset, else the local cursor, clamped to the log.
    async fn resume(&self) -> Result<u64, UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        let (start, end) = self
            .log
            .offsets(topic, partition)
            .map_err(|e| edge_error("offsets", e))?;
        let cursor = self.log.cursor(&self.cursor_name(), topic, partition);
        let committed = self
            .group
            .fetch(&self.topic, index(partition))
            .await
            .map_err(|source| self.group_error("fetch offset", source))?;
        let resume = match committed {
            Some(offset) => u64::try_from(offset).unwrap_or(0),
            None => {
                if cursor.is_some() {
                    tracing::warn!(%topic, partition, group = %self.group.group(), ?cursor, "the consumer group has no offset (expired?); resuming from the forwarder's cursor");
                }
                cursor.unwrap_or(start)
            }
        };
        let name = self.cursor_name();
        let next =
            resume_within(&self.log, &name, &self.source, (start, end), cursor, resume).await?;
        tracing::info!(%topic, partition, group = %self.group.group(), next, "shared forwarding resumes");
        Ok(next)
    }

    /// Splits a batch by upstream partition, keeping edge order within each.
    fn split(&self, batch: Vec<StoredRecord>, partitions: u32) -> BTreeMap<u32, Vec<StoredRecord>> {
        let mut out: BTreeMap<u32, Vec<StoredRecord>> = BTreeMap::new();
        for record in batch {
            let key = partitioner::routing_key(self.config.shared_key, &record, &self.source);
            let target = partitioner::partition_for(&key, partitions);
            out.entry(target).or_default().push(record);
        }
        out
    }

    async fn produce(
        &self,
        upstream: &C::Partition,
        records: &[StoredRecord],
    ) -> Result<(), UpstreamError> {
        let (codec, format) = (self.config.compression, self.config.value_format);
        upstream.produce(records, &self.source, codec, format).await
    }

    /// Commits `next` to the group, then to the local cursor.
    async fn commit(&self, next: u64) -> Result<(), UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        let metadata = format!(
            "tern edge offset of {}/{topic}/{partition}",
            self.source.gateway
        );
        let commit = Commit {
            topic: &self.topic,
            partition: index(partition),
            offset: i64::try_from(next).unwrap_or(i64::MAX),
            metadata: &metadata,
        };
        self.group
            .commit(&commit)
            .await
            .map_err(|source| self.group_error("commit offset", source))?;
        self.log
            .commit_cursor(&self.cursor_name(), topic, partition, next)
            .await
            .map_err(|e| edge_error("commit cursor", e))
    }

    fn group_error(&self, op: &'static str, source: ClientError) -> UpstreamError {
        UpstreamError::Group {
            op,
            group: self.group.group().to_owned(),
            source,
        }
    }
}

/// An edge partition as a Kafka partition index.
fn index(partition: u32) -> i32 {
    i32::try_from(partition).unwrap_or(i32::MAX)
}
