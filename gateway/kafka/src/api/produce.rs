//! Produce: each partition's v2 record batches become log records (headers kept as record
//! headers) queued in request order. `acks=0` gets no answer; `acks=1` and `acks=all` are
//! answered once every partition's append is durable under the topic's policy, which is the
//! group-committed fdatasync an MQTT QoS 1 PUBACK waits for (tern has one replica, so `all` is
//! `1`). Kafka offsets are log offsets: `base_offset` is the first record's offset.
//!
//! A record carrying the MQTT topic header (`mqtt.topic`) must name a valid MQTT topic (no
//! wildcards): MQTT subscribers receive it (see `docs/kafka.md`, "The MQTT route"). Writes to
//! tern's internal `__…` topics are refused. The client needs write access (`[[mqtt.acl]]`) to the
//! topic, and to the MQTT topic of every record that names one. A topic created with
//! `max.message.bytes` refuses a larger batch (its size as produced) with `MESSAGE_TOO_LARGE`.

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use tern_auth::Want;
use tern_log::{Codec, LogError, LogPort, Queued, Record};

use super::{ApiError, Conn, Ctx, PendingReply, Reply, Versions, decode, encode};
use crate::header::Request;
use crate::producers::Refusal;
use crate::records::{self, RecordsError};
use crate::{configs, topics};

/// v3-v12, the versions that name topics (v13 names them by id). Kafka 4.x Java producers use
/// v12, librdkafka 2.x up to v10 or v11, kafka-python up to v8 or higher.
pub const VERSIONS: Versions = Versions { min: 3, max: 12 };

/// The header whose value is the MQTT topic of a record (the name tern-mqtt writes).
pub const MQTT_TOPIC_HEADER: &str = "mqtt.topic";

/// One partition's outcome while the appends are in flight.
enum Outcome {
    Refused(ResponseError, Option<String>),
    Queued(Queued),
}

pub async fn handle<L: LogPort>(
    ctx: &Ctx<L>,
    conn: &Conn,
    request: &Request,
) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: ProduceRequest = decode(request)?;
    let now = now_ms();
    let mut topics_out = Vec::with_capacity(body.topic_data.len());
    for topic in body.topic_data {
        let name = topic.name.0.to_string();
        let found = if topics::is_internal(&name) {
            Err(ResponseError::InvalidTopicException)
        } else {
            ctx.lookup(
                conn,
                request,
                Want::Publish,
                &name,
                ctx.config.auto_create_topics,
            )
        };
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for data in topic.partition_data {
            let outcome = match found.and_then(|count| topics::partition(data.index, count)) {
                Err(error) => Outcome::Refused(error, None),
                Ok(partition) => {
                    let target = Target {
                        topic: &name,
                        partition,
                        now,
                    };
                    append(ctx, conn, request, target, data.records).await
                }
            };
            partitions.push((data.index, outcome));
        }
        topics_out.push((topic.name, partitions));
    }
    if body.acks == 0 {
        // No answer is wanted; the appends proceed without anyone waiting for them.
        return Ok(Reply::Nothing);
    }
    let answer = async move {
        let mut responses = Vec::with_capacity(topics_out.len());
        for (name, partitions) in topics_out {
            let mut partition_responses = Vec::with_capacity(partitions.len());
            for (index, outcome) in partitions {
                partition_responses.push(settle(index, outcome, version).await);
            }
            responses.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_partition_responses(partition_responses),
            );
        }
        let response = ProduceResponse::default().with_responses(responses);
        encode(ApiKey::Produce, version, &response)
    };
    Ok(Reply::Later(PendingReply(Box::pin(answer))))
}

/// Where one partition's records go, and the time that stamps them.
struct Target<'a> {
    topic: &'a str,
    partition: u32,
    now: i64,
}

