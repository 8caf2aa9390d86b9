//! The contract of the log port: one scenario suite run against [`Log`] (on [`FaultyFs`]) and
//! against [`MemoryLog`], so the in-memory fake the other layers' unit tests use behaves like
//! the log they run on in production. Each scenario is written once against [`Subject`]; the
//! `contract!` macro makes a test of it for each implementation (`on_log::…`, `on_memory::…`).
//!
//! A scenario may only use the port and the controls of [`Subject`], which each implementation
//! provides its own way (a held fdatasync or a held commit task, a full disk or a full-disk
//! switch, segment retention or a removed prefix).

use std::time::Duration;

use super::{open, read_all, record, runtime};
use crate::fs::{FaultyFs, is_no_space};
use crate::{Log, LogConfig, LogError, LogPort, MemoryLog, StoredRecord};

/// Segments of a few records each, so retention has sealed segments to remove.
const SEGMENT_BYTES: u64 = 600;
/// Replays the interleavings of one run (the seed is printed by every run).
const SEED_VAR: &str = "TERN_TEST_SEED";

/// A log under contract with the test controls a scenario needs.
trait Subject {
    type Port: LogPort;

    fn port(&self) -> &Self::Port;
    /// While `held`, no commit completes: queued appends stay invisible and unanswered.
    fn hold_commits(&self, held: bool);
    /// Whether a queued append's commit is in flight (waiting, when commits are held).
    fn commit_in_flight(&self) -> bool;
    /// Every write fails as on a full disk (or succeeds again).
    fn set_disk_full(&self, full: bool);
    /// Retention removes the oldest records of a partition, keeping at least the newest.
    async fn remove_prefix(&self, topic: &str, partition: u32);
}

/// [`Log`] on the fault-injecting disk.
struct OnDisk {
    log: Log,
    fs: FaultyFs,
}

impl OnDisk {
    async fn open() -> Self {
        let fs = FaultyFs::new(41);
        let log = open(&fs, &LogConfig::for_tests(SEGMENT_BYTES)).await;
        Self { log, fs }
    }
}

impl Subject for OnDisk {
    type Port = Log;

    fn port(&self) -> &Log {
        &self.log
    }

    fn hold_commits(&self, held: bool) {
        self.fs.hold_syncs(held);
    }

    fn commit_in_flight(&self) -> bool {
        self.fs.syncs_running() > 0
    }

    fn set_disk_full(&self, full: bool) {
        self.fs.set_full(full);
    }

    async fn remove_prefix(&self, _topic: &str, _partition: u32) {
        // The smallest size limit deletes every sealed segment; the active one is kept.
        let mut config = LogConfig::for_tests(SEGMENT_BYTES);
        config.retention.bytes.0 = 1;
        self.log.set_retention(&config);
        self.log.enforce_retention().await;
        self.log.set_retention(&LogConfig::for_tests(SEGMENT_BYTES));
    }
}

impl Subject for MemoryLog {
    type Port = MemoryLog;

    fn port(&self) -> &MemoryLog {
        self
    }

    fn hold_commits(&self, held: bool) {
        MemoryLog::hold_commits(self, held);
    }

    fn commit_in_flight(&self) -> bool {
        self.held_commits() > 0
    }

    fn set_disk_full(&self, full: bool) {
        MemoryLog::set_disk_full(self, full);
    }

    async fn remove_prefix(&self, topic: &str, partition: u32) {
        let (start, end) = self.offsets(topic, partition).expect("offsets");
        MemoryLog::remove_prefix(self, topic, partition, start + (end - start) / 2);
    }
}

/// Makes a test of each scenario for each implementation.
macro_rules! contract {
    ($($scenario:ident),* $(,)?) => {
        mod on_log {
            $(
                #[test]
                fn $scenario() {
                    super::runtime().block_on(async {
                        super::$scenario(&super::OnDisk::open().await).await;
                    });
                }
            )*
        }
        mod on_memory {
            $(
                #[test]
                fn $scenario() {
                    super::runtime().block_on(async {
                        super::$scenario(&crate::MemoryLog::new(1)).await;
                    });
                }
            )*
        }
    };
}

