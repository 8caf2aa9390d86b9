//! Kafka's MirrorMaker 2 (dedicated mode, connect-mirror 4.1 from Maven) pulls a tern topic into
//! the three-broker datacenter cluster through tern's Kafka listener: the datacenter's own tool
//! reads tern as the source cluster `edge` (Metadata, DescribeConfigs, ListOffsets, Fetch,
//! ListGroups, OffsetFetch), and `edge.mqtt` in the cluster ends up holding exactly tern's
//! records, per partition and in order, with their MQTT headers; a consumer group's offsets on
//! tern become the same group's offsets in the datacenter.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::kafka_mirror::MirrorMaker;
use tern_tests::kafka_tools::{
    ConsumedRecord, console_format_args, parse_console_records, run_tool_at,
};
use tern_tests::{Gateway, KafkaCluster, ServeOptions, TempDir, wait_until};

use super::kafka_consumer_groups::kcat_group;

const PARTITIONS: u32 = 3;
const CONSOLE_CONSUMER: &str = "org.apache.kafka.tools.consumer.ConsoleConsumer";
const CONSOLE_PRODUCER: &str = "org.apache.kafka.tools.ConsoleProducer";
const TOPICS: &str = "org.apache.kafka.tools.TopicCommand";

/// One MQTT topic per partition of `mqtt` (the route keys by MQTT topic).
fn device_topics() -> BTreeMap<u32, String> {
    let mut by_partition = BTreeMap::new();
    for i in 0..1000 {
        let topic = format!("site/pump{i}/pressure");
        let p = tern_partitioner::partition_for_key(topic.as_bytes(), PARTITIONS);
        by_partition.entry(p).or_insert(topic);
    }
    by_partition
}

/// Publishes `per_device` MQTT 5 QoS 1 messages from each device, with a user property.
fn publish(gateway: &Gateway, tag: &str, per_device: usize) -> anyhow::Result<()> {
    for (p, topic) in device_topics() {
        let lines: Vec<String> = (0..per_device).map(|n| format!("{tag}-{p}-{n}")).collect();
        let mut child = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
            .args([
                "-V",
                "5",
                "-q",
                "1",
                "-i",
                &format!("pump-{p}"),
                "-t",
                &topic,
            ])
            .args(["-D", "publish", "user-property", "unit", "bar", "-l"])
            .stdin(Stdio::piped())
            .spawn()
            .context("mosquitto_pub")?;
        let mut stdin = child.stdin.take().context("stdin")?;
        writeln!(stdin, "{}", lines.join("\n"))?;
        drop(stdin);
        if !child.wait()?.success() {
            bail!("mosquitto_pub failed");
        }
    }
    Ok(())
}

/// The console consumer's arguments that read `total` records of `topic` from the start, with
/// their partitions.
fn consume_args<'a>(topic: &'a str, total: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "--topic",
        topic,
        "--from-beginning",
        "--max-messages",
        total,
        "--timeout-ms",
        "60000",
        "--formatter-property",
        "print.partition=true",
    ];
    args.extend(console_format_args());
    args
}

/// The console consumer's output as records by partition, in the order read.
fn by_partition(stdout: &[u8]) -> anyhow::Result<BTreeMap<u32, Vec<ConsumedRecord>>> {
    let mut records: BTreeMap<u32, Vec<ConsumedRecord>> = BTreeMap::new();
    for line in String::from_utf8_lossy(stdout).lines() {
        let mut fields: Vec<&str> = line.split('\t').collect();
        let partition = fields
            .get(1)
            .and_then(|f| f.strip_prefix("Partition:"))
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("no partition in {line:?}"))?;
        fields.remove(1);
        let record = parse_console_records(fields.join("\t").as_bytes())?;
        records.entry(partition).or_default().extend(record);
    }
    Ok(records)
}

/// Whether `got` (the mirror) holds exactly `expected` (tern's records) in order: same values,
/// keys, timestamps and headers, nothing missing, nothing extra. Offsets may differ in general
/// (MirrorMaker does not promise them), so they are not compared.
fn same_records(expected: &[ConsumedRecord], got: &[ConsumedRecord]) -> Result<(), String> {
    let strip = |r: &ConsumedRecord| {
        (
            r.value.clone(),
            r.key.clone(),
            r.timestamp_ms,
            r.headers.clone(),
        )
    };
    let (expected, got): (Vec<_>, Vec<_>) = (
        expected.iter().map(strip).collect(),
        got.iter().map(strip).collect(),
    );
    if expected.len() != got.len() {
        return Err(format!(
            "{} records expected, {} mirrored",
            expected.len(),
            got.len()
        ));
    }
    match expected.iter().zip(&got).position(|(e, g)| e != g) {
        None => Ok(()),
        Some(i) => Err(format!(
            "record {i} differs: {:?} vs {:?}",
            expected[i], got[i]
        )),
    }
}

