//! The admin HTTP endpoint: `GET /healthz` and `GET /metrics` (Prometheus text format).
//!
//! A deliberately tiny HTTP/1.1 responder: one request per connection, bounded header size and
//! read time, `Connection: close`. It serves operators and scrapers on a trusted interface, never
//! device traffic, and must never block or slow the data path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use tern_core::metrics::MetricsSource;
use tern_core::shutdown::Shutdown;

/// Largest request head accepted; anything longer gets 431.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// A client that has not sent its request head by then is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the admin endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    #[error("cannot listen for admin HTTP on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A bound admin endpoint, ready to serve.
pub struct AdminServer {
    listener: TcpListener,
    sources: Arc<[Arc<dyn MetricsSource>]>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// Binds `addr`; `/metrics` will render `sources` in order.
    pub async fn bind(
        addr: SocketAddr,
        sources: Vec<Arc<dyn MetricsSource>>,
    ) -> Result<Self, AdminError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        Ok(Self {
            listener,
            sources: sources.into(),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` fires, then lets open requests finish.
    pub async fn run(self, mut shutdown: Shutdown) {
        let mut requests = JoinSet::new();
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let sources = Arc::clone(&self.sources);
                        requests.spawn(serve_connection(stream, sources));
                    }
                    Err(err) => {
                        tracing::warn!(%err, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = requests.join_next(), if !requests.is_empty() => {}
                () = shutdown.wait() => break,
            }
        }
        drop(self.listener);
        while requests.join_next().await.is_some() {}
    }
}

async fn serve_connection(mut stream: TcpStream, sources: Arc<[Arc<dyn MetricsSource>]>) {
    let response = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(head)) => respond(&head, &sources),
        Ok(Err(HeadError::TooLarge)) => Response::text(431, "request header too large\n"),
        Ok(Err(HeadError::Io)) | Err(_) => return,
    };
    let _ = stream.write_all(&response.into_bytes()).await;
    let _ = stream.shutdown().await;
}

enum HeadError {
    TooLarge,
    Io,
}

async fn read_head(stream: &mut TcpStream) -> Result<String, HeadError> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|_| HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Io);
        }
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(String::from_utf8_lossy(&head).into_owned());
        }
        if head.len() > MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
    }
}

fn respond(head: &str, sources: &[Arc<dyn MetricsSource>]) -> Response {
    let mut parts = head.lines().next().unwrap_or_default().split(' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("/"),
    );
    let path = target.split('?').next().unwrap_or(target);
    match (method, path) {
        ("GET" | "HEAD", "/healthz") => Response::text(200, "ok\n"),
        ("GET" | "HEAD", "/metrics") => {
            let mut body = String::with_capacity(4096);
            for source in sources {
                source.render(&mut body);
            }
            Response {
                status: 200,
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                body,
            }
        }
        ("GET" | "HEAD", _) => Response::text(404, "not found; try /healthz or /metrics\n"),
        _ => Response::text(405, "only GET and HEAD are supported\n"),
    }
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.to_owned(),
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            _ => "Error",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl MetricsSource for Fixed {
        fn render(&self, out: &mut String) {
            out.push_str("x 1\n");
        }
    }

    fn sources() -> Vec<Arc<dyn MetricsSource>> {
        vec![Arc::new(Fixed)]
    }

    #[test]
    fn routes_health_metrics_and_unknown_paths() {
        let sources = sources();
        assert_eq!(
            respond("GET /healthz HTTP/1.1\r\n\r\n", &sources).status,
            200
        );
        let metrics = respond("GET /metrics?x=1 HTTP/1.1\r\n\r\n", &sources);
        assert_eq!((metrics.status, metrics.body.as_str()), (200, "x 1\n"));
        assert_eq!(respond("GET /nope HTTP/1.1\r\n\r\n", &sources).status, 404);
        assert_eq!(
            respond("POST /metrics HTTP/1.1\r\n\r\n", &sources).status,
            405
        );
        assert_eq!(respond("", &sources).status, 405);
    }

    #[tokio::test]
    async fn oversized_heads_get_431_and_the_server_keeps_serving() {
        let server = AdminServer::bind("127.0.0.1:0".parse().expect("addr"), sources())
            .await
            .expect("bind");
        let addr = server.local_addr().expect("addr");
        let (trigger, shutdown) = tern_core::shutdown::channel();
        let task = tokio::spawn(server.run(shutdown));

        let mut big = TcpStream::connect(addr).await.expect("connect");
        let _ = big.write_all(&vec![b'a'; MAX_HEAD_BYTES + 2048]).await;
        let mut reply = String::new();
        let _ = big.read_to_string(&mut reply).await;
        assert!(reply.starts_with("HTTP/1.1 431"), "{reply}");

        let mut ok = TcpStream::connect(addr).await.expect("connect");
        ok.write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        let mut reply = String::new();
        ok.read_to_string(&mut reply).await.expect("read");
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(reply.ends_with("ok\n"), "{reply}");

        trigger.trigger();
        task.await.expect("server stops");
    }
}
