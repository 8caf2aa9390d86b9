//! A fault-injecting, in-memory file system for power-cut tests. Each file keeps its durable
//! content (as of its last fdatasync) and the operations applied since; each directory entry is
//! durable only once its directory was synced. After [`FaultyFs::fail_after`] operations every
//! call fails (the power is gone); [`FaultyFs::crash`] then rebuilds what a disk would hold: the
//! durable state plus, depending on the seeded [`CrashMode`], nothing more, a prefix of the
//! unsynced writes ending in a torn one, or all of them with one bit flipped.
//!
//! Like a real `fdatasync`, [`WriteFile::sync_data`] makes durable only the writes that
//! completed before it started: writes that land while it runs (a pipelined commit) stay
//! unsynced, a sync that is still running when the power fails fails, and
//! [`FaultyFs::set_sync_delay`] makes each sync take time so such overlaps happen.
//! [`FaultyFs::hold_syncs`] holds every sync until released, so a test can look at a commit in
//! flight, and [`FaultyFs::set_full`] / [`FaultyFs::fill_after`] fill the disk (ENOSPC).
//!
//! Test equipment only: directories themselves are always durable, and nothing here is fast.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

mod media;

use super::{Fs, ReadFile, WriteFile};
use media::{ReadFaults, Snapshot};

pub use media::ReadHold;

/// What a crash does to writes not yet fdatasync'd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unsynced write is lost.
    DropUnsynced,
    /// A random prefix of the unsynced writes survives, the last of them torn at a random byte.
    TearLastWrite,
    /// Every unsynced write survives, with one random bit of the unsynced bytes flipped.
    FlipBit,
}

#[derive(Debug, Clone)]
enum Op {
    Write { pos: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    /// Operations applied to `current` since `durable`, oldest first.
    pending: Vec<Op>,
    /// Operations applied since the file was created (or since the last crash).
    applied: u64,
    /// Syncs running on this file.
    syncing: u32,
}

#[derive(Debug, Default)]
struct State {
    inodes: BTreeMap<u64, Inode>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    next_inode: u64,
    ops: u64,
    fail_after: Option<u64>,
    /// Writes fail with ENOSPC while set.
    full: bool,
    /// Bytes writes may still add before the disk is full (a write crossing it lands in part).
    room: Option<usize>,
    rng: u64,
    /// How long each file sync takes.
    sync_delay: std::time::Duration,
    /// Writes that landed on a file while a sync of it was running.
    writes_during_sync: u64,
    /// Syncs running now, on every file.
    syncs_running: u32,
    /// File syncs wait before they finish while set ([`FaultyFs::hold_syncs`]).
    syncs_held: bool,
    /// The power was cut now ([`FaultyFs::cut_power`]).
    cut: bool,
    /// Bumped by every crash: a sync that spans one fails.
    boots: u64,
    /// Reads that fail or wait (`media.rs`).
    reads: ReadFaults,
}

/// The fault-injecting file system. Cheap to clone; clones share one disk.
#[derive(Debug, Clone)]
pub struct FaultyFs {
    state: Arc<Mutex<State>>,
    /// Wakes the syncs waiting while [`State::syncs_held`] once it is cleared.
    released: Arc<Condvar>,
}

fn power_cut() -> io::Error {
    io::Error::other("simulated power cut")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

fn apply(data: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { pos, data: bytes } => {
            let pos = usize::try_from(*pos).unwrap_or(usize::MAX);
            let end = pos.saturating_add(bytes.len());
            if data.len() < end {
                data.resize(end, 0);
            }
            if let Some(target) = data.get_mut(pos..end) {
                target.copy_from_slice(bytes);
            }
        }
        Op::SetLen(len) => data.resize(usize::try_from(*len).unwrap_or(usize::MAX), 0),
    }
}

impl State {
    /// Counts an operation; fails once the power is gone.
    fn tick(&mut self) -> io::Result<()> {
        self.ops += 1;
        if self.power_is_out() {
            Err(power_cut())
        } else {
            Ok(())
        }
    }

