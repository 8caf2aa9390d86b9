//! Deliveries against the real binary and log: outgoing QoS 2 (mosquitto_sub in MQTT 3.1.1 and
//! 5, and the PUBREC → PUBREL → PUBCOMP bytes with a raw client, resent across a reconnect),
//! outbound topic aliases (on the wire, and through rumqttc's MQTT 5 client, which refuses an
//! alias it was never given; libmosquitto 2.0.11 cannot receive aliases at all), the inbound
//! Receive Maximum (DISCONNECT 0x93 for a client beyond it, nothing for compliant
//! mosquitto_pub), and DUP on deliveries repeated after a gateway SIGKILL. The MQTT 5-only
//! features are in `mqtt_delivery/v5.rs`.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, MosquittoSub, ServeOptions, TempDir};

mod v5;

/// A two-byte integer in network order.
fn be(value: u16) -> [u8; 2] {
    [(value >> 8) as u8, value as u8]
}

/// A PUBLISH from tern as it was on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wire {
    first: u8,
    topic: String,
    pkid: u16,
    alias: Option<u16>,
    payload: String,
}

impl Wire {
    fn dup(&self) -> bool {
        self.first & 0x08 != 0
    }
    fn qos(&self) -> u8 {
        (self.first >> 1) & 3
    }
}

/// Reads the next packet, which must be a PUBLISH, without acknowledging it.
fn next_wire(client: &mut RawClient, v5: bool) -> anyhow::Result<Wire> {
    let (first, body) = client.read_packet()?;
    if first >> 4 != 3 {
        bail!("expected PUBLISH, got {first:#x} {body:?}");
    }
    let short = || anyhow::anyhow!("short PUBLISH {body:?}");
    let at_u16 = |at: usize| -> anyhow::Result<u16> {
        let bytes = body.get(at..at + 2).ok_or_else(short)?;
        Ok(u16::from(bytes[0]) << 8 | u16::from(bytes[1]))
    };
    let topic_len = usize::from(at_u16(0)?);
    let topic = String::from_utf8_lossy(body.get(2..2 + topic_len).ok_or_else(short)?);
    let mut at = 2 + topic_len;
    let mut pkid = 0;
    if (first >> 1) & 3 > 0 {
        pkid = at_u16(at)?;
        at += 2;
    }
    let mut alias = None;
    if v5 {
        let len = usize::from(*body.get(at).ok_or_else(short)?);
        let properties = body.get(at + 1..at + 1 + len).ok_or_else(short)?;
        alias = topic_alias(properties);
        at += 1 + len;
    }
    Ok(Wire {
        first,
        topic: topic.into_owned(),
        pkid,
        alias,
        payload: String::from_utf8_lossy(body.get(at..).ok_or_else(short)?).into_owned(),
    })
}

/// The Topic Alias (0x23) among PUBLISH properties, skipping the others tern may send.
fn topic_alias(mut properties: &[u8]) -> Option<u16> {
    while let [id, rest @ ..] = properties {
        let skip = match id {
            0x23 => {
                return rest
                    .get(..2)
                    .map(|b| u16::from(b[0]) << 8 | u16::from(b[1]));
            }
            0x01 => 1,
            0x02 => 4,
            0x0b => rest.iter().position(|b| b & 0x80 == 0)? + 1,
            0x03 | 0x08 | 0x09 => 2 + usize::from(u16::from(rest[0]) << 8 | u16::from(rest[1])),
            _ => return None,
        };
        properties = rest.get(skip..)?;
    }
    None
}

fn ack(client: &mut RawClient, first: u8, pkid: u16) -> anyhow::Result<()> {
    client.write_packet(first, &be(pkid))
}

fn expect_packet(client: &mut RawClient, first: u8, pkid: u16) -> anyhow::Result<()> {
    let (got, body) = client.read_packet()?;
    if got != first || body.get(..2) != Some(&be(pkid)[..]) {
        bail!("expected {first:#x} for {pkid}, got {got:#x} {body:?}");
    }
    Ok(())
}

/// PINGREQ → PINGRESP: everything sent before has been handled (a takeover by the next
/// connection could otherwise overtake unread packets).
fn settled(client: &mut RawClient) -> anyhow::Result<()> {
    client.write_packet(0xc0, &[])?;
    let (first, body) = client.read_packet()?;
    if first != 0xd0 {
        bail!("expected PINGRESP, got {first:#x} {body:?}");
    }
    Ok(())
}

