//! Shared subscriptions (`$share/{group}/{filter}`) against the real binary with MQTT 3.1.1 and
//! 5 members (mosquitto_sub, rumqttc, the raw-socket client): round robin delivers every record
//! to exactly one member, key-sticky keeps a key on one member, a member that drops out has its
//! unacknowledged records redelivered to another (DUP), and the group cursor survives a SIGKILL.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, Incoming, MqttOptions, QoS};
use tern_tests::raw_mqtt::{RawClient, Received};
use tern_tests::{Gateway, MosquittoSub, ServeOptions, TempDir, free_port};

/// Reads PUBLISHes (acknowledging them, or not) until none came for `quiet`.
pub(super) fn collect(
    client: &mut RawClient,
    ack: bool,
    quiet: Duration,
) -> anyhow::Result<Vec<Received>> {
    client.set_timeout(quiet)?;
    let mut received = Vec::new();
    loop {
        let next = if ack {
            client.next_publish()
        } else {
            client.next_publish_unacked()
        };
        match next {
            Ok(publish) => received.push(publish),
            Err(err) if is_timeout(&err) => return Ok(received),
            Err(err) => return Err(err),
        }
    }
}

fn is_timeout(err: &anyhow::Error) -> bool {
    err.downcast_ref::<std::io::Error>().is_some_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    })
}

fn payloads(received: &[Received]) -> Vec<String> {
    received
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect()
}

fn publish_all(gateway: &Gateway, topics: &[String]) -> anyhow::Result<()> {
    let mut publisher = RawClient::connect(gateway.mqtt, "share-pub", 60, true, false)?;
    for (i, topic) in topics.iter().enumerate() {
        let pkid = u16::try_from(i % 60_000 + 1)?;
        let code = publisher.publish_qos1(topic, format!("m{i}").as_bytes(), pkid)?;
        assert_eq!(code, 0, "publish {i} refused");
    }
    publisher.disconnect()
}

fn expected(count: usize) -> BTreeSet<String> {
    (0..count).map(|i| format!("m{i}")).collect()
}

#[test]
fn round_robin_hands_each_message_to_exactly_one_member_of_either_version() -> anyhow::Result<()> {
    const COUNT: usize = 30;
    let dir = TempDir::new("share-rr")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mosquitto = MosquittoSub::start(
        gateway.mqtt,
        &[
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-i",
            "rr-mosq",
            "-W",
            "6",
            "-t",
            "$share/workers/jobs/#",
        ],
    )?;
    let mut options = MqttOptions::new("rr-rumqttc", "127.0.0.1", gateway.mqtt.port());
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut connection) = Client::new(options, 64);
    client.subscribe("$share/workers/jobs/#", QoS::AtLeastOnce)?;
    let mut raw = RawClient::connect(gateway.mqtt, "rr-raw5", 60, true, true)?;
    assert_eq!(raw.subscribe("$share/workers/jobs/#", 1, 1)?, 1);
    let mut plain = RawClient::connect(gateway.mqtt, "rr-plain", 60, true, false)?;
    assert_eq!(plain.subscribe("jobs/#", 1, 1)?, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut subscribed = false;
    while !subscribed && Instant::now() < deadline {
        let event = connection.recv_timeout(Duration::from_millis(200));
        subscribed = matches!(event, Ok(Ok(Event::Incoming(Incoming::SubAck(_)))));
    }
    assert!(subscribed, "rumqttc got no SUBACK");

    let topics: Vec<String> = (0..COUNT).map(|i| format!("jobs/{i}")).collect();
    publish_all(&gateway, &topics)?;
    let mut by_member: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    by_member.insert(
        "raw v5",
        payloads(&collect(&mut raw, true, Duration::from_secs(2))?),
    );
    let mut from_rumqttc = Vec::new();
    let quiet_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < quiet_until {
        if let Ok(Ok(Event::Incoming(Incoming::Publish(p)))) =
            connection.recv_timeout(Duration::from_millis(200))
        {
            from_rumqttc.push(String::from_utf8_lossy(&p.payload).into_owned());
        }
    }
    by_member.insert("rumqttc v3.1.1", from_rumqttc);
    let output = mosquitto.finish()?;
    let lines = output.stdout;
    by_member.insert(
        "mosquitto_sub v5",
        lines.lines().map(str::to_owned).collect(),
    );

    let all: Vec<&String> = by_member.values().flatten().collect();
    let unique: BTreeSet<String> = all.iter().map(|s| (*s).clone()).collect();
    assert_eq!(
        all.len(),
        COUNT,
        "a message reached two members: {by_member:?}"
    );
    assert_eq!(unique, expected(COUNT), "{by_member:?}");
    for (member, got) in &by_member {
        let share = got.len();
        assert!((9..=11).contains(&share), "{member} got {share} of {COUNT}");
    }
    let everything = payloads(&collect(&mut plain, true, Duration::from_secs(1))?);
    assert_eq!(
        everything.len(),
        COUNT,
        "the plain subscriber still gets all"
    );
    gateway.stop()
}

