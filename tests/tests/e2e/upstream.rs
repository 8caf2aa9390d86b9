//! tern's forwarder (`tern_upstream`) as a library against the real three-node Kafka cluster,
//! with tern's in-memory log (`tern_log::MemoryLog`) on the edge side: TLS with a custom CA,
//! which the `--kafka` quick start has no flag for; the bandwidth cap; and a backlog older than
//! Kafka's retention, which must stay upstream in the topics tern creates (mirror and shared
//! mode). The exactly-once proof under faults drives the `tern` binary instead
//! (`upstream_faults`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_core::shutdown;
use tern_core::{ByteSize, HumanDuration};
use tern_log::{LogPort, MemoryLog, Record, StoredRecord};
use tern_tests::kafka_tools::{ConsumedRecord, Isolation, TimestampType};
use tern_tests::{KafkaCluster, now_ms, wait_until};
use tern_upstream::{self, Codec, Mode, StatusMap, TlsSettings, UpstreamConfig};

const TOPIC: &str = "sensors";
const PARTITIONS: u32 = 2;
const UPSTREAM: &str = "tern.gw-e2e.sensors";

/// The edge log: tern's in-memory log with the one topic, `count` durable records in each
/// partition, timestamped now.
fn edge_log(count: u64) -> anyhow::Result<MemoryLog> {
    edge_log_at(PARTITIONS, count, |_| now_ms())
}

