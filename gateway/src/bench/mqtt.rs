//! `tern bench mqtt`: a load generator for any MQTT 3.1.1 broker. N publishers each send M
//! messages of S bytes at QoS 0 or 1 (QoS 1 with a window of unacknowledged messages) and the
//! run prints msgs/s and PUBACK latency p50/p99/max; with `--compare` it runs the same load
//! against a second broker and prints the throughput ratio; with `--idle` it holds that many idle
//! connections open and prints the broker's resident memory (`--broker-pid`). Figures live here,
//! never in timed tests. Client side only; it never touches the log.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub broker: SocketAddr,
    pub compare: Option<SocketAddr>,
    pub publishers: usize,
    pub messages: usize,
    pub size: usize,
    pub qos: u8,
    pub window: usize,
    pub idle: usize,
    pub broker_pid: Option<u32>,
}

/// The figures of one broker.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub broker: String,
    pub qos: u8,
    pub messages: usize,
    pub seconds: f64,
    pub msgs_per_sec: f64,
    pub puback_p50_ms: Option<f64>,
    pub puback_p99_ms: Option<f64>,
    pub puback_max_ms: Option<f64>,
    pub idle_clients: usize,
    pub broker_rss_mib: Option<f64>,
}

/// Runs the benchmark and prints it as text or JSON.
pub fn run(options: &BenchOptions, json: bool) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut results = vec![runtime.block_on(measure(options, options.broker))?];
    if let Some(other) = options.compare {
        results.push(runtime.block_on(measure(options, other))?);
    }
    let ratio = match results.as_slice() {
        [first, second] if second.msgs_per_sec > 0.0 => {
            Some(first.msgs_per_sec / second.msgs_per_sec)
        }
        _ => None,
    };
    if json {
        let value = serde_json::json!({ "results": results, "throughput_ratio": ratio });
        println!("{value}");
        return Ok(());
    }
    for r in &results {
        println!(
            "{}: QoS {} {} msgs in {:.2}s = {:.0} msgs/s; PUBACK p50 {} p99 {} max {}; RSS with {} idle clients: {}",
            r.broker,
            r.qos,
            r.messages,
            r.seconds,
            r.msgs_per_sec,
            ms(r.puback_p50_ms),
            ms(r.puback_p99_ms),
            ms(r.puback_max_ms),
            r.idle_clients,
            r.broker_rss_mib
                .map_or("n/a".to_owned(), |m| format!("{m:.1} MiB")),
        );
    }
    if let Some(ratio) = ratio {
        println!("throughput ratio (first / second): {ratio:.2}");
    }
    Ok(())
}

fn ms(value: Option<f64>) -> String {
    value.map_or("n/a".to_owned(), |v| format!("{v:.2}ms"))
}

async fn measure(options: &BenchOptions, broker: SocketAddr) -> anyhow::Result<BenchResult> {
    let mut idle = Vec::with_capacity(options.idle);
    for i in 0..options.idle {
        idle.push(connect(broker, &format!("bench-idle-{i}")).await?);
    }
    let broker_rss_mib = options.broker_pid.and_then(rss_mib);
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(
        options.publishers * options.messages,
    )));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..options.publishers {
        let (options, latencies) = (options.clone(), latencies.clone());
        tasks.push(tokio::spawn(async move {
            publish(&options, broker, p, &latencies).await
        }));
    }
    for task in tasks {
        task.await.context("publisher panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    drop(idle);
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap_or_else(|e| e.into_inner()));
    latencies.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        let last = latencies.len().checked_sub(1)?;
        latencies.get(((last as f64) * q).round() as usize).copied()
    };
    let messages = options.publishers * options.messages;
    Ok(BenchResult {
        broker: broker.to_string(),
        qos: options.qos,
        messages,
        seconds,
        msgs_per_sec: messages as f64 / seconds.max(f64::EPSILON),
        puback_p50_ms: pick(0.5),
        puback_p99_ms: pick(0.99),
        puback_max_ms: latencies.last().copied(),
        idle_clients: options.idle,
        broker_rss_mib,
    })
}

