//! Model-based tests: random appends, reads, time lookups, reopenings and retention, checked
//! against a plain vector of records.

use std::path::Path;

use proptest::prelude::*;

use super::{open, read_all, record, runtime};
use crate::fs::{FaultyFs, Fs};
use crate::{LogConfig, LogError, OnFull, Record};
use tern_core::ByteSize;

#[derive(Debug, Clone)]
enum Op {
    Append { count: u64, ts_jitter: i64 },
    Read { at: prop::sample::Index, max: usize },
    Time { ts: i64 },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u64..6, -50i64..50).prop_map(|(count, ts_jitter)| Op::Append { count, ts_jitter }),
        2 => (any::<prop::sample::Index>(), 1usize..400).prop_map(|(at, max)| Op::Read { at, max }),
        2 => (-100i64..2_000).prop_map(|ts| Op::Time { ts }),
        1 => Just(Op::Reopen),
    ]
}

fn first_at_or_after(model: &[Record], ts: i64) -> Option<u64> {
    model
        .iter()
        .position(|r| r.timestamp_ms >= ts)
        .map(|i| i as u64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn log_matches_a_vector_of_records(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = runtime();
        let fs = FaultyFs::new(7);
        let config = LogConfig::for_tests(700);
        rt.block_on(async {
            let mut log = open(&fs, &config).await;
            log.ensure_topic("t").expect("topic");
            let mut model: Vec<Record> = Vec::new();
            for op in ops {
                match op {
                    Op::Append { count, ts_jitter } => {
                        let base = model.len() as u64;
                        let records: Vec<Record> = (0..count)
                            .map(|i| record(0, base + i, (base + i) as i64 * 10 + ts_jitter))
                            .collect();
                        let offset = log.append("t", 0, records.clone()).await.expect("append");
                        assert_eq!(offset, base, "offsets are dense");
                        // The log raises a timestamp below its predecessor's to it.
                        let mut floor = model.last().map_or(i64::MIN, |r| r.timestamp_ms);
                        for mut r in records {
                            r.timestamp_ms = r.timestamp_ms.max(floor);
                            floor = r.timestamp_ms;
                            model.push(r);
                        }
                    }
                    Op::Read { at, max } => {
                        if model.is_empty() { continue; }
                        let from = at.index(model.len());
                        let got = log.read("t", 0, from as u64, max).expect("read");
                        assert!(!got.is_empty(), "at least one record");
                        for (i, stored) in got.iter().enumerate() {
                            assert_eq!(stored.offset, (from + i) as u64);
                            assert_eq!(Some(&stored.record), model.get(from + i));
                        }
                    }
                    Op::Time { ts } => {
                        let got = log.offset_for_timestamp("t", 0, ts).expect("lookup");
                        assert_eq!(got, first_at_or_after(&model, ts), "timestamp {ts}");
                    }
                    Op::Reopen => {
                        log.close().await.expect("close");
                        log = open(&fs, &config).await;
                    }
                }
                assert_eq!(log.offsets("t", 0).expect("offsets"), (0, model.len() as u64));
            }
            let all: Vec<Record> = read_all(&log, "t", 0).into_iter().map(|s| s.record).collect();
            assert_eq!(all, model);
            assert!(log.read("t", 0, model.len() as u64, 100).expect("read at end").is_empty());
            assert!(matches!(
                log.read("t", 0, model.len() as u64 + 1, 100),
                Err(LogError::OffsetOutOfRange { .. })
            ));
        });
    }
}

#[test]
fn missing_and_stale_indexes_are_rebuilt() {
    let rt = runtime();
    let fs = FaultyFs::new(3);
    let config = LogConfig::for_tests(600);
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        for i in 0..40 {
            log.append("t", 0, vec![record(1, i, i as i64)])
                .await
                .expect("append");
        }
        log.close().await.expect("close");
        let dir = Path::new("/data/log/topics/t/0");
        let names = fs.list_dir(dir).expect("list");
        let indexes: Vec<&String> = names.iter().filter(|n| n.ends_with(".index")).collect();
        assert!(indexes.len() >= 3, "several sealed segments: {names:?}");
        let first = dir.join(indexes.first().map(|s| s.as_str()).unwrap_or_default());
        fs.remove(&first).expect("remove an index");
        let second = dir.join(indexes.get(1).map(|s| s.as_str()).unwrap_or_default());
        let stale = fs.create(&second).expect("replace with garbage");
        stale.write_at(0, b"TERNIDX\0garbage").expect("write");
        let log = open(&fs, &config).await;
        assert!(fs.exists(&first), "index rebuilt");
        let all = read_all(&log, "t", 0);
        assert_eq!(all.len(), 40);
        for (i, stored) in all.iter().enumerate() {
            assert_eq!(stored.record, record(1, i as u64, i as i64));
        }
        assert_eq!(
            log.offset_for_timestamp("t", 0, 17).expect("lookup"),
            Some(17)
        );
    });
}

