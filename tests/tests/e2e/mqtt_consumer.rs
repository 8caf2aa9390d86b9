//! The consumer model for MQTT subscribers against the real binary, with rumqttc's MQTT 5
//! client, Debian's mosquitto_sub (`-D subscribe user-property`) and the raw-socket client:
//! Pulsar's subscription types for shared groups (failover takeover without loss, exclusive
//! refusal with SUBACK 0x97 / 0x80, key_shared keys staying put when a member leaves) and replay
//! with the `tern-start` user property (earliest, an offset, a time; bad values refused with
//! 0x83 and a reason string, left out when the client asked for no problem information; a
//! persistent session's cursor wins).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{SubscribeProperties, SubscribeReasonCode};
use rumqttc::v5::{Client, Connection, Event, Incoming, MqttOptions};
use tern_tests::raw_mqtt::{RawClient, Received};
use tern_tests::{Gateway, MosquittoSub, ServeOptions, TempDir, now_ms, wait_until};

use super::mqtt_shared::collect;

fn gateway_with(dir: &TempDir, toml: &str) -> anyhow::Result<Gateway> {
    let config = dir.path().join("tern.toml");
    std::fs::write(&config, toml)?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        ..ServeOptions::default()
    };
    Gateway::start(dir.path(), &options)
}

/// Publishes `m{i}` for every `i` of `range` on `topic(i)` at QoS 1 (each PUBACK awaited).
fn publish(
    gateway: &Gateway,
    range: std::ops::Range<usize>,
    topic: impl Fn(usize) -> String,
) -> anyhow::Result<()> {
    let mut publisher = RawClient::connect(gateway.mqtt, "consumer-pub", 60, true, false)?;
    for i in range {
        let pkid = u16::try_from(i % 60_000 + 1)?;
        let code = publisher.publish_qos1(&topic(i), format!("m{i}").as_bytes(), pkid)?;
        assert_eq!(code, 0, "publish {i} refused");
    }
    publisher.disconnect()
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

/// rumqttc's MQTT 5 client, driven by the test thread.
struct V5 {
    client: Client,
    events: Connection,
    /// (payload, DUP) of publishes that arrived while waiting for a SUBACK.
    early: Vec<(String, bool)>,
}

impl V5 {
    fn connect(gateway: &Gateway, id: &str, persistent: bool) -> Self {
        let mut options = MqttOptions::new(id, "127.0.0.1", gateway.mqtt.port());
        options.set_keep_alive(Duration::from_secs(30));
        if persistent {
            options.set_clean_start(false);
            options.set_session_expiry_interval(Some(3600));
        }
        let (client, events) = Client::new(options, 64);
        Self {
            client,
            events,
            early: Vec::new(),
        }
    }

    /// SUBSCRIBE at QoS 1 (with `tern-start` = `start` when given); the SUBACK's reason code
    /// and reason string.
    fn subscribe(
        &mut self,
        filter: &str,
        start: Option<&str>,
    ) -> anyhow::Result<(SubscribeReasonCode, Option<String>)> {
        match start {
            Some(start) => {
                let properties = SubscribeProperties {
                    id: None,
                    user_properties: vec![("tern-start".to_owned(), start.to_owned())],
                };
                self.client
                    .subscribe_with_properties(filter, QoS::AtLeastOnce, properties)?;
            }
            None => self.client.subscribe(filter, QoS::AtLeastOnce)?,
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.events.recv_timeout(Duration::from_millis(200)) {
                Ok(Ok(Event::Incoming(Incoming::SubAck(ack)))) => {
                    let code = ack.return_codes.first().copied();
                    let reason = ack.properties.and_then(|p| p.reason_string);
                    match code {
                        Some(code) => return Ok((code, reason)),
                        None => bail!("SUBACK without a reason code"),
                    }
                }
                Ok(Ok(Event::Incoming(Incoming::Publish(p)))) => {
                    let payload = String::from_utf8_lossy(&p.payload).into_owned();
                    self.early.push((payload, p.dup));
                }
                Ok(Err(err)) => bail!("rumqttc: {err}"),
                _ => {}
            }
        }
        bail!("no SUBACK for {filter}")
    }

    /// (payload, DUP) of the publishes that arrive until none came for `quiet`, or `most` came.
    fn received(&mut self, most: usize, quiet: Duration) -> anyhow::Result<Vec<(String, bool)>> {
        let mut got = std::mem::take(&mut self.early);
        let mut last = Instant::now();
        while got.len() < most && last.elapsed() < quiet {
            match self.events.recv_timeout(Duration::from_millis(100)) {
                Ok(Ok(Event::Incoming(Incoming::Publish(p)))) => {
                    got.push((String::from_utf8_lossy(&p.payload).into_owned(), p.dup));
                    last = Instant::now();
                }
                Ok(Err(err)) => bail!("rumqttc: {err}"),
                _ => {}
            }
        }
        Ok(got)
    }

    fn payloads(&mut self, most: usize, quiet: Duration) -> anyhow::Result<Vec<String>> {
        Ok(self
            .received(most, quiet)?
            .into_iter()
            .map(|(payload, _)| payload)
            .collect())
    }

    /// DISCONNECT, then the event loop until the connection is closed.
    fn disconnect(mut self) -> anyhow::Result<()> {
        self.client.disconnect()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.events.recv_timeout(Duration::from_millis(200)) {
                Ok(Err(_)) | Err(rumqttc::v5::RecvTimeoutError::Disconnected) => return Ok(()),
                Ok(Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect))) => return Ok(()),
                _ => {}
            }
        }
        bail!("rumqttc did not disconnect")
    }
}

