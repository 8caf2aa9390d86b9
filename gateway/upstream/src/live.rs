//! Live first (`live_first`, `live_after`): while an edge partition of a live-first topic drains
//! a backlog, its new records also go upstream at once, to `{upstream topic}.live`, ahead of
//! the backlog; and the backlog's records carry `tern-historical` in the forwarded topic.
//!
//! The forwarded topic (mirror or shared, [`crate::mirror`], [`crate::shared`]) is untouched:
//! every record, exactly once, in edge order, as without live first. The [`LiveForwarder`] of a
//! partition copies records into a second topic, one per gateway and edge topic in both modes,
//! only while the partition **drains**: its forwarder's next record (the `upstream:` cursor in
//! the log) is older than `live_after`. It copies the records younger than `live_after` that
//! the forwarder has not sent yet, in edge order, each at most once (the mirror catch-up: settle,
//! then the last copy's `tern-offset`), and skips ahead when the copies themselves fall older
//! than `live_after`, so the live topic always carries what is current. It holds no cursor (it
//! never holds retention back) and sends nothing while the forwarder keeps up, so a link that
//! never fails carries every record once. Its requests are charged to the class above the
//! topic's (`high` stays `high`), so a live copy goes before its own topic's backlog.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tern_core::shutdown::Shutdown;
use tern_log::{Bytes, LogPort, StoredRecord};

use crate::ablation::Ablation;
use crate::bandwidth::Class;
use crate::config::UpstreamConfig;
use crate::driver::{self, StatusMap, edge_error, run_sessions};
use crate::error::UpstreamError;
use crate::follower::{Cluster, Follower, next_edge_offset, settle};
use crate::provenance::Provenance;

/// The header a live-first topic's backlog records carry upstream: `1`.
pub const H_HISTORICAL: &str = "tern-historical";
/// The live topic of forwarded topic `upstream_topic`.
pub const LIVE_SUFFIX: &str = ".live";
/// The longest the live copy waits before it looks at the forwarder's progress again (the
/// forwarder moving does not wake it; new records do).
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// Marks the records of `batch` older than `live_after` at `now_ms` as historical (and takes the
/// header off any other, so an edge record cannot pose as one), when `topic` is live first.
pub fn mark_historical(
    config: &UpstreamConfig,
    topic: &str,
    batch: &mut [StoredRecord],
    now_ms: i64,
) {
    if !config.is_live_first(topic) {
        return;
    }
    let cutoff = cutoff(config, now_ms);
    for stored in batch {
        let headers = &mut stored.record.headers;
        headers.retain(|(name, _)| name != H_HISTORICAL);
        if stored.record.timestamp_ms < cutoff {
            headers.push((Cow::Borrowed(H_HISTORICAL), Bytes::from_static(b"1")));
        }
    }
}

/// Records stamped before this are older than `live_after`.
fn cutoff(config: &UpstreamConfig, now_ms: i64) -> i64 {
    let after = i64::try_from(config.live_after.0.as_millis()).unwrap_or(i64::MAX);
    now_ms.saturating_sub(after)
}

/// The class a live copy of `class` is charged to: one above.
pub fn live_class(class: Class) -> Class {
    match class {
        Class::High | Class::Normal => Class::High,
        Class::Low => Class::Normal,
    }
}

/// Copies one live-first edge partition's current records while its forwarder drains.
#[derive(Debug)]
pub struct LiveForwarder<L, C> {
    config: UpstreamConfig,
    kafka: Arc<C>,
    log: L,
    live_topic: String,
    partitions: u32,
    source: Provenance,
    /// The topic the partition's forwarder sends to; its cursor in the log is
    /// `upstream:{forwarded}`.
    forwarded: String,
    /// The forwarder's status map: the live copy adds its counts to the partition's entry.
    status: StatusMap,
}

impl<L: LogPort, C: Cluster> LiveForwarder<L, C> {
    /// The live copy of `source` beside the forwarder that sends it to `upstream_topic`.
    pub fn new(
        config: &UpstreamConfig,
        kafka: &Arc<C>,
        log: &L,
        (upstream_topic, partitions): (&str, u32),
        source: Provenance,
        status: &StatusMap,
    ) -> Self {
        Self {
            config: config.clone(),
            kafka: Arc::clone(kafka),
            log: log.clone(),
            live_topic: format!(
                "{}{}.{}{LIVE_SUFFIX}",
                config.topic_prefix, source.gateway, source.topic
            ),
            partitions,
            forwarded: upstream_topic.to_owned(),
            source,
            status: Arc::clone(status),
        }
    }

