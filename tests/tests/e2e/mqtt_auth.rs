//! Authentication, ACLs and TLS against the real binary with Debian's mosquitto_pub and
//! mosquitto_sub (MQTT 3.1.1 and 5): a password file written by `tern passwd`, anonymous
//! clients, topic ACLs on publish and subscribe, a TLS listener with server and client
//! certificates (generated at test time by scripts/gen-test-certs.sh with openssl).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::Context;
use tern_tests::{Gateway, ServeOptions, TempDir, read_log, tern_passwd_output, test_certs};

const VERSIONS: [&str; 2] = ["mqttv311", "mqttv5"];

/// Starts tern with `config` (TOML) written next to its data directory.
fn start(dir: &TempDir, config: &str) -> anyhow::Result<Gateway> {
    let file = dir.path().join("tern.toml");
    std::fs::write(&file, config)?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), file.display().to_string()],

        ..ServeOptions::default()
    };
    Gateway::start(&dir.path().join("data"), &options)
}

/// Runs a mosquitto client against `port` on loopback.
fn mosquitto(program: &str, port: u16, args: &[&str]) -> anyhow::Result<Output> {
    Command::new(program)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program} (scripts/ensure-deps.sh installs it)"))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The TLS listener's address, from its `mqtt tls listener on ADDR` log line.
fn tls_port(gateway: &mut Gateway) -> anyhow::Result<u16> {
    gateway
        .stderr_lines()
        .iter()
        .find_map(|line| line.split("mqtt tls listener on ").nth(1))
        .and_then(|addr| addr.trim().parse::<std::net::SocketAddr>().ok())
        .map(|addr| addr.port())
        .context("no TLS listener line")
}

fn values(data_dir: &Path) -> anyhow::Result<Vec<String>> {
    Ok(read_log(data_dir, "mqtt")?
        .into_iter()
        .map(|r| r.value)
        .collect())
}

/// mosquitto_pub with `-V version -q 1` and `args`.
fn publish(port: u16, version: &str, args: &[&str]) -> anyhow::Result<Output> {
    let mut all = vec!["-V", version, "-q", "1"];
    all.extend_from_slice(args);
    mosquitto("mosquitto_pub", port, &all)
}

#[test]
fn tern_passwd_users_are_accepted_and_wrong_or_anonymous_clients_refused() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-auth-passwd")?;
    let file = dir.path().join("passwd");
    let created = tern_passwd_output(&file, "alice", Some("wonderland"))?;
    assert!(created.status.success(), "{}", text(&created));
    assert!(
        tern_passwd_output(&file, "bob", Some("builder"))?
            .status
            .success()
    );
    let mode = std::fs::metadata(&file)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let config = format!(
        "[mqtt.auth]\npassword_file = \"{}\"\nallow_anonymous = false\n",
        file.display()
    );
    let mut gateway = start(&dir, &config)?;
    let port = gateway.mqtt.port();
    for version in VERSIONS {
        let good = publish(
            port,
            version,
            &["-u", "alice", "-P", "wonderland", "-t", "t", "-m", version],
        )?;
        assert!(good.status.success(), "{version}: {}", text(&good));
        let wrong = publish(
            port,
            version,
            &["-u", "alice", "-P", "builder", "-t", "t", "-m", "x"],
        )?;
        assert!(!wrong.status.success());
        let message = text(&wrong).to_lowercase();
        assert!(
            message.contains("bad user name or password"),
            "{version}: {message}"
        );
        let anonymous = publish(port, version, &["-t", "t", "-m", "x"])?;
        assert!(!anonymous.status.success());
        let message = text(&anonymous).to_lowercase();
        assert!(message.contains("not authori"), "{version}: {message}");
    }
    let bob = publish(
        port,
        "mqttv5",
        &["-u", "bob", "-P", "builder", "-t", "t", "-m", "bob"],
    )?;
    assert!(bob.status.success(), "{}", text(&bob));
    let deleted = tern_passwd_output(&file, "bob", None)?;
    assert!(deleted.status.success(), "{}", text(&deleted));
    let bob = publish(
        port,
        "mqttv5",
        &["-u", "bob", "-P", "builder", "-t", "t", "-m", "gone"],
    )?;
    assert!(
        !bob.status.success(),
        "deleted users are refused without a restart"
    );
    gateway.stop()?;
    assert_eq!(
        values(&dir.path().join("data"))?,
        ["mqttv311", "mqttv5", "bob"]
    );
    Ok(())
}

