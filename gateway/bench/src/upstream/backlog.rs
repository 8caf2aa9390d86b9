//! The backlog phase: an edge log in a temporary directory filled through the log API (topic
//! `bench`, one partition, values that look like sensor telemetry: JSON readings from a random
//! walk, cut to the payload size), then drained once per codec and repetition by the forwarder
//! running in this process, each time to a new upstream topic, through a fresh counting proxy.
//! A drain is timed from the forwarder's start (connect and catch-up included; the upstream
//! topic is created beforehand) until the upstream end offset equals the edge end offset. Beside
//! it, a smaller edge topic (`bench-capped`, about ten seconds' worth at the cap) is drained once
//! under the `bandwidth` cap, timed from the first upstream batch past a fifth of it to the last,
//! so that the start-up and the cap's one-second burst stay out of the rate.
//!
//! It never writes outside its temporary directory and never judges the figures.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proxy::{Counted, CountingProxy};
use super::{FORWARD_TIMEOUT, TOPIC_PREFIX, UpstreamBenchOptions, poll_until, wait_for_end};
use crate::BenchError;
use tern_core::ByteSize;
use tern_log::{Log, LogConfig, Record};
use tern_upstream::KafkaUpstream;
use tern_upstream::{self as forwarder, StatusMap};
use tern_upstream::{Ablation, Codec};
use tern_upstream::{Mode, PartitionStatus, shared_topic, upstream_topic};

/// The edge topic of the backlog.
const EDGE_TOPIC: &str = "bench";
/// The edge topic drained under the `bandwidth` cap.
const CAPPED_TOPIC: &str = "bench-capped";
/// The edge topic of the transaction-rate run at sensor rates.
const TRICKLE_TOPIC: &str = "bench-trickle";
/// The sensor rate of that run, records per second (`--sensor-seconds` long).
pub const TRICKLE_RATE: u64 = 100;
/// How long the capped drain should take at the cap.
const CAPPED_SECONDS: u64 = 10;
/// Bytes Kafka's record format adds to each record beside key, value and header bytes, as the
/// forwarder counts them against the cap (tern-upstream's `RECORD_FRAMING`).
const RECORD_FRAMING: u64 = 14;
/// tern's headers on every upstream record (docs/upstream.md), whose names count against the cap.
const TERN_HEADERS: [&str; 5] = [
    "tern-gateway",
    "tern-topic",
    "tern-partition",
    "tern-offset",
    "tern-timestamp",
];

/// Which drain: the backlog with the idempotent producer (what tern does), the backlog without
/// it (the bench-only plain path, for its cost), the backlog in shared mode with its Kafka
/// transactions (what tern does) or without them (the bench-only at-least-once path: plain
/// batches, then a plain OffsetCommit), or the capped topic under `bandwidth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainKind {
    Idempotent,
    Plain,
    Shared { transactions: bool },
    Capped { bytes_per_sec: u64 },
}

impl DrainKind {
    /// What this drain turns off in the forwarder: idempotence for `Plain`, transactions for
    /// shared mode without them.
    fn ablation(self) -> Ablation {
        Ablation {
            without_idempotence: self == Self::Plain,
            without_transactions: self
                == Self::Shared {
                    transactions: false,
                },
            ..Ablation::NONE
        }
    }
}

/// The part of a capped drain its rate is taken over: from the first upstream end offset past a
/// fifth of the records (a batch boundary) to the last record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Bytes of the records in the window as the cap counts them (before compression).
    pub counted_bytes: u64,
    pub elapsed: Duration,
}
/// Figures of the transaction-rate run: a caught-up shared-mode forwarder fed a trickle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrickleRun {
    pub records: u64,
    /// From the first append to the last record committed upstream.
    pub elapsed: Duration,
    /// Kafka transactions committed (each one EndTxn).
    pub transactions: u64,
}

/// Records per append while building the backlog.
const APPEND_BATCH: u64 = 5_000;

/// Figures of one drain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrainRun {
    pub kind: DrainKind,
    pub codec: Codec,
    pub records: u64,
    pub elapsed: Duration,
    pub payload_bytes: u64,
    pub wire: Counted,
    /// Capped drains only.
    pub window: Option<Window>,
    /// Batches the forwarder committed (in shared mode, one Kafka transaction each).
    pub batches: u64,
}

/// The edge log holding the backlog; its directory is removed on drop.
#[derive(Debug)]
pub struct Backlog {
    log: Log,
    dir: PathBuf,
    records: u64,
    size: usize,
    capped_records: u64,
}

