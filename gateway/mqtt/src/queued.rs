//! The process-wide account of queued delivery bytes (`[mqtt] max_queued_bytes_total`): every
//! QoS 1/2 delivery a session keeps a copy of until the client acknowledges it is charged to one
//! shared counter, through the session's [`Charge`], and released when it is acknowledged,
//! dropped, or its session ends. A connection whose session holds at least [`FLOOR`] bytes takes
//! no new delivery while the total is at the cap; one below the floor always may, so a stuck
//! subscriber cannot starve the ones that acknowledge. Pure bookkeeping: never blocks, never
//! refuses a client by itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

/// Bytes of unacknowledged deliveries a session may always hold, whatever the total: below it
/// the session takes one more delivery even at the cap.
pub const FLOOR: usize = 64 * 1024;

/// The shared counter of queued delivery bytes and its cap.
#[derive(Debug)]
pub struct QueuedBytes {
    total: AtomicU64,
    cap: AtomicU64,
    /// Bumped each time the total falls below the cap, to wake connections waiting for room.
    room: watch::Sender<u64>,
}

impl Default for QueuedBytes {
    fn default() -> Self {
        Self {
            total: AtomicU64::new(0),
            cap: AtomicU64::new(u64::MAX),
            room: watch::Sender::new(0),
        }
    }
}

impl QueuedBytes {
    /// Sets the cap (at startup, from `mqtt.max_queued_bytes_total`).
    pub fn set_cap(&self, cap: u64) {
        self.cap.store(cap, Ordering::Relaxed);
    }

    /// The cap.
    pub fn cap(&self) -> u64 {
        self.cap.load(Ordering::Relaxed)
    }

    /// The bytes charged now.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Whether a session holding `held` bytes may take another delivery: below the floor
    /// always, else while the total is below the cap.
    pub fn admits(&self, held: usize) -> bool {
        held < FLOOR || self.total() < self.cap()
    }

    /// A receiver that changes each time room is made below the cap.
    pub fn room(&self) -> watch::Receiver<u64> {
        self.room.subscribe()
    }

    fn charge(&self, bytes: usize) {
        self.total.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn release(&self, bytes: usize) {
        let bytes = bytes as u64;
        let before = self
            .total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_sub(bytes))
            })
            .unwrap_or(0);
        let cap = self.cap();
        if before >= cap && before.saturating_sub(bytes) < cap {
            self.room.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// The bytes one session holds and the account they are charged to (none until a connection
/// attaches one). Dropping it releases them.
#[derive(Debug, Default)]
pub struct Charge {
    account: Option<Arc<QueuedBytes>>,
    bytes: usize,
}

impl Charge {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Charges the bytes held, and from now on every change, to `account`.
    pub fn attach(&mut self, account: Arc<QueuedBytes>) {
        if let Some(old) = self.account.take() {
            old.release(self.bytes);
        }
        account.charge(self.bytes);
        self.account = Some(account);
    }

    /// Adds `bytes`.
    pub fn add(&mut self, bytes: usize) {
        self.bytes += bytes;
        if let Some(account) = &self.account {
            account.charge(bytes);
        }
    }

    /// Removes `bytes` (at most what is held).
    pub fn remove(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        if let Some(account) = &self.account {
            account.release(bytes);
        }
    }

    /// Releases everything held and returns the account, detached.
    pub fn take_account(&mut self) -> Option<Arc<QueuedBytes>> {
        self.remove(self.bytes);
        self.account.take()
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.remove(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_follow_the_session_and_drop_releases_them() {
        let account = Arc::new(QueuedBytes::default());
        account.set_cap(100_000);
        let mut room = account.room();
        let mut charge = Charge::default();
        charge.add(10);
        assert_eq!(account.total(), 0, "not attached yet");
        charge.attach(account.clone());
        assert_eq!(account.total(), 10);
        charge.add(FLOOR * 2);
        assert!(!account.admits(FLOOR), "at the cap, the floor is full");
        assert!(account.admits(FLOOR - 1), "below the floor, room");
        assert!(!room.has_changed().unwrap_or(true));
        charge.remove(FLOOR * 2);
        assert_eq!(account.total(), 10);
        assert!(
            room.has_changed().unwrap_or(false),
            "falling below the cap wakes"
        );
        room.borrow_and_update();
        let mut other = Charge::default();
        other.attach(account.clone());
        other.add(5);
        drop(charge);
        assert_eq!(account.total(), 5);
        assert_eq!(other.take_account().map(|a| a.total()), Some(0));
        assert_eq!(other.bytes(), 0);
        drop(other);
        assert_eq!(account.total(), 0);
    }
}
