//! The shipped Raspberry Pi configurations (`boards/raspberry-pi-{3,4}/tern.toml`) with the
//! shipped firmware. For each, `tern serve --config` runs the file as shipped except for three
//! things a test must change: the password file path is rewritten to a temp file in the text,
//! and `--data-dir`, `--mqtt-listen 127.0.0.1:0` (in place of `0.0.0.0:1883`) and
//! `--admin-listen 127.0.0.1:0` (in place of the fixed 9090, which parallel tests would share)
//! are given on the command line, as an operator overrides them. Devices are provisioned with
//! `tern passwd` and built with the same pair (`TERN_DEVICE_ID`, `TERN_DEVICE_PASSWORD`). Then:
//! an anonymous firmware is refused (CONNACK 5, in its own defmt log), a provisioned firmware's
//! readings reach the log gap-free from 0 and it obeys an operator's `halt`, and a provisioned
//! device publishing under another device's id is refused (MQTT 5: "not authorized"; 3.1.1: the
//! PUBACK without a code) and nothing of it is stored.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use tern_tests::firmware::{self, Board, Device, Qemu};
use tern_tests::{
    Gateway, ServeOptions, TempDir, dump_json, tern_passwd, wait_until, workspace_root,
};

const GATEWAYS: [&str; 2] = ["raspberry-pi-3", "raspberry-pi-4"];
/// The lines of the shipped files this test replaces; each must be there exactly once.
const PASSWORD_FILE: &str = "password_file = \"/etc/tern/passwd\"";
const SHIPPED_LISTENERS: [&str; 2] = ["listen = \"0.0.0.0:1883\"", "listen = \"127.0.0.1:9090\""];
/// Readings of the provisioned device the log must hold before `halt`.
const READINGS: usize = 5;

#[test]
fn shipped_pi_configs_admit_provisioned_firmware_only_under_its_own_id() -> anyhow::Result<()> {
    // One anonymous device on one board, one provisioned on the other; built once for both
    // configurations.
    let anonymous = Device::anonymous(1);
    let provisioned = Device::provisioned(2, "pw of device 2");
    let anonymous_elf = firmware::build_device(Board::Lm3s6965evb, &anonymous)?;
    let provisioned_elf = firmware::build_device(Board::Mps2An385, &provisioned)?;
    for gateway in GATEWAYS {
        check_gateway(
            gateway,
            (&anonymous, &anonymous_elf),
            (&provisioned, &provisioned_elf),
        )
        .with_context(|| format!("boards/{gateway}/tern.toml"))?;
    }
    Ok(())
}

fn check_gateway(
    board: &str,
    (anonymous, anonymous_elf): (&Device, &Path),
    (device, device_elf): (&Device, &Path),
) -> anyhow::Result<()> {
    let dir = TempDir::new(&format!("boards-{board}"))?;
    let passwd = dir.path().join("passwd");
    device.provision(&passwd)?;
    // Device 1's login exists too: the forger below is a real, provisioned device.
    Device::provisioned(1, "pw of device 1").provision(&passwd)?;
    tern_passwd(&passwd, "operator", "operator pw")?;
    let config = dir.path().join("tern.toml");
    std::fs::write(&config, shipped_config(board, &passwd)?)?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        ..ServeOptions::default()
    };
    let data = dir.path().join("data");
    let mut gateway = Gateway::start(&data, &options)?;

    let refused = Qemu::boot(Board::Lm3s6965evb, anonymous_elf, gateway.mqtt, dir.path())?;
    let mut admitted = Qemu::boot(Board::Mps2An385, device_elf, gateway.mqtt, dir.path())?;
    let mut log = String::new();
    wait_until(
        Duration::from_secs(60),
        "the anonymous device's refusal",
        || {
            log = refused.log()?;
            Ok(log.contains("connect failed (Refused { code: 5 })"))
        },
    )
    .with_context(|| format!("its log:\n{log}"))?;
    let mut count = 0;
    wait_until(
        Duration::from_secs(60),
        "the provisioned device's readings",
        || {
            count = sequences(&data, device.id)?.len();
            Ok(count >= READINGS)
        },
    )
    .with_context(|| format!("{count} readings arrived"))?;

    forge_readings(gateway.mqtt.port(), &data, device)?;

    let halt = mosquitto_pub(
        gateway.mqtt.port(),
        "mqttv311",
        "operator",
        "operator pw",
        &format!("sensors/{}/command", device.id),
        "halt",
    )?;
    ensure!(halt.status.success(), "operator's halt: {}", text(&halt));
    let status = admitted.wait_exit(Duration::from_secs(30))?;
    let log = admitted.log()?;
    ensure!(status.success(), "QEMU exited with {status}; log:\n{log}");
    ensure!(log.contains("logs in as its device id"), "boot line: {log}");
    let anonymous_log = refused.log()?;
    ensure!(
        !anonymous_log.contains("connected to broker"),
        "the anonymous device {} got in: {anonymous_log}",
        anonymous.id
    );
    drop(refused);
    gateway.stop()?;

    let sequences = sequences(&data, device.id)?;
    let expected: Vec<u32> = (0..).take(sequences.len()).collect();
    ensure!(
        sequences == expected,
        "readings not gap-free from 0: {sequences:?}"
    );
    Ok(())
}

