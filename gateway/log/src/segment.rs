//! Segment files on disk: their names, and walking the batches of a segment's bytes, whether
//! read with `pread` from a sealed file, from the file being appended (active), or from bytes
//! in memory (recovery and the tools, over a mapping).
//!
//! Read-only: this module validates and decodes, it never writes or truncates.

use std::borrow::Cow;
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::batch::{self, BATCH_HEADER_LEN, BatchHeader, SEGMENT_HEADER_LEN, SegmentHeader};
use super::fs::{ReadFile, WriteFile};
use super::index::IndexBuilder;

/// Name of the segment file whose first offset is `base`.
pub fn log_name(base: u64) -> String {
    format!("{base:020}.log")
}

/// The base offset named by a segment file name, if it is one.
pub fn parse_log_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn log_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(log_name(base))
}

pub fn index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.index"))
}

pub fn time_index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.timeindex"))
}

/// Bytes of a segment, read in place or from a file.
pub trait Source {
    /// `len` bytes from `pos`; fails past the readable end.
    fn slice(&self, pos: u64, len: usize) -> io::Result<Cow<'_, [u8]>>;
    /// Readable length.
    fn len(&self) -> u64;
}

impl Source for [u8] {
    fn slice(&self, pos: u64, len: usize) -> io::Result<Cow<'_, [u8]>> {
        let start = usize::try_from(pos).unwrap_or(usize::MAX);
        self.get(start..start.saturating_add(len))
            .map(Cow::Borrowed)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))
    }
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
}

/// Bytes a sealed segment is read ahead by: one `pread` serves the many small batches an MQTT
/// partition holds, not one call per batch.
const READ_AHEAD: usize = 64 << 10;

/// A sealed segment file, read with `pread`, never through its mapping: a page the card cannot
/// read is EIO from `pread` but SIGBUS, the end of the process, from a mapping. A walk takes a
/// failed read for the end of what it can read; the first such error is kept for the reader
/// to report ([`Sealed::take_error`]).
#[derive(Debug)]
pub struct Sealed {
    file: Arc<dyn ReadFile>,
    state: std::sync::Mutex<SealedState>,
}

#[derive(Debug, Default)]
struct SealedState {
    /// The last bytes read, from `window.0` on.
    window: (u64, Vec<u8>),
    error: Option<io::Error>,
}

impl SealedState {
    /// `len` bytes at `pos` if the window holds them.
    fn cached(&self, pos: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(pos.checked_sub(self.window.0)?).ok()?;
        self.window.1.get(start..start.checked_add(len)?)
    }
}

impl Sealed {
    pub fn new(file: Arc<dyn ReadFile>) -> Self {
        Self {
            file,
            state: std::sync::Mutex::new(SealedState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SealedState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The first read that failed (not a read past the end), if any.
    pub fn take_error(&self) -> Option<io::Error> {
        self.lock().error.take()
    }

    /// The whole file (to resync after damage, a rare path).
    pub fn read_all(&self) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.file.len()).map_err(io::Error::other)?;
        let mut bytes = vec![0u8; len];
        self.file.read_at(0, &mut bytes)?;
        Ok(bytes)
    }
}

impl Source for Sealed {
    fn slice(&self, pos: u64, len: usize) -> io::Result<Cow<'_, [u8]>> {
        let file_len = self.file.len();
        if pos.saturating_add(len as u64) > file_len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        }
        let mut state = self.lock();
        if let Some(bytes) = state.cached(pos, len) {
            return Ok(Cow::Owned(bytes.to_vec()));
        }
        let ahead = usize::try_from(file_len - pos).unwrap_or(usize::MAX);
        let mut buf = vec![0u8; len.max(READ_AHEAD).min(ahead)];
        if let Err(err) = self.file.read_at(pos, &mut buf) {
            let kind = err.kind();
            state.error.get_or_insert(err);
            return Err(kind.into());
        }
        state.window = (pos, buf);
        let bytes = state.cached(pos, len).unwrap_or_default();
        Ok(Cow::Owned(bytes.to_vec()))
    }
    fn len(&self) -> u64 {
        self.file.len()
    }
}

/// The committed prefix of the active segment.
#[derive(Debug)]
pub struct Active {
    pub file: Arc<dyn WriteFile>,
    pub committed: u64,
}

