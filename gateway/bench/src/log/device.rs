//! Where the bench writes and how it counts bytes: a loop-mounted ext4 image with the loop
//! device's sectors-written counter (root), or a plain directory with the process's own
//! `write_bytes` (everyone else). Also syncs and evicts the page cache between workloads.
//!
//! Every mount, loop device, image and directory it creates is undone by a guard's `Drop`, also
//! on error. It never touches a block device or mount it did not create itself.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BenchError;

/// How bytes reaching storage are counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counter {
    /// Sectors written to this loop device (`/sys/block/<name>/stat`, 7th field × 512): includes
    /// the file system's journal and metadata.
    Device { name: String },
    /// `write_bytes` of `/proc/self/io`: this process's data only, no file-system overhead.
    Process,
}

/// The directory the workloads run in, with its byte counter.
#[derive(Debug)]
pub struct Target {
    counter: Counter,
    /// Why the loop device is not used, if it is not.
    fallback_reason: Option<String>,
    /// Human description of the file system under test.
    description: String,
    // Field order matters: the mount goes before the work directory that holds its image.
    mount: Option<LoopMount>,
    work: WorkDir,
}

impl Target {
    /// Prepares a target under `parent`: a loop-mounted ext4 image of `image_bytes` when
    /// `use_loop` and root, else a fresh directory counted by `write_bytes`.
    pub fn prepare(parent: &Path, image_bytes: u64, use_loop: bool) -> Result<Self, BenchError> {
        let work = WorkDir::create(parent)?;
        let reason = if !use_loop {
            "--no-loop given".to_owned()
        } else if !is_root() {
            "not running as root".to_owned()
        } else {
            match LoopMount::create(work.path(), image_bytes) {
                Ok(mount) => return Ok(Self::on_loop(mount, work, image_bytes)),
                Err(err) => format!("loop mount failed: {err}"),
            }
        };
        let description = format!(
            "directory {} (file system of the host)",
            work.path().display()
        );
        Ok(Self {
            counter: Counter::Process,
            fallback_reason: Some(reason),
            description,
            mount: None,
            work,
        })
    }

    fn on_loop(mount: LoopMount, work: WorkDir, image_bytes: u64) -> Self {
        let description = format!(
            "ext4 on {} ({} MiB sparse image, noatime{})",
            mount.device,
            image_bytes >> 20,
            if mount.direct_io {
                ", loop direct-io"
            } else {
                ""
            }
        );
        Self {
            counter: Counter::Device {
                name: mount.device_name(),
            },
            fallback_reason: None,
            description,
            mount: Some(mount),
            work,
        }
    }

    /// The directory every workload writes under.
    pub fn dir(&self) -> PathBuf {
        match &self.mount {
            Some(mount) => mount.mountpoint.clone(),
            None => self.work.path().join("data"),
        }
    }

    pub fn counter(&self) -> &Counter {
        &self.counter
    }

    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// Bytes written so far by the counter's measure.
    pub fn written(&self) -> Result<u64, BenchError> {
        let (path, parsed) = match &self.counter {
            Counter::Device { name } => {
                let path = PathBuf::from(format!("/sys/block/{name}/stat"));
                let text = read(&path)?;
                (path, parse_sectors_written(&text).map(|s| s * 512))
            }
            Counter::Process => {
                let path = PathBuf::from("/proc/self/io");
                let text = read(&path)?;
                (path, parse_write_bytes(&text))
            }
        };
        parsed.ok_or(BenchError::Parse { path })
    }

