//! An in-memory upstream for unit tests, behaving like Kafka where the forwarders can tell: a
//! produce that was acknowledged is visible at once, a refused one stores nothing, and one whose
//! acknowledgement was lost stores its records but shows them only after a delay (on tokio's
//! clock), as a batch cut off in flight does. Faults are queued per produce; `set_down` fails
//! every call. The contract suite (`contract.rs`) runs the same scenarios against it and against
//! a real Kafka cluster: a handle exists only on a partition of an existing topic, retention
//! never passes the end, and mirror mode's produce is idempotent (edge offsets as sequences: a
//! gap is refused, a resent batch stored once).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tern_log::StoredRecord;
use tokio::time::Instant;

use crate::config::{Codec, ValueFormat};
use crate::error::UpstreamError;
use crate::follower::{Cluster, Follower, TxnStamp};
use crate::kafka::upstream_record;
use crate::provenance::{H_OFFSET, Provenance};

/// What the next produce does instead of succeeding.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Fails and stores nothing.
    Refuse,
    /// Fails, but its records were stored and show after the delay.
    LostAck(Duration),
}

/// A fake upstream cluster; clones share it.
#[derive(Debug, Clone)]
pub struct FakeCluster {
    inner: Arc<Mutex<Inner>>,
    batch_limit: u64,
    /// Whether `produce` checks sequences, as mirror mode's idempotent producer has Kafka do.
    idempotent: bool,
}

#[derive(Debug, Default)]
struct Inner {
    topics: BTreeMap<String, u32>,
    partitions: BTreeMap<(String, u32), Partition>,
    faults: VecDeque<Fault>,
    down: bool,
    produces: usize,
}

#[derive(Debug, Default)]
struct Partition {
    start: i64,
    records: Vec<Stored>,
    /// The idempotent producer's state here, as the leader keeps it.
    sequences: Sequences,
}

/// How many of a producer's last batches a Kafka leader remembers to recognise a resent one.
const REMEMBERED_BATCHES: usize = 5;

/// The idempotent producer's state on one partition; empty while the producer has none there
/// (a new partition, or after a new identity).
#[derive(Debug, Default)]
struct Sequences {
    /// The sequence (edge offset) the next batch must start at.
    next: Option<u64>,
    /// The first and last sequence of the last [`REMEMBERED_BATCHES`] batches.
    recent: VecDeque<(u64, u64)>,
}

/// What a leader does with an idempotent batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Append {
    Store,
    /// One of the last batches sent again: acknowledged, nothing stored.
    Duplicate,
    /// A gap or an older batch: OUT_OF_ORDER_SEQUENCE_NUMBER, nothing stored.
    OutOfOrder,
}

impl Sequences {
    fn check(&self, first: u64, last: u64) -> Append {
        if self.recent.contains(&(first, last)) {
            return Append::Duplicate;
        }
        match self.next {
            Some(next) if next != first => Append::OutOfOrder,
            _ => Append::Store,
        }
    }

    fn stored(&mut self, first: u64, last: u64) {
        self.next = Some(last + 1);
        self.recent.push_back((first, last));
        if self.recent.len() > REMEMBERED_BATCHES {
            self.recent.pop_front();
        }
    }
}

#[derive(Debug)]
struct Stored {
    visible_at: Instant,
    headers: BTreeMap<String, Vec<u8>>,
}

impl Partition {
    /// The high watermark: the stored records that show, a prefix.
    fn end(&self, now: Instant) -> i64 {
        let shown = self.records.iter().take_while(|r| r.visible_at <= now);
        i64::try_from(shown.count()).unwrap_or(i64::MAX)
    }
}

impl FakeCluster {
    /// An empty cluster whose produce requests carry at most `batch_limit` bytes.
    pub fn new(batch_limit: u64) -> Self {
        Self {
            inner: Arc::default(),
            batch_limit,
            idempotent: true,
        }
    }

