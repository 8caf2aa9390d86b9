//! The `bandwidth` cap of one upstream: a token bucket held by its Kafka connection
//! (`kafka/`), so all of its forwarders share it, charged with the bytes of every produce
//! request before it is sent. It holds up to one second's
//! worth of bytes (the burst), and the forwarders read batches no larger than that, so the link
//! never sees more than the cap plus one burst in any window. It only delays callers; it never
//! drops, splits or reorders anything, and it never sleeps while holding its lock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How much unused allowance the bucket keeps, in time at the capped rate.
pub const BURST: Duration = Duration::from_secs(1);

/// The shared cap; `bytes_per_sec == 0` means unlimited (every call returns at once).
#[derive(Debug)]
pub struct Bandwidth {
    bucket: Option<Mutex<Bucket>>,
    bytes_per_sec: u64,
}

impl Bandwidth {
    pub fn new(bytes_per_sec: u64) -> Self {
        Self {
            bucket: (bytes_per_sec > 0).then(|| Mutex::new(Bucket::new(bytes_per_sec))),
            bytes_per_sec,
        }
    }

    /// The largest batch a forwarder should read: `max_batch_bytes`, or one burst if smaller.
    pub fn batch_limit(&self, max_batch_bytes: u64) -> u64 {
        match self.bytes_per_sec {
            0 => max_batch_bytes,
            rate => max_batch_bytes.min(rate),
        }
    }

    /// Waits until `bytes` may go out under the cap, and charges them.
    pub async fn acquire(&self, bytes: u64) {
        let Some(bucket) = &self.bucket else { return };
        let wait = {
            let mut bucket = bucket.lock().unwrap_or_else(|e| e.into_inner());
            bucket.reserve(tokio::time::Instant::now().into_std(), bytes)
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// A token bucket kept as its theoretical arrival time (GCRA): the instant at which everything
/// reserved so far has been paid for at the capped rate.
#[derive(Debug)]
pub struct Bucket {
    bytes_per_sec: f64,
    paid_until: Option<Instant>,
}

impl Bucket {
    pub fn new(bytes_per_sec: u64) -> Self {
        Self {
            bytes_per_sec: bytes_per_sec.max(1) as f64,
            paid_until: None,
        }
    }

    /// Reserves `bytes` at `now`; returns how long the caller must wait before sending them.
    /// After a quiet spell the bucket holds at most [`BURST`] of allowance.
    pub fn reserve(&mut self, now: Instant, bytes: u64) -> Duration {
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec);
        let start = match self.paid_until {
            Some(paid) if paid > now => paid,
            _ => now,
        };
        let paid = start + cost;
        self.paid_until = Some(paid);
        paid.saturating_duration_since(now).saturating_sub(BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `chunks` through a bucket as fast as it allows; returns when the last one may go.
    fn last_send(bucket: &mut Bucket, start: Instant, chunks: &[u64]) -> Duration {
        let mut now = start;
        for &bytes in chunks {
            now += bucket.reserve(now, bytes);
        }
        now - start
    }

    #[test]
    fn a_burst_goes_at_once_and_the_rest_at_the_capped_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::new(1000);
        // One second's worth passes without waiting.
        assert_eq!(bucket.reserve(start, 1000), Duration::ZERO);
        // Everything after it is paced: 500 more bytes are due 0.5 s later.
        assert_eq!(bucket.reserve(start, 500), Duration::from_millis(500));
        // 10,000 bytes in 100-byte chunks take (10,000 - 1,000) / 1,000 = 9 s.
        let mut bucket = Bucket::new(1000);
        let elapsed = last_send(&mut bucket, start, &[100; 100]);
        assert_eq!(elapsed, Duration::from_millis(9_000));
    }

    #[test]
    fn idle_time_refills_at_most_one_burst() {
        let start = Instant::now();
        let mut bucket = Bucket::new(1000);
        assert_eq!(bucket.reserve(start, 3000), Duration::from_secs(2));
        // A minute later the bucket is full again, but holds one second, not sixty.
        let later = start + Duration::from_secs(60);
        assert_eq!(bucket.reserve(later, 1000), Duration::ZERO);
        assert_eq!(bucket.reserve(later, 1000), Duration::from_secs(1));
    }

    #[test]
    fn a_batch_larger_than_the_burst_is_sent_late_not_refused() {
        let start = Instant::now();
        let mut bucket = Bucket::new(100);
        assert_eq!(bucket.reserve(start, 1000), Duration::from_secs(9));
        assert_eq!(bucket.reserve(start, 100), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn forwarders_sharing_a_cap_are_paced_together() {
        let cap = std::sync::Arc::new(Bandwidth::new(2000));
        let started = tokio::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let cap = std::sync::Arc::clone(&cap);
            tasks.spawn(async move {
                for _ in 0..10 {
                    cap.acquire(250).await;
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        // 4 x 10 x 250 = 10,000 bytes at 2,000 B/s with a one-second burst: 4 s.
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs(4), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(4_100), "{elapsed:?}");
        assert_eq!(cap.batch_limit(512 * 1024), 2000);
        assert_eq!(Bandwidth::new(0).batch_limit(512 * 1024), 512 * 1024);
    }
}
