//! The rows of the log bench's report: one per tern append workload and per SQLite setting,
//! with the rates and ratios derived from a run, and the flash-lifetime projection from the
//! main workload's write amplification.
//!
//! Pure derivation from measured runs; it never measures and never renders a table.

use serde::Serialize;

use super::{AppendRun, AppendSpec, Plan};
use crate::stats::ratio;

/// The card of the flash-lifetime projection: 32 GB rated for 1,000 program/erase cycles.
pub const CARD_BYTES: f64 = 32e9;
pub const PE_CYCLES: f64 = 1_000.0;
pub const LIFETIME_FORMULA: &str = "years = card bytes × P/E cycles ÷ device bytes per day ÷ 365";

/// The SQLite comparison for one `synchronous` setting and record size.
#[derive(Debug, Clone, Serialize)]
pub struct SqliteFigures {
    pub synchronous: &'static str,
    pub record_size: usize,
    pub records: u64,
    pub records_per_s: f64,
    pub mb_per_s: f64,
    pub write_amplification: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    /// SQLite's records/s ÷ tern's, same record size.
    pub throughput_ratio_to_tern: f64,
    /// SQLite's write amplification ÷ tern's, same record size.
    pub write_amplification_ratio_to_tern: f64,
}

impl SqliteFigures {
    #[cfg(feature = "sqlite")]
    pub fn new(sync: super::sqlite::Synchronous, record_size: usize, run: &AppendRun) -> Self {
        Self {
            synchronous: match sync {
                super::sqlite::Synchronous::Normal => "NORMAL",
                super::sqlite::Synchronous::Full => "FULL",
            },
            record_size,
            records: run.records,
            records_per_s: run.records_per_s(),
            mb_per_s: run.mb_per_s(),
            write_amplification: run.write_amplification(),
            latency_p50_us: run.latency.p50_us,
            latency_p99_us: run.latency.p99_us,
            throughput_ratio_to_tern: 0.0,
            write_amplification_ratio_to_tern: 0.0,
        }
    }
}

/// One tern append workload.
#[derive(Debug, Clone, Serialize)]
pub struct AppendFigures {
    /// The row's name, `{kind}-{record_size}` with kind `closed-loop`, `main` or `batched`
    /// (see `AppendFigures::kind`); readers find rows by it, never by position.
    pub workload: String,
    pub record_size: usize,
    /// Records per append call (1 for the workloads the targets apply to).
    pub batch: usize,
    /// Appends each appender keeps unacknowledged (`Plan::INFLIGHT` in the main workload the
    /// targets apply to; 1 in the closed-loop rows).
    pub inflight: usize,
    pub records: u64,
    pub payload_bytes: u64,
    pub secs: f64,
    pub records_per_s: f64,
    pub mb_per_s: f64,
    /// MB/s ÷ the raw O_DIRECT MB/s.
    pub ratio_to_raw: f64,
    pub fdatasyncs: u64,
    pub fdatasyncs_per_s: f64,
    pub payload_bytes_per_fsync: f64,
    /// Mean time of one fdatasync, µs.
    pub fdatasync_mean_us: f64,
    /// Share of the run's wall time an fdatasync was running: near 1, the device's sync time
    /// is the bound; well below, something before the sync is.
    pub fdatasync_busy: f64,
    /// CPU of the bench process (appenders and log) per record, µs.
    pub cpu_us_per_record: f64,
    /// That CPU ÷ the run's wall time: cores kept busy.
    pub cpu_cores: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub device_bytes: u64,
    /// Device bytes ÷ payload bytes.
    pub write_amplification: f64,
}

impl AppendFigures {
    pub fn new(spec: &AppendSpec, run: &AppendRun, raw_mb_per_s: f64) -> Self {
        let fdatasyncs = run.fdatasyncs.unwrap_or(0);
        Self {
            workload: format!("{}-{}", workload_kind(spec), spec.record_size),
            record_size: spec.record_size,
            batch: spec.batch,
            inflight: spec.inflight,
            records: run.records,
            payload_bytes: run.payload_bytes,
            secs: run.secs,
            records_per_s: run.records_per_s(),
            mb_per_s: run.mb_per_s(),
            ratio_to_raw: ratio(run.mb_per_s(), raw_mb_per_s),
            fdatasyncs,
            fdatasyncs_per_s: ratio(fdatasyncs as f64, run.secs),
            payload_bytes_per_fsync: ratio(run.payload_bytes as f64, fdatasyncs as f64),
            fdatasync_mean_us: ratio(run.fdatasync_secs.unwrap_or(0.0) * 1e6, fdatasyncs as f64),
            fdatasync_busy: ratio(run.fdatasync_secs.unwrap_or(0.0), run.secs),
            cpu_us_per_record: ratio(run.cpu_secs.unwrap_or(0.0) * 1e6, run.records as f64),
            cpu_cores: ratio(run.cpu_secs.unwrap_or(0.0), run.secs),
            latency_p50_us: run.latency.p50_us,
            latency_p99_us: run.latency.p99_us,
            device_bytes: run.device_bytes,
            write_amplification: run.write_amplification(),
        }
    }
}

