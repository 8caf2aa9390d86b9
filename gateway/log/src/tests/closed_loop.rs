//! The commit window of a closed-loop producer (`pace.rs`, `wear.rs`) on the whole log: a
//! producer that appends only once its last append is durable loses the wear window after a
//! streak (before, each of its appends waited the whole window, and a slower arrival rate made
//! the window longer still); a trickle keeps it.

use std::time::Duration;

use tern_core::ByteSize;

use super::{open, record, runtime};
use crate::fs::FaultyFs;
use crate::{LogConfig, pace};

#[test]
fn a_closed_loop_producer_commits_without_the_wear_window_and_a_trickle_keeps_it() {
    runtime().block_on(async {
        let fs = FaultyFs::new(1);
        // Small segments: the in-memory file system copies a file's bytes on each sync.
        let config = LogConfig {
            segment_bytes: ByteSize(256 << 10),
            ..LogConfig::default()
        };
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        log.ensure_topic("u").expect("topic");
        let appends = 200;
        let started = tokio::time::Instant::now();
        for seq in 0..appends {
            log.append("t", 0, vec![record(1, seq, 1)])
                .await
                .expect("append");
        }
        let closed_loop = log.wear_status().closed_loop_commits;
        // After the streak all but one probe in PROBE go without a window; a slow machine (the
        // cross suites run this under QEMU) may answer some late and start a streak over.
        let streak = u64::from(pace::STREAK) + 1;
        assert!(
            closed_loop * 2 >= appends - streak,
            "{closed_loop} of {appends} appends committed as closed-loop"
        );
        println!(
            "closed loop: {appends} appends in {:?}, {closed_loop} without a window",
            started.elapsed()
        );

        // A trickle: one append every 30 ms from a timer (not from the answers).
        let mut tick = tokio::time::interval(Duration::from_millis(30));
        let mut trickle = Vec::new();
        for seq in 0..20 {
            tick.tick().await;
            let log = log.clone();
            trickle.push(tokio::spawn(async move {
                log.append("u", 0, vec![record(2, seq, 1)]).await
            }));
        }
        for append in trickle {
            append.await.expect("task").expect("append");
        }
        assert_eq!(
            log.wear_status().closed_loop_commits,
            closed_loop,
            "a trickle keeps its window"
        );
        assert_eq!(log.offsets("u", 0).expect("offsets").1, 20);
    });
}
