//! Device bytes written for `/metrics`: the block device holding the data directory (its
//! `/sys/dev/block/MAJOR:MINOR/stat` sectors-written counter: every writer of that device,
//! with the file system's journal and metadata), or, where there is none (tmpfs, overlay, a
//! container without `/sys`), this process's `write_bytes` from `/proc/self/io`; the `source`
//! label says which. Also the card lifetime projected at that rate from `[log.flush.wear]`'s
//! card size and cycles ([`tern_log::WearConfig::lifetime_years`]): the one projection, which
//! the status page takes from here.
//!
//! It only reads counters; it never writes anything.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tern_core::metrics::{MetricsSource, write_single};

/// The rate behind the projection is measured over at least this long.
const RATE_WINDOW: Duration = Duration::from_secs(60);

/// Where the count of bytes written comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteCounter {
    /// Sectors written of the block device (a partition or a whole disk) `name`.
    Block { name: String, stat: PathBuf },
    /// `write_bytes` of `/proc/self/io`.
    Process,
}

impl WriteCounter {
    /// The counter of the device holding `dir`, or the process's own.
    pub fn for_dir(dir: &Path) -> Self {
        let Ok(meta) = std::fs::metadata(dir) else {
            return Self::Process;
        };
        let dev = meta.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let link = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
        let stat = link.join("stat");
        let name = std::fs::canonicalize(&link)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        match name {
            Some(name) if major != 0 && sectors_written(&stat).is_some() => {
                Self::Block { name, stat }
            }
            _ => Self::Process,
        }
    }

    /// Bytes written so far by this counter's measure.
    pub fn read(&self) -> Option<u64> {
        match self {
            Self::Block { stat, .. } => sectors_written(stat).map(|s| s * 512),
            Self::Process => {
                let text = std::fs::read_to_string("/proc/self/io").ok()?;
                text.lines()
                    .find_map(|l| l.strip_prefix("write_bytes:"))
                    .and_then(|v| v.trim().parse().ok())
            }
        }
    }

    /// What it counts, for a sentence.
    pub fn describe(&self) -> String {
        match self {
            Self::Block { name, .. } => format!("the block device {name}"),
            Self::Process => "this process (/proc/self/io write_bytes)".to_owned(),
        }
    }

    /// The labels of its samples.
    pub fn labels(&self) -> String {
        match self {
            Self::Block { name, .. } => format!("source=\"block-device\",device=\"{name}\""),
            Self::Process => "source=\"process\"".to_owned(),
        }
    }
}

fn sectors_written(stat: &Path) -> Option<u64> {
    parse_sectors_written(&std::fs::read_to_string(stat).ok()?)
}

/// The 7th field of a block device's `stat` line.
pub fn parse_sectors_written(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(6)?.parse().ok()
}

#[derive(Debug)]
struct Marks {
    /// (when, bytes) at the start of the rate window, and at its latest move.
    from: (Instant, u64),
    last: (Instant, u64),
}

/// `/metrics` families of the data directory's device.
#[derive(Debug)]
pub struct DeviceMetrics {
    counter: WriteCounter,
    start: u64,
    wear: tern_log::WearConfig,
    marks: Mutex<Marks>,
}

/// The card's projected lifetime at the device's write rate: the figure `/metrics` and the
/// status page both show.
#[derive(Debug, Clone, PartialEq)]
pub struct CardLifetime {
    /// Infinite at rest.
    pub years: f64,
    /// Device bytes a second over the last minute or more.
    pub bytes_per_sec: f64,
    pub card_bytes: u64,
    pub write_cycles: u32,
}

impl CardLifetime {
    /// The value of `tern_card_lifetime_projected_years`.
    pub fn metric_value(&self) -> String {
        if self.years.is_finite() {
            format!("{:.2}", self.years)
        } else {
            "+Inf".to_owned()
        }
    }
}

