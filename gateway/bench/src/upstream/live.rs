//! The live phase: a `tern serve` child forwarding straight to the cluster (its MQTT payloads
//! are constant bytes, so bytes on the wire are left to the backlog phase), fed by the MQTT bench's load generator (QoS 1, durable acks). The ingest rate is the bench's
//! anchor; the forwarding rate counts from the first publish until the upstream partition holds
//! the last record, so it includes the forwarder's lag behind the stream. A short warm-up first
//! lets the forwarder find the edge topic and create the upstream one.
//!
//! It never judges the figures and ends only the child it started.

use std::time::{Duration, Instant};

use super::{TOPIC_PREFIX, UpstreamBenchOptions, wait_for_end};
use crate::BenchError;
use crate::mqtt::load::{self, Load};
use crate::mqtt::servers::Server;
use tern_upstream::KafkaUpstream;
use tern_upstream::upstream_topic;

/// Publisher connections of the live load (the MQTT bench's default).
const PUBLISHERS: usize = 16;
/// Unacknowledged QoS 1 publishes per connection (the MQTT bench's default).
const WINDOW: usize = 64;
/// Most messages in one live run; smaller backlogs get as many as they hold.
const MAX_MESSAGES: u64 = 80_000;
/// Messages of the warm-up run.
const WARM_UP: u64 = 100;

/// Figures of one live run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LiveRun {
    pub messages: u64,
    pub ingest_msgs_per_sec: f64,
    pub forward_records_per_sec: f64,
    /// Payload bytes forwarded per second.
    pub forward_bytes_per_sec: f64,
    /// From the last PUBACK until the upstream partition held the last record.
    pub lag: Duration,
}

/// The live runs, one per repetition, against one `tern serve` child.
pub fn measure(
    options: &UpstreamBenchOptions,
    runtime: &tokio::runtime::Runtime,
    kafka: &KafkaUpstream,
    run_id: &str,
) -> Result<Vec<LiveRun>, BenchError> {
    let gateway = format!("{run_id}-live");
    let server = Server::tern_with(&[], &upstream_section(&options.kafka, &gateway))?;
    let topic = upstream_topic(TOPIC_PREFIX, &gateway, "mqtt");
    runtime.block_on(async {
        let warm_up = load(options, 1, WARM_UP);
        load::run(server.addr, warm_up, "warm-up").await?;
        wait_for_end(kafka, &topic, WARM_UP).await?;
        let mut upstream_end = WARM_UP;
        let mut runs = Vec::with_capacity(options.repetitions);
        for rep in 0..options.repetitions {
            let live = load(options, PUBLISHERS, live_messages(options.records));
            let messages = (live.publishers * live.messages) as u64;
            let started = Instant::now();
            let measured = load::run(server.addr, live, &format!("live{rep}")).await?;
            let acked = Instant::now();
            upstream_end += messages;
            let forwarded = wait_for_end(kafka, &topic, upstream_end).await?;
            let secs = forwarded.duration_since(started).as_secs_f64();
            runs.push(LiveRun {
                messages,
                ingest_msgs_per_sec: measured.msgs_per_sec,
                forward_records_per_sec: messages as f64 / secs,
                forward_bytes_per_sec: (messages * options.size as u64) as f64 / secs,
                lag: forwarded.saturating_duration_since(acked),
            });
        }
        Ok(runs)
    })
}

/// The `[[upstream]]` table of the child: default settings, the bench's names.
fn upstream_section(bootstrap: &[String], gateway: &str) -> String {
    let quoted: Vec<String> = bootstrap.iter().map(|b| format!("{b:?}")).collect();
    format!(
        "[[upstream]]\nbootstrap = [{}]\ngateway_id = \"{gateway}\"\n\
         topic_prefix = \"{TOPIC_PREFIX}\"\n",
        quoted.join(", ")
    )
}

/// Messages in one live run: the backlog size, at most [`MAX_MESSAGES`], spread evenly.
fn live_messages(records: u64) -> u64 {
    records.clamp(PUBLISHERS as u64, MAX_MESSAGES) / PUBLISHERS as u64
}

fn load(options: &UpstreamBenchOptions, publishers: usize, messages: u64) -> Load {
    Load {
        publishers,
        messages: usize::try_from(messages).unwrap_or(usize::MAX),
        size: options.size,
        qos1: true,
        window: WINDOW,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_runs_are_capped_and_split_over_the_publishers() {
        assert_eq!(live_messages(1_000_000), 5_000);
        assert_eq!(live_messages(20_000), 1_250);
        assert_eq!(live_messages(3), 1);
    }

    #[test]
    fn the_child_forwards_with_defaults_under_the_bench_prefix() {
        let bootstrap = ["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let text = format!(
            "data_dir = \"d\"\n{}",
            upstream_section(&bootstrap, "r1-live")
        );
        #[derive(serde::Deserialize)]
        struct Sections {
            #[serde(rename = "data_dir")]
            _data_dir: String,
            upstream: Vec<tern_upstream::UpstreamConfig>,
        }
        let config: Sections = toml::from_str(&text).expect("valid config");
        let upstream = config.upstream.first().expect("one upstream");
        assert_eq!(upstream.bootstrap, bootstrap);
        assert_eq!(upstream.topic_prefix, TOPIC_PREFIX);
        assert_eq!(
            upstream.compression,
            tern_upstream::UpstreamConfig::default().compression
        );
    }
}
