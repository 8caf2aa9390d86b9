//! tern's mirror-mode forwarder (`tern_upstream`) as a library against the real three-node
//! Kafka cluster, with tern's in-memory log (`tern_log::MemoryLog`) on the edge side: TLS with a
//! custom CA, which the `--kafka` quick start has no flag for. The exactly-once proof under
//! faults drives the `tern` binary instead (`upstream_faults`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use tern_core::shutdown;
use tern_core::{ByteSize, HumanDuration};
use tern_log::{LogPort, MemoryLog, Record, StoredRecord};
use tern_tests::{KafkaCluster, now_ms};
use tern_upstream::{self, Codec, StatusMap, TlsSettings, UpstreamConfig};

const TOPIC: &str = "sensors";
const PARTITIONS: u32 = 2;
const UPSTREAM: &str = "tern.gw-e2e.sensors";

/// The edge log: tern's in-memory log with the one topic, `count` durable records in each
/// partition.
fn edge_log(count: u64) -> anyhow::Result<MemoryLog> {
    let log = MemoryLog::new(PARTITIONS);
    log.ensure_topic(TOPIC)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for partition in 0..PARTITIONS {
        let records = (0..count)
            .map(|offset| Record {
                timestamp_ms: now_ms(),
                key: Some(format!("dev-{}", offset % 7).into_bytes()),
                value: format!("p{partition}-{offset:06}-{}", "x".repeat(200)).into_bytes(),
                headers: vec![("unit".into(), b"C".to_vec().into())],
            })
            .collect();
        runtime.block_on(log.append(TOPIC, partition, records))?;
    }
    Ok(log)
}

/// The durable end of an edge partition.
fn end(log: &MemoryLog, partition: u32) -> u64 {
    log.offsets(TOPIC, partition).map_or(0, |(_, end)| end)
}

/// A forwarder on its own runtime; dropping it cuts it off wherever it is (like a crash).
struct Forwarder {
    runtime: Option<tokio::runtime::Runtime>,
    _trigger: shutdown::ShutdownTrigger,
    status: StatusMap,
}

impl Forwarder {
    fn start(bootstrap: &str, log: &MemoryLog, tls: Option<TlsSettings>) -> anyhow::Result<Self> {
        Self::start_with(bootstrap, log, |config| config.tls = tls)
    }

    /// Starts with the test's settings, changed by `adjust`.
    fn start_with(
        bootstrap: &str,
        log: &MemoryLog,
        adjust: impl FnOnce(&mut UpstreamConfig),
    ) -> anyhow::Result<Self> {
        let mut config = UpstreamConfig {
            bootstrap: bootstrap.split(',').map(str::to_owned).collect(),
            gateway_id: Some("gw-e2e".to_owned()),
            compression: Codec::Lz4,
            max_batch_bytes: ByteSize(16 * 1024),
            backoff_max: HumanDuration(Duration::from_secs(1)),
            ..UpstreamConfig::default()
        };
        adjust(&mut config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (trigger, shutdown) = shutdown::channel();
        let status = StatusMap::default();
        let task = tern_upstream::run(
            config,
            "gw-e2e".to_owned(),
            log.clone(),
            Arc::clone(&status),
            shutdown,
        );
        runtime.spawn(task);
        Ok(Self {
            runtime: Some(runtime),
            _trigger: trigger,
            status,
        })
    }

    fn next(&self, partition: u32) -> u64 {
        let map = self.status.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(TOPIC.to_owned(), partition))
            .map_or(0, |s| s.next)
    }

