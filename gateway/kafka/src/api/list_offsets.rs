//! ListOffsets: a partition's earliest offset (`-2`, and `-4`, the earliest local one: tern keeps
//! everything local), its latest (`-1`, the durable end), the record with the largest
//! timestamp (`-3`), or the first record at or after a timestamp, found through the log's
//! time index. A time past every record answers offset and timestamp `-1`, as Kafka does; so
//! does `-5` (the earliest offset not yet in tiered storage: there is none).

use kafka_protocol::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ApiKey, ListOffsetsRequest, ListOffsetsResponse};
use tern_auth::Want;
use tern_log::{LogError, LogPort};

use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;
use crate::topics;

/// v1-v10: Kafka 4.x Java clients use v10 (v9 adds `-4`, v10 `-5` and a timeout), librdkafka
/// 2.x up to v7, kafka-python up to v8 or higher. v0 (several offsets per answer) is not served.
pub const VERSIONS: Versions = Versions { min: 1, max: 10 };

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: ListOffsetsRequest = decode(request)?;
    let topics_out = body
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.to_string();
            let found = ctx.lookup(conn, request, Want::Receive, &name, false);
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let answer = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index);
                    let partition =
                        found.and_then(|count| topics::partition(p.partition_index, count));
                    let looked_up = partition
                        .and_then(|partition| locate(&ctx.log, &name, partition, p.timestamp));
                    match looked_up {
                        Ok((offset, timestamp)) => {
                            answer.with_offset(offset).with_timestamp(timestamp)
                        }
                        Err(code) => answer.with_error_code(code.code()),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    let response = ListOffsetsResponse::default().with_topics(topics_out);
    Ok(Reply::Now(encode(ApiKey::ListOffsets, version, &response)?))
}

/// (offset, timestamp) for a ListOffsets `timestamp` query.
fn locate<L: LogPort>(
    log: &L,
    topic: &str,
    partition: u32,
    query: i64,
) -> Result<(i64, i64), ResponseError> {
    let (start, end) = log.offsets(topic, partition).map_err(log_error)?;
    let found = match query {
        LATEST => return Ok((to_i64(end), -1)),
        EARLIEST | EARLIEST_LOCAL => return Ok((to_i64(start), -1)),
        MAX_TIMESTAMP => match end.checked_sub(1).filter(|&last| last >= start) {
            None => None,
            Some(last) => {
                let newest = timestamp_at(log, topic, partition, last)?;
                log.offset_for_timestamp(topic, partition, newest)
                    .map_err(log_error)?
            }
        },
        time if time >= 0 => log
            .offset_for_timestamp(topic, partition, time)
            .map_err(log_error)?,
        _ => None,
    };
    match found {
        Some(offset) => Ok((to_i64(offset), timestamp_at(log, topic, partition, offset)?)),
        None => Ok((-1, -1)),
    }
}

fn timestamp_at<L: LogPort>(
    log: &L,
    topic: &str,
    partition: u32,
    offset: u64,
) -> Result<i64, ResponseError> {
    let records = log.read(topic, partition, offset, 1).map_err(log_error)?;
    Ok(records.first().map_or(-1, |r| r.record.timestamp_ms))
}

fn log_error(err: LogError) -> ResponseError {
    match err {
        LogError::UnknownTopic { .. } | LogError::UnknownPartition { .. } => {
            ResponseError::UnknownTopicOrPartition
        }
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        _ => ResponseError::KafkaStorageError,
    }
}

fn to_i64(offset: u64) -> i64 {
    i64::try_from(offset).unwrap_or(i64::MAX)
}
