//! What an operator asks of an open log: the state of every partition (offsets, sizes, whether
//! it refuses appends and why, naming the cursor that holds a full one), every cursor with its
//! lag and the bytes it holds, and the two repairs of a stuck cursor: delete it or move it.
//!
//! It reads partition state and moves cursors through the cursor store; it never writes a
//! segment (retention, run after a repair, is the writer's own code).

use std::sync::atomic::Ordering;

use super::error::{LogError, Result};
use super::partition::Partition;
use super::store::Log;

/// Why a partition refuses appends.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The retention limit is reached under `on_full = "reject"` and the oldest segment is
    /// still needed by `holder`, the cursor with the lowest position in the partition.
    Full { holder: Option<String> },
    /// The writer stopped (a failed fdatasync, or its task ended); appends fail until restart.
    WriterStopped { reason: String },
}

/// One partition as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub topic: String,
    pub partition: u32,
    pub start_offset: u64,
    pub end_offset: u64,
    pub bytes: u64,
    pub segments: usize,
    /// Set while the partition refuses appends.
    pub refusing: Option<Refusal>,
}

/// One cursor's position in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorPosition {
    pub topic: String,
    pub partition: u32,
    /// The next offset the cursor's owner reads.
    pub offset: u64,
    pub end_offset: u64,
    /// Records between the cursor and the end.
    pub lag_records: u64,
    /// Bytes between the cursor and the end (exact at segment boundaries, interpolated by
    /// offset inside the segment holding the cursor).
    pub lag_bytes: u64,
    /// Bytes retention cannot delete because of this cursor: every segment from the one
    /// holding the cursor on (0 at the end of the partition).
    pub held_bytes: u64,
    /// Timestamp (ms since the epoch) of the oldest record the cursor holds, if any.
    pub oldest_held_ms: Option<i64>,
}

/// A cursor and its positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorReport {
    pub name: String,
    pub positions: Vec<CursorPosition>,
}

/// Where `reset` moves a cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    /// The oldest record still stored.
    Earliest,
    /// The end: the owner skips everything stored.
    Latest,
    /// This offset (must lie between the partition's start and end).
    Offset(u64),
}

impl ResetTo {
    /// Parses `earliest`, `latest` or an offset.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "earliest" => Ok(Self::Earliest),
            "latest" => Ok(Self::Latest),
            other => other
                .parse()
                .map(Self::Offset)
                .map_err(|_| format!("`{other}` is not `earliest`, `latest` or an offset")),
        }
    }
}

impl Partition {
    /// (base, end, bytes) of every segment, oldest first.
    fn segment_spans(&self) -> Vec<(u64, u64, u64)> {
        let st = self.lock();
        let sealed = st.sealed.iter().map(|s| (s.base, s.end, s.len));
        let active = (st.active.base, st.active.end, st.active.len);
        sealed.chain(std::iter::once(active)).collect()
    }

    fn position(&self, offset: u64) -> CursorPosition {
        let (start, end) = self.offsets();
        let (mut lag_bytes, mut held_bytes) = (0u64, 0u64);
        for (base, seg_end, len) in self.segment_spans() {
            if seg_end <= offset || offset >= end {
                continue;
            }
            held_bytes += len;
            lag_bytes += if offset <= base {
                len
            } else {
                let span = u128::from(seg_end - base).max(1);
                let part = u128::from(len) * u128::from(seg_end - offset) / span;
                u64::try_from(part).unwrap_or(len)
            };
        }
        let oldest_held_ms = (offset < end)
            .then(|| self.read(offset.max(start), 1).ok())
            .flatten()
            .and_then(|records| records.first().map(|r| r.record.timestamp_ms));
        CursorPosition {
            topic: self.topic.clone(),
            partition: self.id,
            offset,
            end_offset: end,
            lag_records: end.saturating_sub(offset),
            lag_bytes,
            held_bytes,
            oldest_held_ms,
        }
    }

    fn state(&self, writer_ended: bool, holder: Option<String>) -> PartitionState {
        let stats = self.stats();
        let failed = self.lock().failed.clone();
        let refusing = match failed {
            Some(reason) => Some(Refusal::WriterStopped { reason }),
            None if writer_ended => Some(Refusal::WriterStopped {
                reason: "the writer task ended".to_owned(),
            }),
            None if self.full.load(Ordering::Relaxed) => Some(Refusal::Full { holder }),
            None => None,
        };
        PartitionState {
            topic: stats.topic,
            partition: stats.partition,
            start_offset: stats.start_offset,
            end_offset: stats.end_offset,
            bytes: stats.bytes,
            segments: stats.segments,
            refusing,
        }
    }

