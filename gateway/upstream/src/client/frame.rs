//! Kafka frames as a tool between a Kafka client and a cluster sees them (tern-bench's
//! byte-counting proxy, which forwards the size-prefixed frames with tern-core's framing): the
//! request header, a response's correlation id, and the broker list at the head of a Metadata
//! response (versions 0-8, the non-flexible ones; the client module never asks for a later one,
//! `client::MAX_VERSIONS`), which a proxy rewrites to point at itself. Everything after the
//! broker list is kept as opaque bytes, so a rewrite changes no other byte. The coordinators of
//! a FindCoordinator response (every version) are rewritten the same way, through
//! kafka-protocol's decoder and encoder (the same fields again, the addresses changed).
//!
//! Decoders never panic: a short frame is [`WireError::Incomplete`]. It never opens a
//! connection and knows nothing about timeouts or what other requests mean.
#![expect(
    clippy::big_endian_bytes,
    reason = "Kafka's protocol is big-endian by definition"
)]

use kafka_protocol::messages::{FindCoordinatorResponse, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};

/// Why a frame could not be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    #[error("frame ends early: {needed} more bytes needed for {what}")]
    Incomplete { what: &'static str, needed: usize },
    #[error("invalid {what} in frame")]
    Invalid { what: &'static str },
}

/// Kafka's API key of Metadata requests.
pub const API_METADATA: i16 = 3;
/// Kafka's API key of FindCoordinator requests.
pub const API_FIND_COORDINATOR: i16 = 10;

/// The start of a request frame (header v1+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
}

/// The header of a request frame (without its size prefix).
pub fn request_header(frame: &[u8]) -> Option<RequestHeader> {
    let (api_key, rest) = frame.split_first_chunk::<2>()?;
    let (api_version, rest) = rest.split_first_chunk::<2>()?;
    Some(RequestHeader {
        api_key: i16::from_be_bytes(*api_key),
        api_version: i16::from_be_bytes(*api_version),
        correlation_id: correlation_id(rest)?,
    })
}

/// The correlation id a response frame (without its size prefix) starts with.
pub fn correlation_id(frame: &[u8]) -> Option<i32> {
    frame.first_chunk::<4>().map(|id| i32::from_be_bytes(*id))
}

/// One broker of a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    /// The rack field as it was on the wire (v1+; empty before).
    rack: Vec<u8>,
}

/// A Metadata response split around its broker list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataResponse {
    /// Correlation id and (v3+) throttle time.
    head: Vec<u8>,
    pub brokers: Vec<Broker>,
    /// Everything after the broker list, unchanged.
    tail: Vec<u8>,
}

/// A cursor that remembers where it is, so the raw bytes of a field can be kept.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let rest = self.bytes.get(self.at..).unwrap_or_default();
        let taken = rest.get(..n).ok_or_else(|| WireError::Incomplete {
            what,
            needed: n.saturating_sub(rest.len()),
        })?;
        self.at += n;
        Ok(taken)
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        let bytes = self.take(4, what)?;
        Ok(bytes
            .first_chunk::<4>()
            .map_or(0, |b| i32::from_be_bytes(*b)))
    }

    /// A (nullable) string's raw bytes, its int16 length included.
    fn raw_string(&mut self, what: &'static str) -> Result<&'a [u8], WireError> {
        let start = self.at;
        let len = self.take(2, what)?;
        let len = len.first_chunk::<2>().map_or(0, |b| i16::from_be_bytes(*b));
        self.take(usize::try_from(len).unwrap_or(0), what)?;
        Ok(self.bytes.get(start..self.at).unwrap_or_default())
    }
}

