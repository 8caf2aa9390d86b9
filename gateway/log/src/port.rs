//! The one port through which the other layers use the log: create topics, queue appends that
//! resolve once durable, read durable records from an offset or a time, watch a partition's durable end,
//! and keep named durable cursors. The MQTT server and the upstream forwarder are written
//! against [`LogPort`]; the gateway passes them a [`Log`], unit tests the in-memory
//! [`MemoryLog`](crate::memory::MemoryLog), which keeps the same promise: nothing is visible
//! before its append has resolved as durable.
//!
//! It never adds behaviour of its own: each method is the [`Log`] method of the same name.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

use std::sync::Arc;

use crate::{
    BatchSpan, Codec, Log, LogError, ProducerStamp, Record, RecordView, StampedBatch, StoredRecord,
    TopicConfig, TopicInfo, TopicSettings,
};

/// A queued append: resolves with its base offset once durable.
pub type Queued = Pin<Box<dyn Future<Output = Result<u64, LogError>> + Send>>;

/// What a reader at some offset has still to read in a partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lag {
    /// Records from the offset to the durable end.
    pub records: u64,
    /// Their bytes as stored (exact at segment boundaries, interpolated by offset inside the
    /// segment holding the offset); `None` where the port cannot tell without reading them.
    pub bytes: Option<u64>,
    /// The timestamp (ms since the epoch) of the record at the offset, if there is one.
    pub oldest_ms: Option<i64>,
}

