//! Format versions through the real binary: a data directory of today's format (the committed
//! fixture `tests/fixtures/format-1`, written before the format marker existed) opens and gets
//! its marker; any file of a newer format makes `tern serve` and every `tern log` command refuse
//! with the file and both versions named, and leaves every byte of the directory as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tern_tests::{
    Gateway, MosquittoSub, ServeOptions, TempDir, read_log, run_tern, workspace_root,
};

/// No age retention: the fixture's records keep the time they were written.
const CONFIG: &str = "[log]\nsegment_bytes = \"4KiB\"\n[log.retention]\nage = \"0\"\n";

fn options(dir: &Path) -> anyhow::Result<ServeOptions> {
    let file = dir.join("tern.toml");
    std::fs::write(&file, CONFIG)?;
    Ok(ServeOptions {
        args: vec!["--config".to_owned(), file.display().to_string()],
        ..ServeOptions::default()
    })
}

/// Every file under `dir` with its bytes.
fn contents(dir: &Path) -> anyhow::Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            } else {
                out.insert(entry.path(), std::fs::read(entry.path())?);
            }
        }
    }
    Ok(out)
}

fn mosquitto_sub(gateway: &Gateway, args: &[&str]) -> anyhow::Result<Vec<String>> {
    let output = MosquittoSub::start(gateway.mqtt, args)?.finish()?;
    Ok(output.stdout.lines().map(str::to_owned).collect())
}

#[test]
fn a_log_of_todays_format_opens_and_gets_its_marker() -> anyhow::Result<()> {
    let dir = TempDir::new("format-1")?;
    let data = dir.path().join("data");
    tern_tests::copy_tree(&workspace_root().join("tests/fixtures/format-1"), &data)?;
    let marker = data.join("log/FORMAT");
    assert!(!marker.exists(), "the fixture predates the marker");
    let mut gateway = Gateway::start(&data, &options(dir.path())?)?;
    assert!(marker.exists(), "the marker is written on open");
    let written = std::fs::read(&marker)?;
    assert_eq!(written.get(8..10), Some(&[2u8, 0][..]), "format 2's marker");
    // The stored session resumes with every pending record (the retained one also comes again
    // for its SUBSCRIBE); a new session gets the retained one.
    let args = "-c -i fixture-keeper -q 1 -t jobs/# -C 42 -W 20";
    let pending = mosquitto_sub(&gateway, &args.split(' ').collect::<Vec<_>>())?;
    let got: BTreeSet<&str> = pending.iter().map(String::as_str).collect();
    let jobs: Vec<String> = (0..40).map(|i| format!("job-{i:02}")).collect();
    let expected: BTreeSet<&str> = jobs
        .iter()
        .map(String::as_str)
        .chain(["retained-config"])
        .collect();
    assert_eq!(got, expected, "{pending:?}");
    let retained = mosquitto_sub(&gateway, &["-t", "jobs/config", "-C", "1", "-W", "10"])?;
    assert_eq!(retained, ["retained-config"]);
    gateway.stop()?;
    assert_eq!(read_log(&data, "mqtt")?.len(), 41);
    let (status, stdout, _) =
        run_tern(&["log", "verify", "--data-dir", &data.display().to_string()])?;
    assert!(status.success(), "{stdout}");
    Ok(())
}

/// Rewrites the version at byte 8 of `path` to 3 (newer than any file this tern reads) as a
/// newer writer would: with the header's CRC32C (stored at `crc_at`, over the bytes before it)
/// recomputed, if it has one.
fn make_version_3(path: &Path, crc_at: Option<usize>) -> anyhow::Result<()> {
    let mut bytes = std::fs::read(path)?;
    bytes
        .get_mut(8..10)
        .context("a header")?
        .copy_from_slice(&3u16.to_le_bytes());
    if let Some(at) = crc_at {
        let crc = crc32c(bytes.get(..at).context("a header")?);
        bytes
            .get_mut(at..at + 4)
            .context("a CRC")?
            .copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(path, bytes)?;
    Ok(())
}

/// How a case turns its file into a newer writer's.
enum Edit {
    /// The binary header's version field, with the CRC at this position recomputed.
    Header(Option<usize>),
    /// `clock.json`'s `version` member.
    Json,
}

/// CRC32C (Castagnoli), bitwise: the tests' own, independent of the log's.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn a_newer_format_of_any_file_is_refused_and_every_byte_stays() -> anyhow::Result<()> {
    let dir = TempDir::new("format-2")?;
    let written = dir.path().join("written");
    let options = options(dir.path())?;
    let mut gateway = Gateway::start(&written, &options)?;
    mosquitto_sub(
        &gateway,
        &["-c", "-i", "keeper", "-q", "1", "-t", "jobs/#", "-E"],
    )?;
    let status = std::process::Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
        .args(["-q", "1", "-t", "jobs/new", "-r", "-m", "kept"])
        .status()?;
    anyhow::ensure!(status.success());
    gateway.stop()?;
    let mqtt = written.join("log/topics/mqtt/0");
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&mqtt)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    segments.retain(|p| p.extension().is_some_and(|x| x == "log"));
    segments.sort();
    let active = segments.last().context("an active segment")?.clone();
    let cases: [(PathBuf, Edit); 6] = [
        (active, Edit::Header(Some(28))),
        (
            written.join("log/topics/__mqtt_state/0/00000000000000000000.log"),
            Edit::Header(Some(28)),
        ),
        (written.join("log/cursors.log"), Edit::Header(None)),
        (
            written.join("log/topics/mqtt/topic.meta"),
            Edit::Header(Some(16)),
        ),
        (written.join("log/FORMAT"), Edit::Header(Some(12))),
        (written.join("log/clock.json"), Edit::Json),
    ];
    for (i, (file, edit)) in cases.iter().enumerate() {
        let data = dir.path().join(format!("case-{i}"));
        tern_tests::copy_tree(&written, &data)?;
        let file = data.join(file.strip_prefix(&written)?);
        match edit {
            Edit::Header(crc_at) => make_version_3(&file, *crc_at)?,
            Edit::Json => {
                let text = std::fs::read_to_string(&file)?;
                anyhow::ensure!(text.contains("\"version\":1"), "{text}");
                std::fs::write(&file, text.replace("\"version\":1", "\"version\":3"))?;
            }
        }
        let before = contents(&data)?;
        let mut serve = Gateway::spawn(&data, &options)?;
        let status = serve.wait_exit(Duration::from_secs(20))?;
        let said = serve.stderr_lines().join("\n");
        assert!(
            !status.success(),
            "{}: tern serve must refuse: {said}",
            file.display()
        );
        for text in [
            &file.display().to_string(),
            "format version 3",
            "this tern reads format version",
        ] {
            assert!(said.contains(text), "serve names {text}: {said}");
        }
        let dir_arg = data.display().to_string();
        for command in [
            vec!["log", "verify", "--data-dir", &dir_arg],
            vec!["log", "topics", "--data-dir", &dir_arg],
            vec!["log", "dump", "--data-dir", &dir_arg, "--topic", "mqtt"],
        ] {
            let (status, stdout, stderr) = run_tern(&command)?;
            assert!(!status.success(), "{command:?} must refuse: {stdout}");
            assert!(
                stderr.contains(&file.display().to_string()) && stderr.contains("version 3"),
                "{command:?}: {stderr}"
            );
        }
        assert!(
            contents(&data)? == before,
            "{}: a byte changed",
            file.display()
        );
    }
    Ok(())
}
