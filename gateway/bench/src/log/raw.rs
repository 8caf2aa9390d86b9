//! The anchor figures: sequential write bandwidth of the target's device, measured by writing a
//! file with `O_DIRECT` in large aligned blocks and one `fdatasync` at the end; and the same
//! device at a commit's cadence (`synced_write`): buffered writes of one commit's size into a
//! preallocated file, pipelined as a partition's writer pipelines them (one fdatasync at a
//! time, the next commit written meanwhile) with a workload's bytes in flight. The second is
//! what one partition's group commit could reach on this device with no CPU cost at all.
//!
//! It only writes its own scratch file and removes it afterwards; it never uses the log.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use super::device::Target;
use crate::BenchError;

/// Alignment O_DIRECT needs on every Linux file system tern cares about.
const ALIGN: usize = 4096;

/// One raw write run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RawRun {
    pub bytes: u64,
    pub secs: f64,
    pub mb_per_s: f64,
    /// False when the file system refused O_DIRECT and buffered writes were used instead.
    pub direct_io: bool,
    /// Bytes the target's counter saw during the run.
    pub device_bytes: u64,
}

/// Writes `total` bytes in `block`-sized aligned writes to a scratch file in `target`, then
/// fdatasyncs it. `block` must be a multiple of 4 KiB.
pub fn sequential_write(target: &Target, total: u64, block: usize) -> Result<RawRun, BenchError> {
    let path = target.dir().join("raw-sequential.bin");
    target.drop_cache(&target.dir())?;
    let before = target.written()?;
    let started = Instant::now();
    let direct_io = write_file(&path, total, block)?;
    let secs = started.elapsed().as_secs_f64();
    target.sync()?;
    let device_bytes = target.written()?.saturating_sub(before);
    std::fs::remove_file(&path).map_err(|source| io("remove", &path, source))?;
    Ok(RawRun {
        bytes: total,
        secs,
        mb_per_s: total as f64 / secs / 1e6,
        direct_io,
        device_bytes,
    })
}

/// What the device gives one partition's group commit with no CPU cost: `total` bytes written
/// in commits of `chunk` bytes into a file preallocated to `total` (as a segment is), pipelined
/// as tern's writer pipelines them and through the same file calls (`tern_log::RealFs`). One
/// thread writes each commit and starts its writeback, as tern does for large commits; another
/// runs one fdatasync at a time, each covering every commit written before it started. The
/// writer stays at most `in_flight` bytes ahead of what is durable, as the appenders of a
/// workload with that many bytes unacknowledged do.
pub fn synced_write(
    target: &Target,
    total: u64,
    chunk: usize,
    in_flight: u64,
) -> Result<SyncedRun, BenchError> {
    use tern_log::Fs;

    let path = target.dir().join("raw-synced.bin");
    target.drop_cache(&target.dir())?;
    let buffer = vec![0xA5u8; chunk];
    let file = tern_log::RealFs
        .create(&path)
        .map_err(|source| io("create", &path, source))?;
    file.preallocate(total)
        .map_err(|source| io("fallocate", &path, source))?;
    let commits = total.div_ceil(chunk as u64);
    let ahead = (in_flight / chunk as u64).max(1);
    let pipeline = Pipeline::default();
    let started = Instant::now();
    let (syncs, sync_secs, result) = std::thread::scope(|scope| {
        let syncer = scope.spawn(|| {
            let (mut syncs, mut secs) = (0u64, 0.0f64);
            loop {
                let covered = {
                    let st =
                        pipeline.wait_while(|st| st.written == st.durable && !st.done(commits));
                    if st.done(commits) {
                        return (syncs, secs, Ok(()));
                    }
                    st.written
                };
                let sync_started = Instant::now();
                let synced = file.sync_data();
                secs += sync_started.elapsed().as_secs_f64();
                syncs += 1;
                let failed = synced.is_err();
                {
                    let mut st = pipeline.lock();
                    st.durable = if failed { st.durable } else { covered };
                    st.stopped |= failed;
                }
                pipeline.changed.notify_all();
                if let Err(err) = synced {
                    return (syncs, secs, Err(err));
                }
            }
        });
        let mut written = Ok(());
        for commit in 0..commits {
            if pipeline
                .wait_while(|st| commit - st.durable >= ahead && !st.stopped)
                .stopped
            {
                break;
            }
            let pos = commit * chunk as u64;
            if let Err(err) = file.write_at(pos, &buffer) {
                written = Err(err);
                break;
            }
            let _ = file.start_writeback(pos, chunk as u64);
            pipeline.lock().written = commit + 1;
            pipeline.changed.notify_all();
        }
        if written.is_err() {
            pipeline.lock().stopped = true;
            pipeline.changed.notify_all();
        }
        let (syncs, secs, synced) = syncer.join().unwrap_or((
            0,
            0.0,
            Err(std::io::Error::other("the fdatasync thread panicked")),
        ));
        (syncs, secs, written.and(synced))
    });
    let secs = started.elapsed().as_secs_f64();
    result.map_err(|source| io("write and fdatasync", &path, source))?;
    drop(file);
    std::fs::remove_file(&path).map_err(|source| io("remove", &path, source))?;
    let bytes = commits * chunk as u64;
    Ok(SyncedRun {
        bytes,
        chunk,
        in_flight: ahead * chunk as u64,
        secs,
        mb_per_s: bytes as f64 / secs / 1e6,
        fdatasync_mean_us: sync_secs * 1e6 / syncs.max(1) as f64,
        bytes_per_fdatasync: bytes as f64 / syncs.max(1) as f64,
    })
}

