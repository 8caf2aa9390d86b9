//! Opening a partition directory after a clean or unclean stop. Sealed segments are trusted:
//! only their index files are checked against the segment (length, end offset, CRC) and rebuilt
//! when missing or stale. The active (last) segment is validated batch by batch: a damaged
//! batch with valid ones after it is skipped, counted and left on disk; only the tail after the
//! last valid batch is truncated. Recovery reads at most one segment.
//!
//! Recovery never deletes a segment and never rewrites bytes before the last valid batch. The
//! format versions were checked before it runs (`datadir.rs`); it refuses, never repairs, a
//! segment header of a newer format.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::batch::{SEGMENT_HEADER_LEN, SegmentHeader};
use super::config::TopicSettings;
use super::error::{LogError, Result};
use super::fs::{self, Fs};
use super::index::{IndexBuilder, IndexView};
use super::partition::{ActiveSegment, PartState, Partition, SealedSegment, Shared};
use super::segment::{self, End};
use super::writer;

/// Opens (creating if missing) partition `id` of `topic` in `dir`.
pub fn open_partition(
    topic: &str,
    id: u32,
    dir: PathBuf,
    settings: TopicSettings,
    shared: Arc<Shared>,
) -> Result<Partition> {
    let fs = &*shared.fs;
    fs.create_dir_all(&dir)
        .map_err(|e| LogError::io("create directory", &dir, e))?;
    let names = fs
        .list_dir(&dir)
        .map_err(|e| LogError::io("list", &dir, e))?;
    for name in names.iter().filter(|n| n.ends_with(".tmp")) {
        let path = dir.join(name);
        fs.remove(&path)
            .map_err(|e| LogError::io("remove", &path, e))?;
    }
    let bases: Vec<u64> = names
        .iter()
        .filter_map(|n| segment::parse_log_name(n))
        .collect();
    let mut sealed = VecDeque::new();
    for (i, base) in bases.iter().enumerate() {
        if let Some(next) = bases.get(i + 1) {
            sealed.push_back(open_sealed(&shared, &dir, *base, *next)?);
        }
    }
    let active = match bases.last() {
        Some(base) => {
            let previous = sealed.back().map_or(0, |s: &SealedSegment| s.generation);
            open_active(&shared, &dir, *base, previous)?
        }
        None => writer::create_segment(&shared, &dir, 0, 1)?,
    };
    let state = PartState {
        sealed,
        active,
        failed: None,
    };
    Ok(Partition::new(
        topic.to_owned(),
        id,
        dir,
        settings,
        shared,
        state,
    ))
}

/// The generation of a sealed segment's batches: its header's, or, when the header is damaged
/// and its batches intact, theirs (`segment::header`, the rule every reader follows); 0 when
/// neither can be read.
fn sealed_generation(fs: &dyn Fs, path: &Path, base: u64) -> u32 {
    let Ok(file) = fs.open_read(path) else {
        return 0;
    };
    match segment::header(file.bytes(), base) {
        Ok((header, None)) => header.generation,
        Ok((header, Some(damage))) => {
            tracing::error!(segment = %path.display(), reason = %damage.reason, generation = header.generation, "damaged header of a sealed segment, its batches intact: reads take the generation from them");
            header.generation
        }
        Err(_) => 0,
    }
}

/// Describes a sealed segment, rebuilding its indexes if they do not match it.
fn open_sealed(shared: &Shared, dir: &Path, base: u64, next: u64) -> Result<SealedSegment> {
    let fs = &*shared.fs;
    let log = segment::log_path(dir, base);
    let len = fs
        .file_len(&log)
        .map_err(|e| LogError::io("stat", &log, e))?;
    let generation = sealed_generation(fs, &log, base);
    let offsets = fs.read(&segment::index_path(dir, base)).ok();
    let times = fs.read(&segment::time_index_path(dir, base)).ok();
    let valid = |bytes: &Option<Vec<u8>>, time| {
        bytes
            .as_deref()
            .and_then(|b| IndexView::parse(b, time).ok())
            .map(|v| v.header)
            .filter(|h| h.log_len == len && h.end_offset == next)
    };
    if let (Some(_), Some(header)) = (valid(&offsets, false), valid(&times, true)) {
        return Ok(SealedSegment {
            base,
            end: next,
            len,
            max_ts: header.max_timestamp,
            generation,
        });
    }
    tracing::info!(segment = %log.display(), "rebuilding missing or stale index");
    let mapped = fs
        .open_read(&log)
        .map_err(|e| LogError::io("read", &log, e))?;
    let index = match segment::scan(mapped.bytes(), base, shared.config.index_interval.0) {
        Ok(scan) => {
            if let Some(damage) = scan.first_damage() {
                tracing::error!(segment = %log.display(), position = damage.position, reason = %damage.reason, "sealed segment damaged; reads skip the damage");
            }
            scan.index
        }
        Err(damage) => {
            tracing::error!(segment = %log.display(), reason = %damage.reason, "sealed segment unreadable");
            IndexBuilder::new(shared.config.index_interval.0)
        }
    };
    let (offsets, times) = index.encode(len, next);
    for (path, data) in [
        (segment::index_path(dir, base), offsets),
        (segment::time_index_path(dir, base), times),
    ] {
        shared.counters.wrote(data.len());
        match shared
            .counters
            .timed_sync(|| fs::write_atomic(fs, &path, &data, fs::NewFile::Plain))
        {
            Ok(()) => {}
            // Indexes are derived: on a full device reads scan without them until a later
            // start rebuilds them.
            Err(e) if fs::is_no_space(&e) => {
                tracing::warn!(index = %path.display(), "no space to rebuild the index; reads scan the segment");
            }
            Err(e) => return Err(LogError::io("write index", &path, e)),
        }
    }
    Ok(SealedSegment {
        base,
        end: next,
        len,
        max_ts: if index.offsets.is_empty() {
            i64::MAX
        } else {
            index.max_timestamp
        },
        generation,
    })
}

