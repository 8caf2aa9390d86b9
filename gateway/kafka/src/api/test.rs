//! Unit tests of dispatch and of each API on the in-memory log.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, FetchRequest, MetadataRequest,
    MetadataResponse, ProduceRequest, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tern_log::{LogPort, MemoryLog};

use super::{ApiError, Conn, Ctx, Reply, SERVED, dispatch};
use crate::config::KafkaListenerConfig;
use crate::header::{self, Request};

pub(crate) fn ctx() -> Ctx<MemoryLog> {
    let (trigger, shutdown) = tern_core::shutdown::channel();
    // Kept for the whole test run: a dropped trigger reads as a shutdown.
    Box::leak(Box::new(trigger));
    let groups = crate::group::Groups::new(crate::group::coordinator::Limits::default());
    // Inside a runtime, the groups' timer runs, so parked JoinGroups are answered.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(groups.clone().run_timer(shutdown.clone()));
    }
    Ctx {
        log: MemoryLog::new(2),
        config: Arc::new(KafkaListenerConfig::default()),
        shutdown,
        producer_states: Default::default(),
        producers: Default::default(),
        groups,
        security: None,
    }
}

pub(crate) fn conn() -> Conn {
    Conn {
        local: "127.0.0.1:9092".parse().expect("addr"),
        peer: "127.0.0.1:40000".parse().expect("addr"),
        sasl: crate::sasl::Session::new(false),
    }
}

/// A request frame of `api` at `version` with `body`, decoded as the connection does.
pub(crate) fn request<B: Encodable>(api: ApiKey, version: i16, body: &B) -> Request {
    header::decode(request_bytes(api, version, 1, body).freeze()).expect("decode")
}

/// The bytes of a request frame (without its length) of `api` at `version` with `body`.
pub(crate) fn request_bytes<B: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &B,
) -> BytesMut {
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("test")));
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, api.request_header_version(version))
        .expect("header");
    body.encode(&mut buf, version).expect("body");
    buf
}

/// The body a reply resolves to.
pub(crate) async fn body(reply: Reply) -> Option<Bytes> {
    match reply {
        Reply::Now(body) => Some(body),
        Reply::Later(pending) => Some(pending.0.await.expect("pending reply")),
        Reply::Nothing => None,
    }
}

/// Dispatches `q` on a fresh anonymous connection and decodes the answer.
pub(crate) async fn call<Q: Encodable, R: Decodable>(
    ctx: &Ctx<MemoryLog>,
    api: ApiKey,
    version: i16,
    q: &Q,
) -> R {
    let reply = dispatch(ctx, &mut conn(), &request(api, version, q))
        .await
        .expect("reply");
    decode_as(body(reply).await.expect("answered"), version)
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
            let reply = dispatch(&ctx, &mut conn(), &request).await;
            assert!(reply.is_ok(), "{api:?} v{version}: {reply:?}");
        }
    }
}

/// A frame of `api`'s default request: kafka-protocol's types with their defaults.
pub(crate) fn default_request(api: ApiKey, version: i16) -> Bytes {
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
        Produce => kafka_protocol::messages::ProduceRequest,
        Fetch => kafka_protocol::messages::FetchRequest,
        ListOffsets => kafka_protocol::messages::ListOffsetsRequest,
        InitProducerId => kafka_protocol::messages::InitProducerIdRequest,
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
        CreateTopics => kafka_protocol::messages::CreateTopicsRequest,
        DeleteTopics => kafka_protocol::messages::DeleteTopicsRequest,
        CreatePartitions => kafka_protocol::messages::CreatePartitionsRequest,
        DescribeConfigs => kafka_protocol::messages::DescribeConfigsRequest,
        SaslHandshake => kafka_protocol::messages::SaslHandshakeRequest,
        SaslAuthenticate => kafka_protocol::messages::SaslAuthenticateRequest,
    }
}

