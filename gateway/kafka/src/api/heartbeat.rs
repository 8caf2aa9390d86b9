//! Heartbeat: keeps a member's session and tells it when the group rebalances.

use kafka_protocol::messages::{ApiKey, HeartbeatRequest, HeartbeatResponse};

use super::{ApiError, Ctx, Reply, Versions, decode, encode};
use crate::group::result_code as group_code;
use crate::header::Request;

/// v0-v4, as Kafka 4.x.
pub const VERSIONS: Versions = Versions { min: 0, max: 4 };

pub fn handle<L>(ctx: &Ctx<L>, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: HeartbeatRequest = decode(request)?;
    let beat = ctx
        .groups
        .heartbeat(&body.group_id.0, &body.member_id, body.generation_id);
    let response = HeartbeatResponse::default().with_error_code(group_code(&beat));
    Ok(Reply::Now(encode(ApiKey::Heartbeat, version, &response)?))
}
