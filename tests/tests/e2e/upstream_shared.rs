//! Shared mode against the real three-node Kafka cluster: two `tern serve` gateways (gw-a,
//! gw-b) take MQTT QoS 1 publishes from Debian's mosquitto_pub and forward them into the one
//! upstream topic `tern.mqtt`. Kafka's own tools are the judges: the console consumer reads
//! what arrived, `kafka-consumer-groups` shows (and, for the resume check, moves) the groups'
//! offsets, and the console producer shows where the Java partitioner puts each key. `faults`
//! adds link cuts and a SIGKILL; `group_client` checks the consumer-group client alone (TLS,
//! SASL, and what the broker does with commits naming partitions that do not exist).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::kafka_tools::{ConsumedRecord, Isolation, TimestampType};
use tern_tests::{DumpedRecord, Gateway, KafkaCluster, ServeOptions, TempDir, read_log};

mod faults;
mod group_client;
mod txn_faults;

const EDGE_TOPIC: &str = "mqtt";
const UPSTREAM: &str = "tern.mqtt";
const EDGE_PARTITIONS: u32 = 2;
const SHARED_PARTITIONS: u32 = 3;
const KEYS: u32 = 4;

/// `(gateway, edge topic, edge partition, edge offset)`: what the `tern-*` headers identify.
type Identity = (String, String, u64, u64);

/// A gateway in shared mode, with its data directory and configuration file.
struct SharedGateway {
    id: &'static str,
    data: TempDir,
    options: ServeOptions,
    /// The proxied bootstrap list as TOML (`"host:port", …`).
    bootstrap: String,
    config: PathBuf,
    _config_dir: TempDir,
}

impl SharedGateway {
    fn new(cluster: &KafkaCluster, id: &'static str) -> anyhow::Result<Self> {
        let config_dir = TempDir::new(&format!("shared-config-{id}"))?;
        let bootstrap: Vec<String> = cluster
            .proxied_bootstrap()
            .split(',')
            .map(|b| format!("\"{b}\""))
            .collect();
        let config: PathBuf = config_dir.path().join("tern.toml");
        let shared = Self {
            id,
            data: TempDir::new(&format!("shared-{id}"))?,
            options: ServeOptions {
                args: vec!["--config".to_owned(), config.display().to_string()],
                mqtt_listen: None,
            },
            bootstrap: bootstrap.join(", "),
            config,
            _config_dir: config_dir,
        };
        shared.configure("")?;
        Ok(shared)
    }

    /// Writes the configuration file with `extra` (`key = value` lines) added to the
    /// `[[upstream]]` table; the next [`SharedGateway::start`] reads it.
    fn configure(&self, extra: &str) -> anyhow::Result<()> {
        std::fs::write(
            &self.config,
            format!(
                "[log]\npartitions = {EDGE_PARTITIONS}\n\n[[upstream]]\nbootstrap = [{}]\n\
                 gateway_id = \"{}\"\nmode = \"shared\"\nshared_partitions = \
                 {SHARED_PARTITIONS}\nmax_batch_bytes = \"4KiB\"\nbackoff_max = \"1s\"\n{extra}",
                self.bootstrap, self.id
            ),
        )?;
        Ok(())
    }

    fn start(&self) -> anyhow::Result<Gateway> {
        Gateway::start(self.data.path(), &self.options)
    }

    fn group(&self) -> String {
        format!("tern.{}", self.id)
    }

    fn edge(&self) -> anyhow::Result<Vec<DumpedRecord>> {
        read_log(self.data.path(), EDGE_TOPIC)
    }
}

