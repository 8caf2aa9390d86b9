//! The MQTT bench's figures: medians over repetitions, tern/Mosquitto ratios, the targets and whether
//! each is met, rendered as a side-by-side table or as one JSON object.
//!
//! It must never measure anything and never fail on a target it misses.

use std::fmt::Write as _;
use std::net::SocketAddr;

use serde::Serialize;

use super::BenchOptions;
use super::load::Measured;
use crate::report::Target;
use crate::stats::{median, percentile};

/// tern's durable QoS 1 throughput must reach this multiple of Mosquitto's.
const TARGET_RATIO: f64 = 2.0;
/// tern's p99 PUBACK latency must stay at or below this.
const TARGET_P99_MS: f64 = 20.0;
/// tern's resident memory with 1,000 idle clients must stay at or below this.
const TARGET_IDLE_RSS_MIB: f64 = 24.0;

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
}

impl From<Measured> for Run {
    fn from(measured: Measured) -> Self {
        let at = |p: f64| percentile(&measured.latencies_us, p).map(|us| us / 1000.0);
        Self {
            msgs_per_sec: measured.msgs_per_sec,
            p50_ms: at(50.0),
            p99_ms: at(99.0),
            max_ms: at(100.0),
        }
    }
}

/// Every run of one broker, per QoS level.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BrokerFigures {
    qos1: Vec<Run>,
    qos0: Vec<Run>,
}

impl BrokerFigures {
    pub fn add(&mut self, qos1: bool, run: Run) {
        if qos1 {
            self.qos1.push(run);
        } else {
            self.qos0.push(run);
        }
    }

    fn medians(&self) -> Medians {
        Medians {
            qos1: median_run(&self.qos1),
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
    })
}

/// Median figures of one broker.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Medians {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos1: Option<Run>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos0: Option<Run>,
}

/// tern's memory, in KiB.
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
    pub qos0_msgs_per_sec: Option<f64>,
}

/// The load every run used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LoadShape {
    pub publishers: usize,
    pub messages: usize,
    pub size: usize,
    pub window: usize,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern: Option<Medians>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mosquitto: Option<Medians>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<Ratios>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern_memory: Option<Memory>,
    pub targets: Vec<Target>,
}

fn shape(options: &BenchOptions) -> LoadShape {
    LoadShape {
        publishers: options.publishers,
        messages: options.messages,
        size: options.size,
        window: options.window,
        repetitions: options.repetitions,
    }
}

fn divide(a: Option<Run>, b: Option<Run>) -> Option<f64> {
    Some(a?.msgs_per_sec / b?.msgs_per_sec)
}

impl Report {
    /// The figures of `--broker ADDR`.
    pub fn single(options: &BenchOptions, addr: SocketAddr, figures: BrokerFigures) -> Self {
        Self {
            load: shape(options),
            broker: Some(addr),
            measured: Some(figures.medians()),
            tern: None,
            mosquitto: None,
            ratio: None,
            tern_memory: None,
            targets: Vec::new(),
        }
    }

