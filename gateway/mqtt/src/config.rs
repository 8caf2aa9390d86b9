//! `[mqtt]` and `[[route]]` settings: the listener, its limits (all with safe defaults for a
//! Pi-class gateway), the shared-subscription types (`shared_type`, `[[mqtt.shared_group]]`),
//! the `[mqtt.tls]` listener and the
//! routing rules from MQTT topics to log topics; `[mqtt.auth]` and `[[mqtt.acl]]` are in
//! `config/auth.rs`. Describes settings only; the validation pass names the offending key.
//! A leaf: imports no module that runs the server. Never opens sockets or files.

pub mod auth;

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use tern_core::{ByteSize, HumanDuration, InvalidConfig, invalid};

use self::auth::{AclConfig, AuthConfig};
use super::topic::{self, TopicLimits};

/// `[mqtt]`: the device-facing listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// Address of the MQTT listener.
    pub listen: SocketAddr,
    /// Most simultaneous client connections; more are refused (CONNACK "server busy"). Lowered
    /// at start, with a warning, when the file-descriptor limit cannot hold them.
    pub max_connections: usize,
    /// Most sockets that have not sent CONNECT yet (TLS handshakes included); when full, the
    /// oldest of them is closed for each new one.
    pub max_pending_connections: usize,
    /// Largest MQTT packet accepted or sent, header included.
    pub max_packet_size: ByteSize,
    /// Unacknowledged QoS 1/2 messages per direction and session (announced as Receive Maximum).
    pub inflight: u16,
    /// Bytes of outgoing messages a session may have sent but not yet had acknowledged.
    pub max_queued_bytes: ByteSize,
    /// Bytes of outgoing messages all sessions together may have sent but not yet had
    /// acknowledged (connected or not). At it, a session holding 64 KiB or more gets no new
    /// delivery until acknowledgements make room; one below that always may (docs/mqtt.md).
    pub max_queued_bytes_total: ByteSize,
    /// Longest topic name or filter in bytes.
    pub max_topic_length: usize,
    /// Most levels in a topic name or filter.
    pub max_topic_levels: usize,
    /// Topic aliases an MQTT 5 client may set up per connection (announced in CONNACK).
    pub topic_alias_maximum: u16,
    /// Topic aliases tern uses for deliveries to an MQTT 5 client, per connection (capped by
    /// the client's Topic Alias Maximum; least recently used ones are reassigned). 0 = none.
    pub outbound_topic_aliases: u16,
    /// Publishes per second a single client may send; reading from it pauses beyond it
    /// (counted in `tern_mqtt_rate_limited_total`, logged). 0 = unlimited, the default (as in
    /// Mosquitto, NanoMQ and EMQX): backpressure comes from the durable acks and `inflight`.
    pub max_publish_rate: u32,
    /// Largest keep alive granted; MQTT 5 clients asking for more are told this value.
    pub max_keep_alive: HumanDuration,
    /// A connection that sends no CONNECT within this time is closed.
    pub connect_timeout: HumanDuration,
    /// An MQTT 3.1.1 client that asked for keep alive 0 (no timeout) is closed after this long
    /// without a packet. (MQTT 5 clients asking for 0 are told `max_keep_alive` instead.)
    pub idle_timeout: HumanDuration,
    /// Most retained messages (topics) kept; a retained publish on a new topic beyond it is
    /// refused (MQTT 5: reason 0x97 "quota exceeded").
    pub max_retained: usize,
    /// Most bytes (topic and payload) of all retained messages; a retained publish that would
    /// exceed it is refused like one past `max_retained`. The messages stay in the state log.
    pub max_retained_bytes: ByteSize,
    /// Longest session expiry: MQTT 5 clients asking for more get this, and MQTT 3.1.1
    /// persistent sessions expire after it, so a device that never returns cannot pin the log.
    pub max_session_expiry: HumanDuration,
    /// Log topic for publishes that no `[[route]]` matches.
    pub default_log_topic: String,
    /// Log topics the downstream appends the datacenter's commands to (`[upstream.commands]
    /// log_topic`): every subscription reads them besides the routed ones. Set by the binary
    /// from `[[upstream]]`, not a setting.
    #[serde(skip)]
    pub command_log_topics: Vec<String>,
    /// The subscription type of shared groups (`$share/{group}/{filter}`) that no
    /// `[[mqtt.shared_group]]` names: "shared", "key_shared", "failover" or "exclusive".
    pub shared_type: SharedType,
    /// Deprecated spelling of `shared_type` ("round-robin" = "shared", "key-sticky" =
    /// "key_shared"); accepted alone, refused beside a `shared_type` other than "shared".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_strategy: Option<SharedStrategy>,
    /// `[[mqtt.shared_group]]`: the type of the groups whose share name matches; first match wins.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shared_group: Vec<SharedGroupConfig>,
    /// `[mqtt.auth]`: password file and anonymous access.
    pub auth: AuthConfig,
    /// `[[mqtt.acl]]`: topic access rules; none = everything allowed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub acl: Vec<AclConfig>,
    /// `[mqtt.tls]`: an additional TLS listener; none by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 1883)),
            max_connections: 1024,
            max_pending_connections: 128,
            max_packet_size: ByteSize(256 * 1024),
            inflight: 32,
            max_queued_bytes: ByteSize(1024 * 1024),
            max_queued_bytes_total: ByteSize(64 * 1024 * 1024),
            max_topic_length: 256,
            max_topic_levels: 16,
            topic_alias_maximum: 16,
            outbound_topic_aliases: 16,
            max_publish_rate: 0,
            max_keep_alive: HumanDuration(std::time::Duration::from_secs(3600)),
            connect_timeout: HumanDuration(std::time::Duration::from_secs(10)),
            idle_timeout: HumanDuration(std::time::Duration::from_secs(3600)),
            max_retained: 10_000,
            max_retained_bytes: ByteSize(16 * 1024 * 1024),
            max_session_expiry: HumanDuration(std::time::Duration::from_secs(7 * 24 * 3600)),
            default_log_topic: "mqtt".to_owned(),
            command_log_topics: Vec::new(),
            shared_type: SharedType::Shared,
            shared_strategy: None,
            shared_group: Vec::new(),
            auth: AuthConfig::default(),
            acl: Vec::new(),
            tls: None,
        }
    }
}

