//! The state of one shared group, without any waiting: per partition the next offset to read,
//! the records read ahead and the offsets handed out but not acknowledged; the members with
//! their outstanding records; and the records of departed members waiting for another member.
//! `dispatch` hands records out until no member can take the next one; the group cursor of a
//! partition is its oldest unacknowledged offset. Never awaits and never blocks on a member.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use tokio::sync::mpsc;

use super::super::clip::clip;
use super::super::config::SharedType;
use super::super::message::Message;
use super::super::router::PartitionId;
use super::super::topic;
use super::strategy::{Candidate, Picker, key_hash};
use tern_log::{LogError, LogPort, StoredRecord};

/// A record handed to a member.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub partition: PartitionId,
    pub offset: u64,
    pub message: Box<Message>,
    /// Whether another member had it before and left without acknowledging it.
    pub dup: bool,
}

/// Bytes read ahead from the log per partition.
const READ_BYTES: usize = 32 * 1024;

/// One partition's read state.
#[derive(Debug, Default)]
struct Position {
    next: u64,
    buffer: VecDeque<StoredRecord>,
    outstanding: BTreeSet<u64>,
    /// The matching record read last, waiting for a member with room.
    parked: Option<Handed>,
}

/// A record handed out: where it came from and the message.
#[derive(Debug, Clone)]
struct Handed {
    partition: PartitionId,
    offset: u64,
    key: Vec<u8>,
    message: Box<Message>,
}

/// One connected member.
#[derive(Debug)]
pub(super) struct Slot {
    pub id: u64,
    client_id: String,
    window: usize,
    tx: mpsc::Sender<Delivery>,
    outstanding: BTreeMap<(PartitionId, u64), Handed>,
    /// How many of `outstanding` have each key hash (`key_shared`'s draining check).
    keys: HashMap<u64, usize>,
}

impl Slot {
    fn take(&mut self, token: &(PartitionId, u64)) -> Option<Handed> {
        let handed = self.outstanding.remove(token)?;
        let hash = key_hash(&handed.key);
        if let Some(count) = self.keys.get_mut(&hash) {
            *count -= 1;
            if *count == 0 {
                self.keys.remove(&hash);
            }
        }
        Some(handed)
    }
}

impl Candidate for Slot {
    fn name(&self) -> &str {
        &self.client_id
    }
    fn has_room(&self) -> bool {
        self.outstanding.len() < self.window && !self.tx.is_closed()
    }
    fn holds_key(&self, hash: u64) -> bool {
        self.keys.contains_key(&hash)
    }
}

/// One shared group's positions and members.
#[derive(Debug)]
pub(super) struct GroupState<S> {
    log: S,
    filter: String,
    kind: SharedType,
    positions: BTreeMap<PartitionId, Position>,
    members: Vec<Slot>,
    redeliver: VecDeque<Handed>,
    picker: Picker,
}

impl<S: LogPort> GroupState<S> {
    /// A group reading `filter` from `starts` (partition → first offset to read).
    pub fn new(
        log: S,
        filter: String,
        kind: SharedType,
        starts: BTreeMap<PartitionId, u64>,
    ) -> Self {
        let positions = starts
            .into_iter()
            .map(|(p, next)| {
                let position = Position {
                    next,
                    ..Position::default()
                };
                (p, position)
            })
            .collect();
        Self {
            log,
            filter,
            kind,
            positions,
            members: Vec::new(),
            redeliver: VecDeque::new(),
            picker: Picker::default(),
        }
    }

    pub fn join(&mut self, id: u64, client_id: String, window: usize, tx: mpsc::Sender<Delivery>) {
        self.members.push(Slot {
            id,
            client_id,
            window,
            tx,
            outstanding: BTreeMap::new(),
            keys: HashMap::new(),
        });
    }

    /// Removes a member; what it had not acknowledged waits for the others, in log order.
    pub fn leave(&mut self, id: u64) {
        let Some(index) = self.members.iter().position(|m| m.id == id) else {
            return;
        };
        let slot = self.members.remove(index);
        let mut orphans: Vec<Handed> = slot.outstanding.into_values().collect();
        orphans.sort_by_key(|h| h.offset);
        self.redeliver.extend(orphans);
    }

    /// A member's acknowledgement of one record.
    pub fn ack(&mut self, id: u64, partition: PartitionId, offset: u64) {
        let Some(slot) = self.members.iter_mut().find(|m| m.id == id) else {
            return;
        };
        if slot.take(&(partition.clone(), offset)).is_some() {
            if let Some(position) = self.positions.get_mut(&partition) {
                position.outstanding.remove(&offset);
            }
        }
    }

