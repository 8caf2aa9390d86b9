//! The Kafka-protocol listener with real Kafka clients against the real `tern` binary: kcat
//! (librdkafka) produces, consumes and reads from a timestamp; Kafka's own console producer and
//! consumer from the cached jars; kafka-python (the venv scripts/ensure-deps.sh makes) for
//! acks=all, fetch and offsets by time; MQTT publishes seen over Kafka with their headers, and a
//! Kafka record with the `mqtt.topic` header delivered to an MQTT subscriber.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::kafka_tools::{console_format_args, parse_console_records, run_tool_at};
use tern_tests::mosquitto::MosquittoSub;
use tern_tests::{Gateway, ServeOptions, TempDir, now_ms, wait_until, workspace_root};

fn start(label: &str) -> anyhow::Result<(TempDir, Gateway)> {
    let dir = TempDir::new(label)?;
    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    assert_ne!(gateway.kafka.port(), 0, "no `kafka listener on` line");
    Ok((dir, gateway))
}

/// Runs kcat against the gateway's Kafka listener, feeding `stdin` (also for
/// `kafka_listener_auth`).
pub(super) fn kcat(
    gateway: &Gateway,
    args: &[&str],
    stdin: &[u8],
) -> anyhow::Result<(bool, String, String)> {
    use std::io::Write;
    let mut child = Command::new("timeout")
        .args(["60", "kcat", "-b", &gateway.kafka.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run kcat (scripts/ensure-deps.sh installs it)")?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin)?;
    }
    let output = child.wait_with_output()?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// `kcat -C -e` from `offset` (kcat's -o syntax), one `offset|timestamp|value|headers` line each.
fn consume(gateway: &Gateway, topic: &str, offset: &str) -> anyhow::Result<Vec<String>> {
    let (ok, out, err) = kcat(
        gateway,
        &[
            "-C",
            "-t",
            topic,
            "-o",
            offset,
            "-e",
            "-q",
            "-f",
            "%o|%T|%s|%h\\n",
        ],
        b"",
    )?;
    if !ok {
        bail!("kcat -C failed: {err}");
    }
    Ok(out.lines().map(str::to_owned).collect())
}

#[test]
fn kcat_produces_consumes_and_reads_from_a_timestamp() -> anyhow::Result<()> {
    let (_dir, gateway) = start("kafka-kcat")?;
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let input = format!("{codec}-1\n{codec}-2\n");
        let (ok, _, err) = kcat(
            &gateway,
            &[
                "-P",
                "-t",
                "telemetry",
                "-z",
                codec,
                "-H",
                "site=north",
                "-X",
                "acks=all",
            ],
            input.as_bytes(),
        )?;
        assert!(ok, "kcat -P -z {codec}: {err}");
    }
    let lines = consume(&gateway, "telemetry", "beginning")?;
    assert_eq!(lines.len(), 10, "{lines:?}");
    for (i, line) in lines.iter().enumerate() {
        let fields: Vec<&str> = line.split('|').collect();
        assert_eq!(
            fields[0],
            i.to_string(),
            "Kafka offsets are log offsets: {line}"
        );
        assert_eq!(fields[3], "site=north", "{line}");
    }
    assert!(lines[9].contains("|zstd-2|"), "{lines:?}");

    // From a timestamp: exactly the records produced after it.
    let newest: i64 = lines
        .iter()
        .filter_map(|l| l.split('|').nth(1)?.parse().ok())
        .max()
        .context("timestamps")?;
    let from = newest + 1;
    wait_until(
        Duration::from_secs(5),
        "the clock to pass the last record",
        || Ok(now_ms() > from),
    )?;
    let (ok, _, err) = kcat(&gateway, &["-P", "-t", "telemetry"], b"later-1\nlater-2\n")?;
    assert!(ok, "{err}");
    let since = consume(&gateway, "telemetry", &format!("s@{from}"))?;
    let values: Vec<&str> = since.iter().filter_map(|l| l.split('|').nth(2)).collect();
    assert_eq!(values, ["later-1", "later-2"], "{since:?}");
    // Negative control: from the first record's time, everything comes back.
    let oldest = lines[0].split('|').nth(1).context("ts")?;
    assert_eq!(
        consume(&gateway, "telemetry", &format!("s@{oldest}"))?.len(),
        12
    );

    // A record naming an MQTT topic with a wildcard is refused with a Kafka error.
    let (ok, _, err) = kcat(
        &gateway,
        &["-P", "-t", "telemetry", "-H", "mqtt.topic=a/+"],
        b"x\n",
    )?;
    assert!(!ok && err.contains("validate record"), "{err}");
    Ok(())
}

/// librdkafka's idempotent producer: each kcat run gets its own producer id and starts at
/// sequence 0, so every run's records are stored, once each (a deduplication that mixed up
/// producers would answer the later runs with the first run's offsets and drop their records).
#[test]
fn kcat_idempotent_producers_each_store_their_records_once() -> anyhow::Result<()> {
    let (_dir, gateway) = start("kafka-idempotent")?;
    for run in 0..3 {
        let input = format!("run{run}-a\nrun{run}-b\n");
        let (ok, _, err) = kcat(
            &gateway,
            &[
                "-P",
                "-t",
                "idem",
                "-p",
                "0",
                "-X",
                "enable.idempotence=true",
            ],
            input.as_bytes(),
        )?;
        assert!(ok, "kcat -P run {run}: {err}");
    }
    let lines = consume(&gateway, "idem", "beginning")?;
    let values: Vec<(&str, &str)> = lines
        .iter()
        .filter_map(|l| {
            let mut fields = l.split('|');
            Some((fields.next()?, fields.nth(1)?))
        })
        .collect();
    assert_eq!(
        values,
        [
            ("0", "run0-a"),
            ("1", "run0-b"),
            ("2", "run1-a"),
            ("3", "run1-b"),
            ("4", "run2-a"),
            ("5", "run2-b")
        ],
        "{lines:?}"
    );
    Ok(())
}

#[test]
fn kafkas_console_producer_and_consumer_round_trip() -> anyhow::Result<()> {
    let (dir, gateway) = start("kafka-console")?;
    let bootstrap = gateway.kafka.to_string();
    let input: String = (0..20).map(|i| format!("line-{i}\n")).collect();
    run_tool_at(
        dir.path(),
        &bootstrap,
        "org.apache.kafka.tools.ConsoleProducer",
        &[
            "--topic",
            "console",
            "--producer-property",
            "acks=all",
            // The Java producer's default, said explicitly: idempotent, so it asks for a
            // producer id first and its batches carry sequences tern checks.
            "--producer-property",
            "enable.idempotence=true",
            "--compression-codec",
            "lz4",
        ],
        input.as_bytes(),
    )?;
    let mut args = vec![
        "--topic",
        "console",
        "--partition",
        "0",
        "--offset",
        "earliest",
        "--max-messages",
        "20",
        "--timeout-ms",
        "30000",
    ];
    args.extend(console_format_args());
    let output = run_tool_at(
        dir.path(),
        &bootstrap,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        &args,
        b"",
    )?;
    let records = parse_console_records(&output.stdout)?;
    let values: Vec<&str> = records.iter().map(|r| r.value.as_str()).collect();
    let expected: Vec<String> = (0..20).map(|i| format!("line-{i}")).collect();
    assert_eq!(values, expected);
    assert!(
        records
            .iter()
            .enumerate()
            .all(|(i, r)| r.offset == i as u64)
    );
    Ok(())
}

fn python() -> anyhow::Result<std::path::PathBuf> {
    let python = workspace_root()
        .join("tests")
        .join(".venv")
        .join("bin")
        .join("python");
    if !python.is_file() {
        bail!(
            "{} is missing: run scripts/ensure-deps.sh (it installs kafka-python)",
            python.display()
        );
    }
    Ok(python)
}

/// kafka-python: produce with acks=all, read back by assignment, list offsets by time.
const PYTHON_CHECKS: &str = r#"
import json, sys, time
from kafka import KafkaProducer, KafkaConsumer, TopicPartition
bootstrap = sys.argv[1]
producer = KafkaProducer(bootstrap_servers=bootstrap, acks='all', linger_ms=0)
sent = []
for i in range(5):
    meta = producer.send('py', value=b'v%d' % i, key=b'k', headers=[('n', str(i).encode())],
                         timestamp_ms=1_000_000 + 1000 * i).get(timeout=30)
    sent.append(meta.offset)
producer.close()
consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                         consumer_timeout_ms=5000)
tp = TopicPartition('py', 0)
consumer.assign([tp])
consumer.seek_to_beginning(tp)
got = [(m.offset, m.value.decode(), dict((k, v.decode()) for k, v in m.headers))
       for m in consumer]
