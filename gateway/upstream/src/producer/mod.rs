//! Mirror mode's idempotent producer: Kafka's own duplicate detection for a resent batch.
//! rskafka sends every batch with producer id -1, so a batch that a leader held uncommitted
//! (waiting for a dead follower to leave the ISR) while tern reconnected and sent it again was
//! stored twice. Here every batch carries a producer id and epoch from InitProducerId, kept on
//! disk per cluster (`state.rs`) so a restarted gateway keeps them, and base sequence = the
//! first record's edge offset (mod 2^31, Kafka's wrap): a resend of the same edge records is
//! the same sequence, which the leader answers as a duplicate instead of appending it. The
//! requests (Metadata v7, InitProducerId v1, Produce v7, all from Kafka 2.1 to 4.x) are encoded
//! and decoded by the `kafka-protocol` crate's codec and sent over `group/conn.rs`'s connection
//! (TLS, SASL). It never retries: an error ends the session, and the catch-up decides again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::produce_response::ProduceResponse;
use kafka_protocol::messages::{ApiKey, RequestHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use tokio::sync::Mutex;

use crate::config::{Codec, SaslSettings};
use crate::group::GroupError;
use crate::group::conn::{CLIENT_ID, Connection};

pub mod state;

pub use state::Identity;

/// Request versions: the newest non-flexible ones every broker from 2.1 to 4.x accepts.
const METADATA: (i16, i16) = (ApiKey::Metadata as i16, 7);
const INIT_PRODUCER_ID: (i16, i16) = (ApiKey::InitProducerId as i16, 1);
const PRODUCE: (i16, i16) = (ApiKey::Produce as i16, 7);

/// How long the leader may hold an acks=all produce before answering (Kafka's
/// `request.timeout.ms` default); the connection waits a little longer for the answer.
const PRODUCE_TIMEOUT_MS: i32 = 30_000;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const PRODUCE_WAIT: Duration = Duration::from_secs(35);

/// The producer id of a batch without idempotence (and its epoch and sequence are −1 too).
const NO_PRODUCER_ID: i64 = -1;

/// Kafka's sequence numbers are int32 and wrap from `i32::MAX` to 0.
pub const SEQUENCE_WRAP: u64 = 1 << 31;

/// The sequence number of the record at `edge_offset`.
pub fn sequence_of(edge_offset: u64) -> i32 {
    i32::try_from(edge_offset % SEQUENCE_WRAP).unwrap_or(0)
}

/// Kafka error codes the producer acts on.
pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
/// The broker lost or never had this producer's state, or the identity is stale: get a new one.
pub fn needs_new_identity(code: i16) -> bool {
    matches!(code, 47 | 49 | 59)
}

/// The producer of one upstream cluster: its connection settings and its identity.
#[derive(Debug)]
pub struct Producer {
    bootstrap: Vec<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    sasl: Option<SaslSettings>,
    state_dir: Option<PathBuf>,
    identity: Mutex<Option<Identity>>,
    /// Bench only (`UpstreamConfig::bench_without_idempotence`): batches carry producer id −1
    /// and no sequence numbers, through this same path, so the bench can print what
    /// idempotence costs.
    plain: bool,
}

impl Producer {
    pub fn new(
        bootstrap: Vec<String>,
        tls: Option<Arc<rustls::ClientConfig>>,
        sasl: Option<SaslSettings>,
        state_dir: Option<PathBuf>,
    ) -> Self {
        Self {
            bootstrap,
            tls,
            sasl,
            state_dir,
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

    async fn open(&self, addr: &str, timeout: Duration) -> Result<Connection, GroupError> {
        let needed = [
            ("Metadata", METADATA),
            ("InitProducerId", INIT_PRODUCER_ID),
            ("Produce", PRODUCE),
        ];
        Connection::open_for(
            addr,
            self.tls.as_ref(),
            self.sasl.as_ref(),
            timeout,
            &needed,
        )
        .await
    }

    /// A connection to the first bootstrap server that answers.
    async fn bootstrap(&self) -> Result<Connection, GroupError> {
        let mut tried = Vec::new();
        for addr in &self.bootstrap {
            match self.open(addr, REQUEST_TIMEOUT).await {
                Ok(connection) => return Ok(connection),
                Err(err) => tried.push(err.to_string()),
            }
        }
        Err(GroupError::NoBroker {
            tried: tried.join("; "),
        })
    }

    /// This gateway's producer identity at the cluster: the one in memory, else the one stored
    /// for the cluster's id, else a new one from InitProducerId (stored before it is used).
    pub async fn identity(&self) -> Result<Identity, GroupError> {
        if self.plain {
            return Ok(Identity {
                cluster_id: String::new(),
                producer_id: NO_PRODUCER_ID,
                epoch: -1,
            });
        }
        let mut guard = self.identity.lock().await;
        if let Some(identity) = guard.as_ref() {
            return Ok(identity.clone());
        }
        let mut connection = self.bootstrap().await?;
        let metadata = metadata(&mut connection, None).await?;
        let cluster_id = metadata
            .cluster_id
            .as_ref()
            .map(|id| id.as_str().to_owned())
            .unwrap_or_default();
        if let Some(stored) = self
            .state_dir
            .as_deref()
            .and_then(|dir| state::load(dir, &cluster_id))
        {
            tracing::info!(cluster = %cluster_id, producer_id = stored.producer_id, epoch = stored.epoch, "upstream producer identity from the state file");
            *guard = Some(stored.clone());
            return Ok(stored);
        }
        let request = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000);
        let body = call(
            &mut connection,
            "InitProducerId",
            INIT_PRODUCER_ID,
            &request,
        )
        .await?;
        let answer = decode::<InitProducerIdResponse>("InitProducerId", body, INIT_PRODUCER_ID)?;
        if answer.error_code != 0 {
            return Err(GroupError::kafka(
                "InitProducerId",
                answer.error_code,
                String::new(),
            ));
        }
        let identity = Identity {
            cluster_id,
            producer_id: answer.producer_id.0,
            epoch: answer.producer_epoch,
        };
        if let Some(dir) = &self.state_dir {
            state::store(dir, &identity).map_err(|source| GroupError::Io {
                addr: dir.display().to_string(),
                source,
            })?;
        }
        tracing::info!(cluster = %identity.cluster_id, producer_id = identity.producer_id, epoch = identity.epoch, "new upstream producer identity");
        *guard = Some(identity.clone());
        Ok(identity)
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
            if let Some(dir) = &self.state_dir {
                let _ = std::fs::remove_file(state::path(dir, &stale.cluster_id));
            }
        }
    }

    /// A connection to the current leader of `topic`/`partition`.
    pub async fn leader(&self, topic: &str, partition: i32) -> Result<Connection, GroupError> {
        let mut connection = self.bootstrap().await?;
        let metadata = metadata(&mut connection, Some(topic)).await?;
        let leader = metadata
            .topics
            .iter()
            .filter(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .map(|p| (p.error_code, p.leader_id.0));
        let leader = match leader {
            Some((0, leader)) => leader,
            Some((code, _)) => {
                return Err(GroupError::kafka(
                    "Metadata",
                    code,
                    format!(" for {topic}/{partition}"),
                ));
            }
            None => {
                return Err(GroupError::kafka(
                    "Metadata",
                    3,
                    format!(" for {topic}/{partition}"),
                ));
            }
        };
        let broker = metadata
            .brokers
            .iter()
            .find(|b| b.node_id.0 == leader)
            .ok_or_else(|| {
                GroupError::kafka("Metadata", 5, format!(": leader {leader} not listed"))
            })?;
        let host = broker.host.as_str();
        let addr = if host.contains(':') {
            format!("[{host}]:{}", broker.port)
        } else {
            format!("{host}:{}", broker.port)
        };
        self.open(&addr, PRODUCE_WAIT).await
    }
}

/// An upstream record as the producer sends it (`kafka.rs` builds it; the `tern-*` headers are
/// in `headers`, in name order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutRecord {
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: std::collections::BTreeMap<String, Vec<u8>>,
}

/// One batch for Produce: records with producer id, epoch and sequences from `first_offset`.
pub fn encode_batch(
    identity: &Identity,
    first_offset: u64,
    records: Vec<OutRecord>,
    codec: Codec,
) -> Result<Bytes, GroupError> {
    let records: Vec<Record> = records
        .into_iter()
        .zip(first_offset..)
        .zip(0i64..)
        .map(|((record, edge_offset), offset)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: identity.producer_id,
            producer_epoch: identity.epoch,
            timestamp_type: TimestampType::Creation,
            offset,
            // Without a producer id the batch's base sequence is −1; the codec derives it from
            // the first record and keeps records in one batch only while offset − sequence stays
            // the same, so record i gets i − 1.
            sequence: match identity.producer_id {
                NO_PRODUCER_ID => i32::try_from(offset).map_or(-1, |i| i.wrapping_sub(1)),
                _ => sequence_of(edge_offset),
            },
            timestamp: record.timestamp_ms,
            key: record.key.map(Bytes::from),
            value: Some(Bytes::from(record.value)),
            headers: record
                .headers
                .into_iter()
                .map(|(k, v)| (StrBytes::from_string(k), Some(Bytes::from(v))))
                .collect(),
        })
        .collect();
    let compression = match codec {
        Codec::None => Compression::None,
        Codec::Gzip => Compression::Gzip,
        Codec::Lz4 => Compression::Lz4,
        Codec::Snappy => Compression::Snappy,
        Codec::Zstd => Compression::Zstd,
    };
    let options = RecordEncodeOptions {
        version: 2,
        compression,
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &options)
        .map_err(|e| encode_error("Produce", &e))?;
    Ok(buf.freeze())
}

