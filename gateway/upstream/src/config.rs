//! `[[upstream]]`: where and how the edge log is forwarded to Kafka. Only describes settings and
//! checks them; it never connects anywhere.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use tern_core::{ByteSize, HumanDuration};

#[cfg(test)]
use crate::bandwidth::TimeOfDay;
use crate::bandwidth::{Class, ScheduleWindow};

/// One upstream Kafka cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Bootstrap servers, `host:port`. Required.
    pub bootstrap: Vec<String>,
    /// This gateway's name in upstream topic names and the `tern-gateway` header. Default: the
    /// host name.
    pub gateway_id: Option<String>,
    /// Upstream topic of edge topic `t`: `{topic_prefix}{gateway_id}.{t}`.
    pub topic_prefix: String,
    /// Edge topics to forward; empty forwards every topic. Internal topics (names starting with
    /// `__`, such as the MQTT session state) are never forwarded.
    pub topics: Vec<String>,
    /// `mirror`: exactly once, one upstream topic per gateway and edge topic. `shared`: one
    /// upstream topic per edge topic for every gateway, progress in a consumer group committed
    /// with the records in one Kafka transaction (exactly once for `read_committed` consumers).
    pub mode: Mode,
    /// Shared mode: what Kafka's murmur2 partitioner hashes to pick the upstream partition.
    pub shared_key: SharedKey,
    /// Shared mode: partitions of an upstream topic tern creates. Default: as many as the edge
    /// topic (never fewer: the group offsets name the edge partition).
    pub shared_partitions: Option<u32>,
    /// Shared mode: the consumer group holding progress. Default: `{topic_prefix}{gateway_id}`.
    pub group: Option<String>,
    /// Shared mode: the transaction timeout tern asks for in InitProducerId. A transaction left
    /// open longer (the link lost before EndTxn, a gateway that never comes back) is aborted by
    /// Kafka, and until then it holds `read_committed` consumers of the partitions it wrote.
    /// At most the brokers' `transaction.max.timeout.ms` (15 min by default).
    pub transaction_timeout: HumanDuration,
    pub compression: Codec,
    /// What the upstream record's value is: the edge value as it is (`raw`), or a sensor reading
    /// decoded through the shared schema and sent as JSON (`reading-json`). A value that does not
    /// decode is forwarded raw with a `tern-decode-error` header; nothing is dropped.
    pub value_format: ValueFormat,
    /// Bytes per produce request before compression: key, value, every header (tern's too) and
    /// record framing (at least one record is always sent). Keep it below the topic's
    /// `max.message.bytes`.
    pub max_batch_bytes: ByteSize,
    /// How long a forwarder that has caught up with the edge log waits for more records before
    /// it produces a batch that is not full (Kafka's `linger.ms`). Backlogs never wait.
    pub linger: HumanDuration,
    /// Cap on the bytes produced per second across all partitions of this upstream, counted
    /// like `max_batch_bytes` (before compression); `0` = unlimited.
    pub bandwidth: ByteSize,
    /// `[upstream.priorities]`: edge topic → priority class (`high`, `normal`, `low`) in the
    /// share of `bandwidth`; topics not named are `normal`. Weights 16, 4, 1 (`bandwidth.rs`).
    pub priorities: BTreeMap<String, Class>,
    /// `[[upstream.schedule]]`: windows of the day (the gateway's local time) with their own
    /// `bandwidth`, e.g. a lower cap in working hours on a metered link; the first window that
    /// holds the time applies, `bandwidth` outside every window (`bandwidth.rs`).
    pub schedule: Vec<ScheduleWindow>,
    /// Edge topics forwarded live first: while such a partition drains a backlog whose oldest
    /// record is older than `live_after`, its records younger than that also go at once to
    /// `{topic_prefix}{gateway_id}.{topic}.live`, and the backlog's records carry
    /// `tern-historical` (`live.rs`, docs/upstream.md "Live first").
    pub live_first: Vec<String>,
    /// How old the oldest record not yet forwarded must be for a live-first partition to count
    /// as draining a backlog, and how young a record must be to be copied live.
    pub live_after: HumanDuration,
    /// Replication factor of upstream topics tern creates.
    pub replication_factor: u16,
    /// Topic configs (`name = value`) sent with CreateTopics when tern creates an upstream topic,
    /// over tern's own ([`DEFAULT_TOPIC_CONFIGS`]: `message.timestamp.type = LogAppendTime`, so
    /// Kafka's time retention counts from arrival upstream and a backlog older than
    /// `retention.ms` is not deleted as it lands). An existing topic is never altered.
    pub topic_configs: BTreeMap<String, TopicConfigValue>,
    /// Wait after a failure; doubles up to `backoff_max`.
    pub backoff_min: HumanDuration,
    pub backoff_max: HumanDuration,
    /// The longest gap between connects while Kafka cannot be reached: the gap starts at
    /// 500 ms, grows by half after each failed connect up to this, and is jittered (between
    /// its half and its whole), so a fleet cut off together does not reconnect in one second.
    pub reconnect_max: HumanDuration,
    /// Whether each gap between connects is drawn at random between its half and its whole
    /// (`true`, the default) or is always its whole. A lab comparison knob (`tern-bench fleet
    /// --spread off`): without the draw, gateways cut off by one outage probe in step; a fleet
    /// keeps it on.
    pub reconnect_jitter: bool,
    /// How often new edge topics are looked for.
    pub discover_interval: HumanDuration,
    /// Catch-up waits until the follower's end offset stays the same for this long, so a batch
    /// an interrupted request left on the leader shows up before tern decides what to resend.
    pub catch_up_settle: HumanDuration,
    pub sasl: Option<SaslSettings>,
    pub tls: Option<TlsSettings>,
    /// `[upstream.status]`: this gateway's status records in the fleet's status topic
    /// (docs/fleet.md).
    pub status: StatusConfig,
    /// `[upstream.commands]`: the downstream, commands from this cluster to devices
    /// (docs/downstream.md). Off when absent.
    pub commands: Option<CommandsConfig>,
    /// Where mirror mode's idempotent producer keeps its identity (`producer-{cluster id}.state`,
    /// see docs/upstream.md): set by the binary to `{data_dir}/upstream`, not a setting. Without
    /// it (library use) the identity lives only as long as the process.
    #[serde(skip)]
    pub state_dir: Option<PathBuf>,
}

