//! `tern-bench downstream`: commands from the datacenter to a device through a `tern serve`
//! child (`[upstream.commands]`) and a cluster the user started. In one run: the latency from
//! a command's produce (Kafka's console producer, `linger.ms=0`; the send time travels in the
//! value) to its receipt by an MQTT QoS 1 subscriber of the child, one command in flight, on an
//! idle link (the anchor) and while the child's forwarder drains an upstream backlog under a
//! `bandwidth` cap; then the commands a second the child stores when a burst is waiting, beside
//! the QoS 1 MQTT publishes a second the same child took in the same run (the backlog's ingest).
//!
//! It never starts or stops Kafka, never asserts a target, and creates only topics named
//! `tern-bench.*`; it ends only the children it started.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use tern_shared::mqtt::{self, DecodeError, Packet, QoS};
use tern_upstream::{KafkaUpstream, UpstreamConfig};

use crate::BenchError;
use crate::mqtt::load::{self, Load, put};
use crate::mqtt::servers::Server;
use crate::stats::percentile;
use crate::upstream::TOPIC_PREFIX;

/// The MQTT topic the commands are published on.
const COMMAND_TOPIC: &str = "bench/cmd";
/// Pause between two latency samples (one command in flight at a time).
const PACE: Duration = Duration::from_millis(20);
/// Longest a command may take to reach the device before the bench gives up.
const RECEIPT_TIMEOUT: Duration = Duration::from_secs(60);
/// MQTT's SUBACK packet type.
const SUBACK: u8 = 9;
/// Publishers of the backlog's MQTT load (the MQTT bench's default).
const PUBLISHERS: usize = 16;

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamBenchOptions {
    /// Bootstrap servers of the cluster, `host:port`.
    pub kafka: Vec<String>,
    /// Latency samples per phase.
    pub samples: usize,
    /// Commands of the burst.
    pub burst: u64,
    /// MQTT messages in the upstream backlog.
    pub backlog: u64,
    /// The child's upstream `bandwidth` cap, KiB a second.
    pub bandwidth_kib: u64,
    /// Java classpath with Kafka's tools (`tests/kafka/cache/*`), for its console producer.
    pub kafka_classpath: String,
}

impl DownstreamBenchOptions {
    fn validate(&self) -> Result<(), BenchError> {
        let checks = [
            (
                self.kafka.is_empty(),
                "--kafka",
                "needs at least one host:port",
            ),
            (self.samples < 10, "--samples", "must be at least 10"),
            (self.burst == 0, "--burst", "must be at least 1"),
            (self.backlog < 1000, "--backlog", "must be at least 1000"),
            (
                self.bandwidth_kib == 0,
                "--bandwidth-kib",
                "must be at least 1",
            ),
        ];
        match checks.iter().find(|(bad, ..)| *bad) {
            Some((_, option, reason)) => Err(BenchError::Invalid { option, reason }),
            None => Ok(()),
        }
    }
}

/// Produce-to-receipt latencies of one phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(mut millis: Vec<f64>) -> Self {
        millis.sort_by(f64::total_cmp);
        let at = |p| percentile(&millis, p).unwrap_or(0.0);
        Self {
            samples: millis.len(),
            p50_ms: at(50.0),
            p99_ms: at(99.0),
            max_ms: millis.last().copied().unwrap_or(0.0),
        }
    }
}

/// Every figure of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub command: String,
    pub idle: Latency,
    pub draining: Latency,
    /// Edge records not yet forwarded when the draining samples began and ended.
    pub backlog_at_start: u64,
    pub backlog_at_end: u64,
    pub bandwidth_kib: u64,
    pub burst: u64,
    pub commands_per_sec: f64,
    /// QoS 1 MQTT publishes a second the same child acknowledged (the backlog's ingest).
    pub mqtt_msgs_per_sec: f64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.command)?;
        writeln!(
            f,
            "datacenter -> device (Kafka produce to MQTT QoS 1 receipt, one command in flight):"
        )?;
        for (name, l) in [
            ("idle link", self.idle),
            ("upstream draining", self.draining),
        ] {
            writeln!(
                f,
                "  {name:<18} n={:<5} p50 {:>8.1} ms   p99 {:>8.1} ms   max {:>8.1} ms",
                l.samples, l.p50_ms, l.p99_ms, l.max_ms
            )?;
        }
        writeln!(
            f,
            "  draining: the forwarder {} -> {} records behind under a {} KiB/s cap; p99 {:.2}x the idle p99",
            self.backlog_at_start,
            self.backlog_at_end,
            self.bandwidth_kib,
            self.draining.p99_ms / self.idle.p99_ms.max(f64::MIN_POSITIVE)
        )?;
        writeln!(
            f,
            "commands stored: {:.0}/s ({} waiting at once); the same child's MQTT QoS 1 ingest {:.0} msgs/s; ratio {:.3}",
            self.commands_per_sec,
            self.burst,
            self.mqtt_msgs_per_sec,
            self.commands_per_sec / self.mqtt_msgs_per_sec.max(f64::MIN_POSITIVE)
        )
    }
}

