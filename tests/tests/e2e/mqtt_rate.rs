//! `mqtt.max_publish_rate`: off by default, so a fast local publisher is never held back; when
//! configured, a client publishing faster is paused (tern stops reading from it), and the pause
//! is visible (`tern_mqtt_rate_limited_total`, a WARN naming the client and the limit) while no
//! message is lost. Driven by Debian's `mosquitto_pub`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::{Gateway, ServeOptions, TempDir};

/// Publishes `count` messages (one per line on stdin) with `mosquitto_pub -l`.
fn publish_lines(gateway: &Gateway, args: &[&str], count: usize) -> anyhow::Result<()> {
    let mut child = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
        .args(["-t", "rate/test", "-l"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run mosquitto_pub (Debian's mosquitto-clients)")?;
    let lines: String = (0..count).map(|i| format!("reading {i}\n")).collect();
    child
        .stdin
        .take()
        .context("mosquitto_pub has no stdin")?
        .write_all(lines.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "mosquitto_pub {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

fn gateway(dir: &TempDir, config: &str) -> anyhow::Result<Gateway> {
    let file = dir.path().join("tern.toml");
    std::fs::write(&file, config)?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), file.display().to_string()],
        ..ServeOptions::default()
    };
    Gateway::start(&dir.path().join("data"), &options)
}

#[test]
fn a_client_over_the_configured_rate_is_paused_visibly_and_loses_nothing() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-rate-capped")?;
    let mut gateway = gateway(&dir, "[mqtt]\nmax_publish_rate = 100\n")?;
    // 300 QoS 1 publishes: the first 100 empty the bucket, the rest come at 100/s.
    let args = ["-V", "mqttv5", "-q", "1", "-i", "rate-v5"];
    publish_lines(&gateway, &args, 300)?;
    gateway.wait_metric(
        "tern_mqtt_acks_sent_total",
        "",
        "every publish acknowledged",
        Duration::from_secs(30),
        |acks| acks == Some(300),
    )?;
    let paused = gateway.metric_sum("tern_mqtt_rate_limited_total", "")?;
    assert!(paused.is_some_and(|n| n >= 1), "pauses counted: {paused:?}");
    let warned = gateway.stderr_lines().iter().any(|line| {
        line.contains("mqtt.max_publish_rate") && line.contains("rate-v5") && line.contains("100")
    });
    assert!(
        warned,
        "no WARN names the client: {:#?}",
        gateway.recent_log(20)
    );
    gateway.stop()
}

#[test]
fn by_default_no_client_is_rate_limited() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-rate-default")?;
    let mut gateway = gateway(&dir, "")?;
    // QoS 0 lines are sent as fast as the socket takes them: far beyond 1,000/s, the old cap.
    publish_lines(&gateway, &["-q", "0", "-i", "rate-default"], 5_000)?;
    gateway.wait_metric(
        "tern_mqtt_publishes_received_total",
        "",
        "every publish received",
        Duration::from_secs(30),
        |received| received == Some(5_000),
    )?;
    let paused = gateway.metric_sum("tern_mqtt_rate_limited_total", "")?;
    assert_eq!(paused, Some(0), "{:#?}", gateway.recent_log(20));
    let warned = gateway
        .stderr_lines()
        .iter()
        .any(|line| line.contains("max_publish_rate"));
    assert!(!warned, "{:#?}", gateway.recent_log(20));
    gateway.stop()
}
