//! Per-partition forwarding metrics on `/metrics`: records behind, forwarded totals, connected,
//! and whether the last attempt failed, and the backlog and bytes of each priority class; and the downstream's per command partition (next offset,
//! lag, commands stored and refused). Reads the shared status and the edge log's offsets; never
//! changes either.

use std::collections::BTreeMap;
use std::fmt::Write;

use tern_core::metrics::MetricsSource;
use tern_log::LogPort;

use crate::backlog::{Backlog, backlogs};
use crate::bandwidth::Class;
use crate::driver::{PartitionStatus, StatusMap};

/// The upstream families for the admin endpoint.
#[derive(Debug)]
pub struct UpstreamMetrics<L> {
    status: StatusMap,
    log: L,
}

impl<L> UpstreamMetrics<L> {
    pub fn new(status: StatusMap, log: L) -> Self {
        Self { status, log }
    }
}

const FAMILIES: [(&str, &str, &str); 11] = [
    (
        "tern_upstream_records_behind",
        "gauge",
        "Durable edge records not yet forwarded.",
    ),
    (
        "tern_upstream_forwarded_records_total",
        "counter",
        "Records forwarded since start.",
    ),
    (
        "tern_upstream_forwarded_bytes_total",
        "counter",
        "Uncompressed bytes forwarded since start.",
    ),
    (
        "tern_upstream_batches_total",
        "counter",
        "Batches committed upstream since start (in shared mode, one Kafka transaction each).",
    ),
    (
        "tern_upstream_connected",
        "gauge",
        "1 while the partition's forwarder is connected.",
    ),
    (
        "tern_upstream_failing",
        "gauge",
        "1 when the last attempt failed (see the log).",
    ),
    (
        "tern_upstream_backlog_bytes",
        "gauge",
        "Bytes of the edge records not yet forwarded, as stored in the edge log.",
    ),
    (
        "tern_upstream_backlog_age_seconds",
        "gauge",
        "Age of the oldest edge record not yet forwarded (0 without a backlog).",
    ),
    (
        "tern_upstream_drain_seconds",
        "gauge",
        "Estimated time to forward the backlog at the rate of the last seconds (+Inf while nothing moves).",
    ),
    (
        "tern_upstream_draining",
        "gauge",
        "1 while a live-first partition drains a backlog older than live_after and copies its new records live.",
    ),
    (
        "tern_upstream_live_records_total",
        "counter",
        "Records copied to the live topic since start (live_first).",
    ),
];

impl<L: LogPort> MetricsSource for UpstreamMetrics<L> {
    fn render(&self, out: &mut String) {
        let map = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let backlogs = backlogs(&self.log, &map, tern_core::time::now_ms());
        render(out, &FAMILIES, &map, |i, key, s| {
            let backlog = backlogs.partitions.get(key).copied().unwrap_or_default();
            match i {
                0 => backlog.records as f64,
                1 => s.forwarded_records as f64,
                2 => s.forwarded_bytes as f64,
                3 => s.batches as f64,
                4 => f64::from(u8::from(s.connected)),
                5 => f64::from(u8::from(s.last_error.is_some())),
                6 => backlog.bytes as f64,
                7 => backlog.age_ms as f64 / 1000.0,
                8 => drain(&backlog),
                9 => f64::from(u8::from(s.draining)),
                _ => s.live_records as f64,
            }
        });
        render_classes(out, &map, &backlogs.classes);
    }
}

/// Backlog (records, bytes, age, time to drain; `backlogs`, in [`Class::ALL`]'s order) and bytes
/// forwarded per priority class of the `bandwidth` cap.
fn render_classes(
    out: &mut String,
    map: &BTreeMap<(String, u32), PartitionStatus>,
    backlogs: &[Backlog; 3],
) {
    let mut bytes = [0u64; 3];
    for s in map.values() {
        if let Some(i) = Class::ALL.iter().position(|c| *c == s.class) {
            bytes[i] += s.forwarded_bytes;
        }
    }
    let families: [(&str, &str, &str, [f64; 3]); 5] = [
        (
            "tern_upstream_class_records_behind",
            "gauge",
            "Durable edge records not yet forwarded, per priority class.",
            backlogs.map(|b| b.records as f64),
        ),
        (
            "tern_upstream_class_backlog_bytes",
            "gauge",
            "Bytes of the edge records not yet forwarded, per priority class.",
            backlogs.map(|b| b.bytes as f64),
        ),
        (
            "tern_upstream_class_backlog_age_seconds",
            "gauge",
            "Age of the oldest record not yet forwarded, per priority class.",
            backlogs.map(|b| b.age_ms as f64 / 1000.0),
        ),
        (
            "tern_upstream_class_drain_seconds",
            "gauge",
            "Estimated time to forward the class's backlog at its rate of the last seconds (+Inf while nothing moves).",
            backlogs.map(|b| drain(&b)),
        ),
        (
            "tern_upstream_class_forwarded_bytes_total",
            "counter",
            "Uncompressed bytes forwarded since start, per priority class.",
            bytes.map(|b| b as f64),
        ),
    ];
    for (name, kind, help, values) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (class, value) in Class::ALL.iter().zip(values) {
            let _ = writeln!(
                out,
                "{name}{{class=\"{}\"}} {}",
                class.name(),
                Sample(value)
            );
        }
    }
}

