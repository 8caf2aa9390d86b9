//! What both forwarding modes share for one edge partition: its status in the [`StatusMap`]
//! (shared with the metrics endpoint), the retry loop that runs its sessions with a doubling
//! backoff ([`run_sessions`]), and the resume rule that clamps a resume offset to the edge log
//! and moves the forwarder's cursor there ([`resume_within`]). It never talks to Kafka and never
//! appends to the edge log; the modes (`mirror.rs`, `shared/`) own their sessions.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tern_core::shutdown::Shutdown;
use tern_log::{LogError, LogPort};

use crate::bandwidth::Class;
use crate::config::UpstreamConfig;
use crate::error::UpstreamError;
use crate::provenance::Provenance;

/// The wait between attempts while Kafka cannot be reached at all: every partition's session
/// tries again after it, and the cluster handle (`kafka/`) lets at most one connect per
/// interval out for the whole upstream, so probing a link that is down stays cheap and a
/// session resumes within about this long of the link's return.
pub const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// Per-partition progress, shared with the metrics endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionStatus {
    /// Next edge offset to forward (everything before it is upstream).
    pub next: u64,
    pub forwarded_records: u64,
    pub forwarded_bytes: u64,
    /// Batches committed upstream (in shared mode, one Kafka transaction each).
    pub batches: u64,
    pub connected: bool,
    pub last_error: Option<String>,
    /// The downstream only: the command partition's end (last stable offset) at the last
    /// Fetch, and how many commands addressed to this gateway were refused.
    pub upstream_end: Option<u64>,
    pub refused: u64,
    /// The edge topic's priority class in the share of the `bandwidth` cap.
    pub class: Class,
    /// Live first (`live.rs`): whether the partition drains a backlog older than `live_after`
    /// (its new records are copied live), and how many records were copied since start.
    pub draining: bool,
    pub live_records: u64,
    pub live_bytes: u64,
    /// Forwarding rate: records per second over the last full window of at least
    /// [`RATE_WINDOW_MS`], and the window being counted (start, ms since the epoch; records).
    pub rate: u64,
    pub window_start_ms: i64,
    pub window_records: u64,
}

/// The shortest window a forwarding rate is measured over.
pub const RATE_WINDOW_MS: i64 = 5_000;

impl PartitionStatus {
    /// Records per second forwarded lately: the last window's rate, or less when the window
    /// being counted has run for two windows (forwarding slowed down or stopped).
    pub fn rate_at(&self, now_ms: i64) -> u64 {
        let elapsed = now_ms - self.window_start_ms;
        if self.window_start_ms > 0 && elapsed >= 2 * RATE_WINDOW_MS {
            let elapsed = u64::try_from(elapsed).unwrap_or(u64::MAX);
            return self
                .rate
                .min(self.window_records.saturating_mul(1000) / elapsed);
        }
        self.rate
    }
}

/// Status of every forwarded partition, keyed by (edge topic, partition).
pub type StatusMap = Arc<Mutex<BTreeMap<(String, u32), PartitionStatus>>>;

/// Changes the status of `source`'s partition.
pub fn update(status: &StatusMap, source: &Provenance, change: impl FnOnce(&mut PartitionStatus)) {
    let mut map = status.lock().unwrap_or_else(|e| e.into_inner());
    change(
        map.entry((source.topic.clone(), source.partition))
            .or_default(),
    );
}

/// A session is connected and resumes at `next`.
pub fn connected(status: &StatusMap, source: &Provenance, next: u64) {
    update(status, source, |s| {
        s.connected = true;
        s.next = next;
    });
}

/// A forwarder's session is connected and resumes at `next`, its edge topic in `class`.
pub fn forwarding(status: &StatusMap, source: &Provenance, next: u64, class: Class) {
    update(status, source, |s| {
        s.connected = true;
        s.next = next;
        s.class = class;
    });
}

