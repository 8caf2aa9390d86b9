//! Who gets a socket and a connection slot: the file-descriptor budget (the soft
//! `RLIMIT_NOFILE` as found, which the binary raises to the hard one at start, with room kept
//! for the log and the admin endpoint), sockets that have not sent CONNECT yet (at most `mqtt.max_pending_connections`;
//! when full the oldest is closed, so idle sockets cannot lock clients out that do send
//! CONNECT), and `mqtt.max_connections`, reserved atomically before CONNACK so simultaneous
//! CONNECTs cannot overshoot it. Touches no socket itself.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::config::MqttConfig;

/// File descriptors kept for everything but MQTT sockets: segment and index files, the state
/// log, the admin endpoint, upstream connections, TLS key files.
pub const RESERVED_FDS: u64 = 128;
/// Pending handshakes allowed however small the descriptor budget is.
const MIN_PENDING: usize = 8;

/// The current soft `RLIMIT_NOFILE` (`u64::MAX` if it cannot be read or is unlimited).
fn fd_limit() -> u64 {
    tern_core::sys::fd_limit().map_or(u64::MAX, |limit| limit.soft)
}

/// The limits the descriptor budget allows: (connections, pending handshakes).
fn budget(config: &MqttConfig, fds: u64) -> (usize, usize) {
    let usable = usize::try_from(fds.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    let connections = config
        .max_connections
        .min(usable.saturating_sub(MIN_PENDING).max(1));
    let pending = config
        .max_pending_connections
        .min(usable.saturating_sub(connections))
        .max(MIN_PENDING);
    (connections, pending)
}

/// Connection slots and pending handshakes.
#[derive(Debug)]
pub struct Admission {
    max_connections: usize,
    max_pending: usize,
    open: Arc<AtomicUsize>,
    pending: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    next: u64,
    waiting: VecDeque<(u64, Arc<Notify>)>,
}

impl Admission {
    /// The limits of `config` within the current descriptor limit (a warning when it forces
    /// them lower).
    pub fn new(config: &MqttConfig) -> Self {
        let fds = fd_limit();
        let (max_connections, max_pending) = budget(config, fds);
        if max_connections < config.max_connections {
            tracing::warn!(
                fds,
                configured = config.max_connections,
                allowed = max_connections,
                "the file-descriptor limit lowers mqtt.max_connections"
            );
        }
        Self {
            max_connections,
            max_pending,
            open: Arc::new(AtomicUsize::new(0)),
            pending: Mutex::default(),
        }
    }

    /// A connection slot, or `None` when `max_connections` are taken; freed on drop.
    pub fn reserve(&self) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.max_connections).then_some(open + 1)
            })
            .ok()
            .map(|_| Slot(self.open.clone()))
    }

    /// Registers a socket that has not sent CONNECT; when the pending set is full the oldest
    /// one is told to go (`Handshake::evicted`) and `true` says so.
    pub fn handshake(self: &Arc<Self>) -> (Handshake, bool) {
        let evict = Arc::new(Notify::new());
        let mut pending = self.lock();
        let id = pending.next;
        pending.next += 1;
        let full = pending.waiting.len() >= self.max_pending;
        if full {
            if let Some((_, oldest)) = pending.waiting.pop_front() {
                oldest.notify_one();
            }
        }
        pending.waiting.push_back((id, evict.clone()));
        let handshake = Handshake {
            admission: self.clone(),
            id,
            evict,
        };
        (handshake, full)
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A reserved connection slot.
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A socket waiting for its CONNECT; leaves the pending set on drop.
#[derive(Debug)]
pub struct Handshake {
    admission: Arc<Admission>,
    id: u64,
    evict: Arc<Notify>,
}

impl Handshake {
    /// Completes when newer sockets pushed this one out of the pending set.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        let mut pending = self.admission.lock();
        pending.waiting.retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_connections: usize, max_pending_connections: usize) -> MqttConfig {
        MqttConfig {
            max_connections,
            max_pending_connections,
            ..MqttConfig::default()
        }
    }

    #[test]
    fn the_descriptor_budget_keeps_room_for_the_log() {
        assert_eq!(budget(&config(1024, 128), 1_048_576), (1024, 128));
        assert_eq!(budget(&config(50, 128), 256), (50, 78));
        assert_eq!(budget(&config(1024, 128), 1024), (888, 8));
    }

    #[test]
    fn slots_never_exceed_the_limit_and_come_back_on_drop() {
        let admission = Admission {
            max_connections: 2,
            max_pending: 8,
            open: Arc::default(),
            pending: Mutex::default(),
        };
        let a = admission.reserve().expect("first");
        let _b = admission.reserve().expect("second");
        assert!(admission.reserve().is_none());
        drop(a);
        assert!(admission.reserve().is_some());
    }

    #[tokio::test]
    async fn a_full_pending_set_evicts_its_oldest_socket() {
        let admission = Arc::new(Admission {
            max_connections: 2,
            max_pending: 2,
            open: Arc::default(),
            pending: Mutex::default(),
        });
        let (first, full) = admission.handshake();
        assert!(!full);
        let (second, _) = admission.handshake();
        let (_third, full) = admission.handshake();
        assert!(full);
        tokio::time::timeout(std::time::Duration::from_secs(1), first.evicted())
            .await
            .expect("the oldest is evicted");
        drop(second);
        let (_fourth, full) = admission.handshake();
        assert!(!full, "a finished handshake frees its place");
    }
}
