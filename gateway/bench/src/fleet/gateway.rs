//! One gateway of the fleet: a `tern serve` child with a data directory and configuration of
//! its own (its upstream through the bench's proxy), the sensor that publishes into it, and
//! what the bench reads from it: `/metrics` sums and its CPU and memory from `/proc`.
//!
//! It only ends its own child (by the child's PID, when the handle drops) and only listens on
//! loopback port 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::BenchError;
use crate::mqtt::load::{self, FromBroker};
use crate::mqtt::servers::{Server, http_get};

/// The MQTT topic every sensor publishes to (tern's edge topic `mqtt`).
pub const MQTT_TOPIC: &str = "site/sensor/temp";
/// The edge topic that MQTT topic lands in.
pub const EDGE_TOPIC: &str = "mqtt";
/// The longest a sensor waits for its PUBACK before it counts the publish as unacknowledged
/// and connects again.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// How a gateway forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Forwarding {
    Mirror,
    Shared,
}

impl Forwarding {
    pub fn name(self) -> &'static str {
        match self {
            Self::Mirror => "mirror",
            Self::Shared => "shared",
        }
    }
}

/// What every gateway of one run shares in its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// The proxy's bootstrap address.
    pub bootstrap: SocketAddr,
    /// The run's own topic prefix (`tern-bench.fleet-…`), so runs never share a topic, group
    /// or transactional id.
    pub prefix: String,
    /// `reconnect_jitter`.
    pub jitter: bool,
    pub reconnect_max: Duration,
}

impl Setup {
    /// The run's status topic, beside its prefix (an upstream topic under the prefix would be
    /// where shared mode forwards an edge topic of that name).
    pub fn status_topic(&self) -> String {
        format!("{}-status", self.prefix.trim_end_matches('.'))
    }

    /// The `[[upstream]]` table of gateway `id`.
    pub fn upstream(&self, id: &str, mode: Forwarding) -> String {
        format!(
            "[[upstream]]\nbootstrap = [\"{}\"]\ngateway_id = \"{id}\"\ntopic_prefix = \"{}\"\n\
             mode = \"{}\"\nreconnect_jitter = {}\nreconnect_max = \"{}\"\n\n\
             [upstream.status]\ninterval = \"2s\"\ntopic = \"{}\"\n",
            self.bootstrap,
            self.prefix,
            mode.name(),
            self.jitter,
            tern_core::HumanDuration(self.reconnect_max),
            self.status_topic()
        )
    }
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    pub id: String,
    pub mode: Forwarding,
    pub server: Server,
    pub mqtt: SocketAddr,
    pub admin: SocketAddr,
}

impl Gateway {
    /// Starts gateway `id` and waits for its MQTT listener and admin endpoint.
    pub fn start(id: String, mode: Forwarding, setup: &Setup) -> Result<Self, BenchError> {
        let (server, admin) = Server::tern_named(&id, &setup.upstream(&id, mode))?;
        let mqtt = server.addr;
        Ok(Self {
            id,
            mode,
            server,
            mqtt,
            admin,
        })
    }

    /// Every sample of `names` summed, in order, from one scrape of `/metrics`.
    pub fn metrics<const N: usize>(&self, names: [&str; N]) -> Result<[f64; N], BenchError> {
        let body = http_get(self.admin, "/metrics")?;
        Ok(names.map(|name| metric_sum(&body, name)))
    }

    /// (CPU seconds so far, resident set KiB, its peak KiB).
    pub fn usage(&self) -> Result<(f64, u64, u64), BenchError> {
        let cpu = self.server.cpu_seconds()?;
        let (rss, peak) = self.server.rss_kib()?;
        Ok((cpu, rss, peak))
    }
}

/// The sum of every sample of metric `name` in a Prometheus text exposition (0 when absent).
pub fn metric_sum(body: &str, name: &str) -> f64 {
    body.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter(|rest| rest.starts_with(['{', ' ']))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One gateway's sensor: a QoS 1 reading `{id} {seq}` every `period` until `stop`, one in
/// flight, connecting again after any failure. Returns the sequence numbers acknowledged.
pub async fn sensor(
    broker: SocketAddr,
    id: String,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> Vec<u64> {
    let mut acked = Vec::new();
    let mut client: Option<(TcpStream, BytesMut)> = None;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        if client.is_none() {
            client = load::connect(broker, &format!("sensor-{id}")).await.ok();
        }
        let Some((stream, inbuf)) = client.as_mut() else {
            continue;
        };
        let payload = format!("{id} {seq:06}");
        let pkid = u16::try_from(seq % u64::from(u16::MAX)).unwrap_or(0) + 1;
        match tokio::time::timeout(ACK_TIMEOUT, publish(stream, inbuf, pkid, &payload)).await {
            Ok(Ok(())) => acked.push(seq),
            _ => client = None,
        }
        seq += 1;
    }
    acked
}

/// Publishes `payload` at QoS 1 as packet `pkid` and waits for its PUBACK.
async fn publish(
    stream: &mut TcpStream,
    inbuf: &mut BytesMut,
    pkid: u16,
    payload: &str,
) -> Result<(), BenchError> {
    let mut out = BytesMut::new();
    load::put(
        &mut out,
        &load::publish(MQTT_TOPIC, true, pkid, payload.as_bytes()),
    )?;
    stream
        .write_all(&out)
        .await
        .map_err(|source| BenchError::Io {
            what: "publishing a reading",
            source,
        })?;
    loop {
        if load::read_packet(stream, inbuf).await? == (FromBroker::PubAck { pkid }) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_add_every_sample_of_the_name_only() {
        let body = "# TYPE tern_upstream_failing gauge\n\
                    tern_upstream_failing{topic=\"mqtt\",partition=\"0\"} 1\n\
                    tern_upstream_failing{topic=\"b\",partition=\"0\"} 0\n\
                    tern_upstream_failing_total 5\n\
                    tern_upstream_records_behind 12\n";
        assert_eq!(metric_sum(body, "tern_upstream_failing"), 1.0);
        assert_eq!(metric_sum(body, "tern_upstream_records_behind"), 12.0);
        assert_eq!(metric_sum(body, "tern_upstream_connected"), 0.0);
    }

    #[test]
    fn each_gateway_forwards_through_the_proxy_under_the_runs_prefix() {
        let setup = Setup {
            bootstrap: SocketAddr::from(([127, 0, 0, 1], 4242)),
            prefix: "tern-bench.fleet-r1-on.".into(),
            jitter: false,
            reconnect_max: Duration::from_secs(30),
        };
        let text = setup.upstream("fleet-07", Forwarding::Shared);
        #[derive(serde::Deserialize)]
        struct Tables {
            upstream: Vec<tern_upstream::UpstreamConfig>,
        }
        let tables: Tables = toml::from_str(&text).expect("valid config");
        let [config] = tables.upstream.as_slice() else {
            panic!("one upstream: {text}");
        };
        assert_eq!(config.bootstrap, ["127.0.0.1:4242"]);
        assert_eq!(config.gateway_id.as_deref(), Some("fleet-07"));
        assert_eq!(config.mode, tern_upstream::Mode::Shared);
        assert!(!config.reconnect_jitter);
        assert_eq!(config.reconnect_max.0, Duration::from_secs(30));
        assert_eq!(config.status.topic, "tern-bench.fleet-r1-on-status");
        assert_eq!(config.status.interval.0, Duration::from_secs(2));
        assert_eq!(config.validate(), Ok(()));
    }
}
