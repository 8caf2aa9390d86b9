//! The MQTT TCP listener: binds, accepts connections and runs each in its own task (the TLS
//! handshake from `tls.rs` first on a TLS listener, then the connection) until shutdown, then waits
//! for them to finish their in-flight work. Also runs the session-expiry sweep. The connection
//! limit itself is checked in the handshake so refused clients get a CONNACK; the listener never
//! reads client bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::MqttError;
use super::admission::Handshake;
use super::auth::Origin;
use super::broker::Broker;
use super::config::TlsConfig;
use super::connection;
use super::metrics::MqttMetrics;
use super::tls::{self, TlsServer};
use tern_core::shutdown::Shutdown;
use tern_log::LogPort;

/// How often expired sessions are removed.
const EXPIRY_SWEEP: Duration = Duration::from_secs(5);

/// A bound MQTT listener.
#[derive(Debug)]
pub struct MqttListener<S> {
    listener: TcpListener,
    broker: Arc<Broker<S>>,
    transport: Arc<Transport>,
}

impl<S: LogPort> MqttListener<S> {
    pub async fn bind(addr: SocketAddr, broker: Arc<Broker<S>>) -> Result<Self, MqttError> {
        Self::bind_with(addr, broker, None).await
    }

    /// Binds the `[mqtt.tls]` listener.
    pub async fn bind_tls(config: &TlsConfig, broker: Arc<Broker<S>>) -> Result<Self, MqttError> {
        let server = TlsServer::load(config)?;
        Self::bind_with(config.listen, broker, Some(server)).await
    }

    async fn bind_with(
        addr: SocketAddr,
        broker: Arc<Broker<S>>,
        tls: Option<TlsServer>,
    ) -> Result<Self, MqttError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| MqttError::Bind { addr, source })?;
        let loopback = listener
            .local_addr()
            .is_ok_and(|local| local.ip().is_loopback());
        let transport = Arc::new(Transport { loopback, tls });
        Ok(Self {
            listener,
            broker,
            transport,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts until `shutdown`, then waits for every connection to close.
    pub async fn run(self, mut shutdown: Shutdown) {
        let mut connections = JoinSet::new();
        let mut sweep = tokio::time::interval(EXPIRY_SWEEP);
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((socket, peer)) => {
                        let _ = socket.set_nodelay(true);
                        let (pending, evicted) = self.broker.admission.handshake();
                        if evicted {
                            MqttMetrics::inc(&self.broker.metrics.pending_evicted);
                        }
                        let transport = self.transport.clone();
                        let task = serve_socket(self.broker.clone(), socket, (peer, pending), transport, shutdown.clone());
                        connections.spawn(task);
                    }
                    Err(err) => {
                        tracing::warn!(%err, "cannot accept MQTT connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                _ = sweep.tick() => self.broker.expire_sessions().await,
                () = shutdown.wait() => break,
            }
        }
        drop(self.listener);
        while connections.join_next().await.is_some() {}
        tracing::info!("MQTT listener stopped");
    }
}

/// How connections arrive at one listener.
#[derive(Debug)]
struct Transport {
    /// The listener is bound to a loopback address (anonymous clients may be allowed).
    loopback: bool,
    tls: Option<TlsServer>,
}

/// Runs one accepted socket: the TLS handshake (within the connect timeout) if the listener
/// has TLS, then the MQTT connection.
async fn serve_socket<S: LogPort>(
    broker: Arc<Broker<S>>,
    socket: TcpStream,
    (peer, pending): (SocketAddr, Handshake),
    transport: Arc<Transport>,
    shutdown: Shutdown,
) {
    let mut origin = Origin {
        loopback_listener: transport.loopback,
        cert_identity: None,
        peer: Some(peer.ip()),
    };
    let Some(server) = &transport.tls else {
        connection::serve(broker, socket, peer, (origin, pending), shutdown).await;
        return;
    };
    // Boxed: the TLS handshake and a connection over a TLS stream are larger futures, and
    // every plain connection task would otherwise be as large as them (idle memory, #16).
    Box::pin(async move {
        let limit = broker.config.connect_timeout.0;
        let handshake = tokio::select! {
            done = tls::handshake(server, socket, peer, limit) => done,
            () = pending.evicted() => None,
        };
        let Some((stream, identity)) = handshake else {
            return;
        };
        origin.cert_identity = identity;
        connection::serve(broker, stream, peer, (origin, pending), shutdown).await;
    })
    .await;
}