impl Backlog {
    /// Appends `options.records` records; returns the backlog and how long building it took.
    pub async fn build(options: &UpstreamBenchOptions) -> Result<(Self, Duration), BenchError> {
        let dir = std::env::temp_dir().join(format!("tern-bench-upstream-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log = Log::open(&dir, &LogConfig::default())
            .await
            .map_err(|source| BenchError::log("open", source))?;
        let backlog = Self {
            log,
            dir,
            records: options.records,
            size: options.size,
            capped_records: capped_records(options),
        };
        let started = Instant::now();
        backlog.fill(EDGE_TOPIC, backlog.records).await?;
        let built = started.elapsed();
        backlog.fill(CAPPED_TOPIC, backlog.capped_records).await?;
        Ok((backlog, built))
    }

    async fn fill(&self, topic: &str, records: u64) -> Result<(), BenchError> {
        fill(&self.log, topic, records, self.size).await
    }

    /// Drains the backlog (or, capped, the capped topic) with `codec` to a new upstream topic
    /// named after `gateway`.
    pub async fn drain(
        &self,
        options: &UpstreamBenchOptions,
        kafka: &KafkaUpstream,
        gateway: &str,
        codec: Codec,
        kind: DrainKind,
    ) -> Result<DrainRun, BenchError> {
        let (edge_topic, records) = match kind {
            DrainKind::Capped { .. } => (CAPPED_TOPIC, self.capped_records),
            _ => (EDGE_TOPIC, self.records),
        };
        let target = options
            .kafka
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        let mut config = options.upstream(Vec::new(), gateway, codec);
        let topic = match kind {
            DrainKind::Shared { .. } => {
                // A prefix of its own, so each drain has a new shared topic, group and
                // transactional id.
                config.mode = Mode::Shared;
                config.topic_prefix = format!("{TOPIC_PREFIX}{gateway}.");
                shared_topic(&config.topic_prefix, edge_topic)
            }
            _ => upstream_topic(TOPIC_PREFIX, gateway, edge_topic),
        };
        kafka
            .ensure_topic(&topic, 1, config.replication_factor)
            .await?;
        wait_for_end(kafka, &topic, 0).await?;
        let proxy = CountingProxy::start(target).await?;
        config.bootstrap = vec![proxy.bootstrap().to_string()];
        config.topics = vec![edge_topic.to_owned()];
        let window_from = match kind {
            DrainKind::Capped { bytes_per_sec } => {
                config.bandwidth = ByteSize(bytes_per_sec);
                Some(records / 5)
            }
            _ => None,
        };
        let started = Instant::now();
        let forwarding = self.forward(config, kind.ablation(), gateway);
        let status = &Arc::clone(&forwarding.status);
        let done = match (kind, window_from) {
            // Transaction markers take offsets too: done is when the forwarder committed the
            // last edge offset (with the records, in shared mode's transactions).
            (DrainKind::Shared { .. }, _) => wait_for_commit(status, edge_topic, records, &topic)
                .await
                .map(|done| (done, None)),
            (_, None) => wait_for_end(kafka, &topic, records)
                .await
                .map(|done| (done, None)),
            (_, Some(from)) => wait_for_window(kafka, &topic, from, records).await,
        };
        forwarding.stop().await;
        let batches = committed(status, edge_topic).batches;
        let (done, window) = done?;
        let window = window.map(|(first, at)| Window {
            counted_bytes: (first..records)
                .map(|offset| counted_bytes(self.size, gateway, edge_topic, offset))
                .sum(),
            elapsed: done.duration_since(at),
        });
        Ok(DrainRun {
            kind,
            codec,
            records,
            elapsed: done.duration_since(started),
            payload_bytes: records * self.size as u64,
            wire: proxy.counted(),
            window,
            batches,
        })
    }

    /// Feeds a caught-up shared-mode forwarder (transactions, the default `linger`) one record
    /// every 1/[`TRICKLE_RATE`] s for `--sensor-seconds`, as a gateway at sensor rates does, and
    /// counts the transactions it commits for them.
    pub async fn trickle(
        &self,
        options: &UpstreamBenchOptions,
        kafka: &KafkaUpstream,
        gateway: &str,
    ) -> Result<TrickleRun, BenchError> {
        let log_error = |op| move |source| BenchError::log(op, source);
        self.log
            .ensure_topic(TRICKLE_TOPIC)
            .map_err(log_error("create topic"))?;
        let codec = tern_upstream::UpstreamConfig::default().compression;
        let mut config = options.upstream(options.kafka.clone(), gateway, codec);
        config.mode = Mode::Shared;
        config.topic_prefix = format!("{TOPIC_PREFIX}{gateway}.");
        config.topics = vec![TRICKLE_TOPIC.to_owned()];
        let topic = shared_topic(&config.topic_prefix, TRICKLE_TOPIC);
        kafka
            .ensure_topic(&topic, 1, config.replication_factor)
            .await?;
        let forwarding = self.forward(config, Ablation::NONE, gateway);
        let result = self
            .feed(&forwarding.status, &topic, options.sensor_seconds)
            .await;
        forwarding.stop().await;
        result
    }

    /// Starts the forwarder of `config`, without what `ablation` turns off, on this backlog's
    /// log, in this process.
    fn forward(
        &self,
        config: tern_upstream::UpstreamConfig,
        ablation: Ablation,
        gateway: &str,
    ) -> Forwarding {
        let (trigger, shutdown) = tern_core::shutdown::channel();
        let status = StatusMap::default();
        let task = tokio::spawn(forwarder::run_ablated(
            config,
            ablation,
            gateway.to_owned(),
            self.log.clone(),
            Arc::clone(&status),
            shutdown,
        ));
        Forwarding {
            status,
            trigger,
            task,
        }
    }

    /// The trickle itself, once the forwarder is connected.
    async fn feed(
        &self,
        status: &StatusMap,
        upstream: &str,
        seconds: u64,
    ) -> Result<TrickleRun, BenchError> {
        // Connected: 1.
        poll_until(upstream, 1, Duration::from_millis(10), async || {
            u64::from(committed(status, TRICKLE_TOPIC).connected)
        })
        .await?;
        let before = committed(status, TRICKLE_TOPIC).batches;
        let records = TRICKLE_RATE * seconds;
        let mut values = Telemetry::new(self.size);
        let mut tick = tokio::time::interval(Duration::from_secs(1) / TRICKLE_RATE as u32);
        let started = Instant::now();
        for _ in 0..records {
            tick.tick().await;
            let record = Record {
                timestamp_ms: chrono_now_ms(),
                key: None,
                value: values.next_value().into(),
                headers: tern_log::Headers::new(),
            };
            self.log
                .append(TRICKLE_TOPIC, 0, vec![record])
                .await
                .map_err(|source| BenchError::log("append", source))?;
        }
        let done = wait_for_commit(status, TRICKLE_TOPIC, records, upstream).await?;
        Ok(TrickleRun {
            records,
            elapsed: done.duration_since(started),
            transactions: committed(status, TRICKLE_TOPIC).batches - before,
        })
    }

    /// The backlog's log directory (a `tern serve` data directory's `log/`).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The edge topic of the backlog and its records.
    pub fn backlog_topic(&self) -> (&'static str, u64) {
        (EDGE_TOPIC, self.records)
    }

    /// Records of the capped topic.
    pub fn capped_records(&self) -> u64 {
        self.capped_records
    }

    /// The byte size of one Kafka producer record standing in for one of tern's upstream records
    /// of this backlog: its value plus tern's headers (names and values, for `gateway` and an
    /// offset in the middle of the backlog).
    pub fn record_size_with_headers(&self, gateway: &str) -> usize {
        let counted = counted_bytes(self.size, gateway, EDGE_TOPIC, self.records / 2);
        usize::try_from(counted.saturating_sub(RECORD_FRAMING)).unwrap_or(self.size)
    }

    pub async fn close(&self) -> Result<(), BenchError> {
        self.log
            .close()
            .await
            .map_err(|source| BenchError::log("close", source))
    }
}

impl Drop for Backlog {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Appends `records` telemetry values of `size` bytes to partition 0 of `topic` of `log`
/// (created if missing), [`APPEND_BATCH`] at a time.
pub(crate) async fn fill(
    log: &Log,
    topic: &str,
    records: u64,
    size: usize,
) -> Result<(), BenchError> {
    let log_error = |op| move |source| BenchError::log(op, source);
    log.ensure_topic(topic).map_err(log_error("create topic"))?;
    let mut values = Telemetry::new(size);
    let now_ms = chrono_now_ms();
    let mut appended = 0;
    while appended < records {
        let count = APPEND_BATCH.min(records - appended);
        let batch = (0..count)
            .map(|_| Record {
                timestamp_ms: now_ms,
                key: None,
                value: values.next_value().into(),
                headers: tern_log::Headers::new(),
            })
            .collect();
        log.append(topic, 0, batch)
            .await
            .map_err(log_error("append"))?;
        appended += count;
    }
    Ok(())
}

/// Records of the capped topic: about [`CAPPED_SECONDS`] at `options.bandwidth`.
fn capped_records(options: &UpstreamBenchOptions) -> u64 {
    let per_record = counted_bytes(
        options.size,
        "r0000000000-00000-none-0-capped",
        CAPPED_TOPIC,
        9999,
    );
    (CAPPED_SECONDS * options.bandwidth / per_record).max(1)
}

/// The bytes the forwarder charges the cap for the upstream record of the edge record at
/// `offset` (tern-upstream's `produced_bytes`): value, tern's five headers (`tern-timestamp`: the
/// backlog's timestamps are now, 13 digits), record framing.
fn counted_bytes(size: usize, gateway: &str, edge_topic: &str, offset: u64) -> u64 {
    let names: usize = TERN_HEADERS.iter().map(|h| h.len()).sum();
    let timestamp = chrono_now_ms().to_string().len();
    let values =
        gateway.len() + edge_topic.len() + "0".len() + offset.to_string().len() + timestamp;
    (size + names + values) as u64 + RECORD_FRAMING
}

/// A forwarder running in this process, and how far it got.
struct Forwarding {
    status: StatusMap,
    trigger: tern_core::shutdown::ShutdownTrigger,
    task: tokio::task::JoinHandle<Result<(), tern_upstream::UpstreamError>>,
}

impl Forwarding {
    /// Shuts the forwarder down and waits for it.
    async fn stop(self) {
        self.trigger.trigger();
        let _ = self.task.await;
    }
}

/// The forwarder's status of partition 0 of `edge_topic`.
fn committed(status: &StatusMap, edge_topic: &str) -> PartitionStatus {
    let map = status.lock().unwrap_or_else(|e| e.into_inner());
    map.get(&(edge_topic.to_owned(), 0))
        .cloned()
        .unwrap_or_default()
}

/// Waits until the forwarder of partition 0 of `edge_topic` reports every one of `expected`
/// records committed upstream; returns when it did.
async fn wait_for_commit(
    status: &StatusMap,
    edge_topic: &str,
    expected: u64,
    upstream: &str,
) -> Result<Instant, BenchError> {
    poll_until(upstream, expected, Duration::from_millis(10), async || {
        committed(status, edge_topic).next
    })
    .await
}

/// [`wait_for_end`] for a capped drain; also returns when the end offset first passed `from`
/// (a batch boundary) and the offset it passed it with.
async fn wait_for_window(
    kafka: &KafkaUpstream,
    topic: &str,
    from: u64,
    expected: u64,
) -> Result<(Instant, Option<(u64, Instant)>), BenchError> {
    let mut partition = None;
    let deadline = Instant::now() + FORWARD_TIMEOUT;
    let mut got = 0;
    while Instant::now() < deadline {
        if partition.is_none() {
            partition = kafka.partition(topic, 0).await.ok();
        }
        if let Some(upstream) = &partition {
            match upstream.end_offset().await {
                Ok(end) => got = u64::try_from(end).unwrap_or(0),
                Err(err) => {
                    tracing::debug!(%err, "asking for the end offset again");
                    partition = None;
                }
            }
            if got >= from {
                let at = (got, Instant::now());
                let done = wait_for_end(kafka, topic, expected).await?;
                return Ok((done, Some(at).filter(|(first, _)| *first < expected)));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(BenchError::Stalled {
        topic: topic.to_owned(),
        expected,
        got,
        after: FORWARD_TIMEOUT,
    })
}

use tern_core::time::now_ms as chrono_now_ms;

/// Values like a fleet's telemetry: JSON readings of 1,000 devices whose temperature, humidity
/// and supply voltage drift randomly, as many per value as fit, cut to exactly `size` bytes.
#[derive(Debug)]
pub struct Telemetry {
    size: usize,
    seed: u64,
    sequence: u64,
    temperature: i64,
    humidity: i64,
}

impl Telemetry {
    pub fn new(size: usize) -> Self {
        Self {
            size,
            seed: 0x9e37_79b9_7f4a_7c15,
            sequence: 0,
            temperature: 2150,
            humidity: 4500,
        }
    }

    /// xorshift64: deterministic, so every run drains the same bytes.
    fn random(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed
    }

    pub fn next_value(&mut self) -> Vec<u8> {
        let mut text = String::with_capacity(self.size + 96);
        while text.len() < self.size {
            self.sequence += 1;
            self.temperature += (self.random() % 21) as i64 - 10;
            self.humidity += (self.random() % 41) as i64 - 20;
            let device = self.random() % 1000;
            let supply = 3200 + self.random() % 200;
            let _ = write!(
                text,
                "{{\"dev\":{device},\"seq\":{},\"t\":{},\"rh\":{},\"mv\":{supply}}}",
                self.sequence, self.temperature, self.humidity
            );
        }
        let mut bytes = text.into_bytes();
        bytes.truncate(self.size);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_values_have_the_payload_size_and_differ() {
        let mut telemetry = Telemetry::new(64);
        let first = telemetry.next_value();
        let second = telemetry.next_value();
        assert_eq!((first.len(), second.len()), (64, 64));
        assert_ne!(first, second);
        assert!(first.starts_with(b"{\"dev\":"), "{first:?}");
        let mut big = Telemetry::new(1000);
        assert_eq!(big.next_value().len(), 1000);
    }
}
