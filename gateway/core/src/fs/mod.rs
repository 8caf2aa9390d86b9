//! The gateway's file operations, behind a small [`Fs`] trait: the real file system
//! ([`RealFs`]: std files, `memmap2` for sealed files) and, for tests, a fault-injecting
//! in-memory one ([`FaultyFs`]) that simulates power cuts. Also the one way to replace a small
//! file durably, [`write_atomic`]: the log's metadata, the upstream producer state and the
//! password file all go through it, so the power-cut simulation covers every such write.
//!
//! Only this module touches the operating system's files for the log, the producer state and
//! the password file; it knows nothing of segments, batches, topics or users.

#[cfg(any(test, feature = "fault-injection"))]
mod faulty;

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(any(test, feature = "fault-injection"))]
pub use faulty::{CrashMode, FaultyFs, ReadHold};

/// A file the log appends to (the active segment, the cursor log).
pub trait WriteFile: Send + Sync + Debug {
    /// Writes all of `data` at byte `pos`.
    fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()>;
    /// Fills `buf` from byte `pos`; fails if the file is shorter.
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<()>;
    /// fdatasync: everything written so far survives a power cut once this returns.
    fn sync_data(&self) -> io::Result<()>;
    /// Asks the operating system to start writing `len` bytes from `pos` to the device now
    /// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), without waiting and without any promise:
    /// only a later [`WriteFile::sync_data`] makes them durable. A hint, so the default (and
    /// any file that cannot) does nothing.
    fn start_writeback(&self, _pos: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Reserves `len` bytes of disk space (the file's length grows to at least `len`). File
    /// systems without support leave the file as it is.
    fn preallocate(&self, len: u64) -> io::Result<()>;
}

/// A file no longer written, typically memory-mapped: sealed segments and their indexes.
pub trait ReadFile: Send + Sync + Debug {
    /// The whole file in place (mapped). A page the device cannot read kills the process with
    /// SIGBUS when touched: the broker's segment reads use [`ReadFile::read_at`] instead.
    fn bytes(&self) -> &[u8];
    /// Fills `buf` from byte `pos` with `pread`: a media error is an `Err` (EIO), never a
    /// signal. Fails if the file is shorter.
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<()>;
    /// The file's length (without touching its pages).
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The file-system operations of the gateway. Paths are absolute or relative to the process.
pub trait Fs: Send + Sync + Debug {
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Names of the entries of a directory, sorted.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    fn is_dir(&self, path: &Path) -> bool;
    fn exists(&self, path: &Path) -> bool;
    /// Creates (or truncates) a file for writing.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>>;
    /// Creates a file that must not exist yet, for a secret: mode 0600, or the owner, group and
    /// mode of the file at `like` when there is one (owner first: a chown may clear set-id bits).
    fn create_private(&self, path: &Path, like: &Path) -> io::Result<Arc<dyn WriteFile>>;
    /// Opens an existing file for reading and writing.
    fn open_write(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>>;
    /// Opens a file that is no longer written, for reading in place.
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>>;
    /// Reads a whole file into memory (small files, and files still being written).
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn file_len(&self, path: &Path) -> io::Result<u64>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty directory.
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// fsync of a directory: makes created, renamed and removed entries durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Bytes an unprivileged writer may still allocate on the file system holding `path`.
    /// File systems that cannot tell report no limit.
    fn available_space(&self, path: &Path) -> io::Result<u64> {
        let _ = path;
        Ok(u64::MAX)
    }
}

/// Whether an I/O error means the device (or the user's quota) is full.
pub fn is_no_space(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || err.kind() == io::ErrorKind::StorageFull
}

/// How [`write_atomic`] creates the file that replaces the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NewFile {
    /// The process's default mode, through `{path}.tmp` (created or truncated): files only
    /// this process writes, the log's and the upstream's.
    #[default]
    Plain,
    /// A secret another program may replace too (`tern passwd`): `.{name}.tmp-{pid}` beside
    /// it, created exclusively with mode 0600 or the replaced file's owner, group and mode.
    Private,
}

/// Replaces `path` with `data` atomically and durably: a temporary file in the same directory,
/// written and fdatasync'd, renamed over `path`, the directory fsync'd. Once this returns Ok a
/// power cut leaves `data`; before, it leaves the old file or `data`, never a mix, and never a
/// missing file where there was one. A failed write removes its temporary file (a full device
/// must not be left fuller). Blocking: async code calls it through `spawn_blocking`.
pub fn write_atomic(fs: &dyn Fs, path: &Path, data: &[u8], new: NewFile) -> io::Result<()> {
    let tmp = temporary(path, new);
    let written = match new {
        NewFile::Plain => fs.create(&tmp),
        NewFile::Private => fs.create_private(&tmp, path),
    }
    .and_then(|file| {
        file.write_at(0, data)?;
        file.sync_data()
    })
    .and_then(|()| fs.rename(&tmp, path));
    if let Err(err) = written {
        let _ = fs.remove(&tmp);
        return Err(err);
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    fs.sync_dir(parent.unwrap_or(Path::new(".")))
}

/// The temporary file [`write_atomic`] writes before renaming it over `path`.
fn temporary(path: &Path, new: NewFile) -> PathBuf {
    match new {
        NewFile::Plain => {
            let mut tmp = path.as_os_str().to_owned();
            tmp.push(".tmp");
            PathBuf::from(tmp)
        }
        NewFile::Private => {
            let name = path
                .file_name()
                .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
            path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
        }
    }
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

#[derive(Debug)]
struct RealFile(File);

impl WriteFile for RealFile {
    fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, pos)
    }
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_exact_at(buf, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn start_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (Ok(pos), Ok(len)) = (libc::off64_t::try_from(pos), libc::off64_t::try_from(len))
        else {
            return Ok(());
        };
        // SAFETY: sync_file_range only reads the descriptor number, which `self.0` keeps open.
        let rc = unsafe {
            libc::sync_file_range(self.0.as_raw_fd(), pos, len, libc::SYNC_FILE_RANGE_WRITE)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let before = self.len()?;
        let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("length too large"))?;
        // SAFETY: fallocate only reads the descriptor number, which `self.0` keeps open.
        let rc = unsafe { libc::fallocate(self.0.as_raw_fd(), 0, 0, len) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(()),
            _ => {
                // A failed fallocate may keep what it allocated: give it back.
                let _ = self.0.set_len(before);
                Err(err)
            }
        }
    }
}

/// A sealed file: its descriptor (for `pread`) and its mapping (none when empty).
#[derive(Debug)]
struct Mapped {
    file: File,
    map: Option<memmap2::Mmap>,
}

impl ReadFile for Mapped {
    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or_default()
    }
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, pos)
    }
    fn len(&self) -> u64 {
        self.map.as_ref().map_or(0, |map| map.len() as u64)
    }
}

impl Fs for RealFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }
    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Arc::new(RealFile(file)))
    }
    fn create_private(&self, path: &Path, like: &Path) -> io::Result<Arc<dyn WriteFile>> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let keep = match std::fs::metadata(like) {
            Ok(meta) => Some(meta),
            Err(err) if err.kind() == io::ErrorKind::NotFound => None,
            Err(err) => return Err(err),
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        if let Some(old) = keep {
            std::os::unix::fs::fchown(&file, Some(old.uid()), Some(old.gid()))?;
            file.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))?;
        }
        Ok(Arc::new(RealFile(file)))
    }
    fn open_write(&self, path: &Path) -> io::Result<Arc<dyn WriteFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(RealFile(file)))
    }
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadFile>> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Ok(Arc::new(Mapped { file, map: None }));
        }
        // SAFETY: the log maps only sealed files, which it never writes or truncates again;
        // deleting a mapped file keeps the mapping valid on Linux.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(Arc::new(Mapped {
            file,
            map: Some(map),
        }))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        Ok(std::fs::metadata(path)?.len())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
    fn available_space(&self, path: &Path) -> io::Result<u64> {
        Ok(crate::sys::statvfs(path)?.available)
    }
}
