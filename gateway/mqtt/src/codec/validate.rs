//! What rumqttd's decoder lets through and the spec forbids: a pre-scan of a client packet's own
//! bytes before rumqttd reads it. It walks CONNECT, PUBLISH, SUBSCRIBE and UNSUBSCRIBE field by
//! field, decodes MQTT 5 property sections itself (rumqttd keeps the last of a repeated
//! property), and names the violation as the spec classes it: a malformed packet (reason 0x81)
//! or a protocol error (0x82). Pure; never panics or allocates on any input.
//!
//! | packet | rule | class |
//! |---|---|---|
//! | CONNECT | reserved flag (bit 0) set | malformed |
//! | CONNECT | 3.1.1: password flag without the username flag | malformed |
//! | CONNECT | NUL (U+0000) in the client id | malformed |
//! | any | a property other than User Property repeated | protocol error |
//! | CONNECT | Receive Maximum 0, Maximum Packet Size 0 | protocol error |
//! | CONNECT | Request Problem / Response Information other than 0 or 1 | protocol error |
//! | PUBLISH, will | Payload Format Indicator other than 0 or 1 | protocol error |
//! | PUBLISH | Subscription Identifier sent by a client | protocol error |
//! | PUBLISH, will | Response Topic with a wildcard | protocol error |
//! | PUBLISH | DUP set at QoS 0 | malformed |
//! | PUBLISH, SUBSCRIBE, UNSUBSCRIBE | packet id 0 | malformed |
//! | SUBSCRIBE | Subscription Identifier 0 | protocol error |
//! | SUBSCRIBE | reserved option bits, QoS 3 | malformed |
//! | SUBSCRIBE | Retain Handling 3 | protocol error |
//! | SUBSCRIBE, UNSUBSCRIBE | no topic filter | protocol error |
//!
//! The Authentication Method (enhanced authentication, which tern does not offer) is refused by
//! the handshake with 0x8C, since only CONNACK can say so.

use super::{CodecError, Version};

/// One MQTT 5 property as found on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Property<'a> {
    pub id: u8,
    pub value: Value<'a>,
}

/// A property value by its wire type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    Byte(u8),
    U16(u16),
    U32(u32),
    VarInt(u32),
    /// UTF-8 string or binary data, undecoded.
    Bytes(&'a [u8]),
    Pair(&'a [u8], &'a [u8]),
}

const PAYLOAD_FORMAT: u8 = 0x01;
const RESPONSE_TOPIC: u8 = 0x08;
const SUBSCRIPTION_ID: u8 = 0x0b;
const REQUEST_PROBLEM_INFO: u8 = 0x17;
const REQUEST_RESPONSE_INFO: u8 = 0x19;
const RECEIVE_MAXIMUM: u8 = 0x21;
const USER_PROPERTY: u8 = 0x26;
const MAXIMUM_PACKET_SIZE: u8 = 0x27;

/// A cursor over a packet's bytes.
#[derive(Debug)]
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if n > self.buf.len() {
            return Err(malformed("truncated field"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }

    fn u16(&mut self) -> Result<u16, CodecError> {
        let bytes = self.take(2)?;
        Ok(bytes.iter().fold(0, |acc, b| acc << 8 | u16::from(*b)))
    }

    fn u32(&mut self) -> Result<u32, CodecError> {
        let bytes = self.take(4)?;
        Ok(bytes.iter().fold(0, |acc, b| acc << 8 | u32::from(*b)))
    }

    fn varint(&mut self) -> Result<u32, CodecError> {
        let mut value = 0u32;
        for shift in [0, 7, 14, 21] {
            let byte = self.u8()?;
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(malformed("variable byte integer longer than four bytes"))
    }

    /// A length-prefixed string or binary field.
    fn field(&mut self) -> Result<&'a [u8], CodecError> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// An MQTT 5 property section (its length, then the properties), checked for repeats.
    fn properties(&mut self) -> Result<Vec<Property<'a>>, CodecError> {
        let len = self.varint()?;
        let section = self.take(usize::try_from(len).unwrap_or(usize::MAX))?;
        let found = properties(section)?;
        let mut seen = [false; 256];
        for property in &found {
            let slot = seen.get_mut(usize::from(property.id));
            if let Some(slot) = slot.filter(|_| property.id != USER_PROPERTY) {
                if *slot {
                    return Err(protocol("a property appears more than once"));
                }
                *slot = true;
            }
        }
        Ok(found)
    }
}

/// Decodes a property section (without its length prefix).
pub(crate) fn properties(section: &[u8]) -> Result<Vec<Property<'_>>, CodecError> {
    let mut reader = Reader { buf: section };
    let mut found = Vec::new();
    while !reader.is_empty() {
        let id = reader.u8()?;
        let value = match id {
            0x01 | 0x17 | 0x19 | 0x24 | 0x25 | 0x28 | 0x29 | 0x2a => Value::Byte(reader.u8()?),
            0x13 | 0x21 | 0x22 | 0x23 => Value::U16(reader.u16()?),
            0x02 | 0x11 | 0x18 | 0x27 => Value::U32(reader.u32()?),
            0x0b => Value::VarInt(reader.varint()?),
            0x03 | 0x08 | 0x09 | 0x12 | 0x15 | 0x16 | 0x1a | 0x1c | 0x1f => {
                Value::Bytes(reader.field()?)
            }
            0x26 => Value::Pair(reader.field()?, reader.field()?),
            _ => return Err(malformed("unknown property identifier")),
        };
        found.push(Property { id, value });
    }
    Ok(found)
}

