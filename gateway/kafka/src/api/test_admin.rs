//! Topic administration through the Kafka APIs on the in-memory log: CreateTopics,
//! CreatePartitions, DescribeConfigs and DeleteTopics, with Kafka's error codes for what tern
//! refuses.

use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use tern_log::LogPort;

use super::test::{call, ctx};

fn name(text: &str) -> TopicName {
    TopicName(StrBytes::from_string(text.to_owned()))
}

#[tokio::test]
async fn topics_are_created_grown_described_and_deleted() {
    let ctx = ctx();
    let create = |topic: &str, partitions: i32, replication: i16| {
        CreateTopicsRequest::default().with_topics(vec![
            CreatableTopic::default()
                .with_name(name(topic))
                .with_num_partitions(partitions)
                .with_replication_factor(replication),
        ])
    };
    let created: CreateTopicsResponse =
        call(&ctx, ApiKey::CreateTopics, 7, &create("t", 3, 1)).await;
    assert_eq!(created.topics[0].error_code, 0);
    assert_eq!(created.topics[0].num_partitions, 3);
    assert_eq!(
        ctx.log
            .topics()
            .iter()
            .find(|t| t.name == "t")
            .map(|t| t.partitions),
        Some(3)
    );
    for (request, code) in [
        (create("t", 3, 1), 36),
        (create("u", 1, 3), 38),
        (create("__own", 1, 1), 17),
        (create("v", 0, 1), 37),
    ] {
        let refused: CreateTopicsResponse = call(&ctx, ApiKey::CreateTopics, 7, &request).await;
        assert_eq!(refused.topics[0].error_code, code, "{request:?}");
    }
    let validate_only = create("w", 2, -1).with_validate_only(true);
    let checked: CreateTopicsResponse = call(&ctx, ApiKey::CreateTopics, 5, &validate_only).await;
    assert_eq!(checked.topics[0].error_code, 0);
    assert!(
        ctx.log.topics().iter().all(|t| t.name != "w"),
        "validate_only creates nothing"
    );

    let grow = |count: i32| {
        CreatePartitionsRequest::default().with_topics(vec![
            CreatePartitionsTopic::default()
                .with_name(name("t"))
                .with_count(count),
        ])
    };
    let grown: CreatePartitionsResponse = call(&ctx, ApiKey::CreatePartitions, 3, &grow(5)).await;
    assert_eq!(grown.results[0].error_code, 0);
    assert_eq!(ctx.log.topic_settings("t").expect("known").partitions, 5);
    let shrink: CreatePartitionsResponse = call(&ctx, ApiKey::CreatePartitions, 3, &grow(2)).await;
    assert_eq!(shrink.results[0].error_code, 37);

    let describe = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("t")),
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("nope")),
    ]);
    let described: DescribeConfigsResponse =
        call(&ctx, ApiKey::DescribeConfigs, 4, &describe).await;
    let value = |key: &str| {
        described.results[0]
            .configs
            .iter()
            .find(|c| c.name.as_str() == key)
            .and_then(|c| c.value.as_ref().map(|v| v.to_string()))
    };
    assert_eq!(value("retention.ms").as_deref(), Some("604800000"));
    assert_eq!(value("retention.bytes").as_deref(), Some("1073741824"));
    assert_eq!(value("flush.messages").as_deref(), Some("1"));
    assert_eq!(value("tern.durability").as_deref(), Some("sync"));
    assert_eq!(described.results[1].error_code, 3);

    ctx.log
        .commit_cursor("group:g", "t", 0, 0)
        .await
        .expect("cursor");
    let delete = DeleteTopicsRequest::default()
        .with_topics(vec![DeleteTopicState::default().with_name(Some(name("t")))]);
    let held: DeleteTopicsResponse = call(&ctx, ApiKey::DeleteTopics, 6, &delete).await;
    assert_eq!(held.responses[0].error_code, 44);
    let message = held.responses[0]
        .error_message
        .as_ref()
        .map(|m| m.to_string());
    assert!(message.is_some_and(|m| m.contains("group:g")));
    ctx.log.remove_cursors("group:g").await.expect("remove");
    let deleted: DeleteTopicsResponse = call(&ctx, ApiKey::DeleteTopics, 6, &delete).await;
    assert_eq!(deleted.responses[0].error_code, 0);
    assert!(ctx.log.topics().iter().all(|t| t.name != "t"));
    let old = DeleteTopicsRequest::default().with_topic_names(vec![name("t")]);
    let gone: DeleteTopicsResponse = call(&ctx, ApiKey::DeleteTopics, 5, &old).await;
    assert_eq!(gone.responses[0].error_code, 3);
}

