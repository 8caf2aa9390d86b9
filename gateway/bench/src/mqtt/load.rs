//! One load run against one broker: N publisher connections, each sending M messages of S bytes
//! at QoS 0 or 1, pipelined with an inflight window, timed from the first publish to the last
//! PUBACK (QoS 1) or to the PINGRESP that follows the last publish (QoS 0: the broker answers
//! PINGREQ only after it has read everything before it). Also holds idle connections open for
//! the memory figure. Packets are encoded and decoded by tern-shared's MQTT 3.1.1 codec, the
//! one the sensor firmware speaks; this file only frames them onto the socket.
//!
//! It must never start or stop a broker (that is `servers.rs`), never judge the figures, and
//! never panic on what a broker sends: malformed packets become errors.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use tern_shared::mqtt::{self, Connect, DecodeError, Packet, Publish, QoS};

use crate::BenchError;

/// The shape of one load run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub publishers: usize,
    pub messages: usize,
    pub size: usize,
    pub qos1: bool,
    /// Unacknowledged QoS 1 publishes per connection.
    pub window: usize,
}

/// What one load run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub msgs_per_sec: f64,
    /// PUBACK latencies in microseconds, sorted (empty at QoS 0).
    pub latencies_us: Vec<f64>,
}

/// A broker that says nothing for this long has stalled.
const STALL: Duration = Duration::from_secs(30);

/// Keep alive announced by bench clients; long enough that idle clients never ping.
const KEEP_ALIVE_SECS: u16 = 600;

/// A packet a broker sends to a publisher, reduced to what the load needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FromBroker {
    /// CONNACK with its return code (0 = accepted).
    ConnAck {
        code: u8,
    },
    PubAck {
        pkid: u16,
    },
    PingResp,
    /// Any other packet type (a publisher that subscribes to nothing ignores it).
    Other {
        packet_type: u8,
    },
}

/// Appends `packet` to `out`, growing it by exactly the packet's length.
pub(crate) fn put(out: &mut BytesMut, packet: &Packet<'_>) -> Result<(), BenchError> {
    let start = out.len();
    out.resize(start + packet.encoded_len()?, 0);
    let tail = out.get_mut(start..).unwrap_or_default();
    packet.encode(tail)?;
    Ok(())
}

/// A PUBLISH at QoS 0 (`pkid` unused) or QoS 1, no retain, no dup.
pub(crate) fn publish<'a>(topic: &'a str, qos1: bool, pkid: u16, payload: &'a [u8]) -> Packet<'a> {
    Packet::Publish(Publish {
        topic,
        payload,
        qos: if qos1 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        },
        packet_id: qos1.then_some(pkid),
        dup: false,
        retain: false,
    })
}

/// Takes the first complete packet off `buf`; `Ok(None)` if more bytes are needed.
pub(crate) fn next(buf: &mut BytesMut) -> Result<Option<FromBroker>, BenchError> {
    let frame = match mqtt::frame(buf) {
        Ok(frame) => frame,
        Err(DecodeError::Incomplete { .. }) => return Ok(None),
        Err(err) => return Err(err.into()),
    };
    let bytes = buf.split_to(frame.len);
    let packet = match mqtt::decode(&bytes) {
        Ok((Packet::ConnAck { code, .. }, _)) => FromBroker::ConnAck { code },
        Ok((Packet::PubAck { packet_id }, _)) => FromBroker::PubAck { pkid: packet_id },
        Ok((Packet::PingResp, _)) => FromBroker::PingResp,
        Ok(_) | Err(DecodeError::UnsupportedPacketType { .. }) => FromBroker::Other {
            packet_type: frame.packet_type,
        },
        Err(err) => return Err(err.into()),
    };
    Ok(Some(packet))
}

/// A connected publisher.
#[derive(Debug)]
struct Publisher {
    stream: TcpStream,
    inbuf: BytesMut,
    topic: String,
}

/// Runs `load` against `broker`; `label` keeps client ids of runs apart.
pub async fn run(broker: SocketAddr, load: Load, label: &str) -> Result<Measured, BenchError> {
    let mut publishers = Vec::with_capacity(load.publishers);
    for i in 0..load.publishers {
        let id = format!("bench-{label}-{i}");
        let (stream, inbuf) = connect(broker, &id).await?;
        let topic = format!("bench/{i}");
        publishers.push(Publisher {
            stream,
            inbuf,
            topic,
        });
    }
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for publisher in publishers {
        tasks.spawn(publisher.send_all(load));
    }
    let mut latencies = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let done = joined.map_err(|err| BenchError::task("a publisher task", err))??;
        latencies.extend(done);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let total = (load.publishers * load.messages) as f64;
    Ok(Measured {
        msgs_per_sec: total / elapsed.max(f64::MIN_POSITIVE),
        latencies_us: latencies,
    })
}