/// Checks one complete client frame whose fixed-header flags were already checked.
pub(crate) fn check(version: Version, frame: &[u8]) -> Result<(), CodecError> {
    let byte1 = frame.first().copied().unwrap_or(0);
    let mut reader = Reader { buf: frame };
    reader.u8()?;
    reader.varint()?;
    match byte1 >> 4 {
        1 => check_connect(reader),
        3 => check_publish(version, byte1, reader),
        8 => check_subscribe(version, reader),
        10 => check_unsubscribe(version, reader),
        _ => Ok(()),
    }
}

fn check_connect(mut r: Reader<'_>) -> Result<(), CodecError> {
    r.field()?;
    let version = match r.u8()? {
        5 => Version::V5,
        _ => Version::V4,
    };
    let flags = r.u8()?;
    r.u16()?;
    if flags & 0x01 != 0 {
        return Err(malformed("reserved CONNECT flag set"));
    }
    if version == Version::V4 && flags & 0x40 != 0 && flags & 0x80 == 0 {
        return Err(malformed("password flag without username flag"));
    }
    if version == Version::V5 {
        for property in r.properties()? {
            check_connect_property(property)?;
        }
    }
    if r.field()?.contains(&0) {
        return Err(malformed("NUL character in the client id"));
    }
    if flags & 0x04 != 0 && version == Version::V5 {
        for property in r.properties()? {
            check_message_property(property)?;
        }
    }
    Ok(())
}

fn check_connect_property(property: Property<'_>) -> Result<(), CodecError> {
    match (property.id, property.value) {
        (RECEIVE_MAXIMUM, Value::U16(0)) => Err(protocol("Receive Maximum 0")),
        (MAXIMUM_PACKET_SIZE, Value::U32(0)) => Err(protocol("Maximum Packet Size 0")),
        (REQUEST_PROBLEM_INFO | REQUEST_RESPONSE_INFO, Value::Byte(b)) if b > 1 => {
            Err(protocol("request information flag other than 0 or 1"))
        }
        (0x11 | 0x21 | 0x27 | 0x22 | 0x17 | 0x19 | 0x26 | 0x15 | 0x16, _) => Ok(()),
        _ => Err(protocol("property not allowed in CONNECT")),
    }
}

/// PUBLISH and will properties.
fn check_message_property(property: Property<'_>) -> Result<(), CodecError> {
    match (property.id, property.value) {
        (PAYLOAD_FORMAT, Value::Byte(b)) if b > 1 => {
            Err(protocol("Payload Format Indicator other than 0 or 1"))
        }
        (RESPONSE_TOPIC, Value::Bytes(topic)) if topic.iter().any(|b| matches!(b, b'+' | b'#')) => {
            Err(protocol("Response Topic with a wildcard"))
        }
        (SUBSCRIPTION_ID, _) => Err(protocol("Subscription Identifier sent by a client")),
        (0x01 | 0x02 | 0x03 | 0x08 | 0x09 | 0x18 | 0x23 | 0x26, _) => Ok(()),
        _ => Err(protocol("property not allowed in PUBLISH")),
    }
}

fn check_publish(version: Version, byte1: u8, mut r: Reader<'_>) -> Result<(), CodecError> {
    let qos = (byte1 >> 1) & 0b11;
    if qos == 0 && byte1 & 0b1000 != 0 {
        return Err(malformed("DUP set on a QoS 0 publish"));
    }
    r.field()?;
    if qos > 0 && r.u16()? == 0 {
        return Err(malformed("packet id 0"));
    }
    if version == Version::V5 {
        for property in r.properties()? {
            check_message_property(property)?;
        }
    }
    Ok(())
}

fn check_subscribe(version: Version, mut r: Reader<'_>) -> Result<(), CodecError> {
    if r.u16()? == 0 {
        return Err(malformed("packet id 0"));
    }
    if version == Version::V5 {
        for property in r.properties()? {
            match (property.id, property.value) {
                (SUBSCRIPTION_ID, Value::VarInt(0)) => {
                    return Err(protocol("Subscription Identifier 0"));
                }
                (SUBSCRIPTION_ID | USER_PROPERTY, _) => {}
                _ => return Err(protocol("property not allowed in SUBSCRIBE")),
            }
        }
    }
    if r.is_empty() {
        return Err(protocol("SUBSCRIBE without a topic filter"));
    }
    while !r.is_empty() {
        r.field()?;
        let options = r.u8()?;
        let reserved = match version {
            Version::V4 => 0b1111_1100,
            Version::V5 => 0b1100_0000,
        };
        if options & reserved != 0 || options & 0b11 == 0b11 {
            return Err(malformed("reserved subscription option bits set"));
        }
        if (options >> 4) & 0b11 == 0b11 {
            return Err(protocol("Retain Handling 3"));
        }
    }
    Ok(())
}

