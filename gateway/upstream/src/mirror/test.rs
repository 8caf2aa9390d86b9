//! Unit tests of `mirror.rs` on tokio's paused clock: sessions against the in-memory log and a
//! fake follower (`follower::fake`) that shows acknowledged produces and hides lost ones.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tern_core::HumanDuration;
use tern_core::shutdown::{self, ShutdownTrigger};
use tern_log::{LogError, LogPort, MemoryLog, Record, TopicInfo};
use tokio::task::JoinHandle;

use super::*;
use crate::follower::fake::{FakeCluster, FakeFollower, Fault};

const TOPIC: &str = "sensors";
const UPSTREAM: &str = "tern.gw.sensors";
const CURSOR: &str = "upstream:tern.gw.sensors";

fn config() -> UpstreamConfig {
    UpstreamConfig {
        backoff_min: HumanDuration(Duration::from_millis(100)),
        backoff_max: HumanDuration(Duration::from_secs(1)),
        catch_up_settle: HumanDuration(Duration::from_millis(500)),
        ..UpstreamConfig::default()
    }
}

fn source() -> Provenance {
    Provenance {
        gateway: "gw".into(),
        topic: TOPIC.into(),
        partition: 0,
    }
}

/// An edge log of one partition holding `count` records of 100 value bytes.
async fn edge_log(count: u64) -> MemoryLog {
    let log = MemoryLog::new(1);
    log.ensure_topic(TOPIC).expect("topic");
    append(&log, count).await;
    log
}

async fn append(log: &MemoryLog, count: u64) {
    let records = (0..count)
        .map(|i| Record {
            timestamp_ms: 1_700_000_000_000,
            key: None,
            value: format!("{i:0100}").into_bytes().into(),
            headers: tern_log::Headers::new(),
        })
        .collect();
    log.append(TOPIC, 0, records).await.expect("append");
}

/// A forwarder running on its own task, and what stops it.
struct Running {
    trigger: ShutdownTrigger,
    task: JoinHandle<()>,
    status: StatusMap,
}

impl Running {
    fn start<L: LogPort>(config: &UpstreamConfig, cluster: &FakeCluster, log: &L) -> Self {
        let (trigger, shutdown) = shutdown::channel();
        let status = StatusMap::default();
        let kafka = Arc::new(cluster.clone());
        let forwarder = MirrorForwarder::new(config, &kafka, log, 1, source(), &status);
        let task = tokio::spawn(forwarder.run(shutdown));
        Self {
            trigger,
            task,
            status,
        }
    }

    fn status(&self) -> crate::driver::PartitionStatus {
        let map = self.status.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(TOPIC.to_owned(), 0)).cloned().unwrap_or_default()
    }

    async fn stop(self) {
        self.trigger.trigger();
        self.task.await.expect("the forwarder task ends");
    }
}

/// Waits (on the paused clock) until the follower shows `count` records, at most a minute.
async fn wait_for(cluster: &FakeCluster, count: usize) {
    for _ in 0..6_000 {
        if cluster.edge_offsets(UPSTREAM, 0).len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the follower shows {:?}, not {count} records",
        cluster.edge_offsets(UPSTREAM, 0)
    );
}

/// The follower partition, created the way the forwarder creates it, for a test to seed.
async fn seeded_follower(cluster: &FakeCluster) -> FakeFollower {
    cluster
        .ensure_topic(UPSTREAM, 1, 1)
        .await
        .expect("create the upstream topic");
    cluster.partition(UPSTREAM, 0).await.expect("partition")
}

fn offsets(range: std::ops::Range<u64>) -> Vec<u64> {
    range.collect()
}

#[tokio::test(start_paused = true)]
async fn a_forwarder_resumes_after_a_clean_stop_without_duplicates() {
    let (log, cluster) = (edge_log(10).await, FakeCluster::new(64 * 1024));
    let first = Running::start(&config(), &cluster, &log);
    wait_for(&cluster, 10).await;
    assert_eq!(first.status().next, 10);
    first.stop().await;
    assert_eq!(log.cursor(CURSOR, TOPIC, 0), Some(10));

    append(&log, 5).await;
    let second = Running::start(&config(), &cluster, &log);
    wait_for(&cluster, 15).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(cluster.edge_offsets(UPSTREAM, 0), offsets(0..15));
    assert_eq!(second.status().forwarded_records, 5);
    second.stop().await;
    assert_eq!(log.cursor(CURSOR, TOPIC, 0), Some(15));
}

