//! The seam between forwarding and the Kafka client: [`Cluster`] (topics and partition handles
//! of one upstream) and [`Follower`] (one upstream partition: its offsets, the headers of a
//! record, produce), the few operations the forwarders need, so their catch-up, settle and resume
//! run against a fake in unit tests and against the Kafka client (`kafka/`) in the gateway. It also
//! asks the catch-up question through them ([`next_edge_offset`]). It never retries, and never
//! names the Kafka client.

use std::collections::BTreeMap;
use std::future::Future;

use tern_log::StoredRecord;

use crate::bandwidth::Class;
use crate::config::{Codec, ValueFormat};
use crate::error::UpstreamError;
use crate::provenance::{H_OFFSET, H_PARTITION, H_TOPIC, Provenance};

/// What a transactional batch carries: the transactional id, the incarnation and the base
/// sequence of its first record (the next follow on by one per record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnStamp<'a> {
    pub transactional_id: &'a str,
    pub producer_id: i64,
    pub epoch: i16,
    pub first_sequence: i32,
}

/// One upstream cluster as the forwarders use it.
pub trait Cluster: Send + Sync + 'static {
    /// A handle on one partition.
    type Partition: Follower;
    /// The most bytes one produce request carries.
    fn batch_limit(&self) -> u64;
    /// Creates `topic` with `partitions` partitions unless it exists.
    fn ensure_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: u16,
    ) -> impl Future<Output = Result<(), UpstreamError>> + Send;
    /// How many partitions `topic` has (0 when it does not exist).
    fn partition_count(
        &self,
        topic: &str,
    ) -> impl Future<Output = Result<u32, UpstreamError>> + Send;
    /// A handle on `topic`/`partition` at its current leader.
    fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> impl Future<Output = Result<Self::Partition, UpstreamError>> + Send;
    /// A handle for a live copy (`live.rs`): plain batches (its edge offsets have gaps, so no
    /// idempotent sequences), charged to `class` under the bandwidth cap.
    fn live_partition(
        &self,
        topic: &str,
        partition: u32,
        class: Class,
    ) -> impl Future<Output = Result<Self::Partition, UpstreamError>> + Send {
        let _ = class;
        self.partition(topic, partition)
    }
}

/// One upstream partition: the follower of an edge partition in mirror mode.
pub trait Follower: Send + Sync + 'static {
    /// The upstream topic's name, for errors.
    fn topic(&self) -> &str;
    /// The end offset: only records every in-sync replica holds (the high watermark).
    fn end_offset(&self) -> impl Future<Output = Result<i64, UpstreamError>> + Send;
    /// The earliest offset retention left.
    fn start_offset(&self) -> impl Future<Output = Result<i64, UpstreamError>> + Send;
    /// The headers of the record at `offset`; an error when there is none.
    fn headers_at(
        &self,
        offset: i64,
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<u8>>, UpstreamError>> + Send;
    /// Produces `records` from `source` with acks=all, in order, never retrying. An error may
    /// leave a prefix stored; catch-up finds out which.
    fn produce(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        codec: Codec,
        format: ValueFormat,
    ) -> impl Future<Output = Result<(), UpstreamError>> + Send;
    /// Produces `records` from `source` inside `txn`'s open transaction (the partition was
    /// added to it), as [`Follower::produce`] does otherwise.
    fn produce_in_txn(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        (codec, format): (Codec, ValueFormat),
        txn: &TxnStamp<'_>,
    ) -> impl Future<Output = Result<(), UpstreamError>> + Send {
        let _ = txn;
        self.produce(records, source, codec, format)
    }
    /// The next produce does not follow on from the follower's last record (a gap in edge
    /// offsets): an idempotent producer starts its sequence over. Nothing to do by default.
    fn restart_sequence(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Waits until `follower`'s end offset holds still for `wait`: a request cut off in flight may
/// have left a batch on the leader that is not committed yet, and resending it before it shows
/// would duplicate it.
pub async fn settle<F: Follower>(
    follower: &F,
    wait: std::time::Duration,
) -> Result<(), UpstreamError> {
    let mut end = follower.end_offset().await?;
    loop {
        tokio::time::sleep(wait).await;
        let now = follower.end_offset().await?;
        if now == end {
            return Ok(());
        }
        end = now;
    }
}

/// The catch-up question: the edge offset after the last record `follower` holds (0 when it
/// never held any), from the `tern-offset` header of its last record. `None` when it held
/// records but retention removed them all, so there is no last record to ask. Fails when the
/// last record was not mirrored from `source`.
pub async fn next_edge_offset<F: Follower>(
    follower: &F,
    source: &Provenance,
) -> Result<Option<u64>, UpstreamError> {
    let end = follower.end_offset().await?;
    if end <= 0 {
        return Ok(Some(0));
    }
    let start = follower.start_offset().await?;
    if start >= end {
        return Ok(None);
    }
    let headers = follower.headers_at(end - 1).await?;
    let offset = headers
        .get(H_OFFSET)
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse::<u64>().ok());
    let origin_matches = headers.get(H_TOPIC).map(Vec::as_slice) == Some(source.topic.as_bytes())
        && headers.get(H_PARTITION).map(Vec::as_slice)
            == Some(source.partition.to_string().as_bytes());
    match offset {
        Some(offset) if origin_matches => Ok(Some(offset + 1)),
        _ => Err(UpstreamError::NotMirrored {
            topic: follower.topic().to_owned(),
            partition: source.partition,
            offset: u64::try_from(end - 1).unwrap_or(0),
        }),
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod contract;
#[cfg(any(test, feature = "testing"))]
pub mod fake;

#[cfg(test)]
mod tests {
    use tern_log::{Record, StoredRecord};

    use super::fake::FakeCluster;
    use super::*;
    use crate::config::UpstreamConfig;

    fn source(partition: u32) -> Provenance {
        Provenance {
            gateway: "gw".into(),
            topic: "sensors".into(),
            partition,
        }
    }

    fn records(offsets: std::ops::Range<u64>) -> Vec<StoredRecord> {
        let record = |offset| StoredRecord {
            offset,
            record: Record {
                timestamp_ms: 0,
                key: None,
                value: vec![b'x'; 10].into(),
                headers: tern_log::Headers::new(),
            },
        };
        offsets.map(record).collect()
    }

    #[tokio::test]
    async fn the_catch_up_question_reads_the_last_tern_offset_and_checks_its_origin()
    -> Result<(), UpstreamError> {
        let cluster = FakeCluster::new(1024);
        cluster.ensure_topic("up", 1, 1).await?;
        let follower = cluster.partition("up", 0).await?;
        assert_eq!(next_edge_offset(&follower, &source(0)).await?, Some(0));
        let (codec, format) = (UpstreamConfig::default().compression, ValueFormat::Raw);
        follower
            .produce(&records(7..10), &source(0), codec, format)
            .await?;
        assert_eq!(next_edge_offset(&follower, &source(0)).await?, Some(10));
        let foreign = next_edge_offset(&follower, &source(1)).await;
        assert!(
            matches!(foreign, Err(UpstreamError::NotMirrored { offset: 2, .. })),
            "{foreign:?}"
        );
        cluster.trim("up", 0, 3);
        assert_eq!(next_edge_offset(&follower, &source(0)).await?, None);
        Ok(())
    }
}
