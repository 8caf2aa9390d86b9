//! Mirror mode's idempotent producer: Kafka's own duplicate detection for a resent batch.
//! A plain producer sends every batch with producer id -1, so a batch that a leader held
//! uncommitted (waiting for a dead follower to leave the ISR) while tern reconnected and sent it
//! again was stored twice. Here every batch carries a producer id and epoch from InitProducerId,
//! kept on disk per cluster (`state.rs`, written and read on a blocking thread, never on the
//! runtime) so a restarted gateway keeps them, and base sequence =
//! the first record's edge offset (mod 2^31, Kafka's wrap): a resend of the same edge records is
//! the same sequence, which the leader answers as a duplicate instead of appending it. It owns
//! the identity only: the requests go through the client module (`client/produce.rs`,
//! `client/metadata.rs`), and it never opens a connection itself nor retries: an error ends the
//! session, and the catch-up decides again.

use std::path::PathBuf;
use std::sync::Arc;

use tern_core::fs::RealFs;
use tokio::sync::Mutex;

use crate::client::produce::{self, NO_PRODUCER_ID, Stamp};
use crate::client::{ClientError, Connection, metadata};

pub mod state;

pub use state::{Identity, StateDir};

/// The broker lost or never had this producer's state, or the identity is stale: get a new one.
pub fn needs_new_identity(code: i16) -> bool {
    matches!(code, 47 | 49 | 59)
}

impl Identity {
    /// What this identity's batches say about their producer.
    pub fn stamp(&self) -> Stamp {
        Stamp {
            producer_id: self.producer_id,
            epoch: self.epoch,
            transactional: false,
        }
    }
}

/// The identity of the bench's plain producer: producer id and epoch −1.
fn plain_identity() -> Identity {
    Identity {
        cluster_id: String::new(),
        producer_id: NO_PRODUCER_ID,
        epoch: -1,
    }
}

/// The producer of one upstream cluster: its identity there.
#[derive(Debug)]
pub struct Producer {
    state: Option<StateDir>,
    identity: Mutex<Option<Identity>>,
    /// Bench only (`Ablation::without_idempotence`): batches carry producer id −1
    /// and no sequence numbers, through this same path, so the bench can print what
    /// idempotence costs.
    plain: bool,
}

impl Producer {
    /// A producer whose identities are kept in `state_dir` on the real file system.
    pub fn new(state_dir: Option<PathBuf>) -> Self {
        Self::with_state(state_dir.map(|dir| StateDir::new(Arc::new(RealFs), dir)))
    }

    /// A producer whose identities are kept in `state` (`None`: in memory only).
    pub fn with_state(state: Option<StateDir>) -> Self {
        Self {
            state,
            identity: Mutex::new(None),
            plain: false,
        }
    }

    /// The bench's plain producer: no InitProducerId, producer id −1, no sequence numbers (a
    /// resent batch is stored twice).
    pub fn without_idempotence(self) -> Self {
        Self {
            plain: true,
            ..self
        }
    }

    /// This gateway's producer identity at the cluster: the one in memory, else the one stored
    /// for the cluster's id, else a new one from InitProducerId (stored before it is used),
    /// asked over `connection` (any broker of the cluster).
    pub async fn identity(&self, connection: &mut Connection) -> Result<Identity, ClientError> {
        if self.plain {
            return Ok(plain_identity());
        }
        let mut guard = self.identity.lock().await;
        if let Some(identity) = guard.as_ref() {
            return Ok(identity.clone());
        }
        let metadata = metadata::metadata(connection, None).await?;
        let cluster_id = metadata
            .cluster_id
            .as_ref()
            .map(|id| id.as_str().to_owned())
            .unwrap_or_default();
        if let Some(stored) = self.load(&cluster_id).await {
            tracing::info!(cluster = %cluster_id, producer_id = stored.producer_id, epoch = stored.epoch, "upstream producer identity from the state file");
            *guard = Some(stored.clone());
            return Ok(stored);
        }
        let (producer_id, epoch) =
            produce::init_producer_id(connection, None, produce::IDEMPOTENT_TXN_TIMEOUT).await?;
        let identity = Identity {
            cluster_id,
            producer_id,
            epoch,
        };
        self.store(&identity).await?;
        tracing::info!(cluster = %identity.cluster_id, producer_id = identity.producer_id, epoch = identity.epoch, "new upstream producer identity");
        *guard = Some(identity.clone());
        Ok(identity)
    }

