//! The figures of `tern bench upstream`: medians over repetitions, each codec's drain rate as a
//! ratio to Kafka's own producer in the same run (target ≥ 0.8) and as a multiple of the live
//! MQTT ingest rate, bytes on the wire per payload byte, the idempotent producer's cost, the
//! capped drain's share of the cap (target ≥ 95 %), and whether each target is met; as a table
//! or as one JSON object.
//!
//! It must never measure anything and never fail on a target it misses.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::backlog::{DrainKind, DrainRun, TrickleRun};
use super::java::JavaRun;
use super::live::LiveRun;
use super::serve::{Build, ServeDrain};
use super::{UpstreamBenchOptions, codec_name, mode_name};
use crate::report::Target;
use crate::stats;

/// A backlog must drain at least this fraction of Kafka's own producer's rate.
const TARGET_VS_KAFKA_PRODUCER: f64 = 0.8;
/// A capped drain must use at least this fraction of the cap.
const TARGET_CAP_UTILISATION: f64 = 0.95;

/// The outage backlog whose drain time over a slow uplink is printed per codec: 24 hours of
/// 100 messages a second, over 1 Mbit/s.
const DAY_BACKLOG_RECORDS: f64 = 24.0 * 3600.0 * 100.0;
const UPLINK_BYTES_PER_SEC: f64 = 1e6 / 8.0;
/// tern's default `max_batch_bytes`, the second yardstick's `batch.size`.
const TERN_BATCH: u64 = 512 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shape {
    pub records: u64,
    pub size: usize,
    pub repetitions: usize,
    pub partitions: u32,
}

/// The default codec's drain with and without the idempotent producer (medians).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Idempotence {
    pub codec: &'static str,
    pub idempotent_records_per_sec: f64,
    pub plain_records_per_sec: f64,
    /// 1 − idempotent ÷ plain: the share of the plain rate the idempotent producer costs
    /// (negative when it was faster).
    pub cost: f64,
}

/// The default codec's drain in shared mode with and without Kafka transactions (medians).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Transactions {
    pub codec: &'static str,
    pub transactional_records_per_sec: f64,
    pub plain_records_per_sec: f64,
    /// 1 − transactional ÷ plain (negative when it was faster).
    pub cost: f64,
    /// Transactions one drain committed (median): one per `max_batch_bytes` read.
    pub transactions_per_drain: f64,
}

/// A caught-up shared-mode forwarder fed a sensor-rate trickle.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SensorRate {
    pub records_per_sec: f64,
    pub records: u64,
    pub transactions: u64,
    /// EndTxn requests per second this gateway sends (one per transaction).
    pub transactions_per_sec: f64,
    pub records_per_transaction: f64,
}

/// The backlog drained by `tern serve` of one build in one mode (medians).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServeFigure {
    /// `this`, or `compared` (`--compare-tern`).
    pub build: &'static str,
    pub mode: &'static str,
    pub seconds: f64,
    pub records_per_sec: f64,
    /// This build's rate ÷ the compared build's, on this build's line when both ran.
    pub ratio_vs_compared: Option<f64>,
}

/// The drain under the `bandwidth` cap (no compression, one run).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Capped {
    pub cap_bytes_per_sec: u64,
    pub records: u64,
    pub seconds: f64,
    /// Bytes per second as the cap counts them (before compression), over the window from the
    /// first upstream batch past a fifth of the records to the last.
    pub counted_bytes_per_sec: f64,
    /// counted_bytes_per_sec ÷ the cap.
    pub utilisation: f64,
    /// Bytes sent to Kafka per second over the whole drain (start-up included).
    pub wire_bytes_per_sec: f64,
}

/// Medians of the live runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Live {
    pub codec: &'static str,
    pub messages: u64,
    pub ingest_msgs_per_sec: f64,
    pub forward_records_per_sec: f64,
    pub forward_mb_per_sec: f64,
    pub lag_ms: f64,
}

