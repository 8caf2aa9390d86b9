//! The tern log's workloads: concurrent appends with `sync` durability, reads by offset and in
//! sequence, and recovery after a kill, plus the hidden child process that writes until killed
//! (so its peak memory is the log's alone).
//!
//! It drives the log only through its public API (`tern_log`) and only in directories the
//! bench created; it runs the default configuration, except that the recovery log has no
//! retention size limit (so 1 GiB stays whole) and the append workloads take the commit window
//! they are given (the default unless `--commit-max-*` overrides it).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::device::Target;
use super::stats::Latency;
use super::{AppendRun, AppendSpec, BenchError};
use crate::cli::LogWriterArgs;
use tern_core::ByteSize;
use tern_log::{FlushConfig, Log, LogConfig, LogError, Record};

/// Value size of the recovery writer's records (its `--record-size` default).
const WRITER_RECORD_SIZE: u64 = 1024;

/// Records per append call of the recovery writer: 64 appenders × 16 KiB fill the default
/// 1 MiB commit early, so a 1 GiB log is written in seconds, not minutes.
const WRITER_BATCH: usize = 16;

/// The one topic and partition every workload uses.
const TOPIC: &str = "bench";
const PARTITION: u32 = 0;

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
    std::fs::create_dir_all(dir).map_err(|source| io("mkdir", dir, source))?;
    target.drop_cache(dir)?;
    let before = target.written()?;
    let config = LogConfig {
        flush: flush.clone(),
        ..LogConfig::default()
    };
    let log = open(dir, &config).await?;
    let started = Instant::now();
    let mut latencies = append_concurrently(&log, spec).await?;
    let secs = started.elapsed().as_secs_f64();
    let fdatasyncs = log.stats().fsyncs;
    log.close()
        .await
        .map_err(|source| log_error("close", source))?;
    target.sync()?;
    let device_bytes = target.written()?.saturating_sub(before);
    let records = latencies.len() as u64 * spec.batch.max(1) as u64;
    Ok(AppendRun {
        records,
        payload_bytes: records * spec.record_size as u64,
        secs,
        device_bytes,
        latency: Latency::of(&mut latencies),
        fdatasyncs: Some(fdatasyncs),
    })
}

async fn open(dir: &Path, config: &LogConfig) -> Result<Log, BenchError> {
    let log = Log::open(dir, config)
        .await
        .map_err(|source| log_error("open", source))?;
    log.ensure_topic(TOPIC)
        .map_err(|source| log_error("ensure_topic", source))?;
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
        let result = task.await.map_err(|err| BenchError::Setup {
            message: format!("an appender task failed: {err}"),
        })?;
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
    let mut inflight = tokio::task::JoinSet::new();
    loop {
        while inflight.len() < spec.inflight.max(1)
            && Instant::now() < deadline
            && !super::interrupted()
            && claimed.fetch_add(batch as u64, Ordering::Relaxed) < spec.max_records
        {
            let records: Vec<Record> = (0..batch).map(|_| record(spec.record_size)).collect();
            let log = log.clone();
            inflight.spawn(async move {
                let started = Instant::now();
                let appended = log.append(TOPIC, PARTITION, records).await;
                appended.map(|_| started.elapsed())
            });
        }
        let Some(joined) = inflight.join_next().await else {
            return Ok(latencies);
        };
        let appended = joined.map_err(|err| BenchError::Setup {
            message: format!("an append task failed: {err}"),
        })?;
        latencies.push(appended.map_err(|source| log_error("append", source))?);
    }
}

fn record(size: usize) -> Record {
    let timestamp_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Record {
        timestamp_ms,
        key: None,
        value: vec![0x5A; size],
        headers: Vec::new(),
    }
}

/// Read figures of a log the append workload left behind.
#[derive(Debug, Clone, Serialize)]
pub struct ReadFigures {
    pub records: u64,
    /// Sequential read from offset 0 to the end, page cache dropped first.
    pub sequential_mb_per_s: f64,
    pub sequential_records_per_s: f64,
    /// Random single-record reads by offset, after the sequential pass warmed the cache.
    pub random_samples: usize,
    pub random_p50_us: f64,
    pub random_p99_us: f64,
}

