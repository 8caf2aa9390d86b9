//! The connection's durable-ack pipeline: publishes queued by `packets.rs` become batches
//! stored through `ingest.rs`, up to `APPEND_BATCHES` in flight, and their acks go out strictly
//! in arrival order, each only after its batch settled. It never acknowledges a publish the
//! log did not confirm and never reorders acks.

use std::collections::VecDeque;

use tokio::io::AsyncWrite;
use tokio::task::JoinHandle;

use super::super::clip::clip;
use super::super::codec::{self, Outgoing, Version};
use super::super::ingest::{self, Ingested, Outcome, Pending, Reply};
use super::super::metrics::MqttMetrics;
use super::{ConnError, Connection};
use tern_core::logging::Throttle;
use tern_log::LogPort;

/// Batches of publishes one connection may have in flight to the log at once.
const APPEND_BATCHES: usize = 4;

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// Starts storing the queued publishes unless `APPEND_BATCHES` batches are in flight.
    /// Beside a batch in flight, only a full one (`mqtt.inflight` publishes) starts: small
    /// batches cost more CPU than their overlap saves.
    pub(super) fn start_append(&mut self) {
        let full = usize::from(self.broker.config.inflight);
        let wait = !self.appending.is_empty() && self.pending.len() < full;
        if self.appending.len() >= APPEND_BATCHES || self.pending.is_empty() || wait {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        let previous = self.turn.take();
        let client_id = self.client_id.clone();
        let (work, turn) = ingest::ingest(self.broker.clone(), client_id, batch, previous);
        self.turn = Some(turn);
        self.appending.push_back(tokio::spawn(work));
    }

    /// Sends the acks of the oldest batch (which `join_oldest` saw finish), in order, and
    /// starts the next batch.
    pub(super) fn stored(
        &mut self,
        done: Result<Ingested, tokio::task::JoinError>,
    ) -> Result<(), ConnError> {
        self.appending.pop_front();
        let (batch, outcomes) = done?;
        let mut acks = 0;
        for (pending, outcome) in batch.iter().zip(outcomes) {
            acks += u64::from(self.settle(pending, outcome)?);
        }
        // One shared counter update per batch, not per message.
        MqttMetrics::add(&self.broker.metrics.acks_sent, acks);
        self.start_append();
        Ok(())
    }

    /// Acknowledges (or refuses) one publish; `true` if it was acknowledged as stored.
    fn settle(&mut self, pending: &Pending, outcome: Outcome) -> Result<bool, ConnError> {
        match outcome {
            Outcome::Stored => {
                if let Reply::PubRec(pkid) = pending.ack {
                    self.session.pending_qos2.insert(pkid);
                }
                self.send_ack(pending.ack, false)?;
                Ok(pending.ack != Reply::None)
            }
            Outcome::Full => {
                MqttMetrics::inc(&self.broker.metrics.publishes_rejected);
                // A full log refuses every publish: one line per 10 s, not one per message.
                static FULL: Throttle = Throttle::new(std::time::Duration::from_secs(10));
                if let Some(left_out) = FULL.due() {
                    tracing::warn!(client_id = %clip(&self.client_id), left_out, "log full: publish refused (the partition's cursors and readiness: /readyz, tern cursors list)");
                }
                match self.version {
                    Version::V5 => self.send_ack(pending.ack, true)?,
                    Version::V4 => {}
                }
                Ok(false)
            }
            Outcome::Failed(err) => Err(ConnError::Ingest(err)),
        }
    }

    fn send_ack(&mut self, ack: Reply, quota_exceeded: bool) -> Result<(), ConnError> {
        // The Receive Maximum quota of a publish ends with its PUBACK, or with a refusing
        // PUBREC; an accepted QoS 2 publish holds it until PUBCOMP.
        match ack {
            Reply::PubAck(pkid)
            | Reply::NotAuthorized { pkid, .. }
            | Reply::QuotaExceeded { pkid, .. } => self.inbound.release(pkid),
            Reply::PubRec(pkid) if quota_exceeded => self.inbound.release(pkid),
            Reply::PubRec(_) | Reply::None => {}
        }
        match ack {
            Reply::None => Ok(()),
            Reply::PubAck(pkid) if !quota_exceeded => {
                codec::put_puback(pkid, &mut self.out);
                Ok(())
            }
            Reply::PubAck(pkid) => self.send(Outgoing::PubAck {
                pkid,
                reason: codec::PubAckReason::QuotaExceeded,
            }),
            Reply::PubRec(pkid) => {
                let reason = if quota_exceeded {
                    codec::PubRecReason::QuotaExceeded
                } else {
                    codec::PubRecReason::Success
                };
                self.send(Outgoing::PubRec { pkid, reason })
            }
            Reply::NotAuthorized { pkid, exactly_once } => {
                self.send_not_authorized(pkid, exactly_once)
            }
            Reply::QuotaExceeded {
                pkid,
                exactly_once: true,
            } => {
                let reason = codec::PubRecReason::QuotaExceeded;
                self.send(Outgoing::PubRec { pkid, reason })
            }
            Reply::QuotaExceeded { pkid, .. } => {
                let reason = codec::PubAckReason::QuotaExceeded;
                self.send(Outgoing::PubAck { pkid, reason })
            }
        }
    }

    /// Waits for every queued publish to be settled, and every subscription change to be
    /// stored (graceful shutdown, DISCONNECT).
    pub(super) async fn drain_appends(&mut self) -> Result<(), ConnError> {
        self.drain_saves().await?;
        self.start_append();
        while !self.appending.is_empty() {
            let done = join_oldest(&mut self.appending).await;
            self.stored(done)?;
        }
        self.flush().await
    }

    /// Waits for the batches and the subscription save still running after a failed drain,
    /// without sending their acks: no task of a connection outlives it (the listener's join of
    /// its connections covers their log writes).
    pub(super) async fn join_leftovers(&mut self) {
        for task in self.appending.drain(..) {
            let _ = task.await;
        }
        self.saves.join().await;
    }
}

/// Awaits the oldest task (leaving it queued); never resolves when there is none.
pub(super) async fn join_oldest<T>(
    tasks: &mut VecDeque<JoinHandle<T>>,
) -> Result<T, tokio::task::JoinError> {
    match tasks.front_mut() {
        Some(handle) => handle.await,
        None => std::future::pending().await,
    }
}