    /// Records a refused (`true`) or admitted append and logs the change, naming the holder.
    pub(crate) fn note_full(&self, full: bool) {
        if self.full.swap(full, Ordering::Relaxed) == full {
            return;
        }
        if full {
            let holder = holder(&self.shared.cursors.list(), &self.topic, self.id);
            tracing::warn!(
                topic = %self.topic,
                partition = self.id,
                holder = %holder.as_deref().unwrap_or("none"),
                "partition full: refusing appends until the cursor holding it moves (tern cursors list)"
            );
        } else {
            tracing::info!(topic = %self.topic, partition = self.id, "partition accepts appends again");
        }
    }
}

/// The cursor with the lowest position in a partition (the one retention waits for).
fn holder(cursors: &[(String, String, u32, u64)], topic: &str, partition: u32) -> Option<String> {
    cursors
        .iter()
        .filter(|(_, t, p, _)| t == topic && *p == partition)
        .min_by_key(|(_, _, _, offset)| *offset)
        .map(|(name, ..)| name.clone())
}

impl Log {
    /// Every partition's offsets, size and whether (and why) it refuses appends.
    pub fn partition_states(&self) -> Vec<PartitionState> {
        let cursors = self.cursors().list();
        self.partitions_with_writers()
            .into_iter()
            .map(|(part, ended)| {
                let holder = holder(&cursors, &part.topic, part.id);
                part.state(ended, holder)
            })
            .collect()
    }

    /// What a reader at `from` has left in a partition ([`LogPort::lag`](crate::LogPort::lag)).
    pub fn lag(&self, topic: &str, partition: u32, from: u64) -> Result<crate::Lag, LogError> {
        let part =
            self.partition_handle(topic, partition)
                .ok_or_else(|| LogError::UnknownPartition {
                    topic: topic.to_owned(),
                    partition,
                })?;
        let (start, _) = part.offsets();
        let position = part.position(from.max(start));
        Ok(crate::Lag {
            records: position.lag_records,
            bytes: Some(position.lag_bytes),
            oldest_ms: position.oldest_held_ms,
        })
    }

    /// Every cursor with its lag and held bytes per partition, by name.
    pub fn cursor_report(&self) -> Vec<CursorReport> {
        let mut reports: Vec<CursorReport> = Vec::new();
        for (name, topic, partition, offset) in self.cursors().list() {
            let position = match self.partition_handle(&topic, partition) {
                Some(part) => part.position(offset),
                None => CursorPosition {
                    topic,
                    partition,
                    offset,
                    end_offset: 0,
                    lag_records: 0,
                    lag_bytes: 0,
                    held_bytes: 0,
                    oldest_held_ms: None,
                },
            };
            match reports.last_mut() {
                Some(last) if last.name == name => last.positions.push(position),
                _ => reports.push(CursorReport {
                    name,
                    positions: vec![position],
                }),
            }
        }
        reports
    }

    /// Removes every position of `name`; false if there was none. Retention runs at once, so
    /// a partition the cursor held full takes appends again.
    pub async fn delete_cursor(&self, name: &str) -> Result<bool> {
        if !self.has_cursor(name) {
            return Ok(false);
        }
        self.cursors().remove(name).await?;
        self.after_repair().await;
        Ok(true)
    }

    /// Moves every position of `name` (only those in `topic`, when given) to `to`; returns the
    /// positions moved (0 if the cursor does not exist).
    pub async fn reset_cursor(
        &self,
        name: &str,
        topic: Option<&str>,
        to: ResetTo,
    ) -> Result<usize> {
        let cursors = self.cursors();
        let targets: Vec<(String, u32)> = cursors
            .list()
            .into_iter()
            .filter(|(n, t, ..)| n == name && topic.is_none_or(|want| want == t))
            .map(|(_, t, p, _)| (t, p))
            .collect();
        let mut moves = Vec::with_capacity(targets.len());
        for (t, p) in &targets {
            let (start, end) = self.offsets(t, *p)?;
            let offset = match to {
                ResetTo::Earliest => start,
                ResetTo::Latest => end,
                ResetTo::Offset(o) if (start..=end).contains(&o) => o,
                ResetTo::Offset(o) => {
                    return Err(LogError::OffsetOutOfRange {
                        topic: t.clone(),
                        partition: *p,
                        offset: o,
                        start,
                        end,
                    });
                }
            };
            moves.push((t, *p, offset));
        }
        for (t, p, offset) in &moves {
            cursors.commit(name, t, *p, *offset).await?;
        }
        self.after_repair().await;
        Ok(moves.len())
    }

