//! The wear budget's commit controller (`[log.flush.wear]`): it measures the rate at which
//! appends arrive (bytes a second, over every partition of the log, the mean of the last
//! [`RATE_BUCKETS`] one-second buckets, so a burst is forgotten within seconds) and chooses the commit
//! window of a trickle so that the projected device writes stay within what the card endures
//! for the lifetime wanted, and the window within the longest acceptable acknowledgement delay.
//!
//! The projection (measured on ext4, `docs/log-format.md` "Wear at sensor rates"): once a
//! segment's blocks are written (recycled, or zeroed ahead by `commit.rs`), a commit costs the
//! device its data plus one rewritten 4 KiB page, and the file system adds a few KB a second of
//! its own (the periodic journal commit of the inode's times). So with `n` partitions
//! committing, data arriving at `r` bytes/s and a budget of `b` bytes/s, a window of
//! `n × 4096 / (b − r − fixed)` keeps within the budget. When the data alone exceeds the
//! budget no window can meet it and the controller stops trading latency for nothing: it
//! answers the configured `flush.min_delay` (throughput first; `min_bytes` keeps such commits
//! large).
//!
//! A closed-loop producer (`pace.rs`) gets no window at all: its commits cost a page each, so
//! they are paid from a credit that fills at the budget's rate up to `closed_loop_burst` of it
//! and that every commit spends (its data and a page), never below zero (a flood, data faster
//! than any budget, leaves no debt, as its rate is forgotten within seconds). A trickle's
//! commits spend about what fills it; once a closed-loop producer has spent the credit, its
//! commits get the window of a trickle again until it fills. Over any span, device writes stay
//! within the budget plus one burst, but for data that arrives faster than the budget.
//!
//! Pure bookkeeping under one mutex, on tokio's clock (the unit tests pause it); it never does
//! I/O and never blocks.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::config::{FlushConfig, WearConfig};

/// Device bytes one commit costs beyond its data: the partly filled page written again.
pub const PAGE_BYTES: f64 = 4096.0;
/// Device bytes a second the file system writes on its own while a segment is appended to:
/// ext4's journal commit of the inode's modification time every 5 s (about four blocks).
pub const FIXED_BYTES_PER_SEC: f64 = 16384.0 / 5.0;
/// The arrival rate is counted in buckets of this length.
const BUCKET: Duration = Duration::from_secs(1);
/// The arrival rate is the mean of this many of the latest buckets: steady enough for a
/// trickle's jitter, and a flood that stopped no longer counts after as many seconds (an
/// exponential average of the same memory kept the window of a trickle at `min_delay` for
/// 25 s after a flood of 100 MB/s).
pub const RATE_BUCKETS: usize = 3;

/// What the controller decided last, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WearStatus {
    /// Device bytes a second the budget allows; 0 without a budget.
    pub budget_bytes_per_sec: f64,
    /// Measured arrival rate of appended bytes.
    pub arrival_bytes_per_sec: f64,
    /// The commit window a trickle gets now.
    pub window: Duration,
    /// Projected device bytes a second at that window.
    pub projected_bytes_per_sec: f64,
    /// Device bytes closed-loop producers may still spend at once (the saved credit).
    pub credit_bytes: f64,
    /// Commits that got no window because their producer was closed-loop.
    pub closed_loop_commits: u64,
}

#[derive(Debug)]
struct State {
    since: Instant,
    bytes: u64,
    /// Bytes a second of the latest closed buckets, newest last.
    buckets: VecDeque<f64>,
    rate: f64,
    /// Partitions that committed in the current bucket, and how many did in the last one.
    active: HashSet<u64>,
    partitions: usize,
    window: Duration,
    /// Device bytes saved up for closed-loop commits, and when it was last filled.
    credit: f64,
    filled: Instant,
    closed_loop_commits: u64,
}

/// The log's one controller, shared by every partition's writer.
#[derive(Debug)]
pub struct WearController {
    /// Device bytes a second allowed; `None` when the budget is off.
    budget: Option<f64>,
    min: Duration,
    max: Duration,
    /// Most credit saved: `closed_loop_burst` of the budget.
    credit_cap: f64,
    state: Mutex<State>,
}

