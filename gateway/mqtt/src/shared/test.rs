//! Unit tests of shared groups over the in-memory log: spreading, acknowledgement and the
//! group cursor, redelivery after a member leaves, key_shared ownership and draining, failover
//! takeover, exclusive refusal, where a group starts (`tern-start`, a lost cursor), filter
//! parsing and the registry's cursor lifecycle.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::super::codec::QoS;
use super::super::config::{MqttConfig, SharedType};
use super::super::message::Message;
use super::super::replay;
use super::super::router::PartitionId;
use super::super::topic::{TopicLimits, is_shared};
use super::group::GroupState;
use super::*;
use tern_log::LogPort;
use tern_log::MemoryLog;

const LIMITS: TopicLimits = TopicLimits {
    max_len: 256,
    max_levels: 16,
};

fn message(topic: &str, payload: &str) -> Message {
    Message {
        topic: topic.into(),
        payload: Bytes::copy_from_slice(payload.as_bytes()),
        qos: QoS::AtLeastOnce,
        retain: false,
        client_id: "pub".into(),
        properties: None,
        timestamp_ms: 0,
    }
}

/// A one-partition log holding the topic `mqtt` the tests read from.
fn mqtt_log() -> MemoryLog {
    let log = MemoryLog::new(1);
    log.ensure_topic("mqtt").expect("topic");
    log
}

/// Appends `count` messages on `topic` to partition 0, keyed by `key(i)`.
async fn append(log: &MemoryLog, topic: &str, count: usize, key: impl Fn(usize) -> String) {
    for i in 0..count {
        let record = message(topic, &format!("m{i}")).to_record(Some(key(i).into_bytes().into()));
        log.append("mqtt", 0, vec![record]).await.expect("append");
    }
}

fn group(log: &MemoryLog, filter: &str, kind: SharedType) -> GroupState<MemoryLog> {
    let starts = BTreeMap::from([(partition(), 0)]);
    GroupState::new(log.clone(), filter.to_owned(), kind, starts)
}

/// The registry with every group of type `kind`.
fn groups_of(log: &MemoryLog, kind: SharedType) -> SharedGroups<MemoryLog> {
    let config = MqttConfig {
        shared_type: kind,
        ..MqttConfig::default()
    };
    SharedGroups::new(log.clone(), config.shared_types())
}

fn partition() -> PartitionId {
    ("mqtt".to_owned(), 0)
}

fn drain(rx: &mut mpsc::Receiver<Delivery>) -> Vec<Delivery> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn cursor(state: &GroupState<MemoryLog>) -> u64 {
    state
        .cursors()
        .map(|(_, offset)| offset)
        .next()
        .expect("one partition")
}

