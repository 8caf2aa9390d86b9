//! Shared mode's transactional producer: one `transactional.id` per gateway and edge partition,
//! its incarnation (producer id and epoch from InitProducerId, which fences the previous
//! incarnation and aborts whatever transaction it left open), the connection to its transaction
//! coordinator (FindCoordinator with key type 1) and the next sequence number of every upstream
//! partition it writes. It sends AddPartitionsToTxn, AddOffsetsToTxn and EndTxn through the
//! client module (`client/txn.rs`), retrying with backoff the refusals Kafka calls retriable
//! (the coordinator is loading, moved, or still ending the previous transaction); any other
//! failure — a fenced epoch above all — ends the incarnation: the caller's next session calls
//! [`TxnProducer::init`] again. It never produces records and never commits group offsets
//! itself (`shared/` and `group.rs` do), and never opens a connection except through
//! `client::Connection`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::client::group::{KeyType, find_coordinator_of};
use crate::client::produce::init_producer_id;
use crate::client::txn::{self as requests, TxnId};
use crate::client::{ClientError, Connection, Settings};

/// How long a retriable refusal is asked again before it is an error.
const RETRY_FOR: Duration = Duration::from_secs(30);
/// The first wait after a retriable refusal; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One request to the transaction coordinator.
#[derive(Debug, Clone, Copy)]
enum Request<'a> {
    Init,
    AddPartitions(&'a str, &'a [i32]),
    AddOffsets(&'a str),
    End(bool),
}

/// A transactional producer's incarnation and its coordinator.
#[derive(Debug)]
pub struct TxnProducer {
    settings: Settings,
    transactional_id: String,
    timeout: Duration,
    /// What InitProducerId asks for: Kafka aborts a transaction left open longer.
    transaction_timeout: Duration,
    coordinator: Option<Connection>,
    /// (producer id, epoch) of this incarnation; `None` before [`TxnProducer::init`].
    incarnation: Option<(i64, i16)>,
    /// The next base sequence of each upstream (topic, partition) this incarnation wrote.
    sequences: BTreeMap<(String, i32), i32>,
}

