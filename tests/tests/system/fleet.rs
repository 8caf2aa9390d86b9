//! A QEMU gateway in a fleet's regional outage: [`FLEET`] host gateways ([`tern_tests::fleet`],
//! half mirror, half shared) and one ARM gateway in system QEMU, all forwarding into the same
//! three-broker cluster through cuttable proxies (the guest's listener has its own). The outage
//! cuts every link at once while every gateway keeps ingesting; during it the QEMU gateway,
//! with records waiting for the link, loses its power, boots again on the same SD card and goes
//! on ingesting; then every link returns at once.
//!
//! Checked: no acknowledged message lost or stored twice on the QEMU gateway's card (the power
//! cut harness of `cuts.rs`), its follower topic exactly its edge log once and in order, every
//! host gateway's acknowledged readings upstream exactly once and in order (kcat, shared mode
//! `read_committed`), and the status topic showing every gateway, the rebooted one included,
//! ready again in a status sent after the drain.

use std::time::{Duration, Instant};

use tern_tests::fleet::{Fleet, status_section, wait_all_ready};
use tern_tests::system::{Arch, Guest, guest_config};
use tern_tests::{KafkaCluster, TempDir, now_ms, wait_until};

use crate::cuts::{Stage, run_cuts};
use crate::upstream::{assert_follower_mirrors, forwarded_in_this_boot, upstream_section};

/// Host gateways around the QEMU one.
const FLEET: usize = 10;
const SENSOR_PERIOD: Duration = Duration::from_millis(500);
/// How long the outage lasts at least (the guest's power cut and boot happen within it).
const OUTAGE: Duration = Duration::from_secs(20);
const QEMU_ID: &str = "fleet-qemu";
/// Records the guest holds for the link when its power goes.
const BEHIND_AT_CUT: u64 = 50;

/// A metric of the guest's `mqtt` topic, 0 when absent.
fn guest_metric(guest: &Guest, name: &str) -> anyhow::Result<u64> {
    Ok(guest.metric_sum(name, "topic=\"mqtt\"")?.unwrap_or(0))
}

pub fn a_power_cut_during_a_regional_outage_rejoins_the_fleet(
    arch: Arch,
    cluster: &KafkaCluster,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let direct = cluster.bootstrap();
    let dir = TempDir::new("system-fleet")?;
    let mut fleet = Fleet::start(cluster, "sysfleet", FLEET, SENSOR_PERIOD)?;
    let mut everyone: Vec<String> = fleet.ids().to_vec();
    everyone.push(QEMU_ID.to_owned());
    let config = guest_config(
        "",
        &format!("{}{}", upstream_section(cluster, QEMU_ID), status_section()),
    );
    let mut cut_at = None;
    let mut behind_at_cut = 0;
    let mut restored = None;
    let mut caught_up = Vec::new();
    let mut guest_caught_up = Duration::ZERO;
    let step = |stage, guest: &mut Guest| -> anyhow::Result<()> {
        match stage {
            Stage::BeforeCut => {
                // The fleet forwards and every gateway, the guest too, reported ready.
                wait_until(Duration::from_secs(120), "the guest forwarding", || {
                    Ok(forwarded_in_this_boot(guest)? >= 20)
                })?;
                fleet.wait_forwarding(Duration::from_secs(120))?;
                wait_all_ready(&direct, &everyone, None, Duration::from_secs(90))?;
                // The regional outage; the guest goes on ingesting until records wait.
                cut_at = Some(Instant::now());
                cluster.cut_clients();
                fleet.wait_failing(Duration::from_secs(60))?;
                wait_until(Duration::from_secs(60), "the guest failing", || {
                    Ok(guest_metric(guest, "tern_upstream_failing")? > 0)
                })?;
                wait_until(
                    Duration::from_secs(60),
                    "records waiting in the guest",
                    || {
                        behind_at_cut = guest_metric(guest, "tern_upstream_records_behind")?;
                        Ok(behind_at_cut >= BEHIND_AT_CUT)
                    },
                )?;
                Ok(())
            }
            Stage::BeforeShutdown => {
                // Booted again within the outage: the link is still down for it.
                wait_until(
                    Duration::from_secs(60),
                    "the rebooted guest failing",
                    || Ok(guest_metric(guest, "tern_upstream_failing")? > 0),
                )?;
                let cut = cut_at.unwrap_or_else(Instant::now);
                // The outage's length is the scenario, not a wait for something to happen.
                std::thread::sleep(OUTAGE.saturating_sub(cut.elapsed()));
                let back = Instant::now();
                restored = Some(back);
                cluster.restore_clients();
                (caught_up, guest_caught_up) =
                    fleet.wait_drained_with(back, Duration::from_secs(180), || {
                        Ok(guest_metric(guest, "tern_upstream_records_behind")? == 0
                            && guest_metric(guest, "tern_upstream_failing")? == 0)
                    })?;
                let drained_ms = now_ms();
                wait_all_ready(
                    &direct,
                    &everyone,
                    Some(drained_ms),
                    Duration::from_secs(60),
                )
            }
        }
    };
    let outcome = run_cuts(arch, "fleet", &config, 1, dir.path(), step)?;
    assert_eq!(outcome.lost, 0, "acknowledged messages lost: {outcome:?}");
    assert_eq!(outcome.duplicated, 0, "messages stored twice: {outcome:?}");
    let mirrored = assert_follower_mirrors(cluster, &outcome.data, QEMU_ID, true)?;
    let acked = fleet.stop_sensors()?;
    fleet.wait_forwarded(Duration::from_secs(120))?;
    let records = fleet.check_upstream(&direct, &acked)?;
    let outage = match (cut_at, restored) {
        (Some(cut), Some(back)) => back.duration_since(cut),
        _ => Duration::ZERO,
    };
    let last = caught_up.iter().max().copied().unwrap_or_default();
    eprintln!(
        "system {} fleet: {FLEET} host gateways and {QEMU_ID} cut off for {outage:.1?}; {QEMU_ID} power-cut with {behind_at_cut} records waiting for the link, booted again in {:.1?} within the outage; after the return the host fleet caught up within {last:.1?} and {QEMU_ID} within {guest_caught_up:.1?}; {QEMU_ID}: acknowledged {}, lost {}, {mirrored} records in its follower exactly once and in order; host fleet: {records} acknowledged readings upstream exactly once; every gateway ready again on the status topic; {:.0?} in all",
        arch.name(),
        outcome.boot_times.last().copied().unwrap_or_default(),
        outcome.acked,
        outcome.lost,
        started.elapsed()
    );
    for g in fleet.gateways.iter_mut() {
        g.stop()?;
    }
    Ok(())
}
