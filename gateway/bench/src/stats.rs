//! Small statistics shared by the three benches: the nearest-rank percentile of sorted samples
//! (one function, percentiles on the 0–100 scale), the median of figures and of whole runs, and
//! ratios that treat "nothing measured" as zero.
//!
//! Pure arithmetic on numbers the workloads collected; it never measures, sleeps or does I/O.

use std::time::Duration;

/// The `p`-th percentile (0..=100) of `sorted` (ascending) by the nearest-rank method; `None`
/// if there are no samples.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

/// The median of `values` (the mean of the middle two for an even count); `None` if empty.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => sorted.get(mid).copied(),
        _ => Some((sorted.get(mid - 1)? + sorted.get(mid)?) / 2.0),
    }
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
        samples.sort_unstable();
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

/// CPU seconds this process has used so far, user plus system, all threads
/// (`getrusage(RUSAGE_SELF)`, microsecond resolution).
pub fn process_cpu_secs() -> f64 {
    // SAFETY: an all-zero rusage is a valid value, and getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer is to a live, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        let mut samples: Vec<Duration> = v.iter().map(|&n| Duration::from_millis(n)).collect();
        samples.sort_unstable();
        samples
    }

    #[test]
    fn percentile_uses_nearest_rank() {
        let samples = ms(&[5, 1, 4, 2, 3, 6, 7, 8, 9, 10]);
        let at = |p| percentile(&samples, p).map(|d: Duration| d.as_millis());
        assert_eq!(
            [at(50.0), at(99.0), at(0.0), at(100.0)],
            [Some(5), Some(10), Some(1), Some(10)]
        );
    }

    #[test]
    fn percentile_of_many_samples_picks_the_99th() {
        let samples = ms(&(1..=1000).rev().collect::<Vec<_>>());
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_millis(990)));
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(500)));
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
    }

    #[test]
    fn percentile_of_nothing_is_none() {
        assert_eq!(percentile::<f64>(&[], 50.0), None);
        assert_eq!(
            Latency::of(&mut []),
            Latency {
                p50_us: 0.0,
                p99_us: 0.0
            }
        );
    }

    #[test]
    fn latency_sorts_and_is_in_microseconds() {
        let mut samples = vec![
            Duration::from_micros(900),
            Duration::from_micros(250),
            Duration::from_micros(250),
        ];
        assert_eq!(
            Latency::of(&mut samples),
            Latency {
                p50_us: 250.0,
                p99_us: 900.0
            }
        );
    }

    #[test]
    fn median_averages_the_middle_two() {
        assert_eq!(median([3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([]), None);
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
