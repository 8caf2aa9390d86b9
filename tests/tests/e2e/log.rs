//! The log through the real binary: `tern log dump/verify/topics` on a committed fixture with a
//! torn tail, damage detection, recovery by `tern serve`, and repeated SIGKILLs (process
//! crashes, not power cuts) of a writer that prints every acknowledged append.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tern_tests::{Gateway, ServeOptions, TempDir, TestRng, bench_binary, run_tern, workspace_root};

/// Copies the committed fixture into a fresh temporary directory.
fn fixture_copy(label: &str) -> anyhow::Result<TempDir> {
    let dir = TempDir::new(label)?;
    tern_tests::copy_tree(
        &workspace_root().join("tests/fixtures/torn-tail"),
        dir.path(),
    )?;
    Ok(dir)
}

fn dir_arg(dir: &Path) -> String {
    dir.display().to_string()
}

/// `ack OFFSET COUNT PID TASK SEQ` lines → (offset, value) of every acknowledged record.
fn acked_records(lines: &str) -> anyhow::Result<Vec<(u64, String)>> {
    let mut out = Vec::new();
    for line in lines.lines().filter(|l| l.starts_with("ack ")) {
        let f: Vec<&str> = line.split(' ').collect();
        let [_, offset, count, pid, task, seq] = f.as_slice() else {
            anyhow::bail!("bad ack line {line:?}");
        };
        let (offset, count): (u64, u64) = (offset.parse()?, count.parse()?);
        for i in 0..count {
            out.push((offset + i, format!("pid{pid}-task{task}-seq{seq}-rec{i}")));
        }
    }
    Ok(out)
}

/// Every record of the stress topic as offset → value, via `tern log dump`.
fn dumped(dir: &Path) -> anyhow::Result<HashMap<u64, String>> {
    let (status, stdout, stderr) = run_tern(&[
        "log",
        "dump",
        "--data-dir",
        &dir_arg(dir),
        "--topic",
        "stress",
    ])?;
    anyhow::ensure!(status.success(), "dump failed: {stderr}");
    let mut out = HashMap::new();
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line).context("dump line is JSON")?;
        let offset = v["offset"].as_u64().context("offset")?;
        let value = v["value"].as_str().context("value")?.to_owned();
        anyhow::ensure!(out.insert(offset, value).is_none(), "offset {offset} twice");
    }
    Ok(out)
}

#[test]
fn dump_reads_every_acknowledged_record_of_the_torn_fixture() -> anyhow::Result<()> {
    let dir = fixture_copy("dump")?;
    let acks = std::fs::read_to_string(workspace_root().join("tests/fixtures/torn-tail.acks"))?;
    let expected = acked_records(&acks)?;
    let records = dumped(dir.path())?;
    assert_eq!(records.len(), expected.len());
    for (offset, value) in &expected {
        assert_eq!(records.get(offset), Some(value), "offset {offset}");
    }
    let (status, stdout, stderr) = run_tern(&[
        "log",
        "dump",
        "--data-dir",
        &dir_arg(dir.path()),
        "--topic",
        "stress",
        "--from",
        "100",
        "--count",
        "3",
    ])?;
    assert!(status.success(), "{stderr}");
    let offsets: Vec<u64> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).map(|v| v["offset"].as_u64()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(offsets, vec![100, 101, 102]);
    let first: serde_json::Value = serde_json::from_str(stdout.lines().next().context("a line")?)?;
    for key in [
        "topic",
        "partition",
        "timestamp",
        "key",
        "headers",
        "value_encoding",
    ] {
        assert!(first.get(key).is_some(), "{key} missing in {first}");
    }
    let (status, stdout, _) = run_tern(&[
        "log",
        "dump",
        "--data-dir",
        &dir_arg(dir.path()),
        "--topic",
        "stress",
        "--from",
        "@20",
        "--count",
        "1",
    ])?;
    assert!(status.success());
    let v: serde_json::Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(v["timestamp"].as_i64(), Some(20), "{v}");
    let (status, _, stderr) = run_tern(&[
        "log",
        "dump",
        "--data-dir",
        &dir_arg(dir.path()),
        "--topic",
        "nope",
    ])?;
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("no topic nope"), "{stderr}");
    Ok(())
}

#[test]
fn verify_notes_the_torn_tail_and_serve_repairs_it() -> anyhow::Result<()> {
    let dir = fixture_copy("verify")?;
    let (status, stdout, stderr) =
        run_tern(&["log", "verify", "--data-dir", &dir_arg(dir.path())])?;
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("torn tail of 40 bytes"), "{stdout}");
    assert!(stdout.contains("0 problem(s) found"), "{stdout}");
    let (status, stdout, _) = run_tern(&["log", "topics", "--data-dir", &dir_arg(dir.path())])?;
    assert!(status.success());
    let row: Vec<&str> = stdout
        .lines()
        .nth(1)
        .context("a row")?
        .split_whitespace()
        .collect();
    assert_eq!(row.get(..3), Some(&["stress", "0", "0"][..]), "{stdout}");
    assert_eq!(row.get(3), Some(&"120"), "{stdout}");
    assert_eq!(row.get(5), Some(&"3"), "{stdout}");

    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let (_, metrics) = gateway.admin_get("/metrics")?;
    assert!(
        metrics.contains("tern_log_end_offset{topic=\"stress\",partition=\"0\"} 120"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE tern_log_fsyncs_total counter"),
        "{metrics}"
    );
    gateway.signal(libc::SIGTERM)?;
    assert_eq!(gateway.wait_exit(Duration::from_secs(10))?.code(), Some(0));
    let (status, stdout, _) = run_tern(&["log", "verify", "--data-dir", &dir_arg(dir.path())])?;
    assert!(status.success(), "{stdout}");
    assert!(
        !stdout.contains("torn tail"),
        "recovery truncated it: {stdout}"
    );
    assert_eq!(dumped(dir.path())?.len(), 120);
    Ok(())
}

