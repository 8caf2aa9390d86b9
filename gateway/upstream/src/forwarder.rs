//! Mirror-mode forwarding: one task per edge partition copies its durable records, oldest first
//! and in large batches, to partition p of `{prefix}{gateway_id}.{topic}`. Each session starts
//! with the catch-up protocol — ask the follower for the `tern-offset` of its last record and
//! resume after it — and every error ends the session, so the next one asks again. That keeps
//! forwarding exactly once across reconnects, gateway crashes and broker failover. Progress is
//! also committed to the log's cursor store (it holds retention back). It never appends to the
//! edge log and never talks to Kafka except through `kafka.rs`. In shared mode `run` starts a
//! `shared::SharedForwarder` per edge partition instead.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::config::UpstreamConfig;
use super::edge::{EdgeLog, EdgeRecord};
use super::kafka::{KafkaUpstream, UpstreamPartition};
use super::shared::SharedForwarder;
use super::{Provenance, UpstreamError, upstream_topic};
use tern_core::shutdown::Shutdown;

/// Per-partition progress, shared with the metrics endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionStatus {
    /// Next edge offset to forward (everything before it is upstream).
    pub next: u64,
    pub forwarded_records: u64,
    pub forwarded_bytes: u64,
    pub connected: bool,
    pub last_error: Option<String>,
}

/// Status of every forwarded partition, keyed by (edge topic, partition).
pub type StatusMap = Arc<Mutex<BTreeMap<(String, u32), PartitionStatus>>>;

