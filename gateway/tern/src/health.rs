//! Liveness and readiness: a checker task that, every `[health] interval`, asks each reason
//! source whether tern can store a publish now, and publishes the answer as a [`Readiness`] on a
//! watch channel. `/readyz` and `/livez` read it, and so can a systemd watchdog (it should
//! notify only while the state is fresh: [`Readiness::is_fresh`]).
//!
//! Sources: partitions refusing appends (full, naming the cursor that holds them, or a stopped
//! writer), the data file system (nearly full or read-only, by `statvfs`), the wall clock (before
//! the configured floor, by default this binary's build time) and upstreams failing for longer
//! than `[health] upstream_failed_after`. Checking never writes and never blocks the data path.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use tern_core::shutdown::Shutdown;
use tern_core::{ByteSize, HumanDuration, InvalidConfig, invalid};
use tern_log::{Log, Refusal};

/// `[health]`: when tern reports itself not ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// How often the checks run.
    pub interval: HumanDuration,
    /// Not ready when the data file system has less free space than this.
    pub min_free_bytes: ByteSize,
    /// Not ready when the data file system has less than this share free (0–100).
    pub min_free_percent: u8,
    /// Not ready when an upstream has been disconnected or failing for this long.
    pub upstream_failed_after: HumanDuration,
    /// Not ready while the wall clock is before this RFC 3339 time (a Pi without a real-time
    /// clock boots in 1970 until NTP answers). Default: this binary's build time.
    pub clock_not_before: Option<String>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval: HumanDuration(Duration::from_secs(1)),
            min_free_bytes: ByteSize(64 << 20),
            min_free_percent: 2,
            upstream_failed_after: HumanDuration(Duration::from_secs(300)),
            clock_not_before: None,
        }
    }
}

impl HealthConfig {
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.interval.0.is_zero() {
            return Err(invalid("health.interval", "must be longer than zero"));
        }
        if self.min_free_percent > 100 {
            return Err(invalid("health.min_free_percent", "must be 0 to 100"));
        }
        self.clock_floor_ms().map(|_| ())
    }

    /// The clock floor in ms since the epoch.
    fn clock_floor_ms(&self) -> Result<i64, InvalidConfig> {
        match &self.clock_not_before {
            None => Ok(build_time_ms()),
            Some(text) => match tern_log::tools::From::parse(text) {
                Ok(tern_log::tools::From::Time(ms)) => Ok(ms),
                _ => Err(invalid(
                    "health.clock_not_before",
                    format!("`{text}` is not an RFC 3339 time"),
                )),
            },
        }
    }
}

/// When this binary was built (ms since the epoch), from `build.rs`.
fn build_time_ms() -> i64 {
    env!("TERN_BUILD_UNIX_SECONDS")
        .parse::<i64>()
        .map_or(0, |s| s.saturating_mul(1000))
}

/// One reason tern is not ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// `partition_full`, `writer_stopped`, `disk_nearly_full`, `disk_read_only`,
    /// `disk_unknown`, `clock_unsynchronised` or `upstream_failed`.
    pub reason: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// The cursor holding a full partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

impl Reason {
    fn new(reason: &'static str, message: String) -> Self {
        Self {
            reason,
            message,
            topic: None,
            partition: None,
            cursor: None,
        }
    }
}

/// The latest answer of the checks.
#[derive(Debug, Clone)]
pub struct Readiness {
    pub reasons: Vec<Reason>,
    /// When the checker last finished a round (liveness: a wedged runtime stops updating it).
    pub checked_at: Instant,
    /// The checker's interval.
    pub interval: Duration,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.reasons.is_empty()
    }

    /// Whether the checker ran recently (within three intervals plus a second).
    pub fn is_fresh(&self) -> bool {
        self.age() <= self.interval * 3 + Duration::from_secs(1)
    }

    pub fn age(&self) -> Duration {
        Instant::now().saturating_duration_since(self.checked_at)
    }
}

/// A source of reasons. The clock source is one of these so a better one (the log's own clock
/// status) can replace it without touching the others.
pub trait Check: Send + Sync {
    fn check(&self, out: &mut Vec<Reason>);
}

/// Partitions that refuse appends.
pub struct PartitionCheck(pub Log);

impl Check for PartitionCheck {
    fn check(&self, out: &mut Vec<Reason>) {
        for state in self.0.partition_states() {
            let Some(refusal) = state.refusing else {
                continue;
            };
            let (reason, message, cursor) = match refusal {
                Refusal::Full { holder } => {
                    let message = match &holder {
                        Some(cursor) => format!(
                            "partition {}/{} is full and refuses appends; cursor `{cursor}` holds its oldest segment",
                            state.topic, state.partition
                        ),
                        None => format!(
                            "partition {}/{} is full and refuses appends",
                            state.topic, state.partition
                        ),
                    };
                    ("partition_full", message, holder)
                }
                Refusal::WriterStopped { reason } => (
                    "writer_stopped",
                    format!(
                        "partition {}/{} refuses appends: {reason}",
                        state.topic, state.partition
                    ),
                    None,
                ),
                _ => continue,
            };
            out.push(Reason {
                topic: Some(state.topic),
                partition: Some(state.partition),
                cursor,
                ..Reason::new(reason, message)
            });
        }
    }
}