/// Publishes `count` QoS 1 messages on `site/dev-{k}` for every key with mosquitto_pub.
fn publish(gateway: &Gateway, id: &str, round: u32, count: u32) -> anyhow::Result<()> {
    for key in 0..KEYS {
        let topic = format!("site/dev-{key}");
        let mut child = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &gateway.mqtt.port().to_string()])
            .args(["-q", "1", "-t", &topic, "-l"])
            .args(["-i", &format!("pub-{id}-{key}")])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run mosquitto_pub (scripts/ensure-deps.sh installs it)")?;
        let mut stdin = child.stdin.take().context("mosquitto_pub has no stdin")?;
        for seq in 0..count {
            writeln!(stdin, "{id}-dev-{key}-r{round}-{seq:04}")?;
        }
        drop(stdin);
        let output = child.wait_with_output()?;
        if !output.status.success() {
            bail!(
                "mosquitto_pub failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    Ok(())
}

/// The value of `name` summed over all its samples, if the family has any.
fn metric(gateway: &Gateway, name: &str) -> anyhow::Result<Option<u64>> {
    gateway.metric_sum(name, "")
}

/// Waits until every durable record is forwarded (and committed) and nothing fails.
fn wait_forwarded(gateway: &mut Gateway, timeout: Duration) -> anyhow::Result<()> {
    gateway.wait_forwarded("", timeout)
}

/// Edge end offset of every partition (the log's offsets are contiguous from 0).
fn edge_ends(edge: &[DumpedRecord]) -> BTreeMap<u64, u64> {
    let mut ends = BTreeMap::new();
    for record in edge {
        let end = ends.entry(record.partition).or_insert(0);
        *end = (*end).max(record.offset + 1);
    }
    ends
}

/// The group's offsets of `tern.mqtt` equal the edge end offsets, as Kafka's tool reports them.
fn assert_group_at_end(cluster: &KafkaCluster, gateway: &SharedGateway) -> anyhow::Result<()> {
    let ends = edge_ends(&gateway.edge()?);
    let offsets = cluster.group_offsets(&gateway.group())?;
    for (partition, end) in &ends {
        let row = offsets
            .iter()
            .find(|r| r.topic == UPSTREAM && u64::from(r.partition) == *partition);
        assert_eq!(
            row.and_then(|r| r.offset),
            Some(*end),
            "{}: group offset of partition {partition} vs edge end; rows {offsets:?}",
            gateway.id
        );
    }
    Ok(())
}

fn identity(record: &ConsumedRecord) -> anyhow::Result<Identity> {
    let header = |name: &str| {
        record
            .header(name)
            .map(str::to_owned)
            .with_context(|| format!("no {name} header on {record:?}"))
    };
    Ok((
        header("tern-gateway")?,
        header("tern-topic")?,
        header("tern-partition")?.parse()?,
        header("tern-offset")?.parse()?,
    ))
}

/// What the console consumer found in `tern.mqtt`, checked against the gateways' edge logs.
struct Upstream {
    /// Distinct edge records (all of them, or the check failed).
    records: usize,
    /// Records the consumer saw, copies included.
    seen: u64,
    /// Copies beyond the first.
    duplicates: u64,
    /// The upstream partitions each key was found in.
    placement: HashMap<String, HashSet<u32>>,
}

/// How long the console consumer waits for one more record before it is done with a partition;
/// its first poll (metadata, offsets, first fetch) must fit too, with three consumer JVMs started
/// at once beside the brokers on a small machine.
const CONSUMER_IDLE: Duration = Duration::from_secs(10);

/// Every edge record of `gateways` is seen by a consumer with `isolation` at least once with its
/// value, key and edge timestamp (`tern-timestamp`; the record's own is Kafka's LogAppendTime);
/// nothing else is; first copies of one gateway's key are in edge
/// order; each group's offsets are at the edge ends. Copies are counted, not refused (the
/// callers decide how many their scenario allows: none for `read_committed`).
fn check_upstream(
    cluster: &KafkaCluster,
    gateways: &[SharedGateway],
    isolation: Isolation,
) -> anyhow::Result<Upstream> {
    let mut edge: HashMap<Identity, DumpedRecord> = HashMap::new();
    for shared in gateways {
        for record in shared.edge()? {
            let id = (
                shared.id.to_owned(),
                EDGE_TOPIC.to_owned(),
                record.partition,
                record.offset,
            );
            edge.insert(id, record);
        }
        assert_group_at_end(cluster, shared)?;
    }
    let mut seen: HashSet<Identity> = HashSet::new();
    let (mut duplicates, mut total) = (0u64, 0u64);
    let mut placement: HashMap<String, HashSet<u32>> = HashMap::new();
    // One console consumer per partition, all at once: each ends only after CONSUMER_IDLE.
    let consumed: Vec<anyhow::Result<Vec<ConsumedRecord>>> = std::thread::scope(|scope| {
        let consumers: Vec<_> = (0..SHARED_PARTITIONS)
            .map(|partition| {
                scope.spawn(move || {
                    cluster.consume_isolated(UPSTREAM, partition, isolation, CONSUMER_IDLE)
                })
            })
            .collect();
        consumers
            .into_iter()
            .map(|c| {
                c.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a console consumer thread panicked")))
            })
            .collect()
    });
    let mut counts = Vec::new();
    for (partition, records) in (0..SHARED_PARTITIONS).zip(consumed) {
        let mut last_offset: HashMap<(String, String), u64> = HashMap::new();
        let records = records?;
        counts.push(records.len());
        for record in records {
            total += 1;
            let id = identity(&record)?;
            let origin = edge
                .get(&id)
                .with_context(|| format!("{id:?} is not in an edge log"))?;
            assert_eq!(record.value, origin.value, "{id:?}");
            assert_eq!(record.key, origin.key, "{id:?}");
            let edge_time = origin.timestamp_ms.to_string();
            assert_eq!(
                record.header("tern-timestamp"),
                Some(edge_time.as_str()),
                "{id:?}"
            );
            assert_eq!(record.timestamp_type, TimestampType::LogAppendTime);
            let key = origin.key.clone().context("edge record without key")?;
            placement.entry(key.clone()).or_default().insert(partition);
            if !seen.insert(id.clone()) {
                duplicates += 1;
                continue;
            }
            let previous = last_offset.insert((id.0.clone(), key), id.3);
            assert!(
                previous.is_none_or(|p| p < id.3),
                "{id:?} after edge offset {previous:?}"
            );
        }
    }
    let mut missing: Vec<&Identity> = edge.keys().filter(|id| !seen.contains(*id)).collect();
    missing.sort();
    if !missing.is_empty() {
        let ends: Vec<String> = (0..SHARED_PARTITIONS)
            .map(|p| match cluster.end_offset(UPSTREAM, p) {
                Ok(end) => end.to_string(),
                Err(err) => format!("{err:#}"),
            })
            .collect();
        panic!(
            "{} edge records never upstream for a {} consumer (records per partition {counts:?}, \
             end offsets {ends:?}); first ones: {:?}",
            missing.len(),
            isolation.name(),
            &missing[..missing.len().min(20)]
        );
    }
    Ok(Upstream {
        records: edge.len(),
        seen: total,
        duplicates,
        placement,
    })
}

/// Where Kafka's Java producer (console producer, default partitioner) puts each key.
fn java_partitions(
    cluster: &KafkaCluster,
    keys: &[String],
) -> anyhow::Result<HashMap<String, u32>> {
    cluster.create_topic("java-partitioner", SHARED_PARTITIONS, 1)?;
    let records: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), k.clone())).collect();
    cluster.produce_keyed("java-partitioner", &records)?;
    let mut placed = HashMap::new();
    for partition in 0..SHARED_PARTITIONS {
        for record in cluster.consume_all("java-partitioner", partition)? {
            placed.insert(record.key.context("keyless record")?, partition);
        }
    }
    Ok(placed)
}

