//! A client that breaks the protocol, against the real binary with hand-written packets: every
//! MQTT 5 violation the spec names closes the connection with its reason code (CONNACK before
//! the session, DISCONNECT after), 3.1.1 violations close it, client ids longer than a
//! session's cursor names allow are refused at CONNECT, and no log line carries a client's
//! unbounded input or an attempted username. The limits under load are in `mqtt_abuse_limits`.

use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir};

pub(crate) fn gateway(dir: &TempDir, config: &str) -> anyhow::Result<Gateway> {
    let file = dir.path().join("tern.toml");
    std::fs::write(&file, config)?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), file.display().to_string()],
        ..ServeOptions::default()
    };
    Gateway::start(&dir.path().join("data"), &options)
}

/// A length-prefixed MQTT string or binary field.
pub(crate) fn field(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&wire_u16(len));
    out.extend_from_slice(bytes);
}

/// A two-byte integer as MQTT writes it (most significant byte first).
pub(crate) fn wire_u16(value: u16) -> [u8; 2] {
    [(value >> 8) as u8, value as u8]
}

/// A CONNECT case: what it breaks, its flags, properties and client id, the reason code.
type ConnectCase = (&'static str, u8, &'static [u8], &'static [u8], u8);

/// A CONNECT body: protocol `level`, `flags`, MQTT 5 `properties` (level 5 only), the client
/// id, and a username/password when their flags are set.
pub(crate) fn connect_body(level: u8, flags: u8, properties: &[u8], client_id: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    field(&mut body, b"MQTT");
    body.extend_from_slice(&[level, flags, 0, 60]);
    if level == 5 {
        body.push(u8::try_from(properties.len()).unwrap_or(0));
        body.extend_from_slice(properties);
    }
    field(&mut body, client_id);
    if flags & 0x80 != 0 {
        field(&mut body, b"user");
    }
    if flags & 0x40 != 0 {
        field(&mut body, b"pass");
    }
    body
}

/// Sends a CONNECT body; returns the CONNACK's reason code, `None` if the socket closed
/// without one.
pub(crate) fn connack_code(
    gateway: &Gateway,
    body: &[u8],
    v5: bool,
) -> anyhow::Result<(RawClient, Option<u8>)> {
    let mut client = RawClient::open(gateway.mqtt, v5)?;
    client.write_packet(0x10, body)?;
    match client.read_packet() {
        Ok((0x20, connack)) => {
            let code = connack.get(1).copied().context("short CONNACK")?;
            Ok((client, Some(code)))
        }
        Ok((first, _)) => bail!("expected CONNACK, got {first:#x}"),
        Err(_) => Ok((client, None)),
    }
}

/// Reads until DISCONNECT; returns its reason code.
fn disconnect_reason(client: &mut RawClient) -> anyhow::Result<u8> {
    loop {
        let (first, body) = client.read_packet().context("no DISCONNECT before close")?;
        if first == 0xe0 {
            return Ok(body.first().copied().unwrap_or(0));
        }
    }
}

const CLEAN: u8 = 0x02;

#[test]
fn every_mqtt5_violation_closes_with_its_reason_code() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-codes")?;
    let mut gateway = gateway(&dir, "")?;
    let connects: [ConnectCase; 7] = [
        (
            "duplicated property",
            CLEAN,
            &[0x11, 0, 0, 0, 9, 0x11, 0, 0, 0, 9],
            b"c",
            0x82,
        ),
        ("Receive Maximum 0", CLEAN, &[0x21, 0, 0], b"c", 0x82),
        (
            "Maximum Packet Size 0",
            CLEAN,
            &[0x27, 0, 0, 0, 0],
            b"c",
            0x82,
        ),
        (
            "Request Problem Information 2",
            CLEAN,
            &[0x17, 2],
            b"c",
            0x82,
        ),
        (
            "Authentication Method",
            CLEAN,
            &[0x15, 0, 5, b'S', b'C', b'R', b'A', b'M'],
            b"c",
            0x8c,
        ),
        ("NUL in the client id", CLEAN, &[], b"a\0b", 0x81),
        ("reserved CONNECT flag", CLEAN | 0x01, &[], b"c", 0x81),
    ];
    for (case, flags, properties, id, expected) in connects {
        let (mut client, code) =
            connack_code(&gateway, &connect_body(5, flags, properties, id), true)?;
        assert_eq!(code, Some(expected), "{case}");
        client
            .closed_within(Duration::from_secs(5))
            .with_context(|| format!("{case}: still open"))?;
    }
    // After CONNECT: (case, first byte, body, reason code of the DISCONNECT).
    let packets: [(&str, u8, Vec<u8>, u8); 8] = [
        (
            "PUBLISH with a Subscription Identifier",
            0x30,
            publish(&[0x0b, 1]),
            0x82,
        ),
        (
            "Payload Format Indicator 7",
            0x30,
            publish(&[0x01, 7]),
            0x82,
        ),
        (
            "Response Topic with a wildcard",
            0x30,
            publish(&[0x08, 0, 3, b'a', b'/', b'#']),
            0x82,
        ),
        ("QoS 0 with DUP", 0x38, publish(&[]), 0x81),
        (
            "SUBSCRIBE with packet id 0",
            0x82,
            vec![0, 0, 0, 0, 1, b't', 0],
            0x81,
        ),
        (
            "Subscription Identifier 0",
            0x82,
            vec![0, 1, 2, 0x0b, 0, 0, 1, b't', 0],
            0x82,
        ),
        (
            "reserved subscription option bits",
            0x82,
            vec![0, 1, 0, 0, 1, b't', 0xc0],
            0x81,
        ),
        ("UNSUBSCRIBE without filters", 0xa2, vec![0, 1, 0], 0x82),
    ];
    for (i, (case, first, body, expected)) in packets.into_iter().enumerate() {
        let id = format!("abuse-{i}");
        let mut client = RawClient::connect(gateway.mqtt, &id, 60, true, true)?;
        client.write_packet(first, &body)?;
        let reason = disconnect_reason(&mut client).with_context(|| case.to_owned())?;
        assert_eq!(reason, expected, "{case}");
        client
            .closed_within(Duration::from_secs(5))
            .with_context(|| format!("{case}: still open"))?;
    }
    // MQTT 3.1.1: a password without a username is closed without CONNACK.
    let (mut client, code) =
        connack_code(&gateway, &connect_body(4, CLEAN | 0x40, &[], b"c"), false)?;
    assert_eq!(
        code, None,
        "3.1.1 password flag without username got a CONNACK"
    );
    client.closed_within(Duration::from_secs(5))?;
    // The server is still fine for a well-behaved client.
    let mut good = RawClient::connect(gateway.mqtt, "good", 60, true, true)?;
    assert_eq!(good.subscribe("t", 1, 1)?, 1);
    gateway.stop()
}