impl MqttConfig {
    /// Topic validation limits.
    pub fn topic_limits(&self) -> TopicLimits {
        TopicLimits {
            max_len: self.max_topic_length,
            max_levels: self.max_topic_levels,
        }
    }

    /// Checks ranges and relations.
    pub fn validate(&self, routes: &[RouteConfig]) -> Result<(), InvalidConfig> {
        let packet = self.max_packet_size.0;
        if !(64..=268_435_460).contains(&packet) {
            return Err(invalid(
                "mqtt.max_packet_size",
                "must be between 64B and 256MiB",
            ));
        }
        let checks = [
            (self.max_connections == 0, "mqtt.max_connections"),
            (
                self.max_pending_connections == 0,
                "mqtt.max_pending_connections",
            ),
            (self.idle_timeout.0.is_zero(), "mqtt.idle_timeout"),
            (self.max_retained == 0, "mqtt.max_retained"),
            (self.max_retained_bytes.0 == 0, "mqtt.max_retained_bytes"),
            (self.inflight == 0, "mqtt.inflight"),
            (self.max_queued_bytes.0 < packet, "mqtt.max_queued_bytes"),
            (
                self.max_queued_bytes_total.0 < self.max_queued_bytes.0,
                "mqtt.max_queued_bytes_total",
            ),
            (self.max_topic_length == 0, "mqtt.max_topic_length"),
            (self.max_topic_levels == 0, "mqtt.max_topic_levels"),
            (self.connect_timeout.0.is_zero(), "mqtt.connect_timeout"),
        ];
        if let Some((_, key)) = checks.iter().find(|(bad, _)| *bad) {
            let message = match *key {
                "mqtt.max_queued_bytes" => "must be at least mqtt.max_packet_size",
                "mqtt.max_queued_bytes_total" => "must be at least mqtt.max_queued_bytes",
                _ => "must be greater than zero",
            };
            return Err(invalid(key, message));
        }
        if self.max_keep_alive.0.as_secs() > u64::from(u16::MAX) {
            return Err(invalid("mqtt.max_keep_alive", "must be at most 65535s"));
        }
        validate_log_topic("mqtt.default_log_topic", &self.default_log_topic)?;
        self.validate_shared()?;
        self.auth.validate(&self.acl, &self.topic_limits())?;
        if let Some(tls) = &self.tls {
            tls.validate(self.listen)?;
        }
        for (i, route) in routes.iter().enumerate() {
            route.validate(i, &self.topic_limits())?;
        }
        Ok(())
    }
}