    fn has_cursor(&self, name: &str) -> bool {
        self.cursors().list().iter().any(|(n, ..)| n == name)
    }

    fn partition_handle(&self, topic: &str, partition: u32) -> Option<std::sync::Arc<Partition>> {
        self.partitions_with_writers()
            .into_iter()
            .map(|(part, _)| part)
            .find(|p| p.topic == topic && p.id == partition)
    }

    /// After a cursor moved: retention frees what it can, and "full" is re-decided by the
    /// next append instead of reported from before the repair.
    async fn after_repair(&self) {
        self.enforce_retention().await;
        for (part, _) in self.partitions_with_writers() {
            part.full.store(false, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LogConfig;
    use crate::fs::FaultyFs;
    use crate::tests::{open, record, runtime};
    use tern_core::ByteSize;

    fn first(report: &[CursorReport]) -> (String, CursorPosition) {
        let cursor = report.first().expect("a cursor");
        let position = cursor.positions.first().expect("a position");
        (cursor.name.clone(), position.clone())
    }

    fn refusal(log: &Log) -> Option<Refusal> {
        let states = log.partition_states();
        states.first().expect("a partition").refusing.clone()
    }

    #[test]
    fn a_cursor_reports_lag_and_can_be_reset_and_deleted() {
        runtime().block_on(async {
            let log = open(&FaultyFs::new(1), &LogConfig::for_tests(4096)).await;
            log.ensure_topic("t").expect("topic");
            for seq in 0..10 {
                let rec = record(1, seq, 1_700_000_000_000 + seq as i64);
                log.append("t", 0, vec![rec]).await.expect("append");
            }
            log.cursors().commit("c", "t", 0, 4).await.expect("commit");
            let report = log.cursor_report();
            let (name, pos) = first(&report);
            assert_eq!((name.as_str(), pos.lag_records), ("c", 6));
            assert!(
                pos.lag_bytes > 0 && pos.lag_bytes <= pos.held_bytes,
                "{pos:?}"
            );
            assert_eq!(pos.oldest_held_ms, Some(1_700_000_000_004));

            let moved = log.reset_cursor("c", None, ResetTo::Latest).await;
            assert_eq!(moved.expect("reset"), 1);
            assert_eq!(log.cursors().get("c", "t", 0), Some(10));
            let pos = first(&log.cursor_report()).1;
            assert_eq!(
                (pos.lag_records, pos.held_bytes, pos.oldest_held_ms),
                (0, 0, None)
            );
            let past_end = log.reset_cursor("c", None, ResetTo::Offset(11)).await;
            assert!(
                matches!(past_end, Err(LogError::OffsetOutOfRange { .. })),
                "{past_end:?}"
            );
            let earliest = log.reset_cursor("c", Some("t"), ResetTo::Earliest).await;
            assert_eq!(earliest.expect("reset"), 1);
            assert_eq!(log.cursors().get("c", "t", 0), Some(0));

            assert!(log.delete_cursor("c").await.expect("delete"));
            assert!(!log.delete_cursor("c").await.expect("delete again"));
            assert!(log.cursor_report().is_empty());
        });
    }

    #[test]
    fn a_full_partition_names_its_holder_until_the_holder_is_deleted() {
        let mut config = LogConfig::for_tests(600);
        config.retention.bytes = ByteSize(2_000);
        runtime().block_on(async {
            let log = open(&FaultyFs::new(2), &config).await;
            log.ensure_topic("t").expect("topic");
            log.cursors()
                .commit("stuck", "t", 0, 0)
                .await
                .expect("cursor");
            let mut seq = 0;
            while log.append("t", 0, vec![record(1, seq, 0)]).await.is_ok() {
                seq += 1;
                assert!(seq < 1000, "the log must fill up");
            }
            let refusing = refusal(&log);
            let holder = Some("stuck".to_owned());
            assert_eq!(refusing, Some(Refusal::Full { holder }));

            assert!(log.delete_cursor("stuck").await.expect("delete"));
            assert_eq!(refusal(&log), None);
            log.append("t", 0, vec![record(1, seq, 0)])
                .await
                .expect("room again");
        });
    }

    #[test]
    fn reset_targets_parse() {
        assert_eq!(ResetTo::parse("earliest"), Ok(ResetTo::Earliest));
        assert_eq!(ResetTo::parse("latest"), Ok(ResetTo::Latest));
        assert_eq!(ResetTo::parse("42"), Ok(ResetTo::Offset(42)));
        assert!(ResetTo::parse("-1").is_err());
    }
}
