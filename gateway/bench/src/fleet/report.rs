//! The figures of `tern-bench fleet` and how they are printed: per run (spread on or off) the
//! drain after the links' return per mode, the brokers' new connections per second (from the
//! proxy), request latency per API and Produce throttling as the proxy saw them, the gateways'
//! CPU and memory, and the read-back check. The reductions (peak per second, latency
//! percentiles) are pure functions of what the run recorded.
//!
//! It never measures anything itself and never asserts a target.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::check::Checked;
use crate::stats::{median, percentile};
use crate::upstream::proxy::Answered;

/// Every run's figures, with the command.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetReport {
    pub command: String,
    pub gateways: usize,
    pub sensor_period_ms: u64,
    /// Every gateway's `reconnect_max`.
    pub reconnect_max_s: f64,
    pub outage_s: f64,
    pub runs: Vec<FleetRun>,
}

/// One run of the whole fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetRun {
    /// `reconnect_jitter` of every gateway.
    pub spread: bool,
    /// The run's topic prefix.
    pub prefix: String,
    /// From the cut to the return.
    pub outage_s: f64,
    /// Records not yet forwarded, summed over the fleet, at the return.
    pub behind_at_return: u64,
    /// Per mode: when each gateway first showed itself drained after the return (nothing
    /// failing; nothing behind or nothing older than 2 s).
    pub drained: Vec<Drained>,
    pub connections: Connections,
    /// Per API key, every request answered while the fleet forwarded steadily before the cut
    /// (from every gateway forwarding to the cut) and after the return.
    pub latency: Vec<ApiLatency>,
    /// The largest Produce `throttle_time_ms`, and how many Produce responses had one above 0.
    pub produce_throttle_max_ms: i32,
    pub produce_throttled: usize,
    pub usage: Usage,
    pub check: Checked,
    /// Gateways whose read-back found a problem.
    pub gateways_failing_check: Vec<String>,
    /// From the first gateway's start to the end of the drain's read-back.
    pub elapsed_s: f64,
}

/// When the gateways of one mode had drained, seconds after the return.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drained {
    pub mode: &'static str,
    pub gateways: usize,
    pub first_s: f64,
    pub median_s: f64,
    pub last_s: f64,
}

impl Drained {
    /// Seconds `times` (one per gateway of `mode`) summarised; `None` without any.
    pub fn of(mode: &'static str, mut times: Vec<f64>) -> Option<Self> {
        times.sort_by(f64::total_cmp);
        Some(Self {
            mode,
            gateways: times.len(),
            first_s: *times.first()?,
            median_s: median(times.iter().copied())?,
            last_s: *times.last()?,
        })
    }
}

/// New connections the brokers saw through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Connections {
    /// From the first gateway's start to the cut.
    pub before: usize,
    pub before_peak_per_s: usize,
    /// From the return to the end of the run.
    pub after: usize,
    pub after_peak_per_s: usize,
}

impl Connections {
    pub fn of(opened: &[Instant], cut: Instant, restored: Instant) -> Self {
        let before: Vec<Instant> = opened.iter().copied().filter(|t| *t < cut).collect();
        let after: Vec<Instant> = opened.iter().copied().filter(|t| *t >= restored).collect();
        Self {
            before: before.len(),
            before_peak_per_s: peak_per_second(&before),
            after: after.len(),
            after_peak_per_s: peak_per_second(&after),
        }
    }
}

/// The most instants of `times` (ascending) within any one second.
pub fn peak_per_second(times: &[Instant]) -> usize {
    let mut peak = 0;
    let mut start = 0;
    for (end, at) in times.iter().enumerate() {
        while times
            .get(start)
            .is_some_and(|first| at.duration_since(*first) >= Duration::from_secs(1))
        {
            start += 1;
        }
        peak = peak.max(end + 1 - start);
    }
    peak
}

/// Request latency of one API, steady before the cut and after the return.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApiLatency {
    pub api: &'static str,
    pub before: Latency,
    pub after: Latency,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    pub requests: usize,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(mut latencies: Vec<Duration>) -> Self {
        latencies.sort_unstable();
        let ms = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        Self {
            requests: latencies.len(),
            p99_ms: ms(percentile(&latencies, 99.0)),
            max_ms: ms(latencies.last().copied()),
        }
    }
}

