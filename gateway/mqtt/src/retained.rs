//! Retained messages: the latest retained message per MQTT topic, persisted through the state
//! log (`state.rs`) before the publish is acknowledged and rebuilt from it at startup. A retained
//! publish with an empty payload clears its topic. Bounded: at most `mqtt.max_retained` topics
//! and `mqtt.max_retained_bytes` of topic and payload bytes; a new or larger message past
//! either is refused ([`Retained::admits`] before the publish is stored, and again when it is
//! settled, for publishes that raced). Memory holds the topics and their sizes; the messages
//! stay in the state log, read back from it when a subscription walks the table in topic
//! order ([`Retained::next_matching`]). A retained publish is visible from the moment its
//! connection accepts it ([`Retained::announce`]), before its record and state record are
//! durable: a SUBSCRIBE that follows it (on any connection, and before its live delivery) gets
//! it, as with Mosquitto; the early copy is dropped if the publish is not stored. Never
//! delivers anything itself.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use super::clip::clip;
use super::message::Message;
use super::metrics::MqttMetrics;
use super::state::{StateError, StateLog, retained_key};
use super::topic;
use tern_log::LogPort;

/// How many topics and bytes the table may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainedLimits {
    pub count: usize,
    pub bytes: u64,
}

/// The retained-message table.
#[derive(Debug)]
pub struct Retained<S> {
    table: Mutex<Table>,
    state: Arc<StateLog<S>>,
    limits: RetainedLimits,
    metrics: Arc<MqttMetrics>,
}

#[derive(Debug, Default)]
struct Table {
    /// Retained topics and their payload sizes.
    messages: BTreeMap<String, usize>,
    bytes: u64,
    /// Retained publishes accepted but not settled yet, the newest per topic (an empty
    /// payload clears); they hide the durable entry of their topic.
    early: BTreeMap<String, Message>,
}

/// What a retained message counts against `max_retained_bytes`.
fn size(topic: &str, payload_len: usize) -> u64 {
    (topic.len() + payload_len) as u64
}

impl Table {
    /// Whether storing `payload_len` bytes under `topic` stays within `limits`.
    fn fits(&self, limits: RetainedLimits, topic: &str, payload_len: usize) -> bool {
        let old = self.messages.get(topic);
        let old_bytes = old.map_or(0, |len| size(topic, *len));
        let count = self.messages.len() + usize::from(old.is_none());
        let bytes = self.bytes - old_bytes + size(topic, payload_len);
        payload_len == 0 || (count <= limits.count && bytes <= limits.bytes)
    }

    fn insert(&mut self, topic: String, payload_len: usize) {
        self.bytes += size(&topic, payload_len);
        if let Some(old) = self.messages.insert(topic.clone(), payload_len) {
            self.bytes -= size(&topic, old);
        }
    }

    fn remove(&mut self, topic: &str) {
        if let Some(old) = self.messages.remove(topic) {
            self.bytes -= size(topic, old);
        }
    }

    /// Forgets the early copy of `message` unless a newer publish replaced it.
    fn settle_early(&mut self, message: &Message) {
        if self.early.get(&*message.topic) == Some(message) {
            self.early.remove(&*message.topic);
        }
    }

    /// The first topic after `from` matching `filter`, with its early copy if it has one.
    fn next_topic(&self, filter: &str, from: Bound<&str>) -> Option<(String, Option<Message>)> {
        let durable = self
            .messages
            .range::<str, _>((from, Bound::Unbounded))
            .map(|(topic, _)| topic)
            .filter(|topic| !self.early.contains_key(*topic))
            .find(|topic| topic::matches(filter, topic));
        let early = self
            .early
            .range::<str, _>((from, Bound::Unbounded))
            .filter(|(_, message)| !message.payload.is_empty())
            .find(|(topic, _)| topic::matches(filter, topic));
        match (durable, early) {
            (Some(durable), Some((topic, _))) if durable < topic => Some((durable.clone(), None)),
            (_, Some((topic, message))) => Some((topic.clone(), Some(message.clone()))),
            (durable, None) => durable.map(|topic| (topic.clone(), None)),
        }
    }
}

impl<S: LogPort> Retained<S> {
    /// The table of what the state log held at startup, all of it (limits apply to new
    /// messages; a table over them after a configuration change only shrinks).
    pub fn new(
        state: Arc<StateLog<S>>,
        loaded: impl IntoIterator<Item = (String, usize)>,
        limits: RetainedLimits,
        metrics: Arc<MqttMetrics>,
    ) -> Self {
        let mut table = Table::default();
        for (topic, payload_len) in loaded {
            table.insert(topic, payload_len);
        }
        let retained = Self {
            table: Mutex::new(table),
            state,
            limits,
            metrics,
        };
        retained.publish_gauges(&retained.lock());
        retained
    }

