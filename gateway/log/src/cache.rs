//! A bounded cache of open, memory-mapped sealed files (segments and their indexes), least
//! recently used first out. Sealed files are opened lazily on first read; at most
//! `max_open_files` stay open, so RAM and descriptors do not grow with the log.
//!
//! It never opens a file for writing and never maps the active segment.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::fs::{Fs, ReadFile};

#[derive(Debug)]
pub struct FileCache {
    fs: Arc<dyn Fs>,
    max: usize,
    open: Mutex<VecDeque<(PathBuf, Arc<dyn ReadFile>)>>,
}

impl FileCache {
    pub fn new(fs: Arc<dyn Fs>, max: usize) -> Self {
        Self {
            fs,
            max: max.max(1),
            open: Mutex::new(VecDeque::new()),
        }
    }

    /// The mapped file at `path`, opening it (and evicting the oldest) if needed.
    pub fn get(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = open.iter().position(|(p, _)| p == path) {
            if let Some(entry) = open.remove(i) {
                let file = Arc::clone(&entry.1);
                open.push_back(entry);
                return Ok(file);
            }
        }
        let file = self.fs.open_read(path)?;
        while open.len() >= self.max {
            open.pop_front();
        }
        open.push_back((path.to_owned(), Arc::clone(&file)));
        Ok(file)
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
}