/// The shipped file with its password file at `passwd`; the listeners are overridden on the
/// command line. Fails if the file no longer has the lines this test replaces.
fn shipped_config(board: &str, passwd: &Path) -> anyhow::Result<String> {
    let path = workspace_root()
        .join("boards")
        .join(board)
        .join("tern.toml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    for line in SHIPPED_LISTENERS.iter().chain([&PASSWORD_FILE]) {
        ensure!(
            text.lines().filter(|l| l.trim() == *line).count() == 1,
            "{} lacks `{line}`",
            path.display()
        );
    }
    Ok(text.replace(
        PASSWORD_FILE,
        &format!("password_file = {:?}", passwd.display().to_string()),
    ))
}

/// Device 1 (a valid login) publishes a reading under device 2's id with MQTT 5 and 3.1.1:
/// refused by the `sensors/%u/#` ACL, and nothing of it is in the log.
fn forge_readings(port: u16, data: &Path, victim: &Device) -> anyhow::Result<()> {
    let topic = format!("sensors/{}/reading", victim.id);
    for version in ["mqttv5", "mqttv311"] {
        let forged = mosquitto_pub(port, version, "1", "pw of device 1", &topic, "forged")?;
        let message = text(&forged).to_lowercase();
        if version == "mqttv5" {
            ensure!(message.contains("not authorized"), "{version}: {message}");
        } else {
            // 3.1.1 has no refusal code: the PUBACK comes, the message is dropped.
            ensure!(forged.status.success(), "{version}: {message}");
        }
    }
    // mosquitto_pub exits after its PUBACK, which follows the refusal: nothing can land later.
    let stored = dump_json(data, "mqtt", &[])?;
    ensure!(
        !stored.iter().any(|record| record["value"] == "forged"),
        "a forged reading was stored"
    );
    Ok(())
}

/// The sequence numbers of `device_id`'s readings in the log, in log order, a QoS 1 resend's
/// repeat removed.
fn sequences(data: &Path, device_id: u32) -> anyhow::Result<Vec<u32>> {
    let topic = format!("sensors/{device_id}/reading");
    let mut sequences = Vec::new();
    for record in dump_json(data, "mqtt", &["--decode", "reading"])? {
        if record["key"] != topic.as_str() {
            continue;
        }
        let sequence = record["reading"]["sequence"]
            .as_u64()
            .and_then(|s| u32::try_from(s).ok())
            .with_context(|| format!("no reading in {record}"))?;
        if sequences.last() != Some(&sequence) {
            sequences.push(sequence);
        }
    }
    Ok(sequences)
}

/// Debian's mosquitto_pub, QoS 1, logged in as `user`.
fn mosquitto_pub(
    port: u16,
    version: &str,
    user: &str,
    password: &str,
    topic: &str,
    message: &str,
) -> anyhow::Result<Output> {
    Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-V",
            version,
            "-q",
            "1",
        ])
        .args(["-u", user, "-P", password, "-t", topic, "-m", message])
        .stdin(Stdio::null())
        .output()
        .context("cannot run mosquitto_pub (scripts/ensure-deps.sh installs it)")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
