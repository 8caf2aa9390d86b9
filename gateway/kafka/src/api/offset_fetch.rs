//! OffsetFetch: a group's committed offsets, read from its cursors (`group::offsets`). A
//! partition without one answers -1, as Kafka does; no topics (null) asks for every committed
//! offset of the group. v8+ asks for several groups at once. The metadata string is always
//! `""` and the leader epoch -1 (neither is stored).

use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{ApiKey, OffsetFetchRequest, OffsetFetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tern_auth::Want;
use tern_log::LogPort;

use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::group::offsets;
use crate::header::Request;

/// v1-v9: Kafka 4.x serves no v0 (offsets in ZooKeeper); v10 names topics by id, which tern
/// has none of.
pub const VERSIONS: Versions = Versions { min: 1, max: 9 };

/// (topic, [(partition, committed offset or -1)]).
type Fetched = Vec<(String, Vec<(i32, i64)>)>;

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: OffsetFetchRequest = decode(request)?;
    let response = if version >= 8 {
        let groups = body
            .groups
            .into_iter()
            .map(|g| {
                let wanted = g.topics.map(|topics| {
                    topics
                        .into_iter()
                        .map(|t| (t.name.0.to_string(), t.partition_indexes))
                        .collect()
                });
                let fetched = readable(ctx, conn, request, fetch(&ctx.log, &g.group_id.0, wanted));
                OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_topics(fetched.into_iter().map(topics_v8).collect())
            })
            .collect();
        OffsetFetchResponse::default().with_groups(groups)
    } else {
        let wanted = body.topics.map(|topics| {
            topics
                .into_iter()
                .map(|t| (t.name.0.to_string(), t.partition_indexes))
                .collect()
        });
        let fetched = readable(
            ctx,
            conn,
            request,
            fetch(&ctx.log, &body.group_id.0, wanted),
        );
        OffsetFetchResponse::default().with_topics(fetched.into_iter().map(topic_v1).collect())
    };
    Ok(Reply::Now(encode(ApiKey::OffsetFetch, version, &response)?))
}

/// `fetched` without the topics the client may not read (Kafka leaves them out too).
fn readable<L>(ctx: &Ctx<L>, conn: &Conn, request: &Request, fetched: Fetched) -> Fetched {
    fetched
        .into_iter()
        .filter(|(topic, _)| ctx.allows(conn, request, Want::Receive, topic))
        .collect()
}

/// The committed offsets of `group` in the `wanted` partitions, or all of them.
fn fetch<L: LogPort>(log: &L, group: &str, wanted: Option<Vec<(String, Vec<i32>)>>) -> Fetched {
    match wanted {
        Some(topics) => topics
            .into_iter()
            .map(|(topic, partitions)| {
                let offsets = partitions
                    .into_iter()
                    .map(|index| {
                        let offset = u32::try_from(index)
                            .ok()
                            .and_then(|p| offsets::committed(log, group, &topic, p))
                            .map_or(-1, |o| i64::try_from(o).unwrap_or(i64::MAX));
                        (index, offset)
                    })
                    .collect();
                (topic, offsets)
            })
            .collect(),
        None => {
            let mut all: Fetched = Vec::new();
            for (topic, partition, offset) in offsets::committed_all(log, group) {
                let entry = (
                    i32::try_from(partition).unwrap_or(i32::MAX),
                    i64::try_from(offset).unwrap_or(i64::MAX),
                );
                match all.last_mut() {
                    Some((t, parts)) if *t == topic => parts.push(entry),
                    _ => all.push((topic, vec![entry])),
                }
            }
            all
        }
    }
}

fn name(topic: String) -> TopicName {
    TopicName(StrBytes::from_string(topic))
}

fn topic_v1((topic, parts): (String, Vec<(i32, i64)>)) -> OffsetFetchResponseTopic {
    let partitions = parts
        .into_iter()
        .map(|(index, offset)| {
            OffsetFetchResponsePartition::default()
                .with_partition_index(index)
                .with_committed_offset(offset)
                .with_metadata(Some(StrBytes::default()))
        })
        .collect();
    OffsetFetchResponseTopic::default()
        .with_name(name(topic))
        .with_partitions(partitions)
}

fn topics_v8((topic, parts): (String, Vec<(i32, i64)>)) -> OffsetFetchResponseTopics {
    let partitions = parts
        .into_iter()
        .map(|(index, offset)| {
            OffsetFetchResponsePartitions::default()
                .with_partition_index(index)
                .with_committed_offset(offset)
                .with_metadata(Some(StrBytes::default()))
        })
        .collect();
    OffsetFetchResponseTopics::default()
        .with_name(name(topic))
        .with_partitions(partitions)
}
