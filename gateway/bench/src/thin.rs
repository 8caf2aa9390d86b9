//! `tern-bench thin-link`: the link's return after an outage on a thin uplink, once per
//! strategy, against a cluster the user started. Each run opens a fresh edge log (tern's own
//! [`Log`], in a temporary directory) holding a day of telemetry (timestamps spread over the
//! last 24 hours), starts tern's forwarder in this process under a `bandwidth` cap (the link
//! returns), and while it drains appends live telemetry and alarms at fixed rates. It watches
//! the forwarder's progress every [`POLL`] (a record counts as upstream once Kafka acknowledged
//! it with acks=all, in shared mode once its transaction committed) and prints, per strategy:
//! the time from the link's return to the first live telemetry record upstream, the alarms'
//! latency (durable at the edge → upstream), the time to drain the backlog and its ratio to strict order's, and the
//! share of the cap each kind of traffic got while draining.
//!
//! Strategies: `strict` (one class, oldest first), `priority` (alarms `high`, telemetry `low`),
//! `live-first` (the same classes, telemetry also `live_first`), all in mirror mode; `--shared`
//! adds a live-first run in shared mode. `--ablate-live-copies` adds a
//! run, `live-first` with the copies written into the forwarded topic itself
//! ([`Ablation::live_into_forwarded_topic`]): the negative control of the checks the test
//! makes on the topics the report names.
//!
//! It never starts or stops Kafka, never asserts a target, and only creates topics under
//! `tern-bench.`.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tern_core::shutdown;
use tern_core::{ByteSize, HumanDuration};
use tern_log::{Log, LogConfig, Record};
use tern_upstream::{
    Ablation, Class, Mode, StatusMap, UpstreamConfig, run_ablated, shared_topic, upstream_topic,
};

use crate::BenchError;
use crate::stats::percentile;
use crate::upstream::TOPIC_PREFIX;
use crate::upstream::backlog::Telemetry;

/// How often the upstream end offsets are looked at.
const POLL: Duration = Duration::from_millis(20);
/// The longest one strategy's run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);
const TELEMETRY: &str = "telemetry";
const ALARMS: &str = "alarms";
/// A day, the age of the oldest backlog record.
const DAY_MS: i64 = 24 * 3600 * 1000;
/// Records per append while the backlog is built.
const APPEND_BATCH: u64 = 1000;

/// One way of draining.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    Strict,
    Priority,
    LiveFirst,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [Self::Strict, Self::Priority, Self::LiveFirst];

    fn name(self) -> &'static str {
        match self {
            Self::Strict => "strict",
            Self::Priority => "priority",
            Self::LiveFirst => "live-first",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinOptions {
    pub kafka: Vec<String>,
    /// Telemetry records in the backlog (a day's worth).
    pub backlog: u64,
    /// Payload bytes per record.
    pub size: usize,
    /// The `bandwidth` cap, bytes per second.
    pub bandwidth: u64,
    /// Live telemetry records per second while the backlog drains.
    pub live_rate: u64,
    /// One alarm every this long while the backlog drains.
    pub alarm_interval: Duration,
    pub strategies: Vec<Strategy>,
    /// Adds the negative control's run.
    pub ablate_live_copies: bool,
    /// Adds a live-first run in shared mode.
    pub shared: bool,
}

impl ThinOptions {
    fn validate(&self) -> Result<(), BenchError> {
        let checks = [
            (
                self.kafka.is_empty(),
                "--kafka",
                "needs at least one host:port",
            ),
            (self.backlog == 0, "--backlog", "must be at least 1"),
            (
                !(16..=65536).contains(&self.size),
                "--size",
                "must be between 16 and 65536",
            ),
            (
                self.bandwidth < 1024,
                "--bandwidth",
                "must be at least 1024",
            ),
            (
                self.live_rate == 0 || self.live_rate > 1000,
                "--live-rate",
                "must be 1 to 1000",
            ),
            (
                self.alarm_interval < Duration::from_millis(10),
                "--alarm-interval-ms",
                "must be at least 10",
            ),
        ];
        match checks.into_iter().find(|(bad, _, _)| *bad) {
            Some((_, option, reason)) => Err(BenchError::Invalid { option, reason }),
            None => Ok(()),
        }
    }
}

/// The upstream topics of one run, for a reader to check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topics {
    pub telemetry: String,
    pub alarms: String,
    /// `live-first` only.
    pub live: Option<String>,
}

