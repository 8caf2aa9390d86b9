//! The byte format of segment files: the segment file header, record batches and the records
//! inside them (drawn byte by byte in `docs/log-format.md`; the golden tests below pin it).
//!
//! Pure encoding and decoding over byte slices: this module never touches files, and its decoder
//! never panics or allocates more than the input justifies, whatever the bytes.

use super::{Record, RecordView};

mod crc;

/// First eight bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"TERNSEG\0";
/// The log directory's format version: the version of the format marker and of the segment
/// files this build writes. Format 2 added the producer section of a batch
/// ([`ProducerStamp`]); every other file is written as in format 1 ([`FILE_VERSION_1`]), and
/// this build reads every file of versions 1 ..= 2.
pub const FORMAT_VERSION: u16 = 2;
/// The version written into files whose layout format 2 left as it was (indexes, topic
/// metadata and settings, the cursor log).
pub const FILE_VERSION_1: u16 = 1;
/// Bytes of the segment file header.
pub const SEGMENT_HEADER_LEN: usize = 32;
/// Bytes of a batch header; the records follow.
pub const BATCH_HEADER_LEN: usize = 44;
/// Bytes of a batch's producer section, after its header when [`PRODUCER_BIT`] is set.
pub const PRODUCER_SECTION_LEN: usize = 20;
/// The attribute bit saying a producer section follows the batch header.
pub const PRODUCER_BIT: u16 = 1 << 4;
/// Largest batch accepted on write and on read.
pub const MAX_BATCH_LEN: usize = 16 << 20;

/// The header at the start of every segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Every batch of the file carries this generation; other bytes are stale.
    pub generation: u32,
    /// Offset of the first record the segment holds.
    pub base_offset: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut out = [0u8; SEGMENT_HEADER_LEN];
        let mut w = Writer(&mut out[..]);
        w.put(&SEGMENT_MAGIC);
        w.put(&FORMAT_VERSION.to_le_bytes());
        w.put(&0u16.to_le_bytes());
        w.put(&self.generation.to_le_bytes());
        w.put(&self.base_offset.to_le_bytes());
        w.put(&0u32.to_le_bytes());
        let crc = crc32c::crc32c(out.get(..28).unwrap_or_default());
        if let Some(tail) = out.get_mut(28..32) {
            tail.copy_from_slice(&crc.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let head = r.take(SEGMENT_HEADER_LEN)?;
        let mut r = Reader::new(head);
        if r.take(8)? != SEGMENT_MAGIC {
            return Err(DecodeError::Corrupt("not a tern segment file (bad magic)"));
        }
        let version = r.u16()?;
        let _flags = r.u16()?;
        let generation = r.u32()?;
        let base_offset = r.u64()?;
        let _reserved = r.u32()?;
        let stored = r.u32()?;
        let computed = crc32c::crc32c(head.get(..28).unwrap_or_default());
        if stored != computed {
            return Err(DecodeError::Checksum {
                expected: stored,
                got: computed,
            });
        }
        check_version(version)?;
        Ok(Self {
            generation,
            base_offset,
        })
    }
}

/// The fixed-size header of a record batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Bytes of the whole batch, header included.
    pub length: u32,
    pub crc: u32,
    pub base_offset: u64,
    pub generation: u32,
    pub attributes: u16,
    pub record_count: u32,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
}

impl BatchHeader {
    /// Where the batch's records start: after the header and its producer section, if any.
    pub fn records_start(&self) -> usize {
        if self.attributes & PRODUCER_BIT == 0 {
            BATCH_HEADER_LEN
        } else {
            BATCH_HEADER_LEN + PRODUCER_SECTION_LEN
        }
    }

    /// Offset after the batch's last record.
    pub fn next_offset(&self) -> u64 {
        self.base_offset
            .saturating_add(u64::from(self.record_count))
    }
}

/// Why bytes did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ends before the structure does: `needed` bytes in all.
    #[error("incomplete: {needed} bytes needed")]
    Incomplete { needed: usize },
    #[error("checksum mismatch: stored {expected:#010x}, computed {got:#010x}")]
    Checksum { expected: u32, got: u32 },
    #[error("{0}")]
    Corrupt(&'static str),
    /// A whole, checksummed structure of a format version this build does not know (written by
    /// a newer tern): never damage, never to be repaired or rewritten.
    #[error("format version {found} (this tern reads version {supported})")]
    UnsupportedVersion { found: u16, supported: u16 },
}