/// `records` records of `bytes` bytes are upstream, and everything before `next`.
pub fn forwarded(status: &StatusMap, source: &Provenance, next: u64, records: usize, bytes: usize) {
    update(status, source, |s| {
        s.next = next;
        s.forwarded_records += records as u64;
        s.forwarded_bytes += bytes as u64;
        s.batches += 1;
        s.last_error = None;
        let now = tern_core::time::now_ms();
        if s.window_start_ms == 0 {
            s.window_start_ms = now;
        }
        s.window_records += records as u64;
        let elapsed = now - s.window_start_ms;
        if elapsed >= RATE_WINDOW_MS {
            let elapsed = u64::try_from(elapsed).unwrap_or(u64::MAX);
            s.rate = s.window_records.saturating_mul(1000) / elapsed;
            (s.window_start_ms, s.window_records) = (now, 0);
        }
    });
}

/// An edge log failure during `op`.
pub fn edge_error(op: &'static str, source: LogError) -> UpstreamError {
    UpstreamError::Edge { op, source }
}

/// Where a session resumes, given the offset the follower or the group says is next: an error
/// past the edge log's end, the log start (with a warning) if retention passed it, and the
/// forwarder's cursor (`cursor_name`, now at `cursor`) moved there. Both modes resume through it.
pub async fn resume_within<L: LogPort>(
    log: &L,
    cursor_name: &str,
    source: &Provenance,
    (start, end): (u64, u64),
    cursor: Option<u64>,
    resume: u64,
) -> Result<u64, UpstreamError> {
    let (topic, partition) = (&source.topic, source.partition);
    if resume > end {
        return Err(UpstreamError::AheadOfEdge {
            topic: topic.clone(),
            partition,
            upstream_next: resume,
            edge_end: end,
        });
    }
    let next = if resume < start {
        tracing::warn!(%topic, partition, lost = start - resume, "records left the edge log before they were forwarded");
        start
    } else {
        resume
    };
    if cursor != Some(next) {
        log.commit_cursor(cursor_name, topic, partition, next)
            .await
            .map_err(|e| edge_error("commit cursor", e))?;
    }
    Ok(next)
}

