use super::*;
use tokio::time::advance;

const SESSION: Duration = Duration::from_secs(10);
const REBALANCE: Duration = Duration::from_secs(30);

fn limits() -> Limits {
    Limits {
        initial_delay: Duration::from_secs(3),
        ..Limits::default()
    }
}

fn join_as(member_id: &str, protocols: &[&str]) -> Join {
    Join {
        member_id: member_id.to_owned(),
        client_id: "client".to_owned(),
        client_host: "/127.0.0.1".to_owned(),
        session_timeout: SESSION,
        rebalance_timeout: REBALANCE,
        protocol_type: "consumer".to_owned(),
        protocols: protocols
            .iter()
            .map(|p| ((*p).to_owned(), Bytes::from(format!("{member_id}:{p}"))))
            .collect(),
        require_known_member_id: false,
    }
}

fn joined(replies: &[Reply], token: Token) -> Joined {
    let found = replies.iter().find_map(|r| match r {
        Reply::Join(t, Ok(j)) if *t == token => Some(j.clone()),
        _ => None,
    });
    found.unwrap_or_else(|| panic!("no join answer for {token} in {replies:?}"))
}

fn synced(replies: &[Reply], token: Token) -> Result<Bytes, GroupError> {
    let found = replies.iter().find_map(|r| match r {
        Reply::Sync(t, answer) if *t == token => Some(answer.clone()),
        _ => None,
    });
    found.unwrap_or_else(|| panic!("no sync answer for {token} in {replies:?}"))
}

/// Joins `n` new members (tokens 1..=n), waits out the initial delay and returns their ids
/// and generation; member 1 is the leader.
async fn form(group: &mut Group, n: u64) -> (Vec<String>, i32) {
    let mut replies = Vec::new();
    for token in 1..=n {
        replies.extend(group.join(Instant::now(), join_as("", &["range"]), token));
    }
    assert!(
        replies.is_empty(),
        "the initial delay holds the join: {replies:?}"
    );
    advance(Duration::from_secs(3)).await;
    replies.extend(group.tick(Instant::now()));
    let answers: Vec<Joined> = (1..=n).map(|t| joined(&replies, t)).collect();
    let generation = answers.first().map(|j| j.generation).unwrap_or_default();
    (
        answers.into_iter().map(|j| j.member_id).collect(),
        generation,
    )
}

fn stabilise(group: &mut Group, ids: &[String], generation: i32) {
    let assignments = ids
        .iter()
        .map(|id| (id.clone(), Bytes::from(format!("parts of {id}"))))
        .collect();
    let leader = ids.first().expect("a leader");
    let replies = group.sync(Instant::now(), leader, generation, assignments, 100);
    assert_eq!(
        synced(&replies, 100),
        Ok(Bytes::from(format!("parts of {leader}")))
    );
    assert_eq!(group.state(), State::Stable);
}

#[tokio::test(start_paused = true)]
async fn three_members_join_after_the_initial_delay_and_the_leader_assigns() {
    let mut group = Group::new(limits(), "s");
    let now = Instant::now();
    assert!(group.join(now, join_as("", &["range"]), 1).is_empty());
    advance(Duration::from_secs(2)).await;
    assert!(
        group
            .join(Instant::now(), join_as("", &["range"]), 2)
            .is_empty()
    );
    assert!(
        group
            .join(Instant::now(), join_as("", &["range"]), 3)
            .is_empty()
    );
    // Each join extended the delay: 3 s after the last one, not after the first.
    assert!(group.tick(now + Duration::from_secs(3)).is_empty());
    assert_eq!(group.state(), State::PreparingRebalance);
    assert_eq!(
        group.next_deadline(),
        Some(Instant::now() + Duration::from_secs(3))
    );
    advance(Duration::from_secs(3)).await;
    let replies = group.tick(Instant::now());
    let answers: Vec<Joined> = (1..=3).map(|t| joined(&replies, t)).collect();
    let leader = answers.first().map(|j| j.member_id.clone()).expect("first");
    for answer in &answers {
        assert_eq!((answer.generation, answer.protocol.as_str()), (1, "range"));
        assert_eq!(answer.leader, leader);
        let expected = if answer.member_id == leader { 3 } else { 0 };
        assert_eq!(answer.members.len(), expected, "{answer:?}");
    }
    assert_eq!(group.state(), State::CompletingRebalance);

    let follower = answers.get(1).map(|j| j.member_id.clone()).expect("second");
    assert!(
        group
            .sync(Instant::now(), &follower, 1, Vec::new(), 11)
            .is_empty()
    );
    let ids: Vec<String> = answers.iter().map(|j| j.member_id.clone()).collect();
    let assignments = ids
        .iter()
        .map(|id| (id.clone(), Bytes::from(id.clone())))
        .collect();
    let replies = group.sync(Instant::now(), &leader, 1, assignments, 10);
    assert_eq!(synced(&replies, 11), Ok(Bytes::from(follower.clone())));
    assert_eq!(synced(&replies, 10), Ok(Bytes::from(leader.clone())));
    assert_eq!(group.state(), State::Stable);
    let third = ids.get(2).expect("third");
    let late = group.sync(Instant::now(), third, 1, Vec::new(), 12);
    assert_eq!(synced(&late, 12), Ok(Bytes::from(third.clone())));
    let views = group.members();
    assert!(views.iter().all(|v| v.assignment == v.member_id.as_bytes()));
}

