//! `tern bench upstream`: forwarding figures against a Kafka cluster the user started. In one
//! run it measures the anchor — live MQTT ingest into a `tern serve` child (the MQTT bench's load
//! generator, QoS 1) — and, while that stream runs, the steady forwarding rate of the child's
//! forwarder; then, for each compression codec, the drain of a backlog built directly through
//! the log API, by the forwarder running in this process. Bytes on the wire are counted by a
//! proxy between that forwarder and Kafka (`proxy.rs`). In the same run, against the same
//! cluster: Kafka's own producer sends as many records of the same size per codec (`java.rs`),
//! the yardstick of the drain; the default codec's drain is repeated without the idempotent
//! producer (its cost), and in shared mode with its Kafka transactions and without them (their
//! cost); a smaller backlog is drained under a `bandwidth` cap (how much of the cap it uses); and
//! a shared-mode forwarder fed 100 records/s counts the transactions it commits at sensor rates.
//! It owns the options and the order of measurements; the phases are `live.rs`, `backlog.rs` and
//! `java.rs`, the figures `report.rs`.
//!
//! It never starts or stops Kafka, never asserts a target (it prints whether each is met), and
//! never touches a process or topic it did not create (its topics start with `tern-bench.`).

pub(crate) mod backlog;
mod java;
mod live;
pub(crate) mod proxy;
mod report;
pub(crate) mod serve;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use report::Report;

use backlog::DrainKind;

use crate::BenchError;
use tern_upstream::KafkaUpstream;
use tern_upstream::{Codec, Mode, UpstreamConfig};

/// Prefix of every upstream topic the bench creates.
pub const TOPIC_PREFIX: &str = "tern-bench.";
/// How long forwarding may take to reach an expected end offset before the bench gives up.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(600);

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamBenchOptions {
    /// Bootstrap servers of the cluster, `host:port`.
    pub kafka: Vec<String>,
    /// Records in the backlog drained per codec.
    pub records: u64,
    /// Payload bytes per record (MQTT message and backlog value).
    pub size: usize,
    pub repetitions: usize,
    pub codecs: Vec<Codec>,
    /// The `bandwidth` cap of the capped drain, bytes per second.
    pub bandwidth: u64,
    /// Java classpath holding Kafka's tools (`tests/kafka/cache/*`); without it the drain is
    /// not compared with Kafka's producer.
    pub kafka_classpath: Option<String>,
    /// Seconds of the shared-mode run at sensor rate.
    pub sensor_seconds: u64,
    /// Another build's `tern`, whose `tern serve` drains the backlog beside this build's.
    pub compare_tern: Option<std::path::PathBuf>,
}

impl UpstreamBenchOptions {
    pub const ALL_CODECS: [Codec; 5] = [
        Codec::None,
        Codec::Gzip,
        Codec::Lz4,
        Codec::Snappy,
        Codec::Zstd,
    ];

    fn validate(&self) -> Result<(), BenchError> {
        let checks = [
            (
                self.kafka.is_empty(),
                "--kafka",
                "needs at least one host:port",
            ),
            (self.records == 0, "--records", "must be at least 1"),
            (
                self.sensor_seconds == 0,
                "--sensor-seconds",
                "must be at least 1",
            ),
            (self.repetitions == 0, "--repetitions", "must be at least 1"),
            (
                self.codecs.is_empty(),
                "--codec",
                "needs at least one codec",
            ),
            (
                self.bandwidth < 10_000,
                "--bandwidth",
                "must be at least 10000 bytes per second",
            ),
            (
                !(16..=64 * 1024).contains(&self.size),
                "--size",
                "must be between 16 and 65536",
            ),
            (
                self.records.saturating_mul(self.size as u64 + 64) >= 1 << 30,
                "--records",
                "x (--size + 64 bytes) must stay below the log's default 1GiB retention",
            ),
        ];
        match checks.iter().find(|(bad, ..)| *bad) {
            Some((_, option, reason)) => Err(BenchError::Invalid { option, reason }),
            None => Ok(()),
        }
    }

    /// Settings of a forwarder of this bench: defaults, except where it connects and its names.
    fn upstream(&self, bootstrap: Vec<String>, gateway: &str, codec: Codec) -> UpstreamConfig {
        UpstreamConfig {
            bootstrap,
            gateway_id: Some(gateway.to_owned()),
            topic_prefix: TOPIC_PREFIX.to_owned(),
            compression: codec,
            ..UpstreamConfig::default()
        }
    }
}