/// Per API key (by Kafka's name), the latencies of the requests answered within `steady` (the
/// steady forwarding before the cut) and after `restored`, APIs in key order (those answered
/// only outside both windows left out).
pub fn latency_by_api(
    answered: &[Answered],
    steady: std::ops::Range<Instant>,
    restored: Instant,
) -> Vec<ApiLatency> {
    let mut by_key: BTreeMap<i16, (Vec<Duration>, Vec<Duration>)> = BTreeMap::new();
    for a in answered {
        let (before, after) = by_key.entry(a.api_key).or_default();
        if steady.contains(&a.at) {
            before.push(a.latency);
        } else if a.at >= restored {
            after.push(a.latency);
        }
    }
    by_key
        .into_iter()
        .filter(|(_, (before, after))| !before.is_empty() || !after.is_empty())
        .map(|(key, (before, after))| ApiLatency {
            api: tern_upstream::kafka_api_name(key),
            before: Latency::of(before),
            after: Latency::of(after),
        })
        .collect()
}

/// The gateways' CPU and memory at the end of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    /// CPU seconds (user + system) of one gateway over the whole run.
    pub cpu_median_s: f64,
    pub cpu_max_s: f64,
    /// The median's share of one core over the run.
    pub cpu_median_core: f64,
    /// Resident set at the end (VmRSS) and its peak over the run (VmHWM), KiB.
    pub rss_median_kib: f64,
    pub rss_max_kib: u64,
    pub rss_peak_median_kib: f64,
    pub rss_peak_max_kib: u64,
}

impl Usage {
    /// From (CPU seconds, RSS KiB, peak RSS KiB) per gateway over `elapsed`.
    pub fn of(usages: &[(f64, u64, u64)], elapsed: Duration) -> Self {
        let cpu_median_s = median(usages.iter().map(|u| u.0)).unwrap_or(0.0);
        Self {
            cpu_median_s,
            cpu_max_s: usages.iter().map(|u| u.0).fold(0.0, f64::max),
            cpu_median_core: cpu_median_s / elapsed.as_secs_f64().max(1e-9),
            rss_median_kib: median(usages.iter().map(|u| u.1 as f64)).unwrap_or(0.0),
            rss_max_kib: usages.iter().map(|u| u.1).max().unwrap_or(0),
            rss_peak_median_kib: median(usages.iter().map(|u| u.2 as f64)).unwrap_or(0.0),
            rss_peak_max_kib: usages.iter().map(|u| u.2).max().unwrap_or(0),
        }
    }
}

impl fmt::Display for FleetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.command)?;
        writeln!(
            f,
            "fleet of {} tern serve children, one QoS 1 reading per {} ms each, reconnect_max {} s, a regional \
             outage of {:.0} s (every link cut at once, then returned at once)",
            self.gateways, self.sensor_period_ms, self.reconnect_max_s, self.outage_s
        )?;
        for run in &self.runs {
            run.fmt(f)?;
        }
        writeln!(
            f,
            "(drained: from the return until the gateway's /metrics showed nothing failing and nothing behind or \
             nothing older than 2 s; \
             connections: new TCP connections the proxy opened to the brokers, per second at the peak of any \
             one-second window, before the outage from the first gateway's start; latency: from a request passing \
             the proxy to its response, by correlation id, steady: the 10 s of forwarding before the cut, after: \
             from the return to the end; \
             CPU: seconds of one gateway over the run, and the median as a share of one core; RSS: at the end, \
             and the peak over the run; upstream: read back with kcat, shared mode read_committed)"
        )
    }
}

