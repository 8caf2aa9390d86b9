//! The one client of both brokers: Debian's `kcat` (librdkafka), with its defaults except what
//! each workload names. A produce run pipes a file of newline-separated values into
//! `kcat -P -X acks=all` (one record per line); a consume run is `kcat -C -o beginning -e`
//! reading a topic to its end. Both are timed from spawn to exit (kcat exits only after every
//! record was acknowledged, or after the partition end was reached) and counted (the records a
//! consumer printed), so a run that lost records is an error, not a figure.
//!
//! It only starts and waits for its own kcat processes, by their PIDs.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::BenchError;

/// A file of `records` values of `size` bytes, one per line; removed on drop.
#[derive(Debug)]
pub struct Values {
    pub path: PathBuf,
}

impl Values {
    pub fn write(parent: &Path, records: u64, size: usize) -> Result<Self, BenchError> {
        let path = parent.join(format!("tern-bench-kafka-values-{}", std::process::id()));
        let mut text = Vec::with_capacity((records as usize).saturating_mul(size + 1));
        for n in 0..records {
            // Telemetry-like text of exactly `size` bytes (no newline inside).
            let line = format!("{{\"seq\":{n},\"t\":21.5,\"v\":\"");
            let mut value = line.into_bytes();
            value.resize(size, b'x');
            if let Some(last) = value.last_mut() {
                *last = b'}';
            }
            text.extend_from_slice(&value);
            text.push(b'\n');
        }
        std::fs::write(&path, text).map_err(|e| BenchError::file("write", &path, e))?;
        Ok(Self { path })
    }
}

impl Drop for Values {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Records per second of one timed run.
pub fn rate(records: u64, elapsed: Duration) -> f64 {
    records as f64 / elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
}

/// Produces every value of `values` to `topic` with acks=all; returns the wall time.
pub fn produce(bootstrap: &str, topic: &str, values: &Values) -> Result<Duration, BenchError> {
    let input =
        std::fs::File::open(&values.path).map_err(|e| BenchError::file("open", &values.path, e))?;
    let started = Instant::now();
    let output = Command::new("kcat")
        .args(["-P", "-b", bootstrap, "-t", topic, "-X", "acks=all"])
        .stdin(input)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(spawn_error)?;
    let elapsed = started.elapsed();
    if !output.status.success() || !output.stderr.is_empty() {
        return Err(tool_error("kcat -P", &output.stderr, output.status));
    }
    Ok(elapsed)
}

/// Reads `topic` from its beginning to its end into `out` (a file in the bench's directory, so
/// counting happens after the clock stops); returns the wall time after checking that `records`
/// records arrived.
pub fn consume(
    bootstrap: &str,
    topic: &str,
    records: u64,
    out: &Path,
) -> Result<Duration, BenchError> {
    let sink = std::fs::File::create(out).map_err(|e| BenchError::file("create", out, e))?;
    let started = Instant::now();
    let output = Command::new("kcat")
        .args([
            "-C",
            "-b",
            bootstrap,
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
        ])
        .stdin(Stdio::null())
        .stdout(sink)
        .stderr(Stdio::piped())
        .output()
        .map_err(spawn_error)?;
    let elapsed = started.elapsed();
    if !output.status.success() {
        return Err(tool_error("kcat -C", &output.stderr, output.status));
    }
    let file = std::fs::File::open(out).map_err(|e| BenchError::file("open", out, e))?;
    let lines = count_lines(file)?;
    let _ = std::fs::remove_file(out);
    if lines != records {
        return Err(BenchError::Count {
            topic: topic.to_owned(),
            expected: records,
            got: lines,
        });
    }
    Ok(elapsed)
}

/// Newlines on a reader until its end.
fn count_lines(mut reader: impl Read) -> Result<u64, BenchError> {
    let mut buf = vec![0u8; 1 << 16];
    let mut lines = 0;
    loop {
        let n = reader.read(&mut buf).map_err(|source| BenchError::Io {
            what: "reading kcat's output",
            source,
        })?;
        let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
            return Ok(lines);
        };
        lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
    }
}

/// Consumers left attached to the broker (`kcat -G GROUP TOPIC`, balanced consumer group
/// members starting at the earliest offset), each with the count of records it printed.
/// Dropping it kills them by their PIDs.
#[derive(Debug)]
pub struct Members {
    children: Vec<Child>,
    received: Arc<AtomicU64>,
}

impl Members {
    pub fn join(bootstrap: &str, group: &str, topic: &str, n: usize) -> Result<Self, BenchError> {
        let received = Arc::new(AtomicU64::new(0));
        let mut children = Vec::with_capacity(n);
        for _ in 0..n {
            let mut child = Command::new("kcat")
                .args(["-b", bootstrap, "-G", group, "-q", "-u"])
                .args(["-X", "auto.offset.reset=earliest", topic])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(spawn_error)?;
            if let Some(stdout) = child.stdout.take() {
                let received = Arc::clone(&received);
                std::thread::spawn(move || {
                    for _ in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            children.push(child);
        }
        Ok(Self { children, received })
    }

    /// Records printed by all members so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Whether every member still runs.
    pub fn alive(&mut self) -> bool {
        self.children
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_error(source: std::io::Error) -> BenchError {
    BenchError::Spawn {
        broker: "kcat",
        source,
    }
}

fn tool_error(program: &str, stderr: &[u8], status: std::process::ExitStatus) -> BenchError {
    BenchError::Tool {
        program: program.to_owned(),
        message: format!("{status}: {}", String::from_utf8_lossy(stderr)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_have_the_size_and_count_asked_for() {
        let dir = std::env::temp_dir();
        let values = Values::write(&dir, 1000, 100).expect("write values");
        let text = std::fs::read(&values.path).expect("read values");
        assert_eq!(text.len(), 1000 * 101);
        assert!(
            text.split(|&b| b == b'\n')
                .take(1000)
                .all(|v| v.len() == 100)
        );
        assert_eq!(count_lines(text.as_slice()).expect("count"), 1000);
    }

    #[test]
    fn rate_is_records_per_second() {
        assert_eq!(rate(200_000, Duration::from_millis(500)), 400_000.0);
    }
}