/// Publishes at QoS 2 through the whole PUBLISH → PUBREC → PUBREL → PUBCOMP flow.
fn publish_qos2(
    client: &mut RawClient,
    topic: &str,
    payload: &str,
    pkid: u16,
) -> anyhow::Result<()> {
    client.publish(topic, payload.as_bytes(), 2, pkid, false)?;
    expect_packet(client, 0x50, pkid)?;
    client.write_packet(0x62, &be(pkid))?;
    expect_packet(client, 0x70, pkid)
}

/// MQTT 5 CONNECT properties: session expiry (0x11) and optionally Topic Alias Maximum (0x22).
fn v5_properties(expiry: u32, aliases: Option<u16>) -> Vec<u8> {
    let mut properties = vec![0x11];
    properties.extend_from_slice(&[be((expiry >> 16) as u16), be(expiry as u16)].concat());
    if let Some(max) = aliases {
        properties.push(0x22);
        properties.extend_from_slice(&be(max));
    }
    properties
}

fn connect(
    addr: SocketAddr,
    id: &str,
    v5: bool,
    aliases: Option<u16>,
) -> anyhow::Result<RawClient> {
    let properties = v5.then(|| v5_properties(600, aliases));
    Ok(RawClient::connect_with(addr, id, 60, false, properties.as_deref())?.0)
}

fn gateway_with(dir: &TempDir, toml: &str) -> anyhow::Result<Gateway> {
    let config = dir.path().join("tern.toml");
    std::fs::write(&config, toml)?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        ..ServeOptions::default()
    };
    Gateway::start(dir.path(), &options)
}

/// Runs mosquitto_pub with one message per line of `lines` (`-l`); fails unless it succeeds.
fn mosquitto_pub_lines(addr: SocketAddr, args: &[&str], lines: &[String]) -> anyhow::Result<()> {
    let mut child = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-l"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run mosquitto_pub (scripts/ensure-deps.sh installs it)")?;
    let mut stdin = child.stdin.take().context("mosquitto_pub stdin")?;
    stdin.write_all(lines.join("\n").as_bytes())?;
    stdin.write_all(b"\n")?;
    drop(stdin);
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "mosquitto_pub failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

fn sub_output(sub: MosquittoSub) -> anyhow::Result<Vec<String>> {
    let output = sub.finish()?;
    if !output.status.success() {
        bail!("mosquitto_sub failed: {}", output.stderr);
    }
    Ok(output.stdout.lines().map(str::to_owned).collect())
}

#[test]
fn mosquitto_sub_gets_qos2_deliveries_exactly_once_in_v311_and_v5() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-qos2-out")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    for version in ["mqttv311", "mqttv5"] {
        let filter = format!("q2/{version}/#");
        let sub = MosquittoSub::start(
            gateway.mqtt,
            &[
                "-V", version, "-q", "2", "-t", &filter, "-F", "%q %t %p", "-C", "50", "-W", "30",
            ],
        )?;
        let lines: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
        let topic = format!("q2/{version}/x");
        mosquitto_pub_lines(
            gateway.mqtt,
            &["-V", version, "-q", "2", "-t", &topic],
            &lines,
        )?;
        let got = sub_output(sub)?;
        let expected: Vec<String> = lines.iter().map(|m| format!("2 {topic} {m}")).collect();
        assert_eq!(
            got, expected,
            "{version}: every message once, at QoS 2, in order"
        );
    }
    gateway.stop()
}

