//! The segment lifecycle of a partition, run by its writer task between commits: sealing the
//! active segment and starting the next (a new file or the recycled spare), growing the active
//! segment's allocation in steps ahead of its commits,
//! and retention (whole segments, oldest first, by age and size, never past a cursor unless
//! the operator chose drop-oldest).
//!
//! It must never seal a segment while a written batch is still unsynced (the writer drains its
//! pipeline first) and never delete a segment a cursor still needs under `on_full = "reject"`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::batch::{SEGMENT_HEADER_LEN, SegmentHeader};
use super::error::{LogError, Result};
use super::fs::{self, WriteFile};
use super::index::IndexBuilder;
use super::partition::{ActiveSegment, Partition, SealedSegment, Shared};
use super::segment;

/// Name of the spare segment file kept for reuse after retention deleted a segment.
pub const RECYCLE_NAME: &str = "recycle.log";
/// How often an idle writer checks age retention.
pub const RETENTION_TICK: Duration = Duration::from_secs(30);
/// Free space preallocation leaves on the device: index files, cursors and MQTT state still
/// need room when segments cannot have all they want.
const PREALLOCATE_HEADROOM: u64 = 1 << 20;

/// The largest step in which an active segment's allocation grows ahead of its commits (up to
/// `segment_bytes`): below it the allocation doubles (512 KiB, 1, 2, 4 MiB), then grows by
/// this much. A segment is not allocated whole when it starts: a partition that never receives
/// a record holds its 32-byte header, one holding a little holds at most twice what it wrote
/// or a step more. Each step is one `fallocate` that moves the file's size, so one journal
/// commit more per step (19 per 64 MiB segment); every commit in between lands on allocated
/// blocks, as with a segment allocated whole (`docs/log-format.md`, "Padding, preallocation,
/// recycling").
pub const ALLOCATION_STEP: u64 = 4 << 20;

/// Reserves disk space for the active segment `file` at `path` in `dir` up to `to` bytes
/// (at most `segment_bytes`), best effort: all of it when the device has room, otherwise at
/// most half of its free space beyond [`PREALLOCATE_HEADROOM`], or nothing. A failed
/// reservation is given back (the file keeps its length), so the device is never left fuller
/// than it was; appends then allocate as they write and a full device refuses them with
/// [`LogError::NoSpace`].
pub fn preallocate(shared: &Shared, dir: &Path, path: &Path, file: &dyn WriteFile, to: u64) {
    let want = to.min(shared.config.segment_bytes.0);
    let Ok(len) = file.len() else { return };
    if len >= want {
        return;
    }
    let free = shared.fs.available_space(dir).unwrap_or(u64::MAX);
    let grant = (want - len).min(free.saturating_sub(PREALLOCATE_HEADROOM) / 2);
    if grant < want - len {
        tracing::warn!(segment = %path.display(), free, reserved = grant, wanted = want - len, "disk space short: segment preallocated in part");
    }
    if grant == 0 {
        return;
    }
    if let Err(err) = file.preallocate(len + grant) {
        tracing::warn!(segment = %path.display(), %err, "segment preallocation failed; appends allocate as they write");
    }
}

/// The error of a failed file operation on `path`: [`LogError::NoSpace`] when the device is
/// full (backpressure), [`LogError::Io`] otherwise.
pub fn write_error(
    topic: &str,
    partition: u32,
    op: &'static str,
    path: &Path,
    err: std::io::Error,
) -> LogError {
    if fs::is_no_space(&err) {
        LogError::NoSpace {
            topic: topic.to_owned(),
            partition,
            op,
            path: path.to_owned(),
        }
    } else {
        LogError::io(op, path, err)
    }
}