/// MirrorMaker 2's configuration: `edge` (tern) → `dc` (the cluster) for topic `mqtt` only.
/// Nothing is written to tern: the offset syncs live in the datacenter
/// (`offset-syncs.topic.location = target`), the reverse flow with its heartbeats is off, and
/// tern's topic ACLs are not synced (tern answers no DescribeAcls). Group offsets are synced
/// into the datacenter, with an offset sync at every record so that they translate exactly.
/// Short intervals keep the test quick; the offset flush, which also sends the last offset
/// sync of a quiet partition, is a worker setting and so takes the target cluster's prefix.
fn mm2_properties(gateway: &Gateway, cluster: &KafkaCluster) -> String {
    format!(
        "clusters = edge, dc\n\
         edge.bootstrap.servers = {edge}\n\
         dc.bootstrap.servers = {dc}\n\
         edge->dc.enabled = true\n\
         edge->dc.topics = mqtt\n\
         dc->edge.enabled = false\n\
         dc->edge.emit.heartbeats.enabled = false\n\
         replication.factor = 3\n\
         offset-syncs.topic.location = target\n\
         offset-syncs.topic.replication.factor = 3\n\
         heartbeats.topic.replication.factor = 3\n\
         checkpoints.topic.replication.factor = 3\n\
         config.storage.replication.factor = 3\n\
         offset.storage.replication.factor = 3\n\
         status.storage.replication.factor = 3\n\
         sync.topic.acls.enabled = false\n\
         sync.group.offsets.enabled = true\n\
         offset.lag.max = 0\n\
         refresh.topics.interval.seconds = 1\n\
         refresh.groups.interval.seconds = 1\n\
         emit.checkpoints.interval.seconds = 1\n\
         emit.heartbeats.interval.seconds = 1\n\
         sync.group.offsets.interval.seconds = 1\n\
         dc.offset.flush.interval.ms = 1000\n",
        edge = gateway.kafka,
        dc = cluster.bootstrap(),
    )
}

/// The end offset of every partition of `edge.mqtt` in the cluster (empty while the topic does
/// not exist), from one `kafka-get-offsets` run.
fn mirrored_ends(cluster: &KafkaCluster) -> BTreeMap<u32, u64> {
    let Ok(output) = cluster.run_tool(
        "org.apache.kafka.tools.GetOffsetShell",
        &["--topic", "edge.mqtt", "--time", "latest"],
    ) else {
        return BTreeMap::new();
    };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("edge.mqtt:")?;
            let (p, end) = rest.split_once(':')?;
            Some((p.parse().ok()?, end.trim().parse().ok()?))
        })
        .collect()
}

