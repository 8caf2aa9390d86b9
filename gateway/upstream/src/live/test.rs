//! Unit tests of `live.rs` on tokio's paused clock, against the in-memory log and the fake
//! follower: what is copied live and when, no copy twice across sessions, the historical mark.

use std::sync::Arc;
use std::time::Duration;

use tern_core::HumanDuration;
use tern_core::shutdown::{self, ShutdownTrigger};
use tern_log::{HeaderName, HeaderValue, MemoryLog, Record};
use tokio::task::JoinHandle;

use super::*;
use crate::follower::fake::FakeCluster;
use crate::mirror::MirrorForwarder;

const TOPIC: &str = "sensors";
const FORWARDED: &str = "tern.gw.sensors";
const LIVE: &str = "tern.gw.sensors.live";
/// A record stamped in 2023: older than any `live_after`.
const OLD: i64 = 1_700_000_000_000;

fn config() -> UpstreamConfig {
    UpstreamConfig {
        backoff_min: HumanDuration(Duration::from_millis(100)),
        backoff_max: HumanDuration(Duration::from_secs(1)),
        catch_up_settle: HumanDuration(Duration::from_millis(500)),
        live_first: vec![TOPIC.to_owned()],
        live_after: HumanDuration(Duration::from_secs(30)),
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

fn record(timestamp_ms: i64, headers: Vec<(HeaderName, HeaderValue)>) -> Record {
    Record {
        timestamp_ms,
        key: None,
        value: vec![b'x'; 100].into(),
        headers: headers.into(),
    }
}

async fn append(log: &MemoryLog, count: usize, timestamp_ms: i64) {
    let records = (0..count)
        .map(|_| record(timestamp_ms, Vec::new()))
        .collect();
    log.append(TOPIC, 0, records).await.expect("append");
}

struct Running {
    trigger: ShutdownTrigger,
    task: JoinHandle<()>,
}

impl Running {
    fn live(cluster: &FakeCluster, log: &MemoryLog, status: &StatusMap) -> Self {
        let (trigger, shutdown) = shutdown::channel();
        let kafka = Arc::new(cluster.clone());
        let live = LiveForwarder::new(&config(), &kafka, log, (FORWARDED, 1), source(), status);
        Self {
            trigger,
            task: tokio::spawn(live.run(shutdown)),
        }
    }

    async fn stop(self) {
        self.trigger.trigger();
        self.task.await.expect("the task ends");
    }
}

/// Waits (paused clock) until `topic` shows `count` records, at most a minute.
async fn wait_for(cluster: &FakeCluster, topic: &str, count: usize) {
    for _ in 0..6_000 {
        if cluster.edge_offsets(topic, 0).len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{topic} shows {:?}", cluster.edge_offsets(topic, 0));
}

/// Waits (paused clock) until the partition's draining flag is `draining`, at most a minute.
async fn wait_draining(status: &StatusMap, draining: bool) {
    for _ in 0..6_000 {
        if self::draining(status).0 == draining {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the partition's draining flag never became {draining}");
}

fn draining(status: &StatusMap) -> (bool, u64) {
    let map = status.lock().unwrap_or_else(|e| e.into_inner());
    map.get(&(TOPIC.to_owned(), 0))
        .map_or((false, 0), |s| (s.draining, s.live_records))
}

#[tokio::test(start_paused = true)]
async fn a_draining_partition_copies_only_its_new_records_and_never_one_twice() {
    let log = MemoryLog::new(1);
    log.ensure_topic(TOPIC).expect("topic");
    let cluster = FakeCluster::new(64 * 1024);
    let status = StatusMap::default();
    // A day's backlog nobody forwarded yet (no forwarder cursor: it starts at the log start).
    append(&log, 50, OLD).await;
    let live = Running::live(&cluster, &log, &status);
    append(&log, 5, tern_core::time::now_ms()).await;
    wait_for(&cluster, LIVE, 5).await;
    assert_eq!(cluster.edge_offsets(LIVE, 0), (50..55).collect::<Vec<_>>());
    assert_eq!(draining(&status), (true, 5));
    // A new session resumes after its last copy (settle, then the last tern-offset).
    live.stop().await;
    append(&log, 5, tern_core::time::now_ms()).await;
    let live = Running::live(&cluster, &log, &status);
    wait_for(&cluster, LIVE, 10).await;
    // The forwarder caught up: nothing is copied any more.
    log.commit_cursor(&format!("upstream:{FORWARDED}"), TOPIC, 0, 60)
        .await
        .expect("cursor");
    append(&log, 3, tern_core::time::now_ms()).await;
    // The live copy looked at the new records and found the partition no longer draining.
    wait_draining(&status, false).await;
    assert_eq!(cluster.edge_offsets(LIVE, 0), (50..60).collect::<Vec<_>>());
    assert_eq!(draining(&status), (false, 10));
    live.stop().await;
}

#[tokio::test(start_paused = true)]
async fn copies_skip_what_turned_old_while_the_link_was_down() {
    let log = MemoryLog::new(1);
    log.ensure_topic(TOPIC).expect("topic");
    let cluster = FakeCluster::new(64 * 1024);
    let status = StatusMap::default();
    append(&log, 20, OLD).await;
    // 10 records of a minute ago (older than live_after), then 4 of now: only those 4 are live.
    append(&log, 10, tern_core::time::now_ms() - 60_000).await;
    append(&log, 4, tern_core::time::now_ms()).await;
    let live = Running::live(&cluster, &log, &status);
    // Copies go in edge order, so a stale record copied by mistake would be among the first four.
    wait_for(&cluster, LIVE, 4).await;
    assert_eq!(cluster.edge_offsets(LIVE, 0), (30..34).collect::<Vec<_>>());
    live.stop().await;
}

#[test]
fn the_backlog_is_marked_historical_and_an_edge_record_cannot_forge_the_mark() {
    let now = 1_800_000_000_000;
    let forged = vec![(H_HISTORICAL.into(), b"1".as_slice().into())];
    let mut batch: Vec<StoredRecord> = [
        record(now - 31_000, Vec::new()),
        record(now - 29_000, forged.clone()),
        record(now, Vec::new()),
    ]
    .into_iter()
    .enumerate()
    .map(|(offset, record)| StoredRecord {
        offset: offset as u64,
        record,
    })
    .collect();
    let marks = |batch: &[StoredRecord]| -> Vec<usize> {
        batch
            .iter()
            .map(|r| {
                r.record
                    .headers
                    .iter()
                    .filter(|(n, _)| *n == H_HISTORICAL)
                    .count()
            })
            .collect()
    };
    // Not live first: untouched, forged header and all.
    let mut plain = batch.clone();
    mark_historical(&UpstreamConfig::default(), TOPIC, &mut plain, now);
    assert_eq!(marks(&plain), [0, 1, 0]);
    mark_historical(&config(), TOPIC, &mut batch, now);
    assert_eq!(marks(&batch), [1, 0, 0]);
    assert_eq!(live_class(Class::Low), Class::Normal);
    assert_eq!(live_class(Class::Normal), Class::High);
    assert_eq!(live_class(Class::High), Class::High);
}

#[tokio::test(start_paused = true)]
async fn the_forwarded_topic_keeps_every_record_in_order_with_the_backlog_marked() {
    let log = MemoryLog::new(1);
    log.ensure_topic(TOPIC).expect("topic");
    let cluster = FakeCluster::new(64 * 1024);
    let status = StatusMap::default();
    append(&log, 8, OLD).await;
    append(&log, 4, tern_core::time::now_ms()).await;
    let (trigger, shutdown) = shutdown::channel();
    let kafka = Arc::new(cluster.clone());
    let forwarder = MirrorForwarder::new(&config(), &kafka, &log, 1, source(), &status);
    let task = tokio::spawn(forwarder.run(shutdown));
    wait_for(&cluster, FORWARDED, 12).await;
    trigger.trigger();
    task.await.expect("the forwarder ends");
    assert_eq!(
        cluster.edge_offsets(FORWARDED, 0),
        (0..12).collect::<Vec<_>>()
    );
    let marked: Vec<bool> = cluster
        .headers(FORWARDED, 0)
        .iter()
        .map(|h| h.get(H_HISTORICAL).is_some_and(|v| v == b"1"))
        .collect();
    assert_eq!(marked, [[true; 8].as_slice(), &[false; 4]].concat());
}
