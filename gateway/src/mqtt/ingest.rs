//! Storing publishes: a batch of one connection's publishes is routed, grouped per log partition
//! (keeping their order), appended durably, then retained updates and QoS 2 packet-id marks are
//! written. Only then may the connection acknowledge. Never acknowledges anything itself and
//! never reports success for a record the log did not confirm.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::broker::Broker;
use super::codec::QoS;
use super::message::Message;
use super::store::{Record, Store, StoreError};

/// What to send once a publish is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    None,
    PubAck(u16),
    PubRec(u16),
    /// Refused by the ACL (`auth/acl.rs`): MQTT 5 gets reason 0x87 "not authorized", MQTT
    /// 3.1.1 a plain ack (as Mosquitto does). The message was never stored.
    NotAuthorized {
        pkid: u16,
        exactly_once: bool,
    },
}

/// One publish waiting to be stored.
#[derive(Debug, Clone)]
pub struct Pending {
    /// `None` for a re-sent QoS 2 publish that is already stored: only the ack is repeated.
    pub message: Option<Message>,
    pub ack: Reply,
    /// Whether a QoS 2 packet id must be recorded durably (persistent sessions).
    pub durable_qos2: bool,
}

/// How a publish ended.
#[derive(Debug)]
pub enum Outcome {
    Stored,
    /// The log refused it (full): never acknowledge it as stored.
    Full,
    Failed(StoreError),
}

/// Stores `batch` for `client_id`; outcomes are in batch order.
pub async fn ingest<S: Store>(
    broker: Arc<Broker<S>>,
    client_id: String,
    batch: Vec<Pending>,
) -> (Vec<Pending>, Vec<Outcome>) {
    let mut outcomes: Vec<Option<Outcome>> = batch.iter().map(|_| None).collect();
    let mut appends = JoinSet::new();
    for Group {
        partition: (topic, partition),
        indices,
        records,
    } in group(&broker, &batch)
    {
        let store = broker.store.clone();
        appends.spawn(async move {
            let result = store.append(&topic, partition, records).await;
            (indices, result)
        });
    }
    while let Some(joined) = appends.join_next().await {
        let (indices, result) = match joined {
            Ok(done) => done,
            Err(err) => {
                tracing::error!(%err, "append task failed");
                continue;
            }
        };
        for i in indices {
            if let Some(slot) = outcomes.get_mut(i) {
                *slot = Some(match &result {
                    Ok(_) => Outcome::Stored,
                    Err(StoreError::Full { .. }) => Outcome::Full,
                    Err(err) => Outcome::Failed(StoreError::Failed {
                        op: "append",
                        topic: String::new(),
                        message: err.to_string(),
                    }),
                });
            }
        }
    }
    let mut outcomes: Vec<Outcome> = outcomes
        .into_iter()
        .map(|o| o.unwrap_or(Outcome::Stored))
        .collect();
    settle(&broker, &client_id, &batch, &mut outcomes).await;
    (batch, outcomes)
}

/// The records of one destination partition, in batch order, with their batch indices.
struct Group {
    partition: (String, u32),
    indices: Vec<usize>,
    records: Vec<Record>,
}

/// Groups a batch per destination partition.
fn group<S: Store>(broker: &Broker<S>, batch: &[Pending]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (i, pending) in batch.iter().enumerate() {
        let Some(message) = &pending.message else {
            continue;
        };
        let destination = broker.router.route(&message.topic, &message.client_id);
        let partitions = broker.partitions(destination.log_topic);
        let partition = broker.store.partition_for_key(&destination.key, partitions);
        let key = (destination.log_topic.to_owned(), partition);
        let record = message.to_record(Some(destination.key));
        match groups.iter_mut().find(|g| g.partition == key) {
            Some(group) => {
                group.indices.push(i);
                group.records.push(record);
            }
            None => groups.push(Group {
                partition: key,
                indices: vec![i],
                records: vec![record],
            }),
        }
    }
    groups
}

/// Retained updates and QoS 2 marks for what was stored; a failure turns the outcome into
/// `Failed` so no ack goes out.
async fn settle<S: Store>(
    broker: &Broker<S>,
    client_id: &str,
    batch: &[Pending],
    outcomes: &mut [Outcome],
) {
    for (pending, outcome) in batch.iter().zip(outcomes.iter_mut()) {
        if !matches!(outcome, Outcome::Stored) {
            continue;
        }
        if let Some(message) = pending.message.as_ref().filter(|m| m.retain) {
            if let Err(err) = broker.retained.update(message.clone()).await {
                *outcome = Outcome::Failed(err);
                continue;
            }
        }
        if let (Reply::PubRec(pkid), true) = (pending.ack, pending.durable_qos2) {
            if pending.message.is_some() {
                if let Err(err) = broker.state.put_qos2(client_id, pkid, true).await {
                    *outcome = Outcome::Failed(err);
                }
            }
        }
    }
}

/// The ack for a publish of `qos` with packet id `pkid`.
pub fn ack_for(qos: QoS, pkid: u16) -> Reply {
    match qos {
        QoS::AtMostOnce => Reply::None,
        QoS::AtLeastOnce => Reply::PubAck(pkid),
        QoS::ExactlyOnce => Reply::PubRec(pkid),
    }
}
