//! The load generator's side of MQTT 3.1.1: encodes the few packets a publisher sends
//! (CONNECT, PUBLISH, PINGREQ, DISCONNECT) and decodes the few it receives (CONNACK, PUBACK,
//! PINGRESP), byte by byte as the spec draws them. A client encoder this small needs no codec
//! library; a test feeds its bytes to tern's own server codec so both ends agree.
//!
//! It must never panic on what a broker sends: unknown or malformed frames become errors.

use bytes::{Buf, BufMut, BytesMut};

/// A packet a broker sends to a publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromBroker {
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

/// A broker sent bytes that are not MQTT.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    #[error("remaining length longer than four bytes")]
    BadLength,
    #[error("{packet} of {len} bytes is malformed")]
    Malformed { packet: &'static str, len: usize },
}

/// Appends the remaining-length field.
fn put_remaining_length(out: &mut BytesMut, mut len: usize) {
    loop {
        let digit = (len % 128) as u8;
        len /= 128;
        if len == 0 {
            out.put_u8(digit);
            return;
        }
        out.put_u8(digit | 0x80);
    }
}

fn put_string(out: &mut BytesMut, text: &str) {
    out.put_u16(u16::try_from(text.len()).unwrap_or(u16::MAX));
    out.put_slice(text.as_bytes());
}

/// CONNECT, protocol level 4, clean session, no will, no credentials.
pub fn connect(out: &mut BytesMut, client_id: &str, keep_alive_secs: u16) {
    let body_len = 2 + 4 + 1 + 1 + 2 + 2 + client_id.len();
    out.put_u8(0x10);
    put_remaining_length(out, body_len);
    put_string(out, "MQTT");
    out.put_u8(4);
    out.put_u8(0x02);
    out.put_u16(keep_alive_secs);
    put_string(out, client_id);
}

/// PUBLISH at QoS 0 (`pkid` ignored) or QoS 1, no retain, no dup.
pub fn publish(out: &mut BytesMut, topic: &str, qos1: bool, pkid: u16, payload: &[u8]) {
    let id_len = if qos1 { 2 } else { 0 };
    out.put_u8(if qos1 { 0x32 } else { 0x30 });
    put_remaining_length(out, 2 + topic.len() + id_len + payload.len());
    put_string(out, topic);
    if qos1 {
        out.put_u16(pkid);
    }
    out.put_slice(payload);
}

pub fn pingreq(out: &mut BytesMut) {
    out.put_slice(&[0xc0, 0x00]);
}

pub fn disconnect(out: &mut BytesMut) {
    out.put_slice(&[0xe0, 0x00]);
}

/// Takes the first complete packet off `buf`; `Ok(None)` if more bytes are needed.
pub fn next(buf: &mut BytesMut) -> Result<Option<FromBroker>, WireError> {
    let Some((header_len, body_len)) = frame_header(buf)? else {
        return Ok(None);
    };
    if buf.len() < header_len + body_len {
        return Ok(None);
    }
    let packet_type = buf.first().map_or(0, |b| b >> 4);
    buf.advance(header_len);
    let body = buf.split_to(body_len);
    let packet = match (packet_type, &body[..]) {
        (2, [_flags, code]) => FromBroker::ConnAck { code: *code },
        (2, _) => return Err(malformed("CONNACK", body_len)),
        (4, [hi, lo]) => FromBroker::PubAck {
            pkid: u16::from(*hi) << 8 | u16::from(*lo),
        },
        (4, _) => return Err(malformed("PUBACK", body_len)),
        (13, []) => FromBroker::PingResp,
        (13, _) => return Err(malformed("PINGRESP", body_len)),
        (packet_type, _) => FromBroker::Other { packet_type },
    };
    Ok(Some(packet))
}

fn malformed(packet: &'static str, len: usize) -> WireError {
    WireError::Malformed { packet, len }
}

/// (fixed header length, remaining length) once the fixed header is complete.
fn frame_header(buf: &[u8]) -> Result<Option<(usize, usize)>, WireError> {
    let mut len = 0usize;
    for (i, byte) in buf.iter().skip(1).take(4).enumerate() {
        len |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some((i + 2, len)));
        }
    }
    if buf.len() >= 5 {
        return Err(WireError::BadLength);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_mqtt::codec::{self, Incoming, QoS, Version};

    #[test]
    fn connect_bytes_are_exact_and_tern_decodes_them() {
        let mut out = BytesMut::new();
        connect(&mut out, "b1", 60);
        assert_eq!(
            &out[..],
            &[
                0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 2, b'b', b'1'
            ]
        );
        assert_eq!(codec::connect_version(&out), Ok(Version::V4));
        let Ok(Incoming::Connect(decoded)) = codec::decode(Version::V4, &out) else {
            panic!("tern cannot decode the bench CONNECT");
        };
        assert_eq!(
            (
                decoded.client_id.as_str(),
                decoded.clean_start,
                decoded.keep_alive
            ),
            ("b1", true, 60)
        );
    }

    #[test]
    fn publishes_decode_in_tern_with_their_qos_and_pkid() {
        let payload = vec![7u8; 300];
        for (qos1, qos) in [(true, QoS::AtLeastOnce), (false, QoS::AtMostOnce)] {
            let mut out = BytesMut::new();
            publish(&mut out, "bench/3", qos1, 513, &payload);
            let Ok(Incoming::Publish(decoded)) = codec::decode(Version::V4, &out) else {
                panic!("tern cannot decode the bench PUBLISH (qos1 = {qos1})");
            };
            assert_eq!(decoded.qos, qos);
            assert_eq!(decoded.pkid, if qos1 { 513 } else { 0 });
            assert_eq!(&decoded.topic[..], b"bench/3");
            assert_eq!(&decoded.payload[..], &payload[..]);
        }
    }

    #[test]
    fn pingreq_and_disconnect_decode_in_tern() {
        let mut out = BytesMut::new();
        pingreq(&mut out);
        assert_eq!(codec::decode(Version::V4, &out), Ok(Incoming::PingReq));
        let mut out = BytesMut::new();
        disconnect(&mut out);
        assert!(matches!(
            codec::decode(Version::V4, &out),
            Ok(Incoming::Disconnect { .. })
        ));
    }

    #[test]
    fn broker_packets_decode_across_split_reads() {
        let bytes = [
            0x20, 2, 0, 0, 0x40, 2, 0x01, 0x02, 0xd0, 0, 0x90, 3, 0, 1, 0,
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
            ]
        );
    }

    #[test]
    fn malformed_broker_packets_are_errors() {
        let mut buf = BytesMut::from(&[0x40, 1, 0][..]);
        assert_eq!(next(&mut buf), Err(malformed("PUBACK", 1)));
        let mut buf = BytesMut::from(&[0x40, 0xff, 0xff, 0xff, 0xff, 0x01][..]);
        assert_eq!(next(&mut buf), Err(WireError::BadLength));
    }

    #[test]
    fn long_payloads_use_multi_byte_lengths() {
        let mut out = BytesMut::new();
        publish(&mut out, "t", true, 1, &vec![0u8; 20_000]);
        assert_eq!(codec::frame_len(&out, 1 << 20), Ok(Some(out.len())));
    }
}