impl UpstreamConfig {
    /// The priority class of edge topic `topic` (`[upstream.priorities]`, else `normal`).
    pub fn class_of(&self, topic: &str) -> Class {
        self.priorities.get(topic).copied().unwrap_or_default()
    }

    /// Whether edge topic `topic` is forwarded live first (`live_first`).
    pub fn is_live_first(&self, topic: &str) -> bool {
        self.live_first.iter().any(|t| t == topic)
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            bootstrap: Vec::new(),
            gateway_id: None,
            topic_prefix: "tern.".to_owned(),
            topics: Vec::new(),
            mode: Mode::Mirror,
            shared_key: SharedKey::RecordKey,
            shared_partitions: None,
            group: None,
            transaction_timeout: HumanDuration(std::time::Duration::from_secs(60)),
            compression: Codec::Lz4,
            value_format: ValueFormat::Raw,
            max_batch_bytes: ByteSize(512 * 1024),
            linger: HumanDuration(std::time::Duration::from_millis(5)),
            bandwidth: ByteSize(0),
            priorities: BTreeMap::new(),
            schedule: Vec::new(),
            live_first: Vec::new(),
            live_after: HumanDuration(std::time::Duration::from_secs(30)),
            replication_factor: 3,
            topic_configs: BTreeMap::new(),
            backoff_min: HumanDuration(std::time::Duration::from_millis(100)),
            backoff_max: HumanDuration(std::time::Duration::from_secs(30)),
            reconnect_max: HumanDuration(std::time::Duration::from_secs(2)),
            reconnect_jitter: true,
            discover_interval: HumanDuration(std::time::Duration::from_secs(1)),
            catch_up_settle: HumanDuration(std::time::Duration::from_millis(500)),
            sasl: None,
            tls: None,
            status: StatusConfig::default(),
            commands: None,
            state_dir: None,
        }
    }
}

