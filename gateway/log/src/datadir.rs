//! The data directory and its lock: one tern process per directory, enforced with an advisory
//! `flock` on `LOCK`, which also records the holder's process id for the error message.
//!
//! The lock is released by the kernel when the process exits, however it exits, so a crash never
//! leaves a stale lock behind.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Name of the lock file inside the data directory.
pub const LOCK_FILE: &str = "LOCK";

/// Why the data directory could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataDirError {
    #[error("cannot create data directory {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open lock file {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data directory {path} is in use by another tern process ({holder})")]
    Locked { path: PathBuf, holder: String },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// An exclusively held data directory. Dropping it releases the lock.
#[derive(Debug)]
pub struct DataDirLock {
    path: PathBuf,
    _file: File,
}

impl DataDirLock {
    /// Creates `path` if needed and takes its lock without waiting.
    pub fn acquire(path: &Path) -> Result<Self, DataDirError> {
        std::fs::create_dir_all(path).map_err(|source| DataDirError::Create {
            path: path.to_owned(),
            source,
        })?;
        let lock_path = path.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|source| DataDirError::Open {
                path: lock_path.clone(),
                source,
            })?;
        if let Err(source) = try_flock(&file) {
            if source.kind() == std::io::ErrorKind::WouldBlock {
                return Err(DataDirError::Locked {
                    path: path.to_owned(),
                    holder: describe_holder(&mut file),
                });
            }
            return Err(DataDirError::Lock {
                path: lock_path,
                source,
            });
        }
        // The pid is only a hint for the error message above; failing to write it is harmless.
        let _ = record_pid(&mut file);
        Ok(Self {
            path: path.to_owned(),
            _file: file,
        })
    }

    /// The locked directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn try_flock(file: &File) -> std::io::Result<()> {
    // SAFETY: flock only reads the descriptor number, which `file` keeps open for the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn describe_holder(file: &mut File) -> String {
    let mut text = String::new();
    let read = file
        .seek(SeekFrom::Start(0))
        .and_then(|_| file.take(64).read_to_string(&mut text));
    match read.ok().and_then(|_| text.trim().parse::<u32>().ok()) {
        Some(pid) => format!("pid {pid}"),
        None => "pid unknown".to_owned(),
    }
}

fn record_pid(file: &mut File) -> std::io::Result<()> {
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    writeln!(file, "{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tern-datadir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn second_lock_is_refused_and_names_the_holder() {
        let dir = temp_dir("second");
        let first = DataDirLock::acquire(&dir).expect("first lock");
        let err = DataDirLock::acquire(&dir).expect_err("second lock must fail");
        let text = err.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(first);
        DataDirLock::acquire(&dir).expect("lock is free again after drop");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