#[tokio::test(start_paused = true)]
async fn catch_up_continues_after_what_the_follower_already_holds() {
    let (log, cluster) = (edge_log(10).await, FakeCluster::new(64 * 1024));
    let held = log.read(TOPIC, 0, 0, 4 * 100).expect("read");
    assert_eq!(held.len(), 4);
    let follower = seeded_follower(&cluster).await;
    let (codec, format) = (config().compression, config().value_format);
    follower
        .produce(&held, &source(), codec, format)
        .await
        .expect("seed");
    let running = Running::start(&config(), &cluster, &log);
    wait_for(&cluster, 10).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(cluster.edge_offsets(UPSTREAM, 0), offsets(0..10));
    let status = running.status();
    assert_eq!((status.next, status.forwarded_records), (10, 6));
    running.stop().await;
    assert_eq!(log.cursor(CURSOR, TOPIC, 0), Some(10));
}

#[tokio::test(start_paused = true)]
async fn a_failed_produce_is_caught_up_with_no_gap_and_no_duplicate() {
    let log = edge_log(10).await;
    // Three 100-byte records a request: the first batch is refused, the second stored without
    // its answer and shown only 300 ms later, inside the next session's settle.
    let cluster = FakeCluster::new(300);
    let lost = Fault::LostAck(Duration::from_millis(300));
    cluster.fail_produces([Fault::Refuse, lost]);
    let running = Running::start(&config(), &cluster, &log);
    wait_for(&cluster, 10).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(cluster.edge_offsets(UPSTREAM, 0), offsets(0..10));
    let status = running.status();
    assert_eq!(status.next, 10);
    // The lost batch counts as forwarded only through catch-up, never as a produce.
    assert_eq!(status.forwarded_records, 7);
    assert_eq!((status.connected, status.last_error), (true, None));
    assert_eq!(cluster.produces(), 2 + 3);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_settling_a_lost_batch_would_be_sent_twice() {
    let log = edge_log(3).await;
    // Kafka's idempotent producer would answer the resent batch as a duplicate; a producer
    // without idempotence (the bench's) stores it again.
    let cluster = FakeCluster::new(64 * 1024).without_idempotence();
    cluster.fail_produces([Fault::LostAck(Duration::from_millis(300))]);
    let hasty = UpstreamConfig {
        catch_up_settle: HumanDuration(Duration::from_millis(1)),
        ..config()
    };
    let running = Running::start(&hasty, &cluster, &log);
    wait_for(&cluster, 6).await;
    assert_eq!(cluster.edge_offsets(UPSTREAM, 0), [0, 1, 2, 0, 1, 2]);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_follower_is_retried_until_it_is_back() {
    let (log, cluster) = (edge_log(5).await, FakeCluster::new(64 * 1024));
    cluster.set_down(true);
    let running = Running::start(&config(), &cluster, &log);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = running.status();
    assert!(!status.connected);
    let error = status.last_error.unwrap_or_default();
    assert!(error.contains("broker unreachable"), "{error}");
    cluster.set_down(false);
    wait_for(&cluster, 5).await;
    assert_eq!(cluster.edge_offsets(UPSTREAM, 0), offsets(0..5));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_follower_ahead_of_the_edge_log_stops_forwarding_with_a_clear_error() {
    let (log, cluster) = (edge_log(2).await, FakeCluster::new(64 * 1024));
    let longer = edge_log(5).await;
    let follower = seeded_follower(&cluster).await;
    let held = longer.read(TOPIC, 0, 0, usize::MAX).expect("read");
    let (codec, format) = (config().compression, config().value_format);
    follower
        .produce(&held, &source(), codec, format)
        .await
        .expect("seed");
    let running = Running::start(&config(), &cluster, &log);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let error = running.status().last_error.unwrap_or_default();
    assert!(error.contains("up to edge offset 5"), "{error}");
    assert_eq!(cluster.edge_offsets(UPSTREAM, 0).len(), 5);
    running.stop().await;
}

/// The in-memory log after retention removed every record before `start`.
#[derive(Debug, Clone)]
struct Trimmed {
    log: MemoryLog,
    start: u64,
}

impl LogPort for Trimmed {
    fn topics(&self) -> Vec<TopicInfo> {
        self.log.topics()
    }

    fn ensure_topic(&self, topic: &str) -> Result<u32, LogError> {
        self.log.ensure_topic(topic)
    }

    fn create_topic(&self, topic: &str, partitions: u32) -> Result<u32, LogError> {
        self.log.create_topic(topic, partitions)
    }

    fn add_partitions(&self, topic: &str, total: u32) -> Result<u32, LogError> {
        self.log.add_partitions(topic, total)
    }

    fn delete_topic(&self, topic: &str) -> impl Future<Output = Result<(), LogError>> + Send {
        self.log.delete_topic(topic)
    }

    fn topic_settings(&self, topic: &str) -> Result<tern_log::TopicSettings, LogError> {
        self.log.topic_settings(topic)
    }

    fn default_partitions(&self, topic: &str) -> u32 {
        self.log.default_partitions(topic)
    }

    fn append(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> impl Future<Output = Result<u64, LogError>> + Send {
        self.log.append(topic, partition, records)
    }

    fn enqueue(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> impl Future<Output = Result<tern_log::Queued, LogError>> + Send {
        self.log.enqueue(topic, partition, records)
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<tern_log::StoredRecord>, LogError> {
        let (start, end) = self.offsets(topic, partition)?;
        if from < start {
            return Err(LogError::OffsetOutOfRange {
                topic: topic.to_owned(),
                partition,
                offset: from,
                start,
                end,
            });
        }
        self.log.read(topic, partition, from, max_bytes)
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), LogError> {
        let (_, end) = self.log.offsets(topic, partition)?;
        Ok((self.start, end))
    }

    fn offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        ts_ms: i64,
    ) -> Result<Option<u64>, LogError> {
        let found = self.log.offset_for_timestamp(topic, partition, ts_ms)?;
        Ok(found.map(|offset| offset.max(self.start)))
    }

    fn subscribe(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, LogError> {
        self.log.subscribe(topic, partition)
    }

    fn cursor(&self, name: &str, topic: &str, partition: u32) -> Option<u64> {
        self.log.cursor(name, topic, partition)
    }

    fn commit_cursor(
        &self,
        name: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> impl Future<Output = Result<(), LogError>> + Send {
        self.log.commit_cursor(name, topic, partition, offset)
    }

    fn cursor_names(&self) -> Vec<String> {
        self.log.cursor_names()
    }

    fn remove_cursors(&self, name: &str) -> impl Future<Output = Result<(), LogError>> + Send {
        self.log.remove_cursors(name)
    }
}

#[tokio::test(start_paused = true)]
async fn an_edge_log_whose_start_passed_the_follower_resumes_at_its_start() {
    let log = edge_log(10).await;
    let cluster = FakeCluster::new(64 * 1024);
    let held = log.read(TOPIC, 0, 0, 3 * 100).expect("read");
    let follower = seeded_follower(&cluster).await;
    let (codec, format) = (config().compression, config().value_format);
    follower
        .produce(&held, &source(), codec, format)
        .await
        .expect("seed");
    let trimmed = Trimmed { log, start: 6 };
    let running = Running::start(&config(), &cluster, &trimmed);
    wait_for(&cluster, 7).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(cluster.edge_offsets(UPSTREAM, 0), [0, 1, 2, 6, 7, 8, 9]);
    let status = running.status();
    assert_eq!((status.next, status.forwarded_records), (10, 4));
    assert_eq!(status.last_error, None);
    running.stop().await;
    assert_eq!(trimmed.cursor(CURSOR, TOPIC, 0), Some(10));
}