/// `[upstream.status]`: where and how often the gateway reports its status to the datacenter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatusConfig {
    /// Whether status records are sent at all.
    pub enabled: bool,
    /// The fleet's status topic, one for every gateway, created compacted when missing.
    pub topic: String,
    /// How often a record is sent; one is also sent at start and whenever readiness changes.
    pub interval: HumanDuration,
    /// Partitions of a status topic tern creates (a gateway's records go to the partition
    /// Kafka's partitioner picks for its id).
    pub partitions: u32,
}

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            topic: "tern-status".to_owned(),
            interval: HumanDuration(std::time::Duration::from_secs(60)),
            partitions: 1,
        }
    }
}

/// `[upstream.commands]`: which datacenter topic holds commands for devices, which of them are
/// this gateway's, where they go in the edge log and which MQTT topics they may be published on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandsConfig {
    /// The fleet's command topic in the upstream cluster. A record is this gateway's when its
    /// key is the gateway id, `*` (every gateway) or `group:{g}` for a `g` in `groups`.
    pub topic: String,
    /// Groups this gateway belongs to (`group:{name}` keys address all of a group's gateways).
    pub groups: Vec<String>,
    /// The edge log topic (one partition) each accepted or refused command is appended to; MQTT
    /// subscriptions read it, and the upstream forwards it back as the commands' outcomes.
    pub log_topic: String,
    /// MQTT topic filters the datacenter may publish to; a command for any other topic is
    /// refused (stored with a `tern-refused` header, never delivered). Empty refuses all.
    pub allow: Vec<String>,
    /// Where a gateway that has never consumed the topic starts: `earliest` (every retained
    /// command addressed to it) or `latest` (only what arrives from now on).
    pub start: CommandStart,
    /// Longest a Fetch waits at the leader for a first command.
    pub max_wait: HumanDuration,
    /// At most how often the position is stored in the edge log when no command of this
    /// gateway moved it (records for other gateways skipped); each append of commands stores
    /// it anyway.
    pub checkpoint_interval: HumanDuration,
}

impl Default for CommandsConfig {
    fn default() -> Self {
        Self {
            topic: "tern-commands".to_owned(),
            groups: Vec::new(),
            log_topic: "commands".to_owned(),
            allow: Vec::new(),
            start: CommandStart::Earliest,
            max_wait: HumanDuration(std::time::Duration::from_millis(500)),
            checkpoint_interval: HumanDuration(std::time::Duration::from_secs(60)),
        }
    }
}

/// `start`: where a gateway with no stored position begins reading the command topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommandStart {
    Earliest,
    Latest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Mirror,
    Shared,
}

/// The topic configs tern sends when it creates an upstream topic, unless `topic_configs` sets
/// the same name. `LogAppendTime`: the broker stamps each batch with its arrival time, so
/// `retention.ms` counts from arrival (a backlog older than it is not deleted as it lands) and
/// `message.timestamp.before.max.ms` / `after.max.ms` (which refuse CreateTime records outside a
/// window around the broker's clock; `after` is one hour by default since Kafka 4.0) never refuse
/// a batch. The edge timestamp travels in the `tern-timestamp` header.
pub const DEFAULT_TOPIC_CONFIGS: &[(&str, &str)] = &[("message.timestamp.type", "LogAppendTime")];

/// A `topic_configs` value: Kafka takes every topic config as a string; numbers and booleans
/// are accepted as TOML writes them (`"retention.ms" = 2592000000`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TopicConfigValue {
    Text(String),
    Integer(i64),
    Bool(bool),
}

impl std::fmt::Display for TopicConfigValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(text) => f.write_str(text),
            Self::Integer(n) => write!(f, "{n}"),
            Self::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// `shared_key`: the bytes hashed to pick a record's upstream partition in shared mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SharedKey {
    /// The record key (Kafka's default partitioner); keyless records use `edge-partition`.
    RecordKey,
    /// The gateway id: all of a gateway's records in one partition.
    Gateway,
    /// `{gateway_id}/{edge topic}/{edge partition}`: each edge partition stays in order.
    EdgePartition,
}

