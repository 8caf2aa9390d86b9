//! The single writer of a partition: a task that gathers concurrent appends into one commit
//! (one write and, under `sync`, one fdatasync per window bounded by `flush.max_delay` and
//! `flush.max_bytes`), rolls segments, applies retention and answers each append with its base
//! offset once durable under the topic's policy.
//!
//! Only this task writes the partition's files; readers see a commit only after it is durable
//! (`sync`) or written (`periodic`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::Record;
use super::batch::{self, MAX_BATCH_LEN, SEGMENT_HEADER_LEN, SegmentHeader};
use super::config::{Durability, OnFull};
use super::error::{LogError, Result};
use super::fs::{self, WriteFile};
use super::index::IndexBuilder;
use super::partition::{ActiveSegment, Partition, SealedSegment, Shared};
use super::segment;

/// Name of the spare segment file kept for reuse after retention deleted a segment.
pub const RECYCLE_NAME: &str = "recycle.log";
/// How often an idle writer checks age retention.
const RETENTION_TICK: Duration = Duration::from_secs(30);

/// One append waiting for its commit.
#[derive(Debug)]
pub struct AppendRequest {
    pub records: Vec<Record>,
    pub reply: oneshot::Sender<Result<u64>>,
}

/// A batch encoded into the commit buffer, not yet durable.
struct Pending {
    reply: oneshot::Sender<Result<u64>>,
    base: u64,
    pos: u64,
    len: u64,
    max_ts: i64,
    count: u64,
}

/// Runs the writer until every sender is dropped, then makes everything durable.
pub async fn run(part: Arc<Partition>, mut rx: mpsc::Receiver<AppendRequest>) {
    let config = &part.shared.config;
    let periodic = part.settings.durability == Durability::Periodic;
    let mut dirty = false;
    let mut last_sync = Instant::now();
    let mut last_commit: Option<Instant> = None;
    loop {
        let wake = if dirty {
            last_sync + config.sync_interval.0
        } else {
            Instant::now() + RETENTION_TICK
        };
        let first = tokio::select! {
            request = rx.recv() => request,
            () = tokio::time::sleep_until(wake) => {
                let p = Arc::clone(&part);
                let _ = tokio::task::spawn_blocking(move || {
                    if dirty { p.sync_now(); }
                    p.enforce_retention(0);
                }).await;
                dirty = false;
                last_sync = Instant::now();
                continue;
            }
        };
        let Some(first) = first else { break };
        let requests = gather(&part, &mut rx, first, last_commit).await;
        last_commit = Some(Instant::now());
        let p = Arc::clone(&part);
        let _ = tokio::task::spawn_blocking(move || p.commit(requests)).await;
        dirty |= periodic;
    }
    if dirty {
        let _ = tokio::task::spawn_blocking(move || part.sync_now()).await;
    }
}

