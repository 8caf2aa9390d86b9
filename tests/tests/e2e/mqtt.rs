//! MQTT against the real binary and the real log, with independent clients: Debian's
//! mosquitto_pub/mosquitto_sub for MQTT 3.1.1 and 5, rumqttc and a raw-socket client for scripted
//! flows (persistent sessions across restarts, wills, keep alive, malformed input, SIGKILL).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rumqttc::{Client, Connection, Event, Incoming, LastWill, MqttOptions, QoS};
use tern_tests::{Gateway, ServeOptions, TempDir, read_log};

fn mosquitto_pub(gateway: &Gateway, args: &[&str]) -> anyhow::Result<()> {
    let output = mosquitto("mosquitto_pub", gateway.mqtt, args)?;
    if !output.status.success() {
        bail!(
            "mosquitto_pub {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

fn mosquitto(program: &str, addr: SocketAddr, args: &[&str]) -> anyhow::Result<Output> {
    Command::new(program)
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program} (scripts/ensure-deps.sh installs it)"))
}

/// Starts mosquitto_sub in the background; its output is collected when it exits.
fn mosquitto_sub(gateway: &Gateway, args: &[&str]) -> anyhow::Result<std::process::Child> {
    let child = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run mosquitto_sub (scripts/ensure-deps.sh installs it)")?;
    // mosquitto_sub has no "subscribed" signal on stdout; give it time to connect and subscribe.
    std::thread::sleep(Duration::from_millis(500));
    Ok(child)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn stop(gateway: &mut Gateway) -> anyhow::Result<()> {
    gateway.signal(libc::SIGTERM)?;
    let status = gateway.wait_exit(Duration::from_secs(15))?;
    assert_eq!(status.code(), Some(0), "{:?}", gateway.stderr_lines());
    Ok(())
}

#[test]
fn mosquitto_publishes_in_v311_and_v5_become_records_with_headers() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-pub")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    mosquitto_pub(
        &gateway,
        &[
            "-V",
            "mqttv311",
            "-q",
            "1",
            "-i",
            "dev-311",
            "-t",
            "sensors/a/temp",
            "-m",
            "21.5",
        ],
    )?;
    mosquitto_pub(
        &gateway,
        &[
            "-V",
            "mqttv311",
            "-q",
            "0",
            "-i",
            "dev-q0",
            "-t",
            "sensors/a/q0",
            "-m",
            "zero",
        ],
    )?;
    mosquitto_pub(
        &gateway,
        &[
            "-V",
            "mqttv5",
            "-q",
            "2",
            "-i",
            "dev-5",
            "-t",
            "sensors/b/temp",
            "-m",
            "{\"t\":19}",
            "-D",
            "publish",
            "user-property",
            "unit",
            "celsius",
            "-D",
            "publish",
            "content-type",
            "application/json",
            "-D",
            "publish",
            "correlation-data",
            "abc",
            "-D",
            "publish",
            "response-topic",
            "replies/dev-5",
            "-D",
            "publish",
            "payload-format-indicator",
            "1",
            "-D",
            "publish",
            "message-expiry-interval",
            "3600",
        ],
    )?;
    stop(&mut gateway)?;

    let records = read_log(dir.path(), "mqtt")?;
    assert_eq!(records.len(), 3, "{records:?}");
    let find = |topic: &str| {
        records
            .iter()
            .find(|r| r.header("mqtt.topic") == topic)
            .with_context(|| format!("no record for {topic}"))
    };
    let v311 = find("sensors/a/temp")?;
    assert_eq!(v311.value, "21.5");
    assert_eq!(v311.key.as_deref(), Some("sensors/a/temp"));
    assert_eq!(v311.header("mqtt.qos"), "1");
    assert_eq!(v311.header("mqtt.retain"), "0");
    assert_eq!(v311.header("mqtt.client_id"), "dev-311");
    let age = now_ms() - v311.timestamp_ms;
    assert!(
        (0..120_000).contains(&age),
        "timestamp is the receive time: {age}"
    );
    assert_eq!(find("sensors/a/q0")?.header("mqtt.qos"), "0");
    let v5 = find("sensors/b/temp")?;
    assert_eq!(v5.header("mqtt.qos"), "2");
    assert_eq!(v5.header("mqtt.user.unit"), "celsius");
    assert_eq!(v5.header("mqtt.content_type"), "application/json");
    assert_eq!(v5.header("mqtt.correlation_data"), "abc");
    assert_eq!(v5.header("mqtt.response_topic"), "replies/dev-5");
    assert_eq!(v5.header("mqtt.payload_format"), "1");
    assert_eq!(v5.header("mqtt.message_expiry"), "3600");
    Ok(())
}

#[test]
fn mosquitto_sub_receives_wildcard_matches_in_both_versions() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-sub")?;
    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    for version in ["mqttv311", "mqttv5"] {
        let sub = mosquitto_sub(
            &gateway,
            &[
                "-V",
                version,
                "-q",
                "1",
                "-t",
                "home/+/temp",
                "-t",
                "alarm/#",
                "-C",
                "3",
                "-W",
                "15",
                "-v",
            ],
        )?;
        for (topic, payload) in [
            ("home/kitchen/temp", "20"),
            ("home/kitchen/hum", "no"),
            ("alarm/door/front", "open"),
            ("home/hall/temp", "18"),
        ] {
            mosquitto_pub(
                &gateway,
                &["-V", version, "-q", "1", "-t", topic, "-m", payload],
            )?;
        }
        let output = sub.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{version}: {stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines,
            [
                "home/kitchen/temp 20",
                "alarm/door/front open",
                "home/hall/temp 18"
            ],
            "{version}"
        );
    }
    Ok(())
}

