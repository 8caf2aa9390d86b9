//! The state every MQTT connection shares: the log (a `LogPort`), limits, routing table, retained
//! messages, the session registry (client-id takeover and expiry), the shared subscription
//! groups and the metrics. Built once at startup from the state log. Holds no socket;
//! connections borrow from it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{Notify, OwnedMutexGuard};

use super::MqttError;
use super::admission::Admission;
use super::auth::Auth;
use super::clip::clip;
use super::config::{MqttConfig, RouteConfig};
use super::message;
use super::metrics::MqttMetrics;
use super::retained::{Retained, RetainedLimits};
use super::router::PartitionId;
use super::router::Router;
use super::session::{NEVER_EXPIRES, Session};
use super::shared::SharedGroups;
use super::state::{StateError, StateLog};
use super::tasks::{Watchers, Wills};
use super::topic::TopicLimits;
use super::unclaimed::{self, Unclaimed};
use tern_log::LogPort;
use tokio::time::error::Elapsed;

/// How long a new connection waits for the previous holder of its client id to let go.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);

/// One client id's slot in the registry.
#[derive(Debug)]
pub struct SessionEntry {
    session: Arc<tokio::sync::Mutex<Session>>,
    holder: Mutex<Holder>,
    /// Bumped on every connect; delayed wills check it before firing.
    pub(crate) generation: AtomicU64,
}

#[derive(Debug, Default)]
struct Holder {
    kick: Option<Arc<Notify>>,
    disconnected_at: Option<Instant>,
}

impl SessionEntry {
    fn new(session: Session) -> Self {
        Self {
            session: Arc::new(tokio::sync::Mutex::new(session)),
            holder: Mutex::new(Holder {
                kick: None,
                disconnected_at: Some(Instant::now()),
            }),
            generation: AtomicU64::new(0),
        }
    }

    fn holder(&self) -> MutexGuard<'_, Holder> {
        self.holder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the connection holding `kick` as gone.
    pub(crate) fn release(&self, kick: &Arc<Notify>) {
        let mut holder = self.holder();
        if holder.kick.as_ref().is_some_and(|k| Arc::ptr_eq(k, kick)) {
            holder.kick = None;
            holder.disconnected_at = Some(Instant::now());
        }
    }

    /// Whether no connection holds the session.
    pub(crate) fn is_idle(&self) -> bool {
        self.holder().kick.is_none()
    }
}

/// The routing table and the partition count of each routed log topic, replaced whole by
/// [`Broker::reload`].
#[derive(Debug)]
pub(crate) struct Routing {
    pub(crate) router: Router,
    partitions: HashMap<String, u32>,
}

impl Routing {
    fn open<S: LogPort>(log: &S, router: Router) -> Result<Self, MqttError> {
        let mut partitions = HashMap::new();
        for topic in router.log_topics() {
            let count = log.ensure_topic(&topic).map_err(MqttError::Log)?;
            partitions.insert(topic, count.max(1));
        }
        Ok(Self { router, partitions })
    }

    /// Partition count of a routed log topic.
    pub(crate) fn partitions(&self, log_topic: &str) -> u32 {
        self.partitions.get(log_topic).copied().unwrap_or(1)
    }
}

/// Shared MQTT server state.
#[derive(Debug)]
pub struct Broker<S> {
    pub(crate) log: S,
    pub(crate) config: MqttConfig,
    pub(crate) limits: TopicLimits,
    routing: RwLock<Arc<Routing>>,
    pub(crate) metrics: Arc<MqttMetrics>,
    pub(crate) state: Arc<StateLog<S>>,
    pub(crate) retained: Retained<S>,
    pub(crate) auth: Auth,
    /// Connection slots and sockets waiting for CONNECT.
    pub(crate) admission: Arc<Admission>,
    /// Shared subscription groups (`$share/…`).
    pub(crate) shared: SharedGroups<S>,
    /// Wills waiting for their delay.
    pub(crate) wills: Wills,
    /// Sends of the datacenter's commands with an expiry, for their watchers (`unclaimed.rs`).
    pub(crate) unclaimed: Arc<Unclaimed>,
    /// The watchers of the command log topics' expiries.
    watchers: Watchers,
    sessions: Mutex<HashMap<String, Arc<SessionEntry>>>,
    next_connection: AtomicU64,
    boot: u64,
}

