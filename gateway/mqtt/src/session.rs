//! One MQTT session's state, which outlives its connections when the session is persistent:
//! subscriptions, the read position per log partition, outgoing QoS 1/2 messages awaiting
//! PUBACK or PUBREC/PUBCOMP (the in-flight window and the outgoing QoS 2 machine), the "sent up
//! to" leases that mark redeliveries after a restart, and incoming QoS 2 packet ids awaiting
//! PUBREL. Pure bookkeeping; the connection task does the I/O and the state log and cursor
//! store make the durable parts durable.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use bytes::Bytes;

use super::codec::{OutPublish, QoS};
use super::queued::{Charge, QueuedBytes};
use super::router::PartitionId;
use super::state::{Released, StoredSession, StoredSubscription, qos_from_u8};
use super::topic::{self, is_shared};

/// A session expiry meaning "never" (MQTT 5's 0xFFFFFFFF).
pub const NEVER_EXPIRES: u32 = u32::MAX;

/// One subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub filter: String,
    pub qos: QoS,
    /// MQTT 5 No Local: the client's own publishes are not delivered to it.
    pub no_local: bool,
    /// MQTT 5 Retain As Published.
    pub retain_as_published: bool,
    /// MQTT 5 subscription identifier.
    pub id: Option<usize>,
}

#[cfg(test)]
impl Subscription {
    /// A subscription with MQTT 3.1.1 semantics.
    pub fn plain(filter: &str, qos: QoS) -> Self {
        Self {
            filter: filter.to_owned(),
            qos,
            no_local: false,
            retain_as_published: false,
            id: None,
        }
    }
}

impl Subscription {
    /// The subscription as the state log keeps it.
    pub fn to_stored(&self) -> StoredSubscription {
        StoredSubscription {
            filter: self.filter.clone(),
            qos: self.qos as u8,
            no_local: self.no_local,
            retain_as_published: self.retain_as_published,
            id: self.id,
        }
    }
}

/// How a message reaches this session: the highest granted QoS of the matching
/// subscriptions, whether one keeps the retain flag, and their identifiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub qos: QoS,
    pub retain_as_published: bool,
    pub ids: Vec<usize>,
}

/// A delivered QoS 1 message awaiting PUBACK, or QoS 2 message awaiting PUBREC or PUBCOMP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inflight {
    /// Where it came from in the log; `None` for retained messages sent on subscribe.
    pub source: Option<(PartitionId, u64)>,
    /// Sent with its full topic name and no topic alias (aliases live per connection).
    pub publish: OutPublish,
    pub size: usize,
    /// QoS 2 only: PUBREC came and PUBREL was sent; only PUBREL is ever re-sent now.
    pub released: bool,
}

/// What a PUBREC means for an outgoing message; every case is answered with PUBREL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PubRecOutcome {
    /// A QoS 2 delivery is released now; persistent sessions record it durably when it came
    /// from the log (`Some`).
    Released(Option<Released>),
    /// The delivery was released before (a repeated PUBREC).
    AlreadyReleased,
    /// No QoS 2 delivery has this packet id (the spec's "packet identifier not found").
    Unknown,
}

/// The state of one client id.
#[derive(Debug, Default)]
pub struct Session {
    pub client_id: String,
    /// Seconds the session outlives its connection; 0 ends it with the connection.
    pub expiry: u32,
    pub subscriptions: Vec<Subscription>,
    /// Incoming QoS 2 packet ids with PUBREC sent and no PUBREL yet.
    pub pending_qos2: HashSet<u16>,
    /// Next offset to read per partition.
    pub positions: BTreeMap<PartitionId, u64>,
    /// Outgoing QoS 1 and 2 messages by packet id.
    pub inflight: BTreeMap<u16, Inflight>,
    /// The bytes of `inflight`, charged to the process-wide account once a connection
    /// attached it (`queued.rs`); released when acknowledged, dropped or the session ends.
    inflight_bytes: Charge,
    /// Partitions whose durable cursor is behind.
    pub dirty: BTreeSet<PartitionId>,
    /// Per partition, the durable "sent up to" lease: records before it may have been sent
    /// (persistent sessions; committed before any record at or past it is sent).
    pub sent_leases: BTreeMap<PartitionId, u64>,
    /// Per partition, the lease found at startup: records before it go out with DUP.
    pub redelivery_below: BTreeMap<PartitionId, u64>,
    /// Records of released QoS 2 deliveries restored after a restart: only PUBREL is re-sent
    /// for them, so reading the log again must skip them.
    pub released_records: HashSet<(PartitionId, u64)>,
    /// Whether a session record exists in the state log.
    pub stored: bool,
    next_pkid: u16,
}

