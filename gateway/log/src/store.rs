//! The [`Log`] handle: opens the log directory (topics, partitions, cursors), starts one writer
//! task per partition, routes appends and reads to partitions, and closes everything in order.
//!
//! It holds no format knowledge of its own; it only wires the pieces together.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::batch::{BatchSpan, Codec, ProducerStamp, StampedBatch};
use super::cache::FileCache;
use super::clock::{Clock, ClockStatus, SystemClock, Timekeeper};
use super::config::LogConfig;
use super::cursors::CursorStore;
use super::error::{LogError, Result};
use super::fs::{Fs, RealFs};
use super::partition::{Partition, Shared};
use super::stats::{Counters, LogStats, PartitionStats};
use super::topic_config::{self, TopicConfig};
use super::writer::{self, AppendRequest};
use super::{
    Record, RecordView, StoredRecord, TopicInfo, check_topic_name, datadir, meta, recovery,
};

mod admin;

pub use admin::MAX_PARTITIONS;

/// Appends waiting for a partition's writer before `append` itself waits.
const QUEUE_DEPTH: usize = 1024;

#[derive(Debug)]
struct PartitionEntry {
    part: Arc<Partition>,
    tx: Mutex<Option<mpsc::Sender<AppendRequest>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct TopicEntry {
    info: TopicInfo,
    /// The settings given at creation (`topic.config`).
    config: Arc<TopicConfig>,
    partitions: Vec<Arc<PartitionEntry>>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    dir: PathBuf,
    runtime: tokio::runtime::Handle,
    topics: RwLock<BTreeMap<String, Arc<TopicEntry>>>,
    closed: AtomicBool,
}

/// The segmented log. Cheap to clone (Arc inside); Send + Sync + 'static.
#[derive(Debug, Clone)]
pub struct Log {
    inner: Arc<Inner>,
}

/// Compile-time proof of the contract's "Send + Sync + 'static".
const _: fn() = || {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<Log>();
    shareable::<CursorStore>();
};

fn open_topic(
    shared: &Arc<Shared>,
    dir: &Path,
    info: TopicInfo,
    runtime: &tokio::runtime::Handle,
) -> Result<TopicEntry> {
    let partitions = open_partitions(shared, dir, &info, 0, runtime)?;
    let config = topic_config::read(&*shared.fs, &meta::topics_dir(dir).join(&info.name));
    Ok(TopicEntry {
        info,
        config: Arc::new(config),
        partitions,
    })
}

/// Recovers partitions `from..info.partitions` of a topic and starts their writers.
fn open_partitions(
    shared: &Arc<Shared>,
    dir: &Path,
    info: &TopicInfo,
    from: u32,
    runtime: &tokio::runtime::Handle,
) -> Result<Vec<Arc<PartitionEntry>>> {
    let mut settings = shared.config.topic_settings(&info.name);
    settings.partitions = info.partitions;
    let mut partitions = Vec::new();
    for id in from..info.partitions {
        let pdir = meta::partition_dir(dir, &info.name, id);
        let part =
            recovery::open_partition(&info.name, id, pdir, settings.clone(), Arc::clone(shared))?;
        part.retention.set(
            &shared
                .live
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .topic_settings(&info.name),
        );
        let part = Arc::new(part);
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let task = runtime.spawn(writer::run(Arc::clone(&part), rx));
        partitions.push(Arc::new(PartitionEntry {
            part,
            tx: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
        }));
    }
    Ok(partitions)
}

fn open_blocking(
    fs: Arc<dyn Fs>,
    clock: Arc<dyn Clock>,
    dir: PathBuf,
    config: LogConfig,
    runtime: tokio::runtime::Handle,
) -> Result<Inner> {
    // Versions first, before anything is written: a newer tern's directory is left untouched.
    let marked = datadir::check_format_with(&*fs, &dir)?;
    let had_files = fs.list_dir(&dir).is_ok_and(|names| !names.is_empty());
    fs.create_dir_all(&meta::topics_dir(&dir))
        .map_err(|e| LogError::io("create directory", &dir, e))?;
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    for synced in [dir.as_path(), parent.unwrap_or(Path::new("."))] {
        fs.sync_dir(synced)
            .map_err(|e| LogError::io("fsync directory", synced, e))?;
    }
    datadir::ensure_marker(&*fs, &dir, marked, had_files)?;
    let counters = Arc::new(Counters::default());
    let cursors = CursorStore::open(Arc::clone(&fs), &dir, Arc::clone(&counters))?;
    let time = Timekeeper::open(Arc::clone(&fs), &dir, clock)?;
    let shared = Arc::new(Shared {
        wear: crate::wear::WearController::new(&config.flush),
        time,
        cache: FileCache::new(
            Arc::clone(&fs),
            config.max_open_files,
            config.max_mapped_bytes.0,
        ),
        fs: Arc::clone(&fs),
        live: std::sync::RwLock::new(config.clone()),
        config,
        counters,
        cursors,
    });
    let mut topics = BTreeMap::new();
    for info in meta::list(&*fs, &dir)? {
        let name = info.name.clone();
        topics.insert(name, Arc::new(open_topic(&shared, &dir, info, &runtime)?));
    }
    Ok(Inner {
        shared,
        dir,
        runtime,
        topics: RwLock::new(topics),
        closed: AtomicBool::new(false),
    })
}

impl Log {
    /// Opens (creating if missing) the log under `dir` (normally `<data_dir>/log`), recovering
    /// every partition. Uses the real file system.
    pub async fn open(dir: &Path, config: &LogConfig) -> Result<Log> {
        Self::open_with_fs(Arc::new(RealFs), dir, config).await
    }