fn raw_payloads(received: &[Received]) -> Vec<String> {
    received
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect()
}

/// Runs mosquitto_sub (MQTT 5, `-d`) until it exits by itself (`-C`/`-W` in `args`); its stdout.
fn mosquitto_sub(gateway: &Gateway, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
        .args(["-V", "mqttv5", "-d"])
        .args(args)
        .output()?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn failover_hands_everything_to_one_member_and_the_next_takes_over_without_loss()
-> anyhow::Result<()> {
    let dir = TempDir::new("types-failover")?;
    let toml = "[[mqtt.shared_group]]\nname = \"hist-*\"\ntype = \"failover\"\n";
    let mut gateway = gateway_with(&dir, toml)?;
    let filter = "$share/hist-a/work/#";
    let mut active = RawClient::connect(gateway.mqtt, "fo-active", 60, true, true)?;
    assert_eq!(active.subscribe(filter, 1, 1)?, 1);
    let mut standby = V5::connect(&gateway, "fo-standby", false);
    let (code, _) = standby.subscribe(filter, None)?;
    assert_eq!(code, SubscribeReasonCode::Success(QoS::AtLeastOnce));
    publish(&gateway, 0..10, |i| format!("work/{i}"))?;

    let mut acked = Vec::new();
    for _ in 0..4 {
        acked.push(active.next_publish()?);
    }
    let held = collect(&mut active, false, Duration::from_secs(1))?;
    assert_eq!(
        raw_payloads(&acked),
        names(0..4),
        "the active member gets all"
    );
    assert_eq!(raw_payloads(&held), names(4..10), "in order");
    let idle = standby.payloads(10, Duration::from_secs(1))?;
    assert!(
        idle.is_empty(),
        "the standby got {idle:?} while the active member lived"
    );

    drop(active);
    let taken = standby.received(6, Duration::from_secs(5))?;
    let expected: Vec<(String, bool)> = names(4..10).into_iter().map(|m| (m, true)).collect();
    assert_eq!(
        taken, expected,
        "the unacknowledged ones, in order, with DUP"
    );
    publish(&gateway, 10..15, |i| format!("work/{i}"))?;
    let then = standby.payloads(5, Duration::from_secs(5))?;
    assert_eq!(then, names(10..15));
    let everything: BTreeSet<String> = raw_payloads(&acked)
        .into_iter()
        .chain(taken.into_iter().map(|(m, _)| m))
        .chain(then)
        .collect();
    assert_eq!(
        everything,
        names(0..15).into_iter().collect(),
        "nothing lost"
    );
    gateway.stop()
}

#[test]
fn an_exclusive_group_refuses_a_second_session_with_0x97_and_0x80() -> anyhow::Result<()> {
    let dir = TempDir::new("types-exclusive")?;
    let mut gateway = gateway_with(&dir, "[mqtt]\nshared_type = \"exclusive\"\n")?;
    let filter = "$share/solo/ex/#";
    let mut holder = V5::connect(&gateway, "ex-holder", false);
    let (code, _) = holder.subscribe(filter, None)?;
    assert_eq!(code, SubscribeReasonCode::Success(QoS::AtLeastOnce));

    let mut second = V5::connect(&gateway, "ex-second", false);
    let (code, reason) = second.subscribe(filter, None)?;
    assert_eq!(code, SubscribeReasonCode::QuotaExceeded, "MQTT 5: 0x97");
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("exclusive"), "reason string: {reason:?}");
    let mosquitto = mosquitto_sub(
        &gateway,
        &["-i", "ex-mosq", "-t", filter, "-C", "1", "-W", "3"],
    )?;
    assert!(
        mosquitto.contains("Subscribed (mid: 1): 151"),
        "mosquitto_sub sees 0x97 (151): {mosquitto}"
    );
    let mut old = RawClient::connect(gateway.mqtt, "ex-311", 60, true, false)?;
    assert_eq!(old.subscribe(filter, 1, 1)?, 0x80, "MQTT 3.1.1: failure");

    publish(&gateway, 0..3, |i| format!("ex/{i}"))?;
    assert_eq!(holder.payloads(3, Duration::from_secs(5))?, names(0..3));
    assert!(second.payloads(3, Duration::from_secs(1))?.is_empty());
    holder.disconnect()?;
    // The holder's clean session ends (and lets go of the group) before its connection
    // leaves the gauge; `second` and `old` stay.
    gateway.wait_metric(
        "tern_mqtt_connections",
        "",
        "the holder's connection closed",
        Duration::from_secs(10),
        |open| open == Some(2),
    )?;
    let (code, _) = second.subscribe(filter, None)?;
    assert_eq!(
        code,
        SubscribeReasonCode::Success(QoS::AtLeastOnce),
        "free once the holding session ended"
    );
    gateway.stop()
}