by_time = consumer.offsets_for_times({tp: 1_002_500})[tp]
past = consumer.offsets_for_times({tp: 9_000_000})[tp]
ends = consumer.end_offsets([tp])[tp]
begins = consumer.beginning_offsets([tp])[tp]
print(json.dumps({"sent": sent, "got": got, "by_time": [by_time.offset, by_time.timestamp],
                  "past": past is None, "begin": begins, "end": ends}))
"#;

#[test]
fn kafka_python_produces_with_acks_all_fetches_and_lists_offsets_by_time() -> anyhow::Result<()> {
    let (_dir, gateway) = start("kafka-python")?;
    let output = Command::new(python()?)
        .args(["-c", PYTHON_CHECKS, &gateway.kafka.to_string()])
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(report["sent"], serde_json::json!([0, 1, 2, 3, 4]));
    assert_eq!(report["got"].as_array().map(Vec::len), Some(5), "{report}");
    assert_eq!(report["got"][3], serde_json::json!([3, "v3", {"n": "3"}]));
    // The first record at or after 1,002,500 ms is offset 3 (stamped 1,003,000).
    assert_eq!(report["by_time"], serde_json::json!([3, 1_003_000]));
    assert_eq!(report["past"], serde_json::json!(true));
    assert_eq!(
        (report["begin"].as_i64(), report["end"].as_i64()),
        (Some(0), Some(5))
    );
    Ok(())
}

