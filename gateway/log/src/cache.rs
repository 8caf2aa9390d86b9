//! A bounded cache of open, memory-mapped sealed files (segments and their indexes), least
//! recently used first out. Sealed files are opened lazily on first read; at most
//! `max_open_files` stay open, and their mapped bytes stay within `max_mapped_bytes`, so
//! descriptors and address space do not grow with the log (a 32-bit build has at most 4 GiB of
//! address space for everything, and a few dozen 64 MiB segments fill it).
//!
//! It never opens a file for writing, never maps the active segment, and never holds its lock
//! while it opens or maps a file: on an SD card a cold open takes milliseconds, and a reader of
//! another, already open file must not wait for it.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::fs::{Fs, ReadFile};

#[derive(Debug)]
pub struct FileCache {
    fs: Arc<dyn Fs>,
    max_files: usize,
    /// 0: no limit on mapped bytes (only `max_files`).
    max_bytes: u64,
    open: Mutex<Open>,
    /// Bytes of every file this cache mapped and that is still mapped: those it holds, and
    /// those a reader still holds after they were evicted.
    mapped: Arc<AtomicU64>,
}

/// The open files, oldest use first, and how many times one was forgotten: a file opened while
/// a [`FileCache::forget`] ran may be the deleted one, so it is used but not kept.
#[derive(Debug, Default)]
struct Open {
    files: VecDeque<(PathBuf, Arc<dyn ReadFile>)>,
    forgets: u64,
}

impl Open {
    /// The file at `path` if open, marked as the latest used.
    fn take(&mut self, path: &Path) -> Option<Arc<dyn ReadFile>> {
        let i = self.files.iter().position(|(p, _)| p == path)?;
        let entry = self.files.remove(i)?;
        let file = Arc::clone(&entry.1);
        self.files.push_back(entry);
        Some(file)
    }
}

/// A mapped file that counts its length in the cache's `mapped` bytes until it is unmapped.
#[derive(Debug)]
struct Counted {
    file: Arc<dyn ReadFile>,
    mapped: Arc<AtomicU64>,
}

impl Counted {
    fn new(file: Arc<dyn ReadFile>, mapped: &Arc<AtomicU64>) -> Self {
        mapped.fetch_add(file.len(), Ordering::Relaxed);
        Self {
            file,
            mapped: Arc::clone(mapped),
        }
    }
}

impl ReadFile for Counted {
    fn bytes(&self) -> &[u8] {
        self.file.bytes()
    }
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_at(pos, buf)
    }
    fn len(&self) -> u64 {
        self.file.len()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.mapped.fetch_sub(self.file.len(), Ordering::Relaxed);
    }
}

