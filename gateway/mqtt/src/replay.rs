//! Where a new subscription starts reading the log, as an MQTT 5 subscriber asks for it with the
//! user property `tern-start` on SUBSCRIBE (docs/consumer-model.md, "Replay for MQTT
//! subscribers"): `earliest`, `latest`, `offset:[TOPIC/]PARTITION=OFFSET,…` or
//! `time:(RFC 3339 UTC | milliseconds since the epoch | -DURATION)`. `parse` is pure and total
//! (every input is a `Start` or a `StartError`, never a panic); `resolve` turns a `Start` into
//! an offset per partition through the log's offsets and time index. Knows nothing of sessions
//! or groups: they decide which partitions still need a start.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::UNIX_EPOCH;

use super::clip::clip;
use super::router::PartitionId;
use tern_log::{LogError, LogPort};

/// The SUBSCRIBE user property naming where a new subscription starts.
pub const PROPERTY: &str = "tern-start";
/// Most `PARTITION=OFFSET` items in one `offset:` value.
const MAX_OFFSETS: usize = 1024;

/// Where a subscription starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The oldest record the log still holds.
    Earliest,
    /// The log end: only records appended from now on (what a subscription gets without it).
    Latest,
    /// Named offsets; partitions not named start at the end.
    Offsets(Vec<OffsetAt>),
    /// The first record whose timestamp is at least this (ms since the epoch).
    Time(i64),
}

/// One `[TOPIC/]PARTITION=OFFSET` of an `offset:` start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetAt {
    /// The log topic; `None`: this partition number of every log topic the filter reads.
    pub topic: Option<String>,
    pub partition: u32,
    pub offset: u64,
}

impl OffsetAt {
    fn names(&self, partition: &PartitionId) -> bool {
        self.partition == partition.1 && self.topic.as_ref().is_none_or(|t| *t == partition.0)
    }
}

/// Why a `tern-start` value cannot be served; the text is the SUBACK's reason string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("more than one {PROPERTY} user property")]
    Repeated,
    #[error(
        "{PROPERTY} {0:?}: expected earliest, latest, offset:[TOPIC/]PARTITION=OFFSET,... or time:(RFC 3339 UTC | ms since the epoch | -DURATION)"
    )]
    Unknown(String),
    #[error("{PROPERTY} offset item {0:?}: expected [TOPIC/]PARTITION=OFFSET")]
    BadOffset(String),
    #[error("{PROPERTY} names partition {0:?} twice")]
    Twice(String),
    #[error("{PROPERTY} names more than {MAX_OFFSETS} offsets")]
    TooMany,
    #[error(
        "{PROPERTY} time {0:?}: expected RFC 3339 UTC (2026-12-01T17:00:00Z), ms since the epoch or -DURATION (-15m)"
    )]
    BadTime(String),
    #[error("{PROPERTY} names {0}, which this subscription does not read")]
    NotRead(String),
    #[error("{PROPERTY} offset {offset} is past the end {end} of {topic}/{partition}")]
    PastEnd {
        topic: String,
        partition: u32,
        offset: u64,
        end: u64,
    },
    #[error("{PROPERTY}: the log cannot say where to start: {0}")]
    Log(String),
}

impl From<LogError> for StartError {
    fn from(err: LogError) -> Self {
        Self::Log(err.to_string())
    }
}

/// The start a SUBSCRIBE's user properties ask for, if any.
pub fn from_properties(
    properties: &[(String, String)],
    now_ms: i64,
) -> Result<Option<Start>, StartError> {
    let mut values = properties.iter().filter(|(k, _)| k == PROPERTY);
    let Some((_, value)) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(StartError::Repeated);
    }
    parse(value, now_ms).map(Some)
}

/// Parses a `tern-start` value; `now_ms` anchors `time:-DURATION`.
pub fn parse(value: &str, now_ms: i64) -> Result<Start, StartError> {
    match value {
        "earliest" => return Ok(Start::Earliest),
        "latest" => return Ok(Start::Latest),
        _ => {}
    }
    if let Some(list) = value.strip_prefix("offset:") {
        return parse_offsets(list).map(Start::Offsets);
    }
    if let Some(time) = value.strip_prefix("time:") {
        return parse_time(time, now_ms).map(Start::Time);
    }
    Err(StartError::Unknown(clip(value).to_string()))
}

