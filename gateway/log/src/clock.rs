//! The log's sense of time. Two clocks are kept apart: the wall clock, which stamps records and
//! may step (a Raspberry Pi without a real-time clock boots in 1970 or at its last shutdown and
//! NTP steps it later, by days or years), and the elapsed time the log has been running,
//! measured by the monotonic clock and carried across restarts in `clock.json`. Age retention
//! counts only the latter, so a step is seen as a step, never as time passing.
//!
//! [`Timekeeper`] owns the elapsed count, how long each sealed segment has been held since its
//! newest record was written, step detection and the "not synchronised" flag. It never deletes
//! anything itself and never reads a record.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::{LogError, Result};
use super::fs::{self, Fs};

/// Name of the elapsed-time file in the log directory.
pub const CLOCK_FILE: &str = "clock.json";
/// Format version of [`CLOCK_FILE`].
const CLOCK_VERSION: u16 = 1;
/// A disagreement between wall and monotonic time larger than this is a step.
pub const STEP_THRESHOLD: Duration = Duration::from_secs(60);
/// How often the elapsed count is saved while nothing else changes (a crash loses at most this
/// much elapsed time, which only delays retention).
const SAVE_EVERY: Duration = Duration::from_secs(600);
/// When this binary was built (ms since the epoch; `SOURCE_DATE_EPOCH` if set): a wall clock
/// before it has not been synchronised yet.
pub const BUILD_TIME_MS: i64 = match i64::from_str_radix(env!("TERN_BUILD_EPOCH"), 10) {
    Ok(secs) => secs * 1000,
    Err(_) => 0,
};

/// Where the log reads the time.
pub trait Clock: Send + Sync + Debug {
    /// Wall-clock time in milliseconds since the Unix epoch; it may step either way.
    fn wall_ms(&self) -> i64;
    /// Monotonic time since an arbitrary origin: never steps, never goes back.
    fn monotonic(&self) -> Duration;
}

/// The operating system's clocks.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn wall_ms(&self) -> i64 {
        tern_core::time::now_ms()
    }
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock tests set by hand: wall and monotonic time advance together, or the wall clock
/// alone steps.
#[derive(Debug, Default)]
pub struct ManualClock {
    wall_ms: AtomicI64,
    monotonic_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(wall_ms: i64) -> Self {
        Self {
            wall_ms: AtomicI64::new(wall_ms),
            monotonic_ms: AtomicU64::new(0),
        }
    }
    /// Real time passes: both clocks move by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.monotonic_ms.fetch_add(ms, Ordering::SeqCst);
        self.wall_ms
            .fetch_add(i64::try_from(ms).unwrap_or(i64::MAX), Ordering::SeqCst);
    }
    /// The wall clock is set by `delta_ms` (NTP steps it); no time passes.
    pub fn step_wall(&self, delta_ms: i64) {
        self.wall_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> i64 {
        self.wall_ms.load(Ordering::SeqCst)
    }
    fn monotonic(&self) -> Duration {
        Duration::from_millis(self.monotonic_ms.load(Ordering::SeqCst))
    }
}

/// What the log knows about the wall clock, for metrics and the readiness report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockStatus {
    /// The wall clock reads earlier than this binary's build time: not synchronised yet.
    pub unsynchronised: bool,
    /// Wall-clock steps seen since the log was opened (including one between two runs).
    pub steps: u64,
    /// Real time the log has been running, summed over every run (what age retention counts).
    pub elapsed: Duration,
}

/// `clock.json`: the elapsed count and the held-since mark of every sealed segment.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ClockFile {
    version: u16,
    /// Elapsed running time of the log, ms.
    elapsed_ms: u64,
    /// The wall clock when it was saved, ms since the epoch.
    wall_ms: i64,
    /// `topic/partition/base` → elapsed ms when the segment's newest record was written.
    segments: BTreeMap<String, u64>,
}

/// The version check of `clock.json` that runs before the log is opened
/// (`datadir::check_format`): a file of another version refuses the log; an unreadable one is
/// left to [`Timekeeper`], which ignores it.
pub(crate) fn check_version(path: &Path, bytes: &[u8]) -> Result<()> {
    #[derive(Deserialize)]
    struct Versioned {
        version: u16,
    }
    match serde_json::from_slice::<Versioned>(bytes) {
        Ok(file) if file.version != CLOCK_VERSION => Err(unsupported(path, file.version)),
        _ => Ok(()),
    }
}

fn unsupported(path: &Path, found: u16) -> LogError {
    LogError::UnsupportedVersion {
        path: path.to_owned(),
        what: "clock file",
        found,
        supported: CLOCK_VERSION,
    }
}

#[derive(Debug)]
struct State {
    /// Elapsed ms at open and the monotonic reading then.
    base_ms: u64,
    opened: Duration,
    /// The last observation of both clocks.
    last_wall: i64,
    last_mono: Duration,
    steps: u64,
    unsynchronised: bool,
    held_since: BTreeMap<String, u64>,
    dirty: bool,
    saved: Duration,
}

