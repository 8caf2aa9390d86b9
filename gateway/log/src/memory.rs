//! [`MemoryLog`]: an in-memory [`LogPort`] for the unit tests of the layers above the log
//! (feature `testing`). It keeps the real log's promises where tests can observe them:
//! offsets are assigned in queueing order, a record becomes visible to `read`, `offsets` and
//! the end watch only when its commit happens, and the commit answers every append it covers
//! (a commit covers a prefix of the partition, as a group commit does). Commits run on their
//! own task, so an append is committed whether or not its caller awaits the answer. A record
//! stamped earlier than its predecessor is stored with the predecessor's timestamp, and a
//! partition may start past offset 0 once a prefix is removed, as in the log.
//!
//! The log's contract suite (`tests/contract.rs`) runs the same scenarios against this and the
//! real log: a difference it finds is a bug here (or there), never a test to relax.
//!
//! Test controls: [`MemoryLog::set_full`] refuses appends as a full log does,
//! [`MemoryLog::set_disk_full`] and [`MemoryLog::set_no_space`] fail writes as a full disk
//! does, [`MemoryLog::hold_answers`] delays the commits of the next queued appends (on tokio's
//! clock, so paused-clock tests control them), [`MemoryLog::hold_commits`] holds every commit
//! until released, [`MemoryLog::remove_prefix`] removes the oldest records as retention does,
//! [`MemoryLog::close`] closes it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use crate::port::{LogPort, Queued};
use crate::{
    BatchSpan, Codec, LogConfig, LogError, ProducerStamp, Record, RecordView, StampedBatch,
    StoredRecord, TopicConfig, TopicInfo, TopicSettings, check_partition_count, check_topic_name,
};

/// A shared in-memory log whose topics all have the same partition count.
#[derive(Debug, Clone)]
pub struct MemoryLog {
    inner: Arc<Mutex<Inner>>,
    partitions: u32,
    /// Commits wait while it holds `true` ([`MemoryLog::hold_commits`]).
    commits_held: Arc<watch::Sender<bool>>,
}

#[derive(Debug, Default)]
struct Inner {
    topics: BTreeMap<String, Vec<Partition>>,
    /// The settings topics were created with (only those that had some).
    configs: BTreeMap<String, Arc<TopicConfig>>,
    cursors: BTreeMap<(String, String, u32), u64>,
    /// Commit delays of the next queued appends, in queueing order.
    holds: VecDeque<Duration>,
    full: bool,
    /// Topics whose appends fail with [`LogError::NoSpace`] (a full disk).
    no_space: std::collections::BTreeSet<String>,
    /// Every write fails as on a full disk ([`MemoryLog::set_disk_full`]).
    disk_full: bool,
    closed: bool,
    unanswered: usize,
    most_unanswered: usize,
}

#[derive(Debug)]
struct Partition {
    /// The first offset kept: retention ([`MemoryLog::remove_prefix`]) moves it.
    start: u64,
    /// The records from `start` on.
    durable: Vec<StoredRecord>,
    /// One per committed append, in order: the offset after it and its codec.
    batches: Vec<(u64, Codec)>,
    /// The committed appends of idempotent producers, in order (all of them: this log has no
    /// segments to bound them by).
    stamps: Vec<StampedBatch>,
    pending: VecDeque<Pending>,
    /// The offset the next queued record gets.
    next: u64,
    /// The largest timestamp committed: no record is stored below it (the log's rule).
    ts_floor: i64,
    end: watch::Sender<u64>,
}

#[derive(Debug)]
struct Pending {
    base: u64,
    records: Vec<Record>,
    codec: Codec,
    producer: Option<ProducerStamp>,
    reply: oneshot::Sender<Result<u64, LogError>>,
}

impl Partition {
    fn new() -> Self {
        Self {
            start: 0,
            durable: Vec::new(),
            batches: Vec::new(),
            stamps: Vec::new(),
            pending: VecDeque::new(),
            next: 0,
            ts_floor: i64::MIN,
            end: watch::channel(0).0,
        }
    }

