//! An in-memory [`Store`] for unit tests of the MQTT server's logic. Appends are "durable" at
//! once; `set_full` makes appends fail like a full log, and `hold_answers` delays the answers
//! of queued appends (records still land in queueing order) so tests can keep several appends
//! in flight. Never used by the binary or e2e tests.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::store::{Queued, Record, Store, StoreError, StoredRecord};

#[derive(Debug, Default)]
struct Inner {
    partitions: HashMap<(String, u32), Partition>,
    cursors: HashMap<(String, String, u32), u64>,
    /// Delays of the next queued appends' answers, in queueing order.
    holds: VecDeque<Duration>,
}

#[derive(Debug)]
struct Partition {
    records: Vec<StoredRecord>,
    end: watch::Sender<u64>,
}

/// A shared in-memory log with `partitions` partitions per topic.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    full: Arc<AtomicBool>,
    /// Queued appends not answered yet, and the most there ever were.
    unanswered: Arc<AtomicUsize>,
    most_unanswered: Arc<AtomicUsize>,
    partitions: u32,
}

impl MemoryStore {
    pub fn new(partitions: u32) -> Self {
        Self {
            inner: Arc::default(),
            full: Arc::default(),
            unanswered: Arc::default(),
            most_unanswered: Arc::default(),
            partitions,
        }
    }

    /// Makes every later append fail with [`StoreError::Full`] (or succeed again).
    pub fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// Delays the answers of the next queued appends by `delays`, one each, in queueing order.
    pub fn hold_answers(&self, delays: impl IntoIterator<Item = Duration>) {
        self.lock().holds.extend(delays);
    }

    /// The most queued appends that were waiting for their answer at once.
    pub fn most_unanswered(&self) -> usize {
        self.most_unanswered.load(Ordering::SeqCst)
    }

    /// Every record of `topic`, all partitions, in partition then offset order.
    pub fn all(&self, topic: &str) -> Vec<Record> {
        let inner = self.lock();
        (0..self.partitions)
            .filter_map(|p| inner.partitions.get(&(topic.to_owned(), p)))
            .flat_map(|p| p.records.iter().map(|r| r.record.clone()))
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_partition<T>(
        &self,
        topic: &str,
        partition: u32,
        f: impl FnOnce(&mut Partition) -> T,
    ) -> T {
        let mut inner = self.lock();
        let entry = inner
            .partitions
            .entry((topic.to_owned(), partition))
            .or_insert_with(|| Partition {
                records: Vec::new(),
                end: watch::channel(0).0,
            });
        f(entry)
    }
}

impl Store for MemoryStore {
    fn ensure_topic(&self, _topic: &str) -> Result<u32, StoreError> {
        Ok(self.partitions)
    }

    fn partition_for_key(&self, key: &[u8], partitions: u32) -> u32 {
        let hash = key.iter().fold(2_166_136_261u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(16_777_619)
        });
        hash % partitions.max(1)
    }

    async fn append(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<u64, StoreError> {
        if self.full.load(Ordering::SeqCst) {
            return Err(StoreError::Full {
                topic: topic.to_owned(),
                partition,
            });
        }
        Ok(self.with_partition(topic, partition, |p| {
            let base = p.records.len() as u64;
            for (i, record) in records.into_iter().enumerate() {
                p.records.push(StoredRecord {
                    offset: base + i as u64,
                    record,
                });
            }
            p.end.send_replace(p.records.len() as u64);
            base
        }))
    }

    async fn enqueue(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<Queued, StoreError> {
        let base = self.append(topic, partition, records).await?;
        let hold = self.lock().holds.pop_front().unwrap_or_default();
        let now = self.unanswered.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_unanswered.fetch_max(now, Ordering::SeqCst);
        let unanswered = Arc::clone(&self.unanswered);
        Ok(Box::pin(async move {
            tokio::time::sleep(hold).await;
            unanswered.fetch_sub(1, Ordering::SeqCst);
            Ok(base)
        }))
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, StoreError> {
        Ok(self.with_partition(topic, partition, |p| {
            let mut size = 0;
            p.records
                .iter()
                .skip(usize::try_from(from).unwrap_or(usize::MAX))
                .take_while(|r| {
                    let first = size == 0;
                    size += r.record.value.len() + 1;
                    first || size <= max_bytes
                })
                .cloned()
                .collect()
        }))
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), StoreError> {
        Ok(self.with_partition(topic, partition, |p| (0, p.records.len() as u64)))
    }

    fn watch(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, StoreError> {
        Ok(self.with_partition(topic, partition, |p| p.end.subscribe()))
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
    ) -> Result<(), StoreError> {
        let key = (name.to_owned(), topic.to_owned(), partition);
        self.lock().cursors.insert(key, offset);
        Ok(())
    }

    fn cursor_names(&self) -> Vec<String> {
        let names: std::collections::BTreeSet<String> =
            self.lock().cursors.keys().map(|k| k.0.clone()).collect();
        names.into_iter().collect()
    }

    async fn remove_cursors(&self, name: &str) -> Result<(), StoreError> {
        self.lock().cursors.retain(|(n, _, _), _| n != name);
        Ok(())
    }
}
