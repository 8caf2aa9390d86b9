//! Client behaviour against an in-memory peer that answers with this crate's own codec: CONNACK,
//! PUBACK (optionally withheld to force a DUP resend), SUBACK, PINGRESP, and a pushed command.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;

use super::*;
use crate::mqtt::packet::decode;

/// A clock that moves one millisecond each time it is read, so timeouts pass in bounded loops.
#[derive(Debug, Clone, Default)]
struct StepClock(Rc<Cell<u64>>);

impl Clock for StepClock {
    fn now_ms(&self) -> u64 {
        let now = self.0.get() + 1;
        self.0.set(now);
        now
    }
}

/// The peer: decodes what the client writes, records it, and queues replies.
#[derive(Debug, Default)]
struct Peer {
    to_client: VecDeque<u8>,
    from_client: Vec<u8>,
    sent: Vec<Vec<u8>>,
    withhold_pubacks: usize,
    silent: bool,
    /// Each reply is held back for this many `read_ready` calls (a busy gateway, one still
    /// checking the password); each wait-loop turn reads the clock, so that is as many ms.
    slow_reads: usize,
    held: usize,
}

impl embedded_io::ErrorType for Peer {
    type Error = core::convert::Infallible;
}

impl Read for Peer {
    fn read(&mut self, buf: &mut [u8]) -> core::result::Result<usize, Self::Error> {
        let n = buf.len().min(self.to_client.len());
        for slot in buf.iter_mut().take(n) {
            *slot = self.to_client.pop_front().unwrap_or(0);
        }
        Ok(n)
    }
}

impl ReadReady for Peer {
    fn read_ready(&mut self) -> core::result::Result<bool, Self::Error> {
        if self.held > 0 {
            self.held -= 1;
            return Ok(false);
        }
        Ok(!self.to_client.is_empty())
    }
}

impl Write for Peer {
    fn write(&mut self, buf: &[u8]) -> core::result::Result<usize, Self::Error> {
        self.from_client.extend_from_slice(buf);
        let mut pending = std::mem::take(&mut self.from_client);
        while let Ok((packet, used)) = decode(&pending) {
            self.sent.push(pending[..used].to_vec());
            let reply = self.reply(&packet);
            pending.drain(..used);
            if let Some(reply) = reply {
                self.push(&reply);
            }
        }
        self.from_client = pending;
        Ok(buf.len())
    }

    fn flush(&mut self) -> core::result::Result<(), Self::Error> {
        Ok(())
    }
}

impl Peer {
    fn reply(&mut self, packet: &Packet<'_>) -> Option<Packet<'static>> {
        if self.silent {
            return None;
        }
        match *packet {
            Packet::Connect(_) => Some(Packet::ConnAck {
                session_present: false,
                code: 0,
            }),
            Packet::Publish(Publish {
                packet_id: Some(packet_id),
                ..
            }) => {
                if self.withhold_pubacks > 0 {
                    self.withhold_pubacks -= 1;
                    return None;
                }
                Some(Packet::PubAck { packet_id })
            }
            Packet::Subscribe { packet_id, .. } => Some(Packet::SubAck { packet_id, code: 1 }),
            Packet::PingReq => Some(Packet::PingResp),
            _ => None,
        }
    }

    fn push(&mut self, packet: &Packet<'_>) {
        let mut buf = [0u8; 256];
        let len = packet.encode(&mut buf).unwrap();
        self.to_client.extend(&buf[..len]);
        self.held = self.slow_reads;
    }
}

fn config() -> ClientConfig<'static> {
    ClientConfig {
        client_id: "tern-7",
        credentials: None,
        keep_alive_s: 2,
        clean_session: true,
        connect_timeout_ms: 50,
        ack_timeout_ms: 50,
        max_retries: 2,
    }
}

fn client(peer: Peer) -> Client<'static, Peer, StepClock> {
    Client::new(peer, StepClock::default(), config())
}

fn first_byte_of_each(peer: &Peer) -> Vec<u8> {
    peer.sent.iter().map(|p| p[0]).collect()
}

#[test]
fn connect_then_qos1_publish_is_acknowledged() {
    let mut c = client(Peer::default());
    assert_eq!(c.connect(), Ok(()));
    assert_eq!(
        c.publish("sensors/7/reading", b"hi", QoS::AtLeastOnce),
        Ok(())
    );
    assert!(c.is_connected());
    let peer = c.into_transport();
    assert_eq!(first_byte_of_each(&peer), vec![0x10, 0x32]);
}

#[test]
fn every_connect_carries_the_configured_login() {
    let login = Credentials {
        username: "7",
        password: b"s3cret",
    };
    let config = ClientConfig {
        credentials: Some(login),
        ..config()
    };
    let mut c: Client<'static, Peer, StepClock> =
        Client::new(Peer::default(), StepClock::default(), config);
    assert_eq!(c.connect(), Ok(()));
    assert_eq!(c.connect(), Ok(()));
    let peer = c.into_transport();
    assert_eq!(peer.sent.len(), 2);
    for bytes in &peer.sent {
        let Ok((Packet::Connect(connect), _)) = decode(bytes) else {
            panic!("not a CONNECT: {bytes:?}");
        };
        assert_eq!(connect.credentials, Some(login));
    }
}

