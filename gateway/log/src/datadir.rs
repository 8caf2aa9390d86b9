//! The data directory: its lock and its format marker.
//!
//! The lock: one tern process per directory, enforced with an advisory `flock` on `LOCK`, which
//! also records the holder's process id for the error message. It is released by the kernel
//! when the process exits, however it exits, so a crash never leaves a stale lock behind.
//!
//! The format marker `<log>/FORMAT` names the format version of the whole log directory. It is
//! written when the log is created, and checked before anything else is read; then every file
//! that carries a version of its own (segment and index headers, `topic.meta`, `cursors.log`)
//! is checked, still before anything is written. A version this build does not read refuses to
//! open the log and changes nothing: a downgrade never rewrites a newer tern's data. A log
//! directory without a marker was written by a tern from before the marker (format 1): it is
//! accepted when every file is format 1, and gets its marker.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::batch::{
    DecodeError, FORMAT_VERSION, Reader, SEGMENT_HEADER_LEN, SegmentHeader, check_version,
};
use super::cursors::{self, CURSORS_FILE};
use super::error::{LogError, Result};
use super::fs::{self as log_fs, Fs, RealFs};
use super::index::IndexView;
use super::{clock, meta, segment, topic_config};

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

/// Name of the format marker inside the log directory.
pub const FORMAT_FILE: &str = "FORMAT";
const FORMAT_MAGIC: [u8; 8] = *b"TERNFMT\0";
const FORMAT_LEN: usize = 16;

