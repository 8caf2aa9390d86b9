//! Per-partition forwarding metrics on `/metrics`: records behind, forwarded totals, connected,
//! and whether the last attempt failed, and the backlog and bytes of each priority class; and the downstream's per command partition (next offset,
//! lag, commands stored and refused). Reads the shared status and the edge log's offsets; never
//! changes either.

use std::collections::BTreeMap;
use std::fmt::Write;

use tern_core::metrics::MetricsSource;
use tern_log::LogPort;

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

const FAMILIES: [(&str, &str, &str); 6] = [
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
];

impl<L: LogPort> MetricsSource for UpstreamMetrics<L> {
    fn render(&self, out: &mut String) {
        let map = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        render(out, &FAMILIES, &map, |i, (topic, partition), s| match i {
            0 => self
                .log
                .offsets(topic, *partition)
                .map_or(0, |(_, end)| end.saturating_sub(s.next)),
            1 => s.forwarded_records,
            2 => s.forwarded_bytes,
            3 => s.batches,
            4 => u64::from(s.connected),
            _ => u64::from(s.last_error.is_some()),
        });
        self.render_classes(out, &map);
    }
}

impl<L: LogPort> UpstreamMetrics<L> {
    /// Records behind and bytes forwarded per priority class of the `bandwidth` cap.
    fn render_classes(&self, out: &mut String, map: &BTreeMap<(String, u32), PartitionStatus>) {
        let mut behind = [0u64; 3];
        let mut bytes = [0u64; 3];
        for ((topic, partition), s) in map {
            let Some(i) = Class::ALL.iter().position(|c| *c == s.class) else {
                continue;
            };
            let end = self
                .log
                .offsets(topic, *partition)
                .map_or(0, |(_, end)| end);
            behind[i] += end.saturating_sub(s.next);
            bytes[i] += s.forwarded_bytes;
        }
        for (name, kind, help, values) in [
            (
                "tern_upstream_class_records_behind",
                "gauge",
                "Durable edge records not yet forwarded, per priority class.",
                behind,
            ),
            (
                "tern_upstream_class_forwarded_bytes_total",
                "counter",
                "Uncompressed bytes forwarded since start, per priority class.",
                bytes,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (class, value) in Class::ALL.iter().zip(values) {
                let _ = writeln!(out, "{name}{{class=\"{}\"}} {value}", class.name());
            }
        }
    }
}

/// Writes each of `families` (name, type, help) with one sample per partition of `map`, the
/// value of family `i` for a partition being `value(i, key, status)`.
fn render(
    out: &mut String,
    families: &[(&str, &str, &str)],
    map: &BTreeMap<(String, u32), PartitionStatus>,
    value: impl Fn(usize, &(String, u32), &PartitionStatus) -> u64,
) {
    for (i, (name, kind, help)) in families.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (key, s) in map {
            let (topic, partition) = key;
            let value = value(i, key, s);
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
        render(out, &DOWNSTREAM_FAMILIES, &map, |i, _, s| match i {
            0 => s.next,
            1 => s.upstream_end.map_or(0, |end| end.saturating_sub(s.next)),
            2 => s.forwarded_records,
            3 => s.refused,
            4 => u64::from(s.connected),
            _ => u64::from(s.last_error.is_some()),
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
            value: vec![0; 10],
            headers: Vec::new(),
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
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        Ok(())
    }
}