impl MetadataResponse {
    /// Splits a Metadata response frame of `version` (without its size prefix).
    pub fn parse(frame: &[u8], version: i16) -> Result<Self, WireError> {
        if !(0..=8).contains(&version) {
            return Err(WireError::Invalid {
                what: "Metadata version (0-8 supported)",
            });
        }
        let mut cursor = Cursor {
            bytes: frame,
            at: 0,
        };
        let head_len = if version >= 3 { 8 } else { 4 };
        let head = cursor.take(head_len, "header")?.to_vec();
        let count = usize::try_from(cursor.i32("brokers")?).unwrap_or(0);
        let mut brokers = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            let node_id = cursor.i32("node id")?;
            let host = cursor.raw_string("host")?;
            let host = String::from_utf8_lossy(host.get(2..).unwrap_or_default()).into_owned();
            let port = cursor.i32("port")?;
            let rack = if version >= 1 {
                cursor.raw_string("rack")?.to_vec()
            } else {
                Vec::new()
            };
            brokers.push(Broker {
                node_id,
                host,
                port,
                rack,
            });
        }
        let tail = frame.get(cursor.at..).unwrap_or_default().to_vec();
        Ok(Self {
            head,
            brokers,
            tail,
        })
    }

    /// The frame again (without its size prefix), with the brokers as they are now.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        let count = i32::try_from(self.brokers.len()).unwrap_or(i32::MAX);
        out.extend_from_slice(&count.to_be_bytes());
        for broker in &self.brokers {
            out.extend_from_slice(&broker.node_id.to_be_bytes());
            let host = broker.host.as_bytes();
            let host = host
                .get(..host.len().min(i16::MAX as usize))
                .unwrap_or(host);
            let host_len = i16::try_from(host.len()).unwrap_or(i16::MAX);
            out.extend_from_slice(&host_len.to_be_bytes());
            out.extend_from_slice(host);
            out.extend_from_slice(&broker.port.to_be_bytes());
            out.extend_from_slice(&broker.rack);
        }
        out.extend_from_slice(&self.tail);
        out
    }
}

/// A FindCoordinator response (without its size prefix), decoded so that its coordinators'
/// addresses can be changed.
#[derive(Debug, Clone, PartialEq)]
pub struct CoordinatorResponse {
    version: i16,
    header: ResponseHeader,
    body: FindCoordinatorResponse,
}

impl CoordinatorResponse {
    /// Decodes a FindCoordinator response frame of `version`.
    pub fn parse(frame: &[u8], version: i16) -> Result<Self, WireError> {
        let invalid = |_| WireError::Invalid {
            what: "FindCoordinator response",
        };
        let mut bytes = bytes::Bytes::copy_from_slice(frame);
        let header_version = FindCoordinatorResponse::header_version(version);
        let header = ResponseHeader::decode(&mut bytes, header_version).map_err(invalid)?;
        let body = FindCoordinatorResponse::decode(&mut bytes, version).map_err(invalid)?;
        Ok(Self {
            version,
            header,
            body,
        })
    }

    /// Every coordinator named (one before version 4, a list from 4 on).
    pub fn coordinators(&self) -> Vec<Broker> {
        let broker = |node_id: i32, host: &StrBytes, port| Broker {
            node_id,
            host: host.as_str().to_owned(),
            port,
            rack: Vec::new(),
        };
        match self.version {
            ..=3 => vec![broker(self.body.node_id.0, &self.body.host, self.body.port)],
            _ => self
                .body
                .coordinators
                .iter()
                .map(|c| broker(c.node_id.0, &c.host, c.port))
                .collect(),
        }
    }

    /// Points every coordinator that is broker `node_id` at `host`:`port`.
    pub fn redirect(&mut self, node_id: i32, host: &str, port: i32) {
        let host = StrBytes::from_string(host.to_owned());
        if self.body.node_id.0 == node_id {
            self.body.host = host.clone();
            self.body.port = port;
        }
        for c in self
            .body
            .coordinators
            .iter_mut()
            .filter(|c| c.node_id.0 == node_id)
        {
            c.host = host.clone();
            c.port = port;
        }
    }

    /// The frame again (without its size prefix).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let invalid = |_| WireError::Invalid {
            what: "FindCoordinator response to encode",
        };
        let mut out = bytes::BytesMut::new();
        let header_version = FindCoordinatorResponse::header_version(self.version);
        self.header
            .encode(&mut out, header_version)
            .map_err(invalid)?;
        self.body.encode(&mut out, self.version).map_err(invalid)?;
        Ok(out.to_vec())
    }
}

#[cfg(test)]
#[path = "frame_test.rs"]
mod test;
