//! The little of Kafka's wire protocol the bench's counting proxy reads: frame lengths, request
//! headers (API key, version, correlation id) and the broker list at the head of a Metadata
//! response (versions 0-8, the non-flexible ones; rskafka speaks 0-4). Everything after the
//! broker list is kept as opaque bytes. It never talks to a socket.
#![expect(
    clippy::big_endian_bytes,
    reason = "the Kafka protocol is big-endian; only this bench decoder reads it"
)]

/// A frame the proxy cannot read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    #[error("Metadata response ends early (at byte {at})")]
    Incomplete { at: usize },
    #[error("Metadata response version {version} is not supported (0-8)")]
    Version { version: i16 },
}

/// The big-endian length prefix of a frame.
pub fn frame_len(prefix: [u8; 4]) -> i32 {
    i32::from_be_bytes(prefix)
}

pub fn len_prefix(len: i32) -> [u8; 4] {
    len.to_be_bytes()
}

/// (API key, API version, correlation id) of a request frame.
pub fn request_header(frame: &[u8]) -> Option<(i16, i16, i32)> {
    let key = i16::from_be_bytes(frame.get(0..2)?.try_into().ok()?);
    let version = i16::from_be_bytes(frame.get(2..4)?.try_into().ok()?);
    let correlation = i32::from_be_bytes(frame.get(4..8)?.try_into().ok()?);
    Some((key, version, correlation))
}

/// The correlation id a response frame starts with.
pub fn correlation_id(frame: &[u8]) -> Option<i32> {
    Some(i32::from_be_bytes(frame.get(0..4)?.try_into().ok()?))
}

/// One broker of a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    /// The rack field as it was on the wire (v1+; empty before).
    rack: Vec<u8>,
}

/// A Metadata response split around its broker list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataResponse {
    /// Correlation id and (v3+) throttle time.
    head: Vec<u8>,
    pub brokers: Vec<Broker>,
    /// Everything after the broker list, unchanged.
    tail: Vec<u8>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n);
        let taken = end.and_then(|end| self.bytes.get(self.at..end));
        let taken = taken.ok_or(WireError::Incomplete { at: self.at })?;
        self.at += n;
        Ok(taken)
    }

    fn i16(&mut self) -> Result<i16, WireError> {
        let at = self.at;
        let bytes = self.take(2)?;
        bytes
            .try_into()
            .map(i16::from_be_bytes)
            .map_err(|_| WireError::Incomplete { at })
    }

    fn i32(&mut self) -> Result<i32, WireError> {
        let at = self.at;
        let bytes = self.take(4)?;
        bytes
            .try_into()
            .map(i32::from_be_bytes)
            .map_err(|_| WireError::Incomplete { at })
    }

    /// A (nullable) string's raw bytes including its length.
    fn raw_string(&mut self) -> Result<&'a [u8], WireError> {
        let start = self.at;
        let len = self.i16()?;
        self.take(usize::try_from(len).unwrap_or(0))?;
        self.bytes
            .get(start..self.at)
            .ok_or(WireError::Incomplete { at: start })
    }
}

impl MetadataResponse {
    pub fn parse(frame: &[u8], version: i16) -> Result<Self, WireError> {
        if !(0..=8).contains(&version) {
            return Err(WireError::Version { version });
        }
        let mut reader = Reader {
            bytes: frame,
            at: 0,
        };
        let head = reader.take(if version >= 3 { 8 } else { 4 })?.to_vec();
        let count = usize::try_from(reader.i32()?).unwrap_or(0);
        let mut brokers = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            let node_id = reader.i32()?;
            let host = reader.raw_string()?;
            let host = String::from_utf8_lossy(host.get(2..).unwrap_or_default()).into_owned();
            let port = reader.i32()?;
            let rack = if version >= 1 {
                reader.raw_string()?.to_vec()
            } else {
                Vec::new()
            };
            brokers.push(Broker {
                node_id,
                host,
                port,
                rack,
            });
        }
        let tail = frame.get(reader.at..).unwrap_or_default().to_vec();
        Ok(Self {
            head,
            brokers,
            tail,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        let count = i32::try_from(self.brokers.len()).unwrap_or(i32::MAX);
        out.extend_from_slice(&count.to_be_bytes());
        for broker in &self.brokers {
            out.extend_from_slice(&broker.node_id.to_be_bytes());
            let host_len = i16::try_from(broker.host.len()).unwrap_or(i16::MAX);
            out.extend_from_slice(&host_len.to_be_bytes());
            out.extend_from_slice(broker.host.as_bytes());
            out.extend_from_slice(&broker.port.to_be_bytes());
            out.extend_from_slice(&broker.rack);
        }
        out.extend_from_slice(&self.tail);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v4 Metadata response: correlation 7, throttle 0, brokers 1 (`k1:9092`, rack null)
    /// and 2 (`k2:19092`, rack `r`), then two opaque tail bytes.
    fn v4_response() -> Vec<u8> {
        let mut f = vec![0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 2];
        f.extend_from_slice(&[0, 0, 0, 1, 0, 2, b'k', b'1', 0, 0, 0x23, 0x84, 0xff, 0xff]);
        f.extend_from_slice(&[0, 0, 0, 2, 0, 2, b'k', b'2', 0, 0, 0x4a, 0x94, 0, 1, b'r']);
        f.extend_from_slice(&[0xab, 0xcd]);
        f
    }

    #[test]
    fn the_broker_list_is_rewritten_and_everything_else_kept_byte_for_byte() {
        let frame = v4_response();
        let mut parsed = MetadataResponse::parse(&frame, 4).expect("parses");
        let seen: Vec<_> = parsed
            .brokers
            .iter()
            .map(|b| (b.node_id, b.host.as_str(), b.port))
            .collect();
        assert_eq!(seen, [(1, "k1", 9092), (2, "k2", 19092)]);
        assert_eq!(parsed.encode(), frame);
        parsed.brokers[0].host = "127.0.0.1".into();
        parsed.brokers[0].port = 1;
        let mut expected = vec![0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 9];
        expected.extend_from_slice(b"127.0.0.1");
        expected.extend_from_slice(&[0, 0, 0, 1, 0xff, 0xff]);
        expected.extend_from_slice(frame.get(26..).expect("second broker and tail"));
        assert_eq!(parsed.encode(), expected);
    }

    #[test]
    fn truncated_and_unknown_versions_are_errors_not_panics() {
        let frame = v4_response();
        for cut in 0..frame.len() - 2 {
            let result = MetadataResponse::parse(frame.get(..cut).unwrap_or_default(), 4);
            assert!(result.is_err(), "cut at {cut}");
        }
        assert_eq!(
            MetadataResponse::parse(&frame, 9),
            Err(WireError::Version { version: 9 })
        );
        assert_eq!(request_header(&[0, 3, 0, 4, 0, 0, 1, 0]), Some((3, 4, 256)));
        assert_eq!(request_header(&[0, 3]), None);
    }
}
