//! Pace on tokio's paused clock: a closed-loop producer, a busy device, trickles.

use std::time::Duration;

use tokio::time::Instant;

use super::{PROBE, Pace, STREAK};

/// The window a held commit gets in these tests (the wear controller's choice at a trickle).
const WINDOW: Duration = Duration::from_millis(80);

/// One commit: its first append `gap` after the last answer, then more appends at `later`
/// offsets from the first; the window (held or not), the fdatasync, the answer. Whether the
/// commit was held.
async fn commit(pace: &mut Pace, gap: Duration, later: &[Duration], idle: bool) -> bool {
    tokio::time::advance(gap).await;
    let opened = Instant::now();
    let held = pace.opens(idle);
    let mut last = opened;
    if held {
        for offset in later.iter().filter(|o| **o < WINDOW) {
            last = opened + *offset;
        }
        tokio::time::advance(WINDOW).await;
    }
    pace.closes(last);
    tokio::time::advance(Duration::from_millis(2)).await;
    pace.answered();
    held
}

/// `commits` commits of a closed-loop producer (next append 300 µs after each answer); how
/// many were not held.
async fn closed_loop(pace: &mut Pace, commits: u32) -> u32 {
    let mut dropped = 0;
    for _ in 0..commits {
        dropped += u32::from(!commit(pace, Duration::from_micros(300), &[], true).await);
    }
    dropped
}

#[tokio::test(start_paused = true)]
async fn a_producer_that_sends_right_after_each_answer_loses_its_window_after_a_streak() {
    let mut pace = Pace::default();
    // The first commit has no answer before it; then STREAK held windows show the sign.
    assert_eq!(closed_loop(&mut pace, STREAK + 1).await, 0);
    assert!(pace.closed_loop());
    // From then on no window, but for one probe in PROBE.
    assert_eq!(closed_loop(&mut pace, 2 * PROBE).await, 2 * PROBE - 2);
    assert!(pace.closed_loop(), "the probes showed the sign again");
}

#[tokio::test(start_paused = true)]
async fn a_producer_that_lingers_a_little_before_sending_again_is_closed_loop_too() {
    // franz-go's producer, for one: 10 ms between an answer and its next request.
    let mut pace = Pace::default();
    let mut dropped = 0;
    for _ in 0..(STREAK + 1 + PROBE) {
        dropped += u32::from(!commit(&mut pace, Duration::from_millis(10), &[], true).await);
    }
    assert!(pace.closed_loop());
    assert_eq!(dropped, PROBE - 1, "all but the probe, after the streak");
}

#[tokio::test(start_paused = true)]
async fn a_pause_ends_it_and_a_busy_device_delays_the_probe() {
    let mut pace = Pace::default();
    closed_loop(&mut pace, STREAK + 1).await;
    assert!(pace.closed_loop());
    // Two seconds without an append after the answer: the producer stopped.
    assert!(commit(&mut pace, Duration::from_secs(2), &[], true).await);
    assert!(!pace.closed_loop());
    closed_loop(&mut pace, STREAK).await;
    assert!(pace.closed_loop());
    // Several closed-loop producers: a commit opens while the last one's fdatasync runs.
    // It gets no window, and the probe waits for an idle device.
    for _ in 0..2 * PROBE {
        assert!(!commit(&mut pace, Duration::ZERO, &[], false).await, "busy");
    }
    assert!(pace.closed_loop());
    assert!(
        commit(&mut pace, Duration::ZERO, &[], true).await,
        "the probe"
    );
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_sees_an_append_later_in_its_window_ends_it() {
    let mut pace = Pace::default();
    closed_loop(&mut pace, STREAK + 1).await;
    for _ in 1..PROBE {
        assert!(!commit(&mut pace, Duration::ZERO, &[], true).await);
    }
    let late = [Duration::from_millis(30)];
    assert!(
        commit(&mut pace, Duration::ZERO, &late, true).await,
        "the probe"
    );
    assert!(!pace.closed_loop());
}

#[tokio::test(start_paused = true)]
async fn commits_behind_a_running_fdatasync_never_lose_their_window() {
    let mut pace = Pace::default();
    for _ in 0..100 {
        assert!(commit(&mut pace, Duration::ZERO, &[], false).await);
    }
}

/// A trickle: appends at exponential intervals (seeded; `TERN_TEST_SEED=N` replays). Whatever
/// the rate, its windows keep receiving appends, so it never loses them.
#[tokio::test(start_paused = true)]
async fn a_trickle_keeps_its_window_at_any_rate() {
    let seed = std::env::var("TERN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()));
    println!("seed {seed} (TERN_TEST_SEED={seed} replays)");
    let mut state = seed | 1;
    let mut uniform = move || {
        // xorshift64*: enough for arrival times.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    };
    for rate in [10.0, 100.0, 1000.0_f64] {
        let mut interval = || Duration::from_secs_f64(-(1.0 - uniform()).ln() / rate);
        let mut pace = Pace::default();
        for _ in 0..3000 {
            let gap = interval();
            // The appends that follow the first within the window.
            let mut later = Vec::new();
            let mut at = interval();
            while at < WINDOW {
                later.push(at);
                at += interval();
            }
            let held = commit(&mut pace, gap, &later, true).await;
            assert!(held, "rate {rate}/s, seed {seed}");
        }
    }
}
