//! `tern-bench wear`: what a Pi owner's SD card lives with at sensor rates. A trickle of QoS 1
//! messages (`trickle.rs`: 50 clients, 100 B, 10/100/1,000 messages a second by default)
//! against `tern serve` with its defaults, its data directory on a fresh loop-mounted ext4 (root)
//! whose sectors-written counter gives the device bytes; beside it SQLite in WAL mode with
//! `synchronous=FULL` storing the same messages at tern's commit cadence (`sqlite.rs`). Prints
//! device bytes per message, GB a day, the projected card lifetime and PUBACK p50/p99, as
//! medians over repetitions (`report.rs`).
//!
//! tern runs twice per repetition: on a fresh data directory (its segment's blocks are still
//! unwritten, so commits zero ahead of themselves), and in the steady state a card lives in
//! for nearly all its life: the same fresh directory first aged (`age`) by a flood of large
//! messages through the same server until the default retention has deleted a segment and a
//! roll has reused that file for the active segment, so the trickle writes into blocks that
//! hold older batches, as it does once retention recycles; the trickle then runs
//! `AGE_SETTLE` (30 s) before its warmup, so the flood's own writeback is not measured.
//!
//! It must never touch a data directory, mount or process it did not create.

mod report;
#[cfg(feature = "sqlite")]
mod sqlite;
mod trickle;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::BenchError;
use crate::log::device::Target;
use crate::mqtt::load;
use crate::mqtt::servers::Server;
use crate::stats::percentile;

pub use report::Report;

/// Size of the ext4 image each run gets: room for the default retention (1 GiB) of the aged
/// runs, the active segment and the spare.
const IMAGE_BYTES: u64 = 2 << 30;
/// Payload of the aging flood's messages, and how many each of its publishers sends a round.
const AGE_MESSAGE: usize = 64 << 10;
const AGE_PUBLISHERS: usize = 4;
const AGE_ROUND: usize = 64;
/// After aging, the trickle runs this long before the warmup: the flood's aftermath (ext4's
/// writeback of dirty pages and metadata expires after 30 s, retention's deletions, the
/// journal's checkpoints) is not the steady state.
const AGE_SETTLE: Duration = Duration::from_secs(30);
/// The aging gives up after this many bytes (the default retention is 1 GiB).
const AGE_LIMIT: u64 = 3 << 30;

pub use crate::cli::DirState;

impl DirState {
    pub fn store(self) -> &'static str {
        match self {
            Self::Fresh => "tern fresh dir",
            Self::Steady => "tern steady",
        }
    }
}

/// What aging a data directory took.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Aged {
    pub bytes: u64,
    pub seconds: f64,
    pub segments_deleted: f64,
}

/// What `tern-bench wear` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct WearOptions {
    /// Messages per second of each workload.
    pub rates: Vec<f64>,
    pub clients: usize,
    pub size: usize,
    /// Publishing before the counters are read (segment creation, connections).
    pub warmup: Duration,
    /// The measured interval.
    pub seconds: Duration,
    pub repetitions: usize,
    /// The data directories tern runs from (each repetition runs each).
    pub states: Vec<DirState>,
    pub dir: Option<PathBuf>,
    pub no_loop: bool,
    /// Card the lifetime is projected for.
    pub card_bytes: u64,
    pub card_cycles: u64,
    /// Extra TOML appended to tern's config (printed in the report).
    pub tern_extra: String,
    /// Remount each loop-mounted image with `lazytime` (inode times kept in memory).
    pub lazytime: bool,
}

impl WearOptions {
    fn validate(&self) -> Result<(), BenchError> {
        let bad = |option, reason| Err(BenchError::Invalid { option, reason });
        if self.rates.is_empty() || self.rates.iter().any(|r| !(*r > 0.0 && r.is_finite())) {
            return bad("--rates", "must be positive numbers");
        }
        if self.clients == 0 {
            return bad("--clients", "must be at least 1");
        }
        if self.repetitions == 0 {
            return bad("--repetitions", "must be at least 1");
        }
        if self.states.is_empty() {
            return bad("--states", "must name fresh, steady or both");
        }
        if self.seconds.is_zero() {
            return bad("--seconds", "must be at least 1");
        }
        Ok(())
    }