    /// The cursor of every partition: the oldest unacknowledged offset, else the next to read.
    pub fn cursors(&self) -> impl Iterator<Item = (&PartitionId, u64)> {
        self.positions.iter().map(|(p, position)| {
            let parked = position.parked.as_ref().map(|h| h.offset);
            let oldest = position.outstanding.first().copied();
            let pending = [parked, oldest, Some(position.next)];
            (
                p,
                pending.into_iter().flatten().min().unwrap_or(position.next),
            )
        })
    }

    /// Members currently joined.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Hands out records until no member can take the next one. Members whose connection
    /// is gone are removed on the way.
    pub fn dispatch(&mut self) -> Result<(), LogError> {
        self.drop_closed();
        if !self.members.iter().any(Slot::has_room) {
            return Ok(());
        }
        while let Some(handed) = self.redeliver.pop_front() {
            if let Err(back) = self.hand(handed, true) {
                self.redeliver.push_front(back);
                return Ok(());
            }
        }
        let partitions: Vec<PartitionId> = self.positions.keys().cloned().collect();
        for partition in partitions {
            self.dispatch_partition(&partition)?;
        }
        Ok(())
    }

    fn dispatch_partition(&mut self, partition: &PartitionId) -> Result<(), LogError> {
        loop {
            let parked = self
                .positions
                .get_mut(partition)
                .and_then(|p| p.parked.take());
            let handed = match parked {
                Some(handed) => handed,
                None => match self.next_matching(partition)? {
                    Some(handed) => handed,
                    None => return Ok(()),
                },
            };
            let offset = handed.offset;
            let result = self.hand(handed, false);
            let Some(position) = self.positions.get_mut(partition) else {
                return Ok(());
            };
            match result {
                Ok(()) => {
                    position.outstanding.insert(offset);
                }
                Err(back) => {
                    position.parked = Some(back);
                    return Ok(());
                }
            }
        }
    }

    /// Reads `partition` on to its next record whose MQTT topic matches the filter.
    fn next_matching(&mut self, partition: &PartitionId) -> Result<Option<Handed>, LogError> {
        loop {
            let Some(position) = self.positions.get_mut(partition) else {
                return Ok(None);
            };
            if position
                .buffer
                .front()
                .is_some_and(|r| r.offset != position.next)
            {
                position.buffer.clear();
            }
            if position.buffer.is_empty() {
                let (topic, p) = (&partition.0, partition.1);
                match self.log.read(topic, p, position.next, READ_BYTES) {
                    Ok(records) => position.buffer.extend(records),
                    Err(LogError::OffsetOutOfRange { start, .. }) if start > position.next => {
                        tracing::warn!(filter = %clip(&self.filter), ?partition, next = position.next, start, "records expired before a shared group read them");
                        position.next = start;
                        continue;
                    }
                    Err(err) => return Err(err),
                }
            }
            let Some(stored) = position.buffer.pop_front() else {
                return Ok(None);
            };
            position.next = stored.offset + 1;
            let message = Message::from_record(&stored.record)
                .filter(|m| topic::matches(&self.filter, &m.topic));
            if let Some(message) = message {
                let key = stored
                    .record
                    .key
                    .map_or_else(|| message.topic.as_bytes().to_vec(), Vec::from);
                return Ok(Some(Handed {
                    partition: partition.clone(),
                    offset: stored.offset,
                    key,
                    message: Box::new(message),
                }));
            }
        }
    }

    /// Gives `handed` to the member the strategy picks; returns it when none can take it.
    fn hand(&mut self, handed: Handed, dup: bool) -> Result<(), Handed> {
        let Some(index) = self.picker.pick(self.kind, &self.members, &handed.key) else {
            return Err(handed);
        };
        let Some(slot) = self.members.get_mut(index) else {
            return Err(handed);
        };
        let delivery = Delivery {
            partition: handed.partition.clone(),
            offset: handed.offset,
            message: handed.message.clone(),
            dup,
        };
        if slot.tx.try_send(delivery).is_err() {
            return Err(handed);
        }
        let token = (handed.partition.clone(), handed.offset);
        *slot.keys.entry(key_hash(&handed.key)).or_default() += 1;
        slot.outstanding.insert(token, handed);
        Ok(())
    }

    fn drop_closed(&mut self) {
        let closed: Vec<u64> = self
            .members
            .iter()
            .filter(|m| m.tx.is_closed())
            .map(|m| m.id)
            .collect();
        for id in closed {
            self.leave(id);
        }
    }
}
