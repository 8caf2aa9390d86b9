//! Operator tools over a log directory: `tern log dump`, `tern log verify` and `tern log topics`.
//! They only read:
//! they never recover, truncate or rebuild anything, so they are safe on a live directory.
//!
//! Output formats live here; the storage rules stay in the other modules.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::batch::{self, SEGMENT_HEADER_LEN};
use super::fs::{Fs, RealFs};
use super::segment::{self, Damage, Scan};
use super::{LogError, StoredRecord, meta};

/// Why a tool could not do its work (damage it finds is printed, not returned).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    #[error("no log in {data_dir} (expected {log_dir})")]
    NoLog { data_dir: PathBuf, log_dir: PathBuf },
    #[error("no topic {topic} in {log_dir}")]
    NoTopic { topic: String, log_dir: PathBuf },
    #[error("topic {topic} has {partitions} partitions, not {wanted}")]
    NoPartition {
        topic: String,
        partitions: u32,
        wanted: u32,
    },
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

/// The tools read only a log this build understands: no log at all, or a newer format, is an
/// error (the newer tern's files are never shown as damage).
fn check_format(data_dir: &Path, log_dir: &Path) -> Result<(), ToolError> {
    if !RealFs.is_dir(log_dir) {
        return Err(ToolError::NoLog {
            data_dir: data_dir.to_owned(),
            log_dir: log_dir.to_owned(),
        });
    }
    super::datadir::check_format(log_dir)?;
    Ok(())
}

/// Where `tern log dump` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Offset(u64),
    /// The first record with a timestamp at or after this many ms since the epoch.
    Time(i64),
}

impl From {
    /// Parses `123` (an offset), `@1700000000000` (ms since the epoch) or an RFC 3339 time.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Ok(offset) = text.parse() {
            return Ok(Self::Offset(offset));
        }
        if let Some(ms) = text.strip_prefix('@') {
            return ms
                .parse()
                .map(Self::Time)
                .map_err(|_| format!("`{text}`: bad timestamp"));
        }
        let time = humantime::parse_rfc3339_weak(text).map_err(|_| {
            format!("`{text}` is neither an offset, @milliseconds nor an RFC 3339 time")
        })?;
        let ms = time
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("`{text}` is before 1970"))?
            .as_millis();
        Ok(Self::Time(i64::try_from(ms).unwrap_or(i64::MAX)))
    }
}

/// A read-only view of one partition directory.
#[derive(Debug)]
struct PartitionFiles {
    dir: PathBuf,
    bases: Vec<u64>,
}

fn partition_files(fs: &dyn Fs, log_dir: &Path, topic: &str, partition: u32) -> PartitionFiles {
    let dir = meta::partition_dir(log_dir, topic, partition);
    let names = fs.list_dir(&dir).unwrap_or_default();
    let bases = names
        .iter()
        .filter_map(|n| segment::parse_log_name(n))
        .collect();
    PartitionFiles { dir, bases }
}

fn scan_file(fs: &dyn Fs, dir: &Path, base: u64) -> Result<(Scan, u64, Vec<u8>), Damage> {
    let bytes = fs.read(&segment::log_path(dir, base)).map_err(|e| Damage {
        position: 0,
        reason: format!("cannot read: {e}"),
    })?;
    let scan = segment::scan(&bytes, base, 4096)?;
    let len = bytes.len() as u64;
    Ok((scan, len, bytes))
}

fn encode_bytes(bytes: &[u8]) -> (serde_json::Value, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (json!(text), "utf8"),
        Err(_) => (json!(base64(bytes)), "base64"),
    }
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [0, 1, 2].map(|i| chunk.get(i).copied().unwrap_or(0));
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            let c = ALPHABET
                .get(((n >> shift) & 63) as usize)
                .copied()
                .unwrap_or(b'=');
            out.push(if i <= chunk.len() { char::from(c) } else { '=' });
        }
    }
    out
}

