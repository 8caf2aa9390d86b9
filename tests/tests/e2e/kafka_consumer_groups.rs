//! Kafka consumer groups on tern's Kafka listener, with real clients: kcat's balanced consumer
//! (`-G`), a group of three Kafka console consumers one of which is SIGKILLed, Kafka's
//! `kafka-consumer-groups` (describe, lag, resets), and the committed offsets (cursors
//! `kafka.group:*`) surviving a tern restart.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, bail};
use tern_tests::kafka::kafka_classpath;
use tern_tests::{Gateway, ServeOptions, TempDir, wait_until};

const PARTITIONS: u32 = 4;
const GROUP_TOOL: &str = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand";
const CONSOLE_CONSUMER: &str = "org.apache.kafka.tools.consumer.ConsoleConsumer";
const JVM: &[&str] = &["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"];

/// tern with topic `mqtt` (where MQTT publishes go) in four partitions.
fn start(dir: &Path) -> anyhow::Result<Gateway> {
    let config = dir.join("tern.toml");
    std::fs::write(&config, "[[log.topic]]\nname = \"mqtt\"\npartitions = 4\n")?;
    let options = ServeOptions {
        args: vec!["--config".into(), config.display().to_string()],
        ..ServeOptions::default()
    };
    Gateway::start(&dir.join("data"), &options)
}

/// One MQTT topic per partition (the route keys by MQTT topic), so every partition gets data.
fn device_topics() -> Vec<String> {
    let mut by_partition = BTreeMap::new();
    for i in 0..1000 {
        let topic = format!("devices/d{i}/temperature");
        let p = tern_partitioner::partition_for_key(topic.as_bytes(), PARTITIONS);
        by_partition.entry(p).or_insert(topic);
    }
    by_partition.into_values().collect()
}

/// Publishes `per_device` QoS 1 messages `{tag}-{device}-{n}` from each device (mosquitto_pub).
fn publish(gateway: &Gateway, tag: &str, per_device: usize) -> anyhow::Result<BTreeSet<String>> {
    let mut sent = BTreeSet::new();
    for (d, topic) in device_topics().iter().enumerate() {
        let lines: Vec<String> = (0..per_device).map(|n| format!("{tag}-{d}-{n}")).collect();
        let mut child = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
            .args(["-q", "1", "-t", topic, "-l"])
            .stdin(Stdio::piped())
            .spawn()
            .context("mosquitto_pub")?;
        let mut stdin = child.stdin.take().context("stdin")?;
        writeln!(stdin, "{}", lines.join("\n"))?;
        drop(stdin);
        if !child.wait()?.success() {
            bail!("mosquitto_pub failed");
        }
        sent.extend(lines);
    }
    Ok(sent)
}

fn java(class: &str) -> anyhow::Result<Command> {
    let mut command = Command::new("java");
    command
        .args(JVM)
        .env("CLASSPATH", kafka_classpath()?)
        .arg(class)
        .stdin(Stdio::null());
    Ok(command)
}

/// Runs `kafka-consumer-groups` against tern; its stdout.
fn group_tool(gateway: &Gateway, args: &[&str]) -> anyhow::Result<String> {
    let output = java(GROUP_TOOL)?
        .args(["--bootstrap-server", &gateway.kafka.to_string()])
        .args(args)
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!(
            "{args:?}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(stdout)
}

/// `--describe` rows: (partition, current offset, log end, lag).
fn describe(gateway: &Gateway, group: &str) -> anyhow::Result<Vec<(u32, String, u64, String)>> {
    let out = group_tool(gateway, &["--describe", "--group", group])?;
    let mut rows = Vec::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [g, "mqtt", p, current, end, lag, ..] = f.as_slice() {
            if *g == group {
                rows.push((
                    p.parse()?,
                    (*current).to_owned(),
                    end.parse()?,
                    (*lag).to_owned(),
                ));
            }
        }
    }
    rows.sort();
    Ok(rows)
}