/// The marker's bytes: magic, version u16, reserved u16, CRC32C of bytes 0..12.
fn encode_marker(version: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(FORMAT_LEN);
    out.extend_from_slice(&FORMAT_MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode_marker(bytes: &[u8]) -> Result<u16, DecodeError> {
    let mut r = Reader::new(bytes);
    if r.take(8)? != FORMAT_MAGIC {
        return Err(DecodeError::Corrupt("not a tern format marker"));
    }
    let version = r.u16()?;
    let _reserved = r.u16()?;
    let stored = r.u32()?;
    let got = crc32c::crc32c(bytes.get(..12).unwrap_or_default());
    if stored != got || !r.is_empty() {
        return Err(DecodeError::Checksum {
            expected: stored,
            got,
        });
    }
    check_version(version).map(|()| version)
}

/// Checks the log directory `log_dir` (normally `<data_dir>/log`) on the real file system
/// without changing anything: what `tern serve` runs before it takes the lock and the tools run
/// before they read. `Ok` for a directory that does not exist yet.
pub fn check_format(log_dir: &Path) -> Result<()> {
    check_format_with(&RealFs, log_dir).map(drop)
}

/// [`check_format`] on `fs`: the marker's version when the directory has one, `None` when
/// it has none (new, or written before the marker existed).
pub(crate) fn check_format_with(fs: &dyn Fs, log_dir: &Path) -> Result<Option<u16>> {
    if !fs.is_dir(log_dir) {
        return Ok(None);
    }
    let path = log_dir.join(FORMAT_FILE);
    let mut marked = None;
    if fs.exists(&path) {
        let bytes = fs.read(&path).map_err(|e| LogError::io("read", &path, e))?;
        match decode_marker(&bytes) {
            Ok(version) => marked = Some(version),
            Err(err) => return Err(LogError::version("data directory", &path, &err).unwrap_or_else(|| {
                LogError::Corrupt {
                    path: path.clone(),
                    position: 0,
                    reason: format!(
                        "damaged format marker ({err}); if every other file is intact, remove it and tern checks them all and writes a new one"
                    ),
                }
            })),
        }
    }
    check_files(fs, log_dir)?;
    Ok(marked)
}

/// The version check of every file that carries one; damage is left to recovery.
fn check_files(fs: &dyn Fs, log_dir: &Path) -> Result<()> {
    let clock = log_dir.join(clock::CLOCK_FILE);
    if let Ok(bytes) = fs.read(&clock) {
        clock::check_version(&clock, &bytes)?;
    }
    let cursors = log_dir.join(CURSORS_FILE);
    if fs.exists(&cursors) {
        let bytes = fs
            .read(&cursors)
            .map_err(|e| LogError::io("read", &cursors, e))?;
        if let Some(found) =
            cursors::header_version(&bytes).filter(|v| !(1..=FORMAT_VERSION).contains(v))
        {
            return Err(LogError::UnsupportedVersion {
                path: cursors,
                what: "cursor log",
                found,
                supported: FORMAT_VERSION,
            });
        }
    }
    let topics = meta::topics_dir(log_dir);
    let names = if fs.is_dir(&topics) {
        fs.list_dir(&topics)
            .map_err(|e| LogError::io("list", &topics, e))?
    } else {
        Vec::new()
    };
    for name in names {
        let dir = topics.join(&name);
        let meta_path = dir.join(meta::TOPIC_META);
        if let Ok(bytes) = fs.read(&meta_path) {
            refuse("topic metadata", &meta_path, meta::decode(&bytes).map(drop))?;
        }
        let config_path = dir.join(topic_config::TOPIC_CONFIG);
        if let Ok(bytes) = fs.read(&config_path) {
            refuse(
                "topic settings",
                &config_path,
                topic_config::decode(&bytes).map(drop),
            )?;
        }
        let parts = fs.list_dir(&dir).unwrap_or_default();
        for part in parts
            .iter()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        {
            check_partition(fs, &dir.join(part))?;
        }
    }
    Ok(())
}

fn check_partition(fs: &dyn Fs, dir: &Path) -> Result<()> {
    for name in fs.list_dir(dir).unwrap_or_default() {
        let path = dir.join(&name);
        if segment::parse_log_name(&name).is_some() {
            let Ok(file) = fs.open_read(&path) else {
                continue;
            };
            let head = file.bytes().get(..SEGMENT_HEADER_LEN).unwrap_or_default();
            refuse("segment", &path, SegmentHeader::decode(head).map(drop))?;
        } else if let Some(time) = index_kind(&name) {
            if let Ok(bytes) = fs.read(&path) {
                refuse("index", &path, IndexView::parse(&bytes, time).map(drop))?;
            }
        }
    }
    Ok(())
}

/// Whether `name` is a time index (`Some(true)`), an offset index or neither.
fn index_kind(name: &str) -> Option<bool> {
    let (stem, time) = match name.rsplit_once('.') {
        Some((stem, "index")) => (stem, false),
        Some((stem, "timeindex")) => (stem, true),
        _ => return None,
    };
    segment::parse_log_name(&format!("{stem}.log")).map(|_| time)
}

/// Turns a decoder's unsupported version into the refusal; damage passes.
fn refuse(what: &'static str, path: &Path, decoded: Result<(), DecodeError>) -> Result<()> {
    match decoded {
        Err(err) => LogError::version(what, path, &err).map_or(Ok(()), Err),
        Ok(()) => Ok(()),
    }
}

/// Writes the format marker into `log_dir` if it has none or an older one (after
/// [`check_format_with`] passed): at creation, once for a directory of a tern from before the
/// marker, and once for a directory of format 1, whose files format 2 reads as they are (only
/// segments written from now on may hold batches of format 2).
pub(crate) fn ensure_marker(
    fs: &dyn Fs,
    log_dir: &Path,
    marked: Option<u16>,
    had_files: bool,
) -> Result<()> {
    if marked == Some(FORMAT_VERSION) {
        return Ok(());
    }
    let path = log_dir.join(FORMAT_FILE);
    // Best-effort (a full card must not keep tern down): without it every file's own version
    // still guards the directory, and the next start tries again.
    if let Err(err) = log_fs::write_atomic(
        fs,
        &path,
        &encode_marker(FORMAT_VERSION),
        log_fs::NewFile::Plain,
    ) {
        tracing::warn!(path = %path.display(), %err, "cannot write the format marker; trying again at the next start");
        return Ok(());
    }
    match marked {
        Some(old) => {
            tracing::info!(path = %path.display(), from = old, to = FORMAT_VERSION, "log directory of an older format: its files are read as they are; marker rewritten");
        }
        None if had_files => {
            tracing::info!(path = %path.display(), version = FORMAT_VERSION, "log directory from before the format marker: every file is of format 1; marker written");
        }
        None => {}
    }
    Ok(())
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

    #[test]
    fn marker_golden_bytes_and_versions() {
        let bytes = encode_marker(2);
        assert_eq!(bytes.get(..12), Some(&b"TERNFMT\0\x02\x00\x00\x00"[..]));
        assert_eq!(decode_marker(&bytes), Ok(2));
        assert_eq!(decode_marker(&encode_marker(1)), Ok(1));
        assert_eq!(
            decode_marker(&encode_marker(3)),
            Err(DecodeError::UnsupportedVersion {
                found: 3,
                supported: 2
            })
        );
        let mut flipped = bytes.clone();
        if let Some(b) = flipped.get_mut(8) {
            *b = 3;
        }
        assert!(matches!(
            decode_marker(&flipped),
            Err(DecodeError::Checksum { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn marker_decoding_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            let decoded = decode_marker(&bytes);
            proptest::prop_assert!(
                decoded.is_err() || bytes == encode_marker(1) || bytes == encode_marker(2)
            );
        }
    }
}
