//! TLS tests with certificates made by `scripts/gen-test-certs.sh`: identity extraction (CN,
//! else SAN), loading the rustls configuration, and the `[mqtt.tls]` validation rules.

use super::super::config::default_tls_listen;
use super::*;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use std::path::{Path, PathBuf};

/// Fresh certificates from `scripts/gen-test-certs.sh` (Debian's openssl) in a temp directory.
pub(crate) fn certs(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tern-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gen-test-certs.sh");
    let status = std::process::Command::new("bash")
        .arg(script)
        .arg(&dir)
        .status()
        .expect("runs gen-test-certs.sh (needs openssl)");
    assert!(status.success(), "gen-test-certs.sh failed");
    dir
}

fn der(path: &Path) -> Vec<u8> {
    let cert = CertificateDer::from_pem_file(path).expect("PEM certificate");
    cert.as_ref().to_vec()
}

fn config(dir: &Path) -> TlsConfig {
    TlsConfig {
        listen: default_tls_listen(),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        client_ca: Some(dir.join("ca.pem")),
        require_client_cert: true,
        use_identity_as_username: true,
    }
}

#[test]
fn identity_is_the_common_name_else_the_first_san() {
    let dir = certs("identity");
    assert_eq!(
        identity(&der(&dir.join("client.pem"))).as_deref(),
        Some("sensor-7")
    );
    assert_eq!(
        identity(&der(&dir.join("san-client.pem"))).as_deref(),
        Some("device-9.example")
    );
    assert_eq!(identity(b"not a certificate"), None);
    assert_eq!(identity(&[]), None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn server_configuration_loads_and_names_bad_files() {
    let dir = certs("load");
    assert!(TlsServer::load(&config(&dir)).is_ok());
    let no_client_auth = TlsConfig {
        client_ca: None,
        use_identity_as_username: false,
        ..config(&dir)
    };
    assert!(TlsServer::load(&no_client_auth).is_ok());
    let missing = TlsConfig {
        cert: dir.join("absent.pem"),
        ..config(&dir)
    };
    let err = TlsServer::load(&missing).expect_err("missing file");
    assert!(err.to_string().contains("absent.pem"), "{err}");
    let key_as_cert = TlsConfig {
        cert: dir.join("server.key"),
        ..config(&dir)
    };
    let err = TlsServer::load(&key_as_cert).expect_err("no certificate");
    assert!(err.to_string().contains("no CERTIFICATE"), "{err}");
    let mismatched = TlsConfig {
        key: dir.join("client.key"),
        ..config(&dir)
    };
    assert!(
        TlsServer::load(&mismatched).is_err(),
        "key must match the certificate"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn identity_as_username_needs_required_client_certificates() {
    let dir = PathBuf::from("certs");
    assert!(config(&dir).validate(default_plain()).is_ok());
    let optional = TlsConfig {
        require_client_cert: false,
        ..config(&dir)
    };
    let err = optional
        .validate(default_plain())
        .expect_err("optional certs");
    assert!(
        err.to_string()
            .contains("mqtt.tls.use_identity_as_username"),
        "{err}"
    );
    let clash = TlsConfig {
        listen: default_plain(),
        ..config(&dir)
    };
    let err = clash.validate(default_plain()).expect_err("same address");
    assert!(err.to_string().contains("mqtt.tls.listen"), "{err}");
}

fn default_plain() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 1883))
}
