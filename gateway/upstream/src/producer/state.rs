//! The idempotent producer's identity on disk: one small file per upstream cluster,
//! `producer-{cluster id}.state` in the upstream state directory, holding the producer id and
//! epoch Kafka assigned (InitProducerId), so a restarted gateway resends a batch under the same
//! identity and the broker recognises it. The sequence numbers are not stored: they are the edge
//! offsets (`super::sequence_of`). Format (little endian): magic `TPID`, version 1, cluster id
//! length (u16) and bytes, producer id (i64), epoch (i16), CRC-32C of everything before it.
//! Written through tern-core's `fs::write_atomic` (a temporary file, fdatasync'd, renamed over
//! the old one, the directory fsync'd) on an [`Fs`], so the power-cut simulation covers it
//! (`state/test.rs`, the power-cut sweep); it never opens a file itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tern_core::fs::{Fs, NewFile, write_atomic};

const MAGIC: &[u8; 4] = b"TPID";
const VERSION: u8 = 1;

/// A producer id and epoch assigned by one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub cluster_id: String,
    pub producer_id: i64,
    pub epoch: i16,
}

/// Why a state file does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("not a producer state file (magic)")]
    Magic,
    #[error("producer state version {0} is unknown")]
    Version(u8),
    #[error("producer state is truncated")]
    Truncated,
    #[error("producer state checksum mismatch")]
    Checksum,
    #[error("producer state cluster id is not UTF-8")]
    ClusterId,
}

impl Identity {
    pub fn encode(&self) -> Vec<u8> {
        let id = self.cluster_id.as_bytes();
        let id = id.get(..usize::from(u16::MAX)).unwrap_or(id);
        let mut out = Vec::with_capacity(4 + 1 + 2 + id.len() + 8 + 2 + 4);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&u16::try_from(id.len()).unwrap_or(u16::MAX).to_le_bytes());
        out.extend_from_slice(id);
        out.extend_from_slice(&self.producer_id.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a state file; never panics on any input.
    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        let mut rest = bytes;
        let mut take = |n: usize| -> Result<&[u8], StateError> {
            let (head, tail) = rest.split_at_checked(n).ok_or(StateError::Truncated)?;
            rest = tail;
            Ok(head)
        };
        if take(4)? != MAGIC {
            return Err(StateError::Magic);
        }
        let version = take(1)?.first().copied().ok_or(StateError::Truncated)?;
        if version != VERSION {
            return Err(StateError::Version(version));
        }
        let len = u16::from_le_bytes(take(2)?.try_into().map_err(|_| StateError::Truncated)?);
        let id = take(usize::from(len))?.to_vec();
        let producer_id =
            i64::from_le_bytes(take(8)?.try_into().map_err(|_| StateError::Truncated)?);
        let epoch = i16::from_le_bytes(take(2)?.try_into().map_err(|_| StateError::Truncated)?);
        let crc = u32::from_le_bytes(take(4)?.try_into().map_err(|_| StateError::Truncated)?);
        let body = bytes
            .get(..bytes.len().saturating_sub(4))
            .ok_or(StateError::Truncated)?;
        if !rest.is_empty() || crc32c::crc32c(body) != crc {
            return Err(StateError::Checksum);
        }
        let cluster_id = String::from_utf8(id).map_err(|_| StateError::ClusterId)?;
        Ok(Self {
            cluster_id,
            producer_id,
            epoch,
        })
    }
}

/// The state file of `cluster_id` in `dir` (a cluster id is base64url: safe in a file name;
/// anything else is replaced).
pub fn path(dir: &Path, cluster_id: &str) -> PathBuf {
    let name: String = cluster_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("producer-{name}.state"))
}

/// Why a state file could not be read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: StateError,
    },
}

/// The upstream state directory on a file system (`RealFs` in production, the power-cut
/// simulator in tests). Its calls block: async code runs them through `spawn_blocking`.
#[derive(Debug, Clone)]
pub struct StateDir {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
}

impl StateDir {
    pub fn new(fs: Arc<dyn Fs>, dir: PathBuf) -> Self {
        Self { fs, dir }
    }

    /// The state file of `cluster_id`.
    pub fn path(&self, cluster_id: &str) -> PathBuf {
        path(&self.dir, cluster_id)
    }

    /// The identity stored for `cluster_id`: `None` when there is no file or it is another
    /// cluster's, an error when the file cannot be read or does not decode.
    pub fn read(&self, cluster_id: &str) -> Result<Option<Identity>, StateFileError> {
        let path = self.path(cluster_id);
        let bytes = match self.fs.read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateFileError::Read { path, source }),
        };
        let identity =
            Identity::decode(&bytes).map_err(|source| StateFileError::Decode { path, source })?;
        Ok((identity.cluster_id == cluster_id).then_some(identity))
    }

    /// The identity stored for `cluster_id`, `None` when there is none or it cannot be read
    /// (logged: a new identity is fetched).
    pub fn load(&self, cluster_id: &str) -> Option<Identity> {
        self.read(cluster_id).unwrap_or_else(|err| {
            tracing::warn!(%err, "ignoring the upstream producer state");
            None
        })
    }

    /// Stores `identity` durably, replacing the file whole or not at all
    /// (`tern_core::fs::write_atomic`): once this returns Ok, a power cut leaves this identity
    /// or a newer one being stored, never a damaged file.
    pub fn store(&self, identity: &Identity) -> std::io::Result<()> {
        self.fs.create_dir_all(&self.dir)?;
        let path = self.path(&identity.cluster_id);
        write_atomic(&*self.fs, &path, &identity.encode(), NewFile::Plain)
    }

    /// Removes the state file of `cluster_id` (there may be none).
    pub fn forget(&self, cluster_id: &str) {
        let _ = self.fs.remove(&self.path(cluster_id));
    }
}

#[cfg(test)]
mod test;
