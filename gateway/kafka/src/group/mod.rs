//! Kafka consumer groups on the listener (the classic protocol): tern is every group's
//! coordinator. [`Groups`] keeps each group's [`coordinator::Group`] behind one lock, parks the
//! JoinGroup and SyncGroup requests that must wait and wakes them with their answers, and runs
//! the timer task that ends sessions and join phases. A group's committed offsets are not kept
//! here: they are cursors in the log's cursor store ([`offsets`]), so they survive a restart
//! and hold retention; the membership itself is in memory and is rebuilt by the clients'
//! rejoin after a restart, as after a Kafka coordinator failover.
//!
//! It never awaits while holding the lock and never does I/O.

pub mod config;
pub mod coordinator;
pub mod offsets;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use coordinator::{Group, GroupError, Join, Joined, Limits, MemberView, Reply, State, Token};
use tern_core::shutdown::Shutdown;

/// Kafka's error code of a group answer (0 when it succeeded).
pub fn result_code<T>(result: &Result<T, GroupError>) -> i16 {
    result.as_ref().map_or_else(GroupError::code, |_| 0)
}

/// A group as DescribeGroups and ListGroups show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub state: State,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberView>,
}

#[derive(Debug, Default)]
struct Table {
    groups: BTreeMap<String, Group>,
    waiters: HashMap<Token, oneshot::Sender<Reply>>,
    next_token: Token,
}

impl Table {
    fn deliver(&mut self, replies: Vec<Reply>) {
        for reply in replies {
            let token = match &reply {
                Reply::Join(token, _) | Reply::Sync(token, _) => *token,
            };
            if let Some(waiter) = self.waiters.remove(&token) {
                // The requester may be gone (its connection closed); nothing to do then.
                let _ = waiter.send(reply);
            }
        }
    }
}

#[derive(Debug)]
struct Inner {
    table: Mutex<Table>,
    /// Woken when a deadline may have moved earlier.
    changed: Notify,
    limits: Limits,
    /// Makes member ids unique across restarts of the process.
    salt: String,
}

impl Inner {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every consumer group of the listener. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Groups {
    inner: Arc<Inner>,
}

/// Forgets a parked request whose future was dropped before its answer (the connection
/// closed), so the member's session can end.
struct Parked {
    inner: Arc<Inner>,
    group: String,
    token: Token,
    answered: bool,
}

impl Drop for Parked {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut table = self.inner.table();
        table.waiters.remove(&self.token);
        if let Some(group) = table.groups.get_mut(&self.group) {
            group.cancel(self.token);
        }
        drop(table);
        self.inner.changed.notify_one();
    }
}

impl Groups {
    pub fn new(limits: Limits) -> Self {
        let salt = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        Self {
            inner: Arc::new(Inner {
                table: Mutex::new(Table::default()),
                changed: Notify::new(),
                limits,
                salt: format!("{salt:x}"),
            }),
        }
    }

    /// Runs `f` on the group (created when missing), delivers the replies it returns and
    /// wakes the timer.
    fn with_group<T>(&self, id: &str, f: impl FnOnce(&mut Group, &mut Vec<Reply>) -> T) -> T {
        let mut table = self.inner.table();
        let group = table
            .groups
            .entry(id.to_owned())
            .or_insert_with(|| Group::new(self.inner.limits, &self.inner.salt));
        let mut replies = Vec::new();
        let out = f(group, &mut replies);
        table.deliver(replies);
        drop(table);
        self.inner.changed.notify_one();
        out
    }

    /// Parks a request under a new token and waits for its answer.
    async fn park(
        &self,
        id: &str,
        f: impl FnOnce(&mut Group, Instant, Token) -> Vec<Reply>,
    ) -> Option<Reply> {
        let (tx, rx) = oneshot::channel();
        let token = {
            let mut table = self.inner.table();
            table.next_token += 1;
            let token = table.next_token;
            table.waiters.insert(token, tx);
            token
        };
        let mut parked = Parked {
            inner: Arc::clone(&self.inner),
            group: id.to_owned(),
            token,
            answered: false,
        };
        self.with_group(id, |group, replies| {
            replies.extend(f(group, Instant::now(), token));
        });
        let reply = rx.await.ok();
        parked.answered = true;
        reply
    }