impl Source for Active {
    fn slice(&self, pos: u64, len: usize) -> io::Result<Cow<'_, [u8]>> {
        if pos.saturating_add(len as u64) > self.committed {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        }
        let mut buf = vec![0u8; len];
        self.file.read_at(pos, &mut buf)?;
        Ok(Cow::Owned(buf))
    }
    fn len(&self) -> u64 {
        self.committed
    }
}

/// Where and why a walk over batches stopped before the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub position: u64,
    pub reason: String,
}

/// Visits the batches from byte `pos` to the end of `src`, checking each CRC. Stops at the
/// first damaged batch (reported) or when `visit` breaks.
pub fn walk(
    src: &(impl Source + ?Sized),
    mut pos: u64,
    mut visit: impl FnMut(u64, &BatchHeader, &[u8]) -> ControlFlow<()>,
) -> Result<(), Damage> {
    let limit = src.len();
    while pos < limit {
        let damage = |reason: String| Damage {
            position: pos,
            reason,
        };
        let head = src
            .slice(pos, BATCH_HEADER_LEN)
            .map_err(|_| damage("batch header cut short".to_owned()))?;
        let header = batch::decode_header(&head).map_err(|e| damage(e.to_string()))?;
        let bytes = src
            .slice(pos, header.length as usize)
            .map_err(|_| damage(format!("batch of {} bytes cut short", header.length)))?;
        batch::check_batch(&bytes).map_err(|e| damage(e.to_string()))?;
        if visit(pos, &header, &bytes).is_break() {
            return Ok(());
        }
        pos += u64::from(header.length);
    }
    Ok(())
}

/// After damage at byte `damaged`, the next position holding a whole, valid batch of
/// `generation` whose base offset is at least `min_offset`: where reading resumes. Every reader
/// (recovery, the broker's reads, `tern log dump` and `verify`) resumes with this one rule, so
/// they agree on what a damaged segment holds. It probes every byte position, cheaply: the
/// generation and offset fields are compared before a CRC is computed.
pub fn resync(bytes: &[u8], damaged: u64, generation: u32, min_offset: u64) -> Option<u64> {
    let start = usize::try_from(damaged).ok()?.saturating_add(1);
    // A batch starts with a non-zero length: none starts after the last non-zero byte (the
    // preallocated zeros at the end of a segment are skipped at memory speed).
    let last = last_non_zero(bytes)?;
    let end = bytes
        .len()
        .saturating_sub(BATCH_HEADER_LEN - 1)
        .min(last + 1);
    let field = |pos: usize, at: usize, len: usize| bytes.get(pos + at..pos + at + len);
    let wanted = generation.to_le_bytes();
    (start..end)
        .find(|pos| {
            field(*pos, 16, 4) == Some(&wanted[..])
                && field(*pos, 8, 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .is_some_and(|b| u64::from_le_bytes(b) >= min_offset)
                && batch::check_batch(bytes.get(*pos..).unwrap_or_default())
                    .is_ok_and(|h| h.generation == generation && h.base_offset >= min_offset)
        })
        .map(|pos| pos as u64)
}

/// Visits every batch of `bytes` with a valid CRC from `pos` on, resuming after damage where
/// [`resync`] says (the broker's sealed reads, `tern log dump` and `verify` share it);
/// `on_damage` sees each damaged position. Stops when `visit` breaks or nothing valid follows.
pub fn walk_all(
    bytes: &[u8],
    mut pos: u64,
    generation: u32,
    mut visit: impl FnMut(u64, &BatchHeader, &[u8]) -> ControlFlow<()>,
    mut on_damage: impl FnMut(&Damage),
) -> ControlFlow<()> {
    let mut next_offset = 0;
    let mut flow = ControlFlow::Continue(());
    loop {
        let walked = walk(bytes, pos, |at, header, batch| {
            next_offset = header.next_offset();
            flow = visit(at, header, batch);
            flow
        });
        let Err(damage) = walked else { return flow };
        on_damage(&damage);
        match resync(bytes, damage.position, generation, next_offset) {
            Some(next) => pos = next,
            None => return flow,
        }
    }
}

/// A page of zeros: slices are compared with it (memcmp, fast even unoptimised).
const ZEROS: [u8; 4096] = [0; 4096];

/// Whether `bytes` are all zeros (the preallocated rest of a segment).
fn all_zero(bytes: &[u8]) -> bool {
    bytes
        .chunks(ZEROS.len())
        .all(|chunk| ZEROS.get(..chunk.len()) == Some(chunk))
}

/// Position of the last non-zero byte.
fn last_non_zero(bytes: &[u8]) -> Option<usize> {
    let tail = bytes.len() % ZEROS.len();
    let (body, end) = bytes.split_at(bytes.len() - tail);
    if let Some(i) = end.iter().rposition(|b| *b != 0) {
        return Some(body.len() + i);
    }
    let chunk = body
        .chunks_exact(ZEROS.len())
        .rposition(|chunk| chunk != ZEROS)?;
    let start = chunk * ZEROS.len();
    let within = body.get(start..start + ZEROS.len())?;
    within.iter().rposition(|b| *b != 0).map(|i| start + i)
}

/// A damaged stretch with valid batches after it: skipped, kept on disk as evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Where the first invalid batch starts, and why it is invalid.
    pub damage: Damage,
    /// Where the next valid batch starts.
    pub resume: u64,
    /// Offsets lost: from the end of the last valid batch before to the next valid batch.
    pub lost: std::ops::Range<u64>,
}

