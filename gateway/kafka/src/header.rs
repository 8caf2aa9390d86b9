//! The request header of a frame, decoded with kafka-protocol's `RequestHeader` after the API
//! key and version have been checked by hand (kafka-protocol's own helper peeks at bytes that a
//! short frame does not have), and the response header written in front of each answer.
//!
//! Pure; never looks at the body beyond returning it.
#![expect(
    clippy::big_endian_bytes,
    reason = "Kafka's protocol is big-endian by definition"
)]

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};

/// Why a frame's header could not be read. Each ends the connection (there is no answer a
/// client could match to its request), as Apache Kafka does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    #[error("frame of {len} bytes is shorter than a request header")]
    Short { len: usize },
    #[error("unknown API key {key}")]
    UnknownApi { key: i16, correlation_id: i32 },
    #[error("malformed request header: {message}")]
    Malformed { message: String },
}

/// A decoded request: its header, the API it names and the body after the header.
#[derive(Debug, Clone)]
pub struct Request {
    pub api: ApiKey,
    pub header: RequestHeader,
    pub body: Bytes,
}

impl Request {
    pub fn version(&self) -> i16 {
        self.header.request_api_version
    }

    pub fn correlation_id(&self) -> i32 {
        self.header.correlation_id
    }

    /// The client id of the header, or `""`.
    pub fn client_id(&self) -> &str {
        self.header.client_id.as_deref().unwrap_or_default()
    }
}

/// Splits a request frame (without its size prefix) into header and body.
pub fn decode(frame: Bytes) -> Result<Request, HeaderError> {
    let short = HeaderError::Short { len: frame.len() };
    let key = frame.first_chunk::<2>().ok_or(short.clone())?;
    let version = frame
        .get(2..4)
        .and_then(|v| v.first_chunk::<2>())
        .ok_or(short.clone())?;
    let correlation_id = frame
        .get(4..8)
        .and_then(|v| v.first_chunk::<4>())
        .ok_or(short)?;
    let key = i16::from_be_bytes(*key);
    let version = i16::from_be_bytes(*version);
    let api = ApiKey::try_from(key).map_err(|()| HeaderError::UnknownApi {
        key,
        correlation_id: i32::from_be_bytes(*correlation_id),
    })?;
    let mut buf = frame;
    let header =
        RequestHeader::decode(&mut buf, api.request_header_version(version)).map_err(|err| {
            HeaderError::Malformed {
                message: err.to_string(),
            }
        })?;
    Ok(Request {
        api,
        header,
        body: buf.copy_to_bytes(buf.remaining()),
    })
}

/// The response header for `request`, encoded.
pub fn encode_response_header(request: &Request) -> Bytes {
    let header = ResponseHeader::default().with_correlation_id(request.correlation_id());
    let version = request.api.response_header_version(request.version());
    let mut buf = BytesMut::with_capacity(8);
    // A response header holds an int32 and (v1) an empty tagged-field list: nothing can fail.
    if header.encode(&mut buf, version).is_err() {
        buf.clear();
        buf.extend_from_slice(&request.correlation_id().to_be_bytes());
    }
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;
    use proptest::prelude::*;

    fn frame(key: ApiKey, version: i16, client: &str, body: &[u8]) -> Bytes {
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_string(client.to_owned())));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, key.request_header_version(version))
            .expect("encode");
        buf.extend_from_slice(body);
        buf.freeze()
    }

    #[test]
    fn a_header_splits_off_its_body_in_both_header_versions() {
        for version in [2, 3] {
            let request =
                decode(frame(ApiKey::ApiVersions, version, "kcat", b"xyz")).expect("decode");
            assert_eq!(request.api, ApiKey::ApiVersions);
            assert_eq!(request.version(), version);
            assert_eq!(request.correlation_id(), 7);
            assert_eq!(request.client_id(), "kcat");
            assert_eq!(&request.body[..], b"xyz");
        }
    }

    #[test]
    fn short_and_unknown_headers_are_errors() {
        assert_eq!(
            decode(Bytes::from_static(&[0, 18, 0])).err(),
            Some(HeaderError::Short { len: 3 })
        );
        assert_eq!(
            decode(Bytes::from_static(&[0x7f, 0, 0, 0, 0, 0, 0, 9])).err(),
            Some(HeaderError::UnknownApi {
                key: 0x7f00,
                correlation_id: 9
            })
        );
    }

    #[test]
    fn the_api_versions_response_header_has_no_tagged_fields() {
        let request = decode(frame(ApiKey::ApiVersions, 3, "c", b"")).expect("decode");
        assert_eq!(&encode_response_header(&request)[..], &[0, 0, 0, 7]);
        let request = decode(frame(ApiKey::Metadata, 12, "c", b"")).expect("decode");
        assert_eq!(&encode_response_header(&request)[..], &[0, 0, 0, 7, 0]);
    }

    proptest! {
        #[test]
        fn any_frame_decodes_or_is_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(Bytes::from(bytes));
        }
    }
}