    fn random(&mut self, bound: u64) -> u64 {
        // splitmix64: small, seedable, good enough to pick crash points.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % bound.max(1)
    }

    fn inode(&mut self, path: &Path) -> io::Result<&mut Inode> {
        let id = *self.names.get(path).ok_or_else(|| not_found(path))?;
        self.inodes.get_mut(&id).ok_or_else(|| not_found(path))
    }

    fn crash_inode(&mut self, id: u64, mode: CrashMode) {
        let Some(inode) = self.inodes.get(&id) else {
            return;
        };
        let pending = inode.pending.clone();
        let mut data = inode.durable.clone();
        match mode {
            CrashMode::DropUnsynced => {}
            CrashMode::TearLastWrite => {
                let keep = self.random(pending.len() as u64 + 1) as usize;
                for op in pending.iter().take(keep) {
                    apply(&mut data, op);
                }
                if let Some(Op::Write { pos, data: bytes }) = pending.get(keep) {
                    let cut = self.random(bytes.len() as u64) as usize;
                    let torn = bytes.get(..cut).unwrap_or_default().to_vec();
                    apply(
                        &mut data,
                        &Op::Write {
                            pos: *pos,
                            data: torn,
                        },
                    );
                }
            }
            CrashMode::FlipBit => {
                for op in &pending {
                    apply(&mut data, op);
                }
                let written: Vec<(u64, usize)> = pending
                    .iter()
                    .filter_map(|op| match op {
                        Op::Write { pos, data } if !data.is_empty() => Some((*pos, data.len())),
                        _ => None,
                    })
                    .collect();
                if !written.is_empty() {
                    let pick = self.random(written.len() as u64) as usize;
                    if let Some((pos, len)) = written.get(pick) {
                        let at = *pos as usize + self.random(*len as u64) as usize;
                        let bit = self.random(8) as u8;
                        if let Some(byte) = data.get_mut(at) {
                            *byte ^= 1 << bit;
                        }
                    }
                }
            }
        }
        if let Some(inode) = self.inodes.get_mut(&id) {
            inode.durable = data.clone();
            inode.current = data;
            inode.pending.clear();
            inode.applied = 0;
        }
    }

