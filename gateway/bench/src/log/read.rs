//! The read workloads on the log the main 1 KiB append workload left behind: one sequential
//! pass from the first offset to the end with the page cache dropped first, then random
//! single-record reads by offset on the warm cache.
//!
//! It only reads; it never appends to the log or changes its files.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::append::{PARTITION, TOPIC, open};
use super::device::Target;
use crate::BenchError;
use crate::stats::Latency;
use tern_log::{Log, LogConfig};

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
        .map_err(|source| BenchError::log("offsets", source))?;
    let started = Instant::now();
    let bytes = read_all(&log, start, end)?;
    let secs = started.elapsed().as_secs_f64();
    let mut latencies = random_reads(&log, start, end, samples)?;
    log.close()
        .await
        .map_err(|source| BenchError::log("close", source))?;
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
            .map_err(|source| BenchError::log("read", source))?;
        let Some(last) = batch.last() else {
            return Err(BenchError::ReadBack {
                offset: next,
                end,
                problem: "returned nothing",
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
            .map_err(|source| BenchError::log("read", source))?;
        latencies.push(started.elapsed());
        if batch.first().map(|r| r.offset) != Some(offset) {
            return Err(BenchError::ReadBack {
                offset,
                end,
                problem: "returned another record",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xorshift_spreads_offsets() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let hits: std::collections::HashSet<u64> = (0..100).map(|_| rng.next() % 10).collect();
        assert_eq!(hits.len(), 10);
    }
}