impl<S: LogPort> Broker<S> {
    /// Creates the log topics and rebuilds retained messages and sessions from the state log.
    pub async fn open(
        log: S,
        config: MqttConfig,
        routes: Vec<RouteConfig>,
        metrics: Arc<MqttMetrics>,
    ) -> Result<Arc<Self>, MqttError> {
        let auth = Auth::load(&config.auth, &config.acl)?;
        metrics.queued.set_cap(config.max_queued_bytes_total.0);
        let router = Router::new(routes, config.default_log_topic.clone())
            .reading(config.command_log_topics.clone());
        let routing = Routing::open(&log, router)?;
        let state = Arc::new(StateLog::new(log.clone()).map_err(MqttError::Log)?);
        let loaded = state.load().await.map_err(MqttError::Log)?;
        tracing::info!(
            retained = loaded.retained.len(),
            sessions = loaded.sessions.len(),
            records = loaded.records,
            "MQTT state loaded"
        );
        if let Some(strategy) = config.shared_strategy {
            let kind = config.shared_types().fallback();
            tracing::warn!(
                ?strategy,
                shared_type = kind.name(),
                "[mqtt] shared_strategy is deprecated: write shared_type = \"{}\" instead",
                kind.name()
            );
        }
        let shared = SharedGroups::new(log.clone(), config.shared_types());
        let held = loaded.sessions.iter().flat_map(|(id, stored)| {
            let filters = stored.subscriptions.iter().map(|s| s.filter.clone());
            filters.map(move |filter| (id.clone(), filter))
        });
        shared.restore(held).await.map_err(MqttError::Log)?;
        let sessions = loaded
            .sessions
            .into_iter()
            .map(|(id, stored)| {
                (
                    id.clone(),
                    Arc::new(SessionEntry::new(Session::restore(&id, stored))),
                )
            })
            .collect();
        let unclaimed = Arc::new(Unclaimed::default());
        let watchers = Watchers::default();
        for topic in &config.command_log_topics {
            let partitions = log.ensure_topic(topic).map_err(MqttError::Log)?;
            for partition in 0..partitions {
                let watch = unclaimed::watch(
                    log.clone(),
                    (topic.clone(), partition),
                    Arc::clone(&unclaimed),
                    message::now_ms,
                    watchers.stop.clone(),
                );
                // A fresh set is open.
                let _ = watchers.tasks.spawn(watch).await;
            }
        }
        Ok(Arc::new(Self {
            unclaimed,
            watchers,
            limits: config.topic_limits(),
            retained: Retained::new(
                state.clone(),
                loaded.retained,
                RetainedLimits {
                    count: config.max_retained,
                    bytes: config.max_retained_bytes.0,
                },
                metrics.clone(),
            ),
            auth,
            admission: Arc::new(Admission::new(&config)),
            shared,
            wills: Wills::default(),
            log,
            config,
            routing: RwLock::new(Arc::new(routing)),
            metrics,
            state,
            sessions: Mutex::new(sessions),
            next_connection: AtomicU64::new(1),
            boot: boot_stamp(),
        }))
    }

    /// Ends the broker's own tasks once no connection is left (the listeners returned):
    /// publishes every will still waiting for its delay and waits until each is stored, then
    /// closes every shared group (its cursor committed) and waits for its dispatcher. After
    /// it, no broker task touches the log, which the caller closes next. Cancel-safe: cut
    /// short, what still runs stays owned for [`Broker::abort`].
    pub async fn shutdown(&self) {
        self.wills.close().await;
        self.shared.close().await;
        self.watchers.close().await;
    }

    /// Cancels the broker's tasks left running (a shutdown past its grace period) and waits
    /// until each has stopped.
    pub async fn abort(&self) {
        self.wills.abort().await;
        self.shared.abort().await;
        self.watchers.tasks.abort().await;
    }

    /// A number unique to this connection within this process.
    pub(crate) fn connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    /// A client id for a client that sent an empty one.
    pub(crate) fn assign_client_id(&self, connection: u64) -> String {
        format!("tern-{:x}-{connection}", self.boot)
    }

