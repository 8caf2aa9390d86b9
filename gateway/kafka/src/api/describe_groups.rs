//! DescribeGroups: state, protocol type, chosen assignor and members (with their metadata and
//! assignments once the group is stable), which `kafka-consumer-groups --describe` shows. A
//! group with only committed offsets is `Empty`; an unknown group is `Dead`, and from v6 on
//! also `GROUP_ID_NOT_FOUND`, as Kafka 4.x answers.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{ApiKey, DescribeGroupsRequest, DescribeGroupsResponse, GroupId};
use kafka_protocol::protocol::StrBytes;
use tern_log::LogPort;

use super::{ApiError, Ctx, Reply, Versions, decode, encode};
use crate::group::offsets;
use crate::header::Request;

/// v0-v6, as Kafka 4.x.
pub const VERSIONS: Versions = Versions { min: 0, max: 6 };

pub fn handle<L: LogPort>(ctx: &Ctx<L>, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: DescribeGroupsRequest = decode(request)?;
    let groups = body
        .groups
        .into_iter()
        .map(|id| describe(ctx, version, id))
        .collect();
    let response = DescribeGroupsResponse::default().with_groups(groups);
    Ok(Reply::Now(encode(
        ApiKey::DescribeGroups,
        version,
        &response,
    )?))
}

fn text(s: String) -> StrBytes {
    StrBytes::from_string(s)
}

fn describe<L: LogPort>(ctx: &Ctx<L>, version: i16, id: GroupId) -> DescribedGroup {
    let group = DescribedGroup::default().with_group_id(id.clone());
    if let Some(view) = ctx.groups.view(&id.0) {
        let members = view
            .members
            .into_iter()
            .map(|m| {
                DescribedGroupMember::default()
                    .with_member_id(text(m.member_id))
                    .with_client_id(text(m.client_id))
                    .with_client_host(text(m.client_host))
                    .with_member_metadata(m.metadata)
                    .with_member_assignment(m.assignment)
            })
            .collect();
        return group
            .with_group_state(StrBytes::from_static_str(view.state.name()))
            .with_protocol_type(text(view.protocol_type))
            .with_protocol_data(text(view.protocol))
            .with_members(members);
    }
    if offsets::has_offsets(&ctx.log, &id.0) {
        return group
            .with_group_state(StrBytes::from_static_str("Empty"))
            .with_protocol_type(StrBytes::from_static_str("consumer"));
    }
    let group = group.with_group_state(StrBytes::from_static_str("Dead"));
    if version >= 6 {
        let message = format!("group {} does not exist", &*id.0);
        return group
            .with_error_code(ResponseError::GroupIdNotFound.code())
            .with_error_message(Some(text(message)));
    }
    group
}
