//! LeaveGroup: a member (v0-v2) or several (v3+, by member id) leave; the rest rebalance.
//! Static members (by `group.instance.id` alone) are not known to tern and get
//! `UNKNOWN_MEMBER_ID`.

use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{ApiKey, LeaveGroupRequest, LeaveGroupResponse};

use super::{ApiError, Ctx, Reply, Versions, decode, encode};
use crate::group::result_code as group_code;
use crate::header::Request;

/// v0-v5, as Kafka 4.x.
pub const VERSIONS: Versions = Versions { min: 0, max: 5 };

pub fn handle<L>(ctx: &Ctx<L>, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: LeaveGroupRequest = decode(request)?;
    let group = &body.group_id.0;
    let response = if version < 3 {
        let left = ctx.groups.leave(group, &body.member_id);
        LeaveGroupResponse::default().with_error_code(group_code(&left))
    } else {
        let members = body
            .members
            .into_iter()
            .map(|member| {
                let left = ctx.groups.leave(group, &member.member_id);
                MemberResponse::default()
                    .with_member_id(member.member_id)
                    .with_group_instance_id(member.group_instance_id)
                    .with_error_code(group_code(&left))
            })
            .collect();
        LeaveGroupResponse::default().with_members(members)
    };
    Ok(Reply::Now(encode(ApiKey::LeaveGroup, version, &response)?))
}
