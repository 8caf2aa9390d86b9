//! Unit tests of `group/wire.rs`: golden request bytes, responses built the way Kafka sends
//! them, and decoders fed arbitrary bytes (proptest).
#![expect(
    clippy::big_endian_bytes,
    reason = "the responses are built the way Kafka sends them"
)]

use proptest::prelude::*;

use super::*;

#[test]
fn offset_commit_v5_golden_bytes() {
    let commit = Commit {
        topic: "t",
        partition: 2,
        offset: 300,
        metadata: "m",
    };
    let frame = offset_commit(7, "c", "g", &commit);
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0, 0, 0, 46,             // size
        0, 8, 0, 5,              // OffsetCommit v5
        0, 0, 0, 7,              // correlation id
        0, 1, b'c',              // client id
        0, 1, b'g',              // group
        0xff, 0xff, 0xff, 0xff,  // generation -1
        0, 0,                    // member id ""
        0, 0, 0, 1, 0, 1, b't',  // one topic "t"
        0, 0, 0, 1,              // one partition
        0, 0, 0, 2,              // partition 2
        0, 0, 0, 0, 0, 0, 1, 44, // offset 300
        0, 1, b'm',              // metadata
    ];
    assert_eq!(frame, expected);
}

#[test]
fn find_coordinator_and_offset_fetch_golden_bytes() {
    #[rustfmt::skip]
    let find: &[u8] = &[
        0, 0, 0, 16, 0, 10, 0, 2, 0, 0, 0, 1, 0, 1, b'c',
        0, 2, b'g', b'1', // key
        0,                // key type: group
    ];
    assert_eq!(find_coordinator(1, "c", "g1"), find);
    #[rustfmt::skip]
    let fetch: &[u8] = &[
        0, 0, 0, 29, 0, 9, 0, 5, 0, 0, 0, 2, 0, 1, b'c',
        0, 1, b'g',
        0, 0, 0, 1, 0, 1, b't',
        0, 0, 0, 1, 0, 0, 0, 3,
    ];
    assert_eq!(offset_fetch(2, "c", "g", "t", 3), fetch);
    assert_eq!(
        api_versions(3, ""),
        [0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 3, 0, 0]
    );
    #[rustfmt::skip]
    let authenticate: &[u8] = &[
        0, 0, 0, 17, 0, 36, 0, 1, 0, 0, 0, 4, 0, 1, b'c',
        0, 0, 0, 2, 0, b'u', // auth bytes
    ];
    assert_eq!(sasl_authenticate(4, "c", b"\0u"), authenticate);
    let handshake = Body::default()
        .i16(33)
        .i32(2)
        .string(Some("PLAIN"))
        .string(Some("SCRAM-SHA-512"));
    assert_eq!(
        decode_sasl_handshake(&handshake.0),
        Ok((33, vec!["PLAIN".to_owned(), "SCRAM-SHA-512".to_owned()]))
    );
}

/// A response body built field by field, as a broker sends it.
#[derive(Default)]
struct Body(Vec<u8>);

impl Body {
    fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn string(self, s: Option<&str>) -> Self {
        match s {
            None => self.i16(-1),
            Some(s) => {
                let mut body = self.i16(i16::try_from(s.len()).unwrap_or(i16::MAX));
                body.0.extend_from_slice(s.as_bytes());
                body
            }
        }
    }
}

#[test]
fn decodes_a_coordinator_and_a_missing_offset() {
    let body = Body::default()
        .i32(0)
        .i16(0)
        .string(None)
        .i32(2)
        .string(Some("127.0.0.1"))
        .i32(9092);
    let coordinator = decode_find_coordinator(&body.0);
    assert_eq!(
        coordinator,
        Ok(Coordinator {
            error_code: 0,
            error_message: None,
            node_id: 2,
            host: "127.0.0.1".into(),
            port: 9092
        })
    );
    let body = Body::default()
        .i32(0)
        .i32(1)
        .string(Some("t"))
        .i32(1)
        .i32(0)
        .i64(-1)
        .i32(-1)
        .string(Some(""))
        .i16(0)
        .i16(0);
    let (error, partitions) = decode_offset_fetch(&body.0).unwrap_or_default();
    assert_eq!(error, 0);
    assert_eq!(partitions.len(), 1);
    assert_eq!(partitions.first().map(|p| p.offset), Some(-1));
}

