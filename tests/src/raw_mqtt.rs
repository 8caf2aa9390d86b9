//! A raw-socket MQTT 3.1.1/5 client for scripted tests: it writes packets one by one and reads
//! them back undigested, so tests see exactly what tern answers (reason codes, missing acks,
//! closed sockets) without a client library's retries in between. Loopback only.
//!
//! MQTT 3.1.1 packets at QoS 0 and 1 are encoded and decoded by tern-shared's codec, the one the
//! sensor firmware speaks; only what that codec leaves out is written by hand here: MQTT 5
//! properties, QoS 2, and whatever a test deliberately gets wrong.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_shared::mqtt::{self, Connect, Packet, Publish, QoS};

/// A PUBLISH received from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub topic: String,
    pub payload: Vec<u8>,
    /// The packet id of a QoS 1/2 delivery.
    pub pkid: Option<u16>,
    pub dup: bool,
    pub retain: bool,
}

/// One client connection.
#[derive(Debug)]
pub struct RawClient {
    stream: TcpStream,
    v5: bool,
}

fn u16_bytes(value: u16) -> [u8; 2] {
    [(value >> 8) as u8, value as u8]
}

fn string(out: &mut Vec<u8>, text: &str) {
    let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&u16_bytes(len));
    out.extend_from_slice(text.as_bytes());
}

/// Appends `packet` encoded by tern-shared's codec to `out`; `false` (and nothing appended) if
/// the codec refuses it (a packet id 0, a field over 64 KiB), so the caller writes it by hand.
fn push_shared(out: &mut Vec<u8>, packet: &Packet<'_>) -> bool {
    let Ok(len) = packet.encoded_len() else {
        return false;
    };
    let start = out.len();
    out.resize(start + len, 0);
    match out.get_mut(start..).map(|tail| packet.encode(tail)) {
        Some(Ok(_)) => true,
        _ => {
            out.truncate(start);
            false
        }
    }
}

/// A 3.1.1 PUBLISH at QoS 0 or 1, as tern-shared's codec encodes it; `None` at QoS 2.
fn shared_publish<'a>(
    topic: &'a str,
    payload: &'a [u8],
    qos: u8,
    pkid: u16,
    retain: bool,
) -> Option<Packet<'a>> {
    let (qos, packet_id) = match qos {
        0 => (QoS::AtMostOnce, None),
        1 => (QoS::AtLeastOnce, Some(pkid)),
        _ => return None,
    };
    Some(Packet::Publish(Publish {
        topic,
        payload,
        qos,
        packet_id,
        dup: false,
        retain,
    }))
}

