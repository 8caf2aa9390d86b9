//! `tern-bench upstream --json` against the real three-node cluster with a small backlog: the
//! bench runs its live phase through a `tern serve` child and drains the backlog once per codec.
//! This checks that every figure is present and sane and that the bench's own arithmetic holds;
//! it asserts no timing and no performance target.

use serde_json::Value;
use tern_tests::{KafkaCluster, run_bench};

const CODECS: [&str; 5] = ["none", "gzip", "lz4", "snappy", "zstd"];

/// The number at `path` (e.g. `live.lag_ms`), which must be finite and at least zero.
fn figure(report: &Value, path: &str) -> f64 {
    let value = path
        .split('.')
        .fold(report, |node, key| match key.parse::<usize>() {
            Ok(i) => &node[i],
            Err(_) => &node[key],
        })
        .as_f64()
        .unwrap_or_else(|| panic!("figure {path} missing in {report:#}"));
    assert!(value.is_finite() && value >= 0.0, "{path} = {value}");
    value
}

#[test]
fn bench_upstream_prints_live_and_per_codec_drain_figures() -> anyhow::Result<()> {
    let cluster = KafkaCluster::start()?;
    let bootstrap = cluster.bootstrap();
    let args = [
        "upstream",
        "--kafka",
        &bootstrap,
        "--records",
        "20000",
        "--repetitions",
        "1",
        "--json",
    ];
    let (status, stdout, stderr) = run_bench(&args)?;
    assert!(status.success(), "bench failed: {stderr}\n{stdout}");
    let report: Value = serde_json::from_str(&stdout)?;
    assert_eq!(figure(&report, "shape.records"), 20_000.0);
    assert_eq!(figure(&report, "shape.size"), 64.0);
    // The live run: 20,000 messages over 16 publishers, all forwarded (the bench checks the
    // upstream count exactly and fails on a duplicate).
    assert_eq!(figure(&report, "live.messages"), 20_000.0);
    let live = figure(&report, "live.ingest_msgs_per_sec");
    assert!(live > 0.0);
    assert!(figure(&report, "live.forward_records_per_sec") > 0.0);
    assert!(figure(&report, "live.forward_mb_per_sec") > 0.0);
    figure(&report, "live.lag_ms");
    let drains = report["drains"].as_array().expect("drains");
    let codecs: Vec<&str> = drains.iter().filter_map(|d| d["codec"].as_str()).collect();
    assert_eq!(codecs, CODECS);
    let wire = |codec: usize| {
        figure(
            &report,
            &format!("drains.{codec}.wire_to_kafka_per_payload_byte"),
        )
    };
    // Without compression every payload byte crosses the wire, plus tern's headers.
    assert!(wire(0) > 1.0, "none: {}", wire(0));
    for (i, codec) in CODECS.iter().enumerate() {
        let rate = figure(&report, &format!("drains.{i}.records_per_sec"));
        let seconds = figure(&report, &format!("drains.{i}.seconds"));
        assert!(rate > 0.0 && seconds > 0.0, "{codec}");
        assert!(
            (rate * seconds - 20_000.0).abs() < 1.0,
            "{codec}: {rate} x {seconds}"
        );
        assert!(
            figure(
                &report,
                &format!("drains.{i}.wire_from_kafka_per_payload_byte")
            ) > 0.0
        );
        // The telemetry values compress: every codec sends less than no codec.
        assert!(
            wire(i) > 0.0 && (i == 0 || wire(i) < wire(0)),
            "{codec}: {}",
            wire(i)
        );
        let ratio = figure(&report, &format!("drains.{i}.drain_over_live"));
        assert!((ratio - rate / live).abs() <= 1e-9 * ratio, "{codec}");
        // 24 h at 100 msg/s of 64 B records over 1 Mbit/s: 8,640,000 x 64 B x wire/payload at
        // 125,000 B/s.
        let hours = figure(&report, &format!("drains.{i}.day_backlog_hours_at_1_mbit"));
        let expected = 8_640_000.0 * 64.0 * wire(i) / 125_000.0 / 3600.0;
        assert!(
            (hours - expected).abs() <= 1e-9 * expected,
            "{codec}: {hours} h"
        );
        let target = &report["targets"][i];
        assert_eq!(target["target"].as_f64(), Some(10.0));
        assert_eq!(target["measured"].as_f64(), Some(ratio));
        assert_eq!(target["met"].as_bool(), Some(ratio >= 10.0));
    }
    Ok(())
}