    fn durable_end(&self) -> u64 {
        self.start + self.durable.len() as u64
    }
}

impl MemoryLog {
    /// An empty log; every topic gets `partitions` partitions (at least one).
    pub fn new(partitions: u32) -> Self {
        Self {
            inner: Arc::default(),
            partitions: partitions.max(1),
            commits_held: Arc::new(watch::channel(false).0),
        }
    }

    /// Makes every later append fail with [`LogError::Full`] (or succeed again).
    pub fn set_full(&self, full: bool) {
        self.lock().full = full;
    }

    /// Makes every later append to `topic` fail with [`LogError::NoSpace`], and every cursor
    /// commit on it with the cursor file's ENOSPC, as on a full disk (or succeed again).
    pub fn set_no_space(&self, topic: &str, full: bool) {
        let mut inner = self.lock();
        if full {
            inner.no_space.insert(topic.to_owned());
        } else {
            inner.no_space.remove(topic);
        }
    }

    /// Delays the commits of the next queued appends by `delays`, one each, in queueing order.
    pub fn hold_answers(&self, delays: impl IntoIterator<Item = Duration>) {
        self.lock().holds.extend(delays);
    }

    /// While `held`, no commit happens: queued appends stay invisible and unanswered until it
    /// is called with `false` (the log's fdatasync held on a slow disk).
    pub fn hold_commits(&self, held: bool) {
        self.commits_held.send_replace(held);
    }

    /// How many commits are waiting for [`MemoryLog::hold_commits`] to be released.
    pub fn held_commits(&self) -> usize {
        self.commits_held.receiver_count()
    }

    /// Makes every later write fail as on a full disk (appends with [`LogError::NoSpace`],
    /// cursor commits and removals with the cursor file's ENOSPC), or succeed again.
    pub fn set_disk_full(&self, full: bool) {
        self.lock().disk_full = full;
    }

    /// Removes the durable records of a partition below `before` (at most up to its durable
    /// end), as retention deletes the oldest segments: its start offset moves there.
    pub fn remove_prefix(&self, topic: &str, partition: u32, before: u64) {
        let mut inner = self.lock();
        if let Some(part) = partition_mut(&mut inner.topics, topic, partition) {
            let before = before.clamp(part.start, part.durable_end());
            let removed = usize::try_from(before - part.start).unwrap_or(usize::MAX);
            part.durable.drain(..removed.min(part.durable.len()));
            part.stamps.retain(|stamped| stamped.base_offset >= before);
            part.start = before;
        }
    }

    /// The most queued appends that were waiting for their answer at once.
    pub fn most_unanswered(&self) -> usize {
        self.lock().most_unanswered
    }

    /// Closes the log: later calls fail with [`LogError::Closed`].
    pub fn close(&self) {
        self.lock().closed = true;
    }

