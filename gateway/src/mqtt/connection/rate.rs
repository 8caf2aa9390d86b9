//! The per-client publish rate limit: a token bucket refilled at `max_publish_rate` per second.
//! An empty bucket pauses reading from that client; it never drops or refuses a message.

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket of publishes per second.
#[derive(Debug)]
pub(super) struct RateLimit {
    per_second: u32,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    pub(super) fn new(per_second: u32) -> Self {
        Self {
            per_second,
            tokens: f64::from(per_second),
            last: Instant::now(),
        }
    }

    /// Takes one token, waiting for it if the bucket is empty.
    pub(super) async fn take(&mut self) {
        if self.per_second == 0 {
            return;
        }
        let rate = f64::from(self.per_second);
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(rate);
        self.last = now;
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / rate);
            tokio::time::sleep(wait).await;
            self.tokens = 1.0;
            self.last = Instant::now();
        }
        self.tokens -= 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_publish_rate_is_held_to_its_limit() {
        let mut rate = RateLimit::new(10);
        let started = Instant::now();
        for _ in 0..10 {
            rate.take().await;
        }
        assert!(
            started.elapsed() < Duration::from_millis(10),
            "a full bucket bursts"
        );
        for _ in 0..15 {
            rate.take().await;
        }
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(1400), "{waited:?}");
        assert!(waited <= Duration::from_millis(1700), "{waited:?}");
        let mut unlimited = RateLimit::new(0);
        let before = Instant::now();
        for _ in 0..1000 {
            unlimited.take().await;
        }
        assert_eq!(before.elapsed(), Duration::ZERO);
    }
}
