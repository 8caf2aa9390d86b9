//! One consumer group of Kafka's classic group protocol as a pure state machine: members and
//! their sessions, generations, the choice of a protocol (assignor) every member supports, the
//! rebalance (join phase bounded by the rebalance timeout, then sync), and who may commit.
//!
//! It does no I/O and never reads a clock: every call takes `now`, a request that must wait
//! (JoinGroup until the join phase ends, SyncGroup until the leader's assignment) is parked
//! under the caller's [`Token`] and answered later through the [`Reply`] list a call returns.
//! The caller runs [`Group::tick`] at [`Group::next_deadline`]. Assignments are opaque bytes:
//! the assignors (range, roundrobin, cooperative-sticky) run in the clients.

use std::collections::BTreeMap;

use bytes::Bytes;
use tokio::time::{Duration, Instant};

/// Identifies a parked request; chosen by the caller.
pub type Token = u64;

/// A group's state, named as Kafka's DescribeGroups and ListGroups name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No members (offsets may still be committed).
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    /// Every member has its assignment.
    Stable,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::PreparingRebalance => "PreparingRebalance",
            Self::CompletingRebalance => "CompletingRebalance",
            Self::Stable => "Stable",
        }
    }
}

/// Why a group request is refused; each maps to one Kafka error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupError {
    UnknownMember,
    IllegalGeneration,
    RebalanceInProgress,
    InconsistentProtocol,
    InvalidSessionTimeout,
    /// KIP-394: the member must join again with this id.
    MemberIdRequired(String),
    NotEmpty,
}

impl GroupError {
    /// Kafka's error code.
    pub fn code(&self) -> i16 {
        match self {
            Self::IllegalGeneration => 22,
            Self::InconsistentProtocol => 23,
            Self::UnknownMember => 25,
            Self::InvalidSessionTimeout => 26,
            Self::RebalanceInProgress => 27,
            Self::NotEmpty => 68,
            Self::MemberIdRequired(_) => 79,
        }
    }
}

/// Limits the coordinator applies (Kafka's broker settings of the same meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `group.min.session.timeout.ms`.
    pub min_session: Duration,
    /// `group.max.session.timeout.ms`.
    pub max_session: Duration,
    /// `group.initial.rebalance.delay.ms`: how long the first join of an empty group waits
    /// for more members (each new member extends it, up to the rebalance timeout).
    pub initial_delay: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            min_session: Duration::from_secs(6),
            max_session: Duration::from_secs(1800),
            initial_delay: Duration::from_secs(3),
        }
    }
}

/// A JoinGroup request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Join {
    /// Empty for a new member.
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    /// (name, metadata), in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4 and later: a new member first gets its id with `MemberIdRequired`.
    pub require_known_member_id: bool,
}

/// What a member learns when the join phase ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// Every member's metadata for the chosen protocol, for the leader only (empty otherwise).
    pub members: Vec<(String, Bytes)>,
}

/// An answer to a parked request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Join(Token, Result<Joined, GroupError>),
    /// The member's assignment.
    Sync(Token, Result<Bytes, GroupError>),
}

/// One member as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    /// Metadata of the chosen protocol and the assignment (empty unless the group is stable).
    pub metadata: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug)]
struct Member {
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    /// The session ends here unless a request from the member moves it.
    expires: Instant,
    awaiting_join: Option<Token>,
    awaiting_sync: Option<Token>,
}

impl Member {
    fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, meta)| meta.clone())
            .unwrap_or_default()
    }

    fn supports(&self, protocol: &str) -> bool {
        self.protocols.iter().any(|(name, _)| name == protocol)
    }
}

/// One consumer group.
#[derive(Debug)]
pub struct Group {
    state: State,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Ids handed out with `MemberIdRequired`, valid until their deadline.
    pending: BTreeMap<String, Instant>,
    /// When the join phase ends at the latest, and (for a group that was empty) when the
    /// initial delay ends.
    join_deadline: Option<Instant>,
    delay_until: Option<Instant>,
    limits: Limits,
    /// Prefix of new member ids (unique per process) and a counter.
    id_salt: String,
    next_id: u64,
}

