//! Shared subscription tests over in-memory sockets: the MQTT 5 CONNACK announces them, members
//! of a group split the records in turn, and an unsubscribed member gets no more.

use rumqttd::protocol::Packet;

use super::{Client, Harness};
use crate::codec::test::{client_connect, client_subscribe};
use crate::codec::{QoS, Version};
use tern_log::MemoryLog;

/// The value of a one-byte property in an MQTT 5 CONNACK frame.
fn connack_byte_property(frame: &[u8], wanted: u8) -> Option<u8> {
    // Fixed header (2 bytes for short frames), flags, reason code, property length (1 byte).
    let properties = frame.get(5..)?;
    let mut at = 0;
    while let Some(&id) = properties.get(at) {
        let len = match id {
            0x24 | 0x25 | 0x28 | 0x29 | 0x2a => 1,
            0x13 | 0x21 | 0x22 => 2,
            0x11 | 0x27 => 4,
            0x12 | 0x1a | 0x1c | 0x1f => {
                let high = usize::from(*properties.get(at + 1)?);
                2 + (high << 8 | usize::from(*properties.get(at + 2)?))
            }
            _ => return None,
        };
        if id == wanted {
            return properties.get(at + 1).copied();
        }
        at += 1 + len;
    }
    None
}

async fn publish_payload(client: &mut Client) -> Option<Vec<u8>> {
    match client.packet().await {
        Packet::Publish(publish, _) => Some(publish.payload.to_vec()),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn v5_connack_announces_shared_subscriptions() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let (io, task) = h.socket();
    let mut client = Client {
        io,
        buf: bytes::BytesMut::new(),
        version: Version::V5,
        task,
    };
    client
        .send(&client_connect(Version::V5, "flags", true, 60))
        .await;
    let connack = client.frame().await;
    assert_eq!(connack.first(), Some(&0x20));
    assert_eq!(
        connack_byte_property(&connack, 0x2a),
        Some(1),
        "{connack:?}"
    );
    assert_eq!(
        connack_byte_property(&connack, 0x28),
        Some(1),
        "{connack:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn group_members_split_records_and_an_unsubscribed_member_gets_no_more() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let mut a = h.connect(Version::V4, "a", true).await;
    let mut b = h.connect(Version::V4, "b", true).await;
    for member in [&mut a, &mut b] {
        let subscribe = client_subscribe(Version::V4, 1, "$share/g/t/#", QoS::AtLeastOnce);
        member.send(&subscribe).await;
        assert!(matches!(member.packet().await, Packet::SubAck(..)));
    }
    let mut publisher = h.connect(Version::V4, "pub", true).await;
    for i in 0..4u16 {
        let payload = format!("p{i}");
        publisher
            .publish("t/x", payload.as_bytes(), QoS::AtMostOnce, 0)
            .await;
    }
    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    for _ in 0..2 {
        got_a.push(publish_payload(&mut a).await.expect("a publish"));
        got_b.push(publish_payload(&mut b).await.expect("a publish"));
    }
    assert_eq!(got_a, [b"p0".to_vec(), b"p2".to_vec()]);
    assert_eq!(got_b, [b"p1".to_vec(), b"p3".to_vec()]);

    let mut unsubscribe = vec![0xa2, 0];
    let filter = b"$share/g/t/#";
    unsubscribe.extend_from_slice(&[0, 2, 0, u8::try_from(filter.len()).expect("short")]);
    unsubscribe.extend_from_slice(filter);
    unsubscribe[1] = u8::try_from(unsubscribe.len() - 2).expect("short");
    b.send(&unsubscribe).await;
    assert!(matches!(b.packet().await, Packet::UnsubAck(..)));
    publisher.publish("t/y", b"later", QoS::AtMostOnce, 0).await;
    assert_eq!(publish_payload(&mut a).await, Some(b"later".to_vec()));
    assert!(
        b.try_frame(std::time::Duration::from_millis(300))
            .await
            .is_none()
    );
}
