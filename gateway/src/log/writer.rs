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

/// The appends of one commit that share one batch, not yet written.
struct Group {
    /// Offset of the first record.
    base: u64,
    records: Vec<Record>,
    replies: Vec<(oneshot::Sender<Result<u64>>, u64)>,
    /// Upper bound of the encoded size (each append's size as its own batch).
    estimate: u64,
}

impl Group {
    fn new(base: u64) -> Self {
        Self {
            base,
            records: Vec::new(),
            replies: Vec::new(),
            estimate: 0,
        }
    }

    fn fail(self, err: impl Fn() -> LogError) {
        for (reply, _) in self.replies {
            let _ = reply.send(Err(err()));
        }
    }
}

/// Runs the writer until every sender is dropped, then makes everything durable.
pub async fn run(part: Arc<Partition>, mut rx: mpsc::Receiver<AppendRequest>) {
    let sync_interval = part.shared.config.sync_interval.0;
    let periodic = part.settings.durability == Durability::Periodic;
    // Periodic policy: when the written-but-unsynced data must be synced.
    let mut sync_due: Option<Instant> = None;
    let mut retention_due = Instant::now() + RETENTION_TICK;
    loop {
        let wake = sync_due.map_or(retention_due, |due| due.min(retention_due));
        let first = tokio::select! {
            biased;
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                let sync = sync_due.is_some_and(|due| due <= now);
                let retain = retention_due <= now;
                let p = Arc::clone(&part);
                let _ = tokio::task::spawn_blocking(move || {
                    if sync {
                        p.sync_now();
                    }
                    if retain {
                        p.enforce_retention(0);
                    }
                })
                .await;
                if sync {
                    sync_due = None;
                }
                if retain {
                    retention_due = now + RETENTION_TICK;
                }
                continue;
            }
            request = rx.recv() => request,
        };
        let Some(first) = first else { break };
        let requests = gather(&part, &mut rx, first).await;
        let p = Arc::clone(&part);
        let _ = tokio::task::spawn_blocking(move || p.commit(requests)).await;
        if periodic && sync_due.is_none() {
            sync_due = Some(Instant::now() + sync_interval);
        }
    }
    if sync_due.is_some() {
        let _ = tokio::task::spawn_blocking(move || part.sync_now()).await;
    }
}

/// Collects the requests of one commit window.
async fn gather(
    part: &Partition,
    rx: &mut mpsc::Receiver<AppendRequest>,
    first: AppendRequest,
) -> Vec<AppendRequest> {
    let flush = &part.shared.config.flush;
    let size = |r: &AppendRequest| batch::encoded_len(&r.records) as u64;
    let mut bytes = size(&first);
    let mut requests = vec![first];
    let window = match part.settings.durability {
        Durability::Sync => flush.max_delay.0,
        Durability::Periodic => Duration::ZERO,
    };
    let deadline = Instant::now() + window;
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

    /// Writes, syncs and publishes one commit's requests, answering each. The appends of a
    /// commit share one batch (one header, one CRC) unless a roll or the batch limit splits it.
    pub fn commit(&self, requests: Vec<AppendRequest>) {
        if let Some(reason) = self.lock().failed.clone() {
            for r in requests {
                let _ = r.reply.send(Err(self.failed_error(&reason)));
            }
            return;
        }
        let mut group = Group::new(self.lock().active.end);
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
            let start = self.lock().active.len + group.estimate;
            let roll = start + len > segment_bytes && start > SEGMENT_HEADER_LEN as u64;
            if roll || group.estimate + len > MAX_BATCH_LEN as u64 {
                let flushed = self.flush(std::mem::replace(&mut group, Group::new(0)));
                let rolled = flushed.and_then(|()| if roll { self.roll() } else { Ok(()) });
                group = Group::new(self.lock().active.end);
                if let Err(err) = rolled {
                    let _ = request.reply.send(Err(err));
                    continue;
                }
            }
            let active_len = self.lock().active.len;
            if !self.make_room(active_len + group.estimate + len) {
                let _ = request.reply.send(Err(LogError::Full {
                    topic: self.topic.clone(),
                    partition: self.id,
                }));
                continue;
            }
            let base = group.base + group.records.len() as u64;
            group.replies.push((request.reply, base));
            group.records.extend(request.records);
            group.estimate += len;
        }
        let _ = self.flush(group);
    }

    fn failed_error(&self, reason: &str) -> LogError {
        LogError::Failed {
            topic: self.topic.clone(),
            partition: self.id,
            reason: reason.to_owned(),
        }
    }

    /// Writes `group` as one batch at the committed end, syncs (policy `sync`), publishes and
    /// answers its appends.
    fn flush(&self, group: Group) -> Result<()> {
        if group.records.is_empty() {
            return Ok(());
        }
        let (file, pos, base, generation) = {
            let st = self.lock();
            let a = &st.active;
            (Arc::clone(&a.file), a.len, a.base, a.generation)
        };
        let mut buf = Vec::with_capacity(usize::try_from(group.estimate).unwrap_or(0));
        batch::encode_batch(group.base, generation, &group.records, &mut buf);
        let path = segment::log_path(&self.dir, base);
        let counters = &self.shared.counters;
        let written = file
            .write_at(pos, &buf)
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
        if let Err(err) = synced {
            // Nothing was published: the next commit overwrites these bytes.
            group.fail(|| self.copy_error(&err));
            return Err(err);
        }
        let count = group.records.len() as u64;
        let max_ts = group
            .records
            .iter()
            .map(|r| r.timestamp_ms)
            .max()
            .unwrap_or(i64::MIN);
        let end = {
            let mut st = self.lock();
            let rel = u32::try_from(group.base - st.active.base).unwrap_or(u32::MAX);
            let at = u32::try_from(pos).unwrap_or(u32::MAX);
            st.active.index.add_batch(rel, at, buf.len() as u64, max_ts);
            st.active.len = pos + buf.len() as u64;
            st.active.end = group.base + count;
            st.active.end
        };
        counters.committed(count);
        self.publish(end);
        for (reply, base) in group.replies {
            let _ = reply.send(Ok(base));
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