impl Group {
    pub fn new(limits: Limits, id_salt: &str) -> Self {
        Self {
            state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
            join_deadline: None,
            delay_until: None,
            limits,
            id_salt: id_salt.to_owned(),
            next_id: 0,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    /// The chosen protocol while the group is stable or completing its rebalance.
    pub fn protocol(&self) -> Option<&str> {
        match self.state {
            State::Stable | State::CompletingRebalance => self.protocol.as_deref(),
            _ => None,
        }
    }

    #[cfg(test)]
    pub fn is_member(&self, member_id: &str) -> bool {
        self.members.contains_key(member_id)
    }

    /// Whether the group has neither members nor parked requests (it may be forgotten once it
    /// also has no committed offsets).
    pub fn is_idle(&self) -> bool {
        self.members.is_empty() && self.pending.is_empty()
    }

    /// Members, with metadata and assignments once the group is stable.
    pub fn members(&self) -> Vec<MemberView> {
        let stable = self.state == State::Stable;
        let protocol = self.protocol.as_deref().unwrap_or_default();
        self.members
            .iter()
            .map(|(id, m)| MemberView {
                member_id: id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: if stable {
                    m.metadata(protocol)
                } else {
                    Bytes::new()
                },
                assignment: if stable {
                    m.assignment.clone()
                } else {
                    Bytes::new()
                },
            })
            .collect()
    }

    /// The earliest time [`Group::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let sessions = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none() && m.awaiting_sync.is_none())
            .map(|m| m.expires);
        let join = match self.state {
            State::PreparingRebalance => self.delay_until.or(self.join_deadline),
            _ => None,
        };
        sessions
            .chain(self.pending.values().copied())
            .chain(join)
            .min()
    }

    /// Handles a JoinGroup; the answer comes in the returned replies, now or later.
    pub fn join(&mut self, now: Instant, join: Join, token: Token) -> Vec<Reply> {
        let session = join.session_timeout;
        if session < self.limits.min_session || session > self.limits.max_session {
            return vec![Reply::Join(token, Err(GroupError::InvalidSessionTimeout))];
        }
        if !self.compatible(&join) {
            return vec![Reply::Join(token, Err(GroupError::InconsistentProtocol))];
        }
        if join.member_id.is_empty() {
            let id = self.new_member_id(&join.client_id);
            if join.require_known_member_id {
                self.pending.insert(id.clone(), now + session);
                return vec![Reply::Join(token, Err(GroupError::MemberIdRequired(id)))];
            }
            return self.add_member(now, id, join, token);
        }
        if self.pending.remove(&join.member_id).is_some() {
            let id = join.member_id.clone();
            return self.add_member(now, id, join, token);
        }
        self.rejoin(now, join, token)
    }

    fn compatible(&self, join: &Join) -> bool {
        if join.protocols.is_empty() || join.protocol_type.is_empty() {
            return false;
        }
        if self.members.is_empty() {
            return true;
        }
        self.protocol_type.as_deref() == Some(join.protocol_type.as_str())
            && join
                .protocols
                .iter()
                .any(|(name, _)| self.members.values().all(|m| m.supports(name)))
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        self.next_id += 1;
        format!("{client_id}-{}-{}", self.id_salt, self.next_id)
    }

    fn add_member(&mut self, now: Instant, id: String, join: Join, token: Token) -> Vec<Reply> {
        let was_empty = self.members.is_empty();
        if was_empty {
            self.protocol_type = Some(join.protocol_type.clone());
        }
        let member = Member {
            client_id: join.client_id,
            client_host: join.client_host,
            session_timeout: join.session_timeout,
            rebalance_timeout: join.rebalance_timeout,
            protocols: join.protocols,
            assignment: Bytes::new(),
            expires: now + join.session_timeout,
            awaiting_join: Some(token),
            awaiting_sync: None,
        };
        self.members.insert(id, member);
        let mut replies = Vec::new();
        if self.state == State::PreparingRebalance {
            self.extend_initial_delay(now);
        } else {
            replies.extend(self.prepare_rebalance(now, was_empty));
        }
        replies.extend(self.try_complete_join(now));
        replies
    }

    fn rejoin(&mut self, now: Instant, join: Join, token: Token) -> Vec<Reply> {
        let state = self.state;
        let leader = self.leader.clone();
        let protocol = self.protocol.clone();
        let generation = self.generation;
        let protocol_type = self.protocol_type.clone().unwrap_or_default();
        let Some(member) = self.members.get_mut(&join.member_id) else {
            return vec![Reply::Join(token, Err(GroupError::UnknownMember))];
        };
        member.expires = now + join.session_timeout;
        member.session_timeout = join.session_timeout;
        member.rebalance_timeout = join.rebalance_timeout;
        let unchanged = member.protocols == join.protocols;
        member.protocols = join.protocols;
        let mut replies = Vec::new();
        if let Some(old) = member.awaiting_join.replace(token) {
            replies.push(Reply::Join(old, Err(GroupError::RebalanceInProgress)));
        }
        let is_leader = leader.as_deref() == Some(join.member_id.as_str());
        if state == State::Stable && unchanged && !is_leader {
            // A follower asking again without a change: answer with the current generation.
            member.awaiting_join = None;
            let joined = Joined {
                generation,
                protocol_type,
                protocol: protocol.unwrap_or_default(),
                leader: leader.unwrap_or_default(),
                member_id: join.member_id,
                members: Vec::new(),
            };
            replies.push(Reply::Join(token, Ok(joined)));
            return replies;
        }
        if state != State::PreparingRebalance {
            replies.extend(self.prepare_rebalance(now, false));
        }
        replies.extend(self.try_complete_join(now));
        replies
    }

    /// Starts a join phase: parked syncs are told to rejoin, the deadline is the longest
    /// rebalance timeout of the members.
    fn prepare_rebalance(&mut self, now: Instant, was_empty: bool) -> Vec<Reply> {
        let mut replies = Vec::new();
        for member in self.members.values_mut() {
            if let Some(token) = member.awaiting_sync.take() {
                replies.push(Reply::Sync(token, Err(GroupError::RebalanceInProgress)));
            }
            member.assignment = Bytes::new();
        }
        let longest = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
        self.state = State::PreparingRebalance;
        self.join_deadline = Some(now + longest);
        self.delay_until = (was_empty && !self.limits.initial_delay.is_zero())
            .then(|| (now + self.limits.initial_delay).min(now + longest));
        replies
    }

    fn extend_initial_delay(&mut self, now: Instant) {
        if let (Some(_), Some(deadline)) = (self.delay_until, self.join_deadline) {
            self.delay_until = Some((now + self.limits.initial_delay).min(deadline));
        }
    }

    /// Ends the join phase once every member has rejoined (and any initial delay is over).
    fn try_complete_join(&mut self, now: Instant) -> Vec<Reply> {
        if self.state != State::PreparingRebalance {
            return Vec::new();
        }
        if self.delay_until.is_some_and(|until| now < until) {
            return Vec::new();
        }
        self.delay_until = None;
        let all_joined = self.members.values().all(|m| m.awaiting_join.is_some());
        if all_joined || self.join_deadline.is_some_and(|d| now >= d) {
            return self.complete_join(now);
        }
        Vec::new()
    }

    fn complete_join(&mut self, now: Instant) -> Vec<Reply> {
        self.members.retain(|_, m| m.awaiting_join.is_some());
        self.join_deadline = None;
        self.generation += 1;
        if self.members.is_empty() {
            self.become_empty();
            return Vec::new();
        }
        let protocol = self.select_protocol();
        let leader = match &self.leader {
            Some(id) if self.members.contains_key(id) => id.clone(),
            _ => self.members.keys().next().cloned().unwrap_or_default(),
        };
        let everyone: Vec<(String, Bytes)> = self
            .members
            .iter()
            .map(|(id, m)| (id.clone(), m.metadata(&protocol)))
            .collect();
        let protocol_type = self.protocol_type.clone().unwrap_or_default();
        let mut replies = Vec::new();
        for (id, member) in &mut self.members {
            member.expires = now + member.session_timeout;
            let Some(token) = member.awaiting_join.take() else {
                continue;
            };
            let joined = Joined {
                generation: self.generation,
                protocol_type: protocol_type.clone(),
                protocol: protocol.clone(),
                leader: leader.clone(),
                member_id: id.clone(),
                members: if *id == leader {
                    everyone.clone()
                } else {
                    Vec::new()
                },
            };
            replies.push(Reply::Join(token, Ok(joined)));
        }
        self.protocol = Some(protocol);
        self.leader = Some(leader);
        self.state = State::CompletingRebalance;
        replies
    }

    fn become_empty(&mut self) {
        self.state = State::Empty;
        self.protocol = None;
        self.protocol_type = None;
        self.leader = None;
        self.delay_until = None;
        self.join_deadline = None;
    }

    /// Kafka's choice: among the protocols every member supports, each member votes for the
    /// first of its own list; the most votes win, ties going to the leader's (or first
    /// member's) preference.
    fn select_protocol(&self) -> String {
        let first = self
            .leader
            .as_ref()
            .and_then(|id| self.members.get(id))
            .or_else(|| self.members.values().next());
        let Some(first) = first else {
            return String::new();
        };
        let candidates: Vec<&str> = first
            .protocols
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| self.members.values().all(|m| m.supports(name)))
            .collect();
        let votes = |candidate: &str| {
            self.members
                .values()
                .filter(|m| {
                    m.protocols
                        .iter()
                        .map(|(name, _)| name.as_str())
                        .find(|name| candidates.contains(name))
                        == Some(candidate)
                })
                .count()
        };
        let mut best: Option<(&str, usize)> = None;
        for candidate in &candidates {
            let count = votes(candidate);
            if best.is_none_or(|(_, most)| count > most) {
                best = Some((candidate, count));
            }
        }
        best.map(|(name, _)| name.to_owned()).unwrap_or_default()
    }

