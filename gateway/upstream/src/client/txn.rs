//! The transactional producer's requests to the transaction coordinator: AddPartitionsToTxn
//! (the partitions a transaction writes), AddOffsetsToTxn (the consumer group whose offsets it
//! commits) and EndTxn (commit or abort), plus TxnOffsetCommit, which goes to the group's
//! coordinator. Each call sends one request and turns the answer into `Ok` or a
//! [`ClientError::Kafka`]; [`is_retriable`] and [`is_fenced`] say what a refusal means. It never
//! retries, never keeps a coordinator and never decides what a failure means for forwarding
//! (the crate's `txn.rs` does).

use kafka_protocol::messages::add_offsets_to_txn_request::AddOffsetsToTxnRequest;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic,
};
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{GroupId, ProducerId, TransactionalId};
use kafka_protocol::protocol::StrBytes;

use super::group::Commit;
use super::metadata::topic_name;
use super::{ClientError, Connection};

/// Kafka's COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
/// CONCURRENT_TRANSACTIONS and UNSTABLE_OFFSET_COMMIT: ask again a little later (after finding
/// the coordinator again for the first three).
pub const RETRIABLE: [i16; 5] = [14, 15, 16, 51, 88];
/// Kafka's INVALID_PRODUCER_EPOCH, PRODUCER_FENCED and TRANSACTION_COORDINATOR_FENCED: this
/// incarnation of the transactional producer is over; only a new InitProducerId goes on.
pub const FENCED: [i16; 3] = [47, 90, 52];
/// Kafka's OPERATION_NOT_ATTEMPTED: another partition of the same request failed.
const OPERATION_NOT_ATTEMPTED: i16 = 55;

/// Whether a transactional request refused with `code` may be sent again later.
pub fn is_retriable(code: i16) -> bool {
    RETRIABLE.contains(&code)
}

/// Whether `code` fences this producer incarnation (a new InitProducerId is needed).
pub fn is_fenced(code: i16) -> bool {
    FENCED.contains(&code)
}

/// Whether `code` says the coordinator moved or is not ready: find it again.
pub fn coordinator_moved(code: i16) -> bool {
    matches!(code, 14..=16)
}

/// Who the transactional producer is: its transactional id and this incarnation's id and epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnId<'a> {
    pub transactional_id: &'a str,
    pub producer_id: i64,
    pub epoch: i16,
}

impl TxnId<'_> {
    fn id(&self) -> TransactionalId {
        TransactionalId(StrBytes::from_string(self.transactional_id.to_owned()))
    }
}

fn check(api: &'static str, code: i16, context: String) -> Result<(), ClientError> {
    match code {
        0 => Ok(()),
        code => Err(ClientError::kafka(api, code, context)),
    }
}

/// AddPartitionsToTxn (v0–3, a client's form) of `partitions` of `topic`.
pub fn add_partitions_request(
    txn: &TxnId<'_>,
    topic: &str,
    partitions: &[i32],
) -> AddPartitionsToTxnRequest {
    AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(txn.id())
        .with_v3_and_below_producer_id(ProducerId(txn.producer_id))
        .with_v3_and_below_producer_epoch(txn.epoch)
        .with_v3_and_below_topics(vec![
            AddPartitionsToTxnTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(partitions.to_vec()),
        ])
}

/// Adds `partitions` of `topic` to the open transaction, over its coordinator.
pub async fn add_partitions(
    coordinator: &mut Connection,
    txn: &TxnId<'_>,
    topic: &str,
    partitions: &[i32],
) -> Result<(), ClientError> {
    let api = "AddPartitionsToTxn";
    let answer = coordinator
        .call(|_| add_partitions_request(txn, topic, partitions))
        .await?;
    let codes: Vec<(i32, i16)> = answer
        .results_by_topic_v3_and_below
        .iter()
        .filter(|t| t.name.0.as_str() == topic)
        .flat_map(|t| t.results_by_partition.iter())
        .map(|p| (p.partition_index, p.partition_error_code))
        .collect();
    for partition in partitions {
        match codes.iter().find(|(index, _)| index == partition) {
            None => {
                return Err(ClientError::Missing {
                    api,
                    what: format!("answer for {topic}/{partition}"),
                });
            }
            Some(&(_, 0)) => {}
            Some(_) => {
                // The cause, not the OPERATION_NOT_ATTEMPTED of its neighbours.
                let (index, code) = codes
                    .iter()
                    .copied()
                    .find(|&(_, c)| c != 0 && c != OPERATION_NOT_ATTEMPTED)
                    .unwrap_or((*partition, OPERATION_NOT_ATTEMPTED));
                return check(api, code, format!(" for {topic}/{index}"));
            }
        }
    }
    Ok(())
}

