//! One connection to one broker, and the only place tern opens a Kafka connection: TCP,
//! TLS with the upstream's rustls configuration, ApiVersions (the broker's version ranges, from
//! which every request takes the highest version both sides speak), SASL when configured. Then
//! the one request/response path: [`encode_request`] writes the size prefix, the request header
//! and the body once; [`decode_response`] checks the correlation id and decodes the body, never
//! panicking on any input. Every call has a timeout; a connection whose call failed is never
//! used again (the caller drops it). It knows nothing about what the requests mean.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::sasl_authenticate_request::SaslAuthenticateRequest;
use kafka_protocol::messages::sasl_handshake_request::SaslHandshakeRequest;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::sasl::{self, Scram};
use super::{Api, CLIENT_ID, ClientError, Settings, api_name, client_versions};
use crate::config::{SaslMechanism, SaslSettings};

/// Upper bound on a response: a Fetch answer carries at most `fetch::MAX_BYTES`.
const MAX_RESPONSE: usize = 64 << 20;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A broker connection.
pub struct Connection {
    io: Box<dyn Io>,
    addr: String,
    correlation_id: i32,
    timeout: Duration,
    /// The broker's version range of each api key (ApiVersions).
    versions: BTreeMap<i16, (i16, i16)>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects to `addr` (`host:port`) with `settings`' TLS and SASL; every call through it
    /// times out after `timeout` unless it says otherwise.
    pub async fn open(
        addr: &str,
        settings: &Settings,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let io = tokio::time::timeout(timeout, connect(addr, settings.tls.as_ref()))
            .await
            .map_err(|_| ClientError::Timeout {
                addr: addr.to_owned(),
                op: "connect",
            })??;
        let mut connection = Self {
            io,
            addr: addr.to_owned(),
            correlation_id: 0,
            timeout,
            versions: BTreeMap::new(),
        };
        let answer = connection
            .exchange(&ApiVersionsRequest::default(), 0, timeout)
            .await?;
        if answer.error_code != 0 {
            return Err(ClientError::kafka(
                "ApiVersions",
                answer.error_code,
                String::new(),
            ));
        }
        connection.versions = answer
            .api_keys
            .iter()
            .map(|v| (v.api_key, (v.min_version, v.max_version)))
            .collect();
        if let Some(sasl) = &settings.sasl {
            connection.authenticate(sasl).await?;
        }
        Ok(connection)
    }

    /// A connection to the first of `settings.bootstrap` that answers.
    pub async fn bootstrap(settings: &Settings, timeout: Duration) -> Result<Self, ClientError> {
        let mut last = None;
        for addr in &settings.bootstrap {
            match Self::open(addr, settings, timeout).await {
                Ok(connection) => return Ok(connection),
                Err(err) => last = Some(err),
            }
        }
        Err(ClientError::NoBroker {
            tried: settings.bootstrap.len(),
            source: Box::new(last.unwrap_or(ClientError::Missing {
                api: "bootstrap",
                what: "server in the settings".to_owned(),
            })),
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The version of `api` to send: the highest both tern and the broker speak.
    pub fn version(&self, api: ApiKey) -> Result<i16, ClientError> {
        let key = api as i16;
        let client = client_versions(api).unwrap_or((0, -1));
        let broker = self.versions.get(&key).copied();
        negotiate(client, broker).ok_or(ClientError::Unsupported {
            api: api_name(key),
            client,
            broker,
        })
    }

    /// One request: `build(version)` at the negotiated version, and its response.
    pub async fn call<R: Api>(
        &mut self,
        build: impl FnOnce(i16) -> R,
    ) -> Result<R::Response, ClientError> {
        self.call_within(self.timeout, build).await
    }

    /// [`Connection::call`] with its own timeout (a produce the leader may hold).
    pub async fn call_within<R: Api>(
        &mut self,
        timeout: Duration,
        build: impl FnOnce(i16) -> R,
    ) -> Result<R::Response, ClientError> {
        let version = self.version(R::KEY)?;
        self.exchange(&build(version), version, timeout).await
    }

    async fn exchange<R: Api>(
        &mut self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, ClientError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let id = self.correlation_id;
        let frame = encode_request(request, version, id)?;
        let api = api_name(R::KEY as i16);
        let addr = self.addr.clone();
        let exchange = async {
            self.io.write_all(&frame).await?;
            self.io.flush().await?;
            let size = self.io.read_i32().await?;
            let len = usize::try_from(size)
                .ok()
                .filter(|len| (4..=MAX_RESPONSE).contains(len));
            let Some(len) = len else {
                return Ok(Err(size));
            };
            let mut body = vec![0; len];
            self.io.read_exact(&mut body).await?;
            Ok::<_, std::io::Error>(Ok(body))
        };
        let body = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                addr: addr.clone(),
                op: api,
            })?
            .map_err(|source| ClientError::Io {
                addr: addr.clone(),
                source,
            })?
            .map_err(|size| ClientError::BadFrame {
                addr: addr.clone(),
                size: i64::from(size),
            })?;
        decode_response::<R>(Bytes::from(body), version, id).map_err(|err| match err {
            ClientError::Correlation {
                api, expected, got, ..
            } => ClientError::Correlation {
                addr,
                api,
                expected,
                got,
            },
            err => err,
        })
    }

    /// SaslHandshake, then the mechanism's messages through SaslAuthenticate.
    async fn authenticate(&mut self, settings: &SaslSettings) -> Result<(), ClientError> {
        let name = sasl::mechanism_name(settings.mechanism);
        let answer = self
            .call(|_| {
                SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(name))
            })
            .await?;
        if answer.error_code != 0 {
            let enabled: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
            let context = format!(": {name} asked, the broker enables {enabled:?}");
            return Err(ClientError::kafka(
                "SaslHandshake",
                answer.error_code,
                context,
            ));
        }
        if settings.mechanism == SaslMechanism::Plain {
            self.sasl_step(sasl::plain(settings)).await?;
            return Ok(());
        }
        let addr = self.addr.clone();
        let sasl_error = |source| ClientError::Sasl {
            addr: addr.clone(),
            source,
        };
        let nonce = sasl::client_nonce().map_err(|_| sasl_error(sasl::SaslError::Random))?;
        let mut scram = Scram::new(settings, &nonce);
        let server_first = self.sasl_step(scram.first()).await?;
        let client_final = scram.answer(&server_first).map_err(sasl_error)?;
        let server_final = self.sasl_step(client_final).await?;
        scram.verify(&server_final).map_err(sasl_error)
    }

