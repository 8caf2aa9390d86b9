//! ApiVersions: the table of served APIs and versions ([`super::SERVED`]), nothing more, so a
//! client never negotiates a version tern cannot answer. A version beyond the served range gets
//! the v0 answer with `UNSUPPORTED_VERSION` and the table, as Apache Kafka answers, so the
//! client retries with one it finds there.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};

use super::{ApiError, Reply, SERVED, Versions, decode, encode};
use crate::header::Request;

/// v3 adds the flexible encoding and the client's software name; v4 changes nothing on the
/// wire. Kafka 4.x Java clients send v4, librdkafka 2.x v3, kafka-python v0-v2.
pub const VERSIONS: Versions = Versions { min: 0, max: 4 };

pub fn handle(request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let table = SERVED
        .iter()
        .map(|(api, versions)| {
            ApiVersion::default()
                .with_api_key(*api as i16)
                .with_min_version(versions.min)
                .with_max_version(versions.max)
        })
        .collect();
    let response = ApiVersionsResponse::default().with_api_keys(table);
    if !VERSIONS.contains(version) {
        let response = response.with_error_code(ResponseError::UnsupportedVersion.code());
        return Ok(Reply::Now(encode(ApiKey::ApiVersions, 0, &response)?));
    }
    let response = match decode::<ApiVersionsRequest>(request) {
        Ok(_) => response,
        Err(_) => response.with_error_code(ResponseError::InvalidRequest.code()),
    };
    Ok(Reply::Now(encode(ApiKey::ApiVersions, version, &response)?))
}