#[test]
fn retained_messages_survive_a_restart_and_empty_payloads_clear_them() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-retained")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    mosquitto_pub(
        &gateway,
        &[
            "-V",
            "mqttv311",
            "-q",
            "1",
            "-r",
            "-t",
            "status/pump",
            "-m",
            "on",
        ],
    )?;
    stop(&mut gateway)?;

    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    for version in ["mqttv311", "mqttv5"] {
        let output = mosquitto(
            "mosquitto_sub",
            gateway.mqtt,
            &["-V", version, "-t", "status/#", "-C", "1", "-W", "10", "-v"],
        )?;
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "status/pump on\n",
            "{version}"
        );
    }
    mosquitto_pub(
        &gateway,
        &["-V", "mqttv5", "-q", "1", "-r", "-t", "status/pump", "-n"],
    )?;
    stop(&mut gateway)?;

    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let output = mosquitto(
        "mosquitto_sub",
        gateway.mqtt,
        &["-t", "status/#", "-C", "1", "-W", "2"],
    )?;
    assert!(!output.status.success(), "nothing retained any more");
    assert!(
        output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    Ok(())
}

/// A rumqttc client; its event loop runs in `connection`.
fn rumqttc(
    addr: SocketAddr,
    id: &str,
    clean: bool,
    will: Option<LastWill>,
) -> (Client, Connection) {
    let mut options = MqttOptions::new(id, "127.0.0.1", addr.port());
    options.set_clean_session(clean);
    options.set_keep_alive(Duration::from_secs(30));
    if let Some(will) = will {
        options.set_last_will(will);
    }
    Client::new(options, 64)
}

/// Collects incoming publish payloads until `count` arrived or `timeout` passed; acks them.
fn collect(connection: &mut Connection, count: usize, timeout: Duration) -> BTreeSet<String> {
    let deadline = Instant::now() + timeout;
    let mut payloads = BTreeSet::new();
    while payloads.len() < count && Instant::now() < deadline {
        match connection.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(Event::Incoming(Incoming::Publish(publish)))) => {
                payloads.insert(String::from_utf8_lossy(&publish.payload).into_owned());
            }
            Ok(Ok(_)) => {}
            Ok(Err(_)) => std::thread::sleep(Duration::from_millis(100)),
            Err(_) => {}
        }
    }
    payloads
}

/// Drives the event loop until an incoming packet satisfies `wanted`.
fn wait_for(connection: &mut Connection, wanted: impl Fn(&Incoming) -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Ok(Event::Incoming(packet))) = connection.recv_timeout(Duration::from_millis(200))
        {
            if wanted(&packet) {
                return Ok(());
            }
        }
    }
    bail!("the awaited packet did not arrive")
}

