//! SyncGroup: the leader's request carries every member's assignment (computed by the
//! client-side assignor); each member's request is parked until then and answered with its
//! own assignment, which tern passes on without reading it.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;

use super::{ApiError, Ctx, PendingReply, Reply, Versions, decode, encode};
use crate::group::offsets::valid_group_id;
use crate::header::Request;

/// v0-v5, as Kafka 4.x (v5 names the protocol type and name in both directions).
pub const VERSIONS: Versions = Versions { min: 0, max: 5 };

pub fn handle<L>(ctx: &Ctx<L>, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: SyncGroupRequest = decode(request)?;
    let group = body.group_id.0.to_string();
    if !valid_group_id(&group) {
        let response =
            SyncGroupResponse::default().with_error_code(ResponseError::InvalidGroupId.code());
        return Ok(Reply::Now(encode(ApiKey::SyncGroup, version, &response)?));
    }
    let assignments = body
        .assignments
        .into_iter()
        .map(|a| (a.member_id.to_string(), a.assignment))
        .collect();
    let member = body.member_id.to_string();
    let generation = body.generation_id;
    let groups = ctx.groups.clone();
    Ok(Reply::Later(PendingReply(Box::pin(async move {
        let answer = groups.sync(&group, &member, generation, assignments).await;
        let mut response = match answer {
            Ok(assignment) => SyncGroupResponse::default().with_assignment(assignment),
            Err(err) => SyncGroupResponse::default().with_error_code(err.code()),
        };
        if version >= 5 {
            let view = groups.view(&group);
            let (kind, name) = view
                .map(|v| (v.protocol_type, v.protocol))
                .unwrap_or_default();
            response = response
                .with_protocol_type(Some(StrBytes::from_string(kind)))
                .with_protocol_name(Some(StrBytes::from_string(name)));
        }
        encode(ApiKey::SyncGroup, version, &response)
    }))))
}