#[test]
fn key_shared_keeps_each_key_on_its_member_and_moves_only_a_leavers_keys() -> anyhow::Result<()> {
    const KEYS: usize = 11;
    let dir = TempDir::new("types-key-shared")?;
    let mut gateway = gateway_with(&dir, "[mqtt]\nshared_type = \"key_shared\"\n")?;
    let filter = "$share/dash/dev/+/temp";
    let mut members = vec![
        (
            "ks-a",
            RawClient::connect(gateway.mqtt, "ks-a", 60, true, false)?,
        ),
        (
            "ks-b",
            RawClient::connect(gateway.mqtt, "ks-b", 60, true, true)?,
        ),
        (
            "ks-c",
            RawClient::connect(gateway.mqtt, "ks-c", 60, true, true)?,
        ),
    ];
    for (_, member) in &mut members {
        assert_eq!(member.subscribe(filter, 1, 1)?, 1);
    }
    let topic = |i: usize| format!("dev/{}/temp", i % KEYS);
    publish(&gateway, 0..KEYS * 3, topic)?;
    let first = owners(&mut members)?;
    assert_eq!(first.values().map(Vec::len).sum::<usize>(), KEYS * 3);
    let by_member: BTreeMap<&str, usize> = first.values().fold(BTreeMap::new(), |mut m, v| {
        *m.entry(v[0].0).or_default() += 1;
        m
    });
    assert!(
        by_member.len() >= 2,
        "every key on one member: {by_member:?}"
    );
    let leaver = by_member
        .iter()
        .max_by_key(|(_, count)| **count)
        .map(|(name, _)| *name)
        .unwrap_or("ks-a");
    members.retain(|(name, _)| *name != leaver);
    gateway.wait_metric(
        "tern_mqtt_connections",
        "",
        "the leaver's connection closed",
        Duration::from_secs(10),
        |open| open == Some(2),
    )?;

    publish(&gateway, KEYS * 3..KEYS * 5, topic)?;
    let second = owners(&mut members)?;
    assert_eq!(second.values().map(Vec::len).sum::<usize>(), KEYS * 2);
    for (key, got) in &second {
        let before = first.get(key).map(|v| v[0].0);
        let now = got[0].0;
        if before != Some(leaver) {
            assert_eq!(Some(now), before, "{key} moved although its member stayed");
        }
    }
    let moved = second
        .keys()
        .filter(|k| first.get(*k).map(|v| v[0].0) == Some(leaver))
        .count();
    assert!(moved > 0, "the leaver owned no key");
    gateway.stop()
}

