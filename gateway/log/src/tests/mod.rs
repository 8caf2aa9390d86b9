//! Tests of the whole log through its public API on the in-memory fault-injecting file system:
//! model-based round trips and lookups, retention, index rebuild, cursors, and power cuts.

mod address_space;
mod allocation;
mod clock;
mod closed_loop;
mod codec;
mod cold;
mod contract;
mod crash;
mod damage;
mod model;

use std::path::Path;
use std::sync::Arc;

use super::fs::FaultyFs;
use super::{Log, LogConfig, Record};

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("test runtime")
}

/// A record whose value names its producer and sequence number.
pub fn record(producer: u64, seq: u64, ts: i64) -> Record {
    Record {
        timestamp_ms: ts,
        key: (seq % 3 == 0).then(|| format!("k{producer}").into_bytes().into()),
        value: format!("p{producer}-s{seq}-{}", "x".repeat((seq % 7) as usize * 9))
            .into_bytes()
            .into(),
        headers: if seq % 2 == 0 {
            crate::Headers::from(vec![("h".into(), seq.to_le_bytes().to_vec().into())])
        } else {
            crate::Headers::new()
        },
    }
}

pub async fn open(fs: &FaultyFs, config: &LogConfig) -> Log {
    Log::open_with_fs(Arc::new(fs.clone()), Path::new("/data/log"), config)
        .await
        .expect("log opens")
}

/// Opens the log on `fs` with the clock `clock`.
pub async fn open_clocked(
    fs: &FaultyFs,
    clock: &Arc<super::ManualClock>,
    config: &LogConfig,
) -> Log {
    let clock: Arc<dyn super::Clock> = Arc::clone(clock) as _;
    Log::open_with_clock(Arc::new(fs.clone()), clock, Path::new("/data/log"), config)
        .await
        .expect("log opens")
}

/// Every record of a partition, in order (of either log: the contract suite reads both).
pub fn read_all(
    log: &impl super::LogPort,
    topic: &str,
    partition: u32,
) -> Vec<super::StoredRecord> {
    let (start, end) = log.offsets(topic, partition).expect("offsets");
    let mut out = Vec::new();
    let mut next = start;
    while next < end {
        let chunk = log.read(topic, partition, next, 1000).expect("read");
        let Some(last) = chunk.last() else { break };
        next = last.offset + 1;
        out.extend(chunk);
    }
    out
}
