//! `[kafka_listener]`: where the Kafka-protocol listener binds, what address it advertises in
//! Metadata, how clients authenticate (SASL, TLS) and the limits it applies to requests.
//! Describes settings only; never opens a socket or reads a file.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::group::config::GroupsConfig;
use crate::sasl::Mechanism;
use tern_core::{ByteSize, InvalidConfig, invalid};

/// `[kafka_listener]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaListenerConfig {
    /// Whether Kafka clients can connect at all: `true`, `false`, or unset (the default). Unset
    /// runs the listener when `authentication = "sasl"`, and without authentication only where
    /// it cannot get around MQTT's access rules (the binary decides, since those rules live in
    /// `[mqtt]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `"none"` (the default: every client is anonymous) or `"sasl"`: every connection
    /// authenticates with SASL as a user of `[mqtt.auth] password_file` before any other
    /// request, and the `[[mqtt.acl]]` rules apply to that user.
    pub authentication: Authentication,
    /// The SASL mechanisms offered with `authentication = "sasl"`: any of `"PLAIN"`,
    /// `"SCRAM-SHA-256"`, `"SCRAM-SHA-512"` (all three by default).
    pub sasl_mechanisms: Vec<Mechanism>,
    /// Whether PLAIN (the password in the clear) may be offered on a listener that is neither
    /// TLS nor bound to a loopback address; `false` by default.
    pub allow_plain_without_tls: bool,
    /// `[kafka_listener.tls]`: serve TLS on `listen` (Kafka's `SSL`/`SASL_SSL`); none by
    /// default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<KafkaTlsConfig>,
    /// Address of the listener.
    pub listen: SocketAddr,
    /// `host:port` that Metadata names as the one broker; by default the address the client
    /// reached (the connection's local address), which is right on loopback and on a LAN
    /// without NAT.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertised: Option<String>,
    /// Largest request frame accepted; a bigger one closes the connection (Kafka's
    /// `socket.request.max.bytes`).
    pub max_request_size: ByteSize,
    /// Whether Metadata (when the client allows it) and Produce create a missing topic with the
    /// log's default partition count (Kafka's `auto.create.topics.enable`).
    pub auto_create_topics: bool,
    /// `[kafka_listener.groups]`: the consumer-group coordinator's limits.
    pub groups: GroupsConfig,
}

impl Default for KafkaListenerConfig {
    fn default() -> Self {
        Self {
            enabled: None,
            authentication: Authentication::None,
            sasl_mechanisms: Mechanism::ALL.to_vec(),
            allow_plain_without_tls: false,
            tls: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            advertised: None,
            max_request_size: ByteSize(8 << 20),
            auto_create_topics: true,
            groups: GroupsConfig::default(),
        }
    }
}

/// How Kafka clients authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Authentication {
    /// Every client is anonymous.
    #[default]
    None,
    /// SASL (`SASL_PLAINTEXT`, or `SASL_SSL` with `[kafka_listener.tls]`).
    Sasl,
}

/// `[kafka_listener.tls]`: the server certificate chain and its key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl KafkaListenerConfig {
    /// Whether clients must authenticate with SASL.
    pub fn requires_sasl(&self) -> bool {
        self.authentication == Authentication::Sasl
    }

    /// The mechanisms SaslHandshake offers: none without SASL.
    pub fn offered_mechanisms(&self) -> Vec<Mechanism> {
        if self.requires_sasl() {
            self.sasl_mechanisms.clone()
        } else {
            Vec::new()
        }
    }

    /// Checks the settings; the error names the key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        self.check_sasl()?;
        if let Some(tls) = &self.tls {
            for (key, path) in [("cert", &tls.cert), ("key", &tls.key)] {
                if path.as_os_str().is_empty() {
                    return Err(invalid(
                        &format!("kafka_listener.tls.{key}"),
                        "must not be empty",
                    ));
                }
            }
        }
        if let Some(advertised) = &self.advertised {
            advertised_parts(advertised)
                .map_err(|msg| invalid("kafka_listener.advertised", msg))?;
        }
        if self.max_request_size.0 < 1024 || self.max_request_size.0 > (1 << 30) {
            return Err(invalid(
                "kafka_listener.max_request_size",
                "must be between 1KiB and 1GiB",
            ));
        }
        self.groups.validate()
    }
}

impl KafkaListenerConfig {
    fn check_sasl(&self) -> Result<(), InvalidConfig> {
        if !self.requires_sasl() {
            return Ok(());
        }
        let key = "kafka_listener.sasl_mechanisms";
        if self.sasl_mechanisms.is_empty() {
            return Err(invalid(key, "must name at least one mechanism"));
        }
        let in_clear = self.tls.is_none() && !self.listen.ip().is_loopback();
        if in_clear
            && !self.allow_plain_without_tls
            && self.sasl_mechanisms.contains(&Mechanism::Plain)
        {
            return Err(invalid(
                key,
                format!(
                    "PLAIN would send passwords in the clear on {}: configure \
                     [kafka_listener.tls], use only SCRAM, or set allow_plain_without_tls = true",
                    self.listen
                ),
            ));
        }
        Ok(())
    }
}

/// `host:port` split; the port must be a number.
pub(crate) fn advertised_parts(text: &str) -> Result<(String, u16), String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("`{text}` is not host:port"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("`{port}` is not a port number"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("`{text}` has no host"));
    }
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_advertised_must_be_host_and_port() {
        let mut config = KafkaListenerConfig::default();
        assert!(config.validate().is_ok());
        config.advertised = Some("gateway.local:9092".into());
        assert!(config.validate().is_ok());
        config.advertised = Some("gateway.local".into());
        let err = config.validate().expect_err("no port");
        assert!(
            err.to_string().contains("kafka_listener.advertised"),
            "{err}"
        );
        assert_eq!(advertised_parts("[::1]:9092"), Ok(("::1".to_owned(), 9092)));
    }

    fn parse(text: &str) -> KafkaListenerConfig {
        toml::from_str(text).expect("parses")
    }

    #[test]
    fn plain_in_the_clear_off_loopback_needs_tls_or_an_explicit_yes() {
        let lan = "authentication = \"sasl\"\nlisten = \"0.0.0.0:9092\"\n";
        let err = parse(lan).validate().expect_err("PLAIN in the clear");
        assert!(
            err.to_string().contains("kafka_listener.sasl_mechanisms"),
            "{err}"
        );
        for ok in [
            format!("{lan}sasl_mechanisms = [\"SCRAM-SHA-512\"]\n"),
            format!("{lan}allow_plain_without_tls = true\n"),
            format!("{lan}[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n"),
            "authentication = \"sasl\"\n".to_owned(),
            "listen = \"0.0.0.0:9092\"\n".to_owned(),
        ] {
            parse(&ok).validate().expect(&ok);
        }
        let err = parse("authentication = \"sasl\"\nsasl_mechanisms = []\n")
            .validate()
            .expect_err("empty");
        assert!(
            err.to_string().contains("kafka_listener.sasl_mechanisms"),
            "{err}"
        );
        assert!(toml::from_str::<KafkaListenerConfig>("sasl_mechanisms = [\"GSSAPI\"]\n").is_err());
    }

    #[test]
    fn mechanisms_are_offered_only_with_sasl() {
        assert!(
            KafkaListenerConfig::default()
                .offered_mechanisms()
                .is_empty()
        );
        let sasl = parse("authentication = \"sasl\"\nsasl_mechanisms = [\"scram-sha-256\"]\n");
        assert_eq!(
            sasl.offered_mechanisms(),
            vec![Mechanism::Scram(tern_auth::scram::ScramMechanism::Sha256)]
        );
    }
}
