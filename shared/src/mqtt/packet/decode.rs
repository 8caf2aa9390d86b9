//! Decoding of bytes into [`Packet`]s that borrow from those bytes.
//!
//! It owns framing (fixed header, remaining length) and the checks on incoming fields. It must
//! never panic or read past the input on any bytes whatsoever, and must tell a packet that is
//! merely cut short ([`DecodeError::Incomplete`]) from one that can never become valid.

use super::{
    CONNACK, CONNECT, Connect, Credentials, DISCONNECT, DecodeError, Frame, PINGREQ, PINGRESP,
    PUBACK, PUBLISH, Packet, Publish, QoS, SUBACK, SUBSCRIBE,
};

/// Reads the fixed header of the packet at the front of `bytes` once the whole packet is there,
/// whatever its type: a reader skips packets this codec does not decode by `Frame::len`.
pub fn frame(bytes: &[u8]) -> Result<Frame, DecodeError> {
    let (&first, rest) = bytes
        .split_first()
        .ok_or(DecodeError::Incomplete { needed: 2 })?;
    let (body_len, len_len) = remaining_len(rest)?;
    let len = 1 + len_len + body_len;
    if bytes.len() < len {
        return Err(DecodeError::Incomplete {
            needed: len - bytes.len(),
        });
    }
    Ok(Frame {
        packet_type: first >> 4,
        flags: first & 0x0f,
        header_len: 1 + len_len,
        len,
    })
}

/// Decodes one packet from the front of `bytes`; returns it with the number of bytes it used.
pub fn decode(bytes: &[u8]) -> Result<(Packet<'_>, usize), DecodeError> {
    let Frame {
        packet_type,
        flags,
        header_len,
        len: frame_len,
    } = frame(bytes)?;
    let body = bytes
        .get(header_len..frame_len)
        .ok_or(DecodeError::Incomplete { needed: 1 })?;
    let mut r = Reader { body, packet_type };
    let packet = match packet_type {
        PUBLISH => Packet::Publish(publish(&mut r, flags)?),
        SUBSCRIBE => {
            expect_flags(packet_type, flags, 0b0010)?;
            subscribe(&mut r)?
        }
        CONNECT | CONNACK | PUBACK | SUBACK | PINGREQ | PINGRESP | DISCONNECT => {
            expect_flags(packet_type, flags, 0)?;
            simple(&mut r)?
        }
        _ => return Err(DecodeError::UnsupportedPacketType { packet_type }),
    };
    r.finish()?;
    Ok((packet, frame_len))
}

/// Parses the variable-length remaining-length field: (value, bytes it took).
fn remaining_len(bytes: &[u8]) -> Result<(usize, usize), DecodeError> {
    let mut value = 0usize;
    for (i, &byte) in bytes.iter().enumerate().take(4) {
        value |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    if bytes.len() >= 4 {
        Err(DecodeError::MalformedRemainingLength)
    } else {
        Err(DecodeError::Incomplete { needed: 1 })
    }
}

fn expect_flags(packet_type: u8, flags: u8, want: u8) -> Result<(), DecodeError> {
    if flags == want {
        Ok(())
    } else {
        Err(DecodeError::InvalidFlags { packet_type, flags })
    }
}

/// A bounds-checked cursor over one packet's body.
struct Reader<'a> {
    body: &'a [u8],
    packet_type: u8,
}

