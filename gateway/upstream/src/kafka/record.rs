//! The upstream copy of an edge record ([`upstream_record`]: edge key, value, timestamp and
//! headers plus tern's `tern-*` provenance headers and the edge timestamp in `tern-timestamp`, values optionally decoded to JSON) and how
//! records are cut into produce requests by bytes ([`produced_bytes`], `split`,
//! `split_idempotent`). Pure functions: it never sends anything.

use std::collections::BTreeMap;

use tern_log::StoredRecord;
use tern_shared::Reading;

use crate::client::produce::{OutRecord, SEQUENCE_WRAP};
use crate::config::ValueFormat;
use crate::provenance::{H_GATEWAY, H_OFFSET, H_PARTITION, H_TIMESTAMP, H_TOPIC, Provenance};

/// Set when `value_format` asked for a decoded value and the edge value did not decode.
pub const H_DECODE_ERROR: &str = "tern-decode-error";

/// The upstream copy of an edge record: key, value, timestamp and headers, then tern's headers
/// (which replace edge headers of the same name), the edge timestamp among them as
/// `tern-timestamp` (a topic with `LogAppendTime` replaces the record's own timestamp). Headers are kept in a map, so repeated
/// edge header names keep only their last value. With `ValueFormat::ReadingJson` the value is
/// the decoded reading as JSON, or the raw value plus a `tern-decode-error` header.
pub fn upstream_record(
    stored: &StoredRecord,
    source: &Provenance,
    format: ValueFormat,
) -> OutRecord {
    let record = &stored.record;
    let mut headers: BTreeMap<String, Vec<u8>> = record
        .headers
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_vec()))
        .collect();
    let value = match format {
        ValueFormat::Raw => record.value.to_vec(),
        ValueFormat::ReadingJson => match reading_json(&record.value) {
            Ok(json) => json,
            Err(reason) => {
                headers.insert(H_DECODE_ERROR.to_owned(), reason.into_bytes());
                record.value.to_vec()
            }
        },
    };
    headers.insert(H_GATEWAY.to_owned(), source.gateway.clone().into_bytes());
    headers.insert(H_TOPIC.to_owned(), source.topic.clone().into_bytes());
    headers.insert(
        H_PARTITION.to_owned(),
        source.partition.to_string().into_bytes(),
    );
    headers.insert(H_OFFSET.to_owned(), stored.offset.to_string().into_bytes());
    headers.insert(
        H_TIMESTAMP.to_owned(),
        record.timestamp_ms.to_string().into_bytes(),
    );
    OutRecord {
        key: record.key.as_deref().map(<[u8]>::to_vec),
        value,
        headers,
        timestamp_ms: record.timestamp_ms,
    }
}

/// A Reading value as the JSON document `value_format = "reading-json"` forwards, or why it
/// is not one.
fn reading_json(value: &[u8]) -> Result<Vec<u8>, String> {
    let reading = Reading::decode(value).map_err(|err| format!("not a reading: {err}"))?;
    let json = serde_json::to_value(reading).map_err(|err| format!("reading as JSON: {err}"))?;
    serde_json::to_vec(&json).map_err(|err| format!("reading as JSON: {err}"))
}

/// Bytes Kafka's record format adds to each record beside key, value and header bytes (length,
/// attributes, timestamp and offset deltas, lengths: varints, about 4 + 2 per header).
const RECORD_FRAMING: usize = 14;

/// The bytes a record puts into a produce request before compression: key, value, headers
/// and [`RECORD_FRAMING`].
pub fn produced_bytes(record: &OutRecord) -> u64 {
    let headers: usize = record.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    let bytes =
        record.key.as_ref().map_or(0, Vec::len) + record.value.len() + headers + RECORD_FRAMING;
    bytes as u64
}

/// `records` in order, cut into batches of at most `max_bytes` (at least one record each),
/// each with its byte count.
pub(super) fn split(records: Vec<OutRecord>, max_bytes: u64) -> Vec<(Vec<OutRecord>, u64)> {
    let mut batches: Vec<(Vec<OutRecord>, u64)> = Vec::new();
    for record in records {
        let bytes = produced_bytes(&record);
        match batches.last_mut() {
            Some((batch, total)) if *total + bytes <= max_bytes => {
                batch.push(record);
                *total += bytes;
            }
            _ => batches.push((vec![record], bytes)),
        }
    }
    batches
}

/// [`split`] for the idempotent producer: also cut before a record whose edge offset does not
/// follow the one before (never in a contiguous edge log) and where the sequence wraps to 0, so
/// every request is one record batch with consecutive sequence numbers.
pub(super) fn split_idempotent(
    records: Vec<OutRecord>,
    offsets: &[u64],
    max_bytes: u64,
) -> Vec<(Vec<OutRecord>, u64)> {
    let mut batches: Vec<(Vec<OutRecord>, u64)> = Vec::new();
    let mut previous: Option<u64> = None;
    for (record, &offset) in records.into_iter().zip(offsets) {
        let bytes = produced_bytes(&record);
        let follows = previous.is_some_and(|p| p + 1 == offset) && offset % SEQUENCE_WRAP != 0;
        previous = Some(offset);
        match batches.last_mut() {
            Some((batch, total)) if follows && *total + bytes <= max_bytes => {
                batch.push(record);
                *total += bytes;
            }
            _ => batches.push((vec![record], bytes)),
        }
    }
    batches
}
