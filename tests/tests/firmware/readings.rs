//! One device's readings as the gateway's log holds them: read with
//! `tern log dump --decode reading` (the gateway decodes each value with
//! `tern_shared::Reading::decode`), typed back into `tern_shared::Reading`, and checked for
//! order, gaps and the values the simulated sensor must have produced.

use std::path::Path;

use anyhow::{Context, bail};
use tern_shared::Reading;
use tern_shared::device::simulate;
use tern_tests::dump_json;

/// The log topic the gateway stores every MQTT message in by default.
const LOG_TOPIC: &str = "mqtt";

/// The readings of one device, in log order.
#[derive(Debug)]
pub struct Readings {
    device_id: u32,
    list: Vec<Reading>,
}

impl Readings {
    /// Every record keyed `sensors/{device_id}/reading`; a record that does not decode fails.
    pub fn read(data_dir: &Path, device_id: u32) -> anyhow::Result<Self> {
        let topic = format!("sensors/{device_id}/reading");
        let mut list = Vec::new();
        for line in dump_json(data_dir, LOG_TOPIC, &["--decode", "reading"])? {
            if line["key"] != topic.as_str() {
                continue;
            }
            if let Some(error) = line.get("decode_error") {
                bail!(
                    "record {} of {topic} does not decode: {error}",
                    line["offset"]
                );
            }
            let qos = line["headers"].as_array().and_then(|headers| {
                headers
                    .iter()
                    .find(|h| h["name"] == "mqtt.qos")
                    .map(|h| &h["value"])
            });
            assert_eq!(qos, Some(&serde_json::json!("1")), "not QoS 1: {line}");
            let reading = serde_json::from_value(line["reading"].clone())
                .with_context(|| format!("reading of {line}"))?;
            list.push(reading);
        }
        Ok(Self { device_id, list })
    }

    /// How many different sequence numbers arrived.
    pub fn distinct(&self) -> usize {
        let mut sequences: Vec<u32> = self.list.iter().map(|r| r.sequence).collect();
        sequences.dedup();
        sequences.len()
    }

    /// The highest sequence number in the log (0 if there is none).
    pub fn last_sequence(&self) -> u32 {
        self.list.iter().map(|r| r.sequence).max().unwrap_or(0)
    }

    /// Sequence numbers run 0, 1, 2, … with no gap up to at least `at_least - 1`, each reading
    /// holding the simulated sensor's values and a later timestamp than the one before. The only
    /// repetition allowed is QoS 1's at-least-once resend: the identical reading (same sample,
    /// same timestamp) right after itself, as when a PUBACK was lost in the restart.
    pub fn assert_gap_free_from_zero(&self, at_least: u32) {
        let mut previous: Option<&Reading> = None;
        let mut next_sequence = 0;
        let mut resent = 0;
        for reading in &self.list {
            assert_eq!(reading.device_id, self.device_id, "{reading:?}");
            assert_eq!(reading.dropped, 0, "the backlog overflowed: {reading:?}");
            if let Some(previous) = previous.filter(|p| p.sequence == reading.sequence) {
                assert_eq!(previous, reading, "one sequence number, two samples");
                resent += 1;
                continue;
            }
            assert_eq!(
                reading.sequence,
                next_sequence,
                "gap or reorder in the log: {:?}",
                self.sequences()
            );
            assert_eq!(reading.values, simulate(self.device_id, reading.sequence));
            if let Some(previous) = previous {
                assert!(reading.uptime_ms > previous.uptime_ms, "{reading:?}");
            }
            next_sequence += 1;
            previous = Some(reading);
        }
        assert!(
            next_sequence >= at_least,
            "only {next_sequence} readings: {:?}",
            self.sequences()
        );
        eprintln!(
            "device {}: readings 0..{next_sequence} in the log, gap-free; {resent} resent after a lost PUBACK",
            self.device_id
        );
    }

    fn sequences(&self) -> Vec<u32> {
        self.list.iter().map(|r| r.sequence).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readings 0..count of device 1 as the firmware samples them (period 200 ms).
    fn sampled(count: u32) -> Vec<Reading> {
        (0..count)
            .map(|sequence| Reading {
                device_id: 1,
                sequence,
                uptime_ms: 200 * u64::from(sequence),
                dropped: 0,
                values: simulate(1, sequence),
            })
            .collect()
    }

    fn readings(list: Vec<Reading>) -> Readings {
        Readings { device_id: 1, list }
    }

    #[test]
    fn a_resend_of_the_identical_reading_is_at_least_once() {
        let mut list = sampled(6);
        list.insert(3, list[2]);
        let readings = readings(list);
        assert_eq!(readings.distinct(), 6);
        assert_eq!(readings.last_sequence(), 5);
        readings.assert_gap_free_from_zero(6);
    }

    #[test]
    #[should_panic(expected = "one sequence number, two samples")]
    fn a_repeated_sequence_with_another_sample_fails() {
        let mut list = sampled(6);
        let mut resampled = list[2];
        resampled.uptime_ms += 200;
        list.insert(3, resampled);
        readings(list).assert_gap_free_from_zero(6);
    }

    #[test]
    #[should_panic(expected = "gap or reorder")]
    fn a_gap_fails() {
        let mut list = sampled(6);
        list.remove(4);
        readings(list).assert_gap_free_from_zero(5);
    }

    #[test]
    #[should_panic(expected = "gap or reorder")]
    fn a_resend_after_a_later_reading_fails() {
        let mut list = sampled(6);
        list.push(list[2]);
        readings(list).assert_gap_free_from_zero(6);
    }

    #[test]
    #[should_panic(expected = "only 6 readings")]
    fn too_few_readings_fail() {
        readings(sampled(6)).assert_gap_free_from_zero(7);
    }
}
