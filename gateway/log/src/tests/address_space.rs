//! Address space taken by reads on the real file system: every read maps its sealed segment,
//! and a 32-bit build (armv7, a Raspberry Pi 3) has at most 4 GiB of address space for
//! everything. With many partitions, reads across them must stay within `max_mapped_bytes`:
//! the file cache once kept 64 files mapped whatever their size (32 segments of 128 MiB and
//! their indexes: 4 GiB, and `mmap` failed with ENOMEM under qemu-arm).

use std::path::Path;

use super::runtime;
use crate::batch::{self, SEGMENT_HEADER_LEN, SegmentHeader};
use crate::index::IndexBuilder;
use crate::{Log, LogConfig, Record, meta, segment};
use tern_core::ByteSize;

/// Sealed segments of this length: a legal `segment_bytes`, and sparse files (a header, one
/// batch, then a hole), so the test maps far more than it writes.
const SEGMENT_BYTES: u64 = 128 << 20;
const PARTITIONS: u32 = 100;
/// Sealed segments per partition, one record each; the active segment holds none.
const SEALED: u64 = 2;
const TOPIC: &str = "many";

fn value(partition: u32, offset: u64) -> Vec<u8> {
    format!("partition {partition} offset {offset}").into_bytes()
}

/// Writes sealed segment `base` (generation `base + 1`) of `dir`: its one record, a hole up to
/// `SEGMENT_BYTES`, and indexes that match, as a roll leaves them.
fn write_sealed(dir: &Path, partition: u32, base: u64, config: &LogConfig) {
    let generation = u32::try_from(base + 1).expect("small generation");
    let header = SegmentHeader {
        generation,
        base_offset: base,
    };
    let mut bytes = header.encode().to_vec();
    let record = Record {
        timestamp_ms: 1,
        key: None,
        value: value(partition, base).into(),
        headers: crate::Headers::new(),
    };
    batch::encode_batch(base, generation, &[record], &mut bytes);
    let path = segment::log_path(dir, base);
    std::fs::write(&path, &bytes).expect("write segment");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open segment");
    file.set_len(SEGMENT_BYTES).expect("extend segment");
    let mut index = IndexBuilder::new(config.index_interval.0);
    let batch_len = (bytes.len() - SEGMENT_HEADER_LEN) as u64;
    index.add_batch(0, SEGMENT_HEADER_LEN as u32, batch_len, 1);
    let (offsets, times) = index.encode(SEGMENT_BYTES, base + 1);
    std::fs::write(segment::index_path(dir, base), offsets).expect("write index");
    std::fs::write(segment::time_index_path(dir, base), times).expect("write time index");
}

/// Replaces each partition's files with `SEALED` sealed segments and an empty active one.
fn write_partitions(log_dir: &Path, config: &LogConfig) {
    for partition in 0..PARTITIONS {
        let dir = meta::partition_dir(log_dir, TOPIC, partition);
        for base in 0..SEALED {
            write_sealed(&dir, partition, base, config);
        }
        let active = SegmentHeader {
            generation: u32::try_from(SEALED + 1).expect("small generation"),
            base_offset: SEALED,
        };
        std::fs::write(segment::log_path(&dir, SEALED), active.encode()).expect("write active");
    }
}

#[test]
fn reads_across_many_partitions_of_large_segments_stay_within_the_mapped_budget() {
    let dir = std::env::temp_dir().join(format!("tern-address-space-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log_dir = dir.join("log");
    // The 32-bit default budget, on every build, so a 64-bit run checks the same bound.
    let config = LogConfig {
        max_mapped_bytes: ByteSize(512 << 20),
        ..LogConfig::for_tests(SEGMENT_BYTES)
    };
    config.validate().expect("valid config");
    runtime().block_on(async {
        let log = Log::open(&log_dir, &config).await.expect("open");
        log.create_topic(TOPIC, PARTITIONS).expect("topic");
        log.close().await.expect("close");
        write_partitions(&log_dir, &config);
        let log = Log::open(&log_dir, &config).await.expect("reopen");
        let mut most = 0;
        for offset in 0..SEALED {
            for partition in 0..PARTITIONS {
                let read = log.read(TOPIC, partition, offset, 1);
                let records = read.unwrap_or_else(|e| panic!("read {partition}@{offset}: {e}"));
                let first = records.first().expect("a record");
                assert_eq!(first.record.value, value(partition, offset));
                most = most.max(log.stats().mapped_bytes);
            }
        }
        assert!(
            most <= config.max_mapped_bytes.0,
            "{most} bytes mapped, budget {}",
            config.max_mapped_bytes
        );
        assert!(
            most >= 2 * SEGMENT_BYTES,
            "the cache kept segments mapped: {most}"
        );
        log.close().await.expect("close");
    });
    std::fs::remove_dir_all(&dir).expect("clean up");
}
