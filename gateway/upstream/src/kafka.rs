//! The Kafka side of forwarding, and the only module that imports the Kafka client (rskafka):
//! connecting (TLS via rustls with a custom CA, SASL), creating upstream topics, and the
//! `follower.rs` traits over a partition client — its end and start offsets, the headers of its
//! last record, and producing batches with acks=all as tern's upstream records (`tern-*`
//! headers, `reading-json` values decoded with `tern_shared::Reading`). Mirror mode's batches go
//! through the idempotent producer of `producer/` (producer id, sequence = edge offset); shared
//! mode's through rskafka. It never retries a produce itself: rskafka's internal retries are
//! switched off, because a retried produce whose first attempt was stored would duplicate
//! records. The forwarder re-runs the catch-up protocol after every error instead. A client
//! whose connection failed is dropped at once and rebuilt on the next request ([`ClientSlot`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rskafka::BackoffConfig;
use rskafka::chrono::{DateTime, Utc};
use rskafka::client::error::{Error as ClientError, ProtocolError};
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use tern_log::StoredRecord;
use tern_shared::Reading;

use crate::bandwidth::Bandwidth;
use crate::config::{Codec, Mode, SaslMechanism, TlsSettings, UpstreamConfig, ValueFormat};
use crate::driver::PROBE_INTERVAL;
use crate::error::UpstreamError;
use crate::follower::{Cluster, Follower};
use crate::group::GroupError;
use crate::group::conn::Connection;
use crate::producer::{self, OutRecord, Producer};
use crate::provenance::{H_GATEWAY, H_OFFSET, H_PARTITION, H_TOPIC, Provenance};

/// Set when `value_format` asked for a decoded value and the edge value did not decode.
pub const H_DECODE_ERROR: &str = "tern-decode-error";

/// The most a connect to the cluster (bootstrap and first Metadata) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to the upstream cluster.
#[derive(Debug)]
pub struct KafkaUpstream {
    slot: Arc<ClientSlot>,
    /// Mirror mode's idempotent producer (shared mode produces through rskafka, at least once).
    producer: Option<Arc<Producer>>,
    bootstrap: String,
    /// The upstream's `bandwidth` cap, shared by every partition produced to through it.
    bandwidth: Arc<Bandwidth>,
    /// The most bytes one produce request carries ([`produced_bytes`]).
    batch_limit: u64,
}

/// The rskafka client of one upstream, connected on first use and dropped as soon as one of its
/// connections failed: rskafka keeps a failed (poisoned) metadata connection and would hand it
/// out again, so tern never asks a client again once any request through it lost its
/// connection. A new client is built on the next request, at most once per [`PROBE_INTERVAL`].
struct ClientSlot {
    config: UpstreamConfig,
    tls: Option<Arc<rustls::ClientConfig>>,
    state: std::sync::Mutex<SlotState>,
    /// Held while connecting, so concurrent sessions wait for one connect instead of each
    /// opening their own.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct SlotState {
    /// The live client and its generation.
    client: Option<(u64, Arc<Client>)>,
    generation: u64,
    /// When and why the last connect failed.
    failed: Option<(tokio::time::Instant, String)>,
}

impl std::fmt::Debug for ClientSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSlot").finish_non_exhaustive()
    }
}

