use std::time::Duration;

use super::*;
use tern_core::shutdown::{self, ShutdownTrigger};

fn join(member_id: &str) -> Join {
    Join {
        member_id: member_id.to_owned(),
        client_id: "console-consumer".to_owned(),
        client_host: "/127.0.0.1".to_owned(),
        session_timeout: Duration::from_secs(10),
        rebalance_timeout: Duration::from_secs(30),
        protocol_type: "consumer".to_owned(),
        protocols: vec![("range".to_owned(), Bytes::from_static(b"sub"))],
        require_known_member_id: false,
    }
}

/// The groups and their running timer (which stops when the trigger is dropped).
fn started() -> (Groups, ShutdownTrigger) {
    let groups = Groups::new(Limits::default());
    let (trigger, shutdown) = shutdown::channel();
    tokio::spawn(groups.clone().run_timer(shutdown));
    (groups, trigger)
}

#[tokio::test(start_paused = true)]
async fn parked_joins_are_answered_by_the_timer_after_the_initial_delay() {
    let (groups, _shutdown) = started();
    let start = Instant::now();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let groups = groups.clone();
            tokio::spawn(async move { groups.join("g", join("")).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("task").expect("joined"));
    }
    assert_eq!(Instant::now() - start, Duration::from_secs(3));
    let leader = answers
        .iter()
        .find(|j| j.members.len() == 3)
        .expect("a leader");
    assert!(
        answers
            .iter()
            .all(|j| j.leader == leader.member_id && j.generation == 1)
    );

    let assignments = answers
        .iter()
        .map(|j| (j.member_id.clone(), Bytes::from(j.member_id.clone())))
        .collect();
    let mine = groups.sync("g", &leader.member_id, 1, assignments).await;
    assert_eq!(mine, Ok(Bytes::from(leader.member_id.clone())));
    let view = groups.view("g").expect("the group");
    assert_eq!(
        (view.state, view.protocol.as_str(), view.members.len()),
        (State::Stable, "range", 3)
    );
    assert_eq!(groups.list().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_timer_ends_a_silent_members_session_and_forgets_the_empty_group() {
    let (groups, _shutdown) = started();
    let joined = groups.join("g", join("")).await.expect("joined");
    let assignment = vec![(joined.member_id.clone(), Bytes::from_static(b"all"))];
    groups
        .sync("g", &joined.member_id, joined.generation, assignment)
        .await
        .expect("sync");
    tokio::time::sleep(Duration::from_secs(9)).await;
    groups
        .heartbeat("g", &joined.member_id, joined.generation)
        .expect("alive");
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(groups.view("g").is_some(), "the heartbeat kept the session");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(groups.view("g"), None, "expired and forgotten");
    let late = groups.heartbeat("g", &joined.member_id, joined.generation);
    assert_eq!(late, Err(GroupError::UnknownMember));
}

#[tokio::test(start_paused = true)]
async fn a_join_whose_connection_closed_does_not_hold_the_group() {
    let (groups, _shutdown) = started();
    let first = groups.join("g", join("")).await.expect("joined");
    let assignment = vec![(first.member_id.clone(), Bytes::new())];
    groups
        .sync("g", &first.member_id, first.generation, assignment)
        .await
        .expect("sync");
    // A second member joins; its connection closes before the answer.
    let abandoned = tokio::time::timeout(Duration::from_secs(1), groups.join("g", join("")));
    assert!(
        abandoned.await.is_err(),
        "parked until the first member rejoins"
    );
    // The first member rejoins; the abandoned member is not waited for beyond its session.
    let start = Instant::now();
    let again = groups
        .join("g", join(&first.member_id))
        .await
        .expect("rejoined");
    assert_eq!(
        (again.generation, again.members.len()),
        (first.generation + 1, 1)
    );
    assert!(
        Instant::now() - start <= Duration::from_secs(10),
        "{:?}",
        Instant::now() - start
    );
}
