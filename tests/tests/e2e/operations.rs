//! Operating a gateway, against the real `tern` binary: readiness that names why it cannot
//! store (a full partition and the cursor holding it, a nearly full disk, an unsynchronised
//! clock, a failing upstream), liveness, cursors listed and repaired offline and through the
//! admin endpoint, their metrics, secrets kept out of `tern config check`, SIGHUP reloads
//! without dropping clients, and the status page in a real headless browser.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir, run_tern, wait_until};

/// Writes `text` as `tern.toml` in `dir`; the serve options that use it.
fn with_config(dir: &Path, text: &str) -> anyhow::Result<(PathBuf, ServeOptions)> {
    let path = dir.join("tern.toml");
    std::fs::write(&path, text)?;
    let options = ServeOptions {
        args: vec!["--config".into(), path.display().to_string()],
        ..ServeOptions::default()
    };
    Ok((path, options))
}

fn readyz(gateway: &Gateway) -> anyhow::Result<(u16, Value)> {
    let (status, body) = gateway.admin_get("/readyz")?;
    let json = serde_json::from_str(&body).with_context(|| format!("/readyz body {body:?}"))?;
    Ok((status, json))
}

fn reasons(json: &Value) -> Vec<String> {
    json["reasons"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|x| x["reason"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn tern_json(args: &[&str]) -> anyhow::Result<Value> {
    let (status, stdout, stderr) = run_tern(args)?;
    if !status.success() {
        bail!("tern {args:?} failed: {stderr}");
    }
    serde_json::from_str(&stdout).with_context(|| format!("tern {args:?} printed {stdout:?}"))
}

/// A data directory whose data lives beside the config: small segments and retention so a few
/// hundred KiB fill a partition.
const SMALL_LOG: &str = r#"
[log]
partitions = 1
segment_bytes = "4KiB"
index_interval = "1KiB"
[log.retention]
bytes = "16KiB"
[health]
interval = "100ms"
"#;

/// Whether every publish received has been stored in the `mqtt` topic or refused.
fn publishes_settled(gateway: &Gateway) -> anyhow::Result<bool> {
    let count = |name, labels| -> anyhow::Result<u64> {
        Ok(gateway.metric_sum(name, labels)?.unwrap_or(0))
    };
    let stored = count("tern_log_end_offset", "topic=\"mqtt\"")?;
    let rejected = count("tern_mqtt_publishes_rejected_total", "")?;
    Ok(stored + rejected == count("tern_mqtt_publishes_received_total", "")?)
}

#[test]
fn a_full_partition_is_not_ready_names_its_cursor_and_recovers_when_the_cursor_is_deleted()
-> anyhow::Result<()> {
    let dir = TempDir::new("ops-full")?;
    let data = dir.path().join("data");
    let (_, options) = with_config(dir.path(), SMALL_LOG)?;
    let mut gateway = Gateway::start(&data, &options)?;
    wait_until(Duration::from_secs(10), "ready at start", || {
        Ok(readyz(&gateway)?.0 == 200)
    })?;

    // An abandoned persistent session: subscribed once, never back.
    let mut holder = RawClient::connect(gateway.mqtt, "holder", 30, false, false)?;
    assert_eq!(holder.subscribe("plant/#", 1, 1)?, 1);
    holder.disconnect()?;
    // Gone before the filler publishes: a session still connected would take the first
    // records (QoS 0 deliveries move its cursor at once) and hold fewer than the test counts.
    wait_until(
        Duration::from_secs(10),
        "the holder's connection to close",
        || Ok(gateway.metric_sum("tern_mqtt_connections", "")? == Some(0)),
    )?;
    let admin = gateway.admin.to_string();
    wait_until(Duration::from_secs(10), "the session's cursor", || {
        let list = tern_json(&["cursors", "list", "--admin", &admin, "--json"])?;
        Ok(list.to_string().contains("\"mqtt:holder\""))
    })?;

    let mut publisher = RawClient::connect(gateway.mqtt, "filler", 30, true, false)?;
    let payload = vec![b'x'; 1000];
    wait_until(Duration::from_secs(30), "the partition to fill", || {
        for _ in 0..20 {
            publisher.publish("plant/line-1", &payload, 0, 0, false)?;
        }
        Ok(readyz(&gateway)?.0 == 503)
    })?;
    // A burst reaches the log as appends of several records: one of them may be refused while
    // a single record still fits, and a publish still queued then makes the partition ready
    // again. So let every publish be stored or refused, then fill with single records, each
    // settled before the next, until one is refused: nothing smaller follows it.
    wait_until(
        Duration::from_secs(10),
        "every burst publish stored or refused",
        || publishes_settled(&gateway),
    )?;
    wait_until(Duration::from_secs(30), "a single record refused", || {
        let rejected = gateway.metric_sum("tern_mqtt_publishes_rejected_total", "")?;
        publisher.publish("plant/line-1", &payload, 0, 0, false)?;
        wait_until(
            Duration::from_secs(10),
            "the publish stored or refused",
            || publishes_settled(&gateway),
        )?;
        Ok(gateway.metric_sum("tern_mqtt_publishes_rejected_total", "")? > rejected)
    })?;
    // The health checker sees it at its next tick (`[health] interval`).
    wait_until(Duration::from_secs(10), "not ready: partition full", || {
        Ok(readyz(&gateway)?.0 == 503)
    })?;
    let (_, body) = readyz(&gateway)?;
    let full = body["reasons"]
        .as_array()
        .and_then(|r| r.iter().find(|x| x["reason"] == "partition_full"))
        .with_context(|| format!("no partition_full reason in {body}"))?;
    assert_eq!(full["topic"], "mqtt", "{body}");
    assert_eq!(full["cursor"], "mqtt:holder", "{body}");
    assert!(
        gateway
            .stderr_lines()
            .iter()
            .any(|l| l.contains("partition full") && l.contains("holder=mqtt:holder")),
        "the WARN line names the holder: {:#?}",
        gateway.recent_log(20)
    );
    let lag = gateway.metric_sum("tern_cursor_lag_records", "cursor=\"mqtt:holder\"")?;
    // Each commit starts on a 4 KiB page, so a 16 KiB limit holds a few 1,000-byte records.
    assert!(lag.is_some_and(|n| n >= 2), "lag {lag:?}");
    let held = gateway.metric_sum("tern_cursor_held_bytes", "cursor=\"mqtt:holder\"")?;
    assert!(held.is_some_and(|n| n >= 2000), "held {held:?}");
    assert_eq!(gateway.metric_sum("tern_ready", "")?, Some(0));

    // The offline path refuses while the gateway holds the directory, and changes nothing.
    let data_arg = data.display().to_string();
    let (status, _, stderr) =
        run_tern(&["cursors", "delete", "mqtt:holder", "--data-dir", &data_arg])?;
    assert!(
        !status.success(),
        "offline delete under a running tern must be refused"
    );
    assert!(stderr.contains("in use by a running tern"), "{stderr}");
    assert_eq!(readyz(&gateway)?.0, 503);

    // The listing names owner, lag, bytes and the age of the oldest record held.
    let list = tern_json(&["cursors", "list", "--admin", &admin, "--json"])?;
    let cursor = list["cursors"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "mqtt:holder"))
        .with_context(|| format!("{list}"))?;
    assert_eq!(cursor["owner"], "mqtt session");
    let position = &cursor["positions"][0];
    assert!(
        position["lag_bytes"].as_u64().is_some_and(|b| b > 0),
        "{position}"
    );
    assert!(position["oldest_held_age_seconds"].is_i64(), "{position}");
    let (status, table, _) = run_tern(&["cursors", "list", "--admin", &admin])?;
    assert!(
        status.success() && table.contains("mqtt:holder") && table.contains("mqtt session"),
        "{table}"
    );

    // Delete every cursor of the abandoned session through the admin endpoint: appends resume.
    let names: Vec<String> = list["cursors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .filter(|n| n.ends_with(":holder"))
        .map(str::to_owned)
        .collect();
    for name in &names {
        let answer = tern_json(&["cursors", "delete", name, "--admin", &admin])?;
        assert_eq!(answer["deleted"], true, "{answer}");
    }
    wait_until(Duration::from_secs(10), "ready again", || {
        publisher.publish("plant/line-1", &payload, 0, 0, false)?;
        Ok(readyz(&gateway)?.0 == 200)
    })?;
    publisher.disconnect()?;
    let (status, _, stderr) = run_tern(&["cursors", "delete", "mqtt:holder", "--admin", &admin])?;
    assert!(
        !status.success() && stderr.contains("no such cursor"),
        "{stderr}"
    );
    gateway.stop()?;
    Ok(())
}

#[test]
fn cursors_are_listed_reset_and_deleted_offline_on_a_stopped_gateway() -> anyhow::Result<()> {
    let dir = TempDir::new("ops-offline")?;
    let data = dir.path().join("data");
    let (_, options) = with_config(dir.path(), SMALL_LOG)?;
    let mut gateway = Gateway::start(&data, &options)?;
    let mut holder = RawClient::connect(gateway.mqtt, "sleeper", 30, false, false)?;
    assert_eq!(holder.subscribe("plant/#", 1, 1)?, 1);
    holder.disconnect()?;
    let mut publisher = RawClient::connect(gateway.mqtt, "p", 30, true, false)?;
    for i in 0..5u16 {
        assert_eq!(publisher.publish_qos1("plant/a", b"reading", i + 1)?, 0);
    }
    publisher.disconnect()?;
    let admin = gateway.admin.to_string();
    wait_until(Duration::from_secs(10), "the session's cursor", || {
        let list = tern_json(&["cursors", "list", "--admin", &admin, "--json"])?;
        Ok(list.to_string().contains("\"mqtt:sleeper\""))
    })?;
    gateway.stop()?;

    let data_arg = data.display().to_string();
    let list = tern_json(&["cursors", "list", "--data-dir", &data_arg, "--json"])?;
    let position = |list: &Value| -> Value {
        list["cursors"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "mqtt:sleeper"))
            .map(|c| c["positions"][0].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(position(&list)["lag_records"], 5, "{list}");

    let reset = tern_json(&[
        "cursors",
        "reset",
        "mqtt:sleeper",
        "--to",
        "latest",
        "--data-dir",
        &data_arg,
    ])?;
    assert_eq!(reset["moved"], 1, "{reset}");
    let list = tern_json(&["cursors", "list", "--data-dir", &data_arg, "--json"])?;
    assert_eq!(position(&list)["lag_records"], 0, "{list}");
    let reset = tern_json(&[
        "cursors",
        "reset",
        "mqtt:sleeper",
        "--to",
        "2",
        "--data-dir",
        &data_arg,
    ])?;
    assert_eq!(reset["moved"], 1, "{reset}");
    let list = tern_json(&["cursors", "list", "--data-dir", &data_arg, "--json"])?;
    assert_eq!(position(&list)["offset"], 2, "{list}");
    let (status, _, stderr) = run_tern(&[
        "cursors",
        "reset",
        "mqtt:sleeper",
        "--to",
        "99",
        "--data-dir",
        &data_arg,
    ])?;
    assert!(!status.success() && stderr.contains("99"), "{stderr}");

    let deleted = tern_json(&["cursors", "delete", "mqtt:sleeper", "--data-dir", &data_arg])?;
    assert_eq!(deleted["deleted"], true, "{deleted}");
    let list = tern_json(&["cursors", "list", "--data-dir", &data_arg, "--json"])?;
    assert_eq!(position(&list), Value::Null, "{list}");
    Ok(())
}

#[test]
fn readiness_reports_disk_clock_and_upstream_with_reasons_while_liveness_holds()
-> anyhow::Result<()> {
    let dir = TempDir::new("ops-ready")?;
    // A port nothing listens on: the upstream never connects.
    let dead = tern_tests::free_port()?;
    let config = format!(
        r#"
[health]
interval = "100ms"
min_free_bytes = 1000000000000000000
clock_not_before = "2200-01-01T00:00:00Z"
upstream_failed_after = "1s"

[[upstream]]
bootstrap = ["{dead}"]
gateway_id = "ops"
backoff_max = "1s"
"#
    );
    let (_, options) = with_config(dir.path(), &config)?;
    let gateway = Gateway::start(&dir.path().join("data"), &options)?;
    wait_until(Duration::from_secs(20), "three reasons", || {
        let (status, body) = readyz(&gateway)?;
        let got = reasons(&body);
        Ok(status == 503
            && [
                "disk_nearly_full",
                "clock_unsynchronised",
                "upstream_failed",
            ]
            .iter()
            .all(|r| got.iter().any(|g| g == r)))
    })?;
    let (_, body) = readyz(&gateway)?;
    for reason in body["reasons"].as_array().into_iter().flatten() {
        assert!(
            reason["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{reason}"
        );
    }
    assert_eq!(gateway.admin_get("/livez")?.0, 200);
    assert_eq!(gateway.admin_get("/healthz")?, (200, "ok\n".to_owned()));
    Ok(())
}

#[test]
fn config_check_redacts_secrets_and_reads_them_from_a_file_or_the_environment() -> anyhow::Result<()>
{
    let dir = TempDir::new("ops-secrets")?;
    let check = |text: &str, env: Option<(&str, &str)>| -> anyhow::Result<(bool, String, String)> {
        let path = dir.path().join("check.toml");
        std::fs::write(&path, text)?;
        let mut command = std::process::Command::new(tern_tests::tern_binary()?);
        command.arg("config").arg("check").arg(&path);
        if let Some((key, value)) = env {
            command.env(key, value);
        }
        let output = command.output()?;
        Ok((
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ))
    };
    let sasl = |password_line: &str| {
        format!(
            "[[upstream]]\nbootstrap = [\"127.0.0.1:9\"]\n[upstream.sasl]\nmechanism = \"SCRAM-SHA-512\"\nusername = \"edge\"\n{password_line}\n"
        )
    };

    let (ok, stdout, stderr) = check(&sasl("password = \"in-clear-secret\""), None)?;
    assert!(ok, "{stderr}");
    assert!(!stdout.contains("in-clear-secret"), "{stdout}");
    assert!(stdout.contains("password = \"<redacted>\""), "{stdout}");

    let secret_file = dir.path().join("sasl-password");
    std::fs::write(&secret_file, "file-secret\n")?;
    let line = format!("password_file = \"{}\"", secret_file.display());
    let (ok, stdout, stderr) = check(&sasl(&line), None)?;
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains("file-secret") && stdout.contains("password_file"),
        "{stdout}"
    );

    let line = "password_env = \"TERN_E2E_SASL_PASSWORD\"";
    let env = Some(("TERN_E2E_SASL_PASSWORD", "env-secret"));
    let (ok, stdout, stderr) = check(&sasl(line), env)?;
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains("env-secret") && stdout.contains("password_env"),
        "{stdout}"
    );
    let (ok, _, stderr) = check(&sasl(line), None)?;
    assert!(
        !ok && stderr.contains("upstream.sasl.password_env"),
        "{stderr}"
    );

    let both = "password = \"x\"\npassword_env = \"TERN_E2E_SASL_PASSWORD\"";
    let (ok, _, stderr) = check(&sasl(both), env)?;
    assert!(!ok && stderr.contains("upstream.sasl.password"), "{stderr}");
    Ok(())
}

/// Drives `connection` until `wanted` sees an event; counts CONNACKs in `connacks`.
fn await_event(
    connection: &mut rumqttc::Connection,
    connacks: &mut usize,
    wanted: impl Fn(&rumqttc::Incoming) -> bool,
) -> anyhow::Result<rumqttc::Incoming> {
    use rumqttc::{Event, Incoming};
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        match connection.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(Event::Incoming(packet))) => {
                if matches!(packet, Incoming::ConnAck(_)) {
                    *connacks += 1;
                }
                if wanted(&packet) {
                    return Ok(packet);
                }
            }
            Ok(Err(err)) => bail!("the client's connection failed: {err}"),
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    bail!("the awaited packet did not arrive")
}

fn suback_granted(packet: &rumqttc::Incoming) -> Option<bool> {
    match packet {
        rumqttc::Incoming::SubAck(ack) => ack
            .return_codes
            .first()
            .map(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_))),
        _ => None,
    }
}