/// Decodes and queues one partition's records.
async fn append<L: LogPort>(
    ctx: &Ctx<L>,
    conn: &Conn,
    request: &Request,
    target: Target<'_>,
    data: Option<Bytes>,
) -> Outcome {
    let Target {
        topic,
        partition,
        now,
    } = target;
    // The topic's max.message.bytes bounds each batch as produced (compressed size), as in Kafka.
    if let Some(limit) = ctx
        .log
        .topic_config(topic)
        .ok()
        .and_then(|config| configs::batch_limit(&config))
    {
        let size = data.as_deref().map_or(0, records::largest_batch);
        if size > limit {
            return Outcome::Refused(
                ResponseError::MessageTooLarge,
                Some(format!(
                    "a record batch of {size} bytes is larger than the topic's max.message.bytes ({limit})"
                )),
            );
        }
    }
    let records = match data.as_ref().map(|bytes| records::decode(bytes, now)) {
        None => Ok(Vec::new()),
        Some(decoded) => decoded,
    };
    let records = match records {
        Ok(records) => records,
        Err(err @ RecordsError::OldFormat(_)) => {
            return Outcome::Refused(
                ResponseError::UnsupportedForMessageFormat,
                Some(err.to_string()),
            );
        }
        Err(err) => return Outcome::Refused(ResponseError::CorruptMessage, Some(err.to_string())),
    };
    if records.is_empty() {
        return Outcome::Refused(ResponseError::CorruptMessage, Some("no records".to_owned()));
    }
    if let Some((at, why)) = records
        .iter()
        .enumerate()
        .find_map(|(i, r)| bad_mqtt_topic(r).map(|w| (i, w)))
    {
        return Outcome::Refused(
            ResponseError::InvalidRecord,
            Some(format!("record {at}: {why}")),
        );
    }
    // A record for MQTT subscribers is an MQTT publish: the client needs write access to its
    // MQTT topic too.
    let unwritable = records.iter().position(|r| {
        r.header(MQTT_TOPIC_HEADER)
            .and_then(|t| std::str::from_utf8(t).ok())
            .is_some_and(|t| !ctx.allows(conn, request, Want::Publish, t))
    });
    if let Some(at) = unwritable {
        return Outcome::Refused(
            ResponseError::TopicAuthorizationFailed,
            Some(format!("record {at}: no write access to its mqtt.topic")),
        );
    }
    // An idempotent producer's batch goes through its sequence check (`crate::producers`).
    let producer = data.as_deref().map(records::producer_batch).transpose();
    // The log keeps the producer's codec with the records, so Fetch serves them compressed the
    // same way (as Kafka's default `compression.type=producer` does).
    let codec = data.as_deref().map_or(Codec::None, records::codec);
    let queued = match producer.map(Option::flatten) {
        Err(err) => return Outcome::Refused(ResponseError::CorruptMessage, Some(err.to_string())),
        Ok(None) => ctx.log.enqueue_with(topic, partition, records, codec).await,
        Ok(Some(batch)) => {
            let states = &ctx.producer_states;
            match states
                .enqueue(&ctx.log, topic, partition, batch, records, codec)
                .await
            {
                Err(Refusal::Sequence(code, message)) => {
                    return Outcome::Refused(code, Some(message));
                }
                Err(Refusal::Log(err)) => Err(err),
                Ok(queued) => Ok(queued),
            }
        }
    };
    match queued {
        Ok(queued) => Outcome::Queued(queued),
        Err(err) => {
            let (code, message) = log_error(&err);
            Outcome::Refused(code, Some(message))
        }
    }
}

/// Why a record's MQTT topic header cannot be delivered to MQTT subscribers, if it cannot.
fn bad_mqtt_topic(record: &Record) -> Option<String> {
    let topic = record.header(MQTT_TOPIC_HEADER)?;
    let Ok(topic) = std::str::from_utf8(topic) else {
        return Some("the mqtt.topic header is not UTF-8".to_owned());
    };
    tern_auth::invalid_topic_name(topic).map(|why| format!("the mqtt.topic header {why}"))
}

/// Waits for one partition's append and builds its answer.
async fn settle(index: i32, outcome: Outcome, version: i16) -> PartitionProduceResponse {
    let answer = PartitionProduceResponse::default().with_index(index);
    let (code, message) = match outcome {
        Outcome::Queued(queued) => match queued.await {
            Ok(base) => {
                let base = i64::try_from(base).unwrap_or(i64::MAX);
                return answer.with_base_offset(base);
            }
            Err(err) => {
                let (code, message) = log_error(&err);
                (code, Some(message))
            }
        },
        Outcome::Refused(code, message) => (code, message),
    };
    let answer = answer.with_error_code(code.code()).with_base_offset(-1);
    if version < 8 {
        return answer;
    }
    let message = message.map(StrBytes::from_string);
    let record_errors = if code == ResponseError::InvalidRecord {
        vec![BatchIndexAndErrorMessage::default().with_batch_index_error_message(message.clone())]
    } else {
        Vec::new()
    };
    answer
        .with_error_message(message)
        .with_record_errors(record_errors)
}

/// The Kafka error code a failed append answers with.
pub fn log_error(err: &LogError) -> (ResponseError, String) {
    let code = match err {
        LogError::UnknownTopic { .. } | LogError::UnknownPartition { .. } => {
            ResponseError::UnknownTopicOrPartition
        }
        LogError::InvalidTopicName { .. } => ResponseError::InvalidTopicException,
        LogError::InvalidAppend { .. } => ResponseError::InvalidRecord,
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        // Full, no space, I/O, a stopped partition, shutdown: the client may retry later.
        _ => ResponseError::KafkaStorageError,
    };
    (code, err.to_string())
}

/// Milliseconds since the Unix epoch, now.
pub use tern_core::time::now_ms;
