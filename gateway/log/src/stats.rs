//! Counters of the log's own I/O (fdatasyncs and their latency, bytes written, commits,
//! records, damaged batches skipped, segments rolled, deleted and recycled), a [`LogStats`]
//! snapshot of them for benchmarks and tools, and the `/metrics` rendering.
//!
//! Counting only: nothing here decides anything.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tern_core::metrics::{MetricsSource, write_single};

/// Live counters, shared by every partition of one log.
#[derive(Debug, Default)]
pub struct Counters {
    fsyncs: AtomicU64,
    fsync_nanos: AtomicU64,
    bytes_written: AtomicU64,
    commits: AtomicU64,
    records: AtomicU64,
    corrupt_batches: AtomicU64,
    segments_rolled: AtomicU64,
    segments_deleted: AtomicU64,
    segments_recycled: AtomicU64,
    age_checks: AtomicU64,
}

/// A snapshot of the log's counters since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// fdatasync/fsync calls on files and directories.
    pub fsyncs: u64,
    /// Total time spent in those calls.
    pub fsync_time: Duration,
    /// Bytes handed to write calls (batches, indexes, metadata, cursors).
    pub bytes_written: u64,
    /// Group commits (one write + one fdatasync each under `sync`).
    pub commits: u64,
    /// Records appended.
    pub records: u64,
    /// Damaged batches found and skipped while reading.
    pub corrupt_batches: u64,
    pub segments_rolled: u64,
    pub segments_deleted: u64,
    /// Deleted segment files kept and reused for new segments.
    pub segments_recycled: u64,
    /// Age-retention checks of a partition.
    pub age_checks: u64,
    /// Bytes of sealed files mapped now, for reads (a gauge, within `max_mapped_bytes`).
    pub mapped_bytes: u64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// Runs a sync call, counting it and its latency.
    pub fn timed_sync<T>(&self, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        add(&self.fsyncs, 1);
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        add(&self.fsync_nanos, nanos);
        out
    }
    pub fn wrote(&self, bytes: usize) {
        add(&self.bytes_written, bytes as u64);
    }
    pub fn committed(&self, records: u64) {
        add(&self.commits, 1);
        add(&self.records, records);
    }
    pub fn corrupt_batch(&self) {
        add(&self.corrupt_batches, 1);
    }
    pub fn rolled(&self) {
        add(&self.segments_rolled, 1);
    }
    pub fn age_checked(&self) {
        add(&self.age_checks, 1);
    }
    pub fn deleted(&self, recycled: bool) {
        add(&self.segments_deleted, 1);
        if recycled {
            add(&self.segments_recycled, 1);
        }
    }

    pub fn snapshot(&self) -> LogStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LogStats {
            fsyncs: get(&self.fsyncs),
            fsync_time: Duration::from_nanos(get(&self.fsync_nanos)),
            bytes_written: get(&self.bytes_written),
            commits: get(&self.commits),
            records: get(&self.records),
            corrupt_batches: get(&self.corrupt_batches),
            segments_rolled: get(&self.segments_rolled),
            segments_deleted: get(&self.segments_deleted),
            segments_recycled: get(&self.segments_recycled),
            age_checks: get(&self.age_checks),
            mapped_bytes: 0,
        }
    }
}

/// Size and offsets of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStats {
    pub topic: String,
    pub partition: u32,
    pub start_offset: u64,
    pub end_offset: u64,
    pub bytes: u64,
    pub segments: usize,
}

/// A per-partition gauge: name, help, value.
type Family = (&'static str, &'static str, fn(&PartitionStats) -> u64);

/// The log's `/metrics` families.
#[derive(Debug, Clone)]
pub struct LogMetrics(pub super::Log);

impl MetricsSource for LogMetrics {
    fn render(&self, out: &mut String) {
        let s = self.0.stats();
        let clock = self.0.clock_status();
        let counters: [(&str, &str, u64); 9] = [
            (
                "tern_clock_steps_total",
                "Wall-clock steps seen (larger than a minute, or back between two runs).",
                clock.steps,
            ),
            (
                "tern_log_age_checks_total",
                "Age-retention checks of a partition.",
                s.age_checks,
            ),
            (
                "tern_log_fsyncs_total",
                "fdatasync/fsync calls of the log.",
                s.fsyncs,
            ),
            (
                "tern_log_bytes_written_total",
                "Bytes the log handed to write calls.",
                s.bytes_written,
            ),
            ("tern_log_commits_total", "Group commits.", s.commits),
            ("tern_log_records_total", "Records appended.", s.records),
            (
                "tern_log_corrupt_batches_total",
                "Damaged batches skipped while reading.",
                s.corrupt_batches,
            ),
            (
                "tern_log_segments_rolled_total",
                "Segments sealed.",
                s.segments_rolled,
            ),
            (
                "tern_log_segments_deleted_total",
                "Segments deleted by retention.",
                s.segments_deleted,
            ),
        ];
        for (name, help, value) in counters {
            write_single(out, name, "counter", help, value);
        }
        write_single(
            out,
            "tern_clock_unsynchronised",
            "gauge",
            "1 while the wall clock reads earlier than this build (not synchronised yet).",
            u8::from(clock.unsynchronised),
        );
        write_single(
            out,
            "tern_log_fsync_seconds_total",
            "counter",
            "Time spent in fdatasync/fsync calls of the log.",
            format_args!("{:.6}", s.fsync_time.as_secs_f64()),
        );
        write_single(
            out,
            "tern_log_mapped_bytes",
            "gauge",
            "Bytes of sealed segment and index files memory-mapped for reads (at most log.max_mapped_bytes).",
            s.mapped_bytes,
        );
        let wear = self.0.wear_status();
        let gauges = [
            (
                "tern_log_commit_window_seconds",
                "Commit window a trickle of appends gets now (the wear budget's choice).",
                wear.window.as_secs_f64(),
            ),
            (
                "tern_log_wear_budget_bytes_per_second",
                "Device bytes a second [log.flush.wear] allows (card size x cycles / lifetime); 0 when off.",
                wear.budget_bytes_per_sec,
            ),
            (
                "tern_log_arrival_bytes_per_second",
                "Bytes a second appended to the log (moving average).",
                wear.arrival_bytes_per_sec,
            ),
            (
                "tern_log_projected_device_bytes_per_second",
                "Device bytes a second the log's commits are projected to cost at this window.",
                wear.projected_bytes_per_sec,
            ),
            (
                "tern_log_closed_loop_credit_bytes",
                "Device bytes closed-loop producers may still spend on unwindowed commits.",
                wear.credit_bytes,
            ),
        ];
        for (name, help, value) in gauges {
            write_single(out, name, "gauge", help, format_args!("{value:.3}"));
        }
        write_single(
            out,
            "tern_log_closed_loop_commits_total",
            "counter",
            "Commits that got no window because their producer waited for each answer.",
            wear.closed_loop_commits,
        );
        let parts = self.0.partition_stats();
        let families: [Family; 3] = [
            (
                "tern_log_end_offset",
                "Next offset to be written (durable end).",
                |p| p.end_offset,
            ),
            (
                "tern_log_start_offset",
                "Oldest offset still stored.",
                |p| p.start_offset,
            ),
            (
                "tern_log_partition_bytes",
                "Bytes of the partition's segment files.",
                |p| p.bytes,
            ),
        ];
        for (name, help, get) in families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for p in &parts {
                let _ = writeln!(
                    out,
                    "{name}{{topic=\"{}\",partition=\"{}\"}} {}",
                    p.topic,
                    p.partition,
                    get(p)
                );
            }
        }
    }
}
