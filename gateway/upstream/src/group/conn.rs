//! One connection to one broker, plaintext or TLS (the upstream's rustls configuration), SASL
//! authenticated when the upstream uses SASL: send a request frame, read the response frame with
//! the same correlation id (framing is `frame.rs`). Every call has a
//! timeout; a connection that failed once is never used again (the caller drops it). It knows
//! nothing about what the frames mean beyond the size prefix and the correlation id.
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::GroupError;
use super::frame::{self, FrameError};
use super::sasl::{self, Scram};
use super::wire::{self, ApiVersions, decode_api_versions};
use crate::config::{SaslMechanism, SaslSettings};

/// Upper bound on a response; the group client's answers are a few hundred bytes.
const MAX_RESPONSE: usize = 1 << 20;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A broker connection.
pub struct Connection {
    io: Box<dyn Io>,
    addr: String,
    correlation_id: i32,
    timeout: Duration,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The client id tern sends.
pub const CLIENT_ID: &str = "tern";

impl Connection {
    /// Connects to `addr` (`host:port`), over TLS when `tls` is set, checks with ApiVersions
    /// that the broker accepts every request version tern sends, and authenticates when `sasl`
    /// is set.
    pub async fn open(
        addr: &str,
        tls: Option<&Arc<rustls::ClientConfig>>,
        sasl: Option<&SaslSettings>,
        timeout: Duration,
    ) -> Result<Self, GroupError> {
        let needed = [
            ("FindCoordinator", wire::API_FIND_COORDINATOR),
            ("OffsetCommit", wire::API_OFFSET_COMMIT),
            ("OffsetFetch", wire::API_OFFSET_FETCH),
        ];
        Self::open_for(addr, tls, sasl, timeout, &needed).await
    }

