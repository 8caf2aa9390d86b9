//! More of Kafka's own tools for the shared-mode tests: consumer-group offsets as
//! `kafka-consumer-groups` shows and resets them, and keyed records written by the console
//! producer, so the Java client's partitioner can be compared with tern's. Like
//! `kafka_tools.rs` it never uses tern's code; it only parses the tools' text output.

use std::io::Write;
use std::process::Stdio;

use anyhow::{Context, bail};

use crate::kafka::{KafkaCluster, java};
use crate::kafka_tools::TOOL_JVM;

/// Kafka 4's consumer-group tool.
const GROUP_TOOL: &str = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand";

/// One row of `kafka-consumer-groups --describe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupOffset {
    pub topic: String,
    pub partition: u32,
    /// `CURRENT-OFFSET`; `None` when the tool prints `-`.
    pub offset: Option<u64>,
}

impl KafkaCluster {
    /// The committed offsets of `group`, as `kafka-consumer-groups --describe` lists them.
    pub fn group_offsets(&self, group: &str) -> anyhow::Result<Vec<GroupOffset>> {
        let output = self.run_tool(GROUP_TOOL, &["--describe", "--group", group])?;
        let text = String::from_utf8_lossy(&output.stdout);
        let rows: Vec<GroupOffset> = text
            .lines()
            .filter_map(|line| parse_group_line(group, line))
            .collect();
        if rows.is_empty() {
            bail!("no offsets of group {group} in:\n{text}");
        }
        Ok(rows)
    }

    /// `kafka-consumer-groups --reset-offsets --to-offset OFFSET --execute` for one partition
    /// (the group must have no active members).
    pub fn reset_group_offset(
        &self,
        group: &str,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> anyhow::Result<()> {
        let (target, offset) = (format!("{topic}:{partition}"), offset.to_string());
        self.run_tool(
            GROUP_TOOL,
            &[
                "--reset-offsets",
                "--group",
                group,
                "--topic",
                &target,
                "--to-offset",
                &offset,
                "--execute",
            ],
        )?;
        Ok(())
    }

    /// Writes `(key, value)` records with `kafka-console-producer` (the Java producer and its
    /// default partitioner) to `topic`.
    pub fn produce_keyed(&self, topic: &str, records: &[(String, String)]) -> anyhow::Result<()> {
        let mut command = java(
            self.dir(),
            TOOL_JVM,
            "org.apache.kafka.tools.ConsoleProducer",
        )?;
        command
            .args(["--bootstrap-server", &self.bootstrap(), "--topic", topic])
            .args(["--property", "parse.key=true"])
            .args(["--property", "key.separator=|"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().context("cannot run the console producer")?;
        let mut stdin = child
            .stdin
            .take()
            .context("console producer has no stdin")?;
        for (key, value) in records {
            writeln!(stdin, "{key}|{value}")?;
        }
        drop(stdin);
        let output = child.wait_with_output()?;
        if !output.status.success() {
            bail!(
                "console producer failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }
}

/// `GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID`.
fn parse_group_line(group: &str, line: &str) -> Option<GroupOffset> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [g, topic, partition, current, ..] = fields[..] else {
        return None;
    };
    if g != group {
        return None;
    }
    Some(GroupOffset {
        topic: topic.to_owned(),
        partition: partition.parse().ok()?,
        offset: current.parse().ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_group_description() {
        let text = "\nConsumer group 'tern.gw-a' has no active members.\n\n\
            GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG   CONSUMER-ID HOST CLIENT-ID\n\
            tern.gw-a       tern.mqtt       1          42              90              48    -           -    -\n\
            tern.gw-a       tern.mqtt       0          -               7               -     -           -    -\n";
        let rows: Vec<GroupOffset> = text
            .lines()
            .filter_map(|l| parse_group_line("tern.gw-a", l))
            .collect();
        assert_eq!(
            rows,
            vec![
                GroupOffset {
                    topic: "tern.mqtt".into(),
                    partition: 1,
                    offset: Some(42)
                },
                GroupOffset {
                    topic: "tern.mqtt".into(),
                    partition: 0,
                    offset: None
                },
            ]
        );
    }
}
