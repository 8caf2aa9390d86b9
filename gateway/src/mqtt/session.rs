//! One MQTT session's state, which outlives its connections when the session is persistent:
//! subscriptions, the read position per log partition, outgoing QoS 1 messages awaiting PUBACK
//! (the in-flight window), and incoming QoS 2 packet ids awaiting PUBREL. Pure bookkeeping;
//! the connection task does the I/O and the state log makes the durable parts durable.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::codec::{OutPublish, QoS};
use super::shared::is_shared;
use super::state::{StoredSession, StoredSubscription, qos_from_u8};
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
    /// MQTT 5 No Local: the client's own publishes are not delivered to it.
    pub no_local: bool,
    /// MQTT 5 Retain As Published.
    pub retain_as_published: bool,
    /// MQTT 5 subscription identifier.
    pub id: Option<usize>,
}

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

/// How a message reaches this session: the highest granted QoS of the matching
/// subscriptions, whether one keeps the retain flag, and their identifiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub qos: QoS,
    pub retain_as_published: bool,
    pub ids: Vec<usize>,
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
                .map(|s| Subscription {
                    filter: s.filter,
                    qos: qos_from_u8(s.qos),
                    no_local: s.no_local,
                    retain_as_published: s.retain_as_published,
                    id: s.id,
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
                .map(|s| StoredSubscription {
                    filter: s.filter.clone(),
                    qos: s.qos as u8,
                    no_local: s.no_local,
                    retain_as_published: s.retain_as_published,
                    id: s.id,
                })
                .collect(),
            pending_qos2: self.pending_qos2.clone(),
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

    fn qos_of(session: &Session, topic_name: &str) -> Option<QoS> {
        session.matching(topic_name, false).map(|m| m.qos)
    }

    #[test]
    fn subscriptions_replace_and_match_the_highest_qos() {
        let mut session = Session::new("c");
        assert!(session.subscribe(Subscription::plain("a/#", QoS::AtMostOnce)));
        assert!(session.subscribe(Subscription::plain("a/+", QoS::AtLeastOnce)));
        assert!(!session.subscribe(Subscription::plain("a/#", QoS::AtMostOnce)));
        assert_eq!(qos_of(&session, "a/b"), Some(QoS::AtLeastOnce));
        assert_eq!(qos_of(&session, "a/b/c"), Some(QoS::AtMostOnce));
        assert_eq!(qos_of(&session, "b"), None);
        assert!(session.unsubscribe("a/+"));
        assert_eq!(qos_of(&session, "a/b"), Some(QoS::AtMostOnce));
    }

    #[test]
    fn no_local_skips_own_messages_and_ids_accumulate() {
        let mut session = Session::new("c");
        session.subscribe(Subscription {
            no_local: true,
            id: Some(1),
            ..Subscription::plain("a/#", QoS::AtLeastOnce)
        });
        session.subscribe(Subscription {
            retain_as_published: true,
            id: Some(2),
            ..Subscription::plain("a/+", QoS::AtMostOnce)
        });
        let all = session.matching("a/b", false).expect("matches");
        assert_eq!(
            (all.qos, all.retain_as_published, all.ids),
            (QoS::AtLeastOnce, true, vec![1, 2])
        );
        let own = session.matching("a/b", true).expect("matches");
        assert_eq!((own.qos, own.ids), (QoS::AtMostOnce, vec![2]));
        assert_eq!(session.matching("a/b/c", true), None);
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
        session.subscribe(Subscription {
            no_local: true,
            id: Some(7),
            ..Subscription::plain("x/+", QoS::AtLeastOnce)
        });
        session.pending_qos2.insert(4);
        let restored = Session::restore("c", session.to_stored());
        assert_eq!(restored.subscriptions, session.subscriptions);
        assert_eq!(restored.pending_qos2, session.pending_qos2);
        assert!(restored.present());
    }
}