#[test]
fn two_gateways_share_one_topic_exactly_once_and_resume_from_the_group_offset() -> anyhow::Result<()>
{
    let cluster = KafkaCluster::start()?;
    let gateways = [
        SharedGateway::new(&cluster, "gw-a")?,
        SharedGateway::new(&cluster, "gw-b")?,
    ];
    let mut running = vec![gateways[0].start()?, gateways[1].start()?];
    for (gateway, shared) in running.iter_mut().zip(&gateways) {
        publish(gateway, shared.id, 1, 100)?;
    }
    for gateway in &mut running {
        wait_forwarded(gateway, Duration::from_secs(120)).context("round 1")?;
    }
    for shared in &gateways {
        assert_eq!(
            shared.edge()?.len() as u32,
            KEYS * 100,
            "{} edge log",
            shared.id
        );
        assert_group_at_end(&cluster, shared)?;
    }
    let described = cluster.describe_topic(UPSTREAM)?;
    assert_eq!(described.len() as u32, SHARED_PARTITIONS);

    // gw-a stops; Kafka's tool moves its group offset back; gw-a must resend from there.
    let gw_a = &gateways[0];
    running[0].signal(libc::SIGTERM)?;
    running[0].wait_exit(Duration::from_secs(15))?;
    let ends = edge_ends(&gw_a.edge()?);
    let (&rewound, &end) = ends
        .iter()
        .max_by_key(|(_, end)| **end)
        .context("gw-a has no records")?;
    let rewind_to = end / 2;
    cluster.reset_group_offset(&gw_a.group(), UPSTREAM, u32::try_from(rewound)?, rewind_to)?;
    running[0] = gw_a.start()?;
    wait_forwarded(&mut running[0], Duration::from_secs(120)).context("after the restart")?;
    let resumed = format!("partition={rewound}");
    let next = format!("next={rewind_to}");
    assert!(
        running[0]
            .stderr_lines()
            .iter()
            .any(|l| l.contains("shared forwarding resumes")
                && l.contains(&resumed)
                && l.contains(&next)),
        "no resume from the group offset in {:#?}",
        running[0].stderr_lines()
    );
    assert_group_at_end(&cluster, gw_a)?;

    for (gateway, shared) in running.iter_mut().zip(&gateways) {
        publish(gateway, shared.id, 2, 50)?;
    }
    for gateway in &mut running {
        wait_forwarded(gateway, Duration::from_secs(120)).context("round 2")?;
        gateway.signal(libc::SIGTERM)?;
        gateway.wait_exit(Duration::from_secs(15))?;
    }

    let upstream = check_upstream(&cluster, &gateways, Isolation::ReadCommitted)?;
    assert_eq!(upstream.records as u32, 2 * KEYS * 150);
    assert_eq!(
        upstream.duplicates,
        end - rewind_to,
        "only the rewound range is sent twice (the rewind is an operator's, not a failure)"
    );
    let (duplicates, placement) = (upstream.duplicates, upstream.placement);

    // One partition per key, for both gateways, the one the Java producer picks.
    let keys: Vec<String> = placement.keys().cloned().collect();
    let java = java_partitions(&cluster, &keys)?;
    for (key, partitions) in &placement {
        assert_eq!(partitions.len(), 1, "{key} in partitions {partitions:?}");
        assert_eq!(
            partitions.iter().next(),
            java.get(key),
            "{key}: tern vs the Java partitioner"
        );
    }
    eprintln!(
        "{} edge records of 2 gateways upstream, {duplicates} resent after the rewind, {} keys",
        upstream.records,
        keys.len()
    );
    Ok(())
}