    /// One SaslAuthenticate round trip: the server's answer.
    async fn sasl_step(&mut self, message: Vec<u8>) -> Result<Bytes, ClientError> {
        let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(message));
        let answer = self.call(|_| request).await?;
        if answer.error_code != 0 {
            let context = answer
                .error_message
                .map(|m| format!(": {}", m.as_str()))
                .unwrap_or_default();
            return Err(ClientError::kafka(
                "SaslAuthenticate",
                answer.error_code,
                context,
            ));
        }
        Ok(answer.auth_bytes)
    }

    /// Whether the connection is known dead while idle: a read that does not wait finds the
    /// peer's end of stream, an error, or bytes nobody asked for. Such a connection is dropped
    /// before it is used (a link cut closes idle connections, and their first use after the
    /// link returns would fail).
    pub fn is_dead(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut byte);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        std::pin::Pin::new(&mut self.io)
            .poll_read(&mut cx, &mut buf)
            .is_ready()
    }
}

/// The highest version in both `client` and `broker` (inclusive ranges), if any.
pub fn negotiate(client: (i16, i16), broker: Option<(i16, i16)>) -> Option<i16> {
    let (min, max) = broker?;
    let version = client.1.min(max);
    (version >= client.0.max(min)).then_some(version)
}

/// A whole request frame: size prefix, request header (v1 or v2, as `version` needs) with
/// client id `tern`, body.
pub fn encode_request<R: Api>(
    request: &R,
    version: i16,
    correlation_id: i32,
) -> Result<Bytes, ClientError> {
    let api = api_name(R::KEY as i16);
    let encode_error = |source: anyhow::Error| ClientError::Encode {
        api,
        version,
        source: source.into(),
    };
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    header
        .encode(&mut frame, R::header_version(version))
        .map_err(encode_error)?;
    request.encode(&mut frame, version).map_err(encode_error)?;
    let size = i32::try_from(frame.len() - 4)
        .map_err(|_| encode_error(anyhow::anyhow!("request larger than 2 GiB")))?;
    if let Some(mut prefix) = frame.get_mut(..4) {
        prefix.put_i32(size);
    }
    Ok(frame.freeze())
}

/// The response to a request of `version` with `correlation_id`, from its frame (without the
/// size prefix). Any input yields a response or an error, never a panic.
pub fn decode_response<R: Api>(
    mut frame: Bytes,
    version: i16,
    correlation_id: i32,
) -> Result<R::Response, ClientError> {
    let api = api_name(R::KEY as i16);
    let decode_error = |source: anyhow::Error| ClientError::Decode {
        api,
        version,
        source: source.into(),
    };
    let header_version = <R::Response as HeaderVersion>::header_version(version);
    let header = ResponseHeader::decode(&mut frame, header_version).map_err(decode_error)?;
    if header.correlation_id != correlation_id {
        return Err(ClientError::Correlation {
            addr: String::new(),
            api,
            expected: correlation_id,
            got: header.correlation_id,
        });
    }
    R::Response::decode(&mut frame, version).map_err(decode_error)
}

async fn connect(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Box<dyn Io>, ClientError> {
    let io_error = |source| ClientError::Io {
        addr: addr.to_owned(),
        source,
    };
    let tcp = TcpStream::connect(addr).await.map_err(io_error)?;
    tcp.set_nodelay(true).map_err(io_error)?;
    let Some(tls) = tls else {
        return Ok(Box::new(tcp));
    };
    let name = ServerName::try_from(host_of(addr).to_owned()).map_err(|source| {
        ClientError::ServerName {
            addr: addr.to_owned(),
            source,
        }
    })?;
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
        .connect(name, tcp)
        .await
        .map_err(io_error)?;
    Ok(Box::new(stream))
}

/// The host part of `host:port` (`[v6]:port` without brackets).
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}
