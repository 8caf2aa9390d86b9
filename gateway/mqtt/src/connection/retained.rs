//! Retained messages for a connection: refusing a retained publish past the table's limits
//! (answered in order with the other acks, never stored) and sending the retained messages of
//! a new subscription through the same in-flight window (Receive Maximum, queued bytes) and
//! output high-water mark as every other delivery. A subscription's retained messages are
//! walked in topic order from the broker's table, one at a time, resuming after the last topic
//! sent; nothing is copied ahead, so a subscriber that never reads holds one entry per filter.
//! A retained message sent before it was stored (`retained.rs`, "early") is remembered, and its
//! record is not delivered live again when this connection reads it from the log.

use tokio::io::AsyncWrite;

use super::super::codec::{InPublish, QoS};
use super::super::ingest::{Pending, Reply};
use super::super::message::Message;
use super::super::session::Matched;
use super::delivery::OUT_HIGH_WATER;
use super::{ConnError, Connection};
use tern_log::LogPort;

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// Checks a retained publish against the table's limits; when refused, queues its answer
    /// and returns false.
    pub(super) fn admit_retained(&mut self, publish: &InPublish, topic: &str) -> bool {
        let retained = &self.broker.retained;
        if !publish.retain || retained.admits(topic, publish.payload.len(), &self.client_id) {
            return true;
        }
        if publish.qos != QoS::AtMostOnce {
            self.pending.push(Pending {
                message: None,
                ack: Reply::QuotaExceeded {
                    pkid: publish.pkid,
                    exactly_once: publish.qos == QoS::ExactlyOnce,
                },
                durable_qos2: false,
            });
        }
        false
    }

    /// Schedules the retained messages matching `filter` (again from the first, when the
    /// filter was already scheduled).
    pub(super) fn queue_retained(&mut self, filter: String, matched: Matched) {
        self.retained_due.retain(|(queued, ..)| *queued != filter);
        self.retained_due.push_back((filter, matched, None));
    }

    /// Sends scheduled retained messages while the window and the output buffer have room.
    pub(super) fn pump_retained(&mut self) -> Result<(), ConnError> {
        while let Some((filter, matched, mut after)) = self.retained_due.pop_front() {
            loop {
                let full = self.window_full();
                if full || self.out.len() >= OUT_HIGH_WATER {
                    if !full {
                        self.wake.notify_one();
                    }
                    self.retained_due.push_front((filter, matched, after));
                    return Ok(());
                }
                let retained = &self.broker.retained;
                let Some((message, early)) = retained.next_matching(&filter, after.as_deref())
                else {
                    break;
                };
                after = Some(message.topic.to_string());
                if early {
                    self.sent_early(&message);
                }
                self.deliver(message, &matched, None)?;
            }
        }
        Ok(())
    }

    /// Remembers a retained message sent before it was stored, so its record, which this
    /// connection may still read from the log, is not delivered a second time.
    fn sent_early(&mut self, message: &Message) {
        if self.retained_early.len() >= EARLY_KEPT {
            self.retained_early.pop_front();
        }
        self.retained_early.push_back(message.clone());
    }

    /// Whether a record read from the log is a retained message already sent early (then
    /// forgotten: it is skipped once).
    pub(super) fn was_sent_early(&mut self, message: &Message) -> bool {
        let same = |early: &Message| {
            early.timestamp_ms == message.timestamp_ms
                && early.topic == message.topic
                && early.client_id == message.client_id
                && early.payload == message.payload
        };
        match self.retained_early.iter().position(same) {
            Some(at) => {
                self.retained_early.remove(at);
                true
            }
            None => false,
        }
    }
}

/// Retained messages sent early that a connection remembers (a publish that was never stored
/// leaves its entry until newer ones push it out).
const EARLY_KEPT: usize = 16;
