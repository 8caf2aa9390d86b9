//! `tern-bench log`: the bench runs end to end and prints every figure the storage issue asks
//! for. This checks that the bench works, never how fast anything is.

use serde_json::Value;
use tern_tests::{TempDir, run_bench};

/// Every figure, as a JSON pointer into the report, append rows keyed by their `workload` name.
const FIGURES: &[&str] = &[
    "/raw/mb_per_s",
    "/append/closed-loop-100/records_per_s",
    "/append/closed-loop-100/mb_per_s",
    "/append/closed-loop-100/ratio_to_raw",
    "/append/closed-loop-100/fdatasyncs_per_s",
    "/append/closed-loop-100/payload_bytes_per_fsync",
    "/append/closed-loop-100/latency_p50_us",
    "/append/closed-loop-100/latency_p99_us",
    "/append/closed-loop-100/write_amplification",
    "/append/main-100/records_per_s",
    "/append/main-100/mb_per_s",
    "/append/main-100/ratio_to_raw",
    "/append/main-100/write_amplification",
    "/append/main-100/fdatasyncs_per_s",
    "/append/main-100/latency_p99_us",
    "/append/closed-loop-1024/records_per_s",
    "/append/closed-loop-1024/ratio_to_raw",
    "/append/closed-loop-1024/write_amplification",
    "/append/main-1024/records_per_s",
    "/append/main-1024/mb_per_s",
    "/append/main-1024/ratio_to_raw",
    "/append/main-1024/write_amplification",
    "/append/main-1024/fdatasyncs_per_s",
    "/append/main-1024/payload_bytes_per_fsync",
    "/append/main-1024/latency_p50_us",
    "/append/main-1024/latency_p99_us",
    "/append/batched-1024/records_per_s",
    "/append/batched-1024/ratio_to_raw",
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
    let (status, stdout, stderr) =
        run_bench(&["log", "--quick", "--json", "--no-loop", "--dir", &dir_arg])?;
    assert!(status.success(), "{stderr}");
    let mut report: Value = serde_json::from_str(&stdout)?;
    assert_eq!(report["counter"], "process", "{stdout}");
    // Append rows are found by name (the report's order is not part of its format).
    let append: serde_json::Map<String, Value> = report["append"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| Some((row["workload"].as_str()?.to_owned(), row.clone())))
        .collect();
    for (name, size, batch, inflight) in [
        ("closed-loop-100", 100, 1, 1),
        ("main-100", 100, 1, 32),
        ("closed-loop-1024", 1024, 1, 1),
        ("main-1024", 1024, 1, 32),
        ("batched-1024", 1024, 64, 1),
    ] {
        let shape = append.get(name).map(|r| {
            let field = |key: &str| r[key].as_u64();
            (field("record_size"), field("batch"), field("inflight"))
        });
        let expected = (Some(size), Some(batch), Some(inflight));
        assert_eq!(shape, Some(expected), "row {name} in {stdout}");
    }
    let modes: Vec<Option<&str>> = (0..4)
        .map(|i| report["sqlite"][i]["synchronous"].as_str())
        .collect();
    let expected = ["NORMAL", "NORMAL", "FULL", "FULL"].map(Some);
    assert_eq!(modes, expected);
    // From here on, `/append/{workload}/...` pointers name the rows.
    report["append"] = Value::Object(append);
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