/// Topic names in the cluster.
fn dc_topics(cluster: &KafkaCluster) -> anyhow::Result<Vec<String>> {
    let output = cluster.run_tool(TOPICS, &["--list"])?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// MQTT devices publish into tern's 3-partition topic `mqtt`; MirrorMaker 2 copies it into the
/// datacenter as `edge.mqtt`, first what was there before it started, then what arrives while it
/// runs. Per partition the mirror holds exactly tern's records in order with their MQTT headers,
/// and the group `historian`, which read everything on tern, has the same offsets in the
/// datacenter (MirrorMaker's checkpoints with `sync.group.offsets.enabled`).
/// Negative controls: the comparison fails on one record too many in the expectation, and
/// tern's topic `plant.private`, which MirrorMaker is not told to mirror, stays out of the
/// datacenter.
#[test]
fn mirror_maker_2_pulls_a_tern_topic_into_the_datacenter_cluster() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    // The cluster starts (tens of seconds of JVMs) while tern gets its records.
    let cluster = std::thread::spawn(KafkaCluster::start);
    let dir = TempDir::new("kafka-mirror")?;
    let config = dir.path().join("tern.toml");
    std::fs::write(&config, "[[log.topic]]\nname = \"mqtt\"\npartitions = 3\n")?;
    let options = ServeOptions {
        args: vec!["--config".into(), config.display().to_string()],
        ..ServeOptions::default()
    };
    let gateway = Gateway::start(&dir.path().join("data"), &options)?;
    let tools = TempDir::new("kafka-mirror-tools")?;
    let edge = gateway.kafka.to_string();
    let on_tern = |class: &str, args: &[&str], stdin: &[u8]| {
        run_tool_at(tools.path(), &edge, class, args, stdin)
    };
    on_tern(
        TOPICS,
        &["--create", "--topic", "plant.private", "--partitions", "1"],
        b"",
    )?;
    on_tern(
        CONSOLE_PRODUCER,
        &["--topic", "plant.private"],
        b"not for the datacenter\n",
    )?;
    publish(&gateway, "a", 20)?;
    // A local application's group on tern reads everything and commits.
    let read = kcat_group(&gateway, "historian")?.len();
    assert_eq!(
        read,
        20 * PARTITIONS as usize,
        "historian read every record"
    );
    let cluster = cluster
        .join()
        .map_err(|_| anyhow::anyhow!("the cluster's start panicked"))??;
    println!(
        "cluster started in {:?} ({:?} into the test)",
        cluster.startup,
        started.elapsed()
    );
    let mm2_dir = TempDir::new("kafka-mirror-mm2")?;
    let mut mirror = MirrorMaker::start(
        &cluster,
        mm2_dir.path(),
        &mm2_properties(&gateway, &cluster),
    )?;

    let mut per_partition = 20;
    for round in ["before MirrorMaker started", "while it runs"] {
        let want: BTreeMap<u32, u64> = (0..PARTITIONS).map(|p| (p, per_partition)).collect();
        wait_until(
            Duration::from_secs(120),
            &format!("edge.mqtt holds what tern held {round}"),
            || {
                if !mirror.is_running() {
                    bail!("MirrorMaker exited:\n{}", mirror.log_tail(60));
                }
                Ok(mirrored_ends(&cluster) == want)
            },
        )
        .with_context(|| mirror.log_tail(60))?;
        let total = (per_partition * u64::from(PARTITIONS)).to_string();
        let expected =
            by_partition(&on_tern(CONSOLE_CONSUMER, &consume_args("mqtt", &total), b"")?.stdout)?;
        let got = by_partition(
            &cluster
                .run_tool(CONSOLE_CONSUMER, &consume_args("edge.mqtt", &total))?
                .stdout,
        )?;
        for p in 0..PARTITIONS {
            let expected = expected.get(&p).context("tern's partition")?;
            let got = got
                .get(&p)
                .with_context(|| format!("edge.mqtt/{p} is empty"))?;
            assert_eq!(expected.len() as u64, per_partition, "tern's partition {p}");
            if let Err(diff) = same_records(expected, got) {
                panic!("edge.mqtt/{p} ({round}): {diff}");
            }
            let first = got.first().context("a record")?;
            assert_eq!(
                first.header("mqtt.topic"),
                device_topics().get(&p).map(String::as_str),
                "{first:?}"
            );
            assert_eq!(first.header("mqtt.user.unit"), Some("bar"), "{first:?}");
            // Negative control: one record more in the expectation is seen as missing.
            let mut one_more = expected.clone();
            one_more.push(first.clone());
            assert!(
                same_records(&one_more, got).is_err(),
                "the comparison must see a missing record"
            );
        }
        println!(
            "mirrored {per_partition} records per partition {round} ({:?} into the test)",
            started.elapsed()
        );
        if per_partition == 20 {
            // The group's committed offsets on tern (20 in every partition), checkpointed and
            // translated, are the group's offsets in the datacenter: it can resume there.
            wait_until(
                Duration::from_secs(60),
                "historian's offsets synced into the datacenter",
                || {
                    let offsets = cluster.group_offsets("historian").unwrap_or_default();
                    Ok(offsets.len() == PARTITIONS as usize
                        && offsets
                            .iter()
                            .all(|o| o.topic == "edge.mqtt" && o.offset == Some(20)))
                },
            )
            .with_context(|| mirror.log_tail(60))?;
            println!(
                "historian's offsets synced ({:?} into the test)",
                started.elapsed()
            );
            publish(&gateway, "b", 15)?;
            per_partition += 15;
        }
    }
    let topics = dc_topics(&cluster)?;
    assert!(topics.iter().any(|t| t == "edge.mqtt"), "{topics:?}");
    assert!(
        !topics.iter().any(|t| t.contains("plant.private")),
        "a topic MirrorMaker is not told to mirror stays on tern: {topics:?}"
    );
    drop(mirror);
    Ok(())
}