    /// Writes back everything dirty on the target's file system, so the next counter reading
    /// includes it.
    pub fn sync(&self) -> Result<(), BenchError> {
        let dir = self.dir();
        let file = File::open(&dir).map_err(|source| io("open", &dir, source))?;
        // SAFETY: syncfs only reads the descriptor, which `file` keeps open for the call.
        if unsafe { libc::syncfs(file.as_raw_fd()) } != 0 {
            return Err(io("syncfs", &dir, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Syncs, then evicts `dir`'s files from the page cache so the next read comes from the
    /// device (whole cache via `drop_caches` on the loop target, per file otherwise).
    pub fn drop_cache(&self, dir: &Path) -> Result<(), BenchError> {
        self.sync()?;
        if self.mount.is_some() {
            let path = Path::new("/proc/sys/vm/drop_caches");
            std::fs::write(path, "3\n").map_err(|source| io("write", path, source))?;
        }
        evict_files(dir)
    }
}

/// Whether the process runs with root's privileges.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A unique directory under the given parent, removed with everything in it on drop.
#[derive(Debug)]
struct WorkDir(PathBuf);

impl WorkDir {
    fn create(parent: &Path) -> Result<Self, BenchError> {
        let path = parent.join(format!("tern-bench-{}", std::process::id()));
        std::fs::create_dir_all(path.join("data")).map_err(|source| io("mkdir", &path, source))?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.0) {
            eprintln!("tern bench: cannot remove {}: {err}", self.0.display());
        }
    }
}

/// A sparse ext4 image attached to a loop device and mounted; undone on drop.
#[derive(Debug)]
struct LoopMount {
    image: PathBuf,
    device: String,
    direct_io: bool,
    mountpoint: PathBuf,
    mounted: bool,
}

impl LoopMount {
    fn create(work: &Path, image_bytes: u64) -> Result<Self, BenchError> {
        let image = work.join("ext4.img");
        let file = File::create(&image).map_err(|source| io("create", &image, source))?;
        file.set_len(image_bytes)
            .map_err(|source| io("truncate", &image, source))?;
        drop(file);
        // Initialise inode tables and journal now, so no background thread writes during a
        // workload and pollutes the counter.
        let image_arg = image.display().to_string();
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                &image_arg,
            ],
        )?;
        let (device, direct_io) = attach(&image_arg)?;
        let mut mount = Self {
            image,
            device,
            direct_io,
            mountpoint: work.join("mnt"),
            mounted: false,
        };
        std::fs::create_dir_all(&mount.mountpoint)
            .map_err(|source| io("mkdir", &mount.mountpoint, source))?;
        let mountpoint = mount.mountpoint.display().to_string();
        run(
            "mount",
            &["-t", "ext4", "-o", "noatime", &mount.device, &mountpoint],
        )?;
        mount.mounted = true;
        Ok(mount)
    }

    /// `loop3` for `/dev/loop3`.
    fn device_name(&self) -> String {
        self.device.trim_start_matches("/dev/").to_owned()
    }
}

/// Attaches `image` to a free loop device, with direct I/O to the backing file if the host
/// allows it (so the loop device's speed is the real disk's, not the host's page cache).
fn attach(image: &str) -> Result<(String, bool), BenchError> {
    let direct = run("losetup", &["--find", "--show", "--direct-io=on", image]);
    let (stdout, direct_io) = match direct {
        Ok(stdout) => (stdout, true),
        Err(_) => (run("losetup", &["--find", "--show", image])?, false),
    };
    Ok((stdout.trim().to_owned(), direct_io))
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let mountpoint = self.mountpoint.display().to_string();
        if self.mounted {
            if let Err(err) = run("umount", &[&mountpoint]) {
                eprintln!("tern bench: cannot unmount {mountpoint}: {err}");
            }
        }
        if let Err(err) = run("losetup", &["-d", &self.device]) {
            eprintln!("tern bench: cannot detach {}: {err}", self.device);
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Runs a system tool to completion: its stdout, or an error with its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, BenchError> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| BenchError::Tool {
            program: program.to_owned(),
            message: source.to_string(),
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let message = format!("{} ({})", stderr.trim(), output.status);
        return Err(BenchError::Tool {
            program: program.to_owned(),
            message,
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Asks the kernel to drop the cached pages of every file under `dir`.
fn evict_files(dir: &Path) -> Result<(), BenchError> {
    let entries = std::fs::read_dir(dir).map_err(|source| io("read_dir", dir, source))?;
    for entry in entries {
        let path = entry.map_err(|source| io("read_dir", dir, source))?.path();
        if path.is_dir() {
            evict_files(&path)?;
        } else if let Ok(file) = File::open(&path) {
            // SAFETY: posix_fadvise only reads the descriptor, which `file` keeps open.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, BenchError> {
    std::fs::read_to_string(path).map_err(|source| io("read", path, source))
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> BenchError {
    BenchError::file(op, path, source)
}

/// Sectors written: the 7th field of a `/sys/block/<dev>/stat` line.
pub fn parse_sectors_written(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(6)?.parse().ok()
}

/// The `write_bytes:` value of a `/proc/<pid>/io` file.
pub fn parse_write_bytes(io: &str) -> Option<u64> {
    io.lines()
        .find_map(|line| line.strip_prefix("write_bytes:"))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sectors_written_is_the_seventh_field() {
        let stat = "      54        0     2100        4        1        0        2        3        \
                    0        8       12        0        0        0        0        1        3\n";
        assert_eq!(parse_sectors_written(stat), Some(2));
        assert_eq!(parse_sectors_written("1 2 3"), None);
        assert_eq!(parse_sectors_written("1 2 3 4 5 6 x"), None);
    }

    #[test]
    fn write_bytes_is_found_among_the_io_lines() {
        let io = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\n\
                  write_bytes: 12288\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_write_bytes(io), Some(12288));
        assert_eq!(parse_write_bytes("rchar: 1\n"), None);
    }

    #[test]
    fn a_directory_target_counts_this_process_and_cleans_up() -> Result<(), BenchError> {
        let parent = std::env::temp_dir().join(format!("tern-bench-unit-{}", std::process::id()));
        std::fs::create_dir_all(&parent).map_err(|source| io("mkdir", &parent, source))?;
        let work;
        {
            let target = Target::prepare(&parent, 1 << 20, false)?;
            work = target.work.path().to_owned();
            assert_eq!(target.counter(), &Counter::Process);
            assert_eq!(target.fallback_reason(), Some("--no-loop given"));
            let before = target.written()?;
            std::fs::write(target.dir().join("f"), vec![1u8; 1 << 16])
                .map_err(|source| io("write", &work, source))?;
            target.drop_cache(&target.dir())?;
            assert!(target.written()? >= before, "counter went backwards");
        }
        assert!(!work.exists(), "work directory left behind");
        std::fs::remove_dir_all(&parent).map_err(|source| io("rmdir", &parent, source))
    }
}
