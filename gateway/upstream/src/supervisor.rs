//! One upstream's supervisor ([`run`]): makes the cluster handle (which connects on first use), discovers the edge
//! log's partitions every `discover_interval`, and starts one forwarding task per forwarded
//! partition — a `mirror::MirrorForwarder`, or a `shared::SharedForwarder` in shared mode — then
//! waits for them all after shutdown. It forwards nothing itself.

use std::collections::HashSet;
use std::sync::Arc;

use tern_core::shutdown::Shutdown;
use tern_log::{LogPort, TopicInfo};
use tokio::task::JoinSet;

use crate::ablation::Ablation;
use crate::config::UpstreamConfig;
use crate::driver::StatusMap;
use crate::error::UpstreamError;
use crate::kafka::KafkaUpstream;
use crate::live::LiveForwarder;
use crate::mirror::MirrorForwarder;
use crate::provenance::{Provenance, upstream_topic};
use crate::shared::{SharedForwarder, group_client, shared_topic};

/// Forwards the edge log to one upstream cluster until `shutdown` fires.
pub async fn run<L: LogPort>(
    config: UpstreamConfig,
    gateway: String,
    log: L,
    status: StatusMap,
    shutdown: Shutdown,
) -> Result<(), UpstreamError> {
    run_ablated(config, Ablation::NONE, gateway, log, status, shutdown).await
}

/// [`run`] with the safeguards `ablation` turns off: `tern-bench upstream` only, to print what
/// they cost.
pub async fn run_ablated<L: LogPort>(
    config: UpstreamConfig,
    ablation: Ablation,
    gateway: String,
    log: L,
    status: StatusMap,
    mut shutdown: Shutdown,
) -> Result<(), UpstreamError> {
    // Not connected yet: every partition's session connects through it, and it probes a link
    // that is down at a bounded rate (`kafka::PROBE_INTERVAL`).
    let kafka = Arc::new(KafkaUpstream::ablated(&config, ablation)?);
    let group = group_client(&config, &gateway)?;
    let mut running = HashSet::new();
    let mut tasks = JoinSet::new();
    loop {
        for TopicInfo { name, partitions } in log.topics() {
            if !config.forwards(&name) {
                continue;
            }
            for partition in 0..partitions {
                if !running.insert((name.clone(), partition)) {
                    continue;
                }
                let source = Provenance {
                    gateway: gateway.clone(),
                    topic: name.clone(),
                    partition,
                };
                if config.is_live_first(&name) {
                    let forwarded = match &group {
                        Some(_) => shared_topic(&config.topic_prefix, &name),
                        None => upstream_topic(&config.topic_prefix, &gateway, &name),
                    };
                    let live = LiveForwarder::new(
                        &config,
                        &kafka,
                        &log,
                        (&forwarded, partitions),
                        source.clone(),
                        &status,
                    )
                    .ablated(ablation);
                    tasks.spawn(live.run(shutdown.clone()));
                }
                if let Some(group) = &group {
                    let task = SharedForwarder::new(
                        &config, &kafka, group, &log, partitions, source, &status,
                    )
                    .ablated(ablation);
                    tasks.spawn(task.run(shutdown.clone()));
                } else {
                    let task =
                        MirrorForwarder::new(&config, &kafka, &log, partitions, source, &status);
                    tasks.spawn(task.run(shutdown.clone()));
                }
            }
        }
        tokio::select! {
            () = shutdown.wait() => break,
            () = tokio::time::sleep(config.discover_interval.0) => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}
