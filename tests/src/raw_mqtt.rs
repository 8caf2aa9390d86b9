//! A raw-socket MQTT 3.1.1/5 client for scripted tests: it writes packets byte by byte as the
//! spec draws them, so tests see exactly what tern answers (reason codes, missing acks, closed
//! sockets) without a client library's retries in between. Loopback only.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

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
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut client = Self { stream, v5 };
        let mut body = Vec::new();
        string(&mut body, "MQTT");
        body.push(if v5 { 5 } else { 4 });
        body.push(if clean { 0x02 } else { 0x00 });
        body.extend_from_slice(&u16_bytes(keep_alive));
        if v5 {
            body.push(0);
        }
        string(&mut body, id);
        client.write_packet(0x10, &body)?;
        let (first, connack) = client.read_packet()?;
        let code = connack.get(1).copied();
        if first != 0x20 || code != Some(0) {
            bail!("CONNACK refused: {first:#x} {connack:?}");
        }
        Ok(client)
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
        let mut body = Vec::new();
        string(&mut body, topic);
        if qos > 0 {
            body.extend_from_slice(&u16_bytes(pkid));
        }
        if self.v5 {
            body.push(0);
        }
        body.extend_from_slice(payload);
        self.write_packet(0x30 | (qos << 1) | u8::from(retain), &body)
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
            let mut body = Vec::new();
            string(&mut body, topic);
            body.extend_from_slice(&u16_bytes(pkid));
            if self.v5 {
                body.push(0);
            }
            body.extend_from_slice(payload);
            push_packet(&mut bytes, 0x32, &body);
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
        let mut body = u16_bytes(pkid).to_vec();
        if self.v5 {
            body.push(0);
        }
        string(&mut body, filter);
        body.push(qos);
        self.write_packet(0x82, &body)?;
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
                self.write_packet(0x40, &u16_bytes(pkid))?;
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

    fn parse_publish(&self, first: u8, body: &[u8]) -> anyhow::Result<Received> {
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
        self.write_packet(0xe0, &[])
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
