//! Wiring: builds the runtime, takes the data directory and runs the gateway in three phases:
//! [`Gateway::start`] opens the log and starts every subsystem as a task owned by the
//! [`Gateway`] (a `JoinSet` per shutdown stage, the forwarders in [`Upstreams`]);
//! [`Gateway::serve`] waits for the shutdown signal and applies SIGHUP reloads (`reload.rs`
//! decides what can change live); [`Gateway::drain`] joins every task in order and closes the
//! log last. No task is detached, so none touches the log after it closed. Holds no protocol
//! logic itself.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::admin::{AdminServer, AdminState};
use crate::config::Config;
use crate::cursors::CursorMetrics;
use crate::health::{Health, Readiness, ReadinessMetrics};
use crate::reload::Source;
use crate::status::StatusPage;
use tern_core::metrics::{MetricsSource, ProcessMetrics};
use tern_core::shutdown::{self, Shutdown, ShutdownTrigger, Signals};
use tern_kafka::KafkaListener;
use tern_log::datadir::{self, DataDirLock};
use tern_log::{Log, LogMetrics};
use tern_mqtt::{Broker, MqttListener, MqttMetrics};
use tern_upstream::{self as upstream, DownstreamMetrics, UpstreamConfig, UpstreamMetrics};

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
        let watcher = tokio::spawn(signals.watch(trigger));
        let trimmer = tokio::spawn(crate::heap::trim_periodically());
        let result = run(config, shutdown, Some((source, hangup))).await;
        // Both live until the gateway has drained: a second signal exits at once until then.
        trimmer.abort();
        watcher.abort();
        result
    })
}

/// The forwarders of every `[[upstream]]`, stoppable on their own for a reload.
struct Upstreams {
    log: Log,
    status: upstream::StatusMap,
    /// The downstream's command partitions (`[upstream.commands]`).
    downstream: upstream::StatusMap,
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
            if let Some(commands) = &settings.commands {
                tracing::info!(%gateway, topic = %commands.topic, log_topic = %commands.log_topic, "reading commands from upstream");
                let (trigger, shutdown) = shutdown::channel();
                let task = tokio::spawn(upstream::downstream::run(
                    settings.clone(),
                    gateway.clone(),
                    self.log.clone(),
                    Arc::clone(&self.downstream),
                    shutdown,
                ));
                self.running.push((trigger, task));
            }
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

    /// Stops every forwarder and waits for it; past `grace`, cancels those left and waits
    /// until they have stopped.
    async fn stop(&mut self, grace: Duration) {
        for (trigger, _) in &self.running {
            trigger.trigger();
        }
        if tokio::time::timeout(grace, self.join()).await.is_err() {
            tracing::warn!(
                ?grace,
                "upstream forwarders did not stop within the grace period: cancelling them"
            );
            self.abort().await;
        }
    }

    /// Waits for the forwarders to end. Cancel-safe: a forwarder not yet joined stays owned.
    async fn join(&mut self) {
        while let Some((_, task)) = self.running.last_mut() {
            let ended = task.await;
            self.running.pop();
            if let Ok(Err(err)) = ended {
                tracing::warn!(%err, "upstream forwarding failed");
            }
        }
    }

    /// Cancels the forwarders left and waits until each has stopped.
    async fn abort(&mut self) {
        for (_, task) in &self.running {
            task.abort();
        }
        for (_, task) in self.running.drain(..) {
            let _ = task.await;
        }
    }
}

/// Runs every subsystem until `shutdown` fires, then waits at most `shutdown.grace` for them.
/// With `reload`, each SIGHUP reads the configuration again and applies what it can.
pub async fn run(
    config: Config,
    shutdown: Shutdown,
    reload: Option<(Source, Signal)>,
) -> anyhow::Result<()> {
    let mut gateway = Gateway::start(&config, &shutdown).await?;
    tracing::info!("tern {} ready", env!("CARGO_PKG_VERSION"));
    crate::systemd::ready();
    let config = gateway.serve(config, shutdown, reload).await;
    gateway.drain(config.shutdown.grace.0).await;
    Ok(())
}

/// The running gateway: the log and every task that uses it, grouped by when shutdown
/// joins them.
struct Gateway {
    lock: DataDirLock,
    log: Log,
    broker: Arc<Broker<Log>>,
    /// The MQTT, MQTT TLS and Kafka listeners; each returns once its connections ended.
    listeners: JoinSet<()>,
    upstreams: Upstreams,
    /// The admin endpoint, health checker, status page and systemd notifier: they answer
    /// until the end.
    services: JoinSet<()>,
}

