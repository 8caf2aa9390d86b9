//! The trickle: N MQTT 3.1.1 clients, each publishing one S-byte QoS 1 message every N/R
//! seconds (open loop, phases spread evenly, so the broker sees R messages a second as a
//! hundred sensors would send them), each PUBACK timed from its PUBLISH. Packets are tern-shared's
//! codec through the MQTT bench's framing helpers.
//!
//! It must never start or stop a broker and never judge the figures.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use crate::BenchError;
use crate::mqtt::load::{self, FromBroker};

/// How long the clients wait for the last PUBACKs after the load stops.
const DRAIN: Duration = Duration::from_secs(10);

/// One acknowledged message: when it was published and how long its PUBACK took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acked {
    pub sent: Instant,
    pub latency: Duration,
}

/// The shape of the trickle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trickle {
    pub clients: usize,
    /// Messages per second over all clients.
    pub rate: f64,
    pub size: usize,
}

impl Trickle {
    /// Time between two messages of one client.
    fn interval(&self) -> Duration {
        Duration::from_secs_f64(self.clients as f64 / self.rate.max(f64::MIN_POSITIVE))
    }
}

/// A running trickle; `stop` ends it and returns every acknowledged message.
#[derive(Debug)]
pub struct Running {
    stop: watch::Sender<bool>,
    tasks: JoinSet<Result<Vec<Acked>, BenchError>>,
}

/// Connects every client, then starts publishing.
pub async fn start(broker: SocketAddr, trickle: Trickle) -> Result<Running, BenchError> {
    let (stop, stopped) = watch::channel(false);
    let mut clients = Vec::with_capacity(trickle.clients);
    for i in 0..trickle.clients {
        clients.push(load::connect(broker, &format!("wear-{i}")).await?);
    }
    let interval = trickle.interval();
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for (i, (stream, inbuf)) in clients.into_iter().enumerate() {
        let phase = interval.mul_f64(i as f64 / trickle.clients as f64);
        let client = Client {
            stream,
            inbuf,
            topic: format!("sensors/{i}"),
        };
        let ticks = tokio::time::interval_at(start + phase, interval);
        tasks.spawn(client.publish(ticks, trickle.size, stopped.clone()));
    }
    Ok(Running { stop, tasks })
}

impl Running {
    /// Stops publishing, waits for the outstanding PUBACKs and returns every acknowledged
    /// message sorted by send time.
    pub async fn stop(mut self) -> Result<Vec<Acked>, BenchError> {
        let _ = self.stop.send(true);
        let mut acked = Vec::new();
        while let Some(joined) = self.tasks.join_next().await {
            acked.extend(joined.map_err(|err| BenchError::task("a trickle client", err))??);
        }
        acked.sort_by_key(|a| a.sent);
        Ok(acked)
    }
}

struct Client {
    stream: tokio::net::TcpStream,
    inbuf: BytesMut,
    topic: String,
}

impl Client {
    async fn publish(
        mut self,
        mut ticks: tokio::time::Interval,
        size: usize,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Vec<Acked>, BenchError> {
        ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
        let payload = vec![0x5a; size];
        let mut out = BytesMut::with_capacity(256);
        let mut sent: HashMap<u16, Instant> = HashMap::new();
        let mut acked = Vec::new();
        let mut pkid: u16 = 1;
        let mut drain_until: Option<Instant> = None;
        loop {
            if let Some(until) = drain_until {
                if sent.is_empty() || Instant::now() >= until {
                    break;
                }
            }
            tokio::select! {
                _ = ticks.tick(), if drain_until.is_none() => {
                    out.clear();
                    load::put(&mut out, &load::publish(&self.topic, true, pkid, &payload))?;
                    sent.insert(pkid, Instant::now());
                    pkid = pkid.checked_add(1).unwrap_or(1);
                    self.stream.write_all(&out).await.map_err(|source| BenchError::Io {
                        what: "publishing",
                        source,
                    })?;
                }
                read = self.stream.read_buf(&mut self.inbuf) => {
                    let read = read.map_err(|source| BenchError::Io {
                        what: "reading from the broker",
                        source,
                    })?;
                    if read == 0 {
                        return Err(BenchError::Closed);
                    }
                    while let Some(packet) = load::next(&mut self.inbuf)? {
                        if let FromBroker::PubAck { pkid } = packet {
                            if let Some(at) = sent.remove(&pkid) {
                                acked.push(Acked { sent: at, latency: at.elapsed() });
                            }
                        }
                    }
                }
                _ = stop.changed(), if drain_until.is_none() => {
                    drain_until = Some(Instant::now() + DRAIN);
                }
                () = tokio::time::sleep_until(drain_until.unwrap_or_else(Instant::now)), if drain_until.is_some() => {}
            }
        }
        Ok(acked)
    }
}