    /// Handles a SyncGroup; the leader's carries every member's assignment.
    pub fn sync(
        &mut self,
        now: Instant,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
        token: Token,
    ) -> Vec<Reply> {
        let state = self.state;
        let is_leader = self.leader.as_deref() == Some(member_id);
        let current = self.generation;
        let Some(member) = self.members.get_mut(member_id) else {
            return vec![Reply::Sync(token, Err(GroupError::UnknownMember))];
        };
        if generation != current {
            return vec![Reply::Sync(token, Err(GroupError::IllegalGeneration))];
        }
        member.expires = now + member.session_timeout;
        match state {
            State::PreparingRebalance | State::Empty => {
                vec![Reply::Sync(token, Err(GroupError::RebalanceInProgress))]
            }
            State::Stable => vec![Reply::Sync(token, Ok(member.assignment.clone()))],
            State::CompletingRebalance => {
                let mut replies = Vec::new();
                if let Some(old) = member.awaiting_sync.replace(token) {
                    replies.push(Reply::Sync(old, Err(GroupError::RebalanceInProgress)));
                }
                if is_leader {
                    replies.extend(self.complete_sync(now, assignments));
                }
                replies
            }
        }
    }

    fn complete_sync(&mut self, now: Instant, assignments: Vec<(String, Bytes)>) -> Vec<Reply> {
        let mut given: BTreeMap<String, Bytes> = assignments.into_iter().collect();
        let mut replies = Vec::new();
        for (id, member) in &mut self.members {
            member.assignment = given.remove(id).unwrap_or_default();
            member.expires = now + member.session_timeout;
            if let Some(token) = member.awaiting_sync.take() {
                replies.push(Reply::Sync(token, Ok(member.assignment.clone())));
            }
        }
        self.state = State::Stable;
        replies
    }

