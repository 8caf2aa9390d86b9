//! Kafka's own command-line tools, run from the cluster's jars: topic creation and description,
//! end offsets, and the console consumer that tests use to see what really reached Kafka. This is
//! the independent check of tern's forwarding, so it must never use tern's code or its Kafka
//! client; it only parses the tools' text output.

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::kafka::{KafkaCluster, LOG4J2, java};

/// Runs a Kafka tool class against `bootstrap`, any Kafka-protocol server (tern's listener, a
/// cluster), with `stdin` as its input; `dir` holds the tool's log configuration.
pub fn run_tool_at(
    dir: &Path,
    bootstrap: &str,
    main_class: &str,
    args: &[&str],
    stdin: &[u8],
) -> anyhow::Result<Output> {
    let mut child = spawn_tool_at(dir, bootstrap, main_class, args)?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin)?;
    }
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "{main_class} {args:?} failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

/// Starts a Kafka tool class against `bootstrap` with its stdin, stdout and stderr piped, for
/// a test that feeds it over time (for example the console producer across a gateway restart).
pub fn spawn_tool_at(
    dir: &Path,
    bootstrap: &str,
    main_class: &str,
    args: &[&str],
) -> anyhow::Result<std::process::Child> {
    std::fs::write(dir.join("log4j2.properties"), LOG4J2)?;
    let mut command = java(dir, TOOL_JVM, main_class)?;
    command
        .arg("--bootstrap-server")
        .arg(bootstrap)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
        .spawn()
        .with_context(|| format!("cannot run {main_class}"))
}

/// The console consumer's output lines as records (the format `consume` asks for).
pub fn parse_console_records(stdout: &[u8]) -> anyhow::Result<Vec<ConsumedRecord>> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(parse_record_line)
        .collect()
}

/// The `--formatter-property` arguments that print what [`parse_console_records`] reads.
pub fn console_format_args() -> Vec<&'static str> {
    FORMAT
        .iter()
        .flat_map(|property| ["--formatter-property", property])
        .collect()
}

/// JVM flags for short-lived tools: quick start, small heap.
pub(crate) const TOOL_JVM: &[&str] = &["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"];

/// One partition as `kafka-topics --describe` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub partition: u32,
    pub leader: Option<u32>,
    pub replicas: Vec<u32>,
    pub isr: Vec<u32>,
}

/// Which clock a record's timestamp is: the producer's (`CreateTime`) or the broker's on arrival
/// (`LogAppendTime`, a topic with `message.timestamp.type=LogAppendTime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// One transactional id as `kafka-transactions describe` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionState {
    /// The broker coordinating the transactional id.
    pub coordinator: u32,
    pub producer_id: i64,
    pub epoch: i16,
    /// `Empty`, `Ongoing`, `PrepareCommit`, `PrepareAbort`, `CompleteCommit`, `CompleteAbort`, …
    pub state: String,
    pub timeout_ms: u64,
}

/// One record as the console consumer prints it (text keys, values and header values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedRecord {
    pub offset: u64,
    pub timestamp_type: TimestampType,
    pub timestamp_ms: i64,
    pub headers: Vec<(String, String)>,
    pub key: Option<String>,
    pub value: String,
}

impl ConsumedRecord {
    /// The value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A consumer's `isolation.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Only records of committed transactions (and non-transactional ones).
    ReadCommitted,
    /// Every record, aborted transactions' too.
    ReadUncommitted,
}

impl Isolation {
    pub fn name(self) -> &'static str {
        match self {
            Self::ReadCommitted => "read_committed",
            Self::ReadUncommitted => "read_uncommitted",
        }
    }
}