/// Appends one packet to `out`: the first byte, the remaining length, the body.
fn push_packet(out: &mut Vec<u8>, first: u8, body: &[u8]) {
    out.push(first);
    let mut len = body.len();
    loop {
        let byte = (len % 128) as u8;
        len /= 128;
        out.push(if len > 0 { byte | 0x80 } else { byte });
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
}

impl RawClient {
    /// Connects and sends CONNECT; fails unless CONNACK reports success.
    pub fn connect(
        addr: SocketAddr,
        id: &str,
        keep_alive: u16,
        clean: bool,
        v5: bool,
    ) -> anyhow::Result<Self> {
        let properties = if v5 { Some(&[][..]) } else { None };
        Self::connect_with(addr, id, keep_alive, clean, properties).map(|(client, _)| client)
    }

    /// Connects with MQTT 5 when `properties` (the encoded CONNECT properties, without their
    /// length) is given, else MQTT 3.1.1; fails unless CONNACK reports success, which is
    /// returned as its body.
    pub fn connect_with(
        addr: SocketAddr,
        id: &str,
        keep_alive: u16,
        clean: bool,
        properties: Option<&[u8]>,
    ) -> anyhow::Result<(Self, Vec<u8>)> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let v5 = properties.is_some();
        let mut client = Self { stream, v5 };
        let connect = Packet::Connect(Connect {
            client_id: id,
            keep_alive_s: keep_alive,
            clean_session: clean,
            credentials: None,
        });
        let mut packet = Vec::new();
        if !v5 && push_shared(&mut packet, &connect) {
            client.stream.write_all(&packet)?;
            return client.connack();
        }
        let mut body = Vec::new();
        string(&mut body, "MQTT");
        body.push(if v5 { 5 } else { 4 });
        body.push(if clean { 0x02 } else { 0x00 });
        body.extend_from_slice(&u16_bytes(keep_alive));
        if let Some(properties) = properties {
            let len = u8::try_from(properties.len())
                .ok()
                .filter(|len| *len < 0x80)
                .context("CONNECT properties longer than 127 bytes")?;
            body.push(len);
            body.extend_from_slice(properties);
        }
        string(&mut body, id);
        client.write_packet(0x10, &body)?;
        client.connack()
    }

    /// Opens a socket without sending anything, for tests that write their own CONNECT
    /// (`v5` says how later PUBLISHes are parsed).
    pub fn open(addr: SocketAddr, v5: bool) -> anyhow::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self { stream, v5 })
    }

    /// [`RawClient::open`] from the loopback address `local` (any of 127.0.0.0/8), so one test
    /// can play clients from many addresses.
    pub fn open_from(local: std::net::IpAddr, addr: SocketAddr, v5: bool) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let stream = runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(local, 0))?;
            socket.connect(addr).await?.into_std()
        })?;
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self { stream, v5 })
    }

    /// Reads CONNACK; fails unless it reports success, else returns its body.
    fn connack(mut self) -> anyhow::Result<(Self, Vec<u8>)> {
        let (first, connack) = self.read_packet()?;
        let code = connack.get(1).copied();
        if first != 0x20 || code != Some(0) {
            bail!("CONNACK refused: {first:#x} {connack:?}");
        }
        Ok((self, connack))
    }

    /// Writes one packet: the first byte, the remaining length, the body.
    pub fn write_packet(&mut self, first: u8, body: &[u8]) -> anyhow::Result<()> {
        let mut packet = Vec::with_capacity(body.len() + 5);
        push_packet(&mut packet, first, body);
        self.stream.write_all(&packet)?;
        Ok(())
    }

    /// Writes raw bytes.
    pub fn write_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Reads one packet: (first byte, body).
    pub fn read_packet(&mut self) -> anyhow::Result<(u8, Vec<u8>)> {
        let mut first = [0u8; 1];
        self.stream.read_exact(&mut first)?;
        let mut len = 0usize;
        for shift in [0, 7, 14, 21] {
            let mut byte = [0u8; 1];
            self.stream.read_exact(&mut byte)?;
            len |= usize::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body)?;
        Ok((first[0], body))
    }

    /// Sets how long reads wait.
    pub fn set_timeout(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.stream.set_read_timeout(Some(timeout))?;
        Ok(())
    }

    /// Sends PUBLISH (QoS 1 or 2 carry `pkid`).
    pub fn publish(
        &mut self,
        topic: &str,
        payload: &[u8],
        qos: u8,
        pkid: u16,
        retain: bool,
    ) -> anyhow::Result<()> {
        let mut packet = Vec::new();
        self.push_publish(&mut packet, topic, payload, qos, pkid, retain);
        self.write_raw(&packet)
    }

    /// Appends a PUBLISH: tern-shared's encoding for 3.1.1 at QoS 0/1, else by hand (QoS 2,
    /// MQTT 5's empty property list, packet id 0).
    fn push_publish(
        &self,
        out: &mut Vec<u8>,
        topic: &str,
        payload: &[u8],
        qos: u8,
        pkid: u16,
        retain: bool,
    ) {
        let shared = shared_publish(topic, payload, qos, pkid, retain);
        if !self.v5 && shared.is_some_and(|packet| push_shared(out, &packet)) {
            return;
        }
        let mut body = Vec::new();
        string(&mut body, topic);
        if qos > 0 {
            body.extend_from_slice(&u16_bytes(pkid));
        }
        if self.v5 {
            body.push(0);
        }
        body.extend_from_slice(payload);
        push_packet(out, 0x30 | (qos << 1) | u8::from(retain), &body);
    }

    /// Sends a QoS 1 PUBLISH and waits for its PUBACK; returns the reason code (0 = stored).
    pub fn publish_qos1(&mut self, topic: &str, payload: &[u8], pkid: u16) -> anyhow::Result<u8> {
        self.publish(topic, payload, 1, pkid, false)?;
        let (first, body) = self.read_packet()?;
        if first != 0x40 || body.get(..2) != Some(&u16_bytes(pkid)[..]) {
            bail!("expected PUBACK for {pkid}, got {first:#x} {body:?}");
        }
        Ok(body.get(2).copied().unwrap_or(0))
    }

    /// Sends QoS 1 PUBLISHes of `payloads` (packet ids 1, 2, …) in one write, then reads their
    /// PUBACKs; returns the indices of the payloads acknowledged with reason 0 (stored). An error
    /// (closed socket, timeout) ends the batch: the payloads without a PUBACK may or may not be
    /// stored.
    pub fn publish_batch_qos1(
        &mut self,
        topic: &str,
        payloads: &[Vec<u8>],
    ) -> anyhow::Result<Vec<usize>> {
        let mut bytes = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            let pkid = u16::try_from(i + 1).context("batch larger than 65535")?;
            self.push_publish(&mut bytes, topic, payload, 1, pkid, false);
        }
        self.stream.write_all(&bytes)?;
        let mut acked = Vec::with_capacity(payloads.len());
        for _ in payloads {
            let (first, body) = self.read_packet()?;
            let [high, low, rest @ ..] = body.as_slice() else {
                bail!("short packet {first:#x} {body:?}");
            };
            if first != 0x40 {
                bail!("expected PUBACK, got {first:#x} {body:?}");
            }
            if rest.first().copied().unwrap_or(0) == 0 {
                let pkid = usize::from(u16::from(*high) << 8 | u16::from(*low));
                acked.push(pkid.checked_sub(1).context("PUBACK for packet id 0")?);
            }
        }
        Ok(acked)
    }

    /// Subscribes to one filter and waits for SUBACK; returns the granted QoS or reason code.
    pub fn subscribe(&mut self, filter: &str, qos: u8, pkid: u16) -> anyhow::Result<u8> {
        let shared_qos = match qos {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            _ => None,
        };
        let mut packet = Vec::new();
        let encoded = shared_qos.is_some_and(|qos| {
            let subscribe = Packet::Subscribe {
                packet_id: pkid,
                filter,
                qos,
            };
            !self.v5 && push_shared(&mut packet, &subscribe)
        });
        if encoded {
            self.write_raw(&packet)?;
        } else {
            let mut body = u16_bytes(pkid).to_vec();
            if self.v5 {
                body.push(0);
            }
            string(&mut body, filter);
            body.push(qos);
            self.write_packet(0x82, &body)?;
        }
        let (first, suback) = self.read_packet()?;
        if first != 0x90 {
            bail!("expected SUBACK, got {first:#x}");
        }
        suback.last().copied().context("empty SUBACK")
    }

    /// Waits for the next PUBLISH, skipping other packets, and acknowledges it if QoS 1.
    pub fn next_publish(&mut self) -> anyhow::Result<Received> {
        loop {
            let (first, body) = self.read_packet()?;
            if first >> 4 != 3 {
                continue;
            }
            let received = self.parse_publish(first, &body)?;
            if let Some(pkid) = received.pkid {
                self.puback(pkid)?;
            }
            return Ok(received);
        }
    }

    /// Waits for the next PUBLISH, skipping other packets, without acknowledging it.
    pub fn next_publish_unacked(&mut self) -> anyhow::Result<Received> {
        loop {
            let (first, body) = self.read_packet()?;
            if first >> 4 == 3 {
                return self.parse_publish(first, &body);
            }
        }
    }

    /// PUBACK (3.1.1 layout, which MQTT 5 reads as reason 0 without properties).
    fn puback(&mut self, pkid: u16) -> anyhow::Result<()> {
        let mut packet = Vec::new();
        if push_shared(&mut packet, &Packet::PubAck { packet_id: pkid }) {
            self.write_raw(&packet)
        } else {
            self.write_packet(0x40, &u16_bytes(pkid))
        }
    }

    /// A received PUBLISH: decoded by tern-shared's codec when it is 3.1.1 at QoS 0/1, else
    /// (MQTT 5 properties, QoS 2) by hand.
    fn parse_publish(&self, first: u8, body: &[u8]) -> anyhow::Result<Received> {
        if !self.v5 {
            let mut frame = Vec::with_capacity(body.len() + 5);
            push_packet(&mut frame, first, body);
            if let Ok((Packet::Publish(p), _)) = mqtt::decode(&frame) {
                return Ok(Received {
                    topic: p.topic.to_owned(),
                    payload: p.payload.to_vec(),
                    pkid: p.packet_id,
                    dup: p.dup,
                    retain: p.retain,
                });
            }
        }
        let qos = (first >> 1) & 0b11;
        let short = || anyhow::anyhow!("PUBLISH too short");
        let topic_len = usize::from(*body.first().ok_or_else(short)?) << 8
            | usize::from(*body.get(1).ok_or_else(short)?);
        let topic = body.get(2..2 + topic_len).ok_or_else(short)?;
        let mut at = 2 + topic_len;
        let pkid = if qos > 0 {
            let id = body.get(at..at + 2).ok_or_else(short)?;
            at += 2;
            Some(u16::from(id[0]) << 8 | u16::from(id[1]))
        } else {
            None
        };
        if self.v5 {
            let mut len = 0usize;
            for shift in [0, 7, 14, 21] {
                let byte = *body.get(at).ok_or_else(short)?;
                at += 1;
                len |= usize::from(byte & 0x7f) << shift;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            at += len;
        }
        Ok(Received {
            topic: String::from_utf8_lossy(topic).into_owned(),
            payload: body.get(at..).ok_or_else(short)?.to_vec(),
            pkid,
            dup: first & 0b1000 != 0,
            retain: first & 1 != 0,
        })
    }

    /// Sends DISCONNECT (normal) and closes.
    pub fn disconnect(mut self) -> anyhow::Result<()> {
        let mut packet = Vec::new();
        push_shared(&mut packet, &Packet::Disconnect);
        self.write_raw(&packet)
    }

    /// Waits until the server closes the socket; returns how long that took.
    pub fn closed_within(&mut self, limit: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.stream.set_read_timeout(Some(limit))?;
        let mut buf = [0u8; 64];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok(started.elapsed()),
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Ok(started.elapsed());
                }
                Err(err) => bail!("still open after {limit:?}: {err}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_encodings_are_the_bytes_the_hand_written_ones_were() {
        let mut shared = Vec::new();
        let connect = Connect {
            client_id: "c1",
            keep_alive_s: 60,
            clean_session: false,
            credentials: None,
        };
        assert!(push_shared(&mut shared, &Packet::Connect(connect)));
        let publish = shared_publish("a/b", b"xy", 1, 7, true).expect("QoS 1");
        assert!(push_shared(&mut shared, &publish));
        let mut by_hand = Vec::new();
        let mut body = Vec::new();
        string(&mut body, "MQTT");
        body.extend_from_slice(&[4, 0x00, 0, 60]);
        string(&mut body, "c1");
        push_packet(&mut by_hand, 0x10, &body);
        let mut body = Vec::new();
        string(&mut body, "a/b");
        body.extend_from_slice(&u16_bytes(7));
        body.extend_from_slice(b"xy");
        push_packet(&mut by_hand, 0x33, &body);
        assert_eq!(shared, by_hand);
    }

    #[test]
    fn what_the_shared_codec_refuses_is_left_to_the_hand_written_encoder() {
        let mut out = Vec::new();
        let zero_id = shared_publish("t", b"", 1, 0, false).expect("QoS 1");
        assert!(!push_shared(&mut out, &zero_id));
        assert!(out.is_empty());
        assert!(shared_publish("t", b"", 2, 1, false).is_none());
    }
}
