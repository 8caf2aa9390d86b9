//! The status page: one self-contained HTML file (inline CSS, JS and SVG; no external asset, it
//! runs on an offline Pi) and the JSON it renders, with partitions, cursors and their lag, the
//! upstream state with its backlog over the last hour, fdatasync latency, bytes written, the
//! projected card lifetime and the readiness reasons. A sampler task keeps a small ring of
//! backlog and write samples (one per `[status] sample_interval`, an hour's worth). The card
//! lifetime is `device.rs`'s projection, the one `/metrics` exports; this page never computes
//! its own.
//!
//! It only reads: the log's counters and reports, the upstream status map, `/proc/self/io`,
//! the device counter.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::device::{CardLifetime, DeviceMetrics, WriteCounter};
use crate::health::Readiness;
use tern_core::shutdown::Shutdown;
use tern_core::{ByteSize, HumanDuration, InvalidConfig, invalid};
use tern_log::Log;

/// How much history the ring keeps.
const HISTORY: Duration = Duration::from_secs(3600);

/// `[status]`: the status page's sampling. The card it projects the lifetime of is
/// `[log.flush.wear]`'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatusConfig {
    /// Time between two samples of the backlog and of bytes written.
    pub sample_interval: HumanDuration,
    /// Deprecated: `[log.flush.wear] card_size`. Read from old files and moved there at load
    /// (`deprecated.rs`); never set once loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card_bytes: Option<ByteSize>,
    /// Deprecated: `[log.flush.wear] write_cycles`, likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card_write_cycles: Option<u32>,
}

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            sample_interval: HumanDuration(Duration::from_secs(30)),
            card_bytes: None,
            card_write_cycles: None,
        }
    }
}

impl StatusConfig {
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.sample_interval.0 < Duration::from_secs(1) {
            return Err(invalid("status.sample_interval", "must be at least 1s"));
        }
        Ok(())
    }

    fn capacity(&self) -> usize {
        let per = self.sample_interval.0.as_secs().max(1);
        usize::try_from(HISTORY.as_secs() / per)
            .unwrap_or(120)
            .max(2)
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Sample {
    at_ms: i64,
    backlog: u64,
    written: u64,
}

/// Where "bytes written" comes from.
#[derive(Debug, Clone, Copy)]
enum WriteSource {
    /// `write_bytes` of `/proc/self/io`: what this process caused to be sent to block devices.
    ProcIo,
    /// The log's own count of bytes handed to write calls (no `/proc/self/io`).
    LogCounter,
}

impl WriteSource {
    fn describe(self) -> &'static str {
        match self {
            Self::ProcIo => {
                "process write_bytes from /proc/self/io (bytes this process sent to the block device; the card's own amplification is not visible)"
            }
            Self::LogCounter => "bytes the log handed to write calls (/proc/self/io unavailable)",
        }
    }
}

/// `write_bytes` of `/proc/self/io`, if the kernel exposes it.
fn proc_write_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

use tern_core::time::now_ms;

/// What the page shows and the samples behind its chart.
pub struct StatusPage {
    log: Log,
    upstream: tern_upstream::StatusMap,
    /// The downstream's command partitions (`[upstream.commands]`), empty without one.
    downstream: tern_upstream::StatusMap,
    upstreams: Vec<tern_upstream::UpstreamConfig>,
    config: StatusConfig,
    device: Arc<DeviceMetrics>,
    samples: Mutex<VecDeque<Sample>>,
}

impl StatusPage {
    pub fn new(
        log: Log,
        upstream: tern_upstream::StatusMap,
        upstreams: Vec<tern_upstream::UpstreamConfig>,
        config: StatusConfig,
        device: Arc<DeviceMetrics>,
    ) -> Self {
        Self {
            log,
            upstream,
            downstream: tern_upstream::StatusMap::default(),
            upstreams,
            config,
            device,
            samples: Mutex::new(VecDeque::new()),
        }
    }

    /// The page with the downstream's partitions in it.
    pub fn with_downstream(mut self, downstream: tern_upstream::StatusMap) -> Self {
        self.downstream = downstream;
        self
    }

