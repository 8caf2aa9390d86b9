//! The `bandwidth` cap of one upstream, shared by priority class: a scheduler held by its Kafka
//! connection (`kafka/`), so all of its forwarders share it, charged with the bytes of every
//! produce request before it is sent.
//!
//! Each edge topic belongs to a [`Class`] (`[upstream.priorities]`). The cap is shared by
//! weight among the classes that want to send (weights 16, 4 and 1 for `high`, `normal` and
//! `low`): when all three have a backlog `high` gets 16/21 of it, `low` 1/21, so a higher class
//! is never starved by a lower one's backlog and a lower one still moves; a class alone gets all
//! of it (work-conserving). Two balances decide when a request goes: its class's, which grows at
//! the class's share of the cap, and the link's, which grows at the cap; a request goes as soon
//! as both are positive and is charged to both (they may go negative, so a large request is
//! never starved by small ones). Each holds at most one second's worth ([`BURST`]), and the
//! forwarders read batches no larger than that, so the link never sees more than the cap plus
//! one burst in any window. A waiting request looks again at least every [`LOOK_AGAIN`], so a
//! class going idle hands its share to the others within that. It only delays callers; it never
//! drops, splits or reorders anything, and it never sleeps while holding its lock.
//!
//! The cap itself may follow a [`ScheduleWindow`] list (`[[upstream.schedule]]`): each look
//! asks the [`DayClock`] for the minute of the day, and the first window holding it sets the
//! cap (`0`: unlimited while it lasts); outside every window the cap is `bandwidth`. At a change
//! the balances are grown at the old rate up to then and clipped to one burst of the new one, so
//! a lower cap applies from its first minute.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use tern_core::ByteSize;

/// How much unused allowance a balance keeps, in time at the capped rate.
pub const BURST: Duration = Duration::from_secs(1);
/// The longest a waiting request sleeps before it looks at the shares again.
pub const LOOK_AGAIN: Duration = Duration::from_millis(100);

/// A priority class of the bandwidth cap (`[upstream.priorities]`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    High,
    #[default]
    Normal,
    Low,
}

impl Class {
    pub const ALL: [Class; 3] = [Class::High, Class::Normal, Class::Low];

    /// The class's weight in the share of the cap.
    pub fn weight(self) -> u32 {
        match self {
            Self::High => 16,
            Self::Normal => 4,
            Self::Low => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::High => 0,
            Self::Normal => 1,
            Self::Low => 2,
        }
    }
}

/// One `[[upstream.schedule]]` window: from `from` until `to` (local time, `HH:MM`; a window
/// whose `to` is not after its `from` runs over midnight) the cap is `bandwidth` (`0`:
/// unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleWindow {
    pub from: TimeOfDay,
    pub to: TimeOfDay,
    pub bandwidth: ByteSize,
}

impl ScheduleWindow {
    /// Whether minute `minute` of the day (0..1440) falls in the window.
    pub fn holds(&self, minute: u32) -> bool {
        let (from, to) = (self.from.0, self.to.0);
        if from < to {
            (from..to).contains(&minute)
        } else {
            minute >= from || minute < to
        }
    }
}

/// A time of day, `HH:MM` (00:00 to 23:59), as minutes since midnight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimeOfDay(pub u32);

