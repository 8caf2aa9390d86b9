//! Retained messages: the latest retained message per MQTT topic, persisted through the state
//! log (`state.rs`) before the publish is acknowledged and rebuilt from it at startup. A retained
//! publish with an empty payload clears its topic. Never delivers anything itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::message::Message;
use super::state::{StateError, StateLog};
use super::topic;
use tern_log::LogPort;

/// The retained-message table.
#[derive(Debug)]
pub struct Retained<S> {
    map: Mutex<HashMap<String, Message>>,
    state: Arc<StateLog<S>>,
}

impl<S: LogPort> Retained<S> {
    pub fn new(state: Arc<StateLog<S>>, loaded: HashMap<String, Message>) -> Self {
        Self {
            map: Mutex::new(loaded),
            state,
        }
    }

    /// Durably stores (or clears, for an empty payload) the retained message of its topic.
    pub async fn update(&self, message: Message) -> Result<(), StateError> {
        let topic = message.topic.clone();
        let clear = message.payload.is_empty();
        let stored = message.clone();
        self.state
            .put_retained(&message, move || {
                let mut map = self.lock();
                if clear {
                    map.remove(&topic);
                } else {
                    map.insert(topic, stored);
                }
            })
            .await
    }

    /// Retained messages whose topic matches `filter`, in topic order.
    pub fn matching(&self, filter: &str) -> Vec<Message> {
        let mut found: Vec<Message> = self
            .lock()
            .iter()
            .filter(|(topic, _)| topic::matches(filter, topic))
            .map(|(_, message)| message.clone())
            .collect();
        found.sort_by(|a, b| a.topic.cmp(&b.topic));
        found
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Message>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
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
            topic: topic.to_owned(),
            payload: Bytes::from_static(payload),
            qos: QoS::AtMostOnce,
            retain: true,
            client_id: "c".to_owned(),
            properties: None,
            timestamp_ms: 1,
        }
    }

    #[tokio::test]
    async fn retained_messages_survive_a_reload_and_empty_payloads_clear() {
        let log = MemoryLog::new(1);
        let state = Arc::new(StateLog::new(log.clone()).expect("state"));
        let retained = Retained::new(state, HashMap::new());
        retained.update(message("a/1", b"x")).await.expect("update");
        retained.update(message("a/2", b"y")).await.expect("update");
        retained
            .update(message("$SYS/x", b"z"))
            .await
            .expect("update");
        retained.update(message("a/1", b"")).await.expect("clear");
        assert_eq!(retained.matching("a/+"), vec![message("a/2", b"y")]);
        assert_eq!(retained.matching("#"), vec![message("a/2", b"y")]);

        let state = Arc::new(StateLog::new(log).expect("state"));
        let loaded = state.load().await.expect("load");
        let reloaded = Retained::new(state, loaded.retained);
        assert_eq!(reloaded.len(), 2);
        assert_eq!(reloaded.matching("a/#"), vec![message("a/2", b"y")]);
    }
}
