//! Mirror-mode forwarding: one task per edge partition copies its durable records, oldest first
//! and in large batches, to partition p of `{prefix}{gateway_id}.{topic}`. Each session starts
//! with the catch-up protocol — wait for the follower to settle, ask it for the `tern-offset` of
//! its last record and resume after it — and every error ends the session, so the next one asks
//! again. That keeps forwarding exactly once across reconnects, gateway crashes and broker
//! failover. Progress is also committed to the log's cursor store (it holds retention back). It
//! never appends to the edge log and reaches Kafka only through the [`Cluster`] and
//! [`Follower`] traits.

use std::sync::Arc;

use tern_core::shutdown::Shutdown;
use tern_log::{LogPort, StoredRecord};
use tokio::sync::watch;

use crate::config::UpstreamConfig;
use crate::driver::{self, StatusMap, edge_error, resume_within, run_sessions};
use crate::error::UpstreamError;
use crate::follower::{Cluster, Follower, next_edge_offset, settle};
use crate::live::mark_historical;
use crate::provenance::{Provenance, upstream_topic};

/// Forwards one edge partition to its follower.
#[derive(Debug)]
pub struct MirrorForwarder<L, C> {
    config: UpstreamConfig,
    kafka: Arc<C>,
    log: L,
    upstream_topic: String,
    partitions: u32,
    source: Provenance,
    status: StatusMap,
}

impl<L: LogPort, C: Cluster> MirrorForwarder<L, C> {
    pub fn new(
        config: &UpstreamConfig,
        kafka: &Arc<C>,
        log: &L,
        partitions: u32,
        source: Provenance,
        status: &StatusMap,
    ) -> Self {
        Self {
            upstream_topic: upstream_topic(&config.topic_prefix, &source.gateway, &source.topic),
            config: config.clone(),
            kafka: Arc::clone(kafka),
            log: log.clone(),
            partitions,
            source,
            status: Arc::clone(status),
        }
    }

    /// The cursor holding this upstream's progress in the log's cursor store.
    fn cursor_name(&self) -> String {
        format!("upstream:{}", self.upstream_topic)
    }

    /// Sessions until shutdown, with doubling backoff after failures.
    pub async fn run(self, mut shutdown: Shutdown) {
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
        let replication = self.config.replication_factor;
        self.kafka
            .ensure_topic(&self.upstream_topic, self.partitions, replication)
            .await?;
        let upstream = self
            .kafka
            .partition(&self.upstream_topic, partition)
            .await?;
        let mut next = self.catch_up(&upstream).await?;
        let class = self.config.class_of(topic);
        driver::forwarding(&self.status, &self.source, next, class);
        let mut durable_end = self
            .log
            .subscribe(topic, partition)
            .map_err(|e| edge_error("subscribe", e))?;
        let max_bytes = usize::try_from(self.kafka.batch_limit()).unwrap_or(usize::MAX);
        loop {
            let mut batch = self.next_batch(next, max_bytes, &durable_end).await?;
            let Some(last) = batch.last().map(|r| r.offset) else {
                if durable_end.changed().await.is_err() {
                    return Ok(());
                }
                continue;
            };
            mark_historical(&self.config, topic, &mut batch, tern_core::time::now_ms());
            let (codec, format) = (self.config.compression, self.config.value_format);
            upstream
                .produce(&batch, &self.source, codec, format)
                .await?;
            next = last + 1;
            self.log
                .commit_cursor(&self.cursor_name(), topic, partition, next)
                .await
                .map_err(|e| edge_error("commit cursor", e))?;
            let bytes: usize = batch.iter().map(|r| r.record.size()).sum();
            driver::forwarded(&self.status, &self.source, next, batch.len(), bytes);
        }
    }

    /// The records from `next` on, up to `max_bytes`. A batch that is not full and reaches the
    /// durable end (caught up) waits `linger` once for more records and is read again.
    async fn next_batch(
        &self,
        next: u64,
        max_bytes: usize,
        durable_end: &watch::Receiver<u64>,
    ) -> Result<Vec<StoredRecord>, UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        let read = || {
            self.log
                .read(topic, partition, next, max_bytes)
                .map_err(|e| edge_error("read", e))
        };
        let batch = read()?;
        let bytes: usize = batch.iter().map(|r| r.record.size()).sum();
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
    async fn catch_up(&self, upstream: &C::Partition) -> Result<u64, UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        let (start, end) = self
            .log
            .offsets(topic, partition)
            .map_err(|e| edge_error("offsets", e))?;
        let cursor = self.log.cursor(&self.cursor_name(), topic, partition);
        settle(upstream, self.config.catch_up_settle.0).await?;
        let follower_next = next_edge_offset(upstream, &self.source).await?;
        let upstream_next = match follower_next {
            Some(next) => next,
            None => {
                // Upstream retention removed every record: our own cursor is the best record left.
                tracing::warn!(%topic, partition, ?cursor, "upstream partition has no records left; resuming from the forwarder's cursor");
                cursor.unwrap_or(start)
            }
        };
        let name = self.cursor_name();
        let bounds = (start, end);
        let next = resume_within(
            &self.log,
            &name,
            &self.source,
            bounds,
            cursor,
            upstream_next,
        )
        .await?;
        // An empty follower (Some(0)) is no gap: a new partition has no producer state.
        if follower_next != Some(next) {
            upstream.restart_sequence().await;
        }
        Ok(next)
    }
}

#[cfg(test)]
mod test;
