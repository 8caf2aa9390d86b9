//! MQTT shared subscriptions (`$share/{group}/{filter}`), served like Pulsar's subscription
//! types over the log (`shared`, `key_shared`, `failover`, `exclusive`, chosen per group by
//! `config::SharedTypes`). A group — one (group name, filter) pair — lives in the broker, not
//! in a connection: its dispatcher task (`dispatcher.rs`) owns the read positions of the
//! partitions the filter can match and a durable group cursor `mqtt.share:{group}/{filter}`
//! (the oldest unacknowledged offset), and hands each matching record to exactly one connected
//! member (`strategy.rs`) through a bounded channel; members acknowledge back (`member.rs`).
//! The registry here tracks which sessions hold a group's subscription, refuses a second
//! session of an exclusive group, resolves where a group starts (its cursor; a `tern-start`
//! for a new group; the earliest record when a restored group's cursor was lost; else the log
//! end) and makes that durable before the first member is told, starts dispatchers on the
//! first join and removes a group, cursor included, when no session holds it any more.
//!
//! It never writes records and never touches a socket; connections deliver what they are handed.

mod dispatcher;
mod group;
mod member;
mod strategy;
#[cfg(test)]
mod test;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Mutex, mpsc, oneshot};

use super::clip::clip;
use super::config::{SharedType, SharedTypes};
use super::replay::{self, Start, StartError};
use super::router::PartitionId;
use super::tasks::Tasks;
use super::topic::{self, TopicError, TopicLimits};
pub use dispatcher::Command;
pub use group::Delivery;
pub use member::{Member, Memberships};
use tern_log::{LogError, LogPort};

/// The prefix of group cursor names in the cursor store (session cursors are `mqtt:{id}`).
const CURSOR_PREFIX: &str = "mqtt.share:";
/// Commands queued per group before members wait to send an acknowledgement.
const COMMANDS: usize = 256;

/// One shared group: the share name and the topic filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShareKey {
    pub group: String,
    pub filter: String,
}

/// Why a `$share/` filter was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShareError {
    #[error("shared subscription needs `$share/{{group}}/{{filter}}`")]
    Shape,
    #[error("share name must not be empty nor contain `+` or `#`")]
    GroupName,
    #[error("shared subscription filter: {0}")]
    Filter(#[from] TopicError),
}

impl ShareKey {
    /// Parses and validates `$share/{group}/{filter}`.
    pub fn parse(full: &str, limits: &TopicLimits) -> Result<Self, ShareError> {
        topic::validate_filter(full, limits)?;
        let rest = full
            .strip_prefix(topic::SHARE_PREFIX)
            .ok_or(ShareError::Shape)?;
        let (group, filter) = rest.split_once('/').ok_or(ShareError::Shape)?;
        if group.is_empty() || group.contains(['+', '#']) {
            return Err(ShareError::GroupName);
        }
        topic::validate_filter(filter, limits)?;
        Ok(Self {
            group: group.to_owned(),
            filter: filter.to_owned(),
        })
    }

    /// The name of the group's positions in the cursor store.
    pub fn cursor_name(&self) -> String {
        format!("{CURSOR_PREFIX}{}/{}", self.group, self.filter)
    }
}

/// A running group: how to reach its dispatcher.
#[derive(Debug)]
struct Group {
    commands: mpsc::Sender<Command>,
}

#[derive(Debug, Default)]
struct Registry {
    groups: HashMap<ShareKey, Group>,
    /// Client ids of the sessions (connected or stored) holding each group's subscription.
    holders: HashMap<ShareKey, HashSet<String>>,
    /// Groups held by sessions restored at startup and not started since: each of their
    /// partitions had a cursor, so a missing one was lost.
    restored: HashSet<ShareKey>,
    /// Shutdown closed every group: none starts any more.
    closed: bool,
}

/// Why a session could not join a group; the text is the SUBACK's reason string.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    #[error("exclusive shared group {0:?} is held by another session")]
    Exclusive(String),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("the shared group cannot start: {0}")]
    Log(#[from] LogError),
    #[error("the shared group stopped")]
    Gone,
}

