//! One MQTT session's state, which outlives its connections when the session is persistent:
//! subscriptions, the read position per log partition, outgoing QoS 1 messages awaiting PUBACK
//! (the in-flight window), and incoming QoS 2 packet ids awaiting PUBREL. Pure bookkeeping;
//! the connection task does the I/O and the state log makes the durable parts durable.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::codec::{OutPublish, QoS};
use super::state::{StoredSession, qos_from_u8};
use super::topic;

/// A session expiry meaning "never" (MQTT 5's 0xFFFFFFFF).
pub const NEVER_EXPIRES: u32 = u32::MAX;

/// A log partition: (log topic, partition).
pub type PartitionId = (String, u32);

/// One subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub filter: String,
    pub qos: QoS,
}

/// A delivered QoS 1 message awaiting PUBACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inflight {
    /// Where it came from in the log; `None` for retained messages sent on subscribe.
    pub source: Option<(PartitionId, u64)>,
    pub publish: OutPublish,
    pub size: usize,
}

/// The state of one client id.
#[derive(Debug, Clone, Default)]
pub struct Session {
    pub client_id: String,
    /// Seconds the session outlives its connection; 0 ends it with the connection.
    pub expiry: u32,
    pub subscriptions: Vec<Subscription>,
    /// Incoming QoS 2 packet ids with PUBREC sent and no PUBREL yet.
    pub pending_qos2: HashSet<u16>,
    /// Next offset to read per partition.
    pub positions: BTreeMap<PartitionId, u64>,
    /// Outgoing QoS 1 messages by packet id.
    pub inflight: BTreeMap<u16, Inflight>,
    pub inflight_bytes: usize,
    /// Partitions whose durable cursor is behind.
    pub dirty: BTreeSet<PartitionId>,
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
                .map(|(filter, qos)| Subscription {
                    filter,
                    qos: qos_from_u8(qos),
                })
                .collect(),
            pending_qos2: stored.pending_qos2,
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

    /// Forgets everything but the client id.
    pub fn clear(&mut self) {
        *self = Self::new(&self.client_id);
    }

    /// What the state log keeps of this session.
    pub fn to_stored(&self) -> StoredSession {
        StoredSession {
            expiry: self.expiry,
            subscriptions: self
                .subscriptions
                .iter()
                .map(|s| (s.filter.clone(), s.qos as u8))
                .collect(),
            pending_qos2: self.pending_qos2.clone(),
        }
    }

    /// Adds or replaces a subscription; true if the filter is new.
    pub fn subscribe(&mut self, filter: &str, qos: QoS) -> bool {
        if let Some(existing) = self.subscriptions.iter_mut().find(|s| s.filter == filter) {
            existing.qos = qos;
            return false;
        }
        self.subscriptions.push(Subscription {
            filter: filter.to_owned(),
            qos,
        });
        true
    }

    /// Removes a subscription; true if it existed.
    pub fn unsubscribe(&mut self, filter: &str) -> bool {
        let before = self.subscriptions.len();
        self.subscriptions.retain(|s| s.filter != filter);
        before != self.subscriptions.len()
    }

    /// The highest granted QoS among subscriptions matching `topic_name`.
    pub fn matching_qos(&self, topic_name: &str) -> Option<QoS> {
        self.subscriptions
            .iter()
            .filter(|s| topic::matches(&s.filter, topic_name))
            .map(|s| s.qos)
            .max_by_key(|qos| *qos as u8)
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

    /// Records a delivered QoS 1 message.
    pub fn add_inflight(&mut self, pkid: u16, inflight: Inflight) {
        self.inflight_bytes += inflight.size;
        if let Some((partition, _)) = &inflight.source {
            self.dirty.insert(partition.clone());
        }
        self.inflight.insert(pkid, inflight);
    }

    /// Handles a PUBACK; false for an unknown packet id.
    pub fn acknowledge(&mut self, pkid: u16) -> bool {
        let Some(done) = self.inflight.remove(&pkid) else {
            return false;
        };
        self.inflight_bytes = self.inflight_bytes.saturating_sub(done.size);
        if let Some((partition, _)) = done.source {
            self.dirty.insert(partition);
        }
        true
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn inflight(partition: &PartitionId, offset: u64) -> Inflight {
        Inflight {
            source: Some((partition.clone(), offset)),
            publish: OutPublish {
                topic: Bytes::from_static(b"t"),
                payload: Bytes::from_static(b"p"),
                qos: QoS::AtLeastOnce,
                pkid: 1,
                dup: false,
                retain: false,
                properties: None,
            },
            size: 10,
        }
    }

    #[test]
    fn cursor_stays_at_the_oldest_unacknowledged_offset() {
        let p: PartitionId = ("mqtt".to_owned(), 0);
        let mut session = Session::new("c");
        session.positions.insert(p.clone(), 13);
        let a = session.next_pkid().expect("pkid");
        session.add_inflight(a, inflight(&p, 10));
        let b = session.next_pkid().expect("pkid");
        session.add_inflight(b, inflight(&p, 12));
        assert_ne!(a, b);
        assert_eq!(session.inflight_bytes, 20);
        assert_eq!(session.cursor(&p), Some(10));
        assert!(session.acknowledge(b));
        assert_eq!(session.cursor(&p), Some(10));
        assert!(session.acknowledge(a));
        assert!(!session.acknowledge(a));
        assert_eq!(session.cursor(&p), Some(13));
        assert_eq!(session.inflight_bytes, 0);
    }

    #[test]
    fn subscriptions_replace_and_match_the_highest_qos() {
        let mut session = Session::new("c");
        assert!(session.subscribe("a/#", QoS::AtMostOnce));
        assert!(session.subscribe("a/+", QoS::AtLeastOnce));
        assert!(!session.subscribe("a/#", QoS::AtMostOnce));
        assert_eq!(session.matching_qos("a/b"), Some(QoS::AtLeastOnce));
        assert_eq!(session.matching_qos("a/b/c"), Some(QoS::AtMostOnce));
        assert_eq!(session.matching_qos("b"), None);
        assert!(session.unsubscribe("a/+"));
        assert_eq!(session.matching_qos("a/b"), Some(QoS::AtMostOnce));
    }

    #[test]
    fn packet_ids_skip_ids_in_use_and_zero() {
        let mut session = Session::new("c");
        let p: PartitionId = ("t".to_owned(), 0);
        session.next_pkid = u16::MAX - 1;
        let first = session.next_pkid().expect("pkid");
        assert_eq!(first, u16::MAX);
        session.add_inflight(first, inflight(&p, 0));
        assert_eq!(session.next_pkid(), Some(1));
    }

    #[test]
    fn stored_form_round_trips() {
        let mut session = Session::new("c");
        session.expiry = 60;
        session.subscribe("x/+", QoS::AtLeastOnce);
        session.pending_qos2.insert(4);
        let restored = Session::restore("c", session.to_stored());
        assert_eq!(restored.subscriptions, session.subscriptions);
        assert_eq!(restored.pending_qos2, session.pending_qos2);
        assert!(restored.present());
    }
}