impl Gateway {
    /// Locks the data directory, opens the log, binds every listener and starts every task.
    async fn start(config: &Config, shutdown: &Shutdown) -> anyhow::Result<Self> {
        let (lock, log) = open_log(config).await?;
        ensure_command_topics(&log, config)?;
        let mqtt_metrics = Arc::new(MqttMetrics::default());
        let broker = Broker::open(
            log.clone(),
            config.mqtt.clone(),
            config.route.clone(),
            mqtt_metrics.clone(),
        )
        .await?;
        let mut listeners = JoinSet::new();
        let mut watched = start_listeners(config, &log, &broker, shutdown, &mut listeners).await?;
        let mut upstreams = Upstreams {
            log: log.clone(),
            status: upstream::StatusMap::default(),
            downstream: upstream::StatusMap::default(),
            state_dir: config.data_dir.join("upstream"),
            running: Vec::new(),
        };
        let mut services = JoinSet::new();
        let (admin, readiness) = start_services(
            config,
            (&log, mqtt_metrics, &upstreams.status, &upstreams.downstream),
            shutdown,
            &mut services,
        )
        .await?;
        watched.push(admin);
        upstreams.start(&config.upstream);
        services.spawn(crate::systemd::run(readiness, watched, shutdown.clone()));
        Ok(Self {
            lock,
            log,
            broker,
            listeners,
            upstreams,
            services,
        })
    }

    /// Waits for `shutdown`, applying each SIGHUP of `reload`; returns the configuration then
    /// in force.
    async fn serve(
        &mut self,
        config: Config,
        mut shutdown: Shutdown,
        mut reload: Option<(Source, Signal)>,
    ) -> Config {
        let mut running = config;
        loop {
            let hangup = async {
                match reload.as_mut() {
                    Some((_, signal)) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.wait() => return running,
                Some(()) = hangup => {
                    if let Some((source, _)) = &reload {
                        self.reload(source, &mut running).await;
                    }
                }
            }
        }
    }

    async fn reload(&mut self, source: &Source, running: &mut Config) {
        let (broker, log) = (&self.broker, &self.log);
        apply_reload(source, running, broker, log, &mut self.upstreams).await;
    }

    /// Shuts down in order, within `grace` in all: the listeners (they stopped accepting at
    /// the signal) wait for their connections; the broker publishes the wills still waiting
    /// and closes its shared groups; the forwarders stop; the services stop. Past `grace`,
    /// whatever is left is cancelled and awaited. Only then does the log close.
    async fn drain(mut self, grace: Duration) {
        crate::systemd::stopping();
        let deadline = Instant::now() + grace;
        if tokio::time::timeout_at(deadline, self.stop(deadline))
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "in-flight work did not finish within the grace period: cancelling what is left"
            );
            self.abort().await;
        }
        if let Err(err) = self.log.close().await {
            tracing::warn!(%err, "closing the log failed");
        }
        drop(self.lock);
        tracing::info!("shutdown complete");
    }

    /// The orderly part of [`Gateway::drain`]. Cancel-safe: every task not yet joined stays
    /// owned for [`Gateway::abort`].
    async fn stop(&mut self, deadline: Instant) {
        while self.listeners.join_next().await.is_some() {}
        self.broker.shutdown().await;
        let left = deadline.saturating_duration_since(Instant::now());
        self.upstreams.stop(left).await;
        while self.services.join_next().await.is_some() {}
    }

    /// Cancels every task left and waits until each has stopped.
    async fn abort(&mut self) {
        self.listeners.shutdown().await;
        self.broker.abort().await;
        self.upstreams.abort().await;
        self.services.shutdown().await;
    }
}

/// Checks the log's format, locks the data directory and opens the log.
async fn open_log(config: &Config) -> anyhow::Result<(DataDirLock, Log)> {
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
    Ok((lock, log))
}

