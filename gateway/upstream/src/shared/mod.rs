//! Shared-mode forwarding: many gateways write into one upstream topic per edge topic,
//! `{topic_prefix}{topic}`, each record in the partition Kafka's partitioner picks for its
//! `shared_key`, with the same `tern-*` headers as mirror mode. Delivery is exactly once for a
//! `read_committed` consumer: progress is the consumer-group offset (group
//! `{topic_prefix}{gateway_id}` by default) of upstream topic `{topic_prefix}{topic}`, partition
//! = the edge partition, holding the next edge offset to forward, and each batch's records and
//! that offset are committed in one Kafka transaction (transactional id
//! `{topic_prefix}{gateway_id}.{topic}.{partition}`, see `txn.rs`): AddPartitionsToTxn,
//! Produce, AddOffsetsToTxn, TxnOffsetCommit, EndTxn. A session starts with InitProducerId,
//! which fences the previous incarnation and aborts what it left open, then reads the offset
//! back (OffsetFetch, stable offsets only), so an aborted batch is sent again and a committed one
//! never is. A caught-up forwarder starts at most one transaction per [`TXN_INTERVAL`]. The
//! local cursor still holds edge retention back and is the fallback when the group has no
//! offset. It never appends to the edge log and never reads records back from Kafka.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;
use std::time::Duration;

use tern_core::shutdown::Shutdown;
use tern_log::{LogPort, StoredRecord};

use crate::ablation::Ablation;
use crate::client::group::Commit;
use crate::client::{ClientError, Settings};
use crate::config::{Mode, UpstreamConfig};
use crate::driver::{self, StatusMap, edge_error, resume_within, run_sessions};
use crate::error::UpstreamError;
use crate::follower::{Cluster, Follower, TxnStamp};
use crate::group::GroupClient;
use crate::kafka::tls_config;
use crate::live::mark_historical;
use crate::provenance::Provenance;
use crate::txn::TxnProducer;

