//! Delivery tests against the in-memory log: outgoing QoS 2 (PUBREC → PUBREL → PUBCOMP,
//! resends, refusals, the released state across a restart) and DUP on redelivery after a
//! restart; the MQTT 5 features are in `test_delivery_v5.rs`. The e2e suite repeats them with
//! real clients and the real log.

use bytes::BytesMut;
use rumqttd::protocol::{self, Packet, Protocol};

use super::{Client, Harness};
use crate::broker::sent_cursor_name;
use crate::codec::test::client_subscribe;
use crate::codec::{QoS, Version};
use crate::config::MqttConfig;
use crate::connection::lease::LEASE_RECORDS;
use tern_log::LogPort;
use tern_log::MemoryLog;

pub(super) const SHORT: std::time::Duration = std::time::Duration::from_millis(200);

/// A PUBLISH from the server: (first byte, topic, packet id, topic alias).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Delivered {
    pub(super) first: u8,
    pub(super) topic: String,
    pub(super) pkid: u16,
    pub(super) alias: Option<u16>,
}

impl Client {
    pub(super) async fn delivered(&mut self) -> Delivered {
        let frame = self.frame().await;
        let mut bytes = BytesMut::from(&frame[..]);
        let len = bytes.len();
        let packet = match self.version {
            Version::V4 => protocol::v4::V4.read_mut(&mut bytes, len),
            Version::V5 => protocol::v5::V5.read_mut(&mut bytes, len),
        };
        let Ok(Packet::Publish(publish, properties)) = packet else {
            panic!("expected PUBLISH, got {frame:?}");
        };
        let pkid = match frame.first().map(|b| (b >> 1) & 3) {
            Some(1 | 2) => {
                let at = 2 + 2 + publish.topic.len();
                u16::from(frame[at]) << 8 | u16::from(frame[at + 1])
            }
            _ => 0,
        };
        Delivered {
            first: frame[0],
            topic: String::from_utf8_lossy(&publish.topic).into_owned(),
            pkid,
            alias: properties.and_then(|p| p.topic_alias),
        }
    }

    pub(super) async fn ack(&mut self, first: u8, pkid: u16) {
        self.send(&[first, 2, (pkid >> 8) as u8, pkid as u8]).await;
    }

    pub(super) async fn subscribed(&mut self, filter: &str, qos: QoS) -> u8 {
        self.send(&client_subscribe(self.version, 1, filter, qos))
            .await;
        let suback = self.frame().await;
        assert_eq!(suback.first(), Some(&0x90), "{suback:?}");
        *suback.last().expect("a return code")
    }
}

/// Connects an MQTT 5 client announcing a Topic Alias Maximum.
pub(super) async fn connect_v5_aliases(h: &Harness, id: &str, clean: bool, aliases: u16) -> Client {
    let connect = protocol::Connect {
        keep_alive: 60,
        client_id: id.to_owned(),
        clean_session: clean,
    };
    let properties = protocol::ConnectProperties {
        session_expiry_interval: Some(600),
        receive_maximum: None,
        max_packet_size: None,
        topic_alias_max: Some(aliases),
        request_response_info: None,
        request_problem_info: None,
        user_properties: Vec::new(),
        authentication_method: None,
        authentication_data: None,
    };
    let mut out = BytesMut::new();
    let packet = Packet::Connect(connect, Some(properties), None, None, None);
    protocol::v5::V5.write(packet, &mut out).expect("encodes");
    let (io, task) = h.socket();
    let mut client = Client {
        io,
        buf: BytesMut::new(),
        version: Version::V5,
        task,
    };
    client.send(&out).await;
    let connack = client.frame().await;
    assert_eq!((connack[0], connack[3]), (0x20, 0), "{connack:?}");
    client
}

pub(super) async fn publish_acked(h: &Harness, topic: &str, payloads: usize) {
    let mut publisher = h.connect(Version::V4, "publisher", true).await;
    for i in 1..=payloads {
        let pkid = u16::try_from(i).expect("small");
        publisher.publish(topic, b"m", QoS::AtLeastOnce, pkid).await;
        assert_eq!(publisher.frame().await, [0x40, 2, 0, pkid as u8]);
    }
}

