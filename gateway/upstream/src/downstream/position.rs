//! How far the downstream has consumed, kept in the edge log itself: every append of commands
//! ends with a position record (header [`H_POSITION`] naming the command topic, value a small
//! JSON object of each command partition's next offset), in the same batch as the commands, so
//! both become durable together or not at all. At start the last position record of the log
//! topic is the truth ([`last_position`]): no command is appended twice, none skipped. Position
//! records carry no `mqtt.topic`, so MQTT never delivers them. Pure but for the scan, which only
//! reads the log.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tern_log::{LogError, LogPort, Record, RecordView};

/// The header that makes a record a position record; its value is the command topic.
pub const H_POSITION: &str = "tern-downstream-position";
/// The format of a position record's value.
const VERSION: u32 = 1;
/// Bytes read per step of the scan.
const SCAN_BYTES: usize = 256 * 1024;

/// Each command partition's next offset to read.
pub type Positions = BTreeMap<i32, i64>;

#[derive(Debug, Serialize, Deserialize)]
struct Body {
    version: u32,
    /// Partition → next offset; JSON keys are strings.
    next: BTreeMap<String, i64>,
}

/// The position record of command topic `topic` at `next`, stamped `now_ms`.
pub fn position_record(topic: &str, next: &Positions, now_ms: i64) -> Record {
    let body = Body {
        version: VERSION,
        next: next.iter().map(|(p, o)| (p.to_string(), *o)).collect(),
    };
    let value = serde_json::to_vec(&body).unwrap_or_default();
    Record {
        timestamp_ms: now_ms,
        key: None,
        value: value.into(),
        headers: tern_log::Headers::from(vec![(
            H_POSITION.into(),
            topic.as_bytes().to_vec().into(),
        )]),
    }
}

/// Why a position record cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PositionError {
    #[error("not JSON of a position: {0}")]
    Json(String),
    #[error("format version {0}, this tern reads {VERSION}")]
    Version(u32),
    #[error("partition {0:?} is not a partition number")]
    Partition(String),
    #[error("partition {partition} at offset {offset}, below 0")]
    Negative { partition: i32, offset: i64 },
}

/// The positions a position record's `value` holds.
pub fn decode(value: &[u8]) -> Result<Positions, PositionError> {
    let body: Body =
        serde_json::from_slice(value).map_err(|e| PositionError::Json(e.to_string()))?;
    if body.version != VERSION {
        return Err(PositionError::Version(body.version));
    }
    let mut next = Positions::new();
    for (partition, offset) in body.next {
        let partition = partition
            .parse::<i32>()
            .ok()
            .filter(|p| *p >= 0)
            .ok_or(PositionError::Partition(partition))?;
        if offset < 0 {
            return Err(PositionError::Negative { partition, offset });
        }
        next.insert(partition, offset);
    }
    Ok(next)
}

/// The last position of command topic `topic` in partition 0 of `log_topic`, read from offset
/// `from` to the durable end, with the offset of its record; `None` when no position record of
/// that topic is there. A damaged position record is an error: guessing could apply a command
/// twice or skip one.
pub fn last_position<L: LogPort>(
    log: &L,
    log_topic: &str,
    topic: &str,
    from: u64,
) -> Result<Option<(u64, Positions)>, ScanError> {
    let (start, end) = log.offsets(log_topic, 0)?;
    let mut next = from.max(start);
    let mut found: Option<(u64, Vec<u8>)> = None;
    while next < end {
        let mut last = None;
        log.read_each(log_topic, 0, next, SCAN_BYTES, &mut |offset, record| {
            last = Some(offset);
            if position_of(record) == Some(topic.as_bytes()) {
                found = Some((offset, record.value.to_vec()));
            }
        })?;
        match last {
            Some(offset) => next = offset + 1,
            None => break,
        }
    }
    let Some((offset, value)) = found else {
        return Ok(None);
    };
    let positions = decode(&value).map_err(|source| ScanError::Damaged { offset, source })?;
    Ok(Some((offset, positions)))
}

