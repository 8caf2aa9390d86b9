//! A minimal Kafka consumer-group offset client: find the group's coordinator, commit one
//! partition's offset, fetch it back. rskafka 0.6 has no group API and no way to send a raw
//! request (its protocol and messenger modules are private), so this speaks the four requests it
//! needs itself (`wire.rs`) over its own connection (`conn.rs`), plaintext or TLS with the
//! upstream's rustls configuration, authenticated with the upstream's SASL settings
//! (`sasl.rs`: PLAIN, SCRAM-SHA-256/512).
//! It never joins the group: commits are standalone (generation -1, no member id), like a
//! consumer that assigns its partitions itself. It never produces or fetches records.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

pub(crate) mod conn;
pub mod frame;
mod sasl;
pub mod wire;

use crate::config::SaslSettings;
use conn::{CLIENT_ID, Connection};
pub use sasl::SaslError;
use wire::{Commit, WireError};

/// Why a group request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    #[error("{addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("{addr}: {op} timed out")]
    Timeout { addr: String, op: &'static str },
    #[error("{addr}: TLS: {message}")]
    Tls { addr: String, message: String },
    #[error("{addr}: response frame of {size} bytes")]
    BadFrame { addr: String, size: usize },
    #[error("{api} response: {source}")]
    Wire {
        api: &'static str,
        source: WireError,
    },
    #[error("{api}: Kafka error {code} ({name}){context}")]
    Kafka {
        api: &'static str,
        code: i16,
        name: &'static str,
        context: String,
    },
    #[error("the broker does not accept {api} v{version} (it accepts {range:?})")]
    Unsupported {
        api: &'static str,
        version: i16,
        range: Option<(i16, i16)>,
    },
    #[error("{addr}: SASL: {source}")]
    Sasl { addr: String, source: SaslError },
    #[error("no bootstrap server answered: {tried}")]
    NoBroker { tried: String },
    #[error("{api}: {message}")]
    Codec { api: &'static str, message: String },
}

impl GroupError {
    pub(crate) fn kafka(api: &'static str, code: i16, context: String) -> Self {
        Self::Kafka {
            api,
            code,
            name: error_name(code),
            context,
        }
    }

    /// Whether the broker could not be reached or the connection failed (no broker answered).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            Self::Io { .. } | Self::Timeout { .. } | Self::BadFrame { .. } | Self::NoBroker { .. }
        )
    }

    /// Whether the coordinator moved or is not ready: find it again and retry later.
    fn coordinator_changed(&self) -> bool {
        matches!(self, Self::Kafka { code: 14..=16, .. })
    }
}

/// Names of the Kafka error codes the group requests return.
fn error_name(code: i16) -> &'static str {
    match code {
        2 => "CORRUPT_MESSAGE",
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        5 => "LEADER_NOT_AVAILABLE",
        6 => "NOT_LEADER_OR_FOLLOWER",
        7 => "REQUEST_TIMED_OUT",
        10 => "MESSAGE_TOO_LARGE",
        19 => "NOT_ENOUGH_REPLICAS",
        20 => "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        14 => "COORDINATOR_LOAD_IN_PROGRESS",
        15 => "COORDINATOR_NOT_AVAILABLE",
        16 => "NOT_COORDINATOR",
        22 => "ILLEGAL_GENERATION",
        24 => "INVALID_GROUP_ID",
        25 => "UNKNOWN_MEMBER_ID",
        28 => "OFFSET_METADATA_TOO_LARGE",
        29 => "TOPIC_AUTHORIZATION_FAILED",
        30 => "GROUP_AUTHORIZATION_FAILED",
        33 => "UNSUPPORTED_SASL_MECHANISM",
        34 => "ILLEGAL_SASL_STATE",
        35 => "UNSUPPORTED_VERSION",
        45 => "OUT_OF_ORDER_SEQUENCE_NUMBER",
        46 => "DUPLICATE_SEQUENCE_NUMBER",
        47 => "INVALID_PRODUCER_EPOCH",
        49 => "INVALID_PRODUCER_ID_MAPPING",
        58 => "SASL_AUTHENTICATION_FAILED",
        59 => "UNKNOWN_PRODUCER_ID",
        69 => "GROUP_ID_NOT_FOUND",
        _ => "see Kafka's protocol error codes",
    }
}

/// The group offsets of one consumer group, through its coordinator.
#[derive(Debug)]
pub struct GroupClient {
    bootstrap: Vec<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    sasl: Option<SaslSettings>,
    group: String,
    timeout: Duration,
    coordinator: Mutex<Option<Connection>>,
}