#[tokio::test(start_paused = true)]
async fn qos2_deliveries_run_pubrec_pubrel_pubcomp_on_both_versions() {
    for version in [Version::V4, Version::V5] {
        let h = Harness::new(MemoryLog::new(1)).await;
        let mut sub = h.connect(version, "sub", true).await;
        assert_eq!(sub.subscribed("q/#", QoS::ExactlyOnce).await, 2);
        publish_acked(&h, "q/1", 1).await;
        let first = sub.delivered().await;
        assert_eq!(
            first.first, 0x32,
            "QoS 1 records go out at QoS 1 ({version:?})"
        );
        sub.ack(0x40, first.pkid).await;

        let mut publisher = h.connect(Version::V4, "p2", true).await;
        publisher.publish("q/2", b"x", QoS::ExactlyOnce, 5).await;
        assert_eq!(publisher.frame().await, [0x50, 2, 0, 5]);
        let exact = sub.delivered().await;
        assert_eq!((exact.first, exact.topic.as_str()), (0x34, "q/2"));
        sub.ack(0x50, exact.pkid).await;
        let [high, low] = [(exact.pkid >> 8) as u8, exact.pkid as u8];
        assert_eq!(sub.frame().await, [0x62, 2, high, low]);
        sub.ack(0x70, exact.pkid).await;
        assert_eq!(sub.try_frame(SHORT).await, None, "{version:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_released_qos2_delivery_is_resent_as_pubrel_and_never_as_publish() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let mut sub = h.connect(Version::V4, "sub", false).await;
    assert_eq!(sub.subscribed("r/#", QoS::ExactlyOnce).await, 2);
    let mut publisher = h.connect(Version::V4, "p", true).await;
    for pkid in 1..=2u16 {
        publisher.publish("r/x", b"x", QoS::ExactlyOnce, pkid).await;
        assert_eq!(publisher.frame().await, [0x50, 2, 0, pkid as u8]);
    }
    let a = sub.delivered().await;
    let b = sub.delivered().await;
    sub.ack(0x50, a.pkid).await;
    assert_eq!(sub.frame().await, [0x62, 2, 0, a.pkid as u8]);
    drop(sub);

    let mut sub = h.connect(Version::V4, "sub", false).await;
    assert_eq!(
        sub.frame().await,
        [0x62, 2, 0, a.pkid as u8],
        "PUBREL first"
    );
    let again = sub.delivered().await;
    assert_eq!(
        (again.first, again.pkid),
        (0x3c, b.pkid),
        "PUBLISH with DUP"
    );
    sub.ack(0x70, a.pkid).await;
    sub.ack(0x50, b.pkid).await;
    assert_eq!(sub.frame().await, [0x62, 2, 0, b.pkid as u8]);
    sub.ack(0x70, b.pkid).await;
    assert_eq!(sub.try_frame(SHORT).await, None);
    drop(sub);
    let mut sub = h.connect(Version::V4, "sub", false).await;
    assert_eq!(
        sub.try_frame(SHORT).await,
        None,
        "completed deliveries are not resent"
    );
}

#[tokio::test(start_paused = true)]
async fn qos2_deliveries_fill_the_window_until_pubcomp() {
    let config = MqttConfig {
        inflight: 2,
        ..MqttConfig::default()
    };
    let h = Harness::with_config(MemoryLog::new(1), config).await;
    let mut sub = connect_v5_aliases(&h, "sub", true, 0).await;
    assert_eq!(sub.subscribed("w/#", QoS::ExactlyOnce).await, 2);
    let mut publisher = h.connect(Version::V5, "p", true).await;
    for pkid in 1..=3u16 {
        publisher.publish("w/x", b"x", QoS::ExactlyOnce, pkid).await;
        assert_eq!(publisher.frame().await, [0x50, 2, 0, pkid as u8]);
        publisher.ack(0x62, pkid).await;
        assert_eq!(publisher.frame().await, [0x70, 2, 0, pkid as u8]);
    }
    let a = sub.delivered().await;
    let b = sub.delivered().await;
    let wait = SHORT;
    assert_eq!(sub.try_frame(wait).await, None, "the window holds two");
    sub.ack(0x50, a.pkid).await;
    assert_eq!(sub.frame().await, [0x62, 2, 0, a.pkid as u8]);
    assert_eq!(
        sub.try_frame(wait).await,
        None,
        "PUBREC does not free the slot"
    );
    sub.ack(0x70, a.pkid).await;
    let c = sub.delivered().await;
    assert_ne!(c.pkid, b.pkid);
    // A v5 PUBREC with reason 0x80 (unspecified error) ends the delivery.
    sub.send(&[0x50, 4, 0, b.pkid as u8, 0x80, 0]).await;
    assert_eq!(
        sub.try_frame(wait).await,
        None,
        "no PUBREL for a refused delivery"
    );
    drop(sub);
    let mut sub = connect_v5_aliases(&h, "sub", false, 0).await;
    let resent = sub.delivered().await;
    assert_eq!(
        (resent.first, resent.pkid),
        (0x3c, c.pkid),
        "only c is resent"
    );
    assert_eq!(
        sub.try_frame(wait).await,
        None,
        "the refused delivery is over"
    );
}

#[tokio::test(start_paused = true)]
async fn deliveries_repeated_after_a_restart_carry_dup() {
    let log = MemoryLog::new(1);
    let h = Harness::new(log.clone()).await;
    let mut sub = h.connect(Version::V4, "sub", false).await;
    assert_eq!(sub.subscribed("d/#", QoS::AtLeastOnce).await, 1);
    publish_acked(&h, "d/1", 1).await;
    let sent = sub.delivered().await;
    assert_eq!(sent.first & 0x08, 0, "a first delivery has no DUP");
    let lease = log.cursor(&sent_cursor_name("sub"), "mqtt", 0);
    assert_eq!(
        lease,
        Some(LEASE_RECORDS),
        "the lease was committed before the send"
    );
    drop(sub);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let h = Harness::new(log.clone()).await;
    let mut sub = h.connect(Version::V4, "sub", false).await;
    let again = sub.delivered().await;
    assert_eq!(
        (again.first, again.topic.as_str()),
        (0x3a, "d/1"),
        "DUP after a restart"
    );
    sub.ack(0x40, again.pkid).await;

    let mut clean = h.connect(Version::V4, "sub", true).await;
    clean.send(&[0xe0, 0]).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        log.cursor(&sent_cursor_name("sub"), "mqtt", 0),
        None,
        "leases end with the session"
    );
}

#[tokio::test(start_paused = true)]
async fn a_released_qos2_delivery_stays_released_across_a_restart() {
    let log = MemoryLog::new(1);
    let h = Harness::new(log.clone()).await;
    let mut sub = h.connect(Version::V4, "sub", false).await;
    assert_eq!(sub.subscribed("x/#", QoS::ExactlyOnce).await, 2);
    let mut publisher = h.connect(Version::V4, "p", true).await;
    publisher.publish("x/1", b"x", QoS::ExactlyOnce, 1).await;
    assert_eq!(publisher.frame().await, [0x50, 2, 0, 1]);
    let a = sub.delivered().await;
    sub.ack(0x50, a.pkid).await;
    assert_eq!(sub.frame().await, [0x62, 2, 0, a.pkid as u8]);
    drop((sub, publisher));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let h = Harness::new(log.clone()).await;
    let mut sub = h.connect(Version::V4, "sub", false).await;
    assert_eq!(
        sub.frame().await,
        [0x62, 2, 0, a.pkid as u8],
        "PUBREL, not PUBLISH"
    );
    assert_eq!(
        sub.try_frame(SHORT).await,
        None,
        "the record is not read again"
    );
    sub.ack(0x70, a.pkid).await;
    sub.send(&[0xe0, 0]).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let h = Harness::new(log).await;
    let mut sub = h.connect(Version::V4, "sub", false).await;
    assert_eq!(
        sub.try_frame(SHORT).await,
        None,
        "completed: nothing left after a restart"
    );
}