impl MqttConfig {
    fn validate_shared(&self) -> Result<(), InvalidConfig> {
        if self.shared_strategy.is_some() && self.shared_type != SharedType::Shared {
            return Err(invalid(
                "mqtt.shared_strategy",
                "is deprecated and replaced by mqtt.shared_type: remove it (\"round-robin\" is shared_type = \"shared\", \"key-sticky\" is \"key_shared\")",
            ));
        }
        for (i, group) in self.shared_group.iter().enumerate() {
            let name = &group.name;
            if name.is_empty() || name.contains(['+', '#', '/']) {
                return Err(invalid(
                    &format!("mqtt.shared_group[{i}].name"),
                    "must be a share name or a pattern with `*`, not empty and without `+`, `#` or `/`",
                ));
            }
            if self.shared_group.iter().take(i).any(|g| g.name == *name) {
                return Err(invalid(
                    &format!("mqtt.shared_group[{i}].name"),
                    format!("{name:?} is already named by an earlier [[mqtt.shared_group]]"),
                ));
            }
        }
        Ok(())
    }

    /// Which subscription type each shared group gets.
    pub fn shared_types(&self) -> SharedTypes {
        let default = match self.shared_strategy {
            Some(SharedStrategy::RoundRobin) => SharedType::Shared,
            Some(SharedStrategy::KeySticky) => SharedType::KeyShared,
            None => self.shared_type,
        };
        SharedTypes {
            default,
            rules: self
                .shared_group
                .iter()
                .map(|g| (g.name.clone(), g.kind))
                .collect(),
        }
    }
}

/// One `[[mqtt.shared_group]]`: the subscription type of the groups a share-name pattern matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedGroupConfig {
    /// A share name, or a pattern where `*` stands for any characters (also none).
    pub name: String,
    /// The groups' subscription type.
    #[serde(rename = "type")]
    pub kind: SharedType,
}

/// A shared group's subscription type, after Pulsar's four (docs/consumer-model.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedType {
    /// Each record to the next member with room in its window (round robin).
    #[default]
    Shared,
    /// Each record to the live member its key hashes to; a key that moves to another member
    /// waits until its previous member acknowledged what it had of that key.
    KeyShared,
    /// Every record to one active member (the longest joined); the next takes over when it leaves.
    Failover,
    /// One session holds the group; another session's SUBSCRIBE is refused.
    Exclusive,
}

impl SharedType {
    /// The name used in the configuration and in log lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::KeyShared => "key_shared",
            Self::Failover => "failover",
            Self::Exclusive => "exclusive",
        }
    }
}

/// The subscription type of every shared group: the first `[[mqtt.shared_group]]` whose
/// pattern matches the share name, else `[mqtt] shared_type`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SharedTypes {
    default: SharedType,
    rules: Vec<(String, SharedType)>,
}

impl SharedTypes {
    /// The type of groups no `[[mqtt.shared_group]]` names.
    pub fn fallback(&self) -> SharedType {
        self.default
    }

