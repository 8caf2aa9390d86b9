//! The figures of `tern bench upstream`: medians over repetitions, each codec's drain rate as a
//! multiple of the live MQTT ingest rate of the same run (the anchor), bytes on the wire per
//! payload byte, and the ≥10× target with whether it is met; as a table or as one JSON object.
//!
//! It must never measure anything and never fail on a target it misses.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::backlog::DrainRun;
use super::live::LiveRun;
use super::{UpstreamBenchOptions, codec_name};
use crate::report::Target;
use crate::stats;

/// A backlog must drain at least this many times faster than live MQTT ingest.
const TARGET_DRAIN_RATIO: f64 = 10.0;

/// The outage backlog whose drain time over a slow uplink is printed per codec: 24 hours of
/// 100 messages a second, over 1 Mbit/s.
const DAY_BACKLOG_RECORDS: f64 = 24.0 * 3600.0 * 100.0;
const UPLINK_BYTES_PER_SEC: f64 = 1e6 / 8.0;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shape {
    pub records: u64,
    pub size: usize,
    pub repetitions: usize,
    pub partitions: u32,
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
    ) -> Self {
        let live = Live {
            codec: codec_name(tern_upstream::UpstreamConfig::default().compression),
            messages: live.first().map_or(0, |r| r.messages),
            ingest_msgs_per_sec: median(live.iter().map(|r| r.ingest_msgs_per_sec)),
            forward_records_per_sec: median(live.iter().map(|r| r.forward_records_per_sec)),
            forward_mb_per_sec: median(live.iter().map(|r| r.forward_bytes_per_sec / 1e6)),
            lag_ms: median(live.iter().map(|r| r.lag.as_secs_f64() * 1000.0)),
        };
        let drains: Vec<Drain> = options
            .codecs
            .iter()
            .map(|&codec| {
                drain(
                    live.ingest_msgs_per_sec,
                    drains.iter().filter(|d| d.codec == codec),
                )
            })
            .collect();
        let targets = drains
            .iter()
            .map(|d| {
                let name = format!("{} drain / live ingest", d.codec);
                Target::at_least(name, TARGET_DRAIN_RATIO, d.drain_over_live)
            })
            .collect();
        Self {
            shape: Shape {
                records: options.records,
                size: options.size,
                repetitions: options.repetitions,
                partitions: 1,
            },
            live,
            backlog_build_seconds: built.as_secs_f64(),
            drains,
            targets,
        }
    }
}

/// The medians of one codec's runs.
fn drain<'a>(live_rate: f64, runs: impl Iterator<Item = &'a DrainRun> + Clone) -> Drain {
    let per_payload = |bytes: fn(&DrainRun) -> u64| {
        median(
            runs.clone()
                .map(move |r| bytes(r) as f64 / r.payload_bytes.max(1) as f64),
        )
    };
    let rate = |r: &DrainRun| r.records as f64 / r.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
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
        for t in &self.targets {
            writeln!(
                f,
                "target {} >= {}x: measured {:.1}x {}",
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
    use super::super::proxy::Counted;
    use super::*;
    use tern_upstream::Codec;

    fn run(codec: Codec, secs: u64, to_kafka: u64) -> DrainRun {
        DrainRun {
            codec,
            records: 1000,
            elapsed: Duration::from_secs(secs),
            payload_bytes: 64_000,
            wire: Counted {
                to_kafka,
                from_kafka: 640,
            },
        }
    }

    #[test]
    fn drains_are_medians_against_the_live_anchor() {
        let options = UpstreamBenchOptions {
            kafka: vec!["127.0.0.1:9092".into()],
            records: 1000,
            size: 64,
            repetitions: 3,
            codecs: vec![Codec::Zstd],
        };
        let live = LiveRun {
            messages: 100,
            ingest_msgs_per_sec: 20.0,
            forward_records_per_sec: 19.0,
            forward_bytes_per_sec: 1216.0,
            lag: Duration::from_millis(40),
        };
        let runs = vec![
            run(Codec::Zstd, 1, 32_000),
            run(Codec::Zstd, 4, 16_000),
            run(Codec::Zstd, 2, 64_000),
        ];
        let report = Report::new(&options, vec![live], Duration::from_secs(3), runs);
        let zstd = report.drains.first().expect("one codec");
        assert_eq!(zstd.codec, "zstd");
        assert_eq!(zstd.seconds, 2.0);
        assert_eq!(zstd.records_per_sec, 500.0);
        assert_eq!(zstd.wire_to_kafka_per_payload_byte, 0.5);
        assert_eq!(zstd.drain_over_live, 25.0);
        // 8,640,000 records x 64 B x 0.5 wire bytes per payload byte at 125,000 B/s.
        let hours = 8_640_000.0 * 64.0 * 0.5 / 125_000.0 / 3600.0;
        assert!((zstd.day_backlog_hours_at_1_mbit - hours).abs() < 1e-9);
        assert!(report.targets.iter().all(|t| t.met));
        let text = report.to_string();
        assert!(text.contains("measured 25.0x met"), "{text}");
        assert!(
            text.contains("(8640000 records x 64 B) over 1 Mbit/s with zstd: 0.6 h"),
            "{text}"
        );
        let json = crate::report::to_json(&report).expect("serializes");
        let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(json["drains"][0]["records_per_sec"], 500.0);
        assert_eq!(json["live"]["ingest_msgs_per_sec"], 20.0);
    }
}
