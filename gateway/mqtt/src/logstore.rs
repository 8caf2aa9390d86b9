//! The real [`Store`]: a thin adapter over `tern_log::Log` and its cursor store, mapping log
//! errors onto the few cases the MQTT server distinguishes. Adds no buffering and no policy of
//! its own; durability is exactly the log's.

use tokio::sync::watch;

use tern_log::{self, CursorStore, Log, LogError};

use super::store::{Queued, Record, Store, StoreError, StoredRecord};

/// The MQTT server's view of the log.
#[derive(Debug, Clone)]
pub struct LogStore {
    log: Log,
    cursors: CursorStore,
}

impl LogStore {
    pub fn new(log: Log) -> Self {
        let cursors = log.cursors();
        Self { log, cursors }
    }
}

impl From<LogError> for StoreError {
    fn from(err: LogError) -> Self {
        match err {
            LogError::Full { topic, partition } => StoreError::Full { topic, partition },
            LogError::OffsetOutOfRange {
                topic,
                partition,
                offset,
                start,
                ..
            } => StoreError::OutOfRange {
                topic,
                partition,
                offset,
                start,
            },
            LogError::Closed => StoreError::Closed,
            other => StoreError::Failed {
                op: "log",
                topic: String::new(),
                message: other.to_string(),
            },
        }
    }
}

impl Store for LogStore {
    fn ensure_topic(&self, topic: &str) -> Result<u32, StoreError> {
        Ok(self.log.ensure_topic(topic)?.partitions)
    }

    fn partition_for_key(&self, key: &[u8], partitions: u32) -> u32 {
        tern_log::partition_for_key(key, partitions)
    }

    async fn append(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<u64, StoreError> {
        Ok(self.log.append(topic, partition, records).await?)
    }

    async fn enqueue(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> Result<Queued, StoreError> {
        let answer = self.log.enqueue(topic, partition, records).await?;
        Ok(Box::pin(async move {
            Ok(answer.await.map_err(|_| StoreError::Closed)??)
        }))
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, StoreError> {
        Ok(self.log.read(topic, partition, from, max_bytes)?)
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), StoreError> {
        Ok(self.log.offsets(topic, partition)?)
    }

    fn watch(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, StoreError> {
        Ok(self.log.subscribe(topic, partition)?)
    }

    fn cursor(&self, name: &str, topic: &str, partition: u32) -> Option<u64> {
        self.cursors.get(name, topic, partition)
    }

    async fn commit_cursor(
        &self,
        name: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<(), StoreError> {
        Ok(self.cursors.commit(name, topic, partition, offset).await?)
    }

    fn cursor_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.cursors.list().into_iter().map(|c| c.0).collect();
        names.dedup();
        names
    }

    async fn remove_cursors(&self, name: &str) -> Result<(), StoreError> {
        Ok(self.cursors.remove(name).await?)
    }
}
