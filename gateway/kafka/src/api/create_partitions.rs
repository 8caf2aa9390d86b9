//! CreatePartitions: grows a topic to the requested count. Existing partitions keep their
//! records; keyed records produced later may land elsewhere (Kafka's semantics). Manual
//! assignments are refused (one broker); `validate_only` checks without growing.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{ApiKey, CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;
use tern_log::LogPort;

use super::create_topics::{Refused, refusal};
use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;

/// v0-v3 (Kafka 4.x's admin client sends v3).
pub const VERSIONS: Versions = Versions { min: 0, max: 3 };

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: CreatePartitionsRequest = decode(request)?;
    let mut results = Vec::with_capacity(body.topics.len());
    for topic in body.topics {
        let name = topic.name.0.to_string();
        let outcome = if !ctx.administers(conn, request, &name) {
            Err((
                ResponseError::TopicAuthorizationFailed,
                "needs read and write access to the topic".to_owned(),
            ))
        } else if topic.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
            Err((
                ResponseError::InvalidReplicaAssignment,
                "tern is one broker: replica assignments cannot be chosen".to_owned(),
            ))
        } else {
            grow(&ctx.log, &name, topic.count, body.validate_only)
        };
        let mut result = CreatePartitionsTopicResult::default().with_name(topic.name);
        if let Err((error, message)) = outcome {
            result.error_code = error.code();
            result.error_message = Some(StrBytes::from_string(message));
        }
        results.push(result);
    }
    let response = CreatePartitionsResponse::default().with_results(results);
    Ok(Reply::Now(encode(
        ApiKey::CreatePartitions,
        version,
        &response,
    )?))
}

fn grow<L: LogPort>(log: &L, name: &str, count: i32, validate_only: bool) -> Result<(), Refused> {
    let current = log
        .topics()
        .into_iter()
        .find(|t| t.name == name)
        .map(|t| t.partitions)
        .ok_or((
            ResponseError::UnknownTopicOrPartition,
            format!("unknown topic {name}"),
        ))?;
    let total = u32::try_from(count).unwrap_or(0);
    if total <= current || total > tern_log::MAX_PARTITIONS {
        return Err((
            ResponseError::InvalidPartitions,
            format!(
                "topic {name} has {current} partitions; the new count must be more, at most {}",
                tern_log::MAX_PARTITIONS
            ),
        ));
    }
    if validate_only {
        return Ok(());
    }
    log.add_partitions(name, total).map(|_| ()).map_err(|err| {
        tracing::info!(topic = name, %err, "CreatePartitions refused");
        refusal(&err)
    })
}