/// `value_format`: how edge values are sent upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ValueFormat {
    /// The edge record's value, byte for byte.
    #[default]
    Raw,
    /// `tern_shared::Reading` decoded and sent as a JSON object.
    ReadingJson,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Codec {
    None,
    Gzip,
    Lz4,
    Snappy,
    Zstd,
}

/// `[upstream.sasl]`. The password comes from exactly one of `password`, `password_file` and
/// `password_env`; the binary reads the file or variable into `password` before connecting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslSettings {
    pub mechanism: SaslMechanism,
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub password: String,
    /// A file whose first line is the password (mode 0600, owned by tern's user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

/// `[upstream.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM file of the CAs to trust.
    pub ca_file: PathBuf,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            ca_file: PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
        }
    }
}

/// Longest accepted `linger`.
const MAX_LINGER: std::time::Duration = std::time::Duration::from_secs(10);
/// Shortest accepted `live_after`: below it every record waiting for a batch would count as a
/// backlog and be sent twice.
const MIN_LIVE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
/// Smallest accepted non-zero `bandwidth`, bytes per second.
const MIN_BANDWIDTH: u64 = 1024;
/// Accepted `transaction_timeout`: Kafka counts it in whole milliseconds as an int32 and aborts
/// timed-out transactions on a timer, so below a second only races its own checks.
const MIN_TRANSACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
const MAX_TRANSACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl UpstreamConfig {
    /// Checks the settings; `Err((key, message))` names the offending key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.bootstrap.is_empty() {
            return Err((
                "upstream.bootstrap".into(),
                "needs at least one host:port".into(),
            ));
        }
        if let Some(bad) = self.bootstrap.iter().find(|b| !b.contains(':')) {
            return Err((
                "upstream.bootstrap".into(),
                format!("`{bad}` is not host:port"),
            ));
        }
        if self.replication_factor == 0 || i16::try_from(self.replication_factor).is_err() {
            return Err((
                "upstream.replication_factor".into(),
                "must be 1..=32767".into(),
            ));
        }
        if self.backoff_min.0.is_zero() || self.backoff_min.0 > self.backoff_max.0 {
            return Err((
                "upstream.backoff_min".into(),
                "must be above zero and at most backoff_max".into(),
            ));
        }
        if self.reconnect_max.0 < std::time::Duration::from_millis(500)
            || self.reconnect_max.0 > std::time::Duration::from_secs(600)
        {
            return Err((
                "upstream.reconnect_max".into(),
                "must be 500ms to 10m".into(),
            ));
        }
        if self.linger.0 > MAX_LINGER {
            return Err(("upstream.linger".into(), "must be at most 10s".into()));
        }
        if self.bandwidth.0 != 0 && self.bandwidth.0 < MIN_BANDWIDTH {
            return Err((
                "upstream.bandwidth".into(),
                "must be 0 (unlimited) or at least 1KiB (bytes per second)".into(),
            ));
        }
        for window in &self.schedule {
            if window.from == window.to {
                return Err((
                    "upstream.schedule".into(),
                    format!("the window from {} to {} is empty", window.from, window.to),
                ));
            }
            if window.bandwidth.0 != 0 && window.bandwidth.0 < MIN_BANDWIDTH {
                return Err((
                    "upstream.schedule.bandwidth".into(),
                    "must be 0 (unlimited) or at least 1KiB (bytes per second)".into(),
                ));
            }
        }
        if self.live_after.0 < MIN_LIVE_AFTER {
            return Err(("upstream.live_after".into(), "must be at least 1s".into()));
        }
        if let Some(id) = &self.gateway_id {
            check_topic_part(id).map_err(|m| ("upstream.gateway_id".to_owned(), m))?;
        }
        self.validate_shared()?;
        self.validate_status()?;
        self.validate_topic_configs()?;
        self.validate_commands()?;
        check_topic_part(&self.topic_prefix).map_err(|m| ("upstream.topic_prefix".to_owned(), m))
    }
}

