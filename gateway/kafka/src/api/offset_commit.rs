//! OffsetCommit: a group's committed offsets are cursors (`group::offsets`); the answer goes
//! out once every accepted offset is durable in the cursor store. A member commits in its
//! current generation; a tool or a consumer assigning partitions itself commits with
//! generation -1 and no member id while the group has no members. The commit's metadata
//! string is not stored.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse};
use tern_auth::Want;
use tern_log::LogPort;

use super::{ApiError, Conn, Ctx, PendingReply, Reply, Versions, decode, encode};
use crate::group::offsets::{self, valid_group_id};
use crate::header::Request;
use crate::topics;

/// v2-v9: Kafka 4.x serves no older version. v9 names the generation `member_epoch` (the
/// KIP-848 protocol), the same field for classic groups.
pub const VERSIONS: Versions = Versions { min: 2, max: 9 };

/// One partition's commit: where to, or why not.
type Planned = (i32, Result<(String, u32, u64), i16>);

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: OffsetCommitRequest = decode(request)?;
    let group = body.group_id.0.to_string();
    let allowed = if valid_group_id(&group) {
        ctx.groups
            .check_commit(&group, &body.member_id, body.generation_id_or_member_epoch)
            .map_err(|err| err.code())
    } else {
        Err(ResponseError::InvalidGroupId.code())
    };
    let plan: Vec<(kafka_protocol::messages::TopicName, Vec<Planned>)> = body
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.to_string();
            let found = ctx.lookup(conn, request, Want::Receive, &name, false);
            let parts = topic
                .partitions
                .iter()
                .map(|p| {
                    let planned = match (allowed, found) {
                        (Err(code), _) => Err(code),
                        (Ok(()), Err(err)) => Err(err.code()),
                        (Ok(()), Ok(count)) => topics::partition(p.partition_index, count)
                            .map_err(|err| err.code())
                            .and_then(|partition| {
                                u64::try_from(p.committed_offset)
                                    .map(|offset| (name.clone(), partition, offset))
                                    .map_err(|_| ResponseError::OffsetOutOfRange.code())
                            }),
                    };
                    (p.partition_index, planned)
                })
                .collect();
            (topic.name, parts)
        })
        .collect();
    let log = ctx.log.clone();
    Ok(Reply::Later(PendingReply(Box::pin(async move {
        let mut topics_out = Vec::with_capacity(plan.len());
        for (name, parts) in plan {
            let mut partitions = Vec::with_capacity(parts.len());
            for (index, planned) in parts {
                let code = match planned {
                    Err(code) => code,
                    Ok((topic, partition, offset)) => {
                        match offsets::commit(&log, &group, &topic, partition, offset).await {
                            Ok(()) => 0,
                            Err(err) => {
                                tracing::warn!(%group, %topic, partition, %err, "cannot store a committed offset");
                                ResponseError::UnknownServerError.code()
                            }
                        }
                    }
                };
                partitions.push(
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(index)
                        .with_error_code(code),
                );
            }
            topics_out.push(
                OffsetCommitResponseTopic::default()
                    .with_name(name)
                    .with_partitions(partitions),
            );
        }
        let response = OffsetCommitResponse::default().with_topics(topics_out);
        encode(ApiKey::OffsetCommit, version, &response)
    }))))
}
