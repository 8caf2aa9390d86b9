//! Group commit of a persistent session's subscription changes: SUBSCRIBE and UNSUBSCRIBE
//! change the session in memory at once, and their changes are stored in `__mqtt_state` by one
//! save at a time in a task of its own; every change that arrives while a save is in flight
//! goes into the next one, so 1,000 SUBSCRIBEs sent back to back cost a few durable commits,
//! not one each. A SUBACK or UNSUBACK (and the retained messages of a new subscription) goes
//! out only once its change is durable, in the order the packets arrived; the connection keeps
//! reading and delivering meanwhile (MQTT lets matching PUBLISHes precede the SUBACK).

use std::sync::Arc;

use tokio::io::AsyncWrite;
use tokio::task::JoinHandle;

use super::super::codec::Outgoing;
use super::super::session::Matched;
use super::super::state::{StateError, StoredSubscription};
use super::{ConnError, Connection};
use tern_log::LogPort;

/// A subscription change not yet durable.
pub(super) type Change = (String, Option<StoredSubscription>);

/// How a save ended.
pub(super) type SaveResult = Result<Result<(), StateError>, tokio::task::JoinError>;

/// What waits for a save: the changes, and what goes out once they are durable.
#[derive(Debug, Default)]
pub(super) struct SubscriptionSaves {
    /// Changes not handed to a save yet.
    unsaved: Vec<Change>,
    /// What goes out once the unsaved changes are durable.
    unsaved_done: Vec<Done>,
    /// The save in flight and what goes out when it ends.
    saving: Option<Saving>,
}

/// A save in flight and what goes out when it ends.
type Saving = (JoinHandle<Result<(), StateError>>, Vec<Done>);

/// Sent once a save ended.
#[derive(Debug)]
pub(super) enum Done {
    Ack(Outgoing),
    /// A new subscription's retained messages (after its SUBACK).
    Retained(String, Matched),
}

impl SubscriptionSaves {
    /// Whether nothing waits.
    pub(super) fn is_idle(&self) -> bool {
        self.saving.is_none() && self.unsaved_done.is_empty()
    }

    /// Waits for the save in flight, if any, dropping what would have gone out after it.
    pub(super) async fn join(&mut self) {
        if let Some((task, _)) = self.saving.take() {
            let _ = task.await;
        }
    }

    /// Waits for the save in flight; never resolves when there is none.
    pub(super) async fn saved(&mut self) -> SaveResult {
        match self.saving.as_mut() {
            Some((task, _)) => task.await,
            None => std::future::pending().await,
        }
    }
}

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// Stores what a SUBSCRIBE or UNSUBSCRIBE changed, then sends `done`: at once for a session
    /// that ends with its connection, after the next group commit for a persistent one.
    pub(super) async fn save_then(
        &mut self,
        changes: Vec<Change>,
        done: Vec<Done>,
    ) -> Result<(), ConnError> {
        if !self.session.persistent() {
            return self.send_done(done);
        }
        if !self.session.stored {
            // The session record holds every subscription.
            let stored = self.session.to_stored();
            self.broker
                .state
                .put_session(&self.client_id, Some(&stored))
                .await?;
            self.session.stored = true;
            self.saves.unsaved_done.extend(done);
            return self.start_save();
        }
        self.saves.unsaved.extend(changes);
        self.saves.unsaved_done.extend(done);
        self.start_save()
    }

    /// Starts saving what accumulated unless a save is in flight; with nothing to store, what
    /// waited goes out at once (after any save in flight).
    fn start_save(&mut self) -> Result<(), ConnError> {
        if self.saves.saving.is_some() {
            return Ok(());
        }
        let done = std::mem::take(&mut self.saves.unsaved_done);
        let changes = std::mem::take(&mut self.saves.unsaved);
        if changes.is_empty() {
            return self.send_done(done);
        }
        let state = Arc::clone(&self.broker.state);
        let client_id = self.client_id.clone();
        let task = tokio::spawn(async move { state.put_subscriptions(&client_id, &changes).await });
        self.saves.saving = Some((task, done));
        Ok(())
    }

    /// A save ended: its acknowledgements and retained messages go out, the next save starts.
    pub(super) async fn saved(&mut self, result: SaveResult) -> Result<(), ConnError> {
        let done = self.saves.saving.take().map(|(_, done)| done);
        result??;
        self.send_done(done.unwrap_or_default())?;
        self.start_save()?;
        self.deliver_more().await
    }

    /// Waits until every subscription change is durable and acknowledged (DISCONNECT,
    /// shutdown, the end of the connection).
    pub(super) async fn drain_saves(&mut self) -> Result<(), ConnError> {
        while !self.saves.is_idle() {
            if self.saves.saving.is_none() {
                self.start_save()?;
                continue;
            }
            let result = self.saves.saved().await;
            let done = self.saves.saving.take().map(|(_, done)| done);
            result??;
            self.send_done(done.unwrap_or_default())?;
        }
        Ok(())
    }

    fn send_done(&mut self, done: Vec<Done>) -> Result<(), ConnError> {
        for item in done {
            match item {
                Done::Ack(packet) => self.send(packet)?,
                Done::Retained(filter, matched) => self.queue_retained(filter, matched),
            }
        }
        Ok(())
    }
}