impl Partition {
    /// Seals the active segment (exact length, index files) and starts the next one.
    pub fn roll(&self) -> Result<()> {
        let (file, base, len, end, generation, index) = {
            let st = self.lock();
            let a = &st.active;
            (
                Arc::clone(&a.file),
                a.base,
                a.len,
                a.end,
                a.generation,
                a.index.clone(),
            )
        };
        let fs = &*self.shared.fs;
        let log_path = segment::log_path(&self.dir, base);
        let io = |op: &'static str, path: &Path| {
            let path = path.to_owned();
            move |e| LogError::io(op, path, e)
        };
        if file.len().map_err(io("stat", &log_path))? != len {
            file.set_len(len).map_err(io("truncate", &log_path))?;
        }
        self.shared
            .counters
            .timed_sync(|| file.sync_data())
            .map_err(|e| self.fail(&log_path, e))?;
        let (offsets, times) = index.encode(len, end);
        for (path, data) in [
            (segment::index_path(&self.dir, base), offsets),
            (segment::time_index_path(&self.dir, base), times),
        ] {
            self.shared.counters.wrote(data.len());
            self.shared
                .counters
                .timed_sync(|| fs::write_atomic(fs, &path, &data, fs::NewFile::Plain))
                .map_err(|e| write_error(&self.topic, self.id, "write index", &path, e))?;
        }
        let new = self
            .create_segment(end, generation.wrapping_add(1))
            .map_err(|e| match e {
                LogError::Io { op, path, source } => {
                    write_error(&self.topic, self.id, op, &path, source)
                }
                other => other,
            })?;
        // Held from its newest record's write (or from now, if none was written this run).
        let _ = self.shared.time.held(&self.clock_key(base));
        self.shared.time.sealed();
        let mut st = self.lock();
        st.sealed.push_back(SealedSegment {
            base,
            end,
            len,
            max_ts: index.max_timestamp,
            generation,
        });
        st.active = new;
        self.shared.counters.rolled();
        Ok(())
    }

    /// Creates (or recycles) the segment file starting at `base`, header durable.
    pub fn create_segment(&self, base: u64, generation: u32) -> Result<ActiveSegment> {
        create_segment(&self.shared, &self.dir, base, generation)
    }

    /// Whether a partition of `active_len` active bytes fits its retention limit, deleting
    /// old segments to make room.
    pub fn make_room(&self, active_len: u64) -> bool {
        let limit = self.retention.bytes();
        if limit == 0 {
            return true;
        }
        loop {
            let (total, oldest) = {
                let st = self.lock();
                let sealed: u64 = st.sealed.iter().map(|s| s.len).sum();
                (sealed + active_len, st.sealed.front().cloned())
            };
            if total <= limit {
                return true;
            }
            let Some(oldest) = oldest else { return true };
            if !self.deletable(&oldest) {
                return self.retention.drop_oldest();
            }
            if self.delete_oldest().is_err() {
                return false;
            }
        }
    }

    /// Whether every cursor of this partition is past `seg` (or the operator chose drop-oldest).
    fn deletable(&self, seg: &SealedSegment) -> bool {
        self.retention.drop_oldest()
            || self
                .shared
                .cursors
                .min_offset(&self.topic, self.id)
                .is_none_or(|cursor| cursor >= seg.end)
    }

    /// How often the writer checks age retention: every [`RETENTION_TICK`], or a tenth of a
    /// short `retention.age` (at least a second).
    pub fn retention_tick(&self) -> Duration {
        let age_ms = self.retention.age_ms();
        let tenth = Duration::from_millis(age_ms / 10);
        match age_ms {
            0 => RETENTION_TICK,
            _ => tenth.clamp(Duration::from_secs(1), RETENTION_TICK),
        }
    }

    /// Deletes segments held longer than the age limit, then past the size limit (`extra`
    /// pending bytes). Age is the log's elapsed running time since the segment's newest record
    /// was written (`clock.rs`), never the wall clock: a clock step neither ages a segment nor
    /// keeps it young.
    pub fn enforce_retention(&self, extra: u64) {
        let age = Duration::from_millis(self.retention.age_ms());
        if !age.is_zero() {
            self.shared.counters.age_checked();
            loop {
                let oldest = self.lock().sealed.front().cloned();
                let expired = oldest.filter(|s| {
                    self.shared.time.held(&self.clock_key(s.base)) >= age && self.deletable(s)
                });
                if expired.is_none() || self.delete_oldest().is_err() {
                    break;
                }
            }
        }
        let active = self.lock().active.len;
        let _ = self.make_room(active + extra);
    }

    /// Removes the oldest sealed segment; its `.log` becomes the spare for the next roll.
    fn delete_oldest(&self) -> Result<()> {
        let Some(seg) = self.lock().sealed.pop_front() else {
            return Ok(());
        };
        let fs = &*self.shared.fs;
        let log = segment::log_path(&self.dir, seg.base);
        let recycle = self.dir.join(RECYCLE_NAME);
        let paths = [
            segment::index_path(&self.dir, seg.base),
            segment::time_index_path(&self.dir, seg.base),
            log.clone(),
        ];
        for path in &paths {
            self.shared.cache.forget(path);
        }
        let recycled = !fs.exists(&recycle) && fs.rename(&log, &recycle).is_ok();
        for path in &paths {
            if fs.exists(path) {
                fs.remove(path)
                    .map_err(|e| LogError::io("remove", path, e))?;
            }
        }
        self.shared
            .counters
            .timed_sync(|| fs.sync_dir(&self.dir))
            .map_err(|e| LogError::io("fsync directory", &self.dir, e))?;
        self.shared.counters.deleted(recycled);
        self.shared.time.forget(&self.clock_key(seg.base));
        tracing::debug!(topic = %self.topic, partition = self.id, base = seg.base, recycled, "segment deleted");
        Ok(())
    }
}