/// A QoS 0 PUBLISH body on topic `t` with MQTT 5 `properties`.
fn publish(properties: &[u8]) -> Vec<u8> {
    let mut body = vec![0, 1, b't', u8::try_from(properties.len()).unwrap_or(0)];
    body.extend_from_slice(properties);
    body.extend_from_slice(b"payload");
    body
}

#[test]
fn client_ids_longer_than_a_session_can_name_are_refused_and_never_logged() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-abuse-ids")?;
    let mut gateway = gateway(&dir, "")?;
    // The longest id a persistent session can hold: its SUBSCRIBE works.
    let longest = "i".repeat(1014);
    let mut client = RawClient::connect(gateway.mqtt, &longest, 60, false, false)?;
    assert_eq!(client.subscribe("t/#", 1, 1)?, 1);
    client.disconnect()?;
    let long = "l".repeat(1015);
    let (_, code) = connack_code(&gateway, &connect_body(5, 0, &[], long.as_bytes()), true)?;
    assert_eq!(code, Some(0x85), "MQTT 5: Client Identifier not valid");
    let (_, code) = connack_code(&gateway, &connect_body(4, 0, &[], long.as_bytes()), false)?;
    assert_eq!(code, Some(2), "MQTT 3.1.1: identifier rejected");
    // A 60 KB id, in both versions, with a persistent session and a SUBSCRIBE if let in.
    let huge = "h".repeat(60_000);
    for v5 in [false, true] {
        if let Ok(mut client) = RawClient::connect(gateway.mqtt, &huge, 60, false, v5) {
            let _ = client.subscribe("t/#", 1, 1);
        }
    }
    let probe = RawClient::connect(gateway.mqtt, "after", 60, true, false)?;
    probe.disconnect()?;
    gateway.stop()?;
    let longest_line = gateway
        .stderr_lines()
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(0);
    assert!(
        longest_line < 1000,
        "a log line of {longest_line} bytes: client input reached the log unbounded"
    );
    Ok(())
}