/// Runs the bench described by `options` and returns every figure.
pub fn run(options: &UpstreamBenchOptions) -> Result<Report, BenchError> {
    options.validate()?;
    // The forwarder's warnings.
    tern_core::logging::init("warn");
    let runtime = crate::runtime(None)?;
    let direct = options.upstream(options.kafka.clone(), "direct", Codec::None);
    let kafka = runtime.block_on(KafkaUpstream::connect(&direct))?;
    let run_id = run_id();
    progress(format_args!(
        "live MQTT ingest into tern serve, forwarding ({run_id})"
    ));
    let live = live::measure(options, &runtime, &kafka, &run_id)?;
    progress(format_args!(
        "building a backlog of {} records",
        options.records
    ));
    let (backlog, built) = runtime.block_on(backlog::Backlog::build(options))?;
    let default_codec = UpstreamConfig::default().compression;
    let payloads = match &options.kafka_classpath {
        Some(_) => Some(java::Payloads::write(
            backlog.record_size_with_headers(&format!("{run_id}-none-0")),
        )?),
        None => None,
    };
    let mut drains = Vec::new();
    let mut java_runs = Vec::new();
    let mut serve_drains = Vec::new();
    let mut builds = vec![(crate::tern_binary()?, serve::Build::This)];
    if let Some(exe) = &options.compare_tern {
        builds.push((exe.clone(), serve::Build::Compare));
    }
    for rep in 0..options.repetitions {
        for &codec in &options.codecs {
            let name = codec_name(codec);
            let gateway = format!("{run_id}-{name}-{rep}");
            progress(format_args!("draining it with {name}, run {}", rep + 1));
            let drained = runtime.block_on(backlog.drain(
                options,
                &kafka,
                &gateway,
                codec,
                DrainKind::Idempotent,
            ))?;
            drains.push(drained);
            if let (Some(classpath), Some(payloads)) = (&options.kafka_classpath, &payloads) {
                let runs = KafkaProducerRuns {
                    options,
                    runtime: &runtime,
                    kafka: &kafka,
                    classpath,
                    payloads,
                };
                for batch_size in [None, Some(UpstreamConfig::default().max_batch_bytes.0)] {
                    let topic = format!(
                        "{TOPIC_PREFIX}{run_id}-java-{name}{}-{rep}",
                        batch_size.map_or("", |_| "-big")
                    );
                    java_runs.push(runs.run(&topic, codec, batch_size, rep)?);
                }
            }
        }
        let name = codec_name(default_codec);
        progress(format_args!(
            "draining it with {name} without the idempotent producer, run {}",
            rep + 1
        ));
        let gateway = format!("{run_id}-{name}-plain-{rep}");
        let plain = backlog.drain(options, &kafka, &gateway, default_codec, DrainKind::Plain);
        drains.push(runtime.block_on(plain)?);
        for transactions in [true, false] {
            let how = if transactions { "txn" } else { "plain" };
            progress(format_args!(
                "draining it with {name} in shared mode, {}, run {}",
                if transactions {
                    "in Kafka transactions"
                } else {
                    "without transactions (at least once)"
                },
                rep + 1
            ));
            let gateway = format!("{run_id}-{name}-shared-{how}-{rep}");
            let kind = DrainKind::Shared { transactions };
            let shared = backlog.drain(options, &kafka, &gateway, default_codec, kind);
            drains.push(runtime.block_on(shared)?);
        }
        for (exe, build) in &builds {
            for mode in [Mode::Mirror, Mode::Shared] {
                let gateway = format!(
                    "{run_id}-serve-{}-{}-{rep}",
                    build_name(*build),
                    mode_name(mode)
                );
                progress(format_args!(
                    "tern serve ({} build) drains it in {} mode, run {}",
                    build_name(*build),
                    mode_name(mode),
                    rep + 1
                ));
                let (topic, records) = backlog.backlog_topic();
                let drain = serve::drain(
                    options,
                    &kafka,
                    (exe, *build),
                    (backlog.dir(), topic, records),
                    mode,
                    &gateway,
                );
                serve_drains.push(runtime.block_on(drain)?);
            }
        }
    }
    progress(format_args!(
        "shared mode at {} records/s: counting its transactions",
        backlog::TRICKLE_RATE
    ));
    let trickle =
        runtime.block_on(backlog.trickle(options, &kafka, &format!("{run_id}-trickle")))?;
    progress(format_args!(
        "draining {} under a bandwidth cap of {} B/s",
        backlog.capped_records(),
        options.bandwidth
    ));
    let capped = DrainKind::Capped {
        bytes_per_sec: options.bandwidth,
    };
    let gateway = format!("{run_id}-none-capped");
    drains.push(runtime.block_on(backlog.drain(options, &kafka, &gateway, Codec::None, capped))?);
    runtime.block_on(backlog.close())?;
    let java_record_bytes = payloads.as_ref().map(|p| p.size);
    Ok(
        Report::new(options, live, built, drains, java_runs, java_record_bytes)
            .with_trickle(trickle)
            .with_serve_drains(&serve_drains),
    )
}

fn build_name(build: serve::Build) -> &'static str {
    match build {
        serve::Build::This => "this",
        serve::Build::Compare => "compared",
    }
}

pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Mirror => "mirror",
        Mode::Shared => "shared",
    }
}

/// What every run of Kafka's producer shares.
struct KafkaProducerRuns<'a> {
    options: &'a UpstreamBenchOptions,
    runtime: &'a tokio::runtime::Runtime,
    kafka: &'a KafkaUpstream,
    classpath: &'a str,
    payloads: &'a java::Payloads,
}

