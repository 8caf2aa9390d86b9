//! One upstream partition, the follower of one edge partition: a connection to its leader
//! (found through the upstream's bootstrap connection), over which ListOffsets, Fetch of the
//! last record's headers and Produce go. Mirror mode stamps every batch with the idempotent
//! producer's identity and edge offsets as sequences; shared mode's batches carry the
//! transactional producer's identity, the transactional flag and the sequences it hands out. It never retries: any error drops the leader connection and ends the
//! call, and the forwarder's next session asks for a new handle.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tern_log::StoredRecord;

use super::ClientSlot;
use super::record::{split, split_idempotent, upstream_record};
use crate::bandwidth::{Bandwidth, Class};
use crate::client::fetch::{self, EARLIEST, LATEST};
use crate::client::produce::{self, ProduceOptions, Stamp};
use crate::client::{ClientError, Connection, metadata};
use crate::config::{Codec, ValueFormat};
use crate::error::UpstreamError;
use crate::follower::{Follower, TxnStamp};
use crate::producer::{self as idempotence, Identity, Producer};
use crate::provenance::Provenance;

/// How long the leader may hold an acks=all produce before answering (Kafka's
/// `request.timeout.ms` default); the connection waits a little longer for the answer.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most a request other than Produce may take on the leader connection.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One upstream partition, the follower of one edge partition.
#[derive(Debug)]
pub struct UpstreamPartition {
    topic: String,
    partition: i32,
    /// Mirror mode: batches carry the idempotent producer's identity.
    producer: Option<Arc<Producer>>,
    /// The connection to the partition leader; `None` after an error, opened again on the next
    /// request.
    leader: tokio::sync::Mutex<Option<Connection>>,
    /// The upstream's bootstrap connection, dropped when a request here fails for lack of a
    /// connection (the link may be down).
    slot: Arc<ClientSlot>,
    generation: u64,
    bandwidth: Arc<Bandwidth>,
    batch_limit: u64,
    /// The class its requests are charged to; `None`: the edge topic's.
    class: Option<Class>,
}

impl UpstreamPartition {
    /// A handle on `topic`/`partition`, connected to its current leader.
    pub(super) async fn open(
        slot: &Arc<ClientSlot>,
        producer: Option<Arc<Producer>>,
        topic: &str,
        partition: u32,
        (bandwidth, batch_limit): (Arc<Bandwidth>, u64),
        class: Option<Class>,
    ) -> Result<Self, UpstreamError> {
        let (generation, _) = slot.connection().await?;
        let handle = Self {
            topic: topic.to_owned(),
            partition: i32::try_from(partition).unwrap_or(i32::MAX),
            producer,
            leader: tokio::sync::Mutex::new(None),
            slot: Arc::clone(slot),
            generation,
            bandwidth,
            batch_limit,
            class,
        };
        let mut leader = handle.leader.lock().await;
        handle.leader_in(&mut leader).await?;
        drop(leader);
        Ok(handle)
    }

    /// The leader connection in `slot`, opened when there is none or it died while idle.
    async fn leader_in<'a>(
        &self,
        slot: &'a mut Option<Connection>,
    ) -> Result<&'a mut Connection, UpstreamError> {
        if slot.as_mut().is_some_and(Connection::is_dead) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(self.open_leader().await?);
        }
        slot.as_mut().ok_or_else(|| {
            self.error(
                "find partition leader",
                ClientError::Missing {
                    api: "Metadata",
                    what: "leader".to_owned(),
                },
            )
        })
    }

    async fn open_leader(&self) -> Result<Connection, UpstreamError> {
        let op = "find partition leader";
        let (generation, mut connection) = self.slot.connection().await?;
        let error = |e| self.slot.error(generation, op, self.name(), e);
        let listed = metadata::metadata(&mut connection, Some(&self.topic))
            .await
            .map_err(error)?;
        drop(connection);
        let addr = metadata::leader_addr(&listed, &self.topic, self.partition)
            .map_err(|e| self.error(op, e))?;
        Connection::open(&addr, &self.slot.settings, REQUEST_TIMEOUT)
            .await
            .map_err(|e| self.error(op, e))
    }

    fn name(&self) -> String {
        format!("{}/{}", self.topic, self.partition)
    }

    fn error(&self, op: &'static str, source: ClientError) -> UpstreamError {
        self.slot.error(self.generation, op, self.name(), source)
    }

    /// `result` of a request over the leader connection in `slot`; an error drops it.
    fn settle<T>(
        &self,
        slot: &mut Option<Connection>,
        op: &'static str,
        result: Result<T, ClientError>,
    ) -> Result<T, UpstreamError> {
        result.map_err(|source| {
            *slot = None;
            self.error(op, source)
        })
    }

    async fn list_offset(&self, timestamp: i64) -> Result<i64, UpstreamError> {
        let mut slot = self.leader.lock().await;
        let leader = self.leader_in(&mut slot).await?;
        let result = fetch::list_offset(leader, &self.topic, self.partition, timestamp).await;
        self.settle(&mut slot, "list offsets", result)
    }

    /// The follower's end offset (its high watermark: only records every in-sync replica holds).
    pub async fn end_offset(&self) -> Result<i64, UpstreamError> {
        self.list_offset(LATEST).await
    }

    /// The partition's first offset (Kafka's retention may have moved it).
    pub async fn first_offset(&self) -> Result<i64, UpstreamError> {
        self.list_offset(EARLIEST).await
    }

    /// Committed records from `offset` (a `read_committed` Fetch, the leader waiting up to
    /// `max_wait` for a first one): how the downstream reads a command partition.
    pub async fn fetch_committed(
        &self,
        offset: i64,
        max_wait: Duration,
    ) -> Result<fetch::Fetched, UpstreamError> {
        let wait = i32::try_from(max_wait.as_millis()).unwrap_or(i32::MAX);
        let mut slot = self.leader.lock().await;
        let leader = self.leader_in(&mut slot).await?;
        let result =
            fetch::fetch_committed(leader, &self.topic, self.partition, offset, wait).await;
        self.settle(&mut slot, "fetch", result)
    }

    /// The idempotent producer's identity (asked over the bootstrap connection when it is not
    /// known yet); `None` in shared mode.
    async fn identity(&self) -> Result<Option<(Arc<Producer>, Identity)>, UpstreamError> {
        let Some(producer) = &self.producer else {
            return Ok(None);
        };
        if let Some(identity) = producer.cached().await {
            return Ok(Some((Arc::clone(producer), identity)));
        }
        let (generation, mut connection) = self.slot.connection().await?;
        let identity = producer.identity(&mut connection).await.map_err(|e| {
            self.slot
                .error(generation, "init producer id", self.name(), e)
        })?;
        Ok(Some((Arc::clone(producer), identity)))
    }
}