/// Collects the requests of one commit window. The window runs from the previous commit's start,
/// so commits start at most once per `max_delay` and appends that queued up while the previous
/// commit was writing and syncing do not wait a second window.
async fn gather(
    part: &Partition,
    rx: &mut mpsc::Receiver<AppendRequest>,
    first: AppendRequest,
    last_commit: Option<Instant>,
) -> Vec<AppendRequest> {
    let flush = &part.shared.config.flush;
    let size = |r: &AppendRequest| batch::encoded_len(&r.records) as u64;
    let mut bytes = size(&first);
    let mut requests = vec![first];
    let window = match part.settings.durability {
        Durability::Sync => flush.max_delay.0,
        Durability::Periodic => Duration::ZERO,
    };
    let deadline = last_commit.map_or_else(Instant::now, |at| at + window);
    while bytes < flush.max_bytes.0 {
        let next = match rx.try_recv() {
            Ok(request) => Some(request),
            Err(_) if window.is_zero() => None,
            Err(_) => tokio::select! {
                request = rx.recv() => request,
                () = tokio::time::sleep_until(deadline) => None,
            },
        };
        let Some(request) = next else { break };
        bytes += size(&request);
        requests.push(request);
    }
    requests
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Partition {
    fn invalid(&self, reason: &str) -> LogError {
        LogError::InvalidAppend {
            topic: self.topic.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Writes, syncs and publishes one commit's requests, answering each.
    pub fn commit(&self, requests: Vec<AppendRequest>) {
        if let Some(reason) = self.lock().failed.clone() {
            for r in requests {
                let _ = r.reply.send(Err(self.failed_error(&reason)));
            }
            return;
        }
        let (mut pos, mut next, mut generation) = {
            let st = self.lock();
            (st.active.len, st.active.end, st.active.generation)
        };
        let mut buf = Vec::new();
        let mut pending: Vec<Pending> = Vec::new();
        let segment_bytes = self.shared.config.segment_bytes.0;
        for request in requests {
            let len = batch::encoded_len(&request.records) as u64;
            if request.records.is_empty() {
                let _ = request.reply.send(Err(self.invalid("no records")));
                continue;
            }
            if len > MAX_BATCH_LEN as u64 {
                let _ = request
                    .reply
                    .send(Err(self.invalid("batch larger than 16 MiB")));
                continue;
            }
            let start = pos + buf.len() as u64;
            if start + len > segment_bytes && start > SEGMENT_HEADER_LEN as u64 {
                let flushed = self.flush(&mut buf, std::mem::take(&mut pending));
                let rolled = flushed.and_then(|()| self.roll());
                let st = self.lock();
                (pos, next, generation) = (st.active.len, st.active.end, st.active.generation);
                drop(st);
                if let Err(err) = rolled {
                    let _ = request.reply.send(Err(err));
                    continue;
                }
            }
            if !self.make_room(pos + buf.len() as u64 + len) {
                let _ = request.reply.send(Err(LogError::Full {
                    topic: self.topic.clone(),
                    partition: self.id,
                }));
                continue;
            }
            let at = pos + buf.len() as u64;
            batch::encode_batch(next, generation, &request.records, &mut buf);
            let count = request.records.len() as u64;
            pending.push(Pending {
                reply: request.reply,
                base: next,
                pos: at,
                len,
                max_ts: request
                    .records
                    .iter()
                    .map(|r| r.timestamp_ms)
                    .max()
                    .unwrap_or(i64::MIN),
                count,
            });
            next += count;
        }
        let _ = self.flush(&mut buf, pending);
    }

    fn failed_error(&self, reason: &str) -> LogError {
        LogError::Failed {
            topic: self.topic.clone(),
            partition: self.id,
            reason: reason.to_owned(),
        }
    }

    /// Writes `buf` at the committed end, syncs (policy `sync`), publishes and answers.
    fn flush(&self, buf: &mut Vec<u8>, pending: Vec<Pending>) -> Result<()> {
        let Some(first) = pending.first() else {
            return Ok(());
        };
        let (file, at) = {
            let st = self.lock();
            (Arc::clone(&st.active.file), first.pos)
        };
        let path = segment::log_path(&self.dir, self.lock().active.base);
        let counters = &self.shared.counters;
        let written = file
            .write_at(at, buf)
            .map_err(|e| LogError::io("write", &path, e));
        counters.wrote(buf.len());
        let synced = written.and_then(|()| {
            if self.settings.durability == Durability::Sync {
                counters
                    .timed_sync(|| file.sync_data())
                    .map_err(|e| self.fail(&path, e))
            } else {
                Ok(())
            }
        });
        buf.clear();
        if let Err(err) = synced {
            // Nothing was published: the next commit overwrites these bytes.
            for p in pending {
                let _ = p.reply.send(Err(self.copy_error(&err)));
            }
            return Err(err);
        }
        let records: u64 = pending.iter().map(|p| p.count).sum();
        let end = {
            let mut st = self.lock();
            for p in &pending {
                let rel = u32::try_from(p.base - st.active.base).unwrap_or(u32::MAX);
                let at = u32::try_from(p.pos).unwrap_or(u32::MAX);
                st.active.index.add_batch(rel, at, p.len, p.max_ts);
                st.active.len = p.pos + p.len;
                st.active.end = p.base + p.count;
            }
            st.active.end
        };
        counters.committed(records);
        self.publish(end);
        for p in pending {
            let _ = p.reply.send(Ok(p.base));
        }
        Ok(())
    }

    /// Marks the partition failed after a sync error and builds the error.
    fn fail(&self, path: &Path, err: std::io::Error) -> LogError {
        let reason = format!("fdatasync {}: {err}", path.display());
        tracing::error!(topic = %self.topic, partition = self.id, %reason, "partition stopped");
        self.lock().failed = Some(reason);
        LogError::io("fdatasync", path, err)
    }

    fn copy_error(&self, err: &LogError) -> LogError {
        match err {
            LogError::Io { op, path, source } => LogError::Io {
                op,
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            other => self.failed_error(&other.to_string()),
        }
    }

    /// fdatasync of the active segment (periodic policy and close).
    pub fn sync_now(&self) {
        let (file, base) = {
            let st = self.lock();
            (Arc::clone(&st.active.file), st.active.base)
        };
        let synced = self.shared.counters.timed_sync(|| file.sync_data());
        if let Err(err) = synced {
            let _ = self.fail(&segment::log_path(&self.dir, base), err);
        }
    }

    /// Seals the active segment (exact length, index files) and starts the next one.
    fn roll(&self) -> Result<()> {
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
                .timed_sync(|| fs::write_atomic(fs, &path, &data))
                .map_err(io("write index", &path))?;
        }
        let new = self.create_segment(end, generation.wrapping_add(1))?;
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
    fn make_room(&self, active_len: u64) -> bool {
        let limit = self.settings.retention_bytes;
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
                return self.settings.on_full == OnFull::DropOldest;
            }
            if self.delete_oldest().is_err() {
                return false;
            }
        }
    }

    /// Whether every cursor of this partition is past `seg` (or the operator chose drop-oldest).
    fn deletable(&self, seg: &SealedSegment) -> bool {
        self.settings.on_full == OnFull::DropOldest
            || self
                .shared
                .cursors
                .min_offset(&self.topic, self.id)
                .is_none_or(|cursor| cursor >= seg.end)
    }

    /// Deletes segments past the age limit, then past the size limit (`extra` pending bytes).
    pub fn enforce_retention(&self, extra: u64) {
        let age = self.settings.retention_age_ms;
        if age > 0 {
            let cutoff = now_ms().saturating_sub(i64::try_from(age).unwrap_or(i64::MAX));
            loop {
                let oldest = self.lock().sealed.front().cloned();
                let expired = oldest.filter(|s| s.max_ts < cutoff && self.deletable(s));
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
    let file: Arc<dyn WriteFile> = if fs.exists(&recycle) {
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
    file.write_at(0, &header.encode())
        .map_err(|e| LogError::io("write", &path, e))?;
    shared.counters.wrote(SEGMENT_HEADER_LEN);
    file.preallocate(shared.config.segment_bytes.0)
        .map_err(|e| LogError::io("preallocate", &path, e))?;
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
    })
}
