//! The per-client publish rate limit: a token bucket refilled at `max_publish_rate` per second.
//! Each publish takes a token (the bucket may go into debt); while it is in debt the connection
//! stops reading from that client, but keeps acknowledging and delivering. It never drops or
//! refuses a message.

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

    /// Takes one token, possibly into debt.
    pub(super) fn take(&mut self) {
        if self.per_second > 0 {
            self.refill();
            self.tokens -= 1.0;
        }
    }

    /// When reading may resume, if the bucket is in debt.
    pub(super) fn resume_at(&mut self) -> Option<Instant> {
        if self.per_second == 0 {
            return None;
        }
        self.refill();
        (self.tokens < 0.0).then(|| {
            let wait = Duration::from_secs_f64(-self.tokens / f64::from(self.per_second));
            self.last + wait
        })
    }

    fn refill(&mut self) {
        let rate = f64::from(self.per_second);
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(rate);
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes `n` tokens the way the connection does: waiting whenever the bucket is in debt.
    async fn publish(rate: &mut RateLimit, n: usize) {
        for _ in 0..n {
            if let Some(at) = rate.resume_at() {
                tokio::time::sleep_until(at).await;
            }
            rate.take();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_publish_rate_is_held_to_its_limit() {
        let mut rate = RateLimit::new(10);
        let started = Instant::now();
        publish(&mut rate, 10).await;
        assert!(
            started.elapsed() < Duration::from_millis(10),
            "a full bucket bursts"
        );
        publish(&mut rate, 15).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(1300), "{waited:?}");
        assert!(waited <= Duration::from_millis(1700), "{waited:?}");
        let mut unlimited = RateLimit::new(0);
        let before = Instant::now();
        publish(&mut unlimited, 1000).await;
        assert_eq!(before.elapsed(), Duration::ZERO);
        assert_eq!(unlimited.resume_at(), None);
    }
}
