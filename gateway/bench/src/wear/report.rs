//! The wear bench's figures: per rate and store, the median of each figure over the runs,
//! turned into device bytes per message, GB a day and the projected lifetime of the card, as a
//! table or one JSON object.
//!
//! It never measures anything.

use std::fmt;

use serde::Serialize;

use super::{Aged, DirState, Measured, WearOptions};
use crate::log::device::{Counter, Target};
use crate::stats::median;

const SECONDS_PER_YEAR: f64 = 365.25 * 86_400.0;

/// Medians of one store at one rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub rate: f64,
    pub store: &'static str,
    pub runs: usize,
    pub messages: f64,
    pub device_bytes_per_message: f64,
    pub gb_per_day: f64,
    pub years: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub commits_per_sec: f64,
    /// Of the device bytes per message, the ext4 journal's.
    pub journal_bytes_per_message: Option<f64>,
    /// tern: bytes per message its log handed to write calls (batches and zeros ahead).
    pub written_bytes_per_message: Option<f64>,
    /// tern: bytes per message stored in the partition (records and batch headers).
    pub stored_bytes_per_message: Option<f64>,
    /// tern: the commit window its wear controller chose at the end of the run.
    pub window_ms: Option<f64>,
    /// tern, steady state: the median aging before the run.
    pub aged_bytes: Option<f64>,
    pub aged_seconds: Option<f64>,
}

/// Everything `tern-bench wear` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub clients: usize,
    pub size: usize,
    pub warmup_s: f64,
    pub seconds: f64,
    pub card_bytes: u64,
    pub card_cycles: u64,
    pub storage: String,
    pub counter: String,
    /// tern's config: every line differs from the defaults.
    pub tern_config: Vec<String>,
    pub rows: Vec<Row>,
    pub lazytime: bool,
    #[serde(skip)]
    runs: Vec<(f64, &'static str, Measured)>,
}

