//! Per-partition forwarding metrics on `/metrics`: records behind, forwarded totals, connected,
//! and whether the last attempt failed. Reads the shared status and the edge log's offsets; never
//! changes either.

use std::fmt::Write;

use tern_core::metrics::MetricsSource;
use tern_log::LogPort;

use crate::driver::StatusMap;

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
        for (i, (name, kind, help)) in FAMILIES.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for ((topic, partition), s) in &map {
                let value = match i {
                    0 => self
                        .log
                        .offsets(topic, *partition)
                        .map_or(0, |(_, end)| end.saturating_sub(s.next)),
                    1 => s.forwarded_records,
                    2 => s.forwarded_bytes,
                    3 => s.batches,
                    4 => u64::from(s.connected),
                    _ => u64::from(s.last_error.is_some()),
                };
                let _ = writeln!(
                    out,
                    "{name}{{topic=\"{topic}\",partition=\"{partition}\"}} {value}"
                );
            }
        }
    }
}
