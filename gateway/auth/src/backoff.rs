//! Failed logins per client address: the first `FREE_FAILURES` in a row cost nothing extra;
//! after them, the address must wait 1 s, doubling with each further failure up to 60 s,
//! before tern verifies a password from it again (CONNACK 0x9F "connection rate exceeded",
//! 3.1.1: "server unavailable", without running argon2). A successful login clears its
//! address; addresses quiet for 10 minutes are forgotten, and at most `MAX_TRACKED` are kept.
//! Pure bookkeeping on tokio's clock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Failures in a row before the address has to wait.
pub(crate) const FREE_FAILURES: u32 = 3;
const FIRST_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(60);
const FORGET_AFTER: Duration = Duration::from_secs(600);
const MAX_TRACKED: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

impl Failures {
    /// When the next password from this address is verified again.
    fn until(&self) -> Instant {
        let beyond = self.count.saturating_sub(FREE_FAILURES);
        if self.count < FREE_FAILURES {
            return self.last;
        }
        let delay = FIRST_DELAY
            .saturating_mul(1 << beyond.min(6))
            .min(MAX_DELAY);
        self.last + delay
    }
}

/// The failed-login table.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    table: Mutex<HashMap<IpAddr, Failures>>,
}

impl Backoff {
    /// `Err(wait)` while `address` must wait before its next password is checked.
    pub(crate) fn admit(&self, address: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        match self.lock().get(&address) {
            Some(failures) if failures.until() > now => Err(failures.until() - now),
            _ => Ok(()),
        }
    }

    /// Counts a wrong password from `address`.
    pub(crate) fn failed(&self, address: IpAddr) {
        let now = Instant::now();
        let mut table = self.lock();
        if table.len() >= MAX_TRACKED && !table.contains_key(&address) {
            table.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            if table.len() >= MAX_TRACKED {
                let oldest = table.iter().min_by_key(|(_, f)| f.last).map(|(a, _)| *a);
                if let Some(oldest) = oldest {
                    table.remove(&oldest);
                }
            }
        }
        let entry = table.entry(address).or_insert(Failures {
            count: 0,
            last: now,
        });
        if now.duration_since(entry.last) >= FORGET_AFTER {
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
    }

    /// A successful login clears `address`.
    pub(crate) fn succeeded(&self, address: IpAddr) {
        self.lock().remove(&address);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, Failures>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn repeated_failures_wait_longer_and_success_clears() {
        let backoff = Backoff::default();
        let a: IpAddr = [192, 0, 2, 1].into();
        let b: IpAddr = [192, 0, 2, 2].into();
        for _ in 0..FREE_FAILURES {
            assert!(backoff.admit(a).is_ok());
            backoff.failed(a);
        }
        assert_eq!(backoff.admit(a), Err(Duration::from_secs(1)));
        assert!(backoff.admit(b).is_ok(), "other addresses are not affected");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(backoff.admit(a).is_ok());
        backoff.failed(a);
        assert_eq!(backoff.admit(a), Err(Duration::from_secs(2)));
        for _ in 0..20 {
            backoff.failed(a);
        }
        assert_eq!(backoff.admit(a), Err(MAX_DELAY));
        backoff.succeeded(a);
        assert!(backoff.admit(a).is_ok());
        backoff.failed(b);
        tokio::time::advance(FORGET_AFTER).await;
        for _ in 0..FREE_FAILURES - 1 {
            backoff.failed(b);
        }
        assert!(backoff.admit(b).is_ok(), "old failures are forgotten");
    }
}
