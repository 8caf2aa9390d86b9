//! Unit tests of the transactional requests (`txn.rs`, FindCoordinator's key type 1): golden
//! bytes derived from Kafka's protocol guide (header v1 = api key, version, correlation id,
//! int16 client id; strings with an int16 length, arrays with an int32 count), the retriable and
//! fencing codes, and property tests feeding arbitrary bytes to the new response decoders.

use bytes::Bytes;
use kafka_protocol::messages::*;
use proptest::prelude::*;

use super::conn::{decode_response, encode_request};
use super::group::{self, Commit, KeyType};
use super::txn::{self, TxnId};
use super::*;

/// Size, api key, version, correlation id 7, client id "tern" (header v1).
fn header_v1(size: u8, key: u8, version: u8) -> Vec<u8> {
    vec![
        0, 0, 0, size, 0, key, 0, version, 0, 0, 0, 7, 0, 4, b't', b'e', b'r', b'n',
    ]
}

const TXN: TxnId<'static> = TxnId {
    transactional_id: "x",
    producer_id: 5,
    epoch: 2,
};

/// Transactional id "x", producer id 5, epoch 2.
fn txn_fields() -> Vec<u8> {
    vec![0, 1, b'x', 0, 0, 0, 0, 0, 0, 0, 5, 0, 2]
}

#[test]
fn find_coordinator_v2_of_a_transactional_id_has_key_type_1() -> Result<(), ClientError> {
    let frame = encode_request(
        &group::coordinator_request("x", KeyType::Transaction, 2),
        2,
        7,
    )?;
    let mut expected = header_v1(18, 10, 2);
    expected.extend_from_slice(&[0, 1, b'x', 1]);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn end_txn_v0_commits_or_aborts() -> Result<(), ClientError> {
    for (commit, flag) in [(true, 1), (false, 0)] {
        let frame = encode_request(&txn::end_txn_request(&TXN, commit), 0, 7)?;
        let mut expected = header_v1(14 + 14, 26, 0);
        expected.extend_from_slice(&txn_fields());
        expected.push(flag);
        assert_eq!(frame.as_ref(), expected);
    }
    Ok(())
}

#[test]
fn add_offsets_to_txn_v0_names_the_group() -> Result<(), ClientError> {
    let frame = encode_request(&txn::add_offsets_request(&TXN, "g"), 0, 7)?;
    let mut expected = header_v1(14 + 16, 25, 0);
    expected.extend_from_slice(&txn_fields());
    expected.extend_from_slice(&[0, 1, b'g']);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn add_partitions_to_txn_v0_lists_the_partitions_of_one_topic() -> Result<(), ClientError> {
    let frame = encode_request(&txn::add_partitions_request(&TXN, "t", &[1, 4]), 0, 7)?;
    let mut expected = header_v1(14 + 32, 24, 0);
    expected.extend_from_slice(&txn_fields());
    expected.extend_from_slice(&[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2]);
    expected.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 4]);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn txn_offset_commit_v0_commits_one_partition_in_the_transaction() -> Result<(), ClientError> {
    let commit = Commit {
        topic: "t",
        partition: 3,
        offset: 9,
        metadata: "m",
    };
    let frame = encode_request(&txn::txn_offset_commit_request(&TXN, "g", &commit), 0, 7)?;
    // transactional id, group, producer id, epoch, topics [1]: "t", partitions [1]: index 3,
    // offset 9, metadata "m" (v0 has no leader epoch).
    let mut expected = header_v1(14 + 42, 28, 0);
    expected.extend_from_slice(&[0, 1, b'x', 0, 1, b'g']);
    expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 5, 0, 2]);
    expected.extend_from_slice(&[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 3]);
    expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 9, 0, 1, b'm']);
    assert_eq!(frame.as_ref(), expected);
    Ok(())
}

#[test]
fn coordinator_troubles_are_retried_and_a_fenced_epoch_is_not() {
    for code in [14, 15, 16, 51, 88] {
        assert!(txn::is_retriable(code), "{code}");
        assert!(!txn::is_fenced(code), "{code}");
    }
    for code in [47, 52, 90] {
        assert!(txn::is_fenced(code), "{code}");
        assert!(!txn::is_retriable(code), "{code}");
    }
    assert_eq!(error_name(90), "PRODUCER_FENCED");
    assert_eq!(error_name(51), "CONCURRENT_TRANSACTIONS");
}

/// Decodes `body` as the response of `R` at every version the client speaks; no panic.
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
    fn transactional_response_decoders_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        decode_all_versions::<AddPartitionsToTxnRequest>(&body);
        decode_all_versions::<AddOffsetsToTxnRequest>(&body);
        decode_all_versions::<TxnOffsetCommitRequest>(&body);
        decode_all_versions::<EndTxnRequest>(&body);
        decode_all_versions::<InitProducerIdRequest>(&body);
        decode_all_versions::<FindCoordinatorRequest>(&body);
    }
}
