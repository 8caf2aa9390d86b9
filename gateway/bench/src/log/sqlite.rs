//! The comparison: the same append workload through SQLite in WAL mode, as brokers' offline
//! caches (NanoMQ, Mosquitto's sqlite plugin) store messages: one INSERT per message, each its
//! own transaction, with `synchronous=NORMAL` or `FULL`.
//!
//! It only writes its own database under the directory it is given and never uses the log.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::device::Target;
use super::{AppendRun, AppendSpec};
use crate::BenchError;
use crate::stats::Latency;

/// SQLite's `synchronous` setting under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// WAL is fsynced only at checkpoints: committed rows can be lost on power loss.
    Normal,
    /// WAL is fsynced at every commit: as durable as tern's `sync`.
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Self::Normal => "NORMAL",
            Self::Full => "FULL",
        }
    }
}

/// Runs `spec` against a fresh database in `dir` (removed afterwards), counting device bytes
/// from just before opening to just after closing (including the final checkpoint).
pub fn append(
    target: &Target,
    dir: &Path,
    sync: Synchronous,
    spec: &AppendSpec,
) -> Result<AppendRun, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
    target.drop_cache(dir)?;
    let before = target.written()?;
    let connection = open(&dir.join("bench.db"), sync)?;
    let started = Instant::now();
    let (connection, records, mut latencies) = insert_concurrently(connection, spec)?;
    let secs = started.elapsed().as_secs_f64();
    connection
        .close()
        .map_err(|(_, source)| sqlite("close", source))?;
    target.sync()?;
    let device_bytes = target.written()?.saturating_sub(before);
    std::fs::remove_dir_all(dir).map_err(|source| io(dir, source))?;
    Ok(AppendRun {
        records,
        payload_bytes: records * spec.record_size as u64,
        secs,
        device_bytes,
        latency: Latency::of(&mut latencies),
        fdatasyncs: None,
        fdatasync_secs: None,
        cpu_secs: None,
    })
}

fn open(path: &Path, sync: Synchronous) -> Result<Connection, BenchError> {
    let connection = Connection::open(path).map_err(|source| sqlite("open", source))?;
    let setup = format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={}; \
         CREATE TABLE messages (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, payload BLOB NOT NULL);",
        sync.pragma()
    );
    connection
        .execute_batch(&setup)
        .map_err(|source| sqlite("setup", source))?;
    Ok(connection)
}

/// `spec.appenders` threads share the one connection (SQLite has one writer at a time), each
/// inserting one row per transaction until the record or time budget is spent (`spec.batch`
/// does not apply: brokers' caches insert message by message).
fn insert_concurrently(
    connection: Connection,
    spec: &AppendSpec,
) -> Result<(Connection, u64, Vec<Duration>), BenchError> {
    let shared = Mutex::new(connection);
    let claimed = AtomicU64::new(0);
    let deadline = Instant::now() + spec.max_duration;
    let payload = vec![0x5Au8; spec.record_size];
    let results: Vec<Result<Vec<Duration>, BenchError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..spec.appenders)
            .map(|_| {
                scope.spawn(|| appender(&shared, &claimed, deadline, spec.max_records, &payload))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap_or_else(|_| Err(panicked())))
            .collect()
    });
    let mut latencies = Vec::new();
    for result in results {
        latencies.extend(result?);
    }
    let connection = shared.into_inner().map_err(|_| panicked())?;
    Ok((connection, latencies.len() as u64, latencies))
}

fn appender(
    shared: &Mutex<Connection>,
    claimed: &AtomicU64,
    deadline: Instant,
    max_records: u64,
    payload: &[u8],
) -> Result<Vec<Duration>, BenchError> {
    let mut latencies = Vec::new();
    while Instant::now() < deadline
        && !super::interrupted()
        && claimed.fetch_add(1, Ordering::Relaxed) < max_records
    {
        let started = Instant::now();
        let connection = shared.lock().map_err(|_| panicked())?;
        let now_ms = tern_core::time::now_ms();
        connection
            .prepare_cached("INSERT INTO messages (ts, payload) VALUES (?1, ?2)")
            .and_then(|mut insert| insert.execute((now_ms, payload)))
            .map_err(|source| sqlite("insert", source))?;
        drop(connection);
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}

fn panicked() -> BenchError {
    BenchError::task("an SQLite appender thread", "panicked")
}

fn sqlite(op: &'static str, source: rusqlite::Error) -> BenchError {
    BenchError::Sqlite {
        op,
        message: source.to_string(),
    }
}

fn io(path: &Path, source: std::io::Error) -> BenchError {
    BenchError::file("sqlite dir", path, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_modes_store_every_record_they_count() -> Result<(), BenchError> {
        let parent = std::env::temp_dir().join(format!("tern-sqlite-unit-{}", std::process::id()));
        std::fs::create_dir_all(&parent).map_err(|source| io(&parent, source))?;
        let target = Target::prepare(&parent, 1 << 20, false)?;
        let spec = AppendSpec {
            record_size: 100,
            appenders: 4,
            batch: 1,
            inflight: 1,
            max_records: 200,
            max_duration: Duration::from_secs(20),
        };
        for sync in [Synchronous::Normal, Synchronous::Full] {
            let run = append(&target, &target.dir().join("db"), sync, &spec)?;
            assert_eq!(run.records, 200, "{sync:?}");
            assert_eq!(run.payload_bytes, 20_000);
            assert!(run.latency.p99_us >= run.latency.p50_us && run.latency.p50_us > 0.0);
        }
        drop(target);
        std::fs::remove_dir_all(&parent).map_err(|source| io(&parent, source))
    }
}
