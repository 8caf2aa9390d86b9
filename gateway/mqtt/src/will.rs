//! Will messages: taken from CONNECT, published through the normal ingest path when a
//! connection ends without a clean DISCONNECT (or with MQTT 5 reason 0x04), after the MQTT 5
//! will delay — capped by the session expiry — unless the client reconnected meanwhile. Each
//! waiting will is a task owned by `tasks::Wills` (never detached). Wills live in memory only, so
//! the broker's shutdown is the last moment one can be published: `Wills::close` cuts every
//! remaining delay short, publishes the wills of clients that have not reconnected and waits
//! for them to be stored, before the log closes (docs/mqtt.md, "Wills").

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::broker::{Broker, SessionEntry};
use super::clip::clip;
use super::codec::{Connect, DisconnectReason, PublishProperties};
use super::error::ConnError;
use super::ingest::{self, Outcome, Pending, Reply};
use super::message::{self, Message};
use super::topic::{self, TopicLimits};
use tern_log::LogPort;

/// A will waiting for its connection to end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub message: Message,
    /// MQTT 5 Will Delay Interval in seconds.
    pub delay: u32,
}

impl Will {
    /// The will of a CONNECT, validated like a publish.
    pub fn from_connect(
        connect: &Connect,
        client_id: &str,
        limits: &TopicLimits,
    ) -> Result<Option<Will>, ConnError> {
        let Some(will) = &connect.will else {
            return Ok(None);
        };
        let name = topic::validate_name(&will.topic, limits).map_err(|_| ConnError::Protocol {
            reason: "invalid will topic",
            code: DisconnectReason::TopicNameInvalid,
        })?;
        let properties = connect.will_properties.as_ref();
        let publish_properties = properties.map(|p| PublishProperties {
            payload_format_indicator: p.payload_format_indicator,
            message_expiry_interval: p.message_expiry_interval,
            topic_alias: None,
            response_topic: p.response_topic.clone(),
            correlation_data: p.correlation_data.clone(),
            user_properties: p.user_properties.clone(),
            subscription_identifiers: Vec::new(),
            content_type: p.content_type.clone(),
        });
        Ok(Some(Will {
            message: Message {
                topic: name.into(),
                payload: will.message.clone(),
                qos: will.qos,
                retain: will.retain,
                client_id: client_id.into(),
                properties: publish_properties
                    .filter(|p| *p != PublishProperties::default())
                    .map(Box::new),
                timestamp_ms: 0,
            },
            delay: properties.and_then(|p| p.delay_interval).unwrap_or(0),
        }))
    }
}

/// Publishes `will` after its delay (at most `session_expiry` seconds) unless the session's
/// client reconnects first; at shutdown, at once.
pub async fn schedule<S: LogPort>(
    broker: Arc<Broker<S>>,
    entry: Arc<SessionEntry>,
    will: Will,
    session_expiry: u32,
) {
    let generation = entry.generation.load(Ordering::SeqCst);
    let delay = Duration::from_secs(u64::from(will.delay.min(session_expiry)));
    let mut due = broker.wills.due.clone();
    let client_id = will.message.client_id.clone();
    let wills = Arc::clone(&broker);
    let task = async move {
        if !delay.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = due.wait() => {
                    tracing::info!(client_id = %clip(&will.message.client_id), "server shutting down: publishing a will before its delay ends");
                }
            }
            if entry.generation.load(Ordering::SeqCst) != generation {
                return;
            }
        }
        publish(broker, will.message).await;
    };
    if wills.wills.tasks.spawn(task).await.is_err() {
        tracing::warn!(client_id = %clip(&client_id), "will message dropped: the server is shutting down");
    }
}

async fn publish<S: LogPort>(broker: Arc<Broker<S>>, mut message: Message) {
    message.timestamp_ms = message::now_ms();
    let client_id = message.client_id.clone();
    let topic = message.topic.clone();
    let pending = Pending {
        message: Some(message),
        ack: Reply::None,
        durable_qos2: false,
    };
    let (work, _) = ingest::ingest(broker, client_id.clone(), vec![pending], None);
    let (_, outcomes) = work.await;
    match outcomes.into_iter().next() {
        Some(Outcome::Stored) => {
            tracing::info!(client_id = %clip(&client_id), topic = %clip(&topic), "will message published")
        }
        Some(Outcome::Full) => {
            tracing::warn!(client_id = %clip(&client_id), topic = %clip(&topic), "will message dropped: log full")
        }
        Some(Outcome::Failed(err)) => {
            tracing::error!(client_id = %clip(&client_id), topic = %clip(&topic), %err, "will message not stored")
        }
        None => {}
    }
}