#[test]
fn retention_deletes_oldest_segments_and_respects_cursors() {
    let rt = runtime();
    let fs = FaultyFs::new(4);
    let mut config = LogConfig::for_tests(600);
    config.retention.bytes = ByteSize(2_000);
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        log.cursors()
            .commit("fwd", "t", 0, 0)
            .await
            .expect("cursor");
        let mut appended = 0u64;
        let full = loop {
            match log.append("t", 0, vec![record(1, appended, 0)]).await {
                Ok(_) => appended += 1,
                Err(err) => break err,
            }
            assert!(appended < 1000, "the log must fill up");
        };
        assert!(matches!(full, LogError::Full { .. }), "{full}");
        assert_eq!(
            log.offsets("t", 0).expect("offsets").0,
            0,
            "cursor kept everything"
        );
        log.cursors()
            .commit("fwd", "t", 0, appended)
            .await
            .expect("cursor");
        let offset = log
            .append("t", 0, vec![record(1, appended, 0)])
            .await
            .expect("room again");
        assert_eq!(offset, appended);
        let (start, end) = log.offsets("t", 0).expect("offsets");
        assert!(start > 0, "old segments deleted");
        assert_eq!(end, appended + 1);
        let stats = log.stats();
        assert!(
            stats.segments_deleted > 0 && stats.segments_recycled > 0,
            "{stats:?}"
        );
        let bytes: u64 = log.partition_stats().iter().map(|p| p.bytes).sum();
        assert!(bytes <= 2_000, "{bytes}");
        let rest = read_all(&log, "t", 0);
        assert_eq!(rest.first().map(|s| s.offset), Some(start));
        for stored in &rest {
            assert_eq!(stored.record, record(1, stored.offset, 0));
        }
    });
}

#[test]
fn drop_oldest_deletes_even_what_cursors_need() {
    let rt = runtime();
    let fs = FaultyFs::new(5);
    let mut config = LogConfig::for_tests(600);
    config.retention.bytes = ByteSize(2_000);
    config.retention.on_full = OnFull::DropOldest;
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        log.cursors()
            .commit("fwd", "t", 0, 0)
            .await
            .expect("cursor");
        for i in 0..200 {
            log.append("t", 0, vec![record(1, i, 0)])
                .await
                .expect("never full");
        }
        let (start, end) = log.offsets("t", 0).expect("offsets");
        assert!(start > 0 && end == 200, "{start}..{end}");
        // Recycled segment files hold stale batches that must never be read back.
        log.close().await.expect("close");
        let log = open(&fs, &config).await;
        let rest = read_all(&log, "t", 0);
        assert_eq!(rest.len() as u64, end - start);
        for stored in &rest {
            assert_eq!(stored.record, record(1, stored.offset, 0));
        }
    });
}

#[test]
fn cursors_survive_reopen_and_compaction() {
    let rt = runtime();
    let fs = FaultyFs::new(6);
    let config = LogConfig::for_tests(600);
    rt.block_on(async {
        let log = open(&fs, &config).await;
        let cursors = log.cursors();
        for i in 0..3_000u64 {
            cursors
                .commit(&format!("c{}", i % 5), "t", (i % 2) as u32, i)
                .await
                .expect("commit");
        }
        assert!(
            cursors.file_len() < 64 * 1024 + 200,
            "compacted: {}",
            cursors.file_len()
        );
        cursors.remove("c4").await.expect("remove");
        assert_eq!(cursors.get("c0", "t", 1), Some(2_995));
        assert_eq!(cursors.min_offset("t", 0), Some(2_990));
        log.close().await.expect("close");
        let log = open(&fs, &config).await;
        let list = log.cursors().list();
        assert_eq!(list.len(), 8, "{list:?}");
        assert_eq!(log.cursors().get("c3", "t", 1), Some(2_993));
        assert_eq!(log.cursors().get("c4", "t", 0), None);
    });
}

