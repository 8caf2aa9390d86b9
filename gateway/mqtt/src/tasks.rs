//! The broker's tasks that outlive the connection that started them: delayed wills
//! (`will.rs`), `$share` dispatchers (`shared/`) and the watchers of commands' expiries
//! (`unclaimed.rs`). Each is spawned here and owned here until
//! it ends, so the broker's shutdown can wait for every one of them (or abort and await them)
//! before the log closes. Nothing here ever detaches a task; once closed, it refuses new ones.

use std::future::Future;

use tern_core::shutdown::{self, Shutdown, ShutdownTrigger};
use tokio::sync::Mutex;
use tokio::task::JoinSet;

/// A set of owned tasks that can be closed, joined and aborted.
#[derive(Debug, Default)]
pub(crate) struct Tasks {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    set: JoinSet<()>,
    closed: bool,
}

/// The task was not started: the set is closed (the broker is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the broker is shutting down")]
pub(crate) struct Closed;

impl Tasks {
    /// Starts `task` as one of the set's, unless the set was closed.
    pub(crate) async fn spawn<F>(&self, task: F) -> Result<(), Closed>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut inner = self.inner.lock().await;
        while let Some(ended) = inner.set.try_join_next() {
            report(ended);
        }
        if inner.closed {
            return Err(Closed);
        }
        inner.set.spawn(task);
        Ok(())
    }

    /// Refuses new tasks and waits for every running one to end. Cancel-safe: dropped before
    /// the end, it leaves the tasks still running owned here (for [`Tasks::abort`]).
    pub(crate) async fn close(&self) {
        let mut inner = self.inner.lock().await;
        inner.closed = true;
        while let Some(ended) = inner.set.join_next().await {
            report(ended);
        }
    }

    /// Refuses new tasks, cancels the running ones and waits until each has stopped.
    pub(crate) async fn abort(&self) {
        let mut inner = self.inner.lock().await;
        inner.closed = true;
        inner.set.abort_all();
        while inner.set.join_next().await.is_some() {}
    }
}

fn report(ended: Result<(), tokio::task::JoinError>) {
    if let Err(err) = ended {
        if err.is_panic() {
            tracing::error!(%err, "an MQTT background task panicked");
        }
    }
}

/// The wills waiting for their delay, each in a task of its own.
#[derive(Debug)]
pub(crate) struct Wills {
    pub(super) tasks: Tasks,
    /// Triggered at shutdown: every delay still running ends at once.
    due_now: ShutdownTrigger,
    pub(super) due: Shutdown,
}

impl Default for Wills {
    fn default() -> Self {
        let (due_now, due) = shutdown::channel();
        Self {
            tasks: Tasks::default(),
            due_now,
            due,
        }
    }
}

impl Wills {
    /// Publishes every waiting will now (unless its client reconnected) and waits until each
    /// is stored or refused; a will scheduled later is dropped with a warning.
    pub(crate) async fn close(&self) {
        self.due_now.trigger();
        self.tasks.close().await;
    }

    /// Cancels the wills still being published (shutdown past its grace) and waits for them.
    pub(crate) async fn abort(&self) {
        self.tasks.abort().await;
    }
}

/// The watchers of the command log topics' expiries (`unclaimed.rs`), one task per partition.
#[derive(Debug)]
pub(crate) struct Watchers {
    pub(crate) tasks: Tasks,
    stopping: ShutdownTrigger,
    pub(crate) stop: Shutdown,
}

impl Default for Watchers {
    fn default() -> Self {
        let (stopping, stop) = shutdown::channel();
        Self {
            tasks: Tasks::default(),
            stopping,
            stop,
        }
    }
}

impl Watchers {
    /// Stops every watcher and waits until each has ended.
    pub(crate) async fn close(&self) {
        self.stopping.trigger();
        self.tasks.close().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn close_waits_for_running_tasks_and_refuses_new_ones() {
        let tasks = Tasks::default();
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let work = async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            flag.store(true, Ordering::SeqCst);
        };
        assert_eq!(tasks.spawn(work).await, Ok(()));
        tasks.close().await;
        assert!(
            done.load(Ordering::SeqCst),
            "close returned before the task ended"
        );
        assert_eq!(tasks.spawn(async {}).await, Err(Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn abort_stops_running_tasks_before_it_returns() {
        let tasks = Tasks::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let work = async move {
            // Held until the task is dropped: the receiver then sees the sender gone.
            let _tx = tx;
            std::future::pending::<()>().await;
        };
        assert_eq!(tasks.spawn(work).await, Ok(()));
        tasks.abort().await;
        assert!(rx.await.is_err(), "the aborted task's state was dropped");
        assert_eq!(tasks.spawn(async {}).await, Err(Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_close_leaves_the_tasks_owned() {
        let tasks = Tasks::default();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let work = async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        };
        assert_eq!(tasks.spawn(work).await, Ok(()));
        let cut = tokio::time::timeout(Duration::from_secs(1), tasks.close()).await;
        assert!(cut.is_err(), "close waits for a task that never ends");
        assert!(
            rx.try_recv()
                .is_err_and(|e| e == tokio::sync::oneshot::error::TryRecvError::Empty)
        );
        tasks.abort().await;
        assert!(
            rx.await.is_err(),
            "abort reached the task close left behind"
        );
    }
}