contract!(
    appends_and_enqueues_keep_their_order_per_partition,
    a_record_is_invisible_until_its_commit_completed,
    offsets_after_retention_removed_a_prefix,
    timestamps_that_go_backwards_are_raised_to_their_predecessor,
    a_cursor_commit_on_a_full_disk_keeps_the_old_cursor,
    an_append_on_a_full_disk_is_refused_and_the_next_continues_the_offsets,
);

fn values(records: &[StoredRecord]) -> Vec<Vec<u8>> {
    records.iter().map(|r| r.record.value.to_vec()).collect()
}

/// Appends `n` one-record appends stamped `ts0 + i`.
async fn fill(port: &impl LogPort, topic: &str, n: u64, ts0: i64) {
    for i in 0..n {
        let ts = ts0 + i64::try_from(i).unwrap_or(i64::MAX);
        port.append(topic, 0, vec![record(1, i, ts)])
            .await
            .expect("append");
    }
}

/// The seed of this run's interleavings: `TERN_TEST_SEED` to replay one, else the time.
fn seed() -> u64 {
    let seed = std::env::var(SEED_VAR)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    println!("contract interleavings: {SEED_VAR}={seed}");
    seed
}

/// splitmix64: the next number below `bound`.
fn next(state: &mut u64, bound: u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % bound.max(1)
}

/// Appends (awaited) and enqueues (answers awaited later) to two partitions in a random
/// interleaving: each partition's base offsets follow its call order, and so do its records.
async fn appends_and_enqueues_keep_their_order_per_partition(subject: &impl Subject) {
    let port = subject.port();
    port.create_topic("t", 2).expect("topic");
    let mut state = seed();
    let mut expected: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    let mut answers = Vec::new();
    for call in 0..60u64 {
        let partition = next(&mut state, 2) as u32;
        let count = 1 + next(&mut state, 3);
        let records: Vec<_> = (0..count).map(|i| record(call, i, 1_000)).collect();
        let sent = expected
            .get_mut(partition as usize)
            .expect("two partitions");
        let base = sent.len() as u64;
        sent.extend(records.iter().map(|r| r.value.to_vec()));
        if next(&mut state, 2) == 0 {
            let got = port.append("t", partition, records).await;
            assert_eq!(got.expect("append"), base, "append {call}");
        } else {
            let queued = port
                .enqueue("t", partition, records)
                .await
                .expect("enqueue");
            answers.push((call, base, queued));
        }
    }
    for (call, base, queued) in answers {
        assert_eq!(queued.await.expect("answer"), base, "enqueue {call}");
    }
    for (partition, sent) in (0..).zip(&expected) {
        assert_eq!(values(&read_all(port, "t", partition)), *sent);
    }
}

/// A queued record shows nowhere (read, offsets, the end watch, time lookups) until its commit
/// completed, then everywhere.
async fn a_record_is_invisible_until_its_commit_completed(subject: &impl Subject) {
    let port = subject.port();
    port.ensure_topic("t").expect("topic");
    port.append("t", 0, vec![record(1, 0, 100)])
        .await
        .expect("append");
    let mut end = port.subscribe("t", 0).expect("subscribe");
    subject.hold_commits(true);
    let mut answer = port
        .enqueue("t", 0, vec![record(1, 1, 200)])
        .await
        .expect("enqueue");
    wait_until_in_flight(subject, &mut answer).await;
    assert_eq!(port.offsets("t", 0).expect("offsets"), (0, 1));
    assert_eq!(port.read("t", 0, 0, 1 << 20).expect("read").len(), 1);
    assert_eq!(port.read("t", 0, 1, 1 << 20).expect("read at the end"), []);
    assert_eq!(
        port.offset_for_timestamp("t", 0, 200).expect("lookup"),
        None
    );
    assert_eq!(*end.borrow_and_update(), 1);
    subject.hold_commits(false);
    assert_eq!(answer.await.expect("answer"), 1);
    assert_eq!(port.offsets("t", 0).expect("offsets"), (0, 2));
    assert_eq!(
        *end.borrow_and_update(),
        2,
        "the end moved before the answer"
    );
    assert_eq!(port.read("t", 0, 1, 1 << 20).expect("read").len(), 1);
    assert_eq!(
        port.offset_for_timestamp("t", 0, 200).expect("lookup"),
        Some(1)
    );
}