#[tokio::test(start_paused = true)]
async fn round_robin_hands_each_record_to_one_member_within_its_window() {
    let log = mqtt_log();
    append(&log, "a/x", 10, |i| format!("k{i}")).await;
    append(&log, "other", 2, |i| format!("o{i}")).await;
    let mut state = group(&log, "a/#", SharedType::Shared);
    let (tx1, mut rx1) = mpsc::channel(4);
    let (tx2, mut rx2) = mpsc::channel(4);
    state.join(1, "m1".to_owned(), 4, tx1);
    state.join(2, "m2".to_owned(), 4, tx2);
    state.dispatch().expect("dispatch");
    let (first, second) = (drain(&mut rx1), drain(&mut rx2));
    assert_eq!((first.len(), second.len()), (4, 4), "windows of 4 each");
    let offsets = |d: &[Delivery]| d.iter().map(|d| d.offset).collect::<Vec<_>>();
    assert_eq!(offsets(&first), [0, 2, 4, 6]);
    assert_eq!(offsets(&second), [1, 3, 5, 7]);
    assert_eq!(cursor(&state), 0);
    for d in &first {
        state.ack(1, d.partition.clone(), d.offset);
    }
    assert_eq!(cursor(&state), 1, "offset 1 is still unacknowledged");
    state.dispatch().expect("dispatch");
    assert_eq!(offsets(&drain(&mut rx1)), [8, 9]);
    for d in &second {
        state.ack(2, d.partition.clone(), d.offset);
    }
    state.ack(1, partition(), 8);
    state.ack(1, partition(), 9);
    state.dispatch().expect("dispatch");
    assert_eq!(
        cursor(&state),
        12,
        "the two non-matching records are skipped"
    );
    assert!(drain(&mut rx2).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_leaving_members_unacknowledged_records_go_to_another_with_dup() {
    let log = mqtt_log();
    append(&log, "a", 4, |i| format!("k{i}")).await;
    let mut state = group(&log, "a", SharedType::Shared);
    let (tx1, mut rx1) = mpsc::channel(8);
    state.join(1, "m1".to_owned(), 8, tx1);
    state.dispatch().expect("dispatch");
    let got = drain(&mut rx1);
    assert_eq!(got.len(), 4);
    state.ack(1, partition(), 1);
    state.leave(1);
    assert_eq!(cursor(&state), 0);
    let (tx2, mut rx2) = mpsc::channel(8);
    state.join(2, "m2".to_owned(), 8, tx2);
    state.dispatch().expect("dispatch");
    let again = drain(&mut rx2);
    let offsets: Vec<u64> = again.iter().map(|d| d.offset).collect();
    assert_eq!(offsets, [0, 2, 3]);
    assert!(again.iter().all(|d| d.dup));
    for offset in offsets {
        state.ack(2, partition(), offset);
    }
    assert_eq!(cursor(&state), 4);
}

#[tokio::test(start_paused = true)]
async fn a_closed_member_channel_counts_as_leaving() {
    let log = mqtt_log();
    append(&log, "a", 2, |_| "k".to_owned()).await;
    let mut state = group(&log, "a", SharedType::Shared);
    let (tx1, rx1) = mpsc::channel(8);
    state.join(1, "m1".to_owned(), 8, tx1);
    state.dispatch().expect("dispatch");
    drop(rx1);
    let (tx2, mut rx2) = mpsc::channel(8);
    state.join(2, "m2".to_owned(), 8, tx2);
    state.dispatch().expect("dispatch");
    assert_eq!(state.member_count(), 1);
    assert_eq!(drain(&mut rx2).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn key_sticky_sends_each_key_to_one_member() {
    let log = mqtt_log();
    append(&log, "a", 60, |i| format!("dev-{}", i % 6)).await;
    let mut state = group(&log, "a", SharedType::KeyShared);
    let mut receivers = Vec::new();
    for id in 1..=3u64 {
        let (tx, rx) = mpsc::channel(64);
        state.join(id, format!("m{id}"), 64, tx);
        receivers.push((id, rx));
    }
    state.dispatch().expect("dispatch");
    let mut owner: HashMap<String, u64> = HashMap::new();
    let mut total = 0;
    for (id, rx) in &mut receivers {
        for delivery in drain(rx) {
            total += 1;
            let key = String::from_utf8_lossy(&delivery.message.payload).into_owned();
            let index: usize = key.trim_start_matches('m').parse().expect("number");
            let previous = owner.insert(format!("dev-{}", index % 6), *id);
            assert!(
                previous.is_none_or(|p| p == *id),
                "a key reached two members"
            );
        }
    }
    assert_eq!(total, 60);
    assert_eq!(owner.len(), 6);
}

#[test]
fn share_filters_are_parsed_and_checked() {
    let key = ShareKey::parse("$share/g1/site/+/temp", &LIMITS).expect("valid");
    assert_eq!(
        (key.group.as_str(), key.filter.as_str()),
        ("g1", "site/+/temp")
    );
    assert_eq!(key.cursor_name(), "mqtt.share:g1/site/+/temp");
    for bad in [
        "$share/g",
        "$share//a",
        "$share/+/a",
        "$share/g#/a",
        "$share/g/a/#/b",
    ] {
        assert!(ShareKey::parse(bad, &LIMITS).is_err(), "{bad}");
    }
    assert!(is_shared("$share/g/a") && !is_shared("$SYS/x") && !is_shared("share/g/a"));
}

#[tokio::test(start_paused = true)]
async fn the_group_cursor_lives_as_long_as_a_session_holds_the_group() {
    let log = mqtt_log();
    append(&log, "a", 3, |_| "k".to_owned()).await;
    log.commit_cursor("mqtt.share:old/a", "mqtt", 0, 1)
        .await
        .expect("commit");
    log.commit_cursor("mqtt:c1", "mqtt", 0, 1)
        .await
        .expect("commit");
    let groups = groups_of(&log, SharedType::Shared);
    let held = [("c1".to_owned(), "$share/g/a".to_owned())];
    groups.restore(held.into_iter()).await.expect("restore");
    assert_eq!(
        log.cursor_names(),
        ["mqtt:c1"],
        "abandoned group cursor swept"
    );

    let key = ShareKey::parse("$share/g/a", &LIMITS).expect("valid");
    let mut member = groups
        .join(&key, "c1", vec![partition()], 8, None)
        .await
        .expect("joins")
        .member;
    assert_eq!(
        log.cursor(&key.cursor_name(), "mqtt", 0),
        Some(0),
        "a restored group without its cursor starts at the earliest record"
    );
    append(&log, "a", 1, |_| "k".to_owned()).await;
    let mut memberships = Memberships::default();
    member.matched = None;
    memberships.insert("$share/g/a".to_owned(), member);
    for offset in 0..4 {
        let (filter, delivery) = tokio::time::timeout(Duration::from_secs(5), memberships.recv())
            .await
            .expect("a delivery");
        assert_eq!((filter.as_str(), delivery.offset), ("$share/g/a", offset));
        memberships
            .settle(&filter, delivery.partition, offset)
            .await;
    }
    assert!(memberships.leave_all().await.is_empty());
    assert_eq!(log.cursor(&key.cursor_name(), "mqtt", 0), Some(4));

    let c2 = [("c2".to_owned(), "$share/g/a".to_owned())];
    groups
        .restore(c2.into_iter())
        .await
        .expect("c2 holds the group too");
    groups.release(&key, "c1").await.expect("release");
    assert!(
        log.cursor(&key.cursor_name(), "mqtt", 0).is_some(),
        "c2 still holds it"
    );
    groups
        .release_all(&["$share/g/a".to_owned(), "x/#".to_owned()], "c2")
        .await
        .expect("release");
    assert_eq!(log.cursor(&key.cursor_name(), "mqtt", 0), None);
}

#[tokio::test(start_paused = true)]
async fn a_record_waiting_for_a_busy_member_holds_the_cursor() {
    let log = mqtt_log();
    append(&log, "a", 3, |_| "same-key".to_owned()).await;
    let mut state = group(&log, "a", SharedType::KeyShared);
    let (tx, mut rx) = mpsc::channel(1);
    state.join(1, "m1".to_owned(), 1, tx);
    state.dispatch().expect("dispatch");
    let first = drain(&mut rx);
    assert_eq!(first.iter().map(|d| d.offset).collect::<Vec<_>>(), [0]);
    state.ack(1, partition(), 0);
    assert_eq!(
        cursor(&state),
        1,
        "offset 1 was read but waits for the member"
    );
    state.dispatch().expect("dispatch");
    assert_eq!(drain(&mut rx).first().map(|d| d.offset), Some(1));
    state.ack(1, partition(), 1);
    state.dispatch().expect("dispatch");
    state.ack(1, partition(), 2);
    assert_eq!(drain(&mut rx).len(), 1);
    assert_eq!(cursor(&state), 3);
}

#[tokio::test(start_paused = true)]
async fn failover_gives_everything_to_one_member_and_the_next_takes_over() {
    let log = mqtt_log();
    append(&log, "a", 6, |i| format!("k{i}")).await;
    let mut state = group(&log, "a", SharedType::Failover);
    let (tx1, mut rx1) = mpsc::channel(8);
    let (tx2, mut rx2) = mpsc::channel(8);
    state.join(1, "first".to_owned(), 8, tx1);
    state.join(2, "second".to_owned(), 8, tx2);
    state.dispatch().expect("dispatch");
    let active = drain(&mut rx1);
    assert_eq!(
        active.iter().map(|d| d.offset).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5]
    );
    assert!(drain(&mut rx2).is_empty(), "the standby gets nothing");
    for offset in [0, 1, 2] {
        state.ack(1, partition(), offset);
    }
    state.leave(1);
    append(&log, "a", 2, |i| format!("n{i}")).await;
    state.dispatch().expect("dispatch");
    let taken = drain(&mut rx2);
    let offsets: Vec<(u64, bool)> = taken.iter().map(|d| (d.offset, d.dup)).collect();
    assert_eq!(
        offsets,
        [(3, true), (4, true), (5, true), (6, false), (7, false)],
        "the unacknowledged ones again, then on, in order"
    );
    assert_eq!(cursor(&state), 3);
}

#[tokio::test(start_paused = true)]
async fn key_shared_holds_a_moved_key_until_its_previous_member_acknowledged() {
    let log = mqtt_log();
    let mut state = group(&log, "a", SharedType::KeyShared);
    let (tx1, mut rx1) = mpsc::channel(8);
    state.join(1, "m1".to_owned(), 8, tx1);
    let owner_after_join = |key: &str| {
        let two = [("m1", true), ("m2", true)].map(|(n, r)| Named(n, r));
        strategy::rendezvous(&two, key.as_bytes())
    };
    let moving = (0..100)
        .map(|i| format!("dev-{i}"))
        .find(|k| owner_after_join(k) == Some(1))
        .expect("a key that moves to m2");
    let key = moving.clone();
    append(&log, "a", 2, move |_| key.clone()).await;
    state.dispatch().expect("dispatch");
    let held = drain(&mut rx1);
    assert_eq!(held.len(), 2, "m1 alone owns every key");
    let (tx2, mut rx2) = mpsc::channel(8);
    state.join(2, "m2".to_owned(), 8, tx2);
    let key = moving.clone();
    append(&log, "a", 1, move |_| key.clone()).await;
    state.dispatch().expect("dispatch");
    assert!(
        drain(&mut rx2).is_empty(),
        "m1 still holds records of the key"
    );
    state.ack(1, partition(), 0);
    state.dispatch().expect("dispatch");
    assert!(drain(&mut rx2).is_empty(), "one still outstanding");
    state.ack(1, partition(), 1);
    state.dispatch().expect("dispatch");
    let moved = drain(&mut rx2);
    assert_eq!(moved.iter().map(|d| d.offset).collect::<Vec<_>>(), [2]);
    assert!(drain(&mut rx1).is_empty());
}

/// A bare candidate for computing rendezvous owners.
struct Named(&'static str, bool);

impl strategy::Candidate for Named {
    fn name(&self) -> &str {
        self.0
    }
    fn has_room(&self) -> bool {
        self.1
    }
    fn holds_key(&self, _: u64) -> bool {
        false
    }
}

#[tokio::test(start_paused = true)]
async fn an_exclusive_group_refuses_a_second_session_but_not_the_holder() {
    let log = mqtt_log();
    let groups = groups_of(&log, SharedType::Exclusive);
    let key = ShareKey::parse("$share/solo/a", &LIMITS).expect("valid");
    let first = groups.join(&key, "c1", vec![partition()], 8, None).await;
    let first = first.expect("the first session joins");
    let refused = groups.join(&key, "c2", vec![partition()], 8, None).await;
    let err = refused.expect_err("a second session is refused");
    assert!(
        matches!(err, JoinError::Exclusive(ref g) if g == "solo"),
        "{err}"
    );
    assert!(err.to_string().contains("exclusive"), "{err}");
    let mut memberships = Memberships::default();
    memberships.insert("$share/solo/a".to_owned(), first.member);
    memberships.leave_all().await;
    let again = groups.join(&key, "c1", vec![partition()], 8, None).await;
    assert!(
        again.is_ok(),
        "the holder's session joins again (a reconnect)"
    );
    groups.release(&key, "c1").await.expect("release");
    let next = groups.join(&key, "c2", vec![partition()], 8, None).await;
    assert!(next.is_ok(), "free once the holder let go");
}

#[tokio::test(start_paused = true)]
async fn a_new_group_starts_where_asked_and_an_existing_cursor_wins() {
    let log = mqtt_log();
    append(&log, "a", 3, |_| "k".to_owned()).await;
    let groups = groups_of(&log, SharedType::Shared);
    let key = ShareKey::parse("$share/g/a", &LIMITS).expect("valid");
    let earliest = replay::Start::Earliest;
    let joined = groups
        .join(&key, "c1", vec![partition()], 8, Some(&earliest))
        .await
        .expect("joins");
    assert!(joined.ignored.is_empty());
    assert_eq!(
        log.cursor(&key.cursor_name(), "mqtt", 0),
        Some(0),
        "durable before the SUBACK"
    );
    let mut memberships = Memberships::default();
    memberships.insert("$share/g/a".to_owned(), joined.member);
    let (_, first) = tokio::time::timeout(Duration::from_secs(5), memberships.recv())
        .await
        .expect("a delivery");
    assert_eq!(first.offset, 0);
    let second = groups
        .join(&key, "c2", vec![partition()], 8, Some(&earliest))
        .await
        .expect("joins");
    assert_eq!(
        second.ignored,
        [partition()],
        "the running group's cursor continues"
    );
    let past = replay::Start::Offsets(vec![replay::OffsetAt {
        topic: None,
        partition: 0,
        offset: 99,
    }]);
    let other = ShareKey::parse("$share/h/a", &LIMITS).expect("valid");
    let err = groups
        .join(&other, "c3", vec![partition()], 8, Some(&past))
        .await
        .expect_err("past the end");
    assert!(err.to_string().contains("past the end 3"), "{err}");
    assert_eq!(log.cursor(&other.cursor_name(), "mqtt", 0), None);
}

#[tokio::test(start_paused = true)]
async fn a_restored_group_whose_cursor_was_lost_starts_at_the_earliest_record() {
    let log = mqtt_log();
    append(&log, "a", 2, |_| "k".to_owned()).await;
    let groups = groups_of(&log, SharedType::Shared);
    let held = [("c1".to_owned(), "$share/kept/a".to_owned())];
    groups.restore(held.into_iter()).await.expect("restore");
    let kept = ShareKey::parse("$share/kept/a", &LIMITS).expect("valid");
    groups
        .join(&kept, "c1", vec![partition()], 8, None)
        .await
        .expect("joins");
    assert_eq!(
        log.cursor(&kept.cursor_name(), "mqtt", 0),
        Some(0),
        "redelivers"
    );
    let fresh = ShareKey::parse("$share/fresh/a", &LIMITS).expect("valid");
    groups
        .join(&fresh, "c1", vec![partition()], 8, None)
        .await
        .expect("joins");
    assert_eq!(
        log.cursor(&fresh.cursor_name(), "mqtt", 0),
        Some(2),
        "a new group starts at the end"
    );
}

#[tokio::test(start_paused = true)]
async fn closing_commits_every_group_cursor_and_ends_its_dispatcher() {
    let log = mqtt_log();
    append(&log, "a", 3, |_| "k".to_owned()).await;
    let groups = groups_of(&log, SharedType::Shared);
    let key = ShareKey::parse("$share/g/a", &LIMITS).expect("valid");
    let start = replay::Start::Earliest;
    let mut member = groups
        .join(&key, "c1", vec![partition()], 8, Some(&start))
        .await
        .expect("joins")
        .member;
    member.matched = None;
    let mut memberships = Memberships::default();
    memberships.insert("$share/g/a".to_owned(), member);
    for offset in 0..3 {
        let (filter, delivery) = tokio::time::timeout(Duration::from_secs(5), memberships.recv())
            .await
            .expect("a delivery");
        assert_eq!(delivery.offset, offset);
        memberships
            .settle(&filter, delivery.partition, offset)
            .await;
    }
    // The member stays: shutdown closes groups whose members never left. Well within the
    // once-a-second commit, so only the close can have committed the cursor.
    tokio::time::timeout(Duration::from_millis(500), groups.close())
        .await
        .expect("close ends every dispatcher");
    assert_eq!(log.cursor(&key.cursor_name(), "mqtt", 0), Some(3));
    let again = groups.join(&key, "c2", vec![partition()], 8, None).await;
    assert!(
        matches!(again, Err(JoinError::Gone)),
        "no group starts after close"
    );
}
