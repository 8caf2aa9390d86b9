//! The MQTT bench's figures: medians over repetitions, tern/Mosquitto ratios, the targets and whether
//! each is met, rendered as a side-by-side table or as one JSON object.
//!
//! It must never measure anything and never fail on a target it misses.

use std::fmt::Write as _;
use std::net::SocketAddr;

use serde::Serialize;

use super::BenchOptions;
use super::load::Measured;
use super::subscribes::SubscribeFigures;
use crate::report::Target;
use crate::stats::{median, percentile};

/// tern's durable QoS 1 throughput must reach this multiple of Mosquitto's.
const TARGET_RATIO: f64 = 2.0;
/// tern's p99 PUBACK latency must stay at or below this.
const TARGET_P99_MS: f64 = 20.0;
/// tern's resident memory with 1,000 idle clients must stay at or below this.
const TARGET_IDLE_RSS_MIB: f64 = 24.0;
/// tern's CPU time per durable QoS 1 message must stay at or below this multiple of Mosquitto's
/// (which acknowledges from RAM on one thread: a fair bar for the work per message).
const TARGET_CPU_RATIO: f64 = 0.5;
/// tern's resident memory with the idle clients must stay at or below this multiple of
/// Mosquitto's in the same run.
const TARGET_IDLE_RSS_RATIO: f64 = 1.5;

/// Which load a run was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Qos1,
    /// QoS 1 with many publishes in flight, so the commit window is not the bound.
    Deep,
    Qos0,
}

/// Figures of one load run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Run {
    pub msgs_per_sec: f64,
    /// PUBACK latencies (QoS 1 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<f64>,
    /// The broker's CPU seconds (user + system) per 100,000 messages (child brokers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_s_per_100k: Option<f64>,
}

impl Run {
    pub fn new(measured: Measured, cpu_s_per_100k: Option<f64>) -> Self {
        let at = |p: f64| percentile(&measured.latencies_us, p).map(|us| us / 1000.0);
        Self {
            msgs_per_sec: measured.msgs_per_sec,
            p50_ms: at(50.0),
            p99_ms: at(99.0),
            max_ms: at(100.0),
            cpu_s_per_100k,
        }
    }
}

/// Every run of one broker, per load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BrokerFigures {
    qos1: Vec<Run>,
    deep: Vec<Run>,
    qos0: Vec<Run>,
}

impl BrokerFigures {
    pub fn add(&mut self, kind: Kind, run: Run) {
        match kind {
            Kind::Qos1 => self.qos1.push(run),
            Kind::Deep => self.deep.push(run),
            Kind::Qos0 => self.qos0.push(run),
        }
    }

    fn medians(&self) -> Medians {
        Medians {
            qos1: median_run(&self.qos1),
            deep: median_run(&self.deep),
            qos0: median_run(&self.qos0),
        }
    }
}

/// Each figure's median over the runs (figures of different runs may mix).
fn median_run(runs: &[Run]) -> Option<Run> {
    let of = |pick: fn(&Run) -> Option<f64>| median(runs.iter().filter_map(pick));
    Some(Run {
        msgs_per_sec: of(|r| Some(r.msgs_per_sec))?,
        p50_ms: of(|r| r.p50_ms),
        p99_ms: of(|r| r.p99_ms),
        max_ms: of(|r| r.max_ms),
        cpu_s_per_100k: of(|r| r.cpu_s_per_100k),
    })
}

/// Median figures of one broker.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Medians {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos1: Option<Run>,
    /// The deep QoS 1 run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deep: Option<Run>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos0: Option<Run>,
}

/// A broker's memory, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Memory {
    pub idle_clients: usize,
    /// VmRSS right after start.
    pub start_kib: u64,
    /// VmRSS with `idle_clients` connected idle clients.
    pub idle_kib: u64,
    /// VmHWM after every load run.
    pub peak_kib: u64,
}

/// tern's figure divided by Mosquitto's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ratios {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos1_msgs_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deep_msgs_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos0_msgs_per_sec: Option<f64>,
    /// CPU seconds per QoS 1 message (the first load).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos1_cpu_per_message: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deep_cpu_per_message: Option<f64>,
    /// RSS with the idle clients.
    pub idle_rss: f64,
}

