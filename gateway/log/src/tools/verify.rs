//! `tern log verify`: checks every segment header, batch CRC, generation and offset, every
//! index file against its segment, topic metadata and the cursor log, without changing
//! anything. Damage is reported with its file and byte position; a torn tail of the active
//! segment or cursor log (what a power cut leaves, repaired on the next start) is a note.

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

use super::{ToolError, partition_files, scan_file};
use crate::batch::SEGMENT_HEADER_LEN;
use crate::cursors::CURSORS_FILE;
use crate::fs::{Fs, RealFs};
use crate::index::IndexView;
use crate::meta;
use crate::segment::{self, End};

struct Report<'a> {
    out: &'a mut dyn Write,
    problems: usize,
}

impl Report<'_> {
    fn damage(&mut self, path: &Path, position: u64, reason: &str) {
        self.problems += 1;
        let _ = writeln!(
            self.out,
            "DAMAGE {} byte {position}: {reason}",
            path.display()
        );
    }
    fn note(&mut self, text: &str) {
        let _ = writeln!(self.out, "note: {text}");
    }
}

/// Verifies the log under `data_dir/log`; returns the number of problems found (printed).
pub fn verify(data_dir: &Path, out: &mut dyn Write) -> Result<usize, ToolError> {
    let fs = RealFs;
    let log_dir = data_dir.join("log");
    super::check_format(data_dir, &log_dir)?;
    let mut report = Report { out, problems: 0 };
    let topics_dir = meta::topics_dir(&log_dir);
    for name in fs.list_dir(&topics_dir).unwrap_or_default() {
        let path = topics_dir.join(&name).join(meta::TOPIC_META);
        let partitions = match fs.read(&path).map(|b| meta::decode(&b)) {
            Ok(Ok(p)) => p,
            Ok(Err(err)) => {
                report.damage(&path, 0, &err.to_string());
                continue;
            }
            Err(err) => {
                report.note(&format!(
                    "topic {name} has no metadata ({err}): its creation was interrupted"
                ));
                continue;
            }
        };
        for p in 0..partitions {
            verify_partition(&fs, &log_dir, &name, p, &mut report);
        }
    }
    verify_cursors(&fs, &log_dir, &mut report);
    let Report { out, problems } = report;
    writeln!(out, "{problems} problem(s) found")?;
    Ok(problems)
}

fn verify_partition(fs: &dyn Fs, log_dir: &Path, topic: &str, p: u32, report: &mut Report<'_>) {
    let files = partition_files(fs, log_dir, topic, p);
    let mut expected: Option<u64> = None;
    let mut records = 0u64;
    for (i, base) in files.bases.iter().enumerate() {
        let path = segment::log_path(&files.dir, *base);
        let last = i + 1 == files.bases.len();
        if let Some(want) = expected.filter(|want| want != base) {
            report.damage(
                &path,
                0,
                &format!("offset gap: previous segment ends at {want}"),
            );
        }
        let (scan, len, bytes) = match scan_file(fs, &files.dir, *base) {
            Ok(found) => found,
            Err(damage) if last => {
                report.note(&format!(
                    "{}: unusable header ({}), rewritten on next start",
                    path.display(),
                    damage.reason
                ));
                continue;
            }
            Err(damage) => {
                report.damage(&path, damage.position, &damage.reason);
                continue;
            }
        };
        if let Some(damage) = &scan.header_damage {
            let reason = format!(
                "{}; its batches are intact and read with their generation {}",
                damage.reason, scan.header.generation
            );
            if last {
                let path = path.display();
                report.note(&format!("{path}: {reason} (rewritten on next start)"));
            } else {
                report.damage(&path, damage.position, &reason);
            }
        }
        let lost: u64 = scan.skipped.iter().map(|s| s.lost.end - s.lost.start).sum();
        records += scan.end_offset - base - lost;
        expected = Some(scan.end_offset);
        for skipped in &scan.skipped {
            report.damage(
                &path,
                skipped.damage.position,
                &format!(
                    "{}; valid batches resume at byte {}, offsets {}..{} lost",
                    skipped.damage.reason, skipped.resume, skipped.lost.start, skipped.lost.end
                ),
            );
        }
        if last {
            if let End::Torn(damage) = &scan.end {
                report.note(&format!(
                    "{}: torn tail of {} bytes after byte {} ({}; truncated on next start)",
                    path.display(),
                    len - damage.position,
                    damage.position,
                    damage.reason
                ));
            }
            continue;
        }
        match &scan.end {
            End::Torn(damage) | End::Stale(damage) => {
                report.damage(&path, damage.position, &damage.reason);
            }
            End::Clean if scan.valid_len != len => {
                report.damage(&path, scan.valid_len, "bytes after the last batch");
            }
            End::Clean => {}
        }
        let next = files.bases.get(i + 1).copied().unwrap_or(scan.end_offset);
        verify_indexes(fs, &files.dir, *base, next, &bytes, len, report);
    }
    let _ = writeln!(
        report.out,
        "checked {topic}/{p}: {} segment(s), {records} record(s)",
        files.bases.len()
    );
}