/// Across a reconnect and a process crash (SIGKILL) of tern; power cuts are tern-log's
/// fault-injecting file system's business (`gateway/log/src/tests/crash.rs`).
#[test]
fn released_qos2_deliveries_are_resent_as_pubrel_after_a_reconnect_and_a_sigkill()
-> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-qos2-resend")?;
    for v5 in [false, true] {
        let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
        let mut publisher = RawClient::connect(gateway.mqtt, "q2-pub", 60, true, false)?;
        let id = format!("q2-sub-{v5}");
        let mut sub = connect(gateway.mqtt, &id, v5, None)?;
        let filter = format!("rel/{v5}/#");
        assert_eq!(sub.subscribe(&filter, 2, 1)?, 2, "QoS 2 is granted");
        let topic = format!("rel/{v5}/x");
        publish_qos2(&mut publisher, &topic, "a", 1)?;
        publish_qos2(&mut publisher, &topic, "b", 2)?;
        let a = next_wire(&mut sub, v5)?;
        let b = next_wire(&mut sub, v5)?;
        let payloads = (a.qos(), a.payload.as_str(), b.payload.as_str());
        assert_eq!(payloads, (2, "a", "b"));
        ack(&mut sub, 0x50, a.pkid)?;
        expect_packet(&mut sub, 0x62, a.pkid)?;
        drop(sub);

        let mut sub = connect(gateway.mqtt, &id, v5, None)?;
        expect_packet(&mut sub, 0x62, a.pkid)?;
        let again = next_wire(&mut sub, v5)?;
        let resent = again.dup() && again.pkid == b.pkid && again.payload == "b";
        assert!(resent, "b is re-sent as a PUBLISH with DUP: {again:?}");
        ack(&mut sub, 0x50, b.pkid)?;
        expect_packet(&mut sub, 0x62, b.pkid)?;
        gateway.signal(libc::SIGKILL)?;
        gateway.wait_exit(Duration::from_secs(10))?;

        let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
        let mut sub = connect(gateway.mqtt, &id, v5, None)?;
        let mut pkids = [a.pkid, b.pkid];
        pkids.sort_unstable();
        for pkid in pkids {
            expect_packet(&mut sub, 0x62, pkid)?;
        }
        sub.set_timeout(Duration::from_millis(700))?;
        let stray = sub.read_packet();
        assert!(stray.is_err(), "after SIGKILL only PUBRELs: {stray:?}");
        sub.set_timeout(Duration::from_secs(10))?;
        for pkid in pkids {
            ack(&mut sub, 0x70, pkid)?;
        }
        settled(&mut sub)?;
        sub.disconnect()?;
        gateway.stop()?;

        let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
        let mut sub = connect(gateway.mqtt, &id, v5, None)?;
        sub.set_timeout(Duration::from_millis(700))?;
        let stray = sub.read_packet();
        assert!(stray.is_err(), "nothing is resent after PUBCOMP: {stray:?}");
        gateway.stop()?;
    }
    Ok(())
}

/// A process crash (SIGKILL) mid-delivery; power cuts are tern-log's fault-injecting file
/// system's business (`gateway/log/src/tests/crash.rs`).
#[test]
fn deliveries_repeated_after_a_gateway_sigkill_carry_dup() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-dup-restart")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    for (v5, qos) in [(false, 1u8), (true, 2u8)] {
        let id = format!("dup-sub-{v5}");
        let mut sub = connect(gateway.mqtt, &id, v5, None)?;
        assert_eq!(sub.subscribe(&format!("dup/{v5}/#"), qos, 1)?, qos);
        sub.disconnect()?;
    }
    let mut publisher = RawClient::connect(gateway.mqtt, "dup-pub", 60, true, false)?;
    for i in 0..3u16 {
        let payload = format!("d{i}");
        assert_eq!(
            publisher.publish_qos1("dup/false/x", payload.as_bytes(), i + 1)?,
            0
        );
        publish_qos2(&mut publisher, "dup/true/x", &payload, i + 10)?;
    }
    for (v5, qos) in [(false, 1u8), (true, 2u8)] {
        let mut sub = connect(gateway.mqtt, &format!("dup-sub-{v5}"), v5, None)?;
        for i in 0..3 {
            let wire = next_wire(&mut sub, v5)?;
            assert_eq!(
                (wire.qos(), wire.dup(), wire.payload.clone()),
                (qos, false, format!("d{i}"))
            );
        }
    }
    gateway.signal(libc::SIGKILL)?;
    gateway.wait_exit(Duration::from_secs(10))?;

    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    for (v5, qos) in [(false, 1u8), (true, 2u8)] {
        let mut sub = connect(gateway.mqtt, &format!("dup-sub-{v5}"), v5, None)?;
        let mut repeated = Vec::new();
        for i in 0..3 {
            let wire = next_wire(&mut sub, v5)?;
            let want = (qos, true, format!("d{i}"));
            assert_eq!(
                (wire.qos(), wire.dup(), wire.payload.clone()),
                want,
                "v5: {v5}"
            );
            repeated.push(wire.pkid);
        }
        for pkid in repeated {
            match qos {
                1 => ack(&mut sub, 0x40, pkid)?,
                _ => {
                    ack(&mut sub, 0x50, pkid)?;
                    expect_packet(&mut sub, 0x62, pkid)?;
                    ack(&mut sub, 0x70, pkid)?;
                }
            }
        }
        settled(&mut sub)?;
        sub.disconnect()?;
    }
    gateway.stop()?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mut sub = connect(gateway.mqtt, "dup-sub-false", false, None)?;
    sub.set_timeout(Duration::from_millis(700))?;
    assert!(
        sub.read_packet().is_err(),
        "acknowledged deliveries are not repeated"
    );
    gateway.stop()
}
