//! Format versions and damage through the public API on the in-memory file system: a newer
//! tern's files are refused and left byte for byte, a directory from before the format marker is
//! accepted and marked, damage in a segment is skipped and counted while everything after it
//! stays readable, and the cursor store salvages what its entries' own checks vouch for.

use std::path::Path;
use std::sync::Arc;

use super::{open, read_all, record, runtime};
use crate::fs::{FaultyFs, Fs};
use crate::{Log, LogConfig, LogError};

const SEGMENT: &str = "/data/log/topics/t/0/00000000000000000000.log";

/// A log with `n` one-record appends to `t`/0 and a cursor, closed.
fn written(fs: &FaultyFs, config: &LogConfig, n: u64) {
    runtime().block_on(async {
        let log = open(fs, config).await;
        log.ensure_topic("t").expect("topic");
        for i in 0..n {
            log.append("t", 0, vec![record(1, i, i as i64)])
                .await
                .expect("append");
        }
        log.cursors().commit("c", "t", 0, 3).await.expect("cursor");
        log.close().await.expect("close");
    });
}

fn try_open(fs: &FaultyFs, config: &LogConfig) -> Result<Log, LogError> {
    runtime().block_on(Log::open_with_fs(
        Arc::new(fs.clone()),
        Path::new("/data/log"),
        config,
    ))
}

/// `bytes` (a file starting with a header of `len` bytes whose CRC32C sits in its last four)
/// rewritten the way a writer of `version` would: the version at byte 8, CRC recomputed.
fn as_version(fs: &FaultyFs, path: &str, crc_at: Option<usize>, version: u16) {
    let path = Path::new(path);
    let mut bytes = fs.read(path).expect("file");
    if let Some(v) = bytes.get_mut(8..10) {
        v.copy_from_slice(&version.to_le_bytes());
    }
    if let Some(at) = crc_at {
        let crc = crc32c::crc32c(bytes.get(..at).unwrap_or_default());
        if let Some(field) = bytes.get_mut(at..at + 4) {
            field.copy_from_slice(&crc.to_le_bytes());
        }
    }
    fs.overwrite(
        path,
        0,
        bytes
            .get(..crc_at.map_or(10, |at| at + 4))
            .unwrap_or_default(),
    )
    .expect("overwrite");
}

#[test]
fn a_newer_format_is_refused_and_nothing_is_changed() {
    let config = LogConfig::for_tests(600);
    let cases: [(&str, Option<usize>, &str); 4] = [
        (SEGMENT, Some(28), "segment"),
        ("/data/log/topics/t/topic.meta", Some(16), "topic metadata"),
        ("/data/log/cursors.log", None, "cursor log"),
        ("/data/log/FORMAT", Some(12), "data directory"),
    ];
    for (path, crc_at, what) in cases {
        let fs = FaultyFs::new(21);
        written(&fs, &config, 30);
        as_version(&fs, path, crc_at, 3);
        let before = fs.contents();
        let err = try_open(&fs, &config).expect_err("a newer format must be refused");
        let text = err.to_string();
        assert!(
            matches!(
                err,
                LogError::UnsupportedVersion {
                    found: 3,
                    supported: 2,
                    ..
                }
            ),
            "{what}: {text}"
        );
        assert!(text.contains(path) && text.contains(what), "{text}");
        assert!(
            text.contains("version 3") && text.contains("version 2"),
            "{text}"
        );
        assert_eq!(fs.contents(), before, "{what}: nothing changed");
    }
}

#[test]
fn a_flipped_version_byte_is_damage_not_a_newer_format() {
    let config = LogConfig::for_tests(600);
    let fs = FaultyFs::new(22);
    written(&fs, &config, 30);
    // Version 3 without the CRC a writer would have computed: a torn or flipped header.
    as_version(&fs, "/data/log/topics/t/topic.meta", None, 3);
    let log = try_open(&fs, &config).expect("damage does not refuse the log");
    assert!(log.topics().is_empty(), "the damaged topic is left alone");
}

#[test]
fn a_log_from_before_the_marker_is_accepted_and_marked() {
    let config = LogConfig::for_tests(600);
    let fs = FaultyFs::new(23);
    written(&fs, &config, 30);
    let marker = Path::new("/data/log/FORMAT");
    let written_marker = fs.read(marker).expect("a new log has a marker");
    fs.remove(marker).expect("remove");
    let log = try_open(&fs, &config).expect("format 1 without a marker opens");
    assert_eq!(read_all(&log, "t", 0).len(), 30);
    assert_eq!(log.cursors().get("c", "t", 0), Some(3));
    assert_eq!(fs.read(marker).ok(), Some(written_marker));
}

