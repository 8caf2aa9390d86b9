//! SCRAM server tests: RFC 7677's SHA-256 example, byte for byte; SHA-512 exchanges against a
//! client built from the same RFC 5802 formulas; refusals; the credential's file form; and
//! property tests that no client message panics the parser or the server.

use proptest::prelude::*;

use super::*;

/// RFC 7677, section 3: user "user", password "pencil".
const CLIENT_FIRST: &[u8] = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const SERVER_FIRST: &[u8] =
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const CLIENT_FINAL: &[u8] = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const SERVER_FINAL: &[u8] = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_credential() -> ScramCredential {
    let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("salt");
    ScramCredential::derive(ScramMechanism::Sha256, "pencil", salt, 4096)
}

#[test]
fn the_server_follows_rfc_7677() -> Result<(), ScramError> {
    let mut server = ScramServer::new(ScramMechanism::Sha256);
    let first = server.client_first_with_nonce(CLIENT_FIRST, SERVER_NONCE, |user| {
        assert_eq!(user, "user");
        Some(rfc_credential())
    })?;
    assert_eq!(first, SERVER_FIRST);
    let (user, last) = server.client_final(CLIENT_FINAL)?;
    assert_eq!(user, "user");
    assert_eq!(last, SERVER_FINAL);
    assert_eq!(
        server.client_final(CLIENT_FINAL),
        Err(ScramError::OutOfOrder),
        "one exchange per server"
    );
    Ok(())
}

#[test]
fn a_wrong_proof_an_unknown_user_and_a_foreign_nonce_are_refused() -> Result<(), ScramError> {
    let wrong_proof = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
p=AAAAAapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    let mut server = ScramServer::new(ScramMechanism::Sha256);
    server.client_first_with_nonce(CLIENT_FIRST, SERVER_NONCE, |_| Some(rfc_credential()))?;
    assert_eq!(
        server.client_final(wrong_proof),
        Err(ScramError::InvalidProof)
    );

    // An unknown user gets a salt and iteration count like anyone, stable per name.
    let mut unknown = ScramServer::new(ScramMechanism::Sha256);
    let first = unknown.client_first_with_nonce(CLIENT_FIRST, SERVER_NONCE, |_| None)?;
    let mut again = ScramServer::new(ScramMechanism::Sha256);
    assert_eq!(
        first,
        again.client_first_with_nonce(CLIENT_FIRST, SERVER_NONCE, |_| None)?
    );
    assert!(String::from_utf8_lossy(&first).ends_with(",i=4096"));
    assert_eq!(
        unknown.client_final(CLIENT_FINAL),
        Err(ScramError::InvalidProof)
    );

    // A credential of the other mechanism is no credential.
    let mut other = ScramServer::new(ScramMechanism::Sha512);
    other.client_first_with_nonce(CLIENT_FIRST, SERVER_NONCE, |_| Some(rfc_credential()))?;
    assert_eq!(
        other.client_final(CLIENT_FINAL),
        Err(ScramError::InvalidProof)
    );

    let mut nonce = ScramServer::new(ScramMechanism::Sha256);
    nonce.client_first_with_nonce(CLIENT_FIRST, "other", |_| Some(rfc_credential()))?;
    assert_eq!(nonce.client_final(CLIENT_FINAL), Err(ScramError::Nonce));
    Ok(())
}

/// The client half of RFC 5802, from [`Keys`], for exchanges without a published vector.
fn client_final(
    mechanism: ScramMechanism,
    password: &str,
    first_bare: &str,
    server_first: &[u8],
    gs2: &str,
) -> (Vec<u8>, Vec<u8>) {
    client_final_with_prefix(mechanism, password, first_bare, server_first, gs2, "")
}

/// [`client_final`] with `prefix` in front of the nonce (librdkafka 2.x repeats the client
/// nonce there).
fn client_final_with_prefix(
    mechanism: ScramMechanism,
    password: &str,
    first_bare: &str,
    server_first: &[u8],
    gs2: &str,
    prefix: &str,
) -> (Vec<u8>, Vec<u8>) {
    let text = std::str::from_utf8(server_first).expect("utf-8");
    let field = |name: &str| {
        text.split(',')
            .find_map(|f| f.strip_prefix(name))
            .expect("field")
    };
    let salt = BASE64.decode(field("s=")).expect("salt");
    let iterations = field("i=").parse().expect("iterations");
    let keys = Keys::derive(mechanism, password.as_bytes(), &salt, iterations);
    let without_proof = format!("c={},r={prefix}{}", BASE64.encode(gs2), field("r="));
    let auth = format!("{first_bare},{text},{without_proof}");
    let signature = mechanism.hmac_sign(&keys.stored_key, auth.as_bytes());
    let proof: Vec<u8> = keys
        .client_key
        .iter()
        .zip(signature)
        .map(|(k, s)| k ^ s)
        .collect();
    let expected = mechanism.hmac_sign(&keys.server_key, auth.as_bytes());
    (
        format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes(),
        format!("v={}", BASE64.encode(expected)).into_bytes(),
    )
}