/// Medians of one codec's drains.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drain {
    pub codec: &'static str,
    pub seconds: f64,
    pub records_per_sec: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// Bytes sent to Kafka per payload byte (produce requests with headers and framing).
    pub wire_to_kafka_per_payload_byte: f64,
    /// Bytes Kafka answered with, per payload byte.
    pub wire_from_kafka_per_payload_byte: f64,
    /// records_per_sec ÷ the live ingest rate.
    pub drain_over_live: f64,
    /// Kafka's own producer in the same run (median records/s), when it was run.
    pub kafka_producer_records_per_sec: Option<f64>,
    /// records_per_sec ÷ kafka_producer_records_per_sec.
    pub ratio_vs_kafka_producer: Option<f64>,
    /// Kafka's producer with `batch.size` = tern's `max_batch_bytes` (median records/s).
    pub kafka_producer_big_batch_records_per_sec: Option<f64>,
    /// records_per_sec ÷ kafka_producer_big_batch_records_per_sec.
    pub ratio_vs_kafka_producer_big_batch: Option<f64>,
    /// Hours a backlog of 24 h at 100 msg/s of records of this size takes over a 1 Mbit/s
    /// uplink with this codec: its records × payload size × wire/payload ÷ 125,000 B/s (only the
    /// bytes sent to Kafka count; the link is assumed to be the bound).
    pub day_backlog_hours_at_1_mbit: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub shape: Shape,
    pub live: Live,
    pub backlog_build_seconds: f64,
    pub drains: Vec<Drain>,
    /// Bytes of each record Kafka's producer sent (value only: tern's payload plus as many
    /// bytes as tern's headers take); absent when it was not run.
    pub kafka_producer_record_bytes: Option<usize>,
    pub idempotence: Option<Idempotence>,
    pub transactions: Option<Transactions>,
    pub sensor_rate: Option<SensorRate>,
    pub serve_drains: Vec<ServeFigure>,
    pub capped: Option<Capped>,
    pub targets: Vec<Target>,
}

/// The median of `values`; 0 when there are none.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    stats::median(values).unwrap_or(0.0)
}

impl Report {
    pub fn new(
        options: &UpstreamBenchOptions,
        live: Vec<LiveRun>,
        built: Duration,
        drains: Vec<DrainRun>,
        java: Vec<JavaRun>,
        java_record_bytes: Option<usize>,
    ) -> Self {
        let live = Live {
            codec: codec_name(tern_upstream::UpstreamConfig::default().compression),
            messages: live.first().map_or(0, |r| r.messages),
            ingest_msgs_per_sec: median(live.iter().map(|r| r.ingest_msgs_per_sec)),
            forward_records_per_sec: median(live.iter().map(|r| r.forward_records_per_sec)),
            forward_mb_per_sec: median(live.iter().map(|r| r.forward_bytes_per_sec / 1e6)),
            lag_ms: median(live.iter().map(|r| r.lag.as_secs_f64() * 1000.0)),
        };
        let of_kind = |kind: DrainKind| move |d: &&DrainRun| d.kind == kind;
        let codec_drains: Vec<Drain> = options
            .codecs
            .iter()
            .map(|&codec| {
                let java_rate = |big: bool| {
                    let runs = java
                        .iter()
                        .filter(|j| j.codec == codec && j.batch_size.is_some() == big);
                    stats::median(runs.map(|j| j.records_per_sec))
                };
                drain(
                    live.ingest_msgs_per_sec,
                    (java_rate(false), java_rate(true)),
                    drains
                        .iter()
                        .filter(of_kind(DrainKind::Idempotent))
                        .filter(|d| d.codec == codec),
                )
            })
            .collect();
        let idempotence = plain_cost(&codec_drains, &drains);
        let transactions = transactions_cost(&drains);
        let capped = drains.iter().find_map(capped);
        let mut targets: Vec<Target> = codec_drains
            .iter()
            .filter_map(|d| {
                let name = format!("{} drain / kafka producer", d.codec);
                let ratio = d.ratio_vs_kafka_producer?;
                Some(Target::at_least(name, TARGET_VS_KAFKA_PRODUCER, ratio))
            })
            .collect();
        if let Some(c) = &capped {
            targets.push(Target::at_least(
                "capped drain / bandwidth cap",
                TARGET_CAP_UTILISATION,
                c.utilisation,
            ));
        }
        Self {
            shape: Shape {
                records: options.records,
                size: options.size,
                repetitions: options.repetitions,
                partitions: 1,
            },
            live,
            backlog_build_seconds: built.as_secs_f64(),
            drains: codec_drains,
            kafka_producer_record_bytes: java_record_bytes,
            idempotence,
            transactions,
            sensor_rate: None,
            serve_drains: Vec::new(),
            capped,
            targets,
        }
    }

