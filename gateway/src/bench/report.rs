//! The figures of one `tern bench log` run and their two renderings: a readable table of
//! medians and one JSON object.
//!
//! It only formats numbers the workloads measured; it never measures anything itself.

use std::fmt::Write;

use serde::Serialize;

use super::device::{Counter, Target};
use super::raw::RawRun;
use super::{AppendRun, BenchError, Plan};

/// Everything `tern bench log` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub quick: bool,
    /// Runs of each throughput workload (the median run is quoted).
    pub runs: usize,
    pub target: String,
    /// `device` (loop device sectors) or `process` (this process's write_bytes).
    pub counter: &'static str,
    pub counter_note: String,
    pub raw: RawRun,
    pub sqlite: Vec<SqliteFigures>,
}

impl Report {
    pub fn header(plan: &Plan, target: &Target, raw: RawRun) -> Self {
        let (counter, counter_note) = match (target.counter(), target.fallback_reason()) {
            (Counter::Device { name }, _) => (
                "device",
                format!(
                    "sectors written to /dev/{name} × 512: file-system journal and metadata count"
                ),
            ),
            (Counter::Process, reason) => (
                "process",
                format!(
                    "this process's write_bytes (/proc/self/io), no file-system overhead counted ({})",
                    reason.unwrap_or("no loop device")
                ),
            ),
        };
        Self {
            quick: plan.quick,
            runs: plan.runs,
            target: target.description().to_owned(),
            counter,
            counter_note,
            raw,
            sqlite: Vec::new(),
        }
    }

    pub fn to_json(&self) -> Result<String, BenchError> {
        serde_json::to_string_pretty(self).map_err(|err| BenchError::Setup {
            message: format!("cannot render JSON: {err}"),
        })
    }

    /// The readable rendering.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        self.write_header(&mut out);
        self.write_sqlite(&mut out);
        out
    }

    fn write_header(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "tern bench log{}",
            if self.quick {
                " --quick (smaller sizes, 1 run)"
            } else {
                ""
            }
        );
        let _ = writeln!(out, "target:  {}", self.target);
        let _ = writeln!(out, "counter: {}", self.counter_note);
        let _ = writeln!(
            out,
            "runs:    {} per throughput workload, median quoted",
            self.runs
        );
        let _ = writeln!(out);
        let raw = &self.raw;
        let _ = writeln!(
            out,
            "raw sequential write ({}, {} MiB, 1 MiB blocks, fdatasync at end): {:.1} MB/s",
            if raw.direct_io {
                "O_DIRECT"
            } else {
                "buffered: O_DIRECT refused"
            },
            raw.bytes >> 20,
            raw.mb_per_s
        );
    }

    fn write_sqlite(&self, out: &mut String) {
        if self.sqlite.is_empty() {
            return;
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "SQLite WAL, one transaction per record, 64 threads on one connection:"
        );
        let _ = writeln!(
            out,
            "  {:<8} {:>6} {:>12} {:>9} {:>7} {:>10} {:>10}",
            "sync", "record", "records/s", "MB/s", "WA", "p50 µs", "p99 µs"
        );
        for f in &self.sqlite {
            let _ = writeln!(
                out,
                "  {:<8} {:>5}B {:>12.0} {:>9.2} {:>7.2} {:>10.0} {:>10.0}",
                f.synchronous,
                f.record_size,
                f.records_per_s,
                f.mb_per_s,
                f.write_amplification,
                f.latency_p50_us,
                f.latency_p99_us
            );
        }
    }
}

/// The SQLite comparison for one `synchronous` setting and record size.
#[derive(Debug, Clone, Serialize)]
pub struct SqliteFigures {
    pub synchronous: &'static str,
    pub record_size: usize,
    pub records: u64,
    pub records_per_s: f64,
    pub mb_per_s: f64,
    pub write_amplification: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
}

impl SqliteFigures {
    #[cfg(feature = "bench-sqlite")]
    pub fn new(sync: super::sqlite::Synchronous, record_size: usize, run: &AppendRun) -> Self {
        Self {
            synchronous: match sync {
                super::sqlite::Synchronous::Normal => "NORMAL",
                super::sqlite::Synchronous::Full => "FULL",
            },
            record_size,
            records: run.records,
            records_per_s: run.records_per_s(),
            mb_per_s: run.mb_per_s(),
            write_amplification: run.write_amplification(),
            latency_p50_us: run.latency.p50_us,
            latency_p99_us: run.latency.p99_us,
        }
    }
}