/// Waits until `answer`'s commit is in flight (it runs on a blocking thread or a task of its
/// own: nothing wakes this one when it starts), failing if it is answered meanwhile or never
/// starts.
async fn wait_until_in_flight(subject: &impl Subject, answer: &mut crate::Queued) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !subject.commit_in_flight() {
        tokio::select! {
            biased;
            answered = &mut *answer => panic!("answered while its commit is held: {answered:?}"),
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no commit in flight"
        );
    }
    tokio::select! {
        biased;
        answered = &mut *answer => panic!("answered while its commit is held: {answered:?}"),
        () = std::future::ready(()) => {}
    }
}

/// After retention removed a prefix the start offset is past 0: reads below it are out of
/// range naming the start, time lookups answer no lower than it, and appends continue the end.
async fn offsets_after_retention_removed_a_prefix(subject: &impl Subject) {
    let port = subject.port();
    port.ensure_topic("t").expect("topic");
    fill(port, "t", 40, 1_000).await;
    subject.remove_prefix("t", 0).await;
    let (start, end) = port.offsets("t", 0).expect("offsets");
    assert!(
        0 < start && start < end,
        "a prefix was removed: {start}..{end}"
    );
    assert_eq!(end, 40, "retention never moves the end");
    for below in [0, start - 1] {
        match port.read("t", 0, below, 1 << 20) {
            Err(LogError::OffsetOutOfRange {
                offset,
                start: s,
                end: e,
                ..
            }) => assert_eq!((offset, s, e), (below, start, end)),
            other => panic!("read below the start {start} from {below}: {other:?}"),
        }
    }
    let first = port.read("t", 0, start, 1).expect("read at the start");
    let expected = record(1, start, 1_000 + start as i64).value;
    assert_eq!(
        first.first().map(|r| (r.offset, &r.record.value)),
        Some((start, &expected))
    );
    assert_eq!(read_all(port, "t", 0).len() as u64, end - start);
    for ts in [i64::MIN, 0, 1_000] {
        let found = port.offset_for_timestamp("t", 0, ts).expect("lookup");
        assert_eq!(found, Some(start), "a time before the start: {ts}");
    }
    let found = port.offset_for_timestamp("t", 0, 1_000 + end as i64 - 1);
    assert_eq!(found.expect("lookup"), Some(end - 1));
    let base = port.append("t", 0, vec![record(2, 0, 0)]).await;
    assert_eq!(base.expect("append"), end);
    let last = port
        .read("t", 0, end, 1 << 20)
        .expect("read the new record");
    let stamped = last.first().map(|r| r.record.timestamp_ms);
    assert_eq!(
        stamped,
        Some(1_000 + end as i64 - 1),
        "raised past removed records too"
    );
    assert!(matches!(
        port.read("t", 0, end + 2, 1),
        Err(LogError::OffsetOutOfRange { start: s, .. }) if s == start
    ));
}