impl fmt::Display for FleetRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\nspread {} (reconnect_jitter = {}), topics {}*: outage {:.1} s, {} records behind at the return",
            if self.spread { "on" } else { "off" },
            self.spread,
            self.prefix,
            self.outage_s,
            self.behind_at_return
        )?;
        for d in &self.drained {
            writeln!(
                f,
                "  drained after the return, {} ({} gateways): first {:.1} s, median {:.1} s, last {:.1} s",
                d.mode, d.gateways, d.first_s, d.median_s, d.last_s
            )?;
        }
        let c = self.connections;
        writeln!(
            f,
            "  new broker connections: before the outage {} (peak {}/s); after the return {} (peak {}/s)",
            c.before, c.before_peak_per_s, c.after, c.after_peak_per_s
        )?;
        writeln!(
            f,
            "  {:<20} {:>9} {:>10} {:>10} {:>9} {:>10} {:>10}",
            "request latency", "steady", "p99 ms", "max ms", "after", "p99 ms", "max ms"
        )?;
        for api in &self.latency {
            writeln!(
                f,
                "  {:<20} {:>9} {:>10.1} {:>10.1} {:>9} {:>10.1} {:>10.1}",
                api.api,
                api.before.requests,
                api.before.p99_ms,
                api.before.max_ms,
                api.after.requests,
                api.after.p99_ms,
                api.after.max_ms
            )?;
        }
        writeln!(
            f,
            "  Produce throttle: max {} ms, {} responses throttled",
            self.produce_throttle_max_ms, self.produce_throttled
        )?;
        let u = self.usage;
        writeln!(
            f,
            "  gateway CPU median {:.1} s, max {:.1} s over {:.0} s (median {:.1} % of a core); RSS median {:.1} MiB, \
             max {:.1} MiB (peak median {:.1} MiB, max {:.1} MiB)",
            u.cpu_median_s,
            u.cpu_max_s,
            self.elapsed_s,
            u.cpu_median_core * 100.0,
            u.rss_median_kib / 1024.0,
            u.rss_max_kib as f64 / 1024.0,
            u.rss_peak_median_kib / 1024.0,
            u.rss_peak_max_kib as f64 / 1024.0
        )?;
        let k = self.check;
        writeln!(
            f,
            "  upstream: {} acknowledged readings, {} records read back; {} twice, {} out of order, {} \
             acknowledged missing: {}",
            k.acked,
            k.upstream,
            k.duplicates,
            k.out_of_order,
            k.missing,
            match self.gateways_failing_check.is_empty() {
                true => "every acknowledged reading upstream once, in order".to_owned(),
                false => format!("FAILED for {}", self.gateways_failing_check.join(", ")),
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_per_second_is_the_fullest_one_second_window() {
        let zero = Instant::now();
        let at = |ms: u64| zero + Duration::from_millis(ms);
        let times = [
            at(0),
            at(100),
            at(900),
            at(999),
            at(1000),
            at(1500),
            at(3000),
        ];
        // 100..999 and 900..1500 hold four each; 0..999 holds four too.
        assert_eq!(peak_per_second(&times), 4);
        assert_eq!(peak_per_second(&[]), 0);
        assert_eq!(peak_per_second(&[at(5)]), 1);
        let split = Connections::of(&times, at(950), at(1000));
        assert_eq!((split.before, split.after), (3, 3));
        assert_eq!((split.before_peak_per_s, split.after_peak_per_s), (3, 2));
    }

    #[test]
    fn latency_is_split_around_the_outage_per_api() {
        let zero = Instant::now();
        let answered = |ms: u64, api_key: i16, latency_ms: u64| Answered {
            at: zero + Duration::from_millis(ms),
            api_key,
            latency: Duration::from_millis(latency_ms),
            throttle_ms: None,
        };
        let all = [
            answered(10, 0, 5),
            answered(20, 0, 7),
            answered(500, 0, 900),
            answered(2000, 0, 40),
            answered(2100, 3, 2),
            answered(5, 19, 900),
        ];
        let cut = zero + Duration::from_millis(100);
        let restored = zero + Duration::from_millis(1000);
        let apis = latency_by_api(&all, zero + Duration::from_millis(15)..cut, restored);
        assert_eq!(apis.len(), 2);
        assert_eq!(apis[0].api, "Produce");
        // The answer before the steady window and the one during the outage count in neither.
        assert_eq!((apis[0].before.requests, apis[0].before.max_ms), (1, 7.0));
        assert_eq!((apis[0].after.requests, apis[0].after.max_ms), (1, 40.0));
        assert_eq!(apis[1].api, "Metadata");
        assert_eq!(apis[1].before.requests, 0);
        let drained = Drained::of("mirror", vec![3.0, 1.0, 2.0, 10.0]).expect("some");
        assert_eq!(
            (drained.first_s, drained.median_s, drained.last_s),
            (1.0, 2.5, 10.0)
        );
        assert_eq!(Drained::of("shared", Vec::new()), None);
    }
}