    /// Every durable record of `topic`, all partitions, in partition then offset order.
    pub fn all(&self, topic: &str) -> Vec<Record> {
        let inner = self.lock();
        inner.topics.get(topic).map_or_else(Vec::new, |parts| {
            parts
                .iter()
                .flat_map(|p| p.durable.iter().map(|r| r.record.clone()))
                .collect()
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Commits the queued appends of a partition up to `upto`, in order: their records become
    /// visible, the end watch moves, and then their answers go out.
    fn commit(&self, topic: &str, partition: u32, upto: u64) {
        let mut inner = self.lock();
        let mut answered = 0;
        if let Some(part) = partition_mut(&mut inner.topics, topic, partition) {
            let mut replies = Vec::new();
            while part.pending.front().is_some_and(|p| p.base < upto) {
                let Some(pending) = part.pending.pop_front() else {
                    break;
                };
                for (offset, mut record) in (pending.base..).zip(pending.records) {
                    record.timestamp_ms = record.timestamp_ms.max(part.ts_floor);
                    part.ts_floor = record.timestamp_ms;
                    part.durable.push(StoredRecord { offset, record });
                }
                part.batches.push((part.durable_end(), pending.codec));
                if let Some(stamp) = pending.producer {
                    part.stamps.push(StampedBatch {
                        stamp,
                        base_offset: pending.base,
                    });
                }
                replies.push((pending.reply, pending.base));
            }
            part.end.send_replace(part.durable_end());
            for (reply, base) in replies {
                answered += 1;
                let _ = reply.send(Ok(base));
            }
        }
        inner.unanswered = inner.unanswered.saturating_sub(answered);
    }

    fn check_open(inner: &Inner) -> Result<(), LogError> {
        if inner.closed {
            Err(LogError::Closed)
        } else {
            Ok(())
        }
    }

    fn with_partition<T>(
        &self,
        topic: &str,
        partition: u32,
        f: impl FnOnce(&Partition) -> Result<T, LogError>,
    ) -> Result<T, LogError> {
        let inner = self.lock();
        Self::check_open(&inner)?;
        let parts = inner
            .topics
            .get(topic)
            .ok_or_else(|| LogError::UnknownTopic {
                topic: topic.to_owned(),
            })?;
        let part = parts
            .get(partition as usize)
            .ok_or_else(|| LogError::UnknownPartition {
                topic: topic.to_owned(),
                partition,
            })?;
        f(part)
    }
}

fn partition_mut<'a>(
    topics: &'a mut BTreeMap<String, Vec<Partition>>,
    topic: &str,
    partition: u32,
) -> Option<&'a mut Partition> {
    topics.get_mut(topic)?.get_mut(partition as usize)
}

impl MemoryLog {
    /// Queues one append (one batch), stamped when an idempotent producer sent it.
    fn enqueue_batch(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
        producer: Option<ProducerStamp>,
    ) -> Result<Queued, LogError> {
        if records.is_empty() {
            return Err(LogError::InvalidAppend {
                topic: topic.to_owned(),
                reason: "no records".to_owned(),
            });
        }
        let (reply, answer) = oneshot::channel();
        let (upto, hold) = {
            let mut inner = self.lock();
            Self::check_open(&inner)?;
            if inner.full {
                return Err(LogError::Full {
                    topic: topic.to_owned(),
                    partition,
                });
            }
            if inner.disk_full || inner.no_space.contains(topic) {
                return Err(LogError::NoSpace {
                    topic: topic.to_owned(),
                    partition,
                    op: "write",
                    path: std::path::PathBuf::from(topic),
                });
            }
            let hold = inner.holds.pop_front().unwrap_or_default();
            let part = partition_mut(&mut inner.topics, topic, partition).ok_or_else(|| {
                LogError::UnknownPartition {
                    topic: topic.to_owned(),
                    partition,
                }
            })?;
            let base = part.next;
            part.next += records.len() as u64;
            let upto = part.next;
            part.pending.push_back(Pending {
                base,
                records,
                codec,
                producer,
                reply,
            });
            inner.unanswered += 1;
            inner.most_unanswered = inner.most_unanswered.max(inner.unanswered);
            (upto, hold)
        };
        let log = self.clone();
        let topic = topic.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            let _ = log.commits_held.subscribe().wait_for(|held| !held).await;
            log.commit(&topic, partition, upto);
        });
        Ok(Box::pin(async move {
            answer.await.map_err(|_| LogError::Closed)?
        }))
    }
}

impl LogPort for MemoryLog {
    fn topics(&self) -> Vec<TopicInfo> {
        self.lock()
            .topics
            .iter()
            .map(|(name, parts)| TopicInfo {
                name: name.clone(),
                partitions: u32::try_from(parts.len()).unwrap_or(u32::MAX),
            })
            .collect()
    }

    fn ensure_topic(&self, topic: &str) -> Result<u32, LogError> {
        check_topic_name(topic)?;
        let mut inner = self.lock();
        Self::check_open(&inner)?;
        let partitions = self.partitions;
        inner
            .topics
            .entry(topic.to_owned())
            .or_insert_with(|| (0..partitions).map(|_| Partition::new()).collect());
        Ok(partitions)
    }