/// The loads every run used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LoadShape {
    pub publishers: usize,
    pub messages: usize,
    pub size: usize,
    pub window: usize,
    pub deep_publishers: usize,
    pub deep_window: usize,
    pub repetitions: usize,
}

/// Every figure of one bench.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub load: LoadShape,
    /// `--broker`: the one broker measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<Medians>,
    /// Every tern setting the bench changed from the defaults, as `key = value` (beyond the
    /// temporary data directory and the loopback listeners).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern_settings: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern: Option<Medians>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mosquitto: Option<Medians>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<Ratios>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern_memory: Option<Memory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mosquitto_memory: Option<Memory>,
    /// The closed-loop producer's run (`closed_loop.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_loop: Option<super::closed_loop::ClosedLoop>,
    /// 1,000 SUBSCRIBEs on a persistent session (`subscribes.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribes: Option<SubscribeFigures>,
    pub targets: Vec<Target>,
}

fn shape(options: &BenchOptions) -> LoadShape {
    LoadShape {
        publishers: options.publishers,
        messages: options.messages,
        size: options.size,
        window: options.window,
        deep_publishers: options.deep_publishers,
        deep_window: options.deep_window,
        repetitions: options.repetitions,
    }
}

/// `a / b`, or `None` when either is missing or the quotient is not a number (a quick run may
/// take less CPU than one clock tick of /proc, so a denominator can be zero).
fn divide(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?).filter(|q| q.is_finite())
}

fn rate(run: Option<Run>) -> Option<f64> {
    run.map(|r| r.msgs_per_sec)
}

fn cpu(run: Option<Run>) -> Option<f64> {
    run?.cpu_s_per_100k
}

impl Report {
    /// The figures of `--broker ADDR`.
    pub fn single(options: &BenchOptions, addr: SocketAddr, figures: BrokerFigures) -> Self {
        Self {
            load: shape(options),
            broker: Some(addr),
            measured: Some(figures.medians()),
            tern_settings: None,
            tern: None,
            mosquitto: None,
            ratio: None,
            tern_memory: None,
            mosquitto_memory: None,
            closed_loop: None,
            subscribes: None,
            targets: Vec::new(),
        }
    }

    /// tern next to Mosquitto (figures and memory in that order), with the targets;
    /// `settings` are the tern settings the bench changed.
    pub fn side_by_side(
        options: &BenchOptions,
        [tern, mosquitto]: [BrokerFigures; 2],
        [tern_memory, mosquitto_memory]: [Memory; 2],
        settings: Vec<String>,
    ) -> Self {
        let (t, m) = (tern.medians(), mosquitto.medians());
        let ratio = Ratios {
            qos1_msgs_per_sec: divide(rate(t.qos1), rate(m.qos1)),
            deep_msgs_per_sec: divide(rate(t.deep), rate(m.deep)),
            qos0_msgs_per_sec: divide(rate(t.qos0), rate(m.qos0)),
            qos1_cpu_per_message: divide(cpu(t.qos1), cpu(m.qos1)),
            deep_cpu_per_message: divide(cpu(t.deep), cpu(m.deep)),
            idle_rss: tern_memory.idle_kib as f64 / mosquitto_memory.idle_kib.max(1) as f64,
        };
        let mut targets = Vec::new();
        if let Some(measured) = ratio.qos1_msgs_per_sec {
            targets.push(Target::at_least(
                "tern/mosquitto QoS 1 msgs/s",
                TARGET_RATIO,
                measured,
            ));
        }
        if let Some(measured) = t.qos1.and_then(|r| r.p99_ms) {
            targets.push(Target::at_most(
                "tern p99 PUBACK ms",
                TARGET_P99_MS,
                measured,
            ));
        }
        if let Some(measured) = ratio.qos1_cpu_per_message {
            targets.push(Target::at_most(
                "tern/mosquitto CPU per QoS 1 message",
                TARGET_CPU_RATIO,
                measured,
            ));
        }
        targets.push(Target::at_most(
            "tern RSS MiB with idle clients",
            TARGET_IDLE_RSS_MIB,
            mib(tern_memory.idle_kib),
        ));
        targets.push(Target::at_most(
            "tern/mosquitto RSS with idle clients",
            TARGET_IDLE_RSS_RATIO,
            ratio.idle_rss,
        ));
        Self {
            load: shape(options),
            broker: None,
            measured: None,
            tern_settings: Some(settings),
            tern: Some(t),
            mosquitto: Some(m),
            ratio: Some(ratio),
            tern_memory: Some(tern_memory),
            mosquitto_memory: Some(mosquitto_memory),
            closed_loop: None,
            subscribes: None,
            targets,
        }
    }