/// A session's new membership of a group.
#[derive(Debug)]
pub struct Joined {
    pub member: Member,
    /// Partitions where a requested start was not applied: the group's cursor continues.
    pub ignored: Vec<PartitionId>,
}

/// Every shared group of the broker.
#[derive(Debug)]
pub struct SharedGroups<S> {
    log: S,
    types: SharedTypes,
    registry: Mutex<Registry>,
    next_member: AtomicU64,
    /// The dispatcher task of every group, owned until it ends.
    dispatchers: Tasks,
}

impl<S: LogPort> SharedGroups<S> {
    pub fn new(log: S, types: SharedTypes) -> Self {
        Self {
            log,
            types,
            registry: Mutex::default(),
            next_member: AtomicU64::new(1),
            dispatchers: Tasks::default(),
        }
    }

    /// Records the shared subscriptions of the sessions restored at startup, then removes
    /// group cursors no stored session holds (left by clean sessions before a crash).
    pub async fn restore(
        &self,
        held: impl Iterator<Item = (String, String)>,
    ) -> Result<(), LogError> {
        let mut registry = self.registry.lock().await;
        for (client_id, filter) in held {
            if let Some(key) = parse_stored(&filter) {
                registry.restored.insert(key.clone());
                registry.holders.entry(key).or_default().insert(client_id);
            }
        }
        let live: HashSet<String> = registry.holders.keys().map(ShareKey::cursor_name).collect();
        for name in self.log.cursor_names() {
            if name.starts_with(CURSOR_PREFIX) && !live.contains(&name) {
                tracing::info!(cursor = %clip(&name), "removing the cursor of an abandoned shared group");
                self.log.remove_cursors(&name).await?;
            }
        }
        Ok(())
    }

    /// Joins a connection of `client_id` to the group of `key` with at most `window` records
    /// outstanding at a time, starting its dispatcher over `partitions` if it is not running
    /// (from `start` where the group has no cursor yet).
    pub async fn join(
        &self,
        key: &ShareKey,
        client_id: &str,
        partitions: Vec<PartitionId>,
        window: usize,
        start: Option<&Start>,
    ) -> Result<Joined, JoinError> {
        let id = self.next_member.fetch_add(1, Ordering::Relaxed);
        let kind = self.types.type_for(&key.group);
        let (tx, rx) = mpsc::channel(window.max(1));
        let mut ignored = Vec::new();
        let (commands, new_holder) = {
            let mut registry = self.registry.lock().await;
            let holders = registry.holders.get(key);
            if kind == SharedType::Exclusive
                && holders.is_some_and(|h| !h.is_empty() && !h.contains(client_id))
            {
                return Err(JoinError::Exclusive(key.group.clone()));
            }
            let new_holder = !holders.is_some_and(|h| h.contains(client_id));
            let commands = match registry.groups.get(key) {
                Some(group) => {
                    if start.is_some() {
                        ignored = partitions;
                    }
                    group.commands.clone()
                }
                None if registry.closed => return Err(JoinError::Gone),
                None => {
                    let restored = registry.restored.remove(key);
                    let starts = self
                        .starts(key, &partitions, start, restored, &mut ignored)
                        .await?;
                    let (commands, inbox) = mpsc::channel(COMMANDS);
                    let task = dispatcher::run(self.log.clone(), key.clone(), kind, starts, inbox);
                    if self.dispatchers.spawn(task).await.is_err() {
                        return Err(JoinError::Gone);
                    }
                    let group = Group {
                        commands: commands.clone(),
                    };
                    registry.groups.insert(key.clone(), group);
                    commands
                }
            };
            let holders = registry.holders.entry(key.clone()).or_default();
            holders.insert(client_id.to_owned());
            (commands, new_holder)
        };
        let join = Command::Join {
            member: id,
            client_id: client_id.to_owned(),
            window: window.max(1),
            tx,
        };
        if commands.send(join).await.is_err() {
            // The dispatcher could not start (logged); the next join starts a new one.
            let mut registry = self.registry.lock().await;
            if registry
                .groups
                .get(key)
                .is_some_and(|g| g.commands.is_closed())
            {
                registry.groups.remove(key);
            }
            if let Some(holders) = registry.holders.get_mut(key).filter(|_| new_holder) {
                holders.remove(client_id);
            }
            return Err(JoinError::Gone);
        }
        let member = Member::new(id, commands, rx);
        Ok(Joined { member, ignored })
    }

