//! Unit tests of the client module: requests pinned by golden bytes derived from Kafka's
//! protocol guide (header v1 = api key, version, correlation id, int16 client id; header v2 adds
//! tagged fields; flexible versions use unsigned-varint lengths plus one), version negotiation,
//! and property tests feeding arbitrary bytes to every response decoder the client uses.

use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Message;
use proptest::prelude::*;

use super::conn::{decode_response, encode_request, negotiate};
use super::fetch::{self, decode_records};
use super::group::{self, Commit};
use super::metadata;
use super::*;

/// Size, api key, version, correlation id 7, client id "tern" (header v1).
fn header_v1(size: u8, key: u8, version: u8) -> Vec<u8> {
    vec![
        0, 0, 0, size, 0, key, 0, version, 0, 0, 0, 7, 0, 4, b't', b'e', b'r', b'n',
    ]
}

#[test]
fn api_versions_v0_is_a_bare_header() -> Result<(), ClientError> {
    let frame = encode_request(&ApiVersionsRequest::default(), 0, 7)?;
    assert_eq!(frame.as_ref(), header_v1(14, 18, 0));
    Ok(())
}

#[test]
fn find_coordinator_v2_and_v4_follow_the_protocol_guide() -> Result<(), ClientError> {
    // v2: key "g" (int16 length), key_type 0.
    let frame = encode_request(&group::find_coordinator_request("g", 2), 2, 7)?;
    let mut expected = header_v1(18, 10, 2);
    expected.extend_from_slice(&[0, 1, b'g', 0]);
    assert_eq!(frame.as_ref(), expected);
    // v4 (flexible, header v2): header tagged fields 0, key_type 0, coordinator_keys as a
    // compact array (1 + 1) of compact strings (1 + 1, "g"), body tagged fields 0.
    let frame = encode_request(&group::find_coordinator_request("g", 4), 4, 7)?;
    let mut expected = header_v1(20, 10, 4);
    expected.extend_from_slice(&[0, 0, 2, 2, b'g', 0]);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn list_offsets_v1_asks_for_the_latest_offset() -> Result<(), ClientError> {
    let request = fetch::list_offsets_request("t", 3, fetch::LATEST);
    let frame = encode_request(&request, 1, 7)?;
    // replica_id -1, topics [1]: name "t", partitions [1]: index 3, timestamp -1.
    let mut expected = header_v1(14 + 4 + 4 + 3 + 4 + 4 + 8, 2, 1);
    expected.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0, 1, b't']);
    expected.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 3]);
    expected.extend_from_slice(&[0xff; 8]);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn offset_commit_v2_is_a_standalone_commit() -> Result<(), ClientError> {
    let commit = Commit {
        topic: "t",
        partition: 1,
        offset: 5,
        metadata: "m",
    };
    let frame = encode_request(&group::offset_commit_request("g", &commit), 2, 7)?;
    // group "g", generation -1, member "", retention -1, topics [1]: "t", partitions [1]:
    // index 1, offset 5, metadata "m".
    let body: Vec<u8> = [
        &[0, 1, b'g'][..],
        &[0xff; 4],
        &[0, 0],
        &[0xff; 8],
        &[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 1],
        &[0, 0, 0, 0, 0, 0, 0, 5, 0, 1, b'm'],
    ]
    .concat();
    let mut expected = header_v1(14 + body.len() as u8, 8, 2);
    expected.extend_from_slice(&body);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn metadata_v8_never_creates_topics() -> Result<(), ClientError> {
    let request = MetadataRequest::default()
        .with_topics(Some(vec![
            metadata_request::MetadataRequestTopic::default()
                .with_name(Some(metadata::topic_name("t"))),
        ]))
        .with_allow_auto_topic_creation(false);
    let frame = encode_request(&request, 8, 7)?;
    // topics [1]: "t"; allow_auto_topic_creation, include_cluster/topic_authorized_operations.
    let mut expected = header_v1(14 + 4 + 3 + 3, 3, 8);
    expected.extend_from_slice(&[0, 0, 0, 1, 0, 1, b't', 0, 0, 0]);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn create_topics_v2_carries_the_topic_configs() -> Result<(), ClientError> {
    let request = metadata::create_topic_request("t", 2, 3, &[("retention.ms", "1")]);
    let frame = encode_request(&request, 2, 7)?;
    // topics [1]: "t", 2 partitions, replication 3, assignments [0], configs [1]:
    // "retention.ms" = "1"; timeout 10000 ms, validate_only false.
    let body: Vec<u8> = [
        &[
            0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1,
        ][..],
        &[0, 12],
        b"retention.ms",
        &[0, 1, b'1'],
        &[0, 0, 0x27, 0x10, 0],
    ]
    .concat();
    let mut expected = header_v1(14 + body.len() as u8, 19, 2);
    expected.extend_from_slice(&body);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

/// What tern sends for an upstream topic with the default settings, at v5 (the first flexible
/// version; a 4.x broker negotiates v7, which only adds response fields): the topic config
/// `message.timestamp.type = LogAppendTime`, so Kafka's time retention counts from arrival.
#[test]
fn create_topics_v5_carries_tern_s_log_append_time_config() -> Result<(), ClientError> {
    let configs = crate::config::UpstreamConfig::default().create_topic_configs();
    let configs: Vec<(&str, &str)> = configs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let request = metadata::create_topic_request("t", 2, 3, &configs);
    let frame = encode_request(&request, 5, 7)?;
    // Header v2 (tagged fields 0); topics compact [1]: "t", 2 partitions, replication 3,
    // assignments compact [0], configs compact [1]: "message.timestamp.type" = "LogAppendTime"
    // (compact strings: length + 1), config and topic tagged fields; timeout 10000 ms,
    // validate_only false, body tagged fields.
    let body: Vec<u8> = [
        &[0, 2, 2, b't', 0, 0, 0, 2, 0, 3, 1, 2][..],
        &[23],
        b"message.timestamp.type",
        &[14],
        b"LogAppendTime",
        &[0, 0],
        &[0, 0, 0x27, 0x10, 0, 0],
    ]
    .concat();
    let mut expected = header_v1(14 + body.len() as u8, 19, 5);
    expected.extend_from_slice(&body);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn describe_configs_v1_asks_for_two_configs_of_one_topic() -> Result<(), ClientError> {
    let request =
        metadata::describe_topic_configs_request("t", &["message.timestamp.type", "retention.ms"]);
    let frame = encode_request(&request, 1, 7)?;
    // resources [1]: type 2 (topic), name "t", configuration_keys [2]; include_synonyms false.
    let body: Vec<u8> = [
        &[0, 0, 0, 1, 2, 0, 1, b't', 0, 0, 0, 2][..],
        &[0, 22],
        b"message.timestamp.type",
        &[0, 12],
        b"retention.ms",
        &[0],
    ]
    .concat();
    let mut expected = header_v1(14 + body.len() as u8, 32, 1);
    expected.extend_from_slice(&body);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn init_producer_id_v0_asks_for_an_idempotent_producer() -> Result<(), ClientError> {
    let request = produce::init_producer_id_request(None, produce::IDEMPOTENT_TXN_TIMEOUT);
    let frame = encode_request(&request, 0, 7)?;
    // transactional_id null (length -1), transaction timeout 60000 ms.
    let mut expected = header_v1(14 + 6, 22, 0);
    expected.extend_from_slice(&[0xff, 0xff, 0, 0, 0xea, 0x60]);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn init_producer_id_carries_the_configured_transaction_timeout() -> Result<(), ClientError> {
    let request =
        produce::init_producer_id_request(Some("t.g.m.0"), std::time::Duration::from_secs(3));
    assert_eq!(request.transaction_timeout_ms, 3_000);
    let frame = encode_request(&request, 0, 7)?;
    // transactional_id "t.g.m.0" (int16 length 7), transaction timeout 3000 ms (0x0bb8).
    let mut expected = header_v1(14 + 13, 22, 0);
    expected.extend_from_slice(&[0, 7]);
    expected.extend_from_slice(b"t.g.m.0");
    expected.extend_from_slice(&[0, 0, 0x0b, 0xb8]);
    assert_eq!(frame.as_ref(), expected);
    let capped = produce::init_producer_id_request(None, std::time::Duration::from_secs(1 << 40));
    assert_eq!(capped.transaction_timeout_ms, i32::MAX);
    Ok(())
}

#[test]
fn produce_v3_sends_one_batch_with_acks_all() -> Result<(), ClientError> {
    let options = produce::ProduceOptions {
        timeout: std::time::Duration::from_secs(30),
        transactional_id: None,
    };
    let batch = Bytes::from_static(b"BATCH");
    let frame = encode_request(&produce::produce_request("t", 0, batch, &options), 3, 7)?;
    // transactional_id null, acks -1, timeout 30000 ms, topic_data [1]: "t", partitions [1]:
    // index 0, records (int32 length 5) "BATCH".
    let body: Vec<u8> = [
        &[0xff, 0xff, 0xff, 0xff, 0, 0, 0x75, 0x30][..],
        &[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5],
        b"BATCH",
    ]
    .concat();
    let mut expected = header_v1(14 + body.len() as u8, 0, 3);
    expected.extend_from_slice(&body);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn fetch_v4_asks_for_one_partition_from_an_offset() -> Result<(), ClientError> {
    let frame = encode_request(&fetch::fetch_request("t", 0, 41), 4, 7)?;
    // replica -1, max_wait 1000 ms, min_bytes 1, max_bytes 8 MiB, read uncommitted,
    // topics [1]: "t", partitions [1]: 0, fetch offset 41, partition max bytes 8 MiB.
    let body: Vec<u8> = [
        &[
            0xff, 0xff, 0xff, 0xff, 0, 0, 0x03, 0xe8, 0, 0, 0, 1, 0, 0x80, 0, 0, 0,
        ][..],
        &[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0],
        &[0, 0, 0, 0, 0, 0, 0, 41, 0, 0x80, 0, 0],
    ]
    .concat();
    let mut expected = header_v1(14 + body.len() as u8, 1, 4);
    expected.extend_from_slice(&body);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn an_api_versions_answer_decodes_and_a_foreign_correlation_id_is_refused() {
    // correlation 7, error 0, api_keys [1]: Produce 3..=11.
    let frame = Bytes::from_static(&[0, 0, 0, 7, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 11]);
    let answer = decode_response::<ApiVersionsRequest>(frame.clone(), 0, 7);
    let ranges: Vec<(i16, i16, i16)> = answer
        .map(|a| {
            a.api_keys
                .iter()
                .map(|v| (v.api_key, v.min_version, v.max_version))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(ranges, [(0, 3, 11)]);
    let foreign = decode_response::<ApiVersionsRequest>(frame, 0, 8);
    assert!(
        matches!(foreign, Err(ClientError::Correlation { got: 7, .. })),
        "{foreign:?}"
    );
}

#[test]
fn the_highest_common_version_is_chosen() {
    assert_eq!(negotiate((3, 12), Some((3, 11))), Some(11));
    assert_eq!(negotiate((3, 12), Some((0, 13))), Some(12));
    assert_eq!(negotiate((1, 8), Some((0, 0))), None);
    assert_eq!(negotiate((3, 12), Some((13, 13))), None);
    assert_eq!(negotiate((3, 12), None), None);
    for (api, min, max) in MAX_VERSIONS {
        let encodable = match api {
            ApiKey::Produce => ProduceRequest::VERSIONS,
            ApiKey::Fetch => FetchRequest::VERSIONS,
            ApiKey::ListOffsets => ListOffsetsRequest::VERSIONS,
            ApiKey::Metadata => MetadataRequest::VERSIONS,
            ApiKey::OffsetCommit => OffsetCommitRequest::VERSIONS,
            ApiKey::OffsetFetch => OffsetFetchRequest::VERSIONS,
            ApiKey::FindCoordinator => FindCoordinatorRequest::VERSIONS,
            ApiKey::SaslHandshake => SaslHandshakeRequest::VERSIONS,
            ApiKey::ApiVersions => ApiVersionsRequest::VERSIONS,
            ApiKey::CreateTopics => CreateTopicsRequest::VERSIONS,
            ApiKey::DescribeConfigs => DescribeConfigsRequest::VERSIONS,
            ApiKey::InitProducerId => InitProducerIdRequest::VERSIONS,
            ApiKey::SaslAuthenticate => SaslAuthenticateRequest::VERSIONS,
            ApiKey::AddPartitionsToTxn => AddPartitionsToTxnRequest::VERSIONS,
            ApiKey::AddOffsetsToTxn => AddOffsetsToTxnRequest::VERSIONS,
            ApiKey::TxnOffsetCommit => TxnOffsetCommitRequest::VERSIONS,
            ApiKey::EndTxn => EndTxnRequest::VERSIONS,
            _ => kafka_protocol::protocol::VersionRange { min: 0, max: -1 },
        };
        assert!(
            encodable.min <= *min && *max <= encodable.max,
            "{api:?} {min}-{max} outside {encodable}"
        );
    }
}

/// Decodes `body` after a matching correlation id as the response of `R` at every version the
/// client speaks; it must not panic.
fn decode_all_versions<R: Api>(body: &[u8]) {
    let (min, max) = client_versions(R::KEY).unwrap_or((0, 0));
    for version in min..=max {
        for header in [&[0u8, 0, 0, 1][..], &[0, 0, 0, 1, 0][..]] {
            let frame = Bytes::from([header, body].concat());
            let _ = decode_response::<R>(frame, version, 1);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn response_decoders_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        decode_all_versions::<ProduceRequest>(&body);
        decode_all_versions::<FetchRequest>(&body);
        decode_all_versions::<ListOffsetsRequest>(&body);
        decode_all_versions::<MetadataRequest>(&body);
        decode_all_versions::<OffsetCommitRequest>(&body);
        decode_all_versions::<OffsetFetchRequest>(&body);
        decode_all_versions::<FindCoordinatorRequest>(&body);
        decode_all_versions::<SaslHandshakeRequest>(&body);
        decode_all_versions::<ApiVersionsRequest>(&body);
        decode_all_versions::<CreateTopicsRequest>(&body);
        decode_all_versions::<DescribeConfigsRequest>(&body);
        decode_all_versions::<InitProducerIdRequest>(&body);
        decode_all_versions::<SaslAuthenticateRequest>(&body);
        let _ = decode_response::<FetchRequest>(Bytes::from(body.clone()), 12, 1);
    }

    #[test]
    fn record_batches_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_records(Bytes::from(body));
    }

    #[test]
    fn damaged_record_batches_never_panic(cut in 0usize..200, flip in 0usize..200, bit in 0u8..8) {
        let record = produce::OutRecord {
            timestamp_ms: 1,
            key: Some(b"k".to_vec()),
            value: b"value".to_vec(),
            headers: [("tern-offset".to_owned(), b"7".to_vec())].into(),
        };
        let stamp = produce::Stamp::PLAIN;
        let batch = produce::encode_batch(stamp, 0, vec![record.clone(), record], crate::config::Codec::None);
        let mut bytes = batch.map(|b| b.to_vec()).unwrap_or_default();
        if let Some(byte) = bytes.get_mut(flip) {
            *byte ^= 1 << bit;
        }
        bytes.truncate(cut.max(1));
        let _ = decode_records(Bytes::from(bytes));
    }
}

#[test]
fn a_whole_batch_then_a_partial_one_yields_the_whole_batch() -> Result<(), ClientError> {
    let record = produce::OutRecord {
        timestamp_ms: 1,
        key: None,
        value: b"v".to_vec(),
        headers: [("tern-offset".to_owned(), b"41".to_vec())].into(),
    };
    let stamp = produce::Stamp::PLAIN;
    let codec = crate::config::Codec::None;
    let batch = produce::encode_batch(stamp, 0, vec![record.clone()], codec)?;
    let mut bytes = batch.to_vec();
    bytes.extend_from_slice(batch.get(..batch.len() / 2).unwrap_or_default());
    let records = decode_records(Bytes::from(bytes));
    assert_eq!(records.len(), 1);
    let header = records
        .first()
        .and_then(|r| r.headers.get(&b"tern-offset"[..]).cloned().flatten());
    assert_eq!(header.as_deref(), Some(&b"41"[..]));
    Ok(())
}

/// A record at `offset` of producer `producer`, transactional or not, a control record or not.
fn txn_record(
    offset: i64,
    producer: i64,
    transactional: bool,
    control: bool,
) -> kafka_protocol::records::Record {
    kafka_protocol::records::Record {
        transactional,
        control,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: producer,
        producer_epoch: 0,
        timestamp_type: kafka_protocol::records::TimestampType::Creation,
        offset,
        sequence: 0,
        timestamp: 0,
        key: None,
        value: Some(Bytes::from(offset.to_string())),
        headers: Default::default(),
    }
}

/// A `read_committed` reader keeps plain records and committed transactions and leaves out an
/// aborted transaction's records (from its first offset to its producer's abort marker) and
/// every control record, as Kafka's consumer does.
#[test]
fn a_committed_read_leaves_out_aborted_transactions_and_control_records() {
    let records = vec![
        txn_record(0, -1, false, false),
        txn_record(1, 7, true, false), // producer 7's transaction, aborted
        txn_record(2, 8, true, false), // producer 8's, committed
        txn_record(3, 7, true, false),
        txn_record(4, 7, true, true),  // abort marker of 7
        txn_record(5, 8, true, true),  // commit marker of 8
        txn_record(6, 7, true, false), // 7's next transaction, committed
        txn_record(7, 7, true, true),
        txn_record(8, -1, false, false),
    ];
    let kept: Vec<i64> = fetch::committed(records, vec![(7, 1)])
        .iter()
        .map(|r| r.offset)
        .collect();
    assert_eq!(kept, [0, 2, 6, 8]);
}
