//! `tern-bench fleet`: many gateways through one regional outage into one cluster the user
//! started. Each run starts `--gateways` real `tern serve` children (data directory and
//! configuration of their own, half in mirror and half in shared mode by default), each fed by
//! a QoS 1 sensor, all forwarding through one bench proxy (`upstream/proxy.rs`) that stands in
//! for every link: it cuts every connection at once for `--outage` while the gateways keep
//! ingesting, then lets them all back at once. Printed per run: when each gateway had drained
//! (from its `/metrics`), the new connections the brokers saw before and after, request latency
//! and Produce throttling between the gateways and the brokers, the gateways' CPU and memory,
//! and whether every acknowledged reading is upstream (`check.rs`). `--spread both` runs the
//! same fleet twice, with the reconnect gaps jittered (the product's default) and without
//! (`reconnect_jitter = false`), so the figures show what the spread costs and saves.
//!
//! It never starts or stops Kafka, never asserts a target, ends only the children it started,
//! listens only on loopback, and only creates (through the gateways) topics under
//! `tern-bench.fleet-`, a fresh prefix per run.

mod check;
mod gateway;
mod report;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use report::FleetReport;

use check::Checked;
use gateway::{EDGE_TOPIC, Forwarding, Gateway, Setup};
use report::{Connections, Drained, FleetRun, Usage, latency_by_api};

use crate::BenchError;
use crate::upstream::TOPIC_PREFIX;
use crate::upstream::proxy::{API_PRODUCE, CountingProxy};

/// How often the gateways' `/metrics` are read while waiting for them.
const POLL: Duration = Duration::from_millis(250);
/// The longest the fleet may take to start forwarding.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// Steady forwarding before the outage.
const STEADY: Duration = Duration::from_secs(10);
/// The longest the gateways may take to notice the cut.
const NOTICE_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest every backlog may take to drain after the return.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(900);

/// Which forwarding modes the fleet runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeChoice {
    Mirror,
    Shared,
    /// The first half mirror, the rest shared.
    Both,
}

/// Whether the reconnect gaps are jittered (`reconnect_jitter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpreadChoice {
    On,
    Off,
    /// One whole run each, on first.
    Both,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetOptions {
    pub kafka: Vec<String>,
    pub gateways: usize,
    pub sensor_period: Duration,
    pub outage: Duration,
    pub mode: ModeChoice,
    pub spread: SpreadChoice,
    /// Every gateway's `reconnect_max`.
    pub reconnect_max: Duration,
}

impl FleetOptions {
    fn validate(&self) -> Result<(), BenchError> {
        let checks = [
            (
                self.kafka.is_empty(),
                "--kafka",
                "needs at least one host:port",
            ),
            (
                !(1..=200).contains(&self.gateways),
                "--gateways",
                "must be 1 to 200",
            ),
            (
                self.sensor_period < Duration::from_millis(10),
                "--sensor-period",
                "must be at least 10ms",
            ),
            (
                !(Duration::from_millis(500)..=Duration::from_secs(600))
                    .contains(&self.reconnect_max),
                "--reconnect-max",
                "must be 500ms to 10m",
            ),
            (
                !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.outage),
                "--outage",
                "must be 1s to 1h",
            ),
        ];
        match checks.into_iter().find(|(bad, _, _)| *bad) {
            Some((_, option, reason)) => Err(BenchError::Invalid { option, reason }),
            None => Ok(()),
        }
    }

    /// How gateway `i` forwards.
    fn mode_of(&self, i: usize) -> Forwarding {
        match self.mode {
            ModeChoice::Mirror => Forwarding::Mirror,
            ModeChoice::Shared => Forwarding::Shared,
            ModeChoice::Both if i < self.gateways / 2 => Forwarding::Mirror,
            ModeChoice::Both => Forwarding::Shared,
        }
    }

    fn spreads(&self) -> Vec<bool> {
        match self.spread {
            SpreadChoice::On => vec![true],
            SpreadChoice::Off => vec![false],
            SpreadChoice::Both => vec![true, false],
        }
    }
}

/// Runs the fleet once per spread setting.
pub fn run(options: &FleetOptions, command: String) -> Result<FleetReport, BenchError> {
    options.validate()?;
    let runtime = crate::runtime(None)?;
    let mut runs = Vec::new();
    for spread in options.spreads() {
        runs.push(run_one(&runtime, options, spread)?);
    }
    Ok(FleetReport {
        command,
        gateways: options.gateways,
        sensor_period_ms: u64::try_from(options.sensor_period.as_millis()).unwrap_or(u64::MAX),
        reconnect_max_s: options.reconnect_max.as_secs_f64(),
        outage_s: options.outage.as_secs_f64(),
        runs,
    })
}

/// The outage's instants.
#[derive(Debug, Clone, Copy)]
struct Timeline {
    cut: Instant,
    restored: Instant,
}

