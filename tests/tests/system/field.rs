//! The field in a box: both firmware boards in `qemu-system-arm` log in with their own
//! build-time credentials to the QEMU gateway (through the host's loopback forward), the gateway
//! forwards to the real Kafka cluster and its power is cut while they publish. Afterwards each
//! device's readings are in the edge log and in Kafka gap-free from 0 and in order, with no
//! reading dropped at the device, every reading the device saw acknowledged (its defmt log) is
//! there, and Kafka holds the edge log exactly once.
//!
//! The datacenter talks back: before one of the cuts, each device gets a command produced to
//! the fleet's command topic with kcat (`period 900 <tag>`, to `sensors/{id}/command`), and the
//! gateway's power is cut at a point of their way the seed picks, each reached by a signal
//! (just produced, one or both stored, one applied: `COMMAND_PHASES`). Afterwards each board applied its command exactly
//! once (its defmt log: one `applied` line; a redelivery shows as `already applied`), its reply
//! (`sensors/{id}/reply`, routed to the edge topic `replies`) reached Kafka, and the command's
//! stored copy reached `tern.gw-field.commands` once with a `delivered` outcome from the board's
//! client id.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use tern_tests::commands::{self, Cmd};
use tern_tests::firmware::{self, Board, Device, Qemu};
use tern_tests::system::{Arch, Forward, Guest, SdCard, cross_tern, guest_config};
use tern_tests::{KafkaCluster, TempDir, TestRng, wait_until};

use crate::readings::Readings;
use crate::upstream::{assert_follower_mirrors, follower_topic, upstream_section, wait_forwarded};

/// Power cuts while the devices publish.
const FIELD_CUTS: usize = 3;
/// Readings each device must have had acknowledged (by its own defmt log) at the end.
const READINGS: u32 = 20;
/// The devices' sampling period: their 64-reading backlog then covers 64 s without a gateway,
/// more than a cut, a boot under TCG on a loaded machine (8 to 20 s), the device's backoff (at
/// most 4 s) and a login (argon2 on the emulated gateway, up to 2 s) together.
const PERIOD_MS: u32 = 1_000;
/// This gateway's id: its follower topic is apart from the upstream test's on the shared cluster.
const GATEWAY_ID: &str = "gw-field";
/// The cut the commands travel through.
const COMMAND_CUT: usize = 2;
/// The sampling period the commands set.
const COMMANDED_PERIOD_MS: u32 = 900;
/// Where on their way the cut finds the commands (the seed picks one; each is a signal).
const COMMAND_PHASES: [&str; 4] = [
    "just produced",
    "one stored by the gateway",
    "both stored by the gateway",
    "one applied by its board",
];

/// `tern_mqtt_publishes_received_total` of the running boot.
fn received_in_this_boot(guest: &Guest) -> anyhow::Result<u64> {
    Ok(guest
        .metric_sum("tern_mqtt_publishes_received_total", "")?
        .unwrap_or(0))
}