/// What follows a segment's last valid batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Nothing, or zeros (the preallocated rest of the file): the normal end.
    Clean,
    /// Whole batches of an older generation (a recycled file's earlier use): the normal end too.
    Stale(Damage),
    /// Anything else: what an interrupted write leaves (a torn tail), or damage at the very end.
    Torn(Damage),
}

/// What a full validation of a segment found.
#[derive(Debug)]
pub struct Scan {
    pub header: SegmentHeader,
    /// The file's own header was damaged and `header` was taken from its batches.
    pub header_damage: Option<Damage>,
    /// Bytes up to the end of the last valid batch.
    pub valid_len: u64,
    /// Offset after the last valid batch.
    pub end_offset: u64,
    pub index: IndexBuilder,
    /// Damaged stretches with valid batches after them, in order.
    pub skipped: Vec<Skipped>,
    /// What follows the last valid batch.
    pub end: End,
}

impl Scan {
    /// The first damage found, skipped or at the end, if any (stale bytes are not damage).
    pub fn first_damage(&self) -> Option<&Damage> {
        self.skipped.first().map(|s| &s.damage).or(match &self.end {
            End::Torn(damage) => Some(damage),
            End::Clean | End::Stale(_) => None,
        })
    }
}

/// A segment's header as every reader takes it (recovery, the broker's reads, `tern log dump`
/// and `verify`): the file's own when it is valid. When it is damaged (bad magic or CRC) and a
/// valid batch starts right after it at the file's base offset, the header those batches imply,
/// with the damage: the header is synced before any batch is written, so this is damage, not a
/// crash while the file was created, and the batches are intact. `Err` when neither (a header
/// of a newer format version is never taken for damage).
pub fn header(bytes: &[u8], base: u64) -> Result<(SegmentHeader, Option<Damage>), Damage> {
    let damage = match SegmentHeader::decode(bytes) {
        Ok(header) => return Ok((header, None)),
        Err(err @ batch::DecodeError::UnsupportedVersion { .. }) => {
            return Err(Damage {
                position: 0,
                reason: format!("segment header: {err}"),
            });
        }
        Err(err) => Damage {
            position: 0,
            reason: format!("segment header: {err}"),
        },
    };
    let first = bytes
        .get(SEGMENT_HEADER_LEN..)
        .and_then(|b| batch::check_batch(b).ok())
        .filter(|first| first.base_offset == base)
        .ok_or_else(|| damage.clone())?;
    let header = SegmentHeader {
        generation: first.generation,
        base_offset: base,
    };
    Ok((header, Some(damage)))
}