/// Opens a TCP connection and completes the MQTT handshake; returns leftover read bytes.
pub async fn connect(broker: SocketAddr, id: &str) -> Result<(TcpStream, BytesMut), BenchError> {
    let io = |source| BenchError::Io {
        what: "connecting a bench client",
        source,
    };
    let mut stream = TcpStream::connect(broker).await.map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let mut out = BytesMut::new();
    let connect = Connect {
        client_id: id,
        keep_alive_s: KEEP_ALIVE_SECS,
        clean_session: true,
        credentials: None,
    };
    put(&mut out, &Packet::Connect(connect))?;
    stream.write_all(&out).await.map_err(io)?;
    let mut inbuf = BytesMut::with_capacity(4096);
    match read_packet(&mut stream, &mut inbuf).await? {
        FromBroker::ConnAck { code: 0 } => Ok((stream, inbuf)),
        FromBroker::ConnAck { code } => Err(BenchError::Refused { code }),
        other => Err(BenchError::Unexpected {
            got: format!("{other:?}"),
            wanted: "CONNACK",
        }),
    }
}

/// Connects `count` clients that stay idle until the returned streams drop.
pub async fn idle_clients(broker: SocketAddr, count: usize) -> Result<Vec<TcpStream>, BenchError> {
    idle_clients_from(broker, 0, count).await
}

/// [`idle_clients`] with the client ids numbered from `first` (more clients beside earlier
/// ones).
pub async fn idle_clients_from(
    broker: SocketAddr,
    first: usize,
    count: usize,
) -> Result<Vec<TcpStream>, BenchError> {
    let mut clients = Vec::with_capacity(count);
    for i in first..first + count {
        let (stream, _) = connect(broker, &format!("bench-idle-{i}")).await?;
        clients.push(stream);
    }
    Ok(clients)
}

/// Reads until one packet is complete.
pub(crate) async fn read_packet(
    stream: &mut TcpStream,
    inbuf: &mut BytesMut,
) -> Result<FromBroker, BenchError> {
    loop {
        if let Some(packet) = next(inbuf)? {
            return Ok(packet);
        }
        let read = tokio::time::timeout(STALL, stream.read_buf(inbuf))
            .await
            .map_err(|_| BenchError::Silent { after: STALL })?
            .map_err(|source| BenchError::Io {
                what: "reading from the broker",
                source,
            })?;
        if read == 0 {
            return Err(BenchError::Closed);
        }
    }
}

impl Publisher {
    /// Sends every message, returning PUBACK latencies in microseconds.
    async fn send_all(mut self, load: Load) -> Result<Vec<f64>, BenchError> {
        let payload = vec![0x5a; load.size];
        let mut out = BytesMut::with_capacity(64 * 1024);
        let mut sent_at: HashMap<u16, Instant> = HashMap::with_capacity(load.window);
        let mut latencies = Vec::with_capacity(if load.qos1 { load.messages } else { 0 });
        let mut sent = 0usize;
        let mut next_pkid: u16 = 1;
        let window = if load.qos1 { load.window.max(1) } else { 64 };
        while sent < load.messages || !sent_at.is_empty() {
            while sent < load.messages && sent_at.len() < window && out.len() < 64 * 1024 {
                put(
                    &mut out,
                    &publish(&self.topic, load.qos1, next_pkid, &payload),
                )?;
                if load.qos1 {
                    sent_at.insert(next_pkid, Instant::now());
                    next_pkid = next_pkid.checked_add(1).unwrap_or(1);
                }
                sent += 1;
            }
            if !out.is_empty() {
                self.write(&out).await?;
                out.clear();
            }
            if !load.qos1 {
                continue;
            }
            self.read_acks(&mut sent_at, &mut latencies).await?;
        }
        if !load.qos1 {
            put(&mut out, &Packet::PingReq)?;
            self.write(&out).await?;
            self.await_packet(FromBroker::PingResp, "PINGRESP").await?;
        }
        out.clear();
        put(&mut out, &Packet::Disconnect)?;
        self.write(&out).await?;
        Ok(latencies)
    }