impl UpstreamPartition {
    /// Produces `records` with acks=all, in order, as requests of at most the batch limit (see
    /// [`super::KafkaUpstream::batch_limit`]), each once the bandwidth cap lets its bytes
    /// through; stamped by the transaction when there is one, else by the idempotent producer
    /// (mirror mode). An error ends the call; the requests before it are stored (or, in a
    /// transaction, aborted with it), and the caller finds out where to go on.
    async fn send(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        codec: Codec,
        format: ValueFormat,
        txn: Option<&TxnStamp<'_>>,
    ) -> Result<(), UpstreamError> {
        let batch = records
            .iter()
            .map(|r| upstream_record(r, source, format))
            .collect();
        let offsets: Vec<u64> = match txn {
            // Sequences of the transaction: one per record from its first.
            Some(txn) => (0..records.len() as u64)
                .map(|i| u64::try_from(txn.first_sequence).unwrap_or(0) + i)
                .collect(),
            None => records.iter().map(|r| r.offset).collect(),
        };
        let identity = match txn {
            Some(_) => None,
            None => self.identity().await?,
        };
        let batches = match (&identity, txn) {
            (Some(_), _) | (_, Some(_)) => split_idempotent(batch, &offsets, self.batch_limit),
            (None, None) => split(batch, self.batch_limit),
        };
        let stamp = match txn {
            Some(txn) => Stamp {
                producer_id: txn.producer_id,
                epoch: txn.epoch,
                transactional: true,
            },
            None => identity
                .as_ref()
                .map_or(Stamp::PLAIN, |(_, identity)| identity.stamp()),
        };
        let options = ProduceOptions {
            timeout: PRODUCE_TIMEOUT,
            transactional_id: txn.map(|t| t.transactional_id),
        };
        let mut slot = self.leader.lock().await;
        let mut first = 0;
        for (batch, bytes) in batches {
            let edge_offset = offsets.get(first).copied().unwrap_or(0);
            first += batch.len();
            let class = self
                .class
                .unwrap_or_else(|| self.bandwidth.class_of(&source.topic));
            self.bandwidth.acquire(class, bytes).await;
            let encoded = produce::encode_batch(stamp, edge_offset, batch, codec)
                .map_err(|e| self.error("produce", e))?;
            let leader = self.leader_in(&mut slot).await?;
            let produced =
                produce::produce(leader, &self.topic, self.partition, encoded, &options).await;
            if let Err(err) = &produced {
                if let (Some((producer, identity)), Some(code)) = (&identity, err.code()) {
                    if idempotence::needs_new_identity(code) {
                        producer.renew(identity).await;
                    }
                }
            }
            self.settle(&mut slot, "produce", produced)?;
        }
        Ok(())
    }
}

impl Follower for UpstreamPartition {
    fn topic(&self) -> &str {
        &self.topic
    }

    async fn end_offset(&self) -> Result<i64, UpstreamError> {
        UpstreamPartition::end_offset(self).await
    }

    async fn start_offset(&self) -> Result<i64, UpstreamError> {
        self.list_offset(EARLIEST).await
    }

    async fn headers_at(&self, offset: i64) -> Result<BTreeMap<String, Vec<u8>>, UpstreamError> {
        let mut slot = self.leader.lock().await;
        let leader = self.leader_in(&mut slot).await?;
        let result = fetch::headers_at(leader, &self.topic, self.partition, offset).await;
        self.settle(&mut slot, "fetch last record", result)
    }

    /// Produces `records` with acks=all, in order, as requests of at most the batch limit (see
    /// [`super::KafkaUpstream::batch_limit`]), each once the bandwidth cap lets its bytes
    /// through. An error ends the call; the requests before it are stored, and the caller's
    /// catch-up finds out where.
    async fn produce(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        codec: Codec,
        format: ValueFormat,
    ) -> Result<(), UpstreamError> {
        self.send(records, source, codec, format, None).await
    }

    /// Produces `records` inside the open transaction of `txn`: each request's batch carries
    /// the transactional flag, and sequences from `txn.first_sequence` on.
    async fn produce_in_txn(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        (codec, format): (Codec, ValueFormat),
        txn: &TxnStamp<'_>,
    ) -> Result<(), UpstreamError> {
        self.send(records, source, codec, format, Some(txn)).await
    }

    /// The next batch does not follow on from what the partition holds (records left the edge
    /// log first, or upstream retention removed them all): sequences would not follow either,
    /// so the producer starts over with a new identity.
    async fn restart_sequence(&self) {
        if let Ok(Some((producer, identity))) = self.identity().await {
            producer.renew(&identity).await;
        }
    }
}
