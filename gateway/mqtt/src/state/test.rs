//! State log tests: folding, durable QoS 2 marks, compaction.

mod fold {
    use bytes::Bytes;

    use super::super::*;
    use tern_log::MemoryLog;

    fn retained(topic: &str, payload: &'static [u8]) -> Message {
        Message {
            topic: topic.into(),
            payload: Bytes::from_static(payload),
            qos: QoS::AtLeastOnce,
            retain: true,
            client_id: "c".into(),
            properties: None,
            timestamp_ms: 5,
        }
    }

    #[tokio::test]
    async fn state_folds_latest_value_per_key() {
        let store = MemoryLog::new(1);
        let log = StateLog::new(store.clone()).expect("state log");
        log.put_retained(&retained("a", b"1"), || ())
            .await
            .expect("put");
        log.put_retained(&retained("b", b"2"), || ())
            .await
            .expect("put");
        log.put_retained(&retained("a", b""), || ())
            .await
            .expect("clear");
        let session = StoredSession {
            expiry: 60,
            subscriptions: vec![StoredSubscription {
                filter: "x/#".to_owned(),
                qos: 1,
                ..StoredSubscription::default()
            }],
            pending_qos2: HashSet::new(),
            released: BTreeMap::new(),
        };
        log.put_session("dev", Some(&session))
            .await
            .expect("session");
        log.put_qos2("dev", 7, true).await.expect("qos2");
        log.put_qos2("dev", 8, true).await.expect("qos2");
        log.put_qos2("dev", 7, false).await.expect("qos2");
        log.put_session("gone", Some(&session))
            .await
            .expect("session");
        log.put_session("gone", None).await.expect("delete");

        let reopened = StateLog::new(store).expect("reopen");
        let loaded = reopened.load().await.expect("load");
        assert_eq!(loaded.retained.len(), 1);
        assert_eq!(loaded.retained.get("b"), Some(&1));
        let record = reopened.get(b"retained/b").expect("reads").expect("kept");
        assert_eq!(Message::from_record(&record), Some(retained("b", b"2")));
        assert_eq!(reopened.get(b"retained/a").expect("reads"), None);
        assert_eq!(loaded.sessions.len(), 1);
        let dev = loaded.sessions.get("dev").expect("dev survives");
        assert_eq!(dev.subscriptions, session.subscriptions);
        assert_eq!(dev.pending_qos2, HashSet::from([8]));
        assert_eq!(loaded.records, 9);
    }
}

mod compaction {
    use super::super::*;
    use tern_log::MemoryLog;

    #[tokio::test]
    async fn compaction_snapshots_live_records_and_moves_the_cursor() {
        let store = MemoryLog::new(1);
        let log = StateLog::new(store.clone()).expect("state log");
        log.load().await.expect("load");
        assert_eq!(store.cursor(STATE_CURSOR, STATE_TOPIC, 0), Some(0));
        let session = StoredSession {
            expiry: 60,
            subscriptions: vec![StoredSubscription {
                filter: "a/#".to_owned(),
                qos: 1,
                ..StoredSubscription::default()
            }],
            pending_qos2: HashSet::new(),
            released: BTreeMap::new(),
        };
        log.put_session("keep", Some(&session))
            .await
            .expect("session");
        log.put_qos2("keep", 3, true).await.expect("qos2");
        for i in 0..MIN_RECORDS_BEFORE_COMPACTION {
            log.put_qos2("churn", (i % 7) as u16, i % 2 == 0)
                .await
                .expect("churn");
        }
        let cursor = store.cursor(STATE_CURSOR, STATE_TOPIC, 0).expect("cursor");
        assert!(
            cursor >= MIN_RECORDS_BEFORE_COMPACTION,
            "cursor moved to the snapshot: {cursor}"
        );

        let loaded = StateLog::new(store.clone())
            .expect("reopen")
            .load()
            .await
            .expect("load");
        let keep = loaded
            .sessions
            .get("keep")
            .expect("session survives compaction");
        assert_eq!(keep.pending_qos2, HashSet::from([3]));

        let (_, end) = store.offsets(STATE_TOPIC, 0).expect("offsets");
        let from_snapshot = store
            .read(STATE_TOPIC, 0, cursor, usize::MAX)
            .expect("read");
        assert_eq!(from_snapshot.len() as u64, end - cursor);
        let keys: Vec<Vec<u8>> = from_snapshot
            .iter()
            .filter_map(|r| r.record.key.as_deref().map(<[u8]>::to_vec))
            .collect();
        assert!(keys.contains(&b"session/keep".to_vec()));
        assert!(keys.contains(&b"qos2/keep/3".to_vec()));
    }
}

mod released {
    use super::super::*;
    use tern_log::MemoryLog;

