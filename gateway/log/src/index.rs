//! Sparse indexes of a segment: the offset index (relative offset → byte position) and the time
//! index (running maximum timestamp before a batch → relative offset). The active segment keeps
//! them in RAM ([`IndexBuilder`]); sealing writes them once as `.index` and `.timeindex` files,
//! which are derived state: a missing or stale index is rebuilt from its segment.
//!
//! Pure encoding and lookup; this module never touches files.

use super::batch::{DecodeError, FILE_VERSION_1, FORMAT_VERSION, Reader};

/// First eight bytes of a `.index` file.
pub const OFFSET_INDEX_MAGIC: [u8; 8] = *b"TERNIDX\0";
/// First eight bytes of a `.timeindex` file.
pub const TIME_INDEX_MAGIC: [u8; 8] = *b"TERNTIX\0";
/// Bytes of an index file header.
pub const INDEX_HEADER_LEN: usize = 48;
const OFFSET_ENTRY_LEN: usize = 8;
const TIME_ENTRY_LEN: usize = 12;

/// One offset index entry: the batch starting at `rel` (offset − segment base) is at byte `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    pub rel: u32,
    pub pos: u32,
}

/// One time index entry: every record before relative offset `rel` has a timestamp <= `ts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub ts: i64,
    pub rel: u32,
}

/// What an index file says about the segment it was built from; a mismatch means stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexHeader {
    pub entry_count: u32,
    /// Length of the `.log` file the index describes.
    pub log_len: u64,
    /// Offset after the segment's last record.
    pub end_offset: u64,
    /// Largest timestamp in the segment (`i64::MIN` when empty).
    pub max_timestamp: i64,
}

/// The in-RAM indexes of the active segment, fed one batch at a time.
#[derive(Debug, Clone)]
pub struct IndexBuilder {
    interval: u64,
    since_last: Option<u64>,
    pub offsets: Vec<OffsetEntry>,
    pub times: Vec<TimeEntry>,
    pub max_timestamp: i64,
}

impl IndexBuilder {
    pub fn new(interval: u64) -> Self {
        Self {
            interval: interval.max(1),
            since_last: None,
            offsets: Vec::new(),
            times: Vec::new(),
            max_timestamp: i64::MIN,
        }
    }

    /// Makes the next batch an index entry: where reading resumes after a damaged stretch.
    pub fn restart(&mut self) {
        self.since_last = None;
    }

    /// Records a batch at byte `pos` holding relative offsets from `rel`.
    pub fn add_batch(&mut self, rel: u32, pos: u32, len: u64, max_ts: i64) {
        let due = self.since_last.is_none_or(|bytes| bytes >= self.interval);
        if due {
            self.offsets.push(OffsetEntry { rel, pos });
            self.times.push(TimeEntry {
                ts: self.max_timestamp,
                rel,
            });
            self.since_last = Some(0);
        }
        self.since_last = self.since_last.map(|b| b + len);
        self.max_timestamp = self.max_timestamp.max(max_ts);
    }

    /// Both index files' bytes for a segment of `log_len` bytes ending at `end_offset`.
    pub fn encode(&self, log_len: u64, end_offset: u64) -> (Vec<u8>, Vec<u8>) {
        let mut offsets = Vec::with_capacity(self.offsets.len() * OFFSET_ENTRY_LEN);
        for e in &self.offsets {
            offsets.extend_from_slice(&e.rel.to_le_bytes());
            offsets.extend_from_slice(&e.pos.to_le_bytes());
        }
        let mut times = Vec::with_capacity(self.times.len() * TIME_ENTRY_LEN);
        for e in &self.times {
            times.extend_from_slice(&e.ts.to_le_bytes());
            times.extend_from_slice(&e.rel.to_le_bytes());
        }
        let header = IndexHeader {
            entry_count: u32::try_from(self.offsets.len()).unwrap_or(u32::MAX),
            log_len,
            end_offset,
            max_timestamp: self.max_timestamp,
        };
        (
            encode_file(OFFSET_INDEX_MAGIC, OFFSET_ENTRY_LEN, &header, &offsets),
            encode_file(TIME_INDEX_MAGIC, TIME_ENTRY_LEN, &header, &times),
        )
    }
}

