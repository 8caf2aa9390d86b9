//! A loopback TCP proxy between a Kafka client and a cluster that counts the bytes in each
//! direction, for the bench's bytes-on-the-wire figure. A Kafka client connects to the brokers
//! that Metadata responses advertise, not to its bootstrap address, so the proxy reads the
//! request/response framing (tern-kafka's size-prefixed frames) and rewrites the broker list of
//! every Metadata response (versions 0-8, the ones tern's client sends; decoded by
//! tern-upstream's `kafka_frame`) to point at one proxy listener per broker, started on first
//! sight. Counts are taken on the bytes as Kafka sent or received them, before any rewrite.
//!
//! For the fleet bench it also stands in for the link: [`CountingProxy::cut`] closes every open
//! connection and refuses new ones until [`CountingProxy::restore`]; it notes when each
//! connection to a broker was opened, and times every request from its last byte leaving the
//! client to its response's first frame, matched by correlation id per connection (with the
//! throttle time of Produce responses).
//!
//! It never changes any other byte, never listens beyond 127.0.0.1, and stops every task it
//! started when it is dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::BenchError;
use tern_kafka::frame::{self as framing, FrameError};
use tern_upstream::kafka_frame::{
    self, API_FIND_COORDINATOR, API_METADATA, CoordinatorResponse, MetadataResponse, RequestHeader,
    WireError,
};

/// Largest frame accepted in either direction.
const MAX_FRAME: usize = 256 * 1024 * 1024;
/// Kafka's API key of Produce requests.
pub const API_PRODUCE: i16 = 0;
/// The first Produce version with a flexible (tagged fields) response.
const PRODUCE_FLEXIBLE: i16 = 9;

/// One request the brokers answered, as the proxy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    /// When the response's frame arrived from the broker.
    pub at: Instant,
    pub api_key: i16,
    /// From the request's frame passing the proxy to its response's.
    pub latency: Duration,
    /// A Produce response's `throttle_time_ms` (`None` for other APIs, or when the response
    /// ends in tagged fields, which the proxy does not parse).
    pub throttle_ms: Option<i32>,
}

/// A request on its way, by correlation id.
#[derive(Debug, Clone, Copy)]
struct Pending {
    api_key: i16,
    api_version: i16,
    sent: Instant,
}

/// Bytes counted so far, as Kafka saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Client to Kafka (requests: produce batches, mostly).
    pub to_kafka: u64,
    /// Kafka to client (responses).
    pub from_kafka: u64,
}

/// A running proxy. Dropping it aborts its listeners and connections.
#[derive(Debug)]
pub struct CountingProxy {
    bootstrap: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    to_kafka: AtomicU64,
    from_kafka: AtomicU64,
    /// Broker node id → the proxy listener standing in for it.
    brokers: Mutex<HashMap<i32, SocketAddr>>,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Set while the link is cut: new connections are closed at once.
    cut: AtomicBool,
    /// Bumped by every cut; each connection ends when it changes.
    cuts: watch::Sender<u64>,
    /// When each connection to a broker was opened.
    opened: Mutex<Vec<Instant>>,
    answered: Mutex<Vec<Answered>>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            to_kafka: AtomicU64::default(),
            from_kafka: AtomicU64::default(),
            brokers: Mutex::default(),
            tasks: Mutex::default(),
            cut: AtomicBool::default(),
            cuts: watch::Sender::new(0),
            opened: Mutex::default(),
            answered: Mutex::default(),
        }
    }
}

impl Shared {
    fn track(&self, handle: AbortHandle) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
    }

    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

impl CountingProxy {
    /// Starts the bootstrap listener in front of `target` (`host:port` of one broker).
    pub async fn start(target: &str) -> Result<Self, BenchError> {
        let shared = Arc::new(Shared::default());
        let bootstrap = listen(&shared, target.to_owned())?;
        Ok(Self { bootstrap, shared })
    }

    /// The address to give the client as its bootstrap server.
    pub fn bootstrap(&self) -> SocketAddr {
        self.bootstrap
    }

    pub fn counted(&self) -> Counted {
        Counted {
            to_kafka: self.shared.to_kafka.load(Ordering::Relaxed),
            from_kafka: self.shared.from_kafka.load(Ordering::Relaxed),
        }
    }