    /// The same cluster produced to without idempotence: a batch sent again is stored again.
    pub fn without_idempotence(self) -> Self {
        Self {
            idempotent: false,
            ..self
        }
    }

    /// Queues faults for the next produce calls, one each.
    pub fn fail_produces(&self, faults: impl IntoIterator<Item = Fault>) {
        self.lock().faults.extend(faults);
    }

    /// Makes every call fail (or work again).
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Retention removes every record before `start`, which Kafka allows up to the end offset.
    pub fn trim(&self, topic: &str, partition: u32, start: i64) {
        let mut inner = self.lock();
        let part = inner
            .partitions
            .entry((topic.to_owned(), partition))
            .or_default();
        let end = part.end(Instant::now());
        assert!(
            start <= end,
            "Kafka refuses to delete records past the end offset ({start} > {end})"
        );
        part.start = part.start.max(start);
    }

    /// How many produce calls arrived, failed ones included.
    pub fn produces(&self) -> usize {
        self.lock().produces
    }

    /// The `tern-offset` of every record of a partition that shows, in order.
    pub fn edge_offsets(&self, topic: &str, partition: u32) -> Vec<u64> {
        self.headers(topic, partition)
            .iter()
            .filter_map(|h| h.get(H_OFFSET))
            .filter_map(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .collect()
    }

    /// The headers of every record of a partition that shows, in order.
    pub fn headers(&self, topic: &str, partition: u32) -> Vec<BTreeMap<String, Vec<u8>>> {
        let inner = self.lock();
        let Some(part) = inner.partitions.get(&(topic.to_owned(), partition)) else {
            return Vec::new();
        };
        let now = Instant::now();
        part.records
            .iter()
            .take_while(|r| r.visible_at <= now)
            .map(|r| r.headers.clone())
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_up(&self, op: &'static str, topic: &str) -> Result<(), UpstreamError> {
        if self.lock().down {
            return Err(fake_error(op, topic, "broker unreachable"));
        }
        Ok(())
    }
}

fn fake_error(op: &'static str, topic: &str, message: &str) -> UpstreamError {
    UpstreamError::Kafka {
        op,
        topic: topic.to_owned(),
        message: message.to_owned(),
    }
}

impl Cluster for FakeCluster {
    type Partition = FakeFollower;

    fn batch_limit(&self) -> u64 {
        self.batch_limit
    }

    async fn ensure_topic(
        &self,
        topic: &str,
        partitions: u32,
        _replication: u16,
    ) -> Result<(), UpstreamError> {
        self.check_up("create topic", topic)?;
        self.lock()
            .topics
            .entry(topic.to_owned())
            .or_insert(partitions);
        Ok(())
    }

    async fn partition_count(&self, topic: &str) -> Result<u32, UpstreamError> {
        self.check_up("list topics", topic)?;
        Ok(self.lock().topics.get(topic).copied().unwrap_or(0))
    }

    async fn partition(&self, topic: &str, partition: u32) -> Result<FakeFollower, UpstreamError> {
        let op = "find partition leader";
        self.check_up(op, topic)?;
        let count = self.lock().topics.get(topic).copied().unwrap_or(0);
        if partition >= count {
            return Err(fake_error(op, topic, "unknown topic or partition"));
        }
        Ok(FakeFollower {
            cluster: self.clone(),
            topic: topic.to_owned(),
            partition,
        })
    }
}

/// One partition of a [`FakeCluster`].
#[derive(Debug)]
pub struct FakeFollower {
    cluster: FakeCluster,
    topic: String,
    partition: u32,
}

impl FakeFollower {
    fn with<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Partition) -> T,
    ) -> Result<T, UpstreamError> {
        self.cluster.check_up(op, &self.topic)?;
        let mut inner = self.cluster.lock();
        let key = (self.topic.clone(), self.partition);
        Ok(f(inner.partitions.entry(key).or_default()))
    }
}

