//! DeleteGroups: removes a group without members and its committed offsets (its
//! `kafka.group:` cursor, so retention no longer waits for it); the answer goes out once the
//! removal is durable. Only a client that may read every topic the group has committed
//! offsets in may delete it (else `GROUP_AUTHORIZATION_FAILED`). A group with members: `NON_EMPTY_GROUP`; unknown: `GROUP_ID_NOT_FOUND`.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{ApiKey, DeleteGroupsRequest, DeleteGroupsResponse};
use tern_auth::Want;
use tern_log::LogPort;

use super::{ApiError, Conn, Ctx, PendingReply, Reply, Versions, decode, encode};
use crate::group::offsets;
use crate::header::Request;

/// v0-v2, as Kafka 4.x.
pub const VERSIONS: Versions = Versions { min: 0, max: 2 };

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: DeleteGroupsRequest = decode(request)?;
    let denied: Vec<bool> = body
        .groups_names
        .iter()
        .map(|id| {
            offsets::committed_all(&ctx.log, &id.0)
                .iter()
                .any(|(topic, _, _)| !ctx.allows(conn, request, Want::Receive, topic))
        })
        .collect();
    let log = ctx.log.clone();
    let groups = ctx.groups.clone();
    Ok(Reply::Later(PendingReply(Box::pin(async move {
        let mut results = Vec::with_capacity(body.groups_names.len());
        for (id, denied) in body.groups_names.into_iter().zip(denied) {
            let known = groups.view(&id.0).is_some() || offsets::has_offsets(&log, &id.0);
            let code = if denied {
                ResponseError::GroupAuthorizationFailed.code()
            } else if !known {
                ResponseError::GroupIdNotFound.code()
            } else if let Err(err) = groups.delete(&id.0) {
                err.code()
            } else {
                match offsets::delete_group(&log, &id.0).await {
                    Ok(()) => 0,
                    Err(err) => {
                        tracing::warn!(group = %&*id.0, %err, "cannot delete a group's offsets");
                        ResponseError::UnknownServerError.code()
                    }
                }
            };
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(id)
                    .with_error_code(code),
            );
        }
        let response = DeleteGroupsResponse::default().with_results(results);
        encode(ApiKey::DeleteGroups, version, &response)
    }))))
}
