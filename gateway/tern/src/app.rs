//! Wiring: builds the runtime, takes the data directory, starts every subsystem with a
//! [`Shutdown`] handle, applies a SIGHUP reload (`reload.rs` decides what can change live), and
//! on shutdown waits for them to drain. Holds no protocol logic itself.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinHandle;

use crate::admin::{AdminServer, AdminState};
use crate::config::Config;
use crate::cursors::CursorMetrics;
use crate::health::Health;
use crate::reload::Source;
use crate::status::StatusPage;
use tern_core::metrics::{MetricsSource, ProcessMetrics};
use tern_core::shutdown::{self, Shutdown, ShutdownTrigger, Signals};
use tern_kafka::KafkaListener;
use tern_log::datadir::{self, DataDirLock};
use tern_log::{Log, LogMetrics};
use tern_mqtt::{Broker, MqttListener, MqttMetrics};
use tern_upstream::{self as upstream, UpstreamConfig, UpstreamMetrics};

/// Raises the soft open-files limit to the hard one, before any listener accepts: the MQTT
/// server sizes its connection budget from the limit it finds (`tern_mqtt::Admission`).
fn raise_fd_limit() {
    match tern_core::sys::raise_fd_limit(u64::MAX) {
        Ok((before, after)) => {
            tracing::info!(
                before = before.soft,
                after = after.soft,
                "file-descriptor limit"
            );
        }
        Err(err) => tracing::warn!(%err, "cannot raise the file-descriptor limit"),
    }
}

/// Runs the gateway until SIGINT/SIGTERM, then shuts down gracefully; SIGHUP reloads.
pub fn serve(config: Config, source: Source) -> anyhow::Result<()> {
    raise_fd_limit();
    crate::heap::tune();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .thread_name("tern-worker")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let (trigger, shutdown) = shutdown::channel();
        let signals = Signals::install().context("cannot install signal handlers")?;
        let hangup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
        tokio::spawn(signals.watch(trigger));
        tokio::spawn(crate::heap::trim_periodically());
        run(config, shutdown, Some((source, hangup))).await
    })
}

/// The forwarders of every `[[upstream]]`, stoppable on their own for a reload.
struct Upstreams {
    log: Log,
    status: upstream::StatusMap,
    /// Mirror mode's producer identity lives beside the log (docs/upstream.md).
    state_dir: std::path::PathBuf,
    running: Vec<(
        ShutdownTrigger,
        JoinHandle<Result<(), upstream::UpstreamError>>,
    )>,
}

impl Upstreams {
    fn start(&mut self, settings: &[UpstreamConfig]) {
        for settings in settings {
            let gateway = upstream::gateway_id(settings);
            tracing::info!(%gateway, bootstrap = ?settings.bootstrap, "forwarding upstream");
            let (trigger, shutdown) = shutdown::channel();
            let settings = UpstreamConfig {
                state_dir: Some(self.state_dir.clone()),
                ..settings.clone()
            };
            let task = tokio::spawn(upstream::run(
                settings,
                gateway,
                self.log.clone(),
                Arc::clone(&self.status),
                shutdown,
            ));
            self.running.push((trigger, task));
        }
    }

    /// Stops every forwarder and waits for it (at most `grace` in all).
    async fn stop(&mut self, grace: Duration) {
        let running = std::mem::take(&mut self.running);
        for (trigger, _) in &running {
            trigger.trigger();
        }
        let drained = async {
            for (_, task) in running {
                if let Ok(Err(err)) = task.await {
                    tracing::warn!(%err, "upstream forwarding failed");
                }
            }
        };
        if tokio::time::timeout(grace, drained).await.is_err() {
            tracing::warn!(
                ?grace,
                "upstream forwarders did not stop within the grace period"
            );
        }
    }
}