    /// Per command partition: where the gateway reads, its lag and what it stored.
    fn downstream_json(&self) -> Value {
        let status = self
            .downstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let partitions: Vec<Value> = status
            .iter()
            .map(|((topic, partition), s)| {
                let lag = s.upstream_end.map(|end| end.saturating_sub(s.next));
                json!({
                    "topic": topic, "partition": partition, "connected": s.connected,
                    "next": s.next, "lag": lag, "commands": s.forwarded_records,
                    "refused": s.refused, "last_error": s.last_error,
                })
            })
            .collect();
        let configured = self.upstreams.iter().any(|u| u.commands.is_some());
        json!({ "configured": configured, "partitions": partitions })
    }

    fn write_source() -> WriteSource {
        if proc_write_bytes().is_some() {
            WriteSource::ProcIo
        } else {
            WriteSource::LogCounter
        }
    }

    fn written(&self) -> u64 {
        proc_write_bytes().unwrap_or_else(|| self.log.stats().bytes_written)
    }

    /// Records not yet forwarded, over every partition an upstream forwards: the lag of the
    /// furthest-behind `upstream:*` cursor, or every stored record before any cursor exists.
    fn backlog(&self) -> u64 {
        let reports = self.log.cursor_report();
        let upstream_lag = |topic: &str, partition: u32| {
            reports
                .iter()
                .filter(|c| c.name.starts_with("upstream:"))
                .flat_map(|c| c.positions.iter())
                .filter(|p| p.topic == topic && p.partition == partition)
                .map(|p| p.lag_records)
                .max()
        };
        self.log
            .partition_states()
            .iter()
            .filter(|p| self.upstreams.iter().any(|u| u.forwards(&p.topic)))
            .map(|p| {
                upstream_lag(&p.topic, p.partition)
                    .unwrap_or(p.end_offset.saturating_sub(p.start_offset))
            })
            .sum()
    }

    fn sample(&self) {
        let sample = Sample {
            at_ms: now_ms(),
            backlog: self.backlog(),
            written: self.written(),
        };
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.push_back(sample);
        while samples.len() > self.config.capacity() {
            samples.pop_front();
        }
    }

    /// Samples every `sample_interval` until shutdown.
    pub async fn run(self: Arc<Self>, mut shutdown: Shutdown) {
        let mut tick = tokio::time::interval(self.config.sample_interval.0);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.wait() => return,
            }
            let this = Arc::clone(&self);
            let _ = tokio::task::spawn_blocking(move || this.sample()).await;
        }
    }

    /// Bytes per second written over the sampled window, if two samples exist.
    fn write_rate(samples: &VecDeque<Sample>) -> Option<f64> {
        let (first, last) = (samples.front()?, samples.back()?);
        let seconds = (last.at_ms - first.at_ms) as f64 / 1000.0;
        (seconds > 0.0).then(|| last.written.saturating_sub(first.written) as f64 / seconds)
    }

    fn upstream_json(&self, samples: &VecDeque<Sample>) -> Value {
        let status = self
            .upstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let now = now_ms();
        let backlog_json = |b: &tern_upstream::Backlog| {
            json!({
                "records": b.records, "bytes": b.bytes, "age_seconds": b.age_ms / 1000,
                "rate": b.rate, "drain_seconds": b.drain_seconds(),
            })
        };
        let backlogs = tern_upstream::backlogs(&self.log, &status, now);
        let partitions: Vec<Value> = status
            .iter()
            .map(|(key, s)| {
                let (topic, partition) = key;
                let backlog = backlogs.partitions.get(key).copied().unwrap_or_default();
                json!({
                    "topic": topic, "partition": partition, "connected": s.connected,
                    "next": s.next, "forwarded_records": s.forwarded_records,
                    "class": s.class.name(), "last_error": s.last_error,
                    "backlog": backlog_json(&backlog),
                    "draining": s.draining, "live_records": s.live_records,
                })
            })
            .collect();
        let classes: Vec<Value> = backlogs
            .classes
            .iter()
            .zip(tern_upstream::Class::ALL)
            .map(|(b, class)| json!({ "class": class.name(), "backlog": backlog_json(b) }))
            .collect();
        let history: Vec<Value> = samples
            .iter()
            .map(|s| json!({ "at_ms": s.at_ms, "backlog": s.backlog }))
            .collect();
        json!({
            "configured": !self.upstreams.is_empty(),
            "partitions": partitions,
            "classes": classes,
            "backlog": self.backlog(),
            "history": history,
        })
    }

    /// Everything the page shows, as JSON (`/status.json`, and embedded in the page).
    pub fn snapshot(&self, readiness: Option<&Readiness>) -> Value {
        let samples = self
            .samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let stats = self.log.stats();
        let partitions: Vec<Value> = self
            .log
            .partition_states()
            .into_iter()
            .map(|p| {
                json!({
                    "topic": p.topic, "partition": p.partition,
                    "start_offset": p.start_offset, "end_offset": p.end_offset,
                    "bytes": p.bytes, "segments": p.segments,
                    "refusing": p.refusing.map(|r| format!("{r:?}")),
                })
            })
            .collect();
        let mean_ms = (stats.fsyncs > 0)
            .then(|| stats.fsync_time.as_secs_f64() * 1000.0 / stats.fsyncs as f64);
        let rate = Self::write_rate(&samples);
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "generated_ms": now_ms(),
            "readiness": crate::health::readiness_json(readiness),
            "partitions": partitions,
            "cursors": crate::cursors::report_json(&self.log.cursor_report())["cursors"],
            "upstream": self.upstream_json(&samples),
            "downstream": self.downstream_json(),
            "fsync": {
                "count": stats.fsyncs,
                "total_seconds": stats.fsync_time.as_secs_f64(),
                "mean_ms": mean_ms,
            },
            "writes": {
                "source": Self::write_source().describe(),
                "bytes": self.written(),
                "log_bytes": stats.bytes_written,
                "bytes_per_second": rate,
            },
            "card": card_json(self.device.card_lifetime().as_ref(), self.device.counter()),
        })
    }

    /// The page with `snapshot` embedded, so it renders without a second request.
    pub fn page(&self, readiness: Option<&Readiness>) -> String {
        let data = self.snapshot(readiness).to_string().replace('<', "\\u003c");
        PAGE.replace("/*DATA*/null", &data)
    }
}

