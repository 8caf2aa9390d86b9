//! MQTT shared subscriptions (`$share/{group}/{filter}`), served like a Pulsar Shared or
//! Key_Shared subscription over the log. A group — one (group name, filter) pair — lives in the
//! broker, not in a connection: its dispatcher task (`dispatcher.rs`) owns the read positions of
//! the partitions the filter can match and a durable group cursor `mqtt.share:{group}/{filter}`
//! (the oldest unacknowledged offset), and hands each matching record to exactly one connected
//! member (`strategy.rs`: round robin or key-sticky) through a bounded channel; members
//! acknowledge back (`member.rs`). The registry here tracks which sessions hold a group's
//! subscription, starts dispatchers on the first join and removes a group, cursor included,
//! when no session holds it any more.
//!
//! It never writes records and never touches a socket; connections deliver what they are handed.

mod dispatcher;
mod group;
mod member;
mod strategy;
#[cfg(test)]
mod test;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Mutex, mpsc, oneshot};

use super::clip::clip;
use super::config::SharedStrategy;
use super::router::PartitionId;
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
}

/// Every shared group of the broker.
#[derive(Debug)]
pub struct SharedGroups<S> {
    log: S,
    strategy: SharedStrategy,
    registry: Mutex<Registry>,
    next_member: AtomicU64,
}

impl<S: LogPort> SharedGroups<S> {
    pub fn new(log: S, strategy: SharedStrategy) -> Self {
        Self {
            log,
            strategy,
            registry: Mutex::default(),
            next_member: AtomicU64::new(1),
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

    /// Joins a connection to the group of `key` (starting its dispatcher over `partitions` if
    /// it is not running) with at most `window` records outstanding at a time.
    pub async fn join(
        &self,
        key: &ShareKey,
        client_id: &str,
        partitions: Vec<PartitionId>,
        window: usize,
    ) -> Option<Member> {
        let id = self.next_member.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(window.max(1));
        let commands = {
            let mut registry = self.registry.lock().await;
            let holders = registry.holders.entry(key.clone()).or_default();
            holders.insert(client_id.to_owned());
            let group = registry.groups.entry(key.clone()).or_insert_with(|| {
                let (commands, inbox) = mpsc::channel(COMMANDS);
                let log = self.log.clone();
                let task = dispatcher::run(log, key.clone(), self.strategy, partitions, inbox);
                tokio::spawn(task);
                Group { commands }
            });
            group.commands.clone()
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
            return None;
        }
        Some(Member::new(id, commands, rx))
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
        if let Some(group) = registry.groups.remove(key) {
            let (done, closed) = oneshot::channel();
            if group.commands.send(Command::Close { done }).await.is_ok() {
                let _ = closed.await;
            }
        }
        self.log.remove_cursors(&key.cursor_name()).await
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
