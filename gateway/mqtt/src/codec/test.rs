//! Codec tests: the client-side encoders other tests use to play a client (rumqttd's own
//! writer), decoding and framing of both versions, and fuzzing of the decoder; golden bytes of
//! the delivery packets are in `test/delivery.rs`.

use super::*;

mod delivery;

/// Encodes a client CONNECT (tests play the client with rumqttd's own writer).
pub(crate) fn client_connect(
    version: Version,
    client_id: &str,
    clean: bool,
    keep_alive: u16,
) -> Vec<u8> {
    let connect = protocol::Connect {
        keep_alive,
        client_id: client_id.to_owned(),
        clean_session: clean,
    };
    let mut out = BytesMut::new();
    let packet = Packet::Connect(connect, None, None, None, None);
    match version {
        Version::V4 => protocol::v4::V4.write(packet, &mut out),
        Version::V5 => protocol::v5::V5.write(packet, &mut out),
    }
    .expect("encodes");
    out.to_vec()
}

/// Encodes an MQTT 5 CONNECT with a session expiry and an optional will with a delay.
pub(crate) fn client_connect_v5(
    client_id: &str,
    clean: bool,
    session_expiry: u32,
    will: Option<(&str, &str, u32)>,
) -> Vec<u8> {
    let connect = protocol::Connect {
        keep_alive: 60,
        client_id: client_id.to_owned(),
        clean_session: clean,
    };
    let properties = protocol::ConnectProperties {
        session_expiry_interval: Some(session_expiry),
        receive_maximum: None,
        max_packet_size: None,
        topic_alias_max: None,
        request_response_info: None,
        request_problem_info: None,
        user_properties: Vec::new(),
        authentication_method: None,
        authentication_data: None,
    };
    let (will, will_properties) = match will {
        Some((topic, message, delay)) => (
            Some(LastWill {
                topic: Bytes::copy_from_slice(topic.as_bytes()),
                message: Bytes::copy_from_slice(message.as_bytes()),
                qos: QoS::AtLeastOnce,
                retain: false,
            }),
            Some(LastWillProperties {
                delay_interval: Some(delay),
                payload_format_indicator: None,
                message_expiry_interval: None,
                content_type: None,
                response_topic: None,
                correlation_data: None,
                user_properties: Vec::new(),
            }),
        ),
        None => (None, None),
    };
    let mut out = BytesMut::new();
    let packet = Packet::Connect(connect, Some(properties), will, will_properties, None);
    protocol::v5::V5.write(packet, &mut out).expect("encodes");
    out.to_vec()
}

/// Encodes a client PUBLISH.
pub(crate) fn client_publish(
    version: Version,
    topic: &str,
    payload: &[u8],
    qos: QoS,
    pkid: u16,
) -> Vec<u8> {
    let publish = OutPublish {
        topic: Bytes::copy_from_slice(topic.as_bytes()),
        payload: Bytes::copy_from_slice(payload),
        qos,
        pkid,
        dup: false,
        retain: false,
        properties: None,
    };
    let mut out = BytesMut::new();
    encode(version, Outgoing::Publish(Box::new(publish)), &mut out).expect("encodes");
    out.to_vec()
}

/// Encodes a client SUBSCRIBE.
pub(crate) fn client_subscribe(version: Version, pkid: u16, filter: &str, qos: QoS) -> Vec<u8> {
    let subscribe = protocol::Subscribe {
        pkid,
        filters: vec![protocol::Filter {
            path: filter.to_owned(),
            qos,
            nolocal: false,
            preserve_retain: false,
            retain_forward_rule: protocol::RetainForwardRule::OnEverySubscribe,
        }],
    };
    let mut out = BytesMut::new();
    match version {
        Version::V4 => protocol::v4::V4.write(Packet::Subscribe(subscribe, None), &mut out),
        Version::V5 => protocol::v5::V5.write(Packet::Subscribe(subscribe, None), &mut out),
    }
    .expect("encodes");
    out.to_vec()
}

fn encoded(version: Version, packet: Outgoing) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(version, packet, &mut out).expect("encodes");
    out.to_vec()
}

#[test]
fn frames_are_measured_and_limited() {
    assert_eq!(frame_len(&[], 100), Ok(None));
    assert_eq!(frame_len(&[0xc0], 100), Ok(None));
    assert_eq!(frame_len(&[0xc0, 0x00], 100), Ok(Some(2)));
    assert_eq!(frame_len(&[0x30, 0x03, 1], 100), Ok(None));
    assert_eq!(frame_len(&[0x30, 0x80, 0x01], 1000), Ok(None));
    assert_eq!(
        frame_len(&[0x30, 0x80, 0x01], 100),
        Err(CodecError::TooLarge {
            size: 131,
            max: 100
        })
    );
    assert!(matches!(
        frame_len(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x7f], usize::MAX),
        Err(CodecError::Malformed { .. })
    ));
}

