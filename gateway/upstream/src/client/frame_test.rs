#![expect(
    clippy::big_endian_bytes,
    reason = "the frames are built the way Kafka sends them"
)]

use proptest::prelude::*;

use super::*;

/// A v4 Metadata response: correlation 7, throttle 0, brokers 1 (`k1:9092`, rack null)
/// and 2 (`k2:19092`, rack `r`), then two opaque tail bytes.
fn v4_response() -> Vec<u8> {
    let mut f = vec![0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 2];
    f.extend_from_slice(&[0, 0, 0, 1, 0, 2, b'k', b'1', 0, 0, 0x23, 0x84, 0xff, 0xff]);
    f.extend_from_slice(&[0, 0, 0, 2, 0, 2, b'k', b'2', 0, 0, 0x4a, 0x94, 0, 1, b'r']);
    f.extend_from_slice(&[0xab, 0xcd]);
    f
}

#[test]
fn the_broker_list_is_rewritten_and_everything_else_kept_byte_for_byte() {
    let frame = v4_response();
    let mut parsed = MetadataResponse::parse(&frame, 4).expect("parses");
    let seen: Vec<_> = parsed
        .brokers
        .iter()
        .map(|b| (b.node_id, b.host.as_str(), b.port))
        .collect();
    assert_eq!(seen, [(1, "k1", 9092), (2, "k2", 19092)]);
    assert_eq!(parsed.encode(), frame);
    parsed.brokers[0].host = "127.0.0.1".into();
    parsed.brokers[0].port = 1;
    let mut expected = vec![0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 9];
    expected.extend_from_slice(b"127.0.0.1");
    expected.extend_from_slice(&[0, 0, 0, 1, 0xff, 0xff]);
    expected.extend_from_slice(&frame[26..]);
    assert_eq!(parsed.encode(), expected);
}

#[test]
fn truncated_and_unknown_versions_are_errors_not_panics() {
    let frame = v4_response();
    for cut in 0..frame.len() - 2 {
        let result = MetadataResponse::parse(&frame[..cut], 4);
        assert!(
            matches!(result, Err(WireError::Incomplete { .. })),
            "cut at {cut}: {result:?}"
        );
    }
    assert!(matches!(
        MetadataResponse::parse(&frame, 9),
        Err(WireError::Invalid { .. })
    ));
}

#[test]
fn request_headers_and_correlation_ids_golden_bytes() {
    assert_eq!(
        request_header(&[0, 3, 0, 4, 0, 0, 1, 0, 0xff]),
        Some(RequestHeader {
            api_key: API_METADATA,
            api_version: 4,
            correlation_id: 256
        })
    );
    assert_eq!(request_header(&[0, 3, 0, 4, 0, 0]), None);
    assert_eq!(correlation_id(&[0, 0, 0, 7, 1]), Some(7));
    assert_eq!(correlation_id(&[0, 0, 7]), None);
}

/// A Metadata response of `version` with `brokers` (node id, host, port, rack), then `tail`.
fn response(version: i16, brokers: &[(i32, String, i32, Option<String>)], tail: &[u8]) -> Vec<u8> {
    let mut f = 42i32.to_be_bytes().to_vec();
    if version >= 3 {
        f.extend_from_slice(&5i32.to_be_bytes());
    }
    f.extend_from_slice(&(brokers.len() as i32).to_be_bytes());
    for (id, host, port, rack) in brokers {
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(&(host.len() as i16).to_be_bytes());
        f.extend_from_slice(host.as_bytes());
        f.extend_from_slice(&port.to_be_bytes());
        if version >= 1 {
            match rack {
                Some(rack) => {
                    f.extend_from_slice(&(rack.len() as i16).to_be_bytes());
                    f.extend_from_slice(rack.as_bytes());
                }
                None => f.extend_from_slice(&(-1i16).to_be_bytes()),
            }
        }
    }
    f.extend_from_slice(tail);
    f
}

fn any_brokers() -> impl Strategy<Value = Vec<(i32, String, i32, Option<String>)>> {
    proptest::collection::vec(
        (
            any::<i32>(),
            "[a-z0-9.-]{0,20}",
            any::<i32>(),
            proptest::option::of("[a-z]{0,5}"),
        ),
        0..5,
    )
}

