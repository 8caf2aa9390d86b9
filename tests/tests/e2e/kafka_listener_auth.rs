//! The Kafka listener's authentication and ACLs with real clients against the real `tern`
//! binary: kcat (librdkafka) over SASL_SSL with SCRAM-SHA-512 and over SASL_PLAINTEXT with
//! PLAIN on loopback, Kafka's Java console consumer with SCRAM-SHA-256 from a client properties
//! file; the users are `tern passwd`'s and the rules `[[mqtt.acl]]`, as for MQTT. Negative
//! controls: a wrong password, a client without SASL, a user whose rules deny the topic.

use std::path::{Path, PathBuf};

use anyhow::bail;
use tern_tests::kafka_tools::{console_format_args, parse_console_records, run_tool_at};
use tern_tests::{Gateway, ServeOptions, TempDir, tern_passwd, test_certs};

/// alice may read and write `telemetry`, bob only read it, carol only use `other`.
const RULES: &str = r#"
[[mqtt.acl]]
user = "alice"
topic = "telemetry"
access = "readwrite"

[[mqtt.acl]]
user = "bob"
topic = "telemetry"
access = "read"

[[mqtt.acl]]
user = "carol"
topic = "other"
access = "readwrite"
"#;

/// A gateway whose Kafka listener requires SASL (with TLS when `tls`), its users, and the CA
/// its certificate is signed by.
struct Secured {
    dir: TempDir,
    gateway: Gateway,
    ca: PathBuf,
    tls: bool,
}

fn start(label: &str, tls: bool) -> anyhow::Result<Secured> {
    let dir = TempDir::new(label)?;
    let passwd = dir.path().join("passwd");
    for (user, password) in [
        ("alice", "alice-pw"),
        ("bob", "bob-pw"),
        ("carol", "carol-pw"),
    ] {
        tern_passwd(&passwd, user, password)?;
    }
    let certs = test_certs(dir.path())?;
    let mut config = format!(
        "[mqtt.auth]\npassword_file = {:?}\nallow_anonymous = false\n{RULES}\n\
         [kafka_listener]\nauthentication = \"sasl\"\n",
        passwd.display().to_string()
    );
    if tls {
        config.push_str(&format!(
            "[kafka_listener.tls]\ncert = {:?}\nkey = {:?}\n",
            certs.join("server.pem").display().to_string(),
            certs.join("server.key").display().to_string()
        ));
    }
    let file = dir.path().join("tern.toml");
    std::fs::write(&file, config)?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), file.display().to_string()],
        ..ServeOptions::default()
    };
    let gateway = Gateway::start(&dir.path().join("data"), &options)?;
    assert_ne!(gateway.kafka.port(), 0, "no `kafka listener on` line");
    Ok(Secured {
        dir,
        gateway,
        ca: certs.join("ca.pem"),
        tls,
    })
}

/// How a kcat run authenticates: `-X` settings.
fn sasl(secured: &Secured, mechanism: &str, user: &str, password: &str) -> Vec<String> {
    let tls = secured.tls;
    let mut settings = vec![
        format!(
            "security.protocol={}",
            if tls { "SASL_SSL" } else { "SASL_PLAINTEXT" }
        ),
        format!("sasl.mechanisms={mechanism}"),
        format!("sasl.username={user}"),
        format!("sasl.password={password}"),
    ];
    if tls {
        settings.push(format!("ssl.ca.location={}", secured.ca.display()));
    }
    settings
}

/// Runs kcat against the listener with `settings` (each `-X`), feeding `stdin`: (success,
/// stdout, stderr).
fn kcat(
    secured: &Secured,
    settings: &[String],
    args: &[&str],
    stdin: &[u8],
) -> anyhow::Result<(bool, String, String)> {
    let mut all: Vec<&str> = settings.iter().flat_map(|s| ["-X", s.as_str()]).collect();
    all.extend_from_slice(args);
    super::kafka_listener::kcat(&secured.gateway, &all, stdin)
}

fn produce(secured: &Secured, settings: &[String], lines: &str) -> anyhow::Result<()> {
    let args = ["-P", "-t", "telemetry", "-X", "acks=all"];
    let (ok, _, err) = kcat(secured, settings, &args, lines.as_bytes())?;
    if !ok {
        bail!("kcat -P failed: {err}");
    }
    Ok(())
}

fn consume(secured: &Secured, settings: &[String]) -> anyhow::Result<Vec<String>> {
    let args = ["-C", "-t", "telemetry", "-o", "beginning", "-e", "-q"];
    let (ok, out, err) = kcat(secured, settings, &args, b"")?;
    if !ok {
        bail!("kcat -C failed: {err}");
    }
    Ok(out.lines().map(str::to_owned).collect())
}

/// The topics `kcat -L` lists.
fn listed(secured: &Secured, settings: &[String]) -> anyhow::Result<Vec<String>> {
    let (ok, out, err) = kcat(secured, settings, &["-L"], b"")?;
    if !ok {
        bail!("kcat -L failed: {err}");
    }
    Ok(out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("topic \""))
        .filter_map(|l| l.split('"').next())
        .map(str::to_owned)
        .collect())
}