/// A log of format 1 (its marker and segments of version 1) opens as it is, and its marker is
/// rewritten to format 2; its segments stay version 1 and hold no producer stamps.
#[test]
fn a_log_of_format_1_is_read_and_its_marker_rewritten() {
    let config = LogConfig::for_tests(600);
    let fs = FaultyFs::new(24);
    written(&fs, &config, 30);
    as_version(&fs, "/data/log/FORMAT", Some(12), 1);
    let segments: Vec<String> = fs
        .contents()
        .into_keys()
        .map(|p| p.display().to_string())
        .filter(|p| p.ends_with(".log") && p.contains("/topics/"))
        .collect();
    assert!(segments.len() > 1, "{segments:?}");
    for segment in &segments {
        as_version(&fs, segment, Some(28), 1);
    }
    let log = try_open(&fs, &config).expect("format 1 opens");
    assert_eq!(read_all(&log, "t", 0).len(), 30);
    assert_eq!(log.producer_stamps("t", 0).expect("stamps"), Vec::new());
    let marker = fs.read(Path::new("/data/log/FORMAT")).expect("marker");
    assert_eq!(marker.get(8..10), Some(&2u16.to_le_bytes()[..]));
    for segment in &segments {
        let bytes = fs.read(Path::new(segment)).expect("segment");
        assert_eq!(bytes.get(8..10), Some(&1u16.to_le_bytes()[..]), "{segment}");
    }
}

#[test]
fn a_read_past_a_cut_sealed_segment_goes_on_with_the_next() {
    let config = LogConfig::for_tests(600);
    let fs = FaultyFs::new(24);
    written(&fs, &config, 60);
    let len = fs.file_len(Path::new(SEGMENT)).expect("sealed segment");
    fs.truncate(Path::new(SEGMENT), len / 2).expect("cut");
    let log = try_open(&fs, &config).expect("opens");
    let (start, end) = log.offsets("t", 0).expect("offsets");
    let all = read_all(&log, "t", 0);
    let last = all.last().map(|r| r.offset);
    assert_eq!(last, Some(end - 1), "the records after the cut are read");
    assert!(all.len() < 60 && all.len() > 40, "{}", all.len());
    for stored in &all {
        assert_eq!(
            stored.record,
            record(1, stored.offset, stored.offset as i64)
        );
    }
    let first_lost = (start..)
        .zip(&all)
        .find(|(o, r)| *o != r.offset)
        .map(|(o, _)| o);
    let lost = first_lost.expect("a gap");
    let after = log.read("t", 0, lost, 1000).expect("read in the gap");
    assert!(
        after.first().is_some_and(|r| r.offset > lost),
        "a read from a lost offset returns the next records there are"
    );
}

#[test]
fn damage_in_the_active_segment_is_skipped_and_what_follows_is_kept() {
    let config = LogConfig::for_tests(1 << 20);
    let fs = FaultyFs::new(25);
    written(&fs, &config, 60);
    let path = Path::new(SEGMENT);
    fs.overwrite(path, 32 + 30 * 40, &[0xa5; 16])
        .expect("16 bytes in the middle");
    let kept = runtime().block_on(async {
        let log = open(&fs, &config).await;
        let all = read_all(&log, "t", 0);
        assert!(
            all.len() >= 58 && all.len() < 60,
            "one batch lost: {}",
            all.len()
        );
        for stored in &all {
            assert_eq!(
                stored.record,
                record(1, stored.offset, stored.offset as i64)
            );
        }
        assert_eq!(
            all.last().map(|r| r.offset),
            Some(59),
            "the records after it are kept"
        );
        assert!(log.stats().corrupt_batches > 0, "counted");
        log.append("t", 0, vec![record(1, 60, 60)])
            .await
            .expect("appends continue after the kept records");
        log.close().await.expect("close");
        all.len()
    });
    let log = try_open(&fs, &config).expect("reopens");
    assert!(
        log.stats().corrupt_batches > 0,
        "the evidence is still there"
    );
    assert_eq!(read_all(&log, "t", 0).len(), kept + 1);
}

#[test]
fn the_cursor_store_salvages_every_entry_whose_own_check_holds() {
    let config = LogConfig::for_tests(600);
    let fs = FaultyFs::new(26);
    written(&fs, &config, 3);
    runtime().block_on(async {
        let log = open(&fs, &config).await;
        for i in 0..10u64 {
            log.cursors()
                .commit(&format!("c{i}"), "t", 0, i * 100)
                .await
                .expect("commit");
        }
        log.close().await.expect("close");
    });
    let path = Path::new("/data/log/cursors.log");
    let len = fs.file_len(path).expect("cursor log");
    // Garbage over the header and the first entry ("c" at 3), and in the middle of the file.
    fs.overwrite(path, 0, &[0xee; 20]).expect("header");
    fs.overwrite(path, len / 2, &[0xee; 3]).expect("middle");
    let log = try_open(&fs, &config).expect("opens");
    let cursors = log.cursors().list();
    assert!(
        cursors.len() >= 8 && cursors.len() < 11,
        "salvaged all but the damaged entries: {cursors:?}"
    );
    assert_eq!(log.cursors().get("c9", "t", 0), Some(900));
    let kept = fs.list_dir(Path::new("/data/log")).expect("list");
    assert!(
        kept.iter().any(|n| n.starts_with("cursors.log.damaged-")),
        "{kept:?}"
    );
}

#[test]
fn a_damaged_header_of_the_active_segment_keeps_its_batches() {
    let config = LogConfig::for_tests(1 << 20);
    let fs = FaultyFs::new(27);
    written(&fs, &config, 20);
    fs.corrupt(Path::new(SEGMENT), 20)
        .expect("flip a bit of the header");
    let log = try_open(&fs, &config).expect("opens");
    assert_eq!(read_all(&log, "t", 0).len(), 20, "no batch lost");
    let header = fs.read(Path::new(SEGMENT)).expect("segment");
    assert!(
        crate::batch::SegmentHeader::decode(&header).is_ok(),
        "the header is whole again"
    );
}