impl FileCache {
    /// A cache keeping at most `max_files` files and `max_bytes` mapped bytes (0: no limit).
    pub fn new(fs: Arc<dyn Fs>, max_files: usize, max_bytes: u64) -> Self {
        Self {
            fs,
            max_files: max_files.max(1),
            max_bytes,
            open: Mutex::new(Open::default()),
            mapped: Arc::new(AtomicU64::new(0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mapped file at `path`, opening it (and evicting the oldest) if needed. Evicts before
    /// it maps, so the new map never needs more than the budget (a file larger than the whole
    /// budget is still mapped, alone; readers opening files at once may each map theirs). The
    /// open and map run outside the lock; two readers missing the same file may both open it,
    /// and the first one kept is shared from then on.
    pub fn get(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        let forgets = {
            let mut open = self.lock();
            if let Some(file) = open.take(path) {
                return Ok(file);
            }
            open.forgets
        };
        let len = self.fs.file_len(path)?;
        self.evict(&mut self.lock(), len);
        let file: Arc<dyn ReadFile> =
            Arc::new(Counted::new(self.fs.open_read(path)?, &self.mapped));
        let mut open = self.lock();
        if let Some(kept) = open.take(path) {
            return Ok(kept);
        }
        if open.forgets == forgets {
            while open.files.len() >= self.max_files {
                open.files.pop_front();
            }
            open.files.push_back((path.to_owned(), Arc::clone(&file)));
        }
        Ok(file)
    }

    /// Drops the oldest files until one more file of `len` bytes fits the count and the budget.
    fn evict(&self, open: &mut Open, len: u64) {
        while !open.files.is_empty()
            && (open.files.len() >= self.max_files || self.over_budget_with(len))
        {
            open.files.pop_front();
        }
    }

    /// Whether mapping `len` more bytes would pass the budget.
    fn over_budget_with(&self, len: u64) -> bool {
        self.max_bytes != 0 && self.mapped_bytes().saturating_add(len) > self.max_bytes
    }

    /// Bytes of sealed files mapped now (held here or by a reader).
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed)
    }

    /// Drops `path` from the cache (the file is being deleted or replaced).
    pub fn forget(&self, path: &Path) {
        let mut open = self.lock();
        open.files.retain(|(p, _)| p != path);
        open.forgets += 1;
    }

    /// Files currently open.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().files.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::FaultyFs;

    /// A file system holding files `/c/0`.. of `len` bytes each.
    fn files(count: u8, len: usize) -> Arc<dyn Fs> {
        let fs = FaultyFs::new(0);
        fs.create_dir_all(Path::new("/c")).expect("mkdir");
        for i in 0..count {
            let f = fs
                .create(&Path::new("/c").join(i.to_string()))
                .expect("create");
            f.write_at(0, &vec![i; len]).expect("write");
        }
        Arc::new(fs)
    }

    fn path(i: u8) -> PathBuf {
        Path::new("/c").join(i.to_string())
    }

    #[test]
    fn at_most_max_files_stay_open() {
        let cache = FileCache::new(files(5, 1), 3, 0);
        for i in 0..5 {
            let file = cache.get(&path(i)).expect("open");
            assert_eq!(file.bytes(), &[i]);
        }
        assert_eq!(cache.len(), 3);
        cache.forget(Path::new("/c/4"));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn mapped_bytes_stay_within_the_budget() {
        let cache = FileCache::new(files(6, 100), 64, 250);
        for i in 0..6 {
            assert_eq!(cache.get(&path(i)).expect("open").bytes().len(), 100);
            assert!(
                cache.mapped_bytes() <= 250,
                "{} mapped",
                cache.mapped_bytes()
            );
        }
        assert_eq!((cache.len(), cache.mapped_bytes()), (2, 200));
        cache.forget(&path(5));
        assert_eq!(cache.mapped_bytes(), 100, "a forgotten file is unmapped");
    }

    #[test]
    fn a_file_a_reader_still_holds_counts_until_it_is_dropped() {
        let cache = FileCache::new(files(3, 100), 64, 250);
        let pinned = cache.get(&path(0)).expect("open");
        cache.get(&path(1)).expect("open");
        cache.get(&path(2)).expect("open");
        assert_eq!(cache.len(), 1, "both older files evicted to map the third");
        assert_eq!(cache.mapped_bytes(), 200, "the pinned one is still mapped");
        drop(pinned);
        assert_eq!(cache.mapped_bytes(), 100);
    }

    #[test]
    fn a_file_larger_than_the_budget_is_mapped_alone() {
        let cache = FileCache::new(files(2, 300), 64, 250);
        cache.get(&path(0)).expect("open");
        assert_eq!(cache.get(&path(1)).expect("open").bytes().len(), 300);
        assert_eq!((cache.len(), cache.mapped_bytes()), (1, 300));
    }

    /// A slow open of one file (a cold card) holds up no reader of another: the cache opens
    /// outside its lock.
    #[test]
    fn a_slow_open_does_not_block_other_files() {
        let fs = FaultyFs::new(0);
        fs.create_dir_all(Path::new("/c")).expect("mkdir");
        for name in ["slow", "fast"] {
            let f = fs.create(&Path::new("/c").join(name)).expect("create");
            f.write_at(0, name.as_bytes()).expect("write");
        }
        let hold = fs.hold_reads(Path::new("/c/slow"));
        let cache = Arc::new(FileCache::new(Arc::new(fs), 4, 0));
        let slow = {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || cache.get(Path::new("/c/slow")).map(|f| f.len()))
        };
        let guard = std::time::Duration::from_secs(30);
        assert!(hold.wait_reached(guard), "the slow open never started");
        let (done, fast) = std::sync::mpsc::channel();
        let other = {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                let _ = done.send(cache.get(Path::new("/c/fast")).map(|f| f.len()));
            })
        };
        let fast = fast.recv_timeout(guard);
        hold.release();
        assert_eq!(
            fast.ok().and_then(Result::ok),
            Some(4),
            "the fast open waited"
        );
        assert_eq!(slow.join().expect("slow reader").ok(), Some(4));
        other.join().expect("fast reader");
        assert_eq!(cache.len(), 2);
    }
}