proptest! {
    #[test]
    fn metadata_parse_and_encode_keep_every_byte(
        version in 0i16..=8,
        brokers in any_brokers(),
        tail in proptest::collection::vec(any::<u8>(), 0..32),
    ) {
        let frame = response(version, &brokers, &tail);
        let parsed = MetadataResponse::parse(&frame, version).unwrap();
        let seen: Vec<_> = parsed.brokers.iter().map(|b| (b.node_id, b.host.clone(), b.port)).collect();
        let wanted: Vec<_> = brokers.iter().map(|(id, host, port, _)| (*id, host.clone(), *port)).collect();
        prop_assert_eq!(seen, wanted);
        prop_assert_eq!(parsed.encode(), frame);
    }

    #[test]
    fn a_rewritten_host_changes_only_the_broker_list(
        version in 0i16..=8,
        brokers in any_brokers(),
        tail in proptest::collection::vec(any::<u8>(), 0..32),
        host in "[0-9.]{1,15}",
        port in any::<u16>(),
    ) {
        let mut parsed = MetadataResponse::parse(&response(version, &brokers, &tail), version).unwrap();
        for broker in &mut parsed.brokers {
            broker.host = host.clone();
            broker.port = i32::from(port);
        }
        let moved: Vec<_> = brokers
            .iter()
            .map(|(id, _, _, rack)| (*id, host.clone(), i32::from(port), rack.clone()))
            .collect();
        prop_assert_eq!(parsed.encode(), response(version, &moved, &tail));
    }

    #[test]
    fn metadata_decoder_never_panics(version in -1i16..=9, bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        if let Ok(parsed) = MetadataResponse::parse(&bytes, version) {
            let head = if version >= 3 { 8 } else { 4 };
            prop_assert!(parsed.encode().starts_with(&bytes[..head]));
        }
    }
}

/// A FindCoordinator response of `version` naming broker 2 at `k2:9092` (correlation 9).
fn coordinator_frame(version: i16) -> Vec<u8> {
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    let host = StrBytes::from_static_str("k2");
    let mut body = FindCoordinatorResponse::default();
    if version >= 4 {
        body.coordinators = vec![
            Coordinator::default()
                .with_key(StrBytes::from_static_str("tern.gw.mqtt.0"))
                .with_node_id(BrokerId(2))
                .with_host(host)
                .with_port(9092),
        ];
    } else {
        body = body
            .with_node_id(BrokerId(2))
            .with_host(host)
            .with_port(9092);
    }
    let mut out = bytes::BytesMut::new();
    let header = ResponseHeader::default().with_correlation_id(9);
    let header_version = FindCoordinatorResponse::header_version(version);
    header.encode(&mut out, header_version).expect("header");
    body.encode(&mut out, version).expect("body");
    out.to_vec()
}

#[test]
fn coordinators_are_redirected_in_every_version_and_the_rest_kept() {
    for version in [1, 2, 3, 4, 6] {
        let frame = coordinator_frame(version);
        let mut parsed = CoordinatorResponse::parse(&frame, version).expect("parses");
        let seen: Vec<_> = parsed
            .coordinators()
            .into_iter()
            .map(|b| (b.node_id, b.host, b.port))
            .collect();
        assert_eq!(seen, [(2, "k2".to_owned(), 9092)], "v{version}");
        assert_eq!(parsed.encode(), Ok(frame.clone()), "v{version}");
        parsed.redirect(2, "127.0.0.1", 4242);
        parsed.redirect(3, "elsewhere", 1);
        let again = parsed.encode().expect("encodes");
        assert_eq!(correlation_id(&again), Some(9));
        let moved = CoordinatorResponse::parse(&again, version).expect("parses");
        let seen: Vec<_> = moved
            .coordinators()
            .into_iter()
            .map(|b| (b.node_id, b.host, b.port))
            .collect();
        assert_eq!(seen, [(2, "127.0.0.1".to_owned(), 4242)], "v{version}");
    }
    assert!(CoordinatorResponse::parse(&[0, 0, 0, 9, 0], 6).is_err());
}
