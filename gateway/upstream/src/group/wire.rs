//! Kafka's wire format for exactly the requests the group client sends — ApiVersions v0,
//! FindCoordinator v2, OffsetCommit v5, OffsetFetch v5, and SaslHandshake v1 / SaslAuthenticate
//! v1 when the upstream uses SASL — and their responses. Encoders build
//! a whole size-prefixed frame; decoders take a response body (after the correlation id) and
//! never panic: a short body is [`WireError::Incomplete`], a nonsensical one
//! [`WireError::Invalid`]. The versions are non-flexible ones every broker from Kafka 2.2 to 4.x
//! accepts (Kafka 4.0 dropped FindCoordinator v0, OffsetCommit v0–1 and OffsetFetch v0, KIP-896).
//! Nothing here does I/O.
#![expect(
    clippy::big_endian_bytes,
    reason = "Kafka's protocol is big-endian by definition"
)]

/// Api keys and the version tern sends of each.
pub const API_OFFSET_COMMIT: (i16, i16) = (8, 5);
pub const API_OFFSET_FETCH: (i16, i16) = (9, 5);
pub const API_FIND_COORDINATOR: (i16, i16) = (10, 2);
pub const API_VERSIONS: (i16, i16) = (18, 0);
pub const API_SASL_HANDSHAKE: (i16, i16) = (17, 1);
pub const API_SASL_AUTHENTICATE: (i16, i16) = (36, 1);

/// Why a response could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    #[error("response ends early: {needed} more bytes needed for {what}")]
    Incomplete { what: &'static str, needed: usize },
    #[error("invalid {what} in response")]
    Invalid { what: &'static str },
}

/// Builds one request frame: size, header v1 (api key, version, correlation id, client id), body.
#[derive(Debug)]
pub struct Request(Vec<u8>);

impl Request {
    pub fn new(api: (i16, i16), correlation_id: i32, client_id: &str) -> Self {
        let mut request = Self(vec![0; 4]);
        request.i16(api.0).i16(api.1).i32(correlation_id);
        request.string(client_id);
        request
    }

    pub fn i8(&mut self, v: i8) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn i16(&mut self, v: i16) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A string (int16 length); longer than 32767 bytes is cut there (names never are).
    pub fn string(&mut self, s: &str) -> &mut Self {
        let bytes = &s.as_bytes()[..s.len().min(i16::MAX as usize)];
        self.i16(i16::try_from(bytes.len()).unwrap_or(i16::MAX));
        self.0.extend_from_slice(bytes);
        self
    }

    /// Bytes (int32 length).
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.array_len(b.len());
        self.0.extend_from_slice(b);
        self
    }

    /// An array length (int32).
    pub fn array_len(&mut self, n: usize) -> &mut Self {
        self.i32(i32::try_from(n).unwrap_or(i32::MAX))
    }

    /// The frame with its size prefix filled in.
    pub fn finish(mut self) -> Vec<u8> {
        let size = i32::try_from(self.0.len() - 4).unwrap_or(i32::MAX);
        self.0[..4].copy_from_slice(&size.to_be_bytes());
        self.0
    }
}

/// `ApiVersions` v0: no body.
pub fn api_versions(correlation_id: i32, client_id: &str) -> Vec<u8> {
    Request::new(API_VERSIONS, correlation_id, client_id).finish()
}

/// `FindCoordinator` v2 for a consumer group (key type 0).
pub fn find_coordinator(correlation_id: i32, client_id: &str, group: &str) -> Vec<u8> {
    let mut request = Request::new(API_FIND_COORDINATOR, correlation_id, client_id);
    request.string(group).i8(0);
    request.finish()
}

