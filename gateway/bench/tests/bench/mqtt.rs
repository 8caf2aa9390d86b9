//! `tern-bench mqtt --quick --json`: the bench starts tern and Mosquitto, runs its load against
//! both and prints every figure. This checks that the bench works and its figures are sane
//! (present, positive, finite); it asserts no performance target.

use serde_json::Value;
use tern_tests::run_bench;

/// The figure at `path` (e.g. `tern.qos1.p99_ms`), which must be a positive finite number.
fn figure(report: &Value, path: &str) -> f64 {
    let value = path
        .split('.')
        .fold(report, |node, key| &node[key])
        .as_f64()
        .unwrap_or_else(|| panic!("figure {path} missing in {report:#}"));
    assert!(
        value.is_finite() && value > 0.0,
        "figure {path} = {value} is not positive and finite"
    );
    value
}

#[test]
fn quick_bench_prints_every_figure_side_by_side() -> anyhow::Result<()> {
    let (status, stdout, stderr) = run_bench(&["mqtt", "--quick", "--json"])?;
    assert!(status.success(), "bench failed: {stderr}\n{stdout}");
    let report: Value = serde_json::from_str(&stdout)?;
    for broker in ["tern", "mosquitto"] {
        for name in [
            "qos1.msgs_per_sec",
            "qos1.p50_ms",
            "qos1.p99_ms",
            "qos1.max_ms",
            "deep.msgs_per_sec",
            "deep.p99_ms",
        ] {
            figure(&report, &format!("{broker}.{name}"));
        }
        figure(&report, &format!("{broker}.qos0.msgs_per_sec"));
        // A quick run may take less CPU than one clock tick of /proc: zero is sane.
        for load in ["qos1", "deep", "qos0"] {
            let path = format!("{broker}.{load}.cpu_s_per_100k");
            let cpu = report[broker][load]["cpu_s_per_100k"].as_f64();
            assert!(
                cpu.is_some_and(|s| s.is_finite() && s >= 0.0),
                "{path}: {cpu:?}"
            );
        }
        let p50 = figure(&report, &format!("{broker}.qos1.p50_ms"));
        let max = figure(&report, &format!("{broker}.qos1.max_ms"));
        assert!(p50 <= max, "{broker}: p50 {p50} ms above max {max} ms");
    }
    let ratio = figure(&report, "ratio.qos1_msgs_per_sec");
    let tern = figure(&report, "tern.qos1.msgs_per_sec");
    let mosquitto = figure(&report, "mosquitto.qos1.msgs_per_sec");
    assert!((ratio - tern / mosquitto).abs() < 1e-9 * ratio);
    figure(&report, "ratio.qos0_msgs_per_sec");
    figure(&report, "ratio.idle_rss");
    for broker in ["tern", "tern_windowed", "mosquitto"] {
        figure(&report, &format!("closed_loop.{broker}.msgs_per_sec"));
        figure(&report, &format!("closed_loop.{broker}.p50_ms"));
    }
    for broker in ["tern", "mosquitto"] {
        for name in ["idle_clients", "start_kib", "idle_kib", "peak_kib"] {
            figure(&report, &format!("{broker}_memory.{name}"));
        }
    }
    for broker in ["tern", "mosquitto"] {
        figure(&report, &format!("subscribes.{broker}_s"));
    }
    assert_eq!(report["subscribes"]["subscribes"], 1000, "{report:#}");
    // The quick run fits tern's default connection limit: tern runs with its defaults.
    assert_eq!(report["tern_settings"], serde_json::json!([]), "{report:#}");
    let targets = report["targets"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let names: Vec<&str> = targets.iter().filter_map(|t| t["name"].as_str()).collect();
    // The CPU ratio is a target only when Mosquitto's CPU was measurable (at least one tick).
    let cpu_measured = report["ratio"]["qos1_cpu_per_message"].is_f64();
    // ...and the persistent-session SUBSCRIBE figure (`subscribes.rs`) adds one.
    assert_eq!(names.len(), if cpu_measured { 6 } else { 5 }, "{report:#}");
    for target in targets {
        assert!(target["met"].is_boolean(), "{target}");
        assert!(
            target["measured"].as_f64().is_some_and(f64::is_finite),
            "{target}"
        );
    }
    Ok(())
}

#[test]
fn bench_against_one_broker_and_bad_flags() -> anyhow::Result<()> {
    let (status, _, stderr) = run_bench(&["mqtt", "--quick", "--publishers", "0"])?;
    assert!(!status.success());
    assert!(
        stderr.contains("--publishers must be at least 1"),
        "{stderr}"
    );
    let (status, _, stderr) = run_bench(&["mqtt", "--broker", "127.0.0.1:1", "--quick"])?;
    assert!(!status.success(), "nothing listens on port 1");
    assert!(stderr.contains("connecting a bench client"), "{stderr}");
    Ok(())
}
