//! The connection's side of authentication and authorization: runs the CONNECT decision of
//! `auth/` before any session is touched, and asks the ACL before a publish is queued for the
//! log, a subscription is granted or a message is delivered. A refused publish is answered
//! (MQTT 5: reason 0x87; MQTT 3.1.1: a plain ack, as Mosquitto does, so the client does not
//! resend it forever) in order with the other acks, and is never written to the log. Log lines
//! name the client and topic, never the payload or a password.

use tokio::io::AsyncWrite;

use super::super::auth::Origin;
use super::super::auth::Want;
use super::super::broker::Broker;
use super::super::clip::clip;
use super::super::codec::{
    ConnAckCode, Connect, DisconnectReason, InPublish, Outgoing, PubAckReason, PubRecReason, QoS,
};
use super::super::ingest::{Pending, Reply};
use super::super::metrics::MqttMetrics;
use super::handshake::Refusal;
use super::{ConnError, Connection};
use tern_log::LogPort;

/// Authenticates `connect`; on success its `username` is the authenticated one (the client
/// certificate's identity when configured, `None` for anonymous clients).
pub(super) async fn authenticate<S: LogPort>(
    broker: &Broker<S>,
    mut connect: Box<Connect>,
    origin: &Origin,
) -> Result<Box<Connect>, Refusal> {
    // Verifications queue behind a small semaphore; a flood of CONNECTs must not pile up
    // forever, so the wait is bounded by the connect timeout.
    let limit = broker.config.connect_timeout.0;
    let decision = tokio::time::timeout(limit, broker.auth.authenticate(&connect, origin))
        .await
        .unwrap_or(Err(ConnAckCode::ServerUnavailable));
    match decision {
        Ok(user) => {
            connect.username = user;
            connect.password = None;
            Ok(connect)
        }
        Err(code) => {
            let reason = match code {
                ConnAckCode::BadUserNamePassword => "bad username or password",
                ConnAckCode::ServerUnavailable => "password check timed out",
                ConnAckCode::ConnectionRateExceeded => {
                    MqttMetrics::inc(&broker.metrics.logins_throttled);
                    "too many failed logins from this address"
                }
                _ => "not authorized",
            };
            // Never the attempted username: a mistyped password often ends up in it.
            tracing::warn!(
                client_id = %clip(&connect.client_id),
                reason,
                "MQTT authentication failed"
            );
            let err = ConnError::Protocol {
                reason,
                code: DisconnectReason::ProtocolError,
            };
            Err((err, Some((connect.version, code))))
        }
    }
}

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// Whether this client may do `want` on `topic`.
    pub(super) fn may(&self, want: Want, topic: &str) -> bool {
        self.broker
            .auth
            .allows(self.user.as_deref(), &self.client_id, want, topic)
    }

    /// Whether a message on `topic` may be delivered to this client.
    pub(super) fn may_receive(&self, topic: &str) -> bool {
        !self.broker.auth.acl_active() || self.may(Want::Receive, topic)
    }

    /// Checks a publish against the ACL; when refused, queues its answer and returns false.
    pub(super) fn admit_publish(&mut self, publish: &InPublish, topic: &str) -> bool {
        if self.may(Want::Publish, topic) {
            return true;
        }
        tracing::info!(
            client_id = %clip(&self.client_id),
            user = %clip(self.user.as_deref().unwrap_or("")),
            topic = %clip(topic),
            "publish denied by ACL"
        );
        if publish.qos != QoS::AtMostOnce {
            self.pending.push(Pending {
                message: None,
                ack: Reply::NotAuthorized {
                    pkid: publish.pkid,
                    exactly_once: publish.qos == QoS::ExactlyOnce,
                },
                durable_qos2: false,
            });
        }
        false
    }

    /// The ack of a refused publish (the codec turns the reason into success for MQTT 3.1.1).
    pub(super) fn send_not_authorized(
        &mut self,
        pkid: u16,
        exactly_once: bool,
    ) -> Result<(), ConnError> {
        if exactly_once {
            let reason = PubRecReason::NotAuthorized;
            self.send(Outgoing::PubRec { pkid, reason })
        } else {
            let reason = PubAckReason::NotAuthorized;
            self.send(Outgoing::PubAck { pkid, reason })
        }
    }
}