impl UpstreamConfig {
    /// The shared-mode keys: a usable group name and partition count.
    fn validate_shared(&self) -> Result<(), (String, String)> {
        if self
            .group
            .as_ref()
            .is_some_and(|g| g.is_empty() || g.len() > 249)
        {
            return Err(("upstream.group".into(), "must be 1 to 249 bytes".into()));
        }
        if self
            .shared_partitions
            .is_some_and(|n| n == 0 || i32::try_from(n).is_err())
        {
            return Err((
                "upstream.shared_partitions".into(),
                "must be 1..=2147483647".into(),
            ));
        }
        let timeout = self.transaction_timeout.0;
        if timeout < MIN_TRANSACTION_TIMEOUT || timeout > MAX_TRANSACTION_TIMEOUT {
            return Err((
                "upstream.transaction_timeout".into(),
                "must be 1s to 24h (and at most the brokers' transaction.max.timeout.ms)".into(),
            ));
        }
        Ok(())
    }

    /// `[upstream.status]`: a usable topic that no forwarded edge topic is sent to, and an
    /// interval of at least a second.
    fn validate_status(&self) -> Result<(), (String, String)> {
        let status = &self.status;
        let key = |k: &str| format!("upstream.status.{k}");
        check_topic_part(&status.topic).map_err(|m| (key("topic"), m))?;
        if status.topic.is_empty() || status.topic.len() > 249 {
            return Err((key("topic"), "must be 1 to 249 characters".into()));
        }
        if self.mode == Mode::Shared
            && status
                .topic
                .strip_prefix(&self.topic_prefix)
                .is_some_and(|edge| self.forwards(edge))
        {
            return Err((
                key("topic"),
                format!(
                    "`{}` is where shared mode forwards an edge topic",
                    status.topic
                ),
            ));
        }
        if status.interval.0 < std::time::Duration::from_secs(1) {
            return Err((key("interval"), "must be at least 1s".into()));
        }
        if status.partitions == 0 || i32::try_from(status.partitions).is_err() {
            return Err((key("partitions"), "must be 1..=2147483647".into()));
        }
        Ok(())
    }

    /// `[upstream.commands]`: usable names, and a command topic that no forwarded edge topic
    /// is written to (the commands' own log topic would otherwise loop back into it).
    fn validate_commands(&self) -> Result<(), (String, String)> {
        let Some(commands) = &self.commands else {
            return Ok(());
        };
        let key = |k: &str| format!("upstream.commands.{k}");
        check_topic_part(&commands.topic).map_err(|m| (key("topic"), m))?;
        if commands.topic.is_empty() || commands.topic.len() > 249 {
            return Err((key("topic"), "must be 1 to 249 characters".into()));
        }
        check_topic_part(&commands.log_topic).map_err(|m| (key("log_topic"), m))?;
        if commands.log_topic.is_empty() || commands.log_topic.starts_with("__") {
            return Err((
                key("log_topic"),
                "must be a non-empty edge topic name not starting with `__`".into(),
            ));
        }
        if let Some(bad) = commands.allow.iter().find(|f| !valid_filter(f)) {
            return Err((key("allow"), format!("`{bad}` is not an MQTT topic filter")));
        }
        if commands.max_wait.0.is_zero() || commands.max_wait.0 > MAX_LINGER {
            return Err((key("max_wait"), "must be above zero and at most 10s".into()));
        }
        let shared = format!("{}{}", self.topic_prefix, commands.log_topic);
        let loops = match self.mode {
            Mode::Shared => shared == commands.topic,
            Mode::Mirror => commands
                .topic
                .strip_prefix(&self.topic_prefix)
                .and_then(|rest| rest.strip_suffix(&commands.log_topic))
                .is_some_and(|gw| gw.ends_with('.')),
        };
        if loops && self.forwards(&commands.log_topic) {
            return Err((
                key("topic"),
                format!(
                    "`{}` is where edge topic `{}` is forwarded to: commands would loop back",
                    commands.topic, commands.log_topic
                ),
            ));
        }
        Ok(())
    }

