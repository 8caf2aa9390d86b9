//! The firmware's MQTT client talks to rumqttd's v4 codec: every packet the client writes must
//! decode in rumqttd with the intended fields and re-encode to exactly the same bytes, and every
//! packet rumqttd encodes for the client must decode in the client's codec.

use std::cell::Cell;
use std::rc::Rc;

use bytes::BytesMut;
use rumqttd::protocol::v4::V4;
use rumqttd::protocol::{
    ConnAck, ConnectReturnCode, Packet as Rumqttd, PingResp, Protocol, PubAck, PubAckReason,
    Publish as RumqttdPublish, QoS as RumqttdQoS, SubAck, SubscribeReasonCode,
};
use tern_shared::mqtt::{Client, ClientConfig, Clock, Credentials, Packet, QoS, decode};

const MAX_PACKET: usize = 1024;

/// A clock that moves one millisecond per reading, so timeouts pass without sleeping.
#[derive(Debug, Clone, Default)]
struct StepClock(Rc<Cell<u64>>);

impl Clock for StepClock {
    fn now_ms(&self) -> u64 {
        self.0.set(self.0.get() + 1);
        self.0.get()
    }
}

/// The broker end of the pipe: rumqttd's codec decodes what the client wrote and encodes the
/// answers. Each client packet is kept with its exact bytes.
#[derive(Debug, Default)]
struct RumqttdEnd {
    inbound: BytesMut,
    outbound: std::collections::VecDeque<u8>,
    received: Vec<(Rumqttd, Vec<u8>)>,
    withheld_pubacks: usize,
}

impl embedded_io::ErrorType for RumqttdEnd {
    type Error = std::io::Error;
}

