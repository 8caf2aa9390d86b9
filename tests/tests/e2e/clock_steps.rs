//! The clock of a Pi without a real-time clock, end to end: `tern serve` runs under libfaketime
//! (`LD_PRELOAD`, Debian's `faketime` package) with its wall clock in 2020 or five years ahead,
//! then restarts on the real clock. No sealed segment may be deleted by age before it has been
//! held `retention.age` of real time, and future-dated segments must still go once they have.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir, wait_until};

/// libfaketime's preload library, from Debian's `faketime` package.
fn libfaketime() -> anyhow::Result<PathBuf> {
    let lib = Path::new("/usr/lib");
    let found = std::fs::read_dir(lib)?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"))
        .chain([lib.join("faketime/libfaketime.so.1")])
        .find(|path| path.exists());
    found.context("libfaketime.so.1 not found: install Debian's faketime (scripts/ensure-deps.sh)")
}

/// Writes `tern.toml` with small segments, age retention `age` and no commit window (the wear
/// budget off too, or it would stretch a trickle's window and the 200 publishes with it).
fn options(dir: &Path, age: &str) -> anyhow::Result<ServeOptions> {
    let config = dir.join("tern.toml");
    std::fs::write(
        &config,
        format!(
            "[log]\nsegment_bytes = \"16KiB\"\n[log.flush]\nmin_delay = \"0ms\"\n\
             [log.flush.wear]\nenabled = false\n\
             [log.retention]\nage = \"{age}\"\n"
        ),
    )?;
    Ok(ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        ..ServeOptions::default()
    })
}

/// Starts tern with its wall clock faked by `faketime` (libfaketime's `FAKETIME` syntax); the
/// monotonic clock stays real.
fn start_faked(data: &Path, options: &ServeOptions, faketime: &str) -> anyhow::Result<Gateway> {
    let lib = libfaketime()?;
    let lib = lib.display().to_string();
    let env = [
        ("LD_PRELOAD", lib.as_str()),
        ("FAKETIME", faketime),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    Gateway::start_with_env(data, options, &env)
}

/// Publishes 200 QoS 1 messages of 1 KB (a dozen 16 KiB segments); returns when the last was
/// acknowledged.
fn publish(gateway: &Gateway) -> anyhow::Result<Instant> {
    let mut client = RawClient::connect(gateway.mqtt, "clock-writer", 60, true, true)?;
    let body = "c".repeat(1000);
    for pkid in 1..=200u16 {
        let payload = format!("{pkid:04}-{body}");
        let reason = client.publish_qos1("clock/a", payload.as_bytes(), pkid)?;
        if reason != 0 {
            bail!("publish {pkid} refused with {reason:#x}");
        }
    }
    Ok(Instant::now())
}

/// Waits until age retention deletes the oldest segment of topic `mqtt`, failing if that
/// happens before `age` has passed since `last_write`.
fn deleted_only_after(
    gateway: &mut Gateway,
    last_write: Instant,
    age: Duration,
) -> anyhow::Result<Duration> {
    let mut held = Duration::ZERO;
    let waited = wait_until(age + Duration::from_secs(60), "age retention", || {
        let start = gateway.metric_sum("tern_log_start_offset", "topic=\"mqtt\"")?;
        held = last_write.elapsed();
        match start {
            Some(start) if start > 0 && held < age => {
                bail!("segments deleted after {held:?} of real time (retention.age {age:?})")
            }
            Some(start) => Ok(start > 0),
            None => Ok(false),
        }
    });
    waited.with_context(|| format!("recent log: {:#?}", gateway.recent_log(20)))?;
    Ok(held)
}

#[test]
fn records_written_in_2020_are_deleted_by_age_only_after_being_held_that_long() -> anyhow::Result<()>
{
    const AGE: Duration = Duration::from_secs(60);
    let dir = TempDir::new("clock-2020")?;
    let data = dir.path().join("data");
    let options = options(dir.path(), "60s")?;
    let mut gateway = start_faked(&data, &options, "@2020-01-01 00:00:00")?;
    let unsynchronised = gateway.metric_sum("tern_clock_unsynchronised", "")?;
    let last_write = publish(&gateway)?;
    let said = gateway
        .stderr_lines()
        .iter()
        .any(|line| line.contains("WARN") && line.contains("not synchronised"));
    gateway.stop()?;

    let mut gateway = Gateway::start(&data, &options)?;
    let held = deleted_only_after(&mut gateway, last_write, AGE)?;
    assert_eq!(
        unsynchronised,
        Some(1),
        "a clock in 2020 is reported as not synchronised"
    );
    assert!(said, "a log line says the clock is not synchronised");
    assert_eq!(
        gateway.metric_sum("tern_clock_unsynchronised", "")?,
        Some(0),
        "the real clock is synchronised"
    );
    eprintln!("2020 segments deleted after {held:?} of real time");
    gateway.stop()?;
    Ok(())
}

#[test]
fn segments_dated_years_ahead_are_deleted_once_held_the_age() -> anyhow::Result<()> {
    const AGE: Duration = Duration::from_secs(20);
    let dir = TempDir::new("clock-ahead")?;
    let data = dir.path().join("data");
    let options = options(dir.path(), "20s")?;
    let mut gateway = start_faked(&data, &options, "+5y")?;
    let last_write = publish(&gateway)?;
    gateway.stop()?;

    let mut gateway = Gateway::start(&data, &options)?;
    let held = deleted_only_after(&mut gateway, last_write, AGE)?;
    assert!(
        gateway.metric_sum("tern_clock_steps_total", "")? >= Some(1),
        "the step back from the previous run's clock is counted"
    );
    let said = gateway
        .stderr_lines()
        .iter()
        .any(|line| line.contains("WARN") && line.contains("clock step"));
    assert!(said, "a log line says what tern did about the step");
    eprintln!("future-dated segments deleted after {held:?} of real time");
    gateway.stop()?;
    Ok(())
}