#[tokio::test(start_paused = true)]
async fn a_new_member_of_join_v4_first_gets_its_id() {
    let mut group = Group::new(
        Limits {
            initial_delay: Duration::ZERO,
            ..limits()
        },
        "s",
    );
    let mut join = join_as("", &["range"]);
    join.require_known_member_id = true;
    let replies = group.join(Instant::now(), join.clone(), 1);
    let [Reply::Join(1, Err(GroupError::MemberIdRequired(id)))] = replies.as_slice() else {
        panic!("{replies:?}");
    };
    assert_eq!(group.state(), State::Empty);
    join.member_id = id.clone();
    let replies = group.join(Instant::now(), join, 2);
    assert_eq!(joined(&replies, 2).member_id, *id);
    // An id handed out but never used expires with the session timeout.
    let mut other = join_as("", &["range"]);
    other.require_known_member_id = true;
    assert_eq!(group.join(Instant::now(), other, 3).len(), 1);
    assert!(!group.is_idle());
    group.leave(Instant::now(), id).0.expect("leave");
    group.tick(Instant::now() + SESSION);
    assert!(group.is_idle());
}

#[tokio::test(start_paused = true)]
async fn the_protocol_every_member_supports_with_the_most_votes_is_chosen() {
    let mut group = Group::new(limits(), "s");
    let now = Instant::now();
    group.join(now, join_as("", &["cooperative-sticky", "range"]), 1);
    group.join(
        now,
        join_as("", &["roundrobin", "range", "cooperative-sticky"]),
        2,
    );
    group.join(now, join_as("", &["range", "cooperative-sticky"]), 3);
    let replies = group.tick(now + Duration::from_secs(3));
    // Votes: cooperative-sticky 1 (member 1), range 1 (member 3), and member 2's first
    // common choice, range: range has two.
    assert_eq!(joined(&replies, 1).protocol, "range");
    let leader = joined(&replies, 1);
    // Every member's metadata of the chosen protocol (joined as new members: ":range").
    let metadata: Vec<&[u8]> = leader.members.iter().map(|(_, m)| m.as_ref()).collect();
    assert_eq!(metadata, vec![b":range"; 3]);

    let refused = group.join(now, join_as("", &["roundrobin"]), 4);
    assert_eq!(
        refused,
        vec![Reply::Join(4, Err(GroupError::InconsistentProtocol))]
    );
    let mut other_type = join_as("", &["range"]);
    other_type.protocol_type = "connect".to_owned();
    let refused = group.join(now, other_type, 5);
    assert_eq!(
        refused,
        vec![Reply::Join(5, Err(GroupError::InconsistentProtocol))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_that_stops_heartbeating_is_removed_and_the_rest_rebalance() {
    let mut group = Group::new(limits(), "s");
    let (ids, generation) = form(&mut group, 3).await;
    stabilise(&mut group, &ids, generation);
    let [a, b, dead] = ids.as_slice() else {
        panic!("{ids:?}")
    };
    let start = Instant::now();
    assert_eq!(group.next_deadline(), Some(start + SESSION));
    while group.is_member(dead) {
        advance(Duration::from_secs(3)).await;
        group.heartbeat(Instant::now(), a, generation).expect("a");
        group.heartbeat(Instant::now(), b, generation).expect("b");
        assert!(group.tick(Instant::now()).is_empty());
    }
    // Removed at the first tick after its 10 s session: 12 s without a heartbeat.
    assert_eq!(Instant::now() - start, Duration::from_secs(12));
    assert_eq!(group.state(), State::PreparingRebalance);
    assert_eq!(
        group.heartbeat(Instant::now(), a, generation),
        Err(GroupError::RebalanceInProgress)
    );
    let mut replies = group.join(Instant::now(), join_as(a, &["range"]), 20);
    replies.extend(group.join(Instant::now(), join_as(b, &["range"]), 21));
    let answer = joined(&replies, 20);
    assert_eq!(
        (answer.generation, answer.members.len()),
        (generation + 1, 2)
    );
    assert_eq!(answer.leader, *a, "the leader stays leader");
    assert_eq!(
        group.sync(Instant::now(), b, generation, Vec::new(), 22),
        vec![Reply::Sync(22, Err(GroupError::IllegalGeneration))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_missing_the_rebalance_timeout_is_dropped_from_the_generation() {
    let mut group = Group::new(limits(), "s");
    let (ids, generation) = form(&mut group, 2).await;
    stabilise(&mut group, &ids, generation);
    let [a, slow] = ids.as_slice() else {
        panic!("{ids:?}")
    };
    // `a` rejoins (say, its subscription changed); `slow` keeps heartbeating but never joins.
    let mut protocols = join_as(a, &["range"]);
    protocols.protocols = vec![("range".to_owned(), Bytes::from_static(b"new"))];
    assert!(group.join(Instant::now(), protocols, 30).is_empty());
    let mut answered = Vec::new();
    for _ in 0..10 {
        advance(Duration::from_secs(5)).await;
        let beat = group.heartbeat(Instant::now(), slow, generation);
        answered.extend(group.tick(Instant::now()));
        if !answered.is_empty() {
            assert_eq!(beat, Err(GroupError::RebalanceInProgress));
            break;
        }
    }
    let answer = joined(&answered, 30);
    assert_eq!(
        answer.members,
        vec![(a.clone(), Bytes::from_static(b"new"))]
    );
    assert!(!group.is_member(slow));
    assert_eq!(
        group.heartbeat(Instant::now(), slow, answer.generation),
        Err(GroupError::UnknownMember)
    );
}

#[tokio::test(start_paused = true)]
async fn leaving_rebalances_the_rest_and_the_last_leaves_an_empty_group() {
    let mut group = Group::new(limits(), "s");
    let (ids, generation) = form(&mut group, 2).await;
    stabilise(&mut group, &ids, generation);
    let [a, b] = ids.as_slice() else {
        panic!("{ids:?}")
    };
    let (left, replies) = group.leave(Instant::now(), b);
    assert_eq!((left, replies), (Ok(()), Vec::new()));
    assert_eq!(group.state(), State::PreparingRebalance);
    let replies = group.join(Instant::now(), join_as(a, &["range"]), 40);
    assert_eq!(
        joined(&replies, 40).members.len(),
        1,
        "no delay once the group has members"
    );
    assert_eq!(
        group.leave(Instant::now(), b).0,
        Err(GroupError::UnknownMember)
    );
    group.leave(Instant::now(), a).0.expect("leave");
    assert_eq!(group.state(), State::Empty);
    assert!(group.is_idle());
    assert_eq!(group.check_empty(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn commits_need_the_current_generation_or_an_empty_group() {
    let mut group = Group::new(limits(), "s");
    assert_eq!(group.check_commit(Instant::now(), "", -1), Ok(()));
    let (ids, generation) = form(&mut group, 1).await;
    let id = ids.first().expect("member");
    assert_eq!(
        group.check_commit(Instant::now(), id, generation),
        Err(GroupError::RebalanceInProgress)
    );
    stabilise(&mut group, &ids, generation);
    assert_eq!(group.check_commit(Instant::now(), id, generation), Ok(()));
    assert_eq!(
        group.check_commit(Instant::now(), id, generation - 1),
        Err(GroupError::IllegalGeneration)
    );
    assert_eq!(
        group.check_commit(Instant::now(), "stranger", generation),
        Err(GroupError::UnknownMember)
    );
    assert_eq!(
        group.check_commit(Instant::now(), "", -1),
        Err(GroupError::UnknownMember)
    );
    assert_eq!(group.check_empty(), Err(GroupError::NotEmpty));
}

#[tokio::test(start_paused = true)]
async fn a_session_timeout_outside_the_limits_is_refused() {
    let mut group = Group::new(limits(), "s");
    let mut join = join_as("", &["range"]);
    join.session_timeout = Duration::from_secs(1);
    assert_eq!(
        group.join(Instant::now(), join, 1),
        vec![Reply::Join(1, Err(GroupError::InvalidSessionTimeout))]
    );
    assert!(group.is_idle());
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_join_is_forgotten_and_its_member_expires() {
    let mut group = Group::new(limits(), "s");
    let (ids, generation) = form(&mut group, 3).await;
    stabilise(&mut group, &ids, generation);
    let [a, b, c] = ids.as_slice() else {
        panic!("{ids:?}")
    };
    assert!(
        group
            .join(Instant::now(), join_as(a, &["range"]), 50)
            .is_empty()
    );
    // b's connection closed while its rejoin was parked; c is gone without a word.
    assert!(
        group
            .join(Instant::now(), join_as(b, &["range"]), 51)
            .is_empty()
    );
    group.cancel(51);
    assert_eq!(group.next_deadline(), Some(Instant::now() + SESSION));
    advance(SESSION).await;
    let replies = group.tick(Instant::now());
    let answer = joined(&replies, 50);
    assert!(!group.is_member(b) && !group.is_member(c));
    assert_eq!(answer.members.len(), 1);
}
