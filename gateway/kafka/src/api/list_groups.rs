//! ListGroups: every group with members, plus every group that only has committed offsets
//! (state `Empty`, as Kafka lists a group whose members left), filtered by state (v4+) and
//! type (v5+; every tern group is `classic`).

use std::collections::BTreeMap;

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{ApiKey, GroupId, ListGroupsRequest, ListGroupsResponse};
use kafka_protocol::protocol::StrBytes;
use tern_log::LogPort;

use super::{ApiError, Ctx, Reply, Versions, decode, encode};
use crate::group::offsets;
use crate::header::Request;

/// v0-v5, as Kafka 4.x.
pub const VERSIONS: Versions = Versions { min: 0, max: 5 };

/// The type of every group tern coordinates.
pub const CLASSIC: &str = "classic";

pub fn handle<L: LogPort>(ctx: &Ctx<L>, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: ListGroupsRequest = decode(request)?;
    // group id → (state, protocol type)
    let mut groups: BTreeMap<String, (String, String)> = offsets::groups_with_offsets(&ctx.log)
        .into_iter()
        .map(|id| (id, ("Empty".to_owned(), "consumer".to_owned())))
        .collect();
    for (id, view) in ctx.groups.list() {
        let kind = if view.protocol_type.is_empty() {
            "consumer".to_owned()
        } else {
            view.protocol_type
        };
        groups.insert(id, (view.state.name().to_owned(), kind));
    }
    let wanted = |filter: &[StrBytes], value: &str| {
        filter.is_empty() || filter.iter().any(|f| f.eq_ignore_ascii_case(value))
    };
    let listed = groups
        .into_iter()
        .filter(|(_, (state, _))| wanted(&body.states_filter, state))
        .filter(|_| wanted(&body.types_filter, CLASSIC))
        .map(|(id, (state, kind))| {
            let mut group = ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(id)))
                .with_protocol_type(StrBytes::from_string(kind));
            if version >= 4 {
                group = group.with_group_state(StrBytes::from_string(state));
            }
            if version >= 5 {
                group = group.with_group_type(StrBytes::from_static_str(CLASSIC));
            }
            group
        })
        .collect();
    let response = ListGroupsResponse::default().with_groups(listed);
    Ok(Reply::Now(encode(ApiKey::ListGroups, version, &response)?))
}
