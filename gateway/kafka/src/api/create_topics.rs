//! CreateTopics: creates log topics with the requested partition count (`-1`: the log's
//! default for the name). tern keeps one replica, so the replication factor must be `-1` or
//! `1` and manual replica assignments are refused; per-topic settings come from
//! `[[log.topic]]` in tern.toml, so a request carrying configs is refused with `INVALID_CONFIG`
//! rather than silently ignored. `validate_only` checks without creating. Internal `__…` names
//! are refused.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse};
use kafka_protocol::protocol::StrBytes;
use tern_log::{LogError, LogPort};

use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;
use crate::topics;

/// v2-v7: every version kafka-protocol decodes (Kafka 4.x's admin client sends v7).
pub const VERSIONS: Versions = Versions { min: 2, max: 7 };

/// A refusal: the error and the message the client shows.
pub type Refused = (ResponseError, String);

/// The Kafka error of a log refusal of a topic change.
pub fn refusal(err: &LogError) -> Refused {
    let code = match err {
        LogError::TopicExists { .. } => ResponseError::TopicAlreadyExists,
        LogError::InvalidPartitions { .. } => ResponseError::InvalidPartitions,
        LogError::InvalidTopicName { .. } => ResponseError::InvalidTopicException,
        LogError::UnknownTopic { .. } => ResponseError::UnknownTopicOrPartition,
        LogError::TopicInUse { .. } => ResponseError::PolicyViolation,
        _ => ResponseError::KafkaStorageError,
    };
    (code, err.to_string())
}

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: CreateTopicsRequest = decode(request)?;
    let mut results = Vec::with_capacity(body.topics.len());
    for topic in body.topics {
        let name = topic.name.0.to_string();
        let count = if topic.num_partitions == -1 {
            ctx.log.default_partitions(&name)
        } else {
            u32::try_from(topic.num_partitions).unwrap_or(0)
        };
        let outcome = allowed(ctx, conn, request, &name)
            .and_then(|()| check(&topic, &name))
            .and_then(|()| {
                if body.validate_only {
                    validate(&ctx.log, &name, count)
                } else {
                    create(&ctx.log, &name, count)
                }
            });
        let mut result = CreatableTopicResult::default()
            .with_name(topic.name)
            .with_num_partitions(-1)
            .with_replication_factor(-1);
        match outcome {
            Ok(partitions) => {
                result.num_partitions = i32::try_from(partitions).unwrap_or(i32::MAX);
                result.replication_factor = 1;
                result.configs = Some(Vec::new());
            }
            Err((error, message)) => {
                result.error_code = error.code();
                result.error_message = Some(StrBytes::from_string(message));
            }
        }
        results.push(result);
    }
    let response = CreateTopicsResponse::default().with_topics(results);
    Ok(Reply::Now(encode(
        ApiKey::CreateTopics,
        version,
        &response,
    )?))
}

/// Topic administration needs read and write access to the topic.
fn allowed<L>(ctx: &Ctx<L>, conn: &Conn, request: &Request, name: &str) -> Result<(), Refused> {
    if ctx.administers(conn, request, name) {
        Ok(())
    } else {
        Err((
            ResponseError::TopicAuthorizationFailed,
            "needs read and write access to the topic".to_owned(),
        ))
    }
}

/// What tern refuses whatever the log says.
fn check(
    topic: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    name: &str,
) -> Result<(), Refused> {
    if topics::is_internal(name) {
        return Err((
            ResponseError::InvalidTopicException,
            "names starting with __ are tern's own topics".to_owned(),
        ));
    }
    if !matches!(topic.replication_factor, -1 | 1) {
        return Err((
            ResponseError::InvalidReplicationFactor,
            "tern keeps one replica: the replication factor must be 1".to_owned(),
        ));
    }
    if !topic.assignments.is_empty() {
        return Err((
            ResponseError::InvalidReplicaAssignment,
            "tern is one broker: replica assignments cannot be chosen".to_owned(),
        ));
    }
    if !topic.configs.is_empty() {
        return Err((
            ResponseError::InvalidConfig,
            "per-topic settings come from [[log.topic]] in tern.toml".to_owned(),
        ));
    }
    Ok(())
}

fn validate<L: LogPort>(log: &L, name: &str, count: u32) -> Result<u32, Refused> {
    tern_log::validate_topic_name(name).map_err(|reason| {
        refusal(&LogError::InvalidTopicName {
            topic: name.to_owned(),
            reason,
        })
    })?;
    if log.topics().iter().any(|t| t.name == name) {
        return Err(refusal(&LogError::TopicExists {
            topic: name.to_owned(),
        }));
    }
    if !(1..=tern_log::MAX_PARTITIONS).contains(&count) {
        return Err((
            ResponseError::InvalidPartitions,
            format!(
                "the partition count must be between 1 and {}",
                tern_log::MAX_PARTITIONS
            ),
        ));
    }
    Ok(count)
}

fn create<L: LogPort>(log: &L, name: &str, count: u32) -> Result<u32, Refused> {
    validate(log, name, count)?;
    log.create_topic(name, count).map_err(|err| {
        tracing::info!(topic = name, %err, "CreateTopics refused");
        refusal(&err)
    })
}
