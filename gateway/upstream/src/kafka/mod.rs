//! The Kafka side of forwarding, behind the `follower.rs` traits: one upstream cluster
//! ([`KafkaUpstream`]: its TLS and SASL settings, a bootstrap connection for Metadata,
//! CreateTopics and InitProducerId, the bandwidth cap) and its partitions
//! (`partition.rs`: offsets, the last record's headers, produce with acks=all), with the
//! upstream copy of an edge record in `record.rs`. Every request goes through the client
//! module (`client/`); this module only decides which connection to use and what a failure
//! means for forwarding. It never retries a produce itself, because a retried produce whose
//! first attempt was stored would duplicate records: the forwarder re-runs the catch-up
//! protocol after every error instead. A connection that failed is dropped at once and opened
//! again on the next request ([`ClientSlot`]).

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::sync::OwnedMutexGuard;

use crate::ablation::Ablation;
use crate::bandwidth::{Bandwidth, Class, DayClock};
use crate::client::{ClientError, Connection, Settings, metadata};
use crate::config::{Mode, TlsSettings, UpstreamConfig};
use crate::driver::PROBE_INTERVAL;
use crate::error::UpstreamError;
use crate::follower::Cluster;
use crate::producer::Producer;

mod partition;
mod record;

pub use partition::UpstreamPartition;
#[cfg(any(test, feature = "testing"))]
pub(crate) use record::upstream_record;

/// The most a connect to the cluster (bootstrap and ApiVersions) and a request on it may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to the upstream cluster.
#[derive(Debug)]
pub struct KafkaUpstream {
    slot: Arc<ClientSlot>,
    /// Mirror mode's idempotent producer (shared mode's batches carry no producer id).
    producer: Option<Arc<Producer>>,
    bootstrap: String,
    /// The upstream's `bandwidth` cap, shared by every partition produced to through it.
    bandwidth: Arc<Bandwidth>,
    /// The most bytes one produce request carries ([`produced_bytes`]).
    batch_limit: u64,
    /// Topic configs sent with CreateTopics (`UpstreamConfig::create_topic_configs`).
    topic_configs: Vec<(String, String)>,
    /// Existing topics whose timestamp type was already checked (once per topic and process).
    checked: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// The bootstrap connection of one upstream, opened on first use and dropped as soon as a
/// request through it (or through a partition handle opened with it) lost its connection. A
/// new one is opened on the next request, at most once per gap: [`PROBE_INTERVAL`] after a
/// first failed connect, growing by half after each further one up to `reconnect_max`, each gap
/// drawn between its half and its whole (equal jitter), so gateways cut off by one outage do not
/// come back in the same second ([`reconnect_gap`]); with `reconnect_jitter` off (a lab
/// comparison) each gap is its whole.
#[derive(Debug)]
pub(crate) struct ClientSlot {
    pub(crate) settings: Settings,
    state: std::sync::Mutex<SlotState>,
    /// Held while connecting, so concurrent sessions wait for one connect instead of each
    /// opening their own.
    connecting: tokio::sync::Mutex<()>,
    /// The longest gap between connects while Kafka cannot be reached.
    reconnect_max: Duration,
    /// Whether each gap is drawn between its half and its whole (`reconnect_jitter`).
    jitter: bool,
}

/// The gap after the `failures`-th failed connect in a row: [`PROBE_INTERVAL`] × 1.5^(failures
/// − 1), at most `max`, then a random point between its half and its whole (`random` in
/// [0, 1)).
pub(crate) fn reconnect_gap(failures: u32, max: Duration, random: f64) -> Duration {
    let exponent = i32::try_from(failures.saturating_sub(1))
        .unwrap_or(i32::MAX)
        .min(64);
    let full = PROBE_INTERVAL
        .mul_f64(1.5f64.powi(exponent))
        .min(max.max(PROBE_INTERVAL));
    full.mul_f64(0.5 + 0.5 * random.clamp(0.0, 1.0))
}

/// A number in [0, 1) that differs between processes and calls (the jitter's, not a secret).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The live connection of a [`ClientSlot`] and its generation.
type Live = (u64, Arc<tokio::sync::Mutex<Connection>>);

#[derive(Debug, Default)]
struct SlotState {
    live: Option<Live>,
    generation: u64,
    /// Until when no connect is tried, and why the last one failed.
    failed: Option<(tokio::time::Instant, Arc<ClientError>)>,
    /// Failed connects in a row.
    failures: u32,
}

impl ClientSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bootstrap(&self) -> String {
        self.settings.bootstrap.join(",")
    }

