//! The gateway as a whole ARM Linux system in system QEMU (`-M virt`): Debian's kernel, a busybox
//! initramfs (`scripts/system-image.sh`) and an ext4 "SD card" on a virtio disk holding the
//! cross-built `tern`, its configuration and its log. MQTT and the admin endpoint are forwarded
//! to loopback ports of the host. A power cut is a SIGKILL of QEMU: the guest loses its RAM
//! (page cache, unwritten ext4 journal) as a gateway loses it when its power goes; what QEMU had
//! already written into the image file stays, as on a card that finished the write.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{free_port, wait_until, workspace_root};

/// The guest's MQTT port, forwarded from a loopback port of the host.
const GUEST_MQTT_PORT: u16 = 1883;
/// The guest's admin port, forwarded from a loopback port of the host.
const GUEST_ADMIN_PORT: u16 = 9090;
/// The longest a boot to tern's "ready" may take under TCG on a loaded 2-core machine (about 6 s
/// when idle).
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
/// Size of the SD card image (sparse on the host).
const SD_CARD_MIB: u64 = 160;

/// The two ARM gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// 64-bit (Raspberry Pi 3/4/5 with a 64-bit OS): Debian's cloud-arm64 kernel.
    Aarch64,
    /// 32-bit ARMv7 (Raspberry Pi 2, or a 32-bit OS): Debian's armmp kernel.
    Armv7,
}

