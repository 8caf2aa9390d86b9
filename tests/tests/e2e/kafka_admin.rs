//! Topic administration on tern's Kafka listener with Kafka's own tools from the cached jars:
//! `kafka-topics` (TopicCommand) creates, describes, grows and deletes a topic, and
//! `kafka-configs` (ConfigCommand) shows its retention and durability; what tern refuses
//! (three replicas, a config it would not honour) fails the tool. A topic created with
//! `max.message.bytes` shows it and refuses a larger batch from kcat.

use tern_tests::kafka_tools::run_tool_at;
use tern_tests::{Gateway, ServeOptions, TempDir};

const TOPICS: &str = "org.apache.kafka.tools.TopicCommand";
const CONFIGS: &str = "org.apache.kafka.tools.ConfigCommand";

fn text(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn kafka_topics_creates_grows_describes_and_deletes_a_topic_on_tern() -> anyhow::Result<()> {
    let dir = TempDir::new("kafka-admin")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let bootstrap = gateway.kafka.to_string();
    let tools = TempDir::new("kafka-admin-tools")?;
    let topics = |args: &[&str]| run_tool_at(tools.path(), &bootstrap, TOPICS, args, b"");
    let create = ["--create", "--topic", "plant.alarms", "--partitions", "3"];
    topics(&[&create[..], &["--replication-factor", "1"]].concat())?;
    let described = text(&topics(&["--describe", "--topic", "plant.alarms"])?);
    assert!(described.contains("PartitionCount: 3"), "{described}");

    let refused = topics(&["--create", "--topic", "other", "--replication-factor", "3"])
        .expect_err("tern keeps one replica");
    assert!(refused.to_string().contains("replica"), "{refused}");

    topics(&["--alter", "--topic", "plant.alarms", "--partitions", "5"])?;
    let described = text(&topics(&["--describe", "--topic", "plant.alarms"])?);
    assert!(described.contains("PartitionCount: 5"), "{described}");

    let configs = run_tool_at(
        tools.path(),
        &bootstrap,
        CONFIGS,
        &[
            "--describe",
            "--all",
            "--entity-type",
            "topics",
            "--entity-name",
            "plant.alarms",
        ],
        b"",
    )?;
    let configs = text(&configs);
    for entry in [
        "retention.ms=604800000",
        "flush.messages=1",
        "tern.durability=sync",
    ] {
        assert!(configs.contains(entry), "{entry} in {configs}");
    }

    topics(&["--delete", "--topic", "plant.alarms"])?;
    let listed = text(&topics(&["--list"])?);
    assert!(!listed.lines().any(|l| l == "plant.alarms"), "{listed}");
    let data = dir.path().join("log/topics/plant.alarms");
    assert!(!data.exists(), "{} is gone", data.display());
    gateway.stop()
}

#[test]
fn kafka_topics_create_with_max_message_bytes_is_kept_shown_and_enforced() -> anyhow::Result<()> {
    let dir = TempDir::new("kafka-admin-config")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let bootstrap = gateway.kafka.to_string();
    let tools = TempDir::new("kafka-admin-config-tools")?;
    let topics = |args: &[&str]| run_tool_at(tools.path(), &bootstrap, TOPICS, args, b"");
    topics(&[
        "--create",
        "--topic",
        "bounded",
        "--config",
        "max.message.bytes=2000",
        "--config",
        "cleanup.policy=delete",
    ])?;
    let refused = topics(&[
        "--create",
        "--topic",
        "compacted",
        "--config",
        "cleanup.policy=compact",
    ])
    .expect_err("tern's log does not compact");
    assert!(refused.to_string().contains("cleanup.policy"), "{refused}");

    // Without --all, kafka-configs shows only the topic's own (dynamic) configs.
    let configs = run_tool_at(
        tools.path(),
        &bootstrap,
        CONFIGS,
        &[
            "--describe",
            "--entity-type",
            "topics",
            "--entity-name",
            "bounded",
        ],
        b"",
    )?;
    let configs = text(&configs);
    assert!(configs.contains("max.message.bytes=2000"), "{configs}");

    let mut rng = tern_tests::TestRng::new(24);
    let noise: String = (0..5000)
        .map(|_| char::from(b'a' + u8::try_from(rng.below(26)).unwrap_or(0)))
        .collect();
    // librdkafka reports the broker's MESSAGE_TOO_LARGE as "Message size too large".
    let (_, _, err) = super::kafka_listener::kcat(
        &gateway,
        &["-P", "-t", "bounded", "-X", "acks=all"],
        format!("{noise}\n").as_bytes(),
    )?;
    assert!(err.contains("too large"), "{err}");
    let (ok, _, err) = super::kafka_listener::kcat(
        &gateway,
        &["-P", "-t", "bounded", "-X", "acks=all"],
        b"small\n",
    )?;
    assert!(ok, "{err}");

    // Kept across a restart.
    gateway.stop()?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let (_, _, err) = super::kafka_listener::kcat(
        &gateway,
        &["-P", "-t", "bounded", "-X", "acks=all"],
        format!("{noise}\n").as_bytes(),
    )?;
    assert!(err.contains("too large"), "forgotten by the restart: {err}");
    gateway.stop()
}
