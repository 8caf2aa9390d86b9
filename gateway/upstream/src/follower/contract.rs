//! The contract of the follower port: one scenario suite, written once against [`Subject`], run
//! against the in-memory [`FakeCluster`](super::fake::FakeCluster) in this crate's unit tests
//! and against a real three-broker Kafka cluster through the Kafka client in the e2e suite
//! (`tests/tests/e2e/upstream_contract.rs`), so what mirror mode's unit tests prove on the fake
//! holds on Kafka. The scenarios are what mirror mode relies on: a new partition is empty, produced
//! records read back in order with the `tern-*` headers naming their edge offsets, the catch-up
//! question answered from them, no leader for a missing topic or partition, an existing topic
//! kept as it is, reads below the log start failing, and an idempotent producer refusing a gap in
//! edge offsets until its sequence restarts and storing a batch sent again only once.

use std::collections::BTreeMap;
use std::future::Future;

use anyhow::{Context, bail, ensure};
use tern_log::{Bytes, Record, StoredRecord};

use crate::config::{Codec, ValueFormat};
use crate::follower::{Cluster, Follower, next_edge_offset};
use crate::provenance::{H_GATEWAY, H_OFFSET, H_PARTITION, H_TOPIC, Provenance};

/// The replication factor the scenarios create topics with (the e2e cluster has three brokers).
const REPLICATION: u16 = 3;

/// An upstream cluster under contract, with the test controls a scenario needs.
pub trait Subject {
    type Cluster: Cluster;

    fn cluster(&self) -> &Self::Cluster;
    /// Creates `topic` with `partitions` partitions; returns once each has a leader.
    fn create(&self, topic: &str, partitions: u32) -> impl Future<Output = anyhow::Result<()>>;
    /// Retention removes every record of `topic`/`partition` before `start` (at most its end).
    fn trim(
        &self,
        topic: &str,
        partition: u32,
        start: i64,
    ) -> impl Future<Output = anyhow::Result<()>>;
}

/// Every scenario's name, in the order [`all`] runs them.
pub const SCENARIOS: [&str; 7] = [
    "a_new_partition_is_empty",
    "produced_records_read_back_in_order",
    "a_missing_topic_or_partition_has_no_leader",
    "an_existing_topic_is_kept",
    "retention_moves_the_start_and_reads_below_it_fail",
    "a_gap_in_edge_offsets_needs_a_new_sequence",
    "a_resent_batch_is_stored_once",
];

/// Runs the scenario called `name` (one of [`SCENARIOS`]) on `subject`.
pub async fn run<S: Subject>(subject: &S, name: &str) -> anyhow::Result<()> {
    match name {
        "a_new_partition_is_empty" => a_new_partition_is_empty(subject).await,
        "produced_records_read_back_in_order" => produced_records_read_back_in_order(subject).await,
        "a_missing_topic_or_partition_has_no_leader" => {
            a_missing_topic_or_partition_has_no_leader(subject).await
        }
        "an_existing_topic_is_kept" => an_existing_topic_is_kept(subject).await,
        "retention_moves_the_start_and_reads_below_it_fail" => {
            retention_moves_the_start_and_reads_below_it_fail(subject).await
        }
        "a_gap_in_edge_offsets_needs_a_new_sequence" => {
            a_gap_in_edge_offsets_needs_a_new_sequence(subject).await
        }
        "a_resent_batch_is_stored_once" => a_resent_batch_is_stored_once(subject).await,
        _ => bail!("no scenario {name}"),
    }
}

/// Runs every scenario on `subject` (one cluster, a topic each), failing with every scenario
/// that failed and why.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub async fn all<S: Subject>(subject: &S) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for name in SCENARIOS {
        if let Err(err) = run(subject, name).await {
            failed.push(format!("{name}: {err:#}"));
        }
    }
    ensure!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
    Ok(())
}

/// The edge partition every scenario mirrors.
fn source() -> Provenance {
    Provenance {
        gateway: "gw-contract".to_owned(),
        topic: "sensors".to_owned(),
        partition: 1,
    }
}

/// Edge records with `offsets`, each value naming its offset.
fn records(offsets: std::ops::Range<u64>) -> Vec<StoredRecord> {
    let record = |offset: u64| StoredRecord {
        offset,
        record: Record {
            timestamp_ms: 0,
            key: Some(Bytes::from_static(b"device")),
            value: format!("reading {offset}").into_bytes().into(),
            headers: tern_log::Headers::new(),
        },
    };
    offsets.map(record).collect()
}

