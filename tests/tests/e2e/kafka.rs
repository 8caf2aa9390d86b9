//! The Kafka test cluster and the Kafka client tern forwards with: a real three-node Apache Kafka
//! 4.x cluster, rskafka producing with acks=all, headers and every compression codec, and the
//! catch-up protocol in miniature (ask the follower for its end offset and the `tern-offset` header
//! of its last record with tern's own `tern_upstream::next_edge_offset`, resume from the next edge
//! offset) — across a crash of the partition leader.
//! Also SASL PLAIN / SCRAM-SHA-256 / SCRAM-SHA-512 authentication. What reached Kafka is checked
//! only with Kafka's own console consumer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rskafka::BackoffConfig;
use rskafka::chrono::{DateTime, Utc};
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;
use tern_tests::kafka::{SASL_PASSWORD, SASL_USER};
use tern_tests::kafka_tools::ConsumedRecord;
use tern_tests::{KafkaCluster, now_ms};
use tern_upstream::{KafkaUpstream, Provenance, UpstreamConfig};

const TOPIC: &str = "tern.spike.sensors";
const CODECS: [Compression; 5] = [
    Compression::NoCompression,
    Compression::Gzip,
    Compression::Lz4,
    Compression::Snappy,
    Compression::Zstd,
];

/// The edge record with offset `i` and timestamp `base_ts + i`, carrying tern's upstream headers.
/// Timestamps must be recent: upstream retention (7 days by default) removes older records.
fn edge_record(base_ts: i64, i: u64) -> Record {
    let headers = BTreeMap::from([
        ("sensor".to_owned(), format!("s{}", i % 3).into_bytes()),
        ("tern-gateway".to_owned(), b"gw-spike".to_vec()),
        ("tern-offset".to_owned(), i.to_string().into_bytes()),
        ("tern-partition".to_owned(), b"0".to_vec()),
        ("tern-topic".to_owned(), b"sensors".to_vec()),
    ]);
    Record {
        key: Some(format!("key-{i}").into_bytes()),
        value: Some(format!("value-{i}").into_bytes()),
        headers,
        timestamp: DateTime::<Utc>::from_timestamp_millis(base_ts + i as i64).unwrap_or_default(),
    }
}

async fn connect(cluster: &KafkaCluster) -> anyhow::Result<Client> {
    // No retries inside rskafka: a retried produce whose first attempt was stored would duplicate.
    // Every error goes back to the caller, which re-runs the catch-up protocol instead.
    let no_retry = BackoffConfig {
        deadline: Some(Duration::ZERO),
        ..BackoffConfig::default()
    };
    let bootstrap = cluster.bootstrap().split(',').map(str::to_owned).collect();
    Ok(ClientBuilder::new(bootstrap)
        .client_id("tern-spike")
        .backoff_config(no_retry)
        .build()
        .await?)
}

/// tern's connection to the cluster, which asks the catch-up question.
async fn connect_tern(cluster: &KafkaCluster) -> anyhow::Result<KafkaUpstream> {
    let config = UpstreamConfig {
        bootstrap: cluster.bootstrap().split(',').map(str::to_owned).collect(),
        ..UpstreamConfig::default()
    };
    Ok(KafkaUpstream::connect(&config).await?)
}

/// The edge offset after the last record the follower holds, asked at the partition's current
/// leader the way tern's forwarder asks (`tern_upstream::next_edge_offset`: its `tern-offset`
/// header, checked against the edge partition it came from).
async fn next_edge_offset(kafka: &KafkaUpstream) -> anyhow::Result<u64> {
    let follower = kafka.partition(TOPIC, 0).await?;
    let source = Provenance {
        gateway: "gw-spike".to_owned(),
        topic: "sensors".to_owned(),
        partition: 0,
    };
    tern_upstream::next_edge_offset(&follower, &source)
        .await?
        .context("retention removed every upstream record")
}

