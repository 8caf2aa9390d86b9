//! Sensor readings through the real binary: readings published over MQTT are stored as sent and
//! `tern log dump --decode reading` prints them as JSON objects decoded through the shared schema,
//! while a record that is not a reading keeps its raw value and gets a `decode_error` (the dump
//! never stops at it). An unknown `--decode` schema is refused with the known ones.

use std::time::Duration;

use tern_shared::{READING_MAX_ENCODED_LEN, Reading, SensorValues};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir, dump_json, run_tern};

fn reading(sequence: u32) -> Reading {
    Reading {
        device_id: 7,
        sequence,
        uptime_ms: 200 * u64::from(sequence),
        dropped: 0,
        values: SensorValues {
            temperature_centi_c: -125,
            humidity_centi_pct: 4410,
            supply_mv: 3310,
        },
    }
}

fn encoded(reading: &Reading) -> Vec<u8> {
    let mut buf = [0u8; READING_MAX_ENCODED_LEN];
    reading
        .encode(&mut buf)
        .map(|bytes| bytes.to_vec())
        .unwrap_or_default()
}

#[test]
fn dump_decodes_readings_and_flags_records_that_are_not() -> anyhow::Result<()> {
    let dir = TempDir::new("decode")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mut client = RawClient::connect(gateway.mqtt, "sensor-7", 30, true, false)?;
    let topic = "sensors/7/reading";
    assert_eq!(client.publish_qos1(topic, &encoded(&reading(0)), 1)?, 0);
    assert_eq!(client.publish_qos1(topic, &[2, 7, 1, 0], 2)?, 0);
    assert_eq!(client.publish_qos1("sensors/7/status", b"booted", 3)?, 0);
    assert_eq!(client.publish_qos1(topic, &encoded(&reading(1)), 4)?, 0);
    client.disconnect()?;
    gateway.signal(libc::SIGTERM)?;
    gateway.wait_exit(Duration::from_secs(15))?;

    let lines = dump_json(dir.path(), "mqtt", &["--decode", "reading"])?;
    assert_eq!(lines.len(), 4, "{lines:?}");
    for (line, sequence) in [(&lines[0], 0), (&lines[3], 1)] {
        assert_eq!(line["reading"], serde_json::to_value(reading(sequence))?);
        let typed: Reading = serde_json::from_value(line["reading"].clone())?;
        assert_eq!(typed, reading(sequence));
        assert!(line.get("value").is_none(), "{line}");
        assert!(line.get("decode_error").is_none(), "{line}");
        assert_eq!(line["key"], topic);
    }
    assert_eq!(
        lines[1]["decode_error"],
        "not a reading: unsupported reading version 2 (this build reads version 1)"
    );
    assert_eq!(lines[1]["value"], "\u{2}\u{7}\u{1}\u{0}");
    assert_eq!(
        lines[2]["decode_error"],
        "not a reading: unsupported reading version 98 (this build reads version 1)"
    );
    assert_eq!(lines[2]["value"], "booted");
    assert!(lines[2].get("reading").is_none());

    let raw = dump_json(dir.path(), "mqtt", &[])?;
    assert!(raw.iter().all(|line| line.get("reading").is_none()));
    assert!(raw.iter().all(|line| line.get("value").is_some()));
    Ok(())
}

#[test]
fn an_unknown_schema_is_refused() -> anyhow::Result<()> {
    let dir = TempDir::new("decode-unknown")?;
    let path = dir.path().display().to_string();
    let (status, stdout, stderr) = run_tern(&[
        "log",
        "dump",
        "--data-dir",
        &path,
        "--topic",
        "mqtt",
        "--decode",
        "json",
    ])?;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("unknown decoder `json` (known: reading)"),
        "{stderr}"
    );
    Ok(())
}