impl Session {
    pub fn new(client_id: &str) -> Self {
        Self {
            client_id: client_id.to_owned(),
            ..Self::default()
        }
    }

    /// A session restored from the state log after a restart.
    pub fn restore(client_id: &str, stored: StoredSession) -> Self {
        Self {
            client_id: client_id.to_owned(),
            expiry: stored.expiry,
            subscriptions: stored
                .subscriptions
                .into_iter()
                .map(|s| Subscription {
                    filter: s.filter,
                    qos: qos_from_u8(s.qos),
                    no_local: s.no_local,
                    retain_as_published: s.retain_as_published,
                    id: s.id,
                })
                .collect(),
            pending_qos2: stored.pending_qos2,
            inflight: stored
                .released
                .iter()
                .map(|(pkid, released)| (*pkid, restored_release(*pkid, released)))
                .collect(),
            released_records: stored.released.values().map(Released::source).collect(),
            stored: true,
            ..Self::default()
        }
    }

    /// Whether the session outlives its connection.
    pub fn persistent(&self) -> bool {
        self.expiry > 0
    }

    /// Whether the session carries anything from before (CONNACK "session present").
    pub fn present(&self) -> bool {
        self.stored || !self.subscriptions.is_empty() || !self.positions.is_empty()
    }

    /// Forgets everything but the client id (and the account its deliveries are charged to).
    pub fn clear(&mut self) {
        let account = self.inflight_bytes.take_account();
        *self = Self::new(&self.client_id);
        if let Some(account) = account {
            self.inflight_bytes.attach(account);
        }
    }

    /// Charges the session's in-flight bytes, now and from now on, to `account`.
    pub fn charge_to(&mut self, account: Arc<QueuedBytes>) {
        self.inflight_bytes.attach(account);
    }

    /// Bytes of the outgoing deliveries awaiting acknowledgement.
    pub fn inflight_bytes(&self) -> usize {
        self.inflight_bytes.bytes()
    }

    /// What the state log keeps of this session.
    pub fn to_stored(&self) -> StoredSession {
        StoredSession {
            expiry: self.expiry,
            subscriptions: self
                .subscriptions
                .iter()
                .map(Subscription::to_stored)
                .collect(),
            pending_qos2: self.pending_qos2.clone(),
            released: self
                .inflight
                .iter()
                .filter(|(_, i)| i.released)
                .filter_map(|(pkid, i)| {
                    let (partition, offset) = i.source.as_ref()?;
                    Some((*pkid, Released::new(partition, *offset)))
                })
                .collect(),
        }
    }

    /// Adds or replaces a subscription; true if the filter is new.
    pub fn subscribe(&mut self, subscription: Subscription) -> bool {
        let existing = self
            .subscriptions
            .iter_mut()
            .find(|s| s.filter == subscription.filter);
        match existing {
            Some(existing) => {
                *existing = subscription;
                false
            }
            None => {
                self.subscriptions.push(subscription);
                true
            }
        }
    }

    /// Removes a subscription; true if it existed.
    pub fn unsubscribe(&mut self, filter: &str) -> bool {
        let before = self.subscriptions.len();
        self.subscriptions.retain(|s| s.filter != filter);
        before != self.subscriptions.len()
    }

    /// How a message on `topic_name` reaches this session; `own` marks the session's own
    /// publishes (skipped by No Local subscriptions). Shared subscriptions never match here:
    /// their groups hand records over. `None` if no subscription matches.
    pub fn matching(&self, topic_name: &str, own: bool) -> Option<Matched> {
        let mut matched: Option<Matched> = None;
        let subscriptions = self
            .subscriptions
            .iter()
            .filter(|s| !is_shared(&s.filter))
            .filter(|s| !(own && s.no_local) && topic::matches(&s.filter, topic_name));
        for s in subscriptions {
            let m = matched.get_or_insert(Matched {
                qos: QoS::AtMostOnce,
                retain_as_published: false,
                ids: Vec::new(),
            });
            if s.qos as u8 > m.qos as u8 {
                m.qos = s.qos;
            }
            m.retain_as_published |= s.retain_as_published;
            m.ids.extend(s.id);
        }
        matched
    }

    /// A free packet id for an outgoing message.
    pub fn next_pkid(&mut self) -> Option<u16> {
        for _ in 0..u16::MAX {
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            if !self.inflight.contains_key(&self.next_pkid) {
                return Some(self.next_pkid);
            }
        }
        None
    }

