//! Limits that must hold while clients try to exhaust the real binary: `max_connections` under
//! simultaneous CONNECTs, idle sockets that never send CONNECT against a small
//! file-descriptor limit, MQTT 3.1.1 clients with keep alive 0, and subscribers that never read
//! against `max_queued_bytes_total` (tern's RSS stays bounded).

use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::Context;
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir};

use super::mqtt_abuse::{connack_code, connect_body, gateway};

#[test]
fn max_connections_holds_under_twenty_simultaneous_connects() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-slots")?;
    let mut gateway = gateway(&dir, "[mqtt]\nmax_connections = 50\n")?;
    let mut held = Vec::new();
    for i in 0..49 {
        held.push(RawClient::connect(
            gateway.mqtt,
            &format!("hold-{i}"),
            60,
            true,
            false,
        )?);
    }
    let barrier = Arc::new(Barrier::new(20));
    let addr = gateway.mqtt;
    let racers: Vec<_> = (0..20)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || -> anyhow::Result<(RawClient, Option<u8>)> {
                let mut client = RawClient::open(addr, false)?;
                // Persistent sessions: their CONNECT waits for a state-log append, the
                // longest path between taking a slot and holding the connection.
                let body = connect_body(4, 0x00, &[], format!("race-{i}").as_bytes());
                barrier.wait();
                client.write_packet(0x10, &body)?;
                let code = match client.read_packet() {
                    Ok((0x20, connack)) => connack.get(1).copied(),
                    _ => None,
                };
                Ok((client, code))
            })
        })
        .collect();
    let mut admitted = 0;
    let mut clients = Vec::new();
    for racer in racers {
        let (client, code) = racer
            .join()
            .map_err(|_| anyhow::anyhow!("racer panicked"))??;
        admitted += usize::from(code == Some(0));
        clients.push(client);
    }
    assert_eq!(admitted, 1, "one slot was left, {admitted} CONNECTs got in");
    let open = gateway.metric_sum("tern_mqtt_connections", "")?;
    assert_eq!(open, Some(50));
    drop(clients);
    drop(held);
    gateway.stop()
}

#[test]
fn idle_sockets_without_connect_do_not_lock_clients_out() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-pending")?;
    let file = dir.path().join("tern.toml");
    std::fs::write(
        &file,
        "[mqtt]\nmax_connections = 50\nconnect_timeout = \"60s\"\n",
    )?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), file.display().to_string()],
        ..ServeOptions::default()
    };
    let mut gateway = Gateway::start_with_nofile(&dir.path().join("data"), &options, 256)?;
    // More idle sockets than tern has file descriptors.
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect_timeout(&gateway.mqtt, Duration::from_secs(5)))
        .collect::<Result<_, _>>()?;
    for i in 0..3 {
        let (mut client, code) = connack_code(
            &gateway,
            &connect_body(4, 0x02, &[], format!("good-{i}").as_bytes()),
            false,
        )
        .with_context(|| format!("good client {i}"))?;
        client.set_timeout(Duration::from_secs(5))?;
        assert_eq!(code, Some(0), "good client {i} was locked out");
        assert_eq!(client.subscribe("t", 0, 1)?, 0);
    }
    let evicted = gateway.metric_sum("tern_mqtt_pending_evicted_total", "")?;
    assert!(
        evicted.unwrap_or(0) > 0,
        "no idle socket was closed: {evicted:?}"
    );
    drop(idle);
    gateway.stop()
}

#[test]
fn mqtt311_keep_alive_zero_clients_are_closed_after_the_idle_timeout() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-idle")?;
    let mut gateway = gateway(&dir, "[mqtt]\nidle_timeout = \"1s\"\n")?;
    let mut silent = RawClient::connect(gateway.mqtt, "silent", 0, true, false)?;
    let took = silent.closed_within(Duration::from_secs(15))?;
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    gateway.wait_metric(
        "tern_mqtt_connections",
        "",
        "the idle client to be gone",
        Duration::from_secs(5),
        |open| open == Some(0),
    )?;
    gateway.stop()
}