#[test]
fn kcat_produces_and_consumes_over_sasl_ssl_with_scram_sha_512() -> anyhow::Result<()> {
    let secured = start("kafka-auth-ssl", true)?;
    let alice = sasl(&secured, "SCRAM-SHA-512", "alice", "alice-pw");
    produce(&secured, &alice, "t-1\nt-2\nt-3\n")?;
    assert_eq!(consume(&secured, &alice)?, ["t-1", "t-2", "t-3"]);

    // Negative controls: the TLS port refuses a client without TLS, and a wrong password.
    let plain_text = [
        "security.protocol=SASL_PLAINTEXT".to_owned(),
        "sasl.mechanisms=SCRAM-SHA-512".to_owned(),
        "sasl.username=alice".to_owned(),
        "sasl.password=alice-pw".to_owned(),
    ];
    let (ok, _, _) = kcat(&secured, &plain_text, &["-L", "-m", "3"], b"")?;
    assert!(
        !ok,
        "a client without TLS got metadata from the TLS listener"
    );
    let wrong = sasl(&secured, "SCRAM-SHA-512", "alice", "wrong");
    let (ok, _, err) = kcat(&secured, &wrong, &["-L", "-m", "5"], b"")?;
    assert!(!ok, "a wrong password got metadata");
    assert!(err.contains("SASL authentication error"), "{err}");
    Ok(())
}

#[test]
fn kcat_over_sasl_plaintext_with_plain_and_the_acl_on_every_request() -> anyhow::Result<()> {
    let secured = start("kafka-auth-plain", false)?;
    let alice = sasl(&secured, "PLAIN", "alice", "alice-pw");
    let bob = sasl(&secured, "SCRAM-SHA-256", "bob", "bob-pw");
    let carol = sasl(&secured, "PLAIN", "carol", "carol-pw");
    produce(&secured, &alice, "p-1\np-2\n")?;
    assert_eq!(consume(&secured, &alice)?, ["p-1", "p-2"]);

    // bob may read telemetry, not write it.
    assert_eq!(consume(&secured, &bob)?, ["p-1", "p-2"]);
    let err = produce(&secured, &bob, "b-1\n").expect_err("bob wrote");
    assert!(
        err.to_string().contains("Topic authorization failed"),
        "{err}"
    );
    // carol may neither: telemetry is not in her metadata, and reading it is refused.
    assert_eq!(listed(&secured, &alice)?, ["telemetry"]);
    assert!(listed(&secured, &carol)?.is_empty(), "carol sees telemetry");
    let err = consume(&secured, &carol).expect_err("carol read");
    assert!(err.to_string().contains("authorization failed"), "{err}");
    assert_eq!(
        consume(&secured, &alice)?,
        ["p-1", "p-2"],
        "bob wrote nothing"
    );

    // Negative controls: without SASL nothing but ApiVersions is answered; a wrong password
    // (last: the failed-login backoff would delay the logins after it).
    let (ok, _, _) = kcat(&secured, &[], &["-L", "-m", "3"], b"")?;
    assert!(!ok, "a client without SASL got metadata");
    let wrong = sasl(&secured, "PLAIN", "alice", "wrong");
    let (ok, _, err) = kcat(&secured, &wrong, &["-L", "-m", "5"], b"")?;
    assert!(!ok, "a wrong password got metadata");
    assert!(err.contains("bad username or password"), "{err}");
    Ok(())
}

/// A Java client properties file for SCRAM-SHA-256 over SASL_PLAINTEXT.
fn java_properties(dir: &Path, user: &str, password: &str) -> anyhow::Result<PathBuf> {
    let file = dir.join(format!("{user}.properties"));
    std::fs::write(
        &file,
        format!(
            "security.protocol=SASL_PLAINTEXT\n\
             sasl.mechanism=SCRAM-SHA-256\n\
             sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
             username=\"{user}\" password=\"{password}\";\n"
        ),
    )?;
    Ok(file)
}

#[test]
fn kafkas_console_consumer_reads_with_scram_sha_256_from_a_properties_file() -> anyhow::Result<()> {
    let secured = start("kafka-auth-java", false)?;
    let alice = sasl(&secured, "PLAIN", "alice", "alice-pw");
    produce(&secured, &alice, "j-1\nj-2\nj-3\n")?;
    let consume_as = |properties: &Path| {
        let mut args = vec![
            "--topic",
            "telemetry",
            "--partition",
            "0",
            "--offset",
            "earliest",
            "--max-messages",
            "3",
            "--timeout-ms",
            "30000",
            "--command-config",
        ];
        let properties = properties.display().to_string();
        args.push(&properties);
        args.extend(console_format_args());
        run_tool_at(
            secured.dir.path(),
            &secured.gateway.kafka.to_string(),
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            &args,
            b"",
        )
    };
    let output = consume_as(&java_properties(secured.dir.path(), "alice", "alice-pw")?)?;
    let records = parse_console_records(&output.stdout)?;
    let values: Vec<&str> = records.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(values, ["j-1", "j-2", "j-3"]);

    // Negative control: the same consumer with a wrong password reads nothing (the tool
    // reports the SaslAuthenticationException and, in 4.x, still exits 0).
    let report = match consume_as(&java_properties(secured.dir.path(), "bob", "wrong")?) {
        Ok(output) => {
            assert!(output.stdout.is_empty(), "a wrong password consumed");
            String::from_utf8_lossy(&output.stderr).into_owned()
        }
        Err(err) => err.to_string(),
    };
    assert!(report.contains("SaslAuthenticationException"), "{report}");
    Ok(())
}
