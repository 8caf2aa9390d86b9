//! The MQTT wire codec: framing with a size limit, and decoding/encoding packets through
//! `rumqttd::protocol::{v4, v5}`. This is the only file that touches rumqttd's types directly;
//! it hands the rest of `mqtt/` plain structs.
//!
//! rumqttd's codec has sharp edges that this module works around (each has a test below):
//! - `v5::V5::read_mut` hits `unreachable!()` for CONNACK and UNSUBACK packets, so packet types a
//!   client may never send are rejected here before the codec sees them;
//! - `Publish::{qos, pkid, dup}` are `pub(crate)`, so they are read from the frame's own bytes and
//!   outgoing publishes are built through `Publish::deserialize`;
//! - the writers panic on reason codes the protocol version cannot express, so only typed,
//!   version-checked constructors below produce outgoing packets;
//! - fixed-header flag bits are not validated by rumqttd; they are here.
//!
//! It must never panic on any input bytes and never allocate more than the frame size limit.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rumqttd::protocol::{self, Packet, Protocol};

pub use rumqttd::protocol::{
    ConnAckProperties, ConnectProperties, DisconnectReasonCode, LastWill, LastWillProperties,
    PubAckReason, PubRecReason, PublishProperties, QoS, SubscribeReasonCode,
};

/// Protocol versions tern speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// MQTT 3.1.1 (protocol level 4).
    V4,
    /// MQTT 5.0 (protocol level 5).
    V5,
}

/// Why bytes could not become a packet.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecError {
    #[error("packet of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
    #[error("malformed packet: {reason}")]
    Malformed { reason: String },
    #[error("packet type {packet_type} is not allowed from a client")]
    Protocol { packet_type: u8 },
    /// The packet is well formed but breaks a rule the spec calls a protocol error (0x82).
    #[error("protocol error: {reason}")]
    ProtocolViolation { reason: &'static str },
    #[error("unsupported protocol level {level}")]
    UnsupportedVersion { level: u8 },
    #[error("cannot encode packet: {reason}")]
    Encode { reason: String },
}

impl From<protocol::Error> for CodecError {
    fn from(err: protocol::Error) -> Self {
        CodecError::Malformed {
            reason: err.to_string(),
        }
    }
}

/// Length of the first complete frame in `buf`, `None` if more bytes are needed.
#[inline]
pub fn frame_len(buf: &[u8], max: usize) -> Result<Option<usize>, CodecError> {
    if let Some(&byte) = buf.get(1) {
        if byte & 0x80 == 0 {
            // A remaining length below 128 (a small publish, every ack): one byte.
            return checked_total(buf, 2 + usize::from(byte), max);
        }
    }
    frame_len_general(buf, max)
}

/// The length of the fixed header of `frame` if `frame` is exactly one frame, its remaining
/// length read once (the one-byte form directly); `None` otherwise.
#[inline]
fn exact_header_len(frame: &[u8]) -> Option<usize> {
    match frame.get(1) {
        Some(&byte) if byte & 0x80 == 0 => (frame.len() == 2 + usize::from(byte)).then_some(2),
        _ => match frame_len_general(frame, usize::MAX) {
            Ok(Some(len)) if len == frame.len() => header_len(frame).ok(),
            _ => None,
        },
    }
}

/// [`frame_len`] for any remaining length.
fn frame_len_general(buf: &[u8], max: usize) -> Result<Option<usize>, CodecError> {
    let mut remaining: usize = 0;
    for (i, byte) in buf.iter().skip(1).take(4).enumerate() {
        remaining |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return checked_total(buf, 1 + (i + 1) + remaining, max);
        }
    }
    if buf.len() >= 5 {
        return Err(malformed("remaining length longer than four bytes"));
    }
    Ok(None)
}

/// A frame of `total` bytes: too large beyond `max`, complete once `buf` holds it.
#[inline]
fn checked_total(buf: &[u8], total: usize, max: usize) -> Result<Option<usize>, CodecError> {
    if total > max {
        return Err(CodecError::TooLarge { size: total, max });
    }
    Ok((buf.len() >= total).then_some(total))
}

