//! Kafka's v2 record batches ↔ log records, through kafka-protocol's batch codec: Produce's
//! batches (any codec kafka-protocol has: gzip, snappy, lz4, zstd) become [`Record`]s with their
//! headers, and Fetch gets stored records back as batches whose offsets are the log's offsets,
//! compressed again where the producer's were ([`FetchBatch`]).
//!
//! Mapping: a null value is stored as an empty value and a null header value as an empty one
//! (the log has no nulls); a timestamp of -1 or a `LogAppendTime` batch gets the broker's
//! clock. Control records (transaction markers) are dropped. Kafka's header map keeps one value
//! per name, so a name repeated in a stored record (an MQTT user property given twice) reaches
//! Kafka consumers once, with its last value.
//!
//! Never panics on a client's bytes: batch headers are checked before kafka-protocol sizes
//! anything from them.
#![expect(
    clippy::big_endian_bytes,
    reason = "Kafka's protocol is big-endian by definition"
)]

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record as KafkaRecord, RecordBatchDecoder, RecordBatchEncoder,
    RecordEncodeOptions, TimestampType,
};
use tern_log::{BatchSpan, Codec, Record, RecordView};

/// Offset of a v2 batch's magic byte, of its attributes and of its record count.
const MAGIC_AT: usize = 16;
const ATTRIBUTES_AT: usize = 21;
const COUNT_AT: usize = 57;
/// Offsets of a v2 batch's last offset delta, producer id, producer epoch and base sequence.
const LAST_DELTA_AT: usize = 23;
const PRODUCER_ID_AT: usize = 43;
const EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
/// The smallest record on the wire: length, attributes, timestamp and offset deltas, key and
/// value lengths, header count, one byte each.
const MIN_RECORD: usize = 7;
/// Records a compressed batch may claim (its wire size says nothing about the count).
const MAX_COMPRESSED_RECORDS: usize = 1 << 20;

/// Why a produced record set was refused (Kafka's `CORRUPT_MESSAGE`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordsError {
    #[error("record batch: {0}")]
    Corrupt(String),
    #[error("message format v{0} (only v2 record batches are accepted)")]
    OldFormat(i8),
}

/// The records of a Produce partition's record set.
pub fn decode(bytes: &Bytes, now_ms: i64) -> Result<Vec<Record>, RecordsError> {
    check_batches(bytes)?;
    let mut buf = bytes.clone();
    let sets = RecordBatchDecoder::decode_all(&mut buf)
        .map_err(|err| RecordsError::Corrupt(err.to_string()))?;
    let mut records = Vec::new();
    for set in sets {
        for record in set.records.into_iter().filter(|r| !r.control) {
            records.push(to_log(record, now_ms));
        }
    }
    Ok(records)
}

/// Walks the batch headers: each must be a whole v2 batch whose record count its bytes (or,
/// compressed, a fixed bound) can hold.
fn check_batches(bytes: &[u8]) -> Result<(), RecordsError> {
    let corrupt = |what: &str| RecordsError::Corrupt(what.to_owned());
    let mut rest = bytes;
    while !rest.is_empty() {
        let (total, next) = split_batch(rest)?;
        let magic = rest
            .get(MAGIC_AT)
            .copied()
            .ok_or_else(|| corrupt("no magic byte"))?;
        let magic = i8::from_be_bytes([magic]);
        if magic != 2 {
            return Err(RecordsError::OldFormat(magic));
        }
        let count = read_i32(rest, COUNT_AT).ok_or_else(|| corrupt("truncated batch header"))?;
        let count = usize::try_from(count).map_err(|_| corrupt("negative record count"))?;
        let compressed = rest
            .get(ATTRIBUTES_AT + 1)
            .is_some_and(|attributes| attributes & 0x7 != 0);
        let room = if compressed {
            MAX_COMPRESSED_RECORDS
        } else {
            (total - COUNT_AT.min(total)) / MIN_RECORD
        };
        if count > room {
            return Err(corrupt("more records than the batch can hold"));
        }
        rest = next;
    }
    Ok(())
}

/// The size of the largest whole batch of a record set (what Kafka's `max.message.bytes` is
/// compared with: the batch as produced, compressed if it is); batches whose header does not
/// add up end the walk ([`decode`] refuses them).
pub fn largest_batch(bytes: &[u8]) -> usize {
    let mut rest = bytes;
    let mut largest = 0;
    while let Ok((total, next)) = split_batch(rest) {
        largest = largest.max(total);
        if next.is_empty() {
            break;
        }
        rest = next;
    }
    largest
}

