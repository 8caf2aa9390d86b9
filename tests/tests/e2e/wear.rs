//! The wear figures of `/metrics`: device bytes written (from the data directory's block
//! device, or the process's own count, labelled with its source), the card lifetime projected
//! at that rate, and the wear budget's commit window, against the real binary.

use std::time::Duration;

use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir};

/// The value of the one sample of `name` (labelled or not) on `/metrics`, and its labels.
fn sample(gateway: &Gateway, name: &str) -> anyhow::Result<Option<(String, f64)>> {
    let (status, body) = gateway.admin_get("/metrics")?;
    anyhow::ensure!(status == 200, "/metrics answered {status}");
    Ok(body.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = rest.rsplit_once(' ')?;
        let value = if value == "+Inf" {
            f64::INFINITY
        } else {
            value.parse().ok()?
        };
        (labels.is_empty() || labels.starts_with('{')).then(|| (labels.to_owned(), value))
    }))
}

#[test]
fn device_bytes_written_and_the_projected_card_lifetime_are_reported_and_move() -> anyhow::Result<()>
{
    let dir = TempDir::new("wear-metrics")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let (labels, before) = sample(&gateway, "tern_device_written_bytes_total")?
        .ok_or_else(|| anyhow::anyhow!("no tern_device_written_bytes_total"))?;
    assert!(
        labels.starts_with("{source=\"block-device\",device=\"")
            || labels == "{source=\"process\"}",
        "source label: {labels}"
    );
    let mut client = RawClient::connect(gateway.mqtt, "wear-metrics", 60, true, false)?;
    let payloads = vec![vec![7u8; 100]; 200];
    let acked = client.publish_batch_qos1("wear/metrics", &payloads)?;
    assert_eq!(acked.len(), 200, "every publish stored");
    gateway.wait_metric(
        "tern_log_records_total",
        "",
        "the 200 records to be stored",
        Duration::from_secs(10),
        |n| n.is_some_and(|n| n >= 200),
    )?;
    let mut after = before;
    tern_tests::wait_until(
        Duration::from_secs(60),
        "device bytes written to move",
        || {
            after = sample(&gateway, "tern_device_written_bytes_total")?.map_or(0.0, |s| s.1);
            Ok(after > before)
        },
    )?;
    let (_, rate) = sample(&gateway, "tern_device_write_bytes_per_second")?
        .ok_or_else(|| anyhow::anyhow!("no tern_device_write_bytes_per_second"))?;
    assert!(rate > 0.0, "rate {rate} after {before} -> {after} bytes");
    let (_, years) = sample(&gateway, "tern_card_lifetime_projected_years")?
        .ok_or_else(|| anyhow::anyhow!("no tern_card_lifetime_projected_years"))?;
    assert!(years.is_finite() && years > 0.0, "projected {years} years");
    let (_, budget) = sample(&gateway, "tern_log_wear_budget_bytes_per_second")?
        .ok_or_else(|| anyhow::anyhow!("no tern_log_wear_budget_bytes_per_second"))?;
    assert!((budget - 50_700.0).abs() < 100.0, "default budget {budget}");
    let (_, window) = sample(&gateway, "tern_log_commit_window_seconds")?
        .ok_or_else(|| anyhow::anyhow!("no tern_log_commit_window_seconds"))?;
    assert!((0.010..=0.140).contains(&window), "window {window} s");
    gateway.stop()
}
