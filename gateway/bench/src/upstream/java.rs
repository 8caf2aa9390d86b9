//! Kafka's own producer as the drain's yardstick: `org.apache.kafka.tools.ProducerPerformance`
//! (what `kafka-producer-perf-test.sh` runs) from the jars on `--kafka-classpath`, one producer
//! with its defaults except acks=all and the codec (and, for the second yardstick, `batch.size`
//! as large as tern's batches), no throttling, to a new topic of the same cluster. Its values come from a payload file of the backlog's kind of telemetry, each as long
//! as one of tern's upstream records with its headers, so both send about the same bytes per
//! record and compress alike. Its final summary line gives records/s.
//!
//! It never judges the figure, writes only its payload file in a temporary directory of its
//! own, and waits for the JVM it started (no other process is touched).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::backlog::Telemetry;
use super::codec_name;
use crate::BenchError;
use tern_upstream::Codec;

/// The producer tool's main class, in the kafka-tools jar.
const MAIN_CLASS: &str = "org.apache.kafka.tools.ProducerPerformance";
/// Heap of the producer JVM (`kafka-run-class.sh`'s default for the tools).
const JVM: &[&str] = &["-Xmx512m", "-Djava.awt.headless=true"];
/// Distinct values in the payload file (the tool picks one at random per record).
const PAYLOADS: usize = 10_000;

/// One run of the Java producer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JavaRun {
    pub codec: Codec,
    /// The `batch.size` it ran with when not Kafka's default.
    pub batch_size: Option<u64>,
    pub records_per_sec: f64,
}

/// The payload file for values of `size` bytes; removed on drop.
#[derive(Debug)]
pub struct Payloads {
    dir: PathBuf,
    file: PathBuf,
    pub size: usize,
}

impl Payloads {
    pub fn write(size: usize) -> Result<Self, BenchError> {
        let dir = std::env::temp_dir().join(format!("tern-bench-java-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::file("create", &dir, e))?;
        let file = dir.join("payloads.txt");
        let mut values = Telemetry::new(size);
        let mut text = Vec::with_capacity(PAYLOADS * (size + 1));
        for _ in 0..PAYLOADS {
            text.extend(values.next_value());
            text.push(b'\n');
        }
        std::fs::write(&file, text).map_err(|e| BenchError::file("write", &file, e))?;
        Ok(Self { dir, file, size })
    }
}

impl Drop for Payloads {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the producer once: `records` records to `topic` (created beforehand) with `codec`.
pub fn produce(
    classpath: &str,
    bootstrap: &str,
    topic: &str,
    records: u64,
    payloads: &Payloads,
    codec: Codec,
    batch_size: Option<u64>,
) -> Result<JavaRun, BenchError> {
    let output = Command::new("java")
        .args(JVM)
        .arg("-cp")
        .arg(classpath)
        .arg(MAIN_CLASS)
        .args(["--bootstrap-server", bootstrap, "--topic", topic])
        .args(["--num-records", &records.to_string(), "--throughput", "-1"])
        .arg("--payload-file")
        .arg(&payloads.file)
        .args(["--command-property", "acks=all"])
        .arg(format!("compression.type={}", codec_name(codec)))
        .args(batch_size.map(|bytes| format!("batch.size={bytes}")))
        .stdin(Stdio::null())
        .output()
        .map_err(|source| BenchError::Spawn {
            broker: "java (Kafka's producer)",
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let failed = |why: &str| BenchError::Tool {
        program: MAIN_CLASS.to_owned(),
        message: format!(
            "{why} ({}):\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
    };
    if !output.status.success() {
        return Err(failed("failed"));
    }
    let records_per_sec =
        summary_rate(&stdout, records).ok_or_else(|| failed("printed no summary line"))?;
    Ok(JavaRun {
        codec,
        batch_size,
        records_per_sec,
    })
}

/// Records/s from the tool's final summary line, `N records sent, R records/sec (M MB/sec),
/// … latency …`, which must report all `records`.
fn summary_rate(stdout: &str, records: u64) -> Option<f64> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" records sent, ") && l.contains(" 50th"))?;
    let (sent, rest) = line.trim().split_once(" records sent, ")?;
    if sent.trim().parse::<u64>().ok()? != records {
        return None;
    }
    let (rate, _) = rest.split_once(" records/sec")?;
    rate.trim().parse().ok().filter(|r: &f64| r.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_gives_the_rate_of_all_records() {
        let out = "499981 records sent, 99976.2 records/sec (14.20 MB/sec), 120.5 ms avg latency, \
                   440.0 ms max latency.\n\
                   1000000 records sent, 104942.807219 records/sec (14.90 MB/sec), 113.80 ms avg \
                   latency, 440.00 ms max latency, 98 ms 50th, 220 ms 95th, 300 ms 99th, 420 ms \
                   99.9th.\n";
        assert_eq!(summary_rate(out, 1_000_000), Some(104_942.807219));
        // A progress line only, or a summary of fewer records, is no result.
        assert_eq!(
            summary_rate(out.lines().next().unwrap_or(""), 499_981),
            None
        );
        assert_eq!(summary_rate(out, 2_000_000), None);
        assert_eq!(summary_rate("", 1), None);
    }
}
