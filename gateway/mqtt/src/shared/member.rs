//! A connection's side of its shared subscriptions: one `Member` per joined group (the channel
//! its dispatcher fills, and the way back for acknowledgements), plus which outgoing packet ids
//! carry a group's record. The connection polls every member's channel as one event source.
//! Holds no socket and never delivers by itself.

use std::collections::HashMap;
use std::future::poll_fn;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::super::router::PartitionId;
use super::super::session::Matched;
use super::dispatcher::Command;
use super::group::Delivery;

/// How long a leaving member waits for its group to take its records back.
const LEAVE_WAIT: Duration = Duration::from_secs(2);

/// One joined group.
#[derive(Debug)]
pub struct Member {
    id: u64,
    commands: mpsc::Sender<Command>,
    rx: mpsc::Receiver<Delivery>,
    /// How deliveries reach the client (granted QoS, retain as published, identifier).
    pub matched: Option<Matched>,
}

impl Member {
    pub(super) fn new(
        id: u64,
        commands: mpsc::Sender<Command>,
        rx: mpsc::Receiver<Delivery>,
    ) -> Self {
        Self {
            id,
            commands,
            rx,
            matched: None,
        }
    }

    async fn ack(&self, partition: PartitionId, offset: u64) {
        let ack = Command::Ack {
            member: self.id,
            partition,
            offset,
        };
        let _ = self.commands.send(ack).await;
    }

    async fn leave(self) {
        let (done, left) = oneshot::channel();
        let leave = Command::Leave {
            member: self.id,
            done,
        };
        if self.commands.send(leave).await.is_ok() {
            let _ = tokio::time::timeout(LEAVE_WAIT, left).await;
        }
    }
}

/// Every group a connection is a member of, keyed by the full `$share/…` filter.
#[derive(Debug, Default)]
pub struct Memberships {
    /// (full filter, member); few per connection.
    members: Vec<(String, Member)>,
    /// Where the next poll starts, so one busy group cannot starve the others.
    turn: usize,
    /// Outgoing packet id → (full filter, partition, offset) of a group's record.
    inflight: HashMap<u16, (String, PartitionId, u64)>,
}

impl Memberships {
    fn get(&self, filter: &str) -> Option<&Member> {
        self.members
            .iter()
            .find(|(f, _)| f == filter)
            .map(|(_, m)| m)
    }

    pub fn get_mut(&mut self, filter: &str) -> Option<&mut Member> {
        self.members
            .iter_mut()
            .find(|(f, _)| f == filter)
            .map(|(_, m)| m)
    }

    /// Adds (or replaces) the membership of the group subscribed as `filter`.
    pub fn insert(&mut self, filter: String, member: Member) {
        self.members.retain(|(f, _)| *f != filter);
        self.members.push((filter, member));
    }

    /// The next record any group handed to this connection; pending while there is none.
    pub async fn recv(&mut self) -> (String, Delivery) {
        poll_fn(|cx| {
            let count = self.members.len();
            for step in 0..count {
                let index = (self.turn + step) % count;
                let Some((filter, member)) = self.members.get_mut(index) else {
                    continue;
                };
                if let Poll::Ready(Some(delivery)) = member.rx.poll_recv(cx) {
                    self.turn = index + 1;
                    return Poll::Ready((filter.clone(), delivery));
                }
            }
            Poll::Pending
        })
        .await
    }

    /// A record some group already handed over, if any, without waiting.
    pub fn try_recv(&mut self) -> Option<(String, Delivery)> {
        let count = self.members.len();
        for step in 0..count {
            let index = (self.turn + step) % count;
            let Some((filter, member)) = self.members.get_mut(index) else {
                continue;
            };
            if let Ok(delivery) = member.rx.try_recv() {
                self.turn = index + 1;
                return Some((filter.clone(), delivery));
            }
        }
        None
    }

    /// Remembers that packet `pkid` carries a record of the group subscribed as `filter`.
    pub fn track(&mut self, pkid: u16, filter: String, partition: PartitionId, offset: u64) {
        self.inflight.insert(pkid, (filter, partition, offset));
    }

    /// Acknowledges a record to its group (the client acknowledged it, or it was never
    /// tracked: QoS 0, expired, not allowed, too large).
    pub async fn settle(&self, filter: &str, partition: PartitionId, offset: u64) {
        if let Some(member) = self.get(filter) {
            member.ack(partition, offset).await;
        }
    }

    /// The client acknowledged packet `pkid`; the group's record it carried, if any.
    pub async fn acknowledged(&mut self, pkid: u16) -> Option<(PartitionId, u64)> {
        let (filter, partition, offset) = self.inflight.remove(&pkid)?;
        self.settle(&filter, partition.clone(), offset).await;
        Some((partition, offset))
    }

    /// Leaves the group subscribed as `filter`; returns the packet ids of its records still
    /// in flight, which the group hands to other members.
    pub async fn leave(&mut self, filter: &str) -> Vec<u16> {
        let pkids = self.untrack(|f| f == filter);
        if let Some(index) = self.members.iter().position(|(f, _)| f == filter) {
            let (_, member) = self.members.remove(index);
            member.leave().await;
        }
        pkids
    }

    /// Leaves every group (the connection ends); returns the packet ids no longer tracked.
    pub async fn leave_all(&mut self) -> Vec<u16> {
        let pkids = self.untrack(|_| true);
        for (_, member) in std::mem::take(&mut self.members) {
            member.leave().await;
        }
        pkids
    }

    fn untrack(&mut self, which: impl Fn(&str) -> bool) -> Vec<u16> {
        let pkids: Vec<u16> = self
            .inflight
            .iter()
            .filter(|(_, (f, _, _))| which(f))
            .map(|(pkid, _)| *pkid)
            .collect();
        for pkid in &pkids {
            self.inflight.remove(pkid);
        }
        pkids
    }
}
