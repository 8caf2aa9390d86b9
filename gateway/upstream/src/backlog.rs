//! What an operator sees of the upstream's backlog, per forwarded partition and per priority
//! class: records and bytes not yet forwarded, the age of the oldest, the forwarding rate and
//! the time to drain at that rate. Computed on demand from the status map and the log's
//! [`LogPort::lag`]; `/metrics` (`metrics.rs`) and the status page read it, it changes nothing.

use std::collections::BTreeMap;

use tern_log::LogPort;

use crate::bandwidth::Class;
use crate::driver::PartitionStatus;

/// The backlog of one partition, or of all partitions of a class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    pub records: u64,
    /// As stored in the edge log (exact at segment boundaries); a port that cannot tell gets an
    /// estimate from the mean size of the records forwarded so far.
    pub bytes: u64,
    /// How long ago the oldest record not yet forwarded was stamped (0 without a backlog).
    pub age_ms: u64,
    /// Records per second forwarded lately (0 while disconnected).
    pub rate: u64,
}

impl Backlog {
    /// Seconds to forward the backlog at the present rate: 0 without one, `None` when nothing
    /// is moving.
    pub fn drain_seconds(&self) -> Option<u64> {
        match (self.records, self.rate) {
            (0, _) => Some(0),
            (_, 0) => None,
            (records, rate) => Some(records.div_ceil(rate)),
        }
    }

    fn add(&mut self, other: &Self) {
        self.records += other.records;
        self.bytes += other.bytes;
        self.age_ms = self.age_ms.max(other.age_ms);
        self.rate += other.rate;
    }
}

/// The backlog of `topic`/`partition`, whose forwarder is at `status.next`.
pub fn partition_backlog<L: LogPort>(
    log: &L,
    (topic, partition): (&str, u32),
    status: &PartitionStatus,
    now_ms: i64,
) -> Backlog {
    let Ok(lag) = log.lag(topic, partition, status.next) else {
        return Backlog::default();
    };
    let mean = status
        .forwarded_bytes
        .checked_div(status.forwarded_records)
        .unwrap_or(0);
    Backlog {
        records: lag.records,
        bytes: lag.bytes.unwrap_or(lag.records * mean),
        age_ms: lag
            .oldest_ms
            .map_or(0, |ts| u64::try_from(now_ms - ts).unwrap_or(0)),
        rate: if status.connected {
            status.rate_at(now_ms)
        } else {
            0
        },
    }
}

/// Every partition's backlog, and each class's (in [`Class::ALL`]'s order: sums, and the
/// oldest age) from them: the log is asked once per partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlogs {
    pub partitions: BTreeMap<(String, u32), Backlog>,
    pub classes: [Backlog; 3],
}

/// The backlogs of every partition of `map` and of each class.
pub fn backlogs<L: LogPort>(
    log: &L,
    map: &BTreeMap<(String, u32), PartitionStatus>,
    now_ms: i64,
) -> Backlogs {
    let mut all = Backlogs::default();
    for ((topic, partition), status) in map {
        let backlog = partition_backlog(log, (topic, *partition), status, now_ms);
        if let Some(i) = Class::ALL.iter().position(|c| *c == status.class) {
            all.classes[i].add(&backlog);
        }
        all.partitions.insert((topic.clone(), *partition), backlog);
    }
    all
}

#[cfg(test)]
mod tests {
    use tern_log::{MemoryLog, Record};

    use super::*;

    #[tokio::test]
    async fn a_backlog_counts_records_bytes_and_age_and_drains_at_the_rate() {
        let log = MemoryLog::new(1);
        for topic in ["alarms", "telemetry"] {
            log.ensure_topic(topic).expect("topic");
        }
        let now = 1_800_000_000_000;
        let records = |count: usize, ts: i64| {
            (0..count)
                .map(|_| Record {
                    timestamp_ms: ts,
                    key: None,
                    value: vec![0; 90].into(),
                    headers: tern_log::Headers::new(),
                })
                .collect::<Vec<_>>()
        };
        log.append("telemetry", 0, records(100, now - 3_600_000))
            .await
            .expect("append");
        log.append("telemetry", 0, records(20, now))
            .await
            .expect("append");
        log.append("alarms", 0, records(5, now - 1_000))
            .await
            .expect("append");
        let size = records(1, 0)[0].size() as u64;
        let telemetry = PartitionStatus {
            next: 40,
            class: Class::Low,
            connected: true,
            rate: 20,
            window_start_ms: now - 1_000,
            ..PartitionStatus::default()
        };
        let alarms = PartitionStatus {
            next: 5,
            class: Class::High,
            connected: true,
            ..PartitionStatus::default()
        };
        let backlog = partition_backlog(&log, ("telemetry", 0), &telemetry, now);
        assert_eq!(
            backlog,
            Backlog {
                records: 80,
                bytes: 80 * size,
                age_ms: 3_600_000,
                rate: 20
            }
        );
        assert_eq!(backlog.drain_seconds(), Some(4));
        let map = BTreeMap::from([
            (("alarms".to_owned(), 0), alarms),
            (("telemetry".to_owned(), 0), telemetry.clone()),
        ]);
        let all = backlogs(&log, &map, now);
        assert_eq!(
            all.partitions.get(&("telemetry".to_owned(), 0)),
            Some(&backlog)
        );
        let [high, normal, low] = all.classes;
        assert_eq!((high.records, high.drain_seconds()), (0, Some(0)));
        assert_eq!(normal, Backlog::default());
        assert_eq!(low, backlog);
        // Disconnected: nothing moves, no time to drain.
        let down = PartitionStatus {
            connected: false,
            ..telemetry.clone()
        };
        assert_eq!(
            partition_backlog(&log, ("telemetry", 0), &down, now).drain_seconds(),
            None
        );
        // A window running for two windows without a batch: the rate falls.
        let stalled = PartitionStatus {
            window_start_ms: now - 20_000,
            window_records: 40,
            ..telemetry
        };
        assert_eq!(stalled.rate_at(now), 2);
    }
}
