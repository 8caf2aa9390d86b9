//! SaslAuthenticate (KIP-152): one SASL token of the mechanism SaslHandshake chose, and the
//! server's token back. A failed exchange is answered with SASL_AUTHENTICATION_FAILED and a
//! message (never naming whether the user exists), then the connection closes, as Kafka does;
//! a token without a handshake gets ILLEGAL_SASL_STATE and closes too. Sessions do not expire
//! (`session_lifetime_ms` 0: no KIP-368 re-authentication is asked for).

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse};
use kafka_protocol::protocol::StrBytes;
use tern_log::LogPort;

use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;
use crate::sasl::Step;

/// v0-v2: v1 adds `session_lifetime_ms`, v2 the flexible encoding.
pub const VERSIONS: Versions = Versions { min: 0, max: 2 };

pub async fn handle<L: LogPort>(
    ctx: &Ctx<L>,
    conn: &mut Conn,
    request: &Request,
) -> Result<Reply, ApiError> {
    let body: SaslAuthenticateRequest = decode(request)?;
    let users = ctx.security.as_deref().and_then(|s| s.users());
    let step = conn
        .sasl
        .authenticate(&body.auth_bytes, users, conn.peer.ip())
        .await;
    let response = SaslAuthenticateResponse::default().with_error_message(None);
    let response = match step {
        Step::Continue(token) | Step::Done(token) => response.with_auth_bytes(Bytes::from(token)),
        Step::Failed(err) => {
            tracing::info!(peer = %conn.peer, %err, "kafka SASL authentication failed");
            response
                .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                .with_error_message(Some(StrBytes::from_string(err.to_string())))
        }
        Step::Illegal => response
            .with_error_code(ResponseError::IllegalSaslState.code())
            .with_error_message(Some(StrBytes::from_static_str(
                "SaslAuthenticate without a SaslHandshake",
            ))),
    };
    Ok(Reply::Now(encode(
        ApiKey::SaslAuthenticate,
        request.version(),
        &response,
    )?))
}