    /// The report with the medians of the `tern serve` drains in `runs`, per build and mode.
    pub fn with_serve_drains(self, runs: &[ServeDrain]) -> Self {
        let rate = |r: &ServeDrain| r.records as f64 / r.elapsed.as_secs_f64().max(1e-9);
        let figure = |build: Build, mode| {
            let of = || {
                runs.iter()
                    .filter(move |r| r.build == build && r.mode == mode)
            };
            of().next()?;
            Some((
                median(of().map(|r| r.elapsed.as_secs_f64())),
                median(of().map(rate)),
            ))
        };
        let mut serve_drains = Vec::new();
        for mode in [tern_upstream::Mode::Mirror, tern_upstream::Mode::Shared] {
            let compared = figure(Build::Compare, mode);
            if let Some((seconds, records_per_sec)) = figure(Build::This, mode) {
                serve_drains.push(ServeFigure {
                    build: "this",
                    mode: mode_name(mode),
                    seconds,
                    records_per_sec,
                    ratio_vs_compared: compared
                        .map(|(_, other)| records_per_sec / other.max(f64::MIN_POSITIVE)),
                });
            }
            if let Some((seconds, records_per_sec)) = compared {
                serve_drains.push(ServeFigure {
                    build: "compared",
                    mode: mode_name(mode),
                    seconds,
                    records_per_sec,
                    ratio_vs_compared: None,
                });
            }
        }
        Self {
            serve_drains,
            ..self
        }
    }

    /// The report with the sensor-rate transaction figures of `run`.
    pub fn with_trickle(self, run: TrickleRun) -> Self {
        let seconds = run.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        Self {
            sensor_rate: Some(SensorRate {
                records_per_sec: run.records as f64 / seconds,
                records: run.records,
                transactions: run.transactions,
                transactions_per_sec: run.transactions as f64 / seconds,
                records_per_transaction: run.records as f64 / run.transactions.max(1) as f64,
            }),
            ..self
        }
    }
}

/// The default codec's shared-mode drains with transactions against those without, when both
/// ran.
fn transactions_cost(runs: &[DrainRun]) -> Option<Transactions> {
    let of = |transactions| {
        let kind = DrainKind::Shared { transactions };
        runs.iter().filter(move |d| d.kind == kind)
    };
    let codec = codec_name(of(true).next()?.codec);
    let with = median(of(true).map(rate));
    let without = median(of(false).map(rate));
    of(false).next()?;
    Some(Transactions {
        codec,
        transactional_records_per_sec: with,
        plain_records_per_sec: without,
        cost: 1.0 - with / without.max(f64::MIN_POSITIVE),
        transactions_per_drain: median(of(true).map(|d| d.batches as f64)),
    })
}

/// The default codec's idempotent drain against its plain drains, when both ran.
fn plain_cost(codec_drains: &[Drain], runs: &[DrainRun]) -> Option<Idempotence> {
    let plain: Vec<&DrainRun> = runs.iter().filter(|d| d.kind == DrainKind::Plain).collect();
    let codec = codec_name(plain.first()?.codec);
    let idempotent = codec_drains.iter().find(|d| d.codec == codec)?;
    let plain_rate = median(plain.iter().map(|r| rate(r)));
    Some(Idempotence {
        codec,
        idempotent_records_per_sec: idempotent.records_per_sec,
        plain_records_per_sec: plain_rate,
        cost: 1.0 - idempotent.records_per_sec / plain_rate.max(f64::MIN_POSITIVE),
    })
}