impl KafkaCluster {
    /// Runs a Kafka tool class against this cluster's bootstrap servers.
    pub fn run_tool(&self, main_class: &str, args: &[&str]) -> anyhow::Result<Output> {
        let mut command = java(self.dir(), TOOL_JVM, main_class)?;
        command
            .arg("--bootstrap-server")
            .arg(self.bootstrap())
            .args(args);
        let output = command
            .output()
            .with_context(|| format!("cannot run {main_class}"))?;
        if !output.status.success() {
            bail!(
                "{main_class} {args:?} failed ({}):\n{}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(output)
    }

    /// `kafka-topics --create`.
    pub fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: u32,
    ) -> anyhow::Result<()> {
        let (partitions, replication) = (partitions.to_string(), replication.to_string());
        self.run_tool(
            "org.apache.kafka.tools.TopicCommand",
            &[
                "--create",
                "--topic",
                topic,
                "--partitions",
                &partitions,
                "--replication-factor",
                &replication,
            ],
        )?;
        Ok(())
    }

    /// `kafka-topics --describe`: leader, replicas and ISR of every partition.
    pub fn describe_topic(&self, topic: &str) -> anyhow::Result<Vec<PartitionState>> {
        let output = self.run_tool(
            "org.apache.kafka.tools.TopicCommand",
            &["--describe", "--topic", topic],
        )?;
        let text = String::from_utf8_lossy(&output.stdout);
        let states: Vec<PartitionState> = text.lines().filter_map(parse_partition_line).collect();
        if states.is_empty() {
            bail!("no partitions in the description of {topic}:\n{text}");
        }
        Ok(states)
    }

    /// The broker leading `topic`/`partition` now.
    pub fn leader(&self, topic: &str, partition: u32) -> anyhow::Result<u32> {
        self.describe_topic(topic)?
            .into_iter()
            .find(|s| s.partition == partition)
            .and_then(|s| s.leader)
            .with_context(|| format!("{topic}/{partition} has no leader"))
    }

    /// `kafka-topics --create` with an explicit replica assignment (one `a:b:c` list of broker
    /// ids per partition, the first one its leader while it runs) and `configs` (`name=value`).
    pub fn create_topic_assigned(
        &self,
        topic: &str,
        assignment: &[&[u32]],
        configs: &[&str],
    ) -> anyhow::Result<()> {
        let assignment: Vec<String> = assignment
            .iter()
            .map(|replicas| {
                let ids: Vec<String> = replicas.iter().map(u32::to_string).collect();
                ids.join(":")
            })
            .collect();
        let assignment = assignment.join(",");
        let mut args = vec![
            "--create",
            "--topic",
            topic,
            "--replica-assignment",
            &assignment,
        ];
        for config in configs {
            args.extend(["--config", config]);
        }
        self.run_tool("org.apache.kafka.tools.TopicCommand", &args)?;
        Ok(())
    }

    /// The configs `kafka-topics --describe` lists for `topic` (`name=value`, sorted by name):
    /// those that differ from Kafka's defaults, set on the topic or in the brokers'
    /// configuration (this harness's `min.insync.replicas=2`, for one).
    pub fn topic_config_overrides(&self, topic: &str) -> anyhow::Result<Vec<String>> {
        let output = self.run_tool(
            "org.apache.kafka.tools.TopicCommand",
            &["--describe", "--topic", topic],
        )?;
        let text = String::from_utf8_lossy(&output.stdout);
        let configs = text
            .lines()
            .find(|line| line.starts_with("Topic:"))
            .and_then(|line| {
                line.split('\t')
                    .find_map(|f| f.trim().strip_prefix("Configs:"))
            })
            .with_context(|| format!("no Configs in the description of {topic}:\n{text}"))?;
        let mut configs: Vec<String> = configs
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        configs.sort();
        Ok(configs)
    }

    /// `kafka-get-offsets --time TIME` (`earliest`: the log start offset, which retention moves;
    /// `latest`: the end offset) of every partition of `topic`, by partition.
    pub fn offsets_at(
        &self,
        topic: &str,
        time: &str,
    ) -> anyhow::Result<std::collections::BTreeMap<u32, u64>> {
        let output = self.run_tool(
            "org.apache.kafka.tools.GetOffsetShell",
            &["--topic", topic, "--time", time],
        )?;
        let text = String::from_utf8_lossy(&output.stdout);
        let prefix = format!("{topic}:");
        let offsets: std::collections::BTreeMap<u32, u64> = text
            .lines()
            .filter_map(|line| {
                let (partition, offset) = line.strip_prefix(&prefix)?.split_once(':')?;
                Some((partition.parse().ok()?, offset.trim().parse().ok()?))
            })
            .collect();
        if offsets.is_empty() {
            bail!("no {time} offsets for {topic} in:\n{text}");
        }
        Ok(offsets)
    }

    /// `kafka-transactions describe --transactional-id`: the coordinator, producer id, epoch,
    /// state and timeout of `transactional_id` (an error when the coordinator does not know it).
    pub fn describe_transaction(&self, transactional_id: &str) -> anyhow::Result<TransactionState> {
        let output = self.run_tool(
            "org.apache.kafka.tools.TransactionsCommand",
            &["describe", "--transactional-id", transactional_id],
        )?;
        let text = String::from_utf8_lossy(&output.stdout);
        parse_transaction(&text)
            .with_context(|| format!("no description of {transactional_id} in:\n{text}"))
    }

    /// `kafka-topics --describe --under-replicated-partitions`: every partition of every topic
    /// whose ISR lacks a replica (empty once a restarted broker caught up everywhere).
    pub fn under_replicated(&self) -> anyhow::Result<Vec<PartitionState>> {
        let output = self.run_tool(
            "org.apache.kafka.tools.TopicCommand",
            &["--describe", "--under-replicated-partitions"],
        )?;
        let text = String::from_utf8_lossy(&output.stdout);
        Ok(text.lines().filter_map(parse_partition_line).collect())
    }

    /// `kafka-get-offsets --time latest`: the partition's end offset (next offset to be written).
    pub fn end_offset(&self, topic: &str, partition: u32) -> anyhow::Result<u64> {
        let partition_arg = partition.to_string();
        let output = self.run_tool(
            "org.apache.kafka.tools.GetOffsetShell",
            &[
                "--topic",
                topic,
                "--partitions",
                &partition_arg,
                "--time",
                "latest",
            ],
        )?;
        let text = String::from_utf8_lossy(&output.stdout);
        let prefix = format!("{topic}:{partition}:");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse().ok())
            .with_context(|| format!("no end offset for {topic}/{partition} in:\n{text}"))
    }

