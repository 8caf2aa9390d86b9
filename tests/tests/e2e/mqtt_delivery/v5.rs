//! MQTT 5-only deliveries against the real binary: outbound topic aliases (on the wire, and
//! followed by rumqttc's MQTT 5 client) and the inbound Receive Maximum (DISCONNECT 0x93).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use rumqttc::v5::mqttbytes::QoS as V5QoS;
use rumqttc::v5::{Client as V5Client, Event as V5Event, Incoming as V5Incoming, MqttOptions};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir, read_log};

use super::{
    ack, connect, expect_packet, gateway_with, mosquitto_pub_lines, next_wire, publish_qos2,
};

#[test]
fn outbound_topic_aliases_stay_within_both_maxima_and_rumqttc_follows_them() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-out-alias")?;
    let mut gateway = gateway_with(&dir, "[mqtt]\noutbound_topic_aliases = 2\n")?;
    let mut sub = connect(gateway.mqtt, "alias-sub", true, Some(10))?;
    assert_eq!(sub.subscribe("al/#", 1, 1)?, 1);
    let mut options = MqttOptions::new("alias-rumqttc", "127.0.0.1", gateway.mqtt.port());
    options.set_topic_alias_max(Some(1));
    let (rumqttc, mut events) = V5Client::new(options, 16);
    rumqttc.subscribe("al/#", V5QoS::AtLeastOnce)?;
    wait_suback(&mut events)?;
    let mut plain = connect(gateway.mqtt, "alias-plain", true, None)?;
    assert_eq!(plain.subscribe("al/#", 0, 1)?, 0);
    let mut publisher = RawClient::connect(gateway.mqtt, "alias-pub", 60, true, false)?;
    let topics = ["al/a", "al/a", "al/b", "al/c", "al/a"];
    for (i, topic) in topics.iter().enumerate() {
        assert_eq!(
            publisher.publish_qos1(topic, format!("{i}").as_bytes(), i as u16 + 1)?,
            0
        );
    }
    let mut seen = Vec::new();
    for _ in topics {
        let wire = next_wire(&mut sub, true)?;
        ack(&mut sub, 0x40, wire.pkid)?;
        seen.push((wire.topic, wire.alias));
    }
    let named = |t: &str, a: u16| (t.to_owned(), Some(a));
    let expected = [
        named("al/a", 1),
        (String::new(), Some(1)),
        named("al/b", 2),
        named("al/c", 1),
        named("al/a", 2),
    ];
    assert_eq!(
        seen, expected,
        "LRU reassignment within mqtt.outbound_topic_aliases = 2"
    );
    let first = next_wire(&mut plain, true)?;
    assert_eq!((first.topic.as_str(), first.alias), ("al/a", None));
    let resolved = rumqttc_topics(&mut events, topics.len())?;
    let expected: Vec<(String, String)> = topics
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i.to_string()))
        .collect();
    assert_eq!(
        resolved, expected,
        "rumqttc (alias maximum 1) follows every reassignment"
    );
    gateway.stop()
}

fn wait_suback(events: &mut rumqttc::v5::Connection) -> anyhow::Result<()> {
    for _ in 0..50 {
        match events.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(V5Event::Incoming(V5Incoming::SubAck(_)))) => return Ok(()),
            Ok(Err(err)) => bail!("rumqttc: {err}"),
            _ => {}
        }
    }
    bail!("no SUBACK for rumqttc")
}

/// (topic, payload) of `count` publishes as rumqttc's MQTT 5 client gets them. rumqttc reports
/// a publish before it applies its alias, so the topic of an alias-only publish is looked up
/// here; rumqttc itself ends the connection on an alias it does not know, failing the test.
fn rumqttc_topics(
    events: &mut rumqttc::v5::Connection,
    count: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut aliases = BTreeMap::new();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < count && std::time::Instant::now() < deadline {
        let publish = match events.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(V5Event::Incoming(V5Incoming::Publish(publish)))) => publish,
            Ok(Err(err)) => bail!("rumqttc refused a delivery: {err}"),
            _ => continue,
        };
        let alias = publish.properties.as_ref().and_then(|p| p.topic_alias);
        let mut topic = String::from_utf8_lossy(&publish.topic).into_owned();
        match alias {
            Some(alias) if alias > 1 => bail!("alias {alias} above the client's maximum 1"),
            Some(alias) if topic.is_empty() => {
                topic = aliases.get(&alias).cloned().context("unknown alias")?;
            }
            Some(alias) => {
                aliases.insert(alias, topic.clone());
            }
            None => {}
        }
        got.push((
            topic,
            String::from_utf8_lossy(&publish.payload).into_owned(),
        ));
    }
    Ok(got)
}