impl GroupClient {
    pub fn new(
        bootstrap: Vec<String>,
        tls: Option<Arc<rustls::ClientConfig>>,
        sasl: Option<SaslSettings>,
        group: String,
    ) -> Self {
        Self {
            bootstrap,
            tls,
            sasl,
            group,
            timeout: Duration::from_secs(10),
            coordinator: Mutex::new(None),
        }
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// Commits `commit` for the group; any failure drops the connection, so the next request
    /// finds the coordinator again.
    pub async fn commit(&self, commit: &Commit<'_>) -> Result<(), GroupError> {
        let group = self.group.clone();
        let body = self
            .call("OffsetCommit", |id| {
                wire::offset_commit(id, CLIENT_ID, &group, commit)
            })
            .await?;
        let partitions = wire::decode_offset_commit(&body).map_err(|source| GroupError::Wire {
            api: "OffsetCommit",
            source,
        })?;
        let context = format!(" for {}/{}", commit.topic, commit.partition);
        match partitions
            .iter()
            .find(|p| p.0 == commit.topic && p.1 == commit.partition)
        {
            Some(&(_, _, 0)) => Ok(()),
            Some(&(_, _, code)) => {
                self.fail(GroupError::kafka("OffsetCommit", code, context))
                    .await
            }
            None => {
                let missing = WireError::Invalid {
                    what: "partition (missing)",
                };
                self.fail(GroupError::Wire {
                    api: "OffsetCommit",
                    source: missing,
                })
                .await
            }
        }
    }

    /// The group's committed offset of `topic`/`partition`, `None` when it has none.
    pub async fn fetch(&self, topic: &str, partition: i32) -> Result<Option<i64>, GroupError> {
        let group = self.group.clone();
        let body = self
            .call("OffsetFetch", |id| {
                wire::offset_fetch(id, CLIENT_ID, &group, topic, partition)
            })
            .await?;
        let (error, partitions) =
            wire::decode_offset_fetch(&body).map_err(|source| GroupError::Wire {
                api: "OffsetFetch",
                source,
            })?;
        let context = format!(" for {topic}/{partition}");
        match error {
            0 => {}
            69 => return Ok(None),
            code => {
                return self
                    .fail(GroupError::kafka("OffsetFetch", code, context))
                    .await;
            }
        }
        let Some(fetched) = partitions
            .iter()
            .find(|p| p.topic == topic && p.partition == partition)
        else {
            return Ok(None);
        };
        match fetched.error_code {
            0 => Ok((fetched.offset >= 0).then_some(fetched.offset)),
            3 | 69 => Ok(None),
            code => {
                self.fail(GroupError::kafka("OffsetFetch", code, context))
                    .await
            }
        }
    }

    /// Drops the coordinator connection when the error says it moved, then returns the error.
    async fn fail<T>(&self, err: GroupError) -> Result<T, GroupError> {
        if err.coordinator_changed() {
            *self.coordinator.lock().await = None;
        }
        Err(err)
    }

    /// One request to the coordinator, connecting to it first if needed.
    async fn call(
        &self,
        api: &'static str,
        build: impl FnOnce(i32) -> Vec<u8>,
    ) -> Result<Vec<u8>, GroupError> {
        let mut guard = self.coordinator.lock().await;
        let live = guard.take().and_then(|mut c| (!c.is_dead()).then_some(c));
        let mut connection = match live {
            Some(connection) => connection,
            None => self.find_coordinator().await?,
        };
        let body = connection.call(api, build).await?;
        *guard = Some(connection);
        Ok(body)
    }

    /// Asks the bootstrap servers, in order, where the group's coordinator is and connects.
    async fn find_coordinator(&self) -> Result<Connection, GroupError> {
        let mut tried = Vec::new();
        for addr in &self.bootstrap {
            match self.ask_coordinator(addr).await {
                Ok(coordinator) => {
                    return Connection::open(
                        &coordinator,
                        self.tls.as_ref(),
                        self.sasl.as_ref(),
                        self.timeout,
                    )
                    .await;
                }
                Err(err @ GroupError::Kafka { .. }) => return Err(err),
                Err(err) => tried.push(err.to_string()),
            }
        }
        Err(GroupError::NoBroker {
            tried: tried.join("; "),
        })
    }

    /// `host:port` of the coordinator, as `addr` reports it.
    async fn ask_coordinator(&self, addr: &str) -> Result<String, GroupError> {
        let mut bootstrap =
            Connection::open(addr, self.tls.as_ref(), self.sasl.as_ref(), self.timeout).await?;
        let body = bootstrap
            .call("FindCoordinator", |id| {
                wire::find_coordinator(id, CLIENT_ID, &self.group)
            })
            .await?;
        let found = wire::decode_find_coordinator(&body).map_err(|source| GroupError::Wire {
            api: "FindCoordinator",
            source,
        })?;
        if found.error_code != 0 {
            let context = found
                .error_message
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            return Err(GroupError::kafka(
                "FindCoordinator",
                found.error_code,
                context,
            ));
        }
        tracing::debug!(group = %self.group, via = %bootstrap.addr(), host = %found.host, port = found.port, node = found.node_id, "group coordinator");
        if found.host.contains(':') {
            return Ok(format!("[{}]:{}", found.host, found.port));
        }
        Ok(format!("{}:{}", found.host, found.port))
    }
}