    /// Whether a retained publish of `payload_len` bytes on `topic` would be kept; counts
    /// and logs a refusal.
    pub fn admits(&self, topic: &str, payload_len: usize, client_id: &str) -> bool {
        let fits = self.lock().fits(self.limits, topic, payload_len);
        if !fits {
            MqttMetrics::inc(&self.metrics.retained_refused);
            tracing::warn!(
                client_id = %clip(client_id),
                topic = %clip(topic),
                payload_len,
                max_retained = self.limits.count,
                max_retained_bytes = self.limits.bytes,
                "retained message refused: mqtt.max_retained or mqtt.max_retained_bytes reached"
            );
        }
        fits
    }

    /// Makes a retained publish the connection accepted visible at once, before it is stored
    /// ([`Retained::update`] or [`Retained::withdraw`] settles it).
    pub fn announce(&self, message: &Message) {
        self.lock()
            .early
            .insert(message.topic.to_string(), message.clone());
    }

    /// Drops the early copy of a retained publish that was not stored.
    pub fn withdraw(&self, message: &Message) {
        self.lock().settle_early(message);
    }

    /// Durably stores (or clears, for an empty payload) the retained message of its topic;
    /// one over the limits (a publish that raced others past [`Retained::admits`]) is stored
    /// in the log but not retained.
    pub async fn update(&self, message: Message) -> Result<(), StateError> {
        if !self.admits(&message.topic, message.payload.len(), &message.client_id) {
            self.withdraw(&message);
            return Ok(());
        }
        let topic = message.topic.to_string();
        let payload_len = message.payload.len();
        self.state
            .put_retained(&message, || {
                let mut table = self.lock();
                if payload_len == 0 {
                    table.remove(&topic);
                } else {
                    table.insert(topic, payload_len);
                }
                table.settle_early(&message);
                self.publish_gauges(&table);
            })
            .await
    }