    /// Same with an explicit file system (fault injection in tests).
    pub async fn open_with_fs(fs: Arc<dyn Fs>, dir: &Path, config: &LogConfig) -> Result<Log> {
        Self::open_with_clock(fs, Arc::new(SystemClock::default()), dir, config).await
    }

    /// Same with an explicit clock too (clock steps in tests).
    pub async fn open_with_clock(
        fs: Arc<dyn Fs>,
        clock: Arc<dyn Clock>,
        dir: &Path,
        config: &LogConfig,
    ) -> Result<Log> {
        let runtime = tokio::runtime::Handle::current();
        let (dir, config) = (dir.to_owned(), config.clone());
        let inner =
            tokio::task::spawn_blocking(move || open_blocking(fs, clock, dir, config, runtime))
                .await
                .map_err(|_| LogError::Closed)??;
        Ok(Log {
            inner: Arc::new(inner),
        })
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(LogError::Closed);
        }
        Ok(())
    }

    fn topic(&self, topic: &str) -> Result<Arc<TopicEntry>> {
        let topics = self
            .inner
            .topics
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        topics
            .get(topic)
            .cloned()
            .ok_or_else(|| LogError::UnknownTopic {
                topic: topic.to_owned(),
            })
    }

    fn partition(&self, topic: &str, partition: u32) -> Result<Arc<Partition>> {
        let entry = self.topic(topic)?;
        let found = entry.partitions.get(partition as usize);
        found
            .map(|p| Arc::clone(&p.part))
            .ok_or_else(|| LogError::UnknownPartition {
                topic: topic.to_owned(),
                partition,
            })
    }

    /// Creates the topic with its configured (or default) partition count if missing. Creating
    /// does blocking file I/O (a few fsyncs); finding an existing topic does none.
    pub fn ensure_topic(&self, topic: &str) -> Result<TopicInfo> {
        self.check_open()?;
        check_topic_name(topic)?;
        if let Ok(entry) = self.topic(topic) {
            return Ok(entry.info.clone());
        }
        let mut topics = self
            .inner
            .topics
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = topics.get(topic) {
            return Ok(entry.info.clone());
        }
        let shared = &self.inner.shared;
        let partitions = shared.config.topic_settings(topic).partitions;
        meta::create(
            &*shared.fs,
            &self.inner.dir,
            topic,
            partitions,
            &TopicConfig::new(),
        )?;
        let info = TopicInfo {
            name: topic.to_owned(),
            partitions,
        };
        let entry = open_topic(shared, &self.inner.dir, info.clone(), &self.inner.runtime)?;
        topics.insert(topic.to_owned(), Arc::new(entry));
        Ok(info)
    }

