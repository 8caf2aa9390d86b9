//! The operating-system calls the gateway makes outside `std`: `statvfs` (space and read-only
//! flag of a file system) and the open-files limit (`getrlimit`/`setrlimit` of
//! `RLIMIT_NOFILE`). Each is one safe function here, so `unsafe` and the C structs' widths
//! (32 bits on armv7, 64 on aarch64 and x86_64) stay in one place.
//!
//! It only asks and sets what the caller names; it never decides a policy (how much space is
//! enough, which limit to want) and never logs. [`set_fd_limit`] allocates nothing, so a child's
//! `pre_exec` may call it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why an OS call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SysError {
    /// The call itself failed; `source` is its errno.
    #[error("{call}: {source}")]
    Call {
        call: &'static str,
        source: std::io::Error,
    },
    /// A path the C call cannot take: it holds a NUL byte.
    #[error("{call}: the path {} holds a NUL byte", path.display())]
    NulInPath { call: &'static str, path: PathBuf },
}

impl From<SysError> for std::io::Error {
    /// The call's own errno (so `ErrorKind` survives), or `InvalidInput` for a bad path.
    fn from(err: SysError) -> Self {
        match err {
            SysError::Call { source, .. } => source,
            other @ SysError::NulInPath { .. } => {
                Self::new(std::io::ErrorKind::InvalidInput, other)
            }
        }
    }
}

fn last_error(call: &'static str) -> SysError {
    SysError::Call {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// What `statvfs` says of a file system, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    /// Size of the file system.
    pub total: u64,
    /// Free space an unprivileged writer may use (`f_bavail`, without the root reserve).
    pub available: u64,
    /// Mounted read-only (`ST_RDONLY`).
    pub read_only: bool,
}

/// `statvfs` of the file system holding `path`.
pub fn statvfs(path: &Path) -> Result<FsSpace, SysError> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError::NulInPath {
        call: "statvfs",
        path: path.to_owned(),
    })?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is NUL-terminated and `st` is a valid out-pointer for the call.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(last_error("statvfs"));
    }
    let (block, blocks, avail) = widen(st.f_frsize, st.f_blocks, st.f_bavail);
    Ok(FsSpace {
        total: blocks.saturating_mul(block),
        available: avail.saturating_mul(block),
        read_only: st.f_flag & libc::ST_RDONLY != 0,
    })
}

/// statvfs's fields are 32 bits wide on armv7 and 64 on aarch64.
#[allow(
    clippy::useless_conversion,
    reason = "the field widths differ by target"
)]
fn widen(
    frsize: libc::c_ulong,
    blocks: libc::fsblkcnt_t,
    avail: libc::fsblkcnt_t,
) -> (u64, u64, u64) {
    (u64::from(frsize), u64::from(blocks), u64::from(avail))
}

/// A process's open-files limit (`RLIMIT_NOFILE`); `u64::MAX` stands for unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// What the kernel enforces now (`ulimit -n`, `ulimit -Sn`).
    pub soft: u64,
    /// How far an unprivileged process may raise `soft` (`ulimit -Hn`).
    pub hard: u64,
}

/// `rlim_t` is u32 on armv7 and u64 on aarch64 and x86_64; `RLIM_INFINITY` becomes `u64::MAX`.
#[allow(
    clippy::useless_conversion,
    reason = "rlim_t is u32 on armv7, u64 on aarch64 and x86_64"
)]
fn from_rlim(value: libc::rlim_t) -> u64 {
    if value == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        u64::from(value)
    }
}

/// The inverse of [`from_rlim`]: values past `rlim_t` become `RLIM_INFINITY`.
fn to_rlim(value: u64) -> libc::rlim_t {
    libc::rlim_t::try_from(value).unwrap_or(libc::RLIM_INFINITY)
}

/// This process's open-files limit.
pub fn fd_limit() -> Result<FdLimit, SysError> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own, passed by a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(last_error("getrlimit"));
    }
    Ok(FdLimit {
        soft: from_rlim(limit.rlim_cur),
        hard: from_rlim(limit.rlim_max),
    })
}

/// Sets this process's open-files limit (children inherit it). Allocates nothing.
pub fn set_fd_limit(limit: FdLimit) -> Result<(), SysError> {
    let limit = libc::rlimit {
        rlim_cur: to_rlim(limit.soft),
        rlim_max: to_rlim(limit.hard),
    };
    // SAFETY: setrlimit only reads the struct; a refusal leaves the old limit in place.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(last_error("setrlimit"));
    }
    Ok(())
}

/// Raises the soft open-files limit towards `wanted`, at most to the hard limit; never lowers
/// it. Returns the limit (before, after).
pub fn raise_fd_limit(wanted: u64) -> Result<(FdLimit, FdLimit), SysError> {
    let before = fd_limit()?;
    let soft = wanted.min(before.hard);
    if soft <= before.soft {
        return Ok((before, before));
    }
    let after = FdLimit { soft, ..before };
    set_fd_limit(after)?;
    Ok((before, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_of_a_temp_dir_has_sane_numbers() {
        let dir = std::env::temp_dir();
        let space = statvfs(&dir).expect("statvfs of the temp dir");
        assert!(space.total > 0, "{space:?}");
        assert!(space.available <= space.total, "{space:?}");
        assert!(!space.read_only, "{space:?}");
        let err = statvfs(Path::new("/nonexistent/tern")).expect_err("no such path");
        assert_eq!(
            std::io::Error::from(err).kind(),
            std::io::ErrorKind::NotFound
        );
        let err = statvfs(Path::new("a\0b")).expect_err("a NUL byte");
        assert!(matches!(err, SysError::NulInPath { .. }), "{err}");
        assert_eq!(
            std::io::Error::from(err).kind(),
            std::io::ErrorKind::InvalidInput
        );
    }

    /// What a shell started from this process reports: `ulimit -Sn` and `ulimit -Hn`.
    fn ulimit(flag: &str) -> Option<u64> {
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("ulimit {flag}")])
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        match text.trim() {
            "unlimited" => Some(u64::MAX),
            number => number.parse().ok(),
        }
    }

    #[test]
    fn the_fd_limit_is_what_ulimit_reports_and_raising_never_lowers_it() {
        let limit = fd_limit().expect("getrlimit");
        assert!(limit.soft <= limit.hard, "{limit:?}");
        if let (Some(soft), Some(hard)) = (ulimit("-Sn"), ulimit("-Hn")) {
            assert_eq!(limit, FdLimit { soft, hard }, "a child inherits the limit");
        }
        let (before, after) = raise_fd_limit(0).expect("a no-op");
        assert_eq!((before, after), (limit, limit), "0 never lowers it");
        let (_, raised) = raise_fd_limit(limit.hard).expect("up to the hard limit");
        assert_eq!(raised, fd_limit().expect("getrlimit"));
        assert_eq!(raised.soft, limit.hard, "{raised:?}");
        set_fd_limit(limit).expect("back to the soft limit it had");
        assert_eq!(fd_limit().expect("getrlimit"), limit);
    }
}
