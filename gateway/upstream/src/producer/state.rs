//! The idempotent producer's identity on disk: one small file per upstream cluster,
//! `producer-{cluster id}.state` in the upstream state directory, holding the producer id and
//! epoch Kafka assigned (InitProducerId), so a restarted gateway resends a batch under the same
//! identity and the broker recognises it. The sequence numbers are not stored: they are the edge
//! offsets (`super::sequence_of`). Format (little endian): magic `TPID`, version 1, cluster id
//! length (u16) and bytes, producer id (i64), epoch (i16), CRC-32C of everything before it.
//! Written to a temporary file, synced, renamed over the old one and the directory synced.

use std::io::Write;
use std::path::{Path, PathBuf};

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

/// The identity stored for `cluster_id` in `dir`, `None` when there is none or it does not
/// decode (logged: a new identity is fetched).
pub fn load(dir: &Path, cluster_id: &str) -> Option<Identity> {
    let path = path(dir, cluster_id);
    let bytes = std::fs::read(&path).ok()?;
    match Identity::decode(&bytes) {
        Ok(identity) if identity.cluster_id == cluster_id => Some(identity),
        Ok(_) => None,
        Err(err) => {
            tracing::warn!(path = %path.display(), %err, "ignoring the upstream producer state");
            None
        }
    }
}

/// Stores `identity` in `dir` durably (temporary file, fsync, rename, fsync of the directory).
pub fn store(dir: &Path, identity: &Identity) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = path(dir, &identity.cluster_id);
    let temporary = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&identity.encode())?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn identity() -> Identity {
        Identity {
            cluster_id: "MkU3OEVBNTcwNTJENDM2Qk".into(),
            producer_id: 4711,
            epoch: 3,
        }
    }

    #[test]
    fn an_identity_round_trips_and_every_damage_is_refused() {
        let encoded = identity().encode();
        assert_eq!(Identity::decode(&encoded), Ok(identity()));
        for cut in 0..encoded.len() {
            assert!(Identity::decode(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..encoded.len() {
            let mut flipped = encoded.clone();
            flipped[i] ^= 0x10;
            assert!(Identity::decode(&flipped).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn stored_identities_are_found_again_per_cluster() -> std::io::Result<()> {
        let dir = std::env::temp_dir().join(format!("tern-producer-state-{}", std::process::id()));
        store(&dir, &identity())?;
        assert_eq!(load(&dir, &identity().cluster_id), Some(identity()));
        assert_eq!(load(&dir, "another-cluster"), None);
        std::fs::remove_dir_all(&dir)
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Identity::decode(&bytes);
        }

        #[test]
        fn any_identity_round_trips(id in "[A-Za-z0-9_-]{0,30}", pid in any::<i64>(), epoch in any::<i16>()) {
            let identity = Identity { cluster_id: id, producer_id: pid, epoch };
            prop_assert_eq!(Identity::decode(&identity.encode()), Ok(identity));
        }
    }
}