    fn power_is_out(&self) -> bool {
        self.cut || self.fail_after.is_some_and(|limit| self.ops > limit)
    }
}

impl FaultyFs {
    /// An empty disk whose crash choices follow `seed`.
    pub fn new(seed: u64) -> Self {
        let state = State {
            rng: seed,
            ..State::default()
        };
        Self {
            state: Arc::new(Mutex::new(state)),
            released: Arc::new(Condvar::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cuts the power after `ops` more operations: from then on every call fails.
    pub fn fail_after(&self, ops: u64) {
        let mut state = self.lock();
        state.fail_after = Some(state.ops + ops);
    }

    /// Cuts the power now: every later call fails, and so does every sync still running.
    pub fn cut_power(&self) {
        self.lock().cut = true;
    }

    /// Whether the power is out (an operation was refused since [`Self::fail_after`]).
    pub fn power_failed(&self) -> bool {
        self.lock().power_is_out()
    }

    /// Makes every file sync take `delay` (outside the disk's lock), so that writes can land
    /// while a sync runs, as they do on a real disk.
    pub fn set_sync_delay(&self, delay: std::time::Duration) {
        self.lock().sync_delay = delay;
    }

    /// While `held`, every file sync waits before it finishes (its data not yet durable), so
    /// a test can look at the log while a commit is in flight; `false` lets them finish.
    pub fn hold_syncs(&self, held: bool) {
        self.lock().syncs_held = held;
        if !held {
            self.released.notify_all();
        }
    }

    /// Waits while syncs are held (outside the caller's other work on the disk).
    fn wait_for_syncs(&self) {
        let state = self.lock();
        let _released = self
            .released
            .wait_while(state, |state| state.syncs_held)
            .unwrap_or_else(PoisonError::into_inner);
    }

    /// Writes that landed on a file while a sync of that file was running.
    pub fn writes_during_sync(&self) -> u64 {
        self.lock().writes_during_sync
    }

    /// File syncs running now.
    pub fn syncs_running(&self) -> u32 {
        self.lock().syncs_running
    }

    /// Makes every write fail with ENOSPC (disk full) until called with `false`.
    pub fn set_full(&self, full: bool) {
        self.lock().full = full;
    }

    /// The disk fills after `bytes` more written bytes: the write that crosses the limit
    /// lands in part and fails with ENOSPC, later writes fail until `set_full(false)`.
    pub fn fill_after(&self, bytes: usize) {
        self.lock().room = Some(bytes);
    }

    /// Operations performed so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// A seeded random number below `bound`, from the disk's own generator.
    pub fn random(&self, bound: u64) -> u64 {
        self.lock().random(bound)
    }

    /// Simulates the power cut and the reboot: the disk keeps only durable names and, per file,
    /// its durable bytes plus whatever `mode` lets through. The power is back afterwards.
    pub fn crash(&self, mode: CrashMode) {
        let mut state = self.lock();
        state.names = state.durable_names.clone();
        let live: BTreeSet<u64> = state.names.values().copied().collect();
        state.inodes.retain(|id, _| live.contains(id));
        for id in live {
            state.crash_inode(id, mode);
        }
        state.fail_after = None;
        state.cut = false;
        state.boots += 1;
    }

    /// Overwrites bytes of a file at `at` (growing it if needed), durably: damage or a
    /// future writer's bytes, put there while the log is closed.
    pub fn overwrite(&self, path: &Path, at: u64, bytes: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.inode(path)?;
        for data in [&mut inode.durable, &mut inode.current] {
            apply(
                data,
                &Op::Write {
                    pos: at,
                    data: bytes.to_vec(),
                },
            );
        }
        Ok(())
    }

    /// Cuts a file to `len` bytes, durably.
    pub fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.inode(path)?;
        for data in [&mut inode.durable, &mut inode.current] {
            apply(data, &Op::SetLen(len));
        }
        Ok(())
    }

    /// The current content of every file, by path (to show that nothing changed).
    pub fn contents(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let state = self.lock();
        state
            .names
            .iter()
            .filter_map(|(path, id)| Some((path.clone(), state.inodes.get(id)?.current.clone())))
            .collect()
    }

    /// Flips one bit of a file's content, durably (bit rot on a sealed file).
    pub fn corrupt(&self, path: &Path, at: u64) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.inode(path)?;
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        for data in [&mut inode.durable, &mut inode.current] {
            if let Some(byte) = data.get_mut(at) {
                *byte ^= 0x10;
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct FaultyFile {
    fs: FaultyFs,
    id: u64,
}

impl FaultyFile {
    fn with<T>(&self, f: impl FnOnce(&mut Inode) -> T) -> io::Result<T> {
        let mut state = self.fs.lock();
        state.tick()?;
        let inode = state
            .inodes
            .get_mut(&self.id)
            .ok_or_else(|| io::Error::other("file was removed"))?;
        Ok(f(inode))
    }

    fn push(&self, op: Op) -> io::Result<()> {
        // Truncating or extending a file's length needs no free blocks.
        let needs_room = matches!(op, Op::Write { .. });
        if needs_room && self.fs.lock().full {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let mut op = op;
        let mut filled = false;
        if let Op::Write { data, .. } = &mut op {
            let mut state = self.fs.lock();
            if let Some(room) = state.room {
                filled = data.len() > room;
                data.truncate(room);
                state.room = Some(room - data.len());
                state.full |= filled;
                if filled {
                    state.room = None;
                }
            }
        }
        let overlapped = self.with(|inode| {
            apply(&mut inode.current, &op);
            inode.pending.push(op);
            inode.applied += 1;
            inode.syncing > 0
        })?;
        if overlapped {
            self.fs.lock().writes_during_sync += 1;
        }
        if filled {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }

    /// The end of a sync that started when `mark` operations were applied, with `snapshot` as
    /// the content then: that content becomes durable, later operations stay pending.
    fn finish_sync(&self, mark: u64, snapshot: Vec<u8>, boot: u64) -> io::Result<()> {
        let mut state = self.fs.lock();
        state.syncs_running = state.syncs_running.saturating_sub(1);
        let failed = state.power_is_out() || state.boots != boot;
        let inode = state
            .inodes
            .get_mut(&self.id)
            .ok_or_else(|| io::Error::other("file was removed"))?;
        inode.syncing = inode.syncing.saturating_sub(1);
        if failed {
            return Err(power_cut());
        }
        let first_pending = inode.applied - inode.pending.len() as u64;
        if mark > first_pending {
            let synced = usize::try_from(mark - first_pending).unwrap_or(usize::MAX);
            inode.pending.drain(..synced.min(inode.pending.len()));
            inode.durable = snapshot;
        }
        Ok(())
    }
}

impl WriteFile for FaultyFile {
    fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        self.push(Op::Write {
            pos,
            data: data.to_vec(),
        })
    }
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<()> {
        self.with(|inode| {
            let pos = usize::try_from(pos).unwrap_or(usize::MAX);
            let src = inode
                .current
                .get(pos..pos.saturating_add(buf.len()))
                .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past end"))?;
            buf.copy_from_slice(src);
            Ok(())
        })?
    }
    fn sync_data(&self) -> io::Result<()> {
        let (mark, snapshot) = self.with(|inode| {
            inode.syncing += 1;
            (inode.applied, inode.current.clone())
        })?;
        let (delay, boot) = {
            let mut state = self.fs.lock();
            state.syncs_running += 1;
            (state.sync_delay, state.boots)
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        self.fs.wait_for_syncs();
        self.finish_sync(mark, snapshot, boot)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.push(Op::SetLen(len))
    }
    fn len(&self) -> io::Result<u64> {
        self.with(|inode| inode.current.len() as u64)
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        let current = self.len()?;
        if len > current {
            self.set_len(len)?;
        }
        Ok(())
    }
}

impl Fs for FaultyFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        for dir in path.ancestors() {
            state.dirs.insert(dir.to_owned());
        }
        Ok(())
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut state = self.lock();
        state.tick()?;
        if !state.dirs.contains(path) {
            return Err(not_found(path));
        }
        let files = state.names.keys().filter(|p| p.parent() == Some(path));
        let dirs = state.dirs.iter().filter(|p| p.parent() == Some(path));
        let mut names: Vec<String> = files
            .chain(dirs)
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        names.sort();
        Ok(names)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.lock().dirs.contains(path)
    }
    fn exists(&self, path: &Path) -> bool {
        let state = self.lock();
        state.dirs.contains(path) || state.names.contains_key(path)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        let mut state = self.lock();
        state.tick()?;
        if !path.parent().is_some_and(|dir| state.dirs.contains(dir)) {
            return Err(not_found(path));
        }
        let id = state.next_inode;
        state.next_inode += 1;
        state.inodes.insert(id, Inode::default());
        state.names.insert(path.to_owned(), id);
        Ok(Arc::new(FaultyFile {
            fs: self.clone(),
            id,
        }))
    }
    fn create_private(&self, path: &Path, _like: &Path) -> io::Result<Arc<dyn WriteFile>> {
        // Permissions are not modelled; the exclusive creation is.
        if self.lock().names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            ));
        }
        self.create(path)
    }
    fn open_write(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        let mut state = self.lock();
        state.tick()?;
        let id = *state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(Arc::new(FaultyFile {
            fs: self.clone(),
            id,
        }))
    }
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        self.pass_hold(path);
        Ok(Arc::new(Snapshot {
            data: self.read(path)?,
            path: path.to_owned(),
            fs: self.clone(),
        }))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut state = self.lock();
        state.tick()?;
        Ok(state.inode(path)?.current.clone())
    }
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let mut state = self.lock();
        state.tick()?;
        Ok(state.inode(path)?.current.len() as u64)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        let id = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_owned(), id);
        Ok(())
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        state
            .names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        // A removal not yet made durable by a directory sync still counts: after a power cut the
        // name would be back in a directory that no longer exists.
        let child = |p: &Path| p.parent() == Some(path);
        let names = state.names.keys().chain(state.durable_names.keys());
        if names.into_iter().any(|p| child(p)) || state.dirs.iter().any(|p| child(p)) {
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("{} is not empty", path.display()),
            ));
        }
        if state.dirs.remove(path) {
            Ok(())
        } else {
            Err(not_found(path))
        }
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        let in_dir = |p: &PathBuf| p.parent() == Some(path);
        state.durable_names.retain(|p, _| !in_dir(p));
        let entries: Vec<(PathBuf, u64)> = state
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        state.durable_names.extend(entries);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_and_entries_vanish_in_a_crash() {
        let fs = FaultyFs::new(1);
        let dir = Path::new("/d");
        fs.create_dir_all(dir).expect("mkdir");
        let a = fs.create(&dir.join("a")).expect("create a");
        a.write_at(0, b"hello").expect("write");
        a.sync_data().expect("sync");
        fs.sync_dir(dir).expect("sync dir");
        a.write_at(5, b" world").expect("write");
        let b = fs.create(&dir.join("b")).expect("create b");
        b.write_at(0, b"lost").expect("write");
        b.sync_data().expect("sync b");
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(fs.read(&dir.join("a")).expect("a survives"), b"hello");
        assert!(!fs.exists(&dir.join("b")), "entry never synced");
    }

    #[test]
    fn operations_fail_after_the_power_cut() {
        let fs = FaultyFs::new(2);
        fs.create_dir_all(Path::new("/d")).expect("mkdir");
        fs.fail_after(1);
        let file = fs.create(Path::new("/d/x")).expect("first op works");
        assert!(file.write_at(0, b"x").is_err(), "second op fails");
        fs.crash(CrashMode::TearLastWrite);
        assert!(fs.create(Path::new("/d/y")).is_ok(), "power is back");
    }

    #[test]
    fn torn_and_flipped_writes_differ_from_what_was_written() {
        for seed in 0..20 {
            let fs = FaultyFs::new(seed);
            fs.create_dir_all(Path::new("/d")).expect("mkdir");
            let f = fs.create(Path::new("/d/x")).expect("create");
            fs.sync_dir(Path::new("/d")).expect("sync dir");
            f.write_at(0, &[7u8; 64]).expect("write");
            fs.crash(CrashMode::FlipBit);
            let data = fs.read(Path::new("/d/x")).expect("read");
            assert_eq!(data.len(), 64);
            assert_eq!(
                data.iter().filter(|b| **b != 7).count(),
                1,
                "one byte flipped"
            );
        }
    }

    #[test]
    fn a_held_sync_finishes_only_when_released() {
        let fs = FaultyFs::new(3);
        fs.create_dir_all(Path::new("/d")).expect("mkdir");
        let file = fs.create(Path::new("/d/x")).expect("create");
        file.write_at(0, b"x").expect("write");
        fs.hold_syncs(true);
        let (done_tx, done) = std::sync::mpsc::channel();
        let syncing = std::thread::spawn(move || done_tx.send(file.sync_data().is_ok()));
        while fs.syncs_running() == 0 {
            std::thread::yield_now();
        }
        assert!(done.try_recv().is_err(), "held: the sync has not returned");
        fs.hold_syncs(false);
        assert_eq!(done.recv().ok(), Some(true), "released: the sync returns");
        let _ = syncing.join();
    }
}
