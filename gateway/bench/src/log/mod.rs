//! `tern-bench log`: every workload of the storage bench in one run on one file system (a
//! loop-mounted ext4 image as root, `device.rs`): the raw device's bandwidth (`raw.rs`), tern's
//! appends, reads and recovery (`append.rs`, `read.rs`, `recovery.rs`), the same appends through
//! SQLite (`sqlite.rs`), and the table of medians or one JSON object (`report.rs`,
//! `figures.rs`). This file is glue: it picks sizes, runs the workloads in order, keeps the
//! median run and turns termination signals into a clean stop.
//!
//! It must never touch a data directory it did not create, and never leave a mount, loop
//! device or file behind, also when interrupted.

mod append;
pub(crate) mod device;
mod figures;
mod held;
mod raw;
mod read;
mod recovery;
mod report;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::BenchError;
use crate::cli::BenchLogArgs;
use crate::stats::{self, Latency};

pub use recovery::writer;
pub use report::Report;

/// One append workload: `appenders` concurrent writers of `record_size`-byte values, `batch`
/// records per append call, each writer keeping up to `inflight` appends unacknowledged (as an
/// MQTT publisher does within its QoS 1 window), until `max_records` are written or
/// `max_duration` has passed.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendSpec {
    pub record_size: usize,
    pub appenders: usize,
    pub batch: usize,
    pub inflight: usize,
    pub max_records: u64,
    pub max_duration: Duration,
}

/// What one append workload measured.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendRun {
    pub records: u64,
    /// Value bytes acknowledged.
    pub payload_bytes: u64,
    pub secs: f64,
    /// Bytes the target's counter saw, from before opening to after closing.
    pub device_bytes: u64,
    pub latency: Latency,
    /// fdatasync calls, where the store tells.
    pub fdatasyncs: Option<u64>,
    /// Seconds spent inside those calls (one partition: at most one runs at a time).
    pub fdatasync_secs: Option<f64>,
    /// CPU seconds of the whole bench process during the run (appenders and log alike), where
    /// measured.
    pub cpu_secs: Option<f64>,
}

impl AppendRun {
    pub fn records_per_s(&self) -> f64 {
        stats::ratio(self.records as f64, self.secs)
    }

    pub fn mb_per_s(&self) -> f64 {
        stats::ratio(self.payload_bytes as f64, self.secs) / 1e6
    }

    pub fn write_amplification(&self) -> f64 {
        stats::ratio(self.device_bytes as f64, self.payload_bytes as f64)
    }
}

/// Sizes of one bench run.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub quick: bool,
    /// Runs of each throughput workload; the median is quoted.
    pub runs: usize,
    pub image_bytes: u64,
    pub raw_bytes: u64,
    pub raw_block: usize,
    pub appenders: usize,
    pub append_budget: Duration,
    /// Payload bytes per tern append run (records = this ÷ record size).
    pub append_bytes: u64,
    pub sqlite_budget: Duration,
    pub sqlite_max_records: u64,
    pub recovery_bytes: u64,
    pub read_samples: usize,
    /// The commit window tern's append workloads run with (the default unless overridden).
    pub flush: tern_log::FlushConfig,
}

impl Plan {
    pub fn new(quick: bool) -> Self {
        if quick {
            return Self {
                quick,
                runs: 1,
                image_bytes: 1 << 30,
                raw_bytes: 32 << 20,
                raw_block: 1 << 20,
                appenders: 64,
                append_budget: Duration::from_secs(1),
                append_bytes: 4 << 20,
                sqlite_budget: Duration::from_millis(500),
                sqlite_max_records: 5_000,
                recovery_bytes: 32 << 20,
                read_samples: 1_000,
                flush: tern_log::FlushConfig::default(),
            };
        }
        Self {
            quick,
            runs: 3,
            image_bytes: 3 << 30,
            raw_bytes: 512 << 20,
            raw_block: 1 << 20,
            appenders: 64,
            append_budget: Duration::from_secs(20),
            append_bytes: 128 << 20,
            sqlite_budget: Duration::from_secs(10),
            sqlite_max_records: 1 << 20,
            recovery_bytes: 1 << 30,
            read_samples: 10_000,
            flush: tern_log::FlushConfig::default(),
        }
    }