/// The log's elapsed-time accounting (see the module doc).
#[derive(Debug)]
pub struct Timekeeper {
    clock: Arc<dyn Clock>,
    fs: Arc<dyn Fs>,
    path: PathBuf,
    state: Mutex<State>,
    /// One save at a time (writer tasks of several partitions observe concurrently).
    saving: Mutex<()>,
}

/// The key of a segment in [`CLOCK_FILE`].
pub fn segment_key(topic: &str, partition: u32, base: u64) -> String {
    format!("{topic}/{partition}/{base}")
}

fn describe(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

impl Timekeeper {
    /// Loads `clock.json` from `dir` (a missing or unreadable one starts the count at zero).
    pub fn open(fs: Arc<dyn Fs>, dir: &Path, clock: Arc<dyn Clock>) -> Result<Self> {
        let path = dir.join(CLOCK_FILE);
        let saved = match fs.read(&path) {
            Ok(bytes) => Self::parse(&path, &bytes)?,
            Err(_) => None,
        };
        let (wall, mono) = (clock.wall_ms(), clock.monotonic());
        let mut steps = 0;
        let threshold = i64::try_from(STEP_THRESHOLD.as_millis()).unwrap_or(i64::MAX);
        let previous = saved.as_ref().map(|s| s.wall_ms);
        if let Some(previous) = previous.filter(|p| wall < p.saturating_sub(threshold)) {
            steps += 1;
            tracing::warn!(
                now = %describe(wall),
                previous_run = %describe(previous),
                "the wall clock is behind the previous run's: counted as a clock step; records keep monotonic timestamps and age retention counts only the time tern has run"
            );
        }
        if let Some(previous) = previous.filter(|p| wall > p.saturating_add(threshold)) {
            tracing::info!(
                now = %describe(wall),
                previous_run = %describe(previous),
                "the wall clock is ahead of the previous run's (downtime or a clock step): not counted as held time for age retention"
            );
        }
        let unsynchronised = wall < BUILD_TIME_MS;
        if unsynchronised {
            Self::warn_unsynchronised(wall);
        }
        let saved = saved.unwrap_or_default();
        Ok(Self {
            clock,
            fs,
            path,
            saving: Mutex::new(()),
            state: Mutex::new(State {
                base_ms: saved.elapsed_ms,
                opened: mono,
                last_wall: wall,
                last_mono: mono,
                steps,
                unsynchronised,
                held_since: saved.segments,
                dirty: false,
                saved: mono,
            }),
        })
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Option<ClockFile>> {
        let file: ClockFile = match serde_json::from_slice(bytes) {
            Ok(file) => file,
            Err(err) => {
                tracing::warn!(file = %path.display(), %err, "unreadable clock file ignored: every segment is held from now on");
                return Ok(None);
            }
        };
        if file.version != CLOCK_VERSION {
            return Err(unsupported(path, file.version));
        }
        Ok(Some(file))
    }

    fn warn_unsynchronised(wall: i64) {
        tracing::warn!(
            now = %describe(wall),
            build = %describe(BUILD_TIME_MS),
            "the wall clock is earlier than this build: not synchronised; records keep monotonic timestamps and age retention counts only the time tern has run"
        );
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn elapsed_in(&self, st: &State) -> u64 {
        let run = self.clock.monotonic().saturating_sub(st.opened);
        st.base_ms
            .saturating_add(u64::try_from(run.as_millis()).unwrap_or(u64::MAX))
    }

    /// A segment's newest record was written now.
    pub fn wrote(&self, key: String) {
        let mut st = self.lock();
        let now = self.elapsed_in(&st);
        st.held_since.insert(key, now);
    }

    /// How long the segment has been held since its newest record was written; a segment
    /// never seen before is held from now on.
    pub fn held(&self, key: &str) -> Duration {
        let mut st = self.lock();
        let now = self.elapsed_in(&st);
        let since = match st.held_since.get(key) {
            Some(since) => *since,
            None => {
                st.held_since.insert(key.to_owned(), now);
                st.dirty = true;
                now
            }
        };
        Duration::from_millis(now.saturating_sub(since))
    }

    /// A segment was sealed: its held-since mark is saved at the next observation.
    pub fn sealed(&self) {
        self.lock().dirty = true;
    }

    /// The segment was deleted.
    pub fn forget(&self, key: &str) {
        let mut st = self.lock();
        st.held_since.remove(key);
        st.dirty = true;
    }

    /// Compares the wall clock with the monotonic one since the last look: a disagreement
    /// larger than [`STEP_THRESHOLD`] is a step (counted and logged), and the "not
    /// synchronised" flag follows the wall clock. Saves `clock.json` when due.
    pub fn observe(&self) {
        let (wall, mono) = (self.clock.wall_ms(), self.clock.monotonic());
        let mut st = self.lock();
        let real = i64::try_from(mono.saturating_sub(st.last_mono).as_millis()).unwrap_or(i64::MAX);
        let skew = wall.saturating_sub(st.last_wall).saturating_sub(real);
        if skew.unsigned_abs() > STEP_THRESHOLD.as_millis() as u64 {
            st.steps += 1;
            tracing::warn!(
                from = %describe(st.last_wall.saturating_add(real)),
                to = %describe(wall),
                step_seconds = skew / 1000,
                "the wall clock stepped: age retention ignores the step (it counts only the time tern has run) and record timestamps never go back"
            );
        }
        let unsynchronised = wall < BUILD_TIME_MS;
        if unsynchronised && !st.unsynchronised {
            Self::warn_unsynchronised(wall);
        } else if !unsynchronised && st.unsynchronised {
            tracing::info!(now = %describe(wall), "the wall clock is synchronised now");
        }
        st.unsynchronised = unsynchronised;
        (st.last_wall, st.last_mono) = (wall, mono);
        let due = st.dirty || mono.saturating_sub(st.saved) >= SAVE_EVERY;
        drop(st);
        if due {
            self.save();
        }
    }

    /// Writes `clock.json` (temp file, fdatasync, rename); a failure is logged and retried at
    /// the next observation (losing it only delays retention).
    pub fn save(&self) {
        let _saving = self.saving.lock().unwrap_or_else(PoisonError::into_inner);
        let (data, mono) = {
            let st = self.lock();
            let file = ClockFile {
                version: CLOCK_VERSION,
                elapsed_ms: self.elapsed_in(&st),
                wall_ms: self.clock.wall_ms(),
                segments: st.held_since.clone(),
            };
            (serde_json::to_vec(&file), self.clock.monotonic())
        };
        let Ok(data) = data else { return };
        match fs::write_atomic(&*self.fs, &self.path, &data, fs::NewFile::Plain) {
            Ok(()) => {
                let mut st = self.lock();
                st.dirty = false;
                st.saved = mono;
            }
            Err(err) => {
                tracing::warn!(file = %self.path.display(), %err, "cannot save the clock file");
            }
        }
    }

    pub fn status(&self) -> ClockStatus {
        let st = self.lock();
        ClockStatus {
            unsynchronised: st.unsynchronised,
            steps: st.steps,
            elapsed: Duration::from_millis(self.elapsed_in(&st)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::FaultyFs;
    use proptest::prelude::*;

    fn keeper(fs: &FaultyFs, clock: &Arc<ManualClock>) -> Result<Timekeeper> {
        crate::Fs::create_dir_all(fs, Path::new("/log")).expect("directory");
        let clock: Arc<dyn Clock> = Arc::clone(clock) as _;
        Timekeeper::open(Arc::new(fs.clone()), Path::new("/log"), clock)
    }

    #[test]
    fn a_clock_file_of_another_version_is_refused_and_left_as_it_is() {
        let fs = FaultyFs::new(1);
        crate::Fs::create_dir_all(&fs, Path::new("/log")).expect("directory");
        let bytes = br#"{"version":2,"elapsed_ms":5,"wall_ms":0,"segments":{}}"#;
        fs::write_atomic(&fs, Path::new("/log/clock.json"), bytes, fs::NewFile::Plain)
            .expect("write");
        let clock = Arc::new(ManualClock::new(BUILD_TIME_MS));
        let err = keeper(&fs, &clock).expect_err("unknown version");
        assert!(err.to_string().contains("version 2"), "{err}");
        assert_eq!(
            crate::Fs::read(&fs, Path::new("/log/clock.json")).expect("read"),
            bytes
        );
    }

    proptest! {
        #[test]
        fn any_bytes_in_the_clock_file_open_or_are_refused_without_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let fs = FaultyFs::new(2);
            crate::Fs::create_dir_all(&fs, Path::new("/log")).expect("directory");
            fs::write_atomic(&fs, Path::new("/log/clock.json"), &bytes, fs::NewFile::Plain).expect("write");
            let clock = Arc::new(ManualClock::new(BUILD_TIME_MS));
            let _ = keeper(&fs, &clock);
        }

        #[test]
        fn the_elapsed_count_and_marks_survive_a_save(
            run_ms in 0u64..10_000_000,
            marks in proptest::collection::btree_map("[a-z]{1,5}/[0-9]/[0-9]{1,4}", 0u64..1_000, 0..8),
        ) {
            let fs = FaultyFs::new(3);
            let clock = Arc::new(ManualClock::new(BUILD_TIME_MS));
            let first = keeper(&fs, &clock).expect("open");
            for key in marks.keys() {
                first.wrote(key.clone());
            }
            clock.advance(Duration::from_millis(run_ms));
            first.save();
            let again = keeper(&fs, &Arc::new(ManualClock::new(BUILD_TIME_MS))).expect("reopen");
            prop_assert_eq!(again.status().elapsed, Duration::from_millis(run_ms));
            for key in marks.keys() {
                prop_assert_eq!(again.held(key), Duration::from_millis(run_ms));
            }
        }
    }
}