/// A two-byte property (`id`) of an MQTT 5 CONNACK body.
fn connack_u16(connack: &[u8], id: u8) -> Option<u16> {
    let len = usize::from(*connack.get(2)?);
    let mut properties = connack.get(3..3 + len)?;
    while let [key, rest @ ..] = properties {
        let size = match key {
            0x21 | 0x22 | 0x13 => 2,
            0x24 | 0x25 | 0x28 | 0x29 | 0x2a => 1,
            0x11 | 0x27 => 4,
            0x12 | 0x1f => {
                2 + usize::from(u16::from(*rest.first()?) << 8 | u16::from(*rest.get(1)?))
            }
            _ => return None,
        };
        if *key == id {
            let value = rest.get(..2)?;
            return Some(u16::from(value[0]) << 8 | u16::from(value[1]));
        }
        properties = rest.get(size..)?;
    }
    None
}

#[test]
fn publishes_beyond_the_receive_maximum_get_disconnect_0x93_on_v5_only() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-receive-max")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let (mut exact, connack) =
        RawClient::connect_with(gateway.mqtt, "rm-exact", 60, true, Some(&[][..]))?;
    let max = connack_u16(&connack, 0x21).context("CONNACK announces Receive Maximum")?;
    let payloads =
        |n: u16| -> Vec<Vec<u8>> { (0..n).map(|i| format!("r{i}").into_bytes()).collect() };
    let acked = exact.publish_batch_qos1("rm/exact", &payloads(max))?;
    assert_eq!(
        acked.len(),
        usize::from(max),
        "exactly the maximum outstanding is fine"
    );

    // QoS 2 publishes stay counted from PUBREC until PUBCOMP: without PUBREL, `max` of them
    // use the whole quota and the next one is one too many.
    let mut greedy = RawClient::connect(gateway.mqtt, "rm-greedy", 60, true, true)?;
    for pkid in 1..=max {
        greedy.publish("rm/greedy", b"x", 2, pkid, false)?;
        expect_packet(&mut greedy, 0x50, pkid)?;
    }
    greedy.publish("rm/greedy", b"x", 1, max + 1, false)?;
    let (first, disconnect) = greedy.read_packet()?;
    assert_eq!(
        (first, disconnect.first()),
        (0xe0, Some(&0x93)),
        "Receive Maximum exceeded"
    );
    greedy.closed_within(Duration::from_secs(5))?;
    let mut polite = RawClient::connect(gateway.mqtt, "rm-polite", 60, true, true)?;
    for pkid in 1..=max + 8 {
        publish_qos2(&mut polite, "rm/polite", "p", pkid)?;
    }

    let mut old = RawClient::connect(gateway.mqtt, "rm-v311", 60, true, false)?;
    let acked = old.publish_batch_qos1("rm/v311", &payloads(max + 8))?;
    assert_eq!(
        acked.len(),
        usize::from(max) + 8,
        "MQTT 3.1.1 has no Receive Maximum"
    );

    let lines: Vec<String> = (0..300).map(|i| format!("c{i}")).collect();
    for qos in ["1", "2"] {
        let topic = format!("rm/mosquitto/{qos}");
        mosquitto_pub_lines(
            gateway.mqtt,
            &["-V", "mqttv5", "-q", qos, "-t", &topic],
            &lines,
        )?;
    }
    gateway.stop()?;
    let stored = read_log(dir.path(), "mqtt")?;
    let by_mosquitto = stored.iter().filter(|r| r.value.starts_with('c')).count();
    assert_eq!(
        by_mosquitto, 600,
        "a compliant MQTT 5 client is never cut off"
    );
    Ok(())
}
