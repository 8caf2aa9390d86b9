//! JoinGroup: parks the request until the group's join phase ends and answers with the
//! generation, the chosen protocol (assignor), the leader and, for the leader, every member's
//! metadata. v4+ new members first get `MEMBER_ID_REQUIRED` with their id (KIP-394).
//! `group.instance.id` (static membership) is accepted and ignored: the member is dynamic.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{ApiKey, JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::protocol::StrBytes;

use super::{ApiError, Conn, Ctx, PendingReply, Reply, Versions, decode, encode};
use crate::group::coordinator::{GroupError, Join, Joined};
use crate::group::offsets::valid_group_id;
use crate::header::Request;

/// v0-v9, as Kafka 4.x (v9 adds `skip_assignment`, always false here).
pub const VERSIONS: Versions = Versions { min: 0, max: 9 };

pub fn handle<L>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: JoinGroupRequest = decode(request)?;
    let group = body.group_id.0.to_string();
    if !valid_group_id(&group) {
        let response = JoinGroupResponse::default()
            .with_error_code(ResponseError::InvalidGroupId.code())
            .with_member_id(body.member_id);
        return Ok(Reply::Now(encode(ApiKey::JoinGroup, version, &response)?));
    }
    let session = millis(body.session_timeout_ms);
    let rebalance = match body.rebalance_timeout_ms {
        ms if version >= 1 && ms > 0 => millis(ms),
        _ => session,
    };
    let member_id = body.member_id.clone();
    let join = Join {
        member_id: body.member_id.to_string(),
        client_id: request.client_id().to_owned(),
        client_host: format!("/{}", conn.peer.ip()),
        session_timeout: session,
        rebalance_timeout: rebalance,
        protocol_type: body.protocol_type.to_string(),
        protocols: body
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        require_known_member_id: version >= 4,
    };
    let groups = ctx.groups.clone();
    Ok(Reply::Later(PendingReply(Box::pin(async move {
        let answer = groups.join(&group, join).await;
        let response = match answer {
            Ok(joined) => success(joined),
            Err(err) => failure(version, &err, member_id),
        };
        encode(ApiKey::JoinGroup, version, &response)
    }))))
}

fn millis(ms: i32) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn text(s: String) -> StrBytes {
    StrBytes::from_string(s)
}

fn success(joined: Joined) -> JoinGroupResponse {
    let members = joined
        .members
        .into_iter()
        .map(|(id, metadata): (String, Bytes)| {
            JoinGroupResponseMember::default()
                .with_member_id(text(id))
                .with_metadata(metadata)
        })
        .collect();
    JoinGroupResponse::default()
        .with_generation_id(joined.generation)
        .with_protocol_type(Some(text(joined.protocol_type)))
        .with_protocol_name(Some(text(joined.protocol)))
        .with_leader(text(joined.leader))
        .with_member_id(text(joined.member_id))
        .with_members(members)
}

fn failure(version: i16, err: &GroupError, member_id: StrBytes) -> JoinGroupResponse {
    let member_id = match err {
        GroupError::MemberIdRequired(id) => text(id.clone()),
        _ => member_id,
    };
    // v7+ answers a null protocol name with an error, as Kafka does.
    let protocol_name = (version < 7).then(StrBytes::default);
    JoinGroupResponse::default()
        .with_error_code(err.code())
        .with_member_id(member_id)
        .with_protocol_name(protocol_name)
}
