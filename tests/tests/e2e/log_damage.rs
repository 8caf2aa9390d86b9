//! Damage to a data directory, as an SD card or an operator's mistake leaves it, through the
//! real binary: a sealed segment cut in half, bytes flipped in the middle of the active
//! segment, garbage over the cursor log's header. Every record the damage did not touch must
//! still reach a persistent MQTT session (which skips, counts and goes on), `tern log dump` and
//! the broker must agree on what is left, and `tern log verify` must keep reporting the damage.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use tern_tests::{Gateway, MosquittoSub, ServeOptions, TempDir, read_log, run_tern};

/// Small segments (several per test), no age retention (records keep their real timestamps).
const CONFIG: &str = "[log]\nsegment_bytes = \"8KiB\"\n[log.retention]\nage = \"0\"\n";

fn options(dir: &Path) -> anyhow::Result<ServeOptions> {
    options_with(dir, CONFIG)
}

fn options_with(dir: &Path, config: &str) -> anyhow::Result<ServeOptions> {
    let file = dir.join("tern.toml");
    std::fs::write(&file, config)?;
    Ok(ServeOptions {
        args: vec!["--config".to_owned(), file.display().to_string()],
        ..ServeOptions::default()
    })
}

/// The data directory of a test, beside its config file.
fn data(dir: &TempDir) -> PathBuf {
    dir.path().join("data")
}

/// Registers the persistent session `id` on `jobs/#` (QoS 1) and leaves.
fn register_session(gateway: &Gateway, id: &str) -> anyhow::Result<()> {
    let sub = MosquittoSub::start(
        gateway.mqtt,
        &["-c", "-i", id, "-q", "1", "-t", "jobs/#", "-E"],
    )?;
    let output = sub.finish()?;
    anyhow::ensure!(output.status.success(), "{}", output.stderr);
    Ok(())
}

