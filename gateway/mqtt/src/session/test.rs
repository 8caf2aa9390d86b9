//! Session bookkeeping tests: windows, cursors, packet ids, the QoS 2 machine.

use bytes::Bytes;

use super::*;

fn inflight(partition: &PartitionId, offset: u64) -> Inflight {
    delivery(partition, offset, QoS::AtLeastOnce)
}

fn delivery(partition: &PartitionId, offset: u64, qos: QoS) -> Inflight {
    Inflight {
        source: Some((partition.clone(), offset)),
        publish: OutPublish {
            topic: Bytes::from_static(b"t"),
            payload: Bytes::from_static(b"p"),
            qos,
            pkid: 1,
            dup: false,
            retain: false,
            properties: None,
        },
        size: 10,
        released: false,
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
    assert_eq!(session.inflight_bytes(), 20);
    assert_eq!(session.cursor(&p), Some(10));
    assert!(session.acknowledge(b));
    assert_eq!(session.cursor(&p), Some(10));
    assert!(session.acknowledge(a));
    assert!(!session.acknowledge(a));
    assert_eq!(session.cursor(&p), Some(13));
    assert_eq!(session.inflight_bytes(), 0);
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

#[test]
fn qos2_deliveries_hold_the_cursor_until_pubcomp() {
    let p: PartitionId = ("mqtt".to_owned(), 0);
    let mut session = Session::new("c");
    session.positions.insert(p.clone(), 6);
    session.add_inflight(1, delivery(&p, 4, QoS::ExactlyOnce));
    session.add_inflight(2, delivery(&p, 5, QoS::ExactlyOnce));
    assert!(!session.acknowledge(1), "PUBACK does not finish QoS 2");
    let released = Some(Released::new(&p, 4));
    assert_eq!(session.received(1), PubRecOutcome::Released(released));
    assert_eq!(session.received(1), PubRecOutcome::AlreadyReleased);
    assert!(session.inflight.get(&1).is_some_and(|i| i.released));
    assert_eq!(session.received(9), PubRecOutcome::Unknown);
    assert!(!session.refused(1), "a released delivery cannot be refused");
    assert_eq!(session.cursor(&p), Some(4), "PUBREC alone keeps the cursor");
    assert!(session.complete(1).is_some());
    assert!(session.complete(1).is_none());
    assert_eq!(session.cursor(&p), Some(5));
    assert!(session.refused(2), "PUBREC >= 0x80 ends the delivery");
    assert_eq!(session.cursor(&p), Some(6));
    assert_eq!(session.inflight_bytes(), 0);
}

#[test]
fn qos1_deliveries_ignore_qos2_acks() {
    let p: PartitionId = ("mqtt".to_owned(), 0);
    let mut session = Session::new("c");
    session.add_inflight(3, inflight(&p, 0));
    assert_eq!(session.received(3), PubRecOutcome::Unknown);
    assert!(session.complete(3).is_none());
    assert!(!session.refused(3));
    assert!(session.acknowledge(3));
}

#[test]
fn leases_cover_persistent_sessions_only_below_their_mark() {
    let p: PartitionId = ("mqtt".to_owned(), 1);
    let mut session = Session::new("c");
    assert!(
        session.lease_covers(&p, 1_000),
        "clean sessions need no lease"
    );
    session.expiry = 60;
    assert!(!session.lease_covers(&p, 0));
    session.sent_leases.insert(p.clone(), 10);
    assert!(session.lease_covers(&p, 9));
    assert!(!session.lease_covers(&p, 10));
    assert!(!session.maybe_sent(&p, 0));
    session.redelivery_below.insert(p.clone(), 5);
    assert!(session.maybe_sent(&p, 4));
    assert!(!session.maybe_sent(&p, 5));
}

#[test]
fn restored_releases_hold_the_cursor_and_are_skipped_when_read_again() {
    let p: PartitionId = ("mqtt".to_owned(), 0);
    let stored = StoredSession {
        expiry: 60,
        released: BTreeMap::from([(9, Released::new(&p, 5))]),
        ..StoredSession::default()
    };
    let mut session = Session::restore("c", stored);
    session.positions.insert(p.clone(), 5);
    assert_eq!(session.cursor(&p), Some(5));
    assert!(session.inflight.get(&9).is_some_and(|i| i.released));
    assert!(session.is_released_record(&p, 5));
    assert!(!session.is_released_record(&p, 6));
    assert_ne!(session.next_pkid(), Some(9));
    assert!(session.complete(9).is_some());
    assert!(!session.is_released_record(&p, 5));
    assert_eq!(
        session.cursor(&p),
        Some(5),
        "the position, now that nothing is in flight"
    );
}