impl ClientSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live client, connecting first if there is none (an error without trying when the
    /// last attempt failed less than [`PROBE_INTERVAL`] ago).
    async fn client(&self) -> Result<(u64, Arc<Client>), UpstreamError> {
        if let Some(client) = self.lock().client.clone() {
            return Ok(client);
        }
        let _connecting = self.connecting.lock().await;
        let bootstrap = self.config.bootstrap.join(",");
        {
            let state = self.lock();
            if let Some(client) = state.client.clone() {
                return Ok(client);
            }
            if let Some((at, message)) = &state.failed {
                if at.elapsed() < PROBE_INTERVAL {
                    return Err(UpstreamError::Connect {
                        bootstrap,
                        message: message.clone(),
                    });
                }
            }
        }
        let built = tokio::time::timeout(CONNECT_TIMEOUT, self.builder().build()).await;
        let mut state = self.lock();
        let message = match built {
            Ok(Ok(client)) => {
                state.generation += 1;
                let client = (state.generation, Arc::new(client));
                state.client = Some(client.clone());
                state.failed = None;
                return Ok(client);
            }
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {CONNECT_TIMEOUT:?}"),
        };
        state.failed = Some((tokio::time::Instant::now(), message.clone()));
        Err(UpstreamError::Connect { bootstrap, message })
    }

    /// Drops the client of `generation` (if it is still the live one) after one of its
    /// connections failed.
    fn drop_client(&self, generation: u64) {
        let mut state = self.lock();
        if state.client.as_ref().is_some_and(|(g, _)| *g == generation) {
            tracing::debug!(
                generation,
                "dropping the Kafka client after a lost connection"
            );
            state.client = None;
        }
    }

    fn builder(&self) -> ClientBuilder {
        let no_retry = BackoffConfig {
            deadline: Some(Duration::ZERO),
            ..BackoffConfig::default()
        };
        let mut builder = ClientBuilder::new(self.config.bootstrap.clone())
            .client_id("tern")
            .backoff_config(no_retry);
        if let Some(sasl) = &self.config.sasl {
            let credentials = Credentials::new(sasl.username.clone(), sasl.password.clone());
            builder = builder.sasl_config(match sasl.mechanism {
                SaslMechanism::Plain => SaslConfig::Plain(credentials),
                SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(credentials),
                SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(credentials),
            });
        }
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(Arc::clone(tls));
        }
        builder
    }

    /// `err` from the client of `generation` during `op` on `topic`: a broker's answer is
    /// [`UpstreamError::Kafka`]; anything else means the connection failed, so the client is
    /// dropped and the error is [`UpstreamError::Unreachable`].
    fn error(
        &self,
        generation: u64,
        op: &'static str,
        topic: String,
        err: ClientError,
    ) -> UpstreamError {
        let message = format!("{err} (bootstrap {})", self.config.bootstrap.join(","));
        if matches!(err, ClientError::ServerError { .. }) {
            return UpstreamError::Kafka { op, topic, message };
        }
        self.drop_client(generation);
        UpstreamError::Unreachable { op, topic, message }
    }
}

impl KafkaUpstream {
    /// The upstream's cluster handle, not connected yet: the first request connects. Fails only
    /// on a configuration it cannot use (the TLS CA file).
    pub fn new(config: &UpstreamConfig) -> Result<Self, UpstreamError> {
        let tls = config.tls.as_ref().map(tls_config).transpose()?;
        let bandwidth = Arc::new(Bandwidth::new(config.bandwidth.0));
        let producer = (config.mode == Mode::Mirror).then(|| {
            let producer = Producer::new(
                config.bootstrap.clone(),
                tls.clone(),
                config.sasl.clone(),
                config.state_dir.clone(),
            );
            match config.bench_without_idempotence {
                true => Arc::new(producer.without_idempotence()),
                false => Arc::new(producer),
            }
        });
        Ok(Self {
            producer,
            slot: Arc::new(ClientSlot {
                config: config.clone(),
                tls,
                state: std::sync::Mutex::default(),
                connecting: tokio::sync::Mutex::new(()),
            }),
            bootstrap: config.bootstrap.join(","),
            batch_limit: bandwidth.batch_limit(config.max_batch_bytes.0),
            bandwidth,
        })
    }

    /// [`KafkaUpstream::new`], connected: fails when the cluster cannot be reached.
    pub async fn connect(config: &UpstreamConfig) -> Result<Self, UpstreamError> {
        let upstream = Self::new(config)?;
        upstream.slot.client().await?;
        Ok(upstream)
    }

    /// The most bytes one produce request carries: `max_batch_bytes`, or one second of the
    /// bandwidth cap if that is less.
    pub fn batch_limit(&self) -> u64 {
        self.batch_limit
    }