/// Reads the log in `dir` sequentially (cold), then `samples` random offsets (warm).
pub async fn reads(target: &Target, dir: &Path, samples: usize) -> Result<ReadFigures, BenchError> {
    target.drop_cache(dir)?;
    let log = open(dir, &LogConfig::default()).await?;
    let (start, end) = log
        .offsets(TOPIC, PARTITION)
        .map_err(|source| log_error("offsets", source))?;
    let started = Instant::now();
    let bytes = read_all(&log, start, end)?;
    let secs = started.elapsed().as_secs_f64();
    let mut latencies = random_reads(&log, start, end, samples)?;
    log.close()
        .await
        .map_err(|source| log_error("close", source))?;
    let records = end - start;
    let latency = Latency::of(&mut latencies);
    Ok(ReadFigures {
        records,
        sequential_mb_per_s: bytes as f64 / secs / 1e6,
        sequential_records_per_s: records as f64 / secs,
        random_samples: latencies.len(),
        random_p50_us: latency.p50_us,
        random_p99_us: latency.p99_us,
    })
}

/// Value bytes read from `start` to `end` in 1 MiB reads.
fn read_all(log: &Log, start: u64, end: u64) -> Result<u64, BenchError> {
    let (mut next, mut bytes) = (start, 0u64);
    while next < end {
        let batch = log
            .read(TOPIC, PARTITION, next, 1 << 20)
            .map_err(|source| log_error("read", source))?;
        let Some(last) = batch.last() else {
            return Err(BenchError::Setup {
                message: format!("read at {next} of {end} returned nothing"),
            });
        };
        next = last.offset + 1;
        bytes += batch
            .iter()
            .map(|r| r.record.value.len() as u64)
            .sum::<u64>();
    }
    Ok(bytes)
}

fn random_reads(
    log: &Log,
    start: u64,
    end: u64,
    samples: usize,
) -> Result<Vec<Duration>, BenchError> {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let span = end.saturating_sub(start).max(1);
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let offset = start + rng.next() % span;
        let started = Instant::now();
        let batch = log
            .read(TOPIC, PARTITION, offset, 1)
            .map_err(|source| log_error("read", source))?;
        latencies.push(started.elapsed());
        if batch.first().map(|r| r.offset) != Some(offset) {
            return Err(BenchError::Setup {
                message: format!("read at offset {offset} returned another record"),
            });
        }
    }
    Ok(latencies)
}

/// A tiny deterministic generator for read offsets (no quality needed, only spread).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Recovery after a kill, and the writer's peak memory.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryFigures {
    /// Payload bytes the child had acknowledged when it was killed.
    pub log_payload_bytes: u64,
    /// Bytes of the log's files on disk.
    pub log_file_bytes: u64,
    pub records_recovered: u64,
    /// Records the child had acknowledged (as last reported) but `Log::open` did not find:
    /// anything but 0 is a durability bug.
    pub acknowledged_records_lost: u64,
    /// `Log::open` after the kill, page cache dropped first.
    pub open_ms: f64,
    /// VmHWM of the child that did only the writing.
    pub writer_peak_rss_bytes: u64,
    /// Records per append call of that child (64 appenders).
    pub writer_batch_records: usize,
}

/// Runs `tern bench log-writer` on a fresh log in `dir`, SIGKILLs it once it has written
/// `bytes`, then times `Log::open` on what it left.
pub async fn recovery(
    target: &Target,
    dir: &Path,
    bytes: u64,
) -> Result<RecoveryFigures, BenchError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|source| io("mkdir", dir, source))?;
    let mut child = Writer::spawn(dir, bytes)?;
    let (written, peak) = child.wait_and_kill(bytes)?;
    target.drop_cache(dir)?;
    let started = Instant::now();
    let log = Log::open(dir, &recovery_config())
        .await
        .map_err(|source| log_error("open after kill", source))?;
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    let (start, end) = log
        .offsets(TOPIC, PARTITION)
        .map_err(|source| log_error("offsets", source))?;
    log.close()
        .await
        .map_err(|source| log_error("close", source))?;
    Ok(RecoveryFigures {
        log_payload_bytes: written,
        log_file_bytes: dir_bytes(dir)?,
        records_recovered: end - start,
        acknowledged_records_lost: (written / WRITER_RECORD_SIZE).saturating_sub(end - start),
        open_ms,
        writer_peak_rss_bytes: peak,
        writer_batch_records: WRITER_BATCH,
    })
}

/// The defaults without the retention size limit, so the recovery log keeps every byte.
fn recovery_config() -> LogConfig {
    let mut config = LogConfig::default();
    config.retention.bytes = ByteSize(0);
    config
}

/// The child `tern bench log-writer` process; killed by its PID on drop.
struct Writer {
    child: Child,
}