/// A forwarder that has caught up starts a transaction at most this often (a backlog does not
/// wait): at 100 records/s on one edge partition, at most 10 transactions/s of about 10 records.
pub const TXN_INTERVAL: Duration = Duration::from_millis(100);

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
    /// What the bench turned off ([`Ablation::NONE`] but in `tern-bench upstream`).
    ablation: Ablation,
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
            ablation: Ablation::NONE,
        }
    }

    /// This forwarder with the safeguards `ablation` turns off (the bench's at-least-once run).
    pub fn ablated(self, ablation: Ablation) -> Self {
        Self { ablation, ..self }
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

    /// `{prefix}{gateway}.{topic}.{partition}`: this edge partition's transactional id.
    pub fn transactional_id(&self) -> String {
        let source = &self.source;
        let prefix = &self.config.topic_prefix;
        format!(
            "{prefix}{}.{}.{}",
            source.gateway, source.topic, source.partition
        )
    }

    /// One session: make sure the topic is usable, fence the previous incarnation, resume from
    /// the group offset, then forward batch after batch, one transaction each, until an error
    /// or until the log closes.
    async fn session(&self) -> Result<(), UpstreamError> {
        let partitions = self.prepare_topic().await?;
        let (topic, partition) = (&self.source.topic, self.source.partition);
        // No transactional producer only on the bench's at-least-once path.
        let mut txn = (!self.ablation.without_transactions).then(|| {
            TxnProducer::new(
                self.group.settings().clone(),
                self.transactional_id(),
                self.config.transaction_timeout.0,
            )
        });
        if let Some(txn) = txn.as_mut() {
            txn.init()
                .await
                .map_err(|source| self.txn_error(txn, "init producer id", source))?;
        }
        let mut next = self.resume().await?;
        let class = self.config.class_of(topic);
        driver::forwarding(&self.status, &self.source, next, class);
        let mut upstream = BTreeMap::new();
        let mut durable_end = self
            .log
            .subscribe(topic, partition)
            .map_err(|e| edge_error("subscribe", e))?;
        let max_bytes = usize::try_from(self.config.max_batch_bytes.0).unwrap_or(usize::MAX);
        loop {
            let mut batch = self
                .log
                .read(topic, partition, next, max_bytes)
                .map_err(|e| edge_error("read", e))?;
            let Some(last) = batch.last().map(|r| r.offset) else {
                if durable_end.changed().await.is_err() {
                    return Ok(());
                }
                continue;
            };
            mark_historical(&self.config, topic, &mut batch, tern_core::time::now_ms());
            let started = tokio::time::Instant::now();
            let (count, bytes) = (
                batch.len(),
                batch.iter().map(|r| r.record.size()).sum::<usize>(),
            );
            let split = self.split(batch, partitions);
            if let Some(txn) = txn.as_mut() {
                let indexes: Vec<i32> = split.keys().map(|&i| index(i)).collect();
                txn.add_partitions(&self.topic, &indexes)
                    .await
                    .map_err(|source| self.txn_error(txn, "add partitions", source))?;
            }
            for (index, records) in split {
                let target = match upstream.entry(index) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => {
                        entry.insert(self.kafka.partition(&self.topic, index).await?)
                    }
                };
                self.produce(txn.as_mut(), target, index, &records).await?;
            }
            next = last + 1;
            self.commit(txn.as_mut(), next).await?;
            driver::forwarded(&self.status, &self.source, next, count, bytes);
            if bytes < max_bytes / 2 {
                tokio::time::sleep_until(started + TXN_INTERVAL).await;
            }
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
            let target = tern_partitioner::partition_for_key(&key, partitions);
            out.entry(target).or_default().push(record);
        }
        out
    }

    /// Produces `records` to upstream partition `index` inside the open transaction (without
    /// one, bench only: a plain batch).
    async fn produce(
        &self,
        txn: Option<&mut TxnProducer>,
        upstream: &C::Partition,
        index: u32,
        records: &[StoredRecord],
    ) -> Result<(), UpstreamError> {
        let (codec, format) = (self.config.compression, self.config.value_format);
        let Some(txn) = txn else {
            return upstream.produce(records, &self.source, codec, format).await;
        };
        let partition = self::index(index);
        let first_sequence = txn.take_sequence(&self.topic, partition, records.len());
        let Some(id) = txn.id() else {
            return Err(self.txn_error(txn, "produce", not_initialised()));
        };
        let stamp = TxnStamp {
            transactional_id: id.transactional_id,
            producer_id: id.producer_id,
            epoch: id.epoch,
            first_sequence,
        };
        upstream
            .produce_in_txn(records, &self.source, (codec, format), &stamp)
            .await
    }

    /// Commits the transaction with `next` as the group offset (AddOffsetsToTxn,
    /// TxnOffsetCommit, EndTxn), then `next` to the local cursor. Without a transaction (bench
    /// only, [`Ablation::without_transactions`]) a plain OffsetCommit after the
    /// records: at least once, a failure between the two sends the batch again.
    async fn commit(&self, txn: Option<&mut TxnProducer>, next: u64) -> Result<(), UpstreamError> {
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
        match txn {
            Some(txn) => self.commit_in_txn(txn, &commit).await?,
            None => self
                .group
                .commit(&commit)
                .await
                .map_err(|source| self.group_error("commit offset", source))?,
        }
        self.log
            .commit_cursor(&self.cursor_name(), topic, partition, next)
            .await
            .map_err(|e| edge_error("commit cursor", e))
    }

    /// AddOffsetsToTxn, TxnOffsetCommit of `commit`, EndTxn.
    async fn commit_in_txn(
        &self,
        txn: &mut TxnProducer,
        commit: &Commit<'_>,
    ) -> Result<(), UpstreamError> {
        txn.add_offsets(self.group.group())
            .await
            .map_err(|source| self.txn_error(txn, "add offsets", source))?;
        let Some(id) = txn.id() else {
            return Err(self.txn_error(txn, "commit offset", not_initialised()));
        };
        self.group
            .txn_commit(commit, &id)
            .await
            .map_err(|source| self.group_error("commit offset in the transaction", source))?;
        txn.end(true)
            .await
            .map_err(|source| self.txn_error(txn, "commit transaction", source))
    }

    fn txn_error(&self, txn: &TxnProducer, op: &'static str, source: ClientError) -> UpstreamError {
        UpstreamError::Transaction {
            op,
            transactional_id: txn.transactional_id().to_owned(),
            source,
        }
    }

    fn group_error(&self, op: &'static str, source: ClientError) -> UpstreamError {
        UpstreamError::Group {
            op,
            group: self.group.group().to_owned(),
            source,
        }
    }
}

/// The error of a transactional request before InitProducerId answered.
fn not_initialised() -> ClientError {
    ClientError::Missing {
        api: "transaction",
        what: "producer id (InitProducerId first)".to_owned(),
    }
}

/// An edge partition as a Kafka partition index.
fn index(partition: u32) -> i32 {
    i32::try_from(partition).unwrap_or(i32::MAX)
}