#[test]
fn a_damaged_sealed_batch_is_skipped_not_fatal() {
    let rt = runtime();
    let fs = FaultyFs::new(8);
    let config = LogConfig::for_tests(2_000);
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        for i in 0..60 {
            log.append("t", 0, vec![record(1, i, i as i64)])
                .await
                .expect("append");
        }
        log.close().await.expect("close");
        fs.corrupt(
            Path::new("/data/log/topics/t/0/00000000000000000000.log"),
            100,
        )
        .expect("flip a bit");
        let log = open(&fs, &config).await;
        let all = read_all(&log, "t", 0);
        assert!(
            all.len() < 60 && all.len() > 40,
            "only the damaged stretch is skipped: {}",
            all.len()
        );
        for stored in &all {
            assert_eq!(
                stored.record,
                record(1, stored.offset, stored.offset as i64)
            );
        }
        assert!(log.stats().corrupt_batches > 0);
        log.append("t", 0, vec![record(1, 60, 60)])
            .await
            .expect("appends continue");
    });
}

#[test]
fn bad_names_and_unknown_partitions_are_typed_errors() {
    let rt = runtime();
    let fs = FaultyFs::new(9);
    rt.block_on(async {
        let log = open(&fs, &LogConfig::for_tests(600)).await;
        for bad in ["", ".", "..", "a/b", "é", &"x".repeat(201)] {
            assert!(
                matches!(
                    log.ensure_topic(bad),
                    Err(LogError::InvalidTopicName { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            log.append("nope", 0, vec![record(0, 0, 0)]).await,
            Err(LogError::UnknownTopic { .. })
        ));
        log.ensure_topic("t").expect("topic");
        assert!(matches!(
            log.read("t", 3, 0, 10),
            Err(LogError::UnknownPartition { .. })
        ));
        assert!(matches!(
            log.append("t", 0, Vec::new()).await,
            Err(LogError::InvalidAppend { .. })
        ));
        let mut watch = log.subscribe("t", 0).expect("subscribe");
        log.append("t", 0, vec![record(0, 0, 0)])
            .await
            .expect("append");
        watch.changed().await.expect("watch wakes");
        assert_eq!(*watch.borrow(), 1);
        log.close().await.expect("close");
        assert!(matches!(log.close().await, Err(LogError::Closed)));
        assert!(matches!(
            log.append("t", 0, vec![record(0, 1, 0)]).await,
            Err(LogError::Closed)
        ));
    });
}

#[test]
fn concurrent_appends_share_commits() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fs = FaultyFs::new(10);
    let mut config = LogConfig::for_tests(1 << 20);
    config.flush.max_delay = tern_core::HumanDuration(std::time::Duration::from_millis(20));
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        let before = log.stats();
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let log = log.clone();
                tokio::spawn(async move { log.append("t", 0, vec![record(i, 0, 0)]).await })
            })
            .collect();
        let mut offsets = Vec::new();
        for task in tasks {
            offsets.push(task.await.expect("task").expect("append"));
        }
        offsets.sort_unstable();
        assert_eq!(offsets, (0..64).collect::<Vec<u64>>(), "dense and distinct");
        let after = log.stats();
        let commits = after.commits - before.commits;
        assert!(commits < 16, "64 appends took {commits} commits");
        assert_eq!(
            after.fsyncs - before.fsyncs,
            commits,
            "one fdatasync per commit"
        );
        assert_eq!(after.records - before.records, 64);
    });
}