#[test]
fn key_sticky_keeps_every_key_on_one_member() -> anyhow::Result<()> {
    const KEYS: usize = 8;
    const ROUNDS: usize = 6;
    let dir = TempDir::new("share-sticky")?;
    let config = dir.path().join("tern.toml");
    std::fs::write(&config, "[mqtt]\nshared_strategy = \"key-sticky\"\n")?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        ..ServeOptions::default()
    };
    let mut gateway = Gateway::start(dir.path(), &options)?;
    let mut members = [
        RawClient::connect(gateway.mqtt, "sticky-a", 60, true, false)?,
        RawClient::connect(gateway.mqtt, "sticky-b", 60, true, true)?,
    ];
    for member in &mut members {
        assert_eq!(member.subscribe("$share/dash/dev/+/temp", 1, 1)?, 1);
    }
    let topics: Vec<String> = (0..KEYS * ROUNDS)
        .map(|i| format!("dev/{}/temp", i % KEYS))
        .collect();
    publish_all(&gateway, &topics)?;
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    let mut total = 0;
    for (index, member) in members.iter_mut().enumerate() {
        let received = collect(member, true, Duration::from_secs(2))?;
        let mut last_per_key: BTreeMap<String, usize> = BTreeMap::new();
        for publish in received {
            total += 1;
            let previous = owner.insert(publish.topic.clone(), index);
            assert!(
                previous.is_none_or(|p| p == index),
                "{} reached both members",
                publish.topic
            );
            let n: usize = String::from_utf8_lossy(&publish.payload)
                .trim_start_matches('m')
                .parse()?;
            let before = last_per_key.insert(publish.topic.clone(), n);
            assert!(
                before.is_none_or(|b| b < n),
                "{} out of order",
                publish.topic
            );
        }
    }
    assert_eq!(total, KEYS * ROUNDS);
    assert_eq!(owner.len(), KEYS);
    let owners: BTreeSet<usize> = owner.values().copied().collect();
    assert_eq!(owners.len(), 2, "all keys on one member: {owner:?}");
    gateway.stop()
}

#[test]
fn a_member_that_drops_out_has_its_unacknowledged_messages_redelivered() -> anyhow::Result<()> {
    const COUNT: usize = 10;
    let dir = TempDir::new("share-leave")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mut leaver = RawClient::connect(gateway.mqtt, "leaver", 60, true, true)?;
    let mut stayer = RawClient::connect(gateway.mqtt, "stayer", 60, true, false)?;
    assert_eq!(leaver.subscribe("$share/g/work/#", 1, 1)?, 1);
    assert_eq!(stayer.subscribe("$share/g/work/#", 1, 1)?, 1);
    let topics: Vec<String> = (0..COUNT).map(|i| format!("work/{i}")).collect();
    publish_all(&gateway, &topics)?;
    let quiet = Duration::from_secs(1);
    let unacked = payloads(&collect(&mut leaver, false, quiet)?);
    let acked = payloads(&collect(&mut stayer, true, quiet)?);
    assert_eq!(unacked.len() + acked.len(), COUNT);
    assert!(!unacked.is_empty() && !acked.is_empty());
    drop(leaver);

    let redelivered = collect(&mut stayer, true, Duration::from_secs(2))?;
    assert_eq!(
        payloads(&redelivered),
        unacked,
        "the leaver's messages, in order"
    );
    assert!(redelivered.iter().all(|r| r.dup), "redeliveries carry DUP");
    let all: BTreeSet<String> = acked.into_iter().chain(unacked).collect();
    assert_eq!(all, expected(COUNT));
    gateway.stop()
}