/// Logs what recovery found in the active segment. Damage followed by valid batches is kept on
/// disk (for `tern log verify`) and skipped by readers; only what follows the last valid batch is
/// cut, and zeros or an older generation there are the normal end of a segment, not a torn one.
fn report_active(shared: &Shared, path: &Path, scan: &segment::Scan) {
    for skipped in &scan.skipped {
        shared.counters.corrupt_batch();
        tracing::error!(
            segment = %path.display(),
            position = skipped.damage.position,
            resume = skipped.resume,
            lost = skipped.lost.end - skipped.lost.start,
            from = skipped.lost.start,
            reason = %skipped.damage.reason,
            "damaged batch in the active segment: skipped, the valid batches after it are kept"
        );
    }
    match &scan.end {
        End::Clean => {
            tracing::debug!(segment = %path.display(), position = scan.valid_len, "segment ends after its last batch");
        }
        End::Stale(damage) => {
            tracing::debug!(segment = %path.display(), position = damage.position, "older bytes of a recycled file after the last batch");
        }
        End::Torn(damage) => {
            tracing::info!(segment = %path.display(), position = damage.position, reason = %damage.reason, "truncating torn tail (an interrupted write)");
        }
    }
}

/// Validates the active segment, truncating its torn tail; repairs a torn file header.
fn open_active(
    shared: &Shared,
    dir: &Path,
    base: u64,
    previous_generation: u32,
) -> Result<ActiveSegment> {
    let fs = &*shared.fs;
    let path = segment::log_path(dir, base);
    for stale in [
        segment::index_path(dir, base),
        segment::time_index_path(dir, base),
    ] {
        if fs.exists(&stale) {
            fs.remove(&stale)
                .map_err(|e| LogError::io("remove", &stale, e))?;
        }
    }
    let mapped = fs
        .open_read(&path)
        .map_err(|e| LogError::io("read", &path, e))?;
    if let Some(refusal) = SegmentHeader::decode(mapped.bytes())
        .err()
        .and_then(|err| LogError::version("segment", &path, &err))
    {
        return Err(refusal);
    }
    let file = fs
        .open_write(&path)
        .map_err(|e| LogError::io("open", &path, e))?;
    let io = |op: &'static str| {
        let path = path.clone();
        move |e| LogError::io(op, path, e)
    };
    let mut mapped = mapped;
    if let Ok((header, Some(_))) = segment::header(mapped.bytes(), base) {
        tracing::error!(segment = %path.display(), generation = header.generation, "damaged header of the active segment, its batches intact: header rewritten from them");
        file.write_at(0, &header.encode()).map_err(io("write"))?;
        mapped = fs
            .open_read(&path)
            .map_err(|e| LogError::io("read", &path, e))?;
    }
    let file_len = mapped.bytes().len() as u64;
    let scanned = segment::scan(mapped.bytes(), base, shared.config.index_interval.0);
    drop(mapped);
    let (active, valid_len) = match scanned {
        Ok(scan) => {
            report_active(shared, &path, &scan);
            let active = ActiveSegment {
                base,
                generation: scan.header.generation,
                file: Arc::clone(&file),
                len: scan.valid_len,
                end: scan.end_offset,
                index: scan.index,
                // The tail is cut below; the next commit allocates again: unwritten from here.
                written_to: scan.valid_len,
            };
            (active, scan.valid_len)
        }
        Err(damage) => {
            tracing::warn!(segment = %path.display(), reason = %damage.reason, "rewriting torn segment header");
            let header = SegmentHeader {
                generation: previous_generation.wrapping_add(1),
                base_offset: base,
            };
            file.set_len(0).map_err(io("truncate"))?;
            file.write_at(0, &header.encode()).map_err(io("write"))?;
            let active = ActiveSegment {
                base,
                generation: header.generation,
                file: Arc::clone(&file),
                len: SEGMENT_HEADER_LEN as u64,
                end: base,
                index: IndexBuilder::new(shared.config.index_interval.0),
                written_to: SEGMENT_HEADER_LEN as u64,
            };
            (active, SEGMENT_HEADER_LEN as u64)
        }
    };
    if file_len != valid_len {
        file.set_len(valid_len).map_err(io("truncate"))?;
    }
    shared
        .counters
        .timed_sync(|| file.sync_data())
        .map_err(io("fdatasync"))?;
    shared
        .counters
        .timed_sync(|| fs.sync_dir(dir))
        .map_err(|e| LogError::io("fsync directory", dir, e))?;
    Ok(active)
}