/// The protocol version a CONNECT frame asks for.
pub fn connect_version(frame: &[u8]) -> Result<Version, CodecError> {
    if frame.first().map(|b| b >> 4) != Some(1) {
        return Err(malformed("the first packet must be CONNECT"));
    }
    let header = header_len(frame)?;
    let name_len = read_u16(frame, header)?;
    let level_at = header + 2 + usize::from(name_len);
    let name = frame.get(header + 2..level_at).unwrap_or_default();
    let level = *frame
        .get(level_at)
        .ok_or_else(|| malformed("CONNECT too short"))?;
    match (name, level) {
        (b"MQTT", 4) => Ok(Version::V4),
        (b"MQTT", 5) => Ok(Version::V5),
        (_, level) => Err(CodecError::UnsupportedVersion { level }),
    }
}

/// A decoded client packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    Connect(Box<Connect>),
    /// Inline: with its properties boxed, a PUBLISH is about as small as a SUBSCRIBE, and
    /// the common packet costs no allocation of its own (issue #29).
    Publish(InPublish),
    PubAck {
        pkid: u16,
    },
    /// `reason` is the MQTT 5 reason code (0 for MQTT 3.1.1); 0x80 and above end the delivery.
    PubRec {
        pkid: u16,
        reason: u8,
    },
    PubRel {
        pkid: u16,
    },
    PubComp {
        pkid: u16,
    },
    Subscribe(Subscribe),
    Unsubscribe {
        pkid: u16,
        filters: Vec<String>,
    },
    PingReq,
    Disconnect {
        reason: DisconnectReasonCode,
        session_expiry: Option<u32>,
    },
}

/// CONNECT with everything tern uses.
#[derive(Clone, PartialEq, Eq)]
pub struct Connect {
    pub version: Version,
    pub client_id: String,
    pub clean_start: bool,
    pub keep_alive: u16,
    pub properties: Option<ConnectProperties>,
    pub will: Option<LastWill>,
    pub will_properties: Option<LastWillProperties>,
    pub username: Option<String>,
    /// Never logged: `Connect`'s Debug output redacts it.
    pub password: Option<String>,
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connect")
            .field("version", &self.version)
            .field("client_id", &self.client_id)
            .field("clean_start", &self.clean_start)
            .field("keep_alive", &self.keep_alive)
            .field("properties", &self.properties)
            .field("will", &self.will)
            .field("will_properties", &self.will_properties)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// PUBLISH from a client, with the fields rumqttd keeps private.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPublish {
    pub qos: QoS,
    pub pkid: u16,
    pub dup: bool,
    pub retain: bool,
    pub topic: Bytes,
    pub payload: Bytes,
    /// Boxed: the MQTT 5 properties are 200 bytes and most publishes have none (issue #29).
    pub properties: Option<Box<PublishProperties>>,
}

/// SUBSCRIBE with its filters, the MQTT 5 subscription identifier and user properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub pkid: u16,
    pub filters: Vec<SubscribeFilter>,
    pub id: Option<usize>,
    pub user_properties: Vec<(String, String)>,
}

/// One filter of a SUBSCRIBE with its options (MQTT 3.1.1 clients get the defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    pub filter: String,
    pub qos: QoS,
    /// MQTT 5 No Local: never deliver this client's own publishes.
    pub no_local: bool,
    /// MQTT 5 Retain As Published: keep the retain flag on forwarded messages.
    pub retain_as_published: bool,
    pub retain_handling: RetainHandling,
}

/// When retained messages are sent for a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainHandling {
    OnSubscribe,
    OnNewSubscribe,
    Never,
}

/// Decodes one complete frame (as measured by [`frame_len`]) sent by a client.
pub fn decode(version: Version, frame: &[u8]) -> Result<Incoming, CodecError> {
    decode_frame(version, BytesMut::from(frame))
}

/// [`decode`] of a frame the caller gives up (split off its read buffer): the payload and
/// topic of a PUBLISH stay in the frame's buffer instead of being copied.
pub fn decode_frame(version: Version, frame: BytesMut) -> Result<Incoming, CodecError> {
    let byte1 = *frame.first().ok_or_else(|| malformed("empty frame"))?;
    check_fixed_flags(byte1)?;
    if byte1 >> 4 == 3 {
        if let Some(plain) = PlainPublish::of(version, &frame)? {
            return Ok(Incoming::Publish(plain.take(frame)));
        }
    }
    decode_checked(version, frame)
}