    /// Handles a Heartbeat.
    pub fn heartbeat(
        &mut self,
        now: Instant,
        member_id: &str,
        generation: i32,
    ) -> Result<(), GroupError> {
        match self.touch(now, member_id, generation)? {
            State::PreparingRebalance => Err(GroupError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// A member of the current generation is heard from: its session starts again. Returns the
    /// group's state; an unknown member or another generation is refused.
    fn touch(
        &mut self,
        now: Instant,
        member_id: &str,
        generation: i32,
    ) -> Result<State, GroupError> {
        let current = self.generation;
        let member = self
            .members
            .get_mut(member_id)
            .ok_or(GroupError::UnknownMember)?;
        if generation != current {
            return Err(GroupError::IllegalGeneration);
        }
        member.expires = now + member.session_timeout;
        Ok(self.state)
    }

    /// Handles a LeaveGroup of one member; the rest of the group rebalances.
    pub fn leave(&mut self, now: Instant, member_id: &str) -> (Result<(), GroupError>, Vec<Reply>) {
        if self.pending.remove(member_id).is_some() {
            return (Ok(()), Vec::new());
        }
        match self.remove_member(now, member_id) {
            Some(replies) => (Ok(()), replies),
            None => (Err(GroupError::UnknownMember), Vec::new()),
        }
    }

    fn remove_member(&mut self, now: Instant, member_id: &str) -> Option<Vec<Reply>> {
        let member = self.members.remove(member_id)?;
        let mut replies = Vec::new();
        if let Some(token) = member.awaiting_join {
            replies.push(Reply::Join(token, Err(GroupError::UnknownMember)));
        }
        if let Some(token) = member.awaiting_sync {
            replies.push(Reply::Sync(token, Err(GroupError::UnknownMember)));
        }
        match self.state {
            State::Stable | State::CompletingRebalance => {
                replies.extend(self.prepare_rebalance(now, false));
                replies.extend(self.try_complete_join(now));
            }
            State::PreparingRebalance => replies.extend(self.try_complete_join(now)),
            State::Empty => {}
        }
        if self.members.is_empty() && self.state == State::PreparingRebalance {
            self.generation += 1;
            self.become_empty();
        }
        Some(replies)
    }

    /// Whether `member_id` in `generation` may commit offsets now (an empty group accepts the
    /// commits of tools and of consumers assigning partitions themselves: generation -1, no
    /// member id).
    pub fn check_commit(
        &mut self,
        now: Instant,
        member_id: &str,
        generation: i32,
    ) -> Result<(), GroupError> {
        if generation < 0 && member_id.is_empty() {
            return match self.state {
                State::Empty => Ok(()),
                _ => Err(GroupError::UnknownMember),
            };
        }
        match self.touch(now, member_id, generation)? {
            State::CompletingRebalance => Err(GroupError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// Whether the group may be deleted (DeleteGroups, and OffsetDelete of a subscribed topic).
    pub fn check_empty(&self) -> Result<(), GroupError> {
        match self.state {
            State::Empty => Ok(()),
            _ => Err(GroupError::NotEmpty),
        }
    }

    /// Topics the members' consumer-protocol subscriptions name (for OffsetDelete).
    pub fn members_metadata(&self) -> Vec<Bytes> {
        let protocol = self.protocol.as_deref().unwrap_or_default();
        self.members
            .values()
            .map(|m| m.metadata(protocol))
            .collect()
    }

    /// A token's request was abandoned (its connection closed): forget it, so a later reply
    /// goes nowhere; the member itself stays until its session ends.
    pub fn cancel(&mut self, token: Token) {
        for member in self.members.values_mut() {
            if member.awaiting_join == Some(token) {
                member.awaiting_join = None;
            }
            if member.awaiting_sync == Some(token) {
                member.awaiting_sync = None;
            }
        }
    }

    /// Ends expired sessions and join phases.
    pub fn tick(&mut self, now: Instant) -> Vec<Reply> {
        self.pending.retain(|_, until| *until > now);
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.awaiting_join.is_none() && m.awaiting_sync.is_none())
            .filter(|(_, m)| m.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        let mut replies = Vec::new();
        for id in expired {
            tracing::info!(member = %id, "consumer group member's session expired");
            replies.extend(self.remove_member(now, &id).unwrap_or_default());
        }
        replies.extend(self.try_complete_join(now));
        replies
    }
}

#[cfg(test)]
mod test;