/// The data file system: free space and whether it is mounted read-only.
pub struct DiskCheck {
    pub dir: PathBuf,
    pub min_free_bytes: u64,
    pub min_free_percent: u8,
}

impl Check for DiskCheck {
    fn check(&self, out: &mut Vec<Reason>) {
        let dir = self.dir.display();
        let space = match tern_core::sys::statvfs(&self.dir) {
            Ok(space) => space,
            Err(err) => {
                let message = format!("cannot read the space of the data directory {dir}: {err}");
                out.push(Reason::new("disk_unknown", message));
                return;
            }
        };
        if space.read_only {
            let message = format!("the file system of {dir} is mounted read-only");
            out.push(Reason::new("disk_read_only", message));
        }
        let percent_floor = space.total / 100 * u64::from(self.min_free_percent);
        if space.available < self.min_free_bytes || space.available < percent_floor {
            let message = format!(
                "the file system of {dir} is nearly full: {} free of {} (need {} and {}%)",
                space.available, space.total, self.min_free_bytes, self.min_free_percent
            );
            out.push(Reason::new("disk_nearly_full", message));
        }
    }
}

/// The wall clock against a floor (the build time unless configured).
pub struct ClockCheck {
    pub not_before_ms: i64,
    /// The log's own clock status (tern-log compares the wall clock with its build time and
    /// counts steps), when a log is open.
    pub log: Option<Log>,
}

impl Check for ClockCheck {
    fn check(&self, out: &mut Vec<Reason>) {
        let now = tern_core::time::now_ms();
        let log_says = self
            .log
            .as_ref()
            .is_some_and(|log| log.clock_status().unsynchronised);
        if now < self.not_before_ms || log_says {
            let message = format!(
                "the wall clock ({now} ms since the epoch) is before {} (health.clock_not_before or the build time): not synchronised; record timestamps would be wrong",
                self.not_before_ms
            );
            out.push(Reason::new("clock_unsynchronised", message));
        }
    }
}

/// Upstreams disconnected or failing for longer than `after`.
pub struct UpstreamCheck {
    pub status: tern_upstream::StatusMap,
    pub after: Duration,
    /// Since when the upstream has been failing, if it is.
    failing_since: Mutex<Option<Instant>>,
}

impl UpstreamCheck {
    pub fn new(status: tern_upstream::StatusMap, after: Duration) -> Self {
        Self {
            status,
            after,
            failing_since: Mutex::new(Some(Instant::now())),
        }
    }
}

impl Check for UpstreamCheck {
    fn check(&self, out: &mut Vec<Reason>) {
        let problem = {
            let status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
            if status.is_empty() {
                Some("not connected yet".to_owned())
            } else {
                status
                    .iter()
                    .find(|(_, s)| !s.connected)
                    .map(|((topic, p), s)| {
                        let error = s.last_error.as_deref().unwrap_or("disconnected");
                        format!("{topic}/{p}: {error}")
                    })
            }
        };
        let mut since = self
            .failing_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(problem) = problem else {
            *since = None;
            return;
        };
        let started = *since.get_or_insert_with(Instant::now);
        let failing = Instant::now().saturating_duration_since(started);
        if failing >= self.after {
            let message = format!(
                "upstream failing for {}s (health.upstream_failed_after = {}s): {problem}",
                failing.as_secs(),
                self.after.as_secs()
            );
            out.push(Reason::new("upstream_failed", message));
        }
    }
}

/// `tern_ready` and `tern_not_ready_reasons{reason=…}` for `/metrics`.
pub struct ReadinessMetrics(pub watch::Receiver<Readiness>);

impl tern_core::metrics::MetricsSource for ReadinessMetrics {
    fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let readiness = self.0.borrow().clone();
        tern_core::metrics::write_single(
            out,
            "tern_ready",
            "gauge",
            "1 when /readyz answers 200, else 0.",
            u8::from(readiness.is_ready()),
        );
        let _ = writeln!(
            out,
            "# HELP tern_not_ready_reasons Reasons /readyz reports, by kind."
        );
        let _ = writeln!(out, "# TYPE tern_not_ready_reasons gauge");
        let mut kinds: Vec<&str> = readiness.reasons.iter().map(|r| r.reason).collect();
        kinds.sort_unstable();
        for kind in [
            "clock_unsynchronised",
            "disk_nearly_full",
            "disk_read_only",
            "partition_full",
            "upstream_failed",
            "writer_stopped",
        ] {
            let n = kinds.iter().filter(|k| **k == kind).count();
            let _ = writeln!(out, "tern_not_ready_reasons{{reason=\"{kind}\"}} {n}");
        }
    }
}

/// The checks and the watch they publish on.
pub struct Health {
    checks: Vec<Box<dyn Check>>,
    interval: Duration,
    state: watch::Sender<Readiness>,
}