    /// Every setting of tern's config that is not its default.
    fn tern_config(&self, data_dir: &Path) -> String {
        format!(
            "data_dir = {:?}\n[mqtt]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{}",
            data_dir.display().to_string(),
            self.tern_extra
        )
    }
}

/// The figures of one run of one store at one rate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Measured {
    pub messages: u64,
    pub device_bytes: u64,
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Commits (fdatasyncs of the data) per second.
    pub commits_per_sec: f64,
    /// Of `device_bytes`, the ext4 journal's (`/proc/fs/jbd2/<dev>-8/info`), where readable.
    pub journal_bytes: Option<u64>,
    /// tern only: bytes its log handed to write calls (batches and zeros ahead), and of them
    /// the batches stored (the partition's growth).
    pub written_bytes: Option<u64>,
    pub stored_bytes: Option<u64>,
    /// tern only: the commit window its wear controller chose at the end.
    pub window_ms: Option<f64>,
    /// tern only, steady state: the aging before the run.
    pub aged: Option<Aged>,
}

impl Measured {
    fn new(
        mut latencies: Vec<Duration>,
        device_bytes: u64,
        elapsed: Duration,
        commits_per_sec: f64,
    ) -> Self {
        latencies.sort_unstable();
        let ms = |p| percentile(&latencies, p).map_or(0.0, |d| d.as_secs_f64() * 1e3);
        Self {
            messages: latencies.len() as u64,
            device_bytes,
            seconds: elapsed.as_secs_f64(),
            p50_ms: ms(50.0),
            p99_ms: ms(99.0),
            commits_per_sec,
            journal_bytes: None,
            written_bytes: None,
            stored_bytes: None,
            window_ms: None,
            aged: None,
        }
    }
}

/// The run `tern-bench wear`'s flags describe.
pub fn options(args: &crate::cli::WearArgs) -> WearOptions {
    WearOptions {
        rates: args.rates.clone(),
        clients: args.clients,
        size: args.size,
        warmup: Duration::from_secs(args.warmup),
        seconds: Duration::from_secs(args.seconds),
        repetitions: args.repetitions,
        states: args.states.clone(),
        dir: args.dir.clone(),
        no_loop: args.no_loop,
        card_bytes: args.card_bytes,
        card_cycles: args.card_cycles,
        tern_extra: args.tern_config.replace("\\n", "\n"),
        lazytime: args.lazytime,
    }
}

/// Runs every rate `repetitions` times and returns the medians.
pub fn run(options: &WearOptions) -> Result<Report, BenchError> {
    options.validate()?;
    let runtime = crate::runtime(None)?;
    let parent = options.dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut report = Report::new(options);
    for &rate in &options.rates {
        for rep in 1..=options.repetitions {
            // The cadence of the last tern run, which SQLite commits at.
            #[cfg(feature = "sqlite")]
            let mut cadence = 0.0;
            for &state in &options.states {
                eprintln!(
                    "tern bench wear: {rate} msg/s, run {rep}: {}",
                    state.store()
                );
                let target = prepare(options, &parent)?;
                report.counted_by(&target);
                let tern = runtime.block_on(tern_run(options, &target, rate, state))?;
                drop(target);
                #[cfg(feature = "sqlite")]
                {
                    cadence = tern.commits_per_sec;
                }
                report.add_tern(rate, state, tern);
            }
            #[cfg(feature = "sqlite")]
            {
                eprintln!("tern bench wear: {rate} msg/s, run {rep}: SQLite");
                // The cadence of the last tern run (the steady state's when it ran).
                let interval = Duration::from_secs_f64(1.0 / f64::max(cadence, 0.1));
                let target = prepare(options, &parent)?;
                let db = target.dir().join("sqlite");
                let lite =
                    sqlite::run(&target, &db, rate, options.size, interval, options.seconds)?;
                report.add_sqlite(rate, lite);
            }
        }
    }
    Ok(report)
}