/// The codec a record set was produced with: its batches' (a producer sends one batch per
/// partition), or none if they differ or a header does not add up.
pub fn codec(bytes: &[u8]) -> Codec {
    let mut rest = bytes;
    let mut found = None;
    while let Ok((_, next)) = split_batch(rest) {
        let attributes = rest.get(ATTRIBUTES_AT + 1).copied().unwrap_or(0);
        let codec = Codec::from_attributes(u16::from(attributes));
        if found.is_some_and(|f| f != codec) {
            return Codec::None;
        }
        found = Some(codec);
        if next.is_empty() {
            break;
        }
        rest = next;
    }
    found.unwrap_or_default()
}

/// The length of the whole batch that starts `rest`, and what follows it.
fn split_batch(rest: &[u8]) -> Result<(usize, &[u8]), RecordsError> {
    let corrupt = |what: &str| RecordsError::Corrupt(what.to_owned());
    let length = read_i32(rest, 8).ok_or_else(|| corrupt("truncated batch header"))?;
    let length = usize::try_from(length).map_err(|_| corrupt("negative batch length"))?;
    let total = length
        .checked_add(12)
        .filter(|&total| total <= rest.len())
        .ok_or_else(|| corrupt("batch longer than its record set"))?;
    Ok((total, rest.get(total..).unwrap_or_default()))
}

/// An idempotent producer's batch as its header names it: who sent it, at which epoch, and
/// the sequences of its first and last records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    pub producer_id: i64,
    pub epoch: i16,
    pub first_seq: i32,
    pub last_seq: i32,
}

/// What the log keeps of the batch (its producer section), and what it gives back at start.
impl From<ProducerBatch> for tern_log::ProducerStamp {
    fn from(b: ProducerBatch) -> Self {
        Self {
            producer_id: b.producer_id,
            epoch: b.epoch,
            first_seq: b.first_seq,
            last_seq: b.last_seq,
        }
    }
}

impl From<tern_log::ProducerStamp> for ProducerBatch {
    fn from(s: tern_log::ProducerStamp) -> Self {
        Self {
            producer_id: s.producer_id,
            epoch: s.epoch,
            first_seq: s.first_seq,
            last_seq: s.last_seq,
        }
    }
}

/// The producer of a Produce partition's record set, if it names one (producer id >= 0). An
/// idempotent producer sends exactly one batch per partition (Kafka refuses any other record
/// set from Produce v3 on), with a sequence and an epoch; the last sequence wraps from
/// `i32::MAX` to 0 as Kafka's does. Reads only the batch headers, never panics.
pub fn producer_batch(bytes: &[u8]) -> Result<Option<ProducerBatch>, RecordsError> {
    let corrupt = |what: &str| RecordsError::Corrupt(what.to_owned());
    let mut rest = bytes;
    let mut batches = 0_usize;
    let mut found = None;
    while !rest.is_empty() {
        let (total, next) = split_batch(rest)?;
        let header = rest.get(..total).unwrap_or_default();
        let producer_id =
            read_i64(header, PRODUCER_ID_AT).ok_or_else(|| corrupt("truncated batch header"))?;
        batches += 1;
        if producer_id >= 0 {
            let epoch = read_i16(header, EPOCH_AT);
            let first_seq = read_i32(header, BASE_SEQUENCE_AT);
            let delta = read_i32(header, LAST_DELTA_AT);
            let (Some(epoch), Some(first_seq), Some(delta)) = (epoch, first_seq, delta) else {
                return Err(corrupt("truncated batch header"));
            };
            if epoch < 0 || first_seq < 0 || delta < 0 {
                return Err(corrupt(
                    "a batch with a producer id needs an epoch, a sequence and a last offset delta",
                ));
            }
            let last = (i64::from(first_seq) + i64::from(delta)) % (i64::from(i32::MAX) + 1);
            found = Some(ProducerBatch {
                producer_id,
                epoch,
                first_seq,
                last_seq: i32::try_from(last).unwrap_or_default(),
            });
        }
        rest = next;
    }
    if found.is_some() && batches > 1 {
        return Err(corrupt(
            "an idempotent producer's record set must be exactly one batch",
        ));
    }
    Ok(found)
}