    pub fn topics(&self) -> Vec<TopicInfo> {
        let topics = self
            .inner
            .topics
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        topics.values().map(|t| t.info.clone()).collect()
    }

    /// Appends records; resolves with the base offset once durable under the topic's policy
    /// (sync: after the group-committed fdatasync). Err(Full) under on_full = reject.
    pub async fn append(&self, topic: &str, partition: u32, records: Vec<Record>) -> Result<u64> {
        let answer = self.enqueue(topic, partition, records).await?;
        answer.await.map_err(|_| LogError::Closed)?
    }

    /// Queues records on the partition's writer and returns the receiver of `append`'s answer.
    /// The writer takes appends in queueing order, so a caller that awaits one `enqueue` before
    /// starting the next keeps its appends in order while several are in flight.
    pub async fn enqueue(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<oneshot::Receiver<Result<u64>>> {
        self.enqueue_with(topic, partition, records, Codec::None)
            .await
    }

    /// [`Log::enqueue`] of records that arrived compressed with `codec`: they are stored
    /// uncompressed in batches of their own codec, whose attributes name it
    /// ([`Log::read_batched`] tells readers).
    pub async fn enqueue_with(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
    ) -> Result<oneshot::Receiver<Result<u64>>> {
        self.enqueue_stamped(topic, partition, records, codec, None)
            .await
    }

    /// [`Log::enqueue_with`] of an idempotent producer's batch: its records are stored as one
    /// batch of their own, whose producer section keeps `producer`
    /// ([`Log::producer_stamps`] finds it again after a restart).
    pub async fn enqueue_stamped(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
        producer: Option<ProducerStamp>,
    ) -> Result<oneshot::Receiver<Result<u64>>> {
        self.check_open()?;
        let entry = self.topic(topic)?;
        let part =
            entry
                .partitions
                .get(partition as usize)
                .ok_or_else(|| LogError::UnknownPartition {
                    topic: topic.to_owned(),
                    partition,
                })?;
        let tx = part
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let tx = tx.ok_or(LogError::Closed)?;
        let (reply, answer) = oneshot::channel();
        tx.send(AppendRequest::new(records, codec, producer, reply))
            .await
            .map_err(|_| LogError::Closed)?;
        Ok(answer)
    }

    /// Records with offset >= from, up to about max_bytes (at least one if any exist).
    /// Only durable (committed) records are visible. Empty vec at the end.
    pub fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>> {
        self.partition(topic, partition)?.read(from, max_bytes)
    }

    /// Visits the records with offset >= `from`, up to about `max_bytes` (at least one if any
    /// exist), borrowed from their segment, each with the batch it is stored in; returns how
    /// many it visited.
    pub fn read_batched(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
        visit: &mut dyn FnMut(u64, &RecordView<'_>, BatchSpan),
    ) -> Result<usize> {
        self.partition(topic, partition)?
            .read_batched(from, max_bytes, visit)
    }

    /// The producer stamps of the durable batches in the partition's last
    /// [`PRODUCER_SEGMENTS`](crate::partition::PRODUCER_SEGMENTS) segments, in log order: what
    /// the table of idempotent producers is rebuilt from after a restart.
    pub fn producer_stamps(&self, topic: &str, partition: u32) -> Result<Vec<StampedBatch>> {
        self.partition(topic, partition)?.producer_stamps()
    }

    /// (start offset, end offset = next offset to be written).
    pub fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64)> {
        Ok(self.partition(topic, partition)?.offsets())
    }

    /// The first offset whose timestamp >= ts_ms, None if past the end.
    pub fn offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        ts_ms: i64,
    ) -> Result<Option<u64>> {
        self.partition(topic, partition)?
            .offset_for_timestamp(ts_ms)
    }

