//! Topic administration on tern's Kafka listener with Kafka's own tools from the cached jars:
//! `kafka-topics` (TopicCommand) creates, describes, grows and deletes a topic, and
//! `kafka-configs` (ConfigCommand) shows its retention and durability; what tern refuses
//! (three replicas) fails the tool.

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