/// The time to drain as a sample: `+Inf` when nothing moves.
fn drain(backlog: &Backlog) -> f64 {
    backlog.drain_seconds().map_or(f64::INFINITY, |s| s as f64)
}

/// A sample value as Prometheus writes it.
struct Sample(f64);

impl std::fmt::Display for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            v if v == f64::INFINITY => f.write_str("+Inf"),
            v => write!(f, "{v}"),
        }
    }
}

/// Writes each of `families` (name, type, help) with one sample per partition of `map`, the
/// value of family `i` for a partition being `value(i, key, status)`.
fn render(
    out: &mut String,
    families: &[(&str, &str, &str)],
    map: &BTreeMap<(String, u32), PartitionStatus>,
    value: impl Fn(usize, &(String, u32), &PartitionStatus) -> f64,
) {
    for (i, (name, kind, help)) in families.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (key, s) in map {
            let (topic, partition) = key;
            let value = Sample(value(i, key, s));
            let _ = writeln!(
                out,
                "{name}{{topic=\"{topic}\",partition=\"{partition}\"}} {value}"
            );
        }
    }
}

/// The downstream families for the admin endpoint: per command partition, where the gateway
/// reads, how far behind the partition's end it is, and what it stored.
#[derive(Debug)]
pub struct DownstreamMetrics {
    status: StatusMap,
}

impl DownstreamMetrics {
    pub fn new(status: StatusMap) -> Self {
        Self { status }
    }
}

const DOWNSTREAM_FAMILIES: [(&str, &str, &str); 6] = [
    (
        "tern_downstream_next_offset",
        "gauge",
        "Next offset of the command partition the gateway reads (all before it are in the edge log or for other gateways).",
    ),
    (
        "tern_downstream_lag_records",
        "gauge",
        "Records of the command partition not read yet (its last stable offset at the last Fetch minus the next offset).",
    ),
    (
        "tern_downstream_commands_total",
        "counter",
        "Commands addressed to this gateway appended to the edge log since start (refused ones included).",
    ),
    (
        "tern_downstream_refused_total",
        "counter",
        "Commands refused since start (invalid, or an MQTT topic [upstream.commands] allow does not match).",
    ),
    (
        "tern_downstream_connected",
        "gauge",
        "1 while the partition's reader is connected.",
    ),
    (
        "tern_downstream_failing",
        "gauge",
        "1 when the last attempt failed (see the log).",
    ),
];

impl MetricsSource for DownstreamMetrics {
    fn render(&self, out: &mut String) {
        let map = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        render(out, &DOWNSTREAM_FAMILIES, &map, |i, _, s| {
            let value = match i {
                0 => s.next,
                1 => s.upstream_end.map_or(0, |end| end.saturating_sub(s.next)),
                2 => s.forwarded_records,
                3 => s.refused,
                4 => u64::from(s.connected),
                _ => u64::from(s.last_error.is_some()),
            };
            value as f64
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tern_log::{MemoryLog, Record};

    use super::*;

    fn record() -> Record {
        Record {
            timestamp_ms: 1,
            key: None,
            value: vec![0; 10].into(),
            headers: tern_log::Headers::new(),
        }
    }

    #[tokio::test]
    async fn each_class_shows_its_backlog_and_bytes() -> Result<(), Box<dyn std::error::Error>> {
        let log = MemoryLog::new(1);
        log.create_topic("alarms", 1)?;
        log.create_topic("telemetry", 1)?;
        log.append("alarms", 0, vec![record(); 3]).await?;
        log.append("telemetry", 0, vec![record(); 50]).await?;
        let status: StatusMap = Arc::new(Mutex::new(BTreeMap::new()));
        {
            let mut map = status.lock().map_err(|_| "poisoned")?;
            let alarms = PartitionStatus {
                next: 3,
                forwarded_bytes: 30,
                class: Class::High,
                ..PartitionStatus::default()
            };
            let telemetry = PartitionStatus {
                next: 20,
                forwarded_bytes: 200,
                class: Class::Low,
                ..PartitionStatus::default()
            };
            map.insert(("alarms".to_owned(), 0), alarms);
            map.insert(("telemetry".to_owned(), 0), telemetry);
        }
        let mut out = String::new();
        UpstreamMetrics::new(status, log).render(&mut out);
        for line in [
            "tern_upstream_class_records_behind{class=\"high\"} 0",
            "tern_upstream_class_records_behind{class=\"normal\"} 0",
            "tern_upstream_class_records_behind{class=\"low\"} 30",
            "tern_upstream_class_forwarded_bytes_total{class=\"high\"} 30",
            "tern_upstream_class_forwarded_bytes_total{class=\"low\"} 200",
            "tern_upstream_class_backlog_bytes{class=\"low\"} 300",
            "tern_upstream_class_drain_seconds{class=\"low\"} +Inf",
            "tern_upstream_class_drain_seconds{class=\"high\"} 0",
            "tern_upstream_backlog_bytes{topic=\"telemetry\",partition=\"0\"} 300",
            "tern_upstream_draining{topic=\"telemetry\",partition=\"0\"} 0",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        Ok(())
    }
}
