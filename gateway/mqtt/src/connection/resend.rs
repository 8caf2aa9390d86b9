//! Deliveries resumed after a reconnect: a session's unacknowledged QoS 1/2 deliveries are
//! sent again (PUBLISH with DUP and its full topic, or PUBREL once PUBREC came) within the
//! in-flight window of the new connection, whose client may announce a smaller Receive Maximum
//! than the last: the PUBLISHes beyond it wait, in packet-id order, and go out as the client
//! acknowledges, before any new record. A packet id the client acknowledges before its re-send
//! (it got the message on the earlier connection) is not sent again.

use std::collections::BTreeMap;

use tokio::io::AsyncWrite;

use super::super::codec::Outgoing;
use super::{ConnError, Connection};
use tern_log::LogPort;

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// Resends PUBREL for released deliveries and queues the PUBLISH re-sends, sets up
    /// positions, and starts delivering.
    pub(super) async fn resume(&mut self) -> Result<(), ConnError> {
        let mut released = Vec::new();
        for (pkid, entry) in &self.session.inflight {
            if entry.released {
                released.push(*pkid);
            } else {
                self.resend.push_back(*pkid);
            }
        }
        for pkid in released {
            self.send(Outgoing::PubRel { pkid })?;
        }
        self.pump_resend()?;
        self.track_partitions_of(true, &BTreeMap::new()).await?;
        self.wake.notify_one();
        Ok(())
    }

    /// Re-sends queued deliveries while the window has room. They are charged already, so
    /// `mqtt.max_queued_bytes_total` does not hold them back.
    pub(super) fn pump_resend(&mut self) -> Result<(), ConnError> {
        while !self.resend.is_empty() && !self.window_full_here() {
            let Some(pkid) = self.resend.pop_front() else {
                break;
            };
            let Some(entry) = self.session.inflight.get(&pkid).filter(|e| !e.released) else {
                continue;
            };
            let mut publish = entry.publish.clone();
            publish.dup = true;
            self.send(Outgoing::Publish(Box::new(publish)))?;
        }
        Ok(())
    }

    /// The client acknowledged `pkid` (PUBACK, PUBREC or PUBCOMP): a re-send still queued for
    /// it is dropped.
    pub(super) fn resend_acknowledged(&mut self, pkid: u16) {
        if !self.resend.is_empty() {
            self.resend.retain(|queued| *queued != pkid);
        }
    }
}
