//! The MQTT server's own durable state — retained messages, persistent sessions' subscriptions,
//! incoming QoS 2 packet ids awaiting PUBREL and outgoing QoS 2 deliveries awaiting PUBCOMP —
//! kept append-only in the internal log topic `__mqtt_state` (partition 0). Each record is a key
//! (`retained/{topic}`, `session/{client}`, `sub/{client}\0{filter}`, `qos2/{client}/{pkid}`,
//! `qos2out/{client}/{pkid}`) and a value; the latest record per key wins and an empty value
//! deletes. A session's record holds its expiry and all its subscriptions as of its last
//! CONNECT; each SUBSCRIBE or UNSUBSCRIBE after it appends only the filters it changed as
//! `sub/` records (NUL cannot occur in a client id or a filter), folded over the session's
//! record at startup, so a session of n subscriptions costs O(n) bytes, not O(n²).
//! At startup the topic is folded into memory. Writes are serialized so the in-memory view and
//! the durable order agree. Compaction is append-only too: when dead records outnumber live
//! ones, every live record is appended again as a snapshot and the cursor `mqtt-state` moves to
//! the snapshot, so log retention may delete what lies before it — and nothing after it.
//! Memory holds each live key's offset, not its record: the snapshot and [`StateLog::get`]
//! (retained payloads) read records back from the log. Never holds message data.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::router::PartitionId;
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::codec::QoS;
use super::message::Message;
use tern_log::{LogError, LogPort, Record};

/// Why a state record could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("cannot encode {what} for {STATE_TOPIC}: {source}")]
    Encode {
        what: &'static str,
        source: serde_json::Error,
    },
}

/// The internal log topic.
pub const STATE_TOPIC: &str = "__mqtt_state";
/// The cursor that keeps retention away from live state records.
pub const STATE_CURSOR: &str = "mqtt-state";
const READ_CHUNK: usize = 256 * 1024;
/// Snapshot records per append (the log caps one batch at 16 MiB).
const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Compaction never runs before this many records were appended since the last snapshot.
const MIN_RECORDS_BEFORE_COMPACTION: u64 = 1024;

/// A persistent session as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSession {
    /// Session expiry in seconds; `u32::MAX` never expires.
    pub expiry: u32,
    pub subscriptions: Vec<StoredSubscription>,
    /// Incoming QoS 2 packet ids whose PUBREC was sent and PUBREL not yet received.
    #[serde(skip)]
    pub pending_qos2: HashSet<u16>,
    /// Outgoing QoS 2 deliveries whose PUBREC came (PUBREL sent) and PUBCOMP did not, by
    /// packet id.
    #[serde(skip)]
    pub released: BTreeMap<u16, Released>,
}

/// An outgoing QoS 2 delivery released by PUBREC: the record it carried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
}

impl Released {
    pub fn new((topic, partition): &PartitionId, offset: u64) -> Self {
        Self {
            topic: topic.clone(),
            partition: *partition,
            offset,
        }
    }

    pub fn source(&self) -> (PartitionId, u64) {
        ((self.topic.clone(), self.partition), self.offset)
    }
}

/// One subscription as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSubscription {
    pub filter: String,
    /// Granted QoS, 0..=2.
    pub qos: u8,
    #[serde(default)]
    pub no_local: bool,
    #[serde(default)]
    pub retain_as_published: bool,
    #[serde(default)]
    pub id: Option<usize>,
}

/// Everything folded from the state topic.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Retained topics and their payload sizes (the messages stay in the log).
    pub retained: HashMap<String, usize>,
    pub sessions: HashMap<String, StoredSession>,
    /// How many records were read (compaction heuristics and logs).
    pub records: u64,
    /// Pending QoS 2 ids per client, merged into `sessions` at the end of the fold.
    qos2: HashMap<String, HashSet<u16>>,
    /// Released outgoing QoS 2 deliveries per client, merged into `sessions` at the end.
    released: HashMap<String, BTreeMap<u16, Released>>,
    /// Subscription changes since each client's session record (`None`: unsubscribed),
    /// merged into `sessions` at the end.
    subscriptions: HashMap<String, BTreeMap<String, Option<StoredSubscription>>>,
}

/// Serialized writer of the state topic.
#[derive(Debug)]
pub struct StateLog<S> {
    log: S,
    writer: tokio::sync::Mutex<()>,
    live: Mutex<Live>,
}