impl WearController {
    pub fn new(flush: &FlushConfig) -> Self {
        let min = flush.min_delay.0.min(flush.max_delay.0);
        let budget = flush.wear.enabled.then(|| flush.wear.bytes_per_sec());
        let max = flush.wear.max_ack_delay.0.max(min);
        let credit_cap = budget.unwrap_or(0.0) * flush.wear.closed_loop_burst.0.as_secs_f64();
        let mut this = Self {
            budget,
            min,
            max,
            credit_cap,
            state: Mutex::new(State {
                credit: credit_cap,
                filled: Instant::now(),
                closed_loop_commits: 0,
                since: Instant::now(),
                bytes: 0,
                buckets: VecDeque::with_capacity(RATE_BUCKETS),
                rate: 0.0,
                active: HashSet::new(),
                partitions: 1,
                window: min,
            }),
        };
        let window = this.choose(0.0, 1);
        this.state
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .window = window;
        this
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Partition `partition` is committing `bytes` of appends.
    pub fn committed(&self, partition: u64, bytes: u64) {
        if self.budget.is_none() {
            return;
        }
        let mut st = self.lock();
        self.roll(&mut st);
        st.bytes += bytes;
        st.active.insert(partition);
        self.fill(&mut st);
        // Never below zero: a flood (data faster than any budget) leaves no debt, as its rate
        // is forgotten within seconds; what a closed-loop producer may spend is earned anew.
        st.credit = (st.credit - (bytes as f64 + PAGE_BYTES)).max(0.0);
    }

    /// The window a commit opening now gets, or `None` without a budget and a closed-loop
    /// producer (the configured `min_delay` then applies). A closed-loop producer's commit
    /// gets none (`Some(ZERO)`) while the credit lasts, and always without a budget.
    pub fn window(&self, closed_loop: bool) -> Option<Duration> {
        let Some(_) = self.budget else {
            return closed_loop.then(|| {
                self.lock().closed_loop_commits += 1;
                Duration::ZERO
            });
        };
        let mut st = self.lock();
        self.roll(&mut st);
        self.fill(&mut st);
        // A page's worth at least: what such a commit costs beyond its data.
        if closed_loop && st.credit >= PAGE_BYTES {
            st.closed_loop_commits += 1;
            return Some(Duration::ZERO);
        }
        Some(st.window)
    }

    /// Adds the credit earned since it was last filled, up to the cap.
    fn fill(&self, st: &mut State) {
        let now = Instant::now();
        let earned =
            now.saturating_duration_since(st.filled).as_secs_f64() * self.budget.unwrap_or(0.0);
        st.credit = (st.credit + earned).min(self.credit_cap);
        st.filled = now;
    }

    pub fn status(&self) -> WearStatus {
        let mut st = self.lock();
        self.roll(&mut st);
        self.fill(&mut st);
        WearStatus {
            budget_bytes_per_sec: self.budget.unwrap_or(0.0),
            arrival_bytes_per_sec: st.rate,
            window: st.window,
            projected_bytes_per_sec: projected(st.rate, st.partitions, st.window),
            credit_bytes: st.credit.max(0.0),
            closed_loop_commits: st.closed_loop_commits,
        }
    }

    /// Closes the buckets that ended (empty ones decay the rate) and chooses the window anew.
    fn roll(&self, st: &mut State) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(st.since);
        if elapsed < BUCKET {
            return;
        }
        // An interval of k buckets counts as k buckets of its mean rate (idle time is zeros).
        let newest = st.bytes as f64 / elapsed.as_secs_f64();
        let spanned = (elapsed.as_secs_f64() / BUCKET.as_secs_f64()) as usize;
        for _ in 0..spanned.clamp(1, RATE_BUCKETS) {
            if st.buckets.len() == RATE_BUCKETS {
                st.buckets.pop_front();
            }
            st.buckets.push_back(newest);
        }
        st.rate = st.buckets.iter().sum::<f64>() / st.buckets.len().max(1) as f64;
        st.partitions = st.active.len().max(1);
        st.active.clear();
        st.bytes = 0;
        st.since = now;
        st.window = self.choose(st.rate, st.partitions);
    }

    /// The window for `partitions` partitions sharing data arriving at `rate` bytes/s.
    fn choose(&self, rate: f64, partitions: usize) -> Duration {
        let Some(budget) = self.budget else {
            return self.min;
        };
        let spare = budget - rate - FIXED_BYTES_PER_SEC;
        if spare <= 0.0 {
            return self.min;
        }
        let seconds = partitions as f64 * PAGE_BYTES / spare;
        Duration::from_secs_f64(seconds.min(self.max.as_secs_f64())).max(self.min)
    }
}

