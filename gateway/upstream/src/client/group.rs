//! A consumer group's offsets, as shared mode keeps its progress: FindCoordinator (where the
//! group's coordinator is, or with key type 1 a transactional id's), OffsetCommit of one partition and OffsetFetch of it back. Commits
//! are standalone (generation −1, no member id), like a consumer that assigns its partitions
//! itself. It never joins a group, never keeps a coordinator (`group.rs` of the crate does) and
//! never produces or fetches records.

use kafka_protocol::messages::GroupId;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponse;
use kafka_protocol::protocol::StrBytes;

use super::metadata::topic_name;
use super::{ClientError, Connection, broker_addr};

/// Kafka's GROUP_ID_NOT_FOUND and UNKNOWN_TOPIC_OR_PARTITION: no offset to fetch.
const GROUP_ID_NOT_FOUND: i16 = 69;
const UNKNOWN_TOPIC: i16 = 3;

/// One partition's offset to commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub metadata: &'a str,
}

fn group_id(group: &str) -> GroupId {
    GroupId(StrBytes::from_string(group.to_owned()))
}

/// FindCoordinator's key types: a consumer group, a transactional id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum KeyType {
    Group = 0,
    Transaction = 1,
}

#[cfg(test)]
/// The FindCoordinator request for `group` at `version` (v4+ ask for a list of keys).
pub fn find_coordinator_request(group: &str, version: i16) -> FindCoordinatorRequest {
    coordinator_request(group, KeyType::Group, version)
}

/// The FindCoordinator request for `key` of `key_type` at `version`.
pub fn coordinator_request(key: &str, key_type: KeyType, version: i16) -> FindCoordinatorRequest {
    let key = StrBytes::from_string(key.to_owned());
    let request = FindCoordinatorRequest::default().with_key_type(key_type as i8);
    match version {
        ..=3 => request.with_key(key),
        _ => request.with_coordinator_keys(vec![key]),
    }
}

/// `host:port` of `group`'s coordinator, as `connection`'s broker knows it.
pub async fn find_coordinator(
    connection: &mut Connection,
    group: &str,
) -> Result<String, ClientError> {
    find_coordinator_of(connection, group, KeyType::Group).await
}

/// `host:port` of the coordinator of `key` (a group or a transactional id).
pub async fn find_coordinator_of(
    connection: &mut Connection,
    key: &str,
    key_type: KeyType,
) -> Result<String, ClientError> {
    let group = key;
    let mut version = 0;
    let answer = connection
        .call(|v| {
            version = v;
            coordinator_request(key, key_type, v)
        })
        .await?;
    let found = match version {
        ..=3 => (
            answer.error_code,
            answer.error_message,
            answer.host,
            answer.port,
        ),
        _ => {
            let coordinator =
                answer
                    .coordinators
                    .into_iter()
                    .next()
                    .ok_or_else(|| ClientError::Missing {
                        api: "FindCoordinator",
                        what: format!("coordinator for {group}"),
                    })?;
            (
                coordinator.error_code,
                coordinator.error_message,
                coordinator.host,
                coordinator.port,
            )
        }
    };
    let (code, message, host, port) = found;
    if code != 0 {
        let context = message
            .map(|m| format!(": {}", m.as_str()))
            .unwrap_or_default();
        return Err(ClientError::kafka("FindCoordinator", code, context));
    }
    Ok(broker_addr(host.as_str(), port))
}

/// The OffsetCommit request of `commit` for `group`.
pub fn offset_commit_request(group: &str, commit: &Commit<'_>) -> OffsetCommitRequest {
    let partition = OffsetCommitRequestPartition::default()
        .with_partition_index(commit.partition)
        .with_committed_offset(commit.offset)
        .with_committed_leader_epoch(-1)
        .with_committed_metadata(Some(StrBytes::from_string(commit.metadata.to_owned())));
    OffsetCommitRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(StrBytes::default())
        .with_retention_time_ms(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(topic_name(commit.topic))
                .with_partitions(vec![partition]),
        ])
}

/// Commits `commit` for `group` over its coordinator.
pub async fn offset_commit(
    coordinator: &mut Connection,
    group: &str,
    commit: &Commit<'_>,
) -> Result<(), ClientError> {
    let request = offset_commit_request(group, commit);
    let answer = coordinator.call(|_| request).await?;
    let code = answer
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == commit.topic)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == commit.partition)
        .map(|p| p.error_code);
    let context = || format!(" for {}/{}", commit.topic, commit.partition);
    match code {
        Some(0) => Ok(()),
        Some(code) => Err(ClientError::kafka("OffsetCommit", code, context())),
        None => Err(ClientError::Missing {
            api: "OffsetCommit",
            what: format!("answer{}", context()),
        }),
    }
}

/// The OffsetFetch request of `topic`/`partition` for `group` at `version` (v8+ name groups).
pub fn offset_fetch_request(
    group: &str,
    topic: &str,
    partition: i32,
    version: i16,
) -> OffsetFetchRequest {
    // v7+: an offset a transaction has not ended yet is refused (UNSTABLE_OFFSET_COMMIT, asked
    // again later) instead of answered with the one before it.
    let request = OffsetFetchRequest::default().with_require_stable(version >= 7);
    if version < 8 {
        return request
            .with_group_id(group_id(group))
            .with_topics(Some(vec![
                OffsetFetchRequestTopic::default()
                    .with_name(topic_name(topic))
                    .with_partition_indexes(vec![partition]),
            ]));
    }
    request.with_groups(vec![
        OffsetFetchRequestGroup::default()
            .with_group_id(group_id(group))
            .with_topics(Some(vec![
                OffsetFetchRequestTopics::default()
                    .with_name(topic_name(topic))
                    .with_partition_indexes(vec![partition]),
            ])),
    ])
}

/// `group`'s committed offset of `topic`/`partition`, `None` when it has none.
pub async fn offset_fetch(
    coordinator: &mut Connection,
    group: &str,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, ClientError> {
    let mut version = 0;
    let answer = coordinator
        .call(|v| {
            version = v;
            offset_fetch_request(group, topic, partition, v)
        })
        .await?;
    let context = format!(" for {topic}/{partition}");
    let (group_code, partition) = fetched(&answer, version, topic, partition);
    match group_code {
        0 => {}
        GROUP_ID_NOT_FOUND => return Ok(None),
        code => return Err(ClientError::kafka("OffsetFetch", code, context)),
    }
    match partition {
        None => Ok(None),
        Some((0, offset)) => Ok((offset >= 0).then_some(offset)),
        Some((UNKNOWN_TOPIC | GROUP_ID_NOT_FOUND, _)) => Ok(None),
        Some((code, _)) => Err(ClientError::kafka("OffsetFetch", code, context)),
    }
}

/// The group's error code and the partition's (error code, offset) in an OffsetFetch answer.
fn fetched(
    answer: &OffsetFetchResponse,
    version: i16,
    topic: &str,
    partition: i32,
) -> (i16, Option<(i16, i64)>) {
    if version < 8 {
        let found = answer
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .map(|p| (p.error_code, p.committed_offset));
        return (answer.error_code, found);
    }
    let Some(group) = answer.groups.first() else {
        return (0, None);
    };
    let found = group
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == topic)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == partition)
        .map(|p| (p.error_code, p.committed_offset));
    (group.error_code, found)
}