/// [`decode_frame`] through the pre-scan and rumqttd's reader, for every packet type.
fn decode_checked(version: Version, frame: BytesMut) -> Result<Incoming, CodecError> {
    validate::check(version, &frame)?;
    // What rumqttd keeps private is read from the bytes before its reader consumes them.
    let hidden = Hidden::of(version, &frame)?;
    let len = frame.len();
    let short_disconnect = match (version, &frame[..]) {
        (Version::V5, &[0xe0, 0x01, reason]) => Some(reason),
        _ => None,
    };
    let mut stream = match short_disconnect {
        // rumqttd's v5 DISCONNECT reader requires a property length after the reason code, which
        // the spec makes optional: append the empty one.
        Some(reason) => BytesMut::from(&[0xe0, 0x02, reason, 0x00][..]),
        None => frame,
    };
    let packet = match version {
        Version::V4 => protocol::v4::V4.read_mut(&mut stream, len)?,
        Version::V5 => protocol::v5::V5.read_mut(&mut stream, len)?,
    };
    convert(version, packet, hidden)
}

/// A PUBLISH without properties (every MQTT 3.1.1 one, an MQTT 5 one with an empty property
/// section): where its fields lie in the frame. Read straight from the bytes, without rumqttd's
/// reader and the pre-scan, both of which walk the frame once more (the per-publish instruction
/// count, issue #29); it checks what they check for such a packet (DUP at QoS 0, packet id 0,
/// fields past the frame's end). An MQTT 5 PUBLISH with properties takes the general path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PlainPublish {
    qos: QoS,
    pkid: u16,
    dup: bool,
    retain: bool,
    topic: std::ops::Range<usize>,
    payload_at: usize,
}

impl PlainPublish {
    /// `None` for an MQTT 5 PUBLISH with properties, and for bytes that are not exactly one
    /// frame (what [`frame_len`] cuts always is): the general path tells what is wrong.
    fn of(version: Version, frame: &[u8]) -> Result<Option<Self>, CodecError> {
        let byte1 = *frame.first().ok_or_else(|| malformed("empty frame"))?;
        let Some(header) = exact_header_len(frame) else {
            return Ok(None);
        };
        let qos = protocol::qos((byte1 >> 1) & 0b11).ok_or_else(|| malformed("QoS 3"))?;
        let dup = byte1 & 0b1000 != 0;
        if qos == QoS::AtMostOnce && dup {
            return Err(malformed("DUP set on a QoS 0 publish"));
        }
        let topic_len = usize::from(read_u16(frame, header)?);
        let topic = header + 2..header + 2 + topic_len;
        if topic.end > frame.len() {
            return Err(malformed("truncated field"));
        }
        let mut at = topic.end;
        let pkid = match qos {
            QoS::AtMostOnce => 0,
            _ => {
                let pkid = read_u16(frame, at)?;
                at += 2;
                if pkid == 0 {
                    return Err(malformed("packet id 0"));
                }
                pkid
            }
        };
        if version == Version::V5 {
            match frame.get(at) {
                Some(0) => at += 1,
                Some(_) => return Ok(None),
                None => return Err(malformed("truncated field")),
            }
        }
        Ok(Some(Self {
            qos,
            pkid,
            dup,
            retain: byte1 & 1 != 0,
            topic,
            payload_at: at,
        }))
    }

    /// The publish, its topic and payload slices of `frame` (no copy). The frame becomes the
    /// topic, so the buffer's count of references goes up once, for the payload.
    fn take(self, mut frame: BytesMut) -> InPublish {
        let payload = frame.split_off(self.payload_at.min(frame.len())).freeze();
        frame.truncate(self.topic.end);
        frame.advance(self.topic.start.min(frame.len()));
        InPublish {
            qos: self.qos,
            pkid: self.pkid,
            dup: self.dup,
            retain: self.retain,
            topic: frame.freeze(),
            payload,
            properties: None,
        }
    }
}

/// The fields of a client frame rumqttd hides: its first byte, a PUBLISH's QoS, packet id and
/// DUP, and an MQTT 5 PUBREC's reason code.
struct Hidden {
    byte1: u8,
    publish: Option<(QoS, u16, bool)>,
    reason: u8,
}