    /// JoinGroup: answers when the join phase ends.
    pub async fn join(&self, id: &str, join: Join) -> Result<Joined, GroupError> {
        match self
            .park(id, |g, now, token| g.join(now, join, token))
            .await
        {
            Some(Reply::Join(_, answer)) => answer,
            _ => Err(GroupError::RebalanceInProgress),
        }
    }

    /// SyncGroup: answers with the member's assignment once the leader sent them.
    pub async fn sync(
        &self,
        id: &str,
        member: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<Bytes, GroupError> {
        let parked = self.park(id, |g, now, token| {
            g.sync(now, member, generation, assignments, token)
        });
        match parked.await {
            Some(Reply::Sync(_, answer)) => answer,
            _ => Err(GroupError::RebalanceInProgress),
        }
    }

    pub fn heartbeat(&self, id: &str, member: &str, generation: i32) -> Result<(), GroupError> {
        self.with_group(id, |g, _| g.heartbeat(Instant::now(), member, generation))
    }

    pub fn leave(&self, id: &str, member: &str) -> Result<(), GroupError> {
        self.with_group(id, |g, replies| {
            let (left, more) = g.leave(Instant::now(), member);
            replies.extend(more);
            left
        })
    }

    /// Whether an OffsetCommit of `member` in `generation` is accepted now.
    pub fn check_commit(&self, id: &str, member: &str, generation: i32) -> Result<(), GroupError> {
        self.with_group(id, |g, _| {
            g.check_commit(Instant::now(), member, generation)
        })
    }

    /// The group as DescribeGroups shows it, if it has ever had a member since the start.
    pub fn view(&self, id: &str) -> Option<GroupView> {
        let table = self.inner.table();
        table.groups.get(id).map(|g| GroupView {
            state: g.state(),
            protocol_type: g.protocol_type().unwrap_or_default().to_owned(),
            protocol: g.protocol().unwrap_or_default().to_owned(),
            members: g.members(),
        })
    }

    /// Every group with members or parked requests, and its state.
    pub fn list(&self) -> Vec<(String, GroupView)> {
        let ids: Vec<String> = self.inner.table().groups.keys().cloned().collect();
        ids.into_iter()
            .filter_map(|id| self.view(&id).map(|view| (id, view)))
            .collect()
    }

    /// The members' subscription metadata (to refuse deleting offsets of a subscribed topic);
    /// `Err(NotEmpty)` is not returned here, only the metadata of a non-empty group.
    pub fn subscriptions(&self, id: &str) -> Vec<Bytes> {
        let table = self.inner.table();
        table
            .groups
            .get(id)
            .map(Group::members_metadata)
            .unwrap_or_default()
    }

    /// Forgets an empty group (DeleteGroups); `NotEmpty` while it has members.
    pub fn delete(&self, id: &str) -> Result<(), GroupError> {
        let mut table = self.inner.table();
        match table.groups.get(id) {
            Some(group) => group.check_empty()?,
            None => return Ok(()),
        }
        table.groups.remove(id);
        Ok(())
    }

    /// Ends sessions and join phases as their deadlines pass, until `shutdown`.
    pub async fn run_timer(self, mut shutdown: Shutdown) {
        loop {
            let next = self.tick(Instant::now());
            let changed = self.inner.changed.notified();
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.wait() => break,
                () = changed => {}
                () = sleep => {}
            }
        }
    }

    /// Runs every group's due work, forgets groups with nothing left, and returns the next
    /// deadline.
    fn tick(&self, now: Instant) -> Option<Instant> {
        let mut table = self.inner.table();
        let mut replies = Vec::new();
        for group in table.groups.values_mut() {
            if group.next_deadline().is_some_and(|at| at <= now) {
                replies.extend(group.tick(now));
            }
        }
        table
            .groups
            .retain(|_, g| !(g.is_idle() && g.state() == State::Empty));
        table.deliver(replies);
        table.groups.values().filter_map(Group::next_deadline).min()
    }
}

#[cfg(test)]
mod test;
