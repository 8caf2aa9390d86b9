//! The sensor firmware, booted in QEMU for each board, publishing to a real MQTT broker
//! (rumqttd, whose v4 protocol server the gateway builds on) through a loopback relay that cuts
//! the connection once mid-run: readings arrive decoded through the shared schema, in order, with
//! no gap; a `halt` command ends QEMU with status 0; the defmt log decodes.
//!
//! The gateway itself (`tern serve`, with a restart) is the e2e suite's job; this suite pins the
//! firmware against the broker library and gives that test its harness (`tern_tests::firmware`).

mod relay;

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rumqttd::local::{LinkRx, LinkTx};
use rumqttd::{Broker, Config, Notification};
use tern_shared::Reading;
use tern_tests::TempDir;
use tern_tests::firmware::{self, Board, Qemu};

/// Readings to collect before sending `halt`; the cut happens after `CUT_AFTER` of them.
const READINGS: u32 = 15;
const CUT_AFTER: usize = 5;

/// Starts an in-process rumqttd with one MQTT 3.1.1 listener on a free loopback port.
fn start_broker() -> anyhow::Result<(SocketAddr, LinkTx, LinkRx)> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let config: Config = toml::from_str(&format!(
        r#"
        id = 0
        [router]
        id = 0
        max_connections = 16
        max_outgoing_packet_count = 200
        max_segment_size = 1048576
        max_segment_count = 4
        [v4.1]
        name = "v4-1"
        listen = "127.0.0.1:{port}"
        next_connection_delay_ms = 1
        [v4.1.connections]
        connection_timeout_ms = 60000
        max_payload_size = 4096
        max_inflight_count = 100
        dynamic_filters = true
        "#
    ))
    .context("rumqttd config")?;
    let mut broker = Broker::new(config);
    let (tx, rx) = broker.link("tern-tests").context("rumqttd link")?;
    std::thread::spawn(move || {
        // The broker runs until the test process ends; its error, if any, shows as missing
        // readings below.
        let _ = broker.start();
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            bail!("rumqttd did not listen on {addr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((addr, tx, rx))
}

/// Collects readings of `device_id` until `count` distinct ones arrived, cutting the relay's
/// connection after `CUT_AFTER`. A resent reading (its PUBACK was lost) shows up twice in a row
/// and is kept once: QoS 1 is at least once.
fn collect(
    rx: &mut LinkRx,
    relay: &relay::Relay,
    device_id: u32,
    count: u32,
) -> anyhow::Result<Vec<u32>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut sequences: Vec<u32> = Vec::new();
    while sequences.len() < count as usize {
        if Instant::now() > deadline {
            bail!(
                "only {} readings before the deadline: {sequences:?}",
                sequences.len()
            );
        }
        let Ok(Some(Notification::Forward(forward))) = rx.recv_deadline(deadline) else {
            continue;
        };
        let reading = Reading::decode(&forward.publish.payload)
            .with_context(|| format!("payload {:?}", forward.publish.payload))?;
        assert_eq!(reading.device_id, device_id);
        assert_eq!(reading.dropped, 0, "the backlog overflowed: {reading:?}");
        if sequences.last() != Some(&reading.sequence) {
            sequences.push(reading.sequence);
        }
        if sequences.len() == CUT_AFTER && relay.connections() == 1 {
            relay.cut();
        }
    }
    Ok(sequences)
}

fn readings_arrive_in_order_across_a_cut(board: Board) -> anyhow::Result<()> {
    let elf = firmware::build(board)?;
    let (broker, mut tx, mut rx) = start_broker()?;
    let device_id = board.device_id();
    tx.subscribe(format!("sensors/{device_id}/reading"))?;
    let relay = relay::Relay::start(broker)?;
    let dir = TempDir::new(board.name())?;
    let mut qemu = Qemu::boot(board, &elf, relay.addr(), dir.path())?;

    let sequences = collect(&mut rx, &relay, device_id, READINGS)?;
    tx.publish(format!("sensors/{device_id}/command"), "halt")?;
    let status = qemu.wait_exit(Duration::from_secs(60))?;
    let log = qemu.log()?;

    assert_eq!(sequences, (0..READINGS).collect::<Vec<_>>());
    assert!(status.success(), "QEMU exited with {status}; log:\n{log}");
    assert!(relay.connections() >= 2, "the firmware never reconnected");
    for expected in [
        format!(
            "tern firmware {} on {}",
            env!("CARGO_PKG_VERSION"),
            board.name()
        ),
        "connected to broker".to_owned(),
        "not acknowledged".to_owned(),
        format!("reading {} acknowledged", READINGS - 1),
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
        "no reconnect in the defmt log:\n{log}"
    );
    Ok(())
}

#[test]
fn lm3s6965evb_readings_reach_the_broker_in_order() -> anyhow::Result<()> {
    readings_arrive_in_order_across_a_cut(Board::Lm3s6965evb)
}

#[test]
fn mps2_an385_readings_reach_the_broker_in_order() -> anyhow::Result<()> {
    readings_arrive_in_order_across_a_cut(Board::Mps2An385)
}