impl Report {
    pub fn new(options: &WearOptions) -> Self {
        let text = options.tern_config(std::path::Path::new("<loop mount>/tern"));
        let mut config = Vec::new();
        let mut section = String::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                Some(name) => section = format!("{name}."),
                None => config.push(format!("{section}{line}")),
            }
        }
        Self {
            clients: options.clients,
            size: options.size,
            warmup_s: options.warmup.as_secs_f64(),
            seconds: options.seconds.as_secs_f64(),
            card_bytes: options.card_bytes,
            card_cycles: options.card_cycles,
            storage: String::new(),
            counter: String::new(),
            tern_config: config,
            rows: Vec::new(),
            lazytime: options.lazytime,
            runs: Vec::new(),
        }
    }

    pub fn counted_by(&mut self, target: &Target) {
        self.storage = target.description().to_owned();
        if self.lazytime && matches!(target.counter(), Counter::Device { .. }) {
            self.storage.push_str(", remounted lazytime");
        }
        self.counter = match target.counter() {
            Counter::Device { name } => format!("sectors written of /sys/block/{name}/stat × 512"),
            Counter::Process => format!(
                "write_bytes of /proc/self/io ({}): tern's own writes are NOT counted",
                target.fallback_reason().unwrap_or("no loop device")
            ),
        };
    }

    pub fn add_tern(&mut self, rate: f64, state: DirState, run: Measured) {
        self.add(rate, state.store(), run);
    }

    /// Without the `sqlite` feature there is no comparison to add.
    #[cfg(feature = "sqlite")]
    pub fn add_sqlite(&mut self, rate: f64, run: Measured) {
        self.add(rate, "SQLite WAL FULL", run);
    }

    fn add(&mut self, rate: f64, store: &'static str, run: Measured) {
        self.runs.push((rate, store, run));
        self.rows = self.medians();
    }

    fn medians(&self) -> Vec<Row> {
        let mut keys: Vec<(f64, &'static str)> = Vec::new();
        for (rate, store, _) in &self.runs {
            if !keys.contains(&(*rate, *store)) {
                keys.push((*rate, *store));
            }
        }
        keys.into_iter()
            .map(|(rate, store)| {
                let runs: Vec<&Measured> = self
                    .runs
                    .iter()
                    .filter(|r| r.0 == rate && r.1 == store)
                    .map(|r| &r.2)
                    .collect();
                let of = |f: &dyn Fn(&Measured) -> f64| median(runs.iter().map(|m| f(m)));
                let maybe =
                    |f: &dyn Fn(&Measured) -> Option<f64>| median(runs.iter().filter_map(|m| f(m)));
                let per_msg = |bytes: Option<u64>, m: &Measured| {
                    Some(bytes? as f64 / m.messages.max(1) as f64)
                };
                let aged = |f: fn(&Aged) -> f64| maybe(&|m| m.aged.as_ref().map(f));
                let per_sec = |m: &Measured| m.device_bytes as f64 / m.seconds.max(1e-9);
                let bytes_per_sec = of(&per_sec).unwrap_or(0.0);
                Row {
                    rate,
                    store,
                    runs: runs.len(),
                    messages: of(&|m| m.messages as f64).unwrap_or(0.0),
                    device_bytes_per_message: of(&|m| {
                        m.device_bytes as f64 / (m.messages.max(1) as f64)
                    })
                    .unwrap_or(0.0),
                    gb_per_day: bytes_per_sec * 86_400.0 / 1e9,
                    years: self.years(bytes_per_sec),
                    p50_ms: of(&|m| m.p50_ms).unwrap_or(0.0),
                    p99_ms: of(&|m| m.p99_ms).unwrap_or(0.0),
                    commits_per_sec: of(&|m| m.commits_per_sec).unwrap_or(0.0),
                    journal_bytes_per_message: maybe(&|m| per_msg(m.journal_bytes, m)),
                    written_bytes_per_message: maybe(&|m| per_msg(m.written_bytes, m)),
                    stored_bytes_per_message: maybe(&|m| per_msg(m.stored_bytes, m)),
                    window_ms: maybe(&|m| m.window_ms),
                    aged_bytes: aged(|a| a.bytes as f64),
                    aged_seconds: aged(|a| a.seconds),
                }
            })
            .collect()
    }

    /// Years until `card_bytes × card_cycles` are written at `bytes_per_sec` (even wear).
    fn years(&self, bytes_per_sec: f64) -> f64 {
        if bytes_per_sec <= 0.0 {
            return f64::INFINITY;
        }
        self.card_bytes as f64 * self.card_cycles as f64 / bytes_per_sec / SECONDS_PER_YEAR
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "tern-bench wear: {} clients, {} B QoS 1 messages, open loop; {:.0} s measured after {:.0} s; medians",
            self.clients, self.size, self.seconds, self.warmup_s
        )?;
        writeln!(f, "storage: {}", self.storage)?;
        writeln!(f, "device bytes: {}", self.counter)?;
        writeln!(
            f,
            "tern config (every other setting is the default): {}",
            self.tern_config.join("; ")
        )?;
        writeln!(
            f,
            "projection: {:.0} GB card × {} P/E cycles, even wear, no wear inside the card",
            self.card_bytes as f64 / 1e9,
            self.card_cycles
        )?;
        writeln!(
            f,
            "states: \"fresh dir\" = a new data directory (its segment's blocks unwritten: zeros \
             are written ahead of the commits until retention first recycles a segment, a one-time \
             cost of the retained size); \"steady\" = the same, first aged by a flood of {} KiB \
             messages until retention (the default) deleted a segment and a roll reused its file \
             for the active segment, then 30 s of the trickle before the warmup: the state of a \
             card's life, whose years are the projection",
            super::AGE_MESSAGE >> 10
        )?;
        writeln!(
            f,
            "{:>8}  {:<16} {:>5} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>9}",
            "msg/s",
            "store",
            "runs",
            "messages",
            "dev B/msg",
            "journal",
            "written",
            "stored",
            "GB/day",
            "years",
            "p50 ms",
            "p99 ms",
            "commits/s",
            "window ms"
        )?;
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
        for r in &self.rows {
            writeln!(
                f,
                "{:>8.0}  {:<16} {:>5} {:>9.0} {:>10.0} {:>8} {:>8} {:>8} {:>8.2} {:>8.1} {:>8.1} {:>8.1} {:>10.1} {:>9}",
                r.rate,
                r.store,
                r.runs,
                r.messages,
                r.device_bytes_per_message,
                opt(r.journal_bytes_per_message),
                opt(r.written_bytes_per_message),
                opt(r.stored_bytes_per_message),
                r.gb_per_day,
                r.years,
                r.p50_ms,
                r.p99_ms,
                r.commits_per_sec,
                opt(r.window_ms)
            )?;
        }
        for r in self.rows.iter().filter(|r| r.aged_bytes.is_some()) {
            writeln!(
                f,
                "aging at {:.0} msg/s: {:.0} MiB in {:.1} s (medians)",
                r.rate,
                r.aged_bytes.unwrap_or(0.0) / f64::from(1u32 << 20),
                r.aged_seconds.unwrap_or(0.0)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_row_is_the_median_of_its_runs_and_projects_the_card() {
        let options = WearOptions {
            rates: vec![100.0],
            clients: 50,
            size: 100,
            warmup: Duration::from_secs(5),
            seconds: Duration::from_secs(10),
            repetitions: 3,
            states: vec![DirState::Fresh],
            dir: None,
            no_loop: true,
            card_bytes: 32_000_000_000,
            card_cycles: 1000,
            tern_extra: String::new(),
            lazytime: false,
        };
        let mut report = Report::new(&options);
        for bytes in [500_000u64, 300_000, 900_000] {
            let run = Measured {
                messages: 1000,
                device_bytes: bytes,
                seconds: 10.0,
                p50_ms: 10.0,
                p99_ms: 100.0,
                commits_per_sec: 8.0,
                journal_bytes: None,
                written_bytes: Some(bytes / 2),
                stored_bytes: Some(bytes / 4),
                window_ms: Some(120.0),
                aged: None,
            };
            report.add_tern(100.0, DirState::Fresh, run);
        }
        let row = report.rows.first().cloned().expect("one row");
        assert_eq!((report.rows.len(), row.runs), (1, 3));
        assert_eq!(row.device_bytes_per_message, 500.0);
        assert_eq!(row.written_bytes_per_message, Some(250.0));
        assert_eq!(row.stored_bytes_per_message, Some(125.0));
        assert_eq!((row.store, row.aged_bytes), ("tern fresh dir", None));
        // 50 kB/s: 4.32 GB a day, 32 TB last 20.3 years.
        assert!((row.gb_per_day - 4.32).abs() < 1e-9, "{row:?}");
        assert!((row.years - 20.28).abs() < 0.01, "{row:?}");
        let text = report.to_string();
        assert!(text.contains("data_dir = \"<loop mount>/tern\""), "{text}");
        assert!(text.contains("mqtt.listen = \"127.0.0.1:0\""), "{text}");
        assert!(text.contains("admin.listen = \"127.0.0.1:0\""), "{text}");
    }
}
