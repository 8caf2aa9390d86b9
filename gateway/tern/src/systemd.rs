//! systemd's notification protocol (`Type=notify`, sd_notify(3)): `READY=1` once the log is open
//! and the listeners are bound, `STATUS=` with a short state, `STOPPING=1` when a graceful
//! shutdown starts, and `WATCHDOG=1` every half `WatchdogSec=` while tern is alive.
//!
//! Alive is what `/livez` answers (the health checker ran recently) plus the listener tasks still
//! running and no partition writer stopped. Not being ready (a full disk, an upstream down, the
//! clock) does not withhold keep-alives: a restart cures none of those. Without `NOTIFY_SOCKET`
//! every call here does nothing.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::health::Readiness;
use tern_core::shutdown::Shutdown;

/// Whether a service manager listens (`NOTIFY_SOCKET` is set).
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(err) = sd_notify::notify(states) {
        tracing::warn!(%err, "cannot notify systemd (NOTIFY_SOCKET)");
    }
}

/// Startup finished: the log is open and the listeners accept.
pub fn ready() {
    send(&[NotifyState::Ready, NotifyState::Status("ready")]);
}

/// A graceful shutdown started.
pub fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: finishing in-flight work"),
    ]);
}

/// Whether tern is alive: the checker is fresh, every listener task runs, no writer stopped.
pub fn alive(readiness: &Readiness, tasks: &[AbortHandle]) -> bool {
    readiness.is_fresh()
        && tasks.iter().all(|task| !task.is_finished())
        && !readiness
            .reasons
            .iter()
            .any(|r| r.reason == "writer_stopped")
}

/// The short `STATUS=` text for a readiness state.
fn status_text(readiness: &Readiness) -> String {
    if readiness.is_ready() {
        return "ready".to_owned();
    }
    let mut kinds: Vec<&str> = readiness.reasons.iter().map(|r| r.reason).collect();
    kinds.sort_unstable();
    kinds.dedup();
    format!("not ready: {}", kinds.join(", "))
}

/// Follows readiness into `STATUS=` and, when systemd set a watchdog for this process, sends
/// keep-alives. Returns at once without `NOTIFY_SOCKET`.
pub async fn run(
    readiness: watch::Receiver<Readiness>,
    tasks: Vec<AbortHandle>,
    shutdown: Shutdown,
) {
    if !enabled() {
        return;
    }
    let watchdog = sd_notify::watchdog_enabled();
    if let Some(timeout) = watchdog {
        tracing::info!(?timeout, "systemd watchdog enabled");
    }
    supervise(readiness, tasks, watchdog, shutdown, send).await;
}

/// [`run`]'s loop, with the sender passed in (the tests count what it sends).
async fn supervise(
    mut readiness: watch::Receiver<Readiness>,
    tasks: Vec<AbortHandle>,
    watchdog: Option<Duration>,
    mut shutdown: Shutdown,
    mut notify: impl FnMut(&[NotifyState<'_>]),
) {
    // Without a watchdog the tick arm is disabled; with one, it fires every half interval, as
    // sd_watchdog_enabled(3) advises.
    let period = watchdog.map_or(Duration::from_secs(3600), |t| {
        (t / 2).max(Duration::from_millis(1))
    });
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut status = String::from("ready");
    let mut was_alive = true;
    loop {
        tokio::select! {
            _ = tick.tick(), if watchdog.is_some() => {
                let is_alive = alive(&readiness.borrow(), &tasks);
                if is_alive {
                    notify(&[NotifyState::Watchdog]);
                    if !was_alive {
                        tracing::info!("alive again: systemd watchdog keep-alives resume");
                    }
                } else if was_alive {
                    tracing::error!("not alive (health checker stale, a listener ended or a writer stopped): withholding systemd watchdog keep-alives");
                }
                was_alive = is_alive;
            }
            changed = readiness.changed() => {
                if changed.is_err() {
                    return;
                }
                let text = status_text(&readiness.borrow_and_update());
                if text != status {
                    notify(&[NotifyState::Status(&text)]);
                    status = text;
                }
            }
            () = shutdown.wait() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Reason;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    fn state(reasons: &[&'static str]) -> Readiness {
        Readiness {
            reasons: reasons
                .iter()
                .map(|&reason| Reason {
                    reason,
                    message: String::new(),
                    topic: None,
                    partition: None,
                    cursor: None,
                })
                .collect(),
            checked_at: Instant::now(),
            interval: Duration::from_secs(1),
        }
    }

    /// What the supervisor sent, one string per datagram.
    type Sent = Arc<Mutex<Vec<String>>>;

    fn start(
        readiness: watch::Receiver<Readiness>,
        tasks: Vec<AbortHandle>,
    ) -> (Sent, tern_core::shutdown::ShutdownTrigger) {
        let sent = Sent::default();
        let record = Arc::clone(&sent);
        let (trigger, shutdown) = tern_core::shutdown::channel();
        let watchdog = Some(Duration::from_secs(10));
        tokio::spawn(supervise(
            readiness,
            tasks,
            watchdog,
            shutdown,
            move |states| {
                let text: Vec<String> = states.iter().map(ToString::to_string).collect();
                record.lock().expect("lock").push(text.join("\n"));
            },
        ));
        (sent, trigger)
    }

    fn keep_alives(sent: &Sent) -> usize {
        sent.lock()
            .expect("lock")
            .iter()
            .filter(|s| *s == "WATCHDOG=1")
            .count()
    }

    /// Advances the paused clock by `secs` one second at a time, the checker refreshing the
    /// state each second when `checker` is set.
    async fn run_for(secs: u64, tx: &watch::Sender<Readiness>, checker: Option<&[&'static str]>) {
        for _ in 0..secs {
            tokio::time::advance(Duration::from_secs(1)).await;
            if let Some(reasons) = checker {
                tx.send_replace(state(reasons));
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alives_stop_when_the_checker_goes_stale_not_when_the_disk_is_full() {
        let (tx, rx) = watch::channel(state(&[]));
        let (sent, _trigger) = start(rx, Vec::new());
        run_for(30, &tx, Some(&[])).await;
        let healthy = keep_alives(&sent);
        assert!(healthy >= 5, "every 5 s for 30 s: {healthy}");

        // A full disk: not ready, still alive, keep-alives go on; STATUS says why.
        run_for(30, &tx, Some(&["disk_nearly_full"])).await;
        let full = keep_alives(&sent);
        assert!(full >= healthy + 5, "{healthy} then {full}");
        assert!(
            sent.lock()
                .expect("lock")
                .iter()
                .any(|s| s == "STATUS=not ready: disk_nearly_full"),
            "{sent:?}"
        );

        // The checker stops (a wedged runtime): keep-alives stop once the state is stale.
        run_for(30, &tx, None).await;
        let wedged = keep_alives(&sent);
        assert!(wedged <= full + 1, "{full} then {wedged}");

        // A stopped writer is not alive either.
        run_for(30, &tx, Some(&["writer_stopped"])).await;
        assert_eq!(keep_alives(&sent), wedged);
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alives_stop_when_a_listener_task_ends() {
        let listener = tokio::spawn(std::future::pending::<()>());
        let (tx, rx) = watch::channel(state(&[]));
        let (sent, _trigger) = start(rx, vec![listener.abort_handle()]);
        run_for(20, &tx, Some(&[])).await;
        let before = keep_alives(&sent);
        assert!(before >= 3, "{before}");
        listener.abort();
        let _ = listener.await;
        run_for(30, &tx, Some(&[])).await;
        assert_eq!(keep_alives(&sent), before);
    }
}