fn encode_file(magic: [u8; 8], entry_len: usize, header: &IndexHeader, entries: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(INDEX_HEADER_LEN + entries.len());
    out.extend_from_slice(&magic);
    out.extend_from_slice(&FILE_VERSION_1.to_le_bytes());
    out.extend_from_slice(&u16::try_from(entry_len).unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&header.entry_count.to_le_bytes());
    out.extend_from_slice(&header.log_len.to_le_bytes());
    out.extend_from_slice(&header.end_offset.to_le_bytes());
    out.extend_from_slice(&header.max_timestamp.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), entries);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(entries);
    out
}

/// A validated index file (either kind) viewed in place, typically over a memory map.
#[derive(Debug, Clone, Copy)]
pub struct IndexView<'a> {
    pub header: IndexHeader,
    entries: &'a [u8],
    entry_len: usize,
}

impl<'a> IndexView<'a> {
    /// Checks magic, version, entry size, length and CRC.
    pub fn parse(bytes: &'a [u8], time: bool) -> Result<Self, DecodeError> {
        Self::parse_with(bytes, time, true)
    }

    /// Like [`Self::parse`] without the CRC pass: for index files already checked when the log
    /// was opened (sealed files are never written again), on every read.
    pub fn parse_trusted(bytes: &'a [u8], time: bool) -> Result<Self, DecodeError> {
        Self::parse_with(bytes, time, false)
    }

    fn parse_with(bytes: &'a [u8], time: bool, check_crc: bool) -> Result<Self, DecodeError> {
        let (magic, entry_len) = if time {
            (TIME_INDEX_MAGIC, TIME_ENTRY_LEN)
        } else {
            (OFFSET_INDEX_MAGIC, OFFSET_ENTRY_LEN)
        };
        let mut r = Reader::new(bytes);
        if r.take(8)? != magic {
            return Err(DecodeError::Corrupt("bad index magic"));
        }
        let version = r.u16()?;
        let file_entry_len = usize::from(r.u16()?);
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(Self::other_version(bytes, version, file_entry_len));
        }
        if file_entry_len != entry_len {
            return Err(DecodeError::Corrupt("index entry size does not match"));
        }
        let header = IndexHeader {
            entry_count: r.u32()?,
            log_len: r.u64()?,
            end_offset: r.u64()?,
            max_timestamp: r.i64()?,
        };
        let stored = r.u32()?;
        let _reserved = r.u32()?;
        let entries = r.take(header.entry_count as usize * entry_len)?;
        if !r.is_empty() {
            return Err(DecodeError::Corrupt("bytes after the last index entry"));
        }
        if !check_crc {
            return Ok(Self {
                header,
                entries,
                entry_len,
            });
        }
        let crc = crc32c::crc32c_append(
            crc32c::crc32c(bytes.get(..INDEX_HEADER_LEN - 8).unwrap_or_default()),
            entries,
        );
        if crc != stored {
            return Err(DecodeError::Checksum {
                expected: stored,
                got: crc,
            });
        }
        Ok(Self {
            header,
            entries,
            entry_len,
        })
    }

    /// An index of another format version: refused as such if its CRC (same place in every
    /// version) matches, damage otherwise.
    fn other_version(bytes: &[u8], version: u16, entry_len: usize) -> DecodeError {
        let count = bytes
            .get(12..16)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map_or(0, u32::from_le_bytes) as usize;
        let stored = bytes
            .get(40..44)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes);
        let entries = count
            .checked_mul(entry_len)
            .and_then(|n| bytes.get(INDEX_HEADER_LEN..INDEX_HEADER_LEN.checked_add(n)?));
        let crc = entries.map(|entries| {
            crc32c::crc32c_append(
                crc32c::crc32c(bytes.get(..INDEX_HEADER_LEN - 8).unwrap_or_default()),
                entries,
            )
        });
        match (crc, stored) {
            (Some(crc), Some(stored)) if crc == stored => DecodeError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            },
            _ => DecodeError::Corrupt("bad index version"),
        }
    }

    pub fn len(&self) -> usize {
        self.header.entry_count as usize
    }

    fn entry(&self, i: usize) -> Option<&'a [u8]> {
        self.entries
            .get(i * self.entry_len..(i + 1) * self.entry_len)
    }

    pub fn offset_entry(&self, i: usize) -> Option<OffsetEntry> {
        let mut r = Reader::new(self.entry(i)?);
        Some(OffsetEntry {
            rel: r.u32().ok()?,
            pos: r.u32().ok()?,
        })
    }

    pub fn time_entry(&self, i: usize) -> Option<TimeEntry> {
        let mut r = Reader::new(self.entry(i)?);
        Some(TimeEntry {
            ts: r.i64().ok()?,
            rel: r.u32().ok()?,
        })
    }
}