    /// The live connection and its generation, connecting first if there is none (an error
    /// without trying when the last attempt failed less than [`PROBE_INTERVAL`] ago).
    pub(crate) async fn connection(
        &self,
    ) -> Result<(u64, OwnedMutexGuard<Connection>), UpstreamError> {
        let live = self.lock().live.clone();
        if let Some((generation, connection)) = live {
            let mut guard = connection.lock_owned().await;
            if !guard.is_dead() {
                return Ok((generation, guard));
            }
            self.drop_client(generation);
        }
        let _connecting = self.connecting.lock().await;
        let live = self.live_or_recent_failure()?;
        if let Some((generation, connection)) = live {
            return Ok((generation, connection.lock_owned().await));
        }
        let opened = Connection::bootstrap(&self.settings, CONNECT_TIMEOUT).await;
        let (generation, connection) = self.install(opened)?;
        Ok((generation, connection.lock_owned().await))
    }

    /// Makes `opened` the live connection, or remembers why it failed.
    fn install(&self, opened: Result<Connection, ClientError>) -> Result<Live, UpstreamError> {
        let mut state = self.lock();
        match opened {
            Ok(connection) => {
                state.generation += 1;
                let live = (
                    state.generation,
                    Arc::new(tokio::sync::Mutex::new(connection)),
                );
                state.live = Some(live.clone());
                state.failed = None;
                state.failures = 0;
                Ok(live)
            }
            Err(err) => {
                let source = Arc::new(err);
                state.failures = state.failures.saturating_add(1);
                let random = if self.jitter { jitter() } else { 1.0 };
                let gap = reconnect_gap(state.failures, self.reconnect_max, random);
                let until = tokio::time::Instant::now() + gap;
                state.failed = Some((until, Arc::clone(&source)));
                Err(UpstreamError::Connect {
                    bootstrap: self.bootstrap(),
                    source,
                })
            }
        }
    }

    /// The live connection, if another session connected meanwhile; an error while the gap
    /// after the last failed connect lasts.
    fn live_or_recent_failure(&self) -> Result<Option<Live>, UpstreamError> {
        let state = self.lock();
        if let Some((until, source)) = &state.failed {
            if tokio::time::Instant::now() < *until {
                return Err(UpstreamError::Connect {
                    bootstrap: self.bootstrap(),
                    source: Arc::clone(source),
                });
            }
        }
        Ok(state.live.clone())
    }

    /// Drops the connection of `generation` (if it is still the live one) after a request
    /// through it or through a handle opened with it failed.
    pub(crate) fn drop_client(&self, generation: u64) {
        let mut state = self.lock();
        if state.live.as_ref().is_some_and(|(g, _)| *g == generation) {
            tracing::debug!(generation, "dropping the Kafka connection after a failure");
            state.live = None;
        }
    }

    /// `source` from a request of `generation` during `op` on `topic`; a lost connection also
    /// drops the slot's connection.
    pub(crate) fn error(
        &self,
        generation: u64,
        op: &'static str,
        topic: String,
        source: ClientError,
    ) -> UpstreamError {
        if source.is_unreachable() {
            self.drop_client(generation);
        }
        UpstreamError::Client { op, topic, source }
    }
}

impl KafkaUpstream {
    /// The upstream's cluster handle, not connected yet: the first request connects. Fails only
    /// on a configuration it cannot use (the TLS CA file).
    pub fn new(config: &UpstreamConfig) -> Result<Self, UpstreamError> {
        Self::ablated(config, Ablation::NONE)
    }

