//! Several batches of one connection in flight to the log at once: commits held back so later
//! batches are durable first, yet acks leave in arrival order, each partition keeps the
//! connection's publish order, and retained updates are applied in publish order.

use std::time::Duration;

use super::Harness;
use crate::codec::test::client_publish;
use crate::codec::{QoS, Version};
use crate::config::MqttConfig;
use tern_log::LogPort;
use tern_log::MemoryLog;

/// Pause between publishes so that each one is read as its own batch.
const APART: Duration = Duration::from_millis(20);

/// A server whose first three queued appends have their commits held (300, 150 and 50 ms; a
/// later commit of the same partition covers them, as a group commit does), with
/// `mqtt.inflight = 1` so that one publish makes a full batch (a batch starts beside
/// others in flight only when full).
async fn slow_first_answers(log: MemoryLog) -> Harness {
    log.hold_answers([300, 150, 50].map(Duration::from_millis));
    let config = MqttConfig {
        inflight: 1,
        ..MqttConfig::default()
    };
    Harness::with_config(log, config).await
}

#[tokio::test(start_paused = true)]
async fn acks_follow_arrival_order_and_partitions_keep_publish_order() {
    let log = MemoryLog::new(2);
    let h = slow_first_answers(log.clone()).await;
    let mut c = h.connect(Version::V4, "pipe", true).await;
    for i in 1..=12u16 {
        let topic = format!("t/{}", i % 3);
        c.publish(&topic, i.to_string().as_bytes(), QoS::AtLeastOnce, i)
            .await;
        tokio::time::sleep(APART).await;
    }
    for i in 1..=12u8 {
        assert_eq!(c.frame().await, [0x40, 2, 0, i], "PUBACK {i} out of order");
    }
    assert!(
        log.most_unanswered() >= 3,
        "only {} appends were in flight at once",
        log.most_unanswered()
    );
    let mut stored = 0;
    for partition in 0..2 {
        let records = log.read("mqtt", partition, 0, usize::MAX).expect("read");
        let order: Vec<u16> = records
            .iter()
            .filter_map(|r| std::str::from_utf8(&r.record.value).ok()?.parse().ok())
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "partition {partition} lost the publish order: {order:?}"
        );
        stored += order.len();
    }
    assert_eq!(stored, 12);
}

#[tokio::test(start_paused = true)]
async fn retained_updates_in_flight_together_apply_in_publish_order() {
    let h = slow_first_answers(MemoryLog::new(1)).await;
    let mut c = h.connect(Version::V4, "retainer", true).await;
    for (pkid, value) in [(1u16, "old"), (2, "newer"), (3, "newest")] {
        let mut frame = client_publish(Version::V4, "r", value.as_bytes(), QoS::AtLeastOnce, pkid);
        if let Some(flags) = frame.first_mut() {
            *flags |= 1; // RETAIN
        }
        c.send(&frame).await;
        tokio::time::sleep(APART).await;
    }
    for pkid in 1..=3u8 {
        assert_eq!(c.frame().await, [0x40, 2, 0, pkid]);
    }
    let retained = h.broker.retained.matching("r");
    let payloads: Vec<&[u8]> = retained.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(payloads, [&b"newest"[..]]);
}
