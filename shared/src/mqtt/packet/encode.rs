//! Encoding of [`Packet`]s into a caller's buffer.
//!
//! It owns the byte order and field layout of outgoing packets. It must never write past the
//! buffer it is given nor produce a packet that MQTT 3.1.1 forbids (a QoS 1 PUBLISH without a
//! packet identifier, a string over 65,535 bytes).

use super::{
    CONNACK, CONNECT, Connect, DISCONNECT, EncodeError, MAX_REMAINING_LEN, PINGREQ, PINGRESP,
    PUBACK, PUBLISH, Packet, Publish, QoS, SUBACK, SUBSCRIBE,
};

/// A bounds-checked cursor over the output buffer.
struct Writer<'a> {
    out: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn u8(&mut self, byte: u8) {
        if let Some(slot) = self.out.get_mut(self.pos) {
            *slot = byte;
        }
        self.pos += 1;
    }

    #[expect(
        clippy::big_endian_bytes,
        reason = "MQTT 3.1.1 two-byte integers are big-endian by specification"
    )]
    fn u16(&mut self, value: u16) {
        for byte in value.to_be_bytes() {
            self.u8(byte);
        }
    }

    fn bytes(&mut self, bytes: &[u8]) {
        if let Some(dest) = self.out.get_mut(self.pos..self.pos + bytes.len()) {
            dest.copy_from_slice(bytes);
        }
        self.pos += bytes.len();
    }

    /// A length-prefixed string or binary field.
    fn field(&mut self, bytes: &[u8]) {
        // Lengths were checked against u16::MAX by `field_len` before writing started.
        self.u16(u16::try_from(bytes.len()).unwrap_or(u16::MAX));
        self.bytes(bytes);
    }

    fn remaining_len(&mut self, mut len: usize) {
        loop {
            let digit = (len % 128) as u8;
            len /= 128;
            if len == 0 {
                self.u8(digit);
                return;
            }
            self.u8(digit | 0x80);
        }
    }
}

/// Length of a length-prefixed field, or an error past MQTT's 16-bit limit.
fn field_len(bytes: &[u8]) -> Result<usize, EncodeError> {
    if bytes.len() > usize::from(u16::MAX) {
        return Err(EncodeError::FieldTooLong { len: bytes.len() });
    }
    Ok(2 + bytes.len())
}

fn remaining_len_len(len: usize) -> usize {
    match len {
        0..128 => 1,
        128..16_384 => 2,
        16_384..2_097_152 => 3,
        _ => 4,
    }
}

impl Packet<'_> {
    /// How many bytes [`Packet::encode`] writes for this packet: what a caller sizes a buffer
    /// by when a packet may be larger than any fixed one (a host's load generator).
    pub fn encoded_len(&self) -> Result<usize, EncodeError> {
        let (_, body_len) = self.header_and_body_len()?;
        if body_len > MAX_REMAINING_LEN {
            return Err(EncodeError::FieldTooLong { len: body_len });
        }
        Ok(1 + remaining_len_len(body_len) + body_len)
    }

    /// Writes the packet into `out` and returns how many bytes it took.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let (header, body_len) = self.header_and_body_len()?;
        let needed = self.encoded_len()?;
        if needed > out.len() {
            return Err(EncodeError::BufferTooSmall {
                needed,
                capacity: out.len(),
            });
        }
        let mut w = Writer { out, pos: 0 };
        w.u8(header);
        w.remaining_len(body_len);
        self.write_body(&mut w);
        Ok(w.pos)
    }

    /// The first byte of the fixed header and the remaining length.
    fn header_and_body_len(&self) -> Result<(u8, usize), EncodeError> {
        Ok(match self {
            Packet::Connect(c) => (CONNECT << 4, connect_body_len(c)?),
            Packet::ConnAck { .. } => (CONNACK << 4, 2),
            Packet::Publish(p) => publish_header(p)?,
            Packet::PubAck { .. } => (PUBACK << 4, 2),
            Packet::Subscribe { filter, .. } => (
                (SUBSCRIBE << 4) | 0b0010,
                2 + field_len(filter.as_bytes())? + 1,
            ),
            Packet::SubAck { .. } => (SUBACK << 4, 3),
            Packet::PingReq => (PINGREQ << 4, 0),
            Packet::PingResp => (PINGRESP << 4, 0),
            Packet::Disconnect => (DISCONNECT << 4, 0),
        })
    }

    fn write_body(&self, w: &mut Writer<'_>) {
        match *self {
            Packet::Connect(c) => write_connect(w, &c),
            Packet::ConnAck {
                session_present,
                code,
            } => {
                w.u8(u8::from(session_present));
                w.u8(code);
            }
            Packet::Publish(p) => {
                w.field(p.topic.as_bytes());
                if let Some(id) = p.packet_id {
                    w.u16(id);
                }
                w.bytes(p.payload);
            }
            Packet::PubAck { packet_id } => w.u16(packet_id),
            Packet::Subscribe {
                packet_id,
                filter,
                qos,
            } => {
                w.u16(packet_id);
                w.field(filter.as_bytes());
                w.u8(qos as u8);
            }
            Packet::SubAck { packet_id, code } => {
                w.u16(packet_id);
                w.u8(code);
            }
            Packet::PingReq | Packet::PingResp | Packet::Disconnect => {}
        }
    }
}

fn publish_header(p: &Publish<'_>) -> Result<(u8, usize), EncodeError> {
    let id_len = match (p.qos, p.packet_id) {
        (QoS::AtMostOnce, None) => 0,
        (QoS::AtLeastOnce, Some(id)) if id != 0 => 2,
        _ => return Err(EncodeError::MissingPacketId),
    };
    let flags = (u8::from(p.dup) << 3) | ((p.qos as u8) << 1) | u8::from(p.retain);
    Ok((
        (PUBLISH << 4) | flags,
        field_len(p.topic.as_bytes())? + id_len + p.payload.len(),
    ))
}

/// Protocol name and level, flags, keep alive, then the payload's fields.
fn connect_body_len(c: &Connect<'_>) -> Result<usize, EncodeError> {
    let login = match c.credentials {
        Some(login) => field_len(login.username.as_bytes())? + field_len(login.password)?,
        None => 0,
    };
    Ok(10 + field_len(c.client_id.as_bytes())? + login)
}

/// CONNECT flag bits: username (7), password (6), clean session (1).
const USERNAME_FLAG: u8 = 0b1000_0000;
const PASSWORD_FLAG: u8 = 0b0100_0000;
const CLEAN_SESSION_FLAG: u8 = 0b0000_0010;

fn write_connect(w: &mut Writer<'_>, c: &Connect<'_>) {
    w.field(b"MQTT");
    w.u8(4);
    let mut flags = if c.clean_session {
        CLEAN_SESSION_FLAG
    } else {
        0
    };
    if c.credentials.is_some() {
        flags |= USERNAME_FLAG | PASSWORD_FLAG;
    }
    w.u8(flags);
    w.u16(c.keep_alive_s);
    w.field(c.client_id.as_bytes());
    if let Some(login) = c.credentials {
        w.field(login.username.as_bytes());
        w.field(login.password);
    }
}