impl std::str::FromStr for TimeOfDay {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{text}` is not a time of day HH:MM (00:00 to 23:59)");
        let (hours, minutes) = text.split_once(':').ok_or_else(bad)?;
        let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
        if !two_digits(hours) || !two_digits(minutes) {
            return Err(bad());
        }
        let (hours, minutes): (u32, u32) = (
            hours.parse().map_err(|_| bad())?,
            minutes.parse().map_err(|_| bad())?,
        );
        if hours > 23 || minutes > 59 {
            return Err(bad());
        }
        Ok(Self(hours * 60 + minutes))
    }
}

impl std::fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02}:{:02}", self.0 / 60, self.0 % 60)
    }
}

impl Serialize for TimeOfDay {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TimeOfDay {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The minute of the day (0..1440) a schedule is looked up at: the gateway's local time in the
/// product ([`DayClock::local`]), a paused tokio clock in tests.
#[derive(Clone)]
pub struct DayClock(Arc<dyn Fn() -> u32 + Send + Sync>);

impl std::fmt::Debug for DayClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DayClock(minute {})", (self.0)())
    }
}

impl DayClock {
    pub fn new(minute: impl Fn() -> u32 + Send + Sync + 'static) -> Self {
        Self(Arc::new(minute))
    }

    /// The system's local time (`TZ`, else `/etc/localtime`), as `localtime_r` reads it.
    pub fn local() -> Self {
        Self::new(|| {
            // time_t is 64 bits on aarch64 and x86_64 but 32 on Debian's armhf.
            #[allow(clippy::useless_conversion)]
            let now: libc::time_t = tern_core::time::now_ms()
                .div_euclid(1000)
                .try_into()
                .unwrap_or(0);
            // SAFETY: a zeroed tm is a valid out-parameter; localtime_r writes only into it.
            let mut tm: libc::tm = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are valid for the call; localtime_r is thread-safe.
            let converted = unsafe { libc::localtime_r(&now, &mut tm) };
            if converted.is_null() {
                let seconds = now.rem_euclid(86_400);
                return u32::try_from(seconds / 60).unwrap_or(0);
            }
            u32::try_from(tm.tm_hour * 60 + tm.tm_min).unwrap_or(0)
        })
    }

    fn minute(&self) -> u32 {
        (self.0)() % 1440
    }
}

/// The shared cap; `bytes_per_sec == 0` with no schedule means unlimited (every call returns
/// at once).
#[derive(Debug)]
pub struct Bandwidth {
    shares: Option<Mutex<Shares>>,
    /// The cap outside every schedule window.
    bytes_per_sec: u64,
    schedule: Vec<ScheduleWindow>,
    clock: DayClock,
    /// Edge topic → class (`[upstream.priorities]`); other topics are `normal`.
    priorities: BTreeMap<String, Class>,
}

impl Bandwidth {
    /// A cap of `bytes_per_sec` outside the windows of `schedule`, looked up on `clock`.
    pub fn scheduled(
        bytes_per_sec: u64,
        schedule: Vec<ScheduleWindow>,
        clock: DayClock,
        priorities: BTreeMap<String, Class>,
    ) -> Self {
        let capped = bytes_per_sec > 0 || !schedule.is_empty();
        let mut bandwidth = Self {
            shares: None,
            bytes_per_sec,
            schedule,
            clock,
            priorities,
        };
        let first = bandwidth.rate_now();
        bandwidth.shares = capped.then(|| Mutex::new(Shares::new(first)));
        bandwidth
    }

    /// The cap now, bytes per second (`0`: unlimited).
    pub fn rate_now(&self) -> u64 {
        if self.schedule.is_empty() {
            return self.bytes_per_sec;
        }
        let minute = self.clock.minute();
        self.schedule
            .iter()
            .find(|w| w.holds(minute))
            .map_or(self.bytes_per_sec, |w| w.bandwidth.0)
    }

    /// The class of edge topic `topic`.
    pub fn class_of(&self, topic: &str) -> Class {
        self.priorities.get(topic).copied().unwrap_or_default()
    }

    /// The largest batch a forwarder should read: `max_batch_bytes`, or one burst if smaller.
    /// With a schedule, one burst of its lowest cap.
    pub fn batch_limit(&self, max_batch_bytes: u64) -> u64 {
        let rates =
            std::iter::once(self.bytes_per_sec).chain(self.schedule.iter().map(|w| w.bandwidth.0));
        rates
            .filter(|rate| *rate > 0)
            .fold(max_batch_bytes, u64::min)
    }

    /// Waits until `bytes` of `class` may go out under the cap, and charges them.
    pub async fn acquire(&self, class: Class, bytes: u64) {
        let Some(shares) = &self.shares else { return };
        // While it waits, the request makes its class active; dropped (or done), it does not.
        let mut waiting: Option<Waiting<'_>> = None;
        loop {
            let rate = self.rate_now();
            if rate == 0 {
                return;
            }
            let wait = {
                let mut locked = shares.lock().unwrap_or_else(|e| e.into_inner());
                let now = tokio::time::Instant::now().into_std();
                locked.set_rate(now, rate);
                let wait = locked.try_take(now, class, bytes);
                if wait.is_zero() {
                    return;
                }
                if waiting.is_none() {
                    locked.classes[class.index()].waiting += 1;
                    waiting = Some(Waiting { shares, class });
                }
                wait
            };
            tokio::time::sleep(wait.min(LOOK_AGAIN)).await;
        }
    }
}

#[cfg(test)]
impl Bandwidth {
    /// A cap of `bytes_per_sec` without a schedule.
    fn new(bytes_per_sec: u64, priorities: BTreeMap<String, Class>) -> Self {
        Self::scheduled(bytes_per_sec, Vec::new(), DayClock::local(), priorities)
    }

    /// Bytes charged to each class since start.
    fn charged(&self) -> [(Class, u64); 3] {
        let totals = self.shares.as_ref().map_or([0; 3], |shares| {
            let shares = shares.lock().unwrap_or_else(|e| e.into_inner());
            shares.classes.each_ref().map(|c| c.charged)
        });
        Class::ALL.map(|class| (class, totals[class.index()]))
    }
}

/// A request waiting in its class: counted there until dropped.
struct Waiting<'a> {
    shares: &'a Mutex<Shares>,
    class: Class,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut shares.classes[self.class.index()];
        state.waiting = state.waiting.saturating_sub(1);
    }
}

/// The balances of the link and of each class, in bytes.
#[derive(Debug)]
struct Shares {
    bytes_per_sec: f64,
    link: f64,
    classes: [ClassState; 3],
    updated: Option<Instant>,
}

#[derive(Debug, Default, Clone, Copy)]
struct ClassState {
    balance: f64,
    /// Requests of the class waiting now.
    waiting: u32,
    /// Bytes let through since start (the tests' account).
    charged: u64,
}

impl Shares {
    fn new(bytes_per_sec: u64) -> Self {
        let rate = bytes_per_sec.max(1) as f64;
        let full = rate * BURST.as_secs_f64();
        Self {
            bytes_per_sec: rate,
            link: full,
            classes: [ClassState {
                balance: full,
                ..ClassState::default()
            }; 3],
            updated: None,
        }
    }

    /// Moves to a cap of `bytes_per_sec` at `now`: the time before is earned at the old rate,
    /// and no balance keeps more than one burst of the new one.
    fn set_rate(&mut self, now: Instant, bytes_per_sec: u64) {
        let rate = bytes_per_sec.max(1) as f64;
        if rate == self.bytes_per_sec {
            return;
        }
        self.advance(now);
        tracing::info!(
            from = self.bytes_per_sec,
            to = rate,
            "upstream bandwidth cap changes (schedule)"
        );
        self.bytes_per_sec = rate;
        let full = rate * BURST.as_secs_f64();
        self.link = self.link.min(full);
        for state in &mut self.classes {
            state.balance = state.balance.min(full);
        }
    }

    /// Whether `class` wants to send: a request of it waits, or it still owes bytes (it sent
    /// more than its share earned so far).
    fn active(&self, class: Class) -> bool {
        let state = &self.classes[class.index()];
        state.waiting > 0 || state.balance < 0.0
    }

    /// Each class's rate: its weight's share among the active classes (an idle class as if it
    /// joined them).
    fn rates(&self) -> [f64; 3] {
        let active: u32 = Class::ALL
            .iter()
            .filter(|c| self.active(**c))
            .map(|c| c.weight())
            .sum();
        Class::ALL.map(|class| {
            let total = match self.active(class) {
                true => active,
                false => active + class.weight(),
            };
            self.bytes_per_sec * f64::from(class.weight()) / f64::from(total.max(1))
        })
    }

    /// Grows every balance by what the time since the last look earned, up to one burst.
    fn advance(&mut self, now: Instant) {
        let elapsed = self
            .updated
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        self.updated = Some(self.updated.map_or(now, |at| at.max(now)));
        let full = self.bytes_per_sec * BURST.as_secs_f64();
        let rates = self.rates();
        self.link = (self.link + self.bytes_per_sec * elapsed).min(full);
        for (state, rate) in self.classes.iter_mut().zip(rates) {
            state.balance = (state.balance + rate * elapsed).min(full);
        }
    }

    /// Charges `bytes` to `class` if both balances are positive (zero returned), else how long
    /// until they may be at the present rates.
    fn try_take(&mut self, now: Instant, class: Class, bytes: u64) -> Duration {
        self.advance(now);
        let rates = self.rates();
        let state = &mut self.classes[class.index()];
        if state.balance > 0.0 && self.link > 0.0 {
            state.balance -= bytes as f64;
            state.charged += bytes;
            self.link -= bytes as f64;
            return Duration::ZERO;
        }
        let owed = |balance: f64, rate: f64| {
            Duration::from_secs_f64((-balance).max(0.0) / rate.max(1.0)) + Duration::from_millis(1)
        };
        owed(state.balance, rates[class.index()]).max(owed(self.link, self.bytes_per_sec))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Runs `senders` (class, request size, requests; `None` = as many as it can) on one cap
    /// for `run`; returns the bytes each class was let through.
    async fn share_out(
        rate: u64,
        senders: &[(Class, u64, Option<u32>)],
        run: Duration,
    ) -> [(Class, u64); 3] {
        let cap = Arc::new(Bandwidth::new(rate, BTreeMap::new()));
        let mut tasks = tokio::task::JoinSet::new();
        for &(class, bytes, count) in senders {
            let cap = Arc::clone(&cap);
            tasks.spawn(async move {
                let mut sent = 0;
                while count.is_none_or(|c| sent < c) {
                    cap.acquire(class, bytes).await;
                    sent += 1;
                }
            });
        }
        tokio::time::sleep(run).await;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        cap.charged()
    }

    fn of(charged: [(Class, u64); 3], class: Class) -> u64 {
        charged
            .iter()
            .find(|(c, _)| *c == class)
            .map_or(0, |(_, bytes)| *bytes)
    }

    #[tokio::test(start_paused = true)]
    async fn a_class_alone_gets_the_whole_cap_and_one_burst() {
        let charged = share_out(1000, &[(Class::Low, 100, None)], Duration::from_secs(10)).await;
        // 10 s at 1,000 B/s plus the one-second burst, within one request.
        let low = of(charged, Class::Low);
        assert!((10_900..=11_100).contains(&low), "{low}");
    }

    #[tokio::test(start_paused = true)]
    async fn backlogged_classes_share_the_cap_by_weight_and_the_lowest_still_moves() {
        let senders = [
            (Class::High, 100, None),
            (Class::Normal, 100, None),
            (Class::Low, 100, None),
        ];
        let charged = share_out(2100, &senders, Duration::from_secs(60)).await;
        let (high, normal, low) = (
            of(charged, Class::High),
            of(charged, Class::Normal),
            of(charged, Class::Low),
        );
        let total = high + normal + low;
        // 60 s at 2,100 B/s, plus each class's starting burst at most.
        assert!(total <= 60 * 2100 + 3 * 2100 + 300, "{total}");
        // 16 : 4 : 1 of 126,000 B is 96,000 : 24,000 : 6,000, give or take the bursts.
        assert!((93_000..=100_000).contains(&high), "{charged:?}");
        assert!((22_000..=27_000).contains(&normal), "{charged:?}");
        assert!((5_000..=9_000).contains(&low), "{charged:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_higher_class_goes_first_behind_a_lower_backlog() {
        let cap = Arc::new(Bandwidth::new(1000, BTreeMap::new()));
        let backlog = {
            let cap = Arc::clone(&cap);
            tokio::spawn(async move {
                loop {
                    cap.acquire(Class::Low, 1000).await;
                }
            })
        };
        // The backlog has used its burst and owes a second's worth.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let asked = tokio::time::Instant::now();
        for _ in 0..5 {
            cap.acquire(Class::High, 100).await;
        }
        let waited = asked.elapsed();
        backlog.abort();
        // Five small requests behind 30 s of low-class backlog: the link's debt (at most one
        // request, 1 s) and then the high class's 16/17 of the cap, never the backlog's queue.
        assert!(waited <= Duration::from_millis(1_700), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_class_going_idle_hands_its_share_back_within_a_look() {
        // High sends 5 s' worth and stops; low, backlogged, then gets the whole cap again.
        let senders = [(Class::High, 500, Some(10)), (Class::Low, 500, None)];
        let charged = share_out(1000, &senders, Duration::from_secs(30)).await;
        let low = of(charged, Class::Low);
        // Of 31 s at 1,000 B/s (with the burst), high took 5,000 B: low gets about the rest.
        assert!(low >= 24_000, "{charged:?}");
        assert_eq!(of(charged, Class::High), 5_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_larger_than_the_burst_is_sent_late_not_refused() {
        let cap = Bandwidth::new(100, BTreeMap::new());
        let started = tokio::time::Instant::now();
        cap.acquire(Class::Normal, 1000).await;
        cap.acquire(Class::Normal, 100).await;
        // The first goes at once on the burst; it owes 900 B, 9 s at 100 B/s.
        let elapsed = started.elapsed();
        assert!(
            (Duration::from_secs(9)..Duration::from_millis(9_200)).contains(&elapsed),
            "{elapsed:?}"
        );
        assert_eq!(cap.batch_limit(512 * 1024), 100);
        assert_eq!(
            Bandwidth::new(0, BTreeMap::new()).batch_limit(512 * 1024),
            512 * 1024
        );
    }

    /// A day clock at 00:00 when `started`, running with tokio's (paused) clock.
    fn minutes_since(started: tokio::time::Instant) -> DayClock {
        DayClock::new(move || u32::try_from(started.elapsed().as_secs() / 60).unwrap_or(u32::MAX))
    }

    #[tokio::test(start_paused = true)]
    async fn a_schedule_changes_the_cap_at_its_window_boundaries() {
        // 00:00 on the paused clock; a window from 00:01 to 00:02 at 1,000 B/s, 4,000 outside.
        let started = tokio::time::Instant::now();
        let clock = minutes_since(started);
        let window = ScheduleWindow {
            from: TimeOfDay(1),
            to: TimeOfDay(2),
            bandwidth: ByteSize(1000),
        };
        let cap = Arc::new(Bandwidth::scheduled(
            4000,
            vec![window],
            clock,
            BTreeMap::new(),
        ));
        assert_eq!(cap.batch_limit(512 * 1024), 1000);
        let sender = {
            let cap = Arc::clone(&cap);
            tokio::spawn(async move {
                loop {
                    cap.acquire(Class::Low, 100).await;
                }
            })
        };
        let mut per_minute = Vec::new();
        let mut before = 0;
        for minute in 1..=3 {
            tokio::time::sleep_until(started + Duration::from_secs(60 * minute)).await;
            let total = of(cap.charged(), Class::Low);
            per_minute.push(total - before);
            before = total;
        }
        sender.abort();
        // Each minute at its own cap (the first with its 4,000 B burst); at 00:01 the balance is
        // clipped to 1,000 B, so the lower cap holds from its first second.
        let [first, window, after] = [per_minute[0], per_minute[1], per_minute[2]];
        assert!((243_000..=244_200).contains(&first), "{per_minute:?}");
        assert!((59_000..=61_100).contains(&window), "{per_minute:?}");
        assert!((239_000..=241_200).contains(&after), "{per_minute:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_window_lets_everything_through_and_the_cap_returns_after_it() {
        let started = tokio::time::Instant::now();
        let clock = minutes_since(started);
        // Unlimited from 00:00 to 00:01, 1,000 B/s after.
        let window = ScheduleWindow {
            from: TimeOfDay(0),
            to: TimeOfDay(1),
            bandwidth: ByteSize(0),
        };
        let cap = Bandwidth::scheduled(1000, vec![window], clock, BTreeMap::new());
        for _ in 0..100 {
            cap.acquire(Class::Normal, 100_000).await;
        }
        assert_eq!(started.elapsed(), Duration::ZERO);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let capped = tokio::time::Instant::now();
        for _ in 0..4 {
            cap.acquire(Class::Normal, 1000).await;
        }
        // The first goes on the burst, each of the next three waits a second.
        let waited = capped.elapsed();
        assert!(
            (Duration::from_secs(3)..Duration::from_millis(3_100)).contains(&waited),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_leaves_its_class_idle() {
        let cap = Arc::new(Bandwidth::new(1000, BTreeMap::new()));
        cap.acquire(Class::High, 3000).await;
        let waiter = {
            let cap = Arc::clone(&cap);
            tokio::spawn(async move { cap.acquire(Class::High, 100).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        waiter.abort();
        let _ = waiter.await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let shares = cap
            .shares
            .as_ref()
            .map(|s| s.lock().map(|s| s.classes[0].waiting));
        assert!(matches!(shares, Some(Ok(0))), "{shares:?}");
    }
}
