//! The per-client publish rate limit (`mqtt.max_publish_rate`, off by default): a token bucket
//! refilled at that many publishes per second. Each publish takes a token (the bucket may go
//! into debt); while it is in debt the connection stops reading from that client, but keeps
//! acknowledging and delivering. Each time a publish puts the bucket into debt is a pause, which
//! the connection counts and logs. It never drops or refuses a message.

use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::time::Instant;

use super::super::clip::clip;
use super::super::metrics::MqttMetrics;
use super::Connection;
use tern_core::logging::Throttle;
use tern_log::LogPort;

/// At most one log line per this interval for all clients paused by the limit.
const LOG_EVERY: Duration = Duration::from_secs(10);

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// A publish put the client over `mqtt.max_publish_rate`: reading pauses (by the packet
    /// loop). Counted, and logged at most once per [`LOG_EVERY`] for every client together.
    /// MQTT has no reason code for a pause (0x96 "message rate too high" exists only in
    /// DISCONNECT, and tern does not disconnect for rate), so the client sees slower acks only.
    pub(super) fn rate_limited(&mut self) {
        MqttMetrics::inc(&self.broker.metrics.rate_limited);
        static PAUSED: Throttle = Throttle::new(LOG_EVERY);
        if let Some(left_out) = PAUSED.due() {
            tracing::warn!(
                client_id = %clip(&self.client_id),
                limit = self.rate.per_second(),
                left_out,
                "client over mqtt.max_publish_rate: reading from it paused \
                 (tern_mqtt_rate_limited_total counts pauses)"
            );
        }
    }
}

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

    /// Takes one token, possibly into debt; `true` when this publish starts a pause (the
    /// bucket was not in debt before it).
    pub(super) fn take(&mut self) -> bool {
        if self.per_second == 0 {
            return false;
        }
        self.refill();
        let was_in_debt = self.tokens < 0.0;
        self.tokens -= 1.0;
        !was_in_debt && self.tokens < 0.0
    }

    /// The limit, publishes per second (0: none).
    pub(super) fn per_second(&self) -> u32 {
        self.per_second
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
    /// Returns how many pauses began.
    async fn publish(rate: &mut RateLimit, n: usize) -> usize {
        let mut pauses = 0;
        for _ in 0..n {
            if let Some(at) = rate.resume_at() {
                tokio::time::sleep_until(at).await;
            }
            pauses += usize::from(rate.take());
        }
        pauses
    }

    #[tokio::test(start_paused = true)]
    async fn the_publish_rate_is_held_to_its_limit() {
        let mut rate = RateLimit::new(10);
        let started = Instant::now();
        assert_eq!(publish(&mut rate, 10).await, 0, "a full bucket is no pause");
        assert!(
            started.elapsed() < Duration::from_millis(10),
            "a full bucket bursts"
        );
        let pauses = publish(&mut rate, 15).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(1300), "{waited:?}");
        assert!(waited <= Duration::from_millis(1700), "{waited:?}");
        assert!((1..=15).contains(&pauses), "{pauses} pauses");
        let mut unlimited = RateLimit::new(0);
        let before = Instant::now();
        assert_eq!(publish(&mut unlimited, 1000).await, 0);
        assert_eq!(before.elapsed(), Duration::ZERO);
        assert_eq!(unlimited.resume_at(), None);
    }
}