    /// Record sizes every append workload runs with.
    pub const RECORD_SIZES: [usize; 2] = [100, 1024];
    /// Records per append of the extra batched 1 KiB workload: enough bytes in flight for the
    /// group commit to fill a fast device's bandwidth.
    pub const BATCH: usize = 64;
    /// Appends each appender keeps in flight in the main workload: an MQTT publisher's QoS 1
    /// window (inflight messages / MQTT 5 receive maximum).
    pub const INFLIGHT: usize = 32;

    /// The main workload the targets apply to: 1 KiB records, one per append,
    /// `Plan::INFLIGHT` appends in flight per appender.
    pub fn main_spec(&self) -> AppendSpec {
        self.append_spec(1024, 1, Self::INFLIGHT)
    }

    /// tern's append workload for one record size, batch and in-flight window.
    pub fn append_spec(&self, record_size: usize, batch: usize, inflight: usize) -> AppendSpec {
        AppendSpec {
            record_size,
            appenders: self.appenders,
            batch,
            inflight,
            max_records: self.append_bytes / record_size as u64,
            max_duration: self.append_budget,
        }
    }
}

/// Every workload of `tern bench log`, in order, on one target.
pub fn run_log(args: &BenchLogArgs) -> Result<Report, BenchError> {
    catch_interrupts();
    let mut plan = Plan::new(args.quick);
    if let Some(ms) = args.commit_max_delay_ms {
        plan.flush.max_delay = tern_core::HumanDuration(Duration::from_millis(ms));
    }
    if let Some(bytes) = args.commit_max_bytes {
        plan.flush.max_bytes = tern_core::ByteSize(bytes);
    }
    if let Some(mib) = args.append_mib {
        plan.append_bytes = mib << 20;
        plan.append_budget = plan.append_budget.max(Duration::from_secs(mib / 16));
    }
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let target = device::Target::prepare(&parent, plan.image_bytes, !args.no_loop)?;
    step(&format!("target: {}", target.description()))?;
    step("raw O_DIRECT sequential write")?;
    let raw = repeat(
        "raw write",
        plan.runs,
        |_| raw::sequential_write(&target, plan.raw_bytes, plan.raw_block),
        |r| r.mb_per_s,
    )?;
    step("pipelined commits without CPU: flush.max_bytes writes, one fdatasync at a time")?;
    let chunk = usize::try_from(plan.flush.max_bytes.0).unwrap_or(1 << 20);
    let main = plan.main_spec();
    let in_flight = (main.appenders * main.inflight * main.record_size) as u64;
    let synced = repeat(
        "synced write",
        plan.runs,
        |_| raw::synced_write(&target, plan.raw_bytes, chunk, in_flight),
        |r| r.mb_per_s,
    )?;
    let mut report = Report::header(&plan, &target, raw, synced);
    let runtime = runtime()?;
    if args.main_only {
        runtime.block_on(run_main(&plan, &target, &mut report))?;
        report.finish();
        return Ok(report);
    }
    runtime.block_on(run_tern(&plan, &target, &mut report))?;
    #[cfg(feature = "sqlite")]
    {
        report.sqlite = run_sqlite(&plan, &target)?;
    }
    report.finish();
    Ok(report)
}

/// tern's appends (the 1 KiB log of the main workload is then read back), then recovery after
/// a kill. Per record size: the closed-loop row (one append in flight per appender), then the
/// main workload (`Plan::INFLIGHT` in flight per appender).
async fn run_tern(
    plan: &Plan,
    target: &device::Target,
    report: &mut Report,
) -> Result<(), BenchError> {
    let dir = target.dir().join("log");
    for record_size in Plan::RECORD_SIZES {
        for inflight in [1, Plan::INFLIGHT] {
            let spec = plan.append_spec(record_size, 1, inflight);
            append_row(plan, target, &dir, &spec, report).await?;
        }
    }
    step("tern log reads (sequential cold, random warm)")?;
    report.read = Some(read::reads(target, &dir, plan.read_samples).await?);
    remove(&dir)?;
    let batched = plan.append_spec(1024, Plan::BATCH, 1);
    append_row(plan, target, &dir, &batched, report).await?;
    remove(&dir)?;
    step(&format!(
        "tern log recovery after SIGKILL, {} MiB log",
        plan.recovery_bytes >> 20
    ))?;
    report.recovery = Some(recovery::recovery(target, &dir, plan.recovery_bytes).await?);
    remove(&dir)?;
    step("disk held per idle partition")?;
    report.held = Some(held::held(&dir).await?);
    remove(&dir)
}