#[test]
fn a_persistent_session_resumes_after_a_gateway_restart_with_every_message() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-session")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    {
        let (client, mut connection) = rumqttc(gateway.mqtt, "keeper", false, None);
        client.subscribe("jobs/#", QoS::AtLeastOnce)?;
        wait_for(&mut connection, |p| matches!(p, Incoming::SubAck(_)))?;
        client.disconnect()?;
        let _ = collect(&mut connection, 1, Duration::from_millis(300));
    }
    let sent: BTreeSet<String> = (0..20).map(|i| format!("job-{i}")).collect();
    for payload in &sent {
        raw_publish_qos1(gateway.mqtt, "jobs/new", payload.as_bytes())?;
    }
    stop(&mut gateway)?;

    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let (_client, mut connection) = rumqttc(gateway.mqtt, "keeper", false, None);
    let received = collect(&mut connection, sent.len(), Duration::from_secs(15));
    assert_eq!(received, sent);
    Ok(())
}

#[test]
fn a_will_is_published_when_a_client_vanishes() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-will")?;
    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let sub = mosquitto_sub(
        &gateway,
        &["-V", "mqttv5", "-t", "wills/#", "-C", "1", "-W", "15", "-v"],
    )?;
    {
        let will = LastWill::new("wills/dev-9", "offline", QoS::AtLeastOnce, false);
        let (_client, mut connection) = rumqttc(gateway.mqtt, "dev-9", true, Some(will));
        wait_for(&mut connection, |p| matches!(p, Incoming::ConnAck(_)))?;
    }
    let output = sub.wait_with_output()?;
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "wills/dev-9 offline\n"
    );
    Ok(())
}

/// A raw MQTT 3.1.1 client socket after a successful CONNECT.
fn raw_connect(addr: SocketAddr, id: &str, keep_alive: u16) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut body = vec![
        0,
        4,
        b'M',
        b'Q',
        b'T',
        b'T',
        4,
        0x02,
        (keep_alive >> 8) as u8,
        keep_alive as u8,
    ];
    body.extend_from_slice(&[(id.len() >> 8) as u8, id.len() as u8]);
    body.extend_from_slice(id.as_bytes());
    write_packet(&mut stream, 0x10, &body)?;
    let mut connack = [0u8; 4];
    stream.read_exact(&mut connack)?;
    if connack != [0x20, 2, 0, 0] {
        bail!("CONNACK refused: {connack:?}");
    }
    Ok(stream)
}

fn write_packet(stream: &mut TcpStream, first: u8, body: &[u8]) -> anyhow::Result<()> {
    let mut packet = vec![first];
    let mut len = body.len();
    loop {
        let byte = (len % 128) as u8;
        len /= 128;
        packet.push(if len > 0 { byte | 0x80 } else { byte });
        if len == 0 {
            break;
        }
    }
    packet.extend_from_slice(body);
    stream.write_all(&packet)?;
    Ok(())
}

/// Sends one QoS 1 PUBLISH with `pkid` and waits for its PUBACK.
fn publish_qos1(
    stream: &mut TcpStream,
    topic: &str,
    payload: &[u8],
    pkid: u16,
) -> anyhow::Result<()> {
    let mut body = vec![(topic.len() >> 8) as u8, topic.len() as u8];
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&[(pkid >> 8) as u8, pkid as u8]);
    body.extend_from_slice(payload);
    write_packet(stream, 0x32, &body)?;
    let mut puback = [0u8; 4];
    stream.read_exact(&mut puback)?;
    if puback != [0x40, 2, (pkid >> 8) as u8, pkid as u8] {
        bail!("expected PUBACK for {pkid}, got {puback:?}");
    }
    Ok(())
}

fn raw_publish_qos1(addr: SocketAddr, topic: &str, payload: &[u8]) -> anyhow::Result<()> {
    let mut stream = raw_connect(addr, "", 30)?;
    publish_qos1(&mut stream, topic, payload, 1)?;
    write_packet(&mut stream, 0xe0, &[])
}