    /// The type of the group with share name `group`.
    pub fn type_for(&self, group: &str) -> SharedType {
        self.rules
            .iter()
            .find(|(pattern, _)| glob_matches(pattern, group))
            .map_or(self.default, |(_, kind)| *kind)
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters.
fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return false;
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// One `[[route]]`: publishes whose MQTT topic matches `filter` go to log topic `topic`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// MQTT topic filter (`+` and `#` allowed).
    pub filter: String,
    /// Log topic receiving the records.
    pub topic: String,
    /// The record key: "mqtt-topic" (default), "client-id" or "level:N" (0-based topic level).
    #[serde(default)]
    pub key: RouteKey,
}

impl RouteConfig {
    fn validate(&self, index: usize, limits: &TopicLimits) -> Result<(), InvalidConfig> {
        topic::validate_filter(&self.filter, limits)
            .map_err(|err| invalid(&format!("route[{index}].filter"), err.to_string()))?;
        validate_log_topic(&format!("route[{index}].topic"), &self.topic)
    }
}

/// What becomes the record key (and so picks the partition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum RouteKey {
    /// The MQTT topic name: per-topic order holds.
    #[default]
    MqttTopic,
    /// The publishing client's id: per-client order holds.
    ClientId,
    /// One level of the topic (0-based), e.g. the device id in `site/{device}/temp`.
    Level(usize),
}

impl TryFrom<String> for RouteKey {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        match text.as_str() {
            "mqtt-topic" => Ok(Self::MqttTopic),
            "client-id" => Ok(Self::ClientId),
            other => other
                .strip_prefix("level:")
                .and_then(|n| n.parse().ok())
                .map(Self::Level)
                .ok_or_else(|| {
                    format!("expected \"mqtt-topic\", \"client-id\" or \"level:N\", got {other:?}")
                }),
        }
    }
}

impl From<RouteKey> for String {
    fn from(key: RouteKey) -> String {
        match key {
            RouteKey::MqttTopic => "mqtt-topic".to_owned(),
            RouteKey::ClientId => "client-id".to_owned(),
            RouteKey::Level(n) => format!("level:{n}"),
        }
    }
}

/// Log topic names: [A-Za-z0-9._-], 1..=200 characters, not "." or "..".
fn validate_log_topic(key: &str, name: &str) -> Result<(), InvalidConfig> {
    let charset = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if name.is_empty() || name.len() > 200 || !charset || name == "." || name == ".." {
        return Err(invalid(
            key,
            format!("{name:?} is not a log topic name ([A-Za-z0-9._-], 1 to 200 characters)"),
        ));
    }
    if name.starts_with("__") {
        return Err(invalid(key, "names starting with \"__\" are reserved"));
    }
    Ok(())
}

/// `[mqtt] shared_strategy`, deprecated: the `shared_type` it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SharedStrategy {
    /// `shared_type = "shared"`.
    RoundRobin,
    /// `shared_type = "key_shared"`.
    KeySticky,
}

/// `[mqtt.tls]`: a second, TLS-only MQTT listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Address of the TLS listener.
    #[serde(default = "default_tls_listen")]
    pub listen: SocketAddr,
    /// PEM file with the server certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM file with the server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM file of CA certificates that sign client certificates; none = no client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: refuse clients without a valid certificate (false: verify it only
    /// when one is presented).
    #[serde(default = "yes")]
    pub require_client_cert: bool,
    /// The client certificate's CN (else first SAN) becomes the username; no password needed.
    #[serde(default)]
    pub use_identity_as_username: bool,
}

pub(crate) fn default_tls_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8883))
}

fn yes() -> bool {
    true
}