    /// Every record of `topic`/`partition` a consumer with `isolation` sees, read from offset 0
    /// by the console consumer (no consumer group) until no record arrived for `idle` (a
    /// transactional topic's end offset counts its commit and abort markers, so the number of
    /// records cannot be known in advance).
    pub fn consume_isolated(
        &self,
        topic: &str,
        partition: u32,
        isolation: Isolation,
        idle: Duration,
    ) -> anyhow::Result<Vec<ConsumedRecord>> {
        let (partition_arg, idle_arg) = (partition.to_string(), idle.as_millis().to_string());
        let mut args = vec![
            "--topic",
            topic,
            "--partition",
            &partition_arg,
            "--offset",
            "earliest",
            "--isolation-level",
            isolation.name(),
            "--timeout-ms",
            &idle_arg,
        ];
        for property in FORMAT {
            args.extend(["--formatter-property", property]);
        }
        let class = "org.apache.kafka.tools.consumer.ConsoleConsumer";
        let output = java(self.dir(), TOOL_JVM, class)?
            .arg("--bootstrap-server")
            .arg(self.bootstrap())
            .args(&args)
            .output()
            .with_context(|| format!("cannot run {class}"))?;
        // The idle timeout ends the consumer; any other failure is the test's.
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() && !stderr.contains("TimeoutException") {
            bail!("{class} {args:?} failed ({}):\n{stderr}", output.status);
        }
        parse_console_records(&output.stdout)
    }