    /// [`KafkaUpstream::new`] whose mirror-mode producer is plain if the bench's `ablation`
    /// says so.
    pub(crate) fn ablated(
        config: &UpstreamConfig,
        ablation: Ablation,
    ) -> Result<Self, UpstreamError> {
        let tls = config.tls.as_ref().map(tls_config).transpose()?;
        let bandwidth = Arc::new(Bandwidth::scheduled(
            config.bandwidth.0,
            config.schedule.clone(),
            DayClock::local(),
            config.priorities.clone(),
        ));
        let producer = (config.mode == Mode::Mirror).then(|| {
            let producer = Producer::new(config.state_dir.clone());
            match ablation.without_idempotence {
                true => Arc::new(producer.without_idempotence()),
                false => Arc::new(producer),
            }
        });
        let settings = Settings {
            bootstrap: config.bootstrap.clone(),
            tls,
            sasl: config.sasl.clone(),
        };
        Ok(Self {
            producer,
            slot: Arc::new(ClientSlot {
                settings,
                state: std::sync::Mutex::default(),
                connecting: tokio::sync::Mutex::new(()),
                reconnect_max: config.reconnect_max.0,
                jitter: config.reconnect_jitter,
            }),
            bootstrap: config.bootstrap.join(","),
            batch_limit: bandwidth.batch_limit(config.max_batch_bytes.0),
            bandwidth,
            topic_configs: config.create_topic_configs(),
            checked: std::sync::Mutex::default(),
        })
    }

    /// [`KafkaUpstream::new`], connected: fails when the cluster cannot be reached.
    pub async fn connect(config: &UpstreamConfig) -> Result<Self, UpstreamError> {
        let upstream = Self::new(config)?;
        upstream.slot.connection().await?;
        Ok(upstream)
    }

    /// The most bytes one produce request carries: `max_batch_bytes`, or one second of the
    /// bandwidth cap if that is less.
    pub fn batch_limit(&self) -> u64 {
        self.batch_limit
    }

