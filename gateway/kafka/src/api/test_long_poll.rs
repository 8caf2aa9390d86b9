//! A Fetch long-poll whose partitions are deleted (and created again) while it waits: the
//! answer names what happened, and nothing aborts the process. franz-go's group tests delete
//! topics while their consumers long-poll; a closed watch used to be polled again after it had
//! completed, which tokio answers with a panic ("`async fn` resumed after completion"), and
//! the release build's `panic = "abort"` turned that into exit 134.

use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse};
use tern_log::{LogPort, Record};

use super::test::{body, conn, ctx, decode_as, fetch, name, request};
use super::{Reply, dispatch};

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// A Fetch of partition 0 of each of `topics` from offset 0 that waits up to 10 s for a byte.
fn fetch_all(topics: &[&str]) -> FetchRequest {
    let topics = topics
        .iter()
        .map(|topic| {
            FetchTopic::default()
                .with_topic(name(topic))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(0)
                        .with_partition_max_bytes(1 << 20),
                ])
        })
        .collect();
    FetchRequest::default()
        .with_max_wait_ms(10_000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(topics)
}

fn record(value: &str) -> Record {
    Record {
        timestamp_ms: 1,
        key: None,
        value: value.as_bytes().to_vec().into(),
        headers: tern_log::Headers::new(),
    }
}

/// The pending answer of `request`, awaited on a task of its own as the connection does.
async fn long_poll(
    ctx: &super::Ctx<tern_log::MemoryLog>,
    fetch: &FetchRequest,
) -> tokio::task::JoinHandle<FetchResponse> {
    let reply = dispatch(ctx, &mut conn(), &request(ApiKey::Fetch, 12, fetch))
        .await
        .expect("reply");
    assert!(
        matches!(reply, Reply::Later(_)),
        "nothing to read yet: the fetch waits"
    );
    tokio::spawn(async move { decode_as(body(reply).await.expect("answered"), 12) })
}

#[tokio::test(start_paused = true)]
async fn a_partition_deleted_under_a_long_poll_answers_unknown_and_the_others_still_wake_it() {
    let ctx = ctx();
    ctx.log.ensure_topic("gone").expect("topic");
    ctx.log.ensure_topic("kept").expect("topic");
    let waiting = long_poll(&ctx, &fetch_all(&["gone", "kept"])).await;
    tokio::time::sleep(Duration::from_millis(10)).await;

    ctx.log.delete_topic("gone").await.expect("deleted");
    tokio::time::sleep(Duration::from_millis(10)).await;
    // An append to the partition still there wakes the same wait again.
    ctx.log
        .append("kept", 0, vec![record("after")])
        .await
        .expect("append");
    let response = waiting
        .await
        .expect("the long-poll's task ends without a panic");
    let codes: Vec<(String, i16)> = response
        .responses
        .iter()
        .map(|t| (t.topic.0.to_string(), t.partitions[0].error_code))
        .collect();
    assert_eq!(
        codes,
        vec![
            ("gone".to_owned(), UNKNOWN_TOPIC_OR_PARTITION),
            ("kept".to_owned(), 0)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_topic_deleted_and_created_again_under_a_long_poll_is_read_anew() {
    let ctx = ctx();
    ctx.log.ensure_topic("t").expect("topic");
    let waiting = long_poll(&ctx, &fetch("t", 0, 10_000, 1)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    ctx.log.delete_topic("t").await.expect("deleted");
    ctx.log.ensure_topic("t").expect("created again");
    let started = tokio::time::Instant::now();
    let response = waiting
        .await
        .expect("the long-poll's task ends without a panic");
    // Deleted and created again before the wait looked: the new partition is empty, so the
    // wait goes on until the deadline and answers without an error.
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(response.responses[0].partitions[0].error_code, 0);

    // The new partition's appends wake a new long-poll.
    let waiting = long_poll(&ctx, &fetch("t", 0, 10_000, 1)).await;
    ctx.log
        .append("t", 0, vec![record("new")])
        .await
        .expect("append");
    let response = waiting.await.expect("answered");
    assert_eq!(response.responses[0].partitions[0].high_watermark, 1);
}

#[tokio::test(start_paused = true)]
async fn many_long_polls_survive_topics_deleted_and_recreated_while_they_wait() {
    let ctx = ctx();
    let topics: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    for round in 0..5 {
        for topic in &names {
            ctx.log.ensure_topic(topic).expect("topic");
        }
        let mut polls = Vec::new();
        for _ in 0..4 {
            polls.push(long_poll(&ctx, &fetch_all(&names)).await);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        for (i, topic) in names.iter().enumerate() {
            if (i + round) % 2 == 0 {
                ctx.log.delete_topic(topic).await.expect("deleted");
                tokio::time::sleep(Duration::from_millis(1)).await;
            } else {
                ctx.log
                    .append(topic, 0, vec![record("x")])
                    .await
                    .expect("append");
            }
        }
        for poll in polls {
            poll.await
                .expect("the long-poll's task ends without a panic");
        }
        // What this round kept is deleted for the next one.
        for (i, topic) in names.iter().enumerate() {
            if (i + round) % 2 == 1 {
                ctx.log.delete_topic(topic).await.expect("deleted");
            }
        }
    }
}