impl Hidden {
    fn of(version: Version, frame: &[u8]) -> Result<Self, CodecError> {
        let byte1 = *frame.first().ok_or_else(|| malformed("empty frame"))?;
        let packet_type = byte1 >> 4;
        Ok(Self {
            byte1,
            publish: (packet_type == 3)
                .then(|| publish_header(frame))
                .transpose()?,
            reason: if packet_type == 5 {
                ack_reason(version, frame)?
            } else {
                0
            },
        })
    }
}

/// Rejects packet types a server never receives and fixed-header flags the spec forbids.
fn check_fixed_flags(byte1: u8) -> Result<(), CodecError> {
    let packet_type = byte1 >> 4;
    let flags = byte1 & 0x0f;
    let ok = match packet_type {
        1 | 4 | 5 | 7 | 12 | 14 => flags == 0,
        3 => (flags >> 1) & 0b11 != 0b11,
        6 | 8 | 10 => flags == 0b0010,
        _ => return Err(CodecError::Protocol { packet_type }),
    };
    if ok {
        Ok(())
    } else {
        Err(malformed("reserved fixed-header flags set"))
    }
}

fn convert(version: Version, packet: Packet, hidden: Hidden) -> Result<Incoming, CodecError> {
    Ok(match packet {
        Packet::Connect(connect, properties, will, will_properties, login) => {
            Incoming::Connect(Box::new(Connect {
                version,
                client_id: connect.client_id,
                clean_start: connect.clean_session,
                keep_alive: connect.keep_alive,
                properties,
                will,
                will_properties,
                username: login
                    .as_ref()
                    .map(|l| l.username.clone())
                    .filter(|u| !u.is_empty()),
                password: login.map(|l| l.password).filter(|p| !p.is_empty()),
            }))
        }
        Packet::Publish(publish, properties) => {
            let (qos, pkid, dup) = hidden.publish.ok_or_else(|| malformed("not a PUBLISH"))?;
            Incoming::Publish(InPublish {
                qos,
                pkid,
                dup,
                retain: publish.retain,
                topic: publish.topic,
                payload: publish.payload,
                properties: properties.map(Box::new),
            })
        }
        Packet::PubAck(ack, _) => Incoming::PubAck { pkid: ack.pkid },
        Packet::PubRec(ack, _) => Incoming::PubRec {
            pkid: ack.pkid,
            reason: hidden.reason,
        },
        Packet::PubRel(ack, _) => Incoming::PubRel { pkid: ack.pkid },
        Packet::PubComp(ack, _) => Incoming::PubComp { pkid: ack.pkid },
        Packet::Subscribe(sub, properties) => Incoming::Subscribe(Subscribe {
            pkid: sub.pkid,
            filters: sub
                .filters
                .into_iter()
                .map(|f| SubscribeFilter {
                    filter: f.path,
                    qos: f.qos,
                    no_local: f.nolocal,
                    retain_as_published: f.preserve_retain,
                    retain_handling: match f.retain_forward_rule {
                        protocol::RetainForwardRule::OnEverySubscribe => {
                            RetainHandling::OnSubscribe
                        }
                        protocol::RetainForwardRule::OnNewSubscribe => {
                            RetainHandling::OnNewSubscribe
                        }
                        protocol::RetainForwardRule::Never => RetainHandling::Never,
                    },
                })
                .collect(),
            id: properties.as_ref().and_then(|p| p.id),
            user_properties: properties.map(|p| p.user_properties).unwrap_or_default(),
        }),
        Packet::Unsubscribe(unsub, _) => Incoming::Unsubscribe {
            pkid: unsub.pkid,
            filters: unsub.filters,
        },
        Packet::PingReq(_) => Incoming::PingReq,
        Packet::Disconnect(disconnect, properties) => Incoming::Disconnect {
            reason: disconnect.reason_code,
            session_expiry: properties.and_then(|p| p.session_expiry_interval),
        },
        Packet::ConnAck(..) | Packet::SubAck(..) | Packet::UnsubAck(..) | Packet::PingResp(_) => {
            return Err(CodecError::Protocol {
                packet_type: hidden.byte1 >> 4,
            });
        }
    })
}

