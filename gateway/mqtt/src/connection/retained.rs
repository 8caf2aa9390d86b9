//! Retained messages for a connection: refusing a retained publish past the table's limits
//! (answered in order with the other acks, never stored) and sending the retained messages of
//! a new subscription through the same in-flight window (Receive Maximum, queued bytes) and
//! output high-water mark as every other delivery. A subscription's retained messages are
//! walked in topic order from the broker's table, one at a time, resuming after the last topic
//! sent; nothing is copied ahead, so a subscriber that never reads holds one entry per filter.

use tokio::io::AsyncWrite;

use super::super::codec::{InPublish, QoS};
use super::super::ingest::{Pending, Reply};
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
                let Some(message) = retained.next_matching(&filter, after.as_deref()) else {
                    break;
                };
                after = Some(message.topic.clone());
                self.deliver(message, &matched, None)?;
            }
        }
        Ok(())
    }
}
