//! Limits that must hold while clients try to exhaust the real binary: `max_connections` under
//! simultaneous CONNECTs, idle sockets that never send CONNECT against a small
//! file-descriptor limit, and MQTT 3.1.1 clients with keep alive 0.

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