/// One record as a JSON line of `tern log dump`.
pub fn record_json(topic: &str, partition: u32, stored: &StoredRecord) -> serde_json::Value {
    let r = &stored.record;
    let (value, value_encoding) = encode_bytes(&r.value);
    let (key, key_encoding) = match &r.key {
        Some(key) => encode_bytes(key),
        None => (serde_json::Value::Null, "utf8"),
    };
    let headers: Vec<serde_json::Value> = r
        .headers
        .iter()
        .map(|(name, value)| {
            let (value, encoding) = encode_bytes(value);
            json!({"name": name, "value": value, "encoding": encoding})
        })
        .collect();
    json!({
        "topic": topic,
        "partition": partition,
        "offset": stored.offset,
        "timestamp": r.timestamp_ms,
        "key": key,
        "key_encoding": key_encoding,
        "headers": headers,
        "value": value,
        "value_encoding": value_encoding,
    })
}

/// Rewrites a `tern log dump` line from its record's value (`--decode`). The schemas are the
/// binary's: the storage engine knows no payload format.
pub trait ValueDecoder: std::fmt::Debug {
    /// Decodes `value` into `line` (the JSON object [`record_json`] made); never fails, at worst
    /// it adds why the value did not decode.
    fn apply(&self, value: &[u8], line: &mut serde_json::Map<String, serde_json::Value>);
}

/// Which records `tern log dump` prints, and how.
#[derive(Debug, Clone, Copy)]
pub struct DumpOptions<'a> {
    /// Only this partition; `None` = all, in partition order.
    pub partition: Option<u32>,
    pub from: From,
    /// Print at most this many records.
    pub count: Option<u64>,
    /// Decode each value through this schema (`--decode`).
    pub decode: Option<&'a dyn ValueDecoder>,
}

impl Default for DumpOptions<'_> {
    fn default() -> Self {
        Self {
            partition: None,
            from: From::Offset(0),
            count: None,
            decode: None,
        }
    }
}

/// `tern log dump`: records as JSON lines on `out`; returns how many were printed.
pub fn dump(
    data_dir: &Path,
    topic: &str,
    options: &DumpOptions<'_>,
    out: &mut dyn Write,
) -> Result<u64, ToolError> {
    let DumpOptions {
        partition,
        from,
        count,
        decode,
    } = *options;
    let fs = RealFs;
    let log_dir = data_dir.join("log");
    check_format(data_dir, &log_dir)?;
    let info = meta::list(&fs, &log_dir)?
        .into_iter()
        .find(|t| t.name == topic)
        .ok_or_else(|| ToolError::NoTopic {
            topic: topic.to_owned(),
            log_dir: log_dir.clone(),
        })?;
    let partitions: Vec<u32> = match partition {
        Some(p) if p < info.partitions => vec![p],
        Some(p) => {
            return Err(ToolError::NoPartition {
                topic: topic.to_owned(),
                partitions: info.partitions,
                wanted: p + 1,
            });
        }
        None => (0..info.partitions).collect(),
    };
    let mut dumper = Dumper {
        topic,
        partition: 0,
        from,
        count,
        decode,
        printed: 0,
        started: false,
        out,
    };
    for p in partitions {
        dumper.partition = p;
        dumper.started = matches!(from, From::Offset(_));
        let files = partition_files(&fs, &log_dir, topic, p);
        for (i, base) in files.bases.iter().enumerate() {
            let (scan, _, bytes) = match scan_file(&fs, &files.dir, *base) {
                Ok(found) => found,
                Err(damage) => {
                    eprintln!("skipping segment {base} of {topic}/{p}: {}", damage.reason);
                    continue;
                }
            };
            // The active segment ends at its last valid batch; a sealed one is read to its end,
            // skipping damaged stretches the way the log's readers do.
            let last = i + 1 == files.bases.len();
            let limit = if last {
                scan.valid_len as usize
            } else {
                bytes.len()
            };
            let valid = bytes.get(..limit).unwrap_or_default();
            if dumper
                .segment(valid, *base, scan.header.generation)
                .is_break()
            {
                break;
            }
        }
    }
    dumper.out.flush()?;
    Ok(dumper.printed)
}