fn run_one(
    runtime: &tokio::runtime::Runtime,
    options: &FleetOptions,
    spread: bool,
) -> Result<FleetRun, BenchError> {
    let started = Instant::now();
    let on_off = if spread { "on" } else { "off" };
    let prefix = format!(
        "{TOPIC_PREFIX}fleet-{}-{on_off}.",
        crate::upstream::run_id()
    );
    let target = options.kafka.first().map_or("", String::as_str);
    let proxy = runtime.block_on(CountingProxy::start(target))?;
    let setup = Setup {
        bootstrap: proxy.bootstrap(),
        prefix: prefix.clone(),
        jitter: spread,
        reconnect_max: options.reconnect_max,
    };
    progress(&format!(
        "spread {on_off}: starting {} gateways",
        options.gateways
    ));
    let gateways = (0..options.gateways)
        .map(|i| Gateway::start(format!("fleet-{i:02}"), options.mode_of(i), &setup))
        .collect::<Result<Vec<_>, _>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let sensors: Vec<_> = gateways
        .iter()
        .map(|g| {
            let sensor = gateway::sensor(
                g.mqtt,
                g.id.clone(),
                options.sensor_period,
                Arc::clone(&stop),
            );
            runtime.spawn(sensor)
        })
        .collect();
    wait_all(&gateways, START_TIMEOUT, "every gateway forwarding", |m| {
        m[2] > 0.0
    })?;
    let steady = Instant::now();
    std::thread::sleep(STEADY);
    let (timeline, behind, drained) = outage(&proxy, &gateways, options)?;
    stop.store(true, Ordering::SeqCst);
    let mut acked = Vec::with_capacity(sensors.len());
    for sensor in sensors {
        acked.push(
            runtime
                .block_on(sensor)
                .map_err(|err| BenchError::task("a sensor", err))?,
        );
    }
    wait_all(
        &gateways,
        DRAIN_TIMEOUT,
        "every gateway forwarding its last readings",
        |m| m[0] == 0.0 && m[1] == 0.0,
    )?;
    let elapsed = started.elapsed();
    let usages = gateways
        .iter()
        .map(Gateway::usage)
        .collect::<Result<Vec<_>, _>>()?;
    let ids: Vec<(String, Forwarding)> = gateways.iter().map(|g| (g.id.clone(), g.mode)).collect();
    drop(gateways);
    progress(&format!(
        "spread {on_off}: reading every gateway's records back"
    ));
    let (check, failing) = check_upstream(&options.kafka.join(","), &prefix, &ids, &acked)?;
    let answered = proxy.answered();
    let produce = answered.iter().filter(|a| a.api_key == API_PRODUCE);
    let throttles: Vec<i32> = produce.filter_map(|a| a.throttle_ms).collect();
    Ok(FleetRun {
        spread,
        prefix,
        outage_s: timeline.restored.duration_since(timeline.cut).as_secs_f64(),
        behind_at_return: behind,
        drained: drained_by_mode(&ids, &drained),
        connections: Connections::of(&proxy.opened(), timeline.cut, timeline.restored),
        latency: latency_by_api(&answered, steady..timeline.cut, timeline.restored),
        produce_throttle_max_ms: throttles.iter().copied().max().unwrap_or(0),
        produce_throttled: throttles.iter().filter(|t| **t > 0).count(),
        usage: Usage::of(&usages, elapsed),
        check,
        gateways_failing_check: failing,
        elapsed_s: elapsed.as_secs_f64(),
    })
}

/// The regional outage: cuts every link, waits until every gateway noticed and `--outage`
/// passed, returns the links and waits until every gateway drained. Returns the instants, the
/// records behind at the return, and each gateway's drain time in seconds.
fn outage(
    proxy: &CountingProxy,
    gateways: &[Gateway],
    options: &FleetOptions,
) -> Result<(Timeline, u64, Vec<f64>), BenchError> {
    progress("cutting every link");
    let cut = Instant::now();
    proxy.cut();
    wait_all(gateways, NOTICE_TIMEOUT, "every gateway failing", |m| {
        m[1] > 0.0
    })?;
    // The outage's length is the scenario, not a wait for anything.
    std::thread::sleep(options.outage.saturating_sub(cut.elapsed()));
    let behind: f64 = gateways
        .iter()
        .filter_map(|g| g.metrics(NAMES).ok())
        .map(|m| m[0])
        .sum();
    progress(&format!("returning every link, {behind} records behind"));
    let restored = Instant::now();
    proxy.restore();
    let drained = drain(gateways, restored)?;
    Ok((Timeline { cut, restored }, behind as u64, drained))
}

/// The metrics read from every gateway, in this order.
const NAMES: [&str; 4] = [
    "tern_upstream_records_behind",
    "tern_upstream_failing",
    "tern_upstream_forwarded_records_total",
    "tern_upstream_backlog_age_seconds",
];

/// A gateway has drained once no record older than this waits for its upstream.
const DRAINED_AGE: Duration = Duration::from_secs(2);

