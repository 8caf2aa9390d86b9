//! tern's append workload: `appenders` concurrent tasks appending with `sync` durability, each
//! with a window of appends in flight, and the latency of every append call; plus the log
//! opening and the record shape every workload of the log bench shares.
//!
//! It drives the log only through its public API (`tern_log`) and only in directories the
//! bench created, with the default configuration except the commit window it is given (the
//! default unless `--commit-max-*` overrides it).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::device::Target;
use super::{AppendRun, AppendSpec};
use crate::BenchError;
use crate::stats::Latency;
use tern_log::{FlushConfig, Log, LogConfig, Record};

/// The one topic and partition every workload uses.
pub(super) const TOPIC: &str = "bench";
pub(super) const PARTITION: u32 = 0;

/// Appends `spec` to a fresh log in `dir` with the default configuration but the commit window
/// `flush`; device bytes are counted from before opening to after closing. The log is left in
/// `dir`.
pub async fn append(
    target: &Target,
    dir: &Path,
    spec: &AppendSpec,
    flush: &FlushConfig,
) -> Result<AppendRun, BenchError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|source| BenchError::file("mkdir", dir, source))?;
    target.drop_cache(dir)?;
    let before = target.written()?;
    let config = LogConfig {
        flush: flush.clone(),
        ..LogConfig::default()
    };
    let log = open(dir, &config).await?;
    let (started, cpu_before) = (Instant::now(), crate::stats::process_cpu_secs());
    let mut latencies = append_concurrently(&log, spec).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu_secs = crate::stats::process_cpu_secs() - cpu_before;
    let stats = log.stats();
    log.close()
        .await
        .map_err(|source| BenchError::log("close", source))?;
    target.sync()?;
    let device_bytes = target.written()?.saturating_sub(before);
    let records = latencies.len() as u64 * spec.batch.max(1) as u64;
    Ok(AppendRun {
        records,
        payload_bytes: records * spec.record_size as u64,
        secs,
        device_bytes,
        latency: Latency::of(&mut latencies),
        fdatasyncs: Some(stats.fsyncs),
        fdatasync_secs: Some(stats.fsync_time.as_secs_f64()),
        cpu_secs: Some(cpu_secs),
    })
}

pub(super) async fn open(dir: &Path, config: &LogConfig) -> Result<Log, BenchError> {
    let log = Log::open(dir, config)
        .await
        .map_err(|source| BenchError::log("open", source))?;
    log.ensure_topic(TOPIC)
        .map_err(|source| BenchError::log("ensure_topic", source))?;
    Ok(log)
}

/// `spec.appenders` tokio tasks, each appending `spec.batch` records at a time with up to
/// `spec.inflight` appends waiting to be durable; the latency of every append call.
async fn append_concurrently(log: &Log, spec: &AppendSpec) -> Result<Vec<Duration>, BenchError> {
    let claimed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + spec.max_duration;
    let tasks: Vec<_> = (0..spec.appenders)
        .map(|_| {
            let (log, claimed, spec) = (log.clone(), claimed.clone(), spec.clone());
            tokio::spawn(async move { appender(log, claimed, deadline, spec).await })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        let result = task
            .await
            .map_err(|err| BenchError::task("an appender task", err))?;
        latencies.extend(result?);
    }
    Ok(latencies)
}

async fn appender(
    log: Log,
    claimed: Arc<AtomicU64>,
    deadline: Instant,
    spec: AppendSpec,
) -> Result<Vec<Duration>, BenchError> {
    let mut latencies = Vec::new();
    let batch = spec.batch.max(1);
    // Like an MQTT connection: queue each append on the partition's writer and await the
    // answers in queueing order (the writer answers a partition's appends in that order),
    // without a task per append.
    let mut inflight = std::collections::VecDeque::new();
    loop {
        while inflight.len() < spec.inflight.max(1)
            && Instant::now() < deadline
            && !super::interrupted()
            && claimed.fetch_add(batch as u64, Ordering::Relaxed) < spec.max_records
        {
            let records: Vec<Record> = (0..batch).map(|_| record(spec.record_size)).collect();
            let started = Instant::now();
            let answer = log
                .enqueue(TOPIC, PARTITION, records)
                .await
                .map_err(|source| BenchError::log("append", source))?;
            inflight.push_back((started, answer));
        }
        let Some((started, answer)) = inflight.pop_front() else {
            return Ok(latencies);
        };
        let appended = answer
            .await
            .map_err(|_| BenchError::log("append", tern_log::LogError::Closed))?;
        appended.map_err(|source| BenchError::log("append", source))?;
        latencies.push(started.elapsed());
    }
}

pub(super) fn record(size: usize) -> Record {
    let timestamp_ms = tern_core::time::now_ms();
    Record {
        timestamp_ms,
        key: None,
        value: vec![0x5A; size].into(),
        headers: tern_log::Headers::new(),
    }
}
