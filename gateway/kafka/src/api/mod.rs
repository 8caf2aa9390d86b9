//! Dispatch by API key: [`SERVED`] lists every API this listener answers with its versions
//! (ApiVersions advertises exactly this table), and [`dispatch`] has one match arm per API that
//! calls its module's `handle`. Each module under `api/` owns one API: it decodes its request with
//! kafka-protocol, answers from the log, and encodes its response; none of them touches the socket.
//!
//! Adding an API: a module `api/<name>.rs` with `pub const VERSIONS: Versions` and
//! `pub async fn handle(ctx, conn, request) -> Result<Reply, ApiError>`, one row in [`SERVED`],
//! one arm in [`dispatch`]. The `every_served_api_is_dispatched_at_every_version` test fails
//! until all three agree.

mod api_versions;
mod create_partitions;
mod create_topics;
mod delete_groups;
mod delete_topics;
mod describe_configs;
mod describe_groups;
mod fetch;
mod find_coordinator;
mod heartbeat;
mod init_producer_id;
mod join_group;
mod leave_group;
mod list_groups;
mod list_offsets;
mod metadata;
mod offset_commit;
mod offset_delete;
mod offset_fetch;
mod produce;
mod sasl_authenticate;
mod sasl_handshake;
mod sync_group;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::config::KafkaListenerConfig;
use crate::group::Groups;
use crate::header::Request;
use crate::sasl::Session;
use tern_auth::{Security, Want};
use tern_core::shutdown::Shutdown;
use tern_log::LogPort;

/// The inclusive range of versions served for one API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    pub min: i16,
    pub max: i16,
}

impl Versions {
    pub fn contains(self, version: i16) -> bool {
        (self.min..=self.max).contains(&version)
    }
}

/// Every API the listener answers, with the versions it serves (see `docs/kafka.md` for why
/// these ranges).
pub const SERVED: &[(ApiKey, Versions)] = &[
    (ApiKey::ApiVersions, api_versions::VERSIONS),
    (ApiKey::Metadata, metadata::VERSIONS),
    (ApiKey::Produce, produce::VERSIONS),
    (ApiKey::Fetch, fetch::VERSIONS),
    (ApiKey::ListOffsets, list_offsets::VERSIONS),
    (ApiKey::InitProducerId, init_producer_id::VERSIONS),
    (ApiKey::OffsetCommit, offset_commit::VERSIONS),
    (ApiKey::OffsetFetch, offset_fetch::VERSIONS),
    (ApiKey::FindCoordinator, find_coordinator::VERSIONS),
    (ApiKey::JoinGroup, join_group::VERSIONS),
    (ApiKey::Heartbeat, heartbeat::VERSIONS),
    (ApiKey::LeaveGroup, leave_group::VERSIONS),
    (ApiKey::SyncGroup, sync_group::VERSIONS),
    (ApiKey::DescribeGroups, describe_groups::VERSIONS),
    (ApiKey::ListGroups, list_groups::VERSIONS),
    (ApiKey::DeleteGroups, delete_groups::VERSIONS),
    (ApiKey::OffsetDelete, offset_delete::VERSIONS),
    (ApiKey::CreateTopics, create_topics::VERSIONS),
    (ApiKey::DeleteTopics, delete_topics::VERSIONS),
    (ApiKey::CreatePartitions, create_partitions::VERSIONS),
    (ApiKey::DescribeConfigs, describe_configs::VERSIONS),
    (ApiKey::SaslHandshake, sasl_handshake::VERSIONS),
    (ApiKey::SaslAuthenticate, sasl_authenticate::VERSIONS),
];

/// The versions served for `api`, if it is served at all.
pub fn served(api: ApiKey) -> Option<Versions> {
    SERVED
        .iter()
        .find(|(key, _)| *key == api)
        .map(|(_, versions)| *versions)
}

/// What every handler may use: the log, the settings, the shutdown signal, producer ids, who
/// may do what.
#[derive(Debug)]
pub struct Ctx<L> {
    pub log: L,
    pub config: Arc<KafkaListenerConfig>,
    pub shutdown: Shutdown,
    /// Idempotent producers' sequences per partition.
    pub producer_states: crate::producers::ProducerStates,
    pub producers: init_producer_id::ProducerIds,
    /// Every consumer group (tern is their coordinator).
    pub groups: Groups,
    /// The users and `[[mqtt.acl]]` rules MQTT applies; `None` admits everything (unit tests).
    pub security: Option<Arc<Security>>,
}

impl<L> Ctx<L> {
    /// Whether the connection's user (with the request's client id) may do `want` on the
    /// Kafka topic `topic`, an MQTT topic name of one level.
    pub fn allows(&self, conn: &Conn, request: &Request, want: Want, topic: &str) -> bool {
        self.security.as_deref().is_none_or(|security| {
            security.allows(conn.sasl.user(), request.client_id(), want, topic)
        })
    }

    /// Read or write access to `topic` (what Metadata and the group APIs need to see it).
    pub fn sees(&self, conn: &Conn, request: &Request, topic: &str) -> bool {
        self.allows(conn, request, Want::Receive, topic)
            || self.allows(conn, request, Want::Publish, topic)
    }

    /// `topics::lookup` behind the ACL: TOPIC_AUTHORIZATION_FAILED unless `want` is granted
    /// (checked first, so a client without access never creates a topic).
    pub fn lookup(
        &self,
        conn: &Conn,
        request: &Request,
        want: Want,
        name: &str,
        create: bool,
    ) -> crate::topics::Lookup
    where
        L: LogPort,
    {
        if self.allows(conn, request, want, name) {
            crate::topics::lookup(&self.log, name, create)
        } else {
            Err(kafka_protocol::ResponseError::TopicAuthorizationFailed)
        }
    }

