//! OffsetDelete: removes a group's committed offsets of some partitions
//! (`kafka-consumer-groups --delete-offsets`). Refused per partition with
//! `GROUP_SUBSCRIBED_TO_TOPIC` while a member's subscription names the topic.

use bytes::Buf;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, ConsumerProtocolSubscription, OffsetDeleteRequest, OffsetDeleteResponse,
};
use kafka_protocol::protocol::Decodable;
use tern_auth::Want;
use tern_log::LogPort;

use super::{ApiError, Conn, Ctx, PendingReply, Reply, Versions, decode, encode};
use crate::group::offsets;
use crate::header::Request;

/// v0, the only version.
pub const VERSIONS: Versions = Versions { min: 0, max: 0 };

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: OffsetDeleteRequest = decode(request)?;
    let group = body.group_id.0.to_string();
    let known = ctx.groups.view(&group).is_some() || offsets::has_offsets(&ctx.log, &group);
    if !known {
        let response =
            OffsetDeleteResponse::default().with_error_code(ResponseError::GroupIdNotFound.code());
        return Ok(Reply::Now(encode(
            ApiKey::OffsetDelete,
            version,
            &response,
        )?));
    }
    let subscribed = subscribed_topics(&ctx.groups.subscriptions(&group));
    let mut doomed = Vec::new();
    let topics = body
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.to_string();
            let denied = !ctx.allows(conn, request, Want::Receive, &name);
            let refused = subscribed.as_ref().is_none_or(|s| s.contains(&name));
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let code = if denied {
                        ResponseError::TopicAuthorizationFailed.code()
                    } else if refused {
                        ResponseError::GroupSubscribedToTopic.code()
                    } else {
                        if let Ok(partition) = u32::try_from(p.partition_index) {
                            doomed.push((name.clone(), partition));
                        }
                        0
                    };
                    OffsetDeletePartition(p.partition_index, code).into()
                })
                .collect();
            OffsetDeleteResponseTopic::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    let log = ctx.log.clone();
    Ok(Reply::Later(PendingReply(Box::pin(async move {
        let mut response = OffsetDeleteResponse::default().with_topics(topics);
        if let Err(err) = offsets::delete_offsets(&log, &group, &doomed).await {
            tracing::warn!(%group, %err, "cannot delete a group's offsets");
            response = OffsetDeleteResponse::default()
                .with_error_code(ResponseError::UnknownServerError.code());
        }
        encode(ApiKey::OffsetDelete, version, &response)
    }))))
}

struct OffsetDeletePartition(i32, i16);

impl From<OffsetDeletePartition> for OffsetDeleteResponsePartition {
    fn from(OffsetDeletePartition(index, code): OffsetDeletePartition) -> Self {
        Self::default()
            .with_partition_index(index)
            .with_error_code(code)
    }
}

/// Every topic the members subscribe to; `None` when a subscription cannot be read (then
/// every topic counts as subscribed).
fn subscribed_topics(metadata: &[bytes::Bytes]) -> Option<Vec<String>> {
    let mut topics = Vec::new();
    for meta in metadata {
        let mut buf = meta.clone();
        if buf.len() < 2 {
            return None;
        }
        // The consumer protocol's own version prefix.
        let version = buf.get_i16();
        let subscription = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
        topics.extend(subscription.topics.iter().map(|t| t.to_string()));
    }
    Some(topics)
}