/// Publishes `payloads` to `jobs/new` at QoS 1 over one connection (each one acknowledged).
fn publish(gateway: &Gateway, payloads: &[String]) -> anyhow::Result<()> {
    let mut child = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
        .args(["-q", "1", "-t", "jobs/new", "-l"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run mosquitto_pub (scripts/ensure-deps.sh installs it)")?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().context("mosquitto_pub has no stdin")?;
        for payload in payloads {
            writeln!(stdin, "{payload}")?;
        }
    }
    let output = child.wait_with_output()?;
    anyhow::ensure!(
        output.status.success(),
        "mosquitto_pub: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Resumes the persistent session `id` and collects `count` payloads (within 30 s).
fn receive(gateway: &Gateway, id: &str, count: usize) -> anyhow::Result<BTreeSet<String>> {
    let count = count.to_string();
    let sub = MosquittoSub::start(
        gateway.mqtt,
        &[
            "-c", "-i", id, "-q", "1", "-t", "jobs/#", "-C", &count, "-W", "30",
        ],
    )?;
    let output = sub.finish()?;
    Ok(output.stdout.lines().map(str::to_owned).collect())
}

fn payloads(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:05}")).collect()
}

/// The segment files of partition 0 of the `mqtt` log topic, oldest first.
fn segments(data_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = data_dir.join("log/topics/mqtt/0");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    found.retain(|p| p.extension().is_some_and(|x| x == "log"));
    found.sort();
    Ok(found)
}

/// The values `tern log dump` reads from the `mqtt` topic.
fn dumped_values(data_dir: &Path) -> anyhow::Result<BTreeSet<String>> {
    Ok(read_log(data_dir, "mqtt")?
        .into_iter()
        .map(|r| r.value)
        .collect())
}

fn verify(data_dir: &Path) -> anyhow::Result<(bool, String)> {
    let dir = data_dir.display().to_string();
    let (status, stdout, stderr) = run_tern(&["log", "verify", "--data-dir", &dir])?;
    Ok((status.success(), format!("{stdout}{stderr}")))
}

#[test]
fn a_persistent_session_skips_what_a_cut_sealed_segment_lost_and_goes_on() -> anyhow::Result<()> {
    let dir = TempDir::new("cut-sealed")?;
    let data_dir = data(&dir);
    let options = options(dir.path())?;
    let mut gateway = Gateway::start(&data_dir, &options)?;
    register_session(&gateway, "keeper")?;
    let before = payloads("job", 400);
    publish(&gateway, &before)?;
    gateway.stop()?;

    let files = segments(&data_dir)?;
    anyhow::ensure!(files.len() >= 3, "several segments: {files:?}");
    let sealed = files.first().context("a sealed segment")?;
    let len = std::fs::metadata(sealed)?.len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(sealed)?
        .set_len(len / 2)?;
    let left = dumped_values(&data_dir)?;
    let lost = before.len() - left.len();
    assert!(lost > 0 && left.len() > before.len() / 2, "{lost} lost");
    assert!(left.contains("job-00399"), "records after the cut remain");

    let mut gateway = Gateway::start(&data_dir, &options)?;
    let after = payloads("late", 10);
    publish(&gateway, &after)?;
    let received = receive(&gateway, "keeper", left.len() + after.len())?;
    let expected: BTreeSet<String> = left.iter().chain(&after).cloned().collect();
    assert_eq!(
        received.len(),
        expected.len(),
        "missing: {:?}",
        expected.difference(&received).take(5).collect::<Vec<_>>()
    );
    assert_eq!(received, expected, "the broker delivers what dump reads");
    gateway.wait_metric(
        "tern_mqtt_records_lost_total",
        "",
        "the skipped records counted",
        Duration::from_secs(5),
        |v| v == Some(lost as u64),
    )?;
    let (ok, report) = verify(&data_dir)?;
    assert!(!ok, "{report}");
    assert!(
        report.contains("DAMAGE") && report.contains(&sealed.display().to_string()),
        "{report}"
    );
    gateway.stop()?;
    Ok(())
}

/// The generation field of a sealed segment's header overwritten (its CRC now wrong), as an
/// independent run did: the broker delivered every acknowledged record while `tern log dump`
/// skipped the whole segment. Every reader now takes the header from the intact batches, and
/// `verify` reports the damaged header without counting a record lost.
#[test]
fn a_damaged_header_of_a_sealed_segment_is_read_the_same_by_dump_verify_and_the_broker()
-> anyhow::Result<()> {
    let dir = TempDir::new("sealed-header")?;
    let data_dir = data(&dir);
    let options = options(dir.path())?;
    let mut gateway = Gateway::start(&data_dir, &options)?;
    register_session(&gateway, "keeper")?;
    let sent = payloads("job", 400);
    publish(&gateway, &sent)?;
    gateway.stop()?;

    let files = segments(&data_dir)?;
    anyhow::ensure!(files.len() >= 3, "several segments: {files:?}");
    let sealed = files.get(1).context("a sealed segment")?;
    // Bytes 12..16: the generation.
    let mut bytes = std::fs::read(sealed)?;
    if let Some(generation) = bytes.get_mut(12..16) {
        generation.copy_from_slice(&0xdead_beef_u32.to_le_bytes());
    }
    std::fs::write(sealed, &bytes)?;

    let expected: BTreeSet<String> = sent.iter().cloned().collect();
    assert_eq!(
        dumped_values(&data_dir)?,
        expected,
        "dump reads every record"
    );
    let (ok, report) = verify(&data_dir)?;
    assert!(!ok, "the damaged header is reported: {report}");
    let sealed_name = sealed.display().to_string();
    assert!(
        report.contains("DAMAGE")
            && report.contains(&sealed_name)
            && report.contains("batches are intact"),
        "{report}"
    );
    assert!(
        report.contains(&format!("{} record(s)", sent.len())),
        "verify counts every record: {report}"
    );

    // The indexes are rebuilt too (the same rule at start), and the broker delivers it all.
    for index in ["index", "timeindex"] {
        std::fs::remove_file(sealed.with_extension(index))?;
    }
    let gateway = Gateway::start(&data_dir, &options)?;
    let received = receive(&gateway, "keeper", sent.len())?;
    assert_eq!(received, expected, "the broker delivers what dump reads");
    Ok(())
}

#[test]
fn damage_in_the_active_segment_keeps_what_follows_and_stays_visible() -> anyhow::Result<()> {
    let dir = TempDir::new("active-damage")?;
    let data_dir = data(&dir);
    let options = options_with(dir.path(), "[log]\nsegment_bytes = \"1MiB\"\n")?;
    let mut gateway = Gateway::start(&data_dir, &options)?;
    register_session(&gateway, "watcher")?;
    let sent = payloads("job", 300);
    publish(&gateway, &sent)?;
    gateway.stop()?;
    // A clean restart: the zeros after the last batch are the normal end of a segment.
    let mut gateway = Gateway::start(&data_dir, &options)?;
    gateway.stop()?;
    let torn: Vec<String> = gateway
        .stderr_lines()
        .iter()
        .filter(|l| l.contains("torn"))
        .cloned()
        .collect();
    assert!(
        torn.is_empty(),
        "a clean restart is not a torn tail: {torn:#?}"
    );

    let files = segments(&data_dir)?;
    let active = files.last().context("the active segment")?;
    let mut bytes = std::fs::read(active)?;
    let used = bytes.iter().rposition(|b| *b != 0).context("records")?;
    for byte in bytes.get_mut(used / 2..used / 2 + 16).context("16 bytes")? {
        *byte ^= 0xff;
    }
    std::fs::write(active, &bytes)?;
    let left = dumped_values(&data_dir)?;
    let lost = sent.len() - left.len();
    assert!(
        lost > 0 && lost < 50,
        "one batch lost, not the rest: {lost}"
    );
    assert!(
        left.contains("job-00299"),
        "the records after the damage are kept"
    );
    let (ok, report) = verify(&data_dir)?;
    assert!(!ok && report.contains("DAMAGE"), "{report}");

    let mut gateway = Gateway::start(&data_dir, &options)?;
    let said = gateway.stderr_lines().join("\n");
    assert!(
        said.contains("damaged batch in the active segment"),
        "{said}"
    );
    let received = receive(&gateway, "watcher", left.len())?;
    assert_eq!(received, left, "the broker delivers what dump reads");
    gateway.wait_metric(
        "tern_mqtt_records_lost_total",
        "",
        "the lost records counted",
        Duration::from_secs(5),
        |v| v == Some(lost as u64),
    )?;
    gateway.stop()?;
    let (ok, report) = verify(&data_dir)?;
    assert!(!ok && report.contains("DAMAGE"), "still reported: {report}");
    assert_eq!(dumped_values(&data_dir)?, left);
    Ok(())
}

fn cursor_log(data_dir: &Path) -> PathBuf {
    data_dir.join("log/cursors.log")
}

/// Overwrites the first `len` bytes of `path` (all of it if it is shorter) with garbage.
fn garble(path: &Path, len: usize) -> anyhow::Result<()> {
    let mut bytes = std::fs::read(path)?;
    let len = len.min(bytes.len());
    for byte in bytes.get_mut(..len).context("bytes")? {
        *byte = 0xee;
    }
    std::fs::write(path, bytes)?;
    Ok(())
}

#[test]
fn garbage_over_the_cursor_log_loses_no_pending_message() -> anyhow::Result<()> {
    let dir = TempDir::new("cursor-garbage")?;
    let data_dir = data(&dir);
    let options = options(dir.path())?;
    let mut gateway = Gateway::start(&data_dir, &options)?;
    register_session(&gateway, "saver")?;
    let sent = payloads("job", 200);
    publish(&gateway, &sent)?;
    gateway.stop()?;
    let expected: BTreeSet<String> = sent.iter().cloned().collect();

    // Over the header and the first entry: every entry whose own CRC holds is salvaged.
    garble(&cursor_log(&data_dir), 16)?;
    let mut gateway = Gateway::start(&data_dir, &options)?;
    let said = gateway.stderr_lines().join("\n");
    assert!(said.contains("cursor log damaged"), "{said}");
    let kept = std::fs::read_dir(data_dir.join("log"))?
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("cursors.log.damaged-")
        });
    assert!(kept, "the damaged cursor log is kept for the operator");
    assert_eq!(receive(&gateway, "saver", sent.len())?, expected);
    gateway.stop()?;

    // All of it: the session's cursor is lost, and it is redelivered, not skipped.
    garble(&cursor_log(&data_dir), usize::MAX)?;
    let mut gateway = Gateway::start(&data_dir, &options)?;
    assert_eq!(receive(&gateway, "saver", sent.len())?, expected);
    let said = gateway.stderr_lines().join("\n");
    assert!(
        said.contains("redelivering from the earliest retained record"),
        "{said}"
    );
    gateway.stop()?;
    let (ok, report) = verify(&data_dir)?;
    assert!(ok, "the rewritten cursor log is clean: {report}");
    assert!(report.contains("cursors.log.damaged-"), "{report}");
    Ok(())
}