fn check_unsubscribe(version: Version, mut r: Reader<'_>) -> Result<(), CodecError> {
    if r.u16()? == 0 {
        return Err(malformed("packet id 0"));
    }
    if version == Version::V5 {
        for property in r.properties()? {
            if property.id != USER_PROPERTY {
                return Err(protocol("property not allowed in UNSUBSCRIBE"));
            }
        }
    }
    if r.is_empty() {
        return Err(protocol("UNSUBSCRIBE without a topic filter"));
    }
    Ok(())
}

fn malformed(reason: &str) -> CodecError {
    super::malformed(reason)
}

fn protocol(reason: &'static str) -> CodecError {
    CodecError::ProtocolViolation { reason }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Encodes properties the way a client would.
    fn encode(properties: &[Property<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        let field = |out: &mut Vec<u8>, bytes: &[u8]| {
            out.extend_from_slice(&[(bytes.len() >> 8) as u8, bytes.len() as u8]);
            out.extend_from_slice(bytes);
        };
        for property in properties {
            out.push(property.id);
            match property.value {
                Value::Byte(b) => out.push(b),
                Value::U16(v) => out.extend_from_slice(&[(v >> 8) as u8, v as u8]),
                Value::U32(v) => out.extend([24, 16, 8, 0].map(|s| (v >> s) as u8)),
                Value::VarInt(mut v) => loop {
                    let byte = (v % 128) as u8;
                    v /= 128;
                    out.push(if v > 0 { byte | 0x80 } else { byte });
                    if v == 0 {
                        break;
                    }
                },
                Value::Bytes(bytes) => field(&mut out, bytes),
                Value::Pair(k, v) => {
                    field(&mut out, k);
                    field(&mut out, v);
                }
            }
        }
        out
    }

    fn property() -> impl Strategy<Value = (u8, u32, Vec<u8>, Vec<u8>)> {
        let ids = prop::sample::select(vec![
            0x01u8, 0x02, 0x03, 0x08, 0x09, 0x0b, 0x11, 0x13, 0x15, 0x16, 0x17, 0x18, 0x19, 0x21,
            0x22, 0x23, 0x24, 0x26, 0x27,
        ]);
        (
            ids,
            0u32..=268_435_455,
            prop::collection::vec(any::<u8>(), 0..8),
            prop::collection::vec(any::<u8>(), 0..8),
        )
    }

    fn build<'a>((id, n, a, b): &'a (u8, u32, Vec<u8>, Vec<u8>)) -> Property<'a> {
        let value = match id {
            0x01 | 0x17 | 0x19 | 0x24 => Value::Byte(*n as u8),
            0x13 | 0x21 | 0x22 | 0x23 => Value::U16(*n as u16),
            0x02 | 0x11 | 0x18 | 0x27 => Value::U32(*n),
            0x0b => Value::VarInt(*n),
            0x26 => Value::Pair(a, b),
            _ => Value::Bytes(a),
        };
        Property { id: *id, value }
    }

    proptest! {
        #[test]
        fn encoded_properties_decode_to_themselves(raw in prop::collection::vec(property(), 0..8)) {
            let properties: Vec<Property<'_>> = raw.iter().map(build).collect();
            let bytes = encode(&properties);
            prop_assert_eq!(super::properties(&bytes).expect("decodes"), properties);
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = super::properties(&bytes);
            for first in [0x10u8, 0x30, 0x32, 0x3a, 0x82, 0xa2] {
                let mut frame = vec![first, bytes.len() as u8];
                frame.extend_from_slice(&bytes);
                let _ = check(Version::V5, &frame);
                let _ = check(Version::V4, &frame);
            }
        }

        #[test]
        fn a_repeated_property_is_a_protocol_error(raw in property()) {
            let one = build(&raw);
            let bytes = encode(&[one, one]);
            let mut section = vec![bytes.len() as u8];
            section.extend_from_slice(&bytes);
            prop_assume!(bytes.len() < 128);
            let result = Reader { buf: &section }.properties();
            if one.id == USER_PROPERTY {
                prop_assert!(result.is_ok());
            } else {
                let is_protocol = matches!(result, Err(CodecError::ProtocolViolation { .. }));
                prop_assert!(is_protocol);
            }
        }
    }

    #[test]
    fn truncated_and_unknown_properties_are_malformed() {
        for bytes in [
            &[0x21, 0x00][..],
            &[0x26, 0, 1, b'k'],
            &[0x7f, 0],
            &[0x0b, 0x80],
        ] {
            assert!(
                matches!(properties(bytes), Err(CodecError::Malformed { .. })),
                "{bytes:?}"
            );
        }
    }
}