/// Device bytes a second: the data, a page per commit of each partition, the fixed part.
pub fn projected(rate: f64, partitions: usize, window: Duration) -> f64 {
    let commits = partitions as f64 / window.as_secs_f64().max(1e-3);
    rate + commits * PAGE_BYTES + FIXED_BYTES_PER_SEC
}

/// Seconds in a year of 365.25 days (humantime's `year`, as in `lifetime = "20years"`).
pub const SECONDS_PER_YEAR: f64 = 31_557_600.0;

/// The card's endurance, `card_size × write_cycles` (even wear), is the one fact behind both
/// the budget and the projected lifetime: every figure of the card's life comes from here.
impl WearConfig {
    /// Device bytes the card takes before it wears out.
    pub fn endurance_bytes(&self) -> f64 {
        self.card_size.0 as f64 * f64::from(self.write_cycles)
    }

    /// Device bytes a second the card can take for `lifetime`.
    pub fn bytes_per_sec(&self) -> f64 {
        self.endurance_bytes() / self.lifetime.0.as_secs_f64().max(1.0)
    }

    /// Years the card lasts at `bytes_per_sec` device writes; infinite at rest. The status
    /// page and `/metrics` both show this figure.
    pub fn lifetime_years(&self, bytes_per_sec: f64) -> f64 {
        if bytes_per_sec <= 0.0 {
            return f64::INFINITY;
        }
        self.endurance_bytes() / bytes_per_sec / SECONDS_PER_YEAR
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::HumanDuration;

    fn controller(enabled: bool) -> WearController {
        let mut flush = FlushConfig::default();
        flush.wear.enabled = enabled;
        WearController::new(&flush)
    }

    fn controller_up_to(max: Duration) -> WearController {
        let mut flush = FlushConfig::default();
        flush.wear.max_ack_delay = HumanDuration(max);
        WearController::new(&flush)
    }

    /// `msgs` appends of `bytes` a second for `seconds`, one partition, spread evenly.
    async fn feed(c: &WearController, msgs: u64, bytes: u64, seconds: u64) {
        let step = Duration::from_secs(1) / u32::try_from(msgs).unwrap_or(1);
        for _ in 0..msgs * seconds {
            c.committed(0, bytes);
            tokio::time::advance(step).await;
        }
    }

    #[test]
    fn the_default_budget_is_a_32_gb_card_for_20_years() {
        let wear = WearConfig::default();
        // 32e9 × 1000 / (20 × 365.25 × 86400 s) ≈ 50.7 kB/s.
        assert!((wear.bytes_per_sec() - 50_700.0).abs() < 100.0);
    }

    #[test]
    fn the_lifetime_at_the_budget_is_the_lifetime_wanted() {
        let wear = WearConfig::default();
        let years = wear.lifetime_years(wear.bytes_per_sec());
        assert!((years - 20.0).abs() < 1e-9, "{years}");
        // 50.7 kB/s wears out 32 GB × 1000 cycles in 20 years.
        assert!((wear.lifetime_years(50_700.0) - 20.0).abs() < 0.01);
        assert!(wear.lifetime_years(0.0).is_infinite());
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_gets_the_window_that_meets_the_budget_within_the_delay() {
        let c = controller(true);
        // 100 msg/s of 150 B stored: 15 kB/s.
        feed(&c, 100, 150, 20).await;
        let status = c.status();
        assert!(
            (status.arrival_bytes_per_sec - 15_000.0).abs() < 500.0,
            "{status:?}"
        );
        let budget = status.budget_bytes_per_sec;
        let want = PAGE_BYTES / (budget - 15_000.0 - FIXED_BYTES_PER_SEC);
        assert!(
            (status.window.as_secs_f64() - want).abs() < 0.005,
            "{status:?}, want {want}"
        );
        assert!(
            status.projected_bytes_per_sec <= budget * 1.01,
            "{status:?}"
        );
        // 10 msg/s leaves more room: a shorter window.
        feed(&c, 10, 170, 20).await;
        let slow = c.window(false).expect("a budget");
        assert!(slow < status.window, "{slow:?} !< {:?}", status.window);
        assert!(c.status().projected_bytes_per_sec <= budget * 1.001);
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_never_passes_the_acceptable_delay_nor_goes_below_min_delay() {
        let c = controller(true);
        // 150 msg/s of 200 B: the budget wants a longer window than 140 ms allows.
        feed(&c, 150, 200, 20).await;
        assert_eq!(c.window(false), Some(Duration::from_millis(140)));
        // Nothing arrives: the rate decays, the window shrinks, never below min_delay.
        tokio::time::advance(Duration::from_secs(60)).await;
        let idle = c.window(false).expect("a budget");
        assert!(idle >= Duration::from_millis(10) && idle < Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_that_stopped_is_forgotten_within_seconds() {
        let c = controller(true);
        // 100 MB/s for 10 s (an aging flood, a backlog drained), then a trickle.
        for _ in 0..1000 {
            c.committed(0, 1_000_000);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(
            c.window(false),
            Some(Duration::from_millis(10)),
            "over budget"
        );
        feed(&c, 100, 150, 1).await;
        assert_eq!(
            c.window(false),
            Some(Duration::from_millis(10)),
            "still remembered"
        );
        feed(&c, 100, 150, RATE_BUCKETS as u64).await;
        let status = c.status();
        assert!(
            (status.arrival_bytes_per_sec - 15_000.0).abs() < 500.0,
            "{status:?}"
        );
        assert!(status.window > Duration::from_millis(100), "{status:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_over_the_budget_gets_min_delay_and_partitions_share_the_budget() {
        let c = controller(true);
        feed(&c, 1000, 100, 10).await;
        assert_eq!(
            c.window(false),
            Some(Duration::from_millis(10)),
            "over budget"
        );
        let two = controller_up_to(Duration::from_secs(1));
        for _ in 0..200 {
            two.committed(1, 50);
            two.committed(2, 50);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        let w2 = two.window(false).expect("on");
        let one = controller_up_to(Duration::from_secs(1));
        feed(&one, 100, 100, 2).await;
        let w1 = one.window(false).expect("on");
        assert!(
            (w2.as_secs_f64() / w1.as_secs_f64() - 2.0).abs() < 0.1,
            "{w2:?} vs {w1:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_loop_producer_gets_no_window_while_the_credit_lasts() {
        let mut flush = FlushConfig::default();
        flush.wear.closed_loop_burst = HumanDuration(Duration::from_secs(10));
        let c = WearController::new(&flush);
        let budget = c.status().budget_bytes_per_sec;
        assert!(
            (c.status().credit_bytes - 10.0 * budget).abs() < 1.0,
            "starts full"
        );
        // A closed-loop producer commits 100 B every 2 ms: 2 MB/s of device writes, 40x the
        // budget, until the 10 s of credit is spent (after about a quarter of a second).
        let mut unwindowed: u32 = 0;
        while c.window(true).expect("a budget").is_zero() {
            unwindowed += 1;
            c.committed(0, 100);
            tokio::time::advance(Duration::from_millis(2)).await;
        }
        // Each commit costs its data and a page, and 2 ms earn 2 ms of the budget back.
        let expected = 10.0 * budget / (100.0 + PAGE_BYTES - 0.002 * budget);
        assert!(
            (f64::from(unwindowed) - expected).abs() <= 2.0,
            "{unwindowed} unwindowed, expected {expected:.0}"
        );
        assert_eq!(c.status().closed_loop_commits, u64::from(unwindowed));
        // Spent: its commits are windowed like a trickle's until the credit fills again.
        assert!(!c.window(true).expect("a budget").is_zero());
        assert!(!c.window(false).expect("a budget").is_zero(), "a trickle");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(c.window(true), Some(Duration::ZERO), "filled again");
        // A flood of 1 GB leaves no debt: a second of the budget is earned back in a second.
        c.committed(0, 1_000_000_000);
        assert!(!c.window(true).expect("a budget").is_zero(), "spent");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            c.window(true),
            Some(Duration::ZERO),
            "no debt after a flood"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_credit_or_without_a_budget_a_closed_loop_producer_is_windowed_or_free() {
        let mut flush = FlushConfig::default();
        flush.wear.closed_loop_burst = HumanDuration(Duration::ZERO);
        let none = WearController::new(&flush);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            !none.window(true).expect("a budget").is_zero(),
            "no burst allowed"
        );
        flush.wear.enabled = false;
        let off = WearController::new(&flush);
        assert_eq!(off.window(true), Some(Duration::ZERO));
        assert_eq!(off.window(false), None, "min_delay applies");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_budget_the_configured_window_applies() {
        let c = controller(false);
        feed(&c, 100, 170, 5).await;
        assert_eq!(c.window(false), None);
        let mut flush = FlushConfig::default();
        flush.wear.max_ack_delay = HumanDuration(Duration::from_millis(1));
        // An acceptable delay below min_delay leaves min_delay.
        assert_eq!(
            WearController::new(&flush).window(false),
            Some(Duration::from_millis(10))
        );
    }
}
