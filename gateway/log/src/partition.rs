//! One partition: its segments (sealed ones described in RAM by a few numbers each, the active
//! one with its in-RAM sparse indexes), and the read paths over them: records from an offset,
//! the first offset at a timestamp. Appends, rolls and retention live in `writer.rs`.
//!
//! Readers never see bytes past the committed end, and a damaged batch in a segment is
//! reported and skipped, never fatal.

use std::collections::{HashSet, VecDeque};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::batch::{self, BatchSpan, Codec, SEGMENT_HEADER_LEN, StampedBatch};
use super::cache::FileCache;
use super::clock::Timekeeper;
use super::config::{LogConfig, OnFull, TopicSettings};
use super::cursors::CursorStore;
use super::error::{LogError, Result};
use super::fs::{Fs, ReadFile, WriteFile};
use super::index::{self, IndexBuilder, IndexView, OffsetEntry};
use super::segment::{self, Active, Damage, Sealed};
use super::stats::{Counters, PartitionStats};
use super::{Record, RecordView, StoredRecord};

/// The segments, counted from the end, whose producer stamps rebuild the table of idempotent
/// producers after a restart: the active one and the last sealed one. A producer retries a
/// batch whose answer it lost within its delivery timeout (two minutes by default), and the
/// answers lost in a crash are those of the last commits, which sit at the end of the log.
pub const PRODUCER_SEGMENTS: usize = 2;

/// What every partition of one log shares.
#[derive(Debug)]
pub struct Shared {
    pub fs: Arc<dyn Fs>,
    pub config: LogConfig,
    pub cache: FileCache,
    pub counters: Arc<Counters>,
    pub cursors: CursorStore,
    /// Elapsed-time accounting for age retention, and the wall clock.
    pub time: Timekeeper,
    /// The configuration retention follows: `config` until [`crate::Log::set_retention`]
    /// (SIGHUP) swaps in a new one; topics created later take their limits from it.
    pub live: std::sync::RwLock<LogConfig>,
    /// The wear budget's commit controller, shared by every writer.
    pub wear: super::wear::WearController,
}

/// A partition's retention limits: read by its writer at every check, swapped live by
/// [`crate::Log::set_retention`] without stopping the writer.
#[derive(Debug)]
pub struct Retention {
    bytes: AtomicU64,
    age_ms: AtomicU64,
    drop_oldest: AtomicBool,
    /// Wakes the writer so it takes a new `retention.age` tick at once.
    changed: tokio::sync::Notify,
}

impl Retention {
    pub fn new(settings: &TopicSettings) -> Self {
        let retention = Self {
            bytes: AtomicU64::new(0),
            age_ms: AtomicU64::new(0),
            drop_oldest: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        };
        retention.set(settings);
        retention
    }