    /// The identity in use if it is known without asking the cluster (the bench's plain one
    /// always is).
    pub async fn cached(&self) -> Option<Identity> {
        if self.plain {
            return Some(plain_identity());
        }
        self.identity.lock().await.clone()
    }

    /// Forgets `stale` (if it is still the identity in use), so the next batch gets a new one:
    /// after the broker refused it, or before sending sequences that do not follow on from what
    /// the partition holds.
    pub async fn renew(&self, stale: &Identity) {
        let mut guard = self.identity.lock().await;
        if guard.as_ref() == Some(stale) {
            tracing::info!(
                producer_id = stale.producer_id,
                "renewing the upstream producer identity"
            );
            *guard = None;
            if let Some(state) = self.state.clone() {
                let cluster_id = stale.cluster_id.clone();
                let _ = tokio::task::spawn_blocking(move || state.forget(&cluster_id)).await;
            }
        }
    }

    /// The identity stored for `cluster_id`, read on a blocking thread.
    async fn load(&self, cluster_id: &str) -> Option<Identity> {
        let state = self.state.clone()?;
        let cluster_id = cluster_id.to_owned();
        tokio::task::spawn_blocking(move || state.load(&cluster_id))
            .await
            .ok()
            .flatten()
    }

    /// Stores `identity` durably before it is used, on a blocking thread (the fsyncs of an SD
    /// card take tens of milliseconds: never on the runtime).
    async fn store(&self, identity: &Identity) -> Result<(), ClientError> {
        let Some(state) = self.state.clone() else {
            return Ok(());
        };
        let path = state.path(&identity.cluster_id);
        let owned = identity.clone();
        tokio::task::spawn_blocking(move || state.store(&owned))
            .await
            .unwrap_or_else(|join| Err(std::io::Error::other(join)))
            .map_err(|source| ClientError::State { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::produce::{OutRecord, SEQUENCE_WRAP, encode_batch, sequence_of};
    use crate::config::Codec;

    #[test]
    fn sequences_are_edge_offsets_wrapping_like_kafka() {
        assert_eq!(sequence_of(0), 0);
        assert_eq!(sequence_of(7984), 7984);
        assert_eq!(sequence_of(SEQUENCE_WRAP - 1), i32::MAX);
        assert_eq!(sequence_of(SEQUENCE_WRAP), 0);
        assert_eq!(sequence_of(3 * SEQUENCE_WRAP + 5), 5);
    }

    /// The bench's plain producer: producer id, epoch and base sequence −1 in the batch header
    /// (RecordBatch v2: base offset 8, length 4, leader epoch 4, magic 1, crc 4, attributes 2,
    /// last offset delta 4, two timestamps 16, then producer id 8, epoch 2, base sequence 4).
    #[test]
    fn a_plain_batch_has_no_producer_id_and_no_sequence() {
        let record = || OutRecord {
            key: None,
            value: b"v".to_vec(),
            headers: Default::default(),
            timestamp_ms: 0,
        };
        let header = |identity: &Identity| {
            let records = vec![record(), record(), record()];
            let batch =
                encode_batch(identity.stamp(), 7984, records, Codec::None).expect("encodes");
            // One batch (Produce takes one per partition): its length field covers the rest.
            let length = bytes::Buf::get_u32(&mut batch.get(8..12).expect("a batch length"));
            assert_eq!(length as usize + 12, batch.len(), "one batch");
            batch
                .get(43..57)
                .map(<[u8]>::to_vec)
                .expect("a batch header")
        };
        let plain = Identity {
            cluster_id: String::new(),
            producer_id: NO_PRODUCER_ID,
            epoch: -1,
        };
        assert_eq!(header(&plain), [0xff; 14]);
        let idempotent = Identity {
            producer_id: 5,
            epoch: 0,
            ..plain
        };
        // Big-endian on the wire: producer id 5, epoch 0, base sequence 7984 = 0x1f30.
        let expected = [0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0x1f, 0x30];
        assert_eq!(header(&idempotent), expected);
    }
}
