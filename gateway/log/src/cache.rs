//! A bounded cache of open, memory-mapped sealed files (segments and their indexes), least
//! recently used first out. Sealed files are opened lazily on first read; at most
//! `max_open_files` stay open, so RAM and descriptors do not grow with the log.
//!
//! It never opens a file for writing, never maps the active segment, and never holds its lock
//! while it opens or maps a file: on an SD card a cold open takes milliseconds, and a reader of
//! another, already open file must not wait for it.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::fs::{Fs, ReadFile};

#[derive(Debug)]
pub struct FileCache {
    fs: Arc<dyn Fs>,
    max: usize,
    open: Mutex<Open>,
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

impl FileCache {
    pub fn new(fs: Arc<dyn Fs>, max: usize) -> Self {
        Self {
            fs,
            max: max.max(1),
            open: Mutex::new(Open::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mapped file at `path`, opening it (and evicting the oldest) if needed. The open
    /// runs outside the lock; two readers missing the same file may both open it, and the
    /// first one kept is shared from then on.
    pub fn get(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        let forgets = {
            let mut open = self.lock();
            if let Some(file) = open.take(path) {
                return Ok(file);
            }
            open.forgets
        };
        let file = self.fs.open_read(path)?;
        let mut open = self.lock();
        if let Some(kept) = open.take(path) {
            return Ok(kept);
        }
        if open.forgets == forgets {
            while open.files.len() >= self.max {
                open.files.pop_front();
            }
            open.files.push_back((path.to_owned(), Arc::clone(&file)));
        }
        Ok(file)
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

    #[test]
    fn at_most_max_files_stay_open() {
        let fs = FaultyFs::new(0);
        fs.create_dir_all(Path::new("/c")).expect("mkdir");
        for i in 0..5 {
            let f = fs
                .create(&Path::new("/c").join(i.to_string()))
                .expect("create");
            f.write_at(0, &[i]).expect("write");
        }
        let cache = FileCache::new(Arc::new(fs), 3);
        for i in 0..5 {
            let file = cache
                .get(&Path::new("/c").join(i.to_string()))
                .expect("open");
            assert_eq!(file.bytes(), &[i]);
        }
        assert_eq!(cache.len(), 3);
        cache.forget(Path::new("/c/4"));
        assert_eq!(cache.len(), 2);
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
        let cache = Arc::new(FileCache::new(Arc::new(fs), 4));
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