/// The state of one `tern log dump`.
struct Dumper<'a> {
    topic: &'a str,
    partition: u32,
    from: From,
    count: Option<u64>,
    decode: Option<&'a dyn ValueDecoder>,
    printed: u64,
    /// Whether the `--from` time has been reached in this partition.
    started: bool,
    out: &'a mut dyn Write,
}

impl Dumper<'_> {
    /// Prints the wanted records of one segment's bytes, resyncing past damaged batches.
    fn segment(&mut self, valid: &[u8], base: u64, generation: u32) -> ControlFlow<()> {
        let (topic, partition) = (self.topic, self.partition);
        segment::walk_all(
            valid,
            SEGMENT_HEADER_LEN as u64,
            generation,
            |_, _, bytes| {
                let Ok((header, records)) = batch::decode_batch(bytes) else {
                    return ControlFlow::Continue(());
                };
                for (offset, record) in (header.base_offset..).zip(records) {
                    self.record(StoredRecord { offset, record })?;
                }
                ControlFlow::Continue(())
            },
            |damage| {
                eprintln!(
                    "damaged batch in segment {base} of {topic}/{partition} at byte {}: {}",
                    damage.position, damage.reason
                );
            },
        )
    }

    /// Prints one record if `--from` wants it; breaks at `--count` or when output fails.
    fn record(&mut self, stored: StoredRecord) -> ControlFlow<()> {
        let ts = stored.record.timestamp_ms;
        self.started = self.started || matches!(self.from, From::Time(t) if ts >= t);
        let wanted = match self.from {
            From::Offset(o) => stored.offset >= o,
            From::Time(_) => self.started,
        };
        if !wanted {
            return ControlFlow::Continue(());
        }
        if self.count.is_some_and(|c| self.printed >= c) {
            return ControlFlow::Break(());
        }
        let mut line = record_json(self.topic, self.partition, &stored);
        if let (Some(decoder), serde_json::Value::Object(fields)) = (self.decode, &mut line) {
            decoder.apply(&stored.record.value, fields);
        }
        if writeln!(self.out, "{line}").is_err() {
            return ControlFlow::Break(());
        }
        self.printed += 1;
        ControlFlow::Continue(())
    }
}

/// Summary of one partition for `tern log topics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSummary {
    pub topic: String,
    pub partition: u32,
    pub start: u64,
    pub end: u64,
    pub bytes: u64,
    pub segments: usize,
}

/// Topics, partitions, offsets, sizes and segment counts, read without changing anything.
pub fn summarize(data_dir: &Path) -> Result<Vec<PartitionSummary>, ToolError> {
    let fs = RealFs;
    let log_dir = data_dir.join("log");
    check_format(data_dir, &log_dir)?;
    let mut out = Vec::new();
    for info in meta::list(&fs, &log_dir)? {
        for p in 0..info.partitions {
            let files = partition_files(&fs, &log_dir, &info.name, p);
            let mut bytes = 0;
            for base in files.bases.iter().rev().skip(1) {
                bytes += fs
                    .file_len(&segment::log_path(&files.dir, *base))
                    .unwrap_or(0);
            }
            let last = files.bases.last().copied().unwrap_or(0);
            let (end, used) = scan_file(&fs, &files.dir, last)
                .map_or((last, 0), |(scan, _, _)| (scan.end_offset, scan.valid_len));
            out.push(PartitionSummary {
                topic: info.name.clone(),
                partition: p,
                start: files.bases.first().copied().unwrap_or(0),
                end,
                bytes: bytes + used,
                segments: files.bases.len(),
            });
        }
    }
    Ok(out)
}

/// `tern log topics`: a table on `out`.
pub fn topics(data_dir: &Path, out: &mut dyn Write) -> Result<(), ToolError> {
    writeln!(
        out,
        "{:<30} {:>9} {:>12} {:>12} {:>14} {:>8}",
        "TOPIC", "PARTITION", "START", "END", "BYTES", "SEGMENTS"
    )?;
    for s in summarize(data_dir)? {
        writeln!(
            out,
            "{:<30} {:>9} {:>12} {:>12} {:>14} {:>8}",
            s.topic, s.partition, s.start, s.end, s.bytes, s.segments
        )?;
    }
    Ok(())
}

mod verify;

pub use verify::verify;
