//! Promise 1 on a real ARM Linux system: QoS 1 publishers on the host, QEMU SIGKILLed at seeded
//! random moments while they publish, the same SD card booted again. Afterwards every PUBACKed
//! message is in the log exactly once (each is published once), `tern log verify` is clean,
//! and after every cut the ext4 needed nothing but its own journal replay.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::bail;
use tern_tests::raw_mqtt::RawClient;
use tern_tests::system::{Arch, Forward, Guest, SdCard, cross_tern, guest_config};
use tern_tests::{TempDir, TestRng, read_log, run_tern, wait_until};

/// QoS 1 publishers on the host, each one message at a time.
const PUBLISHERS: usize = 6;
/// Power cuts of the main test, per architecture.
pub const CUTS: usize = 5;
/// Power cuts of the negative control.
const CONTROL_CUTS: usize = 1;

/// Where the publishers connect: the current boot's forwarded MQTT port, or none while the
/// gateway is down. A new boot wakes every publisher waiting for one.
#[derive(Debug, Default)]
pub struct Target {
    addr: Mutex<Option<SocketAddr>>,
    changed: Condvar,
}

impl Target {
    pub fn set(&self, addr: Option<SocketAddr>) {
        *self.addr.lock().unwrap_or_else(|e| e.into_inner()) = addr;
        self.changed.notify_all();
    }

    /// The current address; waits up to `patience` for one while there is none.
    fn get(&self, patience: Duration) -> Option<SocketAddr> {
        let guard = self.addr.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = self
            .changed
            .wait_timeout_while(guard, patience, |addr| addr.is_none())
            .unwrap_or_else(|e| e.into_inner());
        *guard
    }

    /// Waits up to `patience` for the address to change from `from` (a failed connection is
    /// retried once a new boot is announced, or after `patience`).
    fn wait_change(&self, from: SocketAddr, patience: Duration) {
        let guard = self.addr.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .changed
            .wait_timeout_while(guard, patience, |addr| *addr == Some(from));
    }
}

/// Host publishers: each publishes unique payloads `{label}-p{n}-m{seq}` to `{label}/{n}` at
/// QoS 1, one at a time, never republishing one whose PUBACK did not come (so an
/// acknowledged payload must be stored exactly once, an unacknowledged one at most once).
#[derive(Debug)]
pub struct Publishers {
    pub target: Arc<Target>,
    running: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Publishers {
    pub fn start(count: usize, label: &str, target: Arc<Target>) -> Self {
        let running = Arc::new(AtomicBool::new(true));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..count)
            .map(|n| {
                let (target, running, acked) = (target.clone(), running.clone(), acked.clone());
                let label = label.to_owned();
                std::thread::spawn(move || publish(n, &label, &target, &running, &acked))
            })
            .collect();
        Self {
            target,
            running,
            acked,
            threads,
        }
    }

    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits until `more` publishes beyond those acknowledged so far are acknowledged.
    pub fn wait_for_more(&self, more: u64) -> anyhow::Result<()> {
        let target = self.acked_count() + usize::try_from(more)?;
        let what = format!("{more} more acknowledged publishes");
        wait_until(Duration::from_secs(120), &what, || {
            Ok(self.acked_count() >= target)
        })
    }

