//! Storing publishes: a batch of one connection's publishes is routed, grouped per log partition
//! (keeping their order), queued on the log, then, once durable, retained updates and QoS 2
//! packet-id marks are written. Only then may the connection acknowledge. Several batches of one
//! connection may be in flight: each queues its appends only after the previous batch queued its
//! own, and settles only after the previous batch settled (a [`Turn`]), so a connection's records
//! keep their order in every partition and retained updates their order per topic. Never
//! acknowledges anything itself and never reports success for a record the log did not confirm.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::broker::Broker;
use super::codec::QoS;
use super::message::{ByteString, Message, RecordHeaders};
use super::state::StateError;
use tern_log::{LogError, LogPort, Queued, Record};

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
    /// A retained publish past `mqtt.max_retained(_bytes)`: MQTT 5 gets reason 0x97 "quota
    /// exceeded", MQTT 3.1.1 a plain ack. The message was never stored.
    QuotaExceeded {
        pkid: u16,
        exactly_once: bool,
    },
}

/// One publish waiting to be stored.
#[derive(Debug, Clone)]
pub struct Pending {
    /// `None` for a re-sent QoS 2 publish that is already stored: only the ack is repeated.
    /// Once grouped for the log, only a retained message stays (its update follows the
    /// append); the others moved into their records. Only a retained message carries its
    /// client id: the batch's (`ingest`'s `client_id`) is the one its record gets.
    pub message: Option<Message>,
    pub ack: Reply,
    /// Whether a QoS 2 packet id must be recorded durably (persistent sessions).
    pub durable_qos2: bool,
}

/// How a publish ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Stored,
    /// The log refused it (full): never acknowledge it as stored.
    Full,
    /// Not stored, or stored without its retained update or QoS 2 mark: never acknowledge
    /// it. One append's failure is shared by every publish of its group.
    Failed(Arc<StateError>),
}

/// A batch's place in its connection's order: resolves once that batch has queued its appends
/// (`queued`) and once it has settled (`settled`), or was dropped.
#[derive(Debug)]
pub struct Turn {
    queued: oneshot::Receiver<()>,
    settled: oneshot::Receiver<()>,
}

/// A stored batch and its outcomes, in batch order.
pub type Ingested = (Vec<Pending>, Vec<Outcome>);

/// Prepares storing `batch` for `client_id` after the batch whose turn is `previous`. Returns
/// the work (to spawn) and the turn the next batch waits for.
pub fn ingest<S: LogPort>(
    broker: Arc<Broker<S>>,
    client_id: ByteString,
    batch: Vec<Pending>,
    previous: Option<Turn>,
) -> (impl Future<Output = Ingested> + Send + 'static, Turn) {
    let (queued_tx, queued) = oneshot::channel();
    let (settled_tx, settled) = oneshot::channel();
    let work = async move {
        let mut batch = batch;
        let groups = group(&broker, &client_id, &mut batch);
        let (previous_queued, previous_settled) = match previous {
            Some(turn) => (Some(turn.queued), Some(turn.settled)),
            None => (None, None),
        };
        if let Some(turn) = previous_queued {
            let _ = turn.await;
        }
        let mut waiting = Vec::with_capacity(groups.len());
        for group in groups {
            let (topic, partition) = &group.partition;
            let queued = broker.log.enqueue(topic, *partition, group.records).await;
            waiting.push((group.indices, queued));
        }
        let _ = queued_tx.send(());
        let mut outcomes = outcomes(batch.len(), waiting).await;
        if let Some(turn) = previous_settled {
            let _ = turn.await;
        }
        settle(&broker, &client_id, &batch, &mut outcomes).await;
        let _ = settled_tx.send(());
        (batch, outcomes)
    };
    (work, Turn { queued, settled })
}

/// Waits for every queued append; a publish not appended (re-sent QoS 2) counts as stored.
async fn outcomes(
    len: usize,
    waiting: Vec<(Vec<usize>, Result<Queued, LogError>)>,
) -> Vec<Outcome> {
    let mut outcomes: Vec<Outcome> = (0..len).map(|_| Outcome::Stored).collect();
    for (indices, queued) in waiting {
        let result = match queued {
            Ok(answer) => answer.await,
            Err(err) => Err(err),
        };
        let outcome = match result {
            Ok(_) => Outcome::Stored,
            // A retention limit and a full device are the same backpressure to the client.
            Err(err) if err.is_backpressure() => Outcome::Full,
            Err(err) => Outcome::Failed(Arc::new(err.into())),
        };
        for i in indices {
            if let Some(slot) = outcomes.get_mut(i) {
                *slot = outcome.clone();
            }
        }
    }
    outcomes
}

