//! The consumer-group APIs end to end through dispatch, on the in-memory log and tokio's
//! paused clock: what a Java consumer and `kafka-consumer-groups` send, in their order.

use bytes::Bytes;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use tern_log::{LogPort, MemoryLog};

use super::{body, conn, ctx, decode_as, request};
use crate::api::{Ctx, dispatch};

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_owned())
}

async fn call<Req: Encodable, Resp: kafka_protocol::protocol::Decodable>(
    ctx: &Ctx<MemoryLog>,
    api: ApiKey,
    version: i16,
    req: &Req,
) -> Resp {
    let reply = dispatch(ctx, &mut conn(), &request(api, version, req))
        .await
        .expect("reply");
    decode_as(body(reply).await.expect("answered"), version)
}

/// Runs the groups' timer until the returned trigger is dropped (`ctx`'s own shutdown has
/// already fired).
fn timer(ctx: &Ctx<MemoryLog>) -> tern_core::shutdown::ShutdownTrigger {
    let (trigger, shutdown) = tern_core::shutdown::channel();
    tokio::spawn(ctx.groups.clone().run_timer(shutdown));
    trigger
}

fn join_request(member: &str) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(GroupId(s("analytics")))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(s(member))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(b"subscription")),
        ])
}

fn commit_request(member: &str, generation: i32, offset: i64) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(GroupId(s("analytics")))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(s("mqtt")))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(1)
                        .with_committed_offset(offset),
                ]),
        ])
}

#[tokio::test(start_paused = true)]
async fn a_member_joins_syncs_commits_and_the_tools_see_and_delete_the_group() {
    let ctx = ctx();
    ctx.log.ensure_topic("mqtt").expect("topic");
    let _timer = timer(&ctx);

    let found: FindCoordinatorResponse = call(
        &ctx,
        ApiKey::FindCoordinator,
        4,
        &FindCoordinatorRequest::default().with_coordinator_keys(vec![s("analytics")]),
    )
    .await;
    let coordinator = found.coordinators.first().expect("one");
    assert_eq!(
        (
            coordinator.node_id.0,
            coordinator.port,
            coordinator.error_code
        ),
        (0, 9092, 0)
    );

    // v9: the first join only hands out the member id (KIP-394).
    let first: JoinGroupResponse = call(&ctx, ApiKey::JoinGroup, 9, &join_request("")).await;
    assert_eq!(first.error_code, 79);
    let member = first.member_id.to_string();
    let joined: JoinGroupResponse = call(&ctx, ApiKey::JoinGroup, 9, &join_request(&member)).await;
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    assert_eq!(joined.protocol_name.as_deref(), Some("range"));
    assert_eq!(joined.leader.to_string(), member);
    assert_eq!(joined.members.len(), 1);

    let sync = SyncGroupRequest::default()
        .with_group_id(GroupId(s("analytics")))
        .with_generation_id(1)
        .with_member_id(s(&member))
        .with_protocol_type(Some(s("consumer")))
        .with_protocol_name(Some(s("range")))
        .with_assignments(vec![
            SyncGroupRequestAssignment::default()
                .with_member_id(s(&member))
                .with_assignment(Bytes::from_static(b"mqtt-0-1")),
        ]);
    let synced: SyncGroupResponse = call(&ctx, ApiKey::SyncGroup, 5, &sync).await;
    assert_eq!(
        (synced.error_code, &synced.assignment[..]),
        (0, &b"mqtt-0-1"[..])
    );
    assert_eq!(synced.protocol_name.as_deref(), Some("range"));

    let beat = HeartbeatRequest::default()
        .with_group_id(GroupId(s("analytics")))
        .with_generation_id(1)
        .with_member_id(s(&member));
    let beat: HeartbeatResponse = call(&ctx, ApiKey::Heartbeat, 4, &beat).await;
    assert_eq!(beat.error_code, 0);

    let stale: OffsetCommitResponse = call(
        &ctx,
        ApiKey::OffsetCommit,
        9,
        &commit_request(&member, 0, 3),
    )
    .await;
    let code = |r: &OffsetCommitResponse| r.topics[0].partitions[0].error_code;
    assert_eq!(code(&stale), 22, "an old generation may not commit");
    let tool: OffsetCommitResponse =
        call(&ctx, ApiKey::OffsetCommit, 9, &commit_request("", -1, 3)).await;
    assert_eq!(code(&tool), 25, "nor a tool while the group has members");
    let done: OffsetCommitResponse = call(
        &ctx,
        ApiKey::OffsetCommit,
        9,
        &commit_request(&member, 1, 3),
    )
    .await;
    assert_eq!(code(&done), 0);
    assert_eq!(
        ctx.log.cursor("kafka.group:analytics", "mqtt", 1),
        Some(3),
        "a cursor"
    );

    let fetch = OffsetFetchRequest::default().with_groups(vec![
        OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(s("analytics")))
            .with_topics(None),
    ]);
    let fetched: OffsetFetchResponse = call(&ctx, ApiKey::OffsetFetch, 8, &fetch).await;
    let partitions = &fetched.groups[0].topics[0].partitions;
    assert_eq!(
        (
            partitions.len(),
            partitions[0].partition_index,
            partitions[0].committed_offset
        ),
        (1, 1, 3)
    );
    let legacy = OffsetFetchRequest::default()
        .with_group_id(GroupId(s("analytics")))
        .with_topics(Some(vec![
            offset_fetch_request::OffsetFetchRequestTopic::default()
                .with_name(TopicName(s("mqtt")))
                .with_partition_indexes(vec![0, 1]),
        ]));
    let fetched: OffsetFetchResponse = call(&ctx, ApiKey::OffsetFetch, 1, &legacy).await;
    let offsets: Vec<i64> = fetched.topics[0]
        .partitions
        .iter()
        .map(|p| p.committed_offset)
        .collect();
    assert_eq!(offsets, vec![-1, 3]);

    let described: DescribeGroupsResponse = call(
        &ctx,
        ApiKey::DescribeGroups,
        5,
        &DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(s("analytics")), GroupId(s("none"))]),
    )
    .await;
    let group = &described.groups[0];
    assert_eq!(
        (group.group_state.as_str(), group.protocol_data.as_str()),
        ("Stable", "range")
    );
    assert_eq!(&group.members[0].member_assignment[..], b"mqtt-0-1");
    assert_eq!(group.members[0].client_host.as_str(), "/127.0.0.1");
    assert_eq!(described.groups[1].group_state.as_str(), "Dead");

    let refused: DeleteGroupsResponse = call(
        &ctx,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s("analytics"))]),
    )
    .await;
    assert_eq!(refused.results[0].error_code, 68, "the group has a member");

    let leave = LeaveGroupRequest::default()
        .with_group_id(GroupId(s("analytics")))
        .with_members(vec![
            leave_group_request::MemberIdentity::default().with_member_id(s(&member)),
        ]);
    let left: LeaveGroupResponse = call(&ctx, ApiKey::LeaveGroup, 5, &leave).await;
    assert_eq!((left.error_code, left.members[0].error_code), (0, 0));

    let listed: ListGroupsResponse = call(
        &ctx,
        ApiKey::ListGroups,
        5,
        &ListGroupsRequest::default().with_states_filter(vec![s("Empty")]),
    )
    .await;
    let names: Vec<(&str, &str)> = listed
        .groups
        .iter()
        .map(|g| (g.group_id.0.as_str(), g.group_state.as_str()))
        .collect();
    assert_eq!(names, vec![("analytics", "Empty")]);
    let reset: OffsetCommitResponse =
        call(&ctx, ApiKey::OffsetCommit, 9, &commit_request("", -1, 0)).await;
    assert_eq!(code(&reset), 0, "an empty group takes the tool's reset");
    assert_eq!(ctx.log.cursor("kafka.group:analytics", "mqtt", 1), Some(0));

    let deleted: DeleteGroupsResponse = call(
        &ctx,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default()
            .with_groups_names(vec![GroupId(s("analytics")), GroupId(s("none"))]),
    )
    .await;
    let codes: Vec<i16> = deleted.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![0, 69]);
    assert!(
        ctx.log.cursor_names().is_empty(),
        "the cursor is gone: retention is free"
    );
}