/// `Ok` for the format versions this build reads (1 ..= [`FORMAT_VERSION`]). Decoders call it
/// only after the structure's own checksum matched, so a flipped bit is damage and only a real
/// writer's version is refused.
pub fn check_version(found: u16) -> Result<(), DecodeError> {
    if (1..=FORMAT_VERSION).contains(&found) {
        Ok(())
    } else {
        Err(DecodeError::UnsupportedVersion {
            found,
            supported: FORMAT_VERSION,
        })
    }
}

/// Size of the batch encoding `records` (without a producer section), without encoding it.
pub fn encoded_len(records: &[Record]) -> usize {
    let first = records.first().map_or(0, |r| r.timestamp_ms);
    BATCH_HEADER_LEN
        + records
            .iter()
            .map(|r| {
                let body = body_len(r, first);
                uvarint_len(body as u64) + body
            })
            .sum::<usize>()
}

/// How the records of a batch arrived compressed (a Kafka producer's codec), kept in the
/// batch's attributes (bits 0..3, Kafka's numbering) so a reader can serve them compressed the
/// same way. The log itself stores records uncompressed; the codec is a hint only, and a reader
/// that does not know it (a tern from before it) serves the records as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Codec {
    /// The attribute bits of the codec.
    pub fn bits(self) -> u16 {
        match self {
            Self::None => 0,
            Self::Gzip => 1,
            Self::Snappy => 2,
            Self::Lz4 => 3,
            Self::Zstd => 4,
        }
    }

    /// The codec a batch's attributes name; bits it does not know read as none.
    pub fn from_attributes(attributes: u16) -> Self {
        match attributes & 0x7 {
            1 => Self::Gzip,
            2 => Self::Snappy,
            3 => Self::Lz4,
            4 => Self::Zstd,
            _ => Self::None,
        }
    }
}

/// Who appended a batch, when an idempotent Kafka producer did: its producer id and epoch and
/// the sequence numbers of the batch's first and last records, kept in the batch's producer
/// section so that the table of producers that deduplicates retries is rebuilt after a restart
/// (as Kafka keeps them in its batch headers). A batch with a stamp is never gathered with
/// other appends: it holds exactly the producer's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerStamp {
    pub producer_id: i64,
    pub epoch: i16,
    pub first_seq: i32,
    pub last_seq: i32,
}

impl ProducerStamp {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.producer_id.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.first_seq.to_le_bytes());
        out.extend_from_slice(&self.last_seq.to_le_bytes());
    }
}

/// A stored batch's producer stamp and the offset of its first record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StampedBatch {
    pub stamp: ProducerStamp,
    pub base_offset: u64,
}

/// The producer section of a checked batch (`bytes` from its start), if it has one.
pub fn producer_stamp(header: &BatchHeader, bytes: &[u8]) -> Option<ProducerStamp> {
    if header.attributes & PRODUCER_BIT == 0 {
        return None;
    }
    let mut r = Reader::new(bytes.get(BATCH_HEADER_LEN..)?);
    let producer_id = r.i64().ok()?;
    let epoch = r.u16().ok()? as i16;
    let _reserved = r.u16().ok()?;
    let first_seq = r.u32().ok()? as i32;
    let last_seq = r.u32().ok()? as i32;
    Some(ProducerStamp {
        producer_id,
        epoch,
        first_seq,
        last_seq,
    })
}

/// What a reader learns of the batch a record is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpan {
    /// The offset after the batch's last record.
    pub next_offset: u64,
    /// How its records arrived compressed.
    pub codec: Codec,
}

/// Appends the batch holding `records` (at least one) at `base_offset` to `out`.
#[cfg(test)]
pub fn encode_batch(base_offset: u64, generation: u32, records: &[Record], out: &mut Vec<u8>) {
    encode_batch_with(base_offset, generation, Codec::None, None, records, out);
}

