//! CONNECT decision tests: passwords from a real file (and its reload), anonymous access per
//! listener, certificate identities and will topics checked against the ACL.

use super::super::config::auth::{Access, AclConfig, Anonymous};
use super::*;
use crate::codec::{LastWill, QoS, Version};
use std::path::PathBuf;

use tern_auth::passwd;

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tern-auth-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join("passwd")
}

fn connect(user: Option<&str>, password: Option<&str>) -> Connect {
    Connect {
        version: Version::V5,
        client_id: "dev-1".to_owned(),
        clean_start: true,
        keep_alive: 30,
        properties: None,
        will: None,
        will_properties: None,
        username: user.map(str::to_owned),
        password: password.map(str::to_owned),
    }
}

fn origin(loopback: bool) -> Origin {
    Origin {
        loopback_listener: loopback,
        cert_identity: None,
        peer: None,
    }
}

fn auth_with_users(name: &str, anonymous: Anonymous) -> (Auth, PathBuf) {
    let path = temp_file(name);
    passwd::update(&path, "alice", Some("wonderland")).expect("writes");
    let config = AuthConfig {
        password_file: Some(path.clone()),
        allow_anonymous: anonymous,
    };
    (Auth::load(&config, &[]).expect("loads"), path)
}

#[tokio::test]
async fn passwords_are_checked_against_the_file() {
    let (auth, _path) = auth_with_users("check", Anonymous::Never);
    let ok = auth
        .authenticate(&connect(Some("alice"), Some("wonderland")), &origin(false))
        .await;
    assert_eq!(ok, Ok(Some("alice".to_owned())));
    for (user, password) in [
        ("alice", Some("wrong")),
        ("alice", None),
        ("mallory", Some("wonderland")),
    ] {
        let refused = auth
            .authenticate(&connect(Some(user), password), &origin(true))
            .await;
        assert_eq!(refused, Err(ConnAckCode::BadUserNamePassword), "{user}");
    }
}

#[tokio::test]
async fn anonymous_clients_follow_the_listener_rule() {
    let (auth, _path) = auth_with_users("anon", Anonymous::Loopback);
    let anonymous = connect(None, None);
    assert_eq!(auth.authenticate(&anonymous, &origin(true)).await, Ok(None));
    assert_eq!(
        auth.authenticate(&anonymous, &origin(false)).await,
        Err(ConnAckCode::NotAuthorized)
    );
    let open = Auth::load(
        &AuthConfig {
            password_file: None,
            allow_anonymous: Anonymous::Always,
        },
        &[],
    )
    .expect("loads");
    assert_eq!(
        open.authenticate(&anonymous, &origin(false)).await,
        Ok(None)
    );
    let closed = Auth::load(&AuthConfig::default(), &[]).expect("loads");
    let claimed = connect(Some("alice"), Some("x"));
    assert_eq!(
        closed.authenticate(&claimed, &origin(false)).await,
        Err(ConnAckCode::NotAuthorized),
        "without a password file a username proves nothing"
    );
    assert_eq!(closed.authenticate(&claimed, &origin(true)).await, Ok(None));
}

#[tokio::test]
async fn a_certificate_identity_is_the_username() {
    let auth = Auth::load(&AuthConfig::default(), &[]).expect("loads");
    let via_cert = Origin {
        loopback_listener: false,
        cert_identity: Some("sensor-7".to_owned()),
        peer: None,
    };
    let result = auth
        .authenticate(&connect(Some("root"), None), &via_cert)
        .await;
    assert_eq!(result, Ok(Some("sensor-7".to_owned())));
}

#[tokio::test]
async fn the_password_file_is_reloaded_when_it_changes() {
    let (auth, path) = auth_with_users("reload", Anonymous::Never);
    let bob = connect(Some("bob"), Some("builder"));
    assert!(auth.authenticate(&bob, &origin(true)).await.is_err());
    passwd::update(&path, "bob", Some("builder")).expect("adds bob");
    assert_eq!(
        auth.authenticate(&bob, &origin(true)).await,
        Ok(Some("bob".to_owned()))
    );
    std::fs::write(&path, "garbage\n").expect("breaks the file");
    assert_eq!(
        auth.authenticate(&bob, &origin(true)).await,
        Ok(Some("bob".to_owned())),
        "a broken file keeps the previous users"
    );
}

#[tokio::test]
async fn a_will_topic_needs_write_access() {
    let rules = [AclConfig {
        user: None,
        client_id: None,
        topic: "wills/%c".to_owned(),
        access: Access::Write,
    }];
    let config = AuthConfig {
        password_file: None,
        allow_anonymous: Anonymous::Always,
    };
    let auth = Auth::load(&config, &rules).expect("loads");
    let mut with_will = connect(None, None);
    with_will.will = Some(LastWill {
        topic: "wills/dev-1".into(),
        message: "bye".into(),
        qos: QoS::AtLeastOnce,
        retain: false,
    });
    assert_eq!(
        auth.authenticate(&with_will, &origin(false)).await,
        Ok(None)
    );
    if let Some(will) = &mut with_will.will {
        will.topic = "alarms/all".into();
    }
    assert_eq!(
        auth.authenticate(&with_will, &origin(false)).await,
        Err(ConnAckCode::NotAuthorized)
    );
}

#[test]
fn a_missing_password_file_fails_at_startup() {
    let config = AuthConfig {
        password_file: Some(temp_file("missing").with_file_name("absent")),
        allow_anonymous: Anonymous::Loopback,
    };
    let err = Auth::load(&config, &[]).expect_err("missing");
    assert!(err.to_string().contains("absent"), "{err}");
}