    /// Takes the retention limits of `settings` (its other fields need a restart).
    pub fn set(&self, settings: &TopicSettings) {
        self.bytes
            .store(settings.retention_bytes, Ordering::Relaxed);
        self.age_ms
            .store(settings.retention_age_ms, Ordering::Relaxed);
        self.drop_oldest
            .store(settings.on_full == OnFull::DropOldest, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// Resolves at the next [`Retention::set`].
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// `retention.bytes` (0: no limit).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// `retention.age` in ms (0: no limit).
    pub fn age_ms(&self) -> u64 {
        self.age_ms.load(Ordering::Relaxed)
    }

    /// `on_full = "drop-oldest"`.
    pub fn drop_oldest(&self) -> bool {
        self.drop_oldest.load(Ordering::Relaxed)
    }
}

/// A sealed segment, described by what retention and lookups need.
#[derive(Debug, Clone)]
pub struct SealedSegment {
    pub base: u64,
    pub end: u64,
    pub len: u64,
    pub max_ts: i64,
    pub generation: u32,
}

/// The segment being appended to.
#[derive(Debug)]
pub struct ActiveSegment {
    pub base: u64,
    pub generation: u32,
    pub file: Arc<dyn WriteFile>,
    /// Committed bytes (readers see no further).
    pub len: u64,
    /// Committed end offset.
    pub end: u64,
    pub index: IndexBuilder,
    /// Bytes from the start known to lie on blocks already written (not preallocated
    /// unwritten extents): a commit below it needs no extent conversion, so its fdatasync
    /// flushes data only (`commit.rs` zeroes ahead of it).
    pub written_to: u64,
}

#[derive(Debug)]
pub struct PartState {
    pub sealed: VecDeque<SealedSegment>,
    pub active: ActiveSegment,
    /// Set when a sync failed: appends are refused until the log is reopened.
    pub failed: Option<String>,
}

impl PartState {
    pub fn start(&self) -> u64 {
        self.sealed.front().map_or(self.active.base, |s| s.base)
    }

    pub fn bytes(&self) -> u64 {
        self.sealed.iter().map(|s| s.len).sum::<u64>() + self.active.len
    }
}

#[derive(Debug)]
pub struct Partition {
    pub topic: String,
    pub id: u32,
    pub dir: PathBuf,
    pub settings: TopicSettings,
    /// The retention part of `settings`, live (SIGHUP).
    pub retention: Retention,
    pub shared: Arc<Shared>,
    state: Mutex<PartState>,
    durable: watch::Sender<u64>,
    /// Damaged positions already logged at ERROR: (segment base, byte), so a reader passing
    /// them again logs at DEBUG only.
    reported: Mutex<HashSet<(u64, u64)>>,
    /// The largest timestamp stored or being written: no record is stamped below it.
    ts_floor: AtomicI64,
    /// Whether the last append was refused because retention could not make room
    /// (`inspect.rs` reports it and names the cursor that holds the partition).
    pub full: AtomicBool,
}

/// A segment pinned for reading.
enum View {
    Sealed {
        base: u64,
        log: Sealed,
        index: Option<Arc<dyn ReadFile>>,
    },
    Active {
        base: u64,
        src: Active,
    },
}

impl View {
    fn base(&self) -> u64 {
        match self {
            Self::Sealed { base, .. } | Self::Active { base, .. } => *base,
        }
    }
}

fn approx_size(record: &RecordView<'_>) -> usize {
    record.value.len() + record.key.map_or(0, <[u8]>::len) + 16
}

impl Partition {
    pub fn new(
        topic: String,
        id: u32,
        dir: PathBuf,
        settings: TopicSettings,
        shared: Arc<Shared>,
        state: PartState,
    ) -> Self {
        let (durable, _) = watch::channel(state.active.end);
        let active_ts = &state.active.index;
        let ts_floor = if active_ts.offsets.is_empty() {
            // An unreadable sealed segment reports i64::MAX: it sets no floor.
            state
                .sealed
                .back()
                .map(|s| s.max_ts)
                .filter(|ts| *ts != i64::MAX)
                .unwrap_or(i64::MIN)
        } else {
            active_ts.max_timestamp
        };
        Self {
            topic,
            id,
            dir,
            retention: Retention::new(&settings),
            settings,
            shared,
            state: Mutex::new(state),
            durable,
            reported: Mutex::new(HashSet::new()),
            ts_floor: AtomicI64::new(ts_floor),
            full: AtomicBool::new(false),
        }
    }

    /// Raises timestamps below their predecessor's to it, so a partition's timestamps never go
    /// back (a wall clock stepped back does not break the time index); returns the floor they
    /// leave, which [`Partition::keep_ts_floor`] keeps once they are written (a refused write
    /// must not raise later records to its timestamps). Only the writer calls them.
    pub fn monotonic_timestamps(&self, records: &mut [Record]) -> i64 {
        let mut floor = self.ts_floor.load(Ordering::Relaxed);
        for record in records {
            record.timestamp_ms = record.timestamp_ms.max(floor);
            floor = record.timestamp_ms;
        }
        floor
    }

    /// The floor of written records ([`Partition::monotonic_timestamps`]).
    pub fn keep_ts_floor(&self, floor: i64) {
        self.ts_floor.store(floor, Ordering::Relaxed);
    }

    /// The key of this partition's segment `base` in the clock file.
    pub fn clock_key(&self, base: u64) -> String {
        super::clock::segment_key(&self.topic, self.id, base)
    }

    pub fn lock(&self) -> MutexGuard<'_, PartState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// Tells live readers the new durable end.
    pub fn publish(&self, end: u64) {
        self.durable.send_replace(end);
    }

    pub fn offsets(&self) -> (u64, u64) {
        let st = self.lock();
        (st.start(), st.active.end)
    }

    pub fn stats(&self) -> PartitionStats {
        let st = self.lock();
        PartitionStats {
            topic: self.topic.clone(),
            partition: self.id,
            start_offset: st.start(),
            end_offset: st.active.end,
            bytes: st.bytes(),
            segments: st.sealed.len() + 1,
        }
    }

    fn out_of_range(&self, offset: u64, start: u64, end: u64) -> LogError {
        LogError::OffsetOutOfRange {
            topic: self.topic.clone(),
            partition: self.id,
            offset,
            start,
            end,
        }
    }

    /// Pins the segment holding `offset`, or `None` at the end.
    fn view(&self, offset: u64) -> Result<Option<(View, u64)>> {
        let (target, end) = {
            let st = self.lock();
            let (start, end) = (st.start(), st.active.end);
            if offset < start || offset > end {
                return Err(self.out_of_range(offset, start, end));
            }
            if offset == end {
                return Ok(None);
            }
            if offset >= st.active.base {
                let src = Active {
                    file: Arc::clone(&st.active.file),
                    committed: st.active.len,
                };
                let view = View::Active {
                    base: st.active.base,
                    src,
                };
                return Ok(Some((view, end)));
            }
            let i = st.sealed.partition_point(|s| s.base <= offset);
            let seg = i.checked_sub(1).and_then(|i| st.sealed.get(i));
            let seg = seg.ok_or_else(|| self.out_of_range(offset, start, end))?;
            (seg.base, seg.end)
        };
        let cache = &self.shared.cache;
        let path = segment::log_path(&self.dir, target);
        let log = match cache.get(&path) {
            Ok(log) => log,
            // Retention deleted the segment since the lookup above.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (start, end) = self.offsets();
                return Err(self.out_of_range(offset, start, end));
            }
            Err(e) => return Err(LogError::io("open", path, e)),
        };
        let index = cache.get(&segment::index_path(&self.dir, target)).ok();
        Ok(Some((
            View::Sealed {
                base: target,
                log: Sealed::new(log),
                index,
            },
            end,
        )))
    }

    /// Offset index entries of a view, through `f`.
    fn with_offsets<T>(
        &self,
        view: &View,
        f: impl Fn(usize, &dyn Fn(usize) -> Option<OffsetEntry>) -> T,
    ) -> T {
        match view {
            View::Sealed { index, .. } => {
                let parsed = index
                    .as_ref()
                    .and_then(|file| IndexView::parse_trusted(file.bytes(), false).ok());
                match parsed {
                    Some(v) => f(v.len(), &|i| v.offset_entry(i)),
                    None => f(0, &|_| None),
                }
            }
            View::Active { base, .. } => {
                let st = self.lock();
                if st.active.base == *base {
                    let entries = &st.active.index.offsets;
                    f(entries.len(), &|i| entries.get(i).copied())
                } else {
                    f(0, &|_| None)
                }
            }
        }
    }

    /// Byte position to start scanning from for `offset`.
    fn seek(&self, view: &View, offset: u64) -> u64 {
        let rel = u32::try_from(offset.saturating_sub(view.base())).unwrap_or(u32::MAX);
        self.with_offsets(view, |n, get| index::seek_offset(n, get, rel))
            .map_or(SEGMENT_HEADER_LEN as u64, |e| u64::from(e.pos))
    }

    /// Counts a damaged batch found while reading; logs it at ERROR the first time.
    fn report(&self, view: &View, damage: &Damage) {
        self.shared.counters.corrupt_batch();
        let first = self
            .reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((view.base(), damage.position));
        if !first {
            tracing::debug!(topic = %self.topic, partition = self.id, segment = view.base(), position = damage.position, "damaged batch skipped again");
            return;
        }
        tracing::error!(
            topic = %self.topic,
            partition = self.id,
            segment = view.base(),
            position = damage.position,
            reason = %damage.reason,
            "damaged batch skipped"
        );
    }

    /// The first index entry past a damaged position.
    fn next_entry_after(&self, view: &View, damaged: u64) -> Option<u64> {
        self.with_offsets(view, |n, get| {
            (0..n)
                .filter_map(get)
                .map(|e| u64::from(e.pos))
                .find(|pos| *pos > damaged)
        })
    }

    /// Walks `view` from `offset`, skipping damaged stretches; `visit` sees each good batch.
    /// A sealed segment the device fails to read is [`LogError::Io`], not damage: its bytes
    /// may be intact.
    fn walk_view(
        &self,
        view: &View,
        offset: u64,
        mut visit: impl FnMut(&batch::BatchHeader, &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let mut pos = self.seek(view, offset);
        let next_offset = std::cell::Cell::new(view.base());
        let mut visit = |h: &batch::BatchHeader, b: &[u8]| {
            next_offset.set(h.next_offset());
            visit(h, b)
        };
        loop {
            let walked = match view {
                View::Sealed { log, .. } => segment::walk(log, pos, |_, h, b| visit(h, b)),
                View::Active { src, .. } => segment::walk(src, pos, |_, h, b| visit(h, b)),
            };
            self.check_read(view)?;
            let Err(damage) = walked else { return Ok(()) };
            self.report(view, &damage);
            let resynced = match view {
                View::Sealed { log, base, .. } => {
                    let bytes = log.read_all().map_err(|e| self.read_error(*base, e))?;
                    segment::header(&bytes, *base).ok().and_then(|(h, _)| {
                        segment::resync(&bytes, damage.position, h.generation, next_offset.get())
                    })
                }
                View::Active { .. } => None,
            };
            match resynced.or_else(|| self.next_entry_after(view, damage.position)) {
                Some(next) => pos = next,
                None => return Ok(()),
            }
        }
    }

    /// The read error a walk over a sealed segment stopped at, if any.
    fn check_read(&self, view: &View) -> Result<()> {
        match view {
            View::Sealed { log, base, .. } => match log.take_error() {
                Some(err) => Err(self.read_error(*base, err)),
                None => Ok(()),
            },
            View::Active { .. } => Ok(()),
        }
    }

    fn read_error(&self, base: u64, err: std::io::Error) -> LogError {
        LogError::io("read", segment::log_path(&self.dir, base), err)
    }

    /// Records with offset >= `from`, up to about `max_bytes` (at least one if any exist).
    pub fn read(&self, from: u64, max_bytes: usize) -> Result<Vec<StoredRecord>> {
        let mut out = Vec::new();
        self.read_each(from, max_bytes, &mut |offset, view| {
            out.push(StoredRecord {
                offset,
                record: view.to_record(),
            });
        })?;
        Ok(out)
    }

    /// Visits the records with offset >= `from`, up to about `max_bytes` (at least one if any
    /// exist), borrowed from their segment; returns how many it visited.
    pub fn read_each(
        &self,
        from: u64,
        max_bytes: usize,
        visit: &mut dyn FnMut(u64, &RecordView<'_>),
    ) -> Result<usize> {
        self.read_batched(from, max_bytes, &mut |offset, record, _| {
            visit(offset, record)
        })
    }

    /// [`Partition::read_each`], each record seen with the batch it is stored in. A read that
    /// starts in a sealed segment (cold on the card, its file perhaps not yet open) runs
    /// [`off_worker`]; a tail read of the active segment, in the page cache, stays inline.
    pub fn read_batched(
        &self,
        from: u64,
        max_bytes: usize,
        visit: &mut dyn FnMut(u64, &RecordView<'_>, BatchSpan),
    ) -> Result<usize> {
        if self.in_active(from) {
            return self.read_batched_here(from, max_bytes, visit);
        }
        off_worker(|| self.read_batched_here(from, max_bytes, visit))
    }

    /// Whether `from` lies in the active segment (or at the end).
    fn in_active(&self, from: u64) -> bool {
        from >= self.lock().active.base
    }

    fn read_batched_here(
        &self,
        from: u64,
        max_bytes: usize,
        visit: &mut dyn FnMut(u64, &RecordView<'_>, BatchSpan),
    ) -> Result<usize> {
        let mut from = from;
        loop {
            let Some((view, _)) = self.view(from)? else {
                return Ok(0);
            };
            let mut count = 0;
            let mut size = 0usize;
            let mut last_seen = from;
            let walked = self.walk_view(&view, from, |header, bytes| {
                last_seen = header.next_offset();
                if header.next_offset() <= from {
                    return ControlFlow::Continue(());
                }
                let Ok((_, records)) = batch::decode_views(bytes) else {
                    return ControlFlow::Continue(());
                };
                let span = BatchSpan {
                    next_offset: header.next_offset(),
                    codec: Codec::from_attributes(header.attributes),
                };
                for (offset, record) in (header.base_offset..).zip(&records) {
                    if offset < from {
                        continue;
                    }
                    size += approx_size(record);
                    count += 1;
                    visit(offset, record, span);
                    if size >= max_bytes {
                        return ControlFlow::Break(());
                    }
                }
                ControlFlow::Continue(())
            });
            match walked {
                // The records seen are answered; the next read meets the error again.
                Err(_) | Ok(()) if count > 0 => return Ok(count),
                Err(err) => return Err(err),
                Ok(()) => {}
            }
            // Nothing readable here (damage): go on with the next segment, up to the end of the
            // partition (not of this segment: records after a damaged end are still there).
            let next = self.segment_end(view.base()).max(last_seen).max(from + 1);
            if next >= self.offsets().1 {
                return Ok(0);
            }
            from = next;
        }
    }

    /// The producer stamps of the durable batches in the last [`PRODUCER_SEGMENTS`] segments,
    /// in log order (damaged batches are skipped, as every reader skips them).
    pub fn producer_stamps(&self) -> Result<Vec<StampedBatch>> {
        off_worker(|| self.producer_stamps_here())
    }

    fn producer_stamps_here(&self) -> Result<Vec<StampedBatch>> {
        let bases: Vec<u64> = {
            let st = self.lock();
            let last_sealed = st.sealed.iter().rev().take(PRODUCER_SEGMENTS - 1).rev();
            last_sealed
                .map(|s| s.base)
                .chain([st.active.base])
                .collect()
        };
        let mut out = Vec::new();
        for base in bases {
            let from = base.max(self.offsets().0);
            let Some((view, _)) = self.view(from)? else {
                continue;
            };
            if view.base() != base {
                continue;
            }
            self.walk_view(&view, from, |header, bytes| {
                if let Some(stamp) = batch::producer_stamp(header, bytes) {
                    out.push(StampedBatch {
                        stamp,
                        base_offset: header.base_offset,
                    });
                }
                ControlFlow::Continue(())
            })?;
        }
        Ok(out)
    }

    /// End offset of the segment starting at `base`.
    fn segment_end(&self, base: u64) -> u64 {
        let st = self.lock();
        st.sealed
            .iter()
            .find(|s| s.base == base)
            .map_or(st.active.end, |s| s.end)
    }

    /// The first offset whose timestamp is >= `ts`, `None` past the end.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<u64>> {
        off_worker(|| self.offset_for_timestamp_here(ts))
    }

    fn offset_for_timestamp_here(&self, ts: i64) -> Result<Option<u64>> {
        let candidates: Vec<u64> = {
            let st = self.lock();
            let sealed = st.sealed.iter().filter(|s| s.max_ts >= ts).map(|s| s.base);
            let active = (st.active.index.max_timestamp >= ts).then_some(st.active.base);
            sealed.chain(active).collect()
        };
        for base in candidates {
            let Some((view, _)) = self.view(base.max(self.offsets().0))? else {
                return Ok(None);
            };
            let rel = self.time_seek(&view, ts);
            let start = base + u64::from(rel);
            let mut found = None;
            self.walk_view(&view, start, |header, bytes| {
                if header.max_timestamp < ts || header.next_offset() <= start {
                    return ControlFlow::Continue(());
                }
                let Ok((_, records)) = batch::decode_views(bytes) else {
                    return ControlFlow::Continue(());
                };
                found = (header.base_offset..)
                    .zip(records)
                    .find(|(o, r)| *o >= start && r.timestamp_ms >= ts)
                    .map(|(o, _)| o);
                if found.is_some() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Relative offset to start a timestamp scan at, from the time index.
    fn time_seek(&self, view: &View, ts: i64) -> u32 {
        match view {
            View::Sealed { base, .. } => {
                let path = segment::time_index_path(&self.dir, *base);
                let file = self.shared.cache.get(&path).ok();
                let parsed = file
                    .as_ref()
                    .and_then(|f| IndexView::parse_trusted(f.bytes(), true).ok());
                parsed
                    .and_then(|v| index::seek_time(v.len(), |i| v.time_entry(i), ts))
                    .unwrap_or(0)
            }
            View::Active { base, .. } => {
                let st = self.lock();
                if st.active.base != *base {
                    return 0;
                }
                let times = &st.active.index.times;
                index::seek_time(times.len(), |i| times.get(i).copied(), ts).unwrap_or(0)
            }
        }
    }
}

/// Runs `read`, which may wait for the card (a cold sealed segment: opening and mapping it,
/// `pread` of pages not in the page cache), where waiting stalls no other task. On a
/// multi-threaded tokio runtime's worker it runs through `block_in_place`, which first hands
/// the worker's queued tasks (every other connection's acknowledgements) to another thread; on
/// a blocking-pool thread or outside tokio it simply runs. A current-thread runtime has no
/// other thread to hand its tasks to, so there it runs inline (tests, `tern` tools).
///
/// `block_in_place` rather than `spawn_blocking`: the read methods lend each record to the
/// caller's visitor borrowed from the read buffer, and their callers are synchronous steps of
/// connection loops; a `'static` closure on the blocking pool would copy every record.
pub(crate) fn off_worker<T>(read: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|handle| handle.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(read),
        _ => read(),
    }
}