#[test]
fn a_large_commit_is_split_into_bounded_batches() {
    use crate::batch::{self, SEGMENT_HEADER_LEN};
    use crate::commit::BATCH_TARGET_LEN;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fs = FaultyFs::new(13);
    let mut config = LogConfig::for_tests(8 << 20);
    config.flush.max_delay = tern_core::HumanDuration(std::time::Duration::from_millis(200));
    config.flush.max_bytes = ByteSize(4 << 20);
    let value = vec![7u8; 4000];
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        let before = log.stats();
        let tasks: Vec<_> = (0..64u64)
            .map(|_| {
                let (log, value) = (log.clone(), value.clone());
                tokio::spawn(async move {
                    let records = (0..4)
                        .map(|_| Record {
                            timestamp_ms: 0,
                            key: None,
                            value: value.clone().into(),
                            headers: crate::Headers::new(),
                        })
                        .collect();
                    log.append("t", 0, records).await
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task").expect("append");
        }
        let commits = log.stats().commits - before.commits;
        assert!(commits < 8, "256 records took {commits} commits");
        assert_eq!(read_all(&log, "t", 0).len(), 256);
        // Walk the active segment's batches: every one within the target, together all records.
        let dir = crate::meta::partition_dir(Path::new("/data/log"), "t", 0);
        let file = fs
            .open_read(&crate::segment::log_path(&dir, 0))
            .expect("segment");
        let bytes = file.bytes();
        let (mut pos, mut records, mut batches) = (SEGMENT_HEADER_LEN, 0u64, 0u64);
        while let Ok(header) = batch::decode_header(bytes.get(pos..).unwrap_or_default()) {
            assert!(u64::from(header.length) <= BATCH_TARGET_LEN, "{header:?}");
            assert_eq!(header.base_offset, records, "batches are contiguous");
            records += u64::from(header.record_count);
            batches += 1;
            pos += header.length as usize;
        }
        assert_eq!(records, 256);
        assert!(batches >= 1_000_000 / BATCH_TARGET_LEN, "{batches} batches");
    });
}

#[test]
fn periodic_durability_acknowledges_before_the_sync() {
    let rt = runtime();
    let fs = FaultyFs::new(11);
    let mut config = LogConfig::for_tests(1 << 20);
    config.durability = crate::Durability::Periodic;
    // Long enough that 20 appends finish inside one interval even under QEMU emulation.
    config.sync_interval = tern_core::HumanDuration(std::time::Duration::from_secs(2));
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        let before = log.stats().fsyncs;
        for i in 0..20 {
            log.append("t", 0, vec![record(0, i, 0)])
                .await
                .expect("append");
        }
        assert_eq!(log.stats().fsyncs, before, "no fdatasync per append");
        assert_eq!(read_all(&log, "t", 0).len(), 20, "visible after the write");
        // The signal: the periodic sync itself, with no further append to prompt it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while log.stats().fsyncs == before {
            assert!(
                std::time::Instant::now() < deadline,
                "no periodic sync within 20 s of a 2 s interval"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        log.close().await.expect("close");
        fs.crash(crate::fs::CrashMode::DropUnsynced);
        let log = open(&fs, &config).await;
        assert_eq!(
            read_all(&log, "t", 0).len(),
            20,
            "durable after the periodic sync"
        );
    });
}

