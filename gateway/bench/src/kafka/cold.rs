//! `tern-bench cold-read`: what a consumer replaying a cold backlog does to every other
//! connection's acknowledgements. tern (`$TERN_BIN` or the build beside tern-bench) runs with its
//! data on `--dir` (a loop-mounted file system: `scripts/cold-read-bench.sh`), in a cgroup v1
//! `blkio` group that limits reads from that device to `--read-iops` (an SD card's random reads
//! take milliseconds); writes are not limited. A backlog is produced through the Kafka
//! listener, the page cache dropped, then one MQTT publisher sends QoS 1 messages one at a time
//! and the PUBACK latency is measured twice: alone (the anchor), and while `kcat` fetches the
//! backlog from offset 0. Root only (the cgroup, `drop_caches`).
//!
//! It removes its cgroup and ends its kcat and tern by their PIDs; it never touches a
//! process or directory it did not create.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde::Serialize;

use super::kcat;
use crate::BenchError;
use crate::mqtt::load::{self, Load};
use crate::mqtt::servers::Server;
use crate::stats::percentile;

/// The topic the backlog is produced to and fetched from.
const BACKLOG: &str = "cold-backlog";

/// What a `tern-bench cold-read` run does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdReadOptions {
    /// Where tern's data directory is made (the slow device's mount).
    pub dir: PathBuf,
    /// Backlog records and their value bytes.
    pub records: u64,
    pub size: usize,
    /// Reads a second the tern process may make from the data directory's device.
    pub read_iops: u64,
    /// QoS 1 messages per measured phase.
    pub messages: usize,
}

/// PUBACK latency of one phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Phase {
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// The figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub tern: String,
    pub backlog_mib: f64,
    pub read_iops: u64,
    pub messages: usize,
    /// No consumer.
    pub anchor: Phase,
    /// While kcat fetches the cold backlog from offset 0.
    pub cold_read: Phase,
    /// Whether kcat was still reading when the phase ended (the phase overlapped the read).
    pub consumer_still_reading: bool,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "tern {}: {:.0} MiB cold backlog, reads limited to {}/s, {} QoS 1 messages a phase",
            self.tern, self.backlog_mib, self.read_iops, self.messages
        )?;
        for (name, phase) in [("anchor", self.anchor), ("cold read", self.cold_read)] {
            writeln!(
                f,
                "  PUBACK {name:<9}  p50 {:>9.0} us  p99 {:>9.0} us  max {:>9.0} us",
                phase.p50_us, phase.p99_us, phase.max_us
            )?;
        }
        writeln!(
            f,
            "  p99 ratio (cold read / anchor): {:.1}; consumer still reading at the end: {}",
            self.cold_read.p99_us / self.anchor.p99_us.max(1.0),
            self.consumer_still_reading
        )
    }
}

/// Runs the bench.
pub fn run(options: &ColdReadOptions) -> Result<Report, BenchError> {
    let (tern, mqtt) = Server::tern_kafka_mqtt(&options.dir, &[])?;
    let bootstrap = tern.addr.to_string();
    let group = ReadLimit::new(&options.dir, tern.pid(), options.read_iops)?;
    let values = kcat::Values::write(&options.dir, options.records, options.size)?;
    kcat::produce(&bootstrap, BACKLOG, &values)?;
    drop(values);
    eprintln!("backlog produced; dropping the page cache");
    drop_page_cache()?;
    let runtime = tokio::runtime::Runtime::new().map_err(|source| BenchError::Io {
        what: "starting the bench runtime",
        source,
    })?;
    let anchor = runtime.block_on(measure(mqtt, options.messages, "anchor"))?;
    eprintln!("anchor done; fetching the backlog from offset 0");
    let mut consumer = Consumer::start(&bootstrap)?;
    let cold_read = runtime.block_on(measure(mqtt, options.messages, "cold"))?;
    let consumer_still_reading = consumer.running();
    drop(consumer);
    drop(tern);
    drop(group);
    Ok(Report {
        tern: crate::tern_binary()?.display().to_string(),
        backlog_mib: (options.records * options.size as u64) as f64 / f64::from(1 << 20),
        read_iops: options.read_iops,
        messages: options.messages,
        anchor,
        cold_read,
        consumer_still_reading,
    })
}

/// PUBACK latencies of `messages` QoS 1 publishes of 100 bytes, one in flight at a time.
async fn measure(mqtt: SocketAddr, messages: usize, label: &str) -> Result<Phase, BenchError> {
    let shape = Load {
        publishers: 1,
        messages,
        size: 100,
        qos1: true,
        window: 1,
    };
    let measured = load::run(mqtt, shape, label).await?;
    let at = |p| percentile(&measured.latencies_us, p).unwrap_or(0.0);
    Ok(Phase {
        p50_us: at(50.0),
        p99_us: at(99.0),
        max_us: at(100.0),
    })
}

/// Writes back dirty pages and drops the clean ones, so the backlog is read from the device.
fn drop_page_cache() -> Result<(), BenchError> {
    // SAFETY: sync takes no arguments and only schedules writeback.
    unsafe { libc::sync() };
    let path = Path::new("/proc/sys/vm/drop_caches");
    std::fs::write(path, "3\n").map_err(|e| BenchError::file("write", path, e))
}

/// `kcat -C` from the beginning of the backlog to its end, output discarded.
struct Consumer(Child);

impl Consumer {
    fn start(bootstrap: &str) -> Result<Self, BenchError> {
        let child = Command::new("kcat")
            .args(["-C", "-b", bootstrap, "-t", BACKLOG, "-o", "beginning"])
            .args(["-e", "-q"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| BenchError::Io {
                what: "starting kcat",
                source,
            })?;
        Ok(Self(child))
    }

    fn running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // Child::kill sends SIGKILL to this child's own PID.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cgroup v1 `blkio` group holding tern, its reads from one device limited; removed on drop
/// (after tern has ended).
struct ReadLimit(PathBuf);

impl ReadLimit {
    fn new(dir: &Path, pid: u32, iops: u64) -> Result<Self, BenchError> {
        let dev = std::fs::metadata(dir)
            .map_err(|e| BenchError::file("stat", dir, e))?
            .dev();
        let group = PathBuf::from(format!(
            "/sys/fs/cgroup/blkio/tern-bench-cold-{}",
            std::process::id()
        ));
        let write = |name: &str, text: String| {
            let path = group.join(name);
            std::fs::write(&path, text).map_err(|e| BenchError::file("write", &path, e))
        };
        std::fs::create_dir(&group).map_err(|e| BenchError::file("create", &group, e))?;
        let limit = Self(group.clone());
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        write(
            "blkio.throttle.read_iops_device",
            format!("{major}:{minor} {iops}\n"),
        )?;
        write("cgroup.procs", format!("{pid}\n"))?;
        Ok(limit)
    }
}

impl Drop for ReadLimit {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}