#[test]
fn a_short_body_is_incomplete_and_a_negative_length_invalid() {
    let body = Body::default().i32(0).i16(0).string(None).i32(2);
    assert!(matches!(
        decode_find_coordinator(&body.0),
        Err(WireError::Incomplete { what: "host", .. })
    ));
    let body = Body::default().i16(0).i32(-5);
    assert_eq!(
        decode_api_versions(&body.0),
        Err(WireError::Invalid { what: "api keys" })
    );
    // A forged count larger than the body is refused before anything is allocated.
    let body = Body::default().i16(0).i32(i32::MAX);
    assert!(matches!(
        decode_api_versions(&body.0),
        Err(WireError::Incomplete { .. })
    ));
}

fn fetched() -> impl Strategy<Value = Fetched> {
    (
        "[a-z.]{1,20}",
        any::<i32>(),
        any::<i64>(),
        any::<i32>(),
        proptest::option::of("[ -~]{0,40}"),
        any::<i16>(),
    )
        .prop_map(
            |(topic, partition, offset, leader_epoch, metadata, error_code)| Fetched {
                topic,
                partition,
                offset,
                leader_epoch,
                metadata,
                error_code,
            },
        )
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_api_versions(&bytes);
        let _ = decode_find_coordinator(&bytes);
        let _ = decode_offset_commit(&bytes);
        let _ = decode_offset_fetch(&bytes);
        let _ = decode_sasl_handshake(&bytes);
        let _ = decode_sasl_authenticate(&bytes);
    }

    #[test]
    fn sasl_authenticate_round_trips(
        auth in proptest::collection::vec(any::<u8>(), 0..64),
        message in proptest::option::of("[ -~]{0,30}"),
        lifetime in any::<i64>(),
    ) {
        let mut body = Body::default().i16(58).string(message.as_deref());
        body = body.i32(i32::try_from(auth.len()).unwrap_or(0));
        body.0.extend_from_slice(&auth);
        body = body.i64(lifetime);
        let expected = Authenticated {
            error_code: 58,
            error_message: message.clone(),
            auth_bytes: auth.clone(),
            session_lifetime_ms: lifetime,
        };
        prop_assert_eq!(decode_sasl_authenticate(&body.0), Ok(expected));
        for cut in 0..body.0.len() {
            let is_incomplete = matches!(
                decode_sasl_authenticate(&body.0[..cut]),
                Err(WireError::Incomplete { .. })
            );
            prop_assert!(is_incomplete, "cut at {}", cut);
        }
    }

    #[test]
    fn offset_fetch_round_trips(parts in proptest::collection::vec(fetched(), 0..8), top in any::<i16>()) {
        let mut body = Body::default().i32(0).i32(i32::try_from(parts.len()).unwrap_or(0));
        for p in &parts {
            body = body
                .string(Some(&p.topic))
                .i32(1)
                .i32(p.partition)
                .i64(p.offset)
                .i32(p.leader_epoch)
                .string(p.metadata.as_deref())
                .i16(p.error_code);
        }
        body = body.i16(top);
        prop_assert_eq!(decode_offset_fetch(&body.0), Ok((top, parts.clone())));
        // Every proper prefix is incomplete, never a wrong answer.
        for cut in 0..body.0.len() {
            let is_incomplete = matches!(
                decode_offset_fetch(&body.0[..cut]),
                Err(WireError::Incomplete { .. })
            );
            prop_assert!(is_incomplete, "cut at {}", cut);
        }
    }

    #[test]
    fn api_versions_round_trip(apis in proptest::collection::vec(any::<(i16, i16, i16)>(), 0..40)) {
        let mut body = Body::default().i16(0).i32(i32::try_from(apis.len()).unwrap_or(0));
        for &(key, min, max) in &apis {
            body = body.i16(key).i16(min).i16(max);
        }
        let decoded = decode_api_versions(&body.0);
        prop_assert_eq!(decoded, Ok(ApiVersions { error_code: 0, apis: apis.clone() }));
    }
}