fn read_i16(bytes: &[u8], at: usize) -> Option<i16> {
    let word = bytes.get(at..at + 2)?.first_chunk::<2>()?;
    Some(i16::from_be_bytes(*word))
}

fn read_i64(bytes: &[u8], at: usize) -> Option<i64> {
    let word = bytes.get(at..at + 8)?.first_chunk::<8>()?;
    Some(i64::from_be_bytes(*word))
}

fn read_i32(bytes: &[u8], at: usize) -> Option<i32> {
    let word = bytes.get(at..at + 4)?.first_chunk::<4>()?;
    Some(i32::from_be_bytes(*word))
}

fn to_log(record: KafkaRecord, now_ms: i64) -> Record {
    let timestamp_ms = if record.timestamp_type == TimestampType::LogAppend || record.timestamp < 0
    {
        now_ms
    } else {
        record.timestamp
    };
    Record {
        timestamp_ms,
        // Slices of the request's buffer: nothing copied between the request and the batch.
        key: record.key,
        value: record.value.unwrap_or_default(),
        headers: record
            .headers
            .into_iter()
            .map(|(name, value)| {
                (
                    name.to_string().into(),
                    value.map(|v| v.to_vec()).unwrap_or_default().into(),
                )
            })
            .collect(),
    }
}

/// Stored records gathered for one Fetch partition, then written as v2 batches whose offsets
/// are the log's: the records of each stored batch that arrived compressed
/// ([`tern_log::BatchSpan`]) as one batch compressed with that codec again (a consumer gets
/// what the producer sent, batch for batch, as from Kafka; one that bounds decompression, such
/// as franz-go's `MaxDecompressBatchBytes`, sees the producer's batch), and runs of uncompressed
/// records as one uncompressed batch. The log's reader lends
/// each record from its segment ([`tern_log::LogPort::read_each`]); its key, value and header
/// bytes are copied once, into one buffer, and kafka-protocol's encoder writes the batch from
/// slices of that buffer: no allocation per record, but a header map for a record that has
/// headers (kafka-protocol's record type holds them in one).
#[derive(Debug, Default)]
pub struct FetchBatch {
    data: BytesMut,
    records: Vec<Gathered>,
    /// (name, value) ranges in `data`, each record's run named by [`Gathered::headers`].
    headers: Vec<(Range<usize>, Range<usize>)>,
    /// The records of each answered batch, in order.
    runs: Vec<Run>,
}

/// Consecutive records answered as one batch.
#[derive(Debug)]
struct Run {
    /// Index in `records` after the run's last record.
    end: usize,
    codec: Codec,
    /// End offset of the stored batch of compressed records (`u64::MAX` for uncompressed).
    next_offset: u64,
}

/// One record of a [`FetchBatch`], its bytes as ranges of the batch's buffer.
#[derive(Debug)]
struct Gathered {
    offset: i64,
    timestamp_ms: i64,
    key: Option<Range<usize>>,
    value: Range<usize>,
    headers: Range<usize>,
}

/// What a [`FetchBatch`] reserves up front at most, whatever a client's byte budget says.
const MAX_RESERVE: usize = 1 << 20;

impl FetchBatch {
    /// An empty batch expecting about `bytes` of records.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            data: BytesMut::with_capacity(bytes.min(MAX_RESERVE)),
            records: Vec::new(),
            headers: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// Adds the record stored at `offset`, answered uncompressed.
    #[cfg(test)]
    pub fn push(&mut self, offset: u64, record: &RecordView<'_>) {
        self.push_in(
            offset,
            record,
            BatchSpan {
                next_offset: u64::MAX,
                codec: Codec::None,
            },
        );
    }

    /// Adds the record stored at `offset` in the stored batch `span`.
    pub fn push_in(&mut self, offset: u64, record: &RecordView<'_>, span: BatchSpan) {
        let next_offset = if span.codec == Codec::None {
            u64::MAX
        } else {
            span.next_offset
        };
        let end = self.records.len() + 1;
        match self.runs.last_mut() {
            Some(run) if run.codec == span.codec && run.next_offset == next_offset => run.end = end,
            _ => self.runs.push(Run {
                end,
                codec: span.codec,
                next_offset,
            }),
        }
        let first_header = self.headers.len();
        let key = record.key.map(|key| self.put(key));
        let value = self.put(record.value);
        for (name, value) in record.headers() {
            let name = self.put(name.as_bytes());
            let value = self.put(value);
            self.headers.push((name, value));
        }
        self.records.push(Gathered {
            offset: i64::try_from(offset).unwrap_or(i64::MAX),
            timestamp_ms: record.timestamp_ms,
            key,
            value,
            headers: first_header..self.headers.len(),
        });
    }