    fn wait_until(
        &self,
        log: &MemoryLog,
        done: impl Fn(u32) -> u64,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while (0..PARTITIONS).any(|p| self.next(p) < done(p)) {
            if Instant::now() > deadline {
                let map = self
                    .status
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                bail!(
                    "forwarding stalled: ends {:?}, status {map:?}",
                    (0..PARTITIONS).map(|p| end(log, p)).collect::<Vec<_>>()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn assert_mirrors(cluster: &KafkaCluster, log: &MemoryLog) -> anyhow::Result<()> {
    for partition in 0..PARTITIONS {
        let upstream = cluster.consume_all(UPSTREAM, partition)?;
        let edge = log.read(TOPIC, partition, 0, usize::MAX)?;
        assert_eq!(
            upstream.len(),
            edge.len(),
            "partition {partition}: upstream vs edge count"
        );
        for (up, stored) in upstream.iter().zip(&edge) {
            let offset = stored.offset.to_string();
            let ed = &stored.record;
            assert_eq!(up.header("tern-offset"), Some(offset.as_str()), "{up:?}");
            assert_eq!(
                up.header("tern-partition"),
                Some(partition.to_string().as_str())
            );
            assert_eq!(up.header("tern-topic"), Some(TOPIC));
            assert_eq!(up.header("tern-gateway"), Some("gw-e2e"));
            assert_eq!(up.header("unit"), Some("C"));
            assert_eq!(up.value.as_bytes(), ed.value.as_slice());
            assert_eq!(up.key.as_ref().map(String::as_bytes), ed.key.as_deref());
            assert_eq!(up.timestamp_ms, ed.timestamp_ms);
        }
    }
    Ok(())
}

#[test]
fn forwarder_speaks_tls_to_kafka_with_a_custom_ca() -> anyhow::Result<()> {
    let cluster = KafkaCluster::start()?;
    let log = edge_log(300)?;
    let tls = TlsSettings {
        ca_file: cluster.tls_ca(),
    };
    let forwarder = Forwarder::start(&cluster.tls_bootstrap(), &log, Some(tls))?;
    forwarder.wait_until(&log, |p| end(&log, p), Duration::from_secs(120))?;
    drop(forwarder);
    assert_mirrors(&cluster, &log)
}

/// The bytes the bandwidth cap charges for `record` of `partition`: key, value, edge headers,
/// tern's four headers (`tern-gateway gw-e2e`, `tern-topic sensors`, partition, offset) and the
/// 14 bytes of record framing tern counts.
fn charged_bytes(stored: &StoredRecord, partition: u32) -> u64 {
    let record = &stored.record;
    let edge_headers: usize = record.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    let tern_headers = ("tern-gateway".len() + "gw-e2e".len())
        + ("tern-topic".len() + TOPIC.len())
        + ("tern-partition".len() + partition.to_string().len())
        + ("tern-offset".len() + stored.offset.to_string().len());
    let framing = 14;
    (record.key.as_ref().map_or(0, Vec::len)
        + record.value.len()
        + edge_headers
        + tern_headers
        + framing) as u64
}

/// `bandwidth` is one cap shared by both partition forwarders: a backlog of a known number of
/// bytes cannot drain faster than the cap allows (less the one-second burst). Elapsed time is
/// only bounded from below, which no slow machine can break.
#[test]
fn a_capped_backlog_drains_no_faster_than_the_bandwidth_cap() -> anyhow::Result<()> {
    const CAP: u64 = 32 * 1024;
    let cluster = KafkaCluster::start()?;
    let log = edge_log(400)?;
    let mut total = 0;
    for p in 0..PARTITIONS {
        let records = log.read(TOPIC, p, 0, usize::MAX)?;
        total += records.iter().map(|r| charged_bytes(r, p)).sum::<u64>();
    }
    let floor = Duration::from_secs_f64(total as f64 / CAP as f64) - tern_upstream::BANDWIDTH_BURST;
    assert!(
        floor >= Duration::from_secs(3),
        "{total} bytes make too weak a test"
    );
    let started = Instant::now();
    let forwarder = Forwarder::start_with(&cluster.bootstrap(), &log, |config| {
        config.bandwidth = ByteSize(CAP);
    })?;
    forwarder.wait_until(&log, |p| end(&log, p), Duration::from_secs(120))?;
    let elapsed = started.elapsed();
    drop(forwarder);
    assert!(
        elapsed >= floor,
        "{total} bytes under a {CAP} B/s cap drained in {elapsed:?}, faster than {floor:?}"
    );
    assert_mirrors(&cluster, &log)
}