async fn produce<F: Follower>(
    follower: &F,
    offsets: std::ops::Range<u64>,
    codec: Codec,
) -> anyhow::Result<()> {
    let records = records(offsets.clone());
    follower
        .produce(&records, &source(), codec, ValueFormat::Raw)
        .await
        .with_context(|| format!("producing edge offsets {offsets:?}"))
}

/// The follower's offsets: (start, end).
async fn bounds<F: Follower>(follower: &F) -> anyhow::Result<(i64, i64)> {
    Ok((follower.start_offset().await?, follower.end_offset().await?))
}

/// The edge offset in the headers of the record at `offset`, checking the rest of its origin.
async fn edge_offset_at<F: Follower>(follower: &F, offset: i64) -> anyhow::Result<u64> {
    let headers = follower
        .headers_at(offset)
        .await
        .with_context(|| format!("headers at {offset}"))?;
    let header = |name: &str| headers.get(name).map(|v| String::from_utf8_lossy(v));
    let origin = (header(H_GATEWAY), header(H_TOPIC), header(H_PARTITION));
    let source = source();
    let expected = (
        Some(source.gateway.as_str().into()),
        Some(source.topic.as_str().into()),
        Some(source.partition.to_string().into()),
    );
    ensure!(origin == expected, "origin at {offset}: {headers:?}");
    let edge = header(H_OFFSET).with_context(|| format!("no {H_OFFSET} at {offset}"))?;
    Ok(edge.parse()?)
}

async fn headers_fail<F: Follower>(follower: &F, offset: i64) -> anyhow::Result<()> {
    let read: Result<BTreeMap<_, _>, _> = follower.headers_at(offset).await;
    ensure!(read.is_err(), "a record at {offset}: {read:?}");
    Ok(())
}

async fn a_new_partition_is_empty<S: Subject>(subject: &S) -> anyhow::Result<()> {
    let (cluster, topic) = (subject.cluster(), "a_new_partition_is_empty");
    subject.create(topic, 2).await?;
    ensure!(cluster.partition_count(topic).await? == 2);
    for partition in 0..2 {
        let follower = cluster.partition(topic, partition).await?;
        ensure!(bounds(&follower).await? == (0, 0), "partition {partition}");
        ensure!(next_edge_offset(&follower, &source()).await? == Some(0));
        headers_fail(&follower, 0).await?;
    }
    Ok(())
}

async fn produced_records_read_back_in_order<S: Subject>(subject: &S) -> anyhow::Result<()> {
    let (cluster, topic) = (subject.cluster(), "produced_records_read_back_in_order");
    subject.create(topic, 2).await?;
    let follower = cluster.partition(topic, 1).await?;
    produce(&follower, 0..5, Codec::None).await?;
    produce(&follower, 5..9, Codec::Lz4).await?;
    ensure!(
        bounds(&follower).await? == (0, 9),
        "{:?}",
        bounds(&follower).await
    );
    for offset in 0..9 {
        let edge = edge_offset_at(&follower, offset).await?;
        ensure!(
            edge == u64::try_from(offset)?,
            "edge offset {edge} at {offset}"
        );
    }
    headers_fail(&follower, 9).await?;
    ensure!(next_edge_offset(&follower, &source()).await? == Some(9));
    let other = cluster.partition(topic, 0).await?;
    ensure!(bounds(&other).await? == (0, 0), "the other partition");
    let foreign = Provenance {
        partition: 0,
        ..source()
    };
    let asked = next_edge_offset(&follower, &foreign).await;
    ensure!(
        asked.is_err(),
        "another edge partition's follower: {asked:?}"
    );
    Ok(())
}

async fn a_missing_topic_or_partition_has_no_leader<S: Subject>(subject: &S) -> anyhow::Result<()> {
    let (cluster, topic) = (
        subject.cluster(),
        "a_missing_topic_or_partition_has_no_leader",
    );
    ensure!(cluster.partition_count(topic).await? == 0);
    ensure!(cluster.partition(topic, 0).await.is_err(), "missing topic");
    subject.create(topic, 2).await?;
    ensure!(
        cluster.partition(topic, 2).await.is_err(),
        "missing partition"
    );
    ensure!(cluster.partition_count(topic).await? == 2);
    Ok(())
}

async fn an_existing_topic_is_kept<S: Subject>(subject: &S) -> anyhow::Result<()> {
    let (cluster, topic) = (subject.cluster(), "an_existing_topic_is_kept");
    subject.create(topic, 2).await?;
    let follower = cluster.partition(topic, 0).await?;
    produce(&follower, 0..3, Codec::Gzip).await?;
    cluster.ensure_topic(topic, 4, REPLICATION).await?;
    ensure!(cluster.partition_count(topic).await? == 2);
    ensure!(bounds(&follower).await? == (0, 3));
    Ok(())
}

