//! Who an upstream record comes from and where it goes: [`Provenance`] (gateway, edge topic,
//! edge partition), the `tern-*` header names that carry it with the edge offset, the gateway id
//! and the mirror-mode topic name. Pure names and values; it never talks to Kafka or the log.

use crate::config::UpstreamConfig;

/// Header names tern adds to every upstream record.
pub const H_GATEWAY: &str = "tern-gateway";
pub const H_TOPIC: &str = "tern-topic";
pub const H_PARTITION: &str = "tern-partition";
pub const H_OFFSET: &str = "tern-offset";
/// The edge record's own timestamp (milliseconds since the epoch, decimal). The upstream
/// record's timestamp is Kafka's arrival time on topics tern creates
/// (`message.timestamp.type=LogAppendTime`, see `config::DEFAULT_TOPIC_CONFIGS`), so this header
/// is where a consumer finds when the record was made at the edge.
pub const H_TIMESTAMP: &str = "tern-timestamp";

/// Where an upstream record came from: its `tern-*` headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub gateway: String,
    pub topic: String,
    pub partition: u32,
}

/// `{prefix}{gateway}.{edge_topic}`.
pub fn upstream_topic(prefix: &str, gateway: &str, edge_topic: &str) -> String {
    format!("{prefix}{gateway}.{edge_topic}")
}

/// The gateway id: configured, else the host name (characters Kafka refuses become `-`).
pub fn gateway_id(config: &UpstreamConfig) -> String {
    if let Some(id) = &config.gateway_id {
        return id.clone();
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if rc == 0 {
        String::from_utf8_lossy(&buf[..len]).into_owned()
    } else {
        String::new()
    };
    let id: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if id.is_empty() { "tern".to_owned() } else { id }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_topic_names_follow_the_mirror_scheme() {
        assert_eq!(
            upstream_topic("tern.", "pi-7", "sensors"),
            "tern.pi-7.sensors"
        );
    }

    #[test]
    fn gateway_id_prefers_the_configured_one_and_is_a_valid_topic_part() {
        let config = UpstreamConfig {
            gateway_id: Some("gw1".into()),
            ..UpstreamConfig::default()
        };
        assert_eq!(gateway_id(&config), "gw1");
        let host = gateway_id(&UpstreamConfig::default());
        assert!(crate::config::check_topic_part(&host).is_ok(), "{host}");
        assert!(!host.is_empty());
    }
}