/// Validates a whole segment: header, then batches, each with the file's generation and the
/// next dense offset. An invalid batch followed by a valid one (see [`resync`]) is damage, skipped
/// and listed; the first invalid batch with no valid one after it ends the segment. A damaged
/// header whose batches are intact is taken from them ([`header`]) and noted in
/// `header_damage`. `Err` when the file header is unusable.
pub fn scan(bytes: &[u8], expected_base: u64, index_interval: u64) -> Result<Scan, Damage> {
    let (header, header_damage) = header(bytes, expected_base)?;
    if header.base_offset != expected_base {
        return Err(Damage {
            position: 0,
            reason: format!(
                "segment header names base offset {}, file name {expected_base}",
                header.base_offset
            ),
        });
    }
    let mut scan = Scan {
        header,
        header_damage,
        valid_len: SEGMENT_HEADER_LEN as u64,
        end_offset: expected_base,
        index: IndexBuilder::new(index_interval),
        skipped: Vec::new(),
        end: End::Clean,
    };
    let mut pos = SEGMENT_HEADER_LEN as u64;
    loop {
        let Some(damage) = scan_from(bytes, pos, &mut scan) else {
            return Ok(scan);
        };
        let rest = usize::try_from(damage.position).unwrap_or(usize::MAX);
        if all_zero(bytes.get(rest..).unwrap_or_default()) {
            scan.end = End::Clean;
            return Ok(scan);
        }
        match resync(bytes, damage.position, header.generation, scan.end_offset) {
            Some(resume) => {
                let next_base = bytes
                    .get(usize::try_from(resume).unwrap_or(usize::MAX)..)
                    .and_then(|b| batch::decode_header(b).ok())
                    .map_or(scan.end_offset, |h| h.base_offset);
                scan.skipped.push(Skipped {
                    damage,
                    resume,
                    lost: scan.end_offset..next_base,
                });
                scan.end_offset = next_base;
                scan.index.restart();
                pos = resume;
            }
            None => {
                scan.end = classify_end(bytes, damage, header.generation);
                return Ok(scan);
            }
        }
    }
}

/// Walks valid, dense batches from `pos`, adding them to `scan`; the damage it stopped at.
fn scan_from(bytes: &[u8], pos: u64, scan: &mut Scan) -> Option<Damage> {
    let (generation, base) = (scan.header.generation, scan.header.base_offset);
    let mut stopped = None;
    let walked = walk(bytes, pos, |pos, batch, _| {
        if batch.generation != generation || batch.base_offset != scan.end_offset {
            stopped = Some(Damage {
                position: pos,
                reason: format!(
                    "stale batch (generation {}, base offset {}; expected {}, {})",
                    batch.generation, batch.base_offset, generation, scan.end_offset
                ),
            });
            return ControlFlow::Break(());
        }
        let rel = u32::try_from(batch.base_offset - base).unwrap_or(u32::MAX);
        let at = u32::try_from(pos).unwrap_or(u32::MAX);
        scan.index
            .add_batch(rel, at, u64::from(batch.length), batch.max_timestamp);
        scan.valid_len = pos + u64::from(batch.length);
        scan.end_offset = batch.next_offset();
        ControlFlow::Continue(())
    });
    walked.err().or(stopped)
}

