//! The backlog phase: an edge log in a temporary directory filled through the log API (topic
//! `bench`, one partition, values that look like sensor telemetry: JSON readings from a random
//! walk, cut to the payload size), then drained once per codec and repetition by the forwarder
//! running in this process, each time to a new upstream topic, through a fresh counting proxy.
//! A drain is timed from the forwarder's start (connect and catch-up included; the upstream
//! topic is created beforehand) until the upstream end offset equals the edge end offset.
//!
//! It never writes outside its temporary directory and never judges the figures.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proxy::{Counted, CountingProxy};
use super::{TOPIC_PREFIX, UpstreamBenchOptions, wait_for_end};
use crate::BenchError;
use tern_log::{Log, LogConfig, Record};
use tern_upstream::Codec;
use tern_upstream::KafkaUpstream;
use tern_upstream::upstream_topic;
use tern_upstream::{self as forwarder, StatusMap};

/// The edge topic of the backlog.
const EDGE_TOPIC: &str = "bench";
/// Records per append while building the backlog.
const APPEND_BATCH: u64 = 5_000;

/// Figures of one drain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrainRun {
    pub codec: Codec,
    pub records: u64,
    pub elapsed: Duration,
    pub payload_bytes: u64,
    pub wire: Counted,
}

/// The edge log holding the backlog; its directory is removed on drop.
#[derive(Debug)]
pub struct Backlog {
    log: Log,
    dir: PathBuf,
    records: u64,
    size: usize,
}

impl Backlog {
    /// Appends `options.records` records; returns the backlog and how long building it took.
    pub async fn build(options: &UpstreamBenchOptions) -> Result<(Self, Duration), BenchError> {
        let dir = std::env::temp_dir().join(format!("tern-bench-upstream-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log = Log::open(&dir, &LogConfig::default())
            .await
            .map_err(|source| BenchError::log("open", source))?;
        let backlog = Self {
            log,
            dir,
            records: options.records,
            size: options.size,
        };
        let started = Instant::now();
        backlog.fill().await?;
        Ok((backlog, started.elapsed()))
    }

    async fn fill(&self) -> Result<(), BenchError> {
        let log_error = |op| move |source| BenchError::log(op, source);
        self.log
            .ensure_topic(EDGE_TOPIC)
            .map_err(log_error("create topic"))?;
        let mut values = Telemetry::new(self.size);
        let now_ms = chrono_now_ms();
        let mut appended = 0;
        while appended < self.records {
            let count = APPEND_BATCH.min(self.records - appended);
            let records = (0..count)
                .map(|_| Record {
                    timestamp_ms: now_ms,
                    key: None,
                    value: values.next_value(),
                    headers: Vec::new(),
                })
                .collect();
            self.log
                .append(EDGE_TOPIC, 0, records)
                .await
                .map_err(log_error("append"))?;
            appended += count;
        }
        Ok(())
    }

    /// Drains the whole backlog with `codec` to a new upstream topic named after `gateway`.
    pub async fn drain(
        &self,
        options: &UpstreamBenchOptions,
        kafka: &KafkaUpstream,
        gateway: &str,
        codec: Codec,
    ) -> Result<DrainRun, BenchError> {
        let topic = upstream_topic(TOPIC_PREFIX, gateway, EDGE_TOPIC);
        let target = options
            .kafka
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        let mut config = options.upstream(Vec::new(), gateway, codec);
        kafka
            .ensure_topic(&topic, 1, config.replication_factor)
            .await?;
        wait_for_end(kafka, &topic, 0).await?;
        let proxy = CountingProxy::start(target).await?;
        config.bootstrap = vec![proxy.bootstrap().to_string()];
        config.topics = vec![EDGE_TOPIC.to_owned()];
        let (trigger, shutdown) = tern_core::shutdown::channel();
        let status = StatusMap::default();
        let started = Instant::now();
        let task = tokio::spawn(forwarder::run(
            config,
            gateway.to_owned(),
            self.log.clone(),
            Arc::clone(&status),
            shutdown,
        ));
        let done = wait_for_end(kafka, &topic, self.records).await;
        trigger.trigger();
        let _ = task.await;
        let done = done?;
        Ok(DrainRun {
            codec,
            records: self.records,
            elapsed: done.duration_since(started),
            payload_bytes: self.records * self.size as u64,
            wire: proxy.counted(),
        })
    }

    pub async fn close(&self) -> Result<(), BenchError> {
        self.log
            .close()
            .await
            .map_err(|source| BenchError::log("close", source))
    }
}

impl Drop for Backlog {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Values like a fleet's telemetry: JSON readings of 1,000 devices whose temperature, humidity
/// and supply voltage drift randomly, as many per value as fit, cut to exactly `size` bytes.
#[derive(Debug)]
struct Telemetry {
    size: usize,
    seed: u64,
    sequence: u64,
    temperature: i64,
    humidity: i64,
}

impl Telemetry {
    fn new(size: usize) -> Self {
        Self {
            size,
            seed: 0x9e37_79b9_7f4a_7c15,
            sequence: 0,
            temperature: 2150,
            humidity: 4500,
        }
    }

    /// xorshift64: deterministic, so every run drains the same bytes.
    fn random(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed
    }

    fn next_value(&mut self) -> Vec<u8> {
        let mut text = String::with_capacity(self.size + 96);
        while text.len() < self.size {
            self.sequence += 1;
            self.temperature += (self.random() % 21) as i64 - 10;
            self.humidity += (self.random() % 41) as i64 - 20;
            let device = self.random() % 1000;
            let supply = 3200 + self.random() % 200;
            let _ = write!(
                text,
                "{{\"dev\":{device},\"seq\":{},\"t\":{},\"rh\":{},\"mv\":{supply}}}",
                self.sequence, self.temperature, self.humidity
            );
        }
        let mut bytes = text.into_bytes();
        bytes.truncate(self.size);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_values_have_the_payload_size_and_differ() {
        let mut telemetry = Telemetry::new(64);
        let first = telemetry.next_value();
        let second = telemetry.next_value();
        assert_eq!((first.len(), second.len()), (64, 64));
        assert_ne!(first, second);
        assert!(first.starts_with(b"{\"dev\":"), "{first:?}");
        let mut big = Telemetry::new(1000);
        assert_eq!(big.next_value().len(), 1000);
    }
}
