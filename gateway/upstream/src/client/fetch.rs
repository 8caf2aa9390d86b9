//! Reading a partition back, as much as the follower probe needs: ListOffsets (its earliest
//! offset and its end, the high watermark, read uncommitted) and Fetch of the record at one
//! offset (its headers, where the `tern-offset` of the last mirrored record is). Record batches
//! are decoded with the upstream's codecs; a partial batch at the end of a Fetch answer (Kafka
//! cuts at the byte limit) is ignored. It never consumes: no group, no position kept.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::BrokerId;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
};
use kafka_protocol::records::{Record, RecordBatchDecoder};

use super::metadata::topic_name;
use super::{ClientError, Connection};

/// ListOffsets' timestamp for the end (high watermark) and the earliest offset.
pub const LATEST: i64 = -1;
pub const EARLIEST: i64 = -2;
/// The most bytes a Fetch of one record asks for (a whole batch comes back).
pub const MAX_BYTES: i32 = 8 << 20;
/// How long the leader may wait for bytes before answering a Fetch.
const MAX_WAIT_MS: i32 = 1_000;

/// The ListOffsets request for `topic`/`partition` at `timestamp` ([`LATEST`], [`EARLIEST`]).
pub fn list_offsets_request(topic: &str, partition: i32, timestamp: i64) -> ListOffsetsRequest {
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(0)
        .with_timeout_ms(10_000)
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(partition)
                        .with_current_leader_epoch(-1)
                        .with_timestamp(timestamp),
                ]),
        ])
}

/// The offset of `topic`/`partition` at `timestamp`, asked of its leader.
pub async fn list_offset(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
    timestamp: i64,
) -> Result<i64, ClientError> {
    let request = list_offsets_request(topic, partition, timestamp);
    let answer = leader.call(|_| request).await?;
    let found = answer
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == topic)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == partition)
        .ok_or_else(|| ClientError::Missing {
            api: "ListOffsets",
            what: format!("answer for {topic}/{partition}"),
        })?;
    match found.error_code {
        0 => Ok(found.offset),
        code => Err(ClientError::kafka(
            "ListOffsets",
            code,
            format!(" for {topic}/{partition}"),
        )),
    }
}

/// The Fetch request of `topic`/`partition` from `offset`.
pub fn fetch_request(topic: &str, partition: i32, offset: i64) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(MAX_BYTES)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(partition)
                        .with_current_leader_epoch(-1)
                        .with_fetch_offset(offset)
                        .with_last_fetched_epoch(-1)
                        .with_log_start_offset(-1)
                        .with_partition_max_bytes(MAX_BYTES),
                ]),
        ])
}

/// The headers of the record at `offset` of `topic`/`partition`, fetched from its leader.
pub async fn headers_at(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<BTreeMap<String, Vec<u8>>, ClientError> {
    let request = fetch_request(topic, partition, offset);
    let answer = leader.call(|_| request).await?;
    let data = answer
        .responses
        .iter()
        .filter(|t| t.topic.0.as_str() == topic)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == partition)
        .ok_or_else(|| ClientError::Missing {
            api: "Fetch",
            what: format!("answer for {topic}/{partition}"),
        })?;
    if data.error_code != 0 {
        return Err(ClientError::kafka(
            "Fetch",
            data.error_code,
            format!(" for {topic}/{partition}"),
        ));
    }
    let records = decode_records(data.records.clone().unwrap_or_default());
    let record = records
        .into_iter()
        .find(|r| r.offset == offset)
        .ok_or_else(|| ClientError::Missing {
            api: "Fetch",
            what: format!("record at offset {offset} of {topic}/{partition}"),
        })?;
    Ok(record
        .headers
        .into_iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.map(|v| v.to_vec()).unwrap_or_default(),
            )
        })
        .collect())
}

/// The records of the whole batches in `bytes`, in order; decoding stops at the first batch
/// that does not decode (the partial one a Fetch answer may end with). Never panics.
pub fn decode_records(mut bytes: Bytes) -> Vec<Record> {
    let mut records = Vec::new();
    while !bytes.is_empty() {
        match RecordBatchDecoder::decode(&mut bytes) {
            Ok(set) => records.extend(set.records),
            Err(_) => break,
        }
    }
    records
}