#[test]
fn sighup_reloads_routes_and_acls_without_dropping_a_connected_client() -> anyhow::Result<()> {
    use rumqttc::{Client, Incoming, MqttOptions, QoS};
    let dir = TempDir::new("ops-reload")?;
    let data = dir.path().join("data");
    let rules = |extra_acl: &str, topic: &str, age: &str| {
        format!(
            r#"
[[route]]
filter = "t/#"
topic = "{topic}"
[[mqtt.acl]]
client_id = "watcher"
topic = "t/open"
access = "readwrite"
[[mqtt.acl]]
client_id = "pub"
topic = "t/#"
access = "readwrite"
{extra_acl}
[log]
segment_bytes = "4KiB"
[log.retention]
age = "{age}"
"#
        )
    };
    let (path, options) = with_config(dir.path(), &rules("", "before", "7days"))?;
    let mut gateway = Gateway::start(&data, &options)?;

    let mut mqtt = MqttOptions::new("watcher", "127.0.0.1", gateway.mqtt.port());
    mqtt.set_keep_alive(Duration::from_secs(30));
    let (client, mut connection) = Client::new(mqtt, 16);
    let mut connacks = 0;
    client.subscribe("t/new", QoS::AtLeastOnce)?;
    let ack = await_event(&mut connection, &mut connacks, |p| {
        suback_granted(p).is_some()
    })?;
    assert_eq!(
        suback_granted(&ack),
        Some(false),
        "denied before the reload"
    );

    // Sealed segments of `before`, held far less than their 7 days.
    let mut publisher = RawClient::connect(gateway.mqtt, "pub", 30, true, false)?;
    let payload = [b'r'; 200];
    for id in 1..=60 {
        assert_eq!(publisher.publish_qos1("t/old", &payload, id)?, 0);
    }
    publisher.disconnect()?;
    let segments = |topic: &str| -> anyhow::Result<usize> {
        let dir = data.join("log/topics").join(topic).join("0");
        Ok(std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter(|e| {
                // Segments are named by base offset (`recycle.log` is the spare, not one).
                let path = e.path();
                path.extension().is_some_and(|x| x == "log")
                    && path
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
            })
            .count())
    };
    assert!(segments("before")? > 1, "sealed segments to retain");

    let granted =
        "[[mqtt.acl]]\nclient_id = \"watcher\"\ntopic = \"t/new\"\naccess = \"readwrite\"";
    std::fs::write(&path, rules(granted, "after", "1s"))?;
    gateway.signal(libc::SIGHUP)?;
    wait_until(Duration::from_secs(10), "the reload", || {
        Ok(gateway
            .stderr_lines()
            .iter()
            .any(|l| l.contains("configuration reloaded")))
    })?;
    let log = gateway.stderr_lines().join("\n");
    assert!(
        !log.contains("not applied: [log]") && log.contains("per-topic retention"),
        "the retention change applies live: {log}"
    );
    wait_until(
        Duration::from_secs(20),
        "the sealed segments of `before` deleted by the reloaded age",
        || Ok(segments("before")? == 1),
    )?;

    client.subscribe("t/new", QoS::AtLeastOnce)?;
    let ack = await_event(&mut connection, &mut connacks, |p| {
        suback_granted(p).is_some()
    })?;
    assert_eq!(suback_granted(&ack), Some(true), "granted after the reload");
    let mut publisher = RawClient::connect(gateway.mqtt, "pub", 30, true, false)?;
    assert_eq!(publisher.publish_qos1("t/new", b"after-reload", 1)?, 0);
    publisher.disconnect()?;
    let got = await_event(&mut connection, &mut connacks, |p| {
        matches!(p, Incoming::Publish(_))
    })?;
    let Incoming::Publish(publish) = got else {
        bail!("not a publish: {got:?}");
    };
    assert_eq!(&publish.payload[..], b"after-reload");
    assert_eq!(connacks, 1, "the watcher never reconnected");

    let stored = tern_tests::read_log(&data, "after")?;
    assert_eq!(
        stored.len(),
        1,
        "the new route took the publish: {stored:?}"
    );
    gateway.wait_metric(
        "tern_mqtt_connections",
        "",
        "the watcher alone connected",
        Duration::from_secs(10),
        |n| n == Some(1),
    )?;
    client.disconnect()?;
    gateway.stop()?;
    Ok(())
}