/// The group's committed offsets, from tern's cursor API: partition → offset.
fn committed(gateway: &Gateway, group: &str) -> anyhow::Result<BTreeMap<u32, u64>> {
    let (status, body) = gateway.admin_get("/cursors")?;
    anyhow::ensure!(status == 200, "GET /cursors: {status}");
    let json: serde_json::Value = serde_json::from_str(&body)?;
    let mut offsets = BTreeMap::new();
    let name = format!("kafka.group:{group}");
    for cursor in json["cursors"].as_array().into_iter().flatten() {
        if cursor["name"] != name.as_str() {
            continue;
        }
        assert_eq!(cursor["owner"], "kafka group");
        for pos in cursor["positions"].as_array().into_iter().flatten() {
            let p = pos["partition"].as_u64().context("partition")?;
            offsets.insert(u32::try_from(p)?, pos["offset"].as_u64().context("offset")?);
        }
    }
    Ok(offsets)
}

/// A record as a console consumer printed it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    partition: u32,
    offset: u64,
    timestamp_ms: i64,
    value: String,
}

const FORMAT: &[&str] = &[
    "print.timestamp=true",
    "print.partition=true",
    "print.offset=true",
];

/// `CreateTime:TS\tPartition:P\tOffset:O\tVALUE` lines.
fn parse_seen(text: &str) -> Vec<Seen> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.splitn(4, '\t').collect();
            let [ts, p, o, value] = f.as_slice() else {
                return None;
            };
            Some(Seen {
                timestamp_ms: ts.strip_prefix("CreateTime:")?.parse().ok()?,
                partition: p.strip_prefix("Partition:")?.parse().ok()?,
                offset: o.strip_prefix("Offset:")?.parse().ok()?,
                value: (*value).to_owned(),
            })
        })
        .collect()
}

/// A console consumer in `group`, printing to `out`.
fn console_consumer(
    gateway: &Gateway,
    group: &str,
    out: &Path,
    extra: &[&str],
) -> anyhow::Result<Child> {
    let mut command = java(CONSOLE_CONSUMER)?;
    command
        .args(["--bootstrap-server", &gateway.kafka.to_string()])
        .args(["--topic", "mqtt", "--group", group])
        .args(["--consumer-property", "group.protocol=classic"])
        .args(["--consumer-property", "session.timeout.ms=6000"])
        .args(["--consumer-property", "heartbeat.interval.ms=1000"])
        .args(["--consumer-property", "auto.commit.interval.ms=300"])
        .args(extra)
        .stdout(File::create(out)?)
        .stderr(File::create(out.with_extension("err"))?);
    for f in FORMAT {
        command.args(["--formatter-property", f]);
    }
    Ok(command.spawn()?)
}

fn read_seen(path: &Path) -> Vec<Seen> {
    parse_seen(&std::fs::read_to_string(path).unwrap_or_default())
}

fn kill(child: &mut Child, signal: i32) -> anyhow::Result<()> {
    let pid = i32::try_from(child.id())?;
    // SAFETY: kill(2) on our own child's PID.
    if unsafe { libc::kill(pid, signal) } != 0 {
        bail!("kill {pid}: {}", std::io::Error::last_os_error());
    }
    child.wait()?;
    Ok(())
}

/// kcat's balanced consumer in `group` on tern reads `mqtt` from the earliest offset to the end
/// and commits; the values it read.
pub(super) fn kcat_group(gateway: &Gateway, group: &str) -> anyhow::Result<Vec<String>> {
    let output = Command::new("kcat")
        .args(["-b", &gateway.kafka.to_string(), "-G", group, "mqtt"])
        .args([
            "-X",
            "auto.offset.reset=earliest",
            "-e",
            "-q",
            "-f",
            "%s\\n",
        ])
        .stdin(Stdio::null())
        .output()
        .context("kcat")?;
    anyhow::ensure!(
        output.status.success(),
        "kcat: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// kcat's balanced consumer (`-G`) reads every record once; its commits are tern cursors that
/// hold after a restart: `kafka-consumer-groups --describe` shows them with zero lag, and a
/// second kcat in the group starts after them.
#[test]
fn kcat_consumes_in_a_group_and_its_offsets_survive_a_restart() -> anyhow::Result<()> {
    let dir = TempDir::new("kafka-group-kcat")?;
    let mut gateway = start(dir.path())?;
    let sent = publish(&gateway, "a", 25)?;
    let got = kcat_group(&gateway, "analytics")?;
    assert_eq!(got.len(), sent.len(), "each record once");
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), sent);
    let offsets = committed(&gateway, "analytics")?;
    assert_eq!(
        offsets.values().sum::<u64>(),
        sent.len() as u64,
        "{offsets:?}"
    );

    gateway.stop()?;
    let gateway = start(dir.path())?;
    assert_eq!(
        committed(&gateway, "analytics")?,
        offsets,
        "the cursors survived"
    );
    let listed = group_tool(&gateway, &["--list"])?;
    assert!(listed.lines().any(|l| l.trim() == "analytics"), "{listed}");
    let rows = describe(&gateway, "analytics")?;
    assert_eq!(rows.len(), PARTITIONS as usize, "{rows:?}");
    for (p, current, end, lag) in &rows {
        assert_eq!(
            (current.as_str(), lag.as_str()),
            (end.to_string().as_str(), "0"),
            "partition {p}"
        );
    }
    let more = publish(&gateway, "b", 3)?;
    let got = kcat_group(&gateway, "analytics")?;
    assert_eq!(
        got.into_iter().collect::<BTreeSet<_>>(),
        more,
        "only what came after the commits"
    );
    Ok(())
}