#[test]
fn connect_version_is_read_from_the_frame() {
    let v4 = client_connect(Version::V4, "a", true, 30);
    let v5 = client_connect(Version::V5, "a", true, 30);
    assert_eq!(connect_version(&v4), Ok(Version::V4));
    assert_eq!(connect_version(&v5), Ok(Version::V5));
    let mut v3 = v4.clone();
    v3[8] = 3;
    assert_eq!(
        connect_version(&v3),
        Err(CodecError::UnsupportedVersion { level: 3 })
    );
    assert!(connect_version(&[0x30, 0x00]).is_err());
}

#[test]
fn connect_decodes_for_both_versions() {
    for version in [Version::V4, Version::V5] {
        let frame = client_connect(version, "dev-1", false, 42);
        let Ok(Incoming::Connect(connect)) = decode(version, &frame) else {
            panic!("{version:?}: not a connect");
        };
        assert_eq!(connect.client_id, "dev-1");
        assert!(!connect.clean_start);
        assert_eq!(connect.keep_alive, 42);
        assert_eq!(connect.version, version);
    }
}

#[test]
fn publish_qos_pkid_and_dup_are_recovered_although_rumqttd_hides_them() {
    for version in [Version::V4, Version::V5] {
        let mut frame = client_publish(version, "a/b", b"hi", QoS::ExactlyOnce, 513);
        frame[0] |= 0b1000;
        let Ok(Incoming::Publish(publish)) = decode(version, &frame) else {
            panic!("{version:?}: not a publish");
        };
        assert_eq!(publish.qos, QoS::ExactlyOnce);
        assert_eq!(publish.pkid, 513);
        assert!(publish.dup);
        assert_eq!(&publish.topic[..], b"a/b");
        assert_eq!(&publish.payload[..], b"hi");
    }
}

#[test]
fn outgoing_publish_has_golden_bytes() {
    let publish = OutPublish {
        topic: Bytes::from_static(b"t"),
        payload: Bytes::from_static(b"xy"),
        qos: QoS::AtLeastOnce,
        pkid: 7,
        dup: true,
        retain: true,
        properties: None,
    };
    let v4 = encoded(Version::V4, Outgoing::Publish(Box::new(publish.clone())));
    assert_eq!(v4, [0x3b, 7, 0, 1, b't', 0, 7, b'x', b'y']);
    let v5 = encoded(Version::V5, Outgoing::Publish(Box::new(publish)));
    assert_eq!(v5, [0x3b, 8, 0, 1, b't', 0, 7, 0, b'x', b'y']);
}

#[test]
fn v5_connack_and_unsuback_types_do_not_reach_rumqttds_unreachable() {
    // rumqttd's V5::read_mut panics on these packet types; they never reach it.
    for frame in [[0x20u8, 0x03, 0, 0, 0], [0xb0, 0x03, 0, 1, 0]] {
        assert!(matches!(
            decode(Version::V5, &frame),
            Err(CodecError::Protocol { .. })
        ));
    }
}

#[test]
fn reserved_flags_are_rejected() {
    assert!(decode(Version::V4, &[0x82, 0x00]).is_err());
    assert!(matches!(
        decode(Version::V4, &[0x80, 0x05, 0, 1, 0, 0, 0]),
        Err(CodecError::Malformed { .. })
    ));
    assert!(matches!(
        decode(Version::V4, &[0x36, 0x05, 0, 1, b'a', 0, 1]),
        Err(CodecError::Malformed { .. })
    ));
}

#[test]
fn v5_disconnect_with_reason_and_no_properties_decodes() {
    // Allowed by the spec (remaining length 1), refused by rumqttd's reader unless repaired.
    assert_eq!(
        decode(Version::V5, &[0xe0, 0x01, 0x04]),
        Ok(Incoming::Disconnect {
            reason: DisconnectReasonCode::DisconnectWithWillMessage,
            session_expiry: None,
        })
    );
    assert!(matches!(
        decode(Version::V5, &[0xe0, 0x00]),
        Ok(Incoming::Disconnect { .. })
    ));
}

