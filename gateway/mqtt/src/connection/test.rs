//! Connection tests over in-memory sockets against the in-memory log: the protocol flows the
//! e2e suite repeats with real clients and the real log.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use rumqttd::protocol::{self, Packet, Protocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::super::auth::Origin;
use super::super::broker::Broker;
use super::super::codec::test::{client_connect, client_publish, client_subscribe};
use super::super::codec::{self, QoS, Version};
use super::super::config::MqttConfig;
use super::super::message;
use super::super::metrics::MqttMetrics;
use tern_log::MemoryLog;

use super::serve;
use tern_core::shutdown::{self, ShutdownTrigger};

mod auth;
mod delivery;
mod delivery_v5;
mod ingest;
mod memcap;
mod sessions;
mod share;

pub(super) const WAIT: Duration = Duration::from_secs(3);

pub(super) struct Harness {
    pub(super) log: MemoryLog,
    pub(super) broker: Arc<Broker<MemoryLog>>,
    trigger: ShutdownTrigger,
    shutdown: tern_core::shutdown::Shutdown,
}

impl Harness {
    pub(super) async fn new(log: MemoryLog) -> Self {
        Self::with_config(log, MqttConfig::default()).await
    }

    pub(super) async fn with_config(log: MemoryLog, config: MqttConfig) -> Self {
        let metrics = Arc::new(MqttMetrics::default());
        let broker = Broker::open(log.clone(), config, Vec::new(), metrics)
            .await
            .expect("broker");
        let (trigger, shutdown) = shutdown::channel();
        Self {
            log,
            broker,
            trigger,
            shutdown,
        }
    }

    pub(super) fn socket(&self) -> (DuplexStream, tokio::task::JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let peer = "127.0.0.1:9".parse().expect("addr");
        let task = tokio::spawn(serve(
            self.broker.clone(),
            server,
            peer,
            (
                Origin {
                    loopback_listener: true,
                    cert_identity: None,
                    peer: None,
                },
                self.broker.admission.handshake().0,
            ),
            self.shutdown.clone(),
        ));
        (client, task)
    }

    pub(super) async fn connect(&self, version: Version, id: &str, clean: bool) -> Client {
        let (io, task) = self.socket();
        let mut client = Client {
            io,
            buf: BytesMut::new(),
            version,
            task,
        };
        client.send(&client_connect(version, id, clean, 60)).await;
        let connack = client.frame().await;
        assert_eq!(connack.first(), Some(&0x20), "{connack:?}");
        assert_eq!(connack.get(3), Some(&0), "CONNACK not success: {connack:?}");
        client
    }

    pub(super) fn records(&self) -> Vec<tern_log::Record> {
        self.log.all("mqtt")
    }
}