/// QoS, packet id and DUP of a PUBLISH frame, read from its bytes (rumqttd hides them).
fn publish_header(frame: &[u8]) -> Result<(QoS, u16, bool), CodecError> {
    let byte1 = *frame.first().ok_or_else(|| malformed("empty frame"))?;
    let qos = protocol::qos((byte1 >> 1) & 0b11).ok_or_else(|| malformed("QoS 3"))?;
    let dup = byte1 & 0b1000 != 0;
    if qos == QoS::AtMostOnce {
        return Ok((qos, 0, dup));
    }
    let header = header_len(frame)?;
    let topic_len = usize::from(read_u16(frame, header)?);
    let pkid = read_u16(frame, header + 2 + topic_len)?;
    Ok((qos, pkid, dup))
}

/// The reason code of an MQTT 5 acknowledgement frame (absent means success, 0), read from
/// its bytes; MQTT 3.1.1 acknowledgements have none.
fn ack_reason(version: Version, frame: &[u8]) -> Result<u8, CodecError> {
    if version == Version::V4 {
        return Ok(0);
    }
    let header = header_len(frame)?;
    Ok(frame.get(header + 2).copied().unwrap_or(0))
}

#[inline]
fn header_len(frame: &[u8]) -> Result<usize, CodecError> {
    if frame.get(1).is_some_and(|byte| byte & 0x80 == 0) {
        return Ok(2);
    }
    frame
        .iter()
        .skip(1)
        .take(4)
        .position(|b| b & 0x80 == 0)
        .map(|i| i + 2)
        .ok_or_else(|| malformed("bad remaining length"))
}

#[inline]
fn read_u16(frame: &[u8], at: usize) -> Result<u16, CodecError> {
    match frame.get(at..at + 2) {
        Some([hi, lo]) => Ok(u16::from(*hi) << 8 | u16::from(*lo)),
        _ => Err(malformed("truncated field")),
    }
}

#[cold]
fn malformed(reason: &str) -> CodecError {
    CodecError::Malformed {
        reason: reason.to_owned(),
    }
}

/// A PUBLISH tern sends to a subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutPublish {
    pub topic: Bytes,
    pub payload: Bytes,
    pub qos: QoS,
    pub pkid: u16,
    pub dup: bool,
    pub retain: bool,
    pub properties: Option<PublishProperties>,
}

/// Server-to-client packets, each only in forms the target version can express.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    ConnAck {
        session_present: bool,
        code: ConnAckCode,
        properties: Option<ConnAckProperties>,
    },
    Publish(Box<OutPublish>),
    PubAck {
        pkid: u16,
        reason: PubAckReason,
    },
    PubRec {
        pkid: u16,
        reason: PubRecReason,
    },
    PubRel {
        pkid: u16,
    },
    PubComp {
        pkid: u16,
    },
    SubAck {
        pkid: u16,
        codes: Vec<SubAckCode>,
        /// MQTT 5 Reason String (dropped for MQTT 3.1.1).
        reason: Option<String>,
    },
    UnsubAck {
        pkid: u16,
        count: usize,
    },
    PingResp,
    Disconnect {
        reason: DisconnectReason,
    },
}

/// MQTT 5 DISCONNECT reason codes tern sends, with their wire values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DisconnectReason {
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "tern always closes with a reason; the v5 encoder handles it"
        )
    )]
    Normal = 0x00,
    UnspecifiedError = 0x80,
    MalformedPacket = 0x81,
    ProtocolError = 0x82,
    ServerShuttingDown = 0x8b,
    KeepAliveTimeout = 0x8d,
    SessionTakenOver = 0x8e,
    TopicNameInvalid = 0x90,
    TopicAliasInvalid = 0x94,
    ReceiveMaximumExceeded = 0x93,
    PacketTooLarge = 0x95,
}

/// CONNACK outcomes tern uses, mapped per version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnAckCode {
    Success,
    UnsupportedProtocolVersion,
    ClientIdentifierNotValid,
    /// MQTT 5 only (0x81): a 3.1.1 client is closed without CONNACK instead.
    MalformedPacket,
    /// MQTT 5 only (0x82).
    ProtocolError,
    /// MQTT 5 only (0x8C): tern offers no enhanced authentication.
    BadAuthenticationMethod,
    /// MQTT 5: 0x9F; MQTT 3.1.1: "server unavailable".
    ConnectionRateExceeded,
    ServerUnavailable,
    NotAuthorized,
    BadUserNamePassword,
    ServerBusy,
}