/// franz-go's tests create topics with `max.message.bytes`: tern keeps it with the topic,
/// refuses a larger produced batch with `MESSAGE_TOO_LARGE` (its size as produced, compressed),
/// shows it in DescribeConfigs, and refuses configs it would not honour with `INVALID_CONFIG`
/// naming the key.
#[tokio::test]
async fn create_topics_keeps_max_message_bytes_and_produce_enforces_it() {
    use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;
    use kafka_protocol::records::Compression;

    use crate::records::tests::produced;

    let ctx = ctx();
    let create = |topic: &str, configs: &[(&str, &str)]| {
        CreateTopicsRequest::default().with_topics(vec![
            CreatableTopic::default()
                .with_name(name(topic))
                .with_num_partitions(1)
                .with_replication_factor(1)
                .with_configs(
                    configs
                        .iter()
                        .map(|(k, v)| {
                            CreatableTopicConfig::default()
                                .with_name(StrBytes::from_string((*k).to_owned()))
                                .with_value(Some(StrBytes::from_string((*v).to_owned())))
                        })
                        .collect(),
                ),
        ])
    };
    let created: CreateTopicsResponse = call(
        &ctx,
        ApiKey::CreateTopics,
        7,
        &create(
            "limited",
            &[("max.message.bytes", "1000"), ("cleanup.policy", "delete")],
        ),
    )
    .await;
    assert_eq!(created.topics[0].error_code, 0, "{:?}", created.topics[0]);
    let answered: Vec<_> = created.topics[0]
        .configs
        .iter()
        .flatten()
        .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
        .collect();
    assert!(answered.contains(&("max.message.bytes".to_owned(), Some("1000".to_owned()))));

    for (key, value) in [
        ("cleanup.policy", "compact"),
        ("retention.ms", "60000"),
        ("segment.bytes", "1048576"),
    ] {
        let refused: CreateTopicsResponse = call(
            &ctx,
            ApiKey::CreateTopics,
            7,
            &create("other", &[(key, value)]),
        )
        .await;
        assert_eq!(refused.topics[0].error_code, 40, "{key}");
        let message = refused.topics[0]
            .error_message
            .as_ref()
            .map(|m| m.to_string());
        assert!(message.is_some_and(|m| m.contains(key)), "{key}");
    }
    assert!(ctx.log.topics().iter().all(|t| t.name != "other"));

    let small_value = "x".repeat(100);
    let large_value: String = (0..3000)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let small = produced(Compression::None, &[(1, None, small_value.as_bytes(), &[])]);
    let large = produced(Compression::None, &[(1, None, large_value.as_bytes(), &[])]);
    // Compressed below the limit: the batch as produced is what counts, as in Kafka.
    let squeezed_value = "x".repeat(3000);
    let squeezed = produced(
        Compression::Gzip,
        &[(1, None, squeezed_value.as_bytes(), &[])],
    );
    for (batch, code) in [(small, 0), (large, 10), (squeezed, 0)] {
        let answer: ProduceResponse = call(
            &ctx,
            ApiKey::Produce,
            9,
            &super::test::produce("limited", 1, batch),
        )
        .await;
        let partition = &answer.responses[0].partition_responses[0];
        assert_eq!(partition.error_code, code, "{partition:?}");
        if code != 0 {
            let message = partition.error_message.as_ref().map(|m| m.to_string());
            assert!(message.is_some_and(|m| m.contains("max.message.bytes")));
        }
    }
    assert_eq!(ctx.log.offsets("limited", 0).expect("exists").1, 2);

    let describe = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("limited")),
    ]);
    let described: DescribeConfigsResponse =
        call(&ctx, ApiKey::DescribeConfigs, 4, &describe).await;
    let entry = |key: &str| {
        described.results[0]
            .configs
            .iter()
            .find(|c| c.name.as_str() == key)
            .map(|c| (c.value.as_ref().map(|v| v.to_string()), c.config_source))
    };
    assert_eq!(
        entry("max.message.bytes"),
        Some((Some("1000".to_owned()), 1))
    );
    assert_eq!(
        entry("cleanup.policy"),
        Some((Some("delete".to_owned()), 1))
    );
    assert_eq!(entry("retention.ms").map(|e| e.1), Some(4));
}