    /// Creates `topic` with `partitions` partitions unless it exists. A cluster that refuses
    /// (policy, ACLs, too few brokers) yields [`UpstreamError::MissingTopic`] naming the topic.
    pub async fn ensure_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: u16,
    ) -> Result<(), UpstreamError> {
        let (generation, client) = self.slot.client().await?;
        let error = |op, err| self.slot.error(generation, op, topic.to_owned(), err);
        let exists = |topics: &[rskafka::topic::Topic]| topics.iter().any(|t| t.name == topic);
        let listed = client
            .list_topics()
            .await
            .map_err(|e| error("list topics", e))?;
        if exists(&listed) {
            return Ok(());
        }
        let controller = client
            .controller_client()
            .map_err(|e| error("create topic", e))?;
        let (partitions, replication) = (
            i32::try_from(partitions).unwrap_or(i32::MAX),
            i16::try_from(replication).unwrap_or(i16::MAX),
        );
        match controller
            .create_topic(topic, partitions, replication, 10_000)
            .await
        {
            Ok(()) => Ok(()),
            Err(ClientError::ServerError {
                protocol_error: ProtocolError::TopicAlreadyExists,
                ..
            }) => Ok(()),
            Err(err @ ClientError::ServerError { .. }) => Err(UpstreamError::MissingTopic {
                topic: topic.to_owned(),
                reason: err.to_string(),
            }),
            Err(err) => Err(error("create topic", err)),
        }
    }

    /// A handle on `topic`/`partition` at its current leader.
    pub async fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<UpstreamPartition, UpstreamError> {
        let (generation, client) = self.slot.client().await?;
        let index = i32::try_from(partition).unwrap_or(i32::MAX);
        let client = client
            .partition_client(topic, index, UnknownTopicHandling::Error)
            .await
            .map_err(|e| {
                self.slot
                    .error(generation, "find partition leader", topic.to_owned(), e)
            })?;
        Ok(UpstreamPartition {
            client,
            producer: self.producer.clone(),
            leader: tokio::sync::Mutex::new(None),
            slot: Arc::clone(&self.slot),
            generation,
            bandwidth: Arc::clone(&self.bandwidth),
            batch_limit: self.batch_limit,
        })
    }

    /// The bootstrap servers, comma separated.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }
}

/// One upstream partition, the follower of one edge partition.
#[derive(Debug)]
pub struct UpstreamPartition {
    client: PartitionClient,
    /// Mirror mode: batches go through the idempotent producer, over `leader`.
    producer: Option<Arc<Producer>>,
    /// The producer's connection to the partition leader, opened by the first produce; dropped
    /// with the handle (every error ends the session).
    leader: tokio::sync::Mutex<Option<Connection>>,
    /// The cluster client this partition client came from, dropped when a request fails for
    /// lack of a connection.
    slot: Arc<ClientSlot>,
    generation: u64,
    bandwidth: Arc<Bandwidth>,
    batch_limit: u64,
}

impl UpstreamPartition {
    /// The follower's end offset (its high watermark: only records every in-sync replica holds).
    pub async fn end_offset(&self) -> Result<i64, UpstreamError> {
        self.client
            .get_offset(OffsetAt::Latest)
            .await
            .map_err(|e| self.error("list offsets", e))
    }

    fn error(&self, op: &'static str, err: ClientError) -> UpstreamError {
        let topic = format!("{}/{}", self.client.topic(), self.client.partition());
        self.slot.error(self.generation, op, topic, err)
    }

    fn producer_error(&self, op: &'static str, source: GroupError) -> UpstreamError {
        let topic = format!("{}/{}", self.client.topic(), self.client.partition());
        if source.is_unreachable() {
            // The leader may be gone: the cluster client's connections may be too.
            self.slot.drop_client(self.generation);
        }
        UpstreamError::Produce { op, topic, source }
    }

    fn error_text(&self, op: &'static str, message: String) -> UpstreamError {
        UpstreamError::Kafka {
            op,
            topic: format!("{}/{}", self.client.topic(), self.client.partition()),
            message,
        }
    }
}

impl Cluster for KafkaUpstream {
    type Partition = UpstreamPartition;

    fn batch_limit(&self) -> u64 {
        self.batch_limit
    }

    async fn ensure_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: u16,
    ) -> Result<(), UpstreamError> {
        KafkaUpstream::ensure_topic(self, topic, partitions, replication).await
    }

    /// How many partitions `topic` has upstream (0 when it does not exist).
    async fn partition_count(&self, topic: &str) -> Result<u32, UpstreamError> {
        let (generation, client) = self.slot.client().await?;
        let listed = client.list_topics().await.map_err(|e| {
            self.slot
                .error(generation, "list topics", topic.to_owned(), e)
        })?;
        let count = listed
            .iter()
            .find(|t| t.name == topic)
            .map_or(0, |t| t.partitions.len());
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    async fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<UpstreamPartition, UpstreamError> {
        KafkaUpstream::partition(self, topic, partition).await
    }
}

impl Follower for UpstreamPartition {
    fn topic(&self) -> &str {
        self.client.topic()
    }

    async fn end_offset(&self) -> Result<i64, UpstreamError> {
        UpstreamPartition::end_offset(self).await
    }

    async fn start_offset(&self) -> Result<i64, UpstreamError> {
        self.client
            .get_offset(OffsetAt::Earliest)
            .await
            .map_err(|e| self.error("list offsets", e))
    }