impl TxnProducer {
    pub fn new(
        settings: Settings,
        transactional_id: String,
        transaction_timeout: Duration,
    ) -> Self {
        Self {
            settings,
            transactional_id,
            timeout: Duration::from_secs(10),
            transaction_timeout,
            coordinator: None,
            incarnation: None,
            sequences: BTreeMap::new(),
        }
    }

    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// This incarnation's identity, for the batches and the TxnOffsetCommit.
    pub fn id(&self) -> Option<TxnId<'_>> {
        self.incarnation.map(|(producer_id, epoch)| TxnId {
            transactional_id: &self.transactional_id,
            producer_id,
            epoch,
        })
    }

    /// A new incarnation: InitProducerId with the transactional id, which bumps the epoch
    /// (fencing the previous incarnation) and aborts its open transaction. Sequences start over.
    pub async fn init(&mut self) -> Result<(i64, i16), ClientError> {
        self.incarnation = None;
        self.sequences.clear();
        self.call(Request::Init).await?;
        let (producer_id, epoch) = self.incarnation.unwrap_or((-1, -1));
        tracing::info!(transactional_id = %self.transactional_id, producer_id, epoch, "transactional producer initialised");
        Ok((producer_id, epoch))
    }

    /// The base sequence of `count` records to `topic`/`partition`; the next call follows on.
    pub fn take_sequence(&mut self, topic: &str, partition: i32, count: usize) -> i32 {
        let next = self
            .sequences
            .entry((topic.to_owned(), partition))
            .or_insert(0);
        let first = *next;
        let count = i32::try_from(count).unwrap_or(i32::MAX);
        *next = next.wrapping_add(count) & i32::MAX;
        first
    }

    /// Adds `partitions` of `topic` to the open transaction (opening it).
    pub async fn add_partitions(
        &mut self,
        topic: &str,
        partitions: &[i32],
    ) -> Result<(), ClientError> {
        self.call(Request::AddPartitions(topic, partitions)).await
    }

    /// Makes `group`'s offsets part of the open transaction.
    pub async fn add_offsets(&mut self, group: &str) -> Result<(), ClientError> {
        self.call(Request::AddOffsets(group)).await
    }

    /// Commits (`true`) or aborts the open transaction.
    pub async fn end(&mut self, commit: bool) -> Result<(), ClientError> {
        self.call(Request::End(commit)).await
    }

    /// `request`, asked again with backoff while the coordinator answers a retriable refusal;
    /// a connection that failed is dropped (found again on the next call).
    async fn call(&mut self, request: Request<'_>) -> Result<(), ClientError> {
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        let mut backoff = BACKOFF_MIN;
        loop {
            let result = self.once(request).await;
            let code = match &result {
                Ok(()) => return Ok(()),
                Err(err) => err.code(),
            };
            match code {
                Some(code) if requests::is_retriable(code) => {
                    if requests::coordinator_moved(code) {
                        self.coordinator = None;
                    }
                    if tokio::time::Instant::now() + backoff > deadline {
                        return result;
                    }
                    tracing::debug!(transactional_id = %self.transactional_id, ?request, code, "retrying a transactional request");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                Some(code) => {
                    if requests::is_fenced(code) {
                        self.incarnation = None;
                    }
                    return result;
                }
                None => {
                    self.coordinator = None;
                    return result;
                }
            }
        }
    }

    async fn once(&mut self, request: Request<'_>) -> Result<(), ClientError> {
        if self.coordinator.as_mut().is_some_and(Connection::is_dead) {
            self.coordinator = None;
        }
        let mut connection = match self.coordinator.take() {
            Some(connection) => connection,
            None => find_coordinator(&self.settings, &self.transactional_id, self.timeout).await?,
        };
        let result = match (request, self.id()) {
            (Request::Init, _) => {
                let asked = init_producer_id(
                    &mut connection,
                    Some(&self.transactional_id),
                    self.transaction_timeout,
                )
                .await;
                asked.map(|incarnation| self.incarnation = Some(incarnation))
            }
            (_, None) => Err(ClientError::Missing {
                api: "transaction",
                what: "producer id (InitProducerId first)".to_owned(),
            }),
            (Request::AddPartitions(topic, partitions), Some(id)) => {
                requests::add_partitions(&mut connection, &id, topic, partitions).await
            }
            (Request::AddOffsets(group), Some(id)) => {
                requests::add_offsets(&mut connection, &id, group).await
            }
            (Request::End(commit), Some(id)) => {
                requests::end_txn(&mut connection, &id, commit).await
            }
        };
        if result.is_ok() || matches!(result, Err(ClientError::Kafka { .. })) {
            self.coordinator = Some(connection);
        }
        result
    }
}

/// Asks the bootstrap servers, in order, where `transactional_id`'s coordinator is and connects.
async fn find_coordinator(
    settings: &Settings,
    transactional_id: &str,
    timeout: Duration,
) -> Result<Connection, ClientError> {
    let mut last = None;
    for addr in &settings.bootstrap {
        let asked = async {
            let mut bootstrap = Connection::open(addr, settings, timeout).await?;
            find_coordinator_of(&mut bootstrap, transactional_id, KeyType::Transaction).await
        };
        match asked.await {
            Ok(coordinator) => return Connection::open(&coordinator, settings, timeout).await,
            Err(err @ ClientError::Kafka { .. }) => return Err(err),
            Err(err) => last = Some(err),
        }
    }
    Err(ClientError::NoBroker {
        tried: settings.bootstrap.len(),
        source: Box::new(last.unwrap_or(ClientError::Missing {
            api: "bootstrap",
            what: "server in the settings".to_owned(),
        })),
    })
}
