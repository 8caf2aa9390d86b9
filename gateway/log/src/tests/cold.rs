//! Reads of cold sealed segments, on the in-memory file system: a read that waits for the card
//! stalls no other task of a multi-threaded runtime (even one with a single worker), and a
//! segment the card fails to read is [`LogError::Io`] for its partition only, never the end of
//! the process.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use super::{open, read_all, record, runtime};
use crate::fs::FaultyFs;
use crate::{LogConfig, LogError};

/// The first (sealed, once 30 records are written) segment of `t`/`partition`.
fn first_segment(partition: u32) -> String {
    format!("/data/log/topics/t/{partition}/00000000000000000000.log")
}

/// A guard against a hung test: what a stalled read would otherwise wait for forever.
const HUNG: Duration = Duration::from_secs(30);

/// A log of topic `t` with two partitions of 30 one-record appends each, closed.
fn written(fs: &FaultyFs, config: &LogConfig) {
    runtime().block_on(async {
        let log = open(fs, config).await;
        log.create_topic("t", 2).expect("topic");
        for i in 0..30 {
            for partition in 0..2 {
                log.append("t", partition, vec![record(1, i, i as i64)])
                    .await
                    .expect("append");
            }
        }
        log.close().await.expect("close");
    });
}

/// A read of a sealed segment the card is slow to give (a hold only another task releases)
/// on the only worker of the runtime: the other task still runs. Were the read inline on the
/// worker, the other task would never run and the read would never end.
#[test]
fn a_cold_read_does_not_stall_the_only_worker() {
    let config = LogConfig::for_tests(600);
    let fs = FaultyFs::new(41);
    written(&fs, &config);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let log = rt.block_on(open(&fs, &config));
    let hold = fs.hold_reads(Path::new(&first_segment(0)));
    let (done, read) = mpsc::channel();
    rt.spawn(async move {
        let _ = done.send(log.read("t", 0, 0, 1000).map(|r| r.len()));
    });
    let releaser = std::sync::Arc::clone(&hold);
    rt.spawn(async move {
        while !releaser.reached() {
            tokio::task::yield_now().await;
        }
        releaser.release();
    });
    let read = read.recv_timeout(HUNG);
    hold.release();
    let read = read.expect("the cold read stalled the runtime's only worker");
    assert!(read.expect("read") > 0, "the read found records");
}

/// A sealed segment whose pages the card cannot read: reading it is `LogError::Io` (a mapped
/// read would be SIGBUS; `FaultyFs` panics there), and the log goes on serving the other
/// partition and the partition's other segments.
#[test]
fn a_media_error_is_an_io_error_for_that_segment_only() {
    let config = LogConfig::for_tests(600);
    let fs = FaultyFs::new(42);
    written(&fs, &config);
    runtime().block_on(async {
        let log = open(&fs, &config).await;
        let bad = first_segment(0);
        fs.fail_reads(Path::new(&bad));
        let err = log
            .read("t", 0, 0, 1000)
            .expect_err("a failed read is an error");
        assert!(
            matches!(&err, LogError::Io { path, .. } if path == Path::new(&bad)),
            "{err}"
        );
        assert_eq!(
            read_all(&log, "t", 1).len(),
            30,
            "the other partition reads"
        );
        let (_, end) = log.offsets("t", 0).expect("offsets");
        let tail = log
            .read("t", 0, end - 1, 1000)
            .expect("later segments read");
        assert_eq!(tail.len(), 1);
        log.close().await.expect("close");
    });
}
