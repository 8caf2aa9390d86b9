//! Each broker's memory with `--idle-clients` idle MQTT clients on each architecture, as the
//! guest process holds it: QEMU user mode runs the guest inside one host process whose own
//! resident set (`VmRSS`, `VmHWM`) also holds QEMU (its code, its translation cache, its heap),
//! so that figure is printed only beside. QEMU is told to keep the whole guest address space in
//! one reserved host range (`-R`; for a 32-bit guest it reserves 4 GiB anyway) and to log, with
//! `-d page`, where the range starts and the guest's page layout after every change of it.
//!
//! - resident: the `Rss` of the host mappings inside the range (`/proc/<pid>/smaps`), the pages
//!   the guest touched (4 KiB host pages), sampled as the clients connect and every 100 ms for
//!   [`SETTLE`] after; "settled" is the last sample, "peak" the largest.
//! - address space: the size of the last page layout QEMU logged, the guest's own view (what its
//!   `/proc/self/maps` lists), and the largest logged. QEMU maps the main thread's 8 MiB stack
//!   and a 16 MiB reserve for `brk` up front where Linux grows them as used, so both are upper
//!   bounds of the device's `VmSize`/`VmPeak` by up to 24 MiB.
//!
//! No plugin runs here; it never touches a process it did not start.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Arch, Runs};
use crate::BenchError;
use crate::mqtt::load;
use crate::mqtt::servers::Server;

/// Guest address space QEMU reserves for a 64-bit guest (`-R`): far more than a broker maps.
const RESERVED_64: u64 = 64 << 30;
/// How long the clients stay connected after the last one, sampled every [`SAMPLE_EVERY`].
const SETTLE: Duration = Duration::from_secs(2);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Clients connected between two samples while connecting.
const CONNECT_STEP: usize = 100;

/// One broker's memory with the idle clients on one architecture, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryFigure {
    pub arch: Arch,
    pub broker: &'static str,
    pub clients: usize,
    /// Guest pages resident before the first client connected.
    pub start_rss_kib: u64,
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
    pub space_kib: u64,
    pub peak_space_kib: u64,
    /// The whole QEMU process's `VmHWM` (guest and QEMU).
    pub qemu_hwm_kib: u64,
}

/// Where the guest lives in the host process: `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestRange {
    pub start: u64,
    pub len: u64,
}

impl GuestRange {
    /// The range from QEMU's `-d page` log (`Locating guest address space @ 0x1000` and
    /// `pgb_reserved_va: base @ 0x1000 for 4294963200 bytes`).
    pub fn from_log(log: &str) -> Option<Self> {
        let line = log
            .lines()
            .find_map(|line| line.strip_prefix("pgb_reserved_va: base @ "))?;
        let (start, rest) = line.split_once(" for ")?;
        let len = rest.strip_suffix(" bytes")?.parse().ok()?;
        Some(Self {
            start: u64::from_str_radix(start.trim_start_matches("0x"), 16).ok()?,
            len,
        })
    }

    /// The summed `Rss` (KiB) of the mappings of `smaps` inside the range.
    pub fn resident_kib(self, smaps: &str) -> u64 {
        let mut inside = false;
        let mut total = 0;
        for line in smaps.lines() {
            if let Some((start, end)) = mapping_bounds(line) {
                inside = start >= self.start && end <= self.start.saturating_add(self.len);
            } else if let Some(rss) = line.strip_prefix("Rss:").filter(|_| inside) {
                total += rss
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
        total
    }
}

/// The bounds of an smaps mapping line (`7f00-7f10 rw-p ...`); `None` for its field lines.
fn mapping_bounds(line: &str) -> Option<(u64, u64)> {
    let (range, _) = line.split_once(' ')?;
    let (start, end) = range.split_once('-')?;
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    ))
}

/// The size in KiB of the last page layout of a `-d page` log and of its largest. A layout is a
/// `start end size prot` header and then `start-end size prot` lines in hex.
pub fn address_space_kib(log: &str) -> (u64, u64) {
    let (mut last, mut peak, mut current) = (0u64, 0u64, None::<u64>);
    for line in log.lines() {
        if line.starts_with("start ") {
            current = Some(0);
            continue;
        }
        let size = line
            .split_whitespace()
            .nth(1)
            .filter(|_| line.contains('-'))
            .and_then(|size| u64::from_str_radix(size, 16).ok());
        match (current.as_mut(), size) {
            (Some(sum), Some(size)) => *sum += size,
            (Some(sum), None) => {
                (last, peak) = (*sum / 1024, peak.max(*sum / 1024));
                current = None;
            }
            (None, _) => {}
        }
    }
    if let Some(sum) = current {
        (last, peak) = (sum / 1024, peak.max(sum / 1024));
    }
    (last, peak)
}