/// AddOffsetsToTxn of `group`.
pub fn add_offsets_request(txn: &TxnId<'_>, group: &str) -> AddOffsetsToTxnRequest {
    AddOffsetsToTxnRequest::default()
        .with_transactional_id(txn.id())
        .with_producer_id(ProducerId(txn.producer_id))
        .with_producer_epoch(txn.epoch)
        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
}

/// Makes `group`'s offsets part of the open transaction, over the transaction coordinator.
pub async fn add_offsets(
    coordinator: &mut Connection,
    txn: &TxnId<'_>,
    group: &str,
) -> Result<(), ClientError> {
    let answer = coordinator
        .call(|_| add_offsets_request(txn, group))
        .await?;
    check(
        "AddOffsetsToTxn",
        answer.error_code,
        format!(" for {group}"),
    )
}

/// TxnOffsetCommit of `commit` for `group` (standalone: generation −1, no member).
pub fn txn_offset_commit_request(
    txn: &TxnId<'_>,
    group: &str,
    commit: &Commit<'_>,
) -> TxnOffsetCommitRequest {
    let partition = TxnOffsetCommitRequestPartition::default()
        .with_partition_index(commit.partition)
        .with_committed_offset(commit.offset)
        .with_committed_leader_epoch(-1)
        .with_committed_metadata(Some(StrBytes::from_string(commit.metadata.to_owned())));
    TxnOffsetCommitRequest::default()
        .with_transactional_id(txn.id())
        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
        .with_producer_id(ProducerId(txn.producer_id))
        .with_producer_epoch(txn.epoch)
        .with_generation_id(-1)
        .with_member_id(StrBytes::default())
        .with_topics(vec![
            TxnOffsetCommitRequestTopic::default()
                .with_name(topic_name(commit.topic))
                .with_partitions(vec![partition]),
        ])
}

/// Commits `commit` for `group` inside the open transaction, over the group's coordinator.
pub async fn txn_offset_commit(
    coordinator: &mut Connection,
    txn: &TxnId<'_>,
    group: &str,
    commit: &Commit<'_>,
) -> Result<(), ClientError> {
    let answer = coordinator
        .call(|_| txn_offset_commit_request(txn, group, commit))
        .await?;
    let context = format!(" for {}/{}", commit.topic, commit.partition);
    let code = answer
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == commit.topic)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == commit.partition)
        .map(|p| p.error_code);
    match code {
        Some(code) => check("TxnOffsetCommit", code, context),
        None => Err(ClientError::Missing {
            api: "TxnOffsetCommit",
            what: format!("answer{context}"),
        }),
    }
}

/// EndTxn: commit (`true`) or abort the open transaction.
pub fn end_txn_request(txn: &TxnId<'_>, commit: bool) -> EndTxnRequest {
    EndTxnRequest::default()
        .with_transactional_id(txn.id())
        .with_producer_id(ProducerId(txn.producer_id))
        .with_producer_epoch(txn.epoch)
        .with_committed(commit)
}

/// Ends the open transaction over its coordinator.
pub async fn end_txn(
    coordinator: &mut Connection,
    txn: &TxnId<'_>,
    commit: bool,
) -> Result<(), ClientError> {
    let answer = coordinator.call(|_| end_txn_request(txn, commit)).await?;
    check("EndTxn", answer.error_code, String::new())
}
