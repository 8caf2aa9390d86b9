//! The Kafka TCP listener: binds, accepts connections (with a TLS handshake when
//! `[kafka_listener.tls]` is set) and serves each in its own task until shutdown, then waits for
//! them to write the answers they accepted. Never reads client bytes itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::KafkaError;
use crate::api::{Conn, Ctx};
use crate::config::KafkaListenerConfig;
use crate::connection;
use crate::group::Groups;
use crate::sasl::Session;
use tern_auth::Security;
use tern_core::shutdown::Shutdown;
use tern_log::LogPort;

/// How long a client has for its TLS handshake.
const TLS_HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// A bound Kafka listener.
pub struct KafkaListener<L> {
    listener: TcpListener,
    config: Arc<KafkaListenerConfig>,
    log: L,
    security: Arc<Security>,
    tls: Option<TlsAcceptor>,
}

impl<L> std::fmt::Debug for KafkaListener<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaListener")
            .field("listener", &self.listener)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl<L: LogPort> KafkaListener<L> {
    /// Loads `[kafka_listener.tls]` and binds `config.listen`; `security` holds the users
    /// SASL checks and the ACL every request is checked against (the MQTT listener's).
    pub async fn bind(
        config: KafkaListenerConfig,
        log: L,
        security: Arc<Security>,
    ) -> Result<Self, KafkaError> {
        let tls = match &config.tls {
            Some(tls) => Some(TlsAcceptor::from(tern_auth::tls::server_config(
                &tls.cert, &tls.key, None,
            )?)),
            None => None,
        };
        let addr = config.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| KafkaError::Bind { addr, source })?;
        Ok(Self {
            listener,
            config: Arc::new(config),
            log,
            security,
            tls,
        })
    }

    /// The bound address (the real port when configured with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections until `shutdown`, then waits for every connection to finish.
    pub async fn run(self, shutdown: Shutdown) {
        let groups = Groups::new(self.config.groups.limits());
        let timer = tokio::spawn(groups.clone().run_timer(shutdown.clone()));
        let ctx = Arc::new(Ctx {
            log: self.log,
            config: self.config,
            shutdown: shutdown.clone(),
            producer_states: Default::default(),
            producers: Default::default(),
            groups,
            security: Some(self.security),
        });
        let sasl = ctx.config.requires_sasl();
        let mut connections = JoinSet::new();
        let mut stop = shutdown;
        loop {
            let accepted = tokio::select! {
                () = stop.wait() => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                accepted = self.listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors or similar: the next accept may succeed.
                    tracing::warn!(%err, "kafka listener cannot accept");
                    tokio::task::yield_now().await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Ok(local) = stream.local_addr() else {
                continue;
            };
            tracing::debug!(%peer, "kafka client connected");
            let conn = Conn {
                local,
                peer,
                sasl: Session::new(sasl),
            };
            connections.spawn(serve(stream, self.tls.clone(), Arc::clone(&ctx), conn));
        }
        while connections.join_next().await.is_some() {}
        let _ = timer.await;
    }
}

/// One connection, after its TLS handshake when the listener has TLS.
async fn serve<L: LogPort>(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    ctx: Arc<Ctx<L>>,
    conn: Conn,
) {
    let Some(tls) = tls else {
        return connection::serve(stream, ctx, conn).await;
    };
    match tokio::time::timeout(TLS_HANDSHAKE_LIMIT, tls.accept(stream)).await {
        Ok(Ok(stream)) => connection::serve(stream, ctx, conn).await,
        Ok(Err(err)) => tracing::info!(peer = %conn.peer, %err, "kafka TLS handshake failed"),
        Err(_) => tracing::info!(peer = %conn.peer, "kafka TLS handshake timed out"),
    }
}
