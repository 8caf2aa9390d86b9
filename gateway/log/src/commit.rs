//! The blocking stages of one group commit: encoding the gathered appends into batches of about
//! `BATCH_TARGET_LEN` and writing them with one write call past the durable end (the write
//! stage), and, once an
//! fdatasync that started after that write has returned, making the batch visible to readers
//! and answering its appends (the publish stage). The writer task in `writer.rs` decides when
//! each stage runs; the fdatasync itself is the `Fs` file's `sync_data`.
//!
//! It must never answer an append of the `sync` policy before its bytes are durable, and never
//! hold the partition's lock across a file operation.

use std::collections::VecDeque;
use std::path::Path;

use tokio::sync::oneshot;

use super::Record;
use super::batch::{
    self, Codec, MAX_BATCH_LEN, PRODUCER_SECTION_LEN, ProducerStamp, SEGMENT_HEADER_LEN,
};

/// Size a batch grows to before the commit starts the next one (a single larger append stays
/// one batch). Readers decode and check a whole batch to return any record of it, so this bounds
/// the cost of a random read; the framing it adds is 44 bytes per 64 KiB.
pub const BATCH_TARGET_LEN: u64 = 64 << 10;
/// How far ahead of a small commit the active segment's preallocated (unwritten) blocks are
/// zeroed: once per this many bytes, instead of at every commit, ext4 converts extents and
/// journals it (`docs/log-format.md`, "Wear at sensor rates").
pub const ZERO_AHEAD: u64 = 256 << 10;
/// A commit at least this large converts its own extents: zeroing ahead of it would cost more
/// device bytes than the journal commit it saves.
const ZERO_AHEAD_BELOW: u64 = 64 << 10;
/// Commits at least this large start their device writes as soon as they are written
/// (`WriteFile::start_writeback`), not only when their fdatasync starts.
const WRITEBACK_AHEAD_LEN: u64 = 64 << 10;
/// The zeros written ahead (up to a page boundary, then `ZERO_AHEAD`).
static ZEROS: [u8; ZERO_AHEAD as usize + 4096] = [0; ZERO_AHEAD as usize + 4096];
use super::error::{LogError, Result};
use super::partition::Partition;
use super::segment;

/// One append waiting for its commit.
#[derive(Debug)]
pub struct AppendRequest {
    pub records: Vec<Record>,
    /// `batch::encoded_len(&records)`, computed by the appending task (off the writer's path).
    pub len: u64,
    /// How the records arrived compressed: appends are gathered into one batch only with
    /// appends of the same codec, so a reader can serve a batch compressed as one.
    pub codec: Codec,
    /// The idempotent producer that sent the records: they get a batch of their own, stamped.
    pub producer: Option<ProducerStamp>,
    pub reply: oneshot::Sender<Result<u64>>,
}

impl AppendRequest {
    pub fn new(
        records: Vec<Record>,
        codec: Codec,
        producer: Option<ProducerStamp>,
        reply: oneshot::Sender<Result<u64>>,
    ) -> Self {
        let section = if producer.is_some() {
            PRODUCER_SECTION_LEN
        } else {
            0
        };
        let len = (batch::encoded_len(&records) + section) as u64;
        Self {
            records,
            len,
            codec,
            producer,
            reply,
        }
    }

    /// What the batch holding this append's records must share with every other append in
    /// it: the codec, and no producer (a stamped append is a batch alone).
    fn kind(&self) -> BatchKind {
        (self.codec, self.producer)
    }
}

/// The codec and producer stamp of a batch.
type BatchKind = (Codec, Option<ProducerStamp>);

/// Where the next commit is written: the end of everything written so far (durable or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tip {
    /// Byte position in the active segment.
    pub pos: u64,
    /// Offset of the next record.
    pub offset: u64,
}

/// The batches of one write to the active segment, waiting to be published.
#[derive(Debug)]
pub struct Written {
    pub pos: u64,
    pub len: u64,
    pub base: u64,
    pub count: u64,
    /// Each batch of the write, for the index.
    pub frames: Vec<Frame>,
    pub replies: Vec<(oneshot::Sender<Result<u64>>, u64)>,
}

