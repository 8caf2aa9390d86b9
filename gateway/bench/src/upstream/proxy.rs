//! A loopback TCP proxy between a Kafka client and a cluster that counts the bytes in each
//! direction, for the bench's bytes-on-the-wire figure. A Kafka client connects to the brokers
//! that Metadata responses advertise, not to its bootstrap address, so the proxy reads the
//! request/response framing (tern-kafka's size-prefixed frames) and rewrites the broker list of
//! every Metadata response (versions 0-8, the ones tern's client sends; decoded by
//! tern-upstream's `kafka_frame`) to point at one proxy listener per broker, started on first
//! sight. Counts are taken on the bytes as Kafka sent or received them, before any rewrite.
//!
//! It never changes any other byte, never listens beyond 127.0.0.1, and stops every task it
//! started when it is dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::BenchError;
use tern_kafka::frame::{self as framing, FrameError};
use tern_upstream::kafka_frame::{self, API_METADATA, MetadataResponse, RequestHeader, WireError};

/// Largest frame accepted in either direction.
const MAX_FRAME: usize = 256 * 1024 * 1024;

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

#[derive(Debug, Default)]
struct Shared {
    to_kafka: AtomicU64,
    from_kafka: AtomicU64,
    /// Broker node id → the proxy listener standing in for it.
    brokers: Mutex<HashMap<i32, SocketAddr>>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Shared {
    fn track(&self, handle: AbortHandle) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
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

/// Pumps one client connection both ways until either side closes.
async fn connection(client: TcpStream, target: &str, shared: &Arc<Shared>) -> std::io::Result<()> {
    let server = TcpStream::connect(target).await?;
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
    }
}

/// Client → Kafka: frames pass unchanged; Metadata requests are remembered by correlation id.
async fn requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    pending: Arc<Mutex<HashMap<i32, i16>>>,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    while let Some(frame) = read_frame(&mut from).await? {
        shared
            .to_kafka
            .fetch_add(frame.len() as u64 + 4, Ordering::Relaxed);
        if let Some(RequestHeader {
            api_key: API_METADATA,
            api_version,
            correlation_id,
        }) = kafka_frame::request_header(&frame)
        {
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(correlation_id, api_version);
        }
        write_frame(&mut to, &frame).await?;
    }
    Ok(())
}

/// Kafka → client: Metadata responses get the proxy's broker addresses; the rest pass unchanged.
async fn responses(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    pending: Arc<Mutex<HashMap<i32, i16>>>,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    while let Some(frame) = read_frame(&mut from).await? {
        shared
            .from_kafka
            .fetch_add(frame.len() as u64 + 4, Ordering::Relaxed);
        let version = kafka_frame::correlation_id(&frame).and_then(|id| {
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
        });
        let frame = match version {
            Some(version) => rewrite(&frame, version, &shared)?,
            None => frame,
        };
        write_frame(&mut to, &frame).await?;
    }
    Ok(())
}

/// The Metadata response with every broker replaced by its proxy listener.
fn rewrite(frame: &[u8], version: i16, shared: &Arc<Shared>) -> std::io::Result<Vec<u8>> {
    let invalid = |e: WireError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let mut response = MetadataResponse::parse(frame, version).map_err(invalid)?;
    for broker in &mut response.brokers {
        let known = shared
            .brokers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&broker.node_id)
            .copied();
        let local = match known {
            Some(addr) => addr,
            None => {
                let target = format!("{}:{}", broker.host, broker.port);
                let addr =
                    listen(shared, target).map_err(|e| std::io::Error::other(e.to_string()))?;
                shared
                    .brokers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(broker.node_id, addr);
                addr
            }
        };
        broker.host = local.ip().to_string();
        broker.port = i32::from(local.port());
    }
    Ok(response.encode())
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
