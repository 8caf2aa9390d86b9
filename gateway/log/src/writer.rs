//! The single writer of a partition: a task that gathers concurrent appends into group
//! commits, pipelines them (while commit N's fdatasync runs, commit N+1 is gathered and
//! written), rolls segments, applies retention and answers each append with its base offset
//! once durable under the topic's policy.
//!
//! The commit window (policy `sync`) is adaptive group commit. It opens at a commit's first
//! append and closes at the first of: `flush.max_bytes` gathered; `flush.max_delay` elapsed;
//! or no fdatasync running (the previous commits are durable) and either `flush.min_delay`
//! elapsed or `flush.min_bytes` gathered. So an idle device syncs a lone append after
//! `min_delay` and a large commit at once, and while an fdatasync runs the next commit gathers
//! everything that arrives until it returns: the commit size follows the load and the device's
//! sync time. `min_delay` caps the fdatasync rate of a trickle of appends (write amplification
//! on flash); `min_bytes` is a fixed size, so a steady rate cannot ratchet commits down. A written commit's fdatasync starts when the
//! previous one returns (one fdatasync at a time per partition, covering every batch written
//! before it started); its appends are answered only after it returned.
//!
//! A closed-loop producer (its next append only once the last is answered, `pace.rs`) gains
//! nothing from a window: its commits get none while the wear controller's credit lasts.
//!
//! Only this task writes the partition's files; readers see a commit only after it is durable
//! (`sync`) or written (`periodic`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use super::commit::AppendRequest;
use super::commit::{Step, Tip, Written};
use super::config::{Durability, FlushConfig};
use super::error::Result;
use super::pace::Pace;
use super::partition::Partition;
pub use super::roll::create_segment;

/// Largest encoding buffer a writer keeps between commits.
const KEEP_BUFFER: usize = 256 << 10;

/// The fdatasync in flight and the batches it covers.
struct Syncing {
    task: JoinHandle<Result<()>>,
    batches: Vec<Written>,
}

/// The writer task's state.
struct Writer {
    part: Arc<Partition>,
    rx: mpsc::Receiver<AppendRequest>,
    periodic: bool,
    /// End of everything written (durable or not).
    tip: Tip,
    /// Written, fdatasync not yet started.
    written: Vec<Written>,
    syncing: Option<Syncing>,
    /// The reused encoding buffer.
    buf: Vec<u8>,
    /// Whether the producers wait for each answer (`pace.rs`).
    pace: Pace,
}

/// Runs the writer until every sender is dropped, then makes everything durable.
pub async fn run(part: Arc<Partition>, rx: mpsc::Receiver<AppendRequest>) {
    let mut writer = Writer {
        periodic: part.settings.durability == Durability::Periodic,
        tip: part.committed_tip(),
        part,
        rx,
        written: Vec::new(),
        syncing: None,
        buf: Vec::new(),
        pace: Pace::default(),
    };
    writer.run().await;
}

/// Waits for the fdatasync in flight, if any (never resolves without one).
async fn sync_done(syncing: &mut Option<Syncing>) -> SyncResult {
    match syncing {
        Some(s) => (&mut s.task).await,
        None => std::future::pending().await,
    }
}

/// The deadlines of one commit window, from its first append.
struct Window {
    /// The device is idle: close from here on, or from `min_bytes` gathered.
    min: Instant,
    min_bytes: u64,
    /// Close whatever runs.
    max: Instant,
    max_bytes: u64,
}

impl Window {
    /// `chosen`: the wear controller's window, in place of `min_delay` (and at least
    /// `max_delay` long).
    fn new(flush: &FlushConfig, periodic: bool, chosen: Option<Duration>) -> Self {
        let now = Instant::now();
        let (min, max) = match chosen {
            _ if periodic => (Duration::ZERO, Duration::ZERO),
            Some(window) => (window, flush.max_delay.0.max(window)),
            None => (flush.min_delay.0.min(flush.max_delay.0), flush.max_delay.0),
        };
        Self {
            min: now + min,
            max: now + max,
            min_bytes: flush.min_bytes.0,
            max_bytes: flush.max_bytes.0,
        }
    }

    /// Whether a commit of `bytes` closes now, `idle` meaning no fdatasync is running.
    fn closed(&self, idle: bool, bytes: u64) -> bool {
        let now = Instant::now();
        now >= self.max || (idle && (now >= self.min || bytes >= self.min_bytes))
    }

    /// When `closed` may next turn true by time alone.
    fn wake(&self, idle: bool) -> Instant {
        if idle { self.min } else { self.max }
    }
}

