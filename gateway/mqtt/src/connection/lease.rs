//! "Sent up to" leases, so deliveries repeated after a gateway restart carry DUP. A persistent
//! session's durable cursor is its oldest unacknowledged offset, so after a restart it
//! re-sends from there, but the in-memory record of what went out is gone. Before a record at
//! or past a partition's lease is sent, the lease is moved [`LEASE_RECORDS`] offsets ahead and
//! committed durably in the cursor store (name `mqtt-sent:{client id}`): one cursor commit per
//! that many records, not one per record. After a restart, records below the loaded lease go
//! out with DUP ("might be a redelivery": a few never-sent records get it too; a sent one never
//! misses it). Sessions that end with their connection need no lease. Never writes records.

use tokio::io::AsyncWrite;

use super::super::broker::sent_cursor_name;
use super::super::router::PartitionId;
use super::{ConnError, Connection};
use tern_log::LogPort;

/// How far one lease commit reaches past the record that needed it.
pub(super) const LEASE_RECORDS: u64 = 256;

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// Delivers as far as the window allows, committing leases where delivery waits for one.
    pub(super) async fn deliver_more(&mut self) -> Result<(), ConnError> {
        loop {
            self.pump_resend()?;
            self.pump_retained()?;
            self.pump()?;
            if self.lease_due.is_empty() {
                self.report_outcomes().await;
                return Ok(());
            }
            self.extend_leases().await?;
        }
    }

    /// Commits a lease for every partition whose next record waits for one.
    async fn extend_leases(&mut self) -> Result<(), ConnError> {
        let name = sent_cursor_name(&self.client_id);
        for (partition, offset) in std::mem::take(&mut self.lease_due) {
            let lease = offset.saturating_add(LEASE_RECORDS);
            self.broker
                .log
                .commit_cursor(&name, &partition.0, partition.1, lease)
                .await?;
            self.session.sent_leases.insert(partition, lease);
        }
        Ok(())
    }

    /// Loads the durable lease of a stored session's partition (after a restart): everything
    /// below it may have been sent.
    pub(super) fn load_lease(&mut self, partition: &PartitionId) {
        if !self.session.stored {
            return;
        }
        let name = sent_cursor_name(&self.client_id);
        let Some(lease) = self.broker.log.cursor(&name, &partition.0, partition.1) else {
            return;
        };
        self.session.sent_leases.insert(partition.clone(), lease);
        self.session
            .redelivery_below
            .insert(partition.clone(), lease);
    }
}