#[test]
fn the_real_file_system_round_trips_through_mapped_segments() {
    let dir = std::env::temp_dir().join(format!("tern-log-realfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = runtime();
    let config = LogConfig::for_tests(8192);
    rt.block_on(async {
        let log = crate::Log::open(&dir, &config).await.expect("open");
        log.ensure_topic("t").expect("topic");
        for i in 0..300 {
            log.append("t", 0, vec![record(2, i, i as i64)])
                .await
                .expect("append");
        }
        log.close().await.expect("close");
        let log = crate::Log::open(&dir, &config).await.expect("reopen");
        assert!(log.partition_stats().iter().all(|p| p.segments > 3));
        let all = read_all(&log, "t", 0);
        assert_eq!(all.len(), 300);
        for stored in &all {
            assert_eq!(
                stored.record,
                record(2, stored.offset, stored.offset as i64)
            );
        }
        assert_eq!(
            log.offset_for_timestamp("t", 0, 123).expect("lookup"),
            Some(123)
        );
        assert_eq!(
            log.offset_for_timestamp("t", 0, 1_000).expect("lookup"),
            None
        );
        log.close().await.expect("close");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Debug, Clone)]
enum CursorOp {
    Commit {
        name: u8,
        partition: u32,
        offset: u64,
    },
    Remove {
        name: u8,
    },
    Reopen,
}

fn cursor_op() -> impl Strategy<Value = CursorOp> {
    prop_oneof![
        6 => (0u8..4, 0u32..3, any::<u64>()).prop_map(|(name, partition, offset)| CursorOp::Commit { name, partition, offset }),
        1 => (0u8..4).prop_map(|name| CursorOp::Remove { name }),
        1 => Just(CursorOp::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn cursor_store_matches_a_map(ops in proptest::collection::vec(cursor_op(), 1..60)) {
        let rt = runtime();
        let fs = FaultyFs::new(12);
        let config = LogConfig::for_tests(4096);
        rt.block_on(async {
            let mut log = open(&fs, &config).await;
            let mut model = std::collections::BTreeMap::new();
            for op in ops {
                match op {
                    CursorOp::Commit { name, partition, offset } => {
                        let name = format!("c{name}");
                        log.cursors().commit(&name, "t", partition, offset).await.expect("commit");
                        model.insert((name, "t".to_owned(), partition), offset);
                    }
                    CursorOp::Remove { name } => {
                        let name = format!("c{name}");
                        log.cursors().remove(&name).await.expect("remove");
                        model.retain(|(n, _, _), _| *n != name);
                    }
                    CursorOp::Reopen => {
                        log.close().await.expect("close");
                        log = open(&fs, &config).await;
                    }
                }
                let listed: Vec<(String, String, u32, u64)> = model
                    .iter()
                    .map(|((n, t, p), o)| (n.clone(), t.clone(), *p, *o))
                    .collect();
                assert_eq!(log.cursors().list(), listed);
            }
        });
    }

    #[test]
    fn retention_keeps_a_dense_suffix_and_what_cursors_need(
        ops in proptest::collection::vec((0u8..10, 1u64..4), 1..80),
    ) {
        let rt = runtime();
        let fs = FaultyFs::new(13);
        let mut config = LogConfig::for_tests(600);
        config.retention.bytes = ByteSize(1_800);
        rt.block_on(async {
            let log = open(&fs, &config).await;
            log.ensure_topic("t").expect("topic");
            let mut model: Vec<Record> = Vec::new();
            let mut cursor: Option<u64> = None;
            for (kind, n) in ops {
                if kind < 8 {
                    let base = model.len() as u64;
                    let records: Vec<Record> = (0..n).map(|i| record(3, base + i, 0)).collect();
                    match log.append("t", 0, records.clone()).await {
                        Ok(offset) => {
                            assert_eq!(offset, base);
                            model.extend(records);
                        }
                        Err(LogError::Full { .. }) => {
                            assert!(cursor.is_some(), "full only when a cursor holds data");
                        }
                        Err(err) => panic!("append: {err}"),
                    }
                } else {
                    let start = log.offsets("t", 0).expect("offsets").0;
                    let at = (model.len() as u64 * u64::from(kind - 7) / 2).max(start);
                    log.cursors().commit("c", "t", 0, at).await.expect("cursor");
                    cursor = Some(at);
                }
                let (start, end) = log.offsets("t", 0).expect("offsets");
                assert_eq!(end, model.len() as u64);
                if let Some(c) = cursor {
                    assert!(start <= c, "retention deleted what the cursor needs: {start} > {c}");
                }
                let rest = read_all(&log, "t", 0);
                let expected: Vec<Record> = model.get(start as usize..).unwrap_or_default().to_vec();
                assert_eq!(rest.into_iter().map(|s| s.record).collect::<Vec<_>>(), expected);
            }
        });
    }
}

#[test]
fn a_full_disk_fails_appends_cleanly_and_reads_keep_working() {
    let rt = runtime();
    let fs = FaultyFs::new(14);
    let config = LogConfig::for_tests(4096);
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        for i in 0..5 {
            log.append("t", 0, vec![record(4, i, 0)])
                .await
                .expect("append");
        }
        fs.set_full(true);
        let err = log
            .append("t", 0, vec![record(4, 99, 0)])
            .await
            .expect_err("disk full");
        assert!(err.is_backpressure(), "a full disk is backpressure: {err}");
        assert!(err.to_string().contains("no space left"), "{err}");
        assert_eq!(read_all(&log, "t", 0).len(), 5, "reads keep working");
        assert_eq!(log.offsets("t", 0).expect("offsets"), (0, 5));
        fs.set_full(false);
        let offset = log
            .append("t", 0, vec![record(4, 5, 0)])
            .await
            .expect("space again");
        assert_eq!(offset, 5, "the failed append left no trace");
        log.close().await.expect("close");
        let log = open(&fs, &config).await;
        let all = read_all(&log, "t", 0);
        assert_eq!(all.len(), 6);
        for stored in &all {
            assert_eq!(stored.record, record(4, stored.offset, 0));
        }
    });
}

#[test]
fn a_write_cut_short_by_a_full_disk_leaves_no_unacknowledged_batch_behind() {
    let rt = runtime();
    let fs = FaultyFs::new(16);
    let config = LogConfig::for_tests(1 << 20);
    let big = |seq: u64| Record {
        timestamp_ms: 0,
        key: None,
        value: vec![b'v'; 40_000 + seq as usize].into(),
        headers: crate::Headers::new(),
    };
    rt.block_on(async {
        let log = open(&fs, &config).await;
        log.ensure_topic("t").expect("topic");
        log.append("t", 0, vec![record(6, 0, 0)])
            .await
            .expect("append");
        // Two appends of one commit: two batches in one write, the disk fills in the second.
        fs.fill_after(60_000);
        let first = log.enqueue("t", 0, vec![big(1)]).await.expect("queued");
        let second = log.enqueue("t", 0, vec![big(2)]).await.expect("queued");
        for answer in [first, second] {
            let err = answer.await.expect("answered").expect_err("disk full");
            assert!(err.is_backpressure(), "{err}");
        }
        fs.set_full(false);
        log.close().await.expect("close");
        let log = open(&fs, &config).await;
        assert_eq!(
            log.offsets("t", 0).expect("offsets"),
            (0, 1),
            "nothing refused is stored"
        );
        assert_eq!(
            log.append("t", 0, vec![record(6, 1, 0)])
                .await
                .expect("append"),
            1
        );
    });
}

#[test]
fn age_retention_deletes_segments_whose_newest_record_is_too_old() {
    let rt = runtime();
    let fs = FaultyFs::new(15);
    let mut config = LogConfig::for_tests(600);
    config.retention.age = tern_core::HumanDuration(std::time::Duration::from_secs(3_600));
    let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
    rt.block_on(async {
        let log = super::open_clocked(&fs, &clock, &config).await;
        log.ensure_topic("t").expect("topic");
        for i in 0..30 {
            let now = crate::Clock::wall_ms(&*clock);
            log.append("t", 0, vec![record(5, i, now)])
                .await
                .expect("old");
        }
        clock.advance(std::time::Duration::from_secs(7_200));
        for i in 30..40 {
            let now = crate::Clock::wall_ms(&*clock);
            log.append("t", 0, vec![record(5, i, now)])
                .await
                .expect("new");
        }
        log.cursors()
            .commit("slow", "t", 0, 10)
            .await
            .expect("cursor");
        log.enforce_retention().await;
        let (start, _) = log.offsets("t", 0).expect("offsets");
        assert!(
            start > 0 && start <= 10,
            "deleted up to the cursor: {start}"
        );
        log.cursors()
            .commit("slow", "t", 0, 40)
            .await
            .expect("cursor");
        log.enforce_retention().await;
        let (start, end) = log.offsets("t", 0).expect("offsets");
        assert!(
            start > 10 && start <= 30,
            "old segments gone, new kept: {start}"
        );
        assert_eq!(end, 40);
        let rest = read_all(&log, "t", 0);
        assert!(
            rest.iter()
                .all(|s| s.record == record(5, s.offset, s.record.timestamp_ms))
        );
    });
}