    /// Creates `topic` with `partitions` partitions and the upstream's topic configs
    /// (`message.timestamp.type=LogAppendTime` unless `topic_configs` says otherwise) unless it
    /// exists; an existing topic is used as it is, its configs never altered. A cluster that
    /// refuses (policy, ACLs, too few brokers, a bad topic config) yields
    /// [`UpstreamError::MissingTopic`] naming the topic.
    pub async fn ensure_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: u16,
    ) -> Result<(), UpstreamError> {
        let configs: Vec<(&str, &str)> = self
            .topic_configs
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        self.ensure_topic_configured(topic, partitions, replication, &configs)
            .await
    }

    /// [`KafkaUpstream::ensure_topic`] with `configs` instead of the upstream's topic configs
    /// (the fleet status topic, which is compacted).
    pub async fn ensure_topic_configured(
        &self,
        topic: &str,
        partitions: u32,
        replication: u16,
        configs: &[(&str, &str)],
    ) -> Result<(), UpstreamError> {
        let (generation, mut connection) = self.slot.connection().await?;
        let error = |op, err| self.slot.error(generation, op, topic.to_owned(), err);
        let listed = metadata::metadata(&mut connection, Some(topic))
            .await
            .map_err(|e| error("list topics", e))?;
        if metadata::partition_count(&listed, topic).map_err(|e| error("list topics", e))? > 0 {
            let first =
                (self.checked.lock().unwrap_or_else(|e| e.into_inner())).insert(topic.to_owned());
            if first {
                self.check_existing(&mut connection, generation, topic)
                    .await;
            }
            return Ok(());
        }
        let (partitions, replication) = (
            i32::try_from(partitions).unwrap_or(i32::MAX),
            i16::try_from(replication).unwrap_or(i16::MAX),
        );
        let controller = metadata::broker(&listed, listed.controller_id.0);
        let created = match controller {
            Some(addr) if addr != connection.addr() => {
                let settings = &self.slot.settings;
                match Connection::open(&addr, settings, CONNECT_TIMEOUT).await {
                    Ok(mut controller) => {
                        metadata::create_topic(
                            &mut controller,
                            topic,
                            partitions,
                            replication,
                            configs,
                        )
                        .await
                    }
                    Err(err) => Err(err),
                }
            }
            _ => {
                metadata::create_topic(&mut connection, topic, partitions, replication, configs)
                    .await
            }
        };
        match created {
            Ok(true) => {
                tracing::info!(topic, partitions, configs = ?configs, "created the upstream topic");
                Ok(())
            }
            Ok(false) => {
                tracing::info!(
                    topic,
                    "the upstream topic was created meanwhile; its configs are not tern's to change"
                );
                Ok(())
            }
            Err(source @ ClientError::Kafka { .. }) => Err(UpstreamError::MissingTopic {
                topic: topic.to_owned(),
                source,
            }),
            Err(err) => Err(error("create topic", err)),
        }
    }

    /// Warns when the existing `topic` (which tern never alters) keeps producer timestamps
    /// (`CreateTime`): Kafka then deletes a backlog older than its `retention.ms` as it lands.
    /// Asked once per topic; a broker that does not answer (ACLs, a lost connection) only costs
    /// the warning.
    async fn check_existing(&self, connection: &mut Connection, generation: u64, topic: &str) {
        match metadata::topic_configs(connection, topic, &CHECKED_CONFIGS).await {
            Ok(configs) => {
                if let Some(warning) = existing_topic_warning(&configs) {
                    tracing::warn!(topic, "{warning}");
                }
            }
            Err(err) => {
                let err = self
                    .slot
                    .error(generation, "describe configs", topic.to_owned(), err);
                tracing::debug!(topic, %err, "cannot check the upstream topic's timestamp type");
            }
        }
    }

    /// The values the broker gives for `names` of `topic` (DescribeConfigs: set on the topic or
    /// the brokers' defaults).
    pub async fn topic_configs(
        &self,
        topic: &str,
        names: &[&str],
    ) -> Result<Vec<(String, Option<String>)>, UpstreamError> {
        let (generation, mut connection) = self.slot.connection().await?;
        metadata::topic_configs(&mut connection, topic, names)
            .await
            .map_err(|e| {
                self.slot
                    .error(generation, "describe configs", topic.to_owned(), e)
            })
    }

    /// A handle on `topic`/`partition` at its current leader.
    pub async fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<UpstreamPartition, UpstreamError> {
        UpstreamPartition::open(
            &self.slot,
            self.producer.clone(),
            topic,
            partition,
            (Arc::clone(&self.bandwidth), self.batch_limit),
            None,
        )
        .await
    }

    /// A handle for a live copy: plain batches (no producer identity), charged to `class`.
    pub async fn live_partition(
        &self,
        topic: &str,
        partition: u32,
        class: Class,
    ) -> Result<UpstreamPartition, UpstreamError> {
        UpstreamPartition::open(
            &self.slot,
            None,
            topic,
            partition,
            (Arc::clone(&self.bandwidth), self.batch_limit),
            Some(class),
        )
        .await
    }

    /// The bootstrap servers, comma separated.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
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
        let (generation, mut connection) = self.slot.connection().await?;
        let error = |e| {
            self.slot
                .error(generation, "list topics", topic.to_owned(), e)
        };
        let listed = metadata::metadata(&mut connection, Some(topic))
            .await
            .map_err(error)?;
        metadata::partition_count(&listed, topic).map_err(error)
    }

    async fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<UpstreamPartition, UpstreamError> {
        KafkaUpstream::partition(self, topic, partition).await
    }

    async fn live_partition(
        &self,
        topic: &str,
        partition: u32,
        class: Class,
    ) -> Result<UpstreamPartition, UpstreamError> {
        KafkaUpstream::live_partition(self, topic, partition, class).await
    }
}

/// The configs of an existing topic that [`existing_topic_warning`] looks at.
const CHECKED_CONFIGS: [&str; 2] = ["message.timestamp.type", "retention.ms"];

/// What to warn about an existing upstream topic with `configs` (DescribeConfigs' answer for
/// [`CHECKED_CONFIGS`]): nothing unless it keeps producer timestamps (`CreateTime`).
pub(crate) fn existing_topic_warning(configs: &[(String, Option<String>)]) -> Option<String> {
    let value = |name: &str| {
        configs
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    };
    if value("message.timestamp.type") != Some("CreateTime") {
        return None;
    }
    let retention = value("retention.ms").unwrap_or("?");
    Some(format!(
        "the upstream topic exists with message.timestamp.type=CreateTime and \
         retention.ms={retention}: Kafka deletes forwarded records whose edge timestamps are older \
         than that as they arrive (a backlog after a long outage), and refuses records stamped more \
         than message.timestamp.after.max.ms ahead; tern does not alter existing topics: set \
         message.timestamp.type=LogAppendTime on it (docs/upstream.md, \"Topics tern creates\")"
    ))
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

#[cfg(test)]
mod test;
