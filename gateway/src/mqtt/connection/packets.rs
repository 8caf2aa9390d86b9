//! The connected client's packets: PUBLISH into the store queue, PUBREL/PUBACK bookkeeping,
//! SUBSCRIBE/UNSUBSCRIBE, PINGREQ and DISCONNECT; and delivery of log records to the
//! subscriber — reading each subscribed log partition from the session's position, matching
//! records' MQTT topic header against the filters, within the in-flight window, woken by the
//! log's end-offset watch (never polling), with durable cursors for persistent sessions.

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::super::auth::acl::Want;
use super::super::broker::cursor_name;
use super::super::codec::{
    DisconnectReason, DisconnectReasonCode, InPublish, OutPublish, Outgoing, QoS, SubAckCode,
    Subscribe,
};
use super::super::ingest::{Pending, ack_for};
use super::super::message::{self, Message};
use super::super::metrics::MqttMetrics;
use super::super::session::{Inflight, PartitionId};
use super::super::store::{Store, StoreError, StoredRecord};
use super::super::topic;
use super::{ConnError, Connection, Flow};

/// Bytes read from the log per partition and step.
const READ_BYTES: usize = 64 * 1024;
/// Outgoing bytes buffered before the socket must take them.
const OUT_HIGH_WATER: usize = 64 * 1024;