    /// The report with the persistent-session SUBSCRIBE figure (and tern's target for it).
    pub fn with_subscribes(mut self, subscribes: SubscribeFigures) -> Self {
        self.targets.extend(subscribes.target());
        self.subscribes = Some(subscribes);
        self
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = &self.load;
        writeln!(
            f,
            "tern bench mqtt: {} publishers x {} messages x {} B, window {}; deep QoS 1: {} x {} \
             in flight; median of {} run(s)",
            l.publishers,
            l.messages,
            l.size,
            l.window,
            l.deep_publishers,
            l.deep_window,
            l.repetitions
        )?;
        if let Some(settings) = &self.tern_settings {
            let changed = if settings.is_empty() {
                "none".to_owned()
            } else {
                settings.join(", ")
            };
            writeln!(
                f,
                "tern settings: defaults (durable QoS 1 acks), listeners on 127.0.0.1:0; \
                 changed: {changed}"
            )?;
        }
        let mut columns: Vec<(String, Medians, Option<Memory>)> = Vec::new();
        if let (Some(addr), Some(m)) = (self.broker, self.measured) {
            columns.push((addr.to_string(), m, None));
        }
        if let (Some(t), Some(m)) = (self.tern, self.mosquitto) {
            columns.push(("tern (durable)".to_owned(), t, self.tern_memory));
            columns.push(("mosquitto".to_owned(), m, self.mosquitto_memory));
        }
        f.write_str(&table(&columns, self.ratio.is_some()))?;
        if let Some(closed_loop) = &self.closed_loop {
            write!(f, "{closed_loop}")?;
        }
        if let Some(subscribes) = &self.subscribes {
            write!(f, "{subscribes}")?;
        }
        for t in &self.targets {
            writeln!(
                f,
                "target {}: {} (measured {:.2}) {}",
                t.name,
                t.target,
                t.measured,
                t.verdict()
            )?;
        }
        Ok(())
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

type Pick = fn(&Medians, Option<Memory>) -> Option<f64>;

/// The rows of the table: a label and the figure of a column.
const ROWS: [(&str, Pick); 13] = [
    ("QoS 1 msgs/s", |m, _| rate(m.qos1)),
    ("QoS 1 PUBACK p50 ms", |m, _| m.qos1?.p50_ms),
    ("QoS 1 PUBACK p99 ms", |m, _| m.qos1?.p99_ms),
    ("QoS 1 PUBACK max ms", |m, _| m.qos1?.max_ms),
    ("QoS 1 CPU s/100k msgs", |m, _| cpu(m.qos1)),
    ("deep QoS 1 msgs/s", |m, _| rate(m.deep)),
    ("deep PUBACK p99 ms", |m, _| m.deep?.p99_ms),
    ("deep CPU s/100k msgs", |m, _| cpu(m.deep)),
    ("QoS 0 msgs/s", |m, _| rate(m.qos0)),
    ("QoS 0 CPU s/100k msgs", |m, _| cpu(m.qos0)),
    ("RSS MiB at start", |_, mem| Some(mib(mem?.start_kib))),
    ("RSS MiB, idle clients", |_, mem| Some(mib(mem?.idle_kib))),
    ("RSS MiB peak", |_, mem| Some(mib(mem?.peak_kib))),
];

/// The side-by-side table; with `ratio`, a last column of the first column over the second.
fn table(columns: &[(String, Medians, Option<Memory>)], ratio: bool) -> String {
    let mut out = format!("{:<24}", "");
    for (name, ..) in columns {
        let _ = write!(out, "{name:>16}");
    }
    if ratio {
        let _ = write!(out, "{:>16}", "tern/mosquitto");
    }
    out.push('\n');
    for (label, pick) in ROWS {
        let figures: Vec<Option<f64>> = columns.iter().map(|(_, m, mem)| pick(m, *mem)).collect();
        if figures.iter().all(Option::is_none) {
            continue;
        }
        let _ = write!(out, "{label:<24}");
        for figure in &figures {
            match figure {
                Some(v) if *v >= 100.0 => {
                    let _ = write!(out, "{v:>16.0}");
                }
                Some(v) => {
                    let _ = write!(out, "{v:>16.3}");
                }
                None => {
                    let _ = write!(out, "{:>16}", "-");
                }
            }
        }
        if let (true, [Some(a), Some(b)]) = (ratio, figures.as_slice()) {
            let _ = write!(out, "{:>16.2}", a / b);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(msgs_per_sec: f64, latencies_us: Vec<f64>) -> Run {
        let cpu = Some(100_000.0 / msgs_per_sec);
        Run::new(
            Measured {
                msgs_per_sec,
                latencies_us,
            },
            cpu,
        )
    }

    #[test]
    fn a_run_quotes_nearest_rank_latencies_in_ms() {
        let got = run(100.0, (1..=100).map(|us| f64::from(us) * 1000.0).collect());
        assert_eq!(
            (got.p50_ms, got.p99_ms, got.max_ms),
            (Some(50.0), Some(99.0), Some(100.0))
        );
        assert_eq!(run(100.0, Vec::new()).p99_ms, None);
    }

    #[test]
    fn side_by_side_reports_ratios_and_targets() {
        let mut tern = BrokerFigures::default();
        let mut mosquitto = BrokerFigures::default();
        for (t, m) in [(300.0, 100.0), (200.0, 100.0), (250.0, 90.0)] {
            tern.add(Kind::Qos1, run(t, vec![1000.0, 5000.0]));
            mosquitto.add(Kind::Qos1, run(m, vec![100.0]));
        }
        tern.add(Kind::Deep, run(400.0, vec![9000.0]));
        mosquitto.add(Kind::Deep, run(100.0, vec![100.0]));
        tern.add(Kind::Qos0, run(1000.0, Vec::new()));
        mosquitto.add(Kind::Qos0, run(500.0, Vec::new()));
        let memory = |idle_mib: u64| Memory {
            idle_clients: 1000,
            start_kib: 4096,
            idle_kib: idle_mib * 1024,
            peak_kib: 31 * 1024,
        };
        let report = Report::side_by_side(
            &BenchOptions::quick(),
            [tern, mosquitto],
            [memory(30), memory(10)],
            vec!["mqtt.max_connections = 2048".to_owned()],
        );
        let ratio = report.ratio.expect("ratios");
        assert_eq!(ratio.qos1_msgs_per_sec, Some(2.5));
        assert_eq!(ratio.deep_msgs_per_sec, Some(4.0));
        assert_eq!(ratio.qos0_msgs_per_sec, Some(2.0));
        assert_eq!(ratio.qos1_cpu_per_message, Some(0.4));
        assert_eq!(ratio.idle_rss, 3.0);
        let met: Vec<bool> = report.targets.iter().map(|t| t.met).collect();
        assert_eq!(met, vec![true, true, true, false, false]);
        let text = report.to_string();
        assert!(text.contains("QoS 1 PUBACK p99 ms"), "{text}");
        assert!(text.contains("QoS 1 CPU s/100k msgs"), "{text}");
        assert!(
            text.contains("changed: mqtt.max_connections = 2048"),
            "{text}"
        );
        assert!(text.contains("NOT met"), "{text}");
        let json = crate::report::to_json(&report).expect("serializes");
        let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(json["tern"]["qos1"]["p99_ms"], 5.0);
        assert_eq!(json["tern"]["qos1"]["cpu_s_per_100k"], 400.0);
        assert_eq!(json["tern_memory"]["idle_kib"], 30 * 1024);
        assert_eq!(json["mosquitto_memory"]["idle_kib"], 10 * 1024);
    }
}