fn verify_indexes(
    fs: &dyn Fs,
    dir: &Path,
    base: u64,
    next: u64,
    log: &[u8],
    len: u64,
    report: &mut Report<'_>,
) {
    let mut starts = BTreeMap::new();
    let generation = segment::header(log, base).map_or(0, |(h, _)| h.generation);
    let _ = segment::walk_all(
        log,
        SEGMENT_HEADER_LEN as u64,
        generation,
        |pos, header, _| {
            starts.insert(pos, header.base_offset);
            ControlFlow::Continue(())
        },
        |_| {},
    );
    for time in [false, true] {
        let path = if time {
            segment::time_index_path(dir, base)
        } else {
            segment::index_path(dir, base)
        };
        let Ok(bytes) = fs.read(&path) else {
            report.note(&format!(
                "{} missing (rebuilt on next start)",
                path.display()
            ));
            continue;
        };
        let view = match IndexView::parse(&bytes, time) {
            Ok(view) => view,
            Err(err) => {
                report.damage(&path, 0, &err.to_string());
                continue;
            }
        };
        if view.header.log_len != len || view.header.end_offset != next {
            report.damage(
                &path,
                0,
                "stale: describes a different segment length or end offset",
            );
            continue;
        }
        let mut last_ts = i64::MIN;
        for i in 0..view.len() {
            let ok = if time {
                view.time_entry(i).is_some_and(|e| {
                    let ordered = e.ts >= last_ts;
                    last_ts = e.ts;
                    ordered && starts.values().any(|o| *o == base + u64::from(e.rel))
                })
            } else {
                view.offset_entry(i).is_some_and(|e| {
                    starts.get(&u64::from(e.pos)) == Some(&(base + u64::from(e.rel)))
                })
            };
            if !ok {
                report.damage(
                    &path,
                    48 + i as u64 * if time { 12 } else { 8 },
                    &format!("entry {i} does not match the segment"),
                );
                break;
            }
        }
    }
}

fn verify_cursors(fs: &dyn Fs, log_dir: &Path, report: &mut Report<'_>) {
    let path = log_dir.join(CURSORS_FILE);
    let Ok(bytes) = fs.read(&path) else {
        return;
    };
    let check = crate::cursors::check_for_tools(&bytes);
    let positions = check.positions;
    if !check.header_ok {
        report.damage(
            &path,
            0,
            &format!("not a valid cursor log header; {positions} position(s) salvageable"),
        );
    }
    for range in check.skipped.iter().filter(|r| r.start > 0) {
        report.damage(
            &path,
            range.start,
            &format!(
                "{} damaged bytes before the next valid entry",
                range.end - range.start
            ),
        );
    }
    if check.valid < bytes.len() as u64 && check.valid > 0 {
        report.note(&format!(
            "{}: torn tail after byte {} (dropped on next start)",
            path.display(),
            check.valid
        ));
    }
    let kept = fs.list_dir(log_dir).unwrap_or_default();
    for name in kept
        .iter()
        .filter(|n| n.starts_with("cursors.log.damaged-"))
    {
        report.note(&format!(
            "{}: a damaged cursor log kept when its entries were salvaged (remove it when done)",
            log_dir.join(name).display()
        ));
    }
    let _ = writeln!(report.out, "checked cursors: {positions} position(s)");
}