/// The offset of the latest non-deleting record per key, and the appends since the last
/// snapshot.
#[derive(Debug, Default)]
struct Live {
    records: BTreeMap<Vec<u8>, u64>,
    appended: u64,
}

impl<S: LogPort> StateLog<S> {
    pub fn new(log: S) -> Result<Self, LogError> {
        log.ensure_topic(STATE_TOPIC)?;
        Ok(Self {
            log,
            writer: tokio::sync::Mutex::new(()),
            live: Mutex::default(),
        })
    }

    /// Reads the whole state topic and folds it; pins it against retention on first use.
    pub async fn load(&self) -> Result<Loaded, LogError> {
        let (start, end) = self.log.offsets(STATE_TOPIC, 0)?;
        if self.log.cursor(STATE_CURSOR, STATE_TOPIC, 0).is_none() {
            self.log
                .commit_cursor(STATE_CURSOR, STATE_TOPIC, 0, start)
                .await?;
        }
        let mut loaded = Loaded::default();
        let mut live = Live::default();
        let mut next = start;
        while next < end {
            let batch = self.log.read(STATE_TOPIC, 0, next, READ_CHUNK)?;
            let Some(last) = batch.last() else { break };
            next = last.offset + 1;
            for stored in batch {
                loaded.records += 1;
                apply(&mut loaded, &stored.record);
                live.remember(&stored.record, stored.offset);
            }
        }
        live.appended = loaded.records;
        for (client, pending) in std::mem::take(&mut loaded.qos2) {
            if let Some(session) = loaded.sessions.get_mut(&client) {
                session.pending_qos2 = pending;
            }
        }
        for (client, released) in std::mem::take(&mut loaded.released) {
            if let Some(session) = loaded.sessions.get_mut(&client) {
                session.released = released;
            }
        }
        for (client, changes) in std::mem::take(&mut loaded.subscriptions) {
            if let Some(session) = loaded.sessions.get_mut(&client) {
                merge_subscriptions(session, changes);
            }
        }
        *self.lock_live() = live;
        Ok(loaded)
    }