    /// Where a group that is not running starts in each partition, made durable as its cursor:
    /// the cursor it has (a requested start is then `ignored` there), else the requested start,
    /// else for a `restored` group (whose cursor was lost) the earliest retained record, else
    /// the log end.
    async fn starts(
        &self,
        key: &ShareKey,
        partitions: &[PartitionId],
        start: Option<&Start>,
        restored: bool,
        ignored: &mut Vec<PartitionId>,
    ) -> Result<BTreeMap<PartitionId, u64>, JoinError> {
        let name = key.cursor_name();
        let requested = match start {
            Some(start) => replay::resolve(start, &self.log, partitions)?,
            None => BTreeMap::new(),
        };
        let mut starts = BTreeMap::new();
        for partition in partitions {
            let (topic, p) = (&partition.0, partition.1);
            if let Some(offset) = self.log.cursor(&name, topic, p) {
                if start.is_some() {
                    ignored.push(partition.clone());
                }
                starts.insert(partition.clone(), offset);
                continue;
            }
            let (first, end) = self.log.offsets(topic, p)?;
            let offset = match requested.get(partition) {
                Some(offset) => *offset,
                None if restored => {
                    tracing::warn!(group = %clip(&key.group), filter = %clip(&key.filter), topic, partition = p, first, "the shared group's cursor is missing (lost with a damaged cursor log?): redelivering from the earliest retained record");
                    first
                }
                None => end,
            };
            self.log.commit_cursor(&name, topic, p, offset).await?;
            starts.insert(partition.clone(), offset);
        }
        Ok(starts)
    }

    /// Records that `client_id`'s session no longer holds `key`; the last holder's departure
    /// stops the group and removes its cursor.
    pub async fn release(&self, key: &ShareKey, client_id: &str) -> Result<(), LogError> {
        let mut registry = self.registry.lock().await;
        let Some(holders) = registry.holders.get_mut(key) else {
            return Ok(());
        };
        holders.remove(client_id);
        if !holders.is_empty() {
            return Ok(());
        }
        registry.holders.remove(key);
        registry.restored.remove(key);
        if let Some(group) = registry.groups.remove(key) {
            let (done, closed) = oneshot::channel();
            if group.commands.send(Command::Close { done }).await.is_ok() {
                let _ = closed.await;
            }
        }
        self.log.remove_cursors(&key.cursor_name()).await
    }

    /// Closes every running group (each dispatcher commits its cursor) and waits for the
    /// dispatchers to end; no group starts after it (shutdown, once no member is left).
    pub async fn close(&self) {
        let groups = {
            let mut registry = self.registry.lock().await;
            registry.closed = true;
            std::mem::take(&mut registry.groups)
        };
        for group in groups.into_values() {
            let (done, closed) = oneshot::channel();
            if group.commands.send(Command::Close { done }).await.is_ok() {
                let _ = closed.await;
            }
        }
        self.dispatchers.close().await;
    }

    /// Cancels the dispatchers still running and waits until each has stopped.
    pub async fn abort(&self) {
        self.dispatchers.abort().await;
    }

    /// Releases every shared subscription among a session's `filters` (the session ends).
    pub async fn release_all(&self, filters: &[String], client_id: &str) -> Result<(), LogError> {
        for key in filters.iter().filter_map(|f| parse_stored(f)) {
            self.release(&key, client_id).await?;
        }
        Ok(())
    }
}

/// A stored subscription filter's group, if shared (stored filters were validated already).
fn parse_stored(filter: &str) -> Option<ShareKey> {
    let rest = filter.strip_prefix(topic::SHARE_PREFIX)?;
    let (group, filter) = rest.split_once('/')?;
    Some(ShareKey {
        group: group.to_owned(),
        filter: filter.to_owned(),
    })
}