/// Per topic (key), the (member, message number) of every delivery; fails if a key reached two
/// members or arrived out of order.
fn owners(
    members: &mut [(&'static str, RawClient)],
) -> anyhow::Result<BTreeMap<String, Vec<(&'static str, usize)>>> {
    let mut by_key: BTreeMap<String, Vec<(&'static str, usize)>> = BTreeMap::new();
    for (name, member) in members.iter_mut() {
        for publish in collect(member, true, Duration::from_secs(2))? {
            let n: usize = String::from_utf8_lossy(&publish.payload)
                .trim_start_matches('m')
                .parse()?;
            by_key.entry(publish.topic).or_default().push((*name, n));
        }
    }
    for (key, got) in &by_key {
        let members: BTreeSet<&str> = got.iter().map(|(m, _)| *m).collect();
        assert_eq!(members.len(), 1, "{key} reached {members:?}");
        assert!(
            got.windows(2).all(|w| w[0].1 < w[1].1),
            "{key} out of order"
        );
    }
    Ok(by_key)
}

/// `ms` since the epoch as RFC 3339 UTC with milliseconds.
fn rfc3339(ms: i64) -> String {
    let (secs, millis) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

#[test]
fn replay_from_earliest_an_offset_or_a_time_delivers_exactly_those_records() -> anyhow::Result<()> {
    assert_eq!(rfc3339(1_764_608_400_250), "2025-12-01T17:00:00.250Z");
    let dir = TempDir::new("replay-starts")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    publish(&gateway, 0..5, |_| "rp/x".to_owned())?;
    // Every record so far was received before `boundary`; every later one at or after it.
    let boundary = now_ms() + 1;
    wait_until(
        Duration::from_secs(5),
        "the clock to pass the boundary",
        || Ok(now_ms() >= boundary),
    )?;
    publish(&gateway, 5..10, |_| "rp/x".to_owned())?;

    let earliest = ["-t", "rp/#", "-C", "10", "-W", "10", "-q", "1"];
    let mut args = vec![
        "-V",
        "mqttv5",
        "-i",
        "rp-early",
        "-D",
        "subscribe",
        "user-property",
    ];
    args.extend(["tern-start", "earliest"]);
    args.extend(earliest);
    let lines = MosquittoSub::start(gateway.mqtt, &args)?.finish()?.stdout;
    assert_eq!(lines.lines().collect::<Vec<_>>(), names(0..10), "earliest");

    let at = format!("time:{}", rfc3339(boundary));
    let args = [
        "-V",
        "mqttv5",
        "-i",
        "rp-time",
        "-D",
        "subscribe",
        "user-property",
        "tern-start",
        &at,
        "-t",
        "rp/#",
        "-C",
        "5",
        "-W",
        "10",
    ];
    let lines = MosquittoSub::start(gateway.mqtt, &args)?.finish()?.stdout;
    assert_eq!(lines.lines().collect::<Vec<_>>(), names(5..10), "{at}");

    let mut by_offset = V5::connect(&gateway, "rp-offset", false);
    let (code, reason) = by_offset.subscribe("rp/#", Some("offset:mqtt/0=3"))?;
    assert_eq!(
        (code, reason),
        (SubscribeReasonCode::Success(QoS::AtLeastOnce), None)
    );
    assert_eq!(
        by_offset.payloads(7, Duration::from_secs(5))?,
        names(3..10),
        "offset 3 on"
    );
    let mut by_ms = V5::connect(&gateway, "rp-ms", false);
    by_ms.subscribe("rp/#", Some(&format!("time:{boundary}")))?;
    assert_eq!(
        by_ms.payloads(5, Duration::from_secs(5))?,
        names(5..10),
        "ms since the epoch"
    );
    let mut plain = V5::connect(&gateway, "rp-plain", false);
    plain.subscribe("rp/#", None)?;
    assert!(
        plain.payloads(10, Duration::from_secs(1))?.is_empty(),
        "no start: the end"
    );
    gateway.stop()
}

#[test]
fn bad_start_values_get_0x83_with_a_reason_and_the_connection_stays() -> anyhow::Result<()> {
    let dir = TempDir::new("replay-bad")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    publish(&gateway, 0..3, |_| "rb/x".to_owned())?;
    let mut client = V5::connect(&gateway, "rb-client", false);
    let cases = [
        ("offset:0=99", "past the end 3"),
        ("yesterday", "expected earliest"),
        ("time:2025-13-40", "RFC 3339"),
        ("offset:7=0", "does not read"),
    ];
    for (value, says) in cases {
        let (code, reason) = client.subscribe("rb/#", Some(value))?;
        assert_eq!(code, SubscribeReasonCode::ImplementationSpecific, "{value}");
        let reason = reason.unwrap_or_default();
        assert!(reason.contains(says), "{value}: {reason:?}");
    }
    let shared = client.subscribe("$share/g/rb/#", Some("offset:0=99"))?;
    assert_eq!(
        shared.0,
        SubscribeReasonCode::ImplementationSpecific,
        "a new group too"
    );
    let mosquitto = mosquitto_sub(
        &gateway,
        &[
            "-i",
            "rb-mosq",
            "-t",
            "rb/#",
            "-D",
            "subscribe",
            "user-property",
            "tern-start",
            "bogus",
            "-C",
            "1",
            "-W",
            "3",
        ],
    )?;
    assert!(
        mosquitto.contains("Subscribed (mid: 1): 131"),
        "mosquitto_sub sees 0x83 (131): {mosquitto}"
    );
    let (code, _) = client.subscribe("rb/#", Some("earliest"))?;
    assert_eq!(code, SubscribeReasonCode::Success(QoS::AtLeastOnce));
    assert_eq!(
        client.payloads(3, Duration::from_secs(5))?,
        names(0..3),
        "still connected"
    );
    gateway.stop()
}

#[test]
fn a_persistent_session_keeps_its_cursor_whatever_tern_start_says() -> anyhow::Result<()> {
    let dir = TempDir::new("replay-keep")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    publish(&gateway, 0..5, |_| "rk/x".to_owned())?;
    let mut first = V5::connect(&gateway, "rk-keeper", true);
    first.subscribe("rk/#", Some("earliest"))?;
    assert_eq!(first.payloads(5, Duration::from_secs(5))?, names(0..5));
    let more = first.payloads(5, Duration::from_millis(500))?;
    assert!(more.is_empty(), "once each: {more:?}");
    first.disconnect()?;
    publish(&gateway, 5..8, |_| "rk/x".to_owned())?;

    let mut again = V5::connect(&gateway, "rk-keeper", true);
    let (code, reason) = again.subscribe("rk/#", Some("earliest"))?;
    assert_eq!(code, SubscribeReasonCode::Success(QoS::AtLeastOnce));
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains("ignored for mqtt/0"),
        "reason string: {reason:?}"
    );
    assert_eq!(
        again.payloads(10, Duration::from_secs(2))?,
        names(5..8),
        "on from the cursor, not from the earliest record"
    );
    gateway.stop()
}

/// A raw MQTT 5 SUBSCRIBE of `filter` at QoS 1 with the user property `tern-start` = `start`;
/// the SUBACK's body.
fn raw_subscribe_with_start(
    client: &mut RawClient,
    pkid: u16,
    filter: &str,
    start: &str,
) -> anyhow::Result<Vec<u8>> {
    // MQTT's two-byte lengths are big-endian on the wire.
    let pair = |value: u16| [(value >> 8) as u8, value as u8];
    let text = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&pair(u16::try_from(s.len()).unwrap_or(u16::MAX)));
        out.extend_from_slice(s.as_bytes());
    };
    let mut properties = vec![0x26];
    text(&mut properties, "tern-start");
    text(&mut properties, start);
    let mut body = pair(pkid).to_vec();
    body.push(u8::try_from(properties.len())?);
    body.extend_from_slice(&properties);
    text(&mut body, filter);
    body.push(1);
    client.write_packet(0x82, &body)?;
    let (kind, suback) = client.read_packet()?;
    assert_eq!(kind, 0x90, "SUBACK");
    Ok(suback)
}

#[test]
fn the_reason_string_is_left_out_when_the_client_asked_for_no_problem_information()
-> anyhow::Result<()> {
    let dir = TempDir::new("replay-quiet")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    // Request Problem Information (0x17) = 0.
    let (mut quiet, _) =
        RawClient::connect_with(gateway.mqtt, "rq-quiet", 60, true, Some(&[0x17, 0]))?;
    let suback = raw_subscribe_with_start(&mut quiet, 7, "rq/#", "bogus")?;
    assert_eq!(suback, [0, 7, 0, 0x83], "0x83 and no properties");
    let mut told = RawClient::connect(gateway.mqtt, "rq-told", 60, true, true)?;
    let suback = raw_subscribe_with_start(&mut told, 8, "rq/#", "bogus")?;
    assert_eq!(suback.get(..2), Some(&[0, 8][..]));
    let text = String::from_utf8_lossy(&suback);
    assert!(
        text.contains("expected earliest"),
        "a Reason String: {text:?}"
    );
    assert_eq!(suback.last(), Some(&0x83));
    gateway.stop()
}
