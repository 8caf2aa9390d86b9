//! tern's configuration: the serde structs with their defaults, loading from TOML, command-line
//! overrides and the validation pass. Every key is documented, with its default, in
//! `tern.example.toml` at the repository root; a test keeps the two equal.
//!
//! This module only describes settings; it never opens sockets or files other than the
//! configuration file itself.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use tern_core::{HumanDuration, InvalidConfig, invalid};

pub use crate::deprecated::Deprecation;

use tern_kafka::KafkaListenerConfig;
use tern_mqtt::{MqttConfig, RouteConfig};
use tern_upstream::UpstreamConfig;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: key `{key}`: {message}")]
    Parse {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(#[from] InvalidConfig),
    #[error("cannot print configuration: {0}")]
    Print(#[from] toml::ser::Error),
    #[error("key `{key}`: {message}")]
    Secret { key: String, message: String },
}

/// What `tern config check` prints instead of a secret.
pub const REDACTED: &str = "<redacted>";

/// The whole configuration of one gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory holding the log, cursors and the lock file.
    pub data_dir: PathBuf,
    pub mqtt: MqttConfig,
    /// `[kafka_listener]`: Kafka clients on the gateway (not `[[upstream]]`, the cluster tern
    /// forwards to).
    pub kafka_listener: KafkaListenerConfig,
    pub admin: AdminConfig,
    pub logging: LoggingConfig,
    pub shutdown: ShutdownConfig,
    pub log: tern_log::LogConfig,
    pub health: crate::health::HealthConfig,
    pub cursors: crate::cursors::CursorsConfig,
    pub status: crate::status::StatusConfig,
    /// `[[route]]`: MQTT topic filters mapped to log topics, first match wins.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<RouteConfig>,
    /// `[[upstream]]`: the Kafka cluster the log is forwarded to (at most one for now). None by
    /// default: tern then only stores.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<UpstreamConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./tern-data"),
            mqtt: MqttConfig::default(),
            kafka_listener: KafkaListenerConfig::default(),
            admin: AdminConfig::default(),
            logging: LoggingConfig::default(),
            shutdown: ShutdownConfig::default(),
            log: tern_log::LogConfig::default(),
            health: crate::health::HealthConfig::default(),
            cursors: crate::cursors::CursorsConfig::default(),
            status: crate::status::StatusConfig::default(),
            route: Vec::new(),
            upstream: Vec::new(),
        }
    }
}

/// `[admin]`: the HTTP endpoint (health, metrics, status page, cursor API).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin HTTP endpoint.
    pub listen: SocketAddr,
    /// Whether peers other than loopback may list, delete and reset cursors.
    pub remote_cursor_api: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            remote_cursor_api: false,
        }
    }
}

/// `[logging]`: diagnostics written to stderr.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// Lowest level printed; `RUST_LOG` overrides it.
    pub level: LogLevel,
}

/// A diagnostics level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The level's name as `tracing` filters spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
            Self::Trace => "trace",
        }
    }
}

/// `[shutdown]`: how a SIGINT/SIGTERM is handled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// How long in-flight work may take to finish after the first signal before tern exits anyway.
    pub grace: HumanDuration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            grace: HumanDuration(std::time::Duration::from_secs(10)),
        }
    }
}

/// Settings given on the command line; each replaces the file's value when present.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub mqtt_listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    /// `--kafka-listen`: the Kafka-protocol listener's address.
    pub kafka_listen: Option<SocketAddr>,
    /// `--kafka`: forward to these bootstrap servers with default settings (replaces the file's
    /// `[[upstream]]`).
    pub kafka: Option<Vec<String>>,
    /// `--gateway-id`: this gateway's name upstream.
    pub gateway_id: Option<String>,
}

/// Loads `path` (or the built-in defaults when `None`), applies `overrides` and validates.
/// Also returns the deprecated keys the file used, for the caller to report once its
/// diagnostics are set up.
pub fn load(
    path: Option<&Path>,
    overrides: &Overrides,
) -> Result<(Config, Vec<Deprecation>), ConfigError> {
    let (mut config, deprecated) = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            read(&text, path)?
        }
        None => (Config::default(), Vec::new()),
    };
    config.apply(overrides);
    config.derive();
    config.validate()?;
    Ok((config, deprecated))
}

