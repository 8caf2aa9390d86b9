//! Harness for the sensor firmware: builds it for a board with the distro toolchain (the same
//! commands as `scripts/firmware.sh`), boots it in `qemu-system-arm` with its UART on a TCP
//! connection to an MQTT server, and decodes its defmt log with `defmt-print`. A [`Device`] is
//! what a build is provisioned with (device id, password) and writes its login into a gateway's
//! password file with `tern passwd`.
//! Every QEMU it starts is ended by its own PID when the handle drops.

use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::workspace_root;

/// A board the firmware supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Board {
    Lm3s6965evb,
    Mps2An385,
}

impl Board {
    pub const ALL: [Board; 2] = [Board::Lm3s6965evb, Board::Mps2An385];

    /// The cargo feature, QEMU machine and `boards/` directory name.
    pub fn name(self) -> &'static str {
        match self {
            Board::Lm3s6965evb => "lm3s6965evb",
            Board::Mps2An385 => "mps2-an385",
        }
    }

    /// The device id a default build publishes as (`TERN_DEVICE_ID` unset).
    pub fn device_id(self) -> u32 {
        match self {
            Board::Lm3s6965evb => 1,
            Board::Mps2An385 => 2,
        }
    }
}

/// The build-time provisioning of one device (`firmware/build.rs`): `TERN_DEVICE_ID` and
/// `TERN_DEVICE_PASSWORD`. The device's client id is `tern-{id}`, its topics `sensors/{id}/…`
/// and, with a password, its MQTT username `{id}`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Device {
    pub id: u32,
    /// `None` builds a device that connects anonymously.
    pub password: Option<String>,
    /// `TERN_PERIOD_MS`, the sampling period; `None` keeps the firmware's default (200 ms).
    pub period_ms: Option<u32>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.id)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("period_ms", &self.period_ms)
            .finish()
    }
}

impl Device {
    /// A device that connects without credentials.
    pub fn anonymous(id: u32) -> Self {
        Self {
            id,
            password: None,
            period_ms: None,
        }
    }

    /// A device that logs in as `{id}` with `password`.
    pub fn provisioned(id: u32, password: &str) -> Self {
        Self {
            id,
            password: Some(password.to_owned()),
            period_ms: None,
        }
    }

    /// The same device sampling every `period_ms` (its 64-reading backlog then spans
    /// 64 × `period_ms` of gateway downtime).
    pub fn with_period_ms(mut self, period_ms: u32) -> Self {
        self.period_ms = Some(period_ms);
        self
    }

    /// The MQTT username the firmware sends: the device id in decimal.
    pub fn username(&self) -> String {
        self.id.to_string()
    }

    /// Adds (or replaces) this device's login in `passwd_file` with `tern passwd FILE USER`,
    /// the command an operator runs on the gateway. Fails for an anonymous device.
    pub fn provision(&self, passwd_file: &Path) -> anyhow::Result<()> {
        let password = self
            .password
            .as_deref()
            .context("an anonymous device has no login to provision")?;
        crate::tern_passwd(passwd_file, &self.username(), password)
    }

    /// Where [`build_device`] keeps this device's ELF: the board's default device (anonymous,
    /// default id) at `<board>.elf` as before, any other at a name unique to its settings.
    fn elf_name(&self, board: Board) -> String {
        if *self == Device::anonymous(board.device_id()) {
            return format!("{}.elf", board.name());
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut hasher);
        format!(
            "{}-device{}-{:016x}.elf",
            board.name(),
            self.id,
            hasher.finish()
        )
    }
}

/// Builds the release firmware for `board` (semihosting logging) as the board's default device
/// (its [`Board::device_id`], anonymous) and returns a copy of its ELF at
/// `firmware/target/elf/<board>.elf`.
pub fn build(board: Board) -> anyhow::Result<PathBuf> {
    build_device(board, &Device::anonymous(board.device_id()))
}