/// One batch of a write: where it starts, its length, base offset and largest timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub pos: u64,
    pub len: u64,
    pub base: u64,
    pub count: u64,
    pub max_ts: i64,
}

impl Written {
    pub fn tip(&self) -> Tip {
        Tip {
            pos: self.pos + self.len,
            offset: self.base + self.count,
        }
    }

    /// Answers every append of the batch with a copy of `err`.
    pub fn fail(self, part: &Partition, err: &LogError) {
        for (reply, _) in self.replies {
            let _ = reply.send(Err(part.copy_error(err)));
        }
    }
}

/// What one write stage did.
#[derive(Debug)]
pub enum Step {
    /// A batch was written (more requests may remain).
    Written(Written),
    /// The next request needs a new segment: everything written must be synced first.
    Roll,
    /// Nothing to write: the requests were answered with errors.
    Answered,
}

/// After a commit of `len` bytes ending at `end`: if the next commit would land on
/// preallocated blocks not yet written (past `written_to`), and this commit was small, zeroes
/// the file from `end` to [`ZERO_AHEAD`] past the next page boundary (never past the file's
/// length, so a partly preallocated file is not grown). The zeros are flushed by the commit's
/// fdatasync, so ext4 converts those extents once with it, and the commits that follow flush
/// data pages only. Best effort: a failed write only leaves the blocks unwritten. Returns the
/// new `written_to` and the zeros written.
fn zero_ahead(
    file: &dyn super::fs::WriteFile,
    end: u64,
    len: u64,
    written_to: u64,
) -> (u64, usize) {
    const PAGE: u64 = 4096;
    if end + PAGE <= written_to {
        return (written_to, 0);
    }
    let unchanged = (written_to.max(end), 0);
    if len >= ZERO_AHEAD_BELOW {
        return unchanged;
    }
    let Ok(file_len) = file.len() else {
        return unchanged;
    };
    let to = (end.div_ceil(PAGE) * PAGE + ZERO_AHEAD).min(file_len);
    let count = usize::try_from(to.saturating_sub(end)).unwrap_or(0);
    match ZEROS.get(..count) {
        Some(zeros) if count > 0 && file.write_at(end, zeros).is_ok() => (to, count),
        _ => unchanged,
    }
}

impl Partition {
    /// Grows the allocation of the active segment `file` (starting at `base`) before a commit
    /// that ends at `end`, so the commit and the zeros written ahead of it
    /// ([`ZERO_AHEAD`](ZERO_AHEAD)) land on allocated blocks: to the next power
    /// of two past them up to [`ALLOCATION_STEP`](super::roll::ALLOCATION_STEP), then to the next multiple of it; at most
    /// `segment_bytes`.
    fn allocate_ahead(&self, file: &dyn super::fs::WriteFile, base: u64, end: u64) {
        let segment_bytes = self.shared.config.segment_bytes.0;
        let Ok(allocated) = file.len() else { return };
        let needed = end.saturating_add(ZERO_AHEAD).min(segment_bytes);
        if needed <= allocated {
            return;
        }
        let to = if needed <= super::roll::ALLOCATION_STEP {
            needed.next_power_of_two()
        } else {
            needed
                .div_ceil(super::roll::ALLOCATION_STEP)
                .saturating_mul(super::roll::ALLOCATION_STEP)
        };
        let path = segment::log_path(&self.dir, base);
        super::roll::preallocate(&self.shared, &self.dir, &path, file, to);
    }

    fn invalid(&self, reason: &str) -> LogError {
        LogError::InvalidAppend {
            topic: self.topic.clone(),
            reason: reason.to_owned(),
        }
    }

    pub fn failed_error(&self, reason: &str) -> LogError {
        LogError::Failed {
            topic: self.topic.clone(),
            partition: self.id,
            reason: reason.to_owned(),
        }
    }