#[test]
fn missing_puback_is_resent_with_dup_set() {
    let mut c = client(Peer {
        withhold_pubacks: 1,
        ..Peer::default()
    });
    assert_eq!(c.connect(), Ok(()));
    assert_eq!(c.publish("t", b"x", QoS::AtLeastOnce), Ok(()));
    let peer = c.into_transport();
    // CONNECT, PUBLISH (qos 1), PUBLISH (qos 1, DUP); same packet id in both.
    assert_eq!(first_byte_of_each(&peer), vec![0x10, 0x32, 0x3a]);
    assert_eq!(peer.sent[1][5..7], peer.sent[2][5..7]);
}

#[test]
fn publish_fails_after_all_retries() {
    let mut c = client(Peer {
        withhold_pubacks: usize::MAX,
        ..Peer::default()
    });
    assert_eq!(c.connect(), Ok(()));
    assert_eq!(
        c.publish("t", b"x", QoS::AtLeastOnce),
        Err(ClientError::Timeout {
            awaiting: Awaiting::PubAck { packet_id: 1 }
        })
    );
    assert!(!c.is_connected());
    assert_eq!(
        c.publish("t", b"x", QoS::AtMostOnce),
        Err(ClientError::NotConnected)
    );
    let peer = c.into_transport();
    assert_eq!(first_byte_of_each(&peer), vec![0x10, 0x32, 0x3a, 0x3a]);
}

#[test]
fn silent_server_times_out_connect() {
    let mut c = client(Peer {
        silent: true,
        ..Peer::default()
    });
    assert_eq!(
        c.connect(),
        Err(ClientError::Timeout {
            awaiting: Awaiting::ConnAck
        })
    );
}

#[test]
fn slow_connack_and_suback_within_connect_timeout_set_up_the_session() {
    // CONNACK and SUBACK come after more than `ack_timeout_ms` (50) but inside
    // `connect_timeout_ms`.
    let slow = || Peer {
        slow_reads: 200,
        ..Peer::default()
    };
    let patient = ClientConfig {
        connect_timeout_ms: 1_000,
        ..config()
    };
    let mut c: Client<'static, Peer, StepClock> =
        Client::new(slow(), StepClock::default(), patient);
    assert_eq!(c.connect(), Ok(()));
    assert_eq!(c.subscribe("sensors/7/command"), Ok(()));
    assert!(c.is_connected());
    // A PUBACK as slow is still only waited for `ack_timeout_ms`, then resent with DUP.
    assert_eq!(
        c.publish("sensors/7/reading", b"hi", QoS::AtLeastOnce),
        Err(ClientError::Timeout {
            awaiting: Awaiting::PubAck { packet_id: 2 }
        })
    );
    let peer = c.into_transport();
    assert_eq!(
        first_byte_of_each(&peer),
        vec![0x10, 0x82, 0x32, 0x3a, 0x3a]
    );
    // Control: the same gateway with the CONNACK held to `ack_timeout_ms` is a timeout.
    let mut c = client(slow());
    assert_eq!(
        c.connect(),
        Err(ClientError::Timeout {
            awaiting: Awaiting::ConnAck
        })
    );
}

#[test]
fn refused_connack_is_reported() {
    let mut peer = Peer {
        silent: true,
        ..Peer::default()
    };
    peer.push(&Packet::ConnAck {
        session_present: false,
        code: 5,
    });
    let mut c = client(peer);
    assert_eq!(c.connect(), Err(ClientError::Refused { code: 5 }));
}

#[test]
fn idle_client_pings_and_receives_commands() {
    let mut c = client(Peer::default());
    assert_eq!(c.connect(), Ok(()));
    assert_eq!(c.subscribe("sensors/7/command"), Ok(()));
    for _ in 0..1200 {
        assert_eq!(c.poll(), Ok(()));
    }
    let mut peer = c.into_transport();
    assert!(peer.sent.iter().any(|p| p == &[0xc0, 0]), "no PINGREQ sent");
    peer.push(&Packet::Publish(Publish {
        topic: "sensors/7/command",
        payload: b"period=500",
        qos: QoS::AtLeastOnce,
        packet_id: Some(9),
        dup: false,
        retain: false,
    }));
    let mut c = client(peer);
    c.connected = true;
    assert_eq!(c.poll(), Ok(()));
    assert_eq!(c.take_command().as_deref(), Some(&b"period=500"[..]));
    assert_eq!(c.take_command(), None);
    let peer = c.into_transport();
    assert_eq!(peer.sent.last(), Some(&vec![0x40, 2, 0, 9]));
}

#[test]
fn garbage_from_server_is_a_decode_error() {
    let mut peer = Peer {
        silent: true,
        ..Peer::default()
    };
    peer.to_client.extend([0x50, 2, 0, 1]);
    let mut c = client(peer);
    assert_eq!(
        c.connect(),
        Err(ClientError::Decode(
            packet::DecodeError::UnsupportedPacketType { packet_type: 5 }
        ))
    );
}