/// The index entry to start scanning from for relative offset `rel`: the last entry at or
/// before it. `get(i)` yields entry `i` of `n`.
pub fn seek_offset(
    n: usize,
    get: impl Fn(usize) -> Option<OffsetEntry>,
    rel: u32,
) -> Option<OffsetEntry> {
    let first_after = partition_point(n, |i| get(i).is_some_and(|e| e.rel <= rel));
    first_after.checked_sub(1).and_then(get)
}

/// The relative offset to start scanning from for the first record with timestamp >= `ts`: the
/// last entry before which every timestamp is smaller than `ts`.
pub fn seek_time(n: usize, get: impl Fn(usize) -> Option<TimeEntry>, ts: i64) -> Option<u32> {
    let first_after = partition_point(n, |i| get(i).is_some_and(|e| e.ts < ts));
    first_after.checked_sub(1).and_then(get).map(|e| e.rel)
}

/// The number of leading indexes `i < n` for which `pred(i)` holds (pred must be monotone).
fn partition_point(n: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> IndexBuilder {
        let mut b = IndexBuilder::new(100);
        // (rel, pos, len, max_ts)
        for (rel, pos, ts) in [
            (0, 32, 50),
            (3, 92, 40),
            (5, 152, 70),
            (9, 212, 60),
            (12, 272, 90),
        ] {
            b.add_batch(rel, pos, 60, ts);
        }
        b
    }

    #[test]
    fn entries_are_added_every_interval_bytes() {
        let b = builder();
        assert_eq!(
            b.offsets,
            vec![
                OffsetEntry { rel: 0, pos: 32 },
                OffsetEntry { rel: 5, pos: 152 },
                OffsetEntry { rel: 12, pos: 272 },
            ]
        );
        assert_eq!(
            b.times.iter().map(|e| e.ts).collect::<Vec<_>>(),
            vec![i64::MIN, 50, 70]
        );
        assert_eq!(b.max_timestamp, 90);
    }

    #[test]
    fn files_round_trip_and_lookups_find_the_start() {
        let b = builder();
        let (offsets, times) = b.encode(400, 15);
        let view = IndexView::parse(&offsets, false).expect("offset index parses");
        assert_eq!(view.header.end_offset, 15);
        assert_eq!(view.header.log_len, 400);
        let get = |i| view.offset_entry(i);
        assert_eq!(
            seek_offset(view.len(), get, 0),
            Some(OffsetEntry { rel: 0, pos: 32 })
        );
        assert_eq!(
            seek_offset(view.len(), get, 11),
            Some(OffsetEntry { rel: 5, pos: 152 })
        );
        assert_eq!(
            seek_offset(view.len(), get, 14),
            Some(OffsetEntry { rel: 12, pos: 272 })
        );
        let tview = IndexView::parse(&times, true).expect("time index parses");
        let tget = |i| tview.time_entry(i);
        assert_eq!(seek_time(tview.len(), tget, 10), Some(0));
        assert_eq!(seek_time(tview.len(), tget, 60), Some(5));
        assert_eq!(seek_time(tview.len(), tget, 80), Some(12));
        assert!(
            IndexView::parse(&times, false).is_err(),
            "kinds are not interchangeable"
        );
    }

    #[test]
    fn offset_index_golden_bytes() {
        let mut b = IndexBuilder::new(100);
        b.add_batch(0, 32, 60, 50);
        let (offsets, _) = b.encode(92, 1);
        let expected = "5445524e49445800 0100 0800 01000000 5c00000000000000 0100000000000000 \
                        3200000000000000 81d1c368 00000000 00000000 20000000";
        let hex: String = offsets.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expected.replace([' ', '\\', '\n'], ""));
    }

    #[test]
    fn a_damaged_index_is_refused() {
        let (mut offsets, _) = builder().encode(400, 15);
        if let Some(byte) = offsets.last_mut() {
            *byte ^= 1;
        }
        assert!(matches!(
            IndexView::parse(&offsets, false),
            Err(DecodeError::Checksum { .. })
        ));
        offsets.truncate(offsets.len() - 3);
        assert!(IndexView::parse(&offsets, false).is_err());
    }
}