fn closed_within(stream: &mut TcpStream, limit: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    stream.set_read_timeout(Some(limit))?;
    let mut buf = [0u8; 16];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(started.elapsed()),
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {
                return Ok(started.elapsed());
            }
            Err(err) => bail!("still open after {limit:?}: {err}"),
        }
    }
}

#[test]
fn keep_alive_is_enforced_at_one_and_a_half_times_its_value() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-keepalive")?;
    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mut stream = raw_connect(gateway.mqtt, "sleepy", 2)?;
    let waited = closed_within(&mut stream, Duration::from_secs(6))?;
    assert!(
        waited >= Duration::from_millis(2800),
        "closed too early: {waited:?}"
    );
    Ok(())
}

#[test]
fn a_malformed_packet_closes_only_its_connection() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-malformed")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mut good = raw_connect(gateway.mqtt, "good", 30)?;
    let mut bad = raw_connect(gateway.mqtt, "bad", 30)?;
    bad.write_all(&[0x32, 0x03, 0xff, 0xff, 0x00])?;
    closed_within(&mut bad, Duration::from_secs(5))?;
    let mut huge = raw_connect(gateway.mqtt, "huge", 30)?;
    huge.write_all(&[0x30, 0xff, 0xff, 0xff, 0x7f])?;
    closed_within(&mut huge, Duration::from_secs(5))?;
    publish_qos1(&mut good, "still/fine", b"yes", 1)?;
    let (status, metrics) = gateway.admin_get("/metrics")?;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("tern_mqtt_malformed_packets_total 2"),
        "{metrics}"
    );
    stop(&mut gateway)?;
    assert!(
        !gateway
            .stderr_lines()
            .iter()
            .any(|l| l.contains("panicked"))
    );
    Ok(())
}

#[test]
fn every_acknowledged_qos1_message_survives_repeated_sigkill() -> anyhow::Result<()> {
    const PUBLISHERS: usize = 20;
    let dir = TempDir::new("mqtt-crash")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let addr = Arc::new(Mutex::new(gateway.mqtt));
    let running = Arc::new(AtomicBool::new(true));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for publisher in 0..PUBLISHERS {
        let (addr, running, acked) = (addr.clone(), running.clone(), acked.clone());
        threads.push(std::thread::spawn(move || {
            publish_until_stopped(publisher, &addr, &running, &acked)
        }));
    }
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        gateway.signal(libc::SIGKILL)?;
        gateway.wait_exit(Duration::from_secs(10))?;
        gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
        *addr.lock().unwrap_or_else(|e| e.into_inner()) = gateway.mqtt;
    }
    std::thread::sleep(Duration::from_millis(1000));
    running.store(false, Ordering::SeqCst);
    for thread in threads {
        let _ = thread.join();
    }
    stop(&mut gateway)?;

    let acked = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        acked.len() > 100,
        "too few acknowledged messages to mean anything: {}",
        acked.len()
    );
    let stored: BTreeSet<String> = read_log(dir.path(), "mqtt")?
        .into_iter()
        .map(|r| r.value)
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|p| !stored.contains(*p)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged messages lost, e.g. {:?}",
        lost.len(),
        acked.len(),
        lost.first()
    );
    Ok(())
}

/// One crash-test publisher: QoS 1 messages with unique payloads, one at a time, reconnecting
/// after every failure; records each payload whose PUBACK arrived.
fn publish_until_stopped(
    publisher: usize,
    addr: &Mutex<SocketAddr>,
    running: &AtomicBool,
    acked: &Mutex<Vec<String>>,
) {
    let mut sequence = 0u64;
    while running.load(Ordering::SeqCst) {
        let target = *addr.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(mut stream) = raw_connect(target, &format!("crash-{publisher}"), 30) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        while running.load(Ordering::SeqCst) {
            sequence += 1;
            let payload = format!("p{publisher}-m{sequence}");
            let pkid = (sequence % 65_535 + 1) as u16;
            if publish_qos1(
                &mut stream,
                &format!("crash/{publisher}"),
                payload.as_bytes(),
                pkid,
            )
            .is_err()
            {
                break;
            }
            acked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(payload);
        }
    }
}