/// A gateway with an upstream that never connects (so the page has an upstream state, a
/// backlog history and a readiness reason), a sampled history every second and a card size.
fn status_gateway(dir: &TempDir) -> anyhow::Result<Gateway> {
    let dead = tern_tests::free_port()?;
    let config = format!(
        r#"
[health]
interval = "100ms"
upstream_failed_after = "1s"
[status]
sample_interval = "1s"
[log.flush.wear]
card_size = "32GiB"
[[upstream]]
bootstrap = ["{dead}"]
gateway_id = "page"
backoff_max = "1s"
"#
    );
    let (_, options) = with_config(dir.path(), &config)?;
    Gateway::start(&dir.path().join("data"), &options)
}

/// Every metric name a dashboard's queries use.
fn dashboard_metrics(value: &Value, out: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                if let (Some(text), "expr" | "query") = (value.as_str(), key.as_str()) {
                    let mut rest = text;
                    while let Some(at) = rest.find("tern_") {
                        let name: String = rest[at..]
                            .chars()
                            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                            .collect();
                        rest = &rest[at + name.len()..];
                        out.insert(name);
                    }
                }
                dashboard_metrics(value, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_metrics(v, out)),
        _ => {}
    }
}

#[test]
fn the_grafana_dashboard_is_json_and_uses_only_metrics_tern_exports() -> anyhow::Result<()> {
    let path = tern_tests::workspace_root().join("docs/grafana/tern.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let dashboard: Value = serde_json::from_str(&text).context("the dashboard is not JSON")?;
    let mut used = std::collections::BTreeSet::new();
    dashboard_metrics(&dashboard, &mut used);
    assert!(used.len() >= 10, "{used:?}");

    let dir = TempDir::new("ops-grafana")?;
    let gateway = status_gateway(&dir)?;
    let (status, metrics) = gateway.admin_get("/metrics")?;
    assert_eq!(status, 200);
    let missing: Vec<&String> = used
        .iter()
        .filter(|name| !metrics.contains(&format!("# TYPE {name} ")))
        .collect();
    assert!(missing.is_empty(), "not in /metrics: {missing:?}");
    Ok(())
}

#[test]
fn the_status_page_renders_in_a_headless_browser() -> anyhow::Result<()> {
    let dir = TempDir::new("ops-page")?;
    let mut gateway = status_gateway(&dir)?;
    let mut viewer = RawClient::connect(gateway.mqtt, "viewer", 30, false, false)?;
    assert_eq!(viewer.subscribe("plant/#", 1, 1)?, 1);
    viewer.disconnect()?;
    let mut publisher = RawClient::connect(gateway.mqtt, "p", 30, true, false)?;
    assert_eq!(publisher.publish_qos1("plant/a", b"21.5", 1)?, 0);
    publisher.disconnect()?;
    wait_until(Duration::from_secs(20), "two samples and not ready", || {
        let (_, body) = gateway.admin_get("/status.json")?;
        let json: Value = serde_json::from_str(&body)?;
        let samples = json["upstream"]["history"].as_array().map_or(0, Vec::len);
        let backlog = json["upstream"]["backlog"].as_u64();
        Ok(samples >= 2 && json["readiness"]["ready"] == false && backlog == Some(1))
    })?;

    let url = format!("http://{}/", gateway.admin);
    let profile = dir.path().join("chromium-profile");
    let browser = |extra: &[String]| -> anyhow::Result<std::process::Output> {
        // coreutils' timeout: a browser that hangs fails the test instead of the whole run.
        std::process::Command::new("timeout")
            .args(["--kill-after=10", "120", "chromium"])
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(["--window-size=1000,1400", "--virtual-time-budget=3000"])
            .args(extra)
            .arg(&url)
            .stdin(std::process::Stdio::null())
            .output()
            .context("cannot run chromium (scripts/ensure-deps.sh installs it)")
    };
    let dom = browser(&["--dump-dom".to_owned()])?;
    let dom_text = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(
        dom.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    for expected in [
        "id=\"ready-state\" class=\"bad\">not ready",
        "data-reason=\"upstream_failed\"",
        "<td class=\"l\">mqtt</td>",
        "mqtt:viewer",
        "mqtt session",
        "id=\"upstream-state\" class=\"bad\">not connected",
        "<th>priority class</th>",
        "<th>time to drain</th>",
        "<table id=\"upstream-classes\">",
        "<polyline id=\"backlog-line\" points=\"",
        "fdatasync mean latency",
        "projected card lifetime",
        "/proc/self/io",
    ] {
        assert!(
            dom_text.contains(expected),
            "{expected:?} missing from the rendered DOM:\n{dom_text}"
        );
    }
    assert!(
        !dom_text.contains("<polyline id=\"backlog-line\" points=\"\""),
        "the backlog line has points"
    );

    let png = dir.path().join("status.png");
    let shot = browser(&[format!("--screenshot={}", png.display())])?;
    assert!(
        shot.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).context("no screenshot")?;
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        bytes.len() > 20_000,
        "a blank page would be tiny: {} bytes",
        bytes.len()
    );
    gateway.stop()?;
    Ok(())
}