    /// [`Connection::open`] for a client that sends the requests `needed` (name, (api key,
    /// version)) instead of the group requests.
    pub async fn open_for(
        addr: &str,
        tls: Option<&Arc<rustls::ClientConfig>>,
        sasl: Option<&SaslSettings>,
        timeout: Duration,
        needed: &[(&'static str, (i16, i16))],
    ) -> Result<Self, GroupError> {
        let io = tokio::time::timeout(timeout, connect(addr, tls))
            .await
            .map_err(|_| GroupError::Timeout {
                addr: addr.to_owned(),
                op: "connect",
            })??;
        let mut connection = Self {
            io,
            addr: addr.to_owned(),
            correlation_id: 0,
            timeout,
        };
        let body = connection
            .call("ApiVersions", |id| wire::api_versions(id, CLIENT_ID))
            .await?;
        let versions = decode_api_versions(&body).map_err(|source| GroupError::Wire {
            api: "ApiVersions",
            source,
        })?;
        check_versions(&versions, needed, sasl.is_some())?;
        if let Some(settings) = sasl {
            connection.authenticate(settings).await?;
        }
        Ok(connection)
    }

    /// SaslHandshake, then the mechanism's messages through SaslAuthenticate.
    async fn authenticate(&mut self, settings: &SaslSettings) -> Result<(), GroupError> {
        let name = sasl::mechanism_name(settings.mechanism);
        let body = self
            .call("SaslHandshake", |id| {
                wire::sasl_handshake(id, CLIENT_ID, name)
            })
            .await?;
        let (code, enabled) =
            wire::decode_sasl_handshake(&body).map_err(|source| GroupError::Wire {
                api: "SaslHandshake",
                source,
            })?;
        if code != 0 {
            let context = format!(": {name} asked, the broker enables {enabled:?}");
            return Err(GroupError::kafka("SaslHandshake", code, context));
        }
        if settings.mechanism == SaslMechanism::Plain {
            self.sasl_step(&sasl::plain(settings)).await?;
            return Ok(());
        }
        let addr = self.addr.clone();
        let sasl_error = |source| GroupError::Sasl {
            addr: addr.clone(),
            source,
        };
        let nonce = sasl::client_nonce().map_err(|_| sasl_error(sasl::SaslError::Random))?;
        let mut scram = Scram::new(settings, &nonce);
        let server_first = self.sasl_step(&scram.first()).await?;
        let client_final = scram.answer(&server_first).map_err(sasl_error)?;
        let server_final = self.sasl_step(&client_final).await?;
        scram.verify(&server_final).map_err(sasl_error)
    }

    /// One SaslAuthenticate round trip: the server's answer.
    async fn sasl_step(&mut self, message: &[u8]) -> Result<Vec<u8>, GroupError> {
        let body = self
            .call("SaslAuthenticate", |id| {
                wire::sasl_authenticate(id, CLIENT_ID, message)
            })
            .await?;
        let answer = wire::decode_sasl_authenticate(&body).map_err(|source| GroupError::Wire {
            api: "SaslAuthenticate",
            source,
        })?;
        if answer.error_code != 0 {
            let context = answer
                .error_message
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            return Err(GroupError::kafka(
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

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends the frame `build(correlation_id)` and returns the response body after its
    /// correlation id.
    pub async fn call(
        &mut self,
        api: &'static str,
        build: impl FnOnce(i32) -> Vec<u8>,
    ) -> Result<Vec<u8>, GroupError> {
        self.try_call(api, |id| Ok(build(id))).await
    }

    /// [`Connection::call`] with a frame builder that can fail (an encoder's error is returned
    /// before anything is sent).
    pub async fn try_call(
        &mut self,
        api: &'static str,
        build: impl FnOnce(i32) -> Result<Vec<u8>, GroupError>,
    ) -> Result<Vec<u8>, GroupError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let id = self.correlation_id;
        let frame = build(id)?;
        let exchange = async {
            self.io.write_all(&frame).await?;
            self.io.flush().await?;
            frame::read_frame(&mut self.io, MAX_RESPONSE).await
        };
        let addr = self.addr.clone();
        let body = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| GroupError::Timeout {
                addr: addr.clone(),
                op: api,
            })?
            .map_err(|err| match err {
                FrameError::Size { size, .. } => GroupError::BadFrame {
                    addr: addr.clone(),
                    size: usize::try_from(size).unwrap_or(0),
                },
                FrameError::Io(source) => GroupError::Io {
                    addr: addr.clone(),
                    source,
                },
            })?
            .ok_or_else(|| GroupError::Io {
                addr: addr.clone(),
                source: std::io::ErrorKind::UnexpectedEof.into(),
            })?;
        if body.len() < 4 {
            return Err(GroupError::BadFrame {
                addr,
                size: body.len(),
            });
        }
        let got = frame::correlation_id(&body);
        let body = body.get(4..).unwrap_or_default();
        if got != Some(id) {
            return Err(GroupError::Wire {
                api,
                source: wire::WireError::Invalid {
                    what: "correlation id",
                },
            });
        }
        Ok(body.to_vec())
    }
}

async fn connect(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Box<dyn Io>, GroupError> {
    let io_error = |source| GroupError::Io {
        addr: addr.to_owned(),
        source,
    };
    let tcp = TcpStream::connect(addr).await.map_err(io_error)?;
    tcp.set_nodelay(true).map_err(io_error)?;
    let Some(tls) = tls else {
        return Ok(Box::new(tcp));
    };
    let host = host_of(addr);
    let name = ServerName::try_from(host.to_owned()).map_err(|e| GroupError::Tls {
        addr: addr.to_owned(),
        message: e.to_string(),
    })?;
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
        .connect(name, tcp)
        .await
        .map_err(io_error)?;
    Ok(Box::new(stream))
}

/// The host part of `host:port` (`[v6]:port` without brackets).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Fails unless the broker accepts every version in `needed`, and the SASL ones with `sasl`.
fn check_versions(
    versions: &ApiVersions,
    needed: &[(&'static str, (i16, i16))],
    sasl: bool,
) -> Result<(), GroupError> {
    if versions.error_code != 0 {
        return Err(GroupError::kafka(
            "ApiVersions",
            versions.error_code,
            String::new(),
        ));
    }
    let sasl_needed = [
        ("SaslHandshake", wire::API_SASL_HANDSHAKE),
        ("SaslAuthenticate", wire::API_SASL_AUTHENTICATE),
    ];
    let sasl_needed = if sasl { &sasl_needed[..] } else { &[] };
    for &(name, (key, version)) in needed.iter().chain(sasl_needed) {
        let range = versions.range(key);
        if !range.is_some_and(|(min, max)| (min..=max).contains(&version)) {
            return Err(GroupError::Unsupported {
                api: name,
                version,
                range,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_strips_the_port_and_brackets() {
        assert_eq!(host_of("kafka-1:9093"), "kafka-1");
        assert_eq!(host_of("[::1]:9093"), "::1");
        assert_eq!(host_of("127.0.0.1:1"), "127.0.0.1");
    }

    const GROUP: [(&str, (i16, i16)); 3] = [
        ("FindCoordinator", wire::API_FIND_COORDINATOR),
        ("OffsetCommit", wire::API_OFFSET_COMMIT),
        ("OffsetFetch", wire::API_OFFSET_FETCH),
    ];

    #[test]
    fn a_broker_without_the_needed_versions_is_refused() {
        // Kafka 4.x ranges: all three accepted.
        let kafka4 = ApiVersions {
            error_code: 0,
            apis: vec![(8, 2, 9), (9, 1, 9), (10, 1, 6), (18, 0, 4)],
        };
        assert!(check_versions(&kafka4, &GROUP, false).is_ok());
        // SASL needs SaslHandshake v1 and SaslAuthenticate v1 as well.
        let err = check_versions(&kafka4, &GROUP, true)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("SaslHandshake")),
            "{err:?}"
        );
        let mut with_sasl = kafka4.clone();
        with_sasl.apis.extend([(17, 0, 1), (36, 0, 2)]);
        assert!(check_versions(&with_sasl, &GROUP, true).is_ok());
        // A broker that only speaks flexible OffsetCommit versions.
        let future = ApiVersions {
            error_code: 0,
            apis: vec![(8, 8, 12), (9, 1, 9), (10, 1, 6)],
        };
        let err = check_versions(&future, &GROUP, false)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("OffsetCommit")),
            "{err:?}"
        );
    }
}