/// A record stamped earlier than its predecessor (a stepped wall clock, a producer's own time)
/// is stored with its predecessor's timestamp, so a partition's timestamps never go back and a
/// time lookup finds the first record at least that new.
async fn timestamps_that_go_backwards_are_raised_to_their_predecessor(subject: &impl Subject) {
    let port = subject.port();
    port.ensure_topic("t").expect("topic");
    for ts in [100, 300, 200, 250, 400, 50] {
        port.append("t", 0, vec![record(1, 0, ts)])
            .await
            .expect("append");
    }
    let batch = vec![record(1, 1, 500), record(1, 2, 450)];
    port.append("t", 0, batch).await.expect("append");
    let stored: Vec<i64> = read_all(port, "t", 0)
        .iter()
        .map(|r| r.record.timestamp_ms)
        .collect();
    assert_eq!(stored, [100, 300, 300, 300, 400, 400, 500, 500]);
    for (ts, first) in [
        (i64::MIN, Some(0)),
        (100, Some(0)),
        (101, Some(1)),
        (200, Some(1)),
        (300, Some(1)),
        (301, Some(4)),
        (450, Some(6)),
        (500, Some(6)),
        (501, None),
    ] {
        let found = port.offset_for_timestamp("t", 0, ts).expect("lookup");
        assert_eq!(found, first, "first offset at {ts}");
    }
}

/// A cursor commit refused by a full disk is backpressure (the cursor file's ENOSPC): the old
/// position survives, a new cursor is not created, and commits succeed once space is back.
async fn a_cursor_commit_on_a_full_disk_keeps_the_old_cursor(subject: &impl Subject) {
    let port = subject.port();
    port.ensure_topic("t").expect("topic");
    fill(port, "t", 4, 1_000).await;
    port.commit_cursor("c", "t", 0, 1).await.expect("commit");
    subject.set_disk_full(true);
    for (name, offset) in [("c", 3), ("d", 2)] {
        let refused = port.commit_cursor(name, "t", 0, offset).await;
        assert_no_space_in_cursor_file(refused, name);
    }
    assert_no_space_in_cursor_file(port.remove_cursors("c").await, "c removed");
    assert_eq!(
        port.cursor("c", "t", 0),
        Some(1),
        "the old position survives"
    );
    assert_eq!(port.cursor("d", "t", 0), None, "no cursor was created");
    assert_eq!(port.cursor_names(), ["c"]);
    subject.set_disk_full(false);
    port.commit_cursor("c", "t", 0, 3).await.expect("commit");
    assert_eq!(port.cursor("c", "t", 0), Some(3));
}

fn assert_no_space_in_cursor_file(result: Result<(), LogError>, what: &str) {
    match result {
        Err(ref err @ LogError::Io { ref source, .. }) if is_no_space(source) => {
            assert!(err.is_backpressure(), "{what}: {err}");
        }
        other => panic!("{what} on a full disk: {other:?}"),
    }
}

/// An append refused by a full disk is backpressure and stores nothing (not even its timestamp
/// as the partition's floor); once space is back the next append gets the offset the refused
/// one would have had.
async fn an_append_on_a_full_disk_is_refused_and_the_next_continues_the_offsets(
    subject: &impl Subject,
) {
    let port = subject.port();
    port.ensure_topic("t").expect("topic");
    fill(port, "t", 3, 1_000).await;
    subject.set_disk_full(true);
    let refused = port.append("t", 0, vec![record(2, 0, 9_000)]).await;
    assert!(
        matches!(refused, Err(LogError::NoSpace { .. })),
        "{refused:?}"
    );
    assert_eq!(port.offsets("t", 0).expect("offsets"), (0, 3));
    subject.set_disk_full(false);
    let base = port.append("t", 0, vec![record(2, 1, 2_000)]).await;
    assert_eq!(base.expect("append after space is back"), 3);
    let all = read_all(port, "t", 0);
    let last = all
        .last()
        .map(|r| (r.record.value.clone(), r.record.timestamp_ms));
    let stored_as = (record(2, 1, 0).value, 2_000);
    assert_eq!(
        last,
        Some(stored_as),
        "a refused record sets no timestamp floor"
    );
    assert_eq!(all.len(), 4);
}