impl AppendFigures {
    /// The main workload: one record per append, `Plan::INFLIGHT` appends in flight per
    /// appender. The targets apply to it.
    pub fn is_main(&self) -> bool {
        self.batch == 1 && self.inflight == Plan::INFLIGHT
    }

    /// One record per append and one append in flight per appender (what SQLite runs too).
    pub fn is_closed_loop(&self) -> bool {
        self.batch == 1 && self.inflight == 1
    }
}

/// The kind part of a row's `workload` name.
fn workload_kind(spec: &AppendSpec) -> &'static str {
    match (spec.batch, spec.inflight) {
        (1, 1) => "closed-loop",
        (1, _) => "main",
        _ => "batched",
    }
}

/// The flash-lifetime projection.
#[derive(Debug, Clone, Serialize)]
pub struct FlashFigures {
    pub card_bytes: f64,
    pub pe_cycles: f64,
    pub formula: &'static str,
    /// Device bytes per day when appending 1 KiB records at the measured rate all day.
    pub measured_device_bytes_per_day: f64,
    pub measured_years: f64,
    /// The same for a steady 1,000 records/s of 100 B at the measured 100 B amplification.
    pub steady_write_amplification: f64,
    pub steady_device_bytes_per_day: f64,
    pub steady_years: f64,
}

impl FlashFigures {
    pub fn project(append: &[AppendFigures]) -> Option<Self> {
        let find = |size| append.iter().find(|a| a.record_size == size && a.is_main());
        let (large, small) = (find(1024)?, find(100)?);
        let measured = ratio(large.device_bytes as f64, large.secs) * 86_400.0;
        let steady = 1_000.0 * 100.0 * small.write_amplification * 86_400.0;
        Some(Self {
            card_bytes: CARD_BYTES,
            pe_cycles: PE_CYCLES,
            formula: LIFETIME_FORMULA,
            measured_device_bytes_per_day: measured,
            measured_years: years(measured),
            steady_write_amplification: small.write_amplification,
            steady_device_bytes_per_day: steady,
            steady_years: years(steady),
        })
    }
}

/// Years until `bytes_per_day` has written the card `PE_CYCLES` times over.
fn years(bytes_per_day: f64) -> f64 {
    ratio(CARD_BYTES * PE_CYCLES, bytes_per_day) / 365.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Latency;

    fn run(record_size: u64, records: u64, device_bytes: u64) -> AppendRun {
        AppendRun {
            records,
            payload_bytes: records * record_size,
            secs: 2.0,
            device_bytes,
            latency: Latency {
                p50_us: 100.0,
                p99_us: 900.0,
            },
            fdatasyncs: Some(50),
            fdatasync_secs: Some(0.5),
            cpu_secs: Some(3.0),
        }
    }

    fn spec(record_size: usize, batch: usize) -> AppendSpec {
        AppendSpec {
            record_size,
            appenders: 64,
            batch,
            inflight: if batch == 1 { Plan::INFLIGHT } else { 1 },
            max_records: 1_000,
            max_duration: std::time::Duration::from_secs(1),
        }
    }

    #[test]
    fn append_figures_derive_rates_and_ratios() {
        let figures = AppendFigures::new(&spec(1024, 1), &run(1024, 10_000, 12_288_000), 10.24);
        assert_eq!(figures.records_per_s, 5_000.0);
        assert!((figures.mb_per_s - 5.12).abs() < 1e-9);
        assert!((figures.ratio_to_raw - 0.5).abs() < 1e-9);
        assert_eq!(figures.fdatasyncs_per_s, 25.0);
        assert_eq!(figures.payload_bytes_per_fsync, 204_800.0);
        assert_eq!(figures.fdatasync_mean_us, 10_000.0);
        assert_eq!(figures.fdatasync_busy, 0.25);
        assert_eq!(figures.cpu_us_per_record, 300.0);
        assert_eq!(figures.cpu_cores, 1.5);
        assert!((figures.write_amplification - 1.2).abs() < 1e-9);
    }

    #[test]
    fn flash_projection_follows_the_printed_formula() {
        let append = [
            AppendFigures::new(&spec(100, 1), &run(100, 1_000, 150_000), 100.0),
            AppendFigures::new(&spec(1024, 1), &run(1024, 1_000, 2_000_000), 100.0),
            AppendFigures::new(&spec(1024, 64), &run(1024, 1_000, 1_000), 100.0),
        ];
        let flash = FlashFigures::project(&append).expect("both sizes present");
        // 2 MB in 2 s → 1 MB/s → 86.4 GB/day; 32 TB of endurance lasts 370.37 days.
        assert!((flash.measured_device_bytes_per_day - 86.4e9).abs() < 1.0);
        assert!((flash.measured_years - 32e12 / 86.4e9 / 365.0).abs() < 1e-9);
        // 1,000 × 100 B × WA 1.5 × 86,400 s.
        assert!((flash.steady_device_bytes_per_day - 12.96e9).abs() < 1.0);
        assert!(FlashFigures::project(&append[..1]).is_none());
    }
}