#[test]
fn v5_disconnect_with_reason_has_golden_bytes_unlike_rumqttds_writer() {
    let reason = DisconnectReason::SessionTakenOver;
    assert_eq!(
        encoded(Version::V5, Outgoing::Disconnect { reason }),
        [0xe0, 0x02, 0x8e, 0x00]
    );
    let mut rumqttd = BytesMut::new();
    let packet = Packet::Disconnect(
        protocol::Disconnect {
            reason_code: DisconnectReasonCode::SessionTakenOver,
        },
        None,
    );
    protocol::v5::V5
        .write(packet, &mut rumqttd)
        .expect("writes");
    assert_ne!(
        &rumqttd[..],
        [0xe0, 0x02, 0x8e, 0x00],
        "rumqttd fixed? drop the workaround"
    );
    let normal = DisconnectReason::Normal;
    assert_eq!(
        encoded(Version::V5, Outgoing::Disconnect { reason: normal }),
        [0xe0, 0x00]
    );
}

#[test]
fn acks_encode_per_version() {
    let quota = PubAckReason::QuotaExceeded;
    assert_eq!(
        encoded(
            Version::V5,
            Outgoing::PubAck {
                pkid: 1,
                reason: quota
            }
        ),
        [0x40, 0x04, 0, 1, 0x97, 0x00]
    );
    assert_eq!(
        encoded(
            Version::V4,
            Outgoing::PubAck {
                pkid: 1,
                reason: PubAckReason::Success
            }
        ),
        [0x40, 0x02, 0, 1]
    );
    let connack = |version, code| {
        encoded(
            version,
            Outgoing::ConnAck {
                session_present: false,
                code,
                properties: None,
            },
        )
    };
    assert_eq!(
        connack(Version::V4, ConnAckCode::ServerBusy),
        [0x20, 2, 0, 3]
    );
    assert_eq!(
        connack(Version::V4, ConnAckCode::UnsupportedProtocolVersion),
        [0x20, 2, 0, 1]
    );
    assert_eq!(
        connack(Version::V5, ConnAckCode::ServerBusy),
        [0x20, 3, 0, 0x89, 0]
    );
    let suback = Outgoing::SubAck {
        pkid: 2,
        codes: vec![
            SubAckCode::Granted(QoS::AtLeastOnce),
            SubAckCode::TopicFilterInvalid,
        ],
        reason: None,
    };
    assert_eq!(
        encoded(Version::V4, suback.clone()),
        [0x90, 4, 0, 2, 1, 0x80]
    );
    assert_eq!(encoded(Version::V5, suback), [0x90, 5, 0, 2, 0, 1, 0x8f]);
    let refused = Outgoing::SubAck {
        pkid: 3,
        codes: vec![
            SubAckCode::QuotaExceeded,
            SubAckCode::ImplementationSpecific,
            SubAckCode::Unspecified,
        ],
        reason: Some("no".to_owned()),
    };
    assert_eq!(
        encoded(Version::V4, refused.clone()),
        [0x90, 5, 0, 3, 0x80, 0x80, 0x80],
        "3.1.1: every refusal is 0x80 and there is no reason string"
    );
    assert_eq!(
        encoded(Version::V5, refused),
        [0x90, 11, 0, 3, 5, 0x1f, 0, 2, b'n', b'o', 0x97, 0x83, 0x80],
        "MQTT 5: reason codes and the Reason String property (0x1F)"
    );
}

#[test]
fn subscribe_decodes() {
    for version in [Version::V4, Version::V5] {
        let frame = client_subscribe(version, 9, "a/+/c", QoS::AtLeastOnce);
        assert_eq!(
            decode(version, &frame),
            Ok(Incoming::Subscribe(Subscribe {
                pkid: 9,
                filters: vec![SubscribeFilter {
                    filter: "a/+/c".to_owned(),
                    qos: QoS::AtLeastOnce,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: RetainHandling::OnSubscribe,
                }],
                id: None,
                user_properties: Vec::new(),
            }))
        );
    }
}