#[test]
fn mqtt_publishes_reach_kafka_consumers_and_kafka_records_reach_mqtt_subscribers()
-> anyhow::Result<()> {
    let (_dir, gateway) = start("kafka-mqtt")?;
    // MQTT → Kafka: the MQTT topic and properties as headers.
    let status = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
        .args([
            "-V",
            "5",
            "-q",
            "1",
            "-i",
            "sensor-9",
            "-t",
            "plant/line1/temp",
            "-m",
            "21.5",
        ])
        .args(["-D", "publish", "user-property", "unit", "C"])
        .args(["-D", "publish", "content-type", "text/plain"])
        .status()
        .context("cannot run mosquitto_pub")?;
    assert!(status.success());
    let lines = consume(&gateway, "mqtt", "beginning")?;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let headers = lines[0].split('|').nth(3).context("headers")?;
    for expected in [
        "mqtt.topic=plant/line1/temp",
        "mqtt.qos=1",
        "mqtt.client_id=sensor-9",
        "mqtt.user.unit=C",
        "mqtt.content_type=text/plain",
    ] {
        assert!(
            headers.split(',').any(|h| h == expected),
            "{expected} in {headers}"
        );
    }

    // Kafka → MQTT: a record with the mqtt.topic header reaches a subscriber of that topic;
    // one without it (the negative control) does not.
    let sub = MosquittoSub::start(
        gateway.mqtt,
        &[
            "-V",
            "5",
            "-q",
            "1",
            "-t",
            "devices/+/cmd",
            "-v",
            "-C",
            "1",
            "-W",
            "30",
        ],
    )?;
    let (ok, _, err) = kcat(
        &gateway,
        &["-P", "-t", "mqtt", "-H", "mqtt.qos=0"],
        b"no-topic\n",
    )?;
    assert!(ok, "{err}");
    let (ok, _, err) = kcat(
        &gateway,
        &[
            "-P",
            "-t",
            "mqtt",
            "-H",
            "mqtt.topic=devices/7/cmd",
            "-H",
            "mqtt.qos=1",
        ],
        b"reboot\n",
    )?;
    assert!(ok, "{err}");
    let output = sub.finish()?;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout, "devices/7/cmd reboot\n");
    Ok(())
}
