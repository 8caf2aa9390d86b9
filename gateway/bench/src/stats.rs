//! Small statistics for the bench: percentiles of latency samples and the median of repeated runs.
//!
//! Pure arithmetic on numbers the workloads collected; it never measures, sleeps or does I/O.

use std::time::Duration;

/// The `p`-th percentile (0..=100) of `samples` by the nearest-rank method; `None` if empty.
pub fn percentile(samples: &mut [Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let rank = (p / 100.0 * samples.len() as f64).ceil() as usize;
    let index = rank.clamp(1, samples.len()) - 1;
    samples.get(index).copied()
}

/// Latency summary of one workload, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
}

impl Latency {
    /// p50 and p99 of `samples` (sorts them); zeros when there are none.
    pub fn of(samples: &mut [Duration]) -> Self {
        let micros = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e6);
        Self {
            p50_us: micros(percentile(samples, 50.0)),
            p99_us: micros(percentile(samples, 99.0)),
        }
    }
}

/// Of several runs, the one whose `key` is the median (the lower middle for an even count), so
/// every figure quoted comes from one consistent run.
pub fn median_run<T, F: Fn(&T) -> f64>(runs: Vec<T>, key: F) -> Option<T> {
    let mut runs = runs;
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = runs.len().saturating_sub(1) / 2;
    (!runs.is_empty()).then(|| runs.swap_remove(mid))
}

/// `a / b`, or 0 when `b` is zero (a ratio of nothing measured).
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 { 0.0 } else { a / b }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&n| Duration::from_millis(n)).collect()
    }

    #[test]
    fn percentile_uses_nearest_rank() {
        let mut samples = ms(&[5, 1, 4, 2, 3, 6, 7, 8, 9, 10]);
        assert_eq!(
            percentile(&mut samples, 50.0),
            Some(Duration::from_millis(5))
        );
        assert_eq!(
            percentile(&mut samples, 99.0),
            Some(Duration::from_millis(10))
        );
        assert_eq!(
            percentile(&mut samples, 0.0),
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            percentile(&mut samples, 100.0),
            Some(Duration::from_millis(10))
        );
    }

    #[test]
    fn percentile_of_many_samples_picks_the_99th() {
        let mut samples = ms(&(1..=1000).rev().collect::<Vec<_>>());
        assert_eq!(
            percentile(&mut samples, 99.0),
            Some(Duration::from_millis(990))
        );
        assert_eq!(
            percentile(&mut samples, 50.0),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn percentile_of_nothing_is_none() {
        assert_eq!(percentile(&mut [], 50.0), None);
        assert_eq!(
            Latency::of(&mut []),
            Latency {
                p50_us: 0.0,
                p99_us: 0.0
            }
        );
    }

    #[test]
    fn latency_is_in_microseconds() {
        let mut samples = vec![Duration::from_micros(250); 3];
        assert_eq!(
            Latency::of(&mut samples),
            Latency {
                p50_us: 250.0,
                p99_us: 250.0
            }
        );
    }

    #[test]
    fn median_run_keeps_the_whole_middle_run() {
        let runs = vec![(30.0, "c"), (10.0, "a"), (20.0, "b")];
        assert_eq!(median_run(runs, |r| r.0), Some((20.0, "b")));
        let even = vec![(2.0, "y"), (1.0, "x")];
        assert_eq!(median_run(even, |r| r.0), Some((1.0, "x")));
        assert_eq!(median_run(Vec::<(f64, &str)>::new(), |r| r.0), None);
    }

    #[test]
    fn ratio_of_zero_is_zero() {
        assert_eq!(ratio(3.0, 0.0), 0.0);
        assert_eq!(ratio(3.0, 2.0), 1.5);
    }
}