#[tokio::test]
async fn api_versions_advertises_the_served_table_and_refuses_unknown_versions() {
    let ctx = ctx();
    let request = request(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    let reply = body(dispatch(&ctx, &mut conn(), &request).await.expect("reply")).await;
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
    let reply = body(dispatch(&ctx, &mut conn(), &unknown).await.expect("reply")).await;
    let response: ApiVersionsResponse = decode_as(reply.expect("answered"), 0);
    assert_eq!(response.error_code, 35);
    assert_eq!(response.api_keys.len(), SERVED.len());
}

#[tokio::test]
async fn unserved_apis_and_versions_close_the_connection() {
    let ctx = ctx();
    let mut request = request(ApiKey::Metadata, 12, &MetadataRequest::default());
    request.header.request_api_version = 13;
    let err = dispatch(&ctx, &mut conn(), &request)
        .await
        .expect_err("v13");
    assert!(
        matches!(err, ApiError::UnsupportedVersion { version: 13, .. }),
        "{err}"
    );
    request.api = ApiKey::DescribeAcls;
    let err = dispatch(&ctx, &mut conn(), &request)
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
    let reply = body(dispatch(&ctx, &mut conn(), &all).await.expect("reply")).await;
    let response: MetadataResponse = decode_as(reply.expect("answered"), 12);
    assert_eq!(response.brokers.len(), 1);
    assert_eq!(response.brokers[0].host.as_str(), "127.0.0.1");
    assert_eq!(response.brokers[0].port, 9092);
    // The log's topic, then Kafka's offsets topic, listed internal as Kafka lists it (a regex
    // consumer skips it by that flag: franz-go's TestConsumeRegex).
    assert_eq!(response.topics.len(), 2);
    assert_eq!(response.topics[0].partitions.len(), 2);
    let offsets = &response.topics[1];
    assert_eq!(
        offsets.name.as_ref().map(|n| n.0.as_str()),
        Some("__consumer_offsets")
    );
    assert!(offsets.is_internal);
    assert_eq!(offsets.partitions.len(), 1);
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
        ("__consumer_offsets", false, 0),
    ] {
        let request = request(ApiKey::Metadata, 12, &named(name, create));
        let reply = body(dispatch(&ctx, &mut conn(), &request).await.expect("reply")).await;
        let response: MetadataResponse = decode_as(reply.expect("answered"), 12);
        assert_eq!(response.topics[0].error_code, code, "{name}");
        // Kafka's offsets topic: internal, one partition (franz-go's tests wait for it).
        let internal = name.starts_with("__");
        assert_eq!(response.topics[0].is_internal, internal, "{name}");
        if internal {
            assert_eq!(response.topics[0].partitions.len(), 1);
        }
    }
    assert!(ctx.log.topics().iter().any(|t| t.name == "made"));
    assert!(!ctx.log.topics().iter().any(|t| t.name == "missing"));
}

/// `topic` as a request names it.
pub(crate) fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_owned()))
}

/// A Produce of `records` to partition 0 of `topic`.
pub(crate) fn produce(topic: &str, acks: i16, records: Bytes) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(name(topic))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(records)),
                ]),
        ])
}

/// A Fetch of partition 0 of `topic` from `offset`, at most 1 MiB.
pub(crate) fn fetch(topic: &str, offset: i64, max_wait_ms: i32, min_bytes: i32) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(min_bytes)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(name(topic))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(offset)
                        .with_partition_max_bytes(1 << 20),
                ]),
        ])
}

mod data_path {
    use std::time::Duration;

    use super::{fetch, name, produce};

    use bytes::Bytes;
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{
        ApiKey, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
        ProduceResponse,
    };
    use kafka_protocol::records::{Compression, RecordBatchDecoder, RecordSet};
    use tern_log::{LogPort, MemoryLog, Record};

    use super::{body, conn, ctx, decode_as, request};
    use crate::api::{Ctx, Reply, dispatch};
    use crate::records::tests::{Produced, produced};

    /// One uncompressed v2 batch of `values` (with their timestamps), each with `headers`.
    fn batch(values: &[(&str, i64)], headers: &[(&str, &str)]) -> Bytes {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let records: Vec<Produced<'_>> = values
            .iter()
            .map(|(value, ts)| (*ts, None, value.as_bytes(), &headers[..]))
            .collect();
        produced(Compression::None, &records)
    }

    /// `batch` with its last byte changed: the CRC no longer matches.
    fn flipped(batch: Bytes) -> Bytes {
        let mut bytes = batch.to_vec();
        if let Some(last) = bytes.last_mut() {
            *last ^= 0xff;
        }
        Bytes::from(bytes)
    }

    /// The record batches of the first partition `response` answers.
    fn record_sets(response: &FetchResponse) -> Vec<RecordSet> {
        let mut records = response.responses[0].partitions[0]
            .records
            .clone()
            .unwrap_or_default();
        RecordBatchDecoder::decode_all(&mut records).expect("batches")
    }

