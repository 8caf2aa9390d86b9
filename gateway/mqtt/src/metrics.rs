//! Counters of the MQTT server, rendered for `/metrics`. Updated with relaxed atomics from the
//! connection tasks; never blocks and never allocates on the data path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tern_core::metrics::{MetricsSource, write_single};

use super::queued::QueuedBytes;

/// The MQTT server's counters and gauges.
#[derive(Debug, Default)]
pub struct MqttMetrics {
    pub(crate) connections: AtomicU64,
    pub(crate) connections_total: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) publishes_in: AtomicU64,
    pub(crate) publishes_out: AtomicU64,
    pub(crate) acks_sent: AtomicU64,
    pub(crate) publishes_rejected: AtomicU64,
    pub(crate) malformed_packets: AtomicU64,
    pub(crate) keep_alive_timeouts: AtomicU64,
    /// Records subscribers skipped because the log lost them to damage.
    pub(crate) records_lost: AtomicU64,
    pub(crate) pending_evicted: AtomicU64,
    pub(crate) logins_throttled: AtomicU64,
    pub(crate) retained_messages: AtomicU64,
    pub(crate) retained_bytes: AtomicU64,
    pub(crate) retained_refused: AtomicU64,
    /// Times a client's reading was paused by `mqtt.max_publish_rate`.
    pub(crate) rate_limited: AtomicU64,
    /// Bytes of unacknowledged deliveries all sessions hold, and their cap.
    pub(crate) queued: Arc<QueuedBytes>,
}

impl MqttMetrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn inc(counter: &AtomicU64) {
        Self::add(counter, 1);
    }

    pub(crate) fn dec(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}

impl MetricsSource for MqttMetrics {
    fn render(&self, out: &mut String) {
        let families: [(&str, &str, &str, &AtomicU64); 14] = [
            (
                "tern_mqtt_connections",
                "gauge",
                "Open MQTT connections.",
                &self.connections,
            ),
            (
                "tern_mqtt_connections_total",
                "counter",
                "MQTT connections accepted.",
                &self.connections_total,
            ),
            (
                "tern_mqtt_connections_refused_total",
                "counter",
                "MQTT connections refused (limits, bad CONNECT).",
                &self.connections_refused,
            ),
            (
                "tern_mqtt_publishes_received_total",
                "counter",
                "PUBLISH packets received from clients.",
                &self.publishes_in,
            ),
            (
                "tern_mqtt_publishes_sent_total",
                "counter",
                "PUBLISH packets sent to subscribers.",
                &self.publishes_out,
            ),
            (
                "tern_mqtt_acks_sent_total",
                "counter",
                "PUBACK/PUBREC sent after the record was durable.",
                &self.acks_sent,
            ),
            (
                "tern_mqtt_publishes_rejected_total",
                "counter",
                "Publishes not stored (log full, invalid topic).",
                &self.publishes_rejected,
            ),
            (
                "tern_mqtt_malformed_packets_total",
                "counter",
                "Connections closed for malformed or oversized packets.",
                &self.malformed_packets,
            ),
            (
                "tern_mqtt_keep_alive_timeouts_total",
                "counter",
                "Connections closed after 1.5 times the keep alive without a packet.",
                &self.keep_alive_timeouts,
            ),
            (
                "tern_mqtt_pending_evicted_total",
                "counter",
                "Sockets closed before CONNECT to make room (mqtt.max_pending_connections).",
                &self.pending_evicted,
            ),
            (
                "tern_mqtt_logins_throttled_total",
                "counter",
                "Logins refused unchecked: the address failed too often (backoff).",
                &self.logins_throttled,
            ),
            (
                "tern_mqtt_retained_messages",
                "gauge",
                "Retained messages held (mqtt.max_retained).",
                &self.retained_messages,
            ),
            (
                "tern_mqtt_retained_bytes",
                "gauge",
                "Topic and payload bytes of the retained messages (mqtt.max_retained_bytes).",
                &self.retained_bytes,
            ),
            (
                "tern_mqtt_retained_refused_total",
                "counter",
                "Retained publishes refused by mqtt.max_retained or mqtt.max_retained_bytes.",
                &self.retained_refused,
            ),
        ];
        for (name, kind, help, value) in families {
            write_single(out, name, kind, help, value.load(Ordering::Relaxed));
        }
        write_single(
            out,
            "tern_mqtt_records_lost_total",
            "counter",
            "Log records a subscriber skipped because the log lost them to damage.",
            self.records_lost.load(Ordering::Relaxed),
        );
        write_single(
            out,
            "tern_mqtt_rate_limited_total",
            "counter",
            "Times reading from a client was paused because it published faster than mqtt.max_publish_rate.",
            self.rate_limited.load(Ordering::Relaxed),
        );
        write_single(
            out,
            "tern_mqtt_queued_bytes",
            "gauge",
            "Bytes of QoS 1/2 deliveries all sessions hold until their clients acknowledge them.",
            self.queued.total(),
        );
        write_single(
            out,
            "tern_mqtt_queued_bytes_max",
            "gauge",
            "mqtt.max_queued_bytes_total: past it, only sessions below their floor take new deliveries.",
            self.queued.cap(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let metrics = MqttMetrics::default();
        MqttMetrics::inc(&metrics.publishes_in);
        let mut out = String::new();
        metrics.render(&mut out);
        assert!(
            out.contains("tern_mqtt_publishes_received_total 1\n"),
            "{out}"
        );
        assert_eq!(out.matches("# TYPE").count(), 18);
    }
}