    /// Both read and write access to `topic` (topic administration).
    pub fn administers(&self, conn: &Conn, request: &Request, topic: &str) -> bool {
        self.allows(conn, request, Want::Receive, topic)
            && self.allows(conn, request, Want::Publish, topic)
    }
}

/// One client connection as handlers see it.
#[derive(Debug)]
pub struct Conn {
    /// The address the client connected to (advertised in Metadata unless configured).
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// Its authentication: who it is, what it may send now.
    pub sasl: Session,
}

/// A response that is answered later: a produce waiting for fdatasync, a long-polling fetch.
pub type Pending = Pin<Box<dyn Future<Output = Result<Bytes, ApiError>> + Send>>;

/// A handler's answer. The connection writes answers in request order.
#[derive(Debug)]
pub enum Reply {
    /// The encoded response body.
    Now(Bytes),
    /// A response body that completes later.
    Later(PendingReply),
    /// No response at all (Produce with `acks=0`).
    Nothing,
}

/// [`Pending`] with a `Debug` implementation.
pub struct PendingReply(pub Pending);

impl std::fmt::Debug for PendingReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingReply")
    }
}

/// Why a request got no answer; each closes the connection, as Apache Kafka does when it
/// cannot build a response the client could read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    #[error("{api:?} is not served")]
    NotServed { api: ApiKey },
    #[error("{api:?} v{version} is not served (versions {min}-{max} are)")]
    UnsupportedVersion {
        api: ApiKey,
        version: i16,
        min: i16,
        max: i16,
    },
    #[error("{api:?} before SASL authentication")]
    Unauthenticated { api: ApiKey },
    #[error("malformed {api:?} v{version} request: {message}")]
    Decode {
        api: ApiKey,
        version: i16,
        message: String,
    },
    #[error("cannot encode the {api:?} v{version} response: {message}")]
    Encode {
        api: ApiKey,
        version: i16,
        message: String,
    },
}

/// Answers one request.
pub async fn dispatch<L: LogPort>(
    ctx: &Ctx<L>,
    conn: &mut Conn,
    request: &Request,
) -> Result<Reply, ApiError> {
    let api = request.api;
    // Before authentication Kafka closes the connection on any other request.
    if !conn.sasl.admits(api) {
        return Err(ApiError::Unauthenticated { api });
    }
    let versions = served(api).ok_or(ApiError::NotServed { api })?;
    // ApiVersions answers an unknown version itself (with v0 and UNSUPPORTED_VERSION), so the
    // client can learn what is served.
    if api != ApiKey::ApiVersions && !versions.contains(request.version()) {
        return Err(ApiError::UnsupportedVersion {
            api,
            version: request.version(),
            min: versions.min,
            max: versions.max,
        });
    }
    match api {
        ApiKey::ApiVersions => api_versions::handle(request),
        ApiKey::Metadata => metadata::handle(ctx, conn, request),
        ApiKey::Produce => produce::handle(ctx, conn, request).await,
        ApiKey::Fetch => fetch::handle(ctx, conn, request).await,
        ApiKey::ListOffsets => list_offsets::handle(ctx, conn, request),
        ApiKey::InitProducerId => init_producer_id::handle(ctx, request),
        ApiKey::OffsetCommit => offset_commit::handle(ctx, conn, request),
        ApiKey::OffsetFetch => offset_fetch::handle(ctx, conn, request),
        ApiKey::FindCoordinator => find_coordinator::handle(ctx, conn, request),
        ApiKey::JoinGroup => join_group::handle(ctx, conn, request),
        ApiKey::Heartbeat => heartbeat::handle(ctx, request),
        ApiKey::LeaveGroup => leave_group::handle(ctx, request),
        ApiKey::SyncGroup => sync_group::handle(ctx, request),
        ApiKey::DescribeGroups => describe_groups::handle(ctx, request),
        ApiKey::ListGroups => list_groups::handle(ctx, request),
        ApiKey::DeleteGroups => delete_groups::handle(ctx, conn, request),
        ApiKey::OffsetDelete => offset_delete::handle(ctx, conn, request),
        ApiKey::CreateTopics => create_topics::handle(ctx, conn, request),
        ApiKey::DeleteTopics => delete_topics::handle(ctx, conn, request).await,
        ApiKey::CreatePartitions => create_partitions::handle(ctx, conn, request),
        ApiKey::DescribeConfigs => describe_configs::handle(ctx, conn, request),
        ApiKey::SaslHandshake => sasl_handshake::handle(ctx, conn, request),
        ApiKey::SaslAuthenticate => sasl_authenticate::handle(ctx, conn, request).await,
        _ => Err(ApiError::NotServed { api }),
    }
}

/// Decodes `request`'s body as `R` at its version.
pub fn decode<R: Decodable>(request: &Request) -> Result<R, ApiError> {
    let mut body = request.body.clone();
    let decoded = R::decode(&mut body, request.version()).map_err(|err| ApiError::Decode {
        api: request.api,
        version: request.version(),
        message: err.to_string(),
    })?;
    Ok(decoded)
}

/// Encodes a response body at `version`.
pub fn encode<R: Encodable>(api: ApiKey, version: i16, response: &R) -> Result<Bytes, ApiError> {
    let mut buf = BytesMut::new();
    response
        .encode(&mut buf, version)
        .map_err(|err| ApiError::Encode {
            api,
            version,
            message: err.to_string(),
        })?;
    Ok(buf.freeze())
}

#[cfg(test)]
pub(crate) mod test;
#[cfg(test)]
mod test_acl;
#[cfg(test)]
mod test_admin;
#[cfg(test)]
mod test_long_poll;