pub fn field_in_a_box(arch: Arch, cluster: &KafkaCluster) -> anyhow::Result<()> {
    let started = Instant::now();
    let test = format!("system {} field", arch.name());
    let mut rng = TestRng::from_env(&test)?;
    let boards = [
        (
            Board::Lm3s6965evb,
            Device::provisioned(11, "lm3s-field-secret").with_period_ms(PERIOD_MS),
        ),
        (
            Board::Mps2An385,
            Device::provisioned(12, "mps2-field-secret").with_period_ms(PERIOD_MS),
        ),
    ];
    let command_topic = format!("field-commands-{}", arch.name());
    cluster.create_topic(&command_topic, 3, 3)?;
    let dir = TempDir::new("system-field")?;
    let passwd = dir.path().join("passwd");
    let mut elves = Vec::new();
    for (board, device) in &boards {
        device.provision(&passwd)?;
        elves.push(firmware::build_device(*board, device)?);
    }
    // The shipped Raspberry Pi configuration's policy: no anonymous devices, each device
    // publishes and subscribes only under sensors/{its username}/.
    let config = guest_config(
        "",
        &format!(
            "[[mqtt.acl]]\ntopic = \"sensors/%u/#\"\naccess = \"readwrite\"\n\n\
             [[route]]\nfilter = \"sensors/+/reply\"\ntopic = \"replies\"\n\n\
             {}value_format = \"reading-json\"\n\
             [upstream.commands]\ntopic = \"{command_topic}\"\nallow = [\"sensors/+/command\"]\n",
            upstream_section(cluster, GATEWAY_ID)
        ),
    )
    .replace(
        "allow_anonymous = true",
        "allow_anonymous = false\npassword_file = \"/sd/passwd\"",
    );
    let passwd_bytes = std::fs::read(&passwd)?;
    let card = SdCard::create(
        &dir.path().join("sd.img"),
        &cross_tern(arch)?,
        &config,
        &[("passwd", &passwd_bytes)],
    )?;
    let console = dir.path().join("console.log");
    let forward = Forward::pick()?;
    let mut guest = Guest::boot(arch, &card, forward, &console)?;
    let mut devices = Vec::new();
    for ((board, _), elf) in boards.iter().zip(&elves) {
        devices.push(Qemu::boot(*board, elf, forward.mqtt, dir.path())?);
    }
    for cut in 1..=FIELD_CUTS {
        let more = 4 + rng.below(12);
        wait_until(
            Duration::from_secs(120),
            "readings received in this boot",
            || Ok(received_in_this_boot(&guest)? >= more),
        )
        .with_context(|| guest.console_tail(20))?;
        if cut == COMMAND_CUT {
            let phase = COMMAND_PHASES[rng.below(COMMAND_PHASES.len() as u64) as usize];
            let tags = send_commands(cluster, &command_topic, &boards)?;
            let stored = || -> anyhow::Result<u64> {
                let count = guest.metric_sum("tern_downstream_commands_total", "")?;
                Ok(count.unwrap_or(0))
            };
            let applied = || -> anyhow::Result<bool> {
                for ((_, device), qemu) in boards.iter().zip(&devices) {
                    if qemu
                        .log()?
                        .contains(&format!("command {} applied", tag_of(device)))
                    {
                        return Ok(true);
                    }
                }
                Ok(false)
            };
            let reached = |phase: &str| -> anyhow::Result<bool> {
                Ok(match phase {
                    "one stored by the gateway" => stored()? >= 1,
                    "both stored by the gateway" => stored()? >= 2,
                    "one applied by its board" => applied()?,
                    _ => true,
                })
            };
            wait_until(Duration::from_secs(120), phase, || reached(phase))
                .with_context(|| guest.console_tail(20))?;
            eprintln!(
                "{test}: commands {tags:?} produced; cut when {phase}, {} stored by then",
                stored().unwrap_or(0)
            );
        }
        guest.power_cut()?;
        eprintln!("{test}: power cut {cut} after {more} readings received in this boot");
        card.check_after_cut(&dir.path().join("after-cut.img"))?;
        guest = Guest::boot(arch, &card, forward, &console)?;
    }
    // The devices log in again after the last boot and publish their backlog and more: each
    // device's own defmt log must report reading READINGS - 1 acknowledged.
    wait_until(
        Duration::from_secs(300),
        "each device's readings acknowledged after the last boot and its command applied",
        || {
            if received_in_this_boot(&guest)? == 0 {
                return Ok(false);
            }
            for ((_, device), qemu) in boards.iter().zip(&devices) {
                let log = qemu.log()?;
                if last_acknowledged(&log).is_none_or(|acked| acked + 1 < READINGS) {
                    return Ok(false);
                }
                if !log.contains(&format!("command {} applied", tag_of(device))) {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .with_context(|| guest.console_tail(20))?;
    let refused = guest
        .metric_sum("tern_mqtt_connections_refused_total", "")?
        .unwrap_or(0);
    let mut acknowledged = BTreeMap::new();
    let mut devices_logs = BTreeMap::new();
    for ((_, device), qemu) in boards.iter().zip(&devices) {
        devices_logs.insert(device.id, qemu.log()?);
        let acked = last_acknowledged(&qemu.log()?)
            .with_context(|| format!("device {}: nothing acknowledged", device.id))?;
        acknowledged.insert(device.id, acked);
    }
    drop(devices);
    // A killed board's last bytes may still be on their way through QEMU's forward: only once
    // the gateway has closed both connections has it read all they sent, so the edge log is
    // final and "nothing behind upstream" means everything.
    wait_until(
        Duration::from_secs(60),
        "the gateway has closed the boards' connections",
        || Ok(guest.metric_sum("tern_mqtt_connections", "")? == Some(0)),
    )?;
    wait_forwarded(&mut guest, Duration::from_secs(180))?;
    wait_until(
        Duration::from_secs(180),
        "every edge topic forwarded (commands, outcomes, replies)",
        || {
            let behind = guest.metric_sum("tern_upstream_records_behind", "")?;
            let failing = guest.metric_sum("tern_upstream_failing", "")?;
            Ok(behind == Some(0) && failing == Some(0))
        },
    )?;
    let commanded = check_commands(cluster, &boards, &devices_logs)?;
    guest.shutdown()?;
    card.check_clean()?;
    let data = SdCard::extract(&card.path, "/data", &dir.path().join("read-back"))?;

    let mut per_device = BTreeMap::new();
    for (_, device) in &boards {
        let readings = Readings::read(&data, device.id)?;
        let acked = acknowledged.get(&device.id).copied().unwrap_or(0);
        readings.assert_gap_free_from_zero(READINGS.max(acked + 1));
        per_device.insert(device.id, readings.distinct());
    }
    let (mirrored, resent) = assert_follower_mirrors_readings(cluster, &data)?;
    eprintln!(
        "{test}: power cuts {FIELD_CUTS}, readings per device {per_device:?} (gap-free from 0, gaps 0, dropped at the device 0, last acknowledged in the defmt logs {acknowledged:?}), {mirrored} records in {} exactly once and in order (duplicates 0; QoS 1 resends of an unacknowledged reading {resent}), connections refused {refused}; commands: {commanded}; {:.0?} in all",
        follower_topic(GATEWAY_ID),
        started.elapsed()
    );
    Ok(())
}

/// The command tag of `device`.
fn tag_of(device: &Device) -> String {
    format!("field-{}", device.id)
}

/// Produces one `period` command for each board's device to `topic`, addressed to this
/// gateway; returns their tags.
fn send_commands(
    cluster: &KafkaCluster,
    topic: &str,
    boards: &[(Board, Device)],
) -> anyhow::Result<Vec<String>> {
    let commands: Vec<Cmd> = boards
        .iter()
        .map(|(_, device)| {
            let value = format!("period {COMMANDED_PERIOD_MS} {}", tag_of(device));
            let mqtt_topic = format!("sensors/{}/command", device.id);
            Cmd::new(GATEWAY_ID, &mqtt_topic, value)
        })
        .collect();
    commands::produce(&cluster.bootstrap(), topic, &commands)?;
    Ok(boards.iter().map(|(_, d)| tag_of(d)).collect())
}

/// Each board applied its command exactly once (`logs`: the devices' defmt logs), its reply
/// reached Kafka (resent by the board if a cut took its PUBACK: the command, acknowledged on
/// receipt, never comes again), and the command's stored copy reached the datacenter once with a
/// `delivered` outcome from the board's client id (the caller waited until every topic was
/// forwarded); returns a summary for the report.
fn check_commands(
    cluster: &KafkaCluster,
    boards: &[(Board, Device)],
    logs: &BTreeMap<u32, String>,
) -> anyhow::Result<String> {
    let mut summary = Vec::new();
    for (_, device) in boards {
        let tag = tag_of(device);
        let log = logs.get(&device.id).map_or("", String::as_str);
        let applied = format!("command {tag} applied: period {COMMANDED_PERIOD_MS} ms");
        let count = log.matches(&applied).count();
        let again = log
            .matches(&format!("command {tag} already applied"))
            .count();
        assert_eq!(
            count, 1,
            "device {}: `{applied}` {count} times in its defmt log",
            device.id
        );
        // A cut that took the reply's PUBACK: the board kept it and resent it after reconnecting.
        let kept = log
            .matches("reply not acknowledged, kept for the next connection")
            .count();
        summary.push(format!(
            "{tag} applied once, redelivered {again}, reply kept across a cut {kept} times"
        ));
    }
    let commands_topic = format!("tern.{GATEWAY_ID}.commands");
    let replies_topic = format!("tern.{GATEWAY_ID}.replies");
    let records = cluster.consume_all(&commands_topic, 0)?;
    let mut replies = Vec::new();
    for partition in 0..cluster.describe_topic(&replies_topic)?.len() as u32 {
        let consumed = cluster.consume_all(&replies_topic, partition)?;
        replies.extend(consumed.into_iter().map(|r| r.value));
    }
    commands_verdict(&records, &replies, boards).map_err(anyhow::Error::msg)?;
    Ok(summary.join(", "))
}

/// Whether `records` (the forwarded commands' topic) hold each board's command once and its
/// `delivered` outcome, and `replies` its reply.
fn commands_verdict(
    records: &[tern_tests::kafka_tools::ConsumedRecord],
    replies: &[String],
    boards: &[(Board, Device)],
) -> Result<(), String> {
    for (_, device) in boards {
        let value = format!("period {COMMANDED_PERIOD_MS} {}", tag_of(device));
        let stored: Vec<_> = records
            .iter()
            .filter(|r| r.value == value && r.header("tern-outcome").is_none())
            .collect();
        let [command] = stored.as_slice() else {
            return Err(format!("{value}: {} stored copies upstream", stored.len()));
        };
        let id = command.header("tern-command").unwrap_or_default();
        let client = format!("tern-{}", device.id);
        let delivered = records.iter().any(|r| {
            r.header("tern-command") == Some(id)
                && r.header("tern-outcome") == Some("delivered")
                && r.header("tern-client-id") == Some(client.as_str())
        });
        if !delivered {
            return Err(format!("{id}: no delivered outcome from {client}"));
        }
        let reply = format!("applied {} period {COMMANDED_PERIOD_MS}", tag_of(device));
        if !replies.contains(&reply) {
            return Err(format!("no reply {reply:?} upstream: {replies:?}"));
        }
    }
    Ok(())
}

/// The highest sequence number the device's defmt log reports acknowledged.
fn last_acknowledged(log: &str) -> Option<u32> {
    log.lines()
        .filter_map(|line| {
            let rest = line.split("reading ").nth(1)?;
            let (sequence, tail) = rest.split_once(' ')?;
            tail.starts_with("acknowledged")
                .then(|| sequence.parse::<u32>().ok())
                .flatten()
        })
        .max()
}

/// Kafka holds the edge log's records one to one (offsets and `tern-offset` contiguous from 0),
/// and each device's readings there (decoded to JSON by `value_format = "reading-json"`) run
/// gap-free from sequence 0 in order, a reading repeated only right after itself (QoS 1's
/// resend when a power cut took the PUBACK); returns the record count and how many resends.
fn assert_follower_mirrors_readings(
    cluster: &KafkaCluster,
    data: &std::path::Path,
) -> anyhow::Result<(usize, usize)> {
    let count = assert_follower_mirrors(cluster, data, GATEWAY_ID, false)?;
    let mut next: BTreeMap<u64, u64> = BTreeMap::new();
    let mut resent = 0;
    for record in cluster.consume_all(&follower_topic(GATEWAY_ID), 0)? {
        let reading: serde_json::Value = serde_json::from_str(&record.value)
            .with_context(|| format!("not a JSON reading: {record:?}"))?;
        let device = reading["device_id"].as_u64().context("no device_id")?;
        let sequence = reading["sequence"].as_u64().context("no sequence")?;
        let expected = next.entry(device).or_insert(0);
        if sequence + 1 == *expected {
            resent += 1; // the reading resent after a lost PUBACK (the edge log checks it is identical)
            continue;
        }
        assert_eq!(
            sequence, *expected,
            "device {device}: gap or reorder in Kafka"
        );
        *expected += 1;
    }
    Ok((count, resent))
}