/// SUBACK outcome per filter; every refusal is 0x80 for MQTT 3.1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubAckCode {
    Granted(QoS),
    TopicFilterInvalid,
    NotAuthorized,
    /// MQTT 5 0x80: the group could not start.
    Unspecified,
    /// MQTT 5 0x83: a `tern-start` value tern cannot serve.
    ImplementationSpecific,
    /// MQTT 5 0x97: an exclusive shared group already has its session.
    QuotaExceeded,
}

/// Appends the encoding of `packet` for `version` to `out`.
pub fn encode(version: Version, packet: Outgoing, out: &mut BytesMut) -> Result<(), CodecError> {
    if let (Version::V5, Outgoing::Disconnect { reason }) = (version, &packet) {
        // rumqttd's v5 writer drops the reason code when there are no properties and
        // miscounts the length when there are; the packet is four fixed bytes anyway.
        match reason {
            DisconnectReason::Normal => out.extend_from_slice(&[0xe0, 0x00]),
            reason => out.extend_from_slice(&[0xe0, 0x02, *reason as u8, 0x00]),
        }
        return Ok(());
    }
    if let Outgoing::PubAck { pkid, reason } = packet {
        if version == Version::V4 || reason == PubAckReason::Success {
            put_puback(pkid, out);
            return Ok(());
        }
    }
    encode_with_rumqttd(version, packet, out)
}

/// The acknowledgement of nearly every publish, a successful PUBACK in either version: four
/// fixed bytes (MQTT 5 omits a success's reason code and properties), not worth rumqttd's
/// writer nor an [`Outgoing`] moved into [`encode`] (issue #29).
#[inline]
pub fn put_puback(pkid: u16, out: &mut BytesMut) {
    out.put_u32(0x4002_0000 | u32::from(pkid));
}

/// [`encode`] through rumqttd's writers.
fn encode_with_rumqttd(
    version: Version,
    packet: Outgoing,
    out: &mut BytesMut,
) -> Result<(), CodecError> {
    let packet = to_rumqttd(version, packet);
    let result = match version {
        Version::V4 => protocol::v4::V4.write(packet, out),
        Version::V5 => protocol::v5::V5.write(packet, out),
    };
    result.map(drop).map_err(|err| CodecError::Encode {
        reason: err.to_string(),
    })
}

fn to_rumqttd(version: Version, packet: Outgoing) -> Packet {
    let v5 = version == Version::V5;
    match packet {
        Outgoing::ConnAck {
            session_present,
            code,
            properties,
        } => Packet::ConnAck(
            protocol::ConnAck {
                session_present,
                code: connack_code(version, code),
            },
            properties.filter(|_| v5),
        ),
        Outgoing::Publish(publish) => {
            let properties = publish.properties.clone().filter(|_| v5);
            Packet::Publish(build_publish(&publish), properties)
        }
        Outgoing::PubAck { pkid, reason } => {
            let reason = if v5 { reason } else { PubAckReason::Success };
            Packet::PubAck(protocol::PubAck { pkid, reason }, None)
        }
        Outgoing::PubRec { pkid, reason } => {
            let reason = if v5 { reason } else { PubRecReason::Success };
            Packet::PubRec(protocol::PubRec { pkid, reason }, None)
        }
        Outgoing::PubRel { pkid } => Packet::PubRel(
            protocol::PubRel {
                pkid,
                reason: protocol::PubRelReason::Success,
            },
            None,
        ),
        Outgoing::PubComp { pkid } => Packet::PubComp(
            protocol::PubComp {
                pkid,
                reason: protocol::PubCompReason::Success,
            },
            None,
        ),
        Outgoing::SubAck {
            pkid,
            codes,
            reason,
        } => Packet::SubAck(
            protocol::SubAck {
                pkid,
                return_codes: codes.into_iter().map(|c| suback_code(version, c)).collect(),
            },
            reason
                .filter(|_| v5)
                .map(|reason| protocol::SubAckProperties {
                    reason_string: Some(reason),
                    user_properties: Vec::new(),
                }),
        ),
        Outgoing::UnsubAck { pkid, count } => Packet::UnsubAck(
            protocol::UnsubAck {
                pkid,
                reasons: vec![protocol::UnsubAckReason::Success; if v5 { count } else { 0 }],
            },
            None,
        ),
        Outgoing::PingResp => Packet::PingResp(protocol::PingResp),
        Outgoing::Disconnect { .. } => {
            // Encoded by `encode` itself; v4 has no reason codes.
            Packet::Disconnect(
                protocol::Disconnect {
                    reason_code: DisconnectReasonCode::NormalDisconnection,
                },
                None,
            )
        }
    }
}