/// The capped drain's figures, if `run` is one and its window was measured.
fn capped(run: &DrainRun) -> Option<Capped> {
    let DrainKind::Capped { bytes_per_sec } = run.kind else {
        return None;
    };
    let window = run.window?;
    let counted = window.counted_bytes as f64 / window.elapsed.as_secs_f64().max(1e-9);
    let seconds = run.elapsed.as_secs_f64();
    Some(Capped {
        cap_bytes_per_sec: bytes_per_sec,
        records: run.records,
        seconds,
        counted_bytes_per_sec: counted,
        utilisation: counted / bytes_per_sec.max(1) as f64,
        wire_bytes_per_sec: run.wire.to_kafka as f64 / seconds.max(1e-9),
    })
}

fn rate(r: &DrainRun) -> f64 {
    r.records as f64 / r.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
}

/// The medians of one codec's runs.
fn drain<'a>(
    live_rate: f64,
    (kafka_producer, big_batch): (Option<f64>, Option<f64>),
    runs: impl Iterator<Item = &'a DrainRun> + Clone,
) -> Drain {
    let per_payload = |bytes: fn(&DrainRun) -> u64| {
        median(
            runs.clone()
                .map(move |r| bytes(r) as f64 / r.payload_bytes.max(1) as f64),
        )
    };
    let records_per_sec = median(runs.clone().map(rate));
    let wire_to_kafka = per_payload(|r| r.wire.to_kafka);
    let record_size = median(
        runs.clone()
            .map(|r| r.payload_bytes as f64 / r.records.max(1) as f64),
    );
    Drain {
        codec: runs.clone().next().map_or("?", |r| codec_name(r.codec)),
        seconds: median(runs.clone().map(|r| r.elapsed.as_secs_f64())),
        records_per_sec,
        mb_per_sec: median(
            runs.clone()
                .map(|r| rate(r) * r.payload_bytes as f64 / r.records.max(1) as f64 / 1e6),
        ),
        wire_to_kafka_per_payload_byte: wire_to_kafka,
        wire_from_kafka_per_payload_byte: per_payload(|r| r.wire.from_kafka),
        drain_over_live: records_per_sec / live_rate.max(f64::MIN_POSITIVE),
        kafka_producer_records_per_sec: kafka_producer,
        ratio_vs_kafka_producer: kafka_producer
            .map(|java| records_per_sec / java.max(f64::MIN_POSITIVE)),
        kafka_producer_big_batch_records_per_sec: big_batch,
        ratio_vs_kafka_producer_big_batch: big_batch
            .map(|java| records_per_sec / java.max(f64::MIN_POSITIVE)),
        day_backlog_hours_at_1_mbit: DAY_BACKLOG_RECORDS * record_size * wire_to_kafka
            / UPLINK_BYTES_PER_SEC
            / 3600.0,
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (s, l) = (&self.shape, &self.live);
        writeln!(
            f,
            "tern bench upstream: backlog {} records x {} B (1 partition), median of {} run(s)",
            s.records, s.size, s.repetitions
        )?;
        writeln!(
            f,
            "live (anchor): MQTT QoS 1 ingest {:.0} msgs/s; forwarding ({}) {:.0} records/s, \
             {:.2} MB/s, {:.0} ms behind the last PUBACK ({} messages)",
            l.ingest_msgs_per_sec,
            l.codec,
            l.forward_records_per_sec,
            l.forward_mb_per_sec,
            l.lag_ms,
            l.messages
        )?;
        writeln!(f, "backlog built in {:.1} s", self.backlog_build_seconds)?;
        f.write_str(&table(&self.drains))?;
        for d in &self.drains {
            writeln!(
                f,
                "24 h backlog at 100 msg/s ({} records x {} B) over 1 Mbit/s with {}: {:.1} h",
                DAY_BACKLOG_RECORDS, s.size, d.codec, d.day_backlog_hours_at_1_mbit
            )?;
        }
        match self.kafka_producer_record_bytes {
            Some(bytes) => {
                for d in &self.drains {
                    let (Some(ratio), Some(java)) =
                        (d.ratio_vs_kafka_producer, d.kafka_producer_records_per_sec)
                    else {
                        continue;
                    };
                    writeln!(
                        f,
                        "{}: drain ratio vs kafka producer: {ratio:.2} (tern {:.0} records/s, \
                         kafka producer {java:.0} records/s of {bytes} B, acks=all; \
                         tern wire/payload {:.3})",
                        d.codec, d.records_per_sec, d.wire_to_kafka_per_payload_byte
                    )?;
                    if let (Some(ratio), Some(java)) = (
                        d.ratio_vs_kafka_producer_big_batch,
                        d.kafka_producer_big_batch_records_per_sec,
                    ) {
                        writeln!(
                            f,
                            "{}: drain ratio vs kafka producer with batch.size {TERN_BATCH}: \
                             {ratio:.2} ({java:.0} records/s)",
                            d.codec
                        )?;
                    }
                }
            }
            None => writeln!(
                f,
                "drain ratio vs kafka producer: not measured (no --kafka-classpath)"
            )?,
        }
        if let Some(i) = &self.idempotence {
            writeln!(
                f,
                "idempotent producer cost ({}): {:.0} records/s with it, {:.0} without \
                 (producer id -1): {:.1} %",
                i.codec,
                i.idempotent_records_per_sec,
                i.plain_records_per_sec,
                i.cost * 100.0
            )?;
        }
        if let Some(t) = &self.transactions {
            writeln!(
                f,
                "shared mode, transactions' cost ({}): {:.0} records/s in transactions \
                 ({:.0} per drain), {:.0} without (plain OffsetCommit, at least once): {:.1} %",
                t.codec,
                t.transactional_records_per_sec,
                t.transactions_per_drain,
                t.plain_records_per_sec,
                t.cost * 100.0
            )?;
        }
        for d in &self.serve_drains {
            write!(
                f,
                "tern serve drain ({} mode, {} build): {:.2} s, {:.0} records/s",
                d.mode, d.build, d.seconds, d.records_per_sec
            )?;
            match d.ratio_vs_compared {
                Some(ratio) => writeln!(f, "; this / compared build: {ratio:.2}")?,
                None => writeln!(f)?,
            }
        }
        if let Some(r) = &self.sensor_rate {
            writeln!(
                f,
                "shared mode at {:.0} records/s (1 partition, {} records): {} transactions, \
                 {:.1} EndTxn/s, {:.1} records per transaction",
                r.records_per_sec,
                r.records,
                r.transactions,
                r.transactions_per_sec,
                r.records_per_transaction
            )?;
        }
        match &self.capped {
            Some(c) => writeln!(
                f,
                "bandwidth cap {} B/s (none, {} records, {:.1} s): {:.0} B/s as the cap counts \
                 them, {:.1} % of the cap; {:.0} B/s on the wire",
                c.cap_bytes_per_sec,
                c.records,
                c.seconds,
                c.counted_bytes_per_sec,
                c.utilisation * 100.0,
                c.wire_bytes_per_sec
            )?,
            None => writeln!(
                f,
                "bandwidth cap: not measured (the drain went in one burst)"
            )?,
        }
        for t in &self.targets {
            writeln!(
                f,
                "target {} >= {}: measured {:.3} {}",
                t.name,
                t.target,
                t.measured,
                t.verdict()
            )?;
        }
        Ok(())
    }
}