impl<'a> Reader<'a> {
    fn malformed(&self) -> DecodeError {
        DecodeError::MalformedBody {
            packet_type: self.packet_type,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.body.len() {
            return Err(self.malformed());
        }
        let (head, tail) = self.body.split_at(n);
        self.body = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        let (&byte, tail) = self.body.split_first().ok_or(self.malformed())?;
        self.body = tail;
        Ok(byte)
    }

    #[expect(
        clippy::big_endian_bytes,
        reason = "MQTT 3.1.1 two-byte integers are big-endian by specification"
    )]
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let hi = self.u8()?;
        let lo = self.u8()?;
        Ok(u16::from_be_bytes([hi, lo]))
    }

    fn packet_id(&mut self) -> Result<u16, DecodeError> {
        match self.u16()? {
            0 => Err(DecodeError::ZeroPacketId),
            id => Ok(id),
        }
    }

    fn str(&mut self) -> Result<&'a str, DecodeError> {
        let len = self.u16()?;
        let bytes = self.take(usize::from(len))?;
        core::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)
    }

    fn binary(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }

    fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.body)
    }

    /// Every byte of the body must have been consumed.
    fn finish(&self) -> Result<(), DecodeError> {
        if self.body.is_empty() {
            Ok(())
        } else {
            Err(self.malformed())
        }
    }
}

fn qos(bits: u8) -> Result<QoS, DecodeError> {
    match bits {
        0 => Ok(QoS::AtMostOnce),
        1 => Ok(QoS::AtLeastOnce),
        qos => Err(DecodeError::UnsupportedQoS { qos }),
    }
}

fn publish<'a>(r: &mut Reader<'a>, flags: u8) -> Result<Publish<'a>, DecodeError> {
    let qos = qos((flags >> 1) & 0b11)?;
    let dup = flags & 0b1000 != 0;
    if dup && qos == QoS::AtMostOnce {
        return Err(DecodeError::InvalidFlags {
            packet_type: PUBLISH,
            flags,
        });
    }
    let topic = r.str()?;
    let packet_id = match qos {
        QoS::AtMostOnce => None,
        QoS::AtLeastOnce => Some(r.packet_id()?),
    };
    Ok(Publish {
        topic,
        payload: r.rest(),
        qos,
        packet_id,
        dup,
        retain: flags & 1 != 0,
    })
}

fn subscribe<'a>(r: &mut Reader<'a>) -> Result<Packet<'a>, DecodeError> {
    let packet_id = r.packet_id()?;
    let filter = r.str()?;
    let options = r.u8()?;
    if options & 0b1111_1100 != 0 {
        return Err(r.malformed());
    }
    Ok(Packet::Subscribe {
        packet_id,
        filter,
        qos: qos(options)?,
    })
}

/// Packets with fixed flags: CONNECT, CONNACK, PUBACK, SUBACK and the empty ones.
fn simple<'a>(r: &mut Reader<'a>) -> Result<Packet<'a>, DecodeError> {
    Ok(match r.packet_type {
        CONNECT => Packet::Connect(connect(r)?),
        CONNACK => {
            let ack_flags = r.u8()?;
            if ack_flags & 0b1111_1110 != 0 {
                return Err(r.malformed());
            }
            Packet::ConnAck {
                session_present: ack_flags == 1,
                code: r.u8()?,
            }
        }
        PUBACK => Packet::PubAck {
            packet_id: r.packet_id()?,
        },
        SUBACK => Packet::SubAck {
            packet_id: r.packet_id()?,
            code: r.u8()?,
        },
        PINGREQ => Packet::PingReq,
        PINGRESP => Packet::PingResp,
        _ => Packet::Disconnect,
    })
}

fn connect<'a>(r: &mut Reader<'a>) -> Result<Connect<'a>, DecodeError> {
    if r.str()? != "MQTT" || r.u8()? != 4 {
        return Err(DecodeError::UnsupportedProtocol);
    }
    let connect_flags = r.u8()?;
    // The clean-session bit and either both login bits or neither: no will, reserved bit clear.
    let login = match connect_flags & !0b0000_0010 {
        0 => false,
        0b1100_0000 => true,
        _ => return Err(r.malformed()),
    };
    let keep_alive_s = r.u16()?;
    let client_id = r.str()?;
    let credentials = if login {
        Some(Credentials {
            username: r.str()?,
            password: r.binary()?,
        })
    } else {
        None
    };
    Ok(Connect {
        client_id,
        keep_alive_s,
        clean_session: connect_flags & 0b0000_0010 != 0,
        credentials,
    })
}