#[test]
fn v5_subscription_options_and_identifier_decode() {
    let subscribe = protocol::Subscribe {
        pkid: 3,
        filters: vec![protocol::Filter {
            path: "x/#".to_owned(),
            qos: QoS::AtMostOnce,
            nolocal: true,
            preserve_retain: true,
            retain_forward_rule: protocol::RetainForwardRule::Never,
        }],
    };
    let properties = protocol::SubscribeProperties {
        id: Some(42),
        user_properties: vec![("tern-start".to_owned(), "earliest".to_owned())],
    };
    let mut frame = BytesMut::new();
    protocol::v5::V5
        .write(Packet::Subscribe(subscribe, Some(properties)), &mut frame)
        .expect("encodes");
    let Ok(Incoming::Subscribe(decoded)) = decode(Version::V5, &frame) else {
        panic!("not a subscribe");
    };
    assert_eq!(decoded.id, Some(42));
    assert_eq!(
        decoded.user_properties,
        [("tern-start".to_owned(), "earliest".to_owned())]
    );
    let filter = &decoded.filters[0];
    assert!(filter.no_local && filter.retain_as_published);
    assert_eq!(filter.retain_handling, RetainHandling::Never);
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// The one-byte fast path measures frames as the general loop does.
        #[test]
        fn frames_are_measured_as_the_general_loop_measures_them(
            bytes in proptest::collection::vec(any::<u8>(), 0..8),
            max in 0usize..300,
        ) {
            prop_assert_eq!(
                format!("{:?}", frame_len(&bytes, max)),
                format!("{:?}", frame_len_general(&bytes, max))
            );
        }

        /// A PUBACK is written as rumqttd writes it, byte for byte, by the fast path or not.
        #[test]
        fn pubacks_are_written_as_rumqttd_writes_them(
            pkid in any::<u16>(),
            v5 in any::<bool>(),
            reason in prop::sample::select(vec![
                PubAckReason::Success,
                PubAckReason::NoMatchingSubscribers,
                PubAckReason::UnspecifiedError,
                PubAckReason::NotAuthorized,
                PubAckReason::QuotaExceeded,
            ]),
        ) {
            let version = if v5 { Version::V5 } else { Version::V4 };
            let (mut fast, mut general) = (BytesMut::new(), BytesMut::new());
            encode(version, Outgoing::PubAck { pkid, reason }, &mut fast).unwrap();
            encode_with_rumqttd(version, Outgoing::PubAck { pkid, reason }, &mut general).unwrap();
            prop_assert_eq!(fast, general);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            for version in [Version::V4, Version::V5] {
                if let Ok(Some(len)) = frame_len(&bytes, 1 << 20) {
                    let _ = decode(version, &bytes[..len]);
                }
                let _ = connect_version(&bytes);
            }
        }

        #[test]
        fn mutated_valid_packets_never_panic(
            pick in 0usize..4,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let version = if pick % 2 == 0 { Version::V4 } else { Version::V5 };
            let mut frame = match pick {
                0 | 1 => client_connect(version, "abc", true, 10),
                2 => client_publish(version, "a/b", b"payload", QoS::AtLeastOnce, 3),
                _ => client_subscribe(version, 4, "a/#", QoS::AtLeastOnce),
            };
            for (at, value) in flips {
                let i = at.index(frame.len());
                frame[i] = value;
            }
            if let Ok(Some(len)) = frame_len(&frame, 1 << 20) {
                let _ = decode(version, &frame[..len]);
            }
            let _ = connect_version(&frame);
        }

        /// The PUBLISH read straight from the frame is the one the pre-scan and rumqttd read,
        /// and a frame one refuses the other refuses too: valid publishes of every QoS, DUP and
        /// retain flag, empty topics and payloads, then the same frames with bytes changed or
        /// cut short.
        #[test]
        fn plain_publishes_decode_as_the_general_path_does(
            v5 in any::<bool>(),
            qos in 0u8..3,
            dup in any::<bool>(),
            retain in any::<bool>(),
            topic in "[a-z/]{0,12}",
            pkid in any::<u16>(),
            payload in proptest::collection::vec(any::<u8>(), 0..40),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            cut in any::<prop::sample::Index>(),
        ) {
            let version = if v5 { Version::V5 } else { Version::V4 };
            let mut body = Vec::new();
            body.put_u16(u16::try_from(topic.len()).expect("short topic"));
            body.extend_from_slice(topic.as_bytes());
            if qos > 0 {
                body.put_u16(pkid);
            }
            if v5 {
                body.push(0);
            }
            body.extend_from_slice(&payload);
            let byte1 = 0x30 | u8::from(dup) << 3 | qos << 1 | u8::from(retain);
            let mut frame = vec![byte1];
            let mut len = body.len();
            loop {
                let byte = (len % 128) as u8;
                len /= 128;
                frame.push(if len > 0 { byte | 0x80 } else { byte });
                if len == 0 {
                    break;
                }
            }
            frame.extend_from_slice(&body);
            let mutated = {
                let mut frame = frame.clone();
                for (at, value) in &flips {
                    let i = at.index(frame.len());
                    frame[i] = *value;
                }
                frame
            };
            let short = &frame[..cut.index(frame.len()).max(1)];
            for bytes in [&frame[..], &mutated[..], short] {
                let fast = decode_frame(version, BytesMut::from(bytes));
                let general = check_fixed_flags(bytes[0])
                    .and_then(|()| decode_checked(version, BytesMut::from(bytes)));
                match (fast, general) {
                    (Ok(fast), Ok(general)) => prop_assert_eq!(fast, general),
                    (Err(_), Err(_)) => {}
                    (fast, general) => prop_assert!(
                        false,
                        "{bytes:02x?}: fast path {fast:?}, general path {general:?}"
                    ),
                }
            }
        }
    }
}