/// The page's card figure: `lifetime` (the projection `/metrics` exports) in days, and how it
/// was reached.
fn card_json(lifetime: Option<&CardLifetime>, counter: &WriteCounter) -> Value {
    let Some(l) = lifetime else {
        return json!({
            "days": null, "years": null,
            "explanation": "unknown: the device's bytes written cannot be read",
        });
    };
    let years = l.years.is_finite().then_some(l.years);
    let days = years.map(|y| y * 365.25);
    let explanation = match days {
        None => "no device writes over the last minute: the card does not wear at rest".to_owned(),
        Some(_) => format!(
            "{} bytes × {} cycles ([log.flush.wear] card_size, write_cycles) ÷ {:.0} bytes/s written by {} over the last minute or more, assuming even wear",
            l.card_bytes,
            l.write_cycles,
            l.bytes_per_sec,
            counter.describe()
        ),
    };
    json!({
        "days": days, "years": years, "explanation": explanation,
        "card_bytes": l.card_bytes, "write_cycles": l.write_cycles,
        "bytes_per_second": l.bytes_per_sec,
    })
}

/// The page: renders the embedded snapshot at load, then refreshes from `/status.json`.
pub const PAGE: &str = include_str!("status.html");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_external_asset() {
        for needle in ["src=", "href=", "<link", "@import", "url("] {
            assert!(!PAGE.contains(needle), "{needle}");
        }
        assert!(PAGE.contains("/*DATA*/null"));
    }

    #[test]
    fn the_page_shows_the_card_lifetime_metrics_exports() {
        let config = crate::config::Config::default();
        let device = DeviceMetrics::new(&std::env::temp_dir(), &config.log.flush.wear);
        let lifetime = device.lifetime_at(12_345.0);
        let card = card_json(Some(&lifetime), device.counter());
        let years = card["years"].as_f64().expect("projected, not unknown");
        let metric: f64 = lifetime.metric_value().parse().expect("a number");
        assert_eq!(format!("{years:.2}"), format!("{metric:.2}"), "{card}");
        let days = card["days"].as_f64().expect("in days too");
        assert!((days / 365.25 - years).abs() < 1e-9, "{card}");
        // 32 GB × 1000 cycles at 12,345 bytes/s: about 82 years.
        assert!((metric - 82.14).abs() < 0.01, "{metric}");
        assert_eq!(card["card_bytes"], 32_000_000_000u64);
        let rest = card_json(Some(&device.lifetime_at(0.0)), device.counter());
        assert_eq!(rest["days"], Value::Null);
        assert_eq!(device.lifetime_at(0.0).metric_value(), "+Inf");
    }

    #[test]
    fn the_ring_keeps_an_hour() {
        let config = StatusConfig::default();
        assert_eq!(config.capacity(), 120);
    }
}
