//! DeleteTopics: deletes log topics by name (topic ids are not served: tern's topics have
//! none). The log refuses internal `__…` topics and topics a cursor holds (an MQTT session,
//! a forwarder, a consumer group's committed offsets): `POLICY_VIOLATION`, the message naming
//! the cursor.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{ApiKey, DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tern_log::LogPort;

use super::create_topics::refusal;
use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;

/// v1-v6 (v6 names topics in `topics`, which Kafka 4.x's admin client sends).
pub const VERSIONS: Versions = Versions { min: 1, max: 6 };

pub async fn handle<L: LogPort>(
    ctx: &Ctx<L>,
    conn: &Conn,
    request: &Request,
) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: DeleteTopicsRequest = decode(request)?;
    let names: Vec<Option<TopicName>> = if version >= 6 {
        body.topics.into_iter().map(|t| t.name).collect()
    } else {
        body.topic_names.into_iter().map(Some).collect()
    };
    let mut responses = Vec::with_capacity(names.len());
    for name in names {
        let mut result = DeletableTopicResult::default().with_name(name.clone());
        let outcome = match &name {
            None => Err((
                ResponseError::UnknownTopicId,
                "tern's topics have no ids; name the topic".to_owned(),
            )),
            Some(name) if !ctx.administers(conn, request, &name.0) => Err((
                ResponseError::TopicAuthorizationFailed,
                "needs read and write access to the topic".to_owned(),
            )),
            Some(name) => match ctx.log.delete_topic(&name.0).await {
                // A topic created again under this name starts with no producers.
                Ok(()) => {
                    ctx.producer_states.forget_topic(&name.0);
                    Ok(())
                }
                Err(err) => {
                    tracing::info!(topic = %name.0, %err, "DeleteTopics refused");
                    Err(refusal(&err))
                }
            },
        };
        if let Err((error, message)) = outcome {
            result.error_code = error.code();
            result.error_message = Some(StrBytes::from_string(message));
        }
        responses.push(result);
    }
    let response = DeleteTopicsResponse::default().with_responses(responses);
    Ok(Reply::Now(encode(
        ApiKey::DeleteTopics,
        version,
        &response,
    )?))
}