    /// The current routing table.
    pub(crate) fn routing(&self) -> Arc<Routing> {
        Arc::clone(&self.routing.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Every partition a subscription filter may find records in.
    pub(crate) fn partitions_for(&self, filter: &str) -> Vec<PartitionId> {
        let routing = self.routing();
        routing
            .router
            .log_topics_for(filter)
            .into_iter()
            .flat_map(|t| {
                let count = routing.partitions(&t);
                (0..count).map(move |p| (t.clone(), p))
            })
            .collect()
    }

    /// The users and ACL rules of `[mqtt.auth]` and `[[mqtt.acl]]`, for the Kafka listener,
    /// which serves the same users under the same rules (a reload's new rules reach both).
    pub fn security(&self) -> Arc<tern_auth::Security> {
        self.auth.security()
    }

    /// Applies a reloaded configuration (SIGHUP) to new work without touching connections:
    /// `[[route]]` (and `default_log_topic`) for publishes and subscriptions from now on,
    /// `[[mqtt.acl]]` for every check from now on. Returns what it could not apply (every other
    /// `[mqtt]` setting needs a restart).
    pub fn reload(
        &self,
        config: &MqttConfig,
        routes: Vec<RouteConfig>,
    ) -> Result<Vec<String>, MqttError> {
        let router = Router::new(routes, config.default_log_topic.clone())
            .reading(config.command_log_topics.clone());
        let routing = Routing::open(&self.log, router)?;
        *self.routing.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(routing);
        self.auth.set_acl(&config.acl);
        let comparable = |c: &MqttConfig| MqttConfig {
            acl: Vec::new(),
            default_log_topic: String::new(),
            command_log_topics: Vec::new(),
            ..c.clone()
        };
        let mut not_applied = Vec::new();
        if comparable(config) != comparable(&self.config) {
            not_applied.push(
                "[mqtt] settings other than [[mqtt.acl]] and default_log_topic (listeners, limits, auth, TLS) need a restart".to_owned(),
            );
        }
        Ok(not_applied)
    }

    /// Takes the session of `client_id` for a new connection: asks the current holder to leave
    /// (client-id takeover) and waits until it has. `kick` is how this connection will be asked.
    /// The flag says the session expired while no connection held it (its deadline passed,
    /// whether or not the sweep of [`Broker::expire_sessions`] ran since): the caller forgets
    /// it before use.
    pub(crate) async fn take_session(
        &self,
        client_id: &str,
        kick: Arc<Notify>,
    ) -> Result<(Arc<SessionEntry>, OwnedMutexGuard<Session>, bool), Elapsed> {
        let entry = {
            let mut sessions = self.lock_sessions();
            sessions
                .entry(client_id.to_owned())
                .or_insert_with(|| Arc::new(SessionEntry::new(Session::new(client_id))))
                .clone()
        };
        if let Some(previous) = entry.holder().kick.take() {
            previous.notify_one();
        }
        let guard = tokio::time::timeout(TAKEOVER_WAIT, entry.session.clone().lock_owned()).await?;
        let expired = {
            let mut holder = entry.holder();
            if let Some(other) = holder.kick.replace(kick) {
                other.notify_one();
            }
            let since = holder.disconnected_at.take();
            since.is_some_and(|since| expiry_passed(guard.expiry, since))
        };
        entry.generation.fetch_add(1, Ordering::SeqCst);
        Ok((entry, guard, expired))
    }

    /// Ends sessions whose expiry has passed since their connection closed, so an abandoned
    /// session does not hold its state for ever; a CONNECT does not rely on it
    /// ([`Broker::take_session`] checks the deadline itself).
    pub(crate) async fn expire_sessions(&self) {
        let expired: Vec<(String, Arc<SessionEntry>)> = {
            let sessions = self.lock_sessions();
            sessions
                .iter()
                .filter(|(_, entry)| entry.is_idle())
                .map(|(id, entry)| (id.clone(), entry.clone()))
                .collect()
        };
        for (id, entry) in expired {
            let Ok(mut session) = entry.session.clone().try_lock_owned() else {
                continue;
            };
            let since = entry.holder().disconnected_at;
            let due = since.is_some_and(|t| expiry_passed(session.expiry, t));
            if !due || !entry.is_idle() {
                continue;
            }
            if session.stored {
                if let Err(err) = self.forget_session(&mut session).await {
                    tracing::warn!(client_id = %clip(&id), %err, "cannot remove expired session");
                    continue;
                }
            }
            let mut sessions = self.lock_sessions();
            if sessions.get(&id).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                sessions.remove(&id);
            }
        }
    }

    /// Durably deletes a session's record and cursors and clears it in memory.
    pub(crate) async fn forget_session(&self, session: &mut Session) -> Result<(), StateError> {
        if session.stored {
            let released = session.inflight.iter().filter(|(_, i)| i.released);
            for (pkid, _) in released.filter(|(_, i)| i.source.is_some()) {
                self.state
                    .put_released(&session.client_id, *pkid, None)
                    .await?;
            }
            // Incoming QoS 2 ids awaiting PUBREL die with the session (else they would stay
            // live keys of `__mqtt_state` for ever).
            for pkid in &session.pending_qos2 {
                self.state
                    .put_qos2(&session.client_id, *pkid, false)
                    .await?;
            }
            let filters: Vec<String> = session
                .subscriptions
                .iter()
                .map(|s| s.filter.clone())
                .collect();
            self.state
                .delete_session(&session.client_id, &filters)
                .await?;
            self.log
                .remove_cursors(&cursor_name(&session.client_id))
                .await?;
            self.log
                .remove_cursors(&sent_cursor_name(&session.client_id))
                .await?;
        }
        let filters: Vec<String> = session
            .subscriptions
            .iter()
            .map(|s| s.filter.clone())
            .collect();
        self.shared
            .release_all(&filters, &session.client_id)
            .await?;
        session.clear();
        Ok(())
    }

    fn lock_sessions(&self) -> MutexGuard<'_, HashMap<String, Arc<SessionEntry>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a session of `expiry` seconds, without a connection since `since`, has expired.
fn expiry_passed(expiry: u32, since: Instant) -> bool {
    expiry != NEVER_EXPIRES && since.elapsed() >= Duration::from_secs(u64::from(expiry))
}

/// The cursor-store name of a session's read positions.
pub fn cursor_name(client_id: &str) -> String {
    format!("mqtt:{client_id}")
}

/// The cursor-store name of a session's "sent up to" leases (see `connection/lease.rs`).
pub fn sent_cursor_name(client_id: &str) -> String {
    format!("mqtt-sent:{client_id}")
}

fn boot_stamp() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64 & 0xffff_ffff_ffff)
        .unwrap_or(0)
}