/// A process crash (SIGKILL) after the group's cursor moved; power cuts are tern-log's
/// fault-injecting file system's business (`gateway/log/src/tests/crash.rs`).
#[test]
fn the_group_cursor_survives_sigkill_and_resumes_without_loss() -> anyhow::Result<()> {
    let dir = TempDir::new("share-restart")?;
    let options = ServeOptions {
        mqtt_listen: Some(free_port()?),
        ..ServeOptions::default()
    };
    let mut gateway = Gateway::start(dir.path(), &options)?;
    let mut member = RawClient::connect(gateway.mqtt, "keeper", 60, false, false)?;
    assert_eq!(member.subscribe("$share/keep/log/#", 1, 1)?, 1);
    let topics: Vec<String> = (0..10).map(|i| format!("log/{i}")).collect();
    publish_all(&gateway, &topics[..5])?;
    for _ in 0..3 {
        member.next_publish()?;
    }
    let held = collect(&mut member, false, Duration::from_secs(1))?;
    assert_eq!(payloads(&held), ["m3", "m4"]);
    drop(member);
    let mut publisher = RawClient::connect(gateway.mqtt, "late-pub", 60, true, false)?;
    for (i, topic) in topics.iter().enumerate().skip(5) {
        let pkid = u16::try_from(i + 1)?;
        assert_eq!(
            publisher.publish_qos1(topic, format!("m{i}").as_bytes(), pkid)?,
            0
        );
    }
    let wanted: Vec<String> = (3..10).map(|i| format!("m{i}")).collect();
    let mut member = RawClient::connect(gateway.mqtt, "keeper", 60, false, false)?;
    let again = payloads(&collect(&mut member, false, Duration::from_secs(1))?);
    assert_eq!(
        again, wanted,
        "once each: the session does not re-send the group's records"
    );
    drop(member);
    publisher.disconnect()?;
    // A connection's task saves its cursors before it leaves the open-connections gauge.
    gateway.wait_metric(
        "tern_mqtt_connections",
        "",
        "every connection closed",
        Duration::from_secs(10),
        |open| open == Some(0),
    )?;
    gateway.signal(libc::SIGKILL)?;
    gateway.wait_exit(Duration::from_secs(10))?;

    let mut gateway = Gateway::start(dir.path(), &options)?;
    let mut member = RawClient::connect(gateway.mqtt, "keeper", 60, false, false)?;
    let resumed = payloads(&collect(&mut member, true, Duration::from_secs(2))?);
    assert_eq!(resumed, wanted, "from the oldest unacknowledged message on");
    gateway.stop()
}

#[test]
fn shared_subscriptions_get_no_retained_messages_and_refuse_no_local() -> anyhow::Result<()> {
    let dir = TempDir::new("share-rules")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mut publisher = RawClient::connect(gateway.mqtt, "ret-pub", 60, true, false)?;
    publisher.publish("state/a", b"retained", 1, 1, true)?;
    let (first, _) = publisher.read_packet()?;
    assert_eq!(first, 0x40, "PUBACK for the retained message");
    let mut member = RawClient::connect(gateway.mqtt, "ret-sub", 60, true, true)?;
    assert_eq!(member.subscribe("$share/g/state/#", 1, 1)?, 1);
    assert_eq!(publisher.publish_qos1("state/a", b"live", 2)?, 0);
    let first = collect(&mut member, true, Duration::from_secs(1))?;
    assert_eq!(
        payloads(&first),
        ["live"],
        "no retained message on a shared subscribe"
    );
    assert!(!first.iter().any(|r| r.retain));

    for (filter, code) in [("$share/+/a", 0x8f_u8), ("$share/g", 0x8f)] {
        assert_eq!(member.subscribe(filter, 1, 2)?, code, "{filter}");
    }
    let mut body = vec![0, 3, 0];
    let filter = b"$share/g/nl";
    body.extend_from_slice(&[0, u8::try_from(filter.len())?]);
    body.extend_from_slice(filter);
    body.push(0x04 | 1);
    member.write_packet(0x82, &body)?;
    let (kind, reason) = member.read_packet()?;
    assert_eq!(
        (kind, reason.first().copied()),
        (0xe0, Some(0x82)),
        "DISCONNECT protocol error"
    );
    gateway.stop()
}