#[test]
fn verify_names_file_and_byte_of_damage() -> anyhow::Result<()> {
    let dir = fixture_copy("damage")?;
    let segment: PathBuf = dir
        .path()
        .join("log/topics/stress/0/00000000000000000000.log");
    let mut bytes = std::fs::read(&segment)?;
    let byte = bytes.get_mut(700).context("segment has 700 bytes")?;
    *byte ^= 0x40;
    std::fs::write(&segment, &bytes)?;
    let (status, stdout, stderr) =
        run_tern(&["log", "verify", "--data-dir", &dir_arg(dir.path())])?;
    assert_eq!(status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("DAMAGE") && stdout.contains("00000000000000000000.log byte"),
        "{stdout}"
    );
    assert!(stderr.contains("problem(s)"), "{stderr}");
    // Reads skip the damaged batch and go on.
    let records = dumped(dir.path())?;
    assert!(
        records.len() < 120 && records.len() > 100,
        "{}",
        records.len()
    );
    Ok(())
}

/// Starts the stress writer, lets it run for `run_for`, kills it with SIGKILL, returns stdout.
fn run_and_kill(dir: &Path, run_for: Duration) -> anyhow::Result<String> {
    let mut child = Command::new(bench_binary()?)
        .args([
            "stress",
            "--data-dir",
            &dir_arg(dir),
            "--tasks",
            "4",
            "--segment-bytes",
            "16384",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("stdout pipe")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let started = Instant::now();
    while started.elapsed() < run_for {
        // The random moment of the kill is what is tested; this polls for an early exit meanwhile.
        std::thread::sleep(Duration::from_millis(10));
        if child.try_wait()?.is_some() {
            break;
        }
    }
    child.kill()?;
    child.wait()?;
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader thread panicked"))
}

/// A process-crash test: the stress writer is SIGKILLed 30 times at random moments (seeded; replay
/// with `TERN_TEST_SEED`), and every append it acknowledged must read back at its offset. The page
/// cache survives SIGKILL, so this proves nothing about power cuts; that proof is the
/// fault-injecting file system in tern-log's tests (`gateway/log/src/tests/crash.rs`).
#[test]
fn process_crash_at_random_moments_loses_no_acknowledged_record() -> anyhow::Result<()> {
    let dir = TempDir::new("sigkill")?;
    let mut rng =
        TestRng::from_env("process_crash_at_random_moments_loses_no_acknowledged_record")?;
    let mut expected = Vec::new();
    // At least 30 kills, and more while the writer got little done (a loaded machine starts the
    // process slowly), up to 120.
    let mut kills = 0;
    while kills < 30 || (expected.len() <= 500 && kills < 120) {
        let run_for = Duration::from_millis(150 + rng.below(400));
        expected.extend(acked_records(&run_and_kill(dir.path(), run_for)?)?);
        kills += 1;
    }
    assert!(
        expected.len() > 500,
        "the writer got work done: {}",
        expected.len()
    );
    let records = dumped(dir.path())?;
    for (offset, value) in &expected {
        assert_eq!(
            records.get(offset),
            Some(value),
            "acknowledged offset {offset}"
        );
    }
    let max = records.keys().max().copied().unwrap_or(0);
    assert_eq!(records.len() as u64, max + 1, "offsets dense");
    let (status, stdout, _) = run_tern(&["log", "verify", "--data-dir", &dir_arg(dir.path())])?;
    assert!(status.success(), "{stdout}");
    Ok(())
}

#[test]
fn log_settings_are_checked_and_errors_name_the_key() -> anyhow::Result<()> {
    let dir = TempDir::new("logconfig")?;
    let cases = [
        ("[log.flush]\nmax_delay = \"soon\"\n", "log.flush.max_delay"),
        ("[log]\nsegment_bytes = \"1KiB\"\n", "log.segment_bytes"),
        (
            "[log.retention]\non_full = \"explode\"\n",
            "log.retention.on_full",
        ),
        ("[[log.topic]]\nname = \"bad/name\"\n", "log.topic[0].name"),
    ];
    for (text, key) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text)?;
        let (status, _, stderr) = run_tern(&["config", "check", &dir_arg(&file)])?;
        assert_eq!(status.code(), Some(1), "{text}: {stderr}");
        assert!(stderr.contains(key), "{text} should name {key}: {stderr}");
    }
    let (status, stdout, stderr) = run_tern(&[
        "config",
        "check",
        &dir_arg(&workspace_root().join("tern.example.toml")),
    ])?;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("max_delay = \"30ms\""), "{stdout}");
    assert!(stdout.contains("on_full = \"reject\""), "{stdout}");
    Ok(())
}
