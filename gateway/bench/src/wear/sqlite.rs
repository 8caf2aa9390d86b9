//! The comparison of `tern-bench wear`: the same messages stored in SQLite in WAL mode with
//! `synchronous=FULL` (every commit fsyncs the WAL, as durable as tern's acknowledgements),
//! one row per message, the rows that arrived since the last commit committed together every
//! `interval`: the cadence tern's commit window chose at the same rate. A message's latency is
//! from its (evenly spaced) arrival to the end of its commit.
//!
//! It only writes its own database under the directory it is given.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::Measured;
use crate::BenchError;
use crate::log::device::Target;

/// Inserts `rate` rows of `size` bytes a second for `seconds`, committing every `interval`,
/// into a fresh database under `dir`; device bytes from after the schema is created to after
/// the last commit is written back.
pub fn run(
    target: &Target,
    dir: &Path,
    rate: f64,
    size: usize,
    interval: Duration,
    seconds: Duration,
) -> Result<Measured, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::file("mkdir", dir, source))?;
    let db = open(&dir.join("wear.db"))?;
    target.sync()?;
    let journal_before = super::journal_bytes(target);
    let before = target.written()?;
    let started = Instant::now();
    let payload = vec![0x5au8; size];
    let spacing = Duration::from_secs_f64(1.0 / rate.max(f64::MIN_POSITIVE));
    let mut latencies = Vec::new();
    let mut next_arrival = started;
    let mut next_commit = started + interval;
    let end = started + seconds;
    while next_commit <= end {
        std::thread::sleep(next_commit.saturating_duration_since(Instant::now()));
        let mut arrivals = Vec::new();
        while next_arrival <= next_commit {
            arrivals.push(next_arrival);
            next_arrival += spacing;
        }
        commit(&db, &arrivals, &payload)?;
        let done = Instant::now();
        latencies.extend(arrivals.iter().map(|a| done.saturating_duration_since(*a)));
        next_commit += interval;
    }
    let elapsed = started.elapsed();
    target.sync()?;
    let device_bytes = target.written()?.saturating_sub(before);
    let journal = super::journal_bytes(target)
        .zip(journal_before)
        .map(|(b, a)| b.saturating_sub(a));
    let commits = (seconds.as_secs_f64() / interval.as_secs_f64()).floor();
    db.close().map_err(|(_, source)| sqlite("close", source))?;
    let mut measured = Measured::new(
        latencies,
        device_bytes,
        elapsed,
        commits / elapsed.as_secs_f64(),
    );
    measured.journal_bytes = journal;
    Ok(measured)
}

fn open(path: &Path) -> Result<Connection, BenchError> {
    let db = Connection::open(path).map_err(|source| sqlite("open", source))?;
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; \
         CREATE TABLE messages (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, \
         topic TEXT NOT NULL, payload BLOB NOT NULL);",
    )
    .map_err(|source| sqlite("setup", source))?;
    Ok(db)
}

/// One transaction holding a row per arrival.
fn commit(db: &Connection, arrivals: &[Instant], payload: &[u8]) -> Result<(), BenchError> {
    let tx = db
        .unchecked_transaction()
        .map_err(|source| sqlite("begin", source))?;
    let now_ms = tern_core::time::now_ms();
    for (i, _) in arrivals.iter().enumerate() {
        let topic = format!("sensors/{}", i % 50);
        tx.prepare_cached("INSERT INTO messages (ts, topic, payload) VALUES (?1, ?2, ?3)")
            .and_then(|mut insert| insert.execute((now_ms, topic, payload)))
            .map_err(|source| sqlite("insert", source))?;
    }
    tx.commit().map_err(|source| sqlite("commit", source))
}

fn sqlite(op: &'static str, source: rusqlite::Error) -> BenchError {
    BenchError::Sqlite {
        op,
        message: source.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_arrival_is_committed_at_the_cadence() -> Result<(), BenchError> {
        let parent = std::env::temp_dir().join(format!("tern-wear-sqlite-{}", std::process::id()));
        std::fs::create_dir_all(&parent).map_err(|s| BenchError::file("mkdir", &parent, s))?;
        let target = Target::prepare(&parent, 1 << 20, false)?;
        let dir = target.dir().join("db");
        let run = run(
            &target,
            &dir,
            200.0,
            100,
            Duration::from_millis(50),
            Duration::from_millis(500),
        )?;
        // 10 commits of the arrivals every 5 ms since the start (the first at 0).
        assert_eq!(run.messages, 101);
        assert!(run.p99_ms >= run.p50_ms && run.p99_ms >= 45.0, "{run:?}");
        let db = Connection::open(dir.join("wear.db")).map_err(|s| sqlite("open", s))?;
        let rows: u64 = db
            .query_row("SELECT count(*) FROM messages", (), |r| r.get(0))
            .map_err(|s| sqlite("count", s))?;
        assert_eq!(rows, 101);
        drop((db, target));
        std::fs::remove_dir_all(&parent).map_err(|s| BenchError::file("rmdir", &parent, s))
    }
}