    /// This live copy with `ablation`'s safeguards off (the bench's negative control).
    pub fn ablated(self, ablation: Ablation) -> Self {
        match ablation.live_into_forwarded_topic {
            true => Self {
                live_topic: self.forwarded.clone(),
                ..self
            },
            false => self,
        }
    }

    /// Sessions until shutdown; its errors are logged, never shown as the partition's.
    pub async fn run(self, mut shutdown: Shutdown) {
        let own = StatusMap::default();
        let interrupted = "live copy interrupted";
        run_sessions(
            &self.config,
            &self.source,
            &own,
            &mut shutdown,
            interrupted,
            || self.session(&own),
        )
        .await;
    }

    async fn session(&self, own: &StatusMap) -> Result<(), UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        if self.live_topic == self.forwarded {
            // The negative control copies into the forwarded topic itself: copies flowing
            // before its forwarder's catch-up settled would keep that topic's end moving, and
            // the catch-up waiting for ever. They start once the forwarder resumed.
            while !self.forwarder_resumed() {
                tokio::time::sleep(LOOK_AGAIN).await;
            }
        }
        self.kafka
            .ensure_topic(
                &self.live_topic,
                self.partitions,
                self.config.replication_factor,
            )
            .await?;
        let class = live_class(self.config.class_of(topic));
        let upstream = self
            .kafka
            .live_partition(&self.live_topic, partition, class)
            .await?;
        settle(&upstream, self.config.catch_up_settle.0).await?;
        let mut copied = next_edge_offset(&upstream, &self.source)
            .await?
            .unwrap_or(0);
        driver::connected(own, &self.source, copied);
        let mut durable_end = self
            .log
            .subscribe(topic, partition)
            .map_err(|e| edge_error("subscribe", e))?;
        let max_bytes = usize::try_from(self.kafka.batch_limit()).unwrap_or(usize::MAX);
        loop {
            let from = self.copy_from()?;
            self.set_draining(from.is_some());
            if let Some(from) = from {
                let from = from.max(copied);
                let batch = self
                    .log
                    .read(topic, partition, from, max_bytes)
                    .map_err(|e| edge_error("read", e))?;
                if let Some(last) = batch.last().map(|r| r.offset) {
                    let (codec, format) = (self.config.compression, self.config.value_format);
                    upstream
                        .produce(&batch, &self.source, codec, format)
                        .await?;
                    copied = last + 1;
                    let bytes: usize = batch.iter().map(|r| r.record.size()).sum();
                    driver::update(&self.status, &self.source, |s| {
                        s.live_records += batch.len() as u64;
                        s.live_bytes += bytes as u64;
                    });
                    continue;
                }
            }
            tokio::select! {
                changed = durable_end.changed() => if changed.is_err() { return Ok(()) },
                () = tokio::time::sleep(LOOK_AGAIN) => {}
            }
        }
    }

    /// Where the live copy goes on when the partition drains (its forwarder's next record is
    /// older than `live_after`): the first record younger than that, or the forwarder's next
    /// if later; `None` while the forwarder keeps up.
    fn copy_from(&self) -> Result<Option<u64>, UpstreamError> {
        let (topic, partition) = (&self.source.topic, self.source.partition);
        let (start, end) = self
            .log
            .offsets(topic, partition)
            .map_err(|e| edge_error("offsets", e))?;
        let next = self
            .log
            .cursor(&format!("upstream:{}", self.forwarded), topic, partition)
            .unwrap_or(start)
            .max(start);
        if next >= end {
            return Ok(None);
        }
        let head = self
            .log
            .read(topic, partition, next, 1)
            .map_err(|e| edge_error("read", e))?;
        let cutoff = cutoff(&self.config, tern_core::time::now_ms());
        let Some(head) = head.first().filter(|r| r.record.timestamp_ms < cutoff) else {
            return Ok(None);
        };
        let young = self
            .log
            .offset_for_timestamp(topic, partition, cutoff)
            .map_err(|e| edge_error("find by time", e))?
            .unwrap_or(end);
        Ok(Some(young.max(head.offset)))
    }

    /// Whether this partition's forwarder finished its catch-up in its current session.
    fn forwarder_resumed(&self) -> bool {
        let key = (self.source.topic.clone(), self.source.partition);
        let map = self.status.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&key).is_some_and(|s| s.connected)
    }

    fn set_draining(&self, draining: bool) {
        driver::update(&self.status, &self.source, |s| s.draining = draining);
    }
}

#[cfg(test)]
mod test;
