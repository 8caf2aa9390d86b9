//! Retained messages against the real binary: the count limit refuses new topics with MQTT 5's
//! 0x97, and the retained messages of a new subscription go out through the same in-flight
//! window as every other delivery, so neither an MQTT 5 Receive Maximum nor tern's memory is
//! overrun by subscribers that do not acknowledge or do not read.

use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::TempDir;
use tern_tests::raw_mqtt::RawClient;

use super::mqtt_abuse::{gateway, wire_u16};
use super::mqtt_abuse_logins::status_kib;

/// Publishes `count` retained QoS 1 messages of `size` bytes on `{prefix}/{i}`; returns each
/// PUBACK's reason code.
fn retain(
    client: &mut RawClient,
    prefix: &str,
    count: u16,
    size: usize,
) -> anyhow::Result<Vec<u8>> {
    let payload = vec![b'r'; size];
    let mut codes = Vec::new();
    for i in 1..=count {
        client.publish(&format!("{prefix}/{i:05}"), &payload, 1, i, true)?;
        let (first, body) = client.read_packet()?;
        if first != 0x40 {
            bail!("expected PUBACK, got {first:#x}");
        }
        codes.push(body.get(2).copied().unwrap_or(0));
    }
    Ok(codes)
}

#[test]
fn retained_messages_past_the_limit_are_refused_with_quota_exceeded() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-retained-limit")?;
    let mut gateway = gateway(&dir, "[mqtt]\nmax_retained = 20\n")?;
    let mut client = RawClient::connect(gateway.mqtt, "retainer", 60, true, true)?;
    let codes = retain(&mut client, "lim", 25, 10)?;
    assert_eq!(codes[..20], [0; 20], "{codes:?}");
    assert_eq!(codes[20..], [0x97; 5], "{codes:?}");
    // Replacing or clearing a retained topic is still allowed at the limit.
    assert_eq!(retain(&mut client, "lim", 1, 3)?, [0]);
    let refused = gateway.metric_sum("tern_mqtt_retained_refused_total", "")?;
    assert_eq!(refused, Some(5));
    assert_eq!(
        gateway.metric_sum("tern_mqtt_retained_messages", "")?,
        Some(20)
    );
    gateway.stop()?;
    let logged = gateway
        .stderr_lines()
        .iter()
        .any(|l| l.contains("retained message refused"));
    assert!(logged, "no log line for a refused retained message");
    Ok(())
}

#[test]
fn retained_messages_on_subscribe_respect_receive_maximum_and_memory() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-retained-window")?;
    // 200 × 64 KiB fit the default max_retained_bytes (16 MiB).
    let mut gateway = gateway(&dir, "")?;
    let pid = gateway.pid().context("no pid")?;
    let empty = status_kib(pid, "VmRSS:")?;
    let mut publisher = RawClient::connect(gateway.mqtt, "retainer", 60, true, true)?;
    let codes = retain(&mut publisher, "big", 200, 64 * 1024)?;
    assert!(codes.iter().all(|c| *c == 0), "{codes:?}");
    // The messages stay in the log; memory holds their topics.
    let full = status_kib(pid, "VmRSS:")?;
    eprintln!("RSS {empty} KiB before 200 x 64 KiB retained messages, {full} KiB after");
    assert!(
        full.saturating_sub(empty) < 8 * 1024,
        "12.5 MiB of retained messages raised RSS from {empty} to {full} KiB"
    );

    // An MQTT 5 client with Receive Maximum 10 gets 10 unacknowledged QoS 1 publishes, and
    // one more for each PUBACK.
    let (mut slow, _) =
        RawClient::connect_with(gateway.mqtt, "rm10", 60, true, Some(&[0x21, 0, 10]))?;
    assert_eq!(slow.subscribe("big/#", 1, 1)?, 1);
    slow.set_timeout(Duration::from_secs(3))?;
    let mut unacked = Vec::new();
    while let Ok(received) = slow.next_publish_unacked() {
        unacked.push(received.pkid.context("QoS 1 without packet id")?);
        if unacked.len() > 10 {
            break;
        }
    }
    assert_eq!(
        unacked.len(),
        10,
        "publishes in flight beyond Receive Maximum 10"
    );
    slow.write_packet(0x40, &wire_u16(unacked[0]))?;
    assert!(
        slow.next_publish_unacked().is_ok(),
        "a PUBACK makes room for one more"
    );
    assert!(slow.next_publish_unacked().is_err(), "and only one");
    drop(slow);

    // Three `#` subscribers that never read hold tern's memory to their windows.
    let before = status_kib(pid, "VmRSS:")?;
    let sent_before = gateway
        .metric_sum("tern_mqtt_publishes_sent_total", "")?
        .unwrap_or(0);
    let mut idle = Vec::new();
    for i in 0..3 {
        let mut client = RawClient::connect(gateway.mqtt, &format!("deaf-{i}"), 60, true, false)?;
        assert_eq!(client.subscribe("#", 1, 1)?, 1);
        idle.push(client);
    }
    // The window of each: `max_queued_bytes` (1 MiB) of 64 KiB messages unacknowledged.
    gateway.wait_metric(
        "tern_mqtt_publishes_sent_total",
        "",
        "each deaf subscriber's window to fill",
        Duration::from_secs(30),
        |sent| sent.unwrap_or(0) >= sent_before + 3 * 16,
    )?;
    let after = status_kib(pid, "VmRSS:")?;
    eprintln!("RSS {before} KiB before three deaf subscribers, {after} KiB after");
    assert!(
        after.saturating_sub(before) < 16 * 1024,
        "three deaf subscribers of 200 × 64 KiB retained raised RSS from {before} to {after} KiB"
    );
    drop(idle);
    gateway.stop()
}