/// Binds the MQTT (and TLS) and Kafka listeners and starts each in `tasks`; returns the MQTT
/// listeners' handles for the systemd watchdog.
async fn start_listeners(
    config: &Config,
    log: &Log,
    broker: &Arc<Broker<Log>>,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<Vec<AbortHandle>> {
    let mqtt_tls = match &config.mqtt.tls {
        Some(tls) => Some(MqttListener::bind_tls(tls, broker.clone()).await?),
        None => None,
    };
    let mqtt = MqttListener::bind(config.mqtt.listen, broker.clone()).await?;
    let addr = mqtt.local_addr().context("MQTT listener has no address")?;
    tracing::info!("mqtt listener on {addr}");
    let mut watched = vec![tasks.spawn(mqtt.run(shutdown.clone()))];
    if let Some(tls) = mqtt_tls {
        let addr = tls
            .local_addr()
            .context("MQTT TLS listener has no address")?;
        tracing::info!("mqtt tls listener on {addr}");
        watched.push(tasks.spawn(tls.run(shutdown.clone())));
    }
    if let Some(kafka) = bind_kafka(config, log, broker).await? {
        tasks.spawn(kafka.run(shutdown.clone()));
    }
    Ok(watched)
}

/// The Kafka listener, if the configuration runs one.
async fn bind_kafka(
    config: &Config,
    log: &Log,
    broker: &Broker<Log>,
) -> anyhow::Result<Option<KafkaListener<Log>>> {
    if let (None, Some(why)) = (
        config.kafka_listener.enabled,
        config.kafka_listener_bypass(),
    ) {
        tracing::info!(
            "kafka listener off: it has authentication = \"none\" and {why} (docs/kafka.md)"
        );
    }
    if !config.kafka_listener_runs() {
        return Ok(None);
    }
    let kafka = KafkaListener::bind(
        config.kafka_listener.clone(),
        log.clone(),
        broker.security(),
    )
    .await?;
    let addr = kafka
        .local_addr()
        .context("Kafka listener has no address")?;
    tracing::info!("kafka listener on {addr}");
    Ok(Some(kafka))
}

/// Binds the admin endpoint and starts it, the health checker and the status page in
/// `tasks`; returns the admin task's handle (for the watchdog) and a readiness receiver for
/// the systemd notifier.
async fn start_services(
    config: &Config,
    (log, mqtt_metrics, upstream_status, downstream_status): (
        &Log,
        Arc<MqttMetrics>,
        &upstream::StatusMap,
        &upstream::StatusMap,
    ),
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<(AbortHandle, watch::Receiver<Readiness>)> {
    // One projection of the card's lifetime, for `/metrics` and the status page alike.
    let device = Arc::new(crate::device::DeviceMetrics::new(
        &config.data_dir,
        &config.log.flush.wear,
    ));
    let statuses = (upstream_status, downstream_status);
    let mut sources = metrics_sources(config, log, mqtt_metrics, statuses, &device);
    let health = Health::standard(
        &config.health,
        &config.data_dir,
        !config.upstream.is_empty(),
        log,
        upstream_status,
    );
    let readiness = health.subscribe();
    sources.push(Arc::new(ReadinessMetrics(readiness.clone())));
    let status = Arc::new(
        StatusPage::new(
            log.clone(),
            Arc::clone(upstream_status),
            config.upstream.clone(),
            config.status.clone(),
            device,
        )
        .with_downstream(Arc::clone(downstream_status)),
    );
    let admin_state = AdminState {
        sources,
        log: Some(log.clone()),
        health: Some(readiness),
        status: Some(Arc::clone(&status)),
        remote_cursor_api: config.admin.remote_cursor_api,
    };
    let admin = AdminServer::bind(config.admin.listen, admin_state).await?;
    let addr = admin
        .local_addr()
        .context("admin listener has no address")?;
    tracing::info!("admin endpoint listening on {addr}");
    let notifier_readiness = health.subscribe();
    // Each upstream link carries this gateway's status records to the fleet's status topic.
    for settings in config.upstream.iter().filter(|u| u.status.enabled) {
        let gateway = upstream::gateway_id(settings);
        let page = (Arc::clone(&status), config.data_dir.clone());
        let readiness = health.subscribe();
        let report =
            crate::fleet::report(settings.clone(), gateway, page, readiness, shutdown.clone());
        tasks.spawn(report);
    }
    let admin = tasks.spawn(admin.run(shutdown.clone()));
    tasks.spawn(health.run(shutdown.clone()));
    tasks.spawn(status.run(shutdown.clone()));
    Ok((admin, notifier_readiness))
}

/// What `/metrics` reports, but readiness (added once the health checker exists).
fn metrics_sources(
    config: &Config,
    log: &Log,
    mqtt_metrics: Arc<MqttMetrics>,
    (upstream_status, downstream_status): (&upstream::StatusMap, &upstream::StatusMap),
    device: &Arc<crate::device::DeviceMetrics>,
) -> Vec<Arc<dyn MetricsSource>> {
    let mut sources: Vec<Arc<dyn MetricsSource>> = vec![
        Arc::new(ProcessMetrics::new()),
        Arc::new(LogMetrics(log.clone())),
        Arc::clone(device) as Arc<dyn MetricsSource>,
        Arc::new(CursorMetrics(log.clone())),
        mqtt_metrics,
    ];
    if !config.upstream.is_empty() {
        sources.push(Arc::new(UpstreamMetrics::new(
            Arc::clone(upstream_status),
            log.clone(),
        )));
    }
    if !config.command_log_topics().is_empty() {
        sources.push(Arc::new(DownstreamMetrics::new(Arc::clone(
            downstream_status,
        ))));
    }
    sources
}

/// Creates each `[upstream.commands]` log topic (`tern_upstream::downstream::ensure_log_topic`)
/// before MQTT opens, which reads it.
fn ensure_command_topics(log: &Log, config: &Config) -> anyhow::Result<()> {
    for topic in config.command_log_topics() {
        upstream::downstream::ensure_log_topic(log, &topic)
            .with_context(|| format!("cannot create the commands' log topic {topic}"))?;
    }
    Ok(())
}

/// One SIGHUP: load, compare, apply what can change live, log the rest.
async fn apply_reload(
    source: &Source,
    running: &mut Config,
    broker: &Broker<Log>,
    log: &Log,
    upstreams: &mut Upstreams,
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
    if let Err(err) = ensure_command_topics(log, &new) {
        tracing::warn!(%err, "reload: the commands' log topic");
    }
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
        upstreams.stop(running.shutdown.grace.0).await;
        for status in [&upstreams.status, &upstreams.downstream] {
            status
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clear();
        }
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
