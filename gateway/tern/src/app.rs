//! Wiring: builds the runtime, takes the data directory, starts every subsystem with a
//! [`Shutdown`] handle, and on shutdown waits for them to drain. Holds no protocol logic itself.

use std::sync::Arc;

use anyhow::Context;

use crate::admin::AdminServer;
use crate::config::Config;
use tern_core::metrics::{MetricsSource, ProcessMetrics};
use tern_core::shutdown::{self, Shutdown, Signals};
use tern_log::datadir::{self, DataDirLock};
use tern_log::{Log, LogMetrics};
use tern_mqtt::{Broker, MqttListener, MqttMetrics};
use tern_upstream::{self as upstream, UpstreamConfig, UpstreamMetrics};

/// Runs the gateway until SIGINT/SIGTERM, then shuts down gracefully.
pub fn serve(config: Config) -> anyhow::Result<()> {
    match tern_mqtt::raise_fd_limit() {
        Ok((before, after)) => tracing::info!(before, after, "file-descriptor limit"),
        Err(err) => tracing::warn!(%err, "cannot raise the file-descriptor limit"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .thread_name("tern-worker")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let (trigger, shutdown) = shutdown::channel();
        let signals = Signals::install().context("cannot install signal handlers")?;
        tokio::spawn(signals.watch(trigger));
        run(config, shutdown).await
    })
}

/// Runs every subsystem until `shutdown` fires, then waits at most `shutdown.grace` for them.
pub async fn run(config: Config, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let log_dir = config.data_dir.join("log");
    // Read-only, before the lock file is touched: a newer tern's directory stays byte for byte.
    datadir::check_format(&log_dir)
        .with_context(|| format!("cannot open the log in {}", log_dir.display()))?;
    let lock = DataDirLock::acquire(&config.data_dir)?;
    tracing::info!(data_dir = %lock.path().display(), "data directory locked");

    let log = Log::open(&log_dir, &config.log)
        .await
        .with_context(|| format!("cannot open the log in {}", log_dir.display()))?;
    tracing::info!(topics = log.topics().len(), "log opened");

    let mqtt_metrics = Arc::new(MqttMetrics::default());
    let broker = Broker::open(
        log.clone(),
        config.mqtt.clone(),
        config.route.clone(),
        mqtt_metrics.clone(),
    )
    .await?;
    let mqtt_tls = match &config.mqtt.tls {
        Some(tls) => Some(MqttListener::bind_tls(tls, broker.clone()).await?),
        None => None,
    };
    let mqtt = MqttListener::bind(config.mqtt.listen, broker).await?;
    tracing::info!(
        "mqtt listener on {}",
        mqtt.local_addr().context("MQTT listener has no address")?
    );
    if let Some(tls) = &mqtt_tls {
        let addr = tls
            .local_addr()
            .context("MQTT TLS listener has no address")?;
        tracing::info!("mqtt tls listener on {addr}");
    }

    let upstream_status = upstream::StatusMap::default();
    let mut sources: Vec<Arc<dyn MetricsSource>> = vec![
        Arc::new(ProcessMetrics::new()),
        Arc::new(LogMetrics(log.clone())),
        mqtt_metrics,
    ];
    if !config.upstream.is_empty() {
        sources.push(Arc::new(UpstreamMetrics::new(
            Arc::clone(&upstream_status),
            log.clone(),
        )));
    }
    let admin = AdminServer::bind(config.admin.listen, sources).await?;
    tracing::info!(
        "admin endpoint listening on {}",
        admin
            .local_addr()
            .context("admin listener has no address")?
    );
    let admin_task = tokio::spawn(admin.run(shutdown.clone()));
    let mqtt_task = tokio::spawn(mqtt.run(shutdown.clone()));
    let upstream_tasks: Vec<_> = config
        .upstream
        .iter()
        .map(|settings| {
            let gateway = upstream::gateway_id(settings);
            tracing::info!(%gateway, bootstrap = ?settings.bootstrap, "forwarding upstream");
            // Mirror mode's producer identity lives beside the log (docs/upstream.md).
            let settings = UpstreamConfig {
                state_dir: Some(config.data_dir.join("upstream")),
                ..settings.clone()
            };
            tokio::spawn(upstream::run(
                settings,
                gateway,
                log.clone(),
                Arc::clone(&upstream_status),
                shutdown.clone(),
            ))
        })
        .collect();
    let mqtt_tls_task = mqtt_tls.map(|tls| tokio::spawn(tls.run(shutdown.clone())));

    tracing::info!("tern {} ready", env!("CARGO_PKG_VERSION"));
    shutdown.wait().await;

    let grace = config.shutdown.grace.0;
    let drained = async {
        let _ = mqtt_task.await;
        if let Some(task) = mqtt_tls_task {
            let _ = task.await;
        }
        for task in upstream_tasks {
            if let Ok(Err(err)) = task.await {
                tracing::warn!(%err, "upstream forwarding failed");
            }
        }
        let _ = admin_task.await;
    };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!(
            ?grace,
            "in-flight work did not finish within the grace period"
        );
    }
    if let Err(err) = log.close().await {
        tracing::warn!(%err, "closing the log failed");
    }
    drop(lock);
    tracing::info!("shutdown complete");
    Ok(())
}

/// Worker threads: the core count, at most four (a Pi has four cores; more buys nothing here).
fn worker_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().min(4))
        .unwrap_or(2)
}
