//! Golden bytes of the packets tern's deliveries use: the QoS 2 acknowledgements in both
//! versions, PUBREC reason codes read from the frame, and MQTT 5 PUBLISH with a topic alias.

use bytes::{Bytes, BytesMut};

use super::super::*;

fn encoded(version: Version, packet: Outgoing) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(version, packet, &mut out).expect("encodes");
    out.to_vec()
}

#[test]
fn pubrel_is_four_bytes_with_the_reserved_flags_in_both_versions() {
    for version in [Version::V4, Version::V5] {
        let pubrel = encoded(version, Outgoing::PubRel { pkid: 0x0102 });
        assert_eq!(pubrel, [0x62, 0x02, 0x01, 0x02], "{version:?}");
    }
}

#[test]
fn pubrec_reason_codes_are_read_on_v5_only() {
    let plain = [0x50, 0x02, 0x00, 0x07];
    let refused = [0x50, 0x04, 0x00, 0x07, 0x80, 0x00];
    let short = [0x50, 0x03, 0x00, 0x07, 0x97];
    let cases = [
        (Version::V4, &plain[..], 0),
        (Version::V5, &plain[..], 0),
        (Version::V5, &refused[..], 0x80),
        (Version::V5, &short[..], 0x97),
    ];
    for (version, frame, reason) in cases {
        assert_eq!(
            decode(version, frame),
            Ok(Incoming::PubRec { pkid: 7, reason }),
            "{version:?} {frame:?}"
        );
    }
    assert_eq!(
        decode(Version::V5, &[0x70, 0x02, 0x00, 0x07]),
        Ok(Incoming::PubComp { pkid: 7 })
    );
}

#[test]
fn a_v5_publish_with_an_alias_and_no_topic_is_encoded_exactly() {
    let publish = OutPublish {
        topic: Bytes::new(),
        payload: Bytes::from_static(b"hi"),
        qos: QoS::ExactlyOnce,
        pkid: 3,
        dup: true,
        retain: false,
        properties: Some(PublishProperties {
            topic_alias: Some(5),
            ..PublishProperties::default()
        }),
    };
    let bytes = encoded(Version::V5, Outgoing::Publish(Box::new(publish)));
    assert_eq!(
        bytes,
        [
            0x3c, 0x0a, 0x00, 0x00, 0x00, 0x03, 0x03, 0x23, 0x00, 0x05, b'h', b'i'
        ]
    );
}
