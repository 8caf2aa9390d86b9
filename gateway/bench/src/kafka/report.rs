//! The Kafka bench's figures: every run, the medians, tern/Kafka ratios and the targets, as a
//! table or one JSON object, with the settings both brokers ran with.
//!
//! It never measures anything and never fails on a missed target.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use super::{GROUP_MEMBERS, KafkaBenchOptions, broker};
use crate::report::Target;
use crate::stats::{median, ratio};

/// tern's consume throughput must reach this multiple of Kafka's.
const TARGET_CONSUME: f64 = 1.0;
/// tern's acks=all produce throughput must reach this multiple of fsyncing Kafka's.
const TARGET_PRODUCE_FSYNC: f64 = 2.0;
/// tern's memory growth with the consumer group attached.
const TARGET_GROUP_GROWTH_MIB: f64 = 4.0;

/// Everything `tern-bench kafka` measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub records: u64,
    pub value_bytes: usize,
    pub repetitions: usize,
    /// Microseconds each fsync and fdatasync of both brokers waited first (0: none).
    pub flush_delay_us: u64,
    /// tern's configuration file (its data directory elided).
    pub tern_settings: String,
    /// Kafka's server.properties (its data directory elided) and heap.
    pub kafka_settings: String,
    /// Records/s of each run.
    pub tern_produce: Vec<f64>,
    pub kafka_fsync_produce: Vec<f64>,
    pub kafka_produce: Vec<f64>,
    pub tern_consume: Vec<f64>,
    pub kafka_consume: Vec<f64>,
    pub rss_idle_kib: u64,
    pub rss_group_kib: u64,
    /// The anonymous part of each (heap and stacks; the rest is mapped segment pages): idle,
    /// the moment the group caught up (its fetch buffers freed but not yet trimmed), and 7 s
    /// later with the group still attached.
    pub anon_idle_kib: u64,
    pub anon_catchup_kib: u64,
    pub anon_group_kib: u64,
}

/// The medians, ratios and targets of a [`Report`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub tern_produce: f64,
    pub kafka_fsync_produce: f64,
    pub kafka_produce: f64,
    pub tern_consume: f64,
    pub kafka_consume: f64,
    pub produce_vs_fsync: f64,
    pub produce_vs_default: f64,
    pub consume_ratio: f64,
    pub group_growth_mib: f64,
    /// The growth of the anonymous part, which the target judges: tern's own memory for the
    /// group. Mapped segment pages are the page cache, which Kafka uses too (outside its RSS).
    pub anon_growth_mib: f64,
    pub targets: Vec<Target>,
}

impl Report {
    pub fn new(options: &KafkaBenchOptions) -> Self {
        let data = Path::new("DATA");
        Self {
            records: options.records,
            value_bytes: options.size,
            repetitions: options.repetitions,
            flush_delay_us: options.flush_delay_us,
            tern_settings: crate::mqtt::servers::tern_config(data, &[]),
            kafka_settings: format!(
                "{}# heap {}\n",
                broker::properties(0, 0, data),
                broker::HEAP
            ),
            ..Self::default()
        }
    }

    pub fn summary(&self) -> Summary {
        let m = |runs: &[f64]| median(runs.iter().copied()).unwrap_or(0.0);
        let (tern_produce, kafka_fsync_produce, kafka_produce) = (
            m(&self.tern_produce),
            m(&self.kafka_fsync_produce),
            m(&self.kafka_produce),
        );
        let (tern_consume, kafka_consume) = (m(&self.tern_consume), m(&self.kafka_consume));
        let growth = self.rss_group_kib.saturating_sub(self.rss_idle_kib) as f64 / 1024.0;
        let anon_growth = self.anon_group_kib.saturating_sub(self.anon_idle_kib) as f64 / 1024.0;
        let produce_vs_fsync = ratio(tern_produce, kafka_fsync_produce);
        let consume_ratio = ratio(tern_consume, kafka_consume);
        Summary {
            tern_produce,
            kafka_fsync_produce,
            kafka_produce,
            tern_consume,
            kafka_consume,
            produce_vs_fsync,
            produce_vs_default: ratio(tern_produce, kafka_produce),
            consume_ratio,
            group_growth_mib: growth,
            anon_growth_mib: anon_growth,
            targets: vec![
                Target::at_least("consume vs Kafka", TARGET_CONSUME, consume_ratio),
                Target::at_least(
                    "produce acks=all vs fsyncing Kafka",
                    TARGET_PRODUCE_FSYNC,
                    produce_vs_fsync,
                ),
                Target::at_most(
                    "anonymous RSS growth with a group of 3 (MiB)",
                    TARGET_GROUP_GROWTH_MIB,
                    anon_growth,
                ),
            ],
        }
    }
}

