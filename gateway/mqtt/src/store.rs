//! The narrow view of the log that the MQTT server needs: append records durably, read them
//! back, watch a partition's durable end, and keep named durable cursors. The real
//! implementation is the adapter over `tern_log::Log` (`logstore.rs`); unit tests use the small
//! in-memory one in `memstore.rs`. Nothing in `mqtt/` touches storage except through this trait.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

pub use tern_log::{Record, StoredRecord};

/// A queued append: resolves with its base offset once durable.
pub type Queued = Pin<Box<dyn Future<Output = Result<u64, StoreError>> + Send>>;

/// Header lookup on records.
pub trait Headers {
    /// The value of the first header called `name`.
    fn header(&self, name: &str) -> Option<&[u8]>;
}

impl Headers for Record {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_slice())
    }
}

/// What the log refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The log is full and refuses appends: turn into backpressure, never into an ack.
    #[error("log topic {topic} partition {partition} is full")]
    Full { topic: String, partition: u32 },
    /// Records before `start` are gone (retention); read from `start` instead.
    #[error("offset {offset} of {topic}/{partition} is out of range (log starts at {start})")]
    OutOfRange {
        topic: String,
        partition: u32,
        offset: u64,
        start: u64,
    },
    /// The log is closed (shutdown).
    #[error("the log is closed")]
    Closed,
    /// Anything else the log reported.
    #[error("log {op} failed on {topic}: {message}")]
    Failed {
        op: &'static str,
        topic: String,
        message: String,
    },
}

/// The log operations the MQTT server uses.
pub trait Store: Clone + Send + Sync + 'static {
    /// Creates `topic` if missing; returns its partition count.
    fn ensure_topic(&self, topic: &str) -> Result<u32, StoreError>;
    /// The partition of a keyed record.
    fn partition_for_key(&self, key: &[u8], partitions: u32) -> u32;
    /// Appends and resolves with the base offset once durable.
    fn append(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// Queues an append behind every earlier queued append to the partition and returns its
    /// answer; awaiting one `enqueue` before the next keeps appends in order while several are
    /// in flight.
    fn enqueue(
        &self,
        topic: &str,
        partition: u32,
        records: Vec<Record>,
    ) -> impl Future<Output = Result<Queued, StoreError>> + Send;
    /// Durable records from `from`, about `max_bytes` worth; empty at the end.
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, StoreError>;
    /// (start offset, end offset).
    fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), StoreError>;
    /// The partition's durable end offset, changing after each commit.
    fn watch(&self, topic: &str, partition: u32) -> Result<watch::Receiver<u64>, StoreError>;
    /// A durable cursor (next offset to read) of `name`.
    fn cursor(&self, name: &str, topic: &str, partition: u32) -> Option<u64>;
    /// Durably stores a cursor.
    fn commit_cursor(
        &self,
        name: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The names of every stored cursor, each once.
    fn cursor_names(&self) -> Vec<String>;
    /// Durably removes every cursor of `name`.
    fn remove_cursors(&self, name: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}
