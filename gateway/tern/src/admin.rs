//! The admin HTTP endpoint: `/healthz`, `/livez`, `/readyz`, `/metrics` (Prometheus text
//! format), the status page (`/`, `/status`, and its data at `/status.json`) and the cursor
//! API (`GET /cursors`, `POST /cursors/delete`, `POST /cursors/reset`).
//!
//! A deliberately tiny HTTP/1.1 responder: one request per connection, bounded header size and
//! read time, `Connection: close`. It serves operators and scrapers on a trusted interface, never
//! device traffic, and must never block or slow the data path. The cursor API answers only
//! loopback peers unless `[admin] remote_cursor_api = true`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::cursors::{self, Action};
use crate::health::Readiness;
use tern_core::metrics::MetricsSource;
use tern_core::shutdown::Shutdown;
use tern_log::{Log, ResetTo};

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

/// What the endpoint serves from.
pub struct AdminState {
    /// `/metrics` renders these in order.
    pub sources: Vec<Arc<dyn MetricsSource>>,
    /// The log, for the cursor API (absent in unit tests).
    pub log: Option<Log>,
    /// The health checker's state (absent in unit tests: then always ready).
    pub health: Option<watch::Receiver<Readiness>>,
    /// The status page's data.
    pub status: Option<Arc<crate::status::StatusPage>>,
    /// Whether peers other than loopback may use the cursor API.
    pub remote_cursor_api: bool,
}

#[cfg(test)]
impl AdminState {
    /// Only metrics: what the unit tests need.
    pub fn metrics_only(sources: Vec<Arc<dyn MetricsSource>>) -> Self {
        Self {
            sources,
            log: None,
            health: None,
            status: None,
            remote_cursor_api: false,
        }
    }
}

/// A bound admin endpoint, ready to serve.
pub struct AdminServer {
    listener: TcpListener,
    state: Arc<AdminState>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr, state: AdminState) -> Result<Self, AdminError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        Ok(Self {
            listener,
            state: Arc::new(state),
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
                    Ok((stream, peer)) => {
                        let state = Arc::clone(&self.state);
                        requests.spawn(serve_connection(stream, peer, state));
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

async fn serve_connection(mut stream: TcpStream, peer: SocketAddr, state: Arc<AdminState>) {
    let response = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(head)) => respond(&head, peer, &state).await,
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

/// A request's method, path and decoded query parameters.
struct Request<'a> {
    method: &'a str,
    path: &'a str,
    query: Vec<(String, String)>,
}

impl Request<'_> {
    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn parse_request(head: &str) -> Request<'_> {
    let mut parts = head.lines().next().unwrap_or_default().split(' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("/"),
    );
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect();
    Request {
        method,
        path,
        query,
    }
}

/// Decodes `%XX` escapes and `+` (as a space) of a query component.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn respond(head: &str, peer: SocketAddr, state: &AdminState) -> Response {
    let request = parse_request(head);
    let read = matches!(request.method, "GET" | "HEAD");
    match (read, request.method, request.path) {
        (true, _, "/healthz") => Response::text(200, "ok\n"),
        (true, _, "/livez") => livez(state),
        (true, _, "/readyz") => readyz(state),
        (true, _, "/metrics") => {
            let mut body = String::with_capacity(4096);
            for source in &state.sources {
                source.render(&mut body);
            }
            Response::new(200, "text/plain; version=0.0.4; charset=utf-8", body)
        }
        (true, _, "/" | "/status") => match &state.status {
            Some(status) => Response::new(
                200,
                "text/html; charset=utf-8",
                status.page(current(state).as_ref()),
            ),
            None => Response::text(404, "no status page\n"),
        },
        (true, _, "/status.json") => match &state.status {
            Some(status) => Response::json(200, &status.snapshot(current(state).as_ref())),
            None => Response::text(404, "no status page\n"),
        },
        (_, _, "/cursors" | "/cursors/delete" | "/cursors/reset") => {
            cursor_api(&request, peer, state).await
        }
        (true, _, _) => Response::text(
            404,
            "not found; try /status, /healthz, /livez, /readyz, /metrics or /cursors\n",
        ),
        _ => Response::text(405, "only GET and HEAD are supported here\n"),
    }
}

fn current(state: &AdminState) -> Option<Readiness> {
    state.health.as_ref().map(|h| h.borrow().clone())
}

fn livez(state: &AdminState) -> Response {
    match current(state) {
        Some(r) if !r.is_fresh() => Response::text(
            503,
            &format!(
                "wedged: the health checker last ran {} ms ago\n",
                r.age().as_millis()
            ),
        ),
        _ => Response::text(200, "alive\n"),
    }
}

fn readyz(state: &AdminState) -> Response {
    let readiness = current(state);
    let ready = readiness.as_ref().is_none_or(Readiness::is_ready);
    Response::json(
        if ready { 200 } else { 503 },
        &crate::health::readiness_json(readiness.as_ref()),
    )
}