    /// Takes requests from the front of `queue` into batches of about `BATCH_TARGET_LEN` (never
    /// splitting a request) written at `tip` with one write call (`buf` is the reused encoding
    /// buffer). Stops before a request that needs a roll or would make the write larger than
    /// 16 MiB; rejected requests are answered at once.
    pub fn write_stage(
        &self,
        queue: &mut VecDeque<AppendRequest>,
        tip: Tip,
        buf: &mut Vec<u8>,
    ) -> Step {
        if let Some(reason) = self.lock().failed.clone() {
            for r in queue.drain(..) {
                let _ = r.reply.send(Err(self.failed_error(&reason)));
            }
            return Step::Answered;
        }
        let segment_bytes = self.shared.config.segment_bytes.0;
        let mut records: Vec<Record> = Vec::new();
        // Record count and kind of each batch, in order.
        let mut counts: Vec<(usize, BatchKind)> = Vec::new();
        let mut batch_estimate = 0u64;
        let mut replies = Vec::new();
        let mut estimate = 0u64;
        while let Some(request) = queue.pop_front() {
            let len = request.len;
            if request.records.is_empty() || len > MAX_BATCH_LEN as u64 {
                let reason = if request.records.is_empty() {
                    "no records"
                } else {
                    "batch larger than 16 MiB"
                };
                let _ = request.reply.send(Err(self.invalid(reason)));
                continue;
            }
            let start = tip.pos + estimate;
            let roll = start + len > segment_bytes && start > SEGMENT_HEADER_LEN as u64;
            if roll || estimate + len > MAX_BATCH_LEN as u64 {
                queue.push_front(request);
                if records.is_empty() {
                    return Step::Roll;
                }
                break;
            }
            if !self.make_room(tip.pos + estimate + len) {
                self.note_full(true);
                let _ = request.reply.send(Err(LogError::Full {
                    topic: self.topic.clone(),
                    partition: self.id,
                }));
                continue;
            }
            self.note_full(false);
            match counts.last_mut() {
                Some((count, kind))
                    if batch_estimate + len <= BATCH_TARGET_LEN
                        && kind.1.is_none()
                        && *kind == request.kind() =>
                {
                    *count += request.records.len();
                    batch_estimate += len;
                }
                _ => {
                    counts.push((request.records.len(), request.kind()));
                    batch_estimate = len;
                }
            }
            replies.push((request.reply, tip.offset + records.len() as u64));
            if records.is_empty() {
                // Nearly always one request per stage: its records are taken, not moved one by
                // one into a new vector (issue #29).
                records = request.records;
            } else {
                records.extend(request.records);
            }
            estimate += len;
        }
        if records.is_empty() {
            return Step::Answered;
        }
        let floor = self.monotonic_timestamps(&mut records);
        let written = Written {
            pos: tip.pos,
            len: 0,
            base: tip.offset,
            count: records.len() as u64,
            frames: Vec::with_capacity(counts.len()),
            replies,
        };
        let step = self.write_batches(written, &records, &counts, buf);
        if matches!(step, Step::Written(_)) {
            self.keep_ts_floor(floor);
        }
        step
    }