/// Runs `session` again and again until shutdown, or until one ends without an error (the edge
/// log closed). After a failure it records the error in `status` and logs it with
/// `interrupted`, then waits: [`PROBE_INTERVAL`] (at least `backoff_min`) when Kafka could not be
/// reached at all ([`UpstreamError::is_unreachable`]: probing a link that is down is one TCP
/// connect per interval for the whole upstream, so it stays frequent and the session resumes
/// soon after the link returns; it does not grow the backoff), else a backoff that doubles from
/// `backoff_min` to `backoff_max` over consecutive refusals by a broker and starts again from
/// `backoff_min` once a session got connected (its catch-up answered). Both modes'
/// partition tasks run their sessions through it.
pub async fn run_sessions<F, Fut>(
    config: &UpstreamConfig,
    source: &Provenance,
    status: &StatusMap,
    shutdown: &mut Shutdown,
    interrupted: &'static str,
    mut session: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), UpstreamError>>,
{
    let key = (source.topic.clone(), source.partition);
    let connected = || {
        let map = status.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&key).is_some_and(|s| s.connected)
    };
    let probe = PROBE_INTERVAL.max(config.backoff_min.0);
    let mut backoff = config.backoff_min.0;
    loop {
        let ended = tokio::select! {
            () = shutdown.wait() => return,
            result = session() => result,
        };
        let Err(err) = ended else { return };
        if connected() {
            backoff = config.backoff_min.0;
        }
        let wait = if err.is_unreachable() { probe } else { backoff };
        tracing::warn!(topic = %source.topic, partition = source.partition, %err, ?wait, "{interrupted}");
        update(status, source, |s| {
            s.connected = false;
            s.last_error = Some(err.to_string());
        });
        tokio::select! {
            () = shutdown.wait() => return,
            () = tokio::time::sleep(wait) => {}
        }
        if !err.is_unreachable() {
            backoff = (backoff * 2).min(config.backoff_max.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tern_core::HumanDuration;
    use tern_core::shutdown;
    use tern_log::MemoryLog;
    use tokio::time::Instant;

    use super::*;

    fn source() -> Provenance {
        Provenance {
            gateway: "gw".into(),
            topic: "sensors".into(),
            partition: 0,
        }
    }

    fn failure() -> UpstreamError {
        UpstreamError::Kafka {
            op: "produce",
            topic: "up".into(),
            message: "refused".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_doubles_up_to_its_cap_and_resets_once_a_session_connected() {
        let config = UpstreamConfig {
            backoff_min: HumanDuration(Duration::from_millis(100)),
            backoff_max: HumanDuration(Duration::from_millis(400)),
            ..UpstreamConfig::default()
        };
        let (_trigger, mut shutdown) = shutdown::channel();
        let status = StatusMap::default();
        let starts = Mutex::new(Vec::new());
        let session = || {
            let mut starts = starts.lock().unwrap_or_else(|e| e.into_inner());
            starts.push(Instant::now());
            let call = starts.len();
            if call == 5 {
                connected(&status, &source(), 1);
            }
            async move { if call == 7 { Ok(()) } else { Err(failure()) } }
        };
        run_sessions(&config, &source(), &status, &mut shutdown, "test", session).await;
        let starts = starts.into_inner().unwrap_or_else(|e| e.into_inner());
        let gaps: Vec<u128> = starts
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(gaps, [100, 200, 400, 400, 100, 200]);
        let map = status.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map
            .get(&("sensors".to_owned(), 0))
            .cloned()
            .unwrap_or_default();
        assert!(!entry.connected);
        assert_eq!(entry.last_error, Some(failure().to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_cluster_is_probed_at_a_bounded_interval_without_growing_the_backoff() {
        let config = UpstreamConfig {
            backoff_min: HumanDuration(Duration::from_millis(100)),
            backoff_max: HumanDuration(Duration::from_secs(30)),
            ..UpstreamConfig::default()
        };
        let (_trigger, mut shutdown) = shutdown::channel();
        let status = StatusMap::default();
        let starts = Mutex::new(Vec::new());
        let unreachable = || UpstreamError::Unreachable {
            op: "produce",
            topic: "up".into(),
            message: "connection refused".into(),
        };
        // Two refusals by a broker, twenty attempts while the link is down, one refusal, done.
        let session = || {
            let mut starts = starts.lock().unwrap_or_else(|e| e.into_inner());
            starts.push(Instant::now());
            let call = starts.len();
            let result = match call {
                1 | 2 | 23 => Err(failure()),
                24 => Ok(()),
                _ => Err(unreachable()),
            };
            async move { result }
        };
        run_sessions(&config, &source(), &status, &mut shutdown, "test", session).await;
        let starts = starts.into_inner().unwrap_or_else(|e| e.into_inner());
        let gaps: Vec<u128> = starts
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        let probe = PROBE_INTERVAL.as_millis();
        let mut expected = vec![100, 200];
        expected.extend([probe; 20]);
        // The refusal after the outage waits where the backoff was, not 20 doublings later.
        expected.push(400);
        assert_eq!(gaps, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_the_backoff_wait() {
        let config = UpstreamConfig {
            backoff_min: HumanDuration(Duration::from_secs(60)),
            ..UpstreamConfig::default()
        };
        let (trigger, mut shutdown) = shutdown::channel();
        let status = StatusMap::default();
        let started = Instant::now();
        let session = || {
            trigger.trigger();
            async { Err(failure()) }
        };
        run_sessions(&config, &source(), &status, &mut shutdown, "test", session).await;
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn resuming_clamps_to_the_edge_log_and_moves_the_cursor() -> Result<(), UpstreamError> {
        let log = MemoryLog::new(1);
        log.ensure_topic("sensors")
            .map_err(|e| edge_error("topic", e))?;
        let source = source();
        // Retention passed the follower's end: resume at the log start.
        assert_eq!(
            resume_within(&log, "c", &source, (5, 10), None, 3).await?,
            5
        );
        assert_eq!(log.cursor("c", "sensors", 0), Some(5));
        assert_eq!(
            resume_within(&log, "c", &source, (5, 10), Some(5), 8).await?,
            8
        );
        assert_eq!(log.cursor("c", "sensors", 0), Some(8));
        assert_eq!(
            resume_within(&log, "c", &source, (5, 10), Some(8), 10).await?,
            10
        );
        let ahead = resume_within(&log, "c", &source, (5, 10), Some(10), 11).await;
        assert!(
            matches!(
                ahead,
                Err(UpstreamError::AheadOfEdge {
                    upstream_next: 11,
                    edge_end: 10,
                    ..
                })
            ),
            "{ahead:?}"
        );
        assert_eq!(log.cursor("c", "sensors", 0), Some(10));
        Ok(())
    }
}