/// What the MQTT server and the forwarder may do with the log.
pub trait LogPort: Clone + Send + Sync + 'static {
    /// Every topic with its partition count.
    fn topics(&self) -> Vec<TopicInfo>;
    /// Creates `topic` if missing; returns its partition count.
    fn ensure_topic(&self, topic: &str) -> Result<u32, LogError>;
    /// Creates `topic` with `partitions` partitions; [`LogError::TopicExists`] if it exists.
    fn create_topic(&self, topic: &str, partitions: u32) -> Result<u32, LogError>;
    /// [`LogPort::create_topic`] keeping `config` as the topic's own settings. A port that
    /// keeps none refuses any.
    fn create_topic_with(
        &self,
        topic: &str,
        partitions: u32,
        config: &TopicConfig,
    ) -> Result<u32, LogError> {
        if config.is_empty() {
            return self.create_topic(topic, partitions);
        }
        Err(LogError::InvalidTopicConfig {
            topic: topic.to_owned(),
            reason: "this log keeps no topic settings".to_owned(),
        })
    }
    /// The settings `topic` was created with (empty for none).
    fn topic_config(&self, topic: &str) -> Result<Arc<TopicConfig>, LogError> {
        let _ = topic;
        Ok(Arc::default())
    }
    /// Grows `topic` to `total` partitions (more than it has).
    fn add_partitions(&self, topic: &str, total: u32) -> Result<u32, LogError>;
    /// Deletes `topic` and its records; [`LogError::TopicInUse`] for internal topics and
    /// while a cursor holds a position on it.
    fn delete_topic(&self, topic: &str) -> impl Future<Output = Result<(), LogError>> + Send;
    /// The settings in effect for `topic` (partitions, durability, retention).
    fn topic_settings(&self, topic: &str) -> Result<TopicSettings, LogError>;
    /// The partition count [`LogPort::ensure_topic`] would give `topic` now.
    fn default_partitions(&self, topic: &str) -> u32;
    /// Appends and resolves with the base offset once durable.
    fn append(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> impl Future<Output = Result<u64, LogError>> + Send;
    /// Queues an append behind every earlier queued append to the partition and returns its
    /// answer; awaiting one `enqueue` before the next keeps appends in order while several are
    /// in flight.
    fn enqueue(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> impl Future<Output = Result<Queued, LogError>> + Send;
    /// [`LogPort::enqueue`] of records that arrived compressed with `codec` (a Kafka
    /// producer's): the port may keep the codec with them for [`LogPort::read_batched`]. One
    /// that keeps none queues them as any others.
    fn enqueue_with(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
    ) -> impl Future<Output = Result<Queued, LogError>> + Send {
        let _ = codec;
        self.enqueue(topic, partition, records)
    }
    /// [`LogPort::enqueue_with`] of an idempotent producer's batch: stored as a batch of its
    /// own stamped with `producer`, which [`LogPort::producer_stamps`] finds again after a
    /// restart. A port that keeps no stamps queues it as any other.
    fn enqueue_stamped(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
        producer: ProducerStamp,
    ) -> impl Future<Output = Result<Queued, LogError>> + Send {
        let _ = producer;
        self.enqueue_with(topic, partition, records, codec)
    }
    /// The stamps of the durable batches [`LogPort::enqueue_stamped`] stored at the end of the
    /// partition (the log: in its last two segments), in log order.
    fn producer_stamps(&self, topic: &str, partition: u32) -> Result<Vec<StampedBatch>, LogError> {
        let _ = (topic, partition);
        Ok(Vec::new())
    }
    /// Durable records from `from`, about `max_bytes` worth (at least one if any); empty at
    /// the end.
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, LogError>;
    /// [`LogPort::read`]'s records, each seen by `visit` with its offset and borrowed where
    /// the port can (from the segment, without copies); returns how many it saw.
    fn read_each(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
        visit: &mut dyn FnMut(u64, &RecordView<'_>),
    ) -> Result<usize, LogError> {
        self.read_batched(
            topic,
            partition,
            from,
            max_bytes,
            &mut |offset, record, _| {
                visit(offset, record);
            },
        )
    }
    /// [`LogPort::read_each`], each record seen with the batch it is stored in (its end and
    /// the codec its records arrived compressed with). A port that keeps no batches sees every
    /// record of [`LogPort::read`] in one uncompressed batch.
    fn read_batched(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
        visit: &mut dyn FnMut(u64, &RecordView<'_>, BatchSpan),
    ) -> Result<usize, LogError> {
        let span = BatchSpan {
            next_offset: u64::MAX,
            codec: Codec::None,
        };
        let records = self.read(topic, partition, from, max_bytes)?;
        for stored in &records {
            visit(stored.offset, &RecordView::of(&stored.record), span);
        }
        Ok(records.len())
    }
    /// (start offset, end offset = next offset to be written).
    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), LogError>;
    /// The first offset whose record timestamp (ms since the epoch) is at least `ts_ms`,
    /// through the time index; `None` when no record is that new yet.
    fn offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        ts_ms: i64,
    ) -> Result<Option<u64>, LogError>;
    /// What is left to read from `from` (clamped to the log start) to the durable end.
    fn lag(&self, topic: &str, partition: u32, from: u64) -> Result<Lag, LogError> {
        let (start, end) = self.offsets(topic, partition)?;
        let from = from.max(start);
        let oldest_ms = match from < end {
            true => self
                .read(topic, partition, from, 1)?
                .first()
                .map(|r| r.record.timestamp_ms),
            false => None,
        };
        Ok(Lag {
            records: end.saturating_sub(from),
            bytes: None,
            oldest_ms,
        })
    }
    /// The partition's durable end offset, changing after each commit.
    fn subscribe(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, LogError>;
    /// Cursor `name`'s next offset to read in a partition, if it has one.
    fn cursor(&self, name: &str, topic: &str, partition: u32) -> Option<u64>;
    /// Durably moves cursor `name` to `offset` (next to read).
    fn commit_cursor(
        &self,
        name: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> impl Future<Output = Result<(), LogError>> + Send;
    /// The names of every stored cursor, each once, sorted.
    fn cursor_names(&self) -> Vec<String>;
    /// Durably removes every position of cursor `name`.
    fn remove_cursors(&self, name: &str) -> impl Future<Output = Result<(), LogError>> + Send;
}

impl LogPort for Log {
    fn topics(&self) -> Vec<TopicInfo> {
        Log::topics(self)
    }

    fn ensure_topic(&self, topic: &str) -> Result<u32, LogError> {
        Ok(Log::ensure_topic(self, topic)?.partitions)
    }

    fn create_topic(&self, topic: &str, partitions: u32) -> Result<u32, LogError> {
        Ok(Log::create_topic(self, topic, partitions)?.partitions)
    }

    fn create_topic_with(
        &self,
        topic: &str,
        partitions: u32,
        config: &TopicConfig,
    ) -> Result<u32, LogError> {
        Ok(Log::create_topic_with(self, topic, partitions, config)?.partitions)
    }

    fn topic_config(&self, topic: &str) -> Result<Arc<TopicConfig>, LogError> {
        Log::topic_config(self, topic)
    }

    fn add_partitions(&self, topic: &str, total: u32) -> Result<u32, LogError> {
        Ok(Log::add_partitions(self, topic, total)?.partitions)
    }

    async fn delete_topic(&self, topic: &str) -> Result<(), LogError> {
        Log::delete_topic(self, topic).await
    }

    fn topic_settings(&self, topic: &str) -> Result<TopicSettings, LogError> {
        Log::topic_settings(self, topic)
    }

    fn default_partitions(&self, topic: &str) -> u32 {
        Log::default_partitions(self, topic)
    }

    async fn append(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<u64, LogError> {
        Log::append(self, topic, partition, records).await
    }

    async fn enqueue(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<Queued, LogError> {
        let answer = Log::enqueue(self, topic, partition, records).await?;
        Ok(queued(answer))
    }

    async fn enqueue_with(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
    ) -> Result<Queued, LogError> {
        let answer = Log::enqueue_with(self, topic, partition, records, codec).await?;
        Ok(queued(answer))
    }

    async fn enqueue_stamped(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
        codec: Codec,
        producer: ProducerStamp,
    ) -> Result<Queued, LogError> {
        let answer =
            Log::enqueue_stamped(self, topic, partition, records, codec, Some(producer)).await?;
        Ok(queued(answer))
    }

    fn producer_stamps(&self, topic: &str, partition: u32) -> Result<Vec<StampedBatch>, LogError> {
        Log::producer_stamps(self, topic, partition)
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, LogError> {
        Log::read(self, topic, partition, from, max_bytes)
    }

    fn read_batched(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
        visit: &mut dyn FnMut(u64, &RecordView<'_>, BatchSpan),
    ) -> Result<usize, LogError> {
        Log::read_batched(self, topic, partition, from, max_bytes, visit)
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), LogError> {
        Log::offsets(self, topic, partition)
    }

    fn offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        ts_ms: i64,
    ) -> Result<Option<u64>, LogError> {
        Log::offset_for_timestamp(self, topic, partition, ts_ms)
    }

    fn subscribe(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, LogError> {
        Log::subscribe(self, topic, partition)
    }

    fn lag(&self, topic: &str, partition: u32, from: u64) -> Result<Lag, LogError> {
        Log::lag(self, topic, partition, from)
    }

    fn cursor(&self, name: &str, topic: &str, partition: u32) -> Option<u64> {
        self.cursors().get(name, topic, partition)
    }

    async fn commit_cursor(
        &self,
        name: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<(), LogError> {
        self.cursors().commit(name, topic, partition, offset).await
    }

    fn cursor_names(&self) -> Vec<String> {
        let names: std::collections::BTreeSet<String> = self
            .cursors()
            .list()
            .into_iter()
            .map(|(name, ..)| name)
            .collect();
        names.into_iter().collect()
    }

    async fn remove_cursors(&self, name: &str) -> Result<(), LogError> {
        self.cursors().remove(name).await
    }
}

/// The writer's answer to one queued append as a [`Queued`]: a dropped answer is a closed log.
fn queued(answer: tokio::sync::oneshot::Receiver<Result<u64, LogError>>) -> Queued {
    Box::pin(async move { answer.await.map_err(|_| LogError::Closed)? })
}