impl Arch {
    /// The name `scripts/cross.sh` and `scripts/system-image.sh` take.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aarch64 => "aarch64",
            Self::Armv7 => "armv7",
        }
    }

    fn triple(self) -> &'static str {
        match self {
            Self::Aarch64 => "aarch64-unknown-linux-gnu",
            Self::Armv7 => "armv7-unknown-linux-gnueabihf",
        }
    }

    fn qemu(self) -> &'static str {
        match self {
            Self::Aarch64 => "qemu-system-aarch64",
            Self::Armv7 => "qemu-system-arm",
        }
    }

    /// Machine and CPU: a Cortex-A57 (Pi 3/4-class ARMv8) and a Cortex-A15 (ARMv7 with LPAE).
    fn machine(self) -> [&'static str; 4] {
        match self {
            Self::Aarch64 => ["-M", "virt", "-cpu", "cortex-a57"],
            // highmem=off: the armmp kernel has no LPAE, so everything must sit below 4 GiB.
            Self::Armv7 => ["-M", "virt,highmem=off", "-cpu", "cortex-a15"],
        }
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The release binary `scripts/cross.sh ARCH` built (the `system-*` suites of `tests/run` build
/// it first when it is missing).
pub fn cross_tern(arch: Arch) -> anyhow::Result<PathBuf> {
    let path = target_dir()
        .join("cross")
        .join(arch.triple())
        .join("release")
        .join("tern");
    if !path.exists() {
        bail!(
            "{} is missing: run scripts/cross.sh {} first",
            path.display(),
            arch.name()
        );
    }
    Ok(path)
}

/// The kernel and initramfs of one architecture.
#[derive(Debug, Clone)]
pub struct BootFiles {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// Debian's kernel release, e.g. `6.1.0-57-cloud-arm64`.
    pub version: String,
}

/// Builds (or finds, when nothing changed) the boot files with `scripts/system-image.sh`, once
/// per test process and architecture.
pub fn boot_files(arch: Arch) -> anyhow::Result<BootFiles> {
    static BUILT: [OnceLock<Result<BootFiles, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = &BUILT[usize::from(arch == Arch::Armv7)];
    slot.get_or_init(|| build_boot_files(arch).map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_boot_files(arch: Arch) -> anyhow::Result<BootFiles> {
    let out = target_dir().join("system").join(arch.name());
    let status = Command::new(workspace_root().join("scripts/system-image.sh"))
        .arg(arch.name())
        .arg(&out)
        .status()
        .context("cannot run scripts/system-image.sh")?;
    if !status.success() {
        bail!("scripts/system-image.sh {} failed: {status}", arch.name());
    }
    let version = std::fs::read_to_string(out.join("kernel-version"))?
        .trim()
        .to_owned();
    Ok(BootFiles {
        kernel: out.join("vmlinuz"),
        initrd: out.join("initrd.img"),
        version,
    })
}

/// The gateway configuration on the SD card: tern listens on every interface of the guest (the
/// slirp network, reached only through the host's loopback forwards), anonymous devices may
/// publish, the log is on the card in 4 MiB segments. `log` is added to `[log]`, `more` after
/// everything (whole sections).
pub fn guest_config(log: &str, more: &str) -> String {
    format!(
        "data_dir = \"/sd/data\"\n\
         [mqtt]\n\
         listen = \"0.0.0.0:{GUEST_MQTT_PORT}\"\n\
         [mqtt.auth]\n\
         allow_anonymous = true\n\
         [admin]\n\
         listen = \"0.0.0.0:{GUEST_ADMIN_PORT}\"\n\
         [health]\n\
         min_free_bytes = \"8MiB\"\n\
         [log]\n\
         segment_bytes = \"4MiB\"\n\
         {log}\n\
         {more}\n"
    )
}

/// An ext4 image made with `mkfs.ext4 -d` (no root needed): `/tern`, `/tern.toml`, any extra
/// files, and the log under `/data` once tern ran.
#[derive(Debug)]
pub struct SdCard {
    pub path: PathBuf,
}

impl SdCard {
    /// Makes the card at `path` with the cross-built binary, `config` and `extra` files.
    pub fn create(
        path: &Path,
        tern: &Path,
        config: &str,
        extra: &[(&str, &[u8])],
    ) -> anyhow::Result<Self> {
        let stage = path.with_extension("stage");
        let _ = std::fs::remove_dir_all(&stage);
        std::fs::create_dir_all(&stage)?;
        std::fs::copy(tern, stage.join("tern"))
            .with_context(|| format!("copying {}", tern.display()))?;
        std::fs::write(stage.join("tern.toml"), config)?;
        for (name, bytes) in extra {
            std::fs::write(stage.join(name), bytes)?;
        }
        let output = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "tern-sd", "-d"])
            .arg(&stage)
            .arg(path)
            .arg(format!("{SD_CARD_MIB}M"))
            .output()
            .context("cannot run mkfs.ext4 (e2fsprogs)")?;
        let _ = std::fs::remove_dir_all(&stage);
        if !output.status.success() {
            bail!(
                "mkfs.ext4 failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// The check after a power cut, on a copy (the next boot uses the card as the cut left
    /// it): replay the ext4 journal (`e2fsck -E journal_only`), then a forced full check
    /// (`e2fsck -fn`) must find nothing to repair. Returns the copy, journal replayed, for
    /// reading the log back.
    pub fn check_after_cut(&self, copy: &Path) -> anyhow::Result<PathBuf> {
        let status = Command::new("cp")
            .arg("--sparse=always")
            .arg(&self.path)
            .arg(copy)
            .status()?;
        if !status.success() {
            bail!("copying the SD card failed: {status}");
        }
        let replay = Command::new("e2fsck")
            .args(["-E", "journal_only", "-y"])
            .arg(copy)
            .output()
            .context("cannot run e2fsck")?;
        // 0: nothing to do or journal replayed; anything else is more than a replay.
        if !replay.status.success() {
            bail!(
                "e2fsck -E journal_only: {}\n{}",
                replay.status,
                String::from_utf8_lossy(&replay.stdout)
            );
        }
        fsck_clean(copy)?;
        Ok(copy.to_path_buf())
    }

    /// After a clean shutdown the card needs no journal replay and no repair: `e2fsck -fn`
    /// exits 0.
    pub fn check_clean(&self) -> anyhow::Result<()> {
        fsck_clean(&self.path)
    }

    /// Copies directory `dir` of the card (or of a journal-replayed copy `image`) to `to` with
    /// `debugfs rdump`.
    pub fn extract(image: &Path, dir: &str, to: &Path) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(to)?;
        let output = Command::new("debugfs")
            .arg("-R")
            .arg(format!("rdump {dir} {}", to.display()))
            .arg(image)
            .output()
            .context("cannot run debugfs (e2fsprogs)")?;
        let name = dir.rsplit('/').next().unwrap_or(dir);
        let copied = to.join(name);
        if !output.status.success() || !copied.exists() {
            bail!(
                "debugfs rdump {dir} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(copied)
    }
}

fn fsck_clean(image: &Path) -> anyhow::Result<()> {
    let check = Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .output()
        .context("cannot run e2fsck")?;
    if !check.status.success() {
        bail!(
            "e2fsck -fn {} found damage ({}):\n{}",
            image.display(),
            check.status,
            String::from_utf8_lossy(&check.stdout)
        );
    }
    Ok(())
}

/// The host's loopback ports forwarded to the guest, kept across boots (the devices of the field
/// test reconnect to the same address after a power cut, as to a gateway on the LAN).
#[derive(Debug, Clone, Copy)]
pub struct Forward {
    pub mqtt: SocketAddr,
    pub admin: SocketAddr,
}

impl Forward {
    /// Two free loopback ports.
    pub fn pick() -> anyhow::Result<Self> {
        Ok(Self {
            mqtt: free_port()?,
            admin: free_port()?,
        })
    }
}

/// A running QEMU gateway. Dropping it kills QEMU (by its PID).
#[derive(Debug)]
pub struct Guest {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    serial: Arc<Mutex<Vec<String>>>,
    /// The host's loopback address forwarded to the guest's MQTT listener.
    pub mqtt: SocketAddr,
    /// The host's loopback address forwarded to the guest's admin endpoint.
    pub admin: SocketAddr,
    /// From starting QEMU to tern's "ready" line on the console.
    pub boot_time: Duration,
}

impl Guest {
    /// Boots `arch` on `card` with `forward` and waits until tern says it is ready. The console
    /// is kept in `console_log` (appended, for a failure's post-mortem).
    pub fn boot(
        arch: Arch,
        card: &SdCard,
        forward: Forward,
        console_log: &Path,
    ) -> anyhow::Result<Self> {
        let files = boot_files(arch)?;
        let Forward { mqtt, admin } = forward;
        let netdev = format!(
            "user,id=net,hostfwd=tcp:{mqtt}-:{GUEST_MQTT_PORT},hostfwd=tcp:{admin}-:{GUEST_ADMIN_PORT}"
        );
        let started = Instant::now();
        let mut child = Command::new(arch.qemu())
            .args(arch.machine())
            .args(["-m", "512", "-smp", "1", "-no-reboot"])
            .args(["-display", "none", "-monitor", "none", "-serial", "stdio"])
            .arg("-kernel")
            .arg(&files.kernel)
            .arg("-initrd")
            .arg(&files.initrd)
            .args(["-append", "console=ttyAMA0 quiet panic=-1"])
            .arg("-drive")
            .arg(format!(
                "file={},format=raw,if=none,id=sd",
                card.path.display()
            ))
            .args(["-device", "virtio-blk-device,drive=sd"])
            .args([
                "-netdev",
                &netdev,
                "-device",
                "virtio-net-device,netdev=net",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", arch.qemu()))?;
        let serial = Arc::new(Mutex::new(Vec::new()));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(console_log)?;
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let (serial, mut log) = (Arc::clone(&serial), log.try_clone()?);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    // The guest's tty ends its lines with CR LF.
                    let line = line.trim_end_matches('\r').to_owned();
                    let _ = writeln!(log, "{line}");
                    serial.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            });
        }
        let stdin = child.stdin.take();
        let mut guest = Self {
            child: Some(child),
            stdin,
            serial,
            mqtt,
            admin,
            boot_time: Duration::ZERO,
        };
        guest
            .wait_console(BOOT_TIMEOUT, "tern's ready line", |line| {
                line.contains("tern::app") && line.ends_with(" ready")
            })
            .with_context(|| guest.console_tail(30))?;
        guest.boot_time = started.elapsed();
        Ok(guest)
    }

    /// Waits until a console line satisfies `matches`; fails at once if QEMU exits.
    pub fn wait_console(
        &mut self,
        timeout: Duration,
        what: &str,
        matches: impl Fn(&str) -> bool,
    ) -> anyhow::Result<()> {
        let serial = Arc::clone(&self.serial);
        let child = self.child.as_mut().context("QEMU already ended")?;
        wait_until(timeout, what, || {
            if serial
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|line| matches(line))
            {
                return Ok(true);
            }
            if let Some(status) = child.try_wait()? {
                bail!("QEMU exited ({status}) before {what}");
            }
            Ok(false)
        })
    }

    /// The last `count` console lines.
    pub fn console_tail(&self, count: usize) -> String {
        let lines = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        let start = lines.len().saturating_sub(count);
        lines.get(start..).unwrap_or_default().join("\n")
    }

    /// Console lines so far that contain `needle`.
    pub fn console_count(&self, needle: &str) -> usize {
        let lines = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().filter(|line| line.contains(needle)).count()
    }

    /// [`crate::Gateway::metric_sum`] through the forwarded admin endpoint.
    pub fn metric_sum(&self, name: &str, labels: &str) -> anyhow::Result<Option<u64>> {
        crate::metric_sum_at(self.admin, name, labels)
    }

    /// The power cut: SIGKILL to QEMU, then reaped.
    pub fn power_cut(mut self) -> anyhow::Result<()> {
        let mut child = self.child.take().context("QEMU already ended")?;
        child.kill().context("SIGKILL to QEMU")?;
        child.wait()?;
        Ok(())
    }

    /// A clean shutdown: "stop" on the console makes init SIGTERM tern, wait for it, unmount
    /// the card and power off. Fails unless tern exited 0 and the card was unmounted.
    pub fn shutdown(mut self) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("no console input")?;
        stdin.write_all(b"stop\n")?;
        stdin.flush()?;
        let status = self.wait_exit(Duration::from_secs(90))?;
        let tail = self.console_tail(20);
        if self.console_count("tern-guest: tern exited with 0") != 1 {
            bail!("tern did not exit 0 on SIGTERM ({status}):\n{tail}");
        }
        if self.console_count("tern-guest: SD card unmounted") != 1 {
            bail!("the SD card was not unmounted ({status}):\n{tail}");
        }
        Ok(())
    }

    fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let child = self.child.as_mut().context("QEMU already ended")?;
        let mut status = None;
        wait_until(timeout, "QEMU to power off", || {
            status = child.try_wait()?;
            Ok(status.is_some())
        })?;
        self.child = None;
        status.context("QEMU exited without a status")
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