    async fn headers_at(&self, offset: i64) -> Result<BTreeMap<String, Vec<u8>>, UpstreamError> {
        let (records, _high_watermark) = self
            .client
            .fetch_records(offset, 1..8 * 1024 * 1024, 1_000)
            .await
            .map_err(|e| self.error("fetch last record", e))?;
        let record = records
            .into_iter()
            .find(|r| r.offset == offset)
            .ok_or_else(|| {
                self.error_text("fetch last record", format!("no record at offset {offset}"))
            })?;
        Ok(record.record.headers)
    }

    /// Produces `records` with acks=all, in order, as requests of at most the batch limit (see
    /// [`KafkaUpstream::batch_limit`]), each once the bandwidth cap lets its bytes through. An
    /// error ends the call; the requests before it are stored, and the caller's catch-up finds
    /// out where.
    async fn produce(
        &self,
        records: &[StoredRecord],
        source: &Provenance,
        codec: Codec,
        format: ValueFormat,
    ) -> Result<(), UpstreamError> {
        let batch: Vec<Record> = records
            .iter()
            .map(|r| upstream_record(r, source, format))
            .collect();
        let Some(producer) = &self.producer else {
            for (batch, bytes) in split(batch, self.batch_limit) {
                self.bandwidth.acquire(bytes).await;
                self.client
                    .produce(batch, compression(codec))
                    .await
                    .map_err(|e| self.error("produce", e))?;
            }
            return Ok(());
        };
        let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
        let identity = producer
            .identity()
            .await
            .map_err(|e| self.producer_error("init producer id", e))?;
        let mut leader = self.leader.lock().await;
        if leader.as_mut().is_some_and(Connection::is_dead) {
            // The leader closed it while the forwarder waited for records (a link cut).
            *leader = None;
        }
        let mut first = 0;
        for (batch, bytes) in split_idempotent(batch, &offsets, self.batch_limit) {
            let edge_offset = offsets.get(first).copied().unwrap_or(0);
            first += batch.len();
            self.bandwidth.acquire(bytes).await;
            let out = batch.into_iter().map(out_record).collect();
            let encoded = producer::encode_batch(&identity, edge_offset, out, codec)
                .map_err(|e| self.producer_error("produce", e))?;
            let connection = match leader.as_mut() {
                Some(connection) => connection,
                None => {
                    let (topic, partition) = (self.client.topic(), self.client.partition());
                    let opened = producer
                        .leader(topic, partition)
                        .await
                        .map_err(|e| self.producer_error("find partition leader", e))?;
                    leader.insert(opened)
                }
            };
            let produced = producer::produce(
                connection,
                self.client.topic(),
                self.client.partition(),
                encoded,
            )
            .await;
            if let Err(err) = produced {
                *leader = None;
                if let GroupError::Kafka { code, .. } = &err {
                    if producer::needs_new_identity(*code) {
                        producer.renew(&identity).await;
                    }
                }
                return Err(self.producer_error("produce", err));
            }
        }
        Ok(())
    }

    /// The next batch does not follow on from what the partition holds (records left the edge
    /// log first, or upstream retention removed them all): sequences would not follow either,
    /// so the producer starts over with a new identity.
    async fn restart_sequence(&self) {
        if let Some(producer) = &self.producer {
            if let Ok(identity) = producer.identity().await {
                producer.renew(&identity).await;
            }
        }
    }
}

