//! `tern-bench stress` (hidden): appends from several tasks forever (or up to a count) and prints
//! one line per acknowledged append, flushed at once, so a test can kill the process at any
//! moment and then check that every printed record is in the log.
//!
//! Test equipment for the crash tests; never part of normal operation.

use std::io::Write;
use std::path::Path;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::BenchError;
use crate::stats::percentile;
use tern_core::{ByteSize, HumanDuration};
use tern_log::datadir::DataDirLock;
use tern_log::{Log, LogConfig, Record};

/// Settings of a stress run.
#[derive(Debug, Clone)]
pub struct StressOptions {
    pub data_dir: std::path::PathBuf,
    pub tasks: u32,
    /// Appends per task; 0 = until killed.
    pub appends: u64,
    pub segment_bytes: u64,
    /// Group-commit window (`flush.max_delay`).
    pub max_delay: Duration,
    /// `flush.min_delay` (`None`: the default, capped at `max_delay`).
    pub min_delay: Option<Duration>,
    /// `flush.min_bytes` (`None`: the default).
    pub min_bytes: Option<u64>,
    /// Open-loop mode when > 0: this many one-record appends per second for `seconds`, then
    /// one JSON summary line instead of ack lines (the commit-window experiment).
    pub rate: u64,
    pub seconds: u64,
    pub record_bytes: usize,
    /// Partition size limit (`retention.bytes`; 0 = none).
    pub retention_bytes: u64,
}

/// Runs [`stress`] on a two-worker runtime, as the crash tests start it.
pub fn run(options: &StressOptions) -> Result<(), BenchError> {
    let runtime = crate::runtime(Some(2))?;
    let data_dir = options.data_dir.clone();
    runtime.block_on(stress(&data_dir, options.clone()))
}

/// Value of record `i` of append `seq` by `task` in process `pid`: unique across runs.
pub fn stress_value(pid: u32, task: u32, seq: u64, i: u64) -> String {
    format!("pid{pid}-task{task}-seq{seq}-rec{i}")
}

/// Runs the stress writer on `data_dir/log`, topic `stress`, partition 0.
pub async fn stress(data_dir: &Path, options: StressOptions) -> Result<(), BenchError> {
    let lock = DataDirLock::acquire(data_dir).map_err(|source| BenchError::DataDir { source })?;
    let mut config = LogConfig {
        segment_bytes: ByteSize(options.segment_bytes),
        ..LogConfig::default()
    };
    config.flush.max_delay = HumanDuration(options.max_delay);
    let min_delay = options.min_delay.unwrap_or(config.flush.min_delay.0);
    let min_delay = min_delay.min(options.max_delay);
    config.flush.min_delay = HumanDuration(min_delay);
    let min_bytes = options.min_bytes.unwrap_or(config.flush.min_bytes.0);
    config.flush.min_bytes = ByteSize(min_bytes);
    let options = StressOptions {
        min_delay: Some(min_delay),
        min_bytes: Some(min_bytes),
        ..options
    };
    config.retention.bytes = ByteSize(options.retention_bytes);
    config.retention.on_full = tern_log::OnFull::DropOldest;
    let log = Log::open(&data_dir.join("log"), &config)
        .await
        .map_err(|source| BenchError::log("open", source))?;
    log.ensure_topic("stress")
        .map_err(|source| BenchError::log("ensure_topic", source))?;
    if options.rate > 0 {
        let summary = open_loop(&log, &options).await?;
        println!("{summary}");
        return close(&log).await;
    }
    let pid = std::process::id();
    let tasks: Vec<_> = (0..options.tasks)
        .map(|task| tokio::spawn(run_task(log.clone(), pid, task, options.appends)))
        .collect();
    for task in tasks {
        task.await
            .map_err(|err| BenchError::task("a stress task", err))??;
    }
    close(&log).await?;
    drop(lock);
    Ok(())
}

async fn close(log: &Log) -> Result<(), BenchError> {
    log.close()
        .await
        .map_err(|source| BenchError::log("close", source))
}

async fn run_task(log: Log, pid: u32, task: u32, appends: u64) -> Result<(), BenchError> {
    let mut seq = 0u64;
    while appends == 0 || seq < appends {
        let count = 1 + (seq + u64::from(task)) % 3;
        let records: Vec<Record> = (0..count)
            .map(|i| Record {
                timestamp_ms: i64::try_from(seq).unwrap_or(0),
                key: Some(format!("task{task}").into_bytes().into()),
                value: stress_value(pid, task, seq, i).into_bytes().into(),
                headers: tern_log::Headers::from(vec![(
                    "seq".into(),
                    seq.to_le_bytes().to_vec().into(),
                )]),
            })
            .collect();
        let offset = log
            .append("stress", 0, records)
            .await
            .map_err(|source| BenchError::log("append", source))?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ack {offset} {count} {pid} {task} {seq}")
            .and_then(|()| out.flush())
            .map_err(|source| BenchError::Io {
                what: "printing an ack",
                source,
            })?;
        seq += 1;
    }
    Ok(())
}

/// Appends one record every 1/rate s without waiting for acks; summarizes commits and latency.
async fn open_loop(log: &Log, options: &StressOptions) -> Result<serde_json::Value, BenchError> {
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let before = log.stats();
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / options.rate as f64);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = options.rate * options.seconds;
    let mut pending = Vec::new();
    for seq in 0..total {
        ticker.tick().await;
        let (log, latencies) = (log.clone(), Arc::clone(&latencies));
        let value = vec![b'x'; options.record_bytes];
        pending.push(tokio::spawn(async move {
            let sent = Instant::now();
            let record = Record {
                timestamp_ms: i64::try_from(seq).unwrap_or(0),
                key: None,
                value: value.into(),
                headers: tern_log::Headers::new(),
            };
            let acked = log.append("stress", 0, vec![record]).await;
            let mut l = latencies.lock().unwrap_or_else(PoisonError::into_inner);
            l.push(sent.elapsed());
            acked.map(|_| ())
        }));
    }
    for task in pending {
        task.await
            .map_err(|err| BenchError::task("an open-loop append", err))?
            .map_err(|source| BenchError::log("append", source))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = log.stats();
    let mut l = latencies
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    l.sort();
    let pct = |p: f64| percentile(&l, p).map_or(0.0, |d| d.as_secs_f64() * 1e3);
    Ok(serde_json::json!({
        "records": total,
        "record_bytes": options.record_bytes,
        "payload_bytes": total * options.record_bytes as u64,
        "elapsed_s": elapsed,
        "max_delay_ms": options.max_delay.as_millis() as u64,
        "min_delay_ms": options.min_delay.map(|d| d.as_millis() as u64),
        "min_bytes": options.min_bytes,
        "commits": after.commits - before.commits,
        "fsyncs": after.fsyncs - before.fsyncs,
        "bytes_written": after.bytes_written - before.bytes_written,
        "segments_recycled": after.segments_recycled - before.segments_recycled,
        "ack_p50_ms": pct(50.0),
        "ack_p99_ms": pct(99.0),
    }))
}