fn connack_code(version: Version, code: ConnAckCode) -> protocol::ConnectReturnCode {
    use protocol::ConnectReturnCode as C;
    match (version, code) {
        (_, ConnAckCode::Success) => C::Success,
        (Version::V4, ConnAckCode::UnsupportedProtocolVersion) => C::RefusedProtocolVersion,
        (Version::V5, ConnAckCode::UnsupportedProtocolVersion) => C::UnsupportedProtocolVersion,
        (_, ConnAckCode::ClientIdentifierNotValid) => C::ClientIdentifierNotValid,
        (
            Version::V4,
            ConnAckCode::ServerUnavailable
            | ConnAckCode::ServerBusy
            | ConnAckCode::ConnectionRateExceeded,
        ) => C::ServiceUnavailable,
        (Version::V5, ConnAckCode::ConnectionRateExceeded) => C::ConnectionRateExceeded,
        (Version::V5, ConnAckCode::ServerUnavailable) => C::ServerUnavailable,
        (Version::V5, ConnAckCode::ServerBusy) => C::ServerBusy,
        (Version::V5, ConnAckCode::MalformedPacket) => C::MalformedPacket,
        (Version::V5, ConnAckCode::ProtocolError) => C::ProtocolError,
        (Version::V5, ConnAckCode::BadAuthenticationMethod) => C::BadAuthenticationMethod,
        // Never sent to a 3.1.1 client (see `ConnAckCode`); refusal without a reason it knows.
        (Version::V4, ConnAckCode::MalformedPacket | ConnAckCode::ProtocolError) => {
            C::ServiceUnavailable
        }
        (_, ConnAckCode::NotAuthorized) => C::NotAuthorized,
        (Version::V4, ConnAckCode::BadAuthenticationMethod) => C::NotAuthorized,
        (_, ConnAckCode::BadUserNamePassword) => C::BadUserNamePassword,
    }
}

fn suback_code(version: Version, code: SubAckCode) -> SubscribeReasonCode {
    match (version, code) {
        (_, SubAckCode::Granted(qos)) => SubscribeReasonCode::Success(qos),
        (Version::V4, _) => SubscribeReasonCode::Failure,
        (Version::V5, SubAckCode::TopicFilterInvalid) => SubscribeReasonCode::TopicFilterInvalid,
        (Version::V5, SubAckCode::NotAuthorized) => SubscribeReasonCode::NotAuthorized,
        (Version::V5, SubAckCode::Unspecified) => SubscribeReasonCode::Unspecified,
        (Version::V5, SubAckCode::ImplementationSpecific) => {
            SubscribeReasonCode::ImplementationSpecific
        }
        (Version::V5, SubAckCode::QuotaExceeded) => SubscribeReasonCode::QuotaExceeded,
    }
}

/// Builds a rumqttd `Publish` with QoS, packet id and DUP set, through its only public
/// constructor that accepts them (`Publish::deserialize` of its own storage format).
fn build_publish(publish: &OutPublish) -> protocol::Publish {
    let mut raw = BytesMut::with_capacity(5 + publish.topic.len() + publish.payload.len());
    let qos = publish.qos as u8;
    raw.put_u8(0x30 | u8::from(publish.retain) | (qos << 1) | (u8::from(publish.dup) << 3));
    raw.put_u16(publish.pkid);
    raw.put_u16(u16::try_from(publish.topic.len()).unwrap_or(u16::MAX));
    raw.extend_from_slice(&publish.topic);
    raw.extend_from_slice(&publish.payload);
    protocol::Publish::deserialize(raw.freeze())
}

#[cfg(test)]
pub(crate) mod test;
mod validate;
