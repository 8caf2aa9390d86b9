//! Golden bytes and property tests of the packet codec: encode/decode round trips, every cut-short
//! packet is `Incomplete`, and no input makes the decoder panic or over-read.

use proptest::prelude::*;

use super::*;

fn encode_vec(packet: &Packet<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 70_000];
    let len = packet.encode(&mut buf).unwrap();
    buf.truncate(len);
    buf
}

#[test]
fn connect_golden_bytes() {
    let packet = Packet::Connect(Connect {
        client_id: "tern-7",
        keep_alive_s: 30,
        clean_session: true,
        credentials: None,
    });
    let mut golden = vec![0x10, 18, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 30, 0, 6];
    golden.extend_from_slice(b"tern-7");
    assert_eq!(encode_vec(&packet), golden);
}

#[test]
fn connect_with_login_golden_bytes() {
    let packet = Packet::Connect(Connect {
        client_id: "tern-7",
        keep_alive_s: 30,
        clean_session: true,
        credentials: Some(Credentials {
            username: "7",
            password: b"pw",
        }),
    });
    // Flags 0xc2: username, password, clean session; then client id, username, password.
    let mut golden = vec![0x10, 25, 0, 4, b'M', b'Q', b'T', b'T', 4, 0xc2, 0, 30, 0, 6];
    golden.extend_from_slice(b"tern-7");
    golden.extend_from_slice(&[0, 1, b'7', 0, 2, b'p', b'w']);
    assert_eq!(encode_vec(&packet), golden);
}

#[test]
fn a_username_or_password_alone_is_refused_and_the_password_never_printed() {
    for flags in [0x82, 0x42, 0x80, 0x40] {
        let mut bytes = vec![
            0x10, 0, 0, 4, b'M', b'Q', b'T', b'T', 4, flags, 0, 30, 0, 1, b'c',
        ];
        bytes.extend_from_slice(&[0, 1, b'u']);
        bytes[1] = u8::try_from(bytes.len() - 2).unwrap();
        assert_eq!(
            decode(&bytes),
            Err(DecodeError::MalformedBody { packet_type: 1 }),
            "flags {flags:#x}"
        );
    }
    let login = Credentials {
        username: "7",
        password: b"hunter2",
    };
    let shown = format!("{login:?}");
    assert!(
        shown.contains("\"7\"") && !shown.contains("hunter2"),
        "{shown}"
    );
}

#[test]
fn publish_qos1_dup_golden_bytes() {
    let packet = Packet::Publish(Publish {
        topic: "a/b",
        payload: &[0xde, 0xad],
        qos: QoS::AtLeastOnce,
        packet_id: Some(0x0102),
        dup: true,
        retain: false,
    });
    let golden = vec![0x3a, 9, 0, 3, b'a', b'/', b'b', 1, 2, 0xde, 0xad];
    assert_eq!(encode_vec(&packet), golden);
}

#[test]
fn small_packets_golden_bytes() {
    assert_eq!(encode_vec(&Packet::PingReq), vec![0xc0, 0]);
    assert_eq!(encode_vec(&Packet::Disconnect), vec![0xe0, 0]);
    assert_eq!(
        encode_vec(&Packet::PubAck { packet_id: 7 }),
        vec![0x40, 2, 0, 7]
    );
    let subscribe = Packet::Subscribe {
        packet_id: 3,
        filter: "c",
        qos: QoS::AtLeastOnce,
    };
    assert_eq!(encode_vec(&subscribe), vec![0x82, 6, 0, 3, 0, 1, b'c', 1]);
}

#[test]
fn long_payload_uses_a_two_byte_remaining_length() {
    let payload = [0u8; 200];
    let packet = Packet::Publish(Publish {
        topic: "t",
        payload: &payload,
        qos: QoS::AtMostOnce,
        packet_id: None,
        dup: false,
        retain: false,
    });
    let bytes = encode_vec(&packet);
    // 2 + 1 + 200 = 203 = 0x4b + 1 * 128.
    assert_eq!(&bytes[..3], &[0x30, 0xcb, 0x01]);
    assert_eq!(decode(&bytes), Ok((packet, 206)));
}

#[test]
fn encode_rejects_what_mqtt_forbids() {
    let mut buf = [0u8; 64];
    let no_id = Packet::Publish(Publish {
        topic: "t",
        payload: &[],
        qos: QoS::AtLeastOnce,
        packet_id: None,
        dup: false,
        retain: false,
    });
    assert_eq!(no_id.encode(&mut buf), Err(EncodeError::MissingPacketId));
    let mut small = [0u8; 3];
    assert_eq!(
        Packet::PubAck { packet_id: 1 }.encode(&mut small),
        Err(EncodeError::BufferTooSmall {
            needed: 4,
            capacity: 3
        })
    );
}