    /// What a Fetch v12 of `asked` answers.
    async fn fetched(ctx: &Ctx<MemoryLog>, asked: &FetchRequest) -> FetchResponse {
        let asked = request(ApiKey::Fetch, 12, asked);
        let reply = dispatch(ctx, &mut conn(), &asked).await.expect("reply");
        decode_as(body(reply).await.expect("answered"), 12)
    }

    fn values(response: &FetchResponse) -> Vec<(i64, String)> {
        record_sets(response)
            .iter()
            .flat_map(|s| s.records.iter())
            .map(|r| {
                let value = r.value.clone().unwrap_or_default();
                (r.offset, String::from_utf8_lossy(&value).into_owned())
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn acks_1_answers_only_once_the_append_is_durable_and_acks_0_not_at_all() {
        let ctx = ctx();
        ctx.log.ensure_topic("t").expect("topic");
        ctx.log.hold_answers([Duration::from_secs(5)]);
        let started = tokio::time::Instant::now();
        let request = request(
            ApiKey::Produce,
            9,
            &produce("t", 1, batch(&[("a", 1), ("b", 2)], &[("h", "1")])),
        );
        let reply = dispatch(&ctx, &mut conn(), &request).await.expect("reply");
        assert!(matches!(reply, Reply::Later(_)), "{reply:?}");
        let response: ProduceResponse = decode_as(body(reply).await.expect("answered"), 9);
        assert!(
            started.elapsed() >= Duration::from_secs(5),
            "answered before the commit"
        );
        let partition = &response.responses[0].partition_responses[0];
        assert_eq!((partition.error_code, partition.base_offset), (0, 0));
        let stored = ctx.log.read("t", 0, 0, 1 << 20).expect("read");
        assert_eq!(stored.len(), 2);
        assert_eq!(stored[1].record.header("h"), Some(&b"1"[..]));

        let request = request_acks0(&ctx);
        let reply = dispatch(&ctx, &mut conn(), &request).await.expect("reply");
        assert!(matches!(reply, Reply::Nothing), "{reply:?}");
    }

    /// A consumer gets what the producer sent, batch for batch, as from Kafka: records produced
    /// compressed come back in one batch of that codec (franz-go's `MaxDecompressBatchBytes`
    /// and decompression pools are about that batch), uncompressed ones uncompressed. Before,
    /// every answer was one uncompressed batch.
    #[tokio::test]
    async fn fetch_answers_compressed_records_in_their_producers_batch_and_codec() {
        use crate::records::tests::produced;
        let ctx = ctx();
        ctx.log.ensure_topic("t").expect("topic");
        let big = vec![0u8; 100_000];
        let sent = [
            produced(
                Compression::Gzip,
                &[
                    (1, None, &big, &[]),
                    (2, None, &big, &[]),
                    (3, None, &big, &[]),
                ],
            ),
            produced(Compression::None, &[(4, None, b"plain", &[])]),
            produced(
                Compression::Zstd,
                &[(5, None, b"z1", &[]), (6, None, b"z2", &[])],
            ),
            produced(Compression::Lz4, &[(7, None, b"l", &[])]),
        ];
        for batch in sent {
            let asked = request(ApiKey::Produce, 9, &produce("t", 1, batch));
            let reply = dispatch(&ctx, &mut conn(), &asked).await.expect("reply");
            let response: ProduceResponse = decode_as(body(reply).await.expect("answered"), 9);
            assert_eq!(response.responses[0].partition_responses[0].error_code, 0);
        }
        let response = fetched(&ctx, &fetch("t", 0, 0, 1)).await;
        let bytes = response.responses[0].partitions[0]
            .records
            .as_ref()
            .map_or(0, |r| r.len());
        assert!(bytes < 10_000, "the zeros travel gzipped: {bytes}");
        let sets = record_sets(&response);
        let got: Vec<(String, Vec<i64>)> = sets
            .iter()
            .map(|set| {
                let offsets = set.records.iter().map(|r| r.offset).collect();
                (format!("{:?}", set.compression), offsets)
            })
            .collect();
        let want = [
            ("Gzip", vec![0, 1, 2]),
            ("None", vec![3]),
            ("Zstd", vec![4, 5]),
            ("Lz4", vec![6]),
        ];
        let want: Vec<(String, Vec<i64>)> = want
            .iter()
            .map(|(c, o)| ((*c).to_owned(), o.clone()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(sets[0].records[2].value.as_deref(), Some(&big[..]));

        // A budget ending inside the first compressed batch still answers all of it (Kafka
        // never splits a batch; franz-go's ErrDecompressTooLarge names the batch's end).
        let mut small = fetch("t", 0, 0, 1);
        small.topics[0].partitions[0].partition_max_bytes = 150_000;
        let sets = record_sets(&fetched(&ctx, &small).await);
        let offsets: Vec<i64> = sets[0].records.iter().map(|r| r.offset).collect();
        assert_eq!((sets.len(), offsets), (1, vec![0, 1, 2]));

        // From the middle of a compressed batch: the rest of it, still compressed.
        let sets = record_sets(&fetched(&ctx, &fetch("t", 5, 0, 1)).await);
        assert_eq!(sets[0].compression, Compression::Zstd);
        assert_eq!(sets[0].records[0].offset, 5);
    }

    fn request_acks0(_ctx: &crate::api::Ctx<tern_log::MemoryLog>) -> crate::header::Request {
        request(
            ApiKey::Produce,
            9,
            &produce("t", 0, batch(&[("c", 3)], &[])),
        )
    }

    #[tokio::test]
    async fn produce_refuses_internal_topics_bad_mqtt_topics_and_corrupt_batches() {
        let ctx = ctx();
        let cases = [
            (produce("__mqtt_state", -1, batch(&[("a", 1)], &[])), 17),
            (
                produce("t", -1, batch(&[("a", 1)], &[("mqtt.topic", "a/+/c")])),
                87,
            ),
            (produce("t", -1, flipped(batch(&[("a", 1)], &[]))), 2),
            (
                produce("t", -1, batch(&[("a", 1)], &[("mqtt.topic", "a/b/c")])),
                0,
            ),
        ];
        for (body_in, code) in cases {
            let request = request(ApiKey::Produce, 9, &body_in);
            let reply = dispatch(&ctx, &mut conn(), &request).await.expect("reply");
            let response: ProduceResponse = decode_as(body(reply).await.expect("answered"), 9);
            let partition = &response.responses[0].partition_responses[0];
            assert_eq!(partition.error_code, code, "{partition:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_poll_is_woken_by_a_durable_append_and_times_out_otherwise() {
        let ctx = ctx();
        ctx.log.ensure_topic("t").expect("topic");
        // Nothing there: waits the whole max_wait, then answers empty.
        let started = tokio::time::Instant::now();
        let request = request(ApiKey::Fetch, 12, &fetch("t", 0, 2_000, 1));
        let reply = dispatch(&ctx, &mut conn(), &request).await.expect("reply");
        let response: FetchResponse = decode_as(body(reply).await.expect("answered"), 12);
        assert!(started.elapsed() >= Duration::from_secs(2));
        assert!(values(&response).is_empty());

        // An append during the wait answers at once with it.
        let started = tokio::time::Instant::now();
        let reply = dispatch(&ctx, &mut conn(), &request).await.expect("reply");
        let log = ctx.log.clone();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let record = Record {
                timestamp_ms: 5,
                key: None,
                value: b"woke".to_vec().into(),
                headers: tern_log::Headers::from(vec![(
                    "mqtt.topic".into(),
                    b"a/b".to_vec().into(),
                )]),
            };
            log.append("t", 0, vec![record]).await.expect("append");
        });
        let response: FetchResponse = decode_as(body(reply).await.expect("answered"), 12);
        writer.await.expect("writer");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(values(&response), vec![(0, "woke".to_owned())]);
        assert_eq!(response.responses[0].partitions[0].high_watermark, 1);

        // Past the end: OFFSET_OUT_OF_RANGE at once; min_bytes 0: an empty answer at once.
        let request = request_fetch(5, 10_000, 1);
        let reply = dispatch(&ctx, &mut conn(), &request).await.expect("reply");
        assert!(matches!(reply, Reply::Now(_)));
        let response: FetchResponse = decode_as(body(reply).await.expect("answered"), 12);
        assert_eq!(response.responses[0].partitions[0].error_code, 1);
        let reply = dispatch(&ctx, &mut conn(), &request_fetch(1, 10_000, 0))
            .await
            .expect("reply");
        assert!(matches!(reply, Reply::Now(_)));
    }

    fn request_fetch(offset: i64, wait: i32, min: i32) -> crate::header::Request {
        request(ApiKey::Fetch, 12, &fetch("t", offset, wait, min))
    }

    #[tokio::test]
    async fn list_offsets_answers_earliest_latest_max_and_by_time() {
        let ctx = ctx();
        ctx.log.ensure_topic("t").expect("topic");
        let records = (0..5)
            .map(|i| Record {
                timestamp_ms: 1_000 * (i + 1),
                key: None,
                value: vec![].into(),
                headers: tern_log::Headers::new(),
            })
            .collect();
        ctx.log.append("t", 0, records).await.expect("append");
        for (query, expected) in [
            (-2, (0, -1)),
            (-1, (5, -1)),
            (-3, (4, 5_000)),
            (2_500, (2, 3_000)),
            (3_000, (2, 3_000)),
            (9_000, (-1, -1)),
        ] {
            let body_in = ListOffsetsRequest::default().with_topics(vec![
                ListOffsetsTopic::default()
                    .with_name(name("t"))
                    .with_partitions(vec![
                        ListOffsetsPartition::default()
                            .with_partition_index(0)
                            .with_timestamp(query),
                    ]),
            ]);
            let request = request(ApiKey::ListOffsets, 7, &body_in);
            let reply = dispatch(&ctx, &mut conn(), &request).await.expect("reply");
            let response: ListOffsetsResponse = decode_as(body(reply).await.expect("answered"), 7);
            let p = &response.topics[0].partitions[0];
            assert_eq!(
                (p.error_code, p.offset, p.timestamp),
                (0, expected.0, expected.1),
                "{query}"
            );
        }
    }
}

mod fuzz {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::protocol::{Encodable, StrBytes};
    use proptest::prelude::*;

    use super::{body, conn, ctx, default_request};
    use crate::api::{SERVED, dispatch};
    use crate::header;

    /// A valid header of `SERVED[which]` at a served version, then `body`.
    fn frame(which: prop::sample::Index, version: prop::sample::Index, body: &[u8]) -> Bytes {
        let (api, versions) = SERVED[which.index(SERVED.len())];
        let span = usize::try_from(versions.max - versions.min).unwrap_or(0) + 1;
        let version = versions.min + i16::try_from(version.index(span)).unwrap_or(0);
        let header = RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(1)
            .with_client_id(Some(StrBytes::from_static_str("fuzz")));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, api.request_header_version(version))
            .expect("header");
        buf.extend_from_slice(body);
        buf.freeze()
    }

    /// Decodes and answers `frame` as a connection does, waiting out any long poll on the
    /// paused clock. Any outcome but a panic or an abort is fine.
    fn answer(frame: Bytes) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let ctx = ctx();
            let Ok(request) = header::decode(frame) else {
                return;
            };
            if let Ok(reply) = dispatch(&ctx, &mut conn(), &request).await {
                let _ = body(reply).await;
            }
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any body under any served API and version: an answer or a closed connection.
        #[test]
        fn any_body_of_a_served_request_is_answered_or_refused(
            which in any::<prop::sample::Index>(),
            version in any::<prop::sample::Index>(),
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            answer(frame(which, version, &body));
        }

        /// A valid request with bytes changed: the same.
        #[test]
        fn a_mutated_valid_request_is_answered_or_refused(
            which in any::<prop::sample::Index>(),
            version in any::<prop::sample::Index>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let valid = frame(which, version, &[]);
            let request = header::decode(valid).expect("header");
            let mut bytes = default_request(request.api, request.version()).to_vec();
            for (at, byte) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= byte;
            }
            answer(Bytes::from(bytes));
        }

        /// Arbitrary frames, header included.
        #[test]
        fn any_frame_is_answered_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            answer(Bytes::from(bytes));
        }
    }

    /// The inputs that abort an unpatched kafka-protocol 0.18: a Metadata v0 topic count of
    /// 54,265,856 in 4 bytes (upstream PR #152's reproduction), and a compact array of u32::MAX.
    #[test]
    fn huge_array_counts_are_refused_before_anything_is_sized() {
        use kafka_protocol::messages::ApiKey;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        for (api, version, body) in [
            (ApiKey::Metadata, 0, &[0x03, 0x3c, 0x0c, 0x00][..]),
            (ApiKey::Metadata, 12, &[0xff, 0xff, 0xff, 0xff, 0x0f][..]),
            (ApiKey::Fetch, 12, &[0, 0, 0, 0][..]),
        ] {
            let header = RequestHeader::default()
                .with_request_api_key(api as i16)
                .with_request_api_version(version)
                .with_correlation_id(1);
            let mut buf = BytesMut::new();
            header
                .encode(&mut buf, api.request_header_version(version))
                .expect("header");
            buf.extend_from_slice(body);
            let request = header::decode(buf.freeze()).expect("header");
            let reply = runtime.block_on(dispatch(&ctx(), &mut conn(), &request));
            assert!(reply.is_err(), "{api:?} v{version}: {reply:?}");
        }
    }
}
mod groups;
