//! The follower port's contract on a real cluster: tern-upstream's scenario suite
//! (`tern_upstream::testing::contract`, also run on its in-memory fake in its unit tests) against
//! the three-node Apache Kafka cluster through tern's own Kafka client, so the fake that mirror
//! mode's unit tests run on behaves like Kafka wherever the forwarder can tell. It runs on a
//! cluster another test started (Kafka tests share clusters: `upstream.rs`'s TLS test), every
//! scenario on a topic of its own. Retention is Kafka's own DeleteRecords tool.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;
use tern_tests::KafkaCluster;
use tern_upstream::testing::Follower;
use tern_upstream::testing::contract::{self, Subject};
use tern_upstream::{Codec, KafkaUpstream, Provenance, UpstreamConfig, UpstreamError, ValueFormat};

/// How long a new topic's partitions may take to elect their leaders, and a new cluster to hand
/// out producer ids, on a loaded machine.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const DELETE_RECORDS: &str = "org.apache.kafka.tools.DeleteRecordsCommand";

/// The cluster and tern's client of it, in mirror mode (the idempotent producer).
struct OnKafka<'a> {
    cluster: &'a KafkaCluster,
    kafka: KafkaUpstream,
}

impl Subject for OnKafka<'_> {
    type Cluster = KafkaUpstream;

    fn cluster(&self) -> &KafkaUpstream {
        &self.kafka
    }

    async fn create(&self, topic: &str, partitions: u32) -> anyhow::Result<()> {
        self.kafka.ensure_topic(topic, partitions, 3).await?;
        for partition in 0..partitions {
            self.wait_for_leader(topic, partition).await?;
        }
        Ok(())
    }

    async fn trim(&self, topic: &str, partition: u32, start: i64) -> anyhow::Result<()> {
        let offsets = serde_json::json!({
            "version": 1,
            "partitions": [{ "topic": topic, "partition": partition, "offset": start }],
        });
        let file = self.cluster.dir().join(format!("delete-{topic}.json"));
        std::fs::write(&file, offsets.to_string())?;
        let path = file.to_str().context("a non-UTF-8 path")?;
        self.cluster
            .run_tool(DELETE_RECORDS, &["--offset-json-file", path])?;
        Ok(())
    }
}

impl OnKafka<'_> {
    /// Waits until `topic`/`partition` has a leader that answers ListOffsets.
    async fn wait_for_leader(&self, topic: &str, partition: u32) -> anyhow::Result<()> {
        let what = format!("a leader for {topic}/{partition}");
        retry(&what, || async {
            let follower = self.kafka.partition(topic, partition).await?;
            follower.end_offset().await.map(drop)
        })
        .await
    }

    /// Waits until the cluster hands out producer ids: a new cluster answers InitProducerId
    /// with COORDINATOR_LOAD_IN_PROGRESS until its transaction state is loaded (the forwarder
    /// retries; a scenario must not see it). An empty produce asks for the id and sends nothing.
    async fn wait_for_producer_ids(&self) -> anyhow::Result<()> {
        const TOPIC: &str = "producer_ids";
        self.create(TOPIC, 1).await?;
        let source = Provenance {
            gateway: "gw-contract".to_owned(),
            topic: TOPIC.to_owned(),
            partition: 0,
        };
        retry("a producer id", || async {
            let follower = self.kafka.partition(TOPIC, 0).await?;
            follower
                .produce(&[], &source, Codec::None, ValueFormat::Raw)
                .await
        })
        .await
    }
}

/// Calls `attempt` until it succeeds, failing with its last error after [`READY_TIMEOUT`].
async fn retry<F, Fut>(what: &str, mut attempt: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), UpstreamError>>,
{
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match attempt().await {
            Ok(()) => return Ok(()),
            Err(err) if Instant::now() > deadline => {
                return Err(err).context(format!("waiting for {what}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Runs every scenario of the follower contract on `cluster` (left as it was found, but for the
/// scenarios' own topics).
pub fn the_follower_contract_holds_on(cluster: &KafkaCluster) -> anyhow::Result<()> {
    let config = UpstreamConfig {
        bootstrap: cluster.bootstrap().split(',').map(str::to_owned).collect(),
        ..UpstreamConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let kafka = KafkaUpstream::connect(&config).await?;
        let subject = OnKafka { cluster, kafka };
        subject.wait_for_producer_ids().await?;
        contract::all(&subject).await
    })
}
