//! Shutdown signalling: one `Shutdown` handle is cloned into every task. The first SIGINT or
//! SIGTERM asks all tasks to finish their in-flight work; a second signal exits at once.

use tokio::sync::watch;

/// Exit code used when a second signal cuts the graceful shutdown short (128 + SIGINT).
pub const FORCED_EXIT_CODE: i32 = 130;

/// A cloneable view of the shutdown state.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// The side that triggers shutdown.
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// A new, untriggered shutdown pair.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    /// Asks every task holding a [`Shutdown`] to stop.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }
}

impl Shutdown {
    /// Whether shutdown has been asked for.
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once shutdown has been asked for (at once if it already was).
    pub async fn wait(&mut self) {
        // An error means the trigger is gone, which only happens when the process is ending.
        let _ = self.rx.wait_for(|stopped| *stopped).await;
    }
}

/// SIGINT and SIGTERM handlers, installed before anything reports readiness so that a signal
/// sent right after the ready line is never lost to the default (killing) disposition.
#[derive(Debug)]
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers; must run inside the tokio runtime.
    pub fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }

    /// Triggers `trigger` on the first signal and exits the process on the second.
    pub async fn watch(mut self, trigger: ShutdownTrigger) {
        self.next().await;
        tracing::info!(
            "shutdown requested; finishing in-flight work (a second signal exits at once)"
        );
        trigger.trigger();
        self.next().await;
        tracing::warn!("second signal: exiting without finishing in-flight work");
        std::process::exit(FORCED_EXIT_CODE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_when_triggered() {
        let (trigger, shutdown) = channel();
        let mut waiter = shutdown.clone();
        assert!(!shutdown.is_triggered());
        let task = tokio::spawn(async move { waiter.wait().await });
        trigger.trigger();
        task.await.expect("waiter finishes");
        assert!(shutdown.is_triggered());
    }
}
