//! Clock steps through the public API with an injected clock: age retention counts real
//! elapsed time (monotonic, carried across restarts), never a step of the wall clock, and a
//! partition's timestamps never go back.

use std::sync::Arc;
use std::time::Duration;

use tern_core::HumanDuration;

use super::{open_clocked, read_all, record, runtime};
use crate::fs::FaultyFs;
use crate::{BUILD_TIME_MS, Clock, Log, LogConfig, ManualClock};

const HOUR: Duration = Duration::from_secs(3_600);
const TEN_DAYS_MS: i64 = 10 * 86_400_000;
/// 2020-01-01T00:00:00Z, before any build of this code.
const IN_2020_MS: i64 = 1_577_836_800_000;

fn config() -> LogConfig {
    let mut config = LogConfig::for_tests(600);
    config.retention.age = HumanDuration(HOUR);
    config
}

/// Appends `n` records stamped with the clock's wall time: several sealed segments.
async fn fill(log: &Log, clock: &ManualClock, from: u64, n: u64) {
    for i in from..from + n {
        log.append("t", 0, vec![record(1, i, clock.wall_ms())])
            .await
            .expect("append");
    }
}

fn start(log: &Log) -> u64 {
    log.offsets("t", 0).expect("offsets").0
}

#[test]
fn a_forward_step_larger_than_the_age_deletes_nothing_until_the_age_has_really_passed() {
    let rt = runtime();
    let fs = FaultyFs::new(31);
    let clock = Arc::new(ManualClock::new(BUILD_TIME_MS + 1_000));
    rt.block_on(async {
        let log = open_clocked(&fs, &clock, &config()).await;
        log.ensure_topic("t").expect("topic");
        fill(&log, &clock, 0, 40).await;
        clock.advance(Duration::from_secs(60));
        clock.step_wall(TEN_DAYS_MS);
        log.enforce_retention().await;
        assert_eq!(start(&log), 0, "a step forward is not time passing");
        assert_eq!(log.clock_status().steps, 1, "the step is seen");
        clock.advance(HOUR);
        log.enforce_retention().await;
        assert!(start(&log) > 0, "held for the age: deleted");
    });
}

#[test]
fn future_dated_segments_are_deleted_once_held_for_the_age_after_a_backward_step() {
    let rt = runtime();
    let fs = FaultyFs::new(32);
    let clock = Arc::new(ManualClock::new(BUILD_TIME_MS + 5 * 365 * 86_400_000));
    rt.block_on(async {
        let log = open_clocked(&fs, &clock, &config()).await;
        log.ensure_topic("t").expect("topic");
        fill(&log, &clock, 0, 40).await;
        clock.step_wall(-5 * 365 * 86_400_000);
        clock.advance(Duration::from_secs(120));
        fill(&log, &clock, 40, 5).await;
        log.enforce_retention().await;
        assert_eq!(start(&log), 0, "held two minutes: kept");
        assert_eq!(log.clock_status().steps, 1, "the step is seen");
        let all = read_all(&log, "t", 0);
        assert!(
            all.iter()
                .zip(all.iter().skip(1))
                .all(|(a, b)| a.record.timestamp_ms <= b.record.timestamp_ms),
            "timestamps never go back within a partition"
        );
        let newest = all.last().map(|s| s.record.timestamp_ms);
        assert_eq!(
            log.offset_for_timestamp("t", 0, newest.unwrap_or(0))
                .expect("lookup"),
            Some(0),
            "records after the step keep the predecessor's timestamp"
        );
        clock.advance(HOUR);
        log.enforce_retention().await;
        assert!(start(&log) > 0, "future dates do not pin retention");
    });
}

#[test]
fn held_time_survives_a_restart_and_downtime_or_a_changed_wall_clock_does_not_count() {
    let rt = runtime();
    let fs = FaultyFs::new(33);
    let first = Arc::new(ManualClock::new(IN_2020_MS));
    rt.block_on(async {
        let log = open_clocked(&fs, &first, &config()).await;
        assert!(
            log.clock_status().unsynchronised,
            "2020 is before the build"
        );
        log.ensure_topic("t").expect("topic");
        fill(&log, &first, 0, 40).await;
        first.advance(Duration::from_secs(40 * 60));
        log.enforce_retention().await;
        log.close().await.expect("close");

        // The next boot: NTP has set the clock six years ahead; the monotonic clock restarts.
        let second = Arc::new(ManualClock::new(BUILD_TIME_MS + 60_000));
        let log = open_clocked(&fs, &second, &config()).await;
        let status = log.clock_status();
        assert!(!status.unsynchronised, "{status:?}");
        assert!(status.elapsed >= Duration::from_secs(40 * 60), "{status:?}");
        log.enforce_retention().await;
        assert_eq!(start(&log), 0, "held 40 minutes of an hour: kept");
        second.advance(Duration::from_secs(19 * 60));
        log.enforce_retention().await;
        assert_eq!(start(&log), 0, "held 59 minutes: kept");
        second.advance(Duration::from_secs(2 * 60));
        log.enforce_retention().await;
        assert!(start(&log) > 0, "held over an hour: deleted");
    });
}

#[test]
fn a_wall_clock_behind_the_previous_run_is_a_step() {
    let rt = runtime();
    let fs = FaultyFs::new(34);
    let first = Arc::new(ManualClock::new(BUILD_TIME_MS + 100 * 86_400_000));
    rt.block_on(async {
        let log = open_clocked(&fs, &first, &config()).await;
        log.ensure_topic("t").expect("topic");
        fill(&log, &first, 0, 3).await;
        log.close().await.expect("close");
        let second = Arc::new(ManualClock::new(BUILD_TIME_MS + 1_000));
        let log = open_clocked(&fs, &second, &config()).await;
        assert_eq!(log.clock_status().steps, 1);
        log.append("t", 0, vec![record(1, 3, second.wall_ms())])
            .await
            .expect("append");
        let all = read_all(&log, "t", 0);
        let ts: Vec<i64> = all.iter().map(|s| s.record.timestamp_ms).collect();
        assert_eq!(
            ts.last(),
            ts.get(2),
            "stamped no earlier than its predecessor"
        );
    });
}

#[test]
fn retention_set_live_applies_at_the_next_check_without_a_reopen() {
    let rt = runtime();
    let fs = FaultyFs::new(33);
    let clock = Arc::new(ManualClock::new(BUILD_TIME_MS + 1_000));
    rt.block_on(async {
        let mut config = config();
        config.retention.age = HumanDuration(10 * HOUR);
        let log = open_clocked(&fs, &clock, &config).await;
        log.ensure_topic("t").expect("topic");
        fill(&log, &clock, 0, 40).await;
        clock.advance(2 * HOUR);
        log.enforce_retention().await;
        assert_eq!(start(&log), 0, "held 2 h of a 10 h age: kept");
        config.retention.age = HumanDuration(HOUR);
        log.set_retention(&config);
        log.enforce_retention().await;
        assert!(start(&log) > 0, "held 2 h of the new 1 h age: deleted");
    });
}
