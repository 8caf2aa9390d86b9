//! Disk a partition holds: idle (created, never written) and after its first record, with the
//! production defaults (`segment_bytes` 64 MiB). A segment's allocation grows in steps ahead of
//! its commits (`tern_log`'s `ALLOCATION_STEP`), so an idle partition holds its segment header,
//! not a whole preallocated segment.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tern_log::{Log, LogConfig, Record};

use crate::error::BenchError;

/// Partitions the figure is averaged over.
const PARTITIONS: u32 = 32;

/// Bytes held per partition.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeldFigures {
    pub partitions: u32,
    pub segment_bytes: u64,
    /// Allocated bytes per partition that never received a record.
    pub idle_bytes: u64,
    /// Allocated bytes per partition after one 100-byte record.
    pub one_record_bytes: u64,
}

/// Creates a topic of [`PARTITIONS`] partitions under `dir` and measures what each holds
/// before and after one record.
pub async fn held(dir: &Path) -> Result<HeldFigures, BenchError> {
    let config = LogConfig::default();
    let log = Log::open(dir, &config)
        .await
        .map_err(|source| BenchError::log("open", source))?;
    log.create_topic("idle", PARTITIONS)
        .map_err(|source| BenchError::log("create_topic", source))?;
    let topic = dir.join("topics").join("idle");
    let idle = allocated(&topic)? / u64::from(PARTITIONS);
    for partition in 0..PARTITIONS {
        let record = Record {
            timestamp_ms: 0,
            key: None,
            value: vec![b'x'; 100].into(),
            headers: tern_log::Headers::new(),
        };
        log.append("idle", partition, vec![record])
            .await
            .map_err(|source| BenchError::log("append", source))?;
    }
    let one_record = allocated(&topic)? / u64::from(PARTITIONS);
    log.close()
        .await
        .map_err(|source| BenchError::log("close", source))?;
    Ok(HeldFigures {
        partitions: PARTITIONS,
        segment_bytes: config.segment_bytes.0,
        idle_bytes: idle,
        one_record_bytes: one_record,
    })
}

/// Bytes the file system allocated to `path`: a file, or every file under a directory.
fn allocated(path: &Path) -> Result<u64, BenchError> {
    let meta = std::fs::metadata(path).map_err(|source| BenchError::file("stat", path, source))?;
    if !meta.is_dir() {
        return Ok(meta.blocks() * 512);
    }
    let entries =
        std::fs::read_dir(path).map_err(|source| BenchError::file("list", path, source))?;
    let mut total = 0;
    for entry in entries {
        let entry = entry.map_err(|source| BenchError::file("list", path, source))?;
        total += allocated(&entry.path())?;
    }
    Ok(total)
}