/// The edge log with `partitions` partitions of `count` records each, the record at `offset`
/// timestamped `timestamp(offset)`.
fn edge_log_at(
    partitions: u32,
    count: u64,
    timestamp: impl Fn(u64) -> i64,
) -> anyhow::Result<MemoryLog> {
    let log = MemoryLog::new(partitions);
    log.ensure_topic(TOPIC)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for partition in 0..partitions {
        let records = (0..count)
            .map(|offset| Record {
                timestamp_ms: timestamp(offset),
                key: Some(format!("dev-{}", offset % 7).into_bytes().into()),
                value: format!("p{partition}-{offset:06}-{}", "x".repeat(200))
                    .into_bytes()
                    .into(),
                headers: tern_log::Headers::from(vec![("unit".into(), b"C".to_vec().into())]),
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
    /// Partitions of the edge topic.
    partitions: u32,
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
        let gateway = config.gateway_id.clone().unwrap_or_default();
        let partitions = log.ensure_topic(TOPIC)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (trigger, shutdown) = shutdown::channel();
        let status = StatusMap::default();
        let task = tern_upstream::run(config, gateway, log.clone(), Arc::clone(&status), shutdown);
        runtime.spawn(task);
        Ok(Self {
            runtime: Some(runtime),
            _trigger: trigger,
            status,
            partitions,
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
        while (0..self.partitions).any(|p| self.next(p) < done(p)) {
            if Instant::now() > deadline {
                let map = self
                    .status
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                bail!(
                    "forwarding stalled: ends {:?}, status {map:?}",
                    (0..self.partitions)
                        .map(|p| end(log, p))
                        .collect::<Vec<_>>()
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
            assert_eq!(up.value.as_bytes(), &ed.value[..]);
            assert_eq!(up.key.as_ref().map(String::as_bytes), ed.key.as_deref());
            let edge_time = ed.timestamp_ms.to_string();
            assert_eq!(up.header("tern-timestamp"), Some(edge_time.as_str()));
            assert_eq!(up.timestamp_type, TimestampType::LogAppendTime);
        }
    }
    Ok(())
}

/// The cluster is then shared with the follower contract (`upstream_contract.rs`), which
/// needs one nobody faults, and after it with the downstream's suite (`downstream.rs`), which
/// cuts the link and kills a broker.
#[test]
fn forwarder_speaks_tls_to_kafka_with_a_custom_ca_the_follower_contract_and_the_downstream_hold()
-> anyhow::Result<()> {
    let mut cluster = KafkaCluster::start()?;
    let log = edge_log(300)?;
    let tls = TlsSettings {
        ca_file: cluster.tls_ca(),
    };
    let forwarder = Forwarder::start(&cluster.tls_bootstrap(), &log, Some(tls))?;
    forwarder.wait_until(&log, |p| end(&log, p), Duration::from_secs(120))?;
    drop(forwarder);
    assert_mirrors(&cluster, &log)?;
    super::upstream_contract::the_follower_contract_holds_on(&cluster)?;
    super::downstream::commands_reach_devices_exactly_once_on(&mut cluster)
}

/// The bytes the bandwidth cap charges for `record` of `partition`: key, value, edge headers,
/// tern's five headers (`tern-gateway gw-e2e`, `tern-topic sensors`, partition, offset, edge
/// timestamp) and the 14 bytes of record framing tern counts.
fn charged_bytes(stored: &StoredRecord, partition: u32) -> u64 {
    let record = &stored.record;
    let edge_headers: usize = record.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    let tern_headers = ("tern-gateway".len() + "gw-e2e".len())
        + ("tern-topic".len() + TOPIC.len())
        + ("tern-partition".len() + partition.to_string().len())
        + ("tern-offset".len() + stored.offset.to_string().len())
        + ("tern-timestamp".len() + record.timestamp_ms.to_string().len());
    let framing = 14;
    (record.key.as_ref().map_or(0, |key| key.len())
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

/// How old the backlog is: 30 days, beyond Kafka's default `retention.ms` (7 days).
const BACKLOG_AGE_MS: i64 = 30 * 24 * 3600 * 1000;
/// Partitions of the old backlog's edge topic: one per broker, so the negative control's topic
/// (one leader per broker) shows that every broker's retention checker has run.
const OLD_PARTITIONS: u32 = 3;
/// Records per partition of the old backlog.
const OLD_RECORDS: u64 = 200;

/// An outage of 30 days leaves a backlog older than the upstream topic's `retention.ms`. Kafka
/// deletes by record timestamp, so with `CreateTime` those records would be deleted right after
/// they arrive; the topics tern creates (mirror `tern.gw-e2e.sensors`, shared `tern.sensors`) have
/// `message.timestamp.type=LogAppendTime`, so retention counts from arrival and every record stays,
/// with its edge time in `tern-timestamp`. Negative control: the same backlog forwarded into a
/// topic created beforehand with Kafka's defaults (CreateTime, 7 days) is deleted by the
/// retention checker (every second in this cluster), on every broker, while tern's topics still
/// hold everything.
#[test]
fn a_backlog_older_than_retention_stays_in_the_topics_tern_creates() -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = KafkaCluster::start_with("log.retention.check.interval.ms=1000\n")?;
    println!("cluster started in {:?}", cluster.startup);
    let old = now_ms() - BACKLOG_AGE_MS;
    let log = edge_log_at(OLD_PARTITIONS, OLD_RECORDS, |offset| old + offset as i64)?;
    let ends = |p| end(&log, p);

    // tern creates both topics and forwards the old backlog.
    let arrival_from = now_ms();
    let mirror = Forwarder::start_with(&cluster.bootstrap(), &log, |_| {})?;
    let shared = Forwarder::start_with(&cluster.bootstrap(), &log, |config| {
        config.mode = Mode::Shared;
    })?;
    mirror.wait_until(&log, ends, Duration::from_secs(120))?;
    shared.wait_until(&log, ends, Duration::from_secs(120))?;
    drop((mirror, shared));
    let arrival_to = now_ms();
    for topic in [UPSTREAM, SHARED_UPSTREAM] {
        let configs = cluster.topic_config_overrides(topic)?;
        println!("{topic}: created by tern with {configs:?}");
        assert!(
            configs.contains(&"message.timestamp.type=LogAppendTime".to_owned()),
            "{topic}: {configs:?}"
        );
    }

    // Negative control: a topic created beforehand with Kafka's defaults, one leader per broker.
    let assignment: [&[u32]; 3] = [&[1, 2, 3], &[2, 3, 1], &[3, 1, 2]];
    cluster.create_topic_assigned(CONTROL_UPSTREAM, &assignment, &[])?;
    let mut leaders: Vec<Option<u32>> = cluster
        .describe_topic(CONTROL_UPSTREAM)?
        .iter()
        .map(|state| state.leader)
        .collect();
    leaders.sort();
    assert_eq!(
        leaders,
        [Some(1), Some(2), Some(3)],
        "{CONTROL_UPSTREAM} leaders"
    );
    let control_configs = cluster.topic_config_overrides(CONTROL_UPSTREAM)?;
    println!("{CONTROL_UPSTREAM}: created beforehand with {control_configs:?}");
    assert!(
        !control_configs
            .iter()
            .any(|c| c.starts_with("message.timestamp.type=") || c.starts_with("retention.ms=")),
        "{control_configs:?}"
    );
    // What tern's own DescribeConfigs reads (its warning about an existing CreateTime topic).
    let topics = [UPSTREAM, SHARED_UPSTREAM, CONTROL_UPSTREAM];
    let types = timestamp_types(&cluster, &topics)?;
    println!("message.timestamp.type of {topics:?} as tern describes them: {types:?}");
    assert_eq!(types, ["LogAppendTime", "LogAppendTime", "CreateTime"]);
    let control = Forwarder::start_with(&cluster.bootstrap(), &log, |config| {
        config.gateway_id = Some(CONTROL_GATEWAY.to_owned());
    })?;
    control.wait_until(&log, ends, Duration::from_secs(120))?;
    drop(control);
    // At least every edge record arrived (a session that lost its follower's last record to
    // retention mid-run may resend a batch, which does not matter here).
    let control_ends = cluster.offsets_at(CONTROL_UPSTREAM, "latest")?;
    assert!(
        control_ends.len() == OLD_PARTITIONS as usize
            && control_ends.values().all(|&end| end >= OLD_RECORDS),
        "{CONTROL_UPSTREAM} end offsets {control_ends:?}"
    );
    let deleted_after = Instant::now();
    let mut control_starts = BTreeMap::new();
    wait_until(
        Duration::from_secs(60),
        "the control topic's retention",
        || {
            control_starts = cluster.offsets_at(CONTROL_UPSTREAM, "earliest")?;
            Ok(control_starts == control_ends)
        },
    )?;
    println!(
        "negative control {CONTROL_UPSTREAM} (CreateTime, Kafka's default retention): \
         {} records forwarded, log start offsets {control_starts:?} = end offsets {control_ends:?} \
         {:?} after the last one arrived: every record deleted by retention on brokers 1, 2 and 3",
        OLD_RECORDS * u64::from(OLD_PARTITIONS),
        deleted_after.elapsed()
    );

    // Every broker's retention checker has now run over tern's topics too: nothing is gone.
    for topic in [UPSTREAM, SHARED_UPSTREAM] {
        let starts = cluster.offsets_at(topic, "earliest")?;
        assert!(
            starts.values().all(|&start| start == 0),
            "{topic} lost records to retention: log start offsets {starts:?}"
        );
    }
    let arrival = arrival_from..=arrival_to;
    let mirrored = assert_old_backlog_upstream(&cluster, &log, UPSTREAM, true, &arrival)?;
    let shared = assert_old_backlog_upstream(&cluster, &log, SHARED_UPSTREAM, false, &arrival)?;
    println!(
        "{UPSTREAM}: {mirrored} records, {SHARED_UPSTREAM}: {shared} records, all still there \
         (log start offsets 0), each with its 30-day-old edge time in tern-timestamp and \
         LogAppendTime within the forwarding"
    );
    println!("test wall time {:?}", started.elapsed());
    Ok(())
}

/// `message.timestamp.type` of each of `topics` as tern's client reads it with DescribeConfigs.
fn timestamp_types(cluster: &KafkaCluster, topics: &[&str]) -> anyhow::Result<Vec<String>> {
    const NAME: &str = "message.timestamp.type";
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let config = UpstreamConfig {
        bootstrap: cluster.bootstrap().split(',').map(str::to_owned).collect(),
        ..UpstreamConfig::default()
    };
    runtime.block_on(async {
        let kafka = tern_upstream::KafkaUpstream::connect(&config).await?;
        let mut types = Vec::new();
        for topic in topics {
            let configs = kafka.topic_configs(topic, &[NAME]).await?;
            let kind = configs
                .into_iter()
                .find_map(|(name, value)| value.filter(|_| name == NAME))
                .with_context(|| format!("no {NAME} for {topic}"))?;
            types.push(kind);
        }
        Ok(types)
    })
}

/// The shared-mode topic of the edge topic (`{topic_prefix}{t}`).
const SHARED_UPSTREAM: &str = "tern.sensors";
/// The negative control's gateway and the topic it mirrors into, created beforehand.
const CONTROL_GATEWAY: &str = "gw-control";
const CONTROL_UPSTREAM: &str = "tern.gw-control.sensors";

/// Every record of the edge log is in `topic` exactly once (`read_committed`, so shared mode's
/// transactions count only when committed), with key, value, headers and the edge time in
/// `tern-timestamp`, stamped by the broker (`LogAppendTime`) within `arrival`; a `mirror` topic
/// holds edge partition `p` in partition `p`, in edge order. Returns how many records it holds.
fn assert_old_backlog_upstream(
    cluster: &KafkaCluster,
    log: &MemoryLog,
    topic: &str,
    mirror: bool,
    arrival: &std::ops::RangeInclusive<i64>,
) -> anyhow::Result<usize> {
    let edge_records: u64 = (0..OLD_PARTITIONS).map(|p| end(log, p)).sum();
    let mut found: HashMap<(u32, u64), ConsumedRecord> = HashMap::new();
    // The console consumer of a transactional topic stops after an idle time, which a loaded
    // machine can exceed before the first record: a short read is read again.
    let what = format!("{topic} read back whole");
    wait_until(Duration::from_secs(240), &what, || {
        found = read_upstream(cluster, topic, mirror, arrival)?;
        Ok(found.len() as u64 >= edge_records)
    })?;
    let mut expected = 0;
    for partition in 0..OLD_PARTITIONS {
        for stored in log.read(TOPIC, partition, 0, usize::MAX)? {
            expected += 1;
            let up = found
                .get(&(partition, stored.offset))
                .with_context(|| format!("{topic}: edge {partition}/{} missing", stored.offset))?;
            let ed = &stored.record;
            let edge_time = ed.timestamp_ms.to_string();
            assert_eq!(
                up.header("tern-timestamp"),
                Some(edge_time.as_str()),
                "{up:?}"
            );
            assert_eq!(up.value.as_bytes(), &ed.value[..]);
            assert_eq!(up.key.as_ref().map(String::as_bytes), ed.key.as_deref());
            assert_eq!(up.header("unit"), Some("C"));
        }
    }
    assert_eq!(found.len(), expected, "{topic}: upstream vs edge count");
    Ok(expected)
}

/// The records of every partition of `topic` by edge identity (`tern-partition`, `tern-offset`),
/// each checked for its broker timestamp; a mirror topic is read by end offset (exactly that
/// many records), a shared one until the consumer has been idle for a while.
fn read_upstream(
    cluster: &KafkaCluster,
    topic: &str,
    mirror: bool,
    arrival: &std::ops::RangeInclusive<i64>,
) -> anyhow::Result<HashMap<(u32, u64), ConsumedRecord>> {
    let mut found = HashMap::new();
    for partition in 0..OLD_PARTITIONS {
        let records = match mirror {
            true => cluster.consume_all(topic, partition)?,
            false => cluster.consume_isolated(
                topic,
                partition,
                Isolation::ReadCommitted,
                Duration::from_secs(10),
            )?,
        };
        for (i, record) in records.into_iter().enumerate() {
            let id = |name| -> anyhow::Result<u64> {
                let value = record.header(name).with_context(|| format!("{record:?}"))?;
                Ok(value.parse()?)
            };
            let (edge_partition, edge_offset) =
                (u32::try_from(id("tern-partition")?)?, id("tern-offset")?);
            if mirror {
                assert_eq!(
                    (edge_partition, edge_offset),
                    (partition, i as u64),
                    "{topic}: {record:?}"
                );
            }
            assert_eq!(
                record.timestamp_type,
                TimestampType::LogAppendTime,
                "{record:?}"
            );
            assert!(
                arrival.contains(&record.timestamp_ms),
                "{record:?} not stamped in {arrival:?}"
            );
            let copy = found.insert((edge_partition, edge_offset), record);
            assert!(copy.is_none(), "{topic}: {copy:?} twice");
        }
    }
    Ok(found)
}
