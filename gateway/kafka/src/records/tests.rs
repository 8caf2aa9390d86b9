//! Round trips through kafka-protocol's batch codec, every compression codec, and hostile batch
//! headers.

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record as KafkaRecord, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use proptest::prelude::*;
use tern_log::{Record, RecordView, StoredRecord};

use super::*;

/// (timestamp, key, value, headers) of a produced record.
pub(crate) type Produced<'a> = (i64, Option<&'a [u8]>, &'a [u8], &'a [(&'a str, &'a [u8])]);

/// A v2 batch of `records` as a producer sends it.
pub(crate) fn produced(compression: Compression, records: &[Produced<'_>]) -> Bytes {
    let kafka: Vec<KafkaRecord> = records
        .iter()
        .enumerate()
        .map(|(i, (ts, key, value, headers))| {
            let mut map = IndexMap::new();
            for (name, value) in *headers {
                map.insert(
                    StrBytes::from_string((*name).to_owned()),
                    Some(Bytes::copy_from_slice(value)),
                );
            }
            KafkaRecord {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: -1,
                timestamp: *ts,
                key: key.map(Bytes::copy_from_slice),
                value: Some(Bytes::copy_from_slice(value)),
                headers: map,
            }
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        kafka.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .expect("encode");
    buf.freeze()
}

#[test]
fn produced_batches_of_every_codec_become_log_records_with_headers() {
    for compression in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let bytes = produced(
            compression,
            &[
                (
                    1_000,
                    Some(b"k"),
                    b"v1",
                    &[("mqtt.topic", b"cmd/7"), ("x", b"")],
                ),
                (-1, None, b"v2", &[]),
            ],
        );
        let records = decode(&bytes, 42).expect("decodes");
        assert_eq!(
            records,
            vec![
                Record {
                    timestamp_ms: 1_000,
                    key: Some(b"k".to_vec().into()),
                    value: b"v1".to_vec().into(),
                    headers: tern_log::Headers::from(vec![
                        ("mqtt.topic".into(), b"cmd/7".to_vec().into()),
                        ("x".into(), Vec::new().into())
                    ]),
                },
                Record {
                    timestamp_ms: 42,
                    key: None,
                    value: b"v2".to_vec().into(),
                    headers: tern_log::Headers::new()
                },
            ],
            "{compression:?}"
        );
    }
}

#[test]
fn stored_records_come_back_with_their_offsets_timestamps_and_headers() {
    let stored: Vec<StoredRecord> = (7..10)
        .map(|offset| StoredRecord {
            offset,
            record: Record {
                timestamp_ms: 1_000 + offset as i64,
                key: None,
                value: vec![offset as u8].into(),
                headers: tern_log::Headers::from(vec![(
                    "mqtt.topic".into(),
                    b"a/b".to_vec().into(),
                )]),
            },
        })
        .collect();
    let mut gathered = FetchBatch::with_capacity(0);
    for s in &stored {
        gathered.push(s.offset, &RecordView::of(&s.record));
    }
    let batch = gathered.encode().expect("encode");
    let mut buf = batch.clone();
    let sets = RecordBatchDecoder::decode_all(&mut buf).expect("decode");
    assert_eq!(sets.len(), 1, "one batch");
    let offsets: Vec<i64> = sets[0].records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [7, 8, 9]);
    assert_eq!(sets[0].records[2].timestamp, 1_009);
    assert_eq!(
        sets[0].records[0]
            .headers
            .get(&StrBytes::from_static_str("mqtt.topic")),
        Some(&Some(Bytes::from_static(b"a/b")))
    );
    // And a produce of the same bytes gives the records back.
    let back = decode(&batch, 0).expect("decodes");
    assert_eq!(
        back,
        stored.into_iter().map(|s| s.record).collect::<Vec<_>>()
    );
}

#[test]
fn a_huge_record_count_or_old_format_is_refused_before_anything_is_sized() {
    let mut bytes = produced(Compression::None, &[(1, None, b"v", &[])]).to_vec();
    bytes[COUNT_AT..COUNT_AT + 4].copy_from_slice(&i32::MAX.to_be_bytes());
    assert!(matches!(
        decode(&Bytes::from(bytes.clone()), 0),
        Err(RecordsError::Corrupt(_))
    ));
    bytes[MAGIC_AT] = 1;
    assert_eq!(
        decode(&Bytes::from(bytes), 0),
        Err(RecordsError::OldFormat(1))
    );
}

proptest! {
    /// Any bytes, or a valid batch with any bytes flipped: records or an error, never a panic.
    #[test]
    fn any_record_set_decodes_or_is_refused(
        noise in proptest::collection::vec(any::<u8>(), 0..256),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        compressed in any::<bool>(),
    ) {
        let _ = decode(&Bytes::from(noise), 0);
        let compression = if compressed { Compression::Gzip } else { Compression::None };
        let mut valid = produced(compression, &[(5, Some(b"key"), b"value", &[("h", b"1")])]).to_vec();
        for (at, byte) in flips {
            let i = at.index(valid.len());
            valid[i] ^= byte;
        }
        let _ = decode(&Bytes::from(valid), 0);
    }
}
