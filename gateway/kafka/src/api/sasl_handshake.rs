//! SaslHandshake (KIP-43): the client names a mechanism; the answer lists the enabled ones.
//! After v1 the tokens come in SaslAuthenticate requests; after v0 they come as bare frames
//! without a Kafka header (the connection reads them, see `connection.rs`). librdkafka needs
//! v0 advertised to use SASL at all, then sends v1; kafka-python 2.0 sends v0. A
//! mechanism that is not enabled gets UNSUPPORTED_SASL_MECHANISM with the list, then the
//! connection closes (KIP-43); a handshake on a listener without SASL, or a second one, gets ILLEGAL_SASL_STATE and the
//! connection closes.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, SaslHandshakeRequest, SaslHandshakeResponse};
use kafka_protocol::protocol::StrBytes;

use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;
use crate::sasl::Handshake;

pub const VERSIONS: Versions = Versions { min: 0, max: 1 };

pub fn handle<L>(ctx: &Ctx<L>, conn: &mut Conn, request: &Request) -> Result<Reply, ApiError> {
    let body: SaslHandshakeRequest = decode(request)?;
    let enabled = ctx.config.offered_mechanisms();
    let error = match conn
        .sasl
        .handshake(&body.mechanism, &enabled, request.version() == 0)
    {
        Handshake::Chosen(_) => None,
        Handshake::Unsupported => Some(ResponseError::UnsupportedSaslMechanism),
        Handshake::Illegal => Some(ResponseError::IllegalSaslState),
    };
    let response = SaslHandshakeResponse::default()
        .with_error_code(error.map_or(0, |e| e.code()))
        .with_mechanisms(
            enabled
                .iter()
                .map(|m| StrBytes::from_static_str(m.name()))
                .collect(),
        );
    Ok(Reply::Now(encode(
        ApiKey::SaslHandshake,
        request.version(),
        &response,
    )?))
}
