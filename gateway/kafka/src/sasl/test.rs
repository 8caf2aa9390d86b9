//! The SASL state machine over a real password file (argon2 and SCRAM credentials written by
//! `tern passwd`'s code) and tern-auth's SCRAM client-side key derivation; PLAIN's parser
//! under arbitrary input.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use proptest::prelude::*;
use tern_auth::Users;
use tern_auth::scram::{Keys, ScramMechanism};

use super::*;

const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn users(name: &str) -> Users {
    let dir = std::env::temp_dir().join(format!("tern-kafka-sasl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path: PathBuf = dir.join("passwd");
    tern_auth::passwd::update(&path, "alice", Some("secret")).expect("passwd");
    Users::load(&path).expect("users")
}

fn authenticating() -> Session {
    Session::new(true)
}

#[test]
fn before_authentication_only_the_sasl_apis_and_api_versions_are_admitted() {
    let session = authenticating();
    for api in [
        ApiKey::ApiVersions,
        ApiKey::SaslHandshake,
        ApiKey::SaslAuthenticate,
    ] {
        assert!(session.admits(api), "{api:?}");
    }
    for api in [ApiKey::Metadata, ApiKey::Produce, ApiKey::Fetch] {
        assert!(!session.admits(api), "{api:?}");
    }
    assert!(Session::new(false).admits(ApiKey::Produce));
    assert_eq!(Session::new(false).user(), None);
}

#[test]
fn the_handshake_offers_only_enabled_mechanisms_and_comes_once() {
    let mut session = authenticating();
    let enabled = [Mechanism::Scram(ScramMechanism::Sha512)];
    let mut refused = authenticating();
    assert_eq!(
        refused.handshake("PLAIN", &enabled, false),
        Handshake::Unsupported
    );
    assert!(refused.failed(), "KIP-43: an unsupported mechanism closes");
    assert_eq!(
        session.handshake("scram-sha-512", &enabled, false),
        Handshake::Chosen(Mechanism::Scram(ScramMechanism::Sha512))
    );
    assert_eq!(
        session.handshake("SCRAM-SHA-512", &enabled, false),
        Handshake::Illegal
    );
    assert!(session.failed());
    assert_eq!(
        Session::new(false).handshake("PLAIN", &Mechanism::ALL, false),
        Handshake::Illegal
    );
}

#[tokio::test]
async fn plain_with_the_right_password_authenticates_and_a_wrong_one_fails() {
    let users = users("plain");
    let mut session = authenticating();
    session.handshake("PLAIN", &Mechanism::ALL, false);
    let step = session
        .authenticate(b"\0alice\0secret", Some(&users), PEER)
        .await;
    assert_eq!(step, Step::Done(Vec::new()));
    assert_eq!(session.user(), Some("alice"));
    assert!(session.admits(ApiKey::Produce));

    // After a v0 handshake the tokens are bare frames, until the exchange ends.
    let mut session = authenticating();
    session.handshake("PLAIN", &Mechanism::ALL, true);
    assert!(session.raw_tokens());
    let step = session
        .authenticate(b"\0alice\0secret", Some(&users), PEER)
        .await;
    assert_eq!(step, Step::Done(Vec::new()));
    assert!(!session.raw_tokens());

    let mut session = authenticating();
    session.handshake("PLAIN", &Mechanism::ALL, false);
    let step = session
        .authenticate(b"alice\0alice\0wrong", Some(&users), PEER)
        .await;
    assert_eq!(
        step,
        Step::Failed(SaslError::Refused(Refusal::BadCredentials))
    );
    assert!(session.failed());
    assert!(!session.admits(ApiKey::ApiVersions));
}

#[tokio::test]
async fn a_token_without_a_handshake_is_illegal() {
    let users = users("illegal");
    let mut session = authenticating();
    let step = session
        .authenticate(b"\0alice\0secret", Some(&users), PEER)
        .await;
    assert_eq!(step, Step::Illegal);
    assert!(session.failed());
}

/// The client side of SCRAM from RFC 5802, over tern-auth's key derivation.
fn client_final(
    mechanism: ScramMechanism,
    first_bare: &str,
    server_first: &str,
    password: &str,
) -> String {
    let fields: Vec<&str> = server_first.split(',').collect();
    let nonce = fields[0].strip_prefix("r=").expect("nonce");
    let salt = BASE64
        .decode(fields[1].strip_prefix("s=").expect("salt"))
        .expect("b64");
    let iterations: u32 = fields[2].strip_prefix("i=").expect("i").parse().expect("n");
    let keys = Keys::derive(
        mechanism,
        password.as_bytes(),
        &salt,
        NonZeroU32::new(iterations).expect("nonzero"),
    );
    let without_proof = format!("c=biws,r={nonce}");
    let auth_message = format!("{first_bare},{server_first},{without_proof}");
    let signature = mechanism.hmac_sign(&keys.stored_key, auth_message.as_bytes());
    let proof: Vec<u8> = keys
        .client_key
        .iter()
        .zip(&signature)
        .map(|(k, s)| k ^ s)
        .collect();
    format!("{without_proof},p={}", BASE64.encode(proof))
}

async fn scram(
    users: &Users,
    mechanism: ScramMechanism,
    user: &str,
    password: &str,
) -> (Session, Step) {
    let mut session = authenticating();
    session.handshake(mechanism.name(), &Mechanism::ALL, false);
    let bare = format!("n={user},r=clientnonce");
    let first = session
        .authenticate(format!("n,,{bare}").as_bytes(), Some(users), PEER)
        .await;
    let Step::Continue(server_first) = first else {
        panic!("server-first expected: {first:?}");
    };
    let server_first = String::from_utf8(server_first).expect("utf8");
    let last = client_final(mechanism, &bare, &server_first, password);
    let step = session
        .authenticate(last.as_bytes(), Some(users), PEER)
        .await;
    (session, step)
}

#[tokio::test]
async fn scram_sha_256_and_512_authenticate_with_the_password_and_fail_without() {
    let users = users("scram");
    for mechanism in ScramMechanism::ALL {
        let (session, step) = scram(&users, mechanism, "alice", "secret").await;
        assert!(
            matches!(&step, Step::Done(v) if v.starts_with(b"v=")),
            "{mechanism:?}: {step:?}"
        );
        assert_eq!(session.user(), Some("alice"));
        let (session, step) = scram(&users, mechanism, "alice", "wrong").await;
        assert_eq!(
            step,
            Step::Failed(SaslError::Scram(ScramError::InvalidProof))
        );
        assert!(session.failed());
        let (_, step) = scram(&users, mechanism, "mallory", "secret").await;
        assert_eq!(
            step,
            Step::Failed(SaslError::Scram(ScramError::InvalidProof))
        );
    }
}

#[tokio::test]
async fn without_a_password_file_every_exchange_fails() {
    let mut session = authenticating();
    session.handshake("PLAIN", &Mechanism::ALL, false);
    let step = session.authenticate(b"\0alice\0secret", None, PEER).await;
    assert_eq!(step, Step::Failed(SaslError::NoUsers));
}

#[test]
fn plain_fields_are_split_at_nul_and_checked() {
    assert_eq!(
        parse_plain(b"\0bob\0pw"),
        Ok(("bob".to_owned(), "pw".to_owned()))
    );
    assert_eq!(
        parse_plain(b"bob\0bob\0p\x01w"),
        Ok(("bob".to_owned(), "p\x01w".to_owned()))
    );
    assert_eq!(parse_plain(b"eve\0bob\0pw"), Err(SaslError::PlainAuthzId));
    for bad in [
        &b"bob\0pw"[..],
        b"\0\0pw",
        b"\0bob\0",
        b"\0bob\0pw\0x",
        b"\0b\xffob\0pw",
    ] {
        assert!(parse_plain(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        Mechanism::try_from("scram-sha-256".to_owned()),
        Ok(Mechanism::Scram(ScramMechanism::Sha256))
    );
    assert!(Mechanism::try_from("GSSAPI".to_owned()).is_err());
}

proptest! {
    #[test]
    fn any_plain_message_parses_or_is_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok((user, password)) = parse_plain(&bytes) {
            prop_assert!(!user.is_empty() && !password.is_empty());
            prop_assert!(!user.contains('\0') && !password.contains('\0'));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_token_in_any_state_is_answered(
        mechanism in 0usize..3,
        first in proptest::collection::vec(any::<u8>(), 0..96),
        second in proptest::collection::vec(any::<u8>(), 0..96),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let users = users_for_proptest();
        runtime.block_on(async {
            let mut session = authenticating();
            let name = Mechanism::ALL.get(mechanism).map_or("PLAIN", |m| m.name());
            session.handshake(name, &Mechanism::ALL, false);
            let step = session.authenticate(&first, Some(users), PEER).await;
            let again = session.authenticate(&second, Some(users), PEER).await;
            if !matches!(step, Step::Continue(_)) {
                prop_assert_eq!(again, Step::Illegal);
            }
            Ok(())
        })?;
    }
}

fn users_for_proptest() -> &'static Users {
    static USERS: std::sync::OnceLock<Users> = std::sync::OnceLock::new();
    USERS.get_or_init(|| users("proptest"))
}