impl DeviceMetrics {
    pub fn new(data_dir: &Path, wear: &tern_log::WearConfig) -> Self {
        let counter = WriteCounter::for_dir(data_dir);
        let start = counter.read().unwrap_or(0);
        let now = Instant::now();
        Self {
            counter,
            start,
            wear: wear.clone(),
            marks: Mutex::new(Marks {
                from: (now, start),
                last: (now, start),
            }),
        }
    }

    /// Bytes a second over the last window of at least [`RATE_WINDOW`] (since start before).
    fn rate(&self, now: Instant, bytes: u64) -> f64 {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        if now.saturating_duration_since(marks.last.0) >= RATE_WINDOW {
            marks.from = marks.last;
            marks.last = (now, bytes);
        }
        let seconds = now.saturating_duration_since(marks.from.0).as_secs_f64();
        if seconds <= 0.0 {
            return 0.0;
        }
        bytes.saturating_sub(marks.from.1) as f64 / seconds
    }
}

impl DeviceMetrics {
    /// The counter the rate is measured on.
    pub fn counter(&self) -> &WriteCounter {
        &self.counter
    }

    /// Bytes written since start and the rate now; `None` when the counter cannot be read.
    fn measure(&self) -> Option<(u64, f64)> {
        let bytes = self.counter.read()?;
        Some((
            bytes.saturating_sub(self.start),
            self.rate(Instant::now(), bytes),
        ))
    }

    /// The card's lifetime at `bytes_per_sec`.
    pub fn lifetime_at(&self, bytes_per_sec: f64) -> CardLifetime {
        CardLifetime {
            years: self.wear.lifetime_years(bytes_per_sec),
            bytes_per_sec,
            card_bytes: self.wear.card_size.0,
            write_cycles: self.wear.write_cycles,
        }
    }

    /// The card's lifetime at the current rate; `None` when the counter cannot be read.
    pub fn card_lifetime(&self) -> Option<CardLifetime> {
        self.measure().map(|(_, rate)| self.lifetime_at(rate))
    }
}

impl MetricsSource for DeviceMetrics {
    fn render(&self, out: &mut String) {
        let Some((written, rate)) = self.measure() else {
            return;
        };
        let labels = self.counter.labels();
        let families = [
            (
                "tern_device_written_bytes_total",
                "counter",
                "Bytes written since tern started: by the block device holding the data directory (source=block-device, every writer of it) or by this process (source=process).",
                written as f64,
            ),
            (
                "tern_device_write_bytes_per_second",
                "gauge",
                "The same, a second, over the last minute or more.",
                rate,
            ),
        ];
        for (name, kind, help, value) in families {
            use std::fmt::Write as _;
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{{{labels}}} {value:.0}");
        }
        write_single(
            out,
            "tern_card_lifetime_projected_years",
            "gauge",
            "Years the card of [log.flush.wear] (card_size x write_cycles) lasts at the current device write rate, assuming even wear.",
            self.lifetime_at(rate).metric_value(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_of_a_directory_reads_and_labels_its_source() {
        let dir = std::env::temp_dir();
        let counter = WriteCounter::for_dir(&dir);
        assert!(counter.read().is_some(), "{counter:?}");
        let labels = counter.labels();
        assert!(
            labels.starts_with("source=\"block-device\",device=\"")
                || labels == "source=\"process\"",
            "{labels}"
        );
        assert_eq!(
            WriteCounter::for_dir(Path::new("/nonexistent")),
            WriteCounter::Process
        );
        assert_eq!(parse_sectors_written("1 2 3 4 5 6 77 8"), Some(77));
        assert_eq!(parse_sectors_written("1 2 3"), None);
    }

    #[test]
    fn the_lifetime_is_card_times_cycles_over_the_rate() {
        let device = DeviceMetrics::new(&std::env::temp_dir(), &tern_log::WearConfig::default());
        // 50.7 kB/s wears out 32 GB × 1000 cycles in 20 years.
        let lifetime = device.lifetime_at(50_700.0);
        assert!((lifetime.years - 20.0).abs() < 0.01, "{lifetime:?}");
        assert_eq!(lifetime.metric_value(), "20.00");
        assert_eq!(device.lifetime_at(0.0).metric_value(), "+Inf");
    }
}
