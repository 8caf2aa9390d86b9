//! Golden bytes of the segment header and a record batch (the same bytes are drawn in
//! `docs/log-format.md`), round trips, and a property test that random bytes never panic the
//! decoder.

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

fn sample() -> Vec<Record> {
    vec![
        Record {
            timestamp_ms: 1000,
            key: Some(Bytes::from_static(b"k")),
            value: Bytes::from_static(b"hi"),
            headers: crate::Headers::from(vec![("h".into(), b"x".to_vec().into())]),
        },
        Record {
            timestamp_ms: 999,
            key: None,
            value: Bytes::new(),
            headers: crate::Headers::new(),
        },
    ]
}

fn hex(text: &str) -> Vec<u8> {
    let clean: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    clean
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("zz"), 16).unwrap_or(0))
        .collect()
}

#[test]
fn segment_header_golden_bytes() {
    let header = SegmentHeader {
        generation: 2,
        base_offset: 5,
    };
    let expected = hex("5445524e53454700 0200 0000 02000000 0500000000000000 00000000 3b3f043a");
    assert_eq!(header.encode().to_vec(), expected);
    assert_eq!(SegmentHeader::decode(&expected), Ok(header));
}

#[test]
fn a_segment_header_of_format_1_is_read() {
    let v1 = hex("5445524e53454700 0100 0000 02000000 0500000000000000 00000000 fc27c063");
    let header = SegmentHeader::decode(&v1).expect("format 1 is read");
    assert_eq!((header.generation, header.base_offset), (2, 5));
}

#[test]
fn stamped_batch_golden_bytes() {
    let stamp = ProducerStamp {
        producer_id: 0x0102_0304_0506_0708,
        epoch: 3,
        first_seq: 41,
        last_seq: 42,
    };
    let mut out = Vec::new();
    encode_batch_with(5, 2, Codec::Lz4, Some(&stamp), &sample(), &mut out);
    let expected = hex(
        "51000000 9d0c6ef4 0500000000000000 02000000 1300 0000 02000000
         e803000000000000 e803000000000000
         0807060504030201 0300 0000 29000000 2a000000
         0b 00 02 6b 02 6869 01 01 68 01 78
         04 01 01 00 00",
    );
    assert_eq!(out, expected);
    let (header, records) = decode_batch(&out).expect("stamped batch decodes");
    assert_eq!(
        header.records_start(),
        BATCH_HEADER_LEN + PRODUCER_SECTION_LEN
    );
    assert_eq!(Codec::from_attributes(header.attributes), Codec::Lz4);
    assert_eq!(producer_stamp(&header, &out), Some(stamp));
    assert_eq!(records, sample());
    let mut plain = Vec::new();
    encode_batch(5, 2, &sample(), &mut plain);
    let (plain_header, _) = decode_batch(&plain).expect("decodes");
    assert_eq!(producer_stamp(&plain_header, &plain), None);
}

#[test]
fn batch_golden_bytes() {
    let mut out = Vec::new();
    encode_batch(5, 2, &sample(), &mut out);
    let expected = hex(
        "3d000000 6053efc0 0500000000000000 02000000 0000 0000 02000000
         e803000000000000 e803000000000000
         0b 00 02 6b 02 6869 01 01 68 01 78
         04 01 01 00 00",
    );
    assert_eq!(out, expected);
    assert_eq!(encoded_len(&sample()), expected.len());
    let (header, records) = decode_batch(&out).expect("golden batch decodes");
    assert_eq!(header.base_offset, 5);
    assert_eq!(header.next_offset(), 7);
    assert_eq!((header.first_timestamp, header.max_timestamp), (1000, 1000));
    assert_eq!(records, sample());
}

#[test]
fn every_byte_of_a_batch_is_protected() {
    let mut out = Vec::new();
    encode_batch(5, 2, &sample(), &mut out);
    for i in 0..out.len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = out.clone();
            if let Some(b) = bad.get_mut(i) {
                *b ^= bit;
            }
            assert!(
                decode_batch(&bad).is_err(),
                "flip of bit {bit:#x} in byte {i} not detected"
            );
        }
    }
}

#[test]
fn a_cut_batch_is_incomplete() {
    let mut out = Vec::new();
    encode_batch(0, 1, &sample(), &mut out);
    assert_eq!(
        check_batch(out.get(..out.len() - 1).unwrap_or_default()),
        Err(DecodeError::Incomplete { needed: out.len() })
    );
    assert!(matches!(
        decode_header(out.get(..10).unwrap_or_default()),
        Err(DecodeError::Incomplete { .. })
    ));
}