    #[tokio::test]
    async fn qos2_state_folds_per_session_in_any_key_order_and_dies_with_it() {
        let store = MemoryLog::new(1);
        let log = StateLog::new(store.clone()).expect("state log");
        let at = |offset| Released::new(&("mqtt".to_owned(), 1), offset);
        // Written before the session record, as a snapshot in key order would.
        log.put_released("dev", 3, Some(&at(40)))
            .await
            .expect("put");
        log.put_qos2("dev", 12, true).await.expect("qos2");
        log.put_session("dev", Some(&StoredSession::default()))
            .await
            .expect("session");
        log.put_released("dev", 4, Some(&at(41)))
            .await
            .expect("put");
        log.put_released("dev", 3, None).await.expect("complete");
        log.put_released("gone", 1, Some(&at(7)))
            .await
            .expect("put");
        log.put_session("gone", Some(&StoredSession::default()))
            .await
            .expect("session");
        log.put_session("gone", None).await.expect("delete");

        let loaded = StateLog::new(store)
            .expect("reopen")
            .load()
            .await
            .expect("load");
        let dev = loaded.sessions.get("dev").expect("dev");
        assert_eq!(dev.released, BTreeMap::from([(4, at(41))]));
        assert_eq!(
            dev.pending_qos2,
            HashSet::from([12]),
            "qos2/ sorts before session/"
        );
        assert_eq!(at(41).source(), (("mqtt".to_owned(), 1), 41));
        assert!(!loaded.sessions.contains_key("gone"));
    }
}

mod subscriptions {
    use super::super::*;
    use tern_log::MemoryLog;

    fn sub(filter: &str, qos: u8) -> StoredSubscription {
        StoredSubscription {
            filter: filter.to_owned(),
            qos,
            ..StoredSubscription::default()
        }
    }

    fn session(subscriptions: Vec<StoredSubscription>) -> StoredSession {
        StoredSession {
            expiry: 60,
            subscriptions,
            ..StoredSession::default()
        }
    }

    fn filters(loaded: &Loaded, client: &str) -> Vec<(String, u8)> {
        let mut found: Vec<(String, u8)> = loaded.sessions[client]
            .subscriptions
            .iter()
            .map(|s| (s.filter.clone(), s.qos))
            .collect();
        found.sort();
        found
    }

    #[tokio::test]
    async fn subscription_identifiers_are_stored_and_older_records_without_them_load() {
        let store = MemoryLog::new(1);
        let log = StateLog::new(store.clone()).expect("state log");
        // As a tern before subscription identifiers wrote them: no `id`, no MQTT 5 options.
        let older = [
            (
                "session/old",
                r#"{"expiry":60,"subscriptions":[{"filter":"a","qos":1}]}"#,
            ),
            ("sub/old\0b", r#"{"filter":"b","qos":2}"#),
        ];
        let records = older
            .iter()
            .map(|(key, value)| plain((*key).to_owned(), value.as_bytes().to_vec()))
            .collect();
        store.append(STATE_TOPIC, 0, records).await.expect("append");
        let with_id = StoredSubscription {
            id: Some(268_435_455),
            ..sub("c", 1)
        };
        log.put_session("new", Some(&session(vec![with_id.clone()])))
            .await
            .expect("session");
        let changed = StoredSubscription {
            id: Some(7),
            ..sub("d", 0)
        };
        log.put_subscriptions("new", &[("d".to_owned(), Some(changed.clone()))])
            .await
            .expect("sub");
        let loaded = StateLog::new(store)
            .expect("reopen")
            .load()
            .await
            .expect("load");
        assert_eq!(
            loaded.sessions["old"].subscriptions,
            [sub("a", 1), sub("b", 2)],
            "older records load, without identifiers"
        );
        assert_eq!(loaded.sessions["new"].subscriptions, [with_id, changed]);
    }

    #[tokio::test]
    async fn changes_fold_over_the_session_record_and_survive_compaction() {
        let store = MemoryLog::new(1);
        let log = StateLog::new(store.clone()).expect("state log");
        log.put_session("d/1", Some(&session(vec![sub("old", 0)])))
            .await
            .expect("session");
        for i in 0..1500 {
            let change = vec![(
                format!("f/{}", i % 600),
                Some(sub(&format!("f/{}", i % 600), 1)),
            )];
            log.put_subscriptions("d/1", &change).await.expect("sub");
        }
        log.put_subscriptions("d/1", &[("old".to_owned(), None), ("f/0".to_owned(), None)])
            .await
            .expect("unsub");
        // A later full record holds the changes so far; changes after it still apply.
        let mut now = vec![sub("f/1", 2)];
        now.extend((2..600).map(|i| sub(&format!("f/{i}"), 1)));
        log.put_session("d/1", Some(&session(now)))
            .await
            .expect("session");
        log.put_subscriptions("d/1", &[("f/2".to_owned(), None)])
            .await
            .expect("unsub");
        // A forgotten session's subscriptions do not come back with a new one of its id.
        log.put_session("gone", Some(&session(Vec::new())))
            .await
            .expect("session");
        log.put_subscriptions("gone", &[("g".to_owned(), Some(sub("g", 1)))])
            .await
            .expect("sub");
        log.delete_session("gone", &["g".to_owned()])
            .await
            .expect("delete");
        log.put_session("gone", Some(&session(Vec::new())))
            .await
            .expect("session");
        let bytes = store.offsets(STATE_TOPIC, 0).expect("offsets");
        assert!(
            bytes.1 > MIN_RECORDS_BEFORE_COMPACTION,
            "compaction had cause to run"
        );

        let loaded = StateLog::new(store)
            .expect("reopen")
            .load()
            .await
            .expect("load");
        let mut expected = vec![("f/1".to_owned(), 2)];
        expected.extend((3..600).map(|i| (format!("f/{i}"), 1)));
        expected.sort();
        assert_eq!(filters(&loaded, "d/1"), expected);
        assert!(filters(&loaded, "gone").is_empty());
    }
}