#[test]
fn decode_rejects_bad_headers() {
    assert_eq!(
        decode(&[0x50, 2, 0, 1]),
        Err(DecodeError::UnsupportedPacketType { packet_type: 5 })
    );
    assert_eq!(
        decode(&[0x41, 2, 0, 1]),
        Err(DecodeError::InvalidFlags {
            packet_type: 4,
            flags: 1
        })
    );
    assert_eq!(
        decode(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x01]),
        Err(DecodeError::MalformedRemainingLength)
    );
    assert_eq!(decode(&[0x40, 2, 0, 0]), Err(DecodeError::ZeroPacketId));
    assert_eq!(
        decode(&[0x34, 5, 0, 1, b't', 0, 1]),
        Err(DecodeError::UnsupportedQoS { qos: 2 })
    );
    assert_eq!(
        decode(&[0x40, 3, 0, 1, 9]),
        Err(DecodeError::MalformedBody { packet_type: 4 })
    );
}

#[test]
fn frame_golden_bytes_of_any_type() {
    // UNSUBACK (type 11), which `decode` does not handle, framed all the same.
    let unsuback = [0xb0, 2, 0, 9, 0x40];
    assert_eq!(
        frame(&unsuback),
        Ok(Frame {
            packet_type: 11,
            flags: 0,
            header_len: 2,
            len: 4
        })
    );
    assert_eq!(
        decode(&unsuback),
        Err(DecodeError::UnsupportedPacketType { packet_type: 11 })
    );
    // A PUBLISH with a two-byte remaining length of 203.
    let mut publish = vec![0x33, 0xcb, 0x01];
    publish.resize(206, 0);
    assert_eq!(
        frame(&publish),
        Ok(Frame {
            packet_type: 3,
            flags: 3,
            header_len: 3,
            len: 206
        })
    );
    assert_eq!(
        frame(&publish[..100]),
        Err(DecodeError::Incomplete { needed: 106 })
    );
    assert_eq!(frame(&[]), Err(DecodeError::Incomplete { needed: 2 }));
    assert_eq!(
        frame(&[0x30, 0xff, 0xff, 0xff, 0xff]),
        Err(DecodeError::MalformedRemainingLength)
    );
}

#[test]
fn payloads_past_64_kib_encode_with_a_three_byte_length() {
    let payload = vec![0x5a; 70_000];
    let packet = Packet::Publish(Publish {
        topic: "bench/0",
        payload: &payload,
        qos: QoS::AtLeastOnce,
        packet_id: Some(1),
        dup: false,
        retain: false,
    });
    let len = packet.encoded_len().unwrap();
    let mut buf = vec![0u8; len];
    assert_eq!(packet.encode(&mut buf), Ok(len));
    // 2 + 7 + 2 + 70,000 = 70,011 = 0x7b + 0x5e * 128 + 4 * 128².
    assert_eq!(&buf[..4], &[0x32, 0xfb, 0xa2, 0x04]);
    assert_eq!(len, 70_015);
    assert_eq!(decode(&buf), Ok((packet, len)));
    let long_topic = "t".repeat(70_000);
    let too_long = Packet::Subscribe {
        packet_id: 1,
        filter: &long_topic,
        qos: QoS::AtMostOnce,
    };
    assert_eq!(
        too_long.encoded_len(),
        Err(EncodeError::FieldTooLong { len: 70_000 })
    );
}

/// An owned packet, so proptest can generate and shrink it.
#[derive(Debug, Clone)]
enum Case {
    Connect(String, u16, bool, Option<(String, Vec<u8>)>),
    ConnAck(bool, u8),
    Publish(String, Vec<u8>, Option<u16>, bool, bool),
    PubAck(u16),
    Subscribe(u16, String, bool),
    SubAck(u16, u8),
    PingReq,
    PingResp,
    Disconnect,
}

