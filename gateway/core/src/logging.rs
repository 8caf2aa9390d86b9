//! Process-wide diagnostics: installs the `tracing` subscriber that writes to stderr, with a
//! handle that changes its level later (SIGHUP).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, fmt, reload};

/// Changes the level of the installed subscriber.
#[derive(Debug, Clone)]
pub struct LevelHandle {
    handle: Option<reload::Handle<EnvFilter, Registry>>,
    from_env: bool,
}

impl LevelHandle {
    /// Applies new directives; an error says why they were not applied (`RUST_LOG` is set and
    /// wins, no subscriber of ours is installed, or the directives do not parse).
    pub fn set(&self, directives: &str) -> Result<(), String> {
        if self.from_env {
            return Err("RUST_LOG is set and wins over [logging] level".to_owned());
        }
        let Some(handle) = &self.handle else {
            return Err("another diagnostics subscriber is installed".to_owned());
        };
        let filter = EnvFilter::try_new(directives).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    }
}

/// Installs the stderr subscriber with `directives` (such as `"info"` or `"warn,tern_upstream=debug"`)
/// unless `RUST_LOG` is set, which wins.
pub fn init(directives: &str) -> LevelHandle {
    let from_env = EnvFilter::try_from_default_env().ok();
    let is_env = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(directives));
    let (filter, handle) = reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt::layer().with_writer(std::io::stderr).with_ansi(false))
        .try_init();
    // A second call (tests that run `serve` twice in one process) keeps the first subscriber.
    LevelHandle {
        handle: installed.is_ok().then_some(handle),
        from_env: is_env,
    }
}

/// A log line that a flood of events would repeat (a refused publish per message): at most one
/// per interval, saying how many were left out since the last one. Shared by every caller of
/// one call site (a `static`).
#[derive(Debug)]
pub struct Throttle {
    every_ms: u64,
    /// Milliseconds since [`Throttle::origin`] of the last line, plus one (0: never).
    last: std::sync::atomic::AtomicU64,
    skipped: std::sync::atomic::AtomicU64,
}

impl Throttle {
    pub const fn new(every: std::time::Duration) -> Self {
        Self {
            every_ms: every.as_millis() as u64,
            last: std::sync::atomic::AtomicU64::new(0),
            skipped: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `Some(left out since the last line)` when a line is due now, else `None` (counted).
    pub fn due(&self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        let now = u64::try_from(origin().elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= self.every_ms;
        if due
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.skipped.swap(0, Ordering::Relaxed));
        }
        self.skipped.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// The process's reference instant for [`Throttle`].
fn origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

#[cfg(test)]
mod tests {
    use super::Throttle;
    use std::time::Duration;

    #[test]
    fn a_throttle_lets_one_line_through_per_interval_and_counts_the_rest() {
        let throttle = Throttle::new(Duration::from_secs(3_600));
        assert_eq!(throttle.due(), Some(0), "the first line is due");
        assert_eq!(throttle.due(), None);
        assert_eq!(throttle.due(), None);
        let every = Throttle::new(Duration::ZERO);
        assert_eq!(every.due(), Some(0));
        assert_eq!(every.due(), Some(0), "no interval: every line");
        assert_eq!(
            throttle.skipped.load(std::sync::atomic::Ordering::Relaxed),
            2
        );
    }
}