/// Figures of one strategy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyRun {
    pub strategy: Strategy,
    /// `mirror` or `shared`.
    pub mode: &'static str,
    /// The negative control's run (copies into the forwarded topic).
    pub ablated: bool,
    /// From the link's return to the first live telemetry record upstream (the live topic's or
    /// the forwarded topic's, whichever first).
    pub first_live_ms: f64,
    pub alarms: usize,
    pub alarm_p50_ms: f64,
    pub alarm_max_ms: f64,
    /// From the link's return until the whole backlog was upstream.
    pub drain_s: f64,
    /// How the link was shared while draining: each kind's edge bytes ÷ all edge bytes
    /// forwarded by then (backlog, live telemetry in edge order, alarms, live copies).
    pub share_backlog: f64,
    pub share_live_in_order: f64,
    pub share_alarms: f64,
    pub share_live_copies: f64,
    /// Edge bytes forwarded per second while draining ÷ the cap: how much of the cap the
    /// records' own bytes used (the rest carried tern's headers, about 110 B a record here,
    /// and record framing).
    pub cap_used_by_edge_bytes: f64,
    /// Records copied to the live topic.
    pub live_copies: u64,
    /// Records in the edge topics at the end: what the forwarded topics must hold once each.
    pub telemetry_records: u64,
    pub alarm_records: u64,
    pub topics: Topics,
}

/// Every strategy's figures, with the command and what was run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThinReport {
    pub command: String,
    pub backlog: u64,
    pub size: usize,
    pub bandwidth: u64,
    pub live_rate: u64,
    pub alarm_interval_ms: u64,
    pub runs: Vec<StrategyRun>,
}

/// Runs every strategy (and the negative control) one after the other.
pub fn run(options: &ThinOptions, command: String) -> Result<ThinReport, BenchError> {
    options.validate()?;
    let runtime = crate::runtime(None)?;
    let mut runs = Vec::new();
    let mirror = Variant {
        ablated: false,
        shared: false,
    };
    for &strategy in &options.strategies {
        runs.push(runtime.block_on(run_one(options, strategy, mirror))?);
    }
    if options.shared {
        let shared = Variant {
            shared: true,
            ..mirror
        };
        runs.push(runtime.block_on(run_one(options, Strategy::LiveFirst, shared))?);
    }
    if options.ablate_live_copies {
        let ablated = Variant {
            ablated: true,
            ..mirror
        };
        runs.push(runtime.block_on(run_one(options, Strategy::LiveFirst, ablated))?);
    }
    Ok(ThinReport {
        command,
        backlog: options.backlog,
        size: options.size,
        bandwidth: options.bandwidth,
        live_rate: options.live_rate,
        alarm_interval_ms: u64::try_from(options.alarm_interval.as_millis()).unwrap_or(u64::MAX),
        runs,
    })
}

/// How a run differs from the product's mirror mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Variant {
    /// The negative control: copies into the forwarded topic.
    ablated: bool,
    /// Shared mode.
    shared: bool,
}

/// The edge log of one run; its directory is removed on drop.
struct Edge {
    log: Log,
    dir: PathBuf,
}

