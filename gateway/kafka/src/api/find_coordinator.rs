//! FindCoordinator: tern is the coordinator of every consumer group, so the answer is always
//! the one broker (node 0 at the address Metadata advertises). Transaction coordinators
//! (key type 1) are not served: `COORDINATOR_NOT_AVAILABLE`.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{ApiKey, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use super::metadata::{NODE_ID, advertised};
use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;

/// v0-v6: every version Kafka 4.x answers; v4 asks for several keys at once.
pub const VERSIONS: Versions = Versions { min: 0, max: 6 };

/// The key type of a consumer group.
const GROUP: i8 = 0;

pub fn handle<L>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: FindCoordinatorRequest = decode(request)?;
    let (host, port) = advertised(ctx, conn);
    let host = StrBytes::from_string(host);
    let port = i32::from(port);
    let found = body.key_type == GROUP;
    let (node, host, port, error, message) = if found {
        (NODE_ID, host, port, 0, None)
    } else {
        let message = StrBytes::from_static_str("tern has no transaction coordinator");
        let code = ResponseError::CoordinatorNotAvailable.code();
        (-1, StrBytes::default(), -1, code, Some(message))
    };
    let mut response = FindCoordinatorResponse::default();
    if version >= 4 {
        let coordinators = body
            .coordinator_keys
            .into_iter()
            .map(|key| {
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(BrokerId(node))
                    .with_host(host.clone())
                    .with_port(port)
                    .with_error_code(error)
                    .with_error_message(message.clone())
            })
            .collect();
        response = response.with_coordinators(coordinators);
    } else {
        response = response
            .with_node_id(BrokerId(node))
            .with_host(host)
            .with_port(port)
            .with_error_code(error);
        if version >= 1 {
            response = response.with_error_message(message);
        }
    }
    Ok(Reply::Now(encode(
        ApiKey::FindCoordinator,
        version,
        &response,
    )?))
}