impl Writer {
    fn spawn(dir: &Path, bytes: u64) -> Result<Self, BenchError> {
        let exe = std::env::current_exe().map_err(|source| io("current_exe", dir, source))?;
        let child = Command::new(&exe)
            .args(["log-writer", "--dir"])
            .arg(dir)
            .args(["--max-bytes", &(bytes * 2).to_string()])
            .args(["--batch", &WRITER_BATCH.to_string()])
            .args(["--record-size", &WRITER_RECORD_SIZE.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| io("spawn", &exe, source))?;
        Ok(Self { child })
    }

    /// Waits until the child reports `bytes` written, reads its peak RSS, kills it: (bytes
    /// written as last reported, VmHWM in bytes).
    fn wait_and_kill(&mut self, bytes: u64) -> Result<(u64, u64), BenchError> {
        let stdout = self.child.stdout.take().ok_or(BenchError::Setup {
            message: "log writer has no stdout".to_owned(),
        })?;
        let mut written = 0;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if super::interrupted() {
                return Err(BenchError::Interrupted);
            }
            written = line
                .strip_prefix("written ")
                .and_then(|n| n.parse().ok())
                .unwrap_or(written);
            if written >= bytes {
                let status = PathBuf::from(format!("/proc/{}/status", self.child.id()));
                let text = std::fs::read_to_string(&status)
                    .map_err(|source| io("read", &status, source))?;
                let peak = parse_vm_hwm(&text).ok_or(BenchError::Parse { path: status })?;
                self.kill();
                return Ok((written, peak));
            }
        }
        Err(BenchError::Setup {
            message: format!("log writer stopped after {written} of {bytes} bytes"),
        })
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `VmHWM:` of a `/proc/<pid>/status` file, in bytes.
pub fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

fn dir_bytes(dir: &Path) -> Result<u64, BenchError> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(|source| io("read_dir", dir, source))? {
        let entry = entry.map_err(|source| io("read_dir", dir, source))?;
        let meta = entry
            .metadata()
            .map_err(|source| io("stat", &entry.path(), source))?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// The child process: appends until `max_bytes`, printing `written N` about every 50 ms, then
/// exits without closing the log (it is normally killed long before).
pub fn writer(args: &LogWriterArgs) -> Result<(), BenchError> {
    let runtime = super::runtime()?;
    runtime.block_on(async {
        let log = open(&args.dir, &recovery_config()).await?;
        let spec = AppendSpec {
            record_size: args.record_size,
            appenders: args.appenders,
            batch: args.batch.max(1),
            inflight: 1,
            max_records: args.max_bytes / args.record_size.max(1) as u64,
            max_duration: Duration::from_secs(3600),
        };
        let done = Arc::new(AtomicU64::new(0));
        let reporter = tokio::spawn(report_progress(done.clone(), spec.record_size as u64));
        let result = append_counting(&log, &spec, &done).await;
        reporter.abort();
        result
    })?;
    std::process::exit(0)
}

/// Appends `spec`, adding the records of each acknowledged append to `done`.
async fn append_counting(
    log: &Log,
    spec: &AppendSpec,
    done: &Arc<AtomicU64>,
) -> Result<(), BenchError> {
    let batch = spec.batch as u64;
    let claimed = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..spec.appenders)
        .map(|_| {
            let (log, claimed, done, spec) =
                (log.clone(), claimed.clone(), done.clone(), spec.clone());
            tokio::spawn(async move {
                while claimed.fetch_add(batch, Ordering::Relaxed) < spec.max_records {
                    let records = (0..batch).map(|_| record(spec.record_size)).collect();
                    log.append(TOPIC, PARTITION, records)
                        .await
                        .map_err(|source| log_error("append", source))?;
                    done.fetch_add(batch, Ordering::Relaxed);
                }
                Ok::<(), BenchError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.map_err(|err| BenchError::Setup {
            message: format!("appender failed: {err}"),
        })??;
    }
    Ok(())
}

async fn report_progress(done: Arc<AtomicU64>, record_size: u64) {
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let mut out = std::io::stdout().lock();
        if writeln!(
            out,
            "written {}",
            done.load(Ordering::Relaxed) * record_size
        )
        .is_err()
            || out.flush().is_err()
        {
            return;
        }
    }
}

fn log_error(op: &'static str, source: LogError) -> BenchError {
    BenchError::Log { op, source }
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> BenchError {
    BenchError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_hwm_is_read_in_kib() {
        let status = "Name:\ttern\nVmPeak:\t  20000 kB\nVmHWM:\t    8192 kB\nVmRSS:\t 4000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(8 << 20));
        assert_eq!(parse_vm_hwm("VmRSS:\t 4000 kB\n"), None);
    }

    #[test]
    fn xorshift_spreads_offsets() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let hits: std::collections::HashSet<u64> = (0..100).map(|_| rng.next() % 10).collect();
        assert_eq!(hits.len(), 10);
    }
}
