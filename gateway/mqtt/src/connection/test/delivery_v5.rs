//! MQTT 5 delivery tests against the in-memory log: outbound topic aliases (LRU within the
//! client's maximum, full topics on resends) and the inbound Receive Maximum (DISCONNECT 0x93).

use super::Harness;
use super::delivery::{connect_v5_aliases, publish_acked};
use crate::codec::{QoS, Version};
use crate::config::MqttConfig;
use tern_log::MemoryLog;

#[tokio::test(start_paused = true)]
async fn deliveries_use_topic_aliases_up_to_the_client_maximum() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let mut sub = connect_v5_aliases(&h, "sub", true, 1).await;
    assert_eq!(sub.subscribed("a/#", QoS::AtMostOnce).await, 0);
    let mut publisher = h.connect(Version::V4, "p", true).await;
    for (i, topic) in ["a/1", "a/1", "a/2", "a/1"].iter().enumerate() {
        let pkid = i as u16 + 1;
        publisher.publish(topic, b"x", QoS::AtLeastOnce, pkid).await;
        assert_eq!(publisher.frame().await, [0x40, 2, 0, pkid as u8]);
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        let d = sub.delivered().await;
        seen.push((d.topic, d.alias));
    }
    let full = |t: &str| (t.to_owned(), Some(1));
    assert_eq!(
        seen,
        [
            full("a/1"),
            (String::new(), Some(1)),
            full("a/2"),
            full("a/1")
        ]
    );

    let mut plain = h.connect(Version::V5, "plain", true).await;
    assert_eq!(plain.subscribed("a/#", QoS::AtMostOnce).await, 0);
    publisher.publish("a/3", b"x", QoS::AtLeastOnce, 9).await;
    let d = plain.delivered().await;
    assert_eq!(
        (d.topic.as_str(), d.alias),
        ("a/3", None),
        "no alias unless announced"
    );
}

#[tokio::test(start_paused = true)]
async fn resends_after_a_reconnect_carry_the_full_topic() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let mut sub = connect_v5_aliases(&h, "sub", false, 4).await;
    assert_eq!(sub.subscribed("b/#", QoS::AtLeastOnce).await, 1);
    publish_acked(&h, "b/1", 2).await;
    let first = sub.delivered().await;
    let second = sub.delivered().await;
    assert_eq!((first.topic.as_str(), first.alias), ("b/1", Some(1)));
    assert_eq!((second.topic.as_str(), second.alias), ("", Some(1)));
    drop(sub);
    let mut sub = connect_v5_aliases(&h, "sub", false, 4).await;
    for expected in [first.pkid, second.pkid] {
        let again = sub.delivered().await;
        assert_eq!((again.first & 0x08, again.pkid), (0x08, expected));
        assert_eq!((again.topic.as_str(), again.alias), ("b/1", None));
    }
}

fn qos_publish(topic: &str, qos: QoS, pkid: u16) -> Vec<u8> {
    crate::codec::test::client_publish(Version::V5, topic, b"x", qos, pkid)
}

#[tokio::test(start_paused = true)]
async fn more_publishes_than_the_receive_maximum_get_disconnect_0x93() {
    let config = MqttConfig {
        inflight: 2,
        ..MqttConfig::default()
    };
    let h = Harness::with_config(MemoryLog::new(1), config).await;
    let mut ok = h.connect(Version::V5, "ok", true).await;
    ok.send(
        &[
            qos_publish("t", QoS::ExactlyOnce, 1),
            qos_publish("t", QoS::AtLeastOnce, 2),
        ]
        .concat(),
    )
    .await;
    assert_eq!(ok.frame().await, [0x50, 2, 0, 1]);
    assert_eq!(ok.frame().await, [0x40, 2, 0, 2]);
    // PUBREC alone keeps packet 1 counted: one more fits, a second would not.
    ok.send(&qos_publish("t", QoS::AtLeastOnce, 3)).await;
    assert_eq!(ok.frame().await, [0x40, 2, 0, 3]);
    ok.ack(0x62, 1).await;
    assert_eq!(ok.frame().await, [0x70, 2, 0, 1]);
    let burst: Vec<u8> = (4..6u16)
        .flat_map(|pkid| qos_publish("t", QoS::AtLeastOnce, pkid))
        .collect();
    ok.send(&burst).await;
    assert_eq!(ok.frame().await, [0x40, 2, 0, 4]);
    assert_eq!(ok.frame().await, [0x40, 2, 0, 5]);

    let mut greedy = h.connect(Version::V5, "greedy", true).await;
    let burst: Vec<u8> = (1..=3u16)
        .flat_map(|pkid| qos_publish("t", QoS::AtLeastOnce, pkid))
        .collect();
    greedy.send(&burst).await;
    let mut frames = Vec::new();
    while let Some(frame) = greedy.try_frame(super::WAIT).await {
        frames.push(frame);
    }
    assert_eq!(
        frames.last().map(Vec::as_slice),
        Some(&[0xe0, 2, 0x93, 0][..])
    );

    let mut v4 = h.connect(Version::V4, "old", true).await;
    let burst: Vec<u8> = (1..=3u16)
        .flat_map(|pkid| {
            crate::codec::test::client_publish(Version::V4, "t", b"x", QoS::AtLeastOnce, pkid)
        })
        .collect();
    v4.send(&burst).await;
    for pkid in 1..=3u8 {
        assert_eq!(
            v4.frame().await,
            [0x40, 2, 0, pkid],
            "MQTT 3.1.1 has no Receive Maximum"
        );
    }
}