/// [`read`] without the deprecated keys' reports.
#[cfg(test)]
pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    read(text, origin).map(|(config, _)| config)
}

/// Parses TOML text; errors name the offending key by its dotted path. Deprecated keys are
/// moved to their new ones (`deprecated.rs`) and returned.
pub fn read(text: &str, origin: &Path) -> Result<(Config, Vec<Deprecation>), ConfigError> {
    let mut config = deserialize(text, origin)?;
    let deprecated =
        crate::deprecated::resolve(&mut config.status, &mut config.log.flush.wear, text);
    Ok((config, deprecated))
}

fn deserialize(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    let deserializer = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let key = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.message().to_owned();
        if key == "." || key.is_empty() {
            ConfigError::Syntax {
                path: origin.to_owned(),
                message: inner.to_string().trim_end().to_owned(),
            }
        } else {
            ConfigError::Parse {
                path: origin.to_owned(),
                key,
                message,
            }
        }
    })
}

impl Config {
    fn apply(&mut self, overrides: &Overrides) {
        if let Some(dir) = &overrides.data_dir {
            self.data_dir = dir.clone();
        }
        if let Some(addr) = overrides.mqtt_listen {
            self.mqtt.listen = addr;
        }
        if let Some(addr) = overrides.admin_listen {
            self.admin.listen = addr;
        }
        if let Some(addr) = overrides.kafka_listen {
            self.kafka_listener.listen = addr;
        }
        if let Some(bootstrap) = &overrides.kafka {
            self.upstream = vec![UpstreamConfig {
                bootstrap: bootstrap.clone(),
                ..UpstreamConfig::default()
            }];
        }
        if let Some(id) = &overrides.gateway_id {
            for upstream in &mut self.upstream {
                upstream.gateway_id = Some(id.clone());
            }
        }
    }

    /// Fills in what one section takes from another: MQTT subscriptions read the log topic the
    /// downstream appends commands to.
    pub fn derive(&mut self) {
        self.mqtt.command_log_topics = self.command_log_topics();
    }

    /// The log topics of every `[upstream.commands]`.
    pub fn command_log_topics(&self) -> Vec<String> {
        let commands = self.upstream.iter().filter_map(|u| u.commands.as_ref());
        commands.map(|c| c.log_topic.clone()).collect()
    }