impl Drop for Edge {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Edge {
    async fn open(name: &str) -> Result<Self, BenchError> {
        let dir = std::env::temp_dir().join(format!("tern-bench-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        let log = Log::open(&dir, &LogConfig::default())
            .await
            .map_err(|source| BenchError::log("open", source))?;
        for topic in [TELEMETRY, ALARMS] {
            log.create_topic(topic, 1)
                .map_err(|source| BenchError::log("create topic", source))?;
        }
        Ok(Self { log, dir })
    }

    /// Appends `records` to `topic`; the offset after them once durable.
    async fn append(&self, topic: &str, records: Vec<Record>) -> Result<u64, BenchError> {
        let count = records.len() as u64;
        let base = self
            .log
            .append(topic, 0, records)
            .await
            .map_err(|source| BenchError::log("append", source))?;
        Ok(base + count)
    }

    fn end(&self, topic: &str) -> u64 {
        self.log.offsets(topic, 0).map_or(0, |(_, end)| end)
    }
}

fn record(timestamp_ms: i64, value: Vec<u8>) -> Record {
    Record {
        timestamp_ms,
        key: None,
        value: value.into(),
        headers: tern_log::Headers::new(),
    }
}

/// The configuration of `strategy`'s forwarder under `gateway`.
fn upstream_config(
    options: &ThinOptions,
    strategy: Strategy,
    gateway: &str,
    shared: bool,
) -> UpstreamConfig {
    let mut config = UpstreamConfig {
        bootstrap: options.kafka.clone(),
        gateway_id: Some(gateway.to_owned()),
        // Shared mode: a prefix of the run's own, so each run has new shared topics.
        topic_prefix: match shared {
            true => format!("{TOPIC_PREFIX}{gateway}."),
            false => TOPIC_PREFIX.to_owned(),
        },
        mode: if shared { Mode::Shared } else { Mode::Mirror },
        bandwidth: ByteSize(options.bandwidth),
        backoff_max: HumanDuration(Duration::from_secs(1)),
        ..UpstreamConfig::default()
    };
    if strategy != Strategy::Strict {
        config.priorities.insert(ALARMS.to_owned(), Class::High);
        config.priorities.insert(TELEMETRY.to_owned(), Class::Low);
    }
    if strategy == Strategy::LiveFirst {
        config.live_first = vec![TELEMETRY.to_owned()];
    }
    config
}

async fn run_one(
    options: &ThinOptions,
    strategy: Strategy,
    variant: Variant,
) -> Result<StrategyRun, BenchError> {
    let unique = crate::upstream::run_id();
    let gateway = format!(
        "thin-{unique}-{}{}{}",
        strategy.name(),
        if variant.shared { "-shared" } else { "" },
        if variant.ablated { "-ablated" } else { "" }
    );
    let edge = Edge::open(&gateway).await?;
    // A day of telemetry, oldest first.
    let mut values = Telemetry::new(options.size);
    let day_start = tern_core::time::now_ms() - DAY_MS;
    let step = DAY_MS / i64::try_from(options.backlog).unwrap_or(i64::MAX).max(1);
    let mut built = 0;
    while built < options.backlog {
        let count = APPEND_BATCH.min(options.backlog - built);
        let batch = (built..built + count)
            .map(|i| {
                record(
                    day_start + i64::try_from(i).unwrap_or(0) * step,
                    values.next_value(),
                )
            })
            .collect();
        built = edge.append(TELEMETRY, batch).await?;
    }
    let config = upstream_config(options, strategy, &gateway, variant.shared);
    let prefix = config.topic_prefix.clone();
    let forwarded = |topic| match variant.shared {
        true => shared_topic(&prefix, topic),
        false => upstream_topic(&prefix, &gateway, topic),
    };
    let topics = Topics {
        telemetry: forwarded(TELEMETRY),
        alarms: forwarded(ALARMS),
        live: (strategy == Strategy::LiveFirst && !variant.ablated)
            .then(|| format!("{}.live", upstream_topic(&prefix, &gateway, TELEMETRY))),
    };
    let ablation = Ablation {
        live_into_forwarded_topic: variant.ablated,
        ..Ablation::NONE
    };
    // The link returns.
    let status = StatusMap::default();
    let (trigger, stop) = shutdown::channel();
    let started = Instant::now();
    let forwarder = tokio::spawn(run_ablated(
        config,
        ablation,
        gateway.clone(),
        edge.log.clone(),
        Arc::clone(&status),
        stop,
    ));
    let mut live_every = tokio::time::interval(
        Duration::from_secs(1) / u32::try_from(options.live_rate).unwrap_or(1000),
    );
    let mut alarm_every = tokio::time::interval(options.alarm_interval);
    let mut poll = tokio::time::interval(POLL);
    let mut alarms_durable: Vec<Instant> = Vec::new();
    let mut alarms_seen: Vec<Instant> = Vec::new();
    let mut first_live: Option<Duration> = None;
    let mut drained: Option<(Duration, [u64; 4])> = None;
    while drained.is_none() {
        if started.elapsed() > RUN_TIMEOUT {
            return Err(BenchError::Stalled {
                topic: topics.telemetry.clone(),
                expected: options.backlog,
                got: forwarded_next(&status, TELEMETRY),
                after: RUN_TIMEOUT,
            });
        }
        tokio::select! {
            _ = live_every.tick() => {
                let value = values.next_value();
                edge.append(TELEMETRY, vec![record(tern_core::time::now_ms(), value)]).await?;
            }
            _ = alarm_every.tick() => {
                let value = format!("alarm {}", alarms_durable.len()).into_bytes();
                edge.append(ALARMS, vec![record(tern_core::time::now_ms(), value)]).await?;
                alarms_durable.push(Instant::now());
            }
            _ = poll.tick() => {
                let now = Instant::now();
                let alarms = forwarded_next(&status, ALARMS);
                while (alarms_seen.len() as u64) < alarms.min(alarms_durable.len() as u64) {
                    alarms_seen.push(now);
                }
                let telemetry = status_of(&status, TELEMETRY);
                if first_live.is_none()
                    && (telemetry.live_records > 0 || telemetry.next > options.backlog)
                {
                    first_live = Some(started.elapsed());
                }
                if telemetry.next >= options.backlog {
                    drained = Some((started.elapsed(), bytes_by_kind(&status, options.backlog)));
                }
            }
        }
    }
    let (drain, bytes) = drained.unwrap_or_default();
    // Everything appended so far goes upstream; then the forwarder stops.
    let (telemetry_records, alarm_records) = (edge.end(TELEMETRY), edge.end(ALARMS));
    while forwarded_next(&status, TELEMETRY) < telemetry_records
        || forwarded_next(&status, ALARMS) < alarm_records
        || (alarms_seen.len() as u64) < alarm_records
    {
        if started.elapsed() > RUN_TIMEOUT {
            return Err(BenchError::Stalled {
                topic: topics.alarms.clone(),
                expected: alarm_records,
                got: alarms_seen.len() as u64,
                after: RUN_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL).await;
        let now = Instant::now();
        let alarms = forwarded_next(&status, ALARMS);
        while (alarms_seen.len() as u64) < alarms.min(alarm_records) {
            alarms_seen.push(now);
        }
    }
    trigger.trigger();
    forwarder.await.map_err(|e| BenchError::Task {
        what: "the forwarder",
        reason: e.to_string(),
    })??;
    let mut latencies: Vec<Duration> = alarms_durable
        .iter()
        .zip(&alarms_seen)
        .map(|(durable, seen)| seen.saturating_duration_since(*durable))
        .collect();
    latencies.sort();
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    let total: u64 = bytes.iter().sum();
    let share = |b: u64| b as f64 / total.max(1) as f64;
    let live_copies = status_of(&status, TELEMETRY).live_records;
    Ok(StrategyRun {
        strategy,
        mode: if variant.shared { "shared" } else { "mirror" },
        ablated: variant.ablated,
        first_live_ms: ms(first_live),
        alarms: latencies.len(),
        alarm_p50_ms: ms(percentile(&latencies, 50.0)),
        alarm_max_ms: ms(latencies.last().copied()),
        drain_s: drain.as_secs_f64(),
        share_backlog: share(bytes[0]),
        share_live_in_order: share(bytes[1]),
        share_alarms: share(bytes[2]),
        share_live_copies: share(bytes[3]),
        cap_used_by_edge_bytes: total as f64
            / drain.as_secs_f64().max(1e-9)
            / options.bandwidth as f64,
        live_copies,
        telemetry_records,
        alarm_records,
        topics,
    })
}

fn status_of(status: &StatusMap, topic: &str) -> tern_upstream::PartitionStatus {
    let map = status.lock().unwrap_or_else(|e| e.into_inner());
    map.get(&(topic.to_owned(), 0)).cloned().unwrap_or_default()
}

fn forwarded_next(status: &StatusMap, topic: &str) -> u64 {
    status_of(status, topic).next
}

/// Edge bytes forwarded by now: the backlog's and the live records' in order (telemetry
/// beyond the backlog, estimated by the mean record size), the alarms', the live copies'.
fn bytes_by_kind(status: &StatusMap, backlog: u64) -> [u64; 4] {
    let telemetry = status_of(status, TELEMETRY);
    let alarms = status_of(status, ALARMS);
    let mean = telemetry
        .forwarded_bytes
        .checked_div(telemetry.forwarded_records)
        .unwrap_or(0);
    let live_in_order = telemetry.forwarded_records.saturating_sub(backlog) * mean;
    [
        telemetry.forwarded_bytes.saturating_sub(live_in_order),
        live_in_order,
        alarms.forwarded_bytes,
        telemetry.live_bytes,
    ]
}

impl fmt::Display for ThinReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.command)?;
        writeln!(
            f,
            "thin link: a day's backlog of {} telemetry records of {} B under a {} B/s cap ({:.2} Mbit/s); \
             while it drains, {} live telemetry records/s and an alarm every {} ms",
            self.backlog,
            self.size,
            self.bandwidth,
            self.bandwidth as f64 * 8.0 / 1e6,
            self.live_rate,
            self.alarm_interval_ms
        )?;
        writeln!(
            f,
            "{:<22} {:>14} {:>7} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "strategy",
            "first live ms",
            "alarms",
            "alarm p50",
            "alarm max",
            "drain s",
            "x strict",
            "backlog",
            "live",
            "alarms",
            "copies",
            "copied",
            "cap use"
        )?;
        let strict = self
            .runs
            .iter()
            .find(|r| r.strategy == Strategy::Strict && r.mode == "mirror" && !r.ablated)
            .map(|r| r.drain_s);
        for run in &self.runs {
            let name = format!(
                "{}{}{}",
                run.strategy.name(),
                if run.mode == "shared" {
                    " (shared)"
                } else {
                    ""
                },
                if run.ablated { " (ablated)" } else { "" }
            );
            let ratio = strict.map_or(f64::NAN, |s| run.drain_s / s);
            writeln!(
                f,
                "{name:<22} {:>14.0} {:>7} {:>10.0} {:>10.0} {:>9.1} {:>9.3} {:>8.3} {:>8.3} {:>8.4} {:>8.3} {:>8} {:>8.3}",
                run.first_live_ms,
                run.alarms,
                run.alarm_p50_ms,
                run.alarm_max_ms,
                run.drain_s,
                ratio,
                run.share_backlog,
                run.share_live_in_order,
                run.share_alarms,
                run.share_live_copies,
                run.live_copies,
                run.cap_used_by_edge_bytes
            )?;
        }
        writeln!(
            f,
            "(first live: from the link's return to the first live telemetry record upstream; alarm: durable at \
             the edge → visible upstream, ms; x strict: drain time ÷ strict order's; backlog/live/alarms/copies: \
             each kind's share of the edge bytes forwarded while draining (live: telemetry after the backlog in \
             edge order; copies: the live topic); cap use: those edge bytes per second ÷ the cap, the rest of the \
             cap carried tern's headers and framing)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ThinOptions {
        ThinOptions {
            kafka: vec!["127.0.0.1:1".into()],
            backlog: 1000,
            size: 100,
            bandwidth: 125_000,
            live_rate: 20,
            alarm_interval: Duration::from_secs(1),
            strategies: Strategy::ALL.to_vec(),
            ablate_live_copies: false,
            shared: false,
        }
    }

    #[test]
    fn strategies_set_the_classes_and_live_first_and_bad_options_are_named() {
        let strict = upstream_config(&options(), Strategy::Strict, "gw", false);
        assert!(strict.priorities.is_empty() && strict.live_first.is_empty());
        assert_eq!(strict.validate(), Ok(()));
        let priority = upstream_config(&options(), Strategy::Priority, "gw", false);
        assert_eq!(priority.class_of(ALARMS), Class::High);
        assert_eq!(priority.class_of(TELEMETRY), Class::Low);
        assert!(priority.live_first.is_empty());
        let live = upstream_config(&options(), Strategy::LiveFirst, "gw", false);
        assert!(live.is_live_first(TELEMETRY) && !live.is_live_first(ALARMS));
        let shared = upstream_config(&options(), Strategy::LiveFirst, "gw", true);
        assert_eq!(shared.mode, Mode::Shared);
        assert_eq!(shared.topic_prefix, "tern-bench.gw.");
        assert_eq!(shared.validate(), Ok(()));
        assert_eq!(live.bandwidth.0, 125_000);
        let bad = ThinOptions {
            live_rate: 0,
            ..options()
        };
        let err = bad.validate().map_err(|e| e.to_string());
        assert_eq!(err, Err("--live-rate must be 1 to 1000".to_owned()));
    }
}
