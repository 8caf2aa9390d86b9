//! Unit tests of dispatch and of each API on the in-memory log.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse,
    RequestHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tern_log::{LogPort, MemoryLog};

use super::{ApiError, Conn, Ctx, Reply, SERVED, dispatch};
use crate::config::KafkaListenerConfig;
use crate::header::{self, Request};

pub(crate) fn ctx() -> Ctx<MemoryLog> {
    let (trigger, shutdown) = tern_core::shutdown::channel();
    // The trigger is dropped: the shutdown never fires in these tests.
    drop(trigger);
    Ctx {
        log: MemoryLog::new(2),
        config: Arc::new(KafkaListenerConfig::default()),
        shutdown,
        groups: crate::group::Groups::new(crate::group::coordinator::Limits::default()),
    }
}

pub(crate) fn conn() -> Conn {
    Conn {
        local: "127.0.0.1:9092".parse().expect("addr"),
        peer: "127.0.0.1:40000".parse().expect("addr"),
    }
}

/// A request frame of `api` at `version` with `body`, decoded as the connection does.
pub(crate) fn request<B: Encodable>(api: ApiKey, version: i16, body: &B) -> Request {
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("test")));
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, api.request_header_version(version))
        .expect("header");
    body.encode(&mut buf, version).expect("body");
    header::decode(buf.freeze()).expect("decode")
}

/// The body a reply resolves to.
pub(crate) async fn body(reply: Reply) -> Option<Bytes> {
    match reply {
        Reply::Now(body) => Some(body),
        Reply::Later(pending) => Some(pending.0.await.expect("pending reply")),
        Reply::Nothing => None,
    }
}

pub(crate) fn decode_as<R: Decodable>(body: Bytes, version: i16) -> R {
    let mut body = body;
    R::decode(&mut body, version).expect("response decodes")
}

#[tokio::test]
async fn every_served_api_is_dispatched_at_every_version() {
    let ctx = ctx();
    for (api, versions) in SERVED {
        for version in versions.min..=versions.max {
            let frame = default_request(*api, version);
            let request = header::decode(frame).expect("header");
            let reply = dispatch(&ctx, &conn(), &request).await;
            assert!(reply.is_ok(), "{api:?} v{version}: {reply:?}");
        }
    }
}

/// A frame of `api`'s default request: kafka-protocol's types with their defaults.
fn default_request(api: ApiKey, version: i16) -> Bytes {
    macro_rules! frame {
        ($($key:ident => $ty:ty),* $(,)?) => {
            match api {
                $(ApiKey::$key => {
                    let r = request(api, version, &<$ty>::default());
                    let mut buf = BytesMut::new();
                    let h = r.header.clone();
                    h.encode(&mut buf, api.request_header_version(version)).expect("header");
                    buf.extend_from_slice(&r.body);
                    buf.freeze()
                })*
                other => panic!("add {other:?} to default_request"),
            }
        };
    }
    frame! {
        ApiVersions => ApiVersionsRequest,
        Metadata => MetadataRequest,
        OffsetCommit => kafka_protocol::messages::OffsetCommitRequest,
        OffsetFetch => kafka_protocol::messages::OffsetFetchRequest,
        FindCoordinator => kafka_protocol::messages::FindCoordinatorRequest,
        JoinGroup => kafka_protocol::messages::JoinGroupRequest,
        Heartbeat => kafka_protocol::messages::HeartbeatRequest,
        LeaveGroup => kafka_protocol::messages::LeaveGroupRequest,
        SyncGroup => kafka_protocol::messages::SyncGroupRequest,
        DescribeGroups => kafka_protocol::messages::DescribeGroupsRequest,
        ListGroups => kafka_protocol::messages::ListGroupsRequest,
        DeleteGroups => kafka_protocol::messages::DeleteGroupsRequest,
        OffsetDelete => kafka_protocol::messages::OffsetDeleteRequest,
    }
}

#[tokio::test]
async fn api_versions_advertises_the_served_table_and_refuses_unknown_versions() {
    let ctx = ctx();
    let request = request(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    let reply = body(dispatch(&ctx, &conn(), &request).await.expect("reply")).await;
    let response: ApiVersionsResponse = decode_as(reply.expect("answered"), 3);
    assert_eq!(response.error_code, 0);
    let table: Vec<(i16, i16, i16)> = response
        .api_keys
        .iter()
        .map(|k| (k.api_key, k.min_version, k.max_version))
        .collect();
    let expected: Vec<(i16, i16, i16)> = SERVED
        .iter()
        .map(|(api, v)| (*api as i16, v.min, v.max))
        .collect();
    assert_eq!(table, expected);

    // v9 does not exist: the answer is v0 with UNSUPPORTED_VERSION and the table.
    let mut unknown = request.clone();
    unknown.header.request_api_version = 9;
    let reply = body(dispatch(&ctx, &conn(), &unknown).await.expect("reply")).await;
    let response: ApiVersionsResponse = decode_as(reply.expect("answered"), 0);
    assert_eq!(response.error_code, 35);
    assert_eq!(response.api_keys.len(), SERVED.len());
}

#[tokio::test]
async fn unserved_apis_and_versions_close_the_connection() {
    let ctx = ctx();
    let mut request = request(ApiKey::Metadata, 12, &MetadataRequest::default());
    request.header.request_api_version = 13;
    let err = dispatch(&ctx, &conn(), &request).await.expect_err("v13");
    assert!(
        matches!(err, ApiError::UnsupportedVersion { version: 13, .. }),
        "{err}"
    );
    request.api = ApiKey::DescribeAcls;
    let err = dispatch(&ctx, &conn(), &request)
        .await
        .expect_err("not served");
    assert_eq!(
        err,
        ApiError::NotServed {
            api: ApiKey::DescribeAcls
        }
    );
}

#[tokio::test]
async fn metadata_names_one_broker_leading_every_partition_and_creates_when_allowed() {
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    let ctx = ctx();
    ctx.log.ensure_topic("mqtt").expect("topic");
    let all = request(
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(None),
    );
    let reply = body(dispatch(&ctx, &conn(), &all).await.expect("reply")).await;
    let response: MetadataResponse = decode_as(reply.expect("answered"), 12);
    assert_eq!(response.brokers.len(), 1);
    assert_eq!(response.brokers[0].host.as_str(), "127.0.0.1");
    assert_eq!(response.brokers[0].port, 9092);
    assert_eq!(response.topics.len(), 1);
    assert_eq!(response.topics[0].partitions.len(), 2);
    assert!(
        response.topics[0]
            .partitions
            .iter()
            .all(|p| p.leader_id.0 == 0)
    );

    let named = |name: &str, create: bool| {
        MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(name.to_owned())))),
            ]))
            .with_allow_auto_topic_creation(create)
    };
    for (name, create, code) in [
        ("missing", false, 3),
        ("made", true, 0),
        ("bad/name", true, 17),
    ] {
        let request = request(ApiKey::Metadata, 12, &named(name, create));
        let reply = body(dispatch(&ctx, &conn(), &request).await.expect("reply")).await;
        let response: MetadataResponse = decode_as(reply.expect("answered"), 12);
        assert_eq!(response.topics[0].error_code, code, "{name}");
    }
    assert!(ctx.log.topics().iter().any(|t| t.name == "made"));
    assert!(!ctx.log.topics().iter().any(|t| t.name == "missing"));
}

mod groups;