impl Runs<'_> {
    /// The memory figures of tern and of each peer the options name.
    pub(super) fn idle_memory(&self, clients: usize) -> Result<Vec<MemoryFigure>, BenchError> {
        let sysroot = Path::new(self.arch.cross_sysroot());
        let tern = self
            .options
            .cross_dir
            .join(self.arch.triple())
            .join("release/tern");
        let mut figures = vec![self.memory_of("tern", clients, sysroot, |mut command| {
            command.arg(&tern);
            Server::tern_under(command)
        })?];
        if let Some(peers) = &self.options.peers_dir {
            let root = peers.join(self.arch.debian());
            figures.push(self.memory_of("mosquitto", clients, &root, |mut command| {
                command.arg(root.join("usr/sbin/mosquitto"));
                Server::mosquitto_under(command)
            })?);
            let nats = root.join(super::NATS_SERVER);
            if nats.is_file() {
                figures.push(self.memory_of("nats", clients, &root, |mut command| {
                    command.arg(&nats);
                    Server::nats_under(command)
                })?);
            }
        }
        Ok(figures)
    }

    /// Starts `broker` as `start` makes it from QEMU's command, connects the clients, samples.
    fn memory_of(
        &self,
        broker: &'static str,
        clients: usize,
        sysroot: &Path,
        start: impl FnOnce(Command) -> Result<Server, BenchError>,
    ) -> Result<MemoryFigure, BenchError> {
        let log = self
            .work
            .join(format!("{broker}-{}-pages.log", self.arch.name()));
        let mut command = Command::new(self.arch.qemu_program());
        if self.arch == Arch::Aarch64 {
            command.arg("-R").arg(RESERVED_64.to_string());
        }
        command
            .args(["-d", "page", "-D"])
            .arg(&log)
            .arg("-L")
            .arg(sysroot);
        let server = start(command)?;
        let range = GuestRange::from_log(&read(&log)?)
            .ok_or_else(|| BenchError::Parse { path: log.clone() })?;
        let resident = || Ok::<_, BenchError>(range.resident_kib(&read(&smaps(&server))?));
        let start_rss_kib = resident()?;
        let mut peak_rss_kib = start_rss_kib;
        let mut connected = Vec::with_capacity(clients);
        while connected.len() < clients {
            let step = CONNECT_STEP.min(clients - connected.len());
            let more = self.runtime.block_on(load::idle_clients_from(
                server.addr,
                connected.len(),
                step,
            ))?;
            connected.extend(more);
            peak_rss_kib = peak_rss_kib.max(resident()?);
        }
        let settled = Instant::now();
        let mut rss_kib = resident()?;
        while settled.elapsed() < SETTLE {
            std::thread::sleep(SAMPLE_EVERY);
            rss_kib = resident()?;
            peak_rss_kib = peak_rss_kib.max(rss_kib);
        }
        let (_, qemu_hwm_kib) = server.rss_kib()?;
        let (space_kib, peak_space_kib) = address_space_kib(&read(&log)?);
        drop(connected);
        drop(server);
        Ok(MemoryFigure {
            arch: self.arch,
            broker,
            clients,
            start_rss_kib,
            rss_kib,
            peak_rss_kib,
            space_kib,
            peak_space_kib,
            qemu_hwm_kib,
        })
    }
}

fn smaps(server: &Server) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/{}/smaps", server.pid()))
}

fn read(path: &Path) -> Result<String, BenchError> {
    std::fs::read_to_string(path).map_err(|source| BenchError::file("reading", path, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_range_is_read_from_qemus_page_log() {
        let log = "host mmap_min_addr=0x1000\npgb_find_hole: base @ 1000 for 4294967296 bytes\n\
                   pgb_reserved_va: base @ 0x7f0000001000 for 4294963200 bytes\n";
        let range = GuestRange::from_log(log).expect("range");
        assert_eq!(range.start, 0x7f00_0000_1000);
        assert_eq!(range.len, 4_294_963_200);
        assert_eq!(GuestRange::from_log("no layout"), None);
    }

    #[test]
    fn only_the_mappings_inside_the_guest_range_count_as_resident() {
        let range = GuestRange {
            start: 0x1000,
            len: 0x10_0000,
        };
        let smaps = "00001000-00003000 r-xp 00000000 08:01 12 /guest/tern\n\
                     Size:                  8 kB\nRss:                   8 kB\n\
                     00010000-00020000 rw-p 00000000 00:00 0\nRss:                  40 kB\n\
                     55550000-55560000 r-xp 00000000 08:01 13 /usr/bin/qemu-arm\n\
                     Rss:                  64 kB\n";
        assert_eq!(range.resident_kib(smaps), 48);
    }

    #[test]
    fn the_address_space_is_the_last_layout_and_the_peak_the_largest() {
        let log = "page layout changed following mmap\nstart    end      size     prot\n\
                   00010000-00012000 00002000 r-x\n00020000-00030000 00010000 ---\n\
                   page layout changed following munmap\nstart    end      size     prot\n\
                   00010000-00012000 00002000 r-x\n";
        assert_eq!(address_space_kib(log), (8, 72));
    }
}