    /// `topic_configs` names look like Kafka's (`retention.ms`): lower-case letters, digits and
    /// dots. Kafka itself checks names and values when tern creates the topic.
    fn validate_topic_configs(&self) -> Result<(), (String, String)> {
        for name in self.topic_configs.keys() {
            let valid = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.');
            if !valid {
                return Err((
                    "upstream.topic_configs".into(),
                    format!("`{name}` is not a Kafka topic config name (like `retention.ms`)"),
                ));
            }
        }
        Ok(())
    }

    /// The topic configs sent with CreateTopics: [`DEFAULT_TOPIC_CONFIGS`], each replaced by a
    /// `topic_configs` entry of the same name, then the other `topic_configs` entries, by name.
    pub fn create_topic_configs(&self) -> Vec<(String, String)> {
        let mut configs: BTreeMap<String, String> = DEFAULT_TOPIC_CONFIGS
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        for (name, value) in &self.topic_configs {
            configs.insert(name.clone(), value.to_string());
        }
        configs.into_iter().collect()
    }

    /// Whether edge topic `topic` is forwarded.
    pub fn forwards(&self, topic: &str) -> bool {
        !topic.starts_with("__")
            && (self.topics.is_empty() || self.topics.iter().any(|t| t == topic))
    }
}

/// Whether `filter` is a valid MQTT topic filter (`#` last and alone in its level, `+` alone).
fn valid_filter(filter: &str) -> bool {
    let levels: Vec<&str> = filter.split('/').collect();
    !filter.is_empty()
        && !filter.contains('\0')
        && levels.iter().enumerate().all(|(i, level)| {
            (*level == "#" && i + 1 == levels.len()) || *level == "+" || !level.contains(['#', '+'])
        })
}