/// Whether metrics `m` ([`NAMES`]) show a gateway drained: its upstream not failing, and nothing
/// behind or nothing older than [`DRAINED_AGE`]. The age, not "nothing behind", because a
/// shared-mode gateway at sensor rates has a reading in its open transaction most of the time
/// (each AddPartitionsToTxn after a commit waits out `CONCURRENT_TRANSACTIONS` while the markers
/// are written), while an outage's backlog is as old as the outage.
fn is_drained(m: &[f64; 4]) -> bool {
    m[1] == 0.0 && (m[0] == 0.0 || m[3] < DRAINED_AGE.as_secs_f64())
}

/// Seconds from `restored` until each gateway first showed itself drained ([`is_drained`]).
fn drain(gateways: &[Gateway], restored: Instant) -> Result<Vec<f64>, BenchError> {
    let mut drained: Vec<Option<f64>> = vec![None; gateways.len()];
    while drained.iter().any(Option::is_none) {
        if restored.elapsed() > DRAIN_TIMEOUT {
            return Err(BenchError::Waited {
                what: "every backlog drained",
                after: DRAIN_TIMEOUT,
            });
        }
        for (g, slot) in gateways.iter().zip(drained.iter_mut()) {
            if slot.is_none() && g.metrics(NAMES).is_ok_and(|m| is_drained(&m)) {
                *slot = Some(restored.elapsed().as_secs_f64());
            }
        }
        std::thread::sleep(POLL);
    }
    Ok(drained.into_iter().flatten().collect())
}

/// Waits until `done` holds for the metrics ([`NAMES`]) of every gateway.
fn wait_all(
    gateways: &[Gateway],
    timeout: Duration,
    what: &'static str,
    done: impl Fn(&[f64; 4]) -> bool,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<&Gateway> = gateways.iter().collect();
    while !pending.is_empty() {
        if Instant::now() > deadline {
            return Err(BenchError::Waited {
                what,
                after: timeout,
            });
        }
        pending.retain(|g| !g.metrics(NAMES).is_ok_and(|m| done(&m)));
        std::thread::sleep(POLL);
    }
    Ok(())
}

fn drained_by_mode(ids: &[(String, Forwarding)], drained: &[f64]) -> Vec<Drained> {
    [Forwarding::Mirror, Forwarding::Shared]
        .into_iter()
        .filter_map(|mode| {
            let times = ids
                .iter()
                .zip(drained)
                .filter(|((_, m), _)| *m == mode)
                .map(|(_, t)| *t)
                .collect();
            Drained::of(mode.name(), times)
        })
        .collect()
}

/// Reads every gateway's records back and checks them against its sensor's acknowledged
/// readings; the sum, and the gateways that failed.
fn check_upstream(
    bootstrap: &str,
    prefix: &str,
    ids: &[(String, Forwarding)],
    acked: &[Vec<u64>],
) -> Result<(Checked, Vec<String>), BenchError> {
    let mut shared = match ids.iter().any(|(_, m)| *m == Forwarding::Shared) {
        true => check::by_gateway(check::read(
            bootstrap,
            &tern_upstream::shared_topic(prefix, EDGE_TOPIC),
            true,
        )?),
        false => BTreeMap::new(),
    };
    let mut total = Checked::default();
    let mut failing = Vec::new();
    for ((id, mode), acked) in ids.iter().zip(acked) {
        let upstream = match mode {
            Forwarding::Shared => shared.remove(id).unwrap_or_default(),
            Forwarding::Mirror => check::read(
                bootstrap,
                &tern_upstream::upstream_topic(prefix, id, EDGE_TOPIC),
                false,
            )?,
        };
        let checked = check::check(id, &upstream, acked);
        if !checked.ok() {
            failing.push(id.clone());
        }
        total = total.add(checked);
    }
    Ok((total, failing))
}

fn progress(what: &str) {
    eprintln!("tern-bench fleet: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> FleetOptions {
        FleetOptions {
            kafka: vec!["127.0.0.1:1".into()],
            gateways: 5,
            sensor_period: Duration::from_millis(500),
            outage: Duration::from_secs(60),
            mode: ModeChoice::Both,
            spread: SpreadChoice::Both,
            reconnect_max: Duration::from_secs(2),
        }
    }

    #[test]
    fn half_mirror_half_shared_spread_on_then_off_and_bad_options_are_named() {
        let modes: Vec<Forwarding> = (0..5).map(|i| options().mode_of(i)).collect();
        use Forwarding::{Mirror, Shared};
        assert_eq!(modes, [Mirror, Mirror, Shared, Shared, Shared]);
        assert_eq!(options().spreads(), [true, false]);
        assert_eq!(options().validate().map_err(|e| e.to_string()), Ok(()));
        let bad = FleetOptions {
            outage: Duration::from_millis(10),
            ..options()
        };
        let err = bad.validate().map_err(|e| e.to_string());
        assert_eq!(err, Err("--outage must be 1s to 1h".to_owned()));
    }
}