/// `OffsetCommit` v5 of one partition, outside any group generation (generation -1, no member):
/// the way standalone consumers commit.
pub fn offset_commit(
    correlation_id: i32,
    client_id: &str,
    group: &str,
    commit: &Commit<'_>,
) -> Vec<u8> {
    let mut request = Request::new(API_OFFSET_COMMIT, correlation_id, client_id);
    request.string(group).i32(-1).string("");
    request.array_len(1).string(commit.topic).array_len(1);
    request.i32(commit.partition).i64(commit.offset);
    request.string(commit.metadata);
    request.finish()
}

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub metadata: &'a str,
}

/// `OffsetFetch` v5 of one partition.
pub fn offset_fetch(
    correlation_id: i32,
    client_id: &str,
    group: &str,
    topic: &str,
    partition: i32,
) -> Vec<u8> {
    let mut request = Request::new(API_OFFSET_FETCH, correlation_id, client_id);
    request
        .string(group)
        .array_len(1)
        .string(topic)
        .array_len(1)
        .i32(partition);
    request.finish()
}

/// `SaslHandshake` v1: the mechanism tern will use.
pub fn sasl_handshake(correlation_id: i32, client_id: &str, mechanism: &str) -> Vec<u8> {
    let mut request = Request::new(API_SASL_HANDSHAKE, correlation_id, client_id);
    request.string(mechanism);
    request.finish()
}

/// `SaslAuthenticate` v1: one message of the mechanism.
pub fn sasl_authenticate(correlation_id: i32, client_id: &str, auth: &[u8]) -> Vec<u8> {
    let mut request = Request::new(API_SASL_AUTHENTICATE, correlation_id, client_id);
    request.bytes(auth);
    request.finish()
}

/// Reads a response body front to back.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    fn take<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let Some((head, rest)) = self.buf.split_first_chunk::<N>() else {
            return Err(WireError::Incomplete {
                what,
                needed: N - self.buf.len(),
            });
        };
        self.buf = rest;
        Ok(*head)
    }

    pub fn i16(&mut self, what: &'static str) -> Result<i16, WireError> {
        self.take(what).map(i16::from_be_bytes)
    }

    pub fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        self.take(what).map(i32::from_be_bytes)
    }

    pub fn i64(&mut self, what: &'static str) -> Result<i64, WireError> {
        self.take(what).map(i64::from_be_bytes)
    }

    /// A nullable string: `None` for length -1.
    pub fn nullable_string(&mut self, what: &'static str) -> Result<Option<String>, WireError> {
        let len = self.i16(what)?;
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| WireError::Invalid { what })?;
        if self.buf.len() < len {
            return Err(WireError::Incomplete {
                what,
                needed: len - self.buf.len(),
            });
        }
        let (bytes, rest) = self.buf.split_at(len);
        self.buf = rest;
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| WireError::Invalid { what })
    }

    /// Bytes (int32 length; -1, null, reads as empty).
    pub fn bytes(&mut self, what: &'static str) -> Result<Vec<u8>, WireError> {
        let len = self.array(what, 1)?;
        let (bytes, rest) = self.buf.split_at(len);
        self.buf = rest;
        Ok(bytes.to_vec())
    }

    pub fn string(&mut self, what: &'static str) -> Result<String, WireError> {
        self.nullable_string(what)?
            .ok_or(WireError::Invalid { what })
    }

    /// An array length; `min_item` bytes per element bound it by what is left, so a forged
    /// length never allocates more than the response holds. -1 (null) reads as 0.
    pub fn array(&mut self, what: &'static str, min_item: usize) -> Result<usize, WireError> {
        let len = self.i32(what)?;
        if len == -1 {
            return Ok(0);
        }
        let len = usize::try_from(len).map_err(|_| WireError::Invalid { what })?;
        match len.checked_mul(min_item) {
            Some(bytes) if bytes <= self.buf.len() => Ok(len),
            _ => Err(WireError::Incomplete {
                what,
                needed: len.saturating_mul(min_item).saturating_sub(self.buf.len()),
            }),
        }
    }
}

/// `ApiVersions` v0 response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiVersions {
    pub error_code: i16,
    /// (api key, min version, max version).
    pub apis: Vec<(i16, i16, i16)>,
}