/// Produces one encoded batch to `topic`/`partition` over `leader` with acks=all. A duplicate
/// (the leader already holds this sequence) is success.
pub async fn produce(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
    batch: Bytes,
) -> Result<(), GroupError> {
    let request = ProduceRequest::default()
        .with_transactional_id(None)
        .with_acks(-1)
        .with_timeout_ms(PRODUCE_TIMEOUT_MS)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch)),
                ]),
        ]);
    let body = call(leader, "Produce", PRODUCE, &request).await?;
    let answer = decode::<ProduceResponse>("Produce", body, PRODUCE)?;
    let code = answer
        .responses
        .iter()
        .filter(|t| t.name.0.as_str() == topic)
        .flat_map(|t| t.partition_responses.iter())
        .find(|p| p.index == partition)
        .map(|p| p.error_code);
    match code {
        Some(0 | DUPLICATE_SEQUENCE_NUMBER) => Ok(()),
        Some(code) => Err(GroupError::kafka(
            "Produce",
            code,
            format!(" for {topic}/{partition}"),
        )),
        None => Err(GroupError::kafka(
            "Produce",
            3,
            format!(": no answer for {topic}/{partition}"),
        )),
    }
}

async fn metadata(
    connection: &mut Connection,
    topic: Option<&str>,
) -> Result<MetadataResponse, GroupError> {
    let topics = topic
        .map(|t| {
            vec![
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(t.to_owned())))),
            ]
        })
        .unwrap_or_default();
    let request = MetadataRequest::default()
        .with_topics(Some(topics))
        .with_allow_auto_topic_creation(false);
    let body = call(connection, "Metadata", METADATA, &request).await?;
    decode::<MetadataResponse>("Metadata", body, METADATA)
}