    fn lock_live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest record of `key`, read back from the log; `None` when the key is deleted (or
    /// its record was lost to damage).
    pub fn get(&self, key: &[u8]) -> Result<Option<Record>, LogError> {
        // A snapshot may move the record between reading its offset and reading it: retry.
        for _ in 0..2 {
            let Some(offset) = self.lock_live().records.get(key).copied() else {
                return Ok(None);
            };
            match self.read_at(offset) {
                Ok(Some(record)) => return Ok(Some(record)),
                Ok(None) | Err(LogError::OffsetOutOfRange { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }

    /// The record at `offset`, if the log still has it there.
    fn read_at(&self, offset: u64) -> Result<Option<Record>, LogError> {
        let found = self.log.read(STATE_TOPIC, 0, offset, 1)?.into_iter().next();
        Ok(found.filter(|s| s.offset == offset).map(|s| s.record))
    }

    /// Appends every live record again and moves the state cursor to them when dead records
    /// dominate. Runs with the writer held.
    async fn compact_if_due(&self) -> Result<(), LogError> {
        let snapshot: Vec<(Vec<u8>, u64)> = {
            let live = self.lock_live();
            let threshold = MIN_RECORDS_BEFORE_COMPACTION.max(2 * live.records.len() as u64);
            if live.appended < threshold {
                return Ok(());
            }
            live.records.iter().map(|(k, o)| (k.clone(), *o)).collect()
        };
        let mut moved = BTreeMap::new();
        let mut base = None;
        let mut chunk = Vec::new();
        let mut keys = Vec::new();
        let mut chunk_bytes = 0;
        for (key, offset) in snapshot {
            // A record lost to damage has nothing to carry over; its key ends with this
            // snapshot.
            let Some(record) = self.read_at(offset)? else {
                continue;
            };
            chunk_bytes += record.value.len() + 64;
            chunk.push(record);
            keys.push(key);
            if chunk_bytes >= SNAPSHOT_CHUNK_BYTES {
                let records = std::mem::take(&mut chunk);
                let offset = self.log.append(STATE_TOPIC, 0, records).await?;
                base.get_or_insert(offset);
                moved.extend(std::mem::take(&mut keys).into_iter().zip(offset..));
                chunk_bytes = 0;
            }
        }
        if !chunk.is_empty() {
            let offset = self.log.append(STATE_TOPIC, 0, chunk).await?;
            base.get_or_insert(offset);
            moved.extend(keys.into_iter().zip(offset..));
        }
        let count = moved.len() as u64;
        self.lock_live().records = moved;
        let start = match base {
            Some(offset) => offset,
            None => self.log.offsets(STATE_TOPIC, 0)?.1,
        };
        self.log
            .commit_cursor(STATE_CURSOR, STATE_TOPIC, 0, start)
            .await?;
        self.lock_live().appended = count;
        tracing::info!(live = count, from = start, "MQTT state compacted");
        Ok(())
    }

    /// Durably appends a keyed record (an empty value deletes its key), then runs `apply` while still holding
    /// the writer, so memory follows the durable order.
    pub async fn put<T>(&self, record: Record, apply: impl FnOnce() -> T) -> Result<T, StateError> {
        self.put_all(vec![record], apply).await
    }

    /// [`StateLog::put`] of several records in one append.
    async fn put_all<T>(
        &self,
        mut records: Vec<Record>,
        apply: impl FnOnce() -> T,
    ) -> Result<T, StateError> {
        let _guard = self.writer.lock().await;
        let now = super::message::now_ms();
        for record in records.iter_mut().filter(|r| r.timestamp_ms == 0) {
            record.timestamp_ms = now;
        }
        let base = self.log.append(STATE_TOPIC, 0, records.clone()).await?;
        let result = apply();
        {
            let mut live = self.lock_live();
            live.appended += records.len() as u64;
            for (record, offset) in records.iter().zip(base..) {
                live.remember(record, offset);
            }
        }
        if let Err(err) = self.compact_if_due().await {
            tracing::warn!(%err, "MQTT state compaction failed; will retry");
        }
        Ok(result)
    }

    /// Stores a retained message (an empty payload clears the topic).
    pub async fn put_retained<T>(
        &self,
        message: &Message,
        apply: impl FnOnce() -> T,
    ) -> Result<T, StateError> {
        let record = message.to_record(Some(retained_key(&message.topic).into_bytes().into()));
        self.put(record, apply).await
    }

    /// Stores (or with `None` deletes) a persistent session's subscriptions and expiry.
    pub async fn put_session(
        &self,
        client_id: &str,
        session: Option<&StoredSession>,
    ) -> Result<(), StateError> {
        let value = match session {
            Some(session) => serde_json::to_vec(session).map_err(|source| StateError::Encode {
                what: "session",
                source,
            })?,
            None => Vec::new(),
        };
        self.put(plain(format!("session/{client_id}"), value), || ())
            .await
    }

    /// Stores what a SUBSCRIBE or UNSUBSCRIBE changed in a persistent session: each filter's
    /// new subscription, or `None` for one removed.
    pub async fn put_subscriptions(
        &self,
        client_id: &str,
        changes: &[(String, Option<StoredSubscription>)],
    ) -> Result<(), StateError> {
        let mut records = Vec::with_capacity(changes.len());
        for (filter, subscription) in changes {
            let value = match subscription {
                Some(s) => serde_json::to_vec(s).map_err(|source| StateError::Encode {
                    what: "subscription",
                    source,
                })?,
                None => Vec::new(),
            };
            records.push(plain(subscription_key(client_id, filter), value));
        }
        if records.is_empty() {
            return Ok(());
        }
        self.put_all(records, || ()).await
    }

    /// Deletes a session: its subscription records, then its own record, in one append.
    pub async fn delete_session(
        &self,
        client_id: &str,
        filters: &[String],
    ) -> Result<(), StateError> {
        let mut records: Vec<Record> = filters
            .iter()
            .map(|filter| plain(subscription_key(client_id, filter), Vec::new()))
            .collect();
        records.push(plain(format!("session/{client_id}"), Vec::new()));
        self.put_all(records, || ()).await
    }

    /// Marks an incoming QoS 2 packet id as received (`true`) or released (`false`).
    pub async fn put_qos2(
        &self,
        client_id: &str,
        pkid: u16,
        pending: bool,
    ) -> Result<(), StateError> {
        let value = if pending { b"1".to_vec() } else { Vec::new() };
        self.put(plain(format!("qos2/{client_id}/{pkid}"), value), || ())
            .await
    }

    /// Records an outgoing QoS 2 delivery as released (`Some`, after PUBREC) or completed
    /// (`None`, after PUBCOMP).
    pub async fn put_released(
        &self,
        client_id: &str,
        pkid: u16,
        released: Option<&Released>,
    ) -> Result<(), StateError> {
        let value = match released {
            Some(released) => {
                serde_json::to_vec(released).map_err(|source| StateError::Encode {
                    what: "released delivery",
                    source,
                })?
            }
            None => Vec::new(),
        };
        self.put(plain(format!("qos2out/{client_id}/{pkid}"), value), || ())
            .await
    }
}

impl Live {
    /// Keeps `record`, stored at `offset`, as its key's latest value, or forgets the key for an
    /// empty value.
    fn remember(&mut self, record: &Record, offset: u64) {
        let Some(key) = record.key.as_ref() else {
            return;
        };
        if record.value.is_empty() {
            self.records.remove(&key[..]);
        } else {
            self.records.insert(key.to_vec(), offset);
        }
    }
}

fn plain(key: String, value: Vec<u8>) -> Record {
    Record {
        timestamp_ms: 0,
        key: Some(key.into_bytes().into()),
        value: value.into(),
        headers: tern_log::Headers::new(),
    }
}

fn subscription_key(client_id: &str, filter: &str) -> String {
    format!("sub/{client_id}\0{filter}")
}

/// Applies subscription changes made after a session's record to it.
fn merge_subscriptions(
    session: &mut StoredSession,
    changes: BTreeMap<String, Option<StoredSubscription>>,
) {
    for (filter, change) in changes {
        let at = session
            .subscriptions
            .iter()
            .position(|s| s.filter == filter);
        match (change, at) {
            (Some(new), Some(at)) => {
                if let Some(old) = session.subscriptions.get_mut(at) {
                    *old = new;
                }
            }
            (Some(new), None) => session.subscriptions.push(new),
            (None, Some(at)) => {
                session.subscriptions.remove(at);
            }
            (None, None) => {}
        }
    }
}

pub fn retained_key(topic: &str) -> String {
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
            Some(message) => loaded
                .retained
                .insert(topic.to_owned(), message.payload.len()),
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
                loaded.qos2.remove(client);
                loaded.released.remove(client);
            }
        }
        // The record holds every subscription up to now; changes before it are in it. (In a
        // compaction snapshot the `sub/` keys follow it and re-apply what it already holds.)
        loaded.subscriptions.remove(client);
    } else if let Some(rest) = key.strip_prefix("sub/") {
        let Some((client, filter)) = rest.split_once('\0') else {
            return;
        };
        let change = serde_json::from_slice::<StoredSubscription>(&record.value).ok();
        let changes = loaded.subscriptions.entry(client.to_owned()).or_default();
        changes.insert(filter.to_owned(), change);
    } else if let Some(rest) = key.strip_prefix("qos2out/") {
        apply_released(loaded, rest, &record.value);
    } else if let Some(rest) = key.strip_prefix("qos2/") {
        let Some((client, pkid)) = rest.rsplit_once('/') else {
            return;
        };
        let Ok(pkid) = pkid.parse::<u16>() else {
            return;
        };
        // Folded apart from the session and merged at the end: a compaction snapshot lists
        // `qos2/` keys before the `session/` key they belong to.
        let pending = loaded.qos2.entry(client.to_owned()).or_default();
        if record.value.is_empty() {
            pending.remove(&pkid);
        } else {
            pending.insert(pkid);
        }
    }
}

/// Folds a `qos2out/{client}/{pkid}` record (`rest` is what follows the prefix).
fn apply_released(loaded: &mut Loaded, rest: &str, value: &[u8]) {
    let Some((client, pkid)) = rest.rsplit_once('/') else {
        return;
    };
    let Ok(pkid) = pkid.parse::<u16>() else {
        return;
    };
    let entry = loaded.released.entry(client.to_owned()).or_default();
    match serde_json::from_slice::<Released>(value) {
        Ok(released) => entry.insert(pkid, released),
        Err(_) => entry.remove(&pkid),
    };
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
mod test;