/// The records of one destination partition, in batch order, with their batch indices.
struct Group {
    partition: (String, u32),
    indices: Vec<usize>,
    records: Vec<Record>,
}

/// Groups a batch per destination partition. A message that is not retained moves into its
/// record (no copy of its payload); a retained one is cloned (shared), its update follows. The
/// records' headers share one buffer, allocated here at its final size (issue #29).
fn group<S: LogPort>(
    broker: &Broker<S>,
    client_id: &ByteString,
    batch: &mut [Pending],
) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let messages = batch.iter().filter_map(|p| p.message.as_ref());
    let mut headers = RecordHeaders::for_client(client_id, messages);
    let routing = broker.routing();
    let len = batch.len();
    // The previous message's log topic and its partition count: a batch nearly always goes to
    // one log topic, and comparing its name costs less than hashing it (issue #29).
    let mut last: Option<(&str, u32)> = None;
    // The group the previous message went to: (index, log topic, partition).
    let mut previous: Option<(usize, &str, u32)> = None;
    for (i, pending) in batch.iter_mut().enumerate() {
        let Some(message) = &pending.message else {
            continue;
        };
        let destination = routing.router.route(&message.topic);
        let partitions = match last {
            Some((topic, count)) if same(topic, destination.log_topic) => count,
            _ => {
                let count = routing.partitions(destination.log_topic);
                last = Some((destination.log_topic, count));
                count
            }
        };
        let key = destination
            .key
            .of(message.topic.as_bytes(), client_id.as_bytes());
        let partition = tern_partitioner::partition_for_key(key, partitions);
        let record = if message.retain {
            let message = message.clone();
            message.into_record_keyed(&destination.key, &mut headers)
        } else {
            let Some(message) = pending.message.take() else {
                continue;
            };
            message.into_record_keyed(&destination.key, &mut headers)
        };
        // Nearly always the previous message's group: its log topic is the same `&str` of the
        // routing table, told at a glance.
        let found = match previous {
            Some((at, topic, p))
                if p == partition && std::ptr::eq(topic, destination.log_topic) =>
            {
                Some(at)
            }
            _ => groups
                .iter()
                .position(|g| g.partition.1 == partition && g.partition.0 == destination.log_topic),
        };
        let at = found.unwrap_or_else(|| {
            // Most batches go to one partition: room for all of it up front.
            groups.push(Group {
                partition: (destination.log_topic.to_owned(), partition),
                indices: Vec::with_capacity(len - i),
                records: Vec::with_capacity(len - i),
            });
            groups.len() - 1
        });
        if let Some(group) = groups.get_mut(at) {
            group.indices.push(i);
            group.records.push(record);
        }
        previous = Some((at, destination.log_topic, partition));
    }
    groups
}
/// Whether two names are equal, at a glance when both are the routing table's.
fn same(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// Retained updates and QoS 2 marks for what was stored (a retained publish not stored loses
/// its early copy, `retained.rs`); a failure turns the outcome into `Failed` so no ack goes
/// out.
async fn settle<S: LogPort>(
    broker: &Broker<S>,
    client_id: &str,
    batch: &[Pending],
    outcomes: &mut [Outcome],
) {
    for (pending, outcome) in batch.iter().zip(outcomes.iter_mut()) {
        let retained = pending.message.as_ref().filter(|m| m.retain);
        if !matches!(outcome, Outcome::Stored) {
            if let Some(message) = retained {
                broker.retained.withdraw(message);
            }
            continue;
        }
        if let Some(message) = retained {
            if let Err(err) = broker.retained.update(message.clone()).await {
                broker.retained.withdraw(message);
                *outcome = refused(err);
                continue;
            }
        }
        // A re-sent QoS 2 publish (already marked) has `durable_qos2` false.
        if let (Reply::PubRec(pkid), true) = (pending.ack, pending.durable_qos2) {
            if let Err(err) = broker.state.put_qos2(client_id, pkid, true).await {
                *outcome = refused(err);
            }
        }
    }
}

/// The outcome of a publish whose state record was not written: backpressure when the log
/// refused it for now (a full disk), so the client retries instead of reconnecting.
fn refused(err: StateError) -> Outcome {
    match &err {
        StateError::Log(log) if log.is_backpressure() => Outcome::Full,
        _ => Outcome::Failed(Arc::new(err)),
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
