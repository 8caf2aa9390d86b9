//! tern's storage engine: a Kafka-style segmented log per topic partition, on flash. It owns
//! everything under `<data_dir>/log`: segment files with sparse offset and time indexes, topic
//! metadata, the cursor store, group-committed durability, recovery after a power cut and
//! retention. The format is drawn byte by byte in `docs/log-format.md`.
//!
//! It must never know about MQTT or Kafka (topics here are plain names, records plain bytes),
//! never acknowledge an append before it is durable under the topic's policy, and never rewrite
//! acknowledged bytes in place.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

mod batch;
mod cache;
mod clock;
mod commit;
mod config;
mod cursors;
pub mod datadir;
mod error;
mod fs;
mod headers;
mod index;
mod inspect;
#[cfg(any(test, feature = "testing"))]
mod memory;
mod meta;
mod pace;
mod partition;
mod port;
mod recovery;
mod roll;
mod segment;
mod stats;
mod store;
pub mod tools;
mod topic_config;
mod wear;
mod writer;

#[cfg(test)]
mod tests;

use std::borrow::Cow;

pub use bytes::Bytes;
pub use headers::{HeaderBlock, Headers};

pub use batch::{BatchSpan, Codec, ProducerStamp, StampedBatch};
pub use clock::{BUILD_TIME_MS, Clock, ClockStatus, ManualClock, SystemClock};
pub use config::{
    Durability, FlushConfig, LogConfig, OnFull, RetentionConfig, TopicOverride, TopicSettings,
    WearConfig,
};
pub use cursors::CursorStore;
pub use error::LogError;
#[cfg(feature = "fault-injection")]
pub use fs::{CrashMode, FaultyFs};
pub use fs::{Fs, RealFs};
pub use inspect::{CursorPosition, CursorReport, PartitionState, Refusal, ResetTo};
#[cfg(any(test, feature = "testing"))]
pub use memory::MemoryLog;
pub use port::{Lag, LogPort, Queued};
pub use stats::{LogMetrics, LogStats, PartitionStats};
pub use store::{Log, MAX_PARTITIONS};
pub use topic_config::TopicConfig;
pub use wear::WearStatus;

/// A header's name: borrowed for the names a producer knows when it is compiled (no allocation
/// per record, e.g. tern-mqtt's `mqtt.topic`), owned for names read back from a segment or built
/// at run time. The bytes on disk are the same either way.
pub type HeaderName = Cow<'static, str>;

/// A header's value: static for fixed values (tern-mqtt's one-byte `mqtt.qos` and
/// `mqtt.retain`), shared otherwise (tern-mqtt's `mqtt.topic` is a slice of the PUBLISH frame
/// it arrived in, its `mqtt.client_id` the connection's one copy): no allocation or copy per
/// record. The bytes on disk are the same either way.
pub type HeaderValue = Bytes;

/// One record as producers give it. Key, value and header values are [`Bytes`]: a producer
/// hands over the buffer its request arrived in (tern-mqtt's PUBLISH frame), not a copy of
/// it, and a clone shares it (issue #29: the ingest path's allocations and copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub value: Bytes,
    pub headers: Headers,
}

impl Record {
    /// The value of the first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.get(name)
    }

    /// Uncompressed size for batching and read limits: key, value and headers.
    pub fn size(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.key.as_ref().map_or(0, Bytes::len) + self.value.len() + headers
    }
}

/// A record read back, with its offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    pub record: Record,
}

/// A durable record as it lies in its segment: a [`Record`]'s fields borrowed, nothing copied
/// or allocated ([`LogPort::read_each`]). Its batch's CRC and every field were checked before
/// the view was made.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    headers: HeadersView<'a>,
}

/// Where a view's headers are: still encoded in the segment (checked, decoded again on each
/// [`RecordView::headers`]), or in a [`Record`] (the in-memory log, [`RecordView::of`]).
#[derive(Debug, Clone, Copy)]
enum HeadersView<'a> {
    Encoded { count: usize, bytes: &'a [u8] },
    Owned(&'a [(HeaderName, HeaderValue)]),
}

impl<'a> RecordView<'a> {
    /// A view of a record held in memory.
    pub fn of(record: &'a Record) -> Self {
        Self {
            timestamp_ms: record.timestamp_ms,
            key: record.key.as_deref(),
            value: &record.value,
            headers: record.headers.view(),
        }
    }

    /// A view of a record decoded from a batch, its `count` headers still encoded in
    /// `headers` (checked by the decoder).
    pub(crate) fn encoded(
        timestamp_ms: i64,
        key: Option<&'a [u8]>,
        value: &'a [u8],
        count: usize,
        headers: &'a [u8],
    ) -> Self {
        Self {
            timestamp_ms,
            key,
            value,
            headers: HeadersView::Encoded {
                count,
                bytes: headers,
            },
        }
    }

    /// How many headers the record has.
    pub fn header_count(&self) -> usize {
        match self.headers {
            HeadersView::Encoded { count, .. } => count,
            HeadersView::Owned(headers) => headers.len(),
        }
    }

    /// The headers, in their stored order.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + use<'a> {
        let (encoded, owned) = match self.headers {
            HeadersView::Encoded { count, bytes } => (Some(batch::headers(bytes, count)), None),
            HeadersView::Owned(headers) => (
                None,
                Some(headers.iter().map(|(name, value)| (&**name, &**value))),
            ),
        };
        encoded
            .into_iter()
            .flatten()
            .chain(owned.into_iter().flatten())
    }

    /// The record, copied out of its segment.
    pub fn to_record(&self) -> Record {
        let mut headers = Vec::with_capacity(self.header_count());
        headers.extend(
            self.headers()
                .map(|(name, value)| (name.to_owned().into(), Bytes::copy_from_slice(value))),
        );
        Record {
            timestamp_ms: self.timestamp_ms,
            key: self.key.map(Bytes::copy_from_slice),
            value: Bytes::copy_from_slice(self.value),
            headers: headers.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub partitions: u32,
}

/// [`validate_topic_name`] as the log's error, naming the topic.
pub(crate) fn check_topic_name(topic: &str) -> Result<(), LogError> {
    validate_topic_name(topic).map_err(|reason| LogError::InvalidTopicName {
        topic: topic.to_owned(),
        reason,
    })
}

/// A topic's partition count is 1 to [`MAX_PARTITIONS`] (topic administration, both logs).
pub(crate) fn check_partition_count(topic: &str, partitions: u32) -> Result<(), LogError> {
    if (1..=MAX_PARTITIONS).contains(&partitions) {
        return Ok(());
    }
    Err(LogError::InvalidPartitions {
        topic: topic.to_owned(),
        reason: format!("must be between 1 and {MAX_PARTITIONS}"),
    })
}

/// Checks a topic name: `[A-Za-z0-9._-]`, 1..=200 characters, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 200 {
        return Err("must be 1 to 200 characters long".to_owned());
    }
    if name == "." || name == ".." {
        return Err("must not be `.` or `..`".to_owned());
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => Err(format!(
            "character {c:?} is not allowed (use A-Z a-z 0-9 . _ -)"
        )),
        None => Ok(()),
    }
}
