//! The log's error type: one enum for every failure the storage layer reports. Variants are
//! structured (topic, partition, path, position) so callers can react and operators can find the
//! place; nothing here formats MQTT or Kafka concepts.

use std::path::PathBuf;

/// Everything that can go wrong in the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The partition reached its retention limit and `on_full = "reject"`: callers turn this
    /// into backpressure.
    #[error("log full: topic {topic} partition {partition} reached its retention limit")]
    Full { topic: String, partition: u32 },
    /// The device holding the log is full: the append was not stored. Callers turn this into
    /// the same backpressure as [`LogError::Full`]; appends succeed again once space is freed.
    #[error("no space left on the device for topic {topic} partition {partition} ({op} {path})")]
    NoSpace {
        topic: String,
        partition: u32,
        op: &'static str,
        path: PathBuf,
    },
    #[error("topic {topic} already exists")]
    TopicExists { topic: String },
    /// A partition count out of range, or not more than the topic has.
    #[error("invalid partition count for topic {topic}: {reason}")]
    InvalidPartitions { topic: String, reason: String },
    /// Settings given at creation that the log cannot keep.
    #[error("invalid settings for topic {topic}: {reason}")]
    InvalidTopicConfig { topic: String, reason: String },
    /// The topic cannot be deleted now; the reason names what holds it.
    #[error("topic {topic} is in use: {reason}")]
    TopicInUse { topic: String, reason: String },
    #[error("unknown topic {topic}")]
    UnknownTopic { topic: String },
    #[error("unknown partition {partition} of topic {topic}")]
    UnknownPartition { topic: String, partition: u32 },
    #[error(
        "offset {offset} out of range for topic {topic} partition {partition} (log holds {start}..{end})"
    )]
    OffsetOutOfRange {
        topic: String,
        partition: u32,
        offset: u64,
        start: u64,
        end: u64,
    },
    #[error("invalid topic name {topic:?}: {reason}")]
    InvalidTopicName { topic: String, reason: String },
    /// An append that can never be stored (empty, or larger than a batch may be).
    #[error("cannot append to topic {topic}: {reason}")]
    InvalidAppend { topic: String, reason: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Bytes on disk that fail their checksum or structure checks.
    #[error("corrupt data in {path} at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// A file of a format version this tern does not read (written by a newer tern): the log
    /// is not opened and nothing in the directory is changed.
    #[error(
        "{path}: {what} of format version {found}, but this tern reads format version {supported}; refusing to open the log (nothing was changed): use a tern that reads format version {found}"
    )]
    UnsupportedVersion {
        path: PathBuf,
        what: &'static str,
        found: u16,
        supported: u16,
    },
    /// An earlier fdatasync failed: what reached the disk is unknown, so the partition refuses
    /// appends until the log is reopened (reads keep working).
    #[error("topic {topic} partition {partition} stopped after a failed sync: {reason}")]
    Failed {
        topic: String,
        partition: u32,
        reason: String,
    },
    #[error("the log is closed")]
    Closed,
}

impl LogError {
    /// Maps a decoder's [`DecodeError::UnsupportedVersion`] of `what` at `path` to the refusal;
    /// `None` for any other error (damage, handled where it is found).
    pub(crate) fn version(
        what: &'static str,
        path: &std::path::Path,
        err: &super::batch::DecodeError,
    ) -> Option<Self> {
        match *err {
            super::batch::DecodeError::UnsupportedVersion { found, supported } => {
                Some(Self::UnsupportedVersion {
                    path: path.to_owned(),
                    what,
                    found,
                    supported,
                })
            }
            _ => None,
        }
    }

    /// Whether the append was refused for now (retention limit or a full device) and may be
    /// retried later: callers answer with backpressure, never by dropping the producer.
    pub fn is_backpressure(&self) -> bool {
        match self {
            Self::Full { .. } | Self::NoSpace { .. } => true,
            // A full device under a file other than a segment (the cursor log).
            Self::Io { source, .. } => super::fs::is_no_space(source),
            _ => false,
        }
    }

    /// Builds an [`LogError::Io`] naming the operation and the file.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Shorthand for results of the log.
pub type Result<T, E = LogError> = std::result::Result<T, E>;