    /// Encodes `records` as consecutive batches of `counts` records each (with its codec and
    /// producer stamp) and writes them at
    /// `w.pos` with one write call.
    fn write_batches(
        &self,
        mut w: Written,
        records: &[Record],
        counts: &[(usize, BatchKind)],
        buf: &mut Vec<u8>,
    ) -> Step {
        let (file, base, generation, written_to) = {
            let st = self.lock();
            (
                std::sync::Arc::clone(&st.active.file),
                st.active.base,
                st.active.generation,
                st.active.written_to,
            )
        };
        buf.clear();
        let (mut rest, mut first) = (records, w.base);
        for &(count, (codec, producer)) in counts {
            let (these, after) = rest.split_at(count.min(rest.len()));
            let start = buf.len();
            let max_ts =
                batch::encode_batch_with(first, generation, codec, producer.as_ref(), these, buf);
            w.frames.push(Frame {
                pos: w.pos + start as u64,
                len: (buf.len() - start) as u64,
                base: first,
                count: these.len() as u64,
                max_ts,
            });
            (rest, first) = (after, first + these.len() as u64);
        }
        w.len = buf.len() as u64;
        self.allocate_ahead(&*file, base, w.pos + w.len);
        self.shared.counters.wrote(buf.len());
        if let Err(e) = file.write_at(w.pos, buf) {
            // Nothing was published: the next commit overwrites these bytes.
            let path = segment::log_path(&self.dir, base);
            if super::fs::is_no_space(&e) {
                // A full device may have taken whole batches of this write: cut them off, or
                // a recovery would take unacknowledged records as stored. Cutting the
                // preallocated tail also gives its space back.
                let _ = file.set_len(w.pos);
            }
            let err = super::roll::write_error(&self.topic, self.id, "write", &path, e);
            w.fail(self, &err);
            return Step::Answered;
        }
        if w.len >= WRITEBACK_AHEAD_LEN {
            // Under load the previous commit's fdatasync is usually still running: start this
            // one's device writes now, so its own fdatasync finds them under way (a hint; an
            // error here changes nothing, the fdatasync still decides).
            let _ = file.start_writeback(w.pos, w.len);
        }
        let (written_to, zeros) = zero_ahead(&*file, w.pos + w.len, w.len, written_to);
        self.shared.counters.wrote(zeros);
        self.lock().active.written_to = written_to;
        Step::Written(w)
    }

    /// Makes written batches visible to readers (in order) and answers their appends: under
    /// `sync` only after an fdatasync that started after their write returned.
    pub fn publish_written(&self, batches: Vec<Written>) {
        let Some(last) = batches.last() else { return };
        let end = last.tip().offset;
        let base = {
            let mut st = self.lock();
            for w in &batches {
                for frame in &w.frames {
                    let rel = u32::try_from(frame.base - st.active.base).unwrap_or(u32::MAX);
                    let at = u32::try_from(frame.pos).unwrap_or(u32::MAX);
                    st.active.index.add_batch(rel, at, frame.len, frame.max_ts);
                }
                st.active.len = w.pos + w.len;
                st.active.end = w.base + w.count;
            }
            st.active.base
        };
        self.shared.time.wrote(self.clock_key(base));
        self.publish(end);
        for w in batches {
            self.shared.counters.committed(w.count);
            for (reply, base) in w.replies {
                let _ = reply.send(Ok(base));
            }
        }
    }

    /// The committed end: where the next write goes when nothing is pending.
    pub fn committed_tip(&self) -> Tip {
        let st = self.lock();
        Tip {
            pos: st.active.len,
            offset: st.active.end,
        }
    }

    /// Marks the partition failed after a sync error and builds the error.
    pub fn fail(&self, path: &Path, err: std::io::Error) -> LogError {
        let reason = format!("fdatasync {}: {err}", path.display());
        tracing::error!(topic = %self.topic, partition = self.id, %reason, "partition stopped");
        self.lock().failed = Some(reason);
        LogError::io("fdatasync", path, err)
    }

    pub fn copy_error(&self, err: &LogError) -> LogError {
        match err {
            LogError::Io { op, path, source } => LogError::Io {
                op,
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            LogError::NoSpace {
                topic,
                partition,
                op,
                path,
            } => LogError::NoSpace {
                topic: topic.clone(),
                partition: *partition,
                op,
                path: path.clone(),
            },
            other => self.failed_error(&other.to_string()),
        }
    }

    /// fdatasync of the active segment; marks the partition failed when it fails.
    pub fn sync_active(&self) -> Result<()> {
        let (file, base) = {
            let st = self.lock();
            (std::sync::Arc::clone(&st.active.file), st.active.base)
        };
        self.shared
            .counters
            .timed_sync(|| file.sync_data())
            .map_err(|err| self.fail(&segment::log_path(&self.dir, base), err))
    }
}

#[cfg(test)]
mod test;