impl<S: Store, W: AsyncWrite + Send + 'static> Connection<S, W> {
    pub(super) async fn handle(&mut self, packet: super::Incoming) -> Result<Flow, ConnError> {
        use super::Incoming as In;
        match packet {
            In::Connect(_) => return Err(protocol("second CONNECT")),
            In::Publish(publish) => self.publish(*publish).await?,
            In::PubAck { pkid } => {
                if self.session.acknowledge(pkid) {
                    self.pump()?;
                }
            }
            In::PubRec { pkid } => self.send(Outgoing::PubRel { pkid })?,
            In::PubComp { .. } => {}
            In::PubRel { pkid } => self.release(pkid).await?,
            In::Subscribe(subscribe) => self.subscribe(subscribe).await?,
            In::Unsubscribe { pkid, filters } => self.unsubscribe(pkid, &filters).await?,
            In::PingReq => self.send(Outgoing::PingResp)?,
            In::Disconnect {
                reason,
                session_expiry,
            } => {
                if let Some(expiry) = session_expiry {
                    if self.session.expiry == 0 && expiry > 0 {
                        return Err(protocol("session expiry set after connecting with 0"));
                    }
                    self.session.expiry = expiry;
                }
                self.drain_appends().await?;
                let will = reason == DisconnectReasonCode::DisconnectWithWillMessage;
                return Ok(Flow::Disconnect { will });
            }
        }
        Ok(Flow::Continue)
    }

    async fn publish(&mut self, publish: InPublish) -> Result<(), ConnError> {
        self.rate.take().await;
        MqttMetrics::inc(&self.broker.metrics.publishes_in);
        let name = match topic::validate_name(&publish.topic, &self.broker.limits) {
            Ok(name) => name.to_owned(),
            Err(err) => {
                MqttMetrics::inc(&self.broker.metrics.publishes_rejected);
                tracing::warn!(client_id = %self.client_id, %err, "invalid topic name");
                return Err(ConnError::Protocol {
                    reason: "invalid topic name",
                    code: DisconnectReason::TopicNameInvalid,
                });
            }
        };
        if !self.admit_publish(&publish, &name) {
            return Ok(());
        }
        let ack = ack_for(publish.qos, publish.pkid);
        if publish.qos == QoS::ExactlyOnce && self.session.pending_qos2.contains(&publish.pkid) {
            self.pending.push(Pending {
                message: None,
                ack,
                durable_qos2: false,
            });
            return Ok(());
        }
        let properties = publish.properties.map(|mut p| {
            p.topic_alias = None;
            p.subscription_identifiers.clear();
            p
        });
        let message = Message {
            topic: name,
            payload: publish.payload,
            qos: publish.qos,
            retain: publish.retain,
            client_id: self.client_id.clone(),
            properties,
            timestamp_ms: message::now_ms(),
        };
        self.pending.push(Pending {
            message: Some(message),
            ack,
            durable_qos2: self.session.persistent(),
        });
        Ok(())
    }

    /// PUBREL: forgets the QoS 2 packet id (durably for persistent sessions), then PUBCOMP.
    async fn release(&mut self, pkid: u16) -> Result<(), ConnError> {
        let known = self.session.pending_qos2.remove(&pkid);
        if known && self.session.persistent() {
            self.broker
                .state
                .put_qos2(&self.client_id, pkid, false)
                .await?;
        }
        self.send(Outgoing::PubComp { pkid })
    }

    async fn subscribe(&mut self, subscribe: Subscribe) -> Result<(), ConnError> {
        let mut codes = Vec::with_capacity(subscribe.filters.len());
        let mut added = Vec::new();
        for (filter, qos) in subscribe.filters {
            if filter.starts_with("$share/") {
                codes.push(SubAckCode::SharedNotSupported);
            } else if let Err(err) = topic::validate_filter(&filter, &self.broker.limits) {
                tracing::info!(client_id = %self.client_id, %filter, %err, "subscription refused");
                codes.push(SubAckCode::TopicFilterInvalid);
            } else if !self.may(Want::Subscribe, &filter) {
                tracing::info!(client_id = ?self.client_id, ?filter, "subscription denied by ACL");
                codes.push(SubAckCode::NotAuthorized);
            } else {
                let granted = if qos == QoS::AtMostOnce {
                    qos
                } else {
                    QoS::AtLeastOnce
                };
                self.session.subscribe(&filter, granted);
                codes.push(SubAckCode::Granted(granted));
                added.push((filter, granted));
            }
        }
        self.track_partitions().await?;
        self.save_session().await?;
        self.send(Outgoing::SubAck {
            pkid: subscribe.pkid,
            codes,
        })?;
        for (filter, granted) in added {
            for message in self.broker.retained.matching(&filter) {
                self.deliver(message, granted, None, true)?;
            }
        }
        self.pump()
    }

    async fn unsubscribe(&mut self, pkid: u16, filters: &[String]) -> Result<(), ConnError> {
        for filter in filters {
            self.session.unsubscribe(filter);
        }
        self.save_session().await?;
        self.send(Outgoing::UnsubAck {
            pkid,
            count: filters.len(),
        })
    }

    /// Durably stores a persistent session's subscriptions.
    async fn save_session(&mut self) -> Result<(), ConnError> {
        if self.session.persistent() {
            let stored = self.session.to_stored();
            self.broker
                .state
                .put_session(&self.client_id, Some(&stored))
                .await?;
            self.session.stored = true;
        }
        Ok(())
    }

    /// Resends unacknowledged deliveries with DUP, sets up positions, and starts delivering.
    pub(super) async fn resume(&mut self) -> Result<(), ConnError> {
        let inflight: Vec<Inflight> = self.session.inflight.values().cloned().collect();
        for mut entry in inflight {
            entry.publish.dup = true;
            self.send(Outgoing::Publish(Box::new(entry.publish)))?;
        }
        self.track_partitions().await?;
        self.wake.notify_one();
        Ok(())
    }

    /// Gives every partition a subscription may read a position and a watcher.
    async fn track_partitions(&mut self) -> Result<(), ConnError> {
        let name = cursor_name(&self.client_id);
        let wanted: Vec<PartitionId> = self
            .session
            .subscriptions
            .iter()
            .flat_map(|s| self.broker.partitions_for(&s.filter))
            .collect();
        for partition in wanted {
            if !self.session.positions.contains_key(&partition) {
                let (topic, p) = (&partition.0, partition.1);
                let saved = self
                    .broker
                    .store
                    .cursor(&name, topic, p)
                    .filter(|_| self.session.stored);
                let start = match saved {
                    Some(offset) => offset,
                    None => {
                        let end = self.broker.store.offsets(topic, p)?.1;
                        if self.session.persistent() {
                            self.broker
                                .store
                                .commit_cursor(&name, topic, p, end)
                                .await?;
                        }
                        end
                    }
                };
                self.session.positions.insert(partition.clone(), start);
            }
            if self.watched.insert(partition.clone()) {
                let mut end = self.broker.store.watch(&partition.0, partition.1)?;
                let wake = self.wake.clone();
                self.watchers.spawn(async move {
                    while end.changed().await.is_ok() {
                        wake.notify_one();
                    }
                });
            }
        }
        Ok(())
    }

    fn window_full(&self) -> bool {
        let window = usize::from(self.broker.config.inflight).min(self.client_receive_max);
        self.session.inflight.len() >= window
            || self.session.inflight_bytes >= self.broker.config.max_queued_bytes.0 as usize
    }

    /// Delivers what the log holds beyond each position, as far as the window allows.
    pub(super) fn pump(&mut self) -> Result<(), ConnError> {
        let partitions: Vec<PartitionId> = self.session.positions.keys().cloned().collect();
        let mut progressed = true;
        while progressed {
            progressed = false;
            for partition in &partitions {
                if self.out.len() >= OUT_HIGH_WATER {
                    self.wake.notify_one();
                    return Ok(());
                }
                if self.window_full() {
                    return Ok(());
                }
                progressed |= self.pump_partition(partition)?;
            }
        }
        Ok(())
    }

    /// One read step of one partition; true if the position moved.
    fn pump_partition(&mut self, partition: &PartitionId) -> Result<bool, ConnError> {
        let Some(&next) = self.session.positions.get(partition) else {
            return Ok(false);
        };
        let records = match self
            .broker
            .store
            .read(&partition.0, partition.1, next, READ_BYTES)
        {
            Ok(records) => records,
            Err(StoreError::OutOfRange { start, .. }) if start > next => {
                tracing::warn!(client_id = %self.client_id, ?partition, next, start, "records expired before delivery");
                self.session.positions.insert(partition.clone(), start);
                return Ok(true);
            }
            Err(err) => return Err(err.into()),
        };
        let mut moved = false;
        for stored in records {
            if self.window_full() || self.out.len() >= OUT_HIGH_WATER {
                break;
            }
            self.session
                .positions
                .insert(partition.clone(), stored.offset + 1);
            if self.session.persistent() {
                self.session.dirty.insert(partition.clone());
            }
            moved = true;
            self.deliver_record(partition, stored)?;
        }
        Ok(moved)
    }

    fn deliver_record(
        &mut self,
        partition: &PartitionId,
        stored: StoredRecord,
    ) -> Result<(), ConnError> {
        let Some(message) = Message::from_record(&stored.record) else {
            return Ok(());
        };
        let Some(granted) = self.session.matching_qos(&message.topic) else {
            return Ok(());
        };
        let source = Some((partition.clone(), stored.offset));
        self.deliver(message, granted, source, false)
    }

    /// Sends one message at min(its QoS, granted QoS, 1).
    fn deliver(
        &mut self,
        message: Message,
        granted: QoS,
        source: Option<(PartitionId, u64)>,
        retain: bool,
    ) -> Result<(), ConnError> {
        let now = message::now_ms();
        if message.expired(now) || !self.may_receive(&message.topic) {
            return Ok(());
        }
        let qos = if message.qos == QoS::AtMostOnce || granted == QoS::AtMostOnce {
            QoS::AtMostOnce
        } else {
            QoS::AtLeastOnce
        };
        let remaining = message.remaining_expiry(now);
        let properties = message.properties.clone().map(|mut p| {
            p.message_expiry_interval = remaining;
            p
        });
        let size = message.topic.len() + message.payload.len() + 16;
        if size > self.client_max_packet {
            return Ok(());
        }
        let mut publish = OutPublish {
            topic: Bytes::from(message.topic.into_bytes()),
            payload: message.payload,
            qos,
            pkid: 0,
            dup: false,
            retain,
            properties,
        };
        if qos == QoS::AtLeastOnce {
            let Some(pkid) = self.session.next_pkid() else {
                return Ok(());
            };
            publish.pkid = pkid;
            let inflight = Inflight {
                source,
                publish: publish.clone(),
                size,
            };
            self.session.add_inflight(pkid, inflight);
        }
        MqttMetrics::inc(&self.broker.metrics.publishes_out);
        self.send(Outgoing::Publish(Box::new(publish)))
    }

    /// Durably stores the cursors that moved (persistent sessions only).
    pub(super) async fn commit_cursors(&mut self) -> Result<(), ConnError> {
        let dirty = std::mem::take(&mut self.session.dirty);
        if !self.session.persistent() {
            return Ok(());
        }
        let name = cursor_name(&self.client_id);
        for partition in dirty {
            let Some(offset) = self.session.cursor(&partition) else {
                continue;
            };
            let store = &self.broker.store;
            if store.cursor(&name, &partition.0, partition.1) != Some(offset) {
                store
                    .commit_cursor(&name, &partition.0, partition.1, offset)
                    .await?;
            }
        }
        Ok(())
    }
}

fn protocol(reason: &'static str) -> ConnError {
    ConnError::Protocol {
        reason,
        code: DisconnectReason::ProtocolError,
    }
}