/// Runs the bench.
pub fn run(options: &DownstreamBenchOptions, command: String) -> Result<Report, BenchError> {
    options.validate()?;
    let stamp = now_ms();
    let gateway = format!("r{stamp}-down");
    let topic = format!("{TOPIC_PREFIX}{gateway}.commands");
    let runtime = crate::runtime(None)?;
    let config = UpstreamConfig {
        bootstrap: options.kafka.clone(),
        ..UpstreamConfig::default()
    };
    let kafka = KafkaUpstream::new(&config)?;
    runtime.block_on(kafka.ensure_topic(&topic, 1, config.replication_factor))?;
    let mut server = Server::tern_with(&[], &child_config(options, &gateway, &topic))?;
    let admin = server.wait_for_line("admin endpoint listening on ")?;
    runtime.block_on(async {
        let (received, mut receipts) = mpsc::unbounded_channel();
        let (subscribed, ready) = tokio::sync::oneshot::channel();
        let device = tokio::spawn(device(server.addr, subscribed, received));
        // A clean session reads from the end: nothing is produced before its SUBACK.
        ready.await.map_err(|_| BenchError::Closed)?;
        let classpath = &options.kafka_classpath;
        let mut producer = Producer::start(&options.kafka, classpath, &topic, &gateway)?;
        let mut sent = 0u64;
        // Warm-up (the producer's JVM start and metadata, the child's first fetch): not counted.
        samples(&mut producer, &mut receipts, &mut sent, 3)
            .await
            .map_err(|err| explained(err, admin))?;
        let idle = samples(&mut producer, &mut receipts, &mut sent, options.samples)
            .await
            .map_err(|err| explained(err, admin))?;
        let load = Load {
            publishers: PUBLISHERS,
            messages: usize::try_from(options.backlog / PUBLISHERS as u64).unwrap_or(1),
            size: 100,
            qos1: true,
            window: 64,
        };
        let ingest = load::run(server.addr, load, "backlog").await?;
        let backlog_at_start = metric(admin, "tern_upstream_records_behind")?;
        let draining = samples(&mut producer, &mut receipts, &mut sent, options.samples).await?;
        let backlog_at_end = metric(admin, "tern_upstream_records_behind")?;
        let commands_per_sec = burst(&mut producer, admin, sent, options.burst).await?;
        producer.finish()?;
        device.abort();
        Ok(Report {
            command,
            idle,
            draining,
            backlog_at_start,
            backlog_at_end,
            bandwidth_kib: options.bandwidth_kib,
            burst: options.burst,
            commands_per_sec,
            mqtt_msgs_per_sec: ingest.msgs_per_sec,
        })
    })
}

/// The child's `[[upstream]]`: the bench's names, its `mqtt` topic forwarded under the cap, and
/// the commands of `topic`.
fn child_config(options: &DownstreamBenchOptions, gateway: &str, topic: &str) -> String {
    let quoted: Vec<String> = options.kafka.iter().map(|b| format!("{b:?}")).collect();
    format!(
        "[[upstream]]\nbootstrap = [{}]\ngateway_id = \"{gateway}\"\n\
         topic_prefix = \"{TOPIC_PREFIX}\"\ntopics = [\"mqtt\"]\nbandwidth = \"{}KiB\"\n\
         [upstream.commands]\ntopic = \"{topic}\"\nallow = [\"{COMMAND_TOPIC}\"]\n",
        quoted.join(", "),
        options.bandwidth_kib
    )
}

/// Kafka's console producer (the Java client, `linger.ms=0`, acks=all) writing commands for
/// `gateway` to `topic`, one per line as it is given (kcat only sends once its input ends).
struct Producer {
    child: Child,
    stdin: Option<ChildStdin>,
    gateway: String,
}

