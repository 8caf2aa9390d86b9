//! MQTT against the real binary and the real log, with independent clients: Debian's
//! mosquitto_pub/mosquitto_sub for MQTT 3.1.1 and 5, rumqttc and a raw-socket client for scripted
//! flows (persistent sessions across restarts, wills, keep alive, malformed input, SIGKILL).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rumqttc::{Client, Connection, Event, Incoming, LastWill, MqttOptions, QoS};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, MosquittoSub, ServeOptions, TempDir, read_log, tern_binary};

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

/// Starts mosquitto_sub in the background, once its subscription is acknowledged; its output is
/// collected when it exits.
fn mosquitto_sub(gateway: &Gateway, args: &[&str]) -> anyhow::Result<MosquittoSub> {
    MosquittoSub::start(gateway.mqtt, args)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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
    gateway.stop()?;

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
        let output = sub.finish()?;
        let stdout = output.stdout;
        assert!(
            output.status.success(),
            "{version}: {stdout} {}",
            output.stderr
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
fn v5_properties_topic_aliases_and_subscription_ids_pass_through() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-v5")?;
    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let sub = mosquitto_sub(
        &gateway,
        &[
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            "v5/#",
            "-C",
            "1",
            "-W",
            "15",
            "-D",
            "subscribe",
            "subscription-identifier",
            "7",
            "-F",
            "%t|%p|%C|%R|%D|%S|%P",
        ],
    )?;
    mosquitto_pub(
        &gateway,
        &[
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            "v5/dev",
            "-m",
            "hello",
            "-D",
            "publish",
            "topic-alias",
            "3",
            "-D",
            "publish",
            "content-type",
            "text/plain",
            "-D",
            "publish",
            "response-topic",
            "v5/replies",
            "-D",
            "publish",
            "correlation-data",
            "c42",
            "-D",
            "publish",
            "user-property",
            "site",
            "north",
        ],
    )?;
    let output = sub.finish()?;
    assert_eq!(
        output.stdout.trim_end(),
        "v5/dev|hello|text/plain|v5/replies|c42|7|site:north"
    );
    Ok(())
}

#[test]
fn password_file_users_connect_and_others_are_refused() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-auth")?;
    let passwd = dir.path().join("passwd");
    let mut child = Command::new(tern_binary()?)
        .args(["passwd", &passwd.display().to_string(), "alice"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(b"wonderland\n")?;
    assert!(child.wait()?.success());
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt.auth]\nallow_anonymous = \"never\"\npassword_file = \"{}\"\n",
            passwd.display()
        ),
    )?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        ..ServeOptions::default()
    };
    let gateway = Gateway::start(dir.path(), &options)?;
    for version in ["mqttv311", "mqttv5"] {
        let ok = [
            "-V",
            version,
            "-q",
            "1",
            "-t",
            "a",
            "-m",
            "x",
            "-u",
            "alice",
            "-P",
            "wonderland",
        ];
        mosquitto_pub(&gateway, &ok)?;
        let wrong = [
            "-V", version, "-t", "a", "-m", "x", "-u", "alice", "-P", "guess",
        ];
        let output = mosquitto("mosquitto_pub", gateway.mqtt, &wrong)?;
        assert!(
            !output.status.success(),
            "{version}: wrong password accepted"
        );
        let anonymous = ["-V", version, "-t", "a", "-m", "x"];
        let output = mosquitto("mosquitto_pub", gateway.mqtt, &anonymous)?;
        assert!(!output.status.success(), "{version}: anonymous accepted");
        let stderr = String::from_utf8_lossy(&output.stderr).to_lowercase();
        assert!(stderr.contains("not authori"), "{version}: {stderr}");
    }
    Ok(())
}

#[test]
fn acl_rules_limit_publish_and_subscribe_per_client() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-acl")?;
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        "[[mqtt.acl]]\ntopic = \"devices/%c/#\"\naccess = \"readwrite\"\n",
    )?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],

        ..ServeOptions::default()
    };
    let mut gateway = Gateway::start(dir.path(), &options)?;
    let mut v5 = RawClient::connect(gateway.mqtt, "d1", 30, true, true)?;
    assert_eq!(v5.publish_qos1("devices/d1/temp", b"ok", 1)?, 0);
    assert_eq!(
        v5.publish_qos1("devices/d2/temp", b"no", 2)?,
        0x87,
        "not authorized"
    );
    assert_eq!(v5.subscribe("devices/d1/#", 1, 3)?, 1);
    assert_eq!(v5.subscribe("devices/#", 1, 4)?, 0x87);
    let mut v4 = RawClient::connect(gateway.mqtt, "d3", 30, true, false)?;
    assert_eq!(v4.subscribe("devices/d1/#", 1, 1)?, 0x80);
    assert_eq!(
        v4.publish_qos1("devices/d1/x", b"no", 2)?,
        0,
        "3.1.1 has no refusal code: a plain PUBACK, as Mosquitto sends"
    );
    assert_eq!(v4.publish_qos1("devices/d3/x", b"ok too", 3)?, 0);
    gateway.stop()?;
    let records = read_log(dir.path(), "mqtt")?;
    let values: Vec<&str> = records.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(values, ["ok", "ok too"], "refused publishes are not stored");
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
    gateway.stop()?;

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
    gateway.stop()?;

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
            // A connection error: rumqttc reconnects on the next poll; pause between retries.
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
        let mut publisher = RawClient::connect(gateway.mqtt, "", 30, true, false)?;
        assert_eq!(
            publisher.publish_qos1("jobs/new", payload.as_bytes(), 1)?,
            0
        );
        publisher.disconnect()?;
    }
    gateway.stop()?;

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
    let output = sub.finish()?;
    assert_eq!(output.stdout, "wills/dev-9 offline\n");
    Ok(())
}

#[test]
fn keep_alive_is_enforced_at_one_and_a_half_times_its_value() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-keepalive")?;
    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mut client = RawClient::connect(gateway.mqtt, "sleepy", 2, true, false)?;
    let waited = client.closed_within(Duration::from_secs(6))?;
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
    let mut good = RawClient::connect(gateway.mqtt, "good", 30, true, false)?;
    let mut bad = RawClient::connect(gateway.mqtt, "bad", 30, true, false)?;
    bad.write_raw(&[0x32, 0x03, 0xff, 0xff, 0x00])?;
    bad.closed_within(Duration::from_secs(5))?;
    let mut huge = RawClient::connect(gateway.mqtt, "huge", 30, true, true)?;
    huge.write_raw(&[0x30, 0xff, 0xff, 0xff, 0x7f])?;
    let (first, reason) = huge.read_packet()?;
    assert_eq!(
        (first, reason),
        (0xe0, vec![0x95, 0]),
        "MQTT 5 DISCONNECT: packet too large"
    );
    huge.closed_within(Duration::from_secs(5))?;
    assert_eq!(good.publish_qos1("still/fine", b"yes", 1)?, 0);
    let (status, metrics) = gateway.admin_get("/metrics")?;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("tern_mqtt_malformed_packets_total 2"),
        "{metrics}"
    );
    gateway.stop()?;
    assert!(
        !gateway
            .stderr_lines()
            .iter()
            .any(|l| l.contains("panicked"))
    );
    Ok(())
}