/// Forwards the edge log to one upstream cluster until `shutdown` fires.
pub async fn run<L: EdgeLog>(
    config: UpstreamConfig,
    gateway: String,
    log: L,
    status: StatusMap,
    mut shutdown: Shutdown,
) -> Result<(), UpstreamError> {
    let Some(kafka) = connect(&config, &mut shutdown).await else {
        return Ok(());
    };
    let kafka = Arc::new(kafka);
    let group = super::shared::group_client(&config, &gateway)?;
    let mut running = HashSet::new();
    let mut tasks = JoinSet::new();
    loop {
        for (topic, partitions) in log.topics() {
            if !config.forwards(&topic) {
                continue;
            }
            for partition in 0..partitions {
                if running.insert((topic.clone(), partition)) {
                    if let Some(group) = &group {
                        let source = Provenance {
                            gateway: gateway.clone(),
                            topic: topic.clone(),
                            partition,
                        };
                        let task = SharedForwarder::new(
                            &config, &kafka, group, &log, partitions, source, &status,
                        );
                        tasks.spawn(task.run(shutdown.clone()));
                        continue;
                    }
                    let forwarder = PartitionForwarder {
                        config: config.clone(),
                        kafka: Arc::clone(&kafka),
                        log: log.clone(),
                        upstream_topic: upstream_topic(&config.topic_prefix, &gateway, &topic),
                        partitions,
                        source: Provenance {
                            gateway: gateway.clone(),
                            topic: topic.clone(),
                            partition,
                        },
                        status: Arc::clone(&status),
                    };
                    tasks.spawn(forwarder.run(shutdown.clone()));
                }
            }
        }
        tokio::select! {
            () = shutdown.wait() => break,
            () = tokio::time::sleep(config.discover_interval.0) => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Connects with backoff; `None` when shutdown came first.
async fn connect(config: &UpstreamConfig, shutdown: &mut Shutdown) -> Option<KafkaUpstream> {
    let mut backoff = config.backoff_min.0;
    loop {
        match KafkaUpstream::connect(config).await {
            Ok(kafka) => return Some(kafka),
            Err(err) => tracing::warn!(%err, ?backoff, "upstream unreachable, retrying"),
        }
        tokio::select! {
            () = shutdown.wait() => return None,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(config.backoff_max.0);
    }
}

struct PartitionForwarder<L> {
    config: UpstreamConfig,
    kafka: Arc<KafkaUpstream>,
    log: L,
    upstream_topic: String,
    partitions: u32,
    source: Provenance,
    status: StatusMap,
}

impl<L: EdgeLog> PartitionForwarder<L> {
    /// The cursor holding this upstream's progress in the log's cursor store.
    fn cursor_name(&self) -> String {
        format!("upstream:{}", self.upstream_topic)
    }

    async fn run(self, mut shutdown: Shutdown) {
        let (config, source, status) = (&self.config, &self.source, &self.status);
        let interrupted = "forwarding interrupted";
        run_sessions(config, source, status, &mut shutdown, interrupted, || {
            self.session()
        })
        .await;
    }

    /// One connected session: catch up, then forward until an error or until the log closes.
    async fn session(&self) -> Result<(), UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        self.kafka
            .ensure_topic(
                &self.upstream_topic,
                self.partitions,
                self.config.replication_factor,
            )
            .await?;
        let upstream = self
            .kafka
            .partition(&self.upstream_topic, partition)
            .await?;
        let mut next = self.catch_up(&upstream).await?;
        self.update(|s| {
            s.connected = true;
            s.next = next;
        });
        let mut durable_end = self
            .log
            .subscribe(topic, partition)
            .map_err(|e| edge_error("subscribe", e))?;
        let max_bytes = usize::try_from(self.kafka.batch_limit()).unwrap_or(usize::MAX);
        loop {
            let batch = self.next_batch(next, max_bytes, &durable_end).await?;
            let Some(last) = batch.last().map(|r| r.offset) else {
                if durable_end.changed().await.is_err() {
                    return Ok(());
                }
                continue;
            };
            upstream
                .produce(
                    &batch,
                    &self.source,
                    self.config.compression,
                    self.config.value_format,
                )
                .await?;
            next = last + 1;
            self.log
                .commit_cursor(&self.cursor_name(), topic, partition, next)
                .await
                .map_err(|e| edge_error("commit cursor", e))?;
            let bytes: usize = batch.iter().map(|r| r.size()).sum();
            self.update(|s| {
                s.next = next;
                s.forwarded_records += batch.len() as u64;
                s.forwarded_bytes += bytes as u64;
                s.last_error = None;
            });
        }
    }

    /// The records from `next` on, up to `max_bytes`. A batch that is not full and reaches the
    /// durable end (caught up) waits `linger` once for more records and is read again.
    async fn next_batch(
        &self,
        next: u64,
        max_bytes: usize,
        durable_end: &watch::Receiver<u64>,
    ) -> Result<Vec<EdgeRecord>, UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        let read = || {
            self.log
                .read(topic, partition, next, max_bytes)
                .map_err(|e| edge_error("read", e))
        };
        let batch = read()?;
        let bytes: usize = batch.iter().map(EdgeRecord::size).sum();
        let caught_up = batch
            .last()
            .is_some_and(|r| r.offset + 1 >= *durable_end.borrow());
        if !caught_up || bytes >= max_bytes || self.config.linger.0.is_zero() {
            return Ok(batch);
        }
        tokio::time::sleep(self.config.linger.0).await;
        read()
    }

    /// Where to resume: after the last record the follower holds, clamped to the edge log.
    async fn catch_up(&self, upstream: &UpstreamPartition) -> Result<u64, UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        let (start, end) = self
            .log
            .offsets(topic, partition)
            .map_err(|e| edge_error("offsets", e))?;
        let cursor = self.log.cursor(&self.cursor_name(), topic, partition);
        self.settle(upstream).await?;
        let upstream_next = match upstream.next_edge_offset(&self.source).await? {
            Some(next) => next,
            None => {
                // Upstream retention removed every record: our own cursor is the best record left.
                tracing::warn!(%topic, partition, ?cursor, "upstream partition has no records left; resuming from the forwarder's cursor");
                cursor.unwrap_or(start)
            }
        };
        let name = self.cursor_name();
        resume_within(
            &self.log,
            &name,
            &self.source,
            (start, end),
            cursor,
            upstream_next,
        )
        .await
    }

    /// Waits until the follower's end offset holds still for `catch_up_settle`: a request cut
    /// off in flight may have left a batch on the leader that is not committed yet, and resending
    /// it before it shows would duplicate it.
    async fn settle(&self, upstream: &UpstreamPartition) -> Result<(), UpstreamError> {
        let mut end = upstream.end_offset().await?;
        loop {
            tokio::time::sleep(self.config.catch_up_settle.0).await;
            let now = upstream.end_offset().await?;
            if now == end {
                return Ok(());
            }
            end = now;
        }
    }

    fn update(&self, change: impl FnOnce(&mut PartitionStatus)) {
        let mut map = self.status.lock().unwrap_or_else(|e| e.into_inner());
        change(
            map.entry((self.source.topic.clone(), self.source.partition))
                .or_default(),
        );
    }
}

pub(super) fn edge_error(op: &'static str, source: super::edge::EdgeLogError) -> UpstreamError {
    UpstreamError::Edge { op, source }
}

/// Where a session resumes, given the offset the follower or the group says is next: an error
/// past the edge log's end, the log start (with a warning) if retention passed it, and the
/// forwarder's cursor (`cursor_name`, now at `cursor`) moved there. Both modes resume through it.
pub(super) async fn resume_within<L: EdgeLog>(
    log: &L,
    cursor_name: &str,
    source: &Provenance,
    (start, end): (u64, u64),
    cursor: Option<u64>,
    resume: u64,
) -> Result<u64, UpstreamError> {
    let (topic, partition) = (&source.topic, source.partition);
    if resume > end {
        return Err(UpstreamError::AheadOfEdge {
            topic: topic.clone(),
            partition,
            upstream_next: resume,
            edge_end: end,
        });
    }
    let next = if resume < start {
        tracing::warn!(%topic, partition, lost = start - resume, "records left the edge log before they were forwarded");
        start
    } else {
        resume
    };
    if cursor != Some(next) {
        log.commit_cursor(cursor_name, topic, partition, next)
            .await
            .map_err(|e| edge_error("commit cursor", e))?;
    }
    Ok(next)
}

/// Runs `session` again and again until shutdown, or until one ends without an error (the edge
/// log closed). After a failure it records the error in `status`, logs it with `interrupted`, and
/// waits a doubling backoff between `backoff_min` and `backoff_max`, reset once a session
/// forwarded records. Both modes' partition tasks run their sessions through it.
pub(super) async fn run_sessions<F, Fut>(
    config: &UpstreamConfig,
    source: &Provenance,
    status: &StatusMap,
    shutdown: &mut Shutdown,
    interrupted: &'static str,
    mut session: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), UpstreamError>>,
{
    let key = (source.topic.clone(), source.partition);
    let forwarded = || {
        let map = status.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&key).map_or(0, |s| s.forwarded_records)
    };
    let mut backoff = config.backoff_min.0;
    loop {
        let before = forwarded();
        let ended = tokio::select! {
            () = shutdown.wait() => return,
            result = session() => result,
        };
        let Err(err) = ended else { return };
        if forwarded() > before {
            backoff = config.backoff_min.0;
        }
        tracing::warn!(topic = %source.topic, partition = source.partition, %err, ?backoff, "{interrupted}");
        {
            let mut map = status.lock().unwrap_or_else(|e| e.into_inner());
            let entry = map.entry(key.clone()).or_default();
            entry.connected = false;
            entry.last_error = Some(err.to_string());
        }
        tokio::select! {
            () = shutdown.wait() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(config.backoff_max.0);
    }
}