impl Producer {
    fn start(
        kafka: &[String],
        classpath: &str,
        topic: &str,
        gateway: &str,
    ) -> Result<Self, BenchError> {
        let mut child = Command::new("java")
            .args(["-Xmx256m", "-Djava.awt.headless=true", "-cp", classpath])
            .arg("org.apache.kafka.tools.ConsoleProducer")
            .args(["--bootstrap-server", &kafka.join(","), "--topic", topic])
            .args([
                "--property",
                "parse.key=true",
                "--property",
                "key.separator=|",
            ])
            .args([
                "--property",
                "parse.headers=true",
                "--property",
                "headers.delimiter=#",
            ])
            .args(["--producer-property", "linger.ms=0"])
            .args(["--producer-property", "acks=all"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|source| BenchError::Io {
                what: "starting Kafka's console producer (is java installed?)",
                source,
            })?;
        let stdin = child.stdin.take();
        Ok(Self {
            child,
            stdin,
            gateway: gateway.to_owned(),
        })
    }

    /// Produces command `seq`, its send time in its value.
    fn send(&mut self, seq: u64) -> Result<(), BenchError> {
        let io = |source| BenchError::Io {
            what: "writing a command to the console producer",
            source,
        };
        let stdin = self.stdin.as_mut().ok_or(BenchError::Closed)?;
        let headers = format!("mqtt.topic:{COMMAND_TOPIC},mqtt.qos:1");
        writeln!(stdin, "{headers}#{}|{seq}:{}", self.gateway, now_ms()).map_err(io)?;
        stdin.flush().map_err(io)
    }

    /// Closes the producer's input and waits until it has delivered everything.
    fn finish(mut self) -> Result<(), BenchError> {
        drop(self.stdin.take());
        let status = self.child.wait().map_err(|source| BenchError::Io {
            what: "waiting for the console producer",
            source,
        })?;
        if !status.success() {
            return Err(BenchError::Tool {
                program: "ConsoleProducer".to_owned(),
                message: format!("exited with {status}"),
            });
        }
        Ok(())
    }
}

/// `count` commands one at a time, each produced once the one before it arrived.
async fn samples(
    producer: &mut Producer,
    receipts: &mut mpsc::UnboundedReceiver<(u64, f64)>,
    sent: &mut u64,
    count: usize,
) -> Result<Latency, BenchError> {
    let mut millis = Vec::with_capacity(count);
    for _ in 0..count {
        let seq = *sent;
        producer.send(seq)?;
        *sent += 1;
        loop {
            let next = tokio::time::timeout(RECEIPT_TIMEOUT, receipts.recv()).await;
            match next {
                Ok(Some((got, latency))) if got == seq => {
                    millis.push(latency);
                    break;
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err(BenchError::Closed),
                Err(_) => {
                    return Err(BenchError::Silent {
                        after: RECEIPT_TIMEOUT,
                    });
                }
            }
        }
        tokio::time::sleep(PACE).await;
    }
    Ok(Latency::of(millis))
}

/// Produces `count` commands at once and returns how many a second the child stored, from its
/// first stored one to its last (`tern_downstream_commands_total`, which counts `before` ahead).
async fn burst(
    producer: &mut Producer,
    admin: SocketAddr,
    before: u64,
    count: u64,
) -> Result<f64, BenchError> {
    for seq in before..before + count {
        producer.send(seq)?;
    }
    let name = "tern_downstream_commands_total";
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut first: Option<(Instant, u64)> = None;
    loop {
        let stored = metric(admin, name)?;
        let now = Instant::now();
        if first.is_none() && stored > before {
            first = Some((now, stored));
        }
        if stored >= before + count {
            let (at, from) = first.unwrap_or((now, stored));
            let secs = now.duration_since(at).as_secs_f64();
            return Ok((stored - from) as f64 / secs.max(f64::MIN_POSITIVE));
        }
        if now > deadline {
            return Err(BenchError::Stalled {
                topic: name.to_owned(),
                got: stored,
                expected: before + count,
                after: Duration::from_secs(600),
            });
        }
        // The poll interval of the metric, not a wait for the result.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The device: subscribes to the commands at QoS 1 and reports each one's sequence number and
/// produce-to-receipt latency.
async fn device(
    broker: SocketAddr,
    subscribed: tokio::sync::oneshot::Sender<()>,
    received: mpsc::UnboundedSender<(u64, f64)>,
) -> Result<(), BenchError> {
    let mut subscribed = Some(subscribed);
    let (mut stream, mut inbuf) = load::connect(broker, "bench-device").await?;
    let io = |what| move |source| BenchError::Io { what, source };
    let mut out = BytesMut::new();
    let subscribe = Packet::Subscribe {
        packet_id: 1,
        filter: COMMAND_TOPIC,
        qos: QoS::AtLeastOnce,
    };
    put(&mut out, &subscribe)?;
    stream.write_all(&out).await.map_err(io("subscribing"))?;
    loop {
        let frame = match mqtt::frame(&inbuf) {
            Ok(frame) => frame,
            Err(DecodeError::Incomplete { .. }) => {
                let read = stream.read_buf(&mut inbuf).await.map_err(io("reading"))?;
                if read == 0 {
                    return Err(BenchError::Closed);
                }
                continue;
            }
            Err(err) => return Err(err.into()),
        };
        let bytes = inbuf.split_to(frame.len);
        if frame.packet_type == SUBACK {
            if let Some(subscribed) = subscribed.take() {
                let _ = subscribed.send(());
            }
            continue;
        }
        let Ok((Packet::Publish(publish), _)) = mqtt::decode(&bytes) else {
            continue;
        };
        let arrived = now_ms();
        if let Some(packet_id) = publish.packet_id {
            out.clear();
            put(&mut out, &Packet::PubAck { packet_id })?;
            stream.write_all(&out).await.map_err(io("acknowledging"))?;
        }
        let text = std::str::from_utf8(publish.payload).unwrap_or_default();
        if let Some((seq, sent)) = text.split_once(':') {
            if let (Ok(seq), Ok(sent)) = (seq.parse::<u64>(), sent.parse::<i64>()) {
                let _ = received.send((seq, (arrived - sent) as f64));
            }
        }
    }
}

/// `err` with what the child's metrics say about the commands.
fn explained(err: BenchError, admin: SocketAddr) -> BenchError {
    let names = [
        "tern_downstream_next_offset",
        "tern_downstream_commands_total",
        "tern_downstream_failing",
        "tern_mqtt_publishes_sent_total",
    ];
    let figures: Vec<String> = names
        .iter()
        .map(|n| format!("{n} {:?}", metric(admin, n).ok()))
        .collect();
    BenchError::Tool {
        program: "tern-bench downstream".to_owned(),
        message: format!("{err}; {}", figures.join(", ")),
    }
}

/// The sum of every sample of `name` on the child's `/metrics`.
fn metric(admin: SocketAddr, name: &str) -> Result<u64, BenchError> {
    let page = crate::mqtt::servers::http_get(admin, "/metrics")?;
    Ok(page
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

use tern_core::time::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_reads_its_commands_and_forwards_its_mqtt_topic_under_the_cap() {
        let options = DownstreamBenchOptions {
            kafka: vec!["127.0.0.1:1".to_owned()],
            samples: 10,
            burst: 1,
            backlog: 1000,
            bandwidth_kib: 64,
            kafka_classpath: String::new(),
        };
        let text = child_config(&options, "r1-down", "tern-bench.r1-down.commands");
        #[derive(serde::Deserialize)]
        struct Sections {
            upstream: Vec<UpstreamConfig>,
        }
        let config: Sections = toml::from_str(&text).expect("valid config");
        let upstream = config.upstream.first().expect("one upstream");
        assert_eq!(upstream.bandwidth.0, 64 * 1024);
        assert_eq!(upstream.topics, ["mqtt"]);
        let commands = upstream.commands.as_ref().expect("commands");
        assert_eq!(commands.topic, "tern-bench.r1-down.commands");
        assert_eq!(commands.allow, [COMMAND_TOPIC]);
        assert!(upstream.validate().is_ok());
    }

    #[test]
    fn latencies_are_summarised_by_percentile() {
        let l = Latency::of((1..=100).rev().map(f64::from).collect());
        assert_eq!((l.samples, l.max_ms), (100, 100.0));
        assert!((49.0..=51.0).contains(&l.p50_ms), "{l:?}");
        assert!((98.0..=100.0).contains(&l.p99_ms), "{l:?}");
    }
}