async fn cursor_api(request: &Request<'_>, peer: SocketAddr, state: &AdminState) -> Response {
    if !state.remote_cursor_api && !peer.ip().is_loopback() {
        return Response::text(
            403,
            "the cursor API answers loopback only ([admin] remote_cursor_api = true allows others)\n",
        );
    }
    let Some(log) = &state.log else {
        return Response::text(404, "no log\n");
    };
    let action = match (request.method, request.path) {
        ("GET" | "HEAD", "/cursors") => Action::List,
        ("POST", "/cursors/delete") | ("POST", "/cursors/reset") => {
            let Some(name) = request.param("name") else {
                return Response::text(400, "missing ?name=CURSOR\n");
            };
            let name = name.to_owned();
            if request.path == "/cursors/delete" {
                Action::Delete { name }
            } else {
                let to = match ResetTo::parse(request.param("to").unwrap_or_default()) {
                    Ok(to) => to,
                    Err(err) => return Response::text(400, &format!("to: {err}\n")),
                };
                let topic = request.param("topic").map(str::to_owned);
                Action::Reset { name, topic, to }
            }
        }
        ("GET" | "HEAD", _) => return Response::text(405, "use POST\n"),
        _ => return Response::text(405, "use GET /cursors or POST /cursors/{delete,reset}\n"),
    };
    match cursors::apply(log, &action).await {
        Ok(body) => Response::json(200, &body),
        Err(err) => Response::json(409, &json!({ "error": format!("{err:#}") })),
    }
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn new(status: u16, content_type: &'static str, body: String) -> Self {
        Self {
            status,
            content_type,
            body,
        }
    }

    fn text(status: u16, body: &str) -> Self {
        Self::new(status, "text/plain; charset=utf-8", body.to_owned())
    }

    fn json(status: u16, body: &serde_json::Value) -> Self {
        Self::new(status, "application/json", format!("{body}\n"))
    }

    fn into_bytes(self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            409 => "Conflict",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
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

    fn state() -> AdminState {
        AdminState::metrics_only(sources())
    }

    async fn ask(head: &str) -> Response {
        let peer = "127.0.0.1:5".parse().expect("addr");
        respond(head, peer, &state()).await
    }

    #[tokio::test]
    async fn routes_health_metrics_and_unknown_paths() {
        assert_eq!(ask("GET /healthz HTTP/1.1\r\n\r\n").await.status, 200);
        assert_eq!(ask("GET /livez HTTP/1.1\r\n\r\n").await.status, 200);
        assert_eq!(ask("GET /readyz HTTP/1.1\r\n\r\n").await.status, 200);
        let metrics = ask("GET /metrics?x=1 HTTP/1.1\r\n\r\n").await;
        assert_eq!((metrics.status, metrics.body.as_str()), (200, "x 1\n"));
        assert_eq!(ask("GET /nope HTTP/1.1\r\n\r\n").await.status, 404);
        assert_eq!(ask("POST /metrics HTTP/1.1\r\n\r\n").await.status, 405);
        assert_eq!(ask("").await.status, 405);
    }

    #[tokio::test]
    async fn the_cursor_api_answers_loopback_only_unless_configured() {
        let remote = "192.0.2.1:5".parse().expect("addr");
        let head = "POST /cursors/delete?name=x HTTP/1.1\r\n\r\n";
        assert_eq!(respond(head, remote, &state()).await.status, 403);
        let open = AdminState {
            remote_cursor_api: true,
            ..state()
        };
        assert_eq!(
            respond(head, remote, &open).await.status,
            404,
            "no log, but allowed"
        );
    }

    proptest::proptest! {
        /// Any request head, however malformed, parses without panicking, and any query value
        /// percent-encoded by `tern cursors` decodes back to itself.
        #[test]
        fn request_heads_never_panic_and_names_round_trip(
            head in proptest::prelude::any::<String>(),
            name in proptest::prelude::any::<String>(),
        ) {
            let _ = parse_request(&head);
            let _ = percent_decode(&head);
            let encoded = crate::cursors::encode_query(&name);
            let request = parse_request_owned(&format!("POST /cursors/delete?name={encoded} HTTP/1.1"));
            proptest::prop_assert_eq!(request, Some(name));
        }
    }

    fn parse_request_owned(head: &str) -> Option<String> {
        parse_request(head).param("name").map(str::to_owned)
    }

    #[test]
    fn query_components_are_percent_decoded() {
        let request = parse_request("POST /cursors/reset?name=mqtt%3Aa+b%2F%23&to=latest HTTP/1.1");
        assert_eq!(request.param("name"), Some("mqtt:a b/#"));
        assert_eq!(request.param("to"), Some("latest"));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[tokio::test]
    async fn oversized_heads_get_431_and_the_server_keeps_serving() {
        let server = AdminServer::bind("127.0.0.1:0".parse().expect("addr"), state())
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