/// The main 1 KiB workload alone (`--main-only`).
async fn run_main(
    plan: &Plan,
    target: &device::Target,
    report: &mut Report,
) -> Result<(), BenchError> {
    let dir = target.dir().join("log");
    append_row(plan, target, &dir, &plan.main_spec(), report).await?;
    remove(&dir)
}

/// One row of the append table: `spec`'s median run, announced as a step.
async fn append_row(
    plan: &Plan,
    target: &device::Target,
    dir: &std::path::Path,
    spec: &AppendSpec,
    report: &mut Report,
) -> Result<(), BenchError> {
    if spec.batch > 1 {
        step(&format!(
            "tern log append {} B, {} appenders × {} records per append",
            spec.record_size, spec.appenders, spec.batch
        ))?;
    } else {
        step(&format!(
            "tern log append {} B, {} appenders × {} in flight",
            spec.record_size, spec.appenders, spec.inflight
        ))?;
    }
    let run = append_median(plan, target, dir, spec).await?;
    report
        .append
        .push(figures::AppendFigures::new(spec, &run, report.raw.mb_per_s));
    Ok(())
}

/// Runs the append workload `plan.runs` times and keeps the median run by records/s.
async fn append_median(
    plan: &Plan,
    target: &device::Target,
    dir: &std::path::Path,
    spec: &AppendSpec,
) -> Result<AppendRun, BenchError> {
    let mut runs = Vec::new();
    for run in 0..plan.runs.max(1) {
        if run > 0 {
            step(&format!("run {}", run + 1))?;
        }
        runs.push(append::append(target, dir, spec, &plan.flush).await?);
    }
    stats::median_run(runs, AppendRun::records_per_s)
        .ok_or(BenchError::NoRun { workload: "append" })
}

fn remove(dir: &std::path::Path) -> Result<(), BenchError> {
    std::fs::remove_dir_all(dir).map_err(|source| BenchError::file("remove", dir, source))
}

/// The bench's async runtime: as many workers as `tern serve` would use.
fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    crate::runtime(Some(
        std::thread::available_parallelism().map_or(2, |n| n.get().min(4)),
    ))
}

#[cfg(feature = "sqlite")]
fn run_sqlite(
    plan: &Plan,
    target: &device::Target,
) -> Result<Vec<figures::SqliteFigures>, BenchError> {
    let mut figures = Vec::new();
    for sync in [sqlite::Synchronous::Normal, sqlite::Synchronous::Full] {
        for record_size in Plan::RECORD_SIZES {
            step(&format!("sqlite {sync:?} {record_size} B"))?;
            let spec = AppendSpec {
                record_size,
                appenders: plan.appenders,
                batch: 1,
                inflight: 1,
                max_records: plan.sqlite_max_records,
                max_duration: plan.sqlite_budget,
            };
            let dir = target.dir().join("sqlite");
            let run = repeat(
                "sqlite append",
                plan.runs,
                |_| sqlite::append(target, &dir, sync, &spec),
                AppendRun::records_per_s,
            )?;
            figures.push(figures::SqliteFigures::new(sync, record_size, &run));
        }
    }
    Ok(figures)
}

/// Runs `run` `runs` times and keeps the run with the median `key`; `workload` names it in
/// the error when no run completed.
fn repeat<T>(
    workload: &'static str,
    runs: usize,
    mut run: impl FnMut(usize) -> Result<T, BenchError>,
    key: impl Fn(&T) -> f64,
) -> Result<T, BenchError> {
    let results = (0..runs.max(1))
        .map(&mut run)
        .collect::<Result<Vec<_>, _>>()?;
    stats::median_run(results, key).ok_or(BenchError::NoRun { workload })
}

/// Set by SIGINT/SIGTERM/SIGHUP while `bench log` runs.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns the termination signals into a flag checked between workloads, so an interrupted bench
/// still unmounts and detaches its loop device (each workload is bounded to seconds).
fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe; exec'd
        // children get the default handlers back.
        unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Whether a termination signal arrived: long loops stop early when it did.
fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Starts the next step: a progress line on stderr (stdout stays the table or the JSON alone),
/// or `Interrupted` if a termination signal arrived.
fn step(what: &str) -> Result<(), BenchError> {
    if interrupted() {
        eprintln!("tern bench: interrupted, cleaning up");
        return Err(BenchError::Interrupted);
    }
    eprintln!("tern bench: {what}");
    Ok(())
}
