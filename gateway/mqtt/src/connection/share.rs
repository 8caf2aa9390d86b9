//! The connection's part in shared subscriptions (`mqtt/shared/`): SUBSCRIBE and UNSUBSCRIBE of
//! `$share/{group}/{filter}` (no retained messages, No Local refused as the MQTT 5 spec asks,
//! an exclusive group's second session refused with 0x97, a `tern-start` for a new group),
//! joining the groups of a resumed session, delivering what a group hands over through the
//! ordinary delivery path, and acknowledging back to the group. Never reads the log itself.

use tokio::io::AsyncWrite;

use super::super::auth::Want;
use super::super::clip::clip;
use super::super::codec::{DisconnectReason, QoS, SubAckCode, SubscribeFilter};
use super::super::outcome::Kind;
use super::super::replay::{self, Start};
use super::super::router::PartitionId;
use super::super::session::{Matched, Subscription};
use super::super::shared::{Delivery, JoinError, ShareKey};
use super::super::topic::is_shared;
use super::delivery::Origin;
use super::{ConnError, Connection};
use tern_log::LogPort;

/// Outgoing bytes gathered from a burst of group deliveries before the socket write.
const BURST_BYTES: usize = 64 * 1024;

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// Joins the groups of every shared subscription the session holds (after a reconnect).
    pub(super) async fn join_groups(&mut self) {
        let held: Vec<Subscription> = self
            .session
            .subscriptions
            .iter()
            .filter(|s| is_shared(&s.filter))
            .cloned()
            .collect();
        for subscription in held {
            if let Err(err) = self.join_group(&subscription, None).await {
                tracing::warn!(client_id = %clip(&self.client_id), filter = %clip(&subscription.filter), %err, "cannot rejoin a shared group");
            }
        }
    }

    /// Joins (or updates the membership of) the group of `subscription`; returns the
    /// partitions where `start` was not applied because the group's cursor continues.
    async fn join_group(
        &mut self,
        subscription: &Subscription,
        start: Option<&Start>,
    ) -> Result<Vec<PartitionId>, JoinError> {
        let matched = Matched {
            qos: subscription.qos,
            retain_as_published: subscription.retain_as_published,
            ids: subscription.id.into_iter().collect(),
        };
        let Ok(key) = ShareKey::parse(&subscription.filter, &self.broker.limits) else {
            return Ok(Vec::new());
        };
        let partitions = self.broker.partitions_for(&key.filter);
        if let Some(member) = self.groups.get_mut(&subscription.filter) {
            member.matched = Some(matched);
            return Ok(if start.is_some() {
                partitions
            } else {
                Vec::new()
            });
        }
        let window = usize::from(self.broker.config.inflight).min(self.client_receive_max);
        let shared = &self.broker.shared;
        let joined = shared
            .join(&key, &self.client_id, partitions, window, start)
            .await?;
        let mut member = joined.member;
        member.matched = Some(matched);
        self.groups.insert(subscription.filter.clone(), member);
        Ok(joined.ignored)
    }

    /// One `$share/…` filter of a SUBSCRIBE, starting a new group at `start`; the SUBACK code
    /// (with what its reason string should say pushed to `reasons`), or a protocol error.
    pub(super) async fn subscribe_shared(
        &mut self,
        request: SubscribeFilter,
        id: Option<usize>,
        start: Option<&Start>,
        reasons: &mut Vec<String>,
    ) -> Result<SubAckCode, ConnError> {
        let key = match ShareKey::parse(&request.filter, &self.broker.limits) {
            Ok(key) => key,
            Err(err) => {
                tracing::info!(client_id = %clip(&self.client_id), filter = %clip(&request.filter), %err, "shared subscription refused");
                return Ok(SubAckCode::TopicFilterInvalid);
            }
        };
        if request.no_local {
            return Err(ConnError::Protocol {
                reason: "No Local set on a shared subscription",
                code: DisconnectReason::ProtocolError,
            });
        }
        if !self.may(Want::Subscribe, &key.filter) {
            tracing::info!(client_id = %clip(&self.client_id), filter = %clip(&request.filter), "subscription denied by ACL");
            return Ok(SubAckCode::NotAuthorized);
        }
        // At most QoS 1: MQTT 5 (4.8.2) makes an interrupted QoS 2 shared delivery stay with
        // its member, which would hold the group's cursor for a member that may never return.
        let granted = match request.qos {
            QoS::AtMostOnce => QoS::AtMostOnce,
            _ => QoS::AtLeastOnce,
        };
        let subscription = Subscription {
            filter: request.filter,
            qos: granted,
            no_local: false,
            retain_as_published: request.retain_as_published,
            id,
        };
        match self.join_group(&subscription, start).await {
            Ok(ignored) => {
                if !ignored.is_empty() {
                    reasons.push(replay::ignored_reason(&subscription.filter, &ignored));
                }
            }
            Err(err) => {
                tracing::info!(client_id = %clip(&self.client_id), filter = %clip(&subscription.filter), %err, "shared subscription refused");
                reasons.push(err.to_string());
                return Ok(match err {
                    JoinError::Exclusive(_) => SubAckCode::QuotaExceeded,
                    JoinError::Start(_) => SubAckCode::ImplementationSpecific,
                    _ => SubAckCode::Unspecified,
                });
            }
        }
        self.session.subscribe(subscription);
        Ok(SubAckCode::Granted(granted))
    }

    /// UNSUBSCRIBE of a `$share/…` filter: leaves the group and lets go of it.
    pub(super) async fn unsubscribe_shared(&mut self, filter: &str) -> Result<(), ConnError> {
        let pkids = self.groups.leave(filter).await;
        self.forget_shared_inflight(&pkids);
        if let Ok(key) = ShareKey::parse(filter, &self.broker.limits) {
            self.broker.shared.release(&key, &self.client_id).await?;
        }
        Ok(())
    }

    /// Sends a record a group handed over, then whatever else is already waiting while the
    /// window has room (one socket write for a burst).
    pub(super) async fn deliver_shared(
        &mut self,
        filter: String,
        delivery: Delivery,
    ) -> Result<(), ConnError> {
        self.deliver_one_shared(filter, delivery).await?;
        while !self.window_full() && self.out.len() < BURST_BYTES {
            let Some((filter, delivery)) = self.groups.try_recv() else {
                break;
            };
            self.deliver_one_shared(filter, delivery).await?;
        }
        Ok(())
    }

    async fn deliver_one_shared(
        &mut self,
        filter: String,
        delivery: Delivery,
    ) -> Result<(), ConnError> {
        let matched = self.groups.get_mut(&filter).and_then(|m| m.matched.clone());
        let Delivery {
            partition,
            offset,
            message,
            dup,
        } = delivery;
        let pkid = match matched {
            Some(matched) => {
                let from = Origin::Group((partition.clone(), offset));
                self.deliver_tracked(*message, &matched, from, dup)?
            }
            None => None,
        };
        match pkid {
            Some(pkid) => self.groups.track(pkid, filter, partition, offset),
            None => self.groups.settle(&filter, partition, offset).await,
        }
        Ok(())
    }

    /// The client acknowledged `pkid` (PUBACK: shared subscriptions are granted at most QoS 1,
    /// see docs/mqtt.md); passes it on if it carried a group's record.
    pub(super) async fn shared_acknowledged(&mut self, pkid: u16) {
        let source = self.groups.acknowledged(pkid).await;
        self.note_outcome(source, Kind::Delivered, QoS::AtLeastOnce);
    }

    /// Leaves every group; their unacknowledged records go to other members, so they leave
    /// the session's in-flight window (and are not re-sent on reconnect).
    pub(super) async fn leave_groups(&mut self) {
        let pkids = self.groups.leave_all().await;
        self.forget_shared_inflight(&pkids);
    }

    fn forget_shared_inflight(&mut self, pkids: &[u16]) {
        for pkid in pkids {
            self.session.acknowledge(*pkid);
        }
    }
}
