//! The seam between forwarding and the edge log: the few operations a forwarder needs (list
//! topics, read durable records, offsets, wait for new ones, commit its cursor), as a trait so the
//! forwarder is written once against the log's public API. The real implementation for
//! `tern_log::Log` sits at the end of this file. A forwarder never appends to the edge log.

use std::future::Future;

use tokio::sync::watch;

/// An error of the edge log, passed through unchanged.
pub type EdgeLogError = Box<dyn std::error::Error + Send + Sync>;

/// One durable edge record, as the forwarder reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeRecord {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl EdgeRecord {
    /// Uncompressed size for batching: key, value and headers.
    pub fn size(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.key.as_ref().map_or(0, Vec::len) + self.value.len() + headers
    }
}

/// What forwarding needs from the edge log (`tern_log::Log` in the gateway).
pub trait EdgeLog: Clone + Send + Sync + 'static {
    /// Every edge topic with its partition count.
    fn topics(&self) -> Vec<(String, u32)>;
    /// Durable records with offset >= `from`, up to about `max_bytes` (at least one if any).
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<EdgeRecord>, EdgeLogError>;
    /// (start offset, end offset = next offset to be written).
    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), EdgeLogError>;
    /// Watch of the durable end offset.
    fn subscribe(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, EdgeLogError>;
    /// The cursor `name` has consumed everything before `offset`.
    fn cursor(&self, name: &str, topic: &str, partition: u32) -> Option<u64>;
    /// Durably moves cursor `name` to `offset` (next to read).
    fn commit_cursor(
        &self,
        name: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> impl Future<Output = Result<(), EdgeLogError>> + Send;
}

/// The gateway's log as the forwarder's edge.
impl EdgeLog for tern_log::Log {
    fn topics(&self) -> Vec<(String, u32)> {
        tern_log::Log::topics(self)
            .into_iter()
            .map(|t| (t.name, t.partitions))
            .collect()
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<EdgeRecord>, EdgeLogError> {
        let stored = tern_log::Log::read(self, topic, partition, from, max_bytes)?;
        Ok(stored
            .into_iter()
            .map(|s| EdgeRecord {
                offset: s.offset,
                timestamp_ms: s.record.timestamp_ms,
                key: s.record.key,
                value: s.record.value,
                headers: s.record.headers,
            })
            .collect())
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), EdgeLogError> {
        Ok(tern_log::Log::offsets(self, topic, partition)?)
    }

    fn subscribe(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, EdgeLogError> {
        Ok(tern_log::Log::subscribe(self, topic, partition)?)
    }

    fn cursor(&self, name: &str, topic: &str, partition: u32) -> Option<u64> {
        self.cursors().get(name, topic, partition)
    }

    fn commit_cursor(
        &self,
        name: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> impl Future<Output = Result<(), EdgeLogError>> + Send {
        let cursors = self.cursors();
        let (name, topic) = (name.to_owned(), topic.to_owned());
        async move { Ok(cursors.commit(&name, &topic, partition, offset).await?) }
    }
}
