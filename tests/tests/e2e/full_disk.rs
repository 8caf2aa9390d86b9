//! A full card must not keep the gateway down: tern on a 32 MiB tmpfs (mounted by the test, as
//! root) fills it with QoS 1 publishes, refuses what it cannot store with backpressure (MQTT 5
//! PUBACK 0x97, MQTT 3.1.1 no PUBACK, the connection kept), starts again on the full disk,
//! serves reads and delivers, and takes publishes again without a restart once space is freed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir, read_log, run_tern};

/// A tmpfs of a fixed size mounted on a temporary directory, unmounted on drop. Mounting needs
/// root; a test that cannot mount fails (it never skips).
struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    fn mount(label: &str, size: &str) -> anyhow::Result<Self> {
        let dir = TempDir::new(label)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .context("running mount (the full-disk tests need root and mount)")?;
        if !status.success() {
            bail!("mount -t tmpfs failed ({status}); the full-disk tests must run as root");
        }
        Ok(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes still free on the file system.
    fn free(&self) -> anyhow::Result<u64> {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(self.path())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .nth(1)
            .and_then(|line| line.trim().parse().ok())
            .with_context(|| format!("df output {text:?}"))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn options(config: &Path) -> ServeOptions {
    ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        ..ServeOptions::default()
    }
}

/// `tern log verify` of `data_dir`: fails with its output unless it exits 0.
fn verify(data_dir: &Path) -> anyhow::Result<()> {
    let dir = data_dir.display().to_string();
    let (status, stdout, stderr) = run_tern(&["log", "verify", "--data-dir", &dir])?;
    if !status.success() {
        bail!("tern log verify failed ({status}):\n{stdout}\n{stderr}");
    }
    Ok(())
}

/// Publishes unique QoS 1 messages until tern refuses one with 0x97; returns the acknowledged
/// payloads. A dropped connection or a DISCONNECT fails the test.
fn fill(client: &mut RawClient, prefix: &str, acked: &mut BTreeSet<String>) -> anyhow::Result<()> {
    let body = "x".repeat(2000);
    for n in 0..100_000u32 {
        let payload = format!("{prefix}-{n:06}-{body}");
        let pkid = u16::try_from(n % 65_000 + 1)?;
        let reason = client
            .publish_qos1("disk/a", payload.as_bytes(), pkid)
            .with_context(|| format!("publish {n} after {} acknowledged", acked.len()))?;
        match reason {
            0 => {
                acked.insert(payload);
            }
            0x97 => return Ok(()),
            other => bail!("publish {n} answered with reason {other:#x}"),
        }
    }
    bail!("the disk never filled")
}

/// MQTT 3.1.1 publishes until one gets no PUBACK while the connection stays up (PINGRESP
/// answers); the acknowledged ones (the disk may still take a few) join `acked`.
fn v311_is_refused_without_puback(
    addr: std::net::SocketAddr,
    acked: &mut BTreeSet<String>,
) -> anyhow::Result<()> {
    let mut v4 = RawClient::connect(addr, "old-device", 60, true, false)?;
    for pkid in 1..=1000u16 {
        let payload = format!("old-{pkid:04}-{}", "y".repeat(2000));
        v4.publish("disk/b", payload.as_bytes(), 1, pkid, false)?;
        v4.write_packet(0xc0, &[])?;
        let (first, _) = v4.read_packet()?;
        if first == 0x40 {
            acked.insert(payload);
            let (ping, _) = v4.read_packet()?;
            assert_eq!(ping, 0xd0, "PINGRESP follows the PUBACK");
            continue;
        }
        assert_eq!(first, 0xd0, "PINGRESP arrives; the PUBACK is withheld");
        v4.set_timeout(Duration::from_millis(500))?;
        assert!(
            v4.read_packet().is_err(),
            "no PUBACK for a message not stored, and no DISCONNECT"
        );
        return Ok(());
    }
    bail!("every MQTT 3.1.1 publish was acknowledged on a full disk")
}

#[test]
fn a_full_disk_refuses_with_backpressure_restarts_and_resumes_once_space_is_freed()
-> anyhow::Result<()> {
    let fs = Tmpfs::mount("full-disk", "32m")?;
    let data = fs.path().join("data");
    let config = fs.path().join("tern.toml");
    // No commit window (nor the wear budget's, which would stretch it for a trickle): the test
    // publishes one message at a time.
    std::fs::write(
        &config,
        "[log]\nsegment_bytes = \"4MiB\"\n[log.flush]\nmin_delay = \"0ms\"\n\
         [log.flush.wear]\nenabled = false\n",
    )?;
    let mut gateway = Gateway::start(&data, &options(&config))?;
    let mut reader = RawClient::connect(gateway.mqtt, "disk-reader", 60, false, false)?;
    assert_eq!(reader.subscribe("disk/#", 1, 1)?, 1);
    reader.disconnect()?;
    // Room the test frees later, as an operator deleting a file would.
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![0u8; 6 << 20])?;

    let mut acked = BTreeSet::new();
    let mut v5 = RawClient::connect(gateway.mqtt, "disk-writer", 60, true, true)?;
    fill(&mut v5, "first", &mut acked)?;
    assert!(
        acked.len() > 1000,
        "{} stored before the disk filled",
        acked.len()
    );
    v311_is_refused_without_puback(gateway.mqtt, &mut acked)?;
    drop(v5);
    gateway.stop()?;

    let mut gateway =
        Gateway::start(&data, &options(&config)).context("tern must start on a full disk")?;
    let mut v5 = RawClient::connect(gateway.mqtt, "disk-writer", 60, true, true)?;
    // The room a restart finds (preallocated space of the segments it truncated and
    // preallocates in part) is used, then appends are refused.
    fill(&mut v5, "restarted", &mut acked)?;
    let mut reader = RawClient::connect(gateway.mqtt, "disk-reader", 60, false, false)?;
    let mut delivered = BTreeSet::new();
    while delivered.len() < acked.len() {
        let publish = reader.next_publish().with_context(|| {
            format!(
                "delivery stopped after {} of {}",
                delivered.len(),
                acked.len()
            )
        })?;
        delivered.insert(String::from_utf8_lossy(&publish.payload).into_owned());
    }
    assert_eq!(delivered, acked, "every acknowledged message is delivered");

    std::fs::remove_file(&filler)?;
    let before = acked.len();
    fill(&mut v5, "second", &mut acked)?;
    assert!(
        acked.len() > before + 100,
        "publishing resumed without a restart: {} more stored",
        acked.len() - before
    );
    drop(v5);
    drop(reader);
    gateway.stop()?;

    verify(&data)?;
    let stored: BTreeSet<String> = read_log(&data, "mqtt")?
        .into_iter()
        .map(|r| r.value)
        .collect();
    let lost: Vec<&String> = acked.difference(&stored).collect();
    assert!(lost.is_empty(), "{} acknowledged messages lost", lost.len());
    assert_eq!(
        stored.len(),
        acked.len(),
        "only acknowledged messages are stored"
    );
    Ok(())
}

#[test]
fn the_default_segment_size_starts_on_a_small_disk_and_leaves_it_no_fuller() -> anyhow::Result<()> {
    let fs = Tmpfs::mount("small-disk", "32m")?;
    let data: PathBuf = fs.path().join("data");
    let mut gateway = Gateway::start(&data, &ServeOptions::default())
        .context("tern must start with 64 MiB segments on a 32 MiB disk")?;
    let mut client = RawClient::connect(gateway.mqtt, "small", 60, true, true)?;
    assert_eq!(client.publish_qos1("small/a", b"hello", 1)?, 0);
    drop(client);
    gateway.stop()?;
    let free_after_stop = fs.free()?;
    let mut gateway = Gateway::start(&data, &ServeOptions::default())
        .context("tern must start again on the small disk")?;
    gateway.stop()?;
    assert!(
        fs.free()? + (1 << 20) >= free_after_stop,
        "a restart does not leave the disk fuller: {} free before, {} after",
        free_after_stop,
        fs.free()?
    );
    verify(&data)?;
    assert_eq!(read_log(&data, "mqtt")?.len(), 1);
    Ok(())
}