/// Builds the release firmware for `board` (semihosting logging) provisioned as `device` and
/// returns a copy of its ELF under `firmware/target/elf/`, one file per board and device
/// settings. Builds are serialised: every build shares one target dir (a change of settings
/// reruns the build script and relinks the firmware, a few seconds).
pub fn build_device(board: Board, device: &Device) -> anyhow::Result<PathBuf> {
    static BUILD: Mutex<()> = Mutex::new(());
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let firmware = workspace_root().join("firmware");
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let mut command = Command::new("/usr/bin/cargo");
    command.env("TERN_DEVICE_ID", device.id.to_string());
    match &device.password {
        Some(password) => command.env("TERN_DEVICE_PASSWORD", password),
        None => command.env_remove("TERN_DEVICE_PASSWORD"),
    };
    match device.period_ms {
        Some(period_ms) => command.env("TERN_PERIOD_MS", period_ms.to_string()),
        None => command.env_remove("TERN_PERIOD_MS"),
    };
    let status = command
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "--no-default-features",
        ])
        .arg("--features")
        .arg(format!("{},semihosting", board.name()))
        .current_dir(&firmware)
        .env("PATH", path)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", firmware.join("target"))
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .context(
            "cannot run Debian's cargo (/usr/bin/cargo; scripts/ensure-deps.sh installs it)",
        )?;
    if !status.success() {
        bail!(
            "building the firmware for {} failed: {status}",
            board.name()
        );
    }
    let built = firmware.join("target/thumbv7m-none-eabi/release/tern-firmware");
    let elf_dir = firmware.join("target/elf");
    std::fs::create_dir_all(&elf_dir)?;
    let elf = elf_dir.join(device.elf_name(board));
    std::fs::copy(&built, &elf).with_context(|| format!("copying {}", built.display()))?;
    Ok(elf)
}

/// A running `qemu-system-arm` with the firmware.
#[derive(Debug)]
pub struct Qemu {
    child: Option<Child>,
    elf: PathBuf,
    defmt: PathBuf,
}

impl Qemu {
    /// Boots `elf` on `board` with UART0 connected to `mqtt` (QEMU reconnects a second after the
    /// server closes the connection). defmt frames are collected in `dir/defmt.bin`.
    pub fn boot(board: Board, elf: &Path, mqtt: SocketAddr, dir: &Path) -> anyhow::Result<Self> {
        let defmt = dir.join(format!("{}-defmt.bin", board.name()));
        let stdout = std::fs::File::create(&defmt)?;
        let stderr = std::fs::File::create(dir.join(format!("{}-qemu.log", board.name())))?;
        let child = Command::new("qemu-system-arm")
            .args([
                "-machine",
                board.name(),
                "-display",
                "none",
                "-monitor",
                "none",
            ])
            .args(["-semihosting-config", "enable=on,target=native"])
            .arg("-serial")
            .arg(format!("tcp:{mqtt},reconnect=1"))
            .arg("-kernel")
            .arg(elf)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .context("cannot start qemu-system-arm (scripts/ensure-deps.sh installs it)")?;
        Ok(Self {
            child: Some(child),
            elf: elf.to_path_buf(),
            defmt,
        })
    }

    /// Waits for QEMU to exit (the firmware exits it on `halt`), failing after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let child = self.child.as_mut().context("QEMU already reaped")?;
        let mut status = None;
        crate::wait_until(timeout, "QEMU to exit", || {
            status = child.try_wait()?;
            Ok(status.is_some())
        })?;
        self.child = None;
        status.context("QEMU exited without a status")
    }

    /// The defmt log so far, decoded by `defmt-print` into text lines.
    pub fn log(&self) -> anyhow::Result<String> {
        let input = std::fs::File::open(&self.defmt)?;
        let output = Command::new(defmt_print()?)
            .arg("-e")
            .arg(&self.elf)
            .stdin(input)
            .output()
            .context("cannot run defmt-print")?;
        if !output.status.success() {
            bail!(
                "defmt-print failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `defmt-print`, installed with `cargo install defmt-print --locked` when it is missing.
pub fn defmt_print() -> anyhow::Result<PathBuf> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .map(|home| home.join("bin").join("defmt-print"));
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("defmt-print"))
            .find(|candidate| candidate.is_file())
    });
    if let Some(found) = on_path.or(cargo_bin.clone().filter(|p| p.is_file())) {
        return Ok(found);
    }
    let status = Command::new("cargo")
        .args(["install", "defmt-print", "--locked", "--quiet"])
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .context("cannot run cargo install defmt-print")?;
    match cargo_bin {
        Some(path) if status.success() && path.is_file() => Ok(path),
        _ => bail!("cargo install defmt-print failed: {status}"),
    }
}