/// Connects with MQTT 3.1.1, clean session, keep alive 300 s.
async fn connect(broker: SocketAddr, id: &str) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(broker)
        .await
        .with_context(|| format!("connecting to {broker}"))?;
    stream.set_nodelay(true)?;
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0x01, 0x2c];
    push_string(&mut body, id.as_bytes());
    stream.write_all(&packet(0x10, &body)).await?;
    let mut connack = [0u8; 4];
    stream.read_exact(&mut connack).await?;
    if connack != [0x20, 2, 0, 0] {
        bail!("{broker} refused the connection: {connack:?}");
    }
    Ok(stream)
}

async fn publish(
    options: &BenchOptions,
    broker: SocketAddr,
    publisher: usize,
    latencies: &Mutex<Vec<f64>>,
) -> anyhow::Result<()> {
    let stream = connect(broker, &format!("bench-pub-{publisher}")).await?;
    let (mut reader, mut writer) = stream.into_split();
    let topic = format!("bench/{publisher}");
    let payload = vec![b'x'; options.size];
    if options.qos == 0 {
        for _ in 0..options.messages {
            writer
                .write_all(&publish_packet(&topic, &payload, 0, 0))
                .await?;
        }
        writer.write_all(&[0xc0, 0]).await?;
        let mut pingresp = [0u8; 2];
        reader.read_exact(&mut pingresp).await?;
        return Ok(());
    }
    let window = Arc::new(Semaphore::new(options.window.max(1)));
    let sent: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; 65_536]));
    let count = options.messages;
    let acks = {
        let (window, sent) = (window.clone(), sent.clone());
        tokio::spawn(async move {
            let mut mine = Vec::with_capacity(count);
            for _ in 0..count {
                let mut puback = [0u8; 4];
                reader.read_exact(&mut puback).await?;
                let pkid = usize::from(puback[2]) << 8 | usize::from(puback[3]);
                let at = sent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(pkid)
                    .and_then(Option::take);
                if let Some(at) = at {
                    mine.push(at.elapsed().as_secs_f64() * 1000.0);
                }
                window.add_permits(1);
            }
            anyhow::Ok(mine)
        })
    };
    for i in 0..options.messages {
        window.acquire().await.context("window closed")?.forget();
        let pkid = (i % 65_535 + 1) as u16;
        if let Some(slot) = sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(usize::from(pkid))
        {
            *slot = Some(Instant::now());
        }
        writer
            .write_all(&publish_packet(&topic, &payload, 1, pkid))
            .await?;
    }
    let mine = tokio::time::timeout(Duration::from_secs(120), acks)
        .await
        .context("PUBACKs did not arrive")???;
    latencies
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(mine);
    Ok(())
}

fn publish_packet(topic: &str, payload: &[u8], qos: u8, pkid: u16) -> Vec<u8> {
    let mut body = Vec::with_capacity(topic.len() + payload.len() + 4);
    push_string(&mut body, topic.as_bytes());
    if qos > 0 {
        body.extend_from_slice(&[(pkid >> 8) as u8, pkid as u8]);
    }
    body.extend_from_slice(payload);
    packet(0x30 | (qos << 1), &body)
}

fn push_string(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = bytes.len().min(usize::from(u16::MAX));
    out.extend_from_slice(&[(len >> 8) as u8, len as u8]);
    out.extend_from_slice(bytes.get(..len).unwrap_or_default());
}

fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let byte = (len % 128) as u8;
        len /= 128;
        out.push(if len > 0 { byte | 0x80 } else { byte });
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// Resident memory of a process in MiB, from /proc.
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_have_golden_bytes() {
        assert_eq!(
            publish_packet("t", b"xy", 1, 258),
            [0x32, 7, 0, 1, b't', 1, 2, b'x', b'y']
        );
        assert_eq!(publish_packet("t", b"", 0, 0), [0x30, 3, 0, 1, b't']);
        assert_eq!(packet(0x30, &[0; 200])[..3], [0x30, 0xc8, 0x01]);
    }
}
