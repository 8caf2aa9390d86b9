//! Topic metadata on disk: `topics/<name>/topic.meta` holds the partition count, written by
//! temp file + fdatasync + rename + directory fsync, so it is either absent or complete. It is
//! the commit point of every topic change: creating (written last), adding partitions (the new
//! partitions' directories first, then the file is replaced with the larger count) and
//! deleting (removed first, then the files). A topic directory without valid metadata is an
//! interrupted creation or deletion: it is ignored, and creating the topic again clears it.
//!
//! Never rewritten in place; knows segments only as files to remove.

use std::path::{Path, PathBuf};

use super::TopicInfo;
use super::batch::{DecodeError, FILE_VERSION_1, Reader, check_version};
use super::cache::FileCache;
use super::error::{LogError, Result};
use super::fs::{self, Fs};
use super::topic_config::{self, TopicConfig};

/// File name of a topic's metadata inside its directory.
pub const TOPIC_META: &str = "topic.meta";
const MAGIC: [u8; 8] = *b"TERNTOP\0";

/// Directory holding one directory per topic.
pub fn topics_dir(log_dir: &Path) -> PathBuf {
    log_dir.join("topics")
}

/// Directory of one partition.
pub fn partition_dir(log_dir: &Path, topic: &str, partition: u32) -> PathBuf {
    topics_dir(log_dir).join(topic).join(partition.to_string())
}

pub fn encode(partitions: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FILE_VERSION_1.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&partitions.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The partition count stored in a metadata file.
pub fn decode(bytes: &[u8]) -> Result<u32, DecodeError> {
    let mut r = Reader::new(bytes);
    if r.take(8)? != MAGIC {
        return Err(DecodeError::Corrupt("not a tern topic metadata file"));
    }
    let version = r.u16()?;
    let _reserved = r.u16()?;
    let partitions = r.u32()?;
    let stored = r.u32()?;
    let got = crc32c::crc32c(bytes.get(..16).unwrap_or_default());
    if stored != got {
        return Err(DecodeError::Checksum {
            expected: stored,
            got,
        });
    }
    check_version(version)?;
    if partitions == 0 {
        return Err(DecodeError::Corrupt("topic with zero partitions"));
    }
    Ok(partitions)
}

/// Every complete topic under `log_dir`, by name.
pub fn list(fs: &dyn Fs, log_dir: &Path) -> Result<Vec<TopicInfo>> {
    let dir = topics_dir(log_dir);
    if !fs.exists(&dir) {
        return Ok(Vec::new());
    }
    let names = fs
        .list_dir(&dir)
        .map_err(|e| LogError::io("list", &dir, e))?;
    let mut topics = Vec::new();
    for name in names {
        let path = dir.join(&name).join(TOPIC_META);
        match fs.read(&path).ok().map(|b| decode(&b)) {
            Some(Ok(partitions)) => topics.push(TopicInfo { name, partitions }),
            Some(Err(err)) => {
                tracing::warn!(path = %path.display(), %err, "ignoring topic with damaged metadata");
            }
            None => {
                tracing::warn!(topic = %name, "ignoring topic whose creation or deletion was interrupted")
            }
        }
    }
    Ok(topics)
}

/// Creates the directories of a topic, its settings (`topic_config.rs`) and then, as the commit
/// point, its metadata. Leftovers of an interrupted deletion of the same name are removed first.
pub fn create(
    fs: &dyn Fs,
    log_dir: &Path,
    name: &str,
    partitions: u32,
    config: &TopicConfig,
) -> Result<()> {
    let dir = topics_dir(log_dir).join(name);
    if fs.exists(&dir) {
        remove_tree(fs, None, &dir)?;
    }
    make_partitions(fs, &dir, 0..partitions)?;
    let topics = topics_dir(log_dir);
    fs.sync_dir(&topics)
        .map_err(|e| LogError::io("fsync directory", &topics, e))?;
    topic_config::write(fs, &dir, config)?;
    let path = dir.join(TOPIC_META);
    fs::write_atomic(fs, &path, &encode(partitions), fs::NewFile::Plain)
        .map_err(|e| LogError::io("write", &path, e))
}

/// Adds partitions `from..to` to a topic: their (emptied) directories, then the metadata.
pub fn grow(fs: &dyn Fs, log_dir: &Path, name: &str, from: u32, to: u32) -> Result<()> {
    let dir = topics_dir(log_dir).join(name);
    for p in from..to {
        let part = dir.join(p.to_string());
        if fs.exists(&part) {
            remove_tree(fs, None, &part)?;
        }
    }
    make_partitions(fs, &dir, from..to)?;
    fs.sync_dir(&dir)
        .map_err(|e| LogError::io("fsync directory", &dir, e))?;
    let path = dir.join(TOPIC_META);
    fs::write_atomic(fs, &path, &encode(to), fs::NewFile::Plain)
        .map_err(|e| LogError::io("write", &path, e))
}

/// Deletes a topic: its metadata (the commit point), then every file and directory of it.
pub fn delete(fs: &dyn Fs, cache: &FileCache, log_dir: &Path, name: &str) -> Result<()> {
    let dir = topics_dir(log_dir).join(name);
    let path = dir.join(TOPIC_META);
    fs.remove(&path)
        .map_err(|e| LogError::io("remove", &path, e))?;
    fs.sync_dir(&dir)
        .map_err(|e| LogError::io("fsync directory", &dir, e))?;
    remove_tree(fs, Some(cache), &dir)?;
    let topics = topics_dir(log_dir);
    fs.sync_dir(&topics)
        .map_err(|e| LogError::io("fsync directory", &topics, e))
}

fn make_partitions(fs: &dyn Fs, dir: &Path, ids: std::ops::Range<u32>) -> Result<()> {
    for p in ids {
        let part = dir.join(p.to_string());
        fs.create_dir_all(&part)
            .map_err(|e| LogError::io("create directory", &part, e))?;
    }
    Ok(())
}

/// Removes `dir` with everything in it (a topic's or a partition's directory: files and one
/// level of directories below); each directory's removals are synced before it goes.
fn remove_tree(fs: &dyn Fs, cache: Option<&FileCache>, dir: &Path) -> Result<()> {
    let names = fs.list_dir(dir).map_err(|e| LogError::io("list", dir, e))?;
    for name in names {
        let path = dir.join(name);
        if fs.is_dir(&path) {
            remove_tree(fs, cache, &path)?;
            continue;
        }
        if let Some(cache) = cache {
            cache.forget(&path);
        }
        fs.remove(&path)
            .map_err(|e| LogError::io("remove", &path, e))?;
    }
    fs.sync_dir(dir)
        .map_err(|e| LogError::io("fsync directory", dir, e))?;
    fs.remove_dir(dir)
        .map_err(|e| LogError::io("remove directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_golden_bytes() {
        let bytes = encode(3);
        assert_eq!(
            bytes.get(..16),
            Some(&b"TERNTOP\0\x01\x00\x00\x00\x03\x00\x00\x00"[..])
        );
        assert_eq!(decode(&bytes), Ok(3));
        let mut bad = bytes.clone();
        if let Some(b) = bad.get_mut(12) {
            *b = 4;
        }
        assert!(matches!(decode(&bad), Err(DecodeError::Checksum { .. })));
    }
}