fn runs(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.summary();
        let mb = |rate: f64| rate * self.value_bytes as f64 / 1e6;
        writeln!(
            f,
            "tern-bench kafka: {} records of {} B, client kcat, median of {} runs (records/s)",
            self.records, self.value_bytes, self.repetitions
        )?;
        if self.flush_delay_us > 0 {
            writeln!(
                f,
                "flush delay: every fsync and fdatasync of both brokers waited {} µs first \
                 (tern-flush-delay preloaded)",
                self.flush_delay_us
            )?;
        }
        writeln!(f, "{:<34} {:>12} {:>9}  runs", "", "records/s", "MB/s")?;
        let mut row = |name: &str, median: f64, all: &[f64]| {
            writeln!(
                f,
                "{name:<34} {median:>12.0} {:>9.1}  {}",
                mb(median),
                runs(all)
            )
        };
        row("produce acks=all  tern", s.tern_produce, &self.tern_produce)?;
        row(
            "produce acks=all  kafka fsync",
            s.kafka_fsync_produce,
            &self.kafka_fsync_produce,
        )?;
        row(
            "produce acks=all  kafka default",
            s.kafka_produce,
            &self.kafka_produce,
        )?;
        row("consume           tern", s.tern_consume, &self.tern_consume)?;
        row(
            "consume           kafka",
            s.kafka_consume,
            &self.kafka_consume,
        )?;
        writeln!(
            f,
            "ratios: produce {:.2}x fsyncing Kafka, {:.2}x Kafka's default; consume {:.2}x Kafka",
            s.produce_vs_fsync, s.produce_vs_default, s.consume_ratio
        )?;
        writeln!(
            f,
            "tern RSS: {:.1} MiB idle, {:.1} MiB with a consumer group of {GROUP_MEMBERS} \
             (kcat -G) caught up: +{:.2} MiB; anonymous (without mapped segments) {:.1} MiB \
             idle, {:.1} MiB as the group caught up, {:.1} MiB with the group attached 7 s \
             later: +{:.2} MiB",
            self.rss_idle_kib as f64 / 1024.0,
            self.rss_group_kib as f64 / 1024.0,
            s.group_growth_mib,
            self.anon_idle_kib as f64 / 1024.0,
            self.anon_catchup_kib as f64 / 1024.0,
            self.anon_group_kib as f64 / 1024.0,
            s.anon_growth_mib,
        )?;
        for t in &s.targets {
            writeln!(
                f,
                "target {}: {:.2} (target {}) {}",
                t.name,
                t.measured,
                t.target,
                t.verdict()
            )?;
        }
        writeln!(f, "tern settings:\n{}", indent(&self.tern_settings))?;
        writeln!(
            f,
            "kafka settings (else defaults):\n{}",
            indent(&self.kafka_settings)
        )
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            records: 1000,
            value_bytes: 100,
            repetitions: 3,
            tern_produce: vec![300.0, 100.0, 200.0],
            kafka_fsync_produce: vec![50.0, 100.0, 150.0],
            kafka_produce: vec![400.0, 400.0, 400.0],
            tern_consume: vec![900.0, 1000.0, 1100.0],
            kafka_consume: vec![2000.0, 2000.0, 2000.0],
            rss_idle_kib: 10 * 1024,
            rss_group_kib: 15 * 1024,
            anon_idle_kib: 2 * 1024,
            anon_catchup_kib: 9 * 1024,
            anon_group_kib: 3 * 1024,
            ..Report::default()
        }
    }

    #[test]
    fn the_summary_takes_medians_and_ratios() {
        let s = report().summary();
        assert_eq!((s.tern_produce, s.kafka_fsync_produce), (200.0, 100.0));
        assert_eq!(s.produce_vs_fsync, 2.0);
        assert_eq!(s.produce_vs_default, 0.5);
        assert_eq!(s.consume_ratio, 0.5);
        assert_eq!(s.group_growth_mib, 5.0);
        assert_eq!(s.anon_growth_mib, 1.0);
        let met: Vec<bool> = s.targets.iter().map(|t| t.met).collect();
        assert_eq!(met, [false, true, true]);
    }

    #[test]
    fn the_table_prints_ratios_targets_and_settings() {
        let text = report().to_string();
        assert!(
            text.contains("produce 2.00x fsyncing Kafka, 0.50x Kafka's default"),
            "{text}"
        );
        assert!(text.contains("consume 0.50x Kafka"), "{text}");
        assert!(text.contains("+5.00 MiB"), "{text}");
        assert!(text.contains("NOT met"), "{text}");
    }
}
