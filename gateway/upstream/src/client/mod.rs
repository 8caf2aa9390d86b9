//! tern's one Kafka client, on the `kafka-protocol` crate's codec: it owns every connection to
//! the upstream cluster (`conn.rs`: plaintext or TLS, SASL PLAIN and SCRAM in `sasl.rs`,
//! ApiVersions negotiation, the one request/response path that writes the size prefix) and the
//! requests the forwarders send — Metadata, leader discovery and CreateTopics (`metadata.rs`),
//! Produce and InitProducerId (`produce.rs`), ListOffsets and Fetch (`fetch.rs`), and the group
//! offsets (`group.rs`), and the transactional producer's AddPartitionsToTxn, AddOffsetsToTxn,
//! TxnOffsetCommit and EndTxn (`txn.rs`). `frame.rs` splits frames for tools that sit between a client and a
//! cluster. It never retries a request and never decides what a failure means for forwarding:
//! every error goes back to the caller as a [`ClientError`], and a connection that failed once
//! is never used again. Nothing else in tern opens a Kafka connection (scripts/layout.sh).

use std::path::PathBuf;
use std::sync::Arc;

use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};

use crate::config::SaslSettings;

pub mod conn;
pub mod fetch;
pub mod frame;
pub mod group;
pub mod metadata;
pub mod produce;
pub mod sasl;
pub mod txn;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod txn_test;

pub use conn::Connection;
pub use sasl::SaslError;

/// A request the client sends, with its api key and response (kafka-protocol's own `Request`
/// trait needs the crate's broker side too, which tern-upstream does not build).
pub trait Api: Encodable + HeaderVersion {
    const KEY: ApiKey;
    type Response: Decodable + HeaderVersion;
}

macro_rules! apis {
    ($($request:ty => $response:ty, $key:ident;)*) => {
        $(impl Api for $request {
            const KEY: ApiKey = ApiKey::$key;
            type Response = $response;
        })*
    };
}

apis! {
    ProduceRequest => ProduceResponse, Produce;
    FetchRequest => FetchResponse, Fetch;
    ListOffsetsRequest => ListOffsetsResponse, ListOffsets;
    MetadataRequest => MetadataResponse, Metadata;
    OffsetCommitRequest => OffsetCommitResponse, OffsetCommit;
    OffsetFetchRequest => OffsetFetchResponse, OffsetFetch;
    FindCoordinatorRequest => FindCoordinatorResponse, FindCoordinator;
    SaslHandshakeRequest => SaslHandshakeResponse, SaslHandshake;
    ApiVersionsRequest => ApiVersionsResponse, ApiVersions;
    CreateTopicsRequest => CreateTopicsResponse, CreateTopics;
    DescribeConfigsRequest => DescribeConfigsResponse, DescribeConfigs;
    InitProducerIdRequest => InitProducerIdResponse, InitProducerId;
    SaslAuthenticateRequest => SaslAuthenticateResponse, SaslAuthenticate;
    AddPartitionsToTxnRequest => AddPartitionsToTxnResponse, AddPartitionsToTxn;
    AddOffsetsToTxnRequest => AddOffsetsToTxnResponse, AddOffsetsToTxn;
    TxnOffsetCommitRequest => TxnOffsetCommitResponse, TxnOffsetCommit;
    EndTxnRequest => EndTxnResponse, EndTxn;
}

/// An error of the codec (`kafka-protocol` reports them as `anyhow` errors).
pub type CodecError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request to the upstream cluster failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("{addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr}: {op} timed out")]
    Timeout { addr: String, op: &'static str },
    #[error("{addr}: not a TLS server name: {source}")]
    ServerName {
        addr: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("{addr}: response frame of {size} bytes")]
    BadFrame { addr: String, size: i64 },
    #[error("{addr}: {api} response for correlation id {got}, expected {expected}")]
    Correlation {
        addr: String,
        api: &'static str,
        expected: i32,
        got: i32,
    },
    #[error("{api} v{version}: cannot encode the request: {source}")]
    Encode {
        api: &'static str,
        version: i16,
        #[source]
        source: CodecError,
    },
    #[error("{api} v{version} response: {source}")]
    Decode {
        api: &'static str,
        version: i16,
        #[source]
        source: CodecError,
    },
    #[error("{api}: Kafka error {code} ({name}){context}")]
    Kafka {
        api: &'static str,
        code: i16,
        name: &'static str,
        context: String,
    },
    #[error("{api}: the response has no {what}")]
    Missing { api: &'static str, what: String },
    #[error("the broker accepts {api} in {broker:?}, tern speaks v{}-{}", client.0, client.1)]
    Unsupported {
        api: &'static str,
        client: (i16, i16),
        broker: Option<(i16, i16)>,
    },
    #[error("{addr}: SASL: {source}")]
    Sasl {
        addr: String,
        #[source]
        source: SaslError,
    },
    #[error("no bootstrap server answered ({tried} tried), the last: {source}")]
    NoBroker {
        tried: usize,
        #[source]
        source: Box<ClientError>,
    },
    #[error("producer state file {path}: {source}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    pub(crate) fn kafka(api: &'static str, code: i16, context: String) -> Self {
        Self::Kafka {
            api,
            code,
            name: error_name(code),
            context,
        }
    }

    /// Whether the broker could not be reached or the connection failed (no broker answered).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            Self::Io { .. } | Self::Timeout { .. } | Self::BadFrame { .. } | Self::NoBroker { .. }
        )
    }

    /// The Kafka error code of a broker's refusal.
    pub fn code(&self) -> Option<i16> {
        match self {
            Self::Kafka { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// How to reach one upstream cluster: its bootstrap servers, TLS and SASL settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub bootstrap: Vec<String>,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub sasl: Option<SaslSettings>,
}

/// The client id tern sends.
pub const CLIENT_ID: &str = "tern";

/// The versions of each request the client speaks: within what kafka-protocol encodes, without
/// the ones that name topics by id only (Produce and Fetch v13+), and Metadata up to v8, the
/// non-flexible versions `frame.rs` (the bench's proxy) rewrites. The transactional requests stop
/// before Kafka's transactions v2 (KIP-890: Produce v12, AddPartitionsToTxn v4+, EndTxn v5
/// bump the epoch at every commit and add partitions implicitly); tern adds partitions and
/// keeps its epoch itself. A connection sends the
/// highest version both it and the broker accept (`Connection::version`).
pub const MAX_VERSIONS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 11),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 1, 8),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 1, 6),
    (ApiKey::SaslHandshake, 1, 1),
    (ApiKey::ApiVersions, 0, 0),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 4),
    (ApiKey::TxnOffsetCommit, 0, 5),
    (ApiKey::EndTxn, 0, 4),
];

