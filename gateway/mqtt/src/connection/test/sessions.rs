//! MQTT 5 session tests against the in-memory log: session expiry, will delay, a will
//! cancelled by a reconnect, topic aliases.

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::codec::test::{client_connect_v5, client_subscribe};
use crate::codec::{self, OutPublish, Outgoing, PublishProperties, QoS, Version};
use crate::message;
use tern_log::MemoryLog;

use super::{Client, Harness, WAIT};

/// Connects with a raw MQTT 5 CONNECT; returns the client and the CONNACK's session-present flag.
async fn connect_v5(
    h: &Harness,
    id: &str,
    clean: bool,
    expiry: u32,
    will: Option<(&str, &str, u32)>,
) -> (Client, bool) {
    let (io, task) = h.socket();
    let mut client = Client {
        io,
        buf: BytesMut::new(),
        version: Version::V5,
        task,
    };
    client
        .send(&client_connect_v5(id, clean, expiry, will))
        .await;
    let connack = client.frame().await;
    assert_eq!((connack[0], connack[3]), (0x20, 0), "{connack:?}");
    (client, connack[2] == 1)
}

#[tokio::test(start_paused = true)]
async fn a_v5_session_lives_for_its_expiry_interval_and_then_ends() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let (mut c, present) = connect_v5(&h, "exp", true, 1, None).await;
    assert!(!present);
    c.send(&client_subscribe(Version::V5, 1, "x/#", QoS::AtLeastOnce))
        .await;
    assert_eq!(c.frame().await[0], 0x90);
    drop(c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (c, present) = connect_v5(&h, "exp", false, 1, None).await;
    assert!(present, "reconnecting within the expiry finds the session");
    drop(c);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    h.broker.expire_sessions().await;
    let (_c, present) = connect_v5(&h, "exp", false, 1, None).await;
    assert!(!present, "the session expired");
}

#[tokio::test(start_paused = true)]
async fn a_v5_will_waits_for_its_delay() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let (c, _) = connect_v5(&h, "late", true, 10, Some(("wills/late", "bye", 1))).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(h.records().is_empty(), "not before the will delay");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let records = h.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value, &b"bye"[..]);
}

#[tokio::test(start_paused = true)]
async fn reconnecting_within_the_will_delay_cancels_the_will() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let (c, _) = connect_v5(&h, "back", true, 10, Some(("wills/back", "bye", 1))).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_again, present) = connect_v5(&h, "back", false, 10, None).await;
    assert!(present);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        h.records().is_empty(),
        "the will was cancelled by the reconnect"
    );
}

fn aliased_publish(topic: &str, alias: u16, pkid: u16) -> Vec<u8> {
    let publish = OutPublish {
        topic: Bytes::copy_from_slice(topic.as_bytes()),
        payload: Bytes::from_static(b"m"),
        qos: QoS::AtLeastOnce,
        pkid,
        dup: false,
        retain: false,
        properties: Some(PublishProperties {
            topic_alias: Some(alias),
            ..PublishProperties::default()
        }),
    };
    let mut out = BytesMut::new();
    codec::encode(Version::V5, Outgoing::Publish(Box::new(publish)), &mut out).expect("encodes");
    out.to_vec()
}

#[tokio::test(start_paused = true)]
async fn v5_topic_aliases_resolve_and_out_of_range_ones_disconnect() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let (mut c, _) = connect_v5(&h, "alias", true, 0, None).await;
    c.send(&aliased_publish("a/b", 1, 1)).await;
    assert_eq!(c.frame().await, [0x40, 2, 0, 1]);
    c.send(&aliased_publish("", 1, 2)).await;
    assert_eq!(c.frame().await, [0x40, 2, 0, 2]);
    let topics: Vec<Vec<u8>> = h
        .records()
        .iter()
        .map(|r| r.header(message::TOPIC).unwrap_or_default().to_vec())
        .collect();
    assert_eq!(topics, [b"a/b".to_vec(), b"a/b".to_vec()]);
    let properties = h.records()[1]
        .header("mqtt.topic_alias")
        .map(<[u8]>::to_vec);
    assert_eq!(
        properties, None,
        "aliases are connection state, not message data"
    );
    c.send(&aliased_publish("x", 17, 3)).await;
    assert_eq!(c.frame().await, [0xe0, 2, 0x94, 0]);
    assert!(c.closed(WAIT).await);
}