impl KafkaProducerRuns<'_> {
    /// Creates `topic` (one partition, the forwarder's replication factor) and sends the
    /// backlog's number of records to it with `codec` and `batch_size` (None: Kafka's default).
    fn run(
        &self,
        topic: &str,
        codec: Codec,
        batch_size: Option<u64>,
        rep: usize,
    ) -> Result<java::JavaRun, BenchError> {
        let replication = UpstreamConfig::default().replication_factor;
        self.runtime
            .block_on(self.kafka.ensure_topic(topic, 1, replication))?;
        self.runtime.block_on(wait_for_end(self.kafka, topic, 0))?;
        progress(format_args!(
            "Kafka's producer: {} records of {} B with {}, batch.size {}, run {}",
            self.options.records,
            self.payloads.size,
            codec_name(codec),
            batch_size.map_or("default".to_owned(), |b| b.to_string()),
            rep + 1
        ));
        java::produce(
            self.classpath,
            &self.options.kafka.join(","),
            topic,
            self.options.records,
            self.payloads,
            codec,
            batch_size,
        )
    }
}

/// One line on stderr saying what the bench does now (the figures go to stdout).
fn progress(what: std::fmt::Arguments<'_>) {
    eprintln!("tern bench upstream: {what}");
}

/// A name part that keeps this run's topics apart from earlier runs on the same cluster.
pub(crate) fn run_id() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("r{secs}-{}", std::process::id())
}

pub fn codec_name(codec: Codec) -> &'static str {
    match codec {
        Codec::None => "none",
        Codec::Gzip => "gzip",
        Codec::Lz4 => "lz4",
        Codec::Snappy => "snappy",
        Codec::Zstd => "zstd",
    }
}

/// Polls `progress` every `every` until it reports at least `expected`; returns when it did,
/// or [`BenchError::Stalled`] (naming `topic`) after [`FORWARD_TIMEOUT`].
async fn poll_until<F>(
    topic: &str,
    expected: u64,
    every: Duration,
    mut progress: F,
) -> Result<Instant, BenchError>
where
    F: AsyncFnMut() -> u64,
{
    let started = Instant::now();
    let mut got = 0;
    while started.elapsed() < FORWARD_TIMEOUT {
        got = progress().await;
        if got >= expected {
            return Ok(Instant::now());
        }
        tokio::time::sleep(every).await;
    }
    Err(BenchError::Stalled {
        topic: topic.to_owned(),
        expected,
        got,
        after: FORWARD_TIMEOUT,
    })
}

/// Waits until partition 0 of `topic` holds `expected` records (its end offset), polling the
/// cluster directly; returns when it got there. More than `expected` is an error (duplicates).
/// Errors while the new topic's leader settles are retried until the timeout.
pub(crate) async fn wait_for_end(
    kafka: &KafkaUpstream,
    topic: &str,
    expected: u64,
) -> Result<Instant, BenchError> {
    let started = Instant::now();
    let mut got = 0;
    let mut partition = None;
    while started.elapsed() < FORWARD_TIMEOUT {
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
            if got >= expected {
                return match got {
                    got if got == expected => Ok(Instant::now()),
                    got => Err(BenchError::Count {
                        topic: topic.to_owned(),
                        expected,
                        got,
                    }),
                };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> UpstreamBenchOptions {
        UpstreamBenchOptions {
            kafka: vec!["127.0.0.1:9092".into()],
            records: 1_000_000,
            size: 64,
            repetitions: 3,
            codecs: UpstreamBenchOptions::ALL_CODECS.to_vec(),
            bandwidth: 125_000,
            kafka_classpath: None,
            sensor_seconds: 10,
            compare_tern: None,
        }
    }

    #[test]
    fn bad_options_name_the_flag() {
        assert!(options().validate().is_ok());
        let bad = UpstreamBenchOptions {
            size: 8,
            ..options()
        };
        let err = bad.validate().map_err(|e| e.to_string());
        assert_eq!(err, Err("--size must be between 16 and 65536".to_owned()));
        let bad = UpstreamBenchOptions {
            kafka: Vec::new(),
            ..options()
        };
        assert!(bad.validate().is_err());
        let too_big = UpstreamBenchOptions {
            size: 2048,
            ..options()
        };
        let err = too_big.validate().map_err(|e| e.to_string());
        assert!(err.is_err_and(|e| e.starts_with("--records")));
    }

    #[test]
    fn bench_forwarders_use_the_defaults_under_their_own_prefix() {
        let config = options().upstream(vec!["127.0.0.1:1".into()], "r1-zstd-0", Codec::Zstd);
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.topic_prefix, TOPIC_PREFIX);
        assert_eq!(
            config.max_batch_bytes,
            UpstreamConfig::default().max_batch_bytes
        );
        assert_eq!(config.linger, UpstreamConfig::default().linger);
    }
}