/// [`encode_batch`] of records that arrived compressed with `codec`, from `producer` if an
/// idempotent producer sent them. Returns the batch's max timestamp (its header's), so the
/// writer's index needs no second pass over the records.
pub fn encode_batch_with(
    base_offset: u64,
    generation: u32,
    codec: Codec,
    producer: Option<&ProducerStamp>,
    records: &[Record],
    out: &mut Vec<u8>,
) -> i64 {
    let start = out.len();
    let first = records.first().map_or(0, |r| r.timestamp_ms);
    let max = records
        .iter()
        .map(|r| r.timestamp_ms)
        .max()
        .unwrap_or(first);
    let count = u32::try_from(records.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&[0u8; 8]);
    out.extend_from_slice(&base_offset.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    let attributes = codec.bits() | producer.map_or(0, |_| PRODUCER_BIT);
    out.extend_from_slice(&attributes.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&max.to_le_bytes());
    if let Some(producer) = producer {
        producer.encode(out);
    }
    for record in records {
        encode_record(record, first, out);
    }
    let length = u32::try_from(out.len() - start).unwrap_or(u32::MAX);
    if let Some(field) = out.get_mut(start..start + 4) {
        field.copy_from_slice(&length.to_le_bytes());
    }
    let crc = batch_crc(out.get(start..).unwrap_or_default());
    if let Some(field) = out.get_mut(start + 4..start + 8) {
        field.copy_from_slice(&crc.to_le_bytes());
    }
    max
}

/// CRC32C over a whole batch except its own CRC field (bytes 0..4 and 8..end).
fn batch_crc(batch: &[u8]) -> u32 {
    let crc = crc::crc32c_append(0, batch.get(..4).unwrap_or_default());
    crc::crc32c_append(crc, batch.get(8..).unwrap_or_default())
}

/// Decodes the header at the start of `bytes` without checking the CRC.
pub fn decode_header(bytes: &[u8]) -> Result<BatchHeader, DecodeError> {
    let mut r = Reader::new(bytes);
    let header = BatchHeader {
        length: r.u32()?,
        crc: r.u32()?,
        base_offset: r.u64()?,
        generation: r.u32()?,
        attributes: r.u16()?,
        record_count: {
            let _reserved = r.u16()?;
            r.u32()?
        },
        first_timestamp: r.i64()?,
        max_timestamp: r.i64()?,
    };
    let length = header.length as usize;
    if !(BATCH_HEADER_LEN..=MAX_BATCH_LEN).contains(&length) {
        return Err(DecodeError::Corrupt("batch length out of range"));
    }
    if length < header.records_start() {
        return Err(DecodeError::Corrupt(
            "batch shorter than its producer section",
        ));
    }
    if header.record_count == 0 || header.record_count as usize > length - header.records_start() {
        return Err(DecodeError::Corrupt("record count out of range"));
    }
    Ok(header)
}

/// Decodes the header at the start of `bytes` and checks the whole batch's CRC.
pub fn check_batch(bytes: &[u8]) -> Result<BatchHeader, DecodeError> {
    let header = decode_header(bytes)?;
    let batch = bytes
        .get(..header.length as usize)
        .ok_or(DecodeError::Incomplete {
            needed: header.length as usize,
        })?;
    let got = batch_crc(batch);
    if got != header.crc {
        return Err(DecodeError::Checksum {
            expected: header.crc,
            got,
        });
    }
    Ok(header)
}

/// Decodes and checks the batch at the start of `bytes`: its header and records.
pub fn decode_batch(bytes: &[u8]) -> Result<(BatchHeader, Vec<Record>), DecodeError> {
    let (header, views) = decode_views(bytes)?;
    Ok((header, views.iter().map(RecordView::to_record).collect()))
}

/// Decodes and checks the batch at the start of `bytes`, its records borrowed: every record is
/// checked before any is returned, so a batch is read whole or not at all.
pub fn decode_views(bytes: &[u8]) -> Result<(BatchHeader, Vec<RecordView<'_>>), DecodeError> {
    let header = check_batch(bytes)?;
    let body = bytes
        .get(header.records_start()..header.length as usize)
        .ok_or(DecodeError::Corrupt("batch shorter than its header"))?;
    let mut r = Reader::new(body);
    let mut records = Vec::with_capacity(header.record_count.min(1024) as usize);
    for _ in 0..header.record_count {
        records.push(decode_record(&mut r, header.first_timestamp)?);
    }
    if !r.is_empty() {
        return Err(DecodeError::Corrupt("bytes after the last record"));
    }
    Ok((header, records))
}

fn body_len(record: &Record, first: i64) -> usize {
    let delta = zigzag(record.timestamp_ms.wrapping_sub(first));
    let key = record.key.as_ref().map_or(1, |k| {
        uvarint_len(zigzag(i64::try_from(k.len()).unwrap_or(i64::MAX))) + k.len()
    });
    uvarint_len(delta)
        + key
        + uvarint_len(record.value.len() as u64)
        + record.value.len()
        + record.headers.encoded_len()
}

fn encode_record(record: &Record, first: i64, out: &mut Vec<u8>) {
    let body = body_len(record, first);
    // Room for the whole record at once: the pushes below never grow the buffer.
    out.reserve(uvarint_len(body as u64) + body);
    put_uvarint(out, body as u64);
    put_uvarint(out, zigzag(record.timestamp_ms.wrapping_sub(first)));
    match &record.key {
        None => put_uvarint(out, zigzag(-1)),
        Some(key) => {
            put_uvarint(out, zigzag(i64::try_from(key.len()).unwrap_or(i64::MAX)));
            out.extend_from_slice(key);
        }
    }
    put_bytes(out, &record.value);
    record.headers.encode(out);
}

fn decode_record<'a>(r: &mut Reader<'a>, first: i64) -> Result<RecordView<'a>, DecodeError> {
    let body_len = r.len_prefix()?;
    let mut r = Reader::new(r.take(body_len)?);
    let timestamp_ms = first.wrapping_add(unzigzag(r.uvarint()?));
    let key = match unzigzag(r.uvarint()?) {
        -1 => None,
        n => {
            let n = usize::try_from(n).map_err(|_| DecodeError::Corrupt("negative key length"))?;
            Some(r.take(n)?)
        }
    };
    let value = r.bytes()?;
    let count = r.len_prefix()?;
    let headers = r.bytes;
    for _ in 0..count {
        std::str::from_utf8(r.bytes()?)
            .map_err(|_| DecodeError::Corrupt("header name is not UTF-8"))?;
        r.bytes()?;
    }
    if !r.is_empty() {
        return Err(DecodeError::Corrupt("bytes after the record's last field"));
    }
    Ok(RecordView::encoded(
        timestamp_ms,
        key,
        value,
        count,
        headers,
    ))
}