    /// Cuts the link: closes every open connection and closes each new one as soon as it is
    /// accepted, until [`CountingProxy::restore`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// When each connection to a broker was opened, in order.
    pub fn opened(&self) -> Vec<Instant> {
        let opened = self.shared.opened.lock().unwrap_or_else(|e| e.into_inner());
        opened.clone()
    }

    /// Every request answered so far, in the order the responses arrived.
    pub fn answered(&self) -> Vec<Answered> {
        let answered = self
            .shared
            .answered
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        answered.clone()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        let tasks = self.shared.tasks.lock().unwrap_or_else(|e| e.into_inner());
        for task in tasks.iter() {
            task.abort();
        }
    }
}

/// A listener on a free loopback port forwarding each connection to `target`. Not async (it
/// binds a std listener) so that a response handler can start one without async recursion;
/// must be called within the runtime.
fn listen(shared: &Arc<Shared>, target: String) -> Result<SocketAddr, BenchError> {
    let io = |source| BenchError::Io {
        what: "starting the counting proxy",
        source,
    };
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(io)?;
    listener.set_nonblocking(true).map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let listener = TcpListener::from_std(listener).map_err(io)?;
    let accept_shared = Arc::clone(shared);
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            if accept_shared.is_cut() {
                drop(client);
                continue;
            }
            let shared = Arc::clone(&accept_shared);
            let target = target.clone();
            let task = tokio::spawn(async move {
                if let Err(err) = connection(client, &target, &shared).await {
                    tracing::debug!(%err, "bench proxy connection ended");
                }
            });
            accept_shared.track(task.abort_handle());
        }
    });
    shared.track(task.abort_handle());
    Ok(addr)
}

/// Pumps one client connection both ways until either side closes or the link is cut.
async fn connection(client: TcpStream, target: &str, shared: &Arc<Shared>) -> std::io::Result<()> {
    let mut cuts = shared.cuts.subscribe();
    let server = TcpStream::connect(target).await?;
    // A cut since the accept (its signal came before this subscription, or during the connect).
    if shared.is_cut() {
        return Ok(());
    }
    shared
        .opened
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Instant::now());
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client_rx, client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    let pending = Arc::new(Mutex::new(HashMap::new()));
    let requests = requests(
        client_rx,
        server_tx,
        Arc::clone(&pending),
        Arc::clone(shared),
    );
    let responses = responses(server_rx, client_tx, pending, Arc::clone(shared));
    tokio::select! {
        result = requests => result,
        result = responses => result,
        _ = cuts.changed() => Ok(()),
    }
}

/// Client → Kafka: frames pass unchanged; every request is remembered by correlation id.
async fn requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    pending: Arc<Mutex<HashMap<i32, Pending>>>,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    while let Some(frame) = read_frame(&mut from).await? {
        shared
            .to_kafka
            .fetch_add(frame.len() as u64 + 4, Ordering::Relaxed);
        if let Some(RequestHeader {
            api_key,
            api_version,
            correlation_id,
        }) = kafka_frame::request_header(&frame)
        {
            let request = Pending {
                api_key,
                api_version,
                sent: Instant::now(),
            };
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(correlation_id, request);
        }
        write_frame(&mut to, &frame).await?;
    }
    Ok(())
}

/// Kafka → client: Metadata responses get the proxy's broker addresses; the rest pass unchanged.
/// Each response that answers a remembered request is timed.
async fn responses(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    pending: Arc<Mutex<HashMap<i32, Pending>>>,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    while let Some(frame) = read_frame(&mut from).await? {
        let at = Instant::now();
        shared
            .from_kafka
            .fetch_add(frame.len() as u64 + 4, Ordering::Relaxed);
        let request = kafka_frame::correlation_id(&frame).and_then(|id| {
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
        });
        if let Some(request) = request {
            let answered = answered(request, &frame, at);
            let mut all = shared.answered.lock().unwrap_or_else(|e| e.into_inner());
            all.push(answered);
        }
        let frame = match request {
            Some(Pending {
                api_key: API_METADATA,
                api_version,
                ..
            }) => rewrite(&frame, api_version, &shared)?,
            Some(Pending {
                api_key: API_FIND_COORDINATOR,
                api_version,
                ..
            }) => rewrite_coordinators(&frame, api_version, &shared)?,
            _ => frame,
        };
        write_frame(&mut to, &frame).await?;
    }
    Ok(())
}

