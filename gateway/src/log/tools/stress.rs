//! `tern log stress` (hidden): appends from several tasks forever (or up to a count) and prints
//! one line per acknowledged append, flushed at once, so a test can kill the process at any
//! moment and then check that every printed record is in the log.
//!
//! Test equipment for the crash tests; never part of normal operation.

use std::io::Write;
use std::path::Path;

use crate::config::ByteSize;
use crate::datadir::DataDirLock;
use crate::log::{Log, LogConfig, Record};

/// Settings of a stress run.
#[derive(Debug, Clone)]
pub struct StressOptions {
    pub tasks: u32,
    /// Appends per task; 0 = until killed.
    pub appends: u64,
    pub segment_bytes: u64,
}

/// Value of record `i` of append `seq` by `task` in process `pid`: unique across runs.
pub fn stress_value(pid: u32, task: u32, seq: u64, i: u64) -> String {
    format!("pid{pid}-task{task}-seq{seq}-rec{i}")
}

/// Runs the stress writer on `data_dir/log`, topic `stress`, partition 0.
pub async fn stress(data_dir: &Path, options: StressOptions) -> anyhow::Result<()> {
    let lock = DataDirLock::acquire(data_dir)?;
    let config = LogConfig {
        segment_bytes: ByteSize(options.segment_bytes),
        ..LogConfig::default()
    };
    let log = Log::open(&data_dir.join("log"), &config).await?;
    log.ensure_topic("stress")?;
    let pid = std::process::id();
    let tasks: Vec<_> = (0..options.tasks)
        .map(|task| tokio::spawn(run_task(log.clone(), pid, task, options.appends)))
        .collect();
    for task in tasks {
        task.await??;
    }
    log.close().await?;
    drop(lock);
    Ok(())
}

async fn run_task(log: Log, pid: u32, task: u32, appends: u64) -> anyhow::Result<()> {
    let mut seq = 0u64;
    while appends == 0 || seq < appends {
        let count = 1 + (seq + u64::from(task)) % 3;
        let records: Vec<Record> = (0..count)
            .map(|i| Record {
                timestamp_ms: i64::try_from(seq).unwrap_or(0),
                key: Some(format!("task{task}").into_bytes()),
                value: stress_value(pid, task, seq, i).into_bytes(),
                headers: vec![("seq".to_owned(), seq.to_le_bytes().to_vec())],
            })
            .collect();
        let offset = log.append("stress", 0, records).await?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ack {offset} {count} {pid} {task} {seq}")?;
        out.flush()?;
        seq += 1;
    }
    Ok(())
}
