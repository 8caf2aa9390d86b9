//! `mqtt.max_queued_bytes_total` against the in-memory log: subscribers that never acknowledge
//! fill the process-wide account up to the cap (plus their floors) and no further, a subscriber
//! that acknowledges keeps receiving, and the bytes are released when sessions end. The
//! negative control runs the same clients with the cap out of the way and sees the total pass
//! the bound. The e2e suite checks tern's RSS the same way (`mqtt_abuse_limits.rs`).

use super::delivery::SHORT;
use super::{Client, Harness};
use crate::codec::{QoS, Version};
use crate::config::MqttConfig;
use crate::queued::FLOOR;
use tern_core::ByteSize;
use tern_log::MemoryLog;

const PAYLOAD: usize = 20 * 1024;
const STUCK: usize = 4;
const CAP: u64 = 256 * 1024;
/// The most one delivery is charged: topic, payload and 16 bytes.
const DELIVERY: u64 = (PAYLOAD + 3 + 16) as u64;

/// The bound the cap promises: the cap plus, per connection, its floor and one delivery.
fn bound(connections: usize) -> u64 {
    CAP + connections as u64 * (FLOOR as u64 + DELIVERY)
}

impl Client {
    /// Reads PUBLISHes without acknowledging them until none comes for a while.
    async fn read_unacked(&mut self) -> usize {
        let mut count = 0;
        while let Some(frame) = self.try_frame(SHORT).await {
            assert_eq!(frame.first().map(|b| b & 0xf0), Some(0x30), "{frame:?}");
            count += 1;
        }
        count
    }

    /// The next PUBLISH (QoS 1), acknowledged.
    async fn read_acked(&mut self) {
        let frame = self.frame().await;
        assert_eq!(frame.first(), Some(&0x32), "{frame:?}");
        // Past the fixed header's remaining length (a varint) and the topic name.
        let header = 1 + frame.iter().skip(1).take_while(|b| *b & 0x80 != 0).count() + 1;
        let topic = usize::from(frame[header]) << 8 | usize::from(frame[header + 1]);
        let at = header + 2 + topic;
        let pkid = u16::from(frame[at]) << 8 | u16::from(frame[at + 1]);
        self.ack(0x40, pkid).await;
    }
}

/// Subscribers that never acknowledge (the first persistent), one that does, and `count`
/// publishes of [`PAYLOAD`] bytes; returns the harness and the stuck clients after they read
/// everything tern sent them.
async fn stuck_subscribers(cap: u64, count: u16) -> (Harness, Vec<Client>, Client, Client) {
    let config = MqttConfig {
        max_queued_bytes: ByteSize(256 * 1024),
        max_queued_bytes_total: ByteSize(cap),
        ..MqttConfig::default()
    };
    let h = Harness::with_config(MemoryLog::new(1), config).await;
    let mut stuck = Vec::new();
    for i in 0..STUCK {
        let mut client = h.connect(Version::V4, &format!("stuck-{i}"), i > 0).await;
        assert_eq!(client.subscribed("m/#", QoS::AtLeastOnce).await, 1);
        stuck.push(client);
    }
    let mut reader = h.connect(Version::V4, "reader", true).await;
    assert_eq!(reader.subscribed("m/#", QoS::AtLeastOnce).await, 1);
    let mut publisher = h.connect(Version::V4, "publisher", true).await;
    for pkid in 1..=count {
        publish(&mut publisher, pkid).await;
        reader.read_acked().await;
    }
    for client in &mut stuck {
        client.read_unacked().await;
    }
    (h, stuck, reader, publisher)
}

async fn publish(publisher: &mut Client, pkid: u16) {
    let payload = vec![b'x'; PAYLOAD];
    publisher
        .publish("m/x", &payload, QoS::AtLeastOnce, pkid)
        .await;
    assert_eq!(publisher.frame().await, [0x40, 2, 0, pkid as u8]);
}

#[tokio::test(start_paused = true)]
async fn stuck_subscribers_stop_at_the_cap_while_a_reader_keeps_receiving() {
    let (h, mut stuck, mut reader, mut publisher) = stuck_subscribers(CAP, 40).await;
    let queued = &h.broker.metrics.queued;
    let total = queued.total();
    assert!(total >= CAP, "the stuck subscribers reach the cap: {total}");
    assert!(total <= bound(STUCK + 1), "{total} > {}", bound(STUCK + 1));
    // At the cap, the reader (below its floor) still gets every new message; the stuck
    // subscribers (past theirs) get none.
    for pkid in 41..=45 {
        publish(&mut publisher, pkid).await;
        reader.read_acked().await;
    }
    for client in &mut stuck {
        assert_eq!(client.read_unacked().await, 0, "no room past the floor");
    }
    assert_eq!(queued.total(), total, "the reader holds nothing");
    // Ending sessions releases their bytes; the persistent one keeps them while it lives.
    let mut ended = stuck.split_off(1);
    for client in ended.drain(..) {
        let Client { io, task, .. } = client;
        drop(io);
        task.await.expect("connection task");
    }
    let persistent = queued.total();
    assert!(
        persistent > 0 && persistent < total,
        "{persistent} of {total}"
    );
    let Some(Client { io, task, .. }) = stuck.pop() else {
        panic!("the persistent subscriber");
    };
    drop(io);
    task.await.expect("connection task");
    assert_eq!(
        queued.total(),
        persistent,
        "a disconnected session keeps its copies"
    );
    let clean = h.connect(Version::V4, "stuck-0", true).await;
    assert_eq!(queued.total(), 0, "a clean start drops them");
    drop(clean);
}

#[tokio::test(start_paused = true)]
async fn without_the_cap_stuck_subscribers_queue_past_the_bound() {
    // Negative control: the same clients with the cap out of the way queue up to
    // `max_queued_bytes` each, past what the capped run is held to.
    let (h, _stuck, _reader, _publisher) = stuck_subscribers(1 << 30, 40).await;
    let total = h.broker.metrics.queued.total();
    assert!(total > bound(STUCK + 1), "{total} <= {}", bound(STUCK + 1));
}