/// Creates (or recycles) the segment file starting at `base`, header durable.
pub fn create_segment(
    shared: &Shared,
    dir: &Path,
    base: u64,
    generation: u32,
) -> Result<ActiveSegment> {
    let fs = &*shared.fs;
    let path = segment::log_path(dir, base);
    let recycle = dir.join(RECYCLE_NAME);
    let recycled = fs.exists(&recycle);
    let file: Arc<dyn WriteFile> = if recycled {
        fs.rename(&recycle, &path)
            .map_err(|e| LogError::io("rename", &recycle, e))?;
        fs.open_write(&path)
            .map_err(|e| LogError::io("open", &path, e))?
    } else {
        fs.create(&path)
            .map_err(|e| LogError::io("create", &path, e))?
    };
    let header = SegmentHeader {
        generation,
        base_offset: base,
    };
    if let Err(e) = file.write_at(0, &header.encode()) {
        // The segment never started: a full device gets its space back.
        drop(file);
        let _ = fs.remove(&path);
        return Err(LogError::io("write", &path, e));
    }
    shared.counters.wrote(SEGMENT_HEADER_LEN);
    // A recycled file was sealed at its exact length: every block up to it holds its old
    // batches, written. Its commits allocate unwritten extents only past it
    // (`Partition::allocate_ahead`); a new file is allocated by its first commit.
    let written_to = if recycled {
        file.len().unwrap_or(0).max(SEGMENT_HEADER_LEN as u64)
    } else {
        SEGMENT_HEADER_LEN as u64
    };
    let counters = &shared.counters;
    counters
        .timed_sync(|| file.sync_data())
        .map_err(|e| LogError::io("fdatasync", &path, e))?;
    counters
        .timed_sync(|| fs.sync_dir(dir))
        .map_err(|e| LogError::io("fsync directory", dir, e))?;
    Ok(ActiveSegment {
        base,
        generation,
        file,
        len: SEGMENT_HEADER_LEN as u64,
        end: base,
        index: IndexBuilder::new(shared.config.index_interval.0),
        written_to,
    })
}