    fn create_topic(&self, topic: &str, partitions: u32) -> Result<u32, LogError> {
        self.create_topic_with(topic, partitions, &TopicConfig::new())
    }

    fn create_topic_with(
        &self,
        topic: &str,
        partitions: u32,
        config: &TopicConfig,
    ) -> Result<u32, LogError> {
        check_topic_name(topic)?;
        crate::topic_config::check(config).map_err(|reason| LogError::InvalidTopicConfig {
            topic: topic.to_owned(),
            reason,
        })?;
        let mut inner = self.lock();
        Self::check_open(&inner)?;
        check_partition_count(topic, partitions)?;
        if inner.topics.contains_key(topic) {
            return Err(LogError::TopicExists {
                topic: topic.to_owned(),
            });
        }
        let parts = (0..partitions).map(|_| Partition::new()).collect();
        inner.topics.insert(topic.to_owned(), parts);
        if !config.is_empty() {
            inner
                .configs
                .insert(topic.to_owned(), Arc::new(config.clone()));
        }
        Ok(partitions)
    }

    fn topic_config(&self, topic: &str) -> Result<Arc<TopicConfig>, LogError> {
        let inner = self.lock();
        if !inner.topics.contains_key(topic) {
            return Err(LogError::UnknownTopic {
                topic: topic.to_owned(),
            });
        }
        Ok(inner.configs.get(topic).cloned().unwrap_or_default())
    }

    fn add_partitions(&self, topic: &str, total: u32) -> Result<u32, LogError> {
        let mut inner = self.lock();
        Self::check_open(&inner)?;
        check_partition_count(topic, total)?;
        let parts = inner
            .topics
            .get_mut(topic)
            .ok_or_else(|| LogError::UnknownTopic {
                topic: topic.to_owned(),
            })?;
        let current = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        if total <= current {
            return Err(LogError::InvalidPartitions {
                topic: topic.to_owned(),
                reason: format!("the topic already has {current} partitions"),
            });
        }
        parts.extend((current..total).map(|_| Partition::new()));
        Ok(total)
    }

    async fn delete_topic(&self, topic: &str) -> Result<(), LogError> {
        let mut inner = self.lock();
        Self::check_open(&inner)?;
        let in_use = |reason: String| LogError::TopicInUse {
            topic: topic.to_owned(),
            reason,
        };
        if topic.starts_with("__") {
            return Err(in_use("internal topics cannot be deleted".to_owned()));
        }
        if !inner.topics.contains_key(topic) {
            return Err(LogError::UnknownTopic {
                topic: topic.to_owned(),
            });
        }
        let holder = inner.cursors.keys().find(|(_, t, _)| t == topic);
        if let Some((cursor, _, partition)) = holder {
            return Err(in_use(format!(
                "cursor {cursor:?} holds a position on partition {partition}; delete it first"
            )));
        }
        inner.topics.remove(topic);
        inner.configs.remove(topic);
        Ok(())
    }

    fn topic_settings(&self, topic: &str) -> Result<TopicSettings, LogError> {
        let inner = self.lock();
        let parts = inner
            .topics
            .get(topic)
            .ok_or_else(|| LogError::UnknownTopic {
                topic: topic.to_owned(),
            })?;
        let mut settings = LogConfig::default().topic_settings(topic);
        settings.partitions = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        Ok(settings)
    }

    fn default_partitions(&self, _topic: &str) -> u32 {
        self.partitions
    }

