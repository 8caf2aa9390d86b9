//! The task of one shared group: it starts from the offsets its registry resolved and made
//! durable (the group cursor, or where a new group starts: `mod.rs`), wakes on the durable end offset of every partition it reads (no polling), applies
//! the members' commands (join, acknowledge, leave) and hands records out after each; the
//! cursor is committed every second when it moved, when a member leaves and when the group
//! closes. It never awaits a member: deliveries go through `try_send` into channels no larger
//! than the member's window, so a slow member holds back only the records picked for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;

use super::super::clip::clip;
use super::super::config::SharedType;
use super::super::router::PartitionId;
use super::ShareKey;
use super::group::{Delivery, GroupState};
use tern_log::{LogError, LogPort};

/// How often a moved group cursor is made durable.
const COMMIT_EVERY: Duration = Duration::from_secs(1);

/// What members tell their group's dispatcher.
#[derive(Debug)]
pub enum Command {
    Join {
        member: u64,
        client_id: String,
        window: usize,
        tx: mpsc::Sender<Delivery>,
    },
    Ack {
        member: u64,
        partition: PartitionId,
        offset: u64,
    },
    /// The member is gone; `done` fires once its records are requeued and the cursor saved.
    Leave {
        member: u64,
        done: oneshot::Sender<()>,
    },
    /// The group ends; `done` fires after the last commit.
    Close { done: oneshot::Sender<()> },
}

/// Runs the group of `key` of type `kind` from `starts` (partition → first offset to read, the
/// group cursor already committed there) until it is closed or every sender is gone.
pub async fn run<S: LogPort>(
    log: S,
    key: ShareKey,
    kind: SharedType,
    starts: BTreeMap<PartitionId, u64>,
    mut inbox: mpsc::Receiver<Command>,
) {
    let mut dispatcher = match Dispatcher::start(log, key, kind, starts) {
        Ok(dispatcher) => dispatcher,
        Err((key, err)) => {
            tracing::error!(group = %clip(&key.group), filter = %clip(&key.filter), %err, "shared group cannot start");
            return;
        }
    };
    let mut tick = tokio::time::interval(COMMIT_EVERY);
    loop {
        if let Err(err) = dispatcher.state.dispatch() {
            tracing::warn!(group = %clip(&dispatcher.key.group), %err, "shared group cannot read the log");
        }
        tokio::select! {
            // Commands before wake-ups, so a member that joined before a record was
            // appended is among those it can go to; the once-a-second commit first of all.
            biased;
            _ = tick.tick() => dispatcher.commit().await,
            command = inbox.recv() => match command {
                Some(Command::Close { done }) => {
                    dispatcher.commit().await;
                    let _ = done.send(());
                    return;
                }
                Some(command) => dispatcher.apply(command).await,
                None => break,
            },
            () = dispatcher.wake.notified() => {}
        }
    }
    dispatcher.commit().await;
}

struct Dispatcher<S> {
    log: S,
    key: ShareKey,
    cursor_name: String,
    state: GroupState<S>,
    committed: BTreeMap<PartitionId, u64>,
    wake: Arc<Notify>,
    /// One task per partition forwarding its end-offset changes to `wake`; aborted on drop.
    _watchers: JoinSet<()>,
}

impl<S: LogPort> Dispatcher<S> {
    fn start(
        log: S,
        key: ShareKey,
        kind: SharedType,
        starts: BTreeMap<PartitionId, u64>,
    ) -> Result<Self, (ShareKey, LogError)> {
        let cursor_name = key.cursor_name();
        let wake = Arc::new(Notify::new());
        let mut watchers = JoinSet::new();
        for (topic, p) in starts.keys() {
            let mut end = log.subscribe(topic, *p).map_err(|e| (key.clone(), e))?;
            let wake = wake.clone();
            watchers.spawn(async move {
                while end.changed().await.is_ok() {
                    wake.notify_one();
                }
            });
        }
        let state = GroupState::new(log.clone(), key.filter.clone(), kind, starts.clone());
        Ok(Self {
            log,
            key,
            cursor_name,
            state,
            committed: starts,
            wake,
            _watchers: watchers,
        })
    }

    async fn apply(&mut self, command: Command) {
        match command {
            Command::Join {
                member,
                client_id,
                window,
                tx,
            } => self.state.join(member, client_id, window, tx),
            Command::Ack {
                member,
                partition,
                offset,
            } => self.state.ack(member, partition, offset),
            Command::Leave { member, done } => {
                self.state.leave(member);
                if self.state.member_count() == 0 {
                    self.commit().await;
                }
                let _ = done.send(());
            }
            Command::Close { done } => {
                let _ = done.send(());
            }
        }
    }

    /// Durably stores the cursors that moved; a failure is logged and retried next time.
    async fn commit(&mut self) {
        let moved: Vec<(PartitionId, u64)> = self
            .state
            .cursors()
            .filter(|(p, offset)| self.committed.get(*p) != Some(offset))
            .map(|(p, offset)| (p.clone(), offset))
            .collect();
        for (partition, offset) in moved {
            let (topic, p) = (&partition.0, partition.1);
            match self
                .log
                .commit_cursor(&self.cursor_name, topic, p, offset)
                .await
            {
                Ok(()) => {
                    self.committed.insert(partition, offset);
                }
                Err(err) => {
                    tracing::warn!(group = %clip(&self.key.group), %err, "cannot save a shared group cursor");
                    return;
                }
            }
        }
    }
}