/// A rustls client configuration trusting the CAs in `settings.ca_file` (PEM).
pub fn tls_config(settings: &TlsSettings) -> Result<Arc<rustls::ClientConfig>, UpstreamError> {
    let path = &settings.ca_file;
    let tls_error = |message: String| UpstreamError::Tls {
        path: path.clone(),
        message,
    };
    let pem = std::fs::read(path).map_err(|e| tls_error(e.to_string()))?;
    let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| tls_error(format!("not a PEM certificate file: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certificates);
    if added == 0 {
        return Err(tls_error("holds no usable CA certificate".to_owned()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The upstream copy of an edge record: key, value, timestamp and headers, then tern's headers
/// (which replace edge headers of the same name). rskafka keeps headers in a map, so repeated
/// edge header names keep only their last value. With `ValueFormat::ReadingJson` the value is
/// the decoded reading as JSON, or the raw value plus a `tern-decode-error` header.
pub fn upstream_record(stored: &StoredRecord, source: &Provenance, format: ValueFormat) -> Record {
    let record = &stored.record;
    let mut headers: BTreeMap<String, Vec<u8>> = record
        .headers
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_vec()))
        .collect();
    let value = match format {
        ValueFormat::Raw => record.value.clone(),
        ValueFormat::ReadingJson => match reading_json(&record.value) {
            Ok(json) => json,
            Err(reason) => {
                headers.insert(H_DECODE_ERROR.to_owned(), reason.into_bytes());
                record.value.clone()
            }
        },
    };
    headers.insert(H_GATEWAY.to_owned(), source.gateway.clone().into_bytes());
    headers.insert(H_TOPIC.to_owned(), source.topic.clone().into_bytes());
    headers.insert(
        H_PARTITION.to_owned(),
        source.partition.to_string().into_bytes(),
    );
    headers.insert(H_OFFSET.to_owned(), stored.offset.to_string().into_bytes());
    Record {
        key: record.key.clone(),
        value: Some(value),
        headers,
        timestamp: DateTime::<Utc>::from_timestamp_millis(record.timestamp_ms).unwrap_or_default(),
    }
}

/// A Reading value as the JSON document `value_format = "reading-json"` forwards, or why it
/// is not one.
fn reading_json(value: &[u8]) -> Result<Vec<u8>, String> {
    let reading = Reading::decode(value).map_err(|err| format!("not a reading: {err}"))?;
    let json = serde_json::to_value(reading).map_err(|err| format!("reading as JSON: {err}"))?;
    serde_json::to_vec(&json).map_err(|err| format!("reading as JSON: {err}"))
}

/// Bytes Kafka's record format adds to each record beside key, value and header bytes (length,
/// attributes, timestamp and offset deltas, lengths: varints, about 4 + 2 per header).
const RECORD_FRAMING: usize = 14;

/// The bytes a record puts into a produce request before compression: key, value, headers
/// and [`RECORD_FRAMING`].
pub fn produced_bytes(record: &Record) -> u64 {
    let headers: usize = record.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    let bytes = record.key.as_ref().map_or(0, Vec::len)
        + record.value.as_ref().map_or(0, Vec::len)
        + headers
        + RECORD_FRAMING;
    bytes as u64
}

/// `records` in order, cut into batches of at most `max_bytes` (at least one record each),
/// each with its byte count.
fn split(records: Vec<Record>, max_bytes: u64) -> Vec<(Vec<Record>, u64)> {
    let mut batches: Vec<(Vec<Record>, u64)> = Vec::new();
    for record in records {
        let bytes = produced_bytes(&record);
        match batches.last_mut() {
            Some((batch, total)) if *total + bytes <= max_bytes => {
                batch.push(record);
                *total += bytes;
            }
            _ => batches.push((vec![record], bytes)),
        }
    }
    batches
}

/// [`split`] for the idempotent producer: also cut before a record whose edge offset does not
/// follow the one before (never in a contiguous edge log) and where the sequence wraps to 0, so
/// every request is one record batch with consecutive sequence numbers.
fn split_idempotent(
    records: Vec<Record>,
    offsets: &[u64],
    max_bytes: u64,
) -> Vec<(Vec<Record>, u64)> {
    let mut batches: Vec<(Vec<Record>, u64)> = Vec::new();
    let mut previous: Option<u64> = None;
    for (record, &offset) in records.into_iter().zip(offsets) {
        let bytes = produced_bytes(&record);
        let follows =
            previous.is_some_and(|p| p + 1 == offset) && offset % producer::SEQUENCE_WRAP != 0;
        previous = Some(offset);
        match batches.last_mut() {
            Some((batch, total)) if follows && *total + bytes <= max_bytes => {
                batch.push(record);
                *total += bytes;
            }
            _ => batches.push((vec![record], bytes)),
        }
    }
    batches
}

/// An upstream record as the idempotent producer encodes it.
fn out_record(record: Record) -> OutRecord {
    OutRecord {
        timestamp_ms: record.timestamp.timestamp_millis(),
        key: record.key,
        value: record.value.unwrap_or_default(),
        headers: record.headers,
    }
}

fn compression(codec: Codec) -> Compression {
    match codec {
        Codec::None => Compression::NoCompression,
        Codec::Gzip => Compression::Gzip,
        Codec::Lz4 => Compression::Lz4,
        Codec::Snappy => Compression::Snappy,
        Codec::Zstd => Compression::Zstd,
    }
}

#[cfg(test)]
mod test;