fn parse_offsets(list: &str) -> Result<Vec<OffsetAt>, StartError> {
    let mut offsets = Vec::new();
    let mut seen = BTreeSet::new();
    for item in list.split(',') {
        if offsets.len() == MAX_OFFSETS {
            return Err(StartError::TooMany);
        }
        let at = parse_offset(item).ok_or_else(|| StartError::BadOffset(clip(item).to_string()))?;
        if !seen.insert((at.topic.clone(), at.partition)) {
            return Err(StartError::Twice(clip(item).to_string()));
        }
        offsets.push(at);
    }
    Ok(offsets)
}

fn parse_offset(item: &str) -> Option<OffsetAt> {
    let (topic, rest) = match item.split_once('/') {
        Some((topic, rest)) => (Some(topic), rest),
        None => (None, item),
    };
    if topic.is_some_and(|t| !is_log_topic(t)) {
        return None;
    }
    let (partition, offset) = rest.split_once('=')?;
    Some(OffsetAt {
        topic: topic.map(str::to_owned),
        partition: digits(partition)?,
        offset: digits(offset)?,
    })
}

/// A decimal number of ASCII digits only (no sign, no spaces).
fn digits<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn is_log_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn parse_time(time: &str, now_ms: i64) -> Result<i64, StartError> {
    let bad = || StartError::BadTime(clip(time).to_string());
    if let Some(ago) = time.strip_prefix('-') {
        let ago = humantime::parse_duration(ago).map_err(|_| bad())?;
        let ago = i64::try_from(ago.as_millis()).map_err(|_| bad())?;
        return Ok(now_ms.saturating_sub(ago).max(0));
    }
    if let Some(ms) = digits::<i64>(time) {
        return Ok(ms);
    }
    let at = humantime::parse_rfc3339_weak(time).map_err(|_| bad())?;
    let since = at.duration_since(UNIX_EPOCH).map_err(|_| bad())?;
    i64::try_from(since.as_millis()).map_err(|_| bad())
}

impl fmt::Display for Start {
    /// The canonical `tern-start` value, which `parse` reads back to the same `Start`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Earliest => f.write_str("earliest"),
            Self::Latest => f.write_str("latest"),
            Self::Time(ms) => write!(f, "time:{ms}"),
            Self::Offsets(offsets) => {
                f.write_str("offset:")?;
                for (i, at) in offsets.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    if let Some(topic) = &at.topic {
                        write!(f, "{topic}/")?;
                    }
                    write!(f, "{}={}", at.partition, at.offset)?;
                }
                Ok(())
            }
        }
    }
}

/// Where each of `partitions` (every partition the subscription reads) starts. Fails when an
/// `offset:` item names no partition among them or an offset past a partition's end; an offset
/// below the oldest retained record starts at that record.
pub fn resolve<S: LogPort>(
    start: &Start,
    log: &S,
    partitions: &[PartitionId],
) -> Result<BTreeMap<PartitionId, u64>, StartError> {
    if let Start::Offsets(offsets) = start {
        if let Some(at) = offsets
            .iter()
            .find(|at| !partitions.iter().any(|p| at.names(p)))
        {
            let name = match &at.topic {
                Some(topic) => format!("partition {topic}/{}", at.partition),
                None => format!("partition {}", at.partition),
            };
            return Err(StartError::NotRead(name));
        }
    }
    let mut starts = BTreeMap::new();
    for partition in partitions {
        let (topic, p) = (&partition.0, partition.1);
        let (first, end) = log.offsets(topic, p)?;
        let offset = match start {
            Start::Earliest => first,
            Start::Latest => end,
            Start::Time(ms) => log.offset_for_timestamp(topic, p, *ms)?.unwrap_or(end),
            Start::Offsets(offsets) => match offsets.iter().find(|at| at.names(partition)) {
                None => end,
                Some(at) if at.offset > end => {
                    return Err(StartError::PastEnd {
                        topic: topic.clone(),
                        partition: p,
                        offset: at.offset,
                        end,
                    });
                }
                Some(at) => at.offset.max(first),
            },
        };
        starts.insert(partition.clone(), offset);
    }
    Ok(starts)
}

/// The reason string of a subscription whose start was not applied to `partitions`, because a
/// cursor (the session's or the group's) already says where they are.
pub fn ignored_reason(filter: &str, partitions: &[PartitionId]) -> String {
    let names: Vec<String> = partitions
        .iter()
        .map(|(topic, p)| format!("{topic}/{p}"))
        .collect();
    format!(
        "{PROPERTY} ignored for {} of {}: an existing cursor continues",
        names.join(","),
        clip(filter)
    )
}

#[cfg(test)]
mod test;
