//! Upstream across power cuts: the QEMU gateway forwards to the real three-broker Kafka cluster
//! on the host (through the brokers' listener advertised at 10.0.2.2) while its power is cut;
//! the follower ends with exactly the edge log, once and in order (`tern-offset` contiguous from
//! 0), read with Kafka's own console consumer.

use std::time::{Duration, Instant};

use tern_tests::system::{Arch, Guest, guest_config};
use tern_tests::{KafkaCluster, TempDir, read_log, wait_until};

use crate::cuts::{Stage, run_cuts};

const GATEWAY_ID: &str = "gw-qemu";
/// Power cuts while forwarding.
pub const UPSTREAM_CUTS: usize = 3;

/// The follower topic of `gateway_id`'s `mqtt` topic.
pub fn follower_topic(gateway_id: &str) -> String {
    format!("tern.{gateway_id}.mqtt")
}

/// The `[[upstream]]` section for `cluster`, reached from the guest, as gateway `gateway_id`.
pub fn upstream_section(cluster: &KafkaCluster, gateway_id: &str) -> String {
    let bootstrap: Vec<String> = cluster
        .qemu_guest_bootstrap()
        .split(',')
        .map(|addr| format!("\"{addr}\""))
        .collect();
    format!(
        "[[upstream]]\nbootstrap = [{}]\ngateway_id = \"{gateway_id}\"\nbackoff_max = \"1s\"\n",
        bootstrap.join(", ")
    )
}

/// Waits until the guest reports every durable record forwarded and no forwarder failing.
pub fn wait_forwarded(guest: &mut Guest, timeout: Duration) -> anyhow::Result<()> {
    let labels = "topic=\"mqtt\"";
    wait_until(timeout, "every record forwarded to Kafka", || {
        let behind = guest.metric_sum("tern_upstream_records_behind", labels)?;
        let failing = guest.metric_sum("tern_upstream_failing", labels)?;
        Ok(behind == Some(0) && failing == Some(0))
    })
}

/// `tern_upstream_forwarded_records_total` of the running boot (the counter starts at 0 each boot).
pub fn forwarded_in_this_boot(guest: &Guest) -> anyhow::Result<u64> {
    Ok(guest
        .metric_sum("tern_upstream_forwarded_records_total", "topic=\"mqtt\"")?
        .unwrap_or(0))
}

/// `gateway_id`'s follower holds exactly the edge log's records of `mqtt` partition 0, in edge order with
/// `tern-offset` contiguous from 0 and the same keys (and the same values, with `values`: not
/// when `value_format = "reading-json"` rewrote them); returns how many.
pub fn assert_follower_mirrors(
    cluster: &KafkaCluster,
    data: &std::path::Path,
    gateway_id: &str,
    values: bool,
) -> anyhow::Result<usize> {
    let edge = read_log(data, "mqtt")?;
    let upstream = cluster.consume_all(&follower_topic(gateway_id), 0)?;
    assert_eq!(upstream.len(), edge.len(), "upstream vs edge record count");
    for (i, (up, ed)) in upstream.iter().zip(&edge).enumerate() {
        let offset = i.to_string();
        assert_eq!(up.offset, i as u64, "upstream offset of record {i}");
        assert_eq!(ed.offset, i as u64, "edge offsets not contiguous at {i}");
        assert_eq!(up.header("tern-offset"), Some(offset.as_str()), "{up:?}");
        assert_eq!(up.header("tern-gateway"), Some(gateway_id), "{up:?}");
        assert_eq!(up.key, ed.key, "record {i}");
        if values {
            assert_eq!(up.value, ed.value, "record {i}");
        }
    }
    Ok(edge.len())
}

pub fn upstream_is_exactly_once_across_power_cuts(
    arch: Arch,
    cluster: &KafkaCluster,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = TempDir::new("system-upstream")?;
    let config = guest_config("", &upstream_section(cluster, GATEWAY_ID));
    let mut forwarded_at_cuts = Vec::new();
    let step = |stage, guest: &mut Guest| match stage {
        // The cut lands while the forwarder is producing: this boot has forwarded records.
        Stage::BeforeCut => {
            let mut forwarded = 0;
            wait_until(
                Duration::from_secs(120),
                "records forwarded in this boot",
                || {
                    forwarded = forwarded_in_this_boot(guest)?;
                    Ok(forwarded >= 20)
                },
            )?;
            forwarded_at_cuts.push(forwarded);
            Ok(())
        }
        Stage::BeforeShutdown => wait_forwarded(guest, Duration::from_secs(180)),
    };
    let outcome = run_cuts(arch, "upstream", &config, UPSTREAM_CUTS, dir.path(), step)?;
    assert_eq!(outcome.lost, 0, "acknowledged messages lost: {outcome:?}");
    assert_eq!(outcome.duplicated, 0, "messages stored twice: {outcome:?}");
    let mirrored = assert_follower_mirrors(cluster, &outcome.data, GATEWAY_ID, true)?;
    eprintln!(
        "system {} upstream: power cuts {} (records forwarded in each boot before its cut: {forwarded_at_cuts:?}), acknowledged {}, lost {}, {mirrored} records in {} exactly once and in order; {:.0?} in all",
        arch.name(),
        outcome.cuts,
        outcome.acked,
        outcome.lost,
        follower_topic(GATEWAY_ID),
        started.elapsed()
    );
    Ok(())
}