    /// A last run of compressed records that stops before the end of its stored batch (the byte
    /// budget ran out inside it): the offset after its last record, its batch's end, and
    /// whether it is the only run. Kafka never splits a batch: the first is answered whole,
    /// whatever its size (KIP-74), and a later one is left to the next fetch.
    pub fn open_tail(&self) -> Option<(u64, u64, bool)> {
        let run = self.runs.last()?;
        let last = self.records.get(run.end.checked_sub(1)?)?;
        let after = u64::try_from(last.offset).ok()?.checked_add(1)?;
        (run.codec != Codec::None && after < run.next_offset).then_some((
            after,
            run.next_offset,
            self.runs.len() == 1,
        ))
    }

    /// Leaves out the last run (an [`FetchBatch::open_tail`] after others).
    pub fn drop_tail(&mut self) {
        let Some(run) = self.runs.pop() else { return };
        let start = self.runs.last().map_or(0, |r| r.end);
        if let Some(first) = self.records.get(start) {
            let headers = first.headers.start;
            let data = first.key.as_ref().map_or(first.value.start, |k| k.start);
            self.headers.truncate(headers);
            self.data.truncate(data);
        }
        self.records.truncate(start.min(run.end));
    }

    fn put(&mut self, bytes: &[u8]) -> Range<usize> {
        let start = self.data.len();
        self.data.extend_from_slice(bytes);
        start..self.data.len()
    }

    /// The batch's bytes, sized up front (a fetch answers thousands of records).
    pub fn encode(self) -> Result<Bytes, RecordsError> {
        let Self {
            data,
            records,
            headers,
            runs,
        } = self;
        let estimate = data.len() + records.len() * RECORD_OVERHEAD + BATCH_OVERHEAD;
        let data = data.freeze();
        let kafka = records
            .into_iter()
            .map(|record| {
                let names = headers.get(record.headers.clone()).unwrap_or_default();
                to_kafka(&data, record, names)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut buf = BytesMut::with_capacity(
            estimate + headers.len() * HEADER_OVERHEAD + runs.len() * BATCH_OVERHEAD,
        );
        let mut start = 0;
        for run in runs {
            let options = RecordEncodeOptions {
                version: 2,
                compression: compression(run.codec),
            };
            let these = kafka.get(start..run.end).unwrap_or_default();
            RecordBatchEncoder::encode(&mut buf, these.iter(), &options)
                .map_err(|err| RecordsError::Corrupt(err.to_string()))?;
            start = run.end;
        }
        Ok(buf.freeze())
    }
}

/// kafka-protocol's name of a codec.
fn compression(codec: Codec) -> Compression {
    match codec {
        Codec::None => Compression::None,
        Codec::Gzip => Compression::Gzip,
        Codec::Snappy => Compression::Snappy,
        Codec::Lz4 => Compression::Lz4,
        Codec::Zstd => Compression::Zstd,
    }
}

/// A v2 batch header (61 bytes), rounded up.
const BATCH_OVERHEAD: usize = 64;
/// At most, the varints of one record in a v2 batch beyond its key and value: length,
/// attributes, timestamp and offset deltas, key and value lengths, header count.
const RECORD_OVERHEAD: usize = 30;
/// At most, the two length varints of one header.
const HEADER_OVERHEAD: usize = 10;

fn to_kafka(
    data: &Bytes,
    record: Gathered,
    headers: &[(Range<usize>, Range<usize>)],
) -> Result<KafkaRecord, RecordsError> {
    let mut map = IndexMap::with_capacity(headers.len());
    for (name, value) in headers {
        let name = StrBytes::from_utf8(data.slice(name.clone()))
            .map_err(|_| RecordsError::Corrupt("a stored header name is not UTF-8".to_owned()))?;
        map.insert(name, Some(data.slice(value.clone())));
    }
    Ok(KafkaRecord {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: record.offset,
        // Offset minus sequence is what kafka-protocol keeps constant within one batch; without
        // a producer id the sequence means nothing to consumers.
        sequence: record.offset as i32,
        timestamp: record.timestamp_ms,
        key: record.key.map(|key| data.slice(key)),
        value: Some(data.slice(record.value)),
        headers: map,
    })
}

#[cfg(test)]
pub(crate) mod tests;
