//! Disk held per partition on the real file system: a segment is allocated in steps
//! (doubling from 512 KiB to [`ALLOCATION_STEP`], then by it) ahead of its commits, not whole
//! when it starts, so a partition that never received a record holds next to nothing (a Kafka
//! client creating dozens of topics of dozens of partitions once held 64 MiB each), and a busy
//! one holds at most twice what it wrote or a step more, while its commits still land on
//! allocated blocks.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::runtime;
use crate::roll::ALLOCATION_STEP;
use crate::{Log, LogConfig, Record};

const SEGMENT_BYTES: u64 = 64 << 20;

/// Bytes the file system allocated to `path`, a file or every file under a directory.
fn held(path: &Path) -> u64 {
    let meta = std::fs::metadata(path).expect("metadata");
    if !meta.is_dir() {
        return meta.blocks() * 512;
    }
    std::fs::read_dir(path)
        .expect("read dir")
        .flatten()
        .map(|entry| held(&entry.path()))
        .sum()
}

/// The active (only) segment file of partition 0 of `topic`.
fn segment(log_dir: &Path, topic: &str) -> PathBuf {
    log_dir
        .join("topics")
        .join(topic)
        .join("0")
        .join("00000000000000000000.log")
}

fn record(i: usize, len: usize) -> Record {
    Record {
        timestamp_ms: i as i64,
        key: None,
        value: vec![b'x'; len].into(),
        headers: crate::Headers::new(),
    }
}

#[test]
fn an_idle_partition_holds_next_to_nothing_and_a_busy_one_grows_in_steps() {
    let dir = std::env::temp_dir().join(format!("tern-allocation-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log_dir = dir.join("log");
    let config = LogConfig::for_tests(SEGMENT_BYTES);
    runtime().block_on(async {
        let log = Log::open(&log_dir, &config).await.expect("open");
        log.create_topic("idle", 8).expect("idle topic");
        log.create_topic("busy", 1).expect("busy topic");
        let idle = held(&log_dir.join("topics").join("idle"));
        assert!(
            idle <= 8 * (16 << 10),
            "8 idle partitions hold {idle} bytes (each used to hold a whole segment)"
        );

        log.append("busy", 0, vec![record(0, 100)])
            .await
            .expect("append");
        let file = segment(&log_dir, "busy");
        let len = std::fs::metadata(&file).expect("segment").len();
        assert_eq!(len, 512 << 10, "the first commit allocates 512 KiB");
        assert!(held(&file) <= (512 + 64) << 10);

        // About 5 MiB more: the allocation follows in steps, ahead of the commits.
        for i in 1..=80 {
            log.append("busy", 0, vec![record(i, 64 << 10)])
                .await
                .expect("append");
        }
        let written = 80 * (64 << 10) as u64;
        let len = std::fs::metadata(&file).expect("segment").len();
        assert!(
            len > written && len <= written + 2 * ALLOCATION_STEP && len % ALLOCATION_STEP == 0,
            "{len} bytes allocated for {written} written"
        );
        log.close().await.expect("close");

        // A restart cuts the allocated tail and the next commit allocates again.
        let log = Log::open(&log_dir, &config).await.expect("reopen");
        let cut = std::fs::metadata(&file).expect("segment").len();
        assert!(cut < len && cut > written, "{cut} after recovery");
        log.append("busy", 0, vec![record(81, 100)])
            .await
            .expect("append after restart");
        let len = std::fs::metadata(&file).expect("segment").len();
        assert_eq!(len % ALLOCATION_STEP, 0, "{len}");
        assert!(len > cut, "{len} allocated again after {cut}");
        log.close().await.expect("close");
    });
    let _ = std::fs::remove_dir_all(&dir);
}