#[test]
fn a_thousand_subscribes_on_one_persistent_session_write_linear_bytes() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-session")?;
    let listen = tern_tests::free_port()?;
    let options = ServeOptions {
        mqtt_listen: Some(listen),
        ..ServeOptions::default()
    };
    let data = dir.path().join("data");
    let mut gateway = Gateway::start(&data, &options)?;
    let mut client = RawClient::connect(gateway.mqtt, "many-subs", 60, false, false)?;
    let written = |gateway: &Gateway| -> anyhow::Result<u64> {
        gateway
            .metric_sum("tern_log_bytes_written_total", "")?
            .context("no tern_log_bytes_written_total")
    };
    let before = written(&gateway)?;
    for i in 0..1000u16 {
        let filter = format!("sensors/{i:04}/+/temperature");
        assert_eq!(client.subscribe(&filter, 1, i + 1)?, 1, "{filter}");
    }
    let bytes = written(&gateway)? - before;
    eprintln!("1,000 SUBSCRIBEs wrote {bytes} bytes to the log");
    assert!(bytes < 1024 * 1024, "1,000 SUBSCRIBEs wrote {bytes} bytes");
    client.disconnect()?;
    gateway.stop()?;
    // After a restart the session holds every subscription.
    let mut gateway = Gateway::start(&data, &options)?;
    let mut client = RawClient::connect(gateway.mqtt, "many-subs", 60, false, false)?;
    let mut publisher = RawClient::connect(gateway.mqtt, "publisher", 60, true, false)?;
    for i in [0, 517, 999] {
        let topic = format!("sensors/{i:04}/x/temperature");
        assert_eq!(publisher.publish_qos1(&topic, b"21.5", 1)?, 0);
        let received = client.next_publish()?;
        assert_eq!(received.topic, topic);
    }
    gateway.stop()
}

/// tern's resident memory, from `/proc/PID/status` (VmRSS).
fn rss_bytes(gateway: &Gateway) -> anyhow::Result<u64> {
    let pid = gateway.pid().context("tern is not running")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .context("no VmRSS in /proc/PID/status")?;
    Ok(kib * 1024)
}

const STUCK_SUBSCRIBERS: usize = 100;
const MIB: u64 = 1024 * 1024;

/// 100 QoS 1 subscribers that subscribe and never read nor acknowledge, and a publisher of
/// 20 messages of 64 KiB: without a global cap every session queues up to
/// `max_queued_bytes` (1 MiB). Waits until `tern_mqtt_queued_bytes` reaches `until`, then
/// returns tern's RSS growth since the subscribers subscribed, and the queued bytes.
fn stuck_subscribers_rss(cap: u64, until: u64) -> anyhow::Result<(u64, u64)> {
    let dir = TempDir::new("mqtt-abuse-memcap")?;
    let config = format!("[mqtt]\nmax_queued_bytes_total = {cap}\n");
    let mut gateway = gateway(&dir, &config)?;
    let mut stuck = Vec::new();
    for i in 0..STUCK_SUBSCRIBERS {
        let mut client = RawClient::connect(gateway.mqtt, &format!("stuck-{i}"), 0, true, false)?;
        assert_eq!(client.subscribe("bulk/#", 1, 1)?, 1);
        stuck.push(client);
    }
    let baseline = rss_bytes(&gateway)?;
    let mut publisher = RawClient::connect(gateway.mqtt, "publisher", 60, true, false)?;
    let payload = vec![0x5a; 64 * 1024];
    for pkid in 1..=20 {
        assert_eq!(publisher.publish_qos1("bulk/x", &payload, pkid)?, 0);
    }
    gateway.wait_metric(
        "tern_mqtt_queued_bytes",
        "",
        "the stuck sessions to queue their deliveries",
        Duration::from_secs(30),
        |queued| queued.is_some_and(|q| q >= until),
    )?;
    let grown = rss_bytes(&gateway)?.saturating_sub(baseline);
    let queued = gateway
        .metric_sum("tern_mqtt_queued_bytes", "")?
        .context("no tern_mqtt_queued_bytes")?;
    eprintln!(
        "cap {} MiB: RSS grew {} MiB over {} MiB, {} MiB queued",
        cap / MIB,
        grown / MIB,
        baseline / MIB,
        queued / MIB
    );
    drop(stuck);
    gateway.stop()?;
    Ok((grown, queued))
}

/// The bound a capped run's RSS growth stays under: the cap, plus per stuck session its
/// 64 KiB floor and one 64 KiB delivery past it, plus 8 MiB for the allocator and the log.
fn rss_bound(cap: u64) -> u64 {
    cap + STUCK_SUBSCRIBERS as u64 * 128 * 1024 + 8 * MIB
}

#[test]
fn stuck_subscribers_queue_no_more_than_max_queued_bytes_total() -> anyhow::Result<()> {
    let cap = 16 * MIB;
    let (grown, queued) = stuck_subscribers_rss(cap, cap)?;
    let floors = STUCK_SUBSCRIBERS as u64 * 2 * (64 * 1024 + 64);
    assert!(queued < cap + floors, "{queued} bytes queued");
    assert!(
        grown < rss_bound(cap),
        "RSS grew {grown} bytes, bound {}",
        rss_bound(cap)
    );
    // Negative control: with the cap out of the way, the same clients make every session
    // queue its 1 MiB, and the harness sees RSS pass the bound.
    let unbounded = STUCK_SUBSCRIBERS as u64 * MIB;
    let (grown, _) = stuck_subscribers_rss(1 << 30, unbounded)?;
    assert!(
        grown > rss_bound(cap),
        "without the cap RSS grew only {grown} bytes, bound {}",
        rss_bound(cap)
    );
    Ok(())
}