/// Kafka topic names allow `[A-Za-z0-9._-]` and at most 249 characters.
pub fn check_topic_part(part: &str) -> Result<(), String> {
    match part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => Err(format!(
            "`{part}` contains `{c}`; Kafka topic names allow only A-Z a-z 0-9 . _ -"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_topics_are_never_forwarded() {
        let mut config = UpstreamConfig::default();
        assert!(config.forwards("sensors"));
        assert!(!config.forwards("__mqtt_state"));
        config.topics = vec!["alarms".into(), "__mqtt_state".into()];
        assert!(config.forwards("alarms"));
        assert!(!config.forwards("sensors"));
        assert!(!config.forwards("__mqtt_state"));
    }

    #[test]
    fn defaults_need_only_bootstrap_servers() {
        let mut config = UpstreamConfig::default();
        assert_eq!(
            config.validate().map_err(|e| e.0),
            Err("upstream.bootstrap".to_owned())
        );
        config.bootstrap = vec!["127.0.0.1:9092".into()];
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn linger_and_bandwidth_parse_in_human_units_and_are_checked() -> Result<(), toml::de::Error> {
        let config: UpstreamConfig = toml::from_str(
            "bootstrap = [\"k:9093\"]\nlinger = \"20ms\"\nbandwidth = \"256KiB\"\n",
        )?;
        assert_eq!(config.linger.0, std::time::Duration::from_millis(20));
        assert_eq!(config.bandwidth.0, 256 * 1024);
        assert_eq!(config.validate(), Ok(()));
        let key = |config: UpstreamConfig| config.validate().map_err(|e| e.0);
        let slow = UpstreamConfig {
            bandwidth: tern_core::ByteSize(100),
            ..config.clone()
        };
        assert_eq!(key(slow), Err("upstream.bandwidth".to_owned()));
        let long = UpstreamConfig {
            linger: HumanDuration(std::time::Duration::from_secs(11)),
            ..config
        };
        assert_eq!(key(long), Err("upstream.linger".to_owned()));
        Ok(())
    }

    #[test]
    fn priorities_name_a_class_per_edge_topic_and_refuse_unknown_classes()
    -> Result<(), toml::de::Error> {
        let config: UpstreamConfig = toml::from_str(
            "bootstrap = [\"k:9093\"]\nbandwidth = \"125KB\"\n\
             [priorities]\nalarms = \"high\"\ntelemetry = \"low\"\n",
        )?;
        assert_eq!(config.class_of("alarms"), Class::High);
        assert_eq!(config.class_of("telemetry"), Class::Low);
        assert_eq!(config.class_of("mqtt"), Class::Normal);
        let unknown = toml::from_str::<UpstreamConfig>(
            "bootstrap = [\"k:9093\"]\n[priorities]\nalarms = \"urgent\"\n",
        );
        let message = unknown.map(drop).map_err(|e| e.to_string());
        assert!(
            message
                .as_ref()
                .is_err_and(|m| m.contains("urgent") && m.contains("high")),
            "{message:?}"
        );
        Ok(())
    }

    #[test]
    fn a_schedule_and_live_first_topics_parse_and_bad_windows_are_named()
    -> Result<(), toml::de::Error> {
        let config: UpstreamConfig = toml::from_str(
            "bootstrap = [\"k:9093\"]\nbandwidth = \"125KB\"\nlive_first = [\"telemetry\"]\n\
             live_after = \"10s\"\n\
             [[schedule]]\nfrom = \"08:00\"\nto = \"18:30\"\nbandwidth = \"16KB\"\n\
             [[schedule]]\nfrom = \"22:00\"\nto = \"06:00\"\nbandwidth = 0\n",
        )?;
        assert_eq!(config.validate(), Ok(()));
        assert!(config.is_live_first("telemetry") && !config.is_live_first("alarms"));
        assert_eq!(config.live_after.0, std::time::Duration::from_secs(10));
        let [day, night] = [config.schedule[0], config.schedule[1]];
        assert_eq!((day.from, day.to), (TimeOfDay(480), TimeOfDay(1110)));
        assert!(day.holds(480) && day.holds(1109) && !day.holds(1110) && !day.holds(479));
        // Over midnight.
        assert!(night.holds(1320) && night.holds(0) && night.holds(359) && !night.holds(360));
        for bad in ["8:00", "24:00", "12:60", "12-00", "aa:bb", "12:000"] {
            assert!(bad.parse::<TimeOfDay>().is_err(), "{bad}");
        }
        let key = |config: UpstreamConfig| config.validate().map_err(|e| e.0);
        let mut empty = config.clone();
        empty.schedule[0].to = empty.schedule[0].from;
        assert_eq!(key(empty), Err("upstream.schedule".to_owned()));
        let mut slow = config.clone();
        slow.schedule[0].bandwidth = ByteSize(10);
        assert_eq!(key(slow), Err("upstream.schedule.bandwidth".to_owned()));
        let eager = UpstreamConfig {
            live_after: HumanDuration(std::time::Duration::from_millis(10)),
            ..config
        };
        assert_eq!(key(eager), Err("upstream.live_after".to_owned()));
        Ok(())
    }

    #[test]
    fn status_records_are_on_by_default_and_their_topic_is_checked() -> Result<(), toml::de::Error>
    {
        let config: UpstreamConfig = toml::from_str("bootstrap = [\"k:9093\"]\n")?;
        assert!(config.status.enabled);
        assert_eq!(config.status.topic, "tern-status");
        let config: UpstreamConfig = toml::from_str(
            "bootstrap = [\"k:9093\"]\nmode = \"shared\"\n\
             [status]\ntopic = \"tern.mqtt\"\ninterval = \"10s\"\n",
        )?;
        let key = |config: &UpstreamConfig| config.validate().map_err(|e| e.0);
        assert_eq!(key(&config), Err("upstream.status.topic".to_owned()));
        let fast = UpstreamConfig {
            status: StatusConfig {
                interval: HumanDuration(std::time::Duration::from_millis(100)),
                ..StatusConfig::default()
            },
            mode: Mode::Mirror,
            ..config
        };
        assert_eq!(key(&fast), Err("upstream.status.interval".to_owned()));
        Ok(())
    }

    #[test]
    fn shared_mode_parses_and_names_bad_shared_keys() -> Result<(), toml::de::Error> {
        let mut config: UpstreamConfig = toml::from_str(
            "bootstrap = [\"k:9093\"]\nmode = \"shared\"\nshared_key = \"gateway\"\n\
             group = \"plant-7\"\nshared_partitions = 12\n",
        )?;
        assert_eq!(config.mode, Mode::Shared);
        assert_eq!(config.shared_key, SharedKey::Gateway);
        assert_eq!(config.shared_partitions, Some(12));
        assert_eq!(
            config.transaction_timeout.0,
            std::time::Duration::from_secs(60)
        );
        assert_eq!(config.validate(), Ok(()));
        let short: UpstreamConfig = toml::from_str(
            "bootstrap = [\"k:9093\"]\nmode = \"shared\"\ntransaction_timeout = \"3s\"\n",
        )?;
        assert_eq!(
            short.transaction_timeout.0,
            std::time::Duration::from_secs(3)
        );
        assert_eq!(short.validate(), Ok(()));
        let zero = UpstreamConfig {
            transaction_timeout: HumanDuration(std::time::Duration::ZERO),
            ..short
        };
        assert_eq!(
            zero.validate().map_err(|e| e.0),
            Err("upstream.transaction_timeout".to_owned())
        );
        config.shared_partitions = Some(0);
        assert_eq!(
            config.validate().map_err(|e| e.0),
            Err("upstream.shared_partitions".to_owned())
        );
        Ok(())
    }

    #[test]
    fn topic_configs_default_to_log_append_time_and_take_overrides() -> Result<(), toml::de::Error>
    {
        let defaults = UpstreamConfig::default().create_topic_configs();
        assert_eq!(
            defaults,
            vec![("message.timestamp.type".into(), "LogAppendTime".into())]
        );
        let mut config: UpstreamConfig = toml::from_str(
            "bootstrap = [\"k:9093\"]\n[topic_configs]\n\"retention.ms\" = 2592000000\n\
             \"message.timestamp.type\" = \"CreateTime\"\n\"compression.type\" = \"producer\"\n\
             \"unclean.leader.election.enable\" = false\n",
        )?;
        assert_eq!(config.validate(), Ok(()));
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        assert_eq!(
            config.create_topic_configs(),
            pairs(&[
                ("compression.type", "producer"),
                ("message.timestamp.type", "CreateTime"),
                ("retention.ms", "2592000000"),
                ("unclean.leader.election.enable", "false"),
            ])
        );
        // `tern config check` prints the table and it parses back the same.
        let printed = toml::to_string(&config)
            .map_err(|e| <toml::de::Error as serde::de::Error>::custom(format!("prints: {e}")))?;
        assert_eq!(
            toml::from_str::<UpstreamConfig>(&printed)?,
            config,
            "{printed}"
        );
        config
            .topic_configs
            .insert("Retention MS".into(), TopicConfigValue::Integer(1));
        assert_eq!(
            config.validate().map_err(|e| e.0),
            Err("upstream.topic_configs".to_owned())
        );
        Ok(())
    }

    #[test]
    fn parses_sasl_and_codec_and_names_bad_gateway_ids() -> Result<(), toml::de::Error> {
        let config: UpstreamConfig = toml::from_str(
            "bootstrap = [\"k:9093\"]\ncompression = \"zstd\"\ngateway_id = \"pi/1\"\n\
             [sasl]\nmechanism = \"SCRAM-SHA-512\"\nusername = \"u\"\npassword = \"p\"\n",
        )?;
        assert_eq!(config.compression, Codec::Zstd);
        assert_eq!(
            config.sasl.map(|s| s.mechanism),
            Some(SaslMechanism::ScramSha512)
        );
        let mut config = UpstreamConfig {
            gateway_id: Some("pi/1".into()),
            ..UpstreamConfig::default()
        };
        config.bootstrap = vec!["k:9093".into()];
        let err = config.validate().map_err(|e| e.0);
        assert_eq!(err, Err("upstream.gateway_id".to_owned()));
        Ok(())
    }
}
