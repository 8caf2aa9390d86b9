//! Shared mode's progress: the group offsets of one consumer group, through its coordinator.
//! It keeps one connection to the coordinator (found with FindCoordinator through the bootstrap
//! servers, in order) and sends OffsetCommit, OffsetFetch and a transaction's TxnOffsetCommit
//! (asked again with backoff while the coordinator is loading, moved or busy) over it, all through the client
//! module (`client/group.rs`). It never joins the group: commits are standalone, like a
//! consumer that assigns its partitions itself. It never produces or fetches records, and
//! never opens a connection except through `client::Connection`.

use std::time::Duration;

use tokio::sync::Mutex;

use crate::client::group::{self as requests, Commit};
use crate::client::txn::{self as txn_requests, TxnId};
use crate::client::{ClientError, Connection, Settings};

/// How long a transactional commit's retriable refusals are asked again.
const RETRY_FOR: Duration = Duration::from_secs(30);

/// The group offsets of one consumer group, through its coordinator.
#[derive(Debug)]
pub struct GroupClient {
    settings: Settings,
    group: String,
    timeout: Duration,
    coordinator: Mutex<Option<Connection>>,
}

impl GroupClient {
    pub fn new(settings: Settings, group: String) -> Self {
        Self {
            settings,
            group,
            timeout: Duration::from_secs(10),
            coordinator: Mutex::new(None),
        }
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// How the cluster is reached (the transactional producer connects the same way).
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Commits `commit` for the group; any failure drops the connection, so the next request
    /// finds the coordinator again.
    pub async fn commit(&self, commit: &Commit<'_>) -> Result<(), ClientError> {
        let mut guard = self.coordinator.lock().await;
        let mut connection = self.connection(guard.take()).await?;
        let result = requests::offset_commit(&mut connection, &self.group, commit).await;
        self.keep(&mut guard, connection, &result);
        result
    }

    /// Commits `commit` for the group inside `txn`'s open transaction (AddOffsetsToTxn sent
    /// first), asking again with backoff while the coordinator answers a retriable refusal.
    pub async fn txn_commit(
        &self,
        commit: &Commit<'_>,
        txn: &TxnId<'_>,
    ) -> Result<(), ClientError> {
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        let mut backoff = Duration::from_millis(20);
        loop {
            let mut guard = self.coordinator.lock().await;
            let mut connection = self.connection(guard.take()).await?;
            let result =
                txn_requests::txn_offset_commit(&mut connection, txn, &self.group, commit).await;
            self.keep(&mut guard, connection, &result);
            drop(guard);
            match result.as_ref().err().and_then(ClientError::code) {
                Some(code)
                    if txn_requests::is_retriable(code)
                        && tokio::time::Instant::now() + backoff < deadline =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                _ => return result,
            }
        }
    }

    /// The group's committed offset of `topic`/`partition`, `None` when it has none.
    pub async fn fetch(&self, topic: &str, partition: i32) -> Result<Option<i64>, ClientError> {
        let mut guard = self.coordinator.lock().await;
        let mut connection = self.connection(guard.take()).await?;
        let result = requests::offset_fetch(&mut connection, &self.group, topic, partition).await;
        self.keep(&mut guard, connection, &result);
        result
    }

    /// Keeps `connection` for the next request after a success or a broker's refusal, unless
    /// that says the coordinator moved or is not ready (every other failure drops it).
    fn keep<T>(
        &self,
        slot: &mut Option<Connection>,
        connection: Connection,
        result: &Result<T, ClientError>,
    ) {
        let keep = match result {
            Ok(_) => true,
            Err(err @ ClientError::Kafka { .. }) => !coordinator_changed(err),
            Err(_) => false,
        };
        if keep {
            *slot = Some(connection);
        }
    }

    /// The live coordinator connection, or a new one.
    async fn connection(&self, live: Option<Connection>) -> Result<Connection, ClientError> {
        match live.and_then(|mut c| (!c.is_dead()).then_some(c)) {
            Some(connection) => Ok(connection),
            None => self.find_coordinator().await,
        }
    }

    /// Asks the bootstrap servers, in order, where the group's coordinator is and connects.
    async fn find_coordinator(&self) -> Result<Connection, ClientError> {
        let mut last = None;
        for addr in &self.settings.bootstrap {
            let asked = async {
                let mut bootstrap = Connection::open(addr, &self.settings, self.timeout).await?;
                requests::find_coordinator(&mut bootstrap, &self.group).await
            };
            match asked.await {
                Ok(coordinator) => {
                    tracing::debug!(group = %self.group, via = %addr, %coordinator, "group coordinator");
                    return Connection::open(&coordinator, &self.settings, self.timeout).await;
                }
                Err(err @ ClientError::Kafka { .. }) => return Err(err),
                Err(err) => last = Some(err),
            }
        }
        Err(ClientError::NoBroker {
            tried: self.settings.bootstrap.len(),
            source: Box::new(last.unwrap_or(ClientError::Missing {
                api: "bootstrap",
                what: "server in the settings".to_owned(),
            })),
        })
    }
}

/// Whether the coordinator moved or is not ready: find it again and retry later.
fn coordinator_changed(err: &ClientError) -> bool {
    matches!(err.code(), Some(14..=16))
}