    /// Records a delivered QoS 1 or 2 message.
    pub fn add_inflight(&mut self, pkid: u16, inflight: Inflight) {
        self.inflight_bytes.add(inflight.size);
        if let Some((partition, _)) = &inflight.source {
            self.dirty.insert(partition.clone());
        }
        self.inflight.insert(pkid, inflight);
    }

    /// Handles a PUBACK; false unless a QoS 1 delivery had this packet id.
    pub fn acknowledge(&mut self, pkid: u16) -> bool {
        self.acknowledged(pkid).is_some()
    }

    /// [`Session::acknowledge`], returning the delivery that ended.
    pub fn acknowledged(&mut self, pkid: u16) -> Option<Inflight> {
        self.finish_if(pkid, |i| i.publish.qos == QoS::AtLeastOnce)
    }

    /// Handles a successful PUBREC: the QoS 2 delivery moves to "released" and is never
    /// re-sent as a PUBLISH again while the session lives.
    pub fn received(&mut self, pkid: u16) -> PubRecOutcome {
        match self.inflight.get_mut(&pkid) {
            Some(inflight) if inflight.publish.qos == QoS::ExactlyOnce => {
                if std::mem::replace(&mut inflight.released, true) {
                    return PubRecOutcome::AlreadyReleased;
                }
                let source = inflight.source.as_ref();
                PubRecOutcome::Released(source.map(|(p, offset)| Released::new(p, *offset)))
            }
            _ => PubRecOutcome::Unknown,
        }
    }

    /// Handles a PUBREC with a reason code of 0x80 or above: the QoS 2 delivery ends (not
    /// re-sent); false for an unknown or already released packet id.
    pub fn refused(&mut self, pkid: u16) -> bool {
        self.finish_if(pkid, |i| i.publish.qos == QoS::ExactlyOnce && !i.released)
            .is_some()
    }

    /// Handles a PUBCOMP: the finished QoS 2 delivery, `None` for an unknown packet id.
    pub fn complete(&mut self, pkid: u16) -> Option<Inflight> {
        let done = self.finish_if(pkid, |i| i.publish.qos == QoS::ExactlyOnce)?;
        if let Some(source) = &done.source {
            self.released_records.remove(source);
        }
        Some(done)
    }

    /// Removes and returns the delivery with `pkid` if `done` says it is finished.
    fn finish_if(&mut self, pkid: u16, done: impl FnOnce(&Inflight) -> bool) -> Option<Inflight> {
        if !self.inflight.get(&pkid).is_some_and(done) {
            return None;
        }
        let finished = self.inflight.remove(&pkid)?;
        self.inflight_bytes.remove(finished.size);
        if let Some((partition, _)) = &finished.source {
            self.dirty.insert(partition.clone());
        }
        Some(finished)
    }

    /// Whether a record is a released QoS 2 delivery restored after a restart (never sent as
    /// a PUBLISH again).
    pub fn is_released_record(&self, partition: &PartitionId, offset: u64) -> bool {
        !self.released_records.is_empty()
            && self.released_records.contains(&(partition.clone(), offset))
    }

    /// Whether a record may have been sent before a gateway restart (DUP on redelivery).
    pub fn maybe_sent(&self, partition: &PartitionId, offset: u64) -> bool {
        self.redelivery_below
            .get(partition)
            .is_some_and(|below| offset < *below)
    }

    /// Whether the durable "sent up to" lease covers `offset` (always for sessions that do
    /// not outlive their connection, which never redeliver after a restart).
    pub fn lease_covers(&self, partition: &PartitionId, offset: u64) -> bool {
        !self.persistent()
            || self
                .sent_leases
                .get(partition)
                .is_some_and(|lease| offset < *lease)
    }

    /// The durable cursor of a partition: the oldest unacknowledged offset, else the next
    /// offset to read.
    pub fn cursor(&self, partition: &PartitionId) -> Option<u64> {
        let unacked = self
            .inflight
            .values()
            .filter_map(|i| i.source.as_ref())
            .filter(|(p, _)| p == partition)
            .map(|(_, offset)| *offset)
            .min();
        unacked.or_else(|| self.positions.get(partition).copied())
    }
}

/// The in-flight entry of a released delivery restored from the state log: only its packet id
/// and source matter, since only PUBREL is ever sent for it again.
fn restored_release(pkid: u16, released: &Released) -> Inflight {
    Inflight {
        source: Some(released.source()),
        publish: OutPublish {
            topic: Bytes::new(),
            payload: Bytes::new(),
            qos: QoS::ExactlyOnce,
            pkid,
            dup: false,
            retain: false,
            properties: None,
        },
        size: 0,
        released: true,
    }
}

#[cfg(test)]
mod test;