/// Three console consumers share four partitions while devices publish; one is SIGKILLed and
/// the other two take over its partitions from its last committed offsets. Every record is
/// consumed; the only records consumed twice are those the killed consumer read after its last
/// commit (at-least-once: a survivor starts exactly at the committed offset), and no record
/// twice by the survivors. Then `--describe` shows zero lag and `--reset-offsets
/// --to-datetime` replays exactly the records from that time.
#[test]
fn a_group_of_three_console_consumers_survives_a_killed_member_and_replays_by_time()
-> anyhow::Result<()> {
    let dir = TempDir::new("kafka-group-console")?;
    let gateway = start(dir.path())?;
    let mut sent = publish(&gateway, "a", 30)?;
    let outs: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("consumer-{i}.out")))
        .collect();
    let mut consumers = Vec::new();
    for out in &outs {
        consumers.push(console_consumer(
            &gateway,
            "g3",
            out,
            &["--from-beginning"],
        )?);
    }
    let union = |outs: &[std::path::PathBuf]| -> Vec<Seen> {
        outs.iter().flat_map(|o| read_seen(o)).collect()
    };
    wait_until(
        Duration::from_secs(120),
        "the first batch is consumed",
        || {
            let seen: BTreeSet<String> = union(&outs).into_iter().map(|s| s.value).collect();
            Ok(seen == sent)
        },
    )?;
    let members = group_tool(&gateway, &["--describe", "--members", "--group", "g3"])?;
    assert_eq!(
        members.lines().filter(|l| l.starts_with("g3 ")).count(),
        3,
        "{members}"
    );

    // Kill the consumer that printed the most (it holds at least one partition with data).
    let victim = (0..3)
        .max_by_key(|&i| read_seen(&outs[i]).len())
        .context("a consumer")?;
    kill(&mut consumers[victim], libc::SIGKILL)?;
    let at_kill = committed(&gateway, "g3")?;
    let killed: Vec<Seen> = read_seen(&outs[victim]);
    let killed_partitions: BTreeSet<u32> = killed.iter().map(|s| s.partition).collect();
    println!("killed consumer {victim}: partitions {killed_partitions:?}, committed {at_kill:?}");

    sent.extend(publish(&gateway, "b", 30)?);
    wait_until(
        Duration::from_secs(120),
        "every record is consumed after the rebalance",
        || {
            let seen: BTreeSet<String> = union(&outs).into_iter().map(|s| s.value).collect();
            Ok(seen == sent)
        },
    )?;
    let survivors: Vec<Seen> = (0..3)
        .filter(|&i| i != victim)
        .flat_map(|i| read_seen(&outs[i]))
        .collect();
    let unique: BTreeSet<(u32, u64)> = survivors.iter().map(|s| (s.partition, s.offset)).collect();
    assert_eq!(
        unique.len(),
        survivors.len(),
        "no record twice among the survivors"
    );
    let killed_set: BTreeSet<(u32, u64)> = killed.iter().map(|s| (s.partition, s.offset)).collect();
    let twice: BTreeSet<(u32, u64)> = killed_set.intersection(&unique).copied().collect();
    for p in &killed_partitions {
        let from = at_kill.get(p).copied().unwrap_or(0);
        let last = killed
            .iter()
            .filter(|s| s.partition == *p)
            .map(|s| s.offset)
            .max()
            .unwrap_or(0);
        let expected: BTreeSet<(u32, u64)> = (from..=last).map(|o| (*p, o)).collect();
        let got: BTreeSet<(u32, u64)> = twice.iter().filter(|(q, _)| q == p).copied().collect();
        assert_eq!(
            got, expected,
            "partition {p}: exactly the records read after the last commit"
        );
    }
    assert!(
        twice.iter().all(|(p, _)| killed_partitions.contains(p)),
        "{twice:?}"
    );
    println!(
        "read twice (after the killed consumer's last commit): {}",
        twice.len()
    );

    wait_until(Duration::from_secs(60), "the group's lag is zero", || {
        let rows = describe(&gateway, "g3")?;
        Ok(rows.len() == PARTITIONS as usize && rows.iter().all(|r| r.3 == "0"))
    })?;
    for (i, consumer) in consumers.iter_mut().enumerate() {
        if i != victim {
            kill(consumer, libc::SIGTERM)?;
        }
    }
    wait_until(Duration::from_secs(60), "the group is empty", || {
        let state = group_tool(&gateway, &["--describe", "--state", "--group", "g3"])?;
        Ok(state.contains("Empty"))
    })?;

    // Replay from the timestamp of a record in the middle of the second batch.
    let all: Vec<Seen> = union(&outs);
    let mut stamps: Vec<i64> = all.iter().map(|s| s.timestamp_ms).collect();
    stamps.sort_unstable();
    let from_ms = stamps[stamps.len() * 3 / 4];
    let expected: BTreeSet<String> = all
        .iter()
        .filter(|s| s.timestamp_ms >= from_ms)
        .map(|s| s.value.clone())
        .collect();
    let datetime = rfc3339_millis(from_ms)?;
    group_tool(
        &gateway,
        &[
            "--reset-offsets",
            "--group",
            "g3",
            "--topic",
            "mqtt",
            "--to-datetime",
            &datetime,
            "--execute",
        ],
    )?;
    let replay_out = dir.path().join("replay.out");
    let mut replay = console_consumer(&gateway, "g3", &replay_out, &["--timeout-ms", "8000"])?;
    let status = replay.wait()?;
    let replayed: Vec<Seen> = read_seen(&replay_out);
    println!(
        "replay from {datetime}: {} records ({status})",
        replayed.len()
    );
    let replayed_set: BTreeSet<String> = replayed.iter().map(|s| s.value.clone()).collect();
    assert_eq!(replayed.len(), replayed_set.len());
    assert_eq!(
        replayed_set, expected,
        "exactly the records from {datetime}"
    );
    Ok(())
}

