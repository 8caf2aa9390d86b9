//! `tern bench log`: the bench runs end to end and prints every figure the storage issue asks
//! for. This checks that the bench works, never how fast anything is.

use serde_json::Value;
use tern_tests::{TempDir, run_tern};

/// Every figure, as a JSON pointer into the report.
const FIGURES: &[&str] = &[
    "/raw/mb_per_s",
    "/append/0/records_per_s",
    "/append/0/mb_per_s",
    "/append/0/ratio_to_raw",
    "/append/0/fdatasyncs_per_s",
    "/append/0/payload_bytes_per_fsync",
    "/append/0/latency_p50_us",
    "/append/0/latency_p99_us",
    "/append/0/write_amplification",
    "/append/1/records_per_s",
    "/append/1/mb_per_s",
    "/append/1/ratio_to_raw",
    "/append/1/write_amplification",
    "/append/1/fdatasyncs_per_s",
    "/append/1/latency_p99_us",
    "/append/2/records_per_s",
    "/append/2/ratio_to_raw",
    "/append/2/write_amplification",
    "/append/3/records_per_s",
    "/append/3/mb_per_s",
    "/append/3/ratio_to_raw",
    "/append/3/write_amplification",
    "/append/3/fdatasyncs_per_s",
    "/append/3/payload_bytes_per_fsync",
    "/append/3/latency_p50_us",
    "/append/3/latency_p99_us",
    "/append/4/records_per_s",
    "/append/4/ratio_to_raw",
    "/read/random_p50_us",
    "/read/random_p99_us",
    "/read/sequential_mb_per_s",
    "/recovery/open_ms",
    "/recovery/writer_peak_rss_bytes",
    "/recovery/log_payload_bytes",
    "/sqlite/0/records_per_s",
    "/sqlite/0/write_amplification",
    "/sqlite/0/throughput_ratio_to_tern",
    "/sqlite/0/write_amplification_ratio_to_tern",
    "/sqlite/3/records_per_s",
    "/sqlite/3/write_amplification",
    "/flash/measured_device_bytes_per_day",
    "/flash/measured_years",
    "/flash/steady_years",
];

#[test]
fn quick_bench_prints_every_figure_as_json() -> anyhow::Result<()> {
    let dir = TempDir::new("bench")?;
    let dir_arg = dir.path().display().to_string();
    let (status, stdout, stderr) = run_tern(&[
        "bench",
        "log",
        "--quick",
        "--json",
        "--no-loop",
        "--dir",
        &dir_arg,
    ])?;
    assert!(status.success(), "{stderr}");
    let report: Value = serde_json::from_str(&stdout)?;
    assert_eq!(report["counter"], "process", "{stdout}");
    // Per record size the closed-loop row (1 in flight), then the main workload (32 in flight);
    // last the batched 1 KiB row.
    let rows: Vec<(Value, Value, Value)> = (0..5)
        .map(|i| {
            let row = &report["append"][i];
            (
                row["record_size"].clone(),
                row["batch"].clone(),
                row["inflight"].clone(),
            )
        })
        .collect();
    let expected: Vec<(Value, Value, Value)> = [
        (100, 1, 1),
        (100, 1, 32),
        (1024, 1, 1),
        (1024, 1, 32),
        (1024, 64, 1),
    ]
    .iter()
    .map(|&(size, batch, inflight)| (size.into(), batch.into(), inflight.into()))
    .collect();
    assert_eq!(rows, expected, "{stdout}");
    let modes: Vec<Option<&str>> = (0..4)
        .map(|i| report["sqlite"][i]["synchronous"].as_str())
        .collect();
    let expected = ["NORMAL", "NORMAL", "FULL", "FULL"].map(Some);
    assert_eq!(modes, expected);
    for pointer in FIGURES {
        let value = report.pointer(pointer).and_then(Value::as_f64);
        assert!(
            value.is_some_and(|v| v.is_finite() && v > 0.0),
            "{pointer} = {value:?} in {stdout}"
        );
    }
    assert_numbers_are_finite(&report);
    let leftovers = std::fs::read_dir(dir.path())?.count();
    assert_eq!(leftovers, 0, "the bench left files in its --dir");
    Ok(())
}

/// No number anywhere in the report is negative, NaN or infinite.
fn assert_numbers_are_finite(value: &Value) {
    match value {
        Value::Number(n) => {
            let v = n.as_f64().unwrap_or(f64::NAN);
            assert!(v.is_finite() && v >= 0.0, "bad figure {n}");
        }
        Value::Array(items) => items.iter().for_each(assert_numbers_are_finite),
        Value::Object(fields) => fields.values().for_each(assert_numbers_are_finite),
        _ => {}
    }
}