/// Forwards `edge` to the partition in batches of 4, cycling through the codecs, resuming from
/// what the follower really holds after every error. Gives up after `patience`.
async fn forward(
    client: &Client,
    kafka: &KafkaUpstream,
    edge: &[Record],
    patience: Duration,
) -> anyhow::Result<u32> {
    let deadline = Instant::now() + patience;
    let mut errors = 0;
    let mut batches = 0usize;
    loop {
        if Instant::now() > deadline {
            bail!("forwarding did not finish within {patience:?} ({errors} errors)");
        }
        let step = async {
            let partition = client
                .partition_client(TOPIC, 0, UnknownTopicHandling::Retry)
                .await?;
            let next = next_edge_offset(kafka).await?;
            let next = usize::try_from(next)?;
            if next >= edge.len() {
                return Ok::<bool, anyhow::Error>(true);
            }
            let batch = edge[next..edge.len().min(next + 4)].to_vec();
            let codec = CODECS[batches % CODECS.len()];
            partition.produce(batch, codec).await?;
            Ok(false)
        };
        match step.await {
            Ok(true) => return Ok(errors),
            Ok(false) => batches += 1,
            Err(_) => {
                errors += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

fn assert_exactly(records: &[ConsumedRecord], base_ts: i64, count: u64) {
    assert_eq!(records.len() as u64, count, "{records:#?}");
    for (i, record) in (0..count).zip(records) {
        assert_eq!(record.offset, i, "{record:?}");
        assert_eq!(
            record.header("tern-offset"),
            Some(i.to_string().as_str()),
            "{record:?}"
        );
        assert_eq!(
            record.header("tern-gateway"),
            Some("gw-spike"),
            "{record:?}"
        );
        assert_eq!(record.header("tern-topic"), Some("sensors"), "{record:?}");
        assert_eq!(record.header("tern-partition"), Some("0"), "{record:?}");
        assert_eq!(record.key.as_deref(), Some(format!("key-{i}").as_str()));
        assert_eq!(record.value, format!("value-{i}"));
        assert_eq!(record.timestamp_ms, base_ts + i as i64);
    }
}

/// Polls `kafka-topics --describe` until all three replicas are in sync again.
fn wait_for_full_isr(cluster: &KafkaCluster, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let state = cluster.describe_topic(TOPIC)?;
        if state.iter().all(|p| p.isr.len() == 3) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("ISR not back to 3 replicas within {timeout:?}: {state:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn rskafka_forwards_exactly_once_across_a_leader_crash() -> anyhow::Result<()> {
    let mut cluster = KafkaCluster::start()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let base_ts = now_ms();
    let edge: Vec<Record> = (0..40).map(|i| edge_record(base_ts, i)).collect();
    let (client, kafka) = runtime.block_on(async {
        let client = connect(&cluster).await?;
        client
            .controller_client()?
            .create_topic(TOPIC, 1, 3, 10_000)
            .await?;
        Ok::<_, anyhow::Error>((client, connect_tern(&cluster).await?))
    })?;
    let state = cluster.describe_topic(TOPIC)?;
    assert_eq!(state.len(), 1);
    assert_eq!(state[0].replicas.len(), 3, "{state:?}");

    // First half, every codec; then a re-run from scratch adds nothing (catch-up, no duplicates).
    runtime.block_on(forward(
        &client,
        &kafka,
        &edge[..20],
        Duration::from_secs(60),
    ))?;
    runtime.block_on(forward(
        &client,
        &kafka,
        &edge[..20],
        Duration::from_secs(60),
    ))?;
    assert_exactly(&cluster.consume_all(TOPIC, 0)?, base_ts, 20);

    // Crash the leader; the same client carries on with the survivors (min.insync.replicas=2).
    let leader = cluster.leader(TOPIC, 0)?;
    cluster.kill_broker(leader)?;
    runtime.block_on(forward(&client, &kafka, &edge, Duration::from_secs(120)))?;
    let new_leader = cluster.leader(TOPIC, 0)?;
    assert_ne!(new_leader, leader);
    assert_exactly(&cluster.consume_all(TOPIC, 0)?, base_ts, 40);

    // The crashed broker comes back and catches up as a follower.
    cluster.restart_broker(leader)?;
    wait_for_full_isr(&cluster, Duration::from_secs(90))?;
    assert_exactly(&cluster.consume_all(TOPIC, 0)?, base_ts, 40);
    Ok(())
}

/// Produces one record as `sasl` and returns the offset it got.
async fn produce_as(cluster: &KafkaCluster, sasl: SaslConfig, topic: &str) -> anyhow::Result<i64> {
    let bootstrap = cluster
        .sasl_bootstrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    let client = ClientBuilder::new(bootstrap)
        .backoff_config(BackoffConfig {
            deadline: Some(Duration::ZERO),
            ..BackoffConfig::default()
        })
        .sasl_config(sasl)
        .build()
        .await?;
    let partition = client
        .partition_client(topic, 0, UnknownTopicHandling::Retry)
        .await?;
    let offsets = partition
        .produce(vec![edge_record(now_ms(), 0)], Compression::Zstd)
        .await?;
    offsets
        .first()
        .copied()
        .context("produce returned no offset")
}

#[test]
fn rskafka_authenticates_with_sasl_plain_and_scram() -> anyhow::Result<()> {
    let cluster = KafkaCluster::start()?;
    let topic = "tern.spike.sasl";
    cluster.create_topic(topic, 1, 3)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let credentials = || Credentials::new(SASL_USER.to_owned(), SASL_PASSWORD.to_owned());
    let mechanisms = [
        SaslConfig::Plain(credentials()),
        SaslConfig::ScramSha256(credentials()),
        SaslConfig::ScramSha512(credentials()),
    ];
    for (expected, sasl) in (0..).zip(mechanisms) {
        let offset = runtime.block_on(produce_as(&cluster, sasl, topic))?;
        assert_eq!(offset, expected);
    }
    let wrong = Credentials::new(SASL_USER.to_owned(), "wrong".to_owned());
    for sasl in [
        SaslConfig::Plain(wrong.clone()),
        SaslConfig::ScramSha512(wrong),
    ] {
        let refused = runtime.block_on(produce_as(&cluster, sasl, topic));
        assert!(refused.is_err(), "a wrong password must be refused");
    }
    let records = cluster.consume_all(topic, 0)?;
    assert_eq!(records.len(), 3, "{records:?}");
    assert!(records.iter().all(|r| r.value == "value-0"), "{records:?}");
    Ok(())
}