    /// group): first asks for the end offset, then consumes exactly that many records.
    pub fn consume_all(&self, topic: &str, partition: u32) -> anyhow::Result<Vec<ConsumedRecord>> {
        let end = self.end_offset(topic, partition)?;
        if end == 0 {
            return Ok(Vec::new());
        }
        let records = self.consume(topic, partition, end, Duration::from_secs(60))?;
        if records.len() as u64 != end {
            bail!(
                "expected {end} records in {topic}/{partition}, the console consumer got {}",
                records.len()
            );
        }
        Ok(records)
    }

    /// Up to `count` records of `topic`/`partition` from offset 0, giving up after `timeout`.
    pub fn consume(
        &self,
        topic: &str,
        partition: u32,
        count: u64,
        timeout: Duration,
    ) -> anyhow::Result<Vec<ConsumedRecord>> {
        let (partition_arg, count_arg) = (partition.to_string(), count.to_string());
        let timeout_arg = timeout.as_millis().to_string();
        let mut args = vec![
            "--topic",
            topic,
            "--partition",
            &partition_arg,
            "--offset",
            "earliest",
            "--max-messages",
            &count_arg,
            "--timeout-ms",
            &timeout_arg,
        ];
        for property in FORMAT {
            args.extend(["--formatter-property", property]);
        }
        let output = self.run_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", &args)?;
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(parse_record_line)
            .collect()
    }
}

/// Console consumer output: one line per record, fields split by tabs, headers by `|`, each
/// header `key:value`.
const FORMAT: &[&str] = &[
    "print.timestamp=true",
    "print.offset=true",
    "print.headers=true",
    "print.key=true",
    "print.value=true",
    "headers.separator=|",
    "null.literal=<null>",
];

