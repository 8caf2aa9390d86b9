//! Authentication and ACL enforcement over in-memory sockets: CONNACK refusal codes, refused
//! publishes acknowledged in order and never stored, refused subscriptions, and deliveries
//! filtered by `deny` rules.

use bytes::BytesMut;
use rumqttd::protocol::{self, Login, Packet, Protocol};

use super::{Client, Harness};
use crate::codec::test::client_subscribe;
use crate::codec::{QoS, Version};
use crate::config::MqttConfig;
use crate::config::auth::{Access, AclConfig, Anonymous, AuthConfig};
use tern_auth::passwd;
use tern_log::MemoryLog;

fn rule(topic: &str, access: Access) -> AclConfig {
    AclConfig {
        user: None,
        client_id: None,
        topic: topic.to_owned(),
        access,
    }
}

async fn with_acl(rules: Vec<AclConfig>) -> Harness {
    let config = MqttConfig {
        acl: rules,
        ..MqttConfig::default()
    };
    Harness::with_config(MemoryLog::new(1), config).await
}

fn connect_with_login(version: Version, user: &str, password: &str) -> Vec<u8> {
    let connect = protocol::Connect {
        keep_alive: 60,
        client_id: "login".to_owned(),
        clean_session: true,
    };
    let login = Login {
        username: user.to_owned(),
        password: password.to_owned(),
    };
    let packet = Packet::Connect(connect, None, None, None, Some(login));
    let mut out = BytesMut::new();
    match version {
        Version::V4 => protocol::v4::V4.write(packet, &mut out),
        Version::V5 => protocol::v5::V5.write(packet, &mut out),
    }
    .expect("encodes");
    out.to_vec()
}

async fn raw_client(h: &Harness, version: Version) -> Client {
    let (io, task) = h.socket();
    Client {
        io,
        buf: BytesMut::new(),
        version,
        task,
    }
}

#[tokio::test]
async fn credentials_are_checked_and_refusals_carry_the_right_code() {
    let dir = std::env::temp_dir().join(format!("tern-conn-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("passwd");
    passwd::update(&file, "alice", Some("wonderland")).expect("password file");
    let config = MqttConfig {
        auth: AuthConfig {
            password_file: Some(file),
            allow_anonymous: Anonymous::Never,
        },
        ..MqttConfig::default()
    };
    let h = Harness::with_config(MemoryLog::new(1), config).await;
    let cases = [
        (Version::V4, "wonderland", vec![0x20, 2, 0, 0]),
        (Version::V4, "wrong", vec![0x20, 2, 0, 4]),
        (Version::V5, "wrong", vec![0x20, 3, 0, 0x86, 0]),
    ];
    for (version, password, expected) in cases {
        let mut c = raw_client(&h, version).await;
        c.send(&connect_with_login(version, "alice", password))
            .await;
        assert_eq!(
            c.frame().await[..expected.len()],
            expected[..],
            "{password}"
        );
    }
    for (version, expected) in [
        (Version::V4, vec![0x20, 2, 0, 5]),
        (Version::V5, vec![0x20, 3, 0, 0x87, 0]),
    ] {
        let mut c = raw_client(&h, version).await;
        c.send(&crate::codec::test::client_connect(
            version, "anon", true, 60,
        ))
        .await;
        assert_eq!(c.frame().await, expected, "anonymous {version:?}");
        assert!(c.closed(super::WAIT).await);
    }
    assert!(h.records().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn refused_publishes_are_acknowledged_in_order_and_never_stored() {
    let h = with_acl(vec![rule("open/#", Access::Write)]).await;
    let mut v5 = h.connect(Version::V5, "v5", true).await;
    v5.publish("open/a", b"1", QoS::AtLeastOnce, 1).await;
    v5.publish("closed/a", b"secret", QoS::AtLeastOnce, 2).await;
    v5.publish("closed/b", b"secret", QoS::ExactlyOnce, 3).await;
    v5.publish("open/b", b"2", QoS::AtLeastOnce, 4).await;
    assert_eq!(v5.frame().await, [0x40, 2, 0, 1]);
    assert_eq!(v5.frame().await, [0x40, 4, 0, 2, 0x87, 0]);
    assert_eq!(v5.frame().await, [0x50, 4, 0, 3, 0x87, 0]);
    assert_eq!(v5.frame().await, [0x40, 2, 0, 4]);

    let mut v4 = h.connect(Version::V4, "v4", true).await;
    v4.publish("closed/c", b"secret", QoS::AtLeastOnce, 5).await;
    assert_eq!(v4.frame().await, [0x40, 2, 0, 5], "3.1.1: a plain PUBACK");
    let values: Vec<Vec<u8>> = h.records().into_iter().map(|r| r.value.to_vec()).collect();
    assert_eq!(values, [b"1".to_vec(), b"2".to_vec()]);
}

#[tokio::test]
async fn refused_subscriptions_get_not_authorized() {
    let h = with_acl(vec![rule("feed/%c/#", Access::Read)]).await;
    let mut v4 = h.connect(Version::V4, "dev", true).await;
    v4.send(&client_subscribe(
        Version::V4,
        1,
        "feed/dev/#",
        QoS::AtLeastOnce,
    ))
    .await;
    assert_eq!(v4.frame().await, [0x90, 3, 0, 1, 1]);
    v4.send(&client_subscribe(
        Version::V4,
        2,
        "feed/#",
        QoS::AtLeastOnce,
    ))
    .await;
    assert_eq!(v4.frame().await, [0x90, 3, 0, 2, 0x80]);
    let mut v5 = h.connect(Version::V5, "dev5", true).await;
    v5.send(&client_subscribe(
        Version::V5,
        3,
        "feed/dev/#",
        QoS::AtLeastOnce,
    ))
    .await;
    assert_eq!(v5.frame().await, [0x90, 4, 0, 3, 0, 0x87]);
}

#[tokio::test]
async fn deny_rules_filter_deliveries_inside_a_granted_subscription() {
    let for_client = |id: &str, topic: &str, access| AclConfig {
        client_id: Some(id.to_owned()),
        ..rule(topic, access)
    };
    let h = with_acl(vec![
        for_client("pub", "a/#", Access::Write),
        for_client("sub", "a/#", Access::Read),
        for_client("sub", "a/secret", Access::Deny),
    ])
    .await;
    let mut sub = h.connect(Version::V4, "sub", true).await;
    sub.send(&client_subscribe(Version::V4, 1, "a/#", QoS::AtMostOnce))
        .await;
    assert_eq!(sub.frame().await, [0x90, 3, 0, 1, 0]);
    let mut publisher = h.connect(Version::V4, "pub", true).await;
    publisher
        .publish("a/secret", b"s", QoS::AtLeastOnce, 1)
        .await;
    assert_eq!(publisher.frame().await, [0x40, 2, 0, 1]);
    publisher.publish("a/open", b"o", QoS::AtLeastOnce, 2).await;
    assert_eq!(publisher.frame().await, [0x40, 2, 0, 2]);
    let delivered = sub.frame().await;
    assert_eq!(delivered[0] & 0xf0, 0x30, "a PUBLISH: {delivered:?}");
    assert!(delivered.ends_with(b"a/openo"), "{delivered:?}");
    assert_eq!(
        h.records().len(),
        2,
        "both were stored; one was not readable"
    );
}
