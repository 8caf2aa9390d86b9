//! The connected client's packets: PUBLISH into the append queue (Receive Maximum, topic
//! aliases, ACLs), PUBREL, the acknowledgements of deliveries (PUBACK; PUBREC → PUBREL →
//! PUBCOMP), SUBSCRIBE/UNSUBSCRIBE with options, retained messages and a `tern-start`
//! (`replay.rs`; refused per filter with 0x83 and a reason string; stored through the group
//! commit of `saves.rs`), PINGREQ and DISCONNECT.
//! Delivery itself lives in `delivery.rs`, shared subscriptions in `share.rs`.

use std::collections::BTreeMap;

use tokio::io::AsyncWrite;

use super::super::auth::Want;
use super::super::clip::clip;
use super::super::codec::{
    DisconnectReason, DisconnectReasonCode, InPublish, Outgoing, QoS, RetainHandling, SubAckCode,
    Subscribe,
};
use super::super::ingest::{Pending, ack_for};
use super::super::message::{self, ByteString, Message};
use super::super::metrics::MqttMetrics;
use super::super::outcome::Kind;
use super::super::replay::{self, Start, StartError};
use super::super::router::PartitionId;
use super::super::session::{Matched, PubRecOutcome, Subscription};
use super::super::topic;
use super::super::topic::is_shared;
use super::saves::Done;
use super::{ConnError, Connection, Flow};
use tern_log::LogPort;

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    pub(super) async fn handle(&mut self, packet: super::Incoming) -> Result<Flow, ConnError> {
        use super::Incoming as In;
        if let In::PubAck { pkid } | In::PubRec { pkid, .. } | In::PubComp { pkid } = &packet {
            self.resend_acknowledged(*pkid);
        }
        match packet {
            In::Connect(_) => return Err(protocol("second CONNECT")),
            In::Publish(publish) => self.publish(publish)?,
            In::PubAck { pkid } => {
                if let Some(done) = self.session.acknowledged(pkid) {
                    self.note_outcome(done.source, Kind::Delivered, QoS::AtLeastOnce);
                    self.shared_acknowledged(pkid).await;
                    self.deliver_more().await?;
                }
            }
            // Boxed: rarer than PUBLISH and PUBACK, and larger futures that would size every
            // connection's task (idle memory, issue #16).
            In::PubRec { pkid, reason } => Box::pin(self.delivery_received(pkid, reason)).await?,
            In::PubComp { pkid } => Box::pin(self.delivery_complete(pkid)).await?,
            In::PubRel { pkid } => Box::pin(self.release(pkid)).await?,
            In::Subscribe(subscribe) => Box::pin(self.subscribe(subscribe)).await?,
            In::Unsubscribe { pkid, filters } => {
                Box::pin(self.unsubscribe(pkid, &filters)).await?;
            }
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
                Box::pin(self.drain_appends()).await?;
                let will = reason == DisconnectReasonCode::DisconnectWithWillMessage;
                return Ok(Flow::Disconnect { will });
            }
        }
        Ok(Flow::Continue)
    }

    /// PUBREC for a QoS 2 delivery: PUBREL (also for unknown ids), or with a reason code of
    /// 0x80 and above the end of that delivery.
    async fn delivery_received(&mut self, pkid: u16, reason: u8) -> Result<(), ConnError> {
        if reason >= 0x80 {
            tracing::debug!(client_id = %clip(&self.client_id), pkid, reason, "QoS 2 delivery refused");
            if self.session.refused(pkid) {
                self.deliver_more().await?;
            }
            return Ok(());
        }
        match self.session.received(pkid) {
            PubRecOutcome::Released(Some(released)) if self.session.persistent() => {
                let state = &self.broker.state;
                state
                    .put_released(&self.client_id, pkid, Some(&released))
                    .await?;
            }
            PubRecOutcome::Unknown => {
                tracing::debug!(client_id = %clip(&self.client_id), pkid, "PUBREC for an unknown packet id");
            }
            PubRecOutcome::Released(_) | PubRecOutcome::AlreadyReleased => {}
        }
        self.send(Outgoing::PubRel { pkid })
    }

    /// PUBCOMP: the QoS 2 delivery is over (durably for persistent sessions).
    async fn delivery_complete(&mut self, pkid: u16) -> Result<(), ConnError> {
        let Some(done) = self.session.complete(pkid) else {
            return Ok(());
        };
        self.note_outcome(done.source.clone(), Kind::Delivered, QoS::ExactlyOnce);
        if done.released && done.source.is_some() && self.session.persistent() {
            self.broker
                .state
                .put_released(&self.client_id, pkid, None)
                .await?;
        }
        self.deliver_more().await
    }

    pub(super) fn publish(&mut self, mut publish: InPublish) -> Result<(), ConnError> {
        if self.rate.take() {
            self.rate_limited();
        }
        if publish.qos != QoS::AtMostOnce && !self.inbound.admit(publish.pkid) {
            return Err(ConnError::Protocol {
                reason: "more unacknowledged publishes than the Receive Maximum",
                code: DisconnectReason::ReceiveMaximumExceeded,
            });
        }
        let alias = publish.properties.as_ref().and_then(|p| p.topic_alias);
        if let Some(alias) = alias.filter(|_| publish.topic.is_empty()) {
            let known = self.aliases.get(&alias).cloned();
            let topic = known.ok_or_else(|| alias_error("unknown topic alias"))?;
            return self.publish_named(publish, topic);
        }
        let topic = std::mem::take(&mut publish.topic);
        let name = match topic::shared_name(topic, &self.broker.limits) {
            Ok(name) => name,
            Err(err) => {
                MqttMetrics::inc(&self.broker.metrics.publishes_rejected);
                tracing::warn!(client_id = %clip(&self.client_id), %err, "invalid topic name");
                return Err(ConnError::Protocol {
                    reason: "invalid topic name",
                    code: DisconnectReason::TopicNameInvalid,
                });
            }
        };
        if let Some(alias) = alias {
            if alias == 0 || alias > self.broker.config.topic_alias_maximum {
                return Err(alias_error("topic alias out of range"));
            }
            self.aliases.insert(alias, name.clone());
        }
        self.publish_named(publish, name)
    }

    /// Queues a publish whose topic name is known and valid.
    fn publish_named(&mut self, publish: InPublish, name: ByteString) -> Result<(), ConnError> {
        if !self.admit_publish(&publish, &name) || !self.admit_retained(&publish, &name) {
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
            // The batch carries the publisher (`ingest`, `RecordHeaders::for_client`); a
            // retained message is kept on its own and carries it too. One shared count less
            // per message (issue #29).
            client_id: if publish.retain {
                self.client_id.clone()
            } else {
                ByteString::new()
            },
            properties,
            timestamp_ms: self.received_ms,
        };
        if message.retain {
            // Retained for every SUBSCRIBE from now on, not only once stored (`retained.rs`).
            self.broker.retained.announce(&message);
        }
        if self.pending.capacity() == 0 {
            // A batch starts: room for a full one (`start_append`) at once, not growth by
            // doubling (several reallocations and copies per batch). Idle connections hold none.
            self.pending
                .reserve_exact(usize::from(self.broker.config.inflight));
        }
        self.pending.push(Pending {
            message: Some(message),
            ack,
            durable_qos2: self.session.persistent(),
        });
        Ok(())
    }

    /// PUBREL: forgets the QoS 2 packet id (durably for persistent sessions), then PUBCOMP.
    async fn release(&mut self, pkid: u16) -> Result<(), ConnError> {
        self.inbound.release(pkid);
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
        let mut reasons = Vec::new();
        let start = match replay::from_properties(&subscribe.user_properties, message::now_ms()) {
            Ok(start) => start,
            Err(err) => {
                tracing::info!(client_id = %clip(&self.client_id), %err, "subscription start refused");
                let codes = vec![SubAckCode::ImplementationSpecific; subscribe.filters.len()];
                let suback = self.suback(subscribe.pkid, codes, &[err.to_string()]);
                return self.save_then(Vec::new(), vec![Done::Ack(suback)]).await;
            }
        };
        let mut starts = BTreeMap::new();
        let mut retained_for = Vec::new();
        let mut changed = Vec::new();
        for request in subscribe.filters {
            if is_shared(&request.filter) {
                let filter = request.filter.clone();
                let code = self
                    .subscribe_shared(request, subscribe.id, start.as_ref(), &mut reasons)
                    .await?;
                if matches!(code, SubAckCode::Granted(_)) {
                    changed.push(filter);
                }
                codes.push(code);
                continue;
            }
            let filter = request.filter;
            if let Err(err) = topic::validate_filter(&filter, &self.broker.limits) {
                tracing::info!(client_id = %clip(&self.client_id), filter = %clip(&filter), %err, "subscription refused");
                codes.push(SubAckCode::TopicFilterInvalid);
            } else if !self.may(Want::Subscribe, &filter) {
                tracing::info!(client_id = %clip(&self.client_id), filter = %clip(&filter), "subscription denied by ACL");
                codes.push(SubAckCode::NotAuthorized);
            } else if let Err(err) =
                self.replay_starts(start.as_ref(), &filter, &mut starts, &mut reasons)
            {
                tracing::info!(client_id = %clip(&self.client_id), filter = %clip(&filter), %err, "subscription start refused");
                reasons.push(err.to_string());
                codes.push(SubAckCode::ImplementationSpecific);
            } else {
                let granted = request.qos;
                let subscription = Subscription {
                    filter: filter.clone(),
                    qos: granted,
                    no_local: request.no_local,
                    retain_as_published: request.retain_as_published,
                    id: subscribe.id,
                };
                let new = self.session.subscribe(subscription);
                changed.push(filter.clone());
                codes.push(SubAckCode::Granted(granted));
                let send_retained = match request.retain_handling {
                    RetainHandling::OnSubscribe => true,
                    RetainHandling::OnNewSubscribe => new,
                    RetainHandling::Never => false,
                };
                if send_retained {
                    let matched = Matched {
                        qos: granted,
                        retain_as_published: true,
                        ids: subscribe.id.into_iter().collect(),
                    };
                    retained_for.push((filter, matched));
                }
            }
        }
        self.track_partitions(&changed, &starts).await?;
        let changes = changed
            .into_iter()
            .map(|filter| {
                let now = self
                    .session
                    .subscriptions
                    .iter()
                    .find(|s| s.filter == filter);
                let stored = now.map(|s| s.to_stored());
                (filter, stored)
            })
            .collect();
        let mut done = vec![Done::Ack(self.suback(subscribe.pkid, codes, &reasons))];
        done.extend(
            retained_for
                .into_iter()
                .map(|(filter, matched)| Done::Retained(filter, matched)),
        );
        self.save_then(changes, done).await?;
        self.deliver_more().await
    }

    /// Where `start` puts each partition `filter` reads that the session does not read yet
    /// (added to `starts`); partitions it already reads keep their position (said in
    /// `reasons`).
    fn replay_starts(
        &self,
        start: Option<&Start>,
        filter: &str,
        starts: &mut BTreeMap<PartitionId, u64>,
        reasons: &mut Vec<String>,
    ) -> Result<(), StartError> {
        let Some(start) = start else {
            return Ok(());
        };
        let partitions = self.broker.partitions_for(filter);
        let resolved = replay::resolve(start, &self.broker.log, &partitions)?;
        let mut ignored = Vec::new();
        for (partition, offset) in resolved {
            if self.has_position(&partition) {
                ignored.push(partition);
            } else {
                starts.entry(partition).or_insert(offset);
            }
        }
        if !ignored.is_empty() {
            reasons.push(replay::ignored_reason(filter, &ignored));
        }
        Ok(())
    }

    /// The SUBACK with `reasons` as its MQTT 5 Reason String, unless the client asked for no
    /// problem information or it would not fit the client's Maximum Packet Size.
    fn suback(&self, pkid: u16, codes: Vec<SubAckCode>, reasons: &[String]) -> Outgoing {
        let mut reason = reasons.join("; ");
        if reason.len() > MAX_REASON {
            let mut end = MAX_REASON;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason.truncate(end);
        }
        let fits = reason.len() + codes.len() + 16 <= self.client_max_packet;
        let reason = (!reason.is_empty() && self.client_problem_info && fits).then_some(reason);
        Outgoing::SubAck {
            pkid,
            codes,
            reason,
        }
    }

    async fn unsubscribe(&mut self, pkid: u16, filters: &[String]) -> Result<(), ConnError> {
        let mut changes = Vec::new();
        for filter in filters {
            self.retained_due.retain(|(queued, ..)| queued != filter);
            if self.session.unsubscribe(filter) {
                changes.push((filter.clone(), None));
            }
            if is_shared(filter) {
                self.unsubscribe_shared(filter).await?;
            }
        }
        let unsuback = Outgoing::UnsubAck {
            pkid,
            count: filters.len(),
        };
        self.save_then(changes, vec![Done::Ack(unsuback)]).await
    }
}

/// Longest SUBACK Reason String sent.
const MAX_REASON: usize = 1024;

fn alias_error(reason: &'static str) -> ConnError {
    ConnError::Protocol {
        reason,
        code: DisconnectReason::TopicAliasInvalid,
    }
}

fn protocol(reason: &'static str) -> ConnError {
    ConnError::Protocol {
        reason,
        code: DisconnectReason::ProtocolError,
    }
}
