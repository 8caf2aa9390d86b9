//! Password logins under attack, against the real binary with a file written by `tern
//! passwd`: a flood of wrong passwords from many addresses leaves tern's memory bounded
//! (argon2 runs one verification at a time in one reused buffer), one address that keeps
//! failing is made to wait, and the log names the client id, never the attempted username.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, TempDir, tern_passwd, wait_until};

use super::mqtt_abuse::{field, gateway};

fn gateway_with_users(dir: &TempDir) -> anyhow::Result<Gateway> {
    let file = dir.path().join("passwd");
    tern_passwd(&file, "alice", "wonderland")?;
    let config = format!(
        "[mqtt]\nconnect_timeout = \"60s\"\n[mqtt.auth]\npassword_file = \"{}\"\nallow_anonymous = false\n",
        file.display()
    );
    gateway(dir, &config)
}

/// Sends an MQTT 5 CONNECT with a username and password from `local`; returns the CONNACK's
/// reason code.
fn login(
    mqtt: SocketAddr,
    local: IpAddr,
    id: &str,
    user: &str,
    password: &str,
) -> anyhow::Result<u8> {
    let mut body = Vec::new();
    field(&mut body, b"MQTT");
    body.extend_from_slice(&[5, 0xc2, 0, 60, 0]);
    field(&mut body, id.as_bytes());
    field(&mut body, user.as_bytes());
    field(&mut body, password.as_bytes());
    let mut client = RawClient::open_from(local, mqtt, true)?;
    client.set_timeout(Duration::from_secs(60))?;
    client.write_packet(0x10, &body)?;
    let (first, connack) = client.read_packet()?;
    if first != 0x20 {
        bail!("expected CONNACK, got {first:#x}");
    }
    connack.get(1).copied().context("short CONNACK")
}

/// A `/proc/PID/status` field in KiB.
pub(crate) fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| {
            line.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

#[test]
fn a_flood_of_wrong_passwords_from_many_addresses_keeps_memory_bounded() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-flood")?;
    let mut gateway = gateway_with_users(&dir)?;
    let pid = gateway.pid().context("no pid")?;
    // One good login first, so the verifier and its buffer exist before the baseline.
    assert_eq!(
        login(
            gateway.mqtt,
            [127, 0, 0, 1].into(),
            "warm",
            "alice",
            "wonderland"
        )?,
        0
    );
    let before = status_kib(pid, "VmRSS:")?;
    let mqtt = gateway.mqtt;
    let flood: Vec<_> = (0..60u8)
        .map(|i| {
            let local: IpAddr = [127, 0, 1, 10 + i].into();
            std::thread::spawn(move || -> anyhow::Result<u8> {
                login(
                    mqtt,
                    local,
                    &format!("flood-{i}"),
                    "alice",
                    "not-the-password",
                )
            })
        })
        .collect();
    for attacker in flood {
        let code = attacker
            .join()
            .map_err(|_| anyhow::anyhow!("attacker panicked"))??;
        assert_eq!(code, 0x86, "a wrong password is answered 0x86");
    }
    let peak = status_kib(pid, "VmHWM:")?;
    let after = status_kib(pid, "VmRSS:")?;
    eprintln!("RSS before {before} KiB, peak {peak} KiB, after {after} KiB");
    assert!(
        peak.saturating_sub(before) < 40 * 1024,
        "60 failed logins raised the peak RSS from {before} to {peak} KiB"
    );
    gateway.stop()
}

#[test]
fn failed_logins_back_off_per_address_and_never_log_the_username() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-backoff")?;
    let mut gateway = gateway_with_users(&dir)?;
    let me: IpAddr = [127, 0, 0, 1].into();
    let typo = "alice-typo-wonderlan";
    let mut codes = Vec::new();
    let started = Instant::now();
    for i in 0..10 {
        codes.push(login(
            gateway.mqtt,
            me,
            &format!("backoff-{i}"),
            typo,
            "wonderland",
        )?);
    }
    let took = started.elapsed();
    assert_eq!(
        codes[..3],
        [0x86; 3],
        "the first failures are answered: {codes:?}"
    );
    if took < Duration::from_millis(900) {
        assert_eq!(
            codes[3..],
            [0x9f; 7],
            "then the address must wait: {codes:?}"
        );
    }
    assert!(
        codes.contains(&0x9f),
        "no attempt was made to wait: {codes:?}"
    );
    // Another address is not affected, and the right password works once the wait is over.
    assert_eq!(
        login(
            gateway.mqtt,
            [127, 0, 2, 1].into(),
            "elsewhere",
            "alice",
            "wonderland"
        )?,
        0
    );
    wait_until(Duration::from_secs(10), "alice to be let in again", || {
        Ok(login(gateway.mqtt, me, "alice-again", "alice", "wonderland")? == 0)
    })?;
    let throttled = gateway.metric_sum("tern_mqtt_logins_throttled_total", "")?;
    assert!(throttled.unwrap_or(0) >= 1, "{throttled:?}");
    gateway.stop()?;
    let lines = gateway.stderr_lines();
    let failures: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("authentication failed"))
        .collect();
    assert!(
        failures.iter().any(|l| l.contains("backoff-0")),
        "{failures:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains(typo)),
        "the attempted username reached the log"
    );
    Ok(())
}