/// One request: size, header v1 (these versions are not flexible), then the body in `version`.
async fn call<R: Encodable>(
    connection: &mut Connection,
    api: &'static str,
    (key, version): (i16, i16),
    request: &R,
) -> Result<Bytes, GroupError> {
    let answer = connection
        .try_call(api, |correlation_id| {
            let header = RequestHeader::default()
                .with_request_api_key(key)
                .with_request_api_version(version)
                .with_correlation_id(correlation_id)
                .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
            let mut frame = BytesMut::new();
            frame.put_i32(0);
            header
                .encode(&mut frame, 1)
                .map_err(|e| encode_error(api, &e))?;
            request
                .encode(&mut frame, version)
                .map_err(|e| encode_error(api, &e))?;
            let size = i32::try_from(frame.len() - 4).map_err(|_| GroupError::Codec {
                api,
                message: "request too large".to_owned(),
            })?;
            if let Some(mut prefix) = frame.get_mut(..4) {
                prefix.put_i32(size);
            }
            Ok(frame.to_vec())
        })
        .await?;
    Ok(Bytes::from(answer))
}

fn decode<R: Decodable>(
    api: &'static str,
    mut body: Bytes,
    (_, version): (i16, i16),
) -> Result<R, GroupError> {
    R::decode(&mut body, version).map_err(|e| GroupError::Codec {
        api,
        message: e.to_string(),
    })
}

fn encode_error(api: &'static str, err: &impl std::fmt::Display) -> GroupError {
    GroupError::Codec {
        api,
        message: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let batch = encode_batch(identity, 7984, records, Codec::None).expect("encodes");
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