fn arb_record() -> impl Strategy<Value = Record> {
    (
        any::<i64>(),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        proptest::collection::vec(any::<u8>(), 0..300),
        proptest::collection::vec(
            (
                "[a-z-]{0,12}",
                proptest::collection::vec(any::<u8>(), 0..20),
            ),
            0..4,
        ),
    )
        .prop_map(|(timestamp_ms, key, value, headers)| Record {
            timestamp_ms,
            key: key.map(Bytes::from),
            value: value.into(),
            headers: headers
                .into_iter()
                .map(|(n, v)| (n.into(), v.into()))
                .collect(),
        })
}

/// LEB128 one byte at a time: the reference for the inlined varint writer.
fn reference_uvarint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

#[test]
fn varints_of_every_length_match_the_reference() {
    for bits in 0..64 {
        for v in [1u64 << bits, (1u64 << bits) - 1, u64::MAX >> bits] {
            let mut out = Vec::new();
            put_uvarint(&mut out, v);
            assert_eq!(out, reference_uvarint(v), "{v}");
            assert_eq!(uvarint_len(v), out.len(), "{v}");
        }
    }
}

proptest! {
    #[test]
    fn varints_match_the_reference_and_read_back(v in any::<u64>(), shift in 0u32..64) {
        let v = v >> shift;
        let mut out = vec![7u8];
        put_uvarint(&mut out, v);
        prop_assert_eq!(out.get(1..).unwrap_or_default(), &reference_uvarint(v)[..]);
        prop_assert_eq!(uvarint_len(v), out.len() - 1);
        let mut r = Reader::new(out.get(1..).unwrap_or_default());
        prop_assert_eq!(r.uvarint().expect("reads back"), v);
        prop_assert!(r.is_empty());
    }

    #[test]
    fn batches_round_trip(
        base in any::<u64>().prop_map(|b| b >> 1),
        generation in any::<u32>(),
        records in proptest::collection::vec(arb_record(), 1..12),
        stamp in proptest::option::of((any::<i64>(), any::<i16>(), any::<i32>(), any::<i32>())),
    ) {
        let stamp = stamp.map(|(producer_id, epoch, first_seq, last_seq)| ProducerStamp {
            producer_id,
            epoch,
            first_seq,
            last_seq,
        });
        let mut out = vec![0xaa; 3];
        encode_batch_with(base, generation, Codec::None, stamp.as_ref(), &records, &mut out);
        let section = if stamp.is_some() { PRODUCER_SECTION_LEN } else { 0 };
        prop_assert_eq!(out.len() - 3, encoded_len(&records) + section);
        let bytes = out.get(3..).unwrap_or_default();
        let (header, decoded) = decode_batch(bytes).expect("decodes");
        prop_assert_eq!(header.base_offset, base);
        prop_assert_eq!(header.generation, generation);
        prop_assert_eq!(producer_stamp(&header, bytes), stamp);
        prop_assert_eq!(decoded, records);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode_batch(&bytes);
        let _ = SegmentHeader::decode(&bytes);
        let _ = crate::index::IndexView::parse(&bytes, false);
        let _ = crate::index::IndexView::parse(&bytes, true);
        prop_assert!(crate::segment::scan(&bytes, 0, 64).is_err() || bytes.len() >= SEGMENT_HEADER_LEN);
    }

    #[test]
    fn mutated_batches_never_panic_and_never_decode_wrongly(
        records in proptest::collection::vec(arb_record(), 1..4),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        stamped in any::<bool>(),
    ) {
        let stamp = ProducerStamp { producer_id: 9, epoch: 1, first_seq: 0, last_seq: 3 };
        let mut out = Vec::new();
        encode_batch_with(7, 1, Codec::None, stamped.then_some(&stamp), &records, &mut out);
        let original = out.clone();
        for (at, value) in flips {
            let i = at.index(out.len());
            if let Some(b) = out.get_mut(i) {
                *b = value;
            }
        }
        if let Ok((_, decoded)) = decode_batch(&out) {
            prop_assert_eq!(out, original, "only the unmodified batch may decode");
            prop_assert_eq!(decoded, records);
        }
    }
}