impl ApiVersions {
    /// The (min, max) versions the broker supports of `api_key`.
    pub fn range(&self, api_key: i16) -> Option<(i16, i16)> {
        self.apis
            .iter()
            .find(|(key, _, _)| *key == api_key)
            .map(|&(_, min, max)| (min, max))
    }
}

pub fn decode_api_versions(body: &[u8]) -> Result<ApiVersions, WireError> {
    let mut r = Reader::new(body);
    let error_code = r.i16("error code")?;
    let count = r.array("api keys", 6)?;
    let apis = (0..count)
        .map(|_| Ok((r.i16("api key")?, r.i16("min")?, r.i16("max")?)))
        .collect::<Result<_, WireError>>()?;
    Ok(ApiVersions { error_code, apis })
}

/// `FindCoordinator` v2 response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinator {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

pub fn decode_find_coordinator(body: &[u8]) -> Result<Coordinator, WireError> {
    let mut r = Reader::new(body);
    let _throttle = r.i32("throttle time")?;
    Ok(Coordinator {
        error_code: r.i16("error code")?,
        error_message: r.nullable_string("error message")?,
        node_id: r.i32("node id")?,
        host: r.string("host")?,
        port: r.i32("port")?,
    })
}

/// `OffsetCommit` v5 response: (topic, partition, error code) of every partition.
pub fn decode_offset_commit(body: &[u8]) -> Result<Vec<(String, i32, i16)>, WireError> {
    let mut r = Reader::new(body);
    let _throttle = r.i32("throttle time")?;
    let mut out = Vec::new();
    for _ in 0..r.array("topics", 6)? {
        let topic = r.string("topic")?;
        for _ in 0..r.array("partitions", 6)? {
            out.push((topic.clone(), r.i32("partition")?, r.i16("error code")?));
        }
    }
    Ok(out)
}

/// One partition of an `OffsetFetch` v5 response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub topic: String,
    pub partition: i32,
    /// -1 when the group has no offset for the partition.
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub error_code: i16,
}

/// `OffsetFetch` v5 response: (top-level error code, partitions).
pub fn decode_offset_fetch(body: &[u8]) -> Result<(i16, Vec<Fetched>), WireError> {
    let mut r = Reader::new(body);
    let _throttle = r.i32("throttle time")?;
    let mut out = Vec::new();
    for _ in 0..r.array("topics", 6)? {
        let topic = r.string("topic")?;
        for _ in 0..r.array("partitions", 20)? {
            out.push(Fetched {
                topic: topic.clone(),
                partition: r.i32("partition")?,
                offset: r.i64("offset")?,
                leader_epoch: r.i32("leader epoch")?,
                metadata: r.nullable_string("metadata")?,
                error_code: r.i16("error code")?,
            });
        }
    }
    Ok((r.i16("error code")?, out))
}

/// `SaslHandshake` v1 response: (error code, mechanisms the broker enables).
pub fn decode_sasl_handshake(body: &[u8]) -> Result<(i16, Vec<String>), WireError> {
    let mut r = Reader::new(body);
    let error_code = r.i16("error code")?;
    let count = r.array("mechanisms", 2)?;
    let mechanisms = (0..count)
        .map(|_| r.string("mechanism"))
        .collect::<Result<_, _>>()?;
    Ok((error_code, mechanisms))
}

/// `SaslAuthenticate` v1 response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub auth_bytes: Vec<u8>,
    pub session_lifetime_ms: i64,
}

pub fn decode_sasl_authenticate(body: &[u8]) -> Result<Authenticated, WireError> {
    let mut r = Reader::new(body);
    Ok(Authenticated {
        error_code: r.i16("error code")?,
        error_message: r.nullable_string("error message")?,
        auth_bytes: r.bytes("auth bytes")?,
        session_lifetime_ms: r.i64("session lifetime")?,
    })
}

#[cfg(test)]
mod test;