/// What the bytes after the last valid batch are: zeros, an older generation's batch, or torn.
fn classify_end(bytes: &[u8], damage: Damage, generation: u32) -> End {
    let rest = bytes
        .get(usize::try_from(damage.position).unwrap_or(usize::MAX)..)
        .unwrap_or_default();
    if rest.iter().all(|b| *b == 0) {
        return End::Clean;
    }
    match batch::check_batch(rest) {
        Ok(h) if h.generation < generation => End::Stale(damage),
        _ => End::Torn(damage),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bytes, Record};

    #[test]
    fn names_sort_and_parse() {
        assert_eq!(log_name(42), "00000000000000000042.log");
        assert_eq!(parse_log_name("00000000000000000042.log"), Some(42));
        assert_eq!(parse_log_name("42.log"), None);
        assert_eq!(parse_log_name("0000000000000000004x.log"), None);
    }

    #[test]
    fn scan_stops_at_stale_and_torn_batches() {
        let header = SegmentHeader {
            generation: 3,
            base_offset: 10,
        };
        let mut bytes = header.encode().to_vec();
        let rec = Record {
            timestamp_ms: 5,
            key: None,
            value: Bytes::from_static(b"v"),
            headers: crate::Headers::new(),
        };
        batch::encode_batch(10, 3, &[rec.clone(), rec.clone()], &mut bytes);
        let good = bytes.len() as u64;
        batch::encode_batch(12, 2, std::slice::from_ref(&rec), &mut bytes);
        let scanned = scan(&bytes, 10, 4096).expect("header valid");
        assert_eq!((scanned.valid_len, scanned.end_offset), (good, 12));
        assert!(
            matches!(&scanned.end, End::Stale(d) if d.reason.contains("stale")),
            "{:?}",
            scanned.end
        );
        bytes.truncate(good as usize);
        batch::encode_batch(12, 3, &[rec], &mut bytes);
        bytes.truncate(bytes.len() - 1);
        let scanned = scan(&bytes, 10, 4096).expect("header valid");
        assert_eq!((scanned.valid_len, scanned.end_offset), (good, 12));
        assert!(
            scan(&bytes, 11, 4096).is_err(),
            "base offset must match the name"
        );
    }

    fn segment_of(batches: &[u8]) -> (Vec<u8>, Vec<(usize, u64, u64)>) {
        let header = SegmentHeader {
            generation: 7,
            base_offset: 0,
        };
        let mut bytes = header.encode().to_vec();
        let mut spans = Vec::new();
        let mut offset = 0u64;
        for (i, n) in batches.iter().enumerate() {
            let records: Vec<Record> = (0..u64::from(*n % 4 + 1))
                .map(|j| Record {
                    timestamp_ms: (offset + j) as i64,
                    key: None,
                    value: format!("b{i}-r{j}").into_bytes().into(),
                    headers: crate::Headers::new(),
                })
                .collect();
            let start = bytes.len();
            batch::encode_batch(offset, 7, &records, &mut bytes);
            spans.push((start, offset, offset + records.len() as u64));
            offset += records.len() as u64;
        }
        (bytes, spans)
    }

    /// A sealed segment read with `pread` through the read-ahead window sees exactly the
    /// batches its bytes hold, batches across window edges and larger than the window included.
    #[test]
    fn sealed_reads_see_the_batches_the_bytes_hold() {
        use crate::fs::{FaultyFs, Fs};
        let header = SegmentHeader {
            generation: 1,
            base_offset: 0,
        };
        let mut bytes = header.encode().to_vec();
        for (i, size) in [100usize, 40_000, 70_000, 300, 150_000, 7]
            .iter()
            .enumerate()
        {
            let record = Record {
                timestamp_ms: 1,
                key: None,
                value: vec![b'v'; *size].into(),
                headers: crate::Headers::new(),
            };
            batch::encode_batch(i as u64, 1, &[record], &mut bytes);
        }
        let fs = FaultyFs::new(0);
        fs.create_dir_all(Path::new("/s")).expect("mkdir");
        let path = Path::new("/s/0.log");
        fs.create(path)
            .expect("create")
            .write_at(0, &bytes)
            .expect("write");
        let sealed = Sealed::new(fs.open_read(path).expect("open"));
        fn seen(src: &(impl Source + ?Sized)) -> Vec<(u64, u64, Vec<u8>)> {
            let mut seen = Vec::new();
            let start = SEGMENT_HEADER_LEN as u64;
            walk(src, start, |pos, h, b| {
                seen.push((pos, h.base_offset, b.to_vec()));
                ControlFlow::Continue(())
            })
            .expect("no damage");
            seen
        }
        let expected = seen(bytes.as_slice());
        assert_eq!(expected.len(), 6);
        assert_eq!(seen(&sealed), expected);
        assert!(sealed.take_error().is_none());
    }

    proptest::proptest! {
        #[test]
        fn scan_never_panics_on_any_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let _ = scan(&bytes, 0, 64);
            let _ = resync(&bytes, 0, 1, 0);
        }

        /// Garbage over any stretch loses only the batches it touches: every batch after it is
        /// found again, and the scan ends where the last batch does.
        #[test]
        fn damage_loses_only_the_batches_it_touches(
            batches in proptest::collection::vec(proptest::prelude::any::<u8>(), 2..12),
            at in 0usize..1000,
            len in 1usize..40,
        ) {
            let (mut bytes, spans) = segment_of(&batches);
            let total = bytes.len();
            let at = SEGMENT_HEADER_LEN + at % (total - SEGMENT_HEADER_LEN);
            let end = (at + len).min(total);
            for byte in bytes.get_mut(at..end).unwrap_or_default() {
                *byte ^= 0x5a;
            }
            let scanned = scan(&bytes, 0, 64).expect("header untouched");
            let mut kept = std::collections::BTreeSet::new();
            let _ = walk_all(&bytes, SEGMENT_HEADER_LEN as u64, 7, |_, h, _| {
                kept.insert(h.base_offset);
                ControlFlow::Continue(())
            }, |_| {});
            for (i, (start, base, next)) in spans.iter().enumerate() {
                let stop = spans.get(i + 1).map_or(total, |s| s.0);
                let touched = *start < end && at < stop;
                if !touched {
                    proptest::prop_assert!(kept.contains(base), "batch at {} lost", start);
                }
                if i + 1 == spans.len() && !touched {
                    proptest::prop_assert_eq!(scanned.end_offset, *next);
                    proptest::prop_assert_eq!(scanned.valid_len, total as u64);
                }
            }
        }
    }
}