    /// tern next to Mosquitto, with the targets.
    pub fn side_by_side(
        options: &BenchOptions,
        tern: BrokerFigures,
        mosquitto: BrokerFigures,
        memory: Memory,
    ) -> Self {
        let (tern, mosquitto) = (tern.medians(), mosquitto.medians());
        let ratio = Ratios {
            qos1_msgs_per_sec: divide(tern.qos1, mosquitto.qos1),
            qos0_msgs_per_sec: divide(tern.qos0, mosquitto.qos0),
        };
        let mut targets = Vec::new();
        if let Some(measured) = ratio.qos1_msgs_per_sec {
            targets.push(Target::at_least(
                "tern/mosquitto QoS 1 msgs/s",
                TARGET_RATIO,
                measured,
            ));
        }
        if let Some(measured) = tern.qos1.and_then(|r| r.p99_ms) {
            targets.push(Target::at_most(
                "tern p99 PUBACK ms",
                TARGET_P99_MS,
                measured,
            ));
        }
        let idle_mib = memory.idle_kib as f64 / 1024.0;
        targets.push(Target::at_most(
            "tern RSS MiB with idle clients",
            TARGET_IDLE_RSS_MIB,
            idle_mib,
        ));
        Self {
            load: shape(options),
            broker: None,
            measured: None,
            tern: Some(tern),
            mosquitto: Some(mosquitto),
            ratio: Some(ratio),
            tern_memory: Some(memory),
            targets,
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = &self.load;
        writeln!(
            f,
            "tern bench mqtt: {} publishers x {} messages x {} B, window {}, median of {} run(s)",
            l.publishers, l.messages, l.size, l.window, l.repetitions
        )?;
        let mut columns: Vec<(String, Medians)> = Vec::new();
        if let (Some(addr), Some(m)) = (self.broker, self.measured) {
            columns.push((addr.to_string(), m));
        }
        if let (Some(t), Some(m)) = (self.tern, self.mosquitto) {
            columns.push(("tern (durable)".to_owned(), t));
            columns.push(("mosquitto".to_owned(), m));
        }
        f.write_str(&table(&columns, self.ratio))?;
        if let Some(m) = self.tern_memory {
            writeln!(
                f,
                "tern RSS: {:.1} MiB at start, {:.1} MiB with {} idle clients, peak {:.1} MiB",
                mib(m.start_kib),
                mib(m.idle_kib),
                m.idle_clients,
                mib(m.peak_kib)
            )?;
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

type Pick = fn(&Medians) -> Option<f64>;

/// The rows of the side-by-side table.
fn table(columns: &[(String, Medians)], ratio: Option<Ratios>) -> String {
    let rows: [(&str, Pick, Option<f64>); 5] = [
        (
            "QoS 1 msgs/s",
            |m| m.qos1.map(|r| r.msgs_per_sec),
            ratio.and_then(|r| r.qos1_msgs_per_sec),
        ),
        (
            "QoS 1 PUBACK p50 ms",
            |m| m.qos1.and_then(|r| r.p50_ms),
            None,
        ),
        (
            "QoS 1 PUBACK p99 ms",
            |m| m.qos1.and_then(|r| r.p99_ms),
            None,
        ),
        (
            "QoS 1 PUBACK max ms",
            |m| m.qos1.and_then(|r| r.max_ms),
            None,
        ),
        (
            "QoS 0 msgs/s",
            |m| m.qos0.map(|r| r.msgs_per_sec),
            ratio.and_then(|r| r.qos0_msgs_per_sec),
        ),
    ];
    let mut out = format!("{:<22}", "");
    for (name, _) in columns {
        let _ = write!(out, "{name:>16}");
    }
    if ratio.is_some() {
        let _ = write!(out, "{:>16}", "tern/mosquitto");
    }
    out.push('\n');
    for (label, pick, ratio) in rows {
        if columns.iter().all(|(_, m)| pick(m).is_none()) {
            continue;
        }
        let _ = write!(out, "{label:<22}");
        for (_, medians) in columns {
            match pick(medians) {
                Some(v) if v >= 100.0 => {
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
        if let Some(r) = ratio {
            let _ = write!(out, "{r:>16.2}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(msgs_per_sec: f64, latencies_us: Vec<f64>) -> Run {
        Run::from(Measured {
            msgs_per_sec,
            latencies_us,
        })
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
            tern.add(true, run(t, vec![1000.0, 5000.0]));
            mosquitto.add(true, run(m, vec![100.0]));
        }
        tern.add(false, run(1000.0, Vec::new()));
        mosquitto.add(false, run(500.0, Vec::new()));
        let memory = Memory {
            idle_clients: 1000,
            start_kib: 4096,
            idle_kib: 30 * 1024,
            peak_kib: 31 * 1024,
        };
        let report = Report::side_by_side(&BenchOptions::quick(), tern, mosquitto, memory);
        let ratio = report.ratio.expect("ratios");
        assert_eq!(ratio.qos1_msgs_per_sec, Some(2.5));
        assert_eq!(ratio.qos0_msgs_per_sec, Some(2.0));
        let met: Vec<bool> = report.targets.iter().map(|t| t.met).collect();
        assert_eq!(met, vec![true, true, false]);
        let text = report.to_string();
        assert!(text.contains("QoS 1 PUBACK p99 ms"), "{text}");
        assert!(text.contains("NOT met"), "{text}");
        let json = crate::report::to_json(&report).expect("serializes");
        let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(json["tern"]["qos1"]["p99_ms"], 5.0);
        assert_eq!(json["tern_memory"]["idle_kib"], 30 * 1024);
    }
}