/// `CreateTime:TS\tOffset:N\tHEADERS\tKEY\tVALUE` (`LogAppendTime:TS` on a topic that has it).
fn parse_record_line(line: &str) -> anyhow::Result<ConsumedRecord> {
    let fields: Vec<&str> = line.splitn(5, '\t').collect();
    let [ts, offset, headers, key, value] = fields[..] else {
        bail!("unexpected console consumer line {line:?}");
    };
    let (timestamp_type, ts) = if let Some(ts) = ts.strip_prefix("CreateTime:") {
        (TimestampType::CreateTime, ts)
    } else if let Some(ts) = ts.strip_prefix("LogAppendTime:") {
        (TimestampType::LogAppendTime, ts)
    } else {
        bail!("no timestamp in {line:?}");
    };
    let timestamp_ms = ts
        .parse()
        .with_context(|| format!("no timestamp in {line:?}"))?;
    let offset = offset
        .strip_prefix("Offset:")
        .and_then(|o| o.parse().ok())
        .with_context(|| format!("no offset in {line:?}"))?;
    let headers = if headers == "NO_HEADERS" {
        Vec::new()
    } else {
        headers
            .split('|')
            .map(|h| {
                let (k, v) = h.split_once(':').unwrap_or((h, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect()
    };
    let key = (key != "<null>").then(|| key.to_owned());
    Ok(ConsumedRecord {
        offset,
        timestamp_type,
        timestamp_ms,
        headers,
        key,
        value: value.to_owned(),
    })
}

/// `\tTopic: t\tPartition: 0\tLeader: 3\tReplicas: 3,1,2\tIsr: 3,1,2\t…`.
fn parse_partition_line(line: &str) -> Option<PartitionState> {
    let field = |name: &str| {
        line.split('\t')
            .find_map(|f| f.trim().strip_prefix(name).map(str::trim))
    };
    let ids = |list: &str| {
        list.split(',')
            .filter_map(|id| id.trim().parse().ok())
            .collect()
    };
    Some(PartitionState {
        partition: field("Partition:")?.parse().ok()?,
        leader: field("Leader:")?.parse().ok(),
        replicas: ids(field("Replicas:")?),
        isr: ids(field("Isr:")?),
    })
}

/// The table `kafka-transactions describe` prints: a header row, then one row, columns padded
/// with spaces (`TopicPartitions`, the last, may be empty).
fn parse_transaction(text: &str) -> Option<TransactionState> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let row: Vec<&str> = lines.next()?.split_whitespace().collect();
    let field = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .and_then(|i| row.get(i).copied())
    };
    Some(TransactionState {
        coordinator: field("CoordinatorId")?.parse().ok()?,
        producer_id: field("ProducerId")?.parse().ok()?,
        epoch: field("ProducerEpoch")?.parse().ok()?,
        state: field("TransactionState")?.to_owned(),
        timeout_ms: field("TransactionTimeoutMs")?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_console_consumer_line() -> anyhow::Result<()> {
        let line = "CreateTime:1795943224507\tOffset:7\ttern-offset:7|tern-topic:s\tk1\tv\tx";
        let record = parse_record_line(line)?;
        assert_eq!(record.offset, 7);
        assert_eq!(record.timestamp_ms, 1_795_943_224_507);
        assert_eq!(record.timestamp_type, TimestampType::CreateTime);
        assert_eq!(record.header("tern-offset"), Some("7"));
        assert_eq!(record.key.as_deref(), Some("k1"));
        assert_eq!(record.value, "v\tx");
        let bare = parse_record_line("CreateTime:1\tOffset:0\tNO_HEADERS\t<null>\tv")?;
        assert_eq!((bare.headers.len(), bare.key), (0, None));
        let appended = parse_record_line("LogAppendTime:42\tOffset:1\tNO_HEADERS\t<null>\tv")?;
        assert_eq!(appended.timestamp_type, TimestampType::LogAppendTime);
        assert_eq!(appended.timestamp_ms, 42);
        assert!(parse_record_line("NoTimestampType:-1\tOffset:1\tNO_HEADERS\t<null>\tv").is_err());
        Ok(())
    }

    #[test]
    fn parses_a_transaction_description() {
        let text = "CoordinatorId\tTransactionalId\tProducerId\tProducerEpoch\tTransactionState\t\
                    TransactionTimeoutMs\tCurrentTransactionStartTimeMs\tTransactionDurationMs\t\
                    TopicPartitions\n\
                    2            tern.gw.mqtt.0  7           3            Ongoing          \
                    3000                 1795943224507                 812                   \
                    tern.mqtt-0,tern.mqtt-2\n";
        assert_eq!(
            parse_transaction(text),
            Some(TransactionState {
                coordinator: 2,
                producer_id: 7,
                epoch: 3,
                state: "Ongoing".to_owned(),
                timeout_ms: 3000
            })
        );
        let empty = "CoordinatorId TransactionalId ProducerId ProducerEpoch TransactionState \
                     TransactionTimeoutMs CurrentTransactionStartTimeMs TransactionDurationMs \
                     TopicPartitions\n1 t 7 4 CompleteAbort 3000 None None\n";
        assert_eq!(
            parse_transaction(empty).map(|t| (t.epoch, t.state)),
            Some((4, "CompleteAbort".to_owned()))
        );
        assert_eq!(parse_transaction("CoordinatorId\n"), None);
    }

    #[test]
    fn parses_a_partition_description() {
        let line = "\tTopic: t1\tPartition: 0\tLeader: 3\tReplicas: 3,1,2\tIsr: 3,1\tElr: \tLastKnownElr: ";
        let state = parse_partition_line(line);
        assert_eq!(
            state,
            Some(PartitionState {
                partition: 0,
                leader: Some(3),
                replicas: vec![3, 1, 2],
                isr: vec![3, 1]
            })
        );
        assert_eq!(
            parse_partition_line("Topic: t1\tTopicId: x\tPartitionCount: 1"),
            None
        );
    }
}
