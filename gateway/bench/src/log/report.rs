//! The report of one `tern bench log` run: every figure, serialized as one JSON object, and the
//! readable table of medians with each target and whether it is met. The per-workload rows
//! and the flash projection are in `figures.rs`.
//!
//! It only formats numbers the workloads measured; it never measures anything itself.

use std::fmt::Write;

use serde::Serialize;

use super::Plan;
use super::device::{Counter, Target};
use super::figures::{AppendFigures, FlashFigures, SqliteFigures};
use super::held::HeldFigures;
use super::raw::{RawRun, SyncedRun};
use super::read::ReadFigures;
use super::recovery::RecoveryFigures;
use crate::stats::ratio;

use super::figures::{CARD_BYTES, LIFETIME_FORMULA, PE_CYCLES};

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
    pub appenders: usize,
    /// The log's default group-commit window (`flush.max_delay`) and early-commit size
    /// (`flush.max_bytes`) the append workloads ran with, and the idle-device close
    /// (`flush.min_delay`, `flush.min_bytes`).
    pub commit_window_ms: f64,
    pub commit_max_bytes: u64,
    pub commit_min_delay_ms: f64,
    pub commit_min_bytes: u64,
    /// Whether that window is the configuration's default (no `--commit-max-*` flag).
    pub commit_window_is_default: bool,
    pub raw: RawRun,
    /// The device under one partition's pipelined group commit with no CPU cost:
    /// `flush.max_bytes` commits, one fdatasync at a time, the main workload's bytes in flight.
    pub synced: SyncedRun,
    /// tern's append workloads, 100 B then 1 KiB.
    pub append: Vec<AppendFigures>,
    pub read: Option<ReadFigures>,
    pub recovery: Option<RecoveryFigures>,
    /// Disk held per idle partition and per partition after one record.
    pub held: Option<HeldFigures>,
    pub sqlite: Vec<SqliteFigures>,
    pub flash: Option<FlashFigures>,
}