    /// Waits for at least one packet, then handles every complete one.
    async fn read_acks(
        &mut self,
        sent_at: &mut HashMap<u16, Instant>,
        latencies: &mut Vec<f64>,
    ) -> Result<(), BenchError> {
        let mut packet = Some(read_packet(&mut self.stream, &mut self.inbuf).await?);
        while let Some(got) = packet {
            if let FromBroker::PubAck { pkid } = got {
                let at = sent_at.remove(&pkid).ok_or(BenchError::Unexpected {
                    got: format!("PUBACK for unknown packet id {pkid}"),
                    wanted: "PUBACK",
                })?;
                latencies.push(at.elapsed().as_secs_f64() * 1e6);
            }
            packet = next(&mut self.inbuf)?;
        }
        Ok(())
    }

    async fn await_packet(
        &mut self,
        wanted: FromBroker,
        name: &'static str,
    ) -> Result<(), BenchError> {
        loop {
            let got = read_packet(&mut self.stream, &mut self.inbuf).await?;
            if got == wanted {
                return Ok(());
            }
            if !matches!(got, FromBroker::Other { .. }) {
                return Err(BenchError::Unexpected {
                    got: format!("{got:?}"),
                    wanted: name,
                });
            }
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), BenchError> {
        tokio::time::timeout(STALL, self.stream.write_all(bytes))
            .await
            .map_err(|_| BenchError::Silent { after: STALL })?
            .map_err(|source| BenchError::Io {
                what: "writing to the broker",
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    #[test]
    fn bench_packets_have_the_exact_bytes() {
        let mut out = BytesMut::new();
        let connect = Connect {
            client_id: "b1",
            keep_alive_s: 60,
            clean_session: true,
            credentials: None,
        };
        put(&mut out, &Packet::Connect(connect)).expect("encodes");
        put(&mut out, &publish("b/3", true, 513, &[7, 7])).expect("encodes");
        put(&mut out, &publish("b/3", false, 513, &[7])).expect("encodes");
        put(&mut out, &Packet::PingReq).expect("encodes");
        put(&mut out, &Packet::Disconnect).expect("encodes");
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 2, b'b', b'1',
            0x32, 9, 0, 3, b'b', b'/', b'3', 2, 1, 7, 7,
            0x30, 6, 0, 3, b'b', b'/', b'3', 7,
            0xc0, 0,
            0xe0, 0,
        ];
        assert_eq!(&out[..], expected);
    }

    #[test]
    fn payloads_past_64_kib_are_one_well_formed_frame() {
        let mut out = BytesMut::new();
        let payload = vec![0u8; 100_000];
        put(&mut out, &publish("t", true, 1, &payload)).expect("encodes");
        let frame = mqtt::frame(&out).expect("one whole frame");
        assert_eq!(frame.len, out.len());
        assert_eq!(frame.header_len, 4);
    }

    #[test]
    fn broker_packets_decode_across_split_reads() {
        let bytes = [
            0x20, 2, 0, 0, 0x40, 2, 0x01, 0x02, 0xd0, 0, 0x90, 3, 0, 1, 0, 0xb0, 2, 0, 1,
        ];
        let mut buf = BytesMut::new();
        let mut seen = Vec::new();
        for byte in bytes {
            buf.put_u8(byte);
            while let Some(packet) = next(&mut buf).expect("valid bytes") {
                seen.push(packet);
            }
        }
        assert_eq!(
            seen,
            vec![
                FromBroker::ConnAck { code: 0 },
                FromBroker::PubAck { pkid: 0x0102 },
                FromBroker::PingResp,
                FromBroker::Other { packet_type: 9 },
                FromBroker::Other { packet_type: 11 },
            ]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn malformed_broker_packets_are_errors() {
        let mut buf = BytesMut::from(&[0x40, 1, 0][..]);
        let err = next(&mut buf).map_err(|e| e.to_string());
        assert!(
            err.as_ref().is_err_and(|e| e.contains("not MQTT")),
            "{err:?}"
        );
        let mut buf = BytesMut::from(&[0x40, 0xff, 0xff, 0xff, 0xff, 0x01][..]);
        assert!(matches!(
            next(&mut buf),
            Err(BenchError::Mqtt(DecodeError::MalformedRemainingLength))
        ));
    }
}