#[test]
fn a_final_nonce_ending_with_the_exchanges_passes_as_in_kafka() -> Result<(), ScramError> {
    let stored = ScramCredential::generate(ScramMechanism::Sha512, "s3cret")?;
    // librdkafka 2.x: r=<client nonce><client nonce><server nonce>.
    let mut server = ScramServer::new(ScramMechanism::Sha512);
    let first = server.client_first(b"n,,n=alice,r=abc", |_| Some(stored.clone()))?;
    let (last, signature) = client_final_with_prefix(
        ScramMechanism::Sha512,
        "s3cret",
        "n=alice,r=abc",
        &first,
        "n,,",
        "abc",
    );
    assert_eq!(server.client_final(&last)?, ("alice".to_owned(), signature));
    // The server's part must still be there.
    let mut server = ScramServer::new(ScramMechanism::Sha512);
    server.client_first(b"n,,n=alice,r=abc", |_| Some(stored.clone()))?;
    assert_eq!(
        server.client_final(b"c=biws,r=abcabc,p=AAAA"),
        Err(ScramError::Nonce)
    );
    Ok(())
}

#[test]
fn sha_512_exchanges_with_escaped_names_and_an_authzid() -> Result<(), ScramError> {
    let stored = ScramCredential::generate(ScramMechanism::Sha512, "s3cret")?;
    for (gs2, bare, user) in [
        ("n,,", "n=a=2Cb=3Dc,r=abc", "a,b=c"),
        ("y,a=alice,", "n=alice,r=xyz,ext=1", "alice"),
    ] {
        let mut server = ScramServer::new(ScramMechanism::Sha512);
        let first = server.client_first(format!("{gs2}{bare}").as_bytes(), |name| {
            (name == user).then(|| stored.clone())
        })?;
        let (last, signature) = client_final(ScramMechanism::Sha512, "s3cret", bare, &first, gs2);
        assert_eq!(server.client_final(&last)?, (user.to_owned(), signature));
    }
    let mut wrong = ScramServer::new(ScramMechanism::Sha512);
    let first = wrong.client_first(b"n,,n=alice,r=abc", |_| Some(stored.clone()))?;
    let (last, _) = client_final(
        ScramMechanism::Sha512,
        "s3creT",
        "n=alice,r=abc",
        &first,
        "n,,",
    );
    assert_eq!(wrong.client_final(&last), Err(ScramError::InvalidProof));
    Ok(())
}

#[test]
fn client_first_refusals() {
    let cases: [(&[u8], ScramError); 7] = [
        (b"p=tls-unique,,n=u,r=a", ScramError::ChannelBinding),
        (b"n,a=bob,n=alice,r=a", ScramError::AuthzId),
        (
            b"n,,m=x,n=u,r=a",
            ScramError::Malformed("mandatory extensions are not supported"),
        ),
        (
            b"n,,n=u=2X,r=a",
            ScramError::Malformed("bad escape in the username"),
        ),
        (b"n,,n=u", ScramError::Malformed("no valid nonce")),
        (b"n,,n=,r=a", ScramError::Malformed("empty username")),
        (
            b"x,,n=u,r=a",
            ScramError::Malformed("bad channel-binding flag"),
        ),
    ];
    for (message, expected) in cases {
        assert_eq!(
            ClientFirst::parse(message),
            Err(expected),
            "{}",
            String::from_utf8_lossy(message)
        );
    }
}

#[test]
fn credentials_have_a_file_form() -> Result<(), String> {
    let credential = rfc_credential();
    let text = credential.encode();
    assert!(
        text.starts_with("$scram-sha-256$i=4096$W22ZaJ0SNY7soEsUEjb6gQ==$"),
        "{text}"
    );
    assert_eq!(ScramCredential::decode(&text)?, credential);
    for bad in [
        "$scram-sha-1$i=4096$AA==$AA==$AA==",
        "$scram-sha-256$i=10$W22ZaJ0SNY7soEsUEjb6gQ==$AA==$AA==",
        "$scram-sha-256$i=4096$W22ZaJ0SNY7soEsUEjb6gQ==$AA==$AA==",
        "scram-sha-256$i=4096$AA==$AA==$AA==",
        "$scram-sha-256$i=4096$$",
    ] {
        assert!(ScramCredential::decode(bad).is_err(), "{bad}");
    }
    assert!(
        !format!("{credential:?}").contains("stored"),
        "Debug hides the keys"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_client_message_panics_the_server(first in proptest::collection::vec(any::<u8>(), 0..200),
                                           last in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        let _ = server.client_first_with_nonce(&first, "n", |_| Some(rfc_credential()));
        prop_assert!(server.client_final(&last).is_err());
        let _ = ClientFinal::parse(&first);
    }

    #[test]
    fn structured_messages_parse_or_fail_cleanly(user in "[a-z=,]{0,12}", nonce in "[!-~]{0,12}",
                                                 ext in "[a-z=,]{0,8}") {
        let escaped = user.replace('=', "=3D").replace(',', "=2C");
        let message = format!("n,,n={escaped},r={nonce}{ext}");
        match ClientFirst::parse(message.as_bytes()) {
            Ok(first) => {
                prop_assert_eq!(first.user, user);
                prop_assert_eq!(first.gs2_header, "n,,");
            }
            Err(err) => prop_assert!(matches!(err, ScramError::Malformed(_)), "{err}"),
        }
    }

    #[test]
    fn credentials_round_trip_through_their_file_form(salt in proptest::collection::vec(any::<u8>(), 1..40),
                                                      iterations in 4096u32..=16384, sha512 in any::<bool>()) {
        let mechanism = if sha512 { ScramMechanism::Sha512 } else { ScramMechanism::Sha256 };
        let credential = ScramCredential {
            mechanism,
            salt,
            iterations,
            stored_key: vec![7; mechanism.key_len()],
            server_key: vec![9; mechanism.key_len()],
        };
        prop_assert_eq!(ScramCredential::decode(&credential.encode()), Ok(credential));
    }
}
