//! MQTT 3.1.1 packets the device side speaks, and their byte encoding and decoding.
//!
//! This module owns the wire layout of CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK,
//! PINGREQ, PINGRESP and DISCONNECT, and the framing of any packet (so a reader can skip the
//! types it does not decode). It only ever borrows: encoding writes into a caller's
//! buffer, decoding returns views into the caller's bytes. It must never allocate, never panic on
//! any input, and never touch a transport (that is `client.rs`).

/// Quality of service of a PUBLISH or a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum QoS {
    /// Fire and forget.
    AtMostOnce = 0,
    /// Acknowledged by PUBACK; resent with DUP until then.
    AtLeastOnce = 1,
}

/// A CONNECT packet (protocol level 4, no will; a username and password, or neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Connect<'a> {
    pub client_id: &'a str,
    /// Seconds; 0 disables keep alive.
    pub keep_alive_s: u16,
    pub clean_session: bool,
    /// The login; `None` connects anonymously.
    pub credentials: Option<Credentials<'a>>,
}

/// A CONNECT's username and password (both flags set; this codec never sends one alone).
/// Debug and defmt output show the username and hide the password.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Credentials<'a> {
    pub username: &'a str,
    /// MQTT calls it binary data; the gateway's password file compares it as UTF-8.
    pub password: &'a [u8],
}

impl core::fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Credentials<'_> {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "Credentials {{ username: {=str}, password: <redacted> }}",
            self.username
        );
    }
}

/// A PUBLISH packet. `packet_id` is present exactly when `qos` is not [`QoS::AtMostOnce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Publish<'a> {
    pub topic: &'a str,
    pub payload: &'a [u8],
    pub qos: QoS,
    pub packet_id: Option<u16>,
    pub dup: bool,
    pub retain: bool,
}

/// Every packet this codec knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Packet<'a> {
    Connect(Connect<'a>),
    ConnAck {
        session_present: bool,
        code: u8,
    },
    Publish(Publish<'a>),
    PubAck {
        packet_id: u16,
    },
    /// A SUBSCRIBE with exactly one topic filter (all this client ever sends).
    Subscribe {
        packet_id: u16,
        filter: &'a str,
        qos: QoS,
    },
    /// A SUBACK for one filter: `code` is the granted QoS, or 0x80 for failure.
    SubAck {
        packet_id: u16,
        code: u8,
    },
    PingReq,
    PingResp,
    Disconnect,
}

/// The fixed header of one whole packet, of any type (see [`frame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Frame {
    /// The type nibble (1 CONNECT … 14 DISCONNECT; 15 AUTH in MQTT 5).
    pub packet_type: u8,
    /// The flag nibble.
    pub flags: u8,
    /// Bytes of the fixed header: the first byte and the remaining length.
    pub header_len: usize,
    /// Bytes of the whole packet, fixed header included.
    pub len: usize,
}

/// Why bytes are not (yet) a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are a valid start; at least `needed` more are required to finish the packet.
    #[error("incomplete packet: at least {needed} more bytes needed")]
    Incomplete { needed: usize },
    /// The remaining-length field runs past four bytes.
    #[error("malformed remaining length")]
    MalformedRemainingLength,
    /// The packet type nibble is one this codec does not handle (QoS 2 flow, UNSUBSCRIBE, ...).
    #[error("unsupported packet type {packet_type}")]
    UnsupportedPacketType { packet_type: u8 },
    /// The fixed header's flag nibble is not the one MQTT 3.1.1 prescribes for this type.
    #[error("invalid flags {flags:#x} for packet type {packet_type}")]
    InvalidFlags { packet_type: u8, flags: u8 },
    /// The body does not match its packet type's layout.
    #[error("malformed body of packet type {packet_type}")]
    MalformedBody { packet_type: u8 },
    /// A topic, filter or client id is not UTF-8.
    #[error("string is not UTF-8")]
    InvalidUtf8,
    /// A QoS field holds 2 or 3 (this codec speaks QoS 0 and 1 only).
    #[error("unsupported QoS {qos}")]
    UnsupportedQoS { qos: u8 },
    /// Packet identifier 0 where MQTT requires a non-zero one.
    #[error("packet identifier 0")]
    ZeroPacketId,
    /// CONNECT names another protocol or level than MQTT 3.1.1.
    #[error("not an MQTT 3.1.1 CONNECT")]
    UnsupportedProtocol,
}

/// Why a packet could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is shorter than the packet.
    #[error("packet of {needed} bytes does not fit a {capacity}-byte buffer")]
    BufferTooSmall { needed: usize, capacity: usize },
    /// A string or payload is longer than MQTT allows.
    #[error("field of {len} bytes is too long for MQTT")]
    FieldTooLong { len: usize },
    /// A QoS 1 PUBLISH without a packet identifier, or with identifier 0.
    #[error("QoS 1 publish needs a non-zero packet identifier")]
    MissingPacketId,
}

const CONNECT: u8 = 1;
const CONNACK: u8 = 2;
const PUBLISH: u8 = 3;
const PUBACK: u8 = 4;
const SUBSCRIBE: u8 = 8;
const SUBACK: u8 = 9;
const PINGREQ: u8 = 12;
const PINGRESP: u8 = 13;
const DISCONNECT: u8 = 14;
/// Largest remaining length MQTT can express (four 7-bit groups).
const MAX_REMAINING_LEN: usize = 268_435_455;

mod decode;
mod encode;

pub use decode::{decode, frame};

#[cfg(test)]
mod test;
