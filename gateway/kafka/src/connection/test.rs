//! One connection over an in-memory stream with SASL required: requests before authentication
//! close it, a v1 handshake with SaslAuthenticate and a v0 handshake with bare token frames
//! both log in, and a wrong password is answered with SASL_AUTHENTICATION_FAILED, then closed.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tern_auth::{Anonymous, Security};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};

use super::serve;
use crate::api::Conn;
use crate::config::{Authentication, KafkaListenerConfig};
use crate::frame;
use crate::sasl::Session;

const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// A served connection with SASL required over a password file with alice/secret.
fn connect(name: &str) -> DuplexStream {
    let dir = std::env::temp_dir().join(format!("tern-kafka-conn-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let passwd = dir.join("passwd");
    tern_auth::passwd::update(&passwd, "alice", Some("secret")).expect("passwd");
    let security = Security::load(Some(&passwd), Anonymous::Never, &[]).expect("security");
    let mut ctx = crate::api::test::ctx();
    ctx.config = Arc::new(KafkaListenerConfig {
        authentication: Authentication::Sasl,
        ..KafkaListenerConfig::default()
    });
    ctx.security = Some(Arc::new(security));
    let (client, server) = tokio::io::duplex(1 << 16);
    let conn = Conn {
        local: "127.0.0.1:9092".parse().expect("addr"),
        peer: "127.0.0.1:40000".parse().expect("addr"),
        sasl: Session::new(true),
    };
    tokio::spawn(serve(server, Arc::new(ctx), conn));
    client
}

async fn send<W: AsyncWrite + Unpin, B: Encodable>(
    stream: &mut W,
    api: ApiKey,
    version: i16,
    body: &B,
) {
    let buf = crate::api::test::request_bytes(api, version, 7, body);
    frame::write_frame(stream, &[&buf[..]])
        .await
        .expect("write");
}

/// The next frame, or `None` once the server closed the connection.
async fn frame<R: AsyncRead + Unpin>(stream: &mut R) -> Option<Bytes> {
    frame::read_frame(stream, 1 << 20)
        .await
        .ok()
        .flatten()
        .map(Bytes::from)
}

async fn answer<R: AsyncRead + Unpin, B: Decodable>(
    stream: &mut R,
    api: ApiKey,
    version: i16,
) -> B {
    let mut bytes = frame(stream).await.expect("an answer");
    ResponseHeader::decode(&mut bytes, api.response_header_version(version)).expect("header");
    B::decode(&mut bytes, version).expect("body")
}

/// Whether the server closes the connection without answering (within ten seconds).
async fn closes<R: AsyncRead + Unpin>(stream: &mut R) -> bool {
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), frame(stream)).await;
    matches!(next, Ok(None))
}

fn handshake(mechanism: &'static str) -> SaslHandshakeRequest {
    SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism))
}

fn metadata() -> MetadataRequest {
    MetadataRequest::default().with_topics(None)
}

#[tokio::test]
async fn a_request_before_authentication_closes_the_connection() {
    let mut client = connect("early");
    send(
        &mut client,
        ApiKey::ApiVersions,
        3,
        &ApiVersionsRequest::default(),
    )
    .await;
    let versions: ApiVersionsResponse = answer(&mut client, ApiKey::ApiVersions, 3).await;
    let sasl = versions
        .api_keys
        .iter()
        .find(|v| v.api_key == ApiKey::SaslHandshake as i16)
        .expect("SaslHandshake advertised");
    assert_eq!((sasl.min_version, sasl.max_version), (0, 1));
    send(&mut client, ApiKey::Metadata, 12, &metadata()).await;
    assert!(closes(&mut client).await, "Metadata was answered");
}

#[tokio::test]
async fn sasl_authenticate_logs_in_and_a_wrong_password_fails_then_closes() {
    let mut client = connect("v1");
    send(&mut client, ApiKey::SaslHandshake, 1, &handshake("PLAIN")).await;
    let shake: SaslHandshakeResponse = answer(&mut client, ApiKey::SaslHandshake, 1).await;
    assert_eq!(shake.error_code, 0);
    assert_eq!(shake.mechanisms.len(), 3);
    let token =
        SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\0alice\0secret"));
    send(&mut client, ApiKey::SaslAuthenticate, 2, &token).await;
    let auth: SaslAuthenticateResponse = answer(&mut client, ApiKey::SaslAuthenticate, 2).await;
    assert_eq!((auth.error_code, auth.error_message), (0, None));
    send(&mut client, ApiKey::Metadata, 12, &metadata()).await;
    let _: MetadataResponse = answer(&mut client, ApiKey::Metadata, 12).await;

    let mut client = connect("v1-wrong");
    send(&mut client, ApiKey::SaslHandshake, 1, &handshake("PLAIN")).await;
    let _: SaslHandshakeResponse = answer(&mut client, ApiKey::SaslHandshake, 1).await;
    let token =
        SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\0alice\0wrong"));
    send(&mut client, ApiKey::SaslAuthenticate, 2, &token).await;
    let auth: SaslAuthenticateResponse = answer(&mut client, ApiKey::SaslAuthenticate, 2).await;
    assert_eq!(auth.error_code, SASL_AUTHENTICATION_FAILED);
    assert!(
        auth.error_message
            .is_some_and(|m| m.contains("bad username or password"))
    );
    assert!(closes(&mut client).await, "still open after a failed login");
}

#[tokio::test]
async fn after_a_v0_handshake_the_tokens_are_bare_frames() {
    let mut client = connect("v0");
    send(&mut client, ApiKey::SaslHandshake, 0, &handshake("PLAIN")).await;
    let shake: SaslHandshakeResponse = answer(&mut client, ApiKey::SaslHandshake, 0).await;
    assert_eq!(shake.error_code, 0);
    frame::write_frame(&mut client, &[&b"\0alice\0secret"[..]])
        .await
        .expect("token");
    // PLAIN's answer is an empty token, as Kafka sends it.
    assert_eq!(frame(&mut client).await, Some(Bytes::new()));
    send(&mut client, ApiKey::Metadata, 12, &metadata()).await;
    let _: MetadataResponse = answer(&mut client, ApiKey::Metadata, 12).await;

    let mut client = connect("v0-wrong");
    send(&mut client, ApiKey::SaslHandshake, 0, &handshake("PLAIN")).await;
    let _: SaslHandshakeResponse = answer(&mut client, ApiKey::SaslHandshake, 0).await;
    frame::write_frame(&mut client, &[&b"\0alice\0wrong"[..]])
        .await
        .expect("token");
    assert!(
        closes(&mut client).await,
        "a failed v0 login closes without an answer"
    );
}
