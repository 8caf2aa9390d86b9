//! CreateTopics: creates log topics with the requested partition count (`-1`: the log's
//! default for the name). tern keeps one replica, so the replication factor must be `-1` or
//! `1` and manual replica assignments are refused. Configs: the few tern honours are kept with
//! the topic (`crate::configs`: `max.message.bytes`, enforced on Produce, and the values that
//! name what tern does anyway); any other is refused with `INVALID_CONFIG` naming the key,
//! rather than silently ignored (retention and durability come from `[[log.topic]]` in
//! tern.toml). `validate_only` checks without creating. Internal `__…` names are refused.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse};
use kafka_protocol::protocol::StrBytes;
use tern_log::{LogError, LogPort, TopicConfig};

use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;
use crate::{configs, topics};

/// Kafka's `ConfigSource.DYNAMIC_TOPIC_CONFIG`: set for this topic.
pub const DYNAMIC_TOPIC_CONFIG: i8 = 1;

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
        LogError::InvalidTopicConfig { .. } => ResponseError::InvalidConfig,
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
        let mut kept = TopicConfig::new();
        let outcome = allowed(ctx, conn, request, &name)
            .and_then(|()| check(&topic, &name))
            .and_then(|config| {
                kept = config;
                if body.validate_only {
                    validate(&ctx.log, &name, count)
                } else {
                    create(&ctx.log, &name, count, &kept)
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
                result.configs = Some(
                    kept.iter()
                        .map(|(key, value)| {
                            CreatableTopicConfigs::default()
                                .with_name(StrBytes::from_string(key.clone()))
                                .with_value(Some(StrBytes::from_string(value.clone())))
                                .with_read_only(true)
                                .with_config_source(DYNAMIC_TOPIC_CONFIG)
                        })
                        .collect(),
                );
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

/// What tern refuses whatever the log says; the configs the log is to keep.
fn check(
    topic: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    name: &str,
) -> Result<TopicConfig, Refused> {
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
    configs::check(&topic.configs).map_err(|message| (ResponseError::InvalidConfig, message))
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

fn create<L: LogPort>(
    log: &L,
    name: &str,
    count: u32,
    config: &TopicConfig,
) -> Result<u32, Refused> {
    validate(log, name, count)?;
    log.create_topic_with(name, count, config).map_err(|err| {
        tracing::info!(topic = name, %err, "CreateTopics refused");
        refusal(&err)
    })
}