impl Health {
    pub fn new(config: &HealthConfig, checks: Vec<Box<dyn Check>>) -> Self {
        let interval = config.interval.0;
        let (state, _) = watch::channel(Readiness {
            reasons: vec![Reason::new(
                "starting",
                "the first check has not run".into(),
            )],
            checked_at: Instant::now(),
            interval,
        });
        Self {
            checks,
            interval,
            state,
        }
    }

    /// The standard checks for a gateway on `data_dir`; the upstream check when
    /// `has_upstream`.
    pub fn standard(
        health: &HealthConfig,
        data_dir: &Path,
        has_upstream: bool,
        log: &Log,
        status: &tern_upstream::StatusMap,
    ) -> Self {
        let mut checks: Vec<Box<dyn Check>> = vec![
            Box::new(PartitionCheck(log.clone())),
            Box::new(DiskCheck {
                dir: data_dir.to_owned(),
                min_free_bytes: health.min_free_bytes.0,
                min_free_percent: health.min_free_percent,
            }),
            Box::new(ClockCheck {
                log: Some(log.clone()),
                not_before_ms: health.clock_floor_ms().unwrap_or_else(|_| build_time_ms()),
            }),
        ];
        if has_upstream {
            let after = health.upstream_failed_after.0;
            checks.push(Box::new(UpstreamCheck::new(Arc::clone(status), after)));
        }
        Self::new(health, checks)
    }

    /// Follows the state (admin endpoint, status page, a watchdog).
    pub fn subscribe(&self) -> watch::Receiver<Readiness> {
        self.state.subscribe()
    }

    /// Runs one round of checks now.
    fn round(&self) -> Vec<Reason> {
        let mut reasons = Vec::new();
        for check in &self.checks {
            check.check(&mut reasons);
        }
        reasons
    }

    /// Checks every interval until shutdown, logging each change of readiness.
    pub async fn run(self, mut shutdown: Shutdown) {
        let this = Arc::new(self);
        let mut tick = tokio::time::interval(this.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_ready = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.wait() => return,
            }
            let checker = Arc::clone(&this);
            let Ok(reasons) = tokio::task::spawn_blocking(move || checker.round()).await else {
                continue;
            };
            let ready = reasons.is_empty();
            if was_ready != Some(ready) {
                // Worded so no line reads like the startup line "tern <version> ready".
                if ready {
                    tracing::info!("readiness: every check passes (/readyz 200)");
                } else {
                    let why: Vec<&str> = reasons.iter().map(|r| r.message.as_str()).collect();
                    tracing::warn!(reasons = ?why, "readiness: failing checks (/readyz 503)");
                }
                was_ready = Some(ready);
            }
            this.state.send_replace(Readiness {
                reasons,
                checked_at: Instant::now(),
                interval: this.interval,
            });
        }
    }
}

/// The JSON readiness body (also part of the status page's data).
pub fn readiness_json(readiness: Option<&Readiness>) -> serde_json::Value {
    match readiness {
        Some(r) => serde_json::json!({
            "ready": r.is_ready(),
            "reasons": r.reasons,
            "checked_ms_ago": u64::try_from(r.age().as_millis()).unwrap_or(u64::MAX),
        }),
        None => serde_json::json!({ "ready": true, "reasons": [] }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_floor_defaults_to_the_build_time_and_parses_rfc3339() {
        let config = HealthConfig::default();
        assert!(config.clock_floor_ms().expect("floor") > 1_600_000_000_000);
        let config = HealthConfig {
            clock_not_before: Some("2100-01-01T00:00:00Z".into()),
            ..HealthConfig::default()
        };
        let mut out = Vec::new();
        let floor = config.clock_floor_ms().expect("floor");
        ClockCheck {
            log: None,
            not_before_ms: floor,
        }
        .check(&mut out);
        assert_eq!(out.first().map(|r| r.reason), Some("clock_unsynchronised"));
        let bad = HealthConfig {
            clock_not_before: Some("tomorrow".into()),
            ..HealthConfig::default()
        };
        let err = bad.validate().expect_err("bad time");
        assert!(err.to_string().contains("health.clock_not_before"), "{err}");
    }

    #[test]
    fn a_nearly_full_file_system_is_a_reason() {
        let mut out = Vec::new();
        let check = |min_free_bytes| DiskCheck {
            dir: std::env::temp_dir(),
            min_free_bytes,
            min_free_percent: 0,
        };
        check(0).check(&mut out);
        assert!(out.is_empty(), "{out:?}");
        check(u64::MAX).check(&mut out);
        assert_eq!(out.first().map(|r| r.reason), Some("disk_nearly_full"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_upstream_is_failed_only_after_the_configured_time() {
        let status = tern_upstream::StatusMap::default();
        let check = UpstreamCheck::new(Arc::clone(&status), Duration::from_secs(60));
        let mut out = Vec::new();
        check.check(&mut out);
        assert!(out.is_empty());
        tokio::time::advance(Duration::from_secs(61)).await;
        check.check(&mut out);
        assert_eq!(out.first().map(|r| r.reason), Some("upstream_failed"));
    }
}