/// `request`'s answer `frame`, arrived `at`.
fn answered(request: Pending, frame: &[u8], at: Instant) -> Answered {
    Answered {
        at,
        api_key: request.api_key,
        latency: at.saturating_duration_since(request.sent),
        throttle_ms: match request.api_key {
            API_PRODUCE => produce_throttle_ms(frame, request.api_version),
            _ => None,
        },
    }
}

/// The `throttle_time_ms` of a Produce response frame of `version` (v1+): its last field, before
/// the tagged fields in flexible versions, read only when those are empty (one zero byte).
#[expect(
    clippy::big_endian_bytes,
    reason = "Kafka's protocol is big-endian by definition"
)]
fn produce_throttle_ms(frame: &[u8], version: i16) -> Option<i32> {
    let body = match version {
        ..=0 => return None,
        PRODUCE_FLEXIBLE.. => frame.strip_suffix(&[0])?,
        _ => frame,
    };
    // The correlation id comes first, so a body of 8 bytes or less has no throttle field.
    if body.len() < 8 {
        return None;
    }
    body.last_chunk::<4>().map(|b| i32::from_be_bytes(*b))
}

/// The Metadata response with every broker replaced by its proxy listener.
fn rewrite(frame: &[u8], version: i16, shared: &Arc<Shared>) -> std::io::Result<Vec<u8>> {
    let mut response = MetadataResponse::parse(frame, version).map_err(invalid)?;
    for broker in &mut response.brokers {
        let local = stand_in(shared, broker.node_id, &broker.host, broker.port)?;
        broker.host = local.ip().to_string();
        broker.port = i32::from(local.port());
    }
    Ok(response.encode())
}

/// The FindCoordinator response with every coordinator replaced by its proxy listener, so that
/// shared mode's transaction and group coordinators are behind the proxy too.
fn rewrite_coordinators(
    frame: &[u8],
    version: i16,
    shared: &Arc<Shared>,
) -> std::io::Result<Vec<u8>> {
    let mut response = CoordinatorResponse::parse(frame, version).map_err(invalid)?;
    for broker in response.coordinators() {
        // A coordinator not found is node -1 with no address: nothing to stand in for.
        if broker.node_id < 0 || broker.host.is_empty() {
            continue;
        }
        let local = stand_in(shared, broker.node_id, &broker.host, broker.port)?;
        let port = i32::from(local.port());
        response.redirect(broker.node_id, &local.ip().to_string(), port);
    }
    response.encode().map_err(invalid)
}