    /// Stops every publisher and returns the acknowledged payloads.
    pub fn stop(self) -> Vec<String> {
        self.running.store(false, Ordering::SeqCst);
        self.target.changed.notify_all();
        for thread in self.threads {
            let _ = thread.join();
        }
        std::mem::take(&mut *self.acked.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

fn publish(
    n: usize,
    label: &str,
    target: &Target,
    running: &AtomicBool,
    acked: &Mutex<Vec<String>>,
) {
    let mut sequence = 0u64;
    let topic = format!("{label}/{n}");
    while running.load(Ordering::SeqCst) {
        let Some(addr) = target.get(Duration::from_millis(200)) else {
            continue;
        };
        let Ok(mut client) = RawClient::connect(addr, &format!("{label}-{n}"), 30, true, false)
        else {
            // Booting: slirp accepts and drops the connection until tern listens.
            target.wait_change(addr, Duration::from_millis(100));
            continue;
        };
        while running.load(Ordering::SeqCst) {
            sequence += 1;
            let payload = format!("{label}-p{n}-m{sequence}");
            let pkid = u16::try_from(sequence % 65_535 + 1).unwrap_or(1);
            match client.publish_qos1(&topic, payload.as_bytes(), pkid) {
                Ok(0) => acked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(payload),
                _ => break,
            }
        }
    }
}

/// When [`run_cuts`] hands the running guest to the test's own step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Each boot, just before its power cut (the publishers are publishing).
    BeforeCut,
    /// The last boot, after the publishers stopped, before the clean shutdown.
    BeforeShutdown,
}

/// What a run of power cuts found.
#[derive(Debug)]
pub struct Outcome {
    pub cuts: usize,
    pub acked: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub stored: usize,
    pub boot_times: Vec<Duration>,
    pub verify_clean: bool,
    pub verify_output: String,
    /// The log read back from the card after the clean shutdown.
    pub data: PathBuf,
}

/// Boots `arch` on a fresh card with `config`, cuts the power `cuts` times at seeded random
/// moments (after a random number of further acknowledged publishes), checks the card after
/// each cut, boots once more, shuts down cleanly and reads the log back on the host (into
/// `dir`). `step` runs at each [`Stage`].
pub fn run_cuts(
    arch: Arch,
    label: &str,
    config: &str,
    cuts: usize,
    dir: &Path,
    mut step: impl FnMut(Stage, &mut Guest) -> anyhow::Result<()>,
) -> anyhow::Result<Outcome> {
    let test = format!("system {} {label}", arch.name());
    let mut rng = TestRng::from_env(&test)?;
    let card = SdCard::create(&dir.join("sd.img"), &cross_tern(arch)?, config, &[])?;
    let console = dir.join("console.log");
    let mut boot_times = Vec::new();
    let forward = Forward::pick()?;
    let mut guest = Guest::boot(arch, &card, forward, &console)?;
    boot_times.push(guest.boot_time);
    let publishers = Publishers::start(PUBLISHERS, label, Arc::new(Target::default()));
    publishers.target.set(Some(guest.mqtt));
    for cut in 1..=cuts {
        let more = 20 + rng.below(300);
        publishers.wait_for_more(more)?;
        step(Stage::BeforeCut, &mut guest)?;
        publishers.target.set(None);
        guest.power_cut()?;
        eprintln!(
            "{test}: power cut {cut} after {more} more acknowledged ({} in all)",
            publishers.acked_count()
        );
        card.check_after_cut(&dir.join("after-cut.img"))?;
        guest = Guest::boot(arch, &card, forward, &console)?;
        boot_times.push(guest.boot_time);
        publishers.target.set(Some(guest.mqtt));
    }
    publishers.wait_for_more(50)?;
    let acked = publishers.stop();
    step(Stage::BeforeShutdown, &mut guest)?;
    guest.shutdown()?;
    card.check_clean()?;
    let data = SdCard::extract(&card.path, "/data", &dir.join("read-back"))?;
    let (verify_clean, verify_output) = verify(&data)?;

    let mut stored: BTreeMap<String, usize> = BTreeMap::new();
    for record in read_log(&data, "mqtt")? {
        *stored.entry(record.value).or_default() += 1;
    }
    let lost = acked.iter().filter(|p| !stored.contains_key(*p)).count();
    let duplicated = stored.values().filter(|&&n| n > 1).count();
    Ok(Outcome {
        cuts,
        acked: acked.len(),
        lost,
        duplicated,
        stored: stored.values().sum(),
        boot_times,
        verify_clean,
        verify_output,
        data,
    })
}

/// `tern log verify` on the host over the log read back from the card.
fn verify(data: &Path) -> anyhow::Result<(bool, String)> {
    let dir = data.display().to_string();
    let (status, stdout, stderr) = run_tern(&["log", "verify", "--data-dir", &dir])?;
    Ok((status.success(), format!("{stdout}{stderr}")))
}

fn boot_summary(times: &[Duration]) -> String {
    let mut sorted = times.to_vec();
    sorted.sort();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    let max = sorted.last().copied().unwrap_or_default();
    format!("boot to ready median {median:.1?}, max {max:.1?}")
}

pub fn power_cuts_lose_no_acknowledged_message(arch: Arch) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = TempDir::new("system-cuts")?;
    let config = guest_config("", "");
    let outcome = run_cuts(arch, "cuts", &config, CUTS, dir.path(), |_, _| Ok(()))?;
    eprintln!(
        "system {}: power cuts {}, acknowledged {}, lost {}, duplicated {}, stored {}; {}; {:.0?} in all",
        arch.name(),
        outcome.cuts,
        outcome.acked,
        outcome.lost,
        outcome.duplicated,
        outcome.stored,
        boot_summary(&outcome.boot_times),
        started.elapsed()
    );
    if !outcome.verify_clean {
        bail!("tern log verify is not clean:\n{}", outcome.verify_output);
    }
    assert_eq!(outcome.lost, 0, "acknowledged messages lost: {outcome:?}");
    assert_eq!(outcome.duplicated, 0, "messages stored twice: {outcome:?}");
    assert!(outcome.acked > 500, "too few acknowledged: {outcome:?}");
    Ok(())
}

/// The same cuts with fdatasync only every hour: the acknowledged messages of the last seconds
/// are still in the guest's page cache when the power goes, so they must be missing. Proves the
/// harness sees a lost acknowledged message.
pub fn negative_control_periodic_sync_loses_acknowledged_messages(
    arch: Arch,
) -> anyhow::Result<()> {
    let config = guest_config("durability = \"periodic\"\nsync_interval = \"1h\"", "");
    let dir = TempDir::new("system-control")?;
    let outcome = run_cuts(
        arch,
        "control",
        &config,
        CONTROL_CUTS,
        dir.path(),
        |_, _| Ok(()),
    )?;
    eprintln!(
        "system {} negative control (durability = \"periodic\", sync_interval = \"1h\"): power cuts {}, acknowledged {}, lost {}",
        arch.name(),
        outcome.cuts,
        outcome.acked,
        outcome.lost
    );
    assert!(
        outcome.lost > 0,
        "the negative control lost nothing, so the harness cannot see a loss: {outcome:?}"
    );
    Ok(())
}