/// Runs every subsystem until `shutdown` fires, then waits at most `shutdown.grace` for them.
/// With `reload`, each SIGHUP reads the configuration again and applies what it can.
pub async fn run(
    config: Config,
    mut shutdown: Shutdown,
    mut reload: Option<(Source, Signal)>,
) -> anyhow::Result<()> {
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
    crate::cursors::handle_orphans(&log, &config.upstream, config.cursors.drop_orphans).await;

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
    let mqtt = MqttListener::bind(config.mqtt.listen, broker.clone()).await?;
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

    if let (None, Some(why)) = (
        config.kafka_listener.enabled,
        config.kafka_listener_bypass(),
    ) {
        tracing::info!(
            "kafka listener off: it has authentication = \"none\" and {why} (docs/kafka.md)"
        );
    }
    let kafka = if config.kafka_listener_runs() {
        let kafka = KafkaListener::bind(
            config.kafka_listener.clone(),
            log.clone(),
            broker.security(),
        )
        .await?;
        tracing::info!(
            "kafka listener on {}",
            kafka
                .local_addr()
                .context("Kafka listener has no address")?
        );
        Some(kafka)
    } else {
        None
    };

    let upstream_status = upstream::StatusMap::default();
    let device = Arc::new(crate::device::DeviceMetrics::new(
        &config.data_dir,
        &config.log.flush.wear,
    ));
    let mut sources: Vec<Arc<dyn MetricsSource>> = vec![
        Arc::new(ProcessMetrics::new()),
        Arc::new(LogMetrics(log.clone())),
        Arc::clone(&device) as Arc<dyn MetricsSource>,
        Arc::new(CursorMetrics(log.clone())),
        mqtt_metrics,
    ];
    if !config.upstream.is_empty() {
        sources.push(Arc::new(UpstreamMetrics::new(
            Arc::clone(&upstream_status),
            log.clone(),
        )));
    }
    let health = Health::standard(
        &config.health,
        &config.data_dir,
        !config.upstream.is_empty(),
        &log,
        &upstream_status,
    );
    let readiness = health.subscribe();
    let health_readiness = health.subscribe();
    sources.push(Arc::new(crate::health::ReadinessMetrics(readiness.clone())));
    let status = Arc::new(StatusPage::new(
        log.clone(),
        Arc::clone(&upstream_status),
        config.upstream.clone(),
        config.status.clone(),
        device,
    ));
    let admin_state = AdminState {
        sources,
        log: Some(log.clone()),
        health: Some(readiness),
        status: Some(Arc::clone(&status)),
        remote_cursor_api: config.admin.remote_cursor_api,
    };
    let admin = AdminServer::bind(config.admin.listen, admin_state).await?;
    tracing::info!(
        "admin endpoint listening on {}",
        admin
            .local_addr()
            .context("admin listener has no address")?
    );
    let admin_task = tokio::spawn(admin.run(shutdown.clone()));
    let health_task = tokio::spawn(health.run(shutdown.clone()));
    let status_task = tokio::spawn(status.run(shutdown.clone()));
    let mqtt_task = tokio::spawn(mqtt.run(shutdown.clone()));
    let kafka_task = kafka.map(|kafka| tokio::spawn(kafka.run(shutdown.clone())));
    let mut upstreams = Upstreams {
        log: log.clone(),
        status: Arc::clone(&upstream_status),
        state_dir: config.data_dir.join("upstream"),
        running: Vec::new(),
    };
    upstreams.start(&config.upstream);
    let mqtt_tls_task = mqtt_tls.map(|tls| tokio::spawn(tls.run(shutdown.clone())));

    tracing::info!("tern {} ready", env!("CARGO_PKG_VERSION"));
    crate::systemd::ready();
    let mut listeners = vec![mqtt_task.abort_handle(), admin_task.abort_handle()];
    listeners.extend(mqtt_tls_task.as_ref().map(JoinHandle::abort_handle));
    let systemd_task = tokio::spawn(crate::systemd::run(
        health_readiness,
        listeners,
        shutdown.clone(),
    ));
    let grace = config.shutdown.grace.0;
    let mut running = config;
    loop {
        let hangup = async {
            match reload.as_mut() {
                Some((_, signal)) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.wait() => break,
            Some(()) = hangup => {
                if let Some((source, _)) = &reload {
                    apply_reload(source, &mut running, &broker, &log, &mut upstreams, grace).await;
                }
            }
        }
    }

    crate::systemd::stopping();
    let drained = async {
        let _ = systemd_task.await;
        let _ = mqtt_task.await;
        if let Some(task) = mqtt_tls_task {
            let _ = task.await;
        }
        if let Some(task) = kafka_task {
            let _ = task.await;
        }
        upstreams.stop(grace).await;
        let _ = admin_task.await;
        let _ = health_task.await;
        let _ = status_task.await;
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

/// One SIGHUP: load, compare, apply what can change live, log the rest.
async fn apply_reload(
    source: &Source,
    running: &mut Config,
    broker: &Broker<Log>,
    log: &Log,
    upstreams: &mut Upstreams,
    grace: Duration,
) {
    tracing::info!("SIGHUP: reloading the configuration");
    let new = match source.load() {
        Ok(new) => new,
        Err(err) => {
            tracing::warn!(%err, "reload failed; the running configuration stays");
            return;
        }
    };
    let mut outcome = crate::reload::plan(running, &new, &source.level);
    match broker.reload(&new.mqtt, new.route.clone()) {
        Ok(not_applied) => outcome.not_applied.extend(not_applied),
        Err(err) => {
            tracing::warn!(%err, "reload of routes and ACLs failed; they stay as they were");
            outcome.applied.retain(|a| !a.starts_with("[[route]]"));
        }
    }
    if outcome.retention {
        log.set_retention(&new.log);
        log.enforce_retention().await;
    }
    if outcome.restart_upstream {
        upstreams.stop(grace).await;
        upstreams
            .status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        upstreams.start(&new.upstream);
    }
    for item in &outcome.not_applied {
        tracing::warn!("reload: not applied: {item}");
    }
    tracing::info!(applied = ?outcome.applied, "configuration reloaded");
    *running = new;
}

/// Worker threads: the core count, at most four (a Pi has four cores; more buys nothing here).
fn worker_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().min(4))
        .unwrap_or(2)
}