fn invalid(e: WireError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// The proxy listener standing in for broker `node_id` at `host`:`port`, started on first sight.
fn stand_in(
    shared: &Arc<Shared>,
    node_id: i32,
    host: &str,
    port: i32,
) -> std::io::Result<SocketAddr> {
    let mut brokers = shared.brokers.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(addr) = brokers.get(&node_id) {
        return Ok(*addr);
    }
    let addr = listen(shared, format!("{host}:{port}"))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    brokers.insert(node_id, addr);
    Ok(addr)
}

/// One length-prefixed frame (without its length); `None` at a clean end of stream.
async fn read_frame(from: &mut OwnedReadHalf) -> std::io::Result<Option<Vec<u8>>> {
    framing::read_frame(from, MAX_FRAME)
        .await
        .map_err(|err| match err {
            FrameError::Io(err) => err,
            err => std::io::Error::new(std::io::ErrorKind::InvalidData, err),
        })
}

async fn write_frame(to: &mut OwnedWriteHalf, frame: &[u8]) -> std::io::Result<()> {
    framing::write_frame(to, &[frame]).await
}

#[cfg(test)]
#[expect(
    clippy::big_endian_bytes,
    reason = "Kafka's protocol is big-endian by definition"
)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A request frame with its size prefix: api key, version, correlation id, client id null.
    fn request(api_key: i16, version: i16, correlation_id: i32) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&api_key.to_be_bytes());
        body.extend_from_slice(&version.to_be_bytes());
        body.extend_from_slice(&correlation_id.to_be_bytes());
        body.extend_from_slice(&(-1i16).to_be_bytes());
        sized(&body)
    }

    fn sized(body: &[u8]) -> Vec<u8> {
        let mut frame = u32::try_from(body.len())
            .expect("small")
            .to_be_bytes()
            .to_vec();
        frame.extend_from_slice(body);
        frame
    }

    /// A broker that answers each request with its correlation id, an empty response array
    /// and a throttle time of 7 ms, after `delay`.
    async fn broker(delay: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut len = [0; 4];
                    while socket.read_exact(&mut len).await.is_ok() {
                        let mut frame = vec![0; u32::from_be_bytes(len) as usize];
                        if socket.read_exact(&mut frame).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(delay).await;
                        let mut body = frame.get(4..8).expect("a correlation id").to_vec();
                        body.extend_from_slice(&0i32.to_be_bytes());
                        body.extend_from_slice(&7i32.to_be_bytes());
                        if socket.write_all(&sized(&body)).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Sends `frame` and reads one response frame; `None` if the proxy closed the connection.
    async fn ask(client: &mut TcpStream, frame: &[u8]) -> Option<Vec<u8>> {
        client.write_all(frame).await.ok()?;
        let mut len = [0; 4];
        client.read_exact(&mut len).await.ok()?;
        let mut body = vec![0; u32::from_be_bytes(len) as usize];
        client.read_exact(&mut body).await.ok()?;
        Some(body)
    }

    #[tokio::test]
    async fn requests_are_timed_by_correlation_id_and_a_cut_closes_and_refuses_connections() {
        let broker = broker(Duration::from_millis(30)).await;
        let proxy = CountingProxy::start(&broker.to_string())
            .await
            .expect("proxy");
        let mut client = TcpStream::connect(proxy.bootstrap())
            .await
            .expect("connect");
        let answer = ask(&mut client, &request(API_PRODUCE, 8, 41)).await;
        assert_eq!(
            answer.as_deref().and_then(|a| a.get(..4)),
            Some(&41i32.to_be_bytes()[..])
        );
        assert!(ask(&mut client, &request(19, 7, 42)).await.is_some());
        let answered = proxy.answered();
        let keys: Vec<(i16, Option<i32>)> = answered
            .iter()
            .map(|a| (a.api_key, a.throttle_ms))
            .collect();
        assert_eq!(keys, [(API_PRODUCE, Some(7)), (19, None)]);
        assert!(
            answered
                .iter()
                .all(|a| a.latency >= Duration::from_millis(30))
        );
        assert_eq!(proxy.opened().len(), 1);
        proxy.cut();
        assert_eq!(ask(&mut client, &request(API_PRODUCE, 8, 43)).await, None);
        let mut refused = TcpStream::connect(proxy.bootstrap())
            .await
            .expect("accepted");
        assert_eq!(ask(&mut refused, &request(API_PRODUCE, 8, 44)).await, None);
        proxy.restore();
        let mut again = TcpStream::connect(proxy.bootstrap())
            .await
            .expect("connect");
        assert!(
            ask(&mut again, &request(API_PRODUCE, 8, 45))
                .await
                .is_some()
        );
        assert_eq!(proxy.opened().len(), 2);
    }

    #[test]
    fn the_produce_throttle_is_the_last_field_before_empty_tagged_fields() {
        // Correlation id 1, an empty response array, throttle 250.
        let mut v8 = 1i32.to_be_bytes().to_vec();
        v8.extend_from_slice(&0i32.to_be_bytes());
        v8.extend_from_slice(&250i32.to_be_bytes());
        assert_eq!(produce_throttle_ms(&v8, 8), Some(250));
        assert_eq!(produce_throttle_ms(&v8, 0), None);
        // Flexible: header tagged fields, compact array of none, throttle, no tagged fields.
        let mut v11 = vec![0, 0, 0, 1, 0, 1];
        v11.extend_from_slice(&250i32.to_be_bytes());
        v11.push(0);
        assert_eq!(produce_throttle_ms(&v11, 11), Some(250));
        // Tagged fields present: not parsed.
        let last = v11.len() - 1;
        v11[last] = 1;
        assert_eq!(produce_throttle_ms(&v11, 11), None);
        assert_eq!(produce_throttle_ms(&[0, 0, 0, 1], 8), None);
    }
}
