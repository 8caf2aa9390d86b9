//! A bounded cache of open, memory-mapped sealed files (segments and their indexes), least
//! recently used first out. Sealed files are opened lazily on first read; at most
//! `max_open_files` stay open, and their mapped bytes stay within `max_mapped_bytes`, so
//! descriptors and address space do not grow with the log (a 32-bit build has at most 4 GiB of
//! address space for everything, and a few dozen 64 MiB segments fill it).
//!
//! It never opens a file for writing and never maps the active segment.

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
    open: Mutex<VecDeque<(PathBuf, Arc<dyn ReadFile>)>>,
    /// Bytes of every file this cache mapped and that is still mapped: those it holds, and
    /// those a reader still holds after they were evicted.
    mapped: Arc<AtomicU64>,
}

/// A mapped file that counts its length in the cache's `mapped` bytes until it is unmapped.
#[derive(Debug)]
struct Counted {
    file: Arc<dyn ReadFile>,
    mapped: Arc<AtomicU64>,
}

impl Counted {
    fn new(file: Arc<dyn ReadFile>, mapped: &Arc<AtomicU64>) -> Self {
        mapped.fetch_add(file.bytes().len() as u64, Ordering::Relaxed);
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
}

impl Drop for Counted {
    fn drop(&mut self) {
        let len = self.file.bytes().len() as u64;
        self.mapped.fetch_sub(len, Ordering::Relaxed);
    }
}

impl FileCache {
    /// A cache keeping at most `max_files` files and `max_bytes` mapped bytes (0: no limit).
    pub fn new(fs: Arc<dyn Fs>, max_files: usize, max_bytes: u64) -> Self {
        Self {
            fs,
            max_files: max_files.max(1),
            max_bytes,
            open: Mutex::new(VecDeque::new()),
            mapped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The mapped file at `path`, opening it (and evicting the oldest) if needed. Evicts before
    /// it maps, so the new map never needs more than the budget; a file larger than the whole
    /// budget is still mapped, alone.
    pub fn get(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = open.iter().position(|(p, _)| p == path) {
            if let Some(entry) = open.remove(i) {
                let file = Arc::clone(&entry.1);
                open.push_back(entry);
                return Ok(file);
            }
        }
        let len = self.fs.file_len(path)?;
        while !open.is_empty() && (open.len() >= self.max_files || self.over_budget_with(len)) {
            open.pop_front();
        }
        let file: Arc<dyn ReadFile> =
            Arc::new(Counted::new(self.fs.open_read(path)?, &self.mapped));
        open.push_back((path.to_owned(), Arc::clone(&file)));
        Ok(file)
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
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|(p, _)| p != path);
    }

    /// Files currently open.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
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
}