/// The command topic a record is a position of, if it is one.
fn position_of<'a>(record: &RecordView<'a>) -> Option<&'a [u8]> {
    record
        .headers()
        .find(|(name, _)| *name == H_POSITION)
        .map(|(_, value)| value)
}

/// Why the stored position could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("edge log: {0}")]
    Log(#[from] LogError),
    #[error("the position record at offset {offset}: {source}")]
    Damaged {
        offset: u64,
        #[source]
        source: PositionError,
    },
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tern_log::MemoryLog;

    use super::*;

    fn command(n: u8) -> Record {
        Record {
            timestamp_ms: 1,
            key: None,
            value: vec![n].into(),
            headers: tern_log::Headers::from(vec![(
                "mqtt.topic".into(),
                b"devices/1/cmd".to_vec().into(),
            )]),
        }
    }

    #[test]
    fn a_position_record_reads_back_as_written() -> Result<(), PositionError> {
        let next = Positions::from([(0, 12), (3, 0), (17, i64::MAX)]);
        let record = position_record("tern-commands", &next, 5);
        assert_eq!(record.header(H_POSITION), Some(&b"tern-commands"[..]));
        assert_eq!(record.header("mqtt.topic"), None, "never delivered to MQTT");
        assert_eq!(decode(&record.value)?, next);
        Ok(())
    }

    #[test]
    fn a_damaged_or_newer_position_is_an_error_not_a_guess() {
        assert!(matches!(decode(b"{"), Err(PositionError::Json(_))));
        assert_eq!(
            decode(br#"{"version":2,"next":{}}"#),
            Err(PositionError::Version(2))
        );
        assert_eq!(
            decode(br#"{"version":1,"next":{"x":1}}"#),
            Err(PositionError::Partition("x".into()))
        );
        assert_eq!(
            decode(br#"{"version":1,"next":{"-1":1}}"#),
            Err(PositionError::Partition("-1".into()))
        );
        assert_eq!(
            decode(br#"{"version":1,"next":{"1":-4}}"#),
            Err(PositionError::Negative {
                partition: 1,
                offset: -4
            })
        );
    }

    #[tokio::test]
    async fn the_last_position_of_its_own_topic_wins() -> Result<(), Box<dyn std::error::Error>> {
        let log = MemoryLog::new(1);
        log.create_topic("commands", 1)?;
        assert!(last_position(&log, "commands", "tern-commands", 0)?.is_none());
        let first = Positions::from([(0, 3)]);
        let second = Positions::from([(0, 3), (1, 9)]);
        let other = Positions::from([(0, 100)]);
        let batches = [
            vec![command(1), position_record("tern-commands", &first, 1)],
            vec![command(2)],
            vec![command(3), position_record("tern-commands", &second, 2)],
            vec![position_record("other-topic", &other, 3), command(4)],
        ];
        for batch in batches {
            log.append("commands", 0, batch).await?;
        }
        assert_eq!(
            last_position(&log, "commands", "tern-commands", 0)?,
            Some((4, second.clone()))
        );
        // A scan that starts past it finds nothing; one that starts on it finds it.
        assert_eq!(
            last_position(&log, "commands", "tern-commands", 4)?,
            Some((4, second))
        );
        assert!(last_position(&log, "commands", "tern-commands", 5)?.is_none());
        Ok(())
    }

    proptest! {
        /// Any bytes decode to positions or an error, never a panic; what decodes has only
        /// non-negative partitions and offsets.
        #[test]
        fn any_value_decodes_or_is_refused(value in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(next) = decode(&value) {
                prop_assert!(next.iter().all(|(p, o)| *p >= 0 && *o >= 0));
            }
        }

        #[test]
        fn positions_round_trip(next in proptest::collection::btree_map(0..i32::MAX, 0..i64::MAX, 0..8)) {
            let record = position_record("t", &next, 0);
            prop_assert_eq!(decode(&record.value).ok(), Some(next));
        }
    }
}