impl Case {
    fn packet(&self) -> Packet<'_> {
        match self {
            Case::Connect(id, keep_alive_s, clean, login) => Packet::Connect(Connect {
                client_id: id,
                keep_alive_s: *keep_alive_s,
                clean_session: *clean,
                credentials: login
                    .as_ref()
                    .map(|(username, password)| Credentials { username, password }),
            }),
            Case::ConnAck(session_present, code) => Packet::ConnAck {
                session_present: *session_present,
                code: *code,
            },
            Case::Publish(topic, payload, packet_id, dup, retain) => Packet::Publish(Publish {
                topic,
                payload,
                qos: packet_id.map_or(QoS::AtMostOnce, |_| QoS::AtLeastOnce),
                packet_id: *packet_id,
                dup: *dup && packet_id.is_some(),
                retain: *retain,
            }),
            Case::PubAck(packet_id) => Packet::PubAck {
                packet_id: *packet_id,
            },
            Case::Subscribe(packet_id, filter, qos1) => Packet::Subscribe {
                packet_id: *packet_id,
                filter,
                qos: if *qos1 {
                    QoS::AtLeastOnce
                } else {
                    QoS::AtMostOnce
                },
            },
            Case::SubAck(packet_id, code) => Packet::SubAck {
                packet_id: *packet_id,
                code: *code,
            },
            Case::PingReq => Packet::PingReq,
            Case::PingResp => Packet::PingResp,
            Case::Disconnect => Packet::Disconnect,
        }
    }
}

fn any_case() -> impl Strategy<Value = Case> {
    let id = 1..=u16::MAX;
    prop_oneof![
        (
            ".{0,40}",
            any::<u16>(),
            any::<bool>(),
            proptest::option::of((".{0,20}", proptest::collection::vec(any::<u8>(), 0..40)))
        )
            .prop_map(|(c, k, s, l)| Case::Connect(c, k, s, l)),
        (any::<bool>(), any::<u8>()).prop_map(|(s, c)| Case::ConnAck(s, c)),
        (
            ".{0,40}",
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::option::of(id.clone()),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(t, p, i, d, r)| Case::Publish(t, p, i, d, r)),
        id.clone().prop_map(Case::PubAck),
        (id.clone(), ".{0,40}", any::<bool>()).prop_map(|(i, f, q)| Case::Subscribe(i, f, q)),
        (id, any::<u8>()).prop_map(|(i, c)| Case::SubAck(i, c)),
        Just(Case::PingReq),
        Just(Case::PingResp),
        Just(Case::Disconnect),
    ]
}

proptest! {
    #[test]
    fn decode_reverses_encode(case in any_case()) {
        let bytes = encode_vec(&case.packet());
        prop_assert_eq!(decode(&bytes), Ok((case.packet(), bytes.len())));
    }

    #[test]
    fn every_cut_short_packet_is_incomplete(case in any_case(), cut in any::<prop::sample::Index>()) {
        let bytes = encode_vec(&case.packet());
        let len = cut.index(bytes.len());
        let result = decode(&bytes[..len]);
        prop_assert!(
            matches!(result, Err(DecodeError::Incomplete { needed }) if needed >= 1 && needed <= bytes.len() - len),
            "prefix of {} bytes out of {} gave {:?}", len, bytes.len(), result
        );
    }

    #[test]
    fn decoder_never_panics_and_stays_in_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok((packet, used)) = decode(&bytes) {
            prop_assert!(used <= bytes.len());
            let again = encode_vec(&packet);
            prop_assert_eq!(decode(&again), Ok((packet, again.len())));
        }
    }

    #[test]
    fn frame_agrees_with_encode_and_decode(case in any_case(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
        let packet = case.packet();
        let mut bytes = encode_vec(&packet);
        prop_assert_eq!(packet.encoded_len(), Ok(bytes.len()));
        let len = bytes.len();
        bytes.extend_from_slice(&tail);
        let framed = frame(&bytes).unwrap();
        prop_assert_eq!(framed.len, len);
        prop_assert_eq!(bytes[0], (framed.packet_type << 4) | framed.flags);
        prop_assert_eq!(decode(&bytes).map(|(_, used)| used), Ok(framed.len));
    }

    #[test]
    fn frame_never_panics_and_stays_in_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        match frame(&bytes) {
            Ok(framed) => prop_assert!(framed.header_len <= framed.len && framed.len <= bytes.len()),
            Err(DecodeError::Incomplete { needed }) => prop_assert!(needed >= 1),
            Err(err) => prop_assert_eq!(err, DecodeError::MalformedRemainingLength),
        }
    }

    #[test]
    fn trailing_bytes_are_left_for_the_next_packet(case in any_case(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
        let mut bytes = encode_vec(&case.packet());
        let len = bytes.len();
        bytes.extend_from_slice(&tail);
        prop_assert_eq!(decode(&bytes), Ok((case.packet(), len)));
    }
}