/// A fresh image (or directory), remounted with `lazytime` when asked.
fn prepare(options: &WearOptions, parent: &Path) -> Result<Target, BenchError> {
    let target = Target::prepare(parent, IMAGE_BYTES, !options.no_loop)?;
    let on_loop = matches!(target.counter(), crate::log::device::Counter::Device { .. });
    if options.lazytime && on_loop {
        let dir = target.dir().display().to_string();
        let out = std::process::Command::new("mount")
            .args(["-o", "remount,lazytime", &dir])
            .output()
            .map_err(|source| BenchError::Io {
                what: "remounting with lazytime",
                source,
            })?;
        if !out.status.success() {
            return Err(BenchError::Tool {
                program: "mount".to_owned(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
    }
    Ok(target)
}

/// One trickle against a fresh `tern serve` whose data directory is on `target`, aged first
/// for the steady state.
async fn tern_run(
    options: &WearOptions,
    target: &Target,
    rate: f64,
    state: DirState,
) -> Result<Measured, BenchError> {
    let data_dir = target.dir().join("tern");
    let mut server = Server::tern_configured(&options.tern_config(&data_dir))?;
    let admin = server.wait_for_line("admin endpoint listening on ")?;
    let aged = match state {
        DirState::Fresh => None,
        DirState::Steady => Some(age(server.addr, admin).await?),
    };
    let shape = trickle::Trickle {
        clients: options.clients,
        rate,
        size: options.size,
    };
    let running = trickle::start(server.addr, shape).await?;
    if aged.is_some() {
        tokio::time::sleep(AGE_SETTLE).await;
    }
    tokio::time::sleep(options.warmup).await;
    let journal0 = journal_bytes(target);
    let s0 = snapshot(target, admin)?;
    let t0 = tokio::time::Instant::now();
    tokio::time::sleep(options.seconds).await;
    let s1 = snapshot(target, admin)?;
    let journal1 = journal_bytes(target);
    let t1 = tokio::time::Instant::now();
    let acked = running.stop().await?;
    let latencies = acked
        .iter()
        .filter(|a| a.sent >= t0 && a.sent < t1)
        .map(|a| a.latency)
        .collect();
    let elapsed = t1 - t0;
    let mut measured = Measured::new(
        latencies,
        s1.device.saturating_sub(s0.device),
        elapsed,
        (s1.commits - s0.commits).max(0.0) / elapsed.as_secs_f64(),
    );
    measured.journal_bytes = journal0.zip(journal1).map(|(a, b)| b.saturating_sub(a));
    measured.written_bytes = Some((s1.written - s0.written).max(0.0) as u64);
    measured.stored_bytes = Some((s1.stored - s0.stored).max(0.0) as u64);
    measured.window_ms = Some(s1.window_s * 1e3);
    measured.aged = aged;
    Ok(measured)
}

/// Floods the server with large QoS 1 messages, in rounds of 16 MiB, until retention (the
/// default, 1 GiB) has deleted a segment (its file becomes the spare) and a roll after that has
/// taken the spare for the active segment: from then on the trickle writes into blocks that
/// hold older batches, as in a card's steady state.
async fn age(broker: SocketAddr, admin: SocketAddr) -> Result<Aged, BenchError> {
    let started = tokio::time::Instant::now();
    let shape = load::Load {
        publishers: AGE_PUBLISHERS,
        messages: AGE_ROUND,
        size: AGE_MESSAGE,
        qos1: true,
        window: 8,
    };
    let round_bytes = (AGE_PUBLISHERS * AGE_ROUND * AGE_MESSAGE) as u64;
    let mut bytes = 0;
    // Segments rolled when a deletion was first seen.
    let mut rolled_at_delete = None;
    loop {
        let metrics = crate::mqtt::servers::http_get(admin, "/metrics")?;
        let deleted = metric(&metrics, "tern_log_segments_deleted_total").unwrap_or(0.0);
        let rolled = metric(&metrics, "tern_log_segments_rolled_total").unwrap_or(0.0);
        if deleted >= 1.0 {
            let at = *rolled_at_delete.get_or_insert(rolled);
            if rolled > at {
                return Ok(Aged {
                    bytes,
                    seconds: started.elapsed().as_secs_f64(),
                    segments_deleted: deleted,
                });
            }
        }
        if bytes >= AGE_LIMIT {
            return Err(BenchError::Invalid {
                option: "aging",
                reason: "retention recycled no segment after 3 GiB (not the default retention?)",
            });
        }
        load::run(broker, shape, &format!("age{}", bytes / round_bytes)).await?;
        bytes += round_bytes;
    }
}

/// Bytes the ext4 journal of the loop device has written since it was mounted: transactions
/// × logged blocks per transaction (descriptor, metadata and commit blocks) × 4 KiB, from
/// jbd2's averages (rounded, so a breakdown, not an exact count).
fn journal_bytes(target: &Target) -> Option<u64> {
    let crate::log::device::Counter::Device { name } = target.counter() else {
        return None;
    };
    let text = std::fs::read_to_string(format!("/proc/fs/jbd2/{name}-8/info")).ok()?;
    parse_jbd2(&text)
}

fn parse_jbd2(text: &str) -> Option<u64> {
    let transactions: u64 = text.split_whitespace().next()?.parse().ok()?;
    let logged: u64 = text.lines().find_map(|l| {
        l.trim()
            .strip_suffix("logged blocks per transaction")?
            .trim()
            .parse()
            .ok()
    })?;
    Some(transactions * logged * 4096)
}

/// The counters of one moment of a tern run.
struct Snapshot {
    /// Device bytes written, after writing back everything dirty.
    device: u64,
    commits: f64,
    /// Bytes the log handed to write calls.
    written: f64,
    /// Bytes the bench's partition holds.
    stored: f64,
    window_s: f64,
}

fn snapshot(target: &Target, admin: SocketAddr) -> Result<Snapshot, BenchError> {
    target.sync()?;
    let device = target.written()?;
    let metrics = crate::mqtt::servers::http_get(admin, "/metrics")?;
    let get = |name| metric(&metrics, name).unwrap_or(0.0);
    Ok(Snapshot {
        device,
        commits: get("tern_log_commits_total"),
        written: get("tern_log_bytes_written_total"),
        stored: metric(
            &metrics,
            "tern_log_partition_bytes{topic=\"mqtt\",partition=\"0\"}",
        )
        .unwrap_or(0.0),
        window_s: get("tern_log_commit_window_seconds"),
    })
}

/// The value of the unlabelled sample `name` in a Prometheus text page.
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_bytes_are_transactions_times_logged_blocks() {
        let info = "112 transactions (112 requested), each up to 5461 blocks\naverage: \n  \
                    1 blocks per transaction\n  3 logged blocks per transaction\n";
        assert_eq!(parse_jbd2(info), Some(112 * 3 * 4096));
        assert_eq!(parse_jbd2("x"), None);
    }

    #[test]
    fn metrics_are_read_by_exact_name() {
        let page = "# HELP x\ntern_log_commits_total_x 9\ntern_log_commits_total 42\n";
        assert_eq!(metric(page, "tern_log_commits_total"), Some(42.0));
        assert_eq!(metric(page, "tern_log_fsyncs_total"), None);
    }

    #[test]
    fn the_tern_config_changes_only_addresses_and_the_data_dir() {
        let options = WearOptions {
            rates: vec![100.0],
            clients: 50,
            size: 100,
            warmup: Duration::from_secs(1),
            seconds: Duration::from_secs(1),
            repetitions: 1,
            states: vec![DirState::Fresh, DirState::Steady],
            dir: None,
            no_loop: true,
            card_bytes: 32_000_000_000,
            card_cycles: 1000,
            tern_extra: String::new(),
            lazytime: false,
        };
        let text = options.tern_config(Path::new("d"));
        assert_eq!(
            text,
            "data_dir = \"d\"\n[mqtt]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
        );
        assert!(options.validate().is_ok());
        let none = WearOptions {
            rates: vec![],
            ..options
        };
        assert!(none.validate().is_err());
    }
}