    /// Checks what types alone cannot: relations between keys and sensible ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(self.check()?)
    }

    /// Why the Kafka listener would be a way around MQTT's access rules, if it would. With
    /// `authentication = "sasl"` it never is (its clients are the password file's users under
    /// the `[[mqtt.acl]]` rules); without authentication every client is anonymous, which is
    /// safe only where MQTT lets an anonymous client do everything too (anonymous clients
    /// allowed on its address and no `[[mqtt.acl]]` rules).
    pub fn kafka_listener_bypass(&self) -> Option<&'static str> {
        if self.kafka_listener.requires_sasl() {
            return None;
        }
        let anonymous = match self.mqtt.auth.allow_anonymous {
            tern_mqtt::Anonymous::Always => true,
            tern_mqtt::Anonymous::Loopback => self.kafka_listener.listen.ip().is_loopback(),
            tern_mqtt::Anonymous::Never => false,
        };
        if !anonymous {
            Some("mqtt.auth.allow_anonymous refuses anonymous clients on its address")
        } else if !self.mqtt.acl.is_empty() {
            Some("[[mqtt.acl]] rules restrict clients")
        } else {
            None
        }
    }

    /// Whether `tern serve` runs the Kafka listener: as set, or when unset only where it is no
    /// way around MQTT's access rules ([`Self::kafka_listener_bypass`]).
    pub fn kafka_listener_runs(&self) -> bool {
        self.kafka_listener
            .enabled
            .unwrap_or_else(|| self.kafka_listener_bypass().is_none())
    }

    fn check_kafka_listener_access(&self) -> Result<(), InvalidConfig> {
        match (self.kafka_listener.enabled, self.kafka_listener_bypass()) {
            (Some(true), Some(why)) => Err(invalid(
                "kafka_listener.enabled",
                format!(
                    "the Kafka listener on {} has authentication = \"none\", and {why}; \
                     set authentication = \"sasl\" or leave it off (false or unset)",
                    self.kafka_listener.listen
                ),
            )),
            _ if self.kafka_listener_runs()
                && self.kafka_listener.requires_sasl()
                && self.mqtt.auth.password_file.is_none() =>
            {
                Err(invalid(
                    "kafka_listener.authentication",
                    "\"sasl\" checks the users of [mqtt.auth] password_file, which is not set",
                ))
            }
            _ => Ok(()),
        }
    }

    fn check(&self) -> Result<(), InvalidConfig> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        if self.mqtt.listen == self.admin.listen && self.mqtt.listen.port() != 0 {
            return Err(invalid(
                "admin.listen",
                format!("{} is already the MQTT listener", self.admin.listen),
            ));
        }
        self.kafka_listener.validate()?;
        if self.kafka_listener_runs()
            && self.kafka_listener.listen.port() != 0
            && [self.mqtt.listen, self.admin.listen].contains(&self.kafka_listener.listen)
        {
            return Err(invalid(
                "kafka_listener.listen",
                format!(
                    "{} is already the MQTT or admin listener",
                    self.kafka_listener.listen
                ),
            ));
        }
        self.check_kafka_listener_access()?;
        if self.shutdown.grace.0.is_zero() {
            return Err(invalid("shutdown.grace", "must be longer than zero"));
        }
        if self.upstream.len() > 1 {
            return Err(invalid("upstream", "only one [[upstream]] is supported"));
        }
        for upstream in &self.upstream {
            upstream
                .validate()
                .map_err(|(key, message)| invalid(&key, message))?;
            if let Some(sasl) = &upstream.sasl {
                let sources = [
                    !sasl.password.is_empty(),
                    sasl.password_file.is_some(),
                    sasl.password_env.is_some(),
                ];
                if sources.iter().filter(|s| **s).count() != 1 {
                    return Err(invalid(
                        "upstream.sasl.password",
                        "give exactly one of password, password_file and password_env",
                    ));
                }
            }
        }
        let published = |t: &String| {
            *t == self.mqtt.default_log_topic || self.route.iter().any(|r| r.topic == *t)
        };
        if let Some(topic) = self.command_log_topics().iter().find(|t| published(t)) {
            return Err(invalid(
                "upstream.commands.log_topic",
                format!(
                    "`{topic}` is a log topic MQTT publishes are routed to; the commands need one of their own"
                ),
            ));
        }
        self.mqtt.validate(&self.route)?;
        self.health.validate()?;
        self.status.validate()?;
        self.log.validate()
    }

    /// The effective configuration as TOML, as `tern config check` prints it: every secret
    /// (`[upstream.sasl] password`) replaced by [`REDACTED`].
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        Ok(toml::to_string_pretty(&self.redacted())?)
    }

    /// A copy with every secret replaced by [`REDACTED`].
    pub fn redacted(&self) -> Self {
        let mut copy = self.clone();
        for sasl in copy.upstream.iter_mut().filter_map(|u| u.sasl.as_mut()) {
            if !sasl.password.is_empty() {
                sasl.password = REDACTED.to_owned();
            }
        }
        copy
    }

    /// Reads every secret given by file (`password_file`: its first line) or environment
    /// variable (`password_env`) into its setting. Called before serving, and by `config check`
    /// to prove the secrets are there.
    pub fn resolve_secrets(&mut self) -> Result<(), ConfigError> {
        let key = "upstream.sasl.password";
        for sasl in self.upstream.iter_mut().filter_map(|u| u.sasl.as_mut()) {
            let secret = |message: String| ConfigError::Secret {
                key: key.replace(
                    "password",
                    if sasl.password_file.is_some() {
                        "password_file"
                    } else {
                        "password_env"
                    },
                ),
                message,
            };
            let password = if let Some(path) = &sasl.password_file {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| secret(format!("cannot read {}: {e}", path.display())))?;
                text.lines().next().unwrap_or_default().to_owned()
            } else if let Some(var) = &sasl.password_env {
                std::env::var(var)
                    .map_err(|e| secret(format!("environment variable {var}: {e}")))?
            } else {
                continue;
            };
            if password.is_empty() {
                return Err(secret("the password is empty".to_owned()));
            }
            sasl.password = password;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_acls_print_and_parse_back() {
        let text = r##"
[mqtt.auth]
allow_anonymous = "never"
password_file = "/etc/tern/passwd"

[[mqtt.acl]]
user = "ops"
topic = "#"
access = "read"

[[mqtt.acl]]
client_id = "ops-1"
topic = "secrets/#"
access = "deny"

[[route]]
filter = "site/+/temp"
topic = "temperature"
key = "level:1"
"##;
        let path = std::path::Path::new("t.toml");
        let config = parse(text, path).expect("parses");
        assert_eq!(config.route[0].key, tern_mqtt::RouteKey::Level(1));
        assert_eq!(config.mqtt.acl[0].access, tern_mqtt::Access::Read);
        assert_eq!(config.mqtt.acl[1].access, tern_mqtt::Access::Deny);
        assert_eq!(
            config.mqtt.auth.allow_anonymous,
            tern_mqtt::Anonymous::Never
        );
        config.validate().expect("valid");
        let printed = config.to_toml().expect("prints");
        assert_eq!(parse(&printed, path).expect("parses back"), config);
    }

    #[test]
    fn the_kafka_listener_never_gets_around_mqtts_access_rules() {
        let path = std::path::Path::new("t.toml");
        // (what restricts MQTT, the [kafka_listener] lines beside it)
        let restricted = [
            ("[mqtt.auth]\nallow_anonymous = \"never\"\n", ""),
            ("", "listen = \"0.0.0.0:9092\"\n"),
            (
                "[[mqtt.acl]]\nuser = \"ops\"\ntopic = \"#\"\naccess = \"read\"\n",
                "",
            ),
        ];
        for (mqtt, listener) in restricted {
            let unset =
                parse(&format!("[kafka_listener]\n{listener}{mqtt}"), path).expect("parses");
            unset.validate().expect(mqtt);
            assert!(
                !unset.kafka_listener_runs(),
                "unset is off: {mqtt}{listener}"
            );
            let text = format!("[kafka_listener]\nenabled = true\n{listener}{mqtt}");
            let err = parse(&text, path)
                .expect("parses")
                .validate()
                .expect_err(&text);
            assert!(
                err.to_string().contains("kafka_listener.enabled"),
                "{text}: {err}"
            );
        }
        let open = [
            "",
            "[mqtt.auth]\nallow_anonymous = true\n[kafka_listener]\nlisten = \"0.0.0.0:9092\"\n",
        ];
        for text in open {
            let config = parse(text, path).expect("parses");
            config.validate().expect(text);
            assert!(config.kafka_listener_runs(), "{text}");
        }
    }

    #[test]
    fn with_sasl_the_kafka_listener_runs_under_mqtts_rules_and_needs_the_password_file() {
        let path = std::path::Path::new("t.toml");
        let sasl = "[kafka_listener]\nauthentication = \"sasl\"\nsasl_mechanisms = [\"SCRAM-SHA-512\"]\nlisten = \"0.0.0.0:9092\"\n";
        let users = "[mqtt.auth]\nallow_anonymous = \"never\"\npassword_file = \"passwd\"\n[[mqtt.acl]]\nuser = \"ops\"\ntopic = \"#\"\naccess = \"read\"\n";
        for enabled in ["", "enabled = true\n"] {
            let text = format!("{sasl}{enabled}{users}");
            let config = parse(&text, path).expect("parses");
            config.validate().expect(&text);
            assert!(config.kafka_listener_runs(), "{text}");
            assert_eq!(config.kafka_listener_bypass(), None);
        }
        let err = parse(sasl, path)
            .expect("parses")
            .validate()
            .expect_err("no password file");
        assert!(
            err.to_string().contains("kafka_listener.authentication"),
            "{err}"
        );
    }

    const EXAMPLE: &str = include_str!("../../../tern.example.toml");

    #[test]
    fn example_file_parses_to_the_defaults() {
        let parsed = parse(EXAMPLE, Path::new("tern.example.toml")).expect("example parses");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn board_configs_are_valid() {
        let boards = [
            (
                "raspberry-pi-4",
                include_str!("../../../boards/raspberry-pi-4/tern.toml"),
            ),
            (
                "raspberry-pi-3",
                include_str!("../../../boards/raspberry-pi-3/tern.toml"),
            ),
        ];
        for (board, text) in boards {
            let config = parse(text, Path::new(board)).expect("board config parses");
            config.validate().expect("board config is valid");
            assert_eq!(config.data_dir, PathBuf::from("/var/lib/tern"), "{board}");
        }
    }

    #[test]
    fn printed_config_parses_back_identically() {
        let config = Config::default();
        let text = config.to_toml().expect("prints");
        assert_eq!(parse(&text, Path::new("printed")).expect("parses"), config);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse(
            "[mqtt]\nlisten = \"127.0.0.1:1\"\nlistn = 3\n",
            Path::new("t.toml"),
        )
        .expect_err("unknown key");
        let text = err.to_string();
        assert!(text.contains("listn"), "{text}");
    }

    /// tern-bench's ablations (`tern_upstream::Ablation`) are not settings: an `[[upstream]]`
    /// that asks for one is refused like any unknown key.
    #[test]
    fn bench_ablations_are_unknown_upstream_keys() {
        for key in ["bench_without_idempotence", "bench_without_transactions"] {
            let text = format!("[[upstream]]\nbootstrap = [\"k1:9092\"]\n{key} = true\n");
            let err = parse(&text, Path::new("t.toml")).expect_err(key);
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn bad_values_name_their_key() {
        let err = parse("[admin]\nlisten = \"nowhere\"\n", Path::new("t.toml")).expect_err("bad");
        assert!(err.to_string().contains("admin.listen"), "{err}");
        let err = parse("[shutdown]\ngrace = \"soon\"\n", Path::new("t.toml")).expect_err("bad");
        assert!(err.to_string().contains("shutdown.grace"), "{err}");
        let err = parse("[logging]\nlevel = \"loud\"\n", Path::new("t.toml")).expect_err("bad");
        assert!(err.to_string().contains("logging.level"), "{err}");
    }

    #[test]
    fn syntax_errors_are_reported_not_panicked() {
        let err = parse("[mqtt\nlisten=", Path::new("t.toml")).expect_err("syntax");
        assert!(err.to_string().contains("t.toml"), "{err}");
    }

    #[test]
    fn overrides_replace_file_values() {
        let mut config = Config::default();
        config.apply(&Overrides {
            data_dir: Some(PathBuf::from("/d")),
            mqtt_listen: Some("127.0.0.1:2".parse().expect("addr")),
            admin_listen: None,
            ..Overrides::default()
        });
        assert_eq!(config.data_dir, PathBuf::from("/d"));
        assert_eq!(config.mqtt.listen.port(), 2);
        assert_eq!(config.admin.listen.port(), 9090);
    }

    #[test]
    fn log_keys_are_named_in_errors() {
        let err =
            parse("[log.flush]\nmax_delay = \"soon\"\n", Path::new("t.toml")).expect_err("bad");
        assert!(err.to_string().contains("log.flush.max_delay"), "{err}");
        let err = parse(
            "[log.retention]\non_full = \"panic\"\n",
            Path::new("t.toml"),
        )
        .expect_err("bad");
        assert!(err.to_string().contains("log.retention.on_full"), "{err}");
        let config =
            parse("[log]\nsegment_bytes = \"1KiB\"\n", Path::new("t.toml")).expect("parses");
        let err = config.validate().expect_err("too small");
        assert!(err.to_string().contains("log.segment_bytes"), "{err}");
        let config = parse("[[log.topic]]\nname = \"a/b\"\n", Path::new("t.toml")).expect("parses");
        let err = config.validate().expect_err("bad name");
        assert!(err.to_string().contains("log.topic[0].name"), "{err}");
    }

    #[test]
    fn kafka_flag_forwards_with_defaults_and_names_bad_upstream_keys() {
        let mut config = Config::default();
        config.apply(&Overrides {
            kafka: Some(vec!["127.0.0.1:9092".into(), "127.0.0.1:9093".into()]),
            gateway_id: Some("pi-7".into()),
            ..Overrides::default()
        });
        assert_eq!(config.upstream.len(), 1);
        assert_eq!(config.upstream[0].bootstrap.len(), 2);
        assert_eq!(config.upstream[0].gateway_id.as_deref(), Some("pi-7"));
        assert!(config.validate().is_ok());
        let text = config.to_toml().expect("prints");
        assert_eq!(parse(&text, Path::new("printed")).expect("parses"), config);
        let err = parse(
            "[[upstream]]\nbootstrap = [\"k:1\"]\ncompression = \"brotli\"\n",
            Path::new("t.toml"),
        )
        .expect_err("bad codec");
        assert!(err.to_string().contains("compression"), "{err}");
        config.upstream[0].bootstrap.clear();
        let err = config.validate().expect_err("no servers");
        assert!(err.to_string().contains("upstream.bootstrap"), "{err}");
    }

    #[test]
    fn secrets_are_redacted_and_come_from_a_file_or_the_environment() {
        let text = "[[upstream]]\nbootstrap = [\"k:1\"]\n[upstream.sasl]\nmechanism = \"PLAIN\"\nusername = \"u\"\npassword = \"hunter2\"\n";
        let config = parse(text, Path::new("t.toml")).expect("parses");
        config.validate().expect("valid");
        let printed = config.to_toml().expect("prints");
        assert!(
            !printed.contains("hunter2") && printed.contains(REDACTED),
            "{printed}"
        );

        let dir = std::env::temp_dir().join(format!("tern-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("sasl");
        std::fs::write(&file, "from-file\nignored\n").expect("write");
        let mut from_file = config.clone();
        let sasl = from_file.upstream[0].sasl.as_mut().expect("sasl");
        sasl.password.clear();
        sasl.password_file = Some(file.clone());
        from_file.validate().expect("valid");
        from_file.resolve_secrets().expect("resolves");
        assert_eq!(
            from_file.upstream[0]
                .sasl
                .as_ref()
                .map(|s| s.password.as_str()),
            Some("from-file")
        );
        assert!(!from_file.to_toml().expect("prints").contains("from-file"));

        let mut both = from_file.clone();
        both.upstream[0].sasl.as_mut().expect("sasl").password = "x".into();
        let err = both.validate().expect_err("two sources");
        assert!(err.to_string().contains("upstream.sasl.password"), "{err}");

        let mut missing = config;
        let sasl = missing.upstream[0].sasl.as_mut().expect("sasl");
        sasl.password.clear();
        sasl.password_env = Some("TERN_TEST_UNSET_SECRET_VARIABLE".into());
        let err = missing.resolve_secrets().expect_err("unset");
        assert!(
            err.to_string().contains("upstream.sasl.password_env"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn validation_names_the_key() {
        let mut config = Config::default();
        config.admin.listen = config.mqtt.listen;
        let err = config.validate().expect_err("clash");
        assert!(err.to_string().contains("admin.listen"), "{err}");
    }

    #[test]
    fn the_downstream_and_mqtt_name_a_command_alike() {
        assert_eq!(
            tern_mqtt::COMMAND_HEADER,
            tern_upstream::downstream::H_COMMAND
        );
    }
}
