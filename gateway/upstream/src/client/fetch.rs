//! Reading a partition back, as much as the follower probe needs: ListOffsets (its earliest
//! offset and its end, the high watermark, read uncommitted) and Fetch of the record at one
//! offset (its headers, where the `tern-offset` of the last mirrored record is). Record batches
//! are decoded with the upstream's codecs; a partial batch at the end of a Fetch answer (Kafka
//! cuts at the byte limit) is ignored. The downstream reads a command partition with
//! [`fetch_committed`]: `read_committed` Fetch (records of aborted transactions and control
//! records left out), each record handed back as a [`FetchedRecord`]. It never consumes: no
//! group, no position kept.

use std::collections::{BTreeMap, HashSet};

use bytes::Bytes;
use kafka_protocol::messages::BrokerId;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::fetch_response::{FetchResponse, PartitionData};
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
    read_request(
        topic,
        partition,
        offset,
        Isolation::Uncommitted,
        MAX_WAIT_MS,
    )
}

/// Which records a Fetch may answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum Isolation {
    /// Up to the high watermark, open and aborted transactions' records included.
    Uncommitted = 0,
    /// Up to the last stable offset, with the aborted transactions listed.
    Committed = 1,
}

/// The Fetch request of `topic`/`partition` from `offset` at `isolation`, waiting up to
/// `max_wait_ms` for a first byte.
pub fn read_request(
    topic: &str,
    partition: i32,
    offset: i64,
    isolation: Isolation,
    max_wait_ms: i32,
) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(MAX_BYTES)
        .with_isolation_level(isolation as i8)
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
    let data = partition_answer(&answer, topic, partition, offset)?;
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

/// The answer for `topic`/`partition` in a Fetch response, or the error it carries.
fn partition_answer<'a>(
    answer: &'a FetchResponse,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<&'a PartitionData, ClientError> {
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
    match data.error_code {
        0 => Ok(data),
        code => Err(ClientError::kafka(
            "Fetch",
            code,
            format!(" for {topic}/{partition} at offset {offset}"),
        )),
    }
}

/// One record a `read_committed` Fetch answered with, in tern's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    pub offset: i64,
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// In the record's order; a null value as an empty one.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// What a `read_committed` Fetch of one partition answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Committed records from the fetch offset on (none from aborted transactions, no control
    /// records), in offset order.
    pub records: Vec<FetchedRecord>,
    /// The offset after the last record the answer covered (control records and aborted ones
    /// included): where the next Fetch starts, even when every record was left out.
    pub next: i64,
    /// The partition's last stable offset (its end for a `read_committed` reader).
    pub end: i64,
}

/// Committed records of `topic`/`partition` from `offset`, as a `read_committed` consumer
/// sees them; the leader waits up to `max_wait_ms` for a first one. An offset past either end
/// is Kafka's OFFSET_OUT_OF_RANGE (code 1).
pub async fn fetch_committed(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
) -> Result<Fetched, ClientError> {
    let request = read_request(topic, partition, offset, Isolation::Committed, max_wait_ms);
    let answer = leader.call(|_| request).await?;
    let data = partition_answer(&answer, topic, partition, offset)?;
    let aborted: Vec<(i64, i64)> = data
        .aborted_transactions
        .iter()
        .flatten()
        .map(|t| (t.producer_id.0, t.first_offset))
        .collect();
    let decoded = decode_records(data.records.clone().unwrap_or_default());
    let next = decoded
        .iter()
        .map(|r| r.offset + 1)
        .max()
        .unwrap_or(offset)
        .max(offset);
    let records = committed(decoded, aborted)
        .into_iter()
        .filter(|r| r.offset >= offset)
        .map(|r| FetchedRecord {
            offset: r.offset,
            timestamp_ms: r.timestamp,
            key: r.key.map(|k| k.to_vec()),
            value: r.value.map(|v| v.to_vec()),
            headers: r
                .headers
                .into_iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        v.map(|v| v.to_vec()).unwrap_or_default(),
                    )
                })
                .collect(),
        })
        .collect();
    Ok(Fetched {
        records,
        next,
        end: data.last_stable_offset,
    })
}

/// `records` (in offset order) without control records and without those of the `aborted`
/// transactions ((producer id, first offset) pairs, as a Fetch lists them): a producer's
/// transactional records are left out from its aborted transaction's first offset until its
/// next control record (the abort marker), as Kafka's consumer does.
pub fn committed(records: Vec<Record>, mut aborted: Vec<(i64, i64)>) -> Vec<Record> {
    aborted.sort_by_key(|&(_, first)| std::cmp::Reverse(first));
    let mut open = HashSet::new();
    let mut kept = Vec::with_capacity(records.len());
    for record in records {
        while aborted
            .last()
            .is_some_and(|&(_, first)| first <= record.offset)
        {
            if let Some((producer, _)) = aborted.pop() {
                open.insert(producer);
            }
        }
        if record.control {
            open.remove(&record.producer_id);
            continue;
        }
        if record.transactional && open.contains(&record.producer_id) {
            continue;
        }
        kept.push(record);
    }
    kept
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