    async fn append(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<u64, LogError> {
        self.enqueue(topic, partition, records).await?.await
    }

    async fn enqueue(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<Queued, LogError> {
        self.enqueue_with(topic, partition, records, Codec::None)
            .await
    }

    /// Each append is one batch, kept with its codec.
    async fn enqueue_with(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
    ) -> Result<Queued, LogError> {
        self.enqueue_batch(topic, partition, records, codec, None)
    }

    async fn enqueue_stamped(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
        producer: ProducerStamp,
    ) -> Result<Queued, LogError> {
        self.enqueue_batch(topic, partition, records, codec, Some(producer))
    }

    fn producer_stamps(&self, topic: &str, partition: u32) -> Result<Vec<StampedBatch>, LogError> {
        self.with_partition(topic, partition, |part| Ok(part.stamps.clone()))
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, LogError> {
        self.with_partition(topic, partition, |part| {
            let (start, end) = (part.start, part.durable_end());
            if from < start || from > end {
                return Err(LogError::OffsetOutOfRange {
                    topic: topic.to_owned(),
                    partition,
                    offset: from,
                    start,
                    end,
                });
            }
            let mut size = 0;
            Ok(part
                .durable
                .iter()
                .skip(usize::try_from(from - start).unwrap_or(usize::MAX))
                .take_while(|r| {
                    let first = size == 0;
                    size += r.record.size();
                    first || size <= max_bytes
                })
                .cloned()
                .collect())
        })
    }

    fn read_batched(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
        visit: &mut dyn FnMut(u64, &RecordView<'_>, BatchSpan),
    ) -> Result<usize, LogError> {
        let records = self.read(topic, partition, from, max_bytes)?;
        // The span of each record, looked up under the partition's lock (no copy of its list).
        let spans: Vec<BatchSpan> = self.with_partition(topic, partition, |part| {
            Ok(records
                .iter()
                .map(|stored| {
                    let at = part
                        .batches
                        .partition_point(|(next, _)| *next <= stored.offset);
                    let (next_offset, codec) = part
                        .batches
                        .get(at)
                        .copied()
                        .unwrap_or((u64::MAX, Codec::None));
                    BatchSpan { next_offset, codec }
                })
                .collect())
        })?;
        for (stored, span) in records.iter().zip(spans) {
            visit(stored.offset, &RecordView::of(&stored.record), span);
        }
        Ok(records.len())
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), LogError> {
        self.with_partition(topic, partition, |part| {
            Ok((part.start, part.durable_end()))
        })
    }

    fn lag(&self, topic: &str, partition: u32, from: u64) -> Result<crate::Lag, LogError> {
        self.with_partition(topic, partition, |part| {
            let left = part.durable.iter().filter(|r| r.offset >= from);
            let (records, bytes) = left.fold((0u64, 0u64), |(n, b), r| {
                (n + 1, b + r.record.size() as u64)
            });
            let oldest_ms = part
                .durable
                .iter()
                .find(|r| r.offset >= from)
                .map(|r| r.record.timestamp_ms);
            Ok(crate::Lag {
                records,
                bytes: Some(bytes),
                oldest_ms,
            })
        })
    }

    fn offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        ts_ms: i64,
    ) -> Result<Option<u64>, LogError> {
        self.with_partition(topic, partition, |part| {
            Ok(part
                .durable
                .iter()
                .find(|r| r.record.timestamp_ms >= ts_ms)
                .map(|r| r.offset))
        })
    }

    fn subscribe(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, LogError> {
        self.with_partition(topic, partition, |part| Ok(part.end.subscribe()))
    }

    fn cursor(&self, name: &str, topic: &str, partition: u32) -> Option<u64> {
        let key = (name.to_owned(), topic.to_owned(), partition);
        self.lock().cursors.get(&key).copied()
    }

    async fn commit_cursor(
        &self,
        name: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<(), LogError> {
        let mut inner = self.lock();
        Self::check_open(&inner)?;
        if inner.disk_full || inner.no_space.contains(topic) {
            return Err(cursor_file_full());
        }
        inner
            .cursors
            .insert((name.to_owned(), topic.to_owned(), partition), offset);
        Ok(())
    }

    fn cursor_names(&self) -> Vec<String> {
        let names: BTreeSet<String> = self.lock().cursors.keys().map(|k| k.0.clone()).collect();
        names.into_iter().collect()
    }

    async fn remove_cursors(&self, name: &str) -> Result<(), LogError> {
        let mut inner = self.lock();
        Self::check_open(&inner)?;
        if inner.disk_full {
            return Err(cursor_file_full());
        }
        inner.cursors.retain(|(n, _, _), _| n != name);
        Ok(())
    }
}

/// What the log's cursor store answers when the disk is full: its file's write failed.
fn cursor_file_full() -> LogError {
    LogError::Io {
        op: "write",
        path: std::path::PathBuf::from(crate::cursors::CURSORS_FILE),
        source: std::io::ErrorKind::StorageFull.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn record(value: &str) -> Record {
        Record {
            timestamp_ms: 1,
            key: None,
            value: Bytes::copy_from_slice(value.as_bytes()),
            headers: crate::Headers::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_visible_before_its_commit() -> Result<(), LogError> {
        let log = MemoryLog::new(1);
        log.ensure_topic("t")?;
        let end = log.subscribe("t", 0)?;
        log.hold_answers([Duration::from_millis(50)]);
        let answer = log.enqueue("t", 0, vec![record("a")]).await?;
        tokio::time::sleep(Duration::from_millis(49)).await;
        assert_eq!(log.read("t", 0, 0, 1024)?, Vec::new());
        assert_eq!(log.offsets("t", 0)?, (0, 0));
        assert_eq!(*end.borrow(), 0);
        assert_eq!(answer.await?, 0);
        assert_eq!(log.offsets("t", 0)?, (0, 1));
        assert_eq!(*end.borrow(), 1);
        assert_eq!(log.read("t", 0, 0, 1024)?.len(), 1);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_covers_the_appends_queued_before_it() -> Result<(), LogError> {
        let log = MemoryLog::new(1);
        log.ensure_topic("t")?;
        log.hold_answers([Duration::from_secs(10), Duration::ZERO]);
        let first = log.enqueue("t", 0, vec![record("a"), record("b")]).await?;
        let second = log.enqueue("t", 0, vec![record("c")]).await?;
        assert_eq!(second.await?, 2);
        // The second commit made the first append durable too, long before its own delay.
        assert_eq!(first.await?, 0);
        assert_eq!(log.offsets("t", 0)?, (0, 3));
        assert_eq!(log.most_unanswered(), 2);
        Ok(())
    }

    #[tokio::test]
    async fn refuses_like_the_log() -> Result<(), LogError> {
        let log = MemoryLog::new(2);
        assert!(matches!(
            log.read("t", 0, 0, 1),
            Err(LogError::UnknownTopic { .. })
        ));
        assert_eq!(log.ensure_topic("t")?, 2);
        assert!(matches!(
            log.enqueue("t", 2, vec![record("a")]).await,
            Err(LogError::UnknownPartition { .. })
        ));
        assert!(matches!(
            log.read("t", 0, 1, 1),
            Err(LogError::OffsetOutOfRange { .. })
        ));
        log.set_full(true);
        assert!(matches!(
            log.append("t", 0, vec![record("a")]).await,
            Err(LogError::Full { .. })
        ));
        log.set_full(false);
        log.close();
        assert!(matches!(log.offsets("t", 0), Err(LogError::Closed)));
        Ok(())
    }

    #[tokio::test]
    async fn cursors_are_kept_by_name() -> Result<(), LogError> {
        let log = MemoryLog::new(1);
        log.commit_cursor("b", "t", 0, 4).await?;
        log.commit_cursor("a", "t", 0, 2).await?;
        log.commit_cursor("a", "t", 1, 3).await?;
        assert_eq!(log.cursor_names(), ["a", "b"]);
        assert_eq!(log.cursor("a", "t", 1), Some(3));
        log.remove_cursors("a").await?;
        assert_eq!(log.cursor_names(), ["b"]);
        assert_eq!(log.cursor("a", "t", 0), None);
        Ok(())
    }
}
