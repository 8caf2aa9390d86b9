//! The `[[mqtt.acl]]` rules on the Kafka APIs, on the in-memory log: Metadata hides what a
//! client may neither read nor write, Produce needs write (on the topic and on a record's
//! `mqtt.topic`), Fetch needs read, topic administration needs both; denials are Kafka's
//! authorisation error codes, and a denied client never creates a topic.

use std::sync::Arc;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::records::Compression;
use tern_auth::{Access, AclConfig, Anonymous, Security};
use tern_log::{LogPort, MemoryLog};

use super::Ctx;
use super::test::{call, ctx, fetch, name, produce};
use crate::records::tests::{Produced, produced};

const TOPIC_AUTHORIZATION_FAILED: i16 = 29;

/// Record headers of a produce case.
type Headers<'a> = &'a [(&'a str, &'a [u8])];

/// A context whose rules grant `open` read and write, `inbox` write only, `feed` read only.
fn guarded() -> Ctx<MemoryLog> {
    let rule = |topic: &str, access| AclConfig {
        user: None,
        client_id: None,
        topic: topic.to_owned(),
        access,
    };
    let rules = [
        rule("open", Access::ReadWrite),
        rule("inbox", Access::Write),
        rule("feed", Access::Read),
        rule("cmd/#", Access::Write),
    ];
    let security = Security::load(None, Anonymous::Always, &rules).expect("security");
    let mut ctx = ctx();
    ctx.security = Some(Arc::new(security));
    for topic in ["open", "inbox", "feed", "secret"] {
        ctx.log.create_topic(topic, 1).expect("topic");
    }
    ctx
}

#[tokio::test]
async fn metadata_lists_only_topics_the_client_may_read_or_write() {
    let ctx = guarded();
    let all: MetadataResponse = call(
        &ctx,
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(None),
    )
    .await;
    let mut listed: Vec<String> = all
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .collect();
    listed.sort();
    assert_eq!(listed, ["feed", "inbox", "open"]);

    let named = |topic: &str| MetadataRequestTopic::default().with_name(Some(name(topic)));
    let asked = MetadataRequest::default()
        .with_topics(Some(vec![named("secret"), named("unseen"), named("open")]))
        .with_allow_auto_topic_creation(true);
    let response: MetadataResponse = call(&ctx, ApiKey::Metadata, 12, &asked).await;
    let codes: Vec<i16> = response.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(
        codes,
        [TOPIC_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, 0]
    );
    assert!(
        !ctx.log.topics().iter().any(|t| t.name == "unseen"),
        "a client without write access created a topic"
    );
}

/// An acks=all Produce of one record with `headers` to partition 0 of `topic`.
fn produce_one(topic: &str, headers: Headers<'_>) -> ProduceRequest {
    let records: Vec<Produced<'_>> = vec![(1, None, b"v", headers)];
    produce(topic, -1, produced(Compression::None, &records))
}

#[tokio::test]
async fn produce_needs_write_on_the_topic_and_on_the_records_mqtt_topic() {
    let ctx = guarded();
    let cases: [(&str, Headers<'_>, i16); 6] = [
        ("open", &[], 0),
        ("inbox", &[], 0),
        ("feed", &[], TOPIC_AUTHORIZATION_FAILED),
        ("secret", &[], TOPIC_AUTHORIZATION_FAILED),
        ("open", &[("mqtt.topic", b"cmd/valve")], 0),
        (
            "open",
            &[("mqtt.topic", b"alarms/valve")],
            TOPIC_AUTHORIZATION_FAILED,
        ),
    ];
    for (topic, headers, code) in cases {
        let response: ProduceResponse =
            call(&ctx, ApiKey::Produce, 9, &produce_one(topic, headers)).await;
        let partition = &response.responses[0].partition_responses[0];
        assert_eq!(
            partition.error_code, code,
            "{topic} {headers:?}: {partition:?}"
        );
    }
}

#[tokio::test]
async fn fetch_needs_read_and_administration_needs_both() {
    let ctx = guarded();
    for (topic, code) in [
        ("open", 0),
        ("feed", 0),
        ("inbox", TOPIC_AUTHORIZATION_FAILED),
    ] {
        let response: FetchResponse = call(&ctx, ApiKey::Fetch, 12, &fetch(topic, 0, 0, 0)).await;
        assert_eq!(
            response.responses[0].partitions[0].error_code, code,
            "{topic}"
        );
    }
    for (topic, code) in [("new", TOPIC_AUTHORIZATION_FAILED), ("open", 36)] {
        let create = CreateTopicsRequest::default().with_topics(vec![
            CreatableTopic::default()
                .with_name(name(topic))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]);
        let response: CreateTopicsResponse = call(&ctx, ApiKey::CreateTopics, 7, &create).await;
        assert_eq!(response.topics[0].error_code, code, "{topic}");
    }
}