#[tokio::test(start_paused = true)]
async fn offsets_of_a_subscribed_topic_cannot_be_deleted() {
    let ctx = ctx();
    ctx.log.ensure_topic("mqtt").expect("topic");
    ctx.log.ensure_topic("other").expect("topic");
    let _timer = timer(&ctx);
    let subscription = ConsumerProtocolSubscription::default().with_topics(vec![s("mqtt")]);
    let mut meta = bytes::BytesMut::new();
    bytes::BufMut::put_i16(&mut meta, 1);
    subscription.encode(&mut meta, 1).expect("encode");
    let mut join = join_request("");
    join.protocols[0].metadata = meta.freeze();
    let joined: JoinGroupResponse = call(&ctx, ApiKey::JoinGroup, 3, &join).await;
    assert_eq!(joined.error_code, 0);
    let sync = SyncGroupRequest::default()
        .with_group_id(GroupId(s("analytics")))
        .with_generation_id(joined.generation_id)
        .with_member_id(joined.member_id.clone());
    let _: SyncGroupResponse = call(&ctx, ApiKey::SyncGroup, 3, &sync).await;
    for topic in ["mqtt", "other"] {
        let mut commit = commit_request("", -1, 1);
        commit.topics[0].name = TopicName(s(topic));
        let member = joined.member_id.to_string();
        commit.member_id = s(&member);
        commit.generation_id_or_member_epoch = joined.generation_id;
        let done: OffsetCommitResponse = call(&ctx, ApiKey::OffsetCommit, 2, &commit).await;
        assert_eq!(done.topics[0].partitions[0].error_code, 0);
    }
    let delete = |topic: &str| {
        OffsetDeleteRequest::default()
            .with_group_id(GroupId(s("analytics")))
            .with_topics(vec![
                offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(TopicName(s(topic)))
                    .with_partitions(vec![
                        offset_delete_request::OffsetDeleteRequestPartition::default()
                            .with_partition_index(1),
                    ]),
            ])
    };
    let refused: OffsetDeleteResponse = call(&ctx, ApiKey::OffsetDelete, 0, &delete("mqtt")).await;
    assert_eq!(refused.topics[0].partitions[0].error_code, 86);
    let done: OffsetDeleteResponse = call(&ctx, ApiKey::OffsetDelete, 0, &delete("other")).await;
    assert_eq!(done.topics[0].partitions[0].error_code, 0);
    assert_eq!(ctx.log.cursor("kafka.group:analytics", "mqtt", 1), Some(1));
    assert_eq!(ctx.log.cursor("kafka.group:analytics", "other", 1), None);
}
