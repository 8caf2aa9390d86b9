//! `[kafka_listener]`: where the Kafka-protocol listener binds, what address it advertises in
//! Metadata, and the limits it applies to requests. Describes settings only; never opens a socket.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::group::config::GroupsConfig;
use tern_core::{ByteSize, InvalidConfig, invalid};

/// `[kafka_listener]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaListenerConfig {
    /// Whether Kafka clients can connect at all.
    pub enabled: bool,
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
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            advertised: None,
            max_request_size: ByteSize(8 << 20),
            auto_create_topics: true,
            groups: GroupsConfig::default(),
        }
    }
}

impl KafkaListenerConfig {
    /// Checks the settings; the error names the key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
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
}