#[test]
fn acl_refuses_publish_and_subscribe_for_both_versions() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-auth-acl")?;
    // Anonymous clients on the loopback listener (the default), confined by client id.
    let config = "[[mqtt.acl]]\ntopic = \"devices/%c/#\"\naccess = \"readwrite\"\n";
    let mut gateway = start(&dir, config)?;
    let port = gateway.mqtt.port();
    for version in VERSIONS {
        let own = publish(
            port,
            version,
            &["-i", "dev-1", "-t", "devices/dev-1/t", "-m", version],
        )?;
        assert!(own.status.success(), "{version}: {}", text(&own));
        let other = publish(
            port,
            version,
            &["-i", "dev-1", "-t", "devices/dev-2/t", "-m", "no"],
        )?;
        if version == "mqttv5" {
            let message = text(&other).to_lowercase();
            assert!(message.contains("not authorized"), "{version}: {message}");
        } else {
            assert!(
                other.status.success(),
                "3.1.1 gets a plain PUBACK: {}",
                text(&other)
            );
        }
        let sub = mosquitto(
            "mosquitto_sub",
            port,
            &["-V", version, "-i", "dev-1", "-t", "devices/#", "-W", "5"],
        )?;
        let message = text(&sub);
        assert!(
            message.contains("All subscription requests were denied"),
            "{version}: {message}"
        );
    }
    gateway.stop()?;
    assert_eq!(
        values(&dir.path().join("data"))?,
        VERSIONS,
        "denied publishes are not stored"
    );
    Ok(())
}

#[test]
fn tls_listener_takes_the_client_certificate_as_username() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-auth-tls-cert")?;
    let certs = test_certs(dir.path())?;
    let file = |name: &str| certs.join(name).display().to_string();
    let config = format!(
        "[mqtt.auth]\nallow_anonymous = false\n\
         [mqtt.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
         use_identity_as_username = true\n\
         [[mqtt.acl]]\nuser = \"sensor-7\"\ntopic = \"sensors/%u/#\"\naccess = \"write\"\n",
        file("server.pem"),
        file("server.key"),
        file("ca.pem"),
    );
    let mut gateway = start(&dir, &config)?;
    let port = tls_port(&mut gateway)?;
    let ca = file("ca.pem");
    for version in VERSIONS {
        let tls = |cert: &str, key: &str, topic: &str| {
            let (cert, key) = (file(cert), file(key));
            let args = [
                "--cafile", &ca, "--cert", &cert, "--key", &key, "-t", topic, "-m", version,
            ];
            publish(port, version, &args)
        };
        let ok = tls("client.pem", "client.key", "sensors/sensor-7/temp")?;
        assert!(ok.status.success(), "{version}: {}", text(&ok));
        let denied = tls("client.pem", "client.key", "sensors/other/temp")?;
        if version == "mqttv5" {
            assert!(
                text(&denied).contains("Not authorized"),
                "{}",
                text(&denied)
            );
        }
        let rogue = tls("rogue.pem", "rogue.key", "sensors/sensor-7/temp")?;
        assert!(
            !rogue.status.success(),
            "a certificate of another CA is refused"
        );
        let none = publish(
            port,
            version,
            &["--cafile", &ca, "-t", "sensors/sensor-7/t", "-m", "x"],
        )?;
        assert!(
            !none.status.success(),
            "a client without certificate is refused"
        );
    }
    let plain = publish(
        gateway.mqtt.port(),
        "mqttv5",
        &["-t", "sensors/sensor-7/t", "-m", "x"],
    )?;
    assert!(
        !plain.status.success(),
        "anonymous refused on the plain listener too"
    );
    gateway.stop()?;
    assert_eq!(values(&dir.path().join("data"))?, VERSIONS);
    Ok(())
}

#[test]
fn tls_listener_with_passwords_and_no_client_certificates() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-auth-tls-pw")?;
    let certs = test_certs(dir.path())?;
    let passwd = dir.path().join("passwd");
    assert!(
        tern_passwd_output(&passwd, "alice", Some("wonderland"))?
            .status
            .success()
    );
    let file = |name: &str| certs.join(name).display().to_string();
    let config = format!(
        "[mqtt.auth]\npassword_file = \"{}\"\n\
         [mqtt.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\n",
        passwd.display(),
        file("server.pem"),
        file("server.key"),
    );
    let mut gateway = start(&dir, &config)?;
    let port = tls_port(&mut gateway)?;
    let ca = file("ca.pem");
    for version in VERSIONS {
        let args = [
            "--cafile",
            &ca,
            "-u",
            "alice",
            "-P",
            "wonderland",
            "-t",
            "t",
            "-m",
            version,
        ];
        let ok = publish(port, version, &args)?;
        assert!(ok.status.success(), "{version}: {}", text(&ok));
        let args = [
            "--cafile", &ca, "-u", "alice", "-P", "nope", "-t", "t", "-m", "x",
        ];
        assert!(!publish(port, version, &args)?.status.success());
        let plaintext = publish(port, version, &["-t", "t", "-m", "x"])?;
        assert!(
            !plaintext.status.success(),
            "plain MQTT on the TLS port fails"
        );
    }
    gateway.stop()?;
    assert_eq!(values(&dir.path().join("data"))?, VERSIONS);
    Ok(())
}
