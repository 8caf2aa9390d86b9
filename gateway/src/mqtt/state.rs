//! The MQTT server's own durable state — retained messages, persistent sessions' subscriptions
//! and QoS 2 packet ids awaiting PUBREL — kept append-only in the internal log topic
//! `__mqtt_state` (partition 0). Each record is a key (`retained/{topic}`, `session/{client}`,
//! `qos2/{client}/{pkid}`) and a value; the latest record per key wins and an empty value deletes.
//! At startup the topic is folded into memory. Writes are serialized so the in-memory view and
//! the durable order agree. Never holds message data other than retained messages.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::codec::QoS;
use super::message::Message;
use super::store::{Record, Store, StoreError};

/// The internal log topic.
pub const STATE_TOPIC: &str = "__mqtt_state";
const READ_CHUNK: usize = 256 * 1024;

/// A persistent session as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSession {
    /// Session expiry in seconds; `u32::MAX` never expires.
    pub expiry: u32,
    /// (filter, granted QoS 0..=2).
    pub subscriptions: Vec<(String, u8)>,
    /// Incoming QoS 2 packet ids whose PUBREC was sent and PUBREL not yet received.
    #[serde(skip)]
    pub pending_qos2: HashSet<u16>,
}

/// Everything folded from the state topic.
#[derive(Debug, Default)]
pub struct Loaded {
    pub retained: HashMap<String, Message>,
    pub sessions: HashMap<String, StoredSession>,
    /// How many records were read (compaction heuristics and logs).
    pub records: u64,
}

/// Serialized writer of the state topic.
#[derive(Debug)]
pub struct StateLog<S> {
    store: S,
    writer: tokio::sync::Mutex<()>,
}

impl<S: Store> StateLog<S> {
    pub fn new(store: S) -> Result<Self, StoreError> {
        store.ensure_topic(STATE_TOPIC)?;
        Ok(Self {
            store,
            writer: tokio::sync::Mutex::new(()),
        })
    }

    /// Reads the whole state topic and folds it.
    pub fn load(&self) -> Result<Loaded, StoreError> {
        let (start, end) = self.store.offsets(STATE_TOPIC, 0)?;
        let mut loaded = Loaded::default();
        let mut next = start;
        while next < end {
            let batch = self.store.read(STATE_TOPIC, 0, next, READ_CHUNK)?;
            let Some(last) = batch.last() else { break };
            next = last.offset + 1;
            for stored in &batch {
                loaded.records += 1;
                apply(&mut loaded, &stored.record);
            }
        }
        Ok(loaded)
    }

    /// Durably appends a keyed record (an empty value deletes its key), then runs `apply` while still holding
    /// the writer, so memory follows the durable order.
    pub async fn put<T>(
        &self,
        mut record: Record,
        apply: impl FnOnce() -> T,
    ) -> Result<T, StoreError> {
        let _guard = self.writer.lock().await;
        if record.timestamp_ms == 0 {
            record.timestamp_ms = super::message::now_ms();
        }
        self.store.append(STATE_TOPIC, 0, vec![record]).await?;
        Ok(apply())
    }

    /// Stores a retained message (an empty payload clears the topic).
    pub async fn put_retained<T>(
        &self,
        message: &Message,
        apply: impl FnOnce() -> T,
    ) -> Result<T, StoreError> {
        let record = message.to_record(Some(retained_key(&message.topic).into_bytes()));
        self.put(record, apply).await
    }

    /// Stores (or with `None` deletes) a persistent session's subscriptions and expiry.
    pub async fn put_session(
        &self,
        client_id: &str,
        session: Option<&StoredSession>,
    ) -> Result<(), StoreError> {
        let value = match session {
            Some(session) => serde_json::to_vec(session).map_err(|err| StoreError::Failed {
                op: "encode session",
                topic: STATE_TOPIC.to_owned(),
                message: err.to_string(),
            })?,
            None => Vec::new(),
        };
        self.put(plain(format!("session/{client_id}"), value), || ())
            .await
    }

    /// Marks an incoming QoS 2 packet id as received (`true`) or released (`false`).
    pub async fn put_qos2(
        &self,
        client_id: &str,
        pkid: u16,
        pending: bool,
    ) -> Result<(), StoreError> {
        let value = if pending { b"1".to_vec() } else { Vec::new() };
        self.put(plain(format!("qos2/{client_id}/{pkid}"), value), || ())
            .await
    }
}

fn plain(key: String, value: Vec<u8>) -> Record {
    Record {
        timestamp_ms: 0,
        key: Some(key.into_bytes()),
        value,
        headers: Vec::new(),
    }
}

fn retained_key(topic: &str) -> String {
    format!("retained/{topic}")
}

fn apply(loaded: &mut Loaded, record: &Record) {
    let Some(key) = record
        .key
        .as_deref()
        .and_then(|k| std::str::from_utf8(k).ok())
    else {
        return;
    };
    if let Some(topic) = key.strip_prefix("retained/") {
        match Message::from_record(record).filter(|_| !record.value.is_empty()) {
            Some(message) => loaded.retained.insert(topic.to_owned(), message),
            None => loaded.retained.remove(topic),
        };
    } else if let Some(client) = key.strip_prefix("session/") {
        let parsed = serde_json::from_slice::<StoredSession>(&record.value).ok();
        match parsed {
            Some(session) => {
                let entry = loaded.sessions.entry(client.to_owned()).or_default();
                entry.expiry = session.expiry;
                entry.subscriptions = session.subscriptions;
            }
            None => {
                loaded.sessions.remove(client);
            }
        }
    } else if let Some(rest) = key.strip_prefix("qos2/") {
        let Some((client, pkid)) = rest.rsplit_once('/') else {
            return;
        };
        let Ok(pkid) = pkid.parse::<u16>() else {
            return;
        };
        if let Some(session) = loaded.sessions.get_mut(client) {
            if record.value.is_empty() {
                session.pending_qos2.remove(&pkid);
            } else {
                session.pending_qos2.insert(pkid);
            }
        }
    }
}

/// QoS as stored in sessions.
pub fn qos_from_u8(value: u8) -> QoS {
    match value {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::memstore::MemoryStore;
    use super::*;

    fn retained(topic: &str, payload: &'static [u8]) -> Message {
        Message {
            topic: topic.to_owned(),
            payload: Bytes::from_static(payload),
            qos: QoS::AtLeastOnce,
            retain: true,
            client_id: "c".to_owned(),
            properties: None,
            timestamp_ms: 5,
        }
    }

    #[tokio::test]
    async fn state_folds_latest_value_per_key() {
        let store = MemoryStore::new(1);
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
            subscriptions: vec![("x/#".to_owned(), 1)],
            pending_qos2: HashSet::new(),
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

        let loaded = StateLog::new(store).expect("reopen").load().expect("load");
        assert_eq!(loaded.retained.len(), 1);
        assert_eq!(loaded.retained.get("b"), Some(&retained("b", b"2")));
        assert_eq!(loaded.sessions.len(), 1);
        let dev = loaded.sessions.get("dev").expect("dev survives");
        assert_eq!(dev.subscriptions, session.subscriptions);
        assert_eq!(dev.pending_qos2, HashSet::from([8]));
        assert_eq!(loaded.records, 9);
    }
}