#[tokio::test(start_paused = true)]
async fn connections_beyond_the_limit_get_server_busy() {
    let config = crate::config::MqttConfig {
        max_connections: 1,
        ..crate::config::MqttConfig::default()
    };
    let h = Harness::with_config(MemoryLog::new(1), config).await;
    let _first = h.connect(Version::V4, "first", true).await;
    let (io, task) = h.socket();
    let mut second = Client {
        io,
        buf: BytesMut::new(),
        version: Version::V4,
        task,
    };
    second
        .send(&crate::codec::test::client_connect(
            Version::V4,
            "second",
            true,
            30,
        ))
        .await;
    assert_eq!(
        second.frame().await,
        [0x20, 2, 0, 3],
        "CONNACK server unavailable"
    );
    assert!(second.closed(WAIT).await);
}

#[tokio::test(start_paused = true)]
async fn a_forgotten_session_takes_its_incoming_qos2_ids_along() {
    use crate::codec::test::client_publish;
    use crate::state::STATE_TOPIC;
    use tern_log::LogPort;
    let log = MemoryLog::new(1);
    let h = Harness::new(log.clone()).await;
    let (mut c, _) = connect_v5(&h, "q2", true, 60, None).await;
    c.send(&client_publish(
        Version::V5,
        "a/b",
        b"x",
        QoS::ExactlyOnce,
        7,
    ))
    .await;
    assert_eq!(c.frame().await[0], 0x50, "PUBREC");
    drop(c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Clean start ends the stored session, PUBREL never came.
    let (_c, present) = connect_v5(&h, "q2", true, 0, None).await;
    assert!(!present);
    let (start, end) = log.offsets(STATE_TOPIC, 0).expect("offsets");
    let records = log.read(STATE_TOPIC, 0, start, usize::MAX).expect("read");
    assert_eq!(records.len() as u64, end - start);
    let latest = records
        .iter()
        .rev()
        .find(|r| r.record.key.as_deref() == Some(b"qos2/q2/7".as_slice()))
        .expect("the QoS 2 id was recorded");
    assert!(
        latest.record.value.is_empty(),
        "and deleted with the session"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_publishes_a_will_still_waiting_for_its_delay_before_the_log_closes() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let will = Some(("wills/pending", "bye", 60));
    let (Client { io, task, .. }, _) = connect_v5(&h, "pending", true, 300, will).await;
    drop(io);
    task.await
        .expect("the connection ends; its will waits for its delay");
    assert!(h.records().is_empty(), "not before the will delay");
    let started = tokio::time::Instant::now();
    h.trigger.trigger();
    h.broker.shutdown().await;
    h.log.close();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "published at shutdown, not after its delay: {:?}",
        started.elapsed()
    );
    let records = h.records();
    assert_eq!(records.len(), 1, "the will is stored before the log closes");
    assert_eq!(records[0].value, &b"bye"[..]);
}

#[tokio::test(start_paused = true)]
async fn a_will_cancelled_by_a_reconnect_is_not_published_at_shutdown() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let will = Some(("wills/back", "bye", 60));
    let (Client { io, task, .. }, _) = connect_v5(&h, "back", true, 300, will).await;
    drop(io);
    task.await.expect("the connection ends");
    let (_again, present) = connect_v5(&h, "back", false, 300, None).await;
    assert!(present);
    h.broker.shutdown().await;
    assert!(h.records().is_empty(), "the reconnect cancelled the will");
}