impl Report {
    pub fn header(plan: &Plan, target: &Target, raw: RawRun, synced: SyncedRun) -> Self {
        let flush = &plan.flush;
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
            appenders: plan.appenders,
            commit_window_ms: flush.max_delay.0.as_secs_f64() * 1e3,
            commit_max_bytes: flush.max_bytes.0,
            commit_min_delay_ms: flush.min_delay.0.as_secs_f64() * 1e3,
            commit_min_bytes: flush.min_bytes.0,
            commit_window_is_default: *flush == tern_log::FlushConfig::default(),
            raw,
            synced,
            append: Vec::new(),
            read: None,
            recovery: None,
            held: None,
            sqlite: Vec::new(),
            flash: None,
        }
    }

    /// Derives the cross-workload figures: SQLite's ratios to tern and the flash projection.
    pub fn finish(&mut self) {
        for figures in &mut self.sqlite {
            if let Some(tern) = self
                .append
                .iter()
                .find(|a| a.record_size == figures.record_size && a.is_closed_loop())
            {
                figures.throughput_ratio_to_tern = ratio(figures.records_per_s, tern.records_per_s);
                figures.write_amplification_ratio_to_tern =
                    ratio(figures.write_amplification, tern.write_amplification);
            }
        }
        self.flash = FlashFigures::project(&self.append);
    }

    /// The readable rendering.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        self.write_header(&mut out);
        self.write_append(&mut out);
        self.write_read(&mut out);
        self.write_sqlite(&mut out);
        self.write_flash(&mut out);
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
        let synced = &self.synced;
        let _ = writeln!(
            out,
            "pipelined commits without CPU ({} KiB writes into a preallocated file, one fdatasync \
             at a time covering all written, at most {} KiB ahead of durable as the main \
             workload): {:.1} MB/s ({:.1}% of raw), fdatasync mean {:.0} µs of {:.0} KB",
            synced.chunk >> 10,
            synced.in_flight >> 10,
            synced.mb_per_s,
            ratio(synced.mb_per_s, raw.mb_per_s) * 100.0,
            synced.fdatasync_mean_us,
            synced.bytes_per_fdatasync / 1e3
        );
    }

    fn write_append(&self, out: &mut String) {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "tern log append, durability sync, {} concurrent appenders, {} commit window \
             (device idle: {} ms or {} KiB; at most {} ms or {} KiB):",
            self.appenders,
            if self.commit_window_is_default {
                "default"
            } else {
                "NON-DEFAULT (--commit-max-*)"
            },
            self.commit_min_delay_ms,
            self.commit_min_bytes >> 10,
            self.commit_window_ms,
            self.commit_max_bytes >> 10
        );
        let _ = writeln!(
            out,
            "  {:>6} {:>5} {:>6} {:>10} {:>8} {:>7} {:>10} {:>12} {:>8} {:>6} {:>6} {:>7} {:>8} {:>8} {:>6}",
            "record",
            "batch",
            "flight",
            "records/s",
            "MB/s",
            "vs raw",
            "fsyncs/s",
            "bytes/fsync",
            "fsync µs",
            "busy",
            "cores",
            "CPU µs",
            "p50 µs",
            "p99 µs",
            "WA"
        );
        for a in &self.append {
            let _ = writeln!(
                out,
                "  {:>5}B {:>5} {:>6} {:>10.0} {:>8.2} {:>6.1}% {:>10.0} {:>12.0} {:>8.0} {:>5.0}% {:>6.2} {:>7.2} {:>8.0} {:>8.0} {:>6.3}",
                a.record_size,
                a.batch,
                a.inflight,
                a.records_per_s,
                a.mb_per_s,
                a.ratio_to_raw * 100.0,
                a.fdatasyncs_per_s,
                a.payload_bytes_per_fsync,
                a.fdatasync_mean_us,
                a.fdatasync_busy * 100.0,
                a.cpu_cores,
                a.cpu_us_per_record,
                a.latency_p50_us,
                a.latency_p99_us,
                a.write_amplification
            );
        }
        for a in self.append.iter().filter(|a| a.is_main()) {
            let (wa_target, raw_target) = if a.record_size >= 1024 {
                (1.2, Some(0.8))
            } else {
                (1.5, None)
            };
            let _ = write!(
                out,
                "  targets {} B: WA ≤ {wa_target} {}",
                a.record_size,
                verdict(a.write_amplification <= wa_target)
            );
            if let Some(raw_target) = raw_target {
                let _ = write!(
                    out,
                    ", ≥ {:.0}% of raw {}",
                    raw_target * 100.0,
                    verdict(a.ratio_to_raw >= raw_target)
                );
                let _ = write!(
                    out,
                    "\n  where the {} B bound lies: {:.0}% of the pipelined commits without CPU \
                     ({:.1} MB/s); an fdatasync ran {:.0}% of the time (mean {:.0} µs); \
                     the process kept {:.2} cores busy, {:.2} µs of CPU a record",
                    a.record_size,
                    ratio(a.mb_per_s, self.synced.mb_per_s) * 100.0,
                    self.synced.mb_per_s,
                    a.fdatasync_busy * 100.0,
                    a.fdatasync_mean_us,
                    a.cpu_cores,
                    a.cpu_us_per_record
                );
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(
            out,
            "  (batch = records per append call; flight = appends each appender keeps \
             unacknowledged. The targets apply to the main workload, batch 1 × {} in flight: one \
             record per append as MQTT delivers them, within a QoS 1 window; flight 1 is the \
             closed loop, each appender waiting for every ack; fsync µs = mean fdatasync time, \
             busy = share of the run an fdatasync was running, cores and CPU µs = the bench \
             process's CPU, appenders and log together)",
            Plan::INFLIGHT
        );
    }

    fn write_read(&self, out: &mut String) {
        let _ = writeln!(out);
        if let Some(r) = &self.read {
            let _ = writeln!(
                out,
                "read ({} records of 1 KiB): random by offset p50 {:.1} µs, p99 {:.1} µs (warm, target p99 ≤ 100 µs {}); \
                 sequential {:.1} MB/s, {:.0} records/s (cold cache)",
                r.records,
                r.random_p50_us,
                r.random_p99_us,
                verdict(r.random_p99_us <= 100.0),
                r.sequential_mb_per_s,
                r.sequential_records_per_s
            );
        }
        if let Some(h) = &self.held {
            let _ = writeln!(
                out,
                "disk held per partition (segment_bytes {} MiB, {} partitions): idle {:.1} KiB, after one record {:.1} KiB",
                h.segment_bytes >> 20,
                h.partitions,
                h.idle_bytes as f64 / 1024.0,
                h.one_record_bytes as f64 / 1024.0
            );
        }
        if let Some(r) = &self.recovery {
            let _ = writeln!(
                out,
                "recovery after SIGKILL of a writer with {} MiB acknowledged ({} MiB of files{}): Log::open {:.1} ms (target ≤ 1 s {}), {} records recovered, {} acknowledged records lost",
                r.log_payload_bytes >> 20,
                r.log_file_bytes >> 20,
                if self.quick {
                    ", --quick: not 1 GiB"
                } else {
                    ""
                },
                r.open_ms,
                verdict(r.open_ms <= 1000.0),
                r.records_recovered,
                r.acknowledged_records_lost
            );
            let _ = writeln!(
                out,
                "peak RSS of the writer process (64 appenders × {} records of 1 KiB): {:.1} MiB (target ≤ 16 MiB {})",
                r.writer_batch_records,
                r.writer_peak_rss_bytes as f64 / f64::from(1u32 << 20),
                verdict(r.writer_peak_rss_bytes <= 16 << 20)
            );
        }
    }

    fn write_flash(&self, out: &mut String) {
        let Some(f) = &self.flash else { return };
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "flash lifetime of a {:.0} GB card rated for {:.0} P/E cycles ({LIFETIME_FORMULA}):",
            CARD_BYTES / 1e9,
            PE_CYCLES
        );
        let _ = writeln!(
            out,
            "  at the measured 1 KiB rate: {:.1} GB/day to the device → {:.2} years",
            f.measured_device_bytes_per_day / 1e9,
            f.measured_years
        );
        let _ = writeln!(
            out,
            "  at a steady 1,000 records/s of 100 B (WA {:.3}): {:.2} GB/day → {:.1} years",
            f.steady_write_amplification,
            f.steady_device_bytes_per_day / 1e9,
            f.steady_years
        );
    }

    fn write_sqlite(&self, out: &mut String) {
        if self.sqlite.is_empty() {
            return;
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "SQLite WAL, one transaction per record, {} threads on one connection (ratios: SQLite ÷ tern closed loop, 1 in flight, same record size):",
            self.appenders
        );
        let _ = writeln!(
            out,
            "  {:<8} {:>6} {:>10} {:>8} {:>8} {:>10} {:>10} {:>10} {:>8}",
            "sync", "record", "records/s", "MB/s", "WA", "p50 µs", "p99 µs", "rate÷tern", "WA÷tern"
        );
        for f in &self.sqlite {
            let _ = writeln!(
                out,
                "  {:<8} {:>5}B {:>10.0} {:>8.2} {:>8.2} {:>10.0} {:>10.0} {:>10.3} {:>8.2}",
                f.synchronous,
                f.record_size,
                f.records_per_s,
                f.mb_per_s,
                f.write_amplification,
                f.latency_p50_us,
                f.latency_p99_us,
                f.throughput_ratio_to_tern,
                f.write_amplification_ratio_to_tern
            );
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_table())
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}