/// `--to-earliest`, `--to-offset` and `--shift-by` move the group's cursors.
#[test]
fn the_group_tool_resets_offsets_to_earliest_an_offset_and_by_a_shift() -> anyhow::Result<()> {
    let dir = TempDir::new("kafka-group-reset")?;
    let gateway = start(dir.path())?;
    publish(&gateway, "a", 10)?;
    let reset = |how: &[&str]| -> anyhow::Result<BTreeMap<u32, u64>> {
        let mut args = vec![
            "--reset-offsets",
            "--group",
            "r",
            "--topic",
            "mqtt",
            "--execute",
        ];
        args.extend_from_slice(how);
        group_tool(&gateway, &args)?;
        committed(&gateway, "r")
    };
    let all = |o: u64| (0..PARTITIONS).map(|p| (p, o)).collect::<BTreeMap<_, _>>();
    assert_eq!(reset(&["--to-latest"])?, all(10));
    assert_eq!(reset(&["--shift-by", "-3"])?, all(7));
    assert_eq!(reset(&["--to-earliest"])?, all(0));
    assert_eq!(reset(&["--to-offset", "4"])?, all(4));
    assert_eq!(
        reset(&["--shift-by", "100"])?,
        all(10),
        "clamped to the end"
    );
    let rows = describe(&gateway, "r")?;
    assert!(rows.iter().all(|r| r.1 == "10" && r.3 == "0"), "{rows:?}");
    Ok(())
}

/// `2026-12-01T18:39:43.948Z` (the tool's `--to-datetime` format, in UTC).
fn rfc3339_millis(ms: i64) -> anyhow::Result<String> {
    let time = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms)?);
    let secs = time.duration_since(UNIX_EPOCH)?.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(i64::try_from(days)?);
    Ok(format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        ms.rem_euclid(1000)
    ))
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}