pub(super) struct Client {
    pub(super) io: DuplexStream,
    pub(super) buf: BytesMut,
    pub(super) version: Version,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Client {
    pub(super) async fn send(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.expect("write");
    }

    pub(super) async fn publish(&mut self, topic: &str, payload: &[u8], qos: QoS, pkid: u16) {
        let frame = client_publish(self.version, topic, payload, qos, pkid);
        self.send(&frame).await;
    }

    /// The next raw frame from the server.
    pub(super) async fn frame(&mut self) -> Vec<u8> {
        self.try_frame(WAIT).await.expect("a frame from the server")
    }

    pub(super) async fn try_frame(&mut self, wait: Duration) -> Option<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Ok(Some(len)) = codec::frame_len(&self.buf, usize::MAX) {
                return Some(self.buf.split_to(len).to_vec());
            }
            let read = tokio::time::timeout_at(deadline, self.io.read_buf(&mut self.buf)).await;
            match read {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// The next packet, decoded as MQTT 3.1.1.
    pub(super) async fn packet(&mut self) -> Packet {
        let mut frame = BytesMut::from(&self.frame().await[..]);
        let len = frame.len();
        protocol::v4::V4
            .read_mut(&mut frame, len)
            .expect("valid packet")
    }

    /// Whether the server closed the connection within `wait`.
    pub(super) async fn closed(&mut self, wait: Duration) -> bool {
        while let Some(frame) = self.try_frame(wait).await {
            if frame.first() == Some(&0xe0) {
                continue;
            }
        }
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(wait, self.io.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }
}

fn header<'a>(record: &'a tern_log::Record, name: &str) -> &'a [u8] {
    record.header(name).unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn qos1_is_acknowledged_after_the_record_is_stored_with_headers() {
    let h = Harness::new(MemoryLog::new(2)).await;
    let mut c = h.connect(Version::V4, "dev-1", true).await;
    let commit = Duration::from_millis(100);
    h.log.hold_answers([commit]);
    let sent = tokio::time::Instant::now();
    c.publish("site/a/temp", b"21.5", QoS::AtLeastOnce, 7).await;
    assert_eq!(
        c.try_frame(commit / 2).await,
        None,
        "no PUBACK while the append's commit is held"
    );
    assert!(
        h.records().is_empty(),
        "nothing is durable before the commit"
    );
    assert_eq!(c.frame().await, [0x40, 2, 0, 7]);
    assert!(sent.elapsed() >= commit, "PUBACK came before the commit");
    let records = h.records();
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.value, &b"21.5"[..]);
    assert_eq!(record.key.as_deref(), Some(&b"site/a/temp"[..]));
    assert_eq!(header(record, message::TOPIC), b"site/a/temp");
    assert_eq!(header(record, message::QOS), b"1");
    assert_eq!(header(record, message::CLIENT_ID), b"dev-1");
    assert!((message::now_ms() - record.timestamp_ms).abs() < 10_000);
}

#[tokio::test(start_paused = true)]
async fn a_full_log_gets_quota_exceeded_on_v5_and_no_ack_on_v4() {
    let h = Harness::new(MemoryLog::new(1)).await;
    h.log.set_full(true);
    let mut v5 = h.connect(Version::V5, "v5", true).await;
    v5.publish("t", b"x", QoS::AtLeastOnce, 1).await;
    assert_eq!(v5.frame().await, [0x40, 4, 0, 1, 0x97, 0]);
    v5.publish("t", b"x", QoS::ExactlyOnce, 2).await;
    assert_eq!(v5.frame().await, [0x50, 4, 0, 2, 0x97, 0]);

    let mut v4 = h.connect(Version::V4, "v4", true).await;
    v4.publish("t", b"x", QoS::AtLeastOnce, 1).await;
    v4.send(&[0xc0, 0]).await;
    assert_eq!(
        v4.frame().await,
        [0xd0, 0],
        "PINGRESP, not a PUBACK, comes first"
    );
    assert!(h.records().is_empty());
    h.log.set_full(false);
    v4.publish("t", b"x", QoS::AtLeastOnce, 1).await;
    assert_eq!(v4.frame().await, [0x40, 2, 0, 1]);
    assert_eq!(h.records().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn qos2_is_stored_exactly_once_and_survives_a_restart() {
    let log = MemoryLog::new(1);
    let h = Harness::new(log.clone()).await;
    let mut c = h.connect(Version::V4, "q2", false).await;
    c.publish("t", b"once", QoS::ExactlyOnce, 9).await;
    assert_eq!(c.frame().await, [0x50, 2, 0, 9]);
    drop(c);

    let h = Harness::new(log).await;
    let mut c = h.connect(Version::V4, "q2", false).await;
    let mut dup = client_publish(Version::V4, "t", b"once", QoS::ExactlyOnce, 9);
    dup[0] |= 0b1000;
    c.send(&dup).await;
    assert_eq!(c.frame().await, [0x50, 2, 0, 9]);
    c.send(&[0x62, 2, 0, 9]).await;
    assert_eq!(c.frame().await, [0x70, 2, 0, 9]);
    assert_eq!(
        h.records().len(),
        1,
        "the re-sent QoS 2 publish is not stored twice"
    );
    c.publish("t", b"again", QoS::ExactlyOnce, 9).await;
    assert_eq!(c.frame().await, [0x50, 2, 0, 9]);
    assert_eq!(h.records().len(), 2, "a released packet id is new again");
}

#[tokio::test(start_paused = true)]
async fn subscribers_get_live_records_matching_their_filters() {
    let h = Harness::new(MemoryLog::new(2)).await;
    let mut sub = h.connect(Version::V4, "sub", true).await;
    sub.send(&client_subscribe(Version::V4, 1, "a/+", QoS::AtLeastOnce))
        .await;
    assert!(matches!(sub.packet().await, Packet::SubAck(..)));
    let mut publisher = h.connect(Version::V4, "pub", true).await;
    publisher.publish("b/x", b"no", QoS::AtLeastOnce, 1).await;
    publisher.publish("a/x", b"yes", QoS::AtLeastOnce, 2).await;
    assert_eq!(publisher.frame().await, [0x40, 2, 0, 1]);
    assert_eq!(publisher.frame().await, [0x40, 2, 0, 2]);
    let Packet::Publish(publish, _) = sub.packet().await else {
        panic!("expected a publish");
    };
    assert_eq!(
        (&publish.topic[..], &publish.payload[..]),
        (&b"a/x"[..], &b"yes"[..])
    );
}

#[tokio::test(start_paused = true)]
async fn a_cursor_refused_by_a_full_disk_keeps_the_connection_and_is_saved_later() {
    let log = MemoryLog::new(1);
    let h = Harness::new(log.clone()).await;
    let mut sub = h.connect(Version::V4, "keeper", false).await;
    sub.send(&client_subscribe(Version::V4, 1, "d/#", QoS::AtLeastOnce))
        .await;
    assert!(matches!(sub.packet().await, Packet::SubAck(..)));
    let mut publisher = h.connect(Version::V4, "pub", true).await;
    publisher.publish("d/0", b"m", QoS::AtLeastOnce, 1).await;
    assert_eq!(publisher.frame().await, [0x40, 2, 0, 1]);
    // PUBLISH d/0 QoS 1: fixed header, topic length 3, "d/0", then the packet id.
    let frame = sub.frame().await;
    assert_eq!(frame.get(..7), Some(&[0x32, 8, 0, 3, b'd', b'/', b'0'][..]));
    let pkid = [frame[7], frame[8]];
    log.set_no_space("mqtt", true);
    sub.send(&[0x40, 2, pkid[0], pkid[1]]).await;
    // Paused clock: lets the session's cursor ticks run (and be refused) for WAIT of virtual
    // time; nothing signals a save that did not happen.
    tokio::time::sleep(WAIT).await;
    sub.send(&[0xc0, 0]).await;
    assert_eq!(sub.frame().await, [0xd0, 0], "the connection stays");
    let cursor = || tern_log::LogPort::cursor(&log, "mqtt:keeper", "mqtt", 0);
    assert_ne!(cursor(), Some(1), "not saved yet");
    log.set_no_space("mqtt", false);
    let deadline = tokio::time::Instant::now() + WAIT;
    while cursor() != Some(1) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cursor(), Some(1), "saved once space is back");
}

#[tokio::test(start_paused = true)]
async fn a_persistent_session_resumes_after_reconnect_and_restart() {
    let log = MemoryLog::new(2);
    let h = Harness::new(log.clone()).await;
    let mut sub = h.connect(Version::V4, "keeper", false).await;
    sub.send(&client_subscribe(Version::V4, 1, "d/#", QoS::AtLeastOnce))
        .await;
    assert!(matches!(sub.packet().await, Packet::SubAck(..)));
    drop(sub);
    let mut publisher = h.connect(Version::V4, "pub", true).await;
    for i in 0..5u16 {
        publisher
            .publish(&format!("d/{i}"), b"m", QoS::AtLeastOnce, i + 1)
            .await;
        assert_eq!(publisher.frame().await, [0x40, 2, 0, (i + 1) as u8]);
    }
    drop(publisher);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let h = Harness::new(log).await;
    let mut sub = h.connect(Version::V4, "keeper", false).await;
    let mut topics = Vec::new();
    for _ in 0..5 {
        let Packet::Publish(publish, _) = sub.packet().await else {
            panic!("expected a publish");
        };
        topics.push(String::from_utf8_lossy(&publish.topic).into_owned());
    }
    topics.sort();
    assert_eq!(topics, ["d/0", "d/1", "d/2", "d/3", "d/4"]);
}

#[tokio::test(start_paused = true)]
async fn the_keep_alive_deadline_follows_each_packet_and_closes_a_silent_client() {
    let h = Harness::new(MemoryLog::new(1)).await;
    // Keep alive 60 s: tern allows one and a half times it, 90 s, after each packet.
    let mut c = h.connect(Version::V4, "pinger", true).await;
    for _ in 0..4 {
        // The paused clock moves past the deadline that held when the timer was set, never
        // past the one due now.
        tokio::time::advance(Duration::from_secs(80)).await;
        c.send(&[0xc0, 0]).await;
        assert_eq!(c.frame().await, [0xd0, 0], "a PINGRESP: still connected");
    }
    let silent = tokio::time::Instant::now();
    assert!(
        c.closed(Duration::from_secs(120)).await,
        "a silent client is closed"
    );
    let waited = silent.elapsed();
    assert!(
        waited >= Duration::from_secs(90) && waited < Duration::from_secs(91),
        "closed {waited:?} after its last packet"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retained_update_refused_by_a_full_disk_is_backpressure_not_a_disconnect() {
    let log = MemoryLog::new(1);
    let h = Harness::new(log.clone()).await;
    log.set_no_space(crate::state::STATE_TOPIC, true);
    let mut c = h.connect(Version::V5, "r5", true).await;
    let mut retained = client_publish(Version::V5, "r/1", b"kept", QoS::AtLeastOnce, 1);
    retained[0] |= 1;
    c.send(&retained).await;
    assert_eq!(c.frame().await, [0x40, 4, 0, 1, 0x97, 0], "quota exceeded");
    c.send(&[0xc0, 0]).await;
    assert_eq!(c.frame().await, [0xd0, 0], "the connection stays");
    log.set_no_space(crate::state::STATE_TOPIC, false);
    c.send(&retained).await;
    assert_eq!(
        c.frame().await,
        [0x40, 2, 0, 1],
        "stored once space is back"
    );
}

#[tokio::test(start_paused = true)]
async fn retained_messages_are_sent_on_subscribe_and_cleared_by_empty_payloads() {
    let log = MemoryLog::new(1);
    let h = Harness::new(log.clone()).await;
    let mut c = h.connect(Version::V4, "r", true).await;
    let mut retained = client_publish(Version::V4, "r/1", b"kept", QoS::AtLeastOnce, 1);
    retained[0] |= 1;
    c.send(&retained).await;
    assert_eq!(c.frame().await, [0x40, 2, 0, 1]);

    let h2 = Harness::new(log).await;
    let mut s = h2.connect(Version::V4, "s", true).await;
    s.send(&client_subscribe(Version::V4, 1, "r/#", QoS::AtMostOnce))
        .await;
    assert!(matches!(s.packet().await, Packet::SubAck(..)));
    let Packet::Publish(publish, _) = s.packet().await else {
        panic!("expected the retained message");
    };
    assert!(publish.retain);
    assert_eq!(&publish.payload[..], b"kept");

    let mut clear = client_publish(Version::V4, "r/1", b"", QoS::AtLeastOnce, 2);
    clear[0] |= 1;
    c.send(&clear).await;
    assert_eq!(c.frame().await, [0x40, 2, 0, 2]);
    assert!(h.broker.retained.matching("#").is_empty());
}

#[tokio::test(start_paused = true)]
async fn malformed_input_closes_only_that_connection() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let mut good = h.connect(Version::V4, "good", true).await;
    let mut bad = h.connect(Version::V4, "bad", true).await;
    bad.send(&[0x30, 0x02, 0xff, 0xff]).await;
    assert!(bad.closed(WAIT).await);
    let mut other = h.connect(Version::V4, "other", true).await;
    other.send(&[0xf0, 0x00]).await;
    assert!(other.closed(WAIT).await);
    good.publish("t", b"fine", QoS::AtLeastOnce, 3).await;
    assert_eq!(good.frame().await, [0x40, 2, 0, 3]);
}

#[tokio::test(start_paused = true)]
async fn oversized_packets_get_packet_too_large_on_v5() {
    let config = MqttConfig {
        max_packet_size: tern_core::ByteSize(128),
        ..MqttConfig::default()
    };
    let h = Harness::with_config(MemoryLog::new(1), config).await;
    let mut c = h.connect(Version::V5, "big", true).await;
    c.publish("t", &[0u8; 200], QoS::AtMostOnce, 0).await;
    assert_eq!(c.frame().await, [0xe0, 2, 0x95, 0]);
    assert!(c.closed(WAIT).await);
}

#[tokio::test(start_paused = true)]
async fn keep_alive_is_enforced_at_one_and_a_half_times() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let (io, _task) = h.socket();
    let mut c = Client {
        io,
        buf: BytesMut::new(),
        version: Version::V4,
        task: tokio::spawn(async {}),
    };
    c.send(&client_connect(Version::V4, "sleepy", true, 1))
        .await;
    assert_eq!(c.frame().await[0], 0x20);
    let started = tokio::time::Instant::now();
    assert!(c.closed(Duration::from_secs(3)).await);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1400), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_second_connection_with_the_same_client_id_takes_over() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let mut first = h.connect(Version::V5, "same", true).await;
    let mut second = h.connect(Version::V5, "same", true).await;
    assert_eq!(first.frame().await, [0xe0, 2, 0x8e, 0]);
    assert!(first.closed(WAIT).await);
    second.publish("t", b"x", QoS::AtLeastOnce, 1).await;
    assert_eq!(second.frame().await, [0x40, 2, 0, 1]);
    assert!(first.task.await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn empty_client_ids_get_one_assigned_on_v5_and_refused_on_persistent_v4() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let (io, _task) = h.socket();
    let mut c = Client {
        io,
        buf: BytesMut::new(),
        version: Version::V4,
        task: tokio::spawn(async {}),
    };
    c.send(&client_connect(Version::V4, "", false, 10)).await;
    assert_eq!(c.frame().await, [0x20, 2, 0, 2]);
    let mut v5 = h.connect(Version::V5, "", true).await;
    v5.publish("t", b"x", QoS::AtLeastOnce, 1).await;
    assert_eq!(v5.frame().await, [0x40, 2, 0, 1]);
    let record = &h.records()[0];
    assert!(header(record, message::CLIENT_ID).starts_with(b"tern-"));
}

#[tokio::test(start_paused = true)]
async fn a_will_is_published_when_the_connection_drops() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let (io, task) = h.socket();
    let mut c = Client {
        io,
        buf: BytesMut::new(),
        version: Version::V4,
        task,
    };
    let connect = protocol::Connect {
        keep_alive: 30,
        client_id: "mortal".to_owned(),
        clean_session: true,
    };
    let will = protocol::LastWill {
        topic: "wills/mortal".into(),
        message: "gone".into(),
        qos: QoS::AtLeastOnce,
        retain: false,
    };
    let mut frame = BytesMut::new();
    protocol::v4::V4
        .write(
            Packet::Connect(connect, None, Some(will), None, None),
            &mut frame,
        )
        .expect("encodes");
    c.send(&frame).await;
    assert_eq!(c.frame().await[0], 0x20);
    drop(c.io);
    c.task.await.expect("connection ends");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let records = h.records();
    assert_eq!(records.len(), 1);
    assert_eq!(header(&records[0], message::TOPIC), b"wills/mortal");
    assert_eq!(records[0].value, &b"gone"[..]);
}

#[tokio::test(start_paused = true)]
async fn shutdown_disconnects_clients_with_a_reason() {
    let h = Harness::new(MemoryLog::new(1)).await;
    let mut c = h.connect(Version::V5, "bye", true).await;
    h.trigger.trigger();
    assert_eq!(c.frame().await, [0xe0, 2, 0x8b, 0]);
    assert!(c.task.await.is_ok());
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    pub(super) fn run(version: Version, bytes: Vec<u8>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let h = Harness::new(MemoryLog::new(1)).await;
            let mut c = h.connect(version, "fuzz", false).await;
            c.send(&bytes).await;
            let mut tail = BytesMut::new();
            tail.put_slice(&[0xc0, 0x00]);
            let _ = c.io.write_all(&tail).await;
            drop(c.io);
            let finished = tokio::time::timeout(WAIT, c.task).await;
            assert!(
                matches!(finished, Ok(Ok(()))),
                "connection task panicked or hung"
            );
        });
    }

    /// Random bytes where the CONNECT should be: the handshake must end cleanly.
    fn run_first(bytes: Vec<u8>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let h = Harness::new(MemoryLog::new(1)).await;
            let (mut io, task) = h.socket();
            let _ = io.write_all(&bytes).await;
            drop(io);
            let finished = tokio::time::timeout(WAIT, task).await;
            assert!(matches!(finished, Ok(Ok(()))), "handshake panicked or hung");
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn random_first_packets_never_panic(
            connect in proptest::collection::vec(any::<u8>(), 0..120),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            v5 in any::<bool>(),
        ) {
            let version = if v5 { Version::V5 } else { Version::V4 };
            let mut bytes = client_connect(version, "fuzz", true, 10);
            for (at, value) in flips {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            bytes.extend_from_slice(&connect);
            run_first(bytes);
        }

        #[test]
        fn random_bytes_after_connect_never_panic(
            v5 in any::<bool>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            run(if v5 { Version::V5 } else { Version::V4 }, bytes);
        }

        #[test]
        fn random_packets_with_valid_headers_never_panic(
            v5 in any::<bool>(),
            kind in prop::sample::select(vec![0x30u8, 0x32, 0x34, 0x40, 0x50, 0x62, 0x70, 0x82, 0xa2, 0xc0, 0xe0]),
            body in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            let mut bytes = vec![kind, body.len() as u8];
            bytes.extend_from_slice(&body);
            run(if v5 { Version::V5 } else { Version::V4 }, bytes);
        }
    }
}