    /// Watch of the partition's durable end offset; changes after every commit.
    pub fn subscribe(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>> {
        Ok(self.partition(topic, partition)?.subscribe())
    }

    /// The durable cursor store (forwarders, MQTT sessions, consumer groups).
    pub fn cursors(&self) -> CursorStore {
        self.inner.shared.cursors.clone()
    }

    /// What the log knows of the wall clock: not synchronised, steps seen, elapsed running
    /// time (for the readiness report and `/metrics`).
    pub fn clock_status(&self) -> ClockStatus {
        self.inner.shared.time.status()
    }

    /// What the wear budget's commit controller measured and chose.
    pub fn wear_status(&self) -> crate::WearStatus {
        self.inner.shared.wear.status()
    }

    /// Counters of the log's I/O since it was opened.
    pub fn stats(&self) -> LogStats {
        let shared = &self.inner.shared;
        LogStats {
            mapped_bytes: shared.cache.mapped_bytes(),
            ..shared.counters.snapshot()
        }
    }

    /// Offsets and sizes of every partition.
    pub fn partition_stats(&self) -> Vec<PartitionStats> {
        self.all_partitions().iter().map(|p| p.stats()).collect()
    }

    /// Every partition with whether its writer task has ended (`inspect.rs`).
    pub(crate) fn partitions_with_writers(&self) -> Vec<(Arc<Partition>, bool)> {
        let topics = self
            .inner
            .topics
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let closed = self.inner.closed.load(Ordering::Acquire);
        let ended = |p: &PartitionEntry| {
            closed
                || p.task
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .is_none_or(JoinHandle::is_finished)
        };
        topics
            .values()
            .flat_map(|t| t.partitions.iter().map(|p| (Arc::clone(&p.part), ended(p))))
            .collect()
    }

    /// Every partition of every topic, taken under one read lock.
    fn all_partitions(&self) -> Vec<Arc<Partition>> {
        let topics = self
            .inner
            .topics
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        topics
            .values()
            .flat_map(|t| t.partitions.iter().map(|p| Arc::clone(&p.part)))
            .collect()
    }

    /// Takes the retention limits (`[log.retention]` and per-topic overrides) of `config` for
    /// every partition and for topics created from now on, without stopping a writer (SIGHUP).
    /// Each writer's next retention check applies them ([`Log::enforce_retention`] applies them
    /// now); the other settings of `config` are ignored.
    pub fn set_retention(&self, config: &LogConfig) {
        *self
            .inner
            .shared
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner) = config.clone();
        for part in self.all_partitions() {
            part.retention.set(&config.topic_settings(&part.topic));
        }
    }

    /// Runs retention on every partition now (normally done after rolls and every 30 s).
    pub async fn enforce_retention(&self) {
        let parts = self.all_partitions();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(part) = parts.first() {
                part.shared.time.observe();
            }
            for part in parts {
                part.enforce_retention(0);
            }
        })
        .await;
    }

    /// Lets every writer finish its queued appends and syncs; later calls return Err(Closed).
    pub async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Err(LogError::Closed);
        }
        let entries: Vec<Arc<TopicEntry>> = {
            let topics = self
                .inner
                .topics
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            topics.values().cloned().collect()
        };
        for topic in &entries {
            for p in &topic.partitions {
                p.tx.lock().unwrap_or_else(PoisonError::into_inner).take();
            }
        }
        for topic in &entries {
            for p in &topic.partitions {
                let task = p.task.lock().unwrap_or_else(PoisonError::into_inner).take();
                if let Some(task) = task {
                    let _ = task.await;
                }
            }
        }
        let shared = Arc::clone(&self.inner.shared);
        let _ = tokio::task::spawn_blocking(move || shared.time.save()).await;
        Ok(())
    }
}