async fn retention_moves_the_start_and_reads_below_it_fail<S: Subject>(
    subject: &S,
) -> anyhow::Result<()> {
    let topic = "retention_moves_the_start_and_reads_below_it_fail";
    subject.create(topic, 1).await?;
    let follower = subject.cluster().partition(topic, 0).await?;
    produce(&follower, 0..6, Codec::Zstd).await?;
    subject.trim(topic, 0, 4).await?;
    ensure!(
        bounds(&follower).await? == (4, 6),
        "{:?}",
        bounds(&follower).await
    );
    headers_fail(&follower, 3).await?;
    ensure!(edge_offset_at(&follower, 4).await? == 4);
    ensure!(next_edge_offset(&follower, &source()).await? == Some(6));
    subject.trim(topic, 0, 6).await?;
    ensure!(bounds(&follower).await? == (6, 6));
    headers_fail(&follower, 5).await?;
    let asked = next_edge_offset(&follower, &source()).await?;
    ensure!(asked.is_none(), "every record removed: {asked:?}");
    Ok(())
}

async fn a_gap_in_edge_offsets_needs_a_new_sequence<S: Subject>(subject: &S) -> anyhow::Result<()> {
    let topic = "a_gap_in_edge_offsets_needs_a_new_sequence";
    subject.create(topic, 1).await?;
    let follower = subject.cluster().partition(topic, 0).await?;
    produce(&follower, 0..3, Codec::Snappy).await?;
    let gap = produce(&follower, 5..7, Codec::Snappy).await;
    ensure!(gap.is_err(), "a gap without a new sequence was stored");
    ensure!(
        bounds(&follower).await? == (0, 3),
        "the refused batch stored records"
    );
    follower.restart_sequence().await;
    produce(&follower, 5..7, Codec::Snappy).await?;
    ensure!(bounds(&follower).await? == (0, 5));
    ensure!(edge_offset_at(&follower, 3).await? == 5);
    ensure!(next_edge_offset(&follower, &source()).await? == Some(7));
    Ok(())
}

/// A batch sent again (its acknowledgement was lost, and catch-up did not see it yet) is
/// acknowledged by the leader without being stored twice.
async fn a_resent_batch_is_stored_once<S: Subject>(subject: &S) -> anyhow::Result<()> {
    let topic = "a_resent_batch_is_stored_once";
    subject.create(topic, 1).await?;
    let follower = subject.cluster().partition(topic, 0).await?;
    produce(&follower, 0..3, Codec::None).await?;
    produce(&follower, 3..5, Codec::None).await?;
    produce(&follower, 3..5, Codec::None).await?;
    ensure!(
        bounds(&follower).await? == (0, 5),
        "{:?}",
        bounds(&follower).await
    );
    produce(&follower, 5..6, Codec::None).await?;
    ensure!(edge_offset_at(&follower, 5).await? == 5);
    Ok(())
}

/// The suite on the in-memory fake: one test per scenario.
#[cfg(test)]
mod on_fake {
    use super::Subject;
    use crate::follower::Cluster;
    use crate::follower::fake::FakeCluster;

    impl Subject for FakeCluster {
        type Cluster = FakeCluster;

        fn cluster(&self) -> &FakeCluster {
            self
        }

        async fn create(&self, topic: &str, partitions: u32) -> anyhow::Result<()> {
            Ok(self
                .ensure_topic(topic, partitions, super::REPLICATION)
                .await?)
        }

        async fn trim(&self, topic: &str, partition: u32, start: i64) -> anyhow::Result<()> {
            FakeCluster::trim(self, topic, partition, start);
            Ok(())
        }
    }

    macro_rules! contract {
        ($($name:ident),* $(,)?) => {
            $(
                #[tokio::test]
                async fn $name() -> anyhow::Result<()> {
                    super::run(&FakeCluster::new(64 * 1024), stringify!($name)).await
                }
            )*

            #[test]
            fn every_scenario_has_a_test() {
                assert_eq!(super::SCENARIOS, [$(stringify!($name)),*]);
            }
        };
    }

    contract!(
        a_new_partition_is_empty,
        produced_records_read_back_in_order,
        a_missing_topic_or_partition_has_no_leader,
        an_existing_topic_is_kept,
        retention_moves_the_start_and_reads_below_it_fail,
        a_gap_in_edge_offsets_needs_a_new_sequence,
        a_resent_batch_is_stored_once,
    );
}
