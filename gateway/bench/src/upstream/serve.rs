//! The drain by `tern serve` itself, the figure that compares two builds: the backlog's log is
//! copied into a fresh data directory and a `tern serve` child forwards its `bench` topic, in
//! mirror mode and in shared mode, timed from the child's start (the forwarder's connect,
//! InitProducerId and catch-up included) until every record is upstream — mirror mode: the
//! upstream end offset; shared mode: the gateway's group offset, which a transaction commits
//! with its records. The child is this build's `tern` and, with `--compare-tern`, another build
//! (an earlier commit), both on the same backlog and the same cluster, one after the other in
//! each repetition, so the two are compared as a ratio of figures from one run.
//!
//! It never judges the figures and ends only the children it started.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{TOPIC_PREFIX, UpstreamBenchOptions, poll_until, wait_for_end};
use crate::BenchError;
use crate::mqtt::servers::Server;
use tern_upstream::upstream_topic;
use tern_upstream::{KafkaUpstream, Mode, UpstreamConfig, group_client, shared_topic};

/// Which build forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// The `tern` beside this bench (or `$TERN_BIN`).
    This,
    /// `--compare-tern`.
    Compare,
}

/// Figures of one drain by a `tern serve` child.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServeDrain {
    pub build: Build,
    pub mode: Mode,
    pub records: u64,
    pub elapsed: Duration,
}

/// Starts `exe serve` on a copy of `log` forwarding its edge topic `edge_topic` (`records`
/// records) in `mode` under names of `gateway`'s own, and waits until all of it is upstream.
pub async fn drain(
    options: &UpstreamBenchOptions,
    kafka: &KafkaUpstream,
    (exe, build): (&Path, Build),
    (log, edge_topic, records): (&Path, &str, u64),
    mode: Mode,
    gateway: &str,
) -> Result<ServeDrain, BenchError> {
    let prefix = format!("{TOPIC_PREFIX}{gateway}.");
    let topic = match mode {
        Mode::Shared => shared_topic(&prefix, edge_topic),
        Mode::Mirror => upstream_topic(&prefix, gateway, edge_topic),
    };
    let replication = UpstreamConfig::default().replication_factor;
    kafka.ensure_topic(&topic, 1, replication).await?;
    wait_for_end(kafka, &topic, 0).await?;
    let section = upstream_section(&options.kafka, gateway, &prefix, mode, edge_topic);
    let started = Instant::now();
    let server = Server::tern_build_on_copy(exe, log, &section)?;
    let done = match mode {
        Mode::Mirror => wait_for_end(kafka, &topic, records).await,
        Mode::Shared => {
            let config = UpstreamConfig {
                bootstrap: options.kafka.clone(),
                mode: Mode::Shared,
                topic_prefix: prefix.clone(),
                ..UpstreamConfig::default()
            };
            wait_for_group(&config, gateway, &topic, records).await
        }
    };
    drop(server);
    Ok(ServeDrain {
        build,
        mode,
        records,
        elapsed: done?.duration_since(started),
    })
}

/// The child's `[[upstream]]` table: defaults, the bench's names, `mode`, only `edge_topic`.
pub(crate) fn upstream_section(
    bootstrap: &[String],
    gateway: &str,
    prefix: &str,
    mode: Mode,
    edge_topic: &str,
) -> String {
    let quoted: Vec<String> = bootstrap.iter().map(|b| format!("{b:?}")).collect();
    let mode = match mode {
        Mode::Mirror => "mirror",
        Mode::Shared => "shared",
    };
    format!(
        "[[upstream]]\nbootstrap = [{}]\ngateway_id = \"{gateway}\"\ntopic_prefix = \"{prefix}\"\n\
         mode = \"{mode}\"\ntopics = [\"{edge_topic}\"]\n",
        quoted.join(", ")
    )
}

/// Waits until the shared-mode group of `gateway` under `config` holds `expected` as its
/// committed offset of `topic` partition 0 (stable offsets only: a transaction's offset counts
/// once it committed).
async fn wait_for_group(
    config: &UpstreamConfig,
    gateway: &str,
    topic: &str,
    expected: u64,
) -> Result<Instant, BenchError> {
    let Some(group) = group_client(config, gateway)? else {
        return Err(BenchError::Invalid {
            option: "--kafka",
            reason: "no group client for shared mode",
        });
    };
    let fetch = async || match group.fetch(topic, 0).await {
        Ok(offset) => offset.and_then(|o| u64::try_from(o).ok()).unwrap_or(0),
        Err(err) => {
            tracing::debug!(%err, "asking for the group offset again");
            0
        }
    };
    poll_until(topic, expected, Duration::from_millis(20), fetch).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_forwards_only_the_backlog_topic_in_the_mode_asked_for() {
        let bootstrap = ["127.0.0.1:1".to_owned()];
        let text = upstream_section(
            &bootstrap,
            "r1-serve",
            "tern-bench.r1-serve.",
            Mode::Shared,
            "bench",
        );
        #[derive(serde::Deserialize)]
        struct Sections {
            upstream: Vec<UpstreamConfig>,
        }
        let config: Sections = toml::from_str(&text).expect("valid config");
        let upstream = config.upstream.first().expect("one upstream");
        assert_eq!(upstream.mode, Mode::Shared);
        assert_eq!(upstream.topics, ["bench"]);
        assert_eq!(upstream.topic_prefix, "tern-bench.r1-serve.");
        assert_eq!(upstream.gateway_id.as_deref(), Some("r1-serve"));
    }
}