impl TlsConfig {
    /// Checks relations the types cannot express.
    pub fn validate(&self, plain_listen: SocketAddr) -> Result<(), InvalidConfig> {
        let invalid =
            |key: &str, message: &str| tern_core::invalid(&format!("mqtt.tls.{key}"), message);
        if self.listen == plain_listen && self.listen.port() != 0 {
            return Err(invalid("listen", "is already the plain MQTT listener"));
        }
        if self.use_identity_as_username && !(self.client_ca.is_some() && self.require_client_cert)
        {
            return Err(invalid(
                "use_identity_as_username",
                "needs client_ca and require_client_cert = true",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_keys_parse_and_print() {
        for text in ["mqtt-topic", "client-id", "level:3"] {
            let key = RouteKey::try_from(text.to_owned()).expect("parses");
            assert_eq!(String::from(key), text);
        }
        assert!(RouteKey::try_from("level:x".to_owned()).is_err());
    }

    #[test]
    fn validation_names_the_key() {
        let config = MqttConfig::default();
        assert!(config.validate(&[]).is_ok());
        let route = RouteConfig {
            filter: "a/#/b".to_owned(),
            topic: "t".to_owned(),
            key: RouteKey::MqttTopic,
        };
        let err = config
            .validate(std::slice::from_ref(&route))
            .expect_err("bad filter");
        assert!(err.to_string().contains("route[0].filter"), "{err}");
        let route = RouteConfig {
            filter: "a/#".to_owned(),
            topic: "bad topic".to_owned(),
            ..route
        };
        let err = config.validate(&[route]).expect_err("bad topic");
        assert!(err.to_string().contains("route[0].topic"), "{err}");
        let zero = MqttConfig {
            inflight: 0,
            ..MqttConfig::default()
        };
        let err = zero.validate(&[]).expect_err("zero");
        assert!(err.to_string().contains("mqtt.inflight"), "{err}");
    }

    fn shared(text: &str) -> MqttConfig {
        toml::from_str(text).expect("parses")
    }

    #[test]
    fn shared_groups_get_the_type_of_the_first_matching_pattern() {
        let config = shared(
            r#"
            shared_type = "key_shared"
            [[shared_group]]
            name = "hist-*"
            type = "failover"
            [[shared_group]]
            name = "hist-main"
            type = "exclusive"
            [[shared_group]]
            name = "*-x-*"
            type = "shared"
            "#,
        );
        assert!(config.validate(&[]).is_ok());
        let types = config.shared_types();
        let cases = [
            ("hist-main", SharedType::Failover),
            ("hist-", SharedType::Failover),
            ("hist", SharedType::KeyShared),
            ("a-x-b", SharedType::Shared),
            ("-x-", SharedType::Shared),
            ("a-x", SharedType::KeyShared),
            ("dash", SharedType::KeyShared),
        ];
        for (group, kind) in cases {
            assert_eq!(types.type_for(group), kind, "{group}");
        }
        assert!(glob_matches("*", "") && glob_matches("a*a", "aa") && !glob_matches("a*a", "a"));
        assert!(glob_matches("a**b", "ab") && !glob_matches("exact", "exactly"));
    }

    #[test]
    fn the_deprecated_strategy_key_still_works_alone() {
        let old = shared("shared_strategy = \"key-sticky\"");
        assert!(old.validate(&[]).is_ok());
        assert_eq!(old.shared_types().type_for("any"), SharedType::KeyShared);
        let both = shared("shared_strategy = \"round-robin\"\nshared_type = \"failover\"");
        let err = both.validate(&[]).expect_err("both");
        assert!(err.to_string().contains("mqtt.shared_strategy"), "{err}");
        assert!(err.to_string().contains("shared_type"), "{err}");
        let bad = shared("[[shared_group]]\nname = \"a/b\"\ntype = \"shared\"");
        let err = bad.validate(&[]).expect_err("slash");
        assert!(
            err.to_string().contains("mqtt.shared_group[0].name"),
            "{err}"
        );
        let twice = shared(
            "[[shared_group]]\nname = \"a\"\ntype = \"shared\"\n[[shared_group]]\nname = \"a\"\ntype = \"failover\"",
        );
        let err = twice.validate(&[]).expect_err("twice");
        assert!(
            err.to_string().contains("mqtt.shared_group[1].name"),
            "{err}"
        );
        assert!(toml::from_str::<MqttConfig>("shared_type = \"round-robin\"").is_err());
    }
}