/// What the fdatasync task returned, or why it did not.
type SyncResult = std::result::Result<Result<()>, tokio::task::JoinError>;

impl Writer {
    async fn run(&mut self) {
        let sync_interval = self.part.shared.config.sync_interval.0;
        // Periodic policy: when the written-but-unsynced data must be synced.
        let mut sync_due: Option<Instant> = None;
        let mut retained_at = Instant::now();
        loop {
            // Read every turn: a live retention change (SIGHUP) changes the tick.
            let retention_due = retained_at + self.part.retention_tick();
            let wake = sync_due.map_or(retention_due, |due| due.min(retention_due));
            tokio::select! {
                biased;
                done = sync_done(&mut self.syncing) => self.synced(done),
                () = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    let sync = sync_due.is_some_and(|due| due <= now);
                    let retain = retention_due <= now;
                    self.housekeeping(sync, retain).await;
                    if sync {
                        sync_due = None;
                    }
                    if retain {
                        retained_at = now;
                    }
                }
                () = self.part.retention.changed() => {}
                request = self.rx.recv() => {
                    let Some(first) = request else { break };
                    let requests = self.gather(first).await;
                    self.write(requests).await;
                    if self.periodic && sync_due.is_none() {
                        sync_due = Some(Instant::now() + sync_interval);
                    }
                }
            }
        }
        self.drain().await;
        if sync_due.is_some() {
            self.housekeeping(true, false).await;
        }
    }

    /// Periodic fdatasync and age retention, off the async threads.
    async fn housekeeping(&mut self, sync: bool, retain: bool) {
        let p = Arc::clone(&self.part);
        let _ = tokio::task::spawn_blocking(move || {
            if sync {
                let _ = p.sync_active();
            }
            if retain {
                p.shared.time.observe();
                p.enforce_retention(0);
            }
        })
        .await;
    }

    /// Collects the requests of one commit window (see the module doc for the rule).
    async fn gather(&mut self, first: AppendRequest) -> VecDeque<AppendRequest> {
        let shared = Arc::clone(&self.part.shared);
        let held = self.pace.opens(self.syncing.is_none());
        let window = Window::new(
            &shared.config.flush,
            self.periodic,
            shared.wear.window(!held),
        );
        let mut bytes = first.len;
        let mut requests = VecDeque::from([first]);
        let mut last_arrival = Instant::now();
        while bytes < window.max_bytes {
            if let Ok(request) = self.rx.try_recv() {
                bytes += request.len;
                requests.push_back(request);
                last_arrival = Instant::now();
                continue;
            }
            let idle = self.syncing.is_none();
            if window.closed(idle, bytes) {
                break;
            }
            tokio::select! {
                biased;
                done = sync_done(&mut self.syncing) => self.synced(done),
                request = self.rx.recv() => match request {
                    Some(request) => {
                        bytes += request.len;
                        requests.push_back(request);
                        last_arrival = Instant::now();
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(window.wake(idle)) => {}
            }
        }
        self.pace.closes(last_arrival);
        shared
            .wear
            .committed(Arc::as_ptr(&self.part) as usize as u64, bytes);
        requests
    }

    /// Writes the gathered requests (one batch unless a roll or the batch limit splits them)
    /// and starts their fdatasync if none is running.
    async fn write(&mut self, requests: VecDeque<AppendRequest>) {
        let mut queue = requests;
        while !queue.is_empty() {
            let (part, tip, mut buf) = (
                Arc::clone(&self.part),
                self.tip,
                std::mem::take(&mut self.buf),
            );
            let joined = tokio::task::spawn_blocking(move || {
                let step = part.write_stage(&mut queue, tip, &mut buf);
                (step, queue, buf)
            })
            .await;
            let Ok((step, rest, mut buf)) = joined else {
                return;
            };
            if buf.capacity() > KEEP_BUFFER {
                // A large commit's buffer is not kept: RAM stays small with many partitions.
                buf = Vec::new();
            }
            (queue, self.buf) = (rest, buf);
            match step {
                Step::Written(w) => {
                    self.tip = w.tip();
                    if self.periodic {
                        self.part.publish_written(vec![w]);
                    } else {
                        self.written.push(w);
                    }
                }
                Step::Roll => self.roll(&mut queue).await,
                Step::Answered => {}
            }
        }
        self.start_sync();
    }

    /// Syncs everything written, seals the active segment and starts the next one; on failure
    /// the request that needed the roll gets the error.
    async fn roll(&mut self, queue: &mut VecDeque<AppendRequest>) {
        self.drain().await;
        if self.part.lock().failed.is_some() {
            // The next write stage answers every request with the failure.
            return;
        }
        let part = Arc::clone(&self.part);
        let rolled = tokio::task::spawn_blocking(move || part.roll()).await;
        let rolled =
            rolled.unwrap_or_else(|err| Err(self.part.failed_error(&format!("roll task: {err}"))));
        self.tip = self.part.committed_tip();
        match rolled {
            Ok(()) => {}
            // A full device: every waiting append needs the new segment; refuse them all
            // rather than retry the roll once per append.
            Err(err) if err.is_backpressure() => {
                for request in queue.drain(..) {
                    let _ = request.reply.send(Err(self.part.copy_error(&err)));
                }
            }
            Err(err) => {
                if let Some(request) = queue.pop_front() {
                    let _ = request.reply.send(Err(err));
                }
            }
        }
    }

    /// Starts an fdatasync covering every written batch, unless one is already running.
    fn start_sync(&mut self) {
        if self.syncing.is_some() || self.written.is_empty() {
            return;
        }
        let batches = std::mem::take(&mut self.written);
        let part = Arc::clone(&self.part);
        let task = tokio::task::spawn_blocking(move || part.sync_active());
        self.syncing = Some(Syncing { task, batches });
    }

    /// The fdatasync in flight returned: publish its batches (or fail them and everything
    /// written after them), then sync what was written meanwhile.
    fn synced(&mut self, done: SyncResult) {
        let Some(syncing) = self.syncing.take() else {
            return;
        };
        let done = done.unwrap_or_else(|err| {
            let reason = format!("fdatasync task: {err}");
            self.part.lock().failed = Some(reason.clone());
            Err(self.part.failed_error(&reason))
        });
        match done {
            Ok(()) => {
                self.part.publish_written(syncing.batches);
                self.pace.answered();
            }
            Err(err) => {
                let later = std::mem::take(&mut self.written);
                for w in syncing.batches.into_iter().chain(later) {
                    w.fail(&self.part, &err);
                }
                self.tip = self.part.committed_tip();
            }
        }
        self.start_sync();
    }

    /// Waits until every written batch is synced and published (or failed).
    async fn drain(&mut self) {
        self.start_sync();
        while self.syncing.is_some() {
            let done = sync_done(&mut self.syncing).await;
            self.synced(done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::{ByteSize, HumanDuration};

    fn flush(min_ms: u64, min_bytes: u64, max_ms: u64) -> FlushConfig {
        FlushConfig {
            min_delay: HumanDuration(Duration::from_millis(min_ms)),
            min_bytes: ByteSize(min_bytes),
            max_delay: HumanDuration(Duration::from_millis(max_ms)),
            max_bytes: ByteSize(1 << 20),
            wear: crate::config::WearConfig::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_device_commits_at_min_delay_or_min_bytes_a_busy_one_at_max_delay() {
        let window = Window::new(&flush(10, 1000, 30), false, None);
        assert!(!window.closed(true, 999), "idle, small, before min_delay");
        assert!(window.closed(true, 1000), "idle and min_bytes gathered");
        assert!(
            !window.closed(false, 1000),
            "an fdatasync runs: keep gathering"
        );
        assert_eq!(window.wake(true), window.min);
        assert_eq!(window.wake(false), window.max);
        tokio::time::advance(Duration::from_millis(10)).await;
        assert!(window.closed(true, 1), "idle after min_delay");
        assert!(!window.closed(false, 1), "busy before max_delay");
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(window.closed(false, 1), "max_delay closes whatever runs");
    }

    #[tokio::test(start_paused = true)]
    async fn min_delay_is_capped_at_max_delay() {
        let window = Window::new(&flush(50, 1000, 5), false, None);
        assert_eq!(window.min, window.max);
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(window.closed(true, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wear_window_replaces_min_delay_and_stretches_max_delay() {
        let window = Window::new(
            &flush(10, 1000, 30),
            false,
            Some(Duration::from_millis(120)),
        );
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(!window.closed(true, 1), "idle before the chosen window");
        assert!(!window.closed(false, 1), "busy before the chosen window");
        assert!(window.closed(true, 1000), "min_bytes still closes at once");
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(window.closed(true, 1) && window.closed(false, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_periodic_policy_never_waits() {
        let window = Window::new(&flush(10, 1000, 30), true, None);
        assert!(window.closed(false, 0));
    }
}