    /// The first retained message after topic `after` (from the start: `None`), in topic
    /// order, whose topic matches `filter`, and whether it is an early copy (not stored yet:
    /// its record may still be delivered live). A stored one is read from the state log; one
    /// the log cannot give back (damaged) is skipped with a warning.
    pub fn next_matching(&self, filter: &str, after: Option<&str>) -> Option<(Message, bool)> {
        let mut after = after.map(str::to_owned);
        loop {
            let from = match after.as_deref() {
                Some(topic) => Bound::Excluded(topic),
                None => Bound::Unbounded,
            };
            let (topic, early) = self.lock().next_topic(filter, from)?;
            if let Some(message) = early {
                return Some((message, true));
            }
            let read = self.state.get(retained_key(&topic).as_bytes());
            match read.map(|r| r.as_ref().and_then(Message::from_record)) {
                Ok(Some(message)) => return Some((message, false)),
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(topic = %clip(&topic), %err, "cannot read a retained message");
                }
            }
            after = Some(topic);
        }
    }

    /// Every retained message matching `filter`, in topic order.
    #[cfg(test)]
    pub fn matching(&self, filter: &str) -> Vec<Message> {
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        while let Some((next, _)) = self.next_matching(filter, after.as_deref()) {
            after = Some(next.topic.to_string());
            found.push(next);
        }
        found
    }

    fn publish_gauges(&self, table: &Table) {
        let metrics = &self.metrics;
        let count = table.messages.len() as u64;
        metrics
            .retained_messages
            .store(count, std::sync::atomic::Ordering::Relaxed);
        metrics
            .retained_bytes
            .store(table.bytes, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::codec::QoS;
    use super::*;
    use tern_log::MemoryLog;

    fn message(topic: &str, payload: &'static [u8]) -> Message {
        Message {
            topic: topic.into(),
            payload: Bytes::from_static(payload),
            qos: QoS::AtMostOnce,
            retain: true,
            client_id: "c".into(),
            properties: None,
            timestamp_ms: 1,
        }
    }

    const LIMITS: RetainedLimits = RetainedLimits {
        count: 100,
        bytes: 1 << 20,
    };

    fn all(retained: &Retained<MemoryLog>, filter: &str) -> Vec<Message> {
        retained.matching(filter)
    }

    #[tokio::test]
    async fn retained_messages_survive_a_reload_and_empty_payloads_clear() {
        let log = MemoryLog::new(1);
        let state = Arc::new(StateLog::new(log.clone()).expect("state"));
        let metrics = Arc::new(MqttMetrics::default());
        let retained = Retained::new(state, Vec::new(), LIMITS, metrics.clone());
        retained.update(message("a/1", b"x")).await.expect("update");
        retained.update(message("a/2", b"y")).await.expect("update");
        retained
            .update(message("$SYS/x", b"z"))
            .await
            .expect("update");
        retained.update(message("a/1", b"")).await.expect("clear");
        assert_eq!(all(&retained, "a/+"), vec![message("a/2", b"y")]);
        assert_eq!(all(&retained, "#"), vec![message("a/2", b"y")]);

        let state = Arc::new(StateLog::new(log).expect("state"));
        let loaded = state.load().await.expect("load");
        let reloaded = Retained::new(state, loaded.retained, LIMITS, metrics);
        assert_eq!(reloaded.lock().messages.len(), 2);
        assert_eq!(all(&reloaded, "a/#"), vec![message("a/2", b"y")]);
    }

    #[tokio::test]
    async fn messages_are_read_back_from_the_log_across_compactions() {
        let log = MemoryLog::new(1);
        let state = Arc::new(StateLog::new(log.clone()).expect("state"));
        let metrics = Arc::new(MqttMetrics::default());
        let retained = Retained::new(state, Vec::new(), LIMITS, metrics.clone());
        retained
            .update(message("keep", b"k"))
            .await
            .expect("update");
        let payloads: [&'static [u8]; 2] = [b"odd", b"even"];
        for i in 0..2500 {
            let payload = payloads[i % 2];
            retained
                .update(message("moving", payload))
                .await
                .expect("update");
        }
        let (start, _) = log.offsets("__mqtt_state", 0).expect("offsets");
        let cursor = log.cursor("mqtt-state", "__mqtt_state", 0).expect("cursor");
        assert!(cursor > start, "compaction moved the state cursor");
        let expected = vec![message("keep", b"k"), message("moving", b"even")];
        assert_eq!(all(&retained, "#"), expected);
        let state = Arc::new(StateLog::new(log).expect("state"));
        let loaded = state.load().await.expect("load");
        let reloaded = Retained::new(state, loaded.retained, LIMITS, metrics);
        assert_eq!(all(&reloaded, "#"), expected);
    }

    #[tokio::test]
    async fn an_announced_message_is_retained_until_withdrawn_or_stored() {
        let state = Arc::new(StateLog::new(MemoryLog::new(1)).expect("state"));
        let retained = Retained::new(state, Vec::new(), LIMITS, Arc::default());
        retained.update(message("a", b"old")).await.expect("update");
        retained.announce(&message("a", b"new"));
        retained.announce(&message("b", b"b"));
        let early = retained.next_matching("#", None);
        assert_eq!(
            early,
            Some((message("a", b"new"), true)),
            "hides the stored one"
        );
        assert_eq!(
            all(&retained, "#"),
            [message("a", b"new"), message("b", b"b")]
        );
        retained.withdraw(&message("b", b"b"));
        retained.announce(&message("a", b""));
        assert_eq!(all(&retained, "#"), [], "an announced clear hides it too");
        retained.update(message("a", b"new")).await.expect("update");
        assert_eq!(all(&retained, "#"), [], "a newer announcement stays");
        retained.update(message("a", b"")).await.expect("clear");
        retained.update(message("c", b"c")).await.expect("update");
        assert_eq!(
            retained.next_matching("#", None),
            Some((message("c", b"c"), false))
        );
    }

    #[tokio::test]
    async fn the_count_and_byte_limits_refuse_new_and_larger_messages() {
        let state = Arc::new(StateLog::new(MemoryLog::new(1)).expect("state"));
        let metrics = Arc::new(MqttMetrics::default());
        let limits = RetainedLimits { count: 2, bytes: 8 };
        let retained = Retained::new(state, Vec::new(), limits, metrics.clone());
        retained.update(message("a", b"123")).await.expect("update");
        retained.update(message("b", b"12")).await.expect("update");
        assert!(!retained.admits("c", 1, "c"), "a third topic");
        assert!(!retained.admits("a", 5, "c"), "too many bytes");
        assert!(retained.admits("a", 4, "c"), "replacing within the bytes");
        retained
            .update(message("c", b"1"))
            .await
            .expect("not retained");
        assert_eq!(all(&retained, "#").len(), 2);
        assert!(retained.admits("c", 0, "c"), "clearing is always allowed");
        retained.update(message("a", b"")).await.expect("clear");
        assert!(retained.admits("c", 1, "c"));
        let gauge = metrics
            .retained_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(gauge, 3);
        let refused = metrics
            .retained_refused
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(refused, 3);
    }
}