/// The versions of `api` the client speaks.
pub fn client_versions(api: ApiKey) -> Option<(i16, i16)> {
    MAX_VERSIONS
        .iter()
        .find(|(key, _, _)| *key == api)
        .map(|&(_, min, max)| (min, max))
}

/// Kafka's name of an API key, for errors.
pub fn api_name(key: i16) -> &'static str {
    match ApiKey::try_from(key) {
        Ok(ApiKey::Produce) => "Produce",
        Ok(ApiKey::Fetch) => "Fetch",
        Ok(ApiKey::ListOffsets) => "ListOffsets",
        Ok(ApiKey::Metadata) => "Metadata",
        Ok(ApiKey::OffsetCommit) => "OffsetCommit",
        Ok(ApiKey::OffsetFetch) => "OffsetFetch",
        Ok(ApiKey::FindCoordinator) => "FindCoordinator",
        Ok(ApiKey::SaslHandshake) => "SaslHandshake",
        Ok(ApiKey::ApiVersions) => "ApiVersions",
        Ok(ApiKey::CreateTopics) => "CreateTopics",
        Ok(ApiKey::DescribeConfigs) => "DescribeConfigs",
        Ok(ApiKey::InitProducerId) => "InitProducerId",
        Ok(ApiKey::SaslAuthenticate) => "SaslAuthenticate",
        Ok(ApiKey::AddPartitionsToTxn) => "AddPartitionsToTxn",
        Ok(ApiKey::AddOffsetsToTxn) => "AddOffsetsToTxn",
        Ok(ApiKey::TxnOffsetCommit) => "TxnOffsetCommit",
        Ok(ApiKey::EndTxn) => "EndTxn",
        _ => "request",
    }
}

/// `host:port` of a broker as Metadata or FindCoordinator name it (IPv6 hosts in brackets).
pub fn broker_addr(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Names of the Kafka error codes the client's requests return.
pub fn error_name(code: i16) -> &'static str {
    match code {
        1 => "OFFSET_OUT_OF_RANGE",
        2 => "CORRUPT_MESSAGE",
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        5 => "LEADER_NOT_AVAILABLE",
        6 => "NOT_LEADER_OR_FOLLOWER",
        7 => "REQUEST_TIMED_OUT",
        10 => "MESSAGE_TOO_LARGE",
        14 => "COORDINATOR_LOAD_IN_PROGRESS",
        15 => "COORDINATOR_NOT_AVAILABLE",
        16 => "NOT_COORDINATOR",
        19 => "NOT_ENOUGH_REPLICAS",
        20 => "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        22 => "ILLEGAL_GENERATION",
        24 => "INVALID_GROUP_ID",
        25 => "UNKNOWN_MEMBER_ID",
        28 => "OFFSET_METADATA_TOO_LARGE",
        29 => "TOPIC_AUTHORIZATION_FAILED",
        30 => "GROUP_AUTHORIZATION_FAILED",
        33 => "UNSUPPORTED_SASL_MECHANISM",
        34 => "ILLEGAL_SASL_STATE",
        35 => "UNSUPPORTED_VERSION",
        36 => "TOPIC_ALREADY_EXISTS",
        37 => "INVALID_PARTITIONS",
        38 => "INVALID_REPLICATION_FACTOR",
        41 => "NOT_CONTROLLER",
        44 => "POLICY_VIOLATION",
        45 => "OUT_OF_ORDER_SEQUENCE_NUMBER",
        46 => "DUPLICATE_SEQUENCE_NUMBER",
        47 => "INVALID_PRODUCER_EPOCH",
        48 => "INVALID_TXN_STATE",
        49 => "INVALID_PRODUCER_ID_MAPPING",
        50 => "INVALID_TRANSACTION_TIMEOUT",
        51 => "CONCURRENT_TRANSACTIONS",
        52 => "TRANSACTION_COORDINATOR_FENCED",
        53 => "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        55 => "OPERATION_NOT_ATTEMPTED",
        58 => "SASL_AUTHENTICATION_FAILED",
        59 => "UNKNOWN_PRODUCER_ID",
        69 => "GROUP_ID_NOT_FOUND",
        88 => "UNSTABLE_OFFSET_COMMIT",
        90 => "PRODUCER_FENCED",
        120 => "TRANSACTION_ABORTABLE",
        _ => "see Kafka's protocol error codes",
    }
}
