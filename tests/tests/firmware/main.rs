//! The sensor firmware end to end through the real gateway, for each board: `tern serve` runs,
//! the firmware boots in `qemu-system-arm` with its UART on the gateway's MQTT port, publishes
//! QoS 1 readings, and the gateway is restarted once mid-run (SIGTERM, then started again on the
//! same data directory and port, where QEMU reconnects). Afterwards the log, read with
//! `tern log dump --decode reading` (so through `tern_shared::Reading::decode`), holds readings
//! 0..N in order with no gap; a `halt` published to the gateway ends QEMU with status 0; and the
//! defmt log decodes with the expected lines.

mod readings;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tern_tests::firmware::{self, Board, Qemu};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir, free_port, wait_until};

use readings::Readings;

/// Readings the log must hold before `halt`; the restart comes after `RESTART_AFTER` of them.
const READINGS: u32 = 15;
const RESTART_AFTER: u32 = 5;

/// Polls the log until `device_id` has at least `count` distinct readings in it.
fn wait_for_readings(data_dir: &Path, device_id: u32, count: u32) -> anyhow::Result<()> {
    let mut found = 0;
    let what = format!("{count} readings of device {device_id} in the log");
    let reached = wait_until(Duration::from_secs(60), &what, || {
        found = Readings::read(data_dir, device_id)?.distinct();
        Ok(found >= count as usize)
    });
    reached.with_context(|| format!("only {found} reached the log"))
}

/// SIGTERM, then the same gateway again: same data directory, same MQTT port.
fn restart(gateway: &mut Gateway, data_dir: &Path, options: &ServeOptions) -> anyhow::Result<()> {
    gateway.stop()?;
    *gateway = Gateway::start(data_dir, options)?;
    Ok(())
}

/// Publishes `halt` on the device's command topic through the gateway.
fn halt(gateway: &Gateway, device_id: u32) -> anyhow::Result<()> {
    let mut client = RawClient::connect(gateway.mqtt, "tern-tests-operator", 30, true, false)?;
    let topic = format!("sensors/{device_id}/command");
    assert_eq!(client.publish_qos1(&topic, b"halt", 1)?, 0, "halt refused");
    client.disconnect()
}

fn readings_reach_the_log_across_a_gateway_restart(board: Board) -> anyhow::Result<()> {
    let elf = firmware::build(board)?;
    let data = TempDir::new(&format!("fw-{}-data", board.name()))?;
    let qemu_dir = TempDir::new(&format!("fw-{}-qemu", board.name()))?;
    let options = ServeOptions {
        mqtt_listen: Some(free_port()?),
        ..ServeOptions::default()
    };
    let device_id = board.device_id();
    let mut gateway = Gateway::start(data.path(), &options)?;
    let mut qemu = Qemu::boot(board, &elf, gateway.mqtt, qemu_dir.path())?;

    wait_for_readings(data.path(), device_id, RESTART_AFTER)?;
    restart(&mut gateway, data.path(), &options)?;
    wait_for_readings(data.path(), device_id, READINGS)?;
    halt(&gateway, device_id)?;
    let status = qemu.wait_exit(Duration::from_secs(30))?;
    let log = qemu.log()?;
    assert!(status.success(), "QEMU exited with {status}; log:\n{log}");
    gateway.stop()?;

    let readings = Readings::read(data.path(), device_id)?;
    readings.assert_gap_free_from_zero(READINGS);
    check_defmt_log(board, &log, readings.last_sequence());
    Ok(())
}

/// The defmt log shows the boot banner, two connections (one per gateway), the lost PUBACK at
/// the restart, the last reading acknowledged, and the halt.
fn check_defmt_log(board: Board, log: &str, last_sequence: u32) {
    for expected in [
        format!(
            "tern firmware {} on {}",
            env!("CARGO_PKG_VERSION"),
            board.name()
        ),
        "connected to broker".to_owned(),
        "not acknowledged".to_owned(),
        format!("reading {last_sequence} acknowledged"),
        "halting on command".to_owned(),
        "stack high-water mark".to_owned(),
    ] {
        assert!(
            log.contains(&expected),
            "defmt log lacks {expected:?}:\n{log}"
        );
    }
    assert!(
        log.matches("connected to broker").count() >= 2,
        "no reconnect after the gateway restart in the defmt log:\n{log}"
    );
}

#[test]
fn lm3s6965evb_readings_reach_the_gateway_log_across_a_restart() -> anyhow::Result<()> {
    readings_reach_the_log_across_a_gateway_restart(Board::Lm3s6965evb)
}

#[test]
fn mps2_an385_readings_reach_the_gateway_log_across_a_restart() -> anyhow::Result<()> {
    readings_reach_the_log_across_a_gateway_restart(Board::Mps2An385)
}