/// `synced_write`'s two threads meet here: commits written, commits durable, and whether either
/// thread stopped on an error.
#[derive(Default)]
struct Pipeline {
    state: std::sync::Mutex<PipelineState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct PipelineState {
    written: u64,
    durable: u64,
    stopped: bool,
}

impl PipelineState {
    /// Nothing is left for the fdatasync thread.
    fn done(&self, commits: u64) -> bool {
        self.stopped || self.durable >= commits
    }
}

impl Pipeline {
    fn lock(&self) -> std::sync::MutexGuard<'_, PipelineState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The state once `blocked` no longer holds.
    fn wait_while(
        &self,
        blocked: impl FnMut(&mut PipelineState) -> bool,
    ) -> std::sync::MutexGuard<'_, PipelineState> {
        self.changed
            .wait_while(self.lock(), blocked)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One `synced_write` run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SyncedRun {
    pub bytes: u64,
    /// Bytes per commit (one write).
    pub chunk: usize,
    /// How far the writer may run ahead of what is durable.
    pub in_flight: u64,
    pub secs: f64,
    pub mb_per_s: f64,
    pub fdatasync_mean_us: f64,
    pub bytes_per_fdatasync: f64,
}

/// Writes and fdatasyncs the file; whether O_DIRECT was used.
fn write_file(path: &Path, total: u64, block: usize) -> Result<bool, BenchError> {
    let mut storage = vec![0xA5u8; block + ALIGN];
    let start = storage.as_ptr().align_offset(ALIGN).min(ALIGN);
    let buffer = storage
        .get_mut(start..start + block)
        .ok_or(BenchError::Align { block })?;
    let (mut file, direct_io) = open(path)?;
    let mut written = 0u64;
    while written < total {
        file.write_all(buffer)
            .map_err(|source| io("write", path, source))?;
        written += block as u64;
    }
    file.sync_data()
        .map_err(|source| io("fdatasync", path, source))?;
    Ok(direct_io)
}

fn open(path: &Path) -> Result<(std::fs::File, bool), BenchError> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    match options.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(file) => Ok((file, true)),
        Err(err) if err.raw_os_error() == Some(libc::EINVAL) => options
            .open(path)
            .map(|file| (file, false))
            .map_err(|source| io("open", path, source)),
        Err(source) => Err(io("open", path, source)),
    }
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> BenchError {
    BenchError::file(op, path, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_requested_bytes_and_removes_its_file() -> Result<(), BenchError> {
        let parent = std::env::temp_dir().join(format!("tern-raw-unit-{}", std::process::id()));
        std::fs::create_dir_all(&parent).map_err(|source| io("mkdir", &parent, source))?;
        let target = Target::prepare(&parent, 1 << 20, false)?;
        let run = sequential_write(&target, 4 << 20, 1 << 20)?;
        assert_eq!(run.bytes, 4 << 20);
        assert!(run.mb_per_s.is_finite() && run.mb_per_s > 0.0, "{run:?}");
        assert!(!target.dir().join("raw-sequential.bin").exists());
        let synced = synced_write(&target, 1 << 20, 256 << 10, 512 << 10)?;
        assert_eq!((synced.bytes, synced.chunk), (1 << 20, 256 << 10));
        assert_eq!(synced.in_flight, 512 << 10);
        assert!(
            synced.bytes_per_fdatasync >= (256 << 10) as f64,
            "{synced:?}"
        );
        assert!(
            synced.mb_per_s > 0.0 && synced.fdatasync_mean_us > 0.0,
            "{synced:?}"
        );
        assert!(!target.dir().join("raw-synced.bin").exists());
        drop(target);
        std::fs::remove_dir_all(&parent).map_err(|source| io("rmdir", &parent, source))
    }
}