impl embedded_io::Write for RumqttdEnd {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inbound.extend_from_slice(buf);
        loop {
            let before = self.inbound.clone();
            match V4.read_mut(&mut self.inbound, MAX_PACKET) {
                Ok(packet) => {
                    let used = before.len() - self.inbound.len();
                    self.answer(&packet);
                    self.received.push((packet, before[..used].to_vec()));
                }
                Err(rumqttd::protocol::Error::InsufficientBytes(_)) => return Ok(buf.len()),
                Err(err) => panic!("rumqttd rejected the client's bytes {before:?}: {err:?}"),
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl embedded_io::Read for RumqttdEnd {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.outbound.len());
        for (slot, byte) in buf.iter_mut().zip(self.outbound.drain(..n)) {
            *slot = byte;
        }
        Ok(n)
    }
}

impl embedded_io::ReadReady for RumqttdEnd {
    fn read_ready(&mut self) -> std::io::Result<bool> {
        Ok(!self.outbound.is_empty())
    }
}

impl RumqttdEnd {
    fn answer(&mut self, packet: &Rumqttd) {
        let reply = match packet {
            Rumqttd::Connect(..) => Rumqttd::ConnAck(
                ConnAck {
                    session_present: false,
                    code: ConnectReturnCode::Success,
                },
                None,
            ),
            Rumqttd::Subscribe(subscribe, _) => Rumqttd::SubAck(
                SubAck {
                    pkid: subscribe.pkid,
                    return_codes: vec![SubscribeReasonCode::Success(RumqttdQoS::AtLeastOnce)],
                },
                None,
            ),
            Rumqttd::Publish(publish, _) => {
                let Some(pkid) = publish_pkid(publish) else {
                    return;
                };
                if self.withheld_pubacks > 0 {
                    self.withheld_pubacks -= 1;
                    return;
                }
                Rumqttd::PubAck(
                    PubAck {
                        pkid,
                        reason: PubAckReason::Success,
                    },
                    None,
                )
            }
            Rumqttd::PingReq(_) => Rumqttd::PingResp(PingResp),
            _ => return,
        };
        let mut bytes = BytesMut::new();
        V4.write(reply, &mut bytes)
            .expect("rumqttd encodes its own reply");
        self.outbound.extend(bytes.iter());
    }
}

/// rumqttd keeps QoS and packet id crate-private; its Debug output shows them.
fn publish_pkid(publish: &RumqttdPublish) -> Option<u16> {
    let debug = format!("{publish:?}");
    if debug.contains("qos: AtMostOnce") {
        return None;
    }
    let after = debug.split("pkid: ").nth(1)?;
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn reencoded(packet: &Rumqttd) -> Vec<u8> {
    let mut bytes = BytesMut::new();
    V4.write(packet.clone(), &mut bytes)
        .expect("rumqttd re-encodes what it decoded");
    bytes.to_vec()
}

fn config() -> ClientConfig<'static> {
    ClientConfig {
        client_id: "tern-7",
        credentials: None,
        keep_alive_s: 1,
        // The firmware's persistent session: the flag must reach the broker as sent.
        clean_session: false,
        connect_timeout_ms: 50,
        ack_timeout_ms: 50,
        max_retries: 2,
    }
}

#[test]
fn every_client_packet_decodes_in_rumqttd_and_reencodes_byte_for_byte() {
    let broker = RumqttdEnd {
        withheld_pubacks: 1,
        ..RumqttdEnd::default()
    };
    let mut client: Client<'_, _, _> = Client::new(broker, StepClock::default(), config());
    client.connect().expect("CONNACK from rumqttd's encoder");
    client
        .subscribe("sensors/7/command")
        .expect("SUBACK from rumqttd's encoder");
    client
        .publish("sensors/7/reading", &[1, 7, 0, 0], QoS::AtLeastOnce)
        .expect("PUBACK after one DUP resend");
    client
        .publish("sensors/7/status", b"ok", QoS::AtMostOnce)
        .expect("QoS 0 needs no answer");
    for _ in 0..1000 {
        client.poll().expect("PINGRESP from rumqttd's encoder");
    }
    client.disconnect().expect("DISCONNECT written");
    let broker = client.into_transport();

    for (packet, bytes) in &broker.received {
        assert_eq!(
            &reencoded(packet),
            bytes,
            "rumqttd re-encodes {packet:?} differently"
        );
    }
    let kinds: Vec<String> = broker
        .received
        .iter()
        .map(|(p, _)| format!("{p:?}").split('(').next().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        kinds[..5],
        ["Connect", "Subscribe", "Publish", "Publish", "Publish"]
    );
    assert!(
        kinds.contains(&"PingReq".to_owned()),
        "no PINGREQ in {kinds:?}"
    );
    assert_eq!(kinds.last().map(String::as_str), Some("Disconnect"));

    let Rumqttd::Connect(connect, ..) = &broker.received[0].0 else {
        panic!("first packet is not CONNECT")
    };
    assert_eq!(
        (
            connect.client_id.as_str(),
            connect.keep_alive,
            connect.clean_session
        ),
        ("tern-7", 1, false)
    );
    let Rumqttd::Subscribe(subscribe, _) = &broker.received[1].0 else {
        panic!("second packet is not SUBSCRIBE")
    };
    assert_eq!(subscribe.filters.len(), 1);
    assert_eq!(subscribe.filters[0].path, "sensors/7/command");
    assert_eq!(subscribe.filters[0].qos, RumqttdQoS::AtLeastOnce);

    let publishes: Vec<&RumqttdPublish> = broker
        .received
        .iter()
        .filter_map(|(p, _)| match p {
            Rumqttd::Publish(publish, _) => Some(publish),
            _ => None,
        })
        .collect();
    assert_eq!(&publishes[0].topic[..], b"sensors/7/reading");
    assert_eq!(&publishes[0].payload[..], &[1, 7, 0, 0]);
    assert_eq!(publish_pkid(publishes[0]), Some(2));
    // The resend after the withheld PUBACK: same packet id, DUP set.
    assert_eq!(publish_pkid(publishes[1]), Some(2));
    assert!(format!("{:?}", publishes[1]).contains("dup: true"));
    assert!(format!("{:?}", publishes[0]).contains("dup: false"));
    assert_eq!(&publishes[2].topic[..], b"sensors/7/status");
    assert_eq!(publish_pkid(publishes[2]), None);
}

#[test]
fn a_device_login_decodes_in_rumqttd_and_reencodes_byte_for_byte() {
    let login = Credentials {
        username: "7",
        password: b"correct horse",
    };
    let config = ClientConfig {
        credentials: Some(login),
        ..config()
    };
    let mut client: Client<'_, _, _> =
        Client::new(RumqttdEnd::default(), StepClock::default(), config);
    client.connect().expect("CONNACK from rumqttd's encoder");
    let broker = client.into_transport();
    let [(packet, bytes)] = &broker.received[..] else {
        panic!("expected one CONNECT, got {:?}", broker.received);
    };
    assert_eq!(
        &reencoded(packet),
        bytes,
        "rumqttd re-encodes {packet:?} differently"
    );
    let Rumqttd::Connect(connect, None, None, None, Some(rumqttd_login)) = packet else {
        panic!("not a CONNECT with a login and no will: {packet:?}");
    };
    assert_eq!(connect.client_id, "tern-7");
    assert_eq!(
        (
            rumqttd_login.username.as_str(),
            rumqttd_login.password.as_str()
        ),
        ("7", "correct horse")
    );
}

#[test]
fn packets_rumqttd_encodes_decode_in_the_client_codec() {
    let cases = [
        (
            Rumqttd::ConnAck(
                ConnAck {
                    session_present: true,
                    code: ConnectReturnCode::NotAuthorized,
                },
                None,
            ),
            Packet::ConnAck {
                session_present: true,
                code: 5,
            },
        ),
        (
            Rumqttd::PubAck(
                PubAck {
                    pkid: 513,
                    reason: PubAckReason::Success,
                },
                None,
            ),
            Packet::PubAck { packet_id: 513 },
        ),
        (
            Rumqttd::SubAck(
                SubAck {
                    pkid: 9,
                    return_codes: vec![SubscribeReasonCode::Failure],
                },
                None,
            ),
            Packet::SubAck {
                packet_id: 9,
                code: 0x80,
            },
        ),
        (Rumqttd::PingResp(PingResp), Packet::PingResp),
    ];
    for (theirs, ours) in cases {
        let bytes = reencoded(&theirs);
        assert_eq!(decode(&bytes), Ok((ours, bytes.len())), "{theirs:?}");
    }
    let command = Rumqttd::Publish(
        RumqttdPublish::new("sensors/7/command", "halt", false),
        None,
    );
    let bytes = reencoded(&command);
    let (Packet::Publish(publish), used) = decode(&bytes).expect("PUBLISH decodes") else {
        panic!("not a PUBLISH")
    };
    assert_eq!(used, bytes.len());
    assert_eq!(
        (publish.topic, publish.payload, publish.qos),
        ("sensors/7/command", &b"halt"[..], QoS::AtMostOnce)
    );
}
