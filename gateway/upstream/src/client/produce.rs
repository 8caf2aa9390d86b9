//! Writing records: one RecordBatch v2 per request (compressed with the upstream's codec,
//! stamped with a producer id, epoch and base sequence, or with −1s for a plain producer),
//! Produce with acks=all, and InitProducerId for an idempotent producer's identity. The
//! transactional fields — the batch's `transactional` flag, the request's and InitProducerId's
//! transactional id — are carried by [`Stamp`] and [`ProduceOptions`] and are off until the
//! transactional producer uses them. It never retries: a duplicate (the leader holds this
//! sequence already) is success, every other refusal goes back to the caller.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::TransactionalId;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::metadata::topic_name;
use super::{ClientError, Connection};
use crate::config::Codec;

/// The producer id of a batch without idempotence (and its epoch and sequence are −1 too).
pub const NO_PRODUCER_ID: i64 = -1;
/// Kafka's DUPLICATE_SEQUENCE_NUMBER: the leader holds this batch already.
pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
/// The transaction timeout an idempotent producer's InitProducerId carries (unused by Kafka).
pub const IDEMPOTENT_TXN_TIMEOUT: Duration = Duration::from_secs(60);
/// Kafka's sequence numbers are int32 and wrap from `i32::MAX` to 0.
pub const SEQUENCE_WRAP: u64 = 1 << 31;

/// The sequence number of the record at `edge_offset`.
pub fn sequence_of(edge_offset: u64) -> i32 {
    i32::try_from(edge_offset % SEQUENCE_WRAP).unwrap_or(0)
}

/// A record as the producer sends it (the `tern-*` headers are in `headers`, in name order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutRecord {
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, Vec<u8>>,
}

/// What a batch says about its producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// [`NO_PRODUCER_ID`] for a plain producer.
    pub producer_id: i64,
    pub epoch: i16,
    /// Part of a transaction (the transactional producer's; false today).
    pub transactional: bool,
}

impl Stamp {
    /// A plain producer's batches: no producer id, no sequence numbers.
    pub const PLAIN: Self = Self {
        producer_id: NO_PRODUCER_ID,
        epoch: -1,
        transactional: false,
    };
}

/// One batch: `records` stamped with `stamp`, sequences from `first_offset`.
pub fn encode_batch(
    stamp: Stamp,
    first_offset: u64,
    records: Vec<OutRecord>,
    codec: Codec,
) -> Result<Bytes, ClientError> {
    let records: Vec<Record> = records
        .into_iter()
        .zip(first_offset..)
        .zip(0i64..)
        .map(|((record, edge_offset), offset)| Record {
            transactional: stamp.transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: stamp.producer_id,
            producer_epoch: stamp.epoch,
            timestamp_type: TimestampType::Creation,
            offset,
            // Without a producer id the batch's base sequence is −1; the codec derives it from
            // the first record and keeps records in one batch only while offset − sequence stays
            // the same, so record i gets i − 1.
            sequence: match stamp.producer_id {
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
    RecordBatchEncoder::encode(&mut buf, &records, &options).map_err(|source| {
        ClientError::Encode {
            api: "Produce",
            version: 2,
            source: source.into(),
        }
    })?;
    Ok(buf.freeze())
}

/// How a Produce request is sent.
#[derive(Debug, Clone, Copy)]
pub struct ProduceOptions<'a> {
    /// How long the leader may hold an acks=all produce before answering.
    pub timeout: Duration,
    /// The transactional producer's id (none today).
    pub transactional_id: Option<&'a str>,
}

/// The Produce request of one batch to `topic`/`partition`, acks=all.
pub fn produce_request(
    topic: &str,
    partition: i32,
    batch: Bytes,
    options: &ProduceOptions<'_>,
) -> ProduceRequest {
    let timeout_ms = i32::try_from(options.timeout.as_millis()).unwrap_or(i32::MAX);
    ProduceRequest::default()
        .with_transactional_id(
            options
                .transactional_id
                .map(|id| TransactionalId(StrBytes::from_string(id.to_owned()))),
        )
        .with_acks(-1)
        .with_timeout_ms(timeout_ms)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch)),
                ]),
        ])
}

/// Produces one encoded batch to `topic`/`partition` over `leader`, which waits a little
/// longer than the leader may. A duplicate is success.
pub async fn produce(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
    batch: Bytes,
    options: &ProduceOptions<'_>,
) -> Result<(), ClientError> {
    let request = produce_request(topic, partition, batch, options);
    let wait = options.timeout + Duration::from_secs(5);
    let answer = leader.call_within(wait, |_| request).await?;
    let code = answer
        .responses
        .iter()
        .filter(|t| t.name.0.as_str() == topic)
        .flat_map(|t| t.partition_responses.iter())
        .find(|p| p.index == partition)
        .map(|p| p.error_code);
    match code {
        Some(0 | DUPLICATE_SEQUENCE_NUMBER) => Ok(()),
        Some(code) => Err(ClientError::kafka(
            "Produce",
            code,
            format!(" for {topic}/{partition}"),
        )),
        None => Err(ClientError::Missing {
            api: "Produce",
            what: format!("answer for {topic}/{partition}"),
        }),
    }
}

/// InitProducerId asking for a new producer id (−1, epoch −1), with `transaction_timeout` in
/// whole milliseconds (int32 on the wire, so a longer one is capped).
pub fn init_producer_id_request(
    transactional_id: Option<&str>,
    transaction_timeout: Duration,
) -> InitProducerIdRequest {
    let timeout_ms = i32::try_from(transaction_timeout.as_millis()).unwrap_or(i32::MAX);
    InitProducerIdRequest::default()
        .with_transactional_id(
            transactional_id.map(|id| TransactionalId(StrBytes::from_string(id.to_owned()))),
        )
        .with_transaction_timeout_ms(timeout_ms)
        .with_producer_id((-1).into())
        .with_producer_epoch(-1)
}

/// A new producer id and epoch: an idempotent producer's (no transactional id; Kafka ignores
/// the timeout, [`IDEMPOTENT_TXN_TIMEOUT`] is sent), or a transactional one's, whose open
/// transactions Kafka aborts after `transaction_timeout`.
pub async fn init_producer_id(
    connection: &mut Connection,
    transactional_id: Option<&str>,
    transaction_timeout: Duration,
) -> Result<(i64, i16), ClientError> {
    let request = init_producer_id_request(transactional_id, transaction_timeout);
    let answer = connection.call(|_| request).await?;
    if answer.error_code != 0 {
        return Err(ClientError::kafka(
            "InitProducerId",
            answer.error_code,
            String::new(),
        ));
    }
    Ok((answer.producer_id.0, answer.producer_epoch))
}
