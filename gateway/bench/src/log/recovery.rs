//! Recovery after a kill: a child `tern-bench log-writer` appends to a fresh log until it has
//! acknowledged the wanted bytes, is SIGKILLed, and `Log::open` is timed on what it left; the
//! child's peak RSS is the log's memory figure. Also the child itself (`writer`), which appends
//! until it is killed and prints its progress.
//!
//! The recovery log has the default configuration without the retention size limit (so 1 GiB
//! stays whole). It ends only the child it started, by that child's own PID.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::AppendSpec;
use super::append::{PARTITION, TOPIC, open, record};
use super::device::Target;
use crate::BenchError;
use crate::cli::LogWriterArgs;
use tern_core::ByteSize;
use tern_log::{Log, LogConfig};

/// Value size of the recovery writer's records (its `--record-size` default).
const WRITER_RECORD_SIZE: u64 = 1024;

/// Records per append call of the recovery writer: 64 appenders × 16 KiB fill the default
/// 1 MiB commit early, so a 1 GiB log is written in seconds, not minutes.
const WRITER_BATCH: usize = 16;

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
    std::fs::create_dir_all(dir).map_err(|source| BenchError::file("mkdir", dir, source))?;
    let mut child = Writer::spawn(dir, bytes)?;
    let (written, peak) = child.wait_and_kill(bytes)?;
    target.drop_cache(dir)?;
    let started = Instant::now();
    let log = Log::open(dir, &recovery_config())
        .await
        .map_err(|source| BenchError::log("open after kill", source))?;
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    let (start, end) = log
        .offsets(TOPIC, PARTITION)
        .map_err(|source| BenchError::log("offsets", source))?;
    log.close()
        .await
        .map_err(|source| BenchError::log("close", source))?;
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
        let exe = std::env::current_exe()
            .map_err(|source| BenchError::file("current_exe", dir, source))?;
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
            .map_err(|source| BenchError::file("spawn", &exe, source))?;
        Ok(Self { child })
    }

    /// Waits until the child reports `bytes` written, reads its peak RSS, kills it: (bytes
    /// written as last reported, VmHWM in bytes).
    fn wait_and_kill(&mut self, bytes: u64) -> Result<(u64, u64), BenchError> {
        let stdout = self.child.stdout.take().ok_or(BenchError::NoStdout {
            child: "log writer",
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
                    .map_err(|source| BenchError::file("read", &status, source))?;
                let peak = parse_vm_hwm(&text).ok_or(BenchError::Parse { path: status })?;
                self.kill();
                return Ok((written, peak));
            }
        }
        Err(BenchError::WriterStopped {
            written,
            expected: bytes,
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
    for entry in
        std::fs::read_dir(dir).map_err(|source| BenchError::file("read_dir", dir, source))?
    {
        let entry = entry.map_err(|source| BenchError::file("read_dir", dir, source))?;
        let meta = entry
            .metadata()
            .map_err(|source| BenchError::file("stat", &entry.path(), source))?;
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
                        .map_err(|source| BenchError::log("append", source))?;
                    done.fetch_add(batch, Ordering::Relaxed);
                }
                Ok::<(), BenchError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await
            .map_err(|err| BenchError::task("an appender of the log writer", err))??;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_hwm_is_read_in_kib() {
        let status = "Name:\ttern\nVmPeak:\t  20000 kB\nVmHWM:\t    8192 kB\nVmRSS:\t 4000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(8 << 20));
        assert_eq!(parse_vm_hwm("VmRSS:\t 4000 kB\n"), None);
    }
}
