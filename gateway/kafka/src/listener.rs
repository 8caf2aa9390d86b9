//! The Kafka TCP listener: binds, accepts connections and serves each in its own task until
//! shutdown, then waits for them to write the answers they accepted. Never reads client bytes
//! itself.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::KafkaError;
use crate::api::{Conn, Ctx};
use crate::config::KafkaListenerConfig;
use crate::connection;
use crate::group::Groups;
use tern_core::shutdown::Shutdown;
use tern_log::LogPort;

/// A bound Kafka listener.
#[derive(Debug)]
pub struct KafkaListener<L> {
    listener: TcpListener,
    config: Arc<KafkaListenerConfig>,
    log: L,
}

impl<L: LogPort> KafkaListener<L> {
    /// Binds `config.listen`.
    pub async fn bind(config: KafkaListenerConfig, log: L) -> Result<Self, KafkaError> {
        let addr = config.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| KafkaError::Bind { addr, source })?;
        Ok(Self {
            listener,
            config: Arc::new(config),
            log,
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
        });
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
            connections.spawn(connection::serve(
                stream,
                Arc::clone(&ctx),
                Conn { local, peer },
            ));
        }
        while connections.join_next().await.is_some() {}
        let _ = timer.await;
    }
}
