//! The read faults of [`FaultyFs`]: a file whose reads fail as a failing card's do (EIO from
//! `pread`; a touched mapping would be SIGBUS, so reading it through [`ReadFile::bytes`]
//! panics), and a file whose reads wait at a [`ReadHold`] until a test releases them (a slow
//! card, without timing).
//!
//! It never changes a file's content.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use super::FaultyFs;
use crate::fs::ReadFile;

/// What reads of a file do besides reading.
#[derive(Debug, Default)]
pub(super) struct ReadFaults {
    /// Files whose reads fail with EIO (a media error).
    failing: BTreeMap<PathBuf, ()>,
    /// Files whose opens and reads wait for their hold's release.
    held: BTreeMap<PathBuf, Arc<ReadHold>>,
}

impl ReadFaults {
    pub(super) fn fail(&mut self, path: &Path) {
        self.failing.insert(path.to_owned(), ());
    }

    pub(super) fn hold(&mut self, path: &Path) -> Arc<ReadHold> {
        let hold = Arc::new(ReadHold::default());
        self.held.insert(path.to_owned(), Arc::clone(&hold));
        hold
    }

    pub(super) fn failing(&self, path: &Path) -> bool {
        self.failing.contains_key(path)
    }

    pub(super) fn held(&self, path: &Path) -> Option<Arc<ReadHold>> {
        self.held.get(path).cloned()
    }
}

/// A gate the opens and reads of one file wait at until [`ReadHold::release`]: stands for a
/// read that takes as long as a test wants, so tests wait for signals, not for time.
#[derive(Debug, Default)]
pub struct ReadHold {
    /// (a reader reached the hold, the hold was released)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl ReadHold {
    /// Lets every waiting and later read through.
    pub fn release(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
        self.changed.notify_all();
    }

    /// Whether a reader has reached the hold (it may since have passed it).
    pub fn reached(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// Waits until a reader reaches the hold; false if none did within `limit` (a guard
    /// against a hung test, not a timing assumption).
    pub fn wait_reached(&self, limit: std::time::Duration) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (state, _) = self
            .changed
            .wait_timeout_while(state, limit, |(reached, _)| !*reached)
            .unwrap_or_else(PoisonError::into_inner);
        state.0
    }

    /// A reader's side: says it arrived, then waits for the release.
    fn pass(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 = true;
        self.changed.notify_all();
        while !state.1 {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl FaultyFs {
    /// Makes every read of `path` fail as a failing card's does: `pread` with EIO, a read of
    /// its mapping ([`ReadFile::bytes`]) with a panic standing for the SIGBUS that would kill
    /// the process. Opening it still works.
    pub fn fail_reads(&self, path: &Path) {
        self.lock().reads.fail(path);
    }

    /// Makes every open for reading and every read of `path` wait until the returned hold is
    /// released.
    pub fn hold_reads(&self, path: &Path) -> Arc<ReadHold> {
        self.lock().reads.hold(path)
    }

    /// Waits at `path`'s hold, if it has one (outside the disk's lock).
    pub(super) fn pass_hold(&self, path: &Path) {
        let hold = self.lock().reads.held(path);
        if let Some(hold) = hold {
            hold.pass();
        }
    }

    fn read_fails(&self, path: &Path) -> bool {
        self.lock().reads.failing(path)
    }
}

fn media_error() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// A file opened for reading: its content when opened.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub(super) data: Vec<u8>,
    pub(super) path: PathBuf,
    pub(super) fs: FaultyFs,
}

impl ReadFile for Snapshot {
    fn bytes(&self) -> &[u8] {
        assert!(
            !self.fs.read_fails(&self.path),
            "mapped read of {} hit a media error: a real process dies of SIGBUS here",
            self.path.display()
        );
        &self.data
    }
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<()> {
        self.fs.pass_hold(&self.path);
        if self.fs.read_fails(&self.path) {
            return Err(media_error());
        }
        let pos = usize::try_from(pos).unwrap_or(usize::MAX);
        let src = self
            .data
            .get(pos..pos.saturating_add(buf.len()))
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past end"))?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
}