/// The `count` headers encoded in `bytes`, which [`decode_record`] checked: names are UTF-8 and
/// every length fits (anything else ends the iteration early, never panics).
pub(crate) fn headers(bytes: &[u8], count: usize) -> impl Iterator<Item = (&str, &[u8])> {
    let mut r = Reader::new(bytes);
    (0..count).map_while(move |_| {
        let name = std::str::from_utf8(r.bytes().ok()?).ok()?;
        Some((name, r.bytes().ok()?))
    })
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(crate) fn uvarint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Appends `v` as an unsigned LEB128 varint. Inlined with a one-byte fast path: a record's
/// lengths and timestamp delta are nearly all below 128, and a record writes a dozen of them
/// (the encoding's instruction count, issue #29).
#[inline]
pub fn put_uvarint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else {
        put_long_uvarint(out, v);
    }
}

/// [`put_uvarint`] of a value of two bytes or more, a byte at a time: copying a few bytes from a
/// stack buffer was a `memcpy` call per record for the record's length (issue #29).
fn put_long_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_uvarint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Fills a fixed buffer front to back.
struct Writer<'a>(&'a mut [u8]);

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let buf = std::mem::take(&mut self.0);
        let (head, tail) = buf.split_at_mut(bytes.len().min(buf.len()));
        head.copy_from_slice(bytes.get(..head.len()).unwrap_or_default());
        self.0 = tail;
    }
}

/// A bounds-checked cursor over untrusted bytes.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    consumed: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, consumed: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.bytes.len() {
            return Err(DecodeError::Incomplete {
                needed: self.consumed.saturating_add(n),
            });
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        self.consumed += n;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_le_bytes)
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }

    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        self.array().map(i64::from_le_bytes)
    }

    pub fn uvarint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let [byte] = self.array::<1>()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::Corrupt("varint longer than 10 bytes"))
    }

    /// A varint length that must fit in the remaining input.
    pub fn len_prefix(&mut self) -> Result<usize, DecodeError> {
        let n = self.uvarint()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.bytes.len())
            .ok_or(DecodeError::Corrupt(
                "length prefix past the end of its batch",
            ))
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.len_prefix()?;
        self.take(n)
    }
}

#[cfg(test)]
mod test;