fn table(drains: &[Drain]) -> String {
    let mut out = format!(
        "{:<8} {:>9} {:>12} {:>9} {:>14} {:>16} {:>12}\n",
        "codec", "drain s", "records/s", "MB/s", "wire/payload", "answers/payload", "x live"
    );
    for d in drains {
        let _ = writeln!(
            out,
            "{:<8} {:>9.2} {:>12.0} {:>9.2} {:>14.3} {:>16.4} {:>12.1}",
            d.codec,
            d.seconds,
            d.records_per_sec,
            d.mb_per_sec,
            d.wire_to_kafka_per_payload_byte,
            d.wire_from_kafka_per_payload_byte,
            d.drain_over_live
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::backlog::Window;
    use super::super::proxy::Counted;
    use super::*;
    use tern_upstream::{Codec, Mode};

    fn run(kind: DrainKind, codec: Codec, secs: u64, to_kafka: u64) -> DrainRun {
        DrainRun {
            kind,
            codec,
            records: 1000,
            elapsed: Duration::from_secs(secs),
            payload_bytes: 64_000,
            wire: Counted {
                to_kafka,
                from_kafka: 640,
            },
            window: None,
            batches: 4,
        }
    }

    fn serve(build: Build, mode: Mode, secs: u64) -> ServeDrain {
        ServeDrain {
            build,
            mode,
            records: 1000,
            elapsed: Duration::from_secs(secs),
        }
    }

    fn java(records_per_sec: f64) -> JavaRun {
        JavaRun {
            codec: Codec::Zstd,
            batch_size: None,
            records_per_sec,
        }
    }

    #[test]
    fn drains_are_medians_against_kafka_s_producer_and_the_live_anchor() {
        let options = UpstreamBenchOptions {
            kafka: vec!["127.0.0.1:9092".into()],
            records: 1000,
            size: 64,
            repetitions: 3,
            codecs: vec![Codec::Zstd],
            bandwidth: 125_000,
            kafka_classpath: Some("jars/*".into()),
            sensor_seconds: 10,
            compare_tern: None,
        };
        let live = LiveRun {
            messages: 100,
            ingest_msgs_per_sec: 20.0,
            forward_records_per_sec: 19.0,
            forward_bytes_per_sec: 1216.0,
            lag: Duration::from_millis(40),
        };
        let zstd = |secs, wire| run(DrainKind::Idempotent, Codec::Zstd, secs, wire);
        let capped = DrainRun {
            window: Some(Window {
                counted_bytes: 1_200_000,
                elapsed: Duration::from_secs(10),
            }),
            ..run(
                DrainKind::Capped {
                    bytes_per_sec: 125_000,
                },
                Codec::None,
                12,
                1_440_000,
            )
        };
        let runs = vec![
            zstd(1, 32_000),
            zstd(4, 16_000),
            zstd(2, 64_000),
            run(DrainKind::Plain, Codec::Zstd, 1, 64_000),
            run(
                DrainKind::Shared { transactions: true },
                Codec::Zstd,
                4,
                64_000,
            ),
            run(
                DrainKind::Shared {
                    transactions: false,
                },
                Codec::Zstd,
                2,
                64_000,
            ),
            capped,
        ];
        let big = JavaRun {
            batch_size: Some(TERN_BATCH),
            ..java(250.0)
        };
        let javas = vec![java(400.0), java(1000.0), big, java(100.0)];
        let report = Report::new(
            &options,
            vec![live],
            Duration::from_secs(3),
            runs,
            javas,
            Some(150),
        )
        .with_trickle(TrickleRun {
            records: 1000,
            elapsed: Duration::from_secs(10),
            transactions: 100,
        })
        .with_serve_drains(&[
            serve(Build::This, Mode::Mirror, 2),
            serve(Build::Compare, Mode::Mirror, 4),
            serve(Build::This, Mode::Shared, 5),
        ]);
        assert_eq!(
            report.drains.len(),
            1,
            "only the idempotent drains per codec"
        );
        let zstd = report.drains.first().expect("one codec");
        assert_eq!(zstd.codec, "zstd");
        assert_eq!(zstd.seconds, 2.0);
        assert_eq!(zstd.records_per_sec, 500.0);
        assert_eq!(zstd.wire_to_kafka_per_payload_byte, 0.5);
        assert_eq!(zstd.drain_over_live, 25.0);
        assert_eq!(zstd.kafka_producer_records_per_sec, Some(400.0));
        assert_eq!(zstd.ratio_vs_kafka_producer, Some(1.25));
        assert_eq!(zstd.kafka_producer_big_batch_records_per_sec, Some(250.0));
        assert_eq!(zstd.ratio_vs_kafka_producer_big_batch, Some(2.0));
        // 8,640,000 records x 64 B x 0.5 wire bytes per payload byte at 125,000 B/s.
        let hours = 8_640_000.0 * 64.0 * 0.5 / 125_000.0 / 3600.0;
        assert!((zstd.day_backlog_hours_at_1_mbit - hours).abs() < 1e-9);
        let idempotence = report.idempotence.expect("plain drain");
        assert_eq!(idempotence.plain_records_per_sec, 1000.0);
        assert_eq!(idempotence.cost, 0.5);
        let transactions = report.transactions.expect("shared drains");
        assert_eq!(transactions.transactional_records_per_sec, 250.0);
        assert_eq!(transactions.plain_records_per_sec, 500.0);
        assert_eq!(transactions.cost, 0.5);
        let sensor = report.sensor_rate.expect("trickle");
        assert_eq!(sensor.transactions_per_sec, 10.0);
        assert_eq!(sensor.records_per_transaction, 10.0);
        let cap = report.capped.expect("capped drain");
        assert_eq!(cap.counted_bytes_per_sec, 120_000.0);
        assert_eq!(cap.utilisation, 0.96);
        assert_eq!(cap.wire_bytes_per_sec, 120_000.0);
        assert_eq!(report.targets.len(), 2);
        assert!(report.targets.iter().all(|t| t.met));
        let text = report.to_string();
        for line in [
            "zstd: drain ratio vs kafka producer: 1.25 (tern 500 records/s, kafka producer 400 \
             records/s of 150 B, acks=all; tern wire/payload 0.500)",
            "zstd: drain ratio vs kafka producer with batch.size 524288: 2.00 (250 records/s)",
            "idempotent producer cost (zstd): 500 records/s with it, 1000 without (producer id \
             -1): 50.0 %",
            "bandwidth cap 125000 B/s (none, 1000 records, 12.0 s): 120000 B/s as the cap counts \
             them, 96.0 % of the cap; 120000 B/s on the wire",
            "shared mode, transactions' cost (zstd): 250 records/s in transactions (4 per \
             drain), 500 without (plain OffsetCommit, at least once): 50.0 %",
            "shared mode at 100 records/s (1 partition, 1000 records): 100 transactions, 10.0 \
             EndTxn/s, 10.0 records per transaction",
            "tern serve drain (mirror mode, this build): 2.00 s, 500 records/s; this / compared \
             build: 2.00",
            "tern serve drain (mirror mode, compared build): 4.00 s, 250 records/s\n",
            "tern serve drain (shared mode, this build): 5.00 s, 200 records/s\n",
            "target zstd drain / kafka producer >= 0.8: measured 1.250 met",
            "target capped drain / bandwidth cap >= 0.95: measured 0.960 met",
            "(8640000 records x 64 B) over 1 Mbit/s with zstd: 0.6 h",
        ] {
            assert!(text.contains(line), "{line}\nnot in\n{text}");
        }
        let json = crate::report::to_json(&report).expect("serializes");
        let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(json["drains"][0]["records_per_sec"], 500.0);
        assert_eq!(json["drains"][0]["ratio_vs_kafka_producer"], 1.25);
        assert_eq!(json["capped"]["utilisation"], 0.96);
        assert_eq!(json["live"]["ingest_msgs_per_sec"], 20.0);
    }

    #[test]
    fn without_kafka_s_producer_the_ratio_is_not_claimed() {
        let options = UpstreamBenchOptions {
            kafka: vec!["127.0.0.1:9092".into()],
            records: 1000,
            size: 64,
            repetitions: 1,
            codecs: vec![Codec::Lz4],
            bandwidth: 125_000,
            kafka_classpath: None,
            sensor_seconds: 10,
            compare_tern: None,
        };
        let runs = vec![run(DrainKind::Idempotent, Codec::Lz4, 1, 32_000)];
        let report = Report::new(&options, Vec::new(), Duration::ZERO, runs, Vec::new(), None);
        assert_eq!(
            report
                .drains
                .first()
                .and_then(|d| d.ratio_vs_kafka_producer),
            None
        );
        assert!(report.targets.is_empty());
        let text = report.to_string();
        assert!(
            text.contains("drain ratio vs kafka producer: not measured"),
            "{text}"
        );
    }
}