impl Follower for FakeFollower {
    fn topic(&self) -> &str {
        &self.topic
    }

    async fn end_offset(&self) -> Result<i64, UpstreamError> {
        let now = Instant::now();
        self.with("list offsets", |p| p.end(now))
    }

    async fn start_offset(&self) -> Result<i64, UpstreamError> {
        let now = Instant::now();
        self.with("list offsets", |p| p.start.min(p.end(now)))
    }

    async fn headers_at(&self, offset: i64) -> Result<BTreeMap<String, Vec<u8>>, UpstreamError> {
        let now = Instant::now();
        let found = self.with("fetch last record", |p| {
            let index = usize::try_from(offset).ok()?;
            let shown = offset >= p.start && offset < p.end(now);
            shown.then(|| p.records.get(index).map(|r| r.headers.clone()))?
        })?;
        found.ok_or_else(|| fake_error("fetch last record", &self.topic, "no record there"))
    }

    async fn produce(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        _codec: Codec,
        format: ValueFormat,
    ) -> Result<(), UpstreamError> {
        let sequenced = match self.cluster.idempotent {
            true => Sequenced::Idempotent,
            false => Sequenced::Unchecked,
        };
        self.store(records, source, format, sequenced)
    }

    async fn produce_in_txn(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        (_codec, format): (Codec, ValueFormat),
        _txn: &TxnStamp<'_>,
    ) -> Result<(), UpstreamError> {
        self.store(records, source, format, Sequenced::Unchecked)
    }

    /// A new producer identity: no partition expects a sequence any more.
    async fn restart_sequence(&self) {
        for part in self.cluster.lock().partitions.values_mut() {
            part.sequences = Sequences::default();
        }
    }
}

/// Whose sequences a produced batch carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sequenced {
    /// Mirror mode's idempotent producer: edge offsets, which must follow on.
    Idempotent,
    /// A transaction's own, or none (not checked here).
    Unchecked,
}

impl FakeFollower {
    /// Stores `records` unless a fault refuses them or, for the idempotent producer, the leader
    /// would: a batch that does not follow on is refused (OUT_OF_ORDER_SEQUENCE_NUMBER), one of
    /// its last batches sent again is acknowledged without being stored.
    fn store(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        format: ValueFormat,
        sequenced: Sequenced,
    ) -> Result<(), UpstreamError> {
        let (Some(first), Some(last)) = (records.first(), records.last()) else {
            return Ok(());
        };
        let (first, last) = (first.offset, last.offset);
        let fault = {
            let mut inner = self.cluster.lock();
            inner.produces += 1;
            inner.faults.pop_front()
        };
        let visible_at = match fault {
            Some(Fault::Refuse) => return Err(fake_error("produce", &self.topic, "refused")),
            Some(Fault::LostAck(delay)) => Instant::now() + delay,
            None => Instant::now(),
        };
        let idempotent = sequenced == Sequenced::Idempotent;
        let append = self.with("produce", |p| {
            let append = match idempotent {
                true => p.sequences.check(first, last),
                false => Append::Store,
            };
            if append != Append::Store {
                return append;
            }
            for record in records {
                let headers = upstream_record(record, source, format).headers;
                p.records.push(Stored {
                    visible_at,
                    headers,
                });
            }
            if idempotent {
                p.sequences.stored(first, last);
            }
            append
        })?;
        match (append, fault) {
            (Append::OutOfOrder, _) => {
                Err(fake_error("produce", &self.topic, "out of order sequence"))
            }
            (_, Some(_)) => Err(fake_error("produce", &self.topic, "acknowledgement lost")),
            (_, None) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FakeCluster;

    /// Kafka's DeleteRecords refuses an offset past the high watermark (OFFSET_OUT_OF_RANGE).
    #[tokio::test]
    #[should_panic(expected = "past the end offset")]
    async fn retention_never_passes_the_end() {
        FakeCluster::new(1024).trim("up", 0, 1);
    }
}
