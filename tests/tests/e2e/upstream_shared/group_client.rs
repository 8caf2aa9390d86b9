//! tern's consumer-group client (`tern_upstream::GroupClient`, built by `tern_upstream::group_client` as
//! shared mode builds it) alone against the real cluster: over TLS with a private CA and over
//! SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, commit and fetch back, with the offsets checked
//! by `kafka-consumer-groups`; a wrong password and commits naming a partition or a topic that
//! does not exist are refused by the broker.

use std::time::{Duration, Instant};

use anyhow::Context;
use tern_tests::KafkaCluster;
use tern_tests::kafka::{SASL_PASSWORD, SASL_USER};
use tern_upstream::{
    self, Commit, GroupClient, Mode, SaslMechanism, SaslSettings, TlsSettings, UpstreamConfig,
};

const TOPIC: &str = "progress";

fn commit(topic: &str, partition: i32, offset: i64) -> Commit<'_> {
    Commit {
        topic,
        partition,
        offset,
        metadata: "tern edge offset of gw-t/t/1",
    }
}

fn client(
    bootstrap: &str,
    group: &str,
    change: impl FnOnce(&mut UpstreamConfig),
) -> anyhow::Result<GroupClient> {
    let mut config = UpstreamConfig {
        bootstrap: bootstrap.split(',').map(str::to_owned).collect(),
        mode: Mode::Shared,
        group: Some(group.to_owned()),
        ..UpstreamConfig::default()
    };
    change(&mut config);
    let client =
        tern_upstream::group_client(&config, "gw-t")?.context("shared mode has a client")?;
    std::sync::Arc::into_inner(client).context("the client is shared")
}

/// The group's offset of `TOPIC`/`partition`, waiting out "coordinator not available" while
/// `__consumer_offsets` is being created (the forwarder retries it the same way).
async fn first_fetch(client: &GroupClient, partition: i32) -> anyhow::Result<Option<i64>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.fetch(TOPIC, partition).await {
            Err(err) if Instant::now() < deadline && err.to_string().contains("COORDINATOR") => {
                // The retry pause of a wait for the coordinator (async, so not `wait_until`).
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => return Ok(other?),
        }
    }
}

fn group_offset(
    cluster: &KafkaCluster,
    group: &str,
    partition: u32,
) -> anyhow::Result<Option<u64>> {
    let rows = cluster.group_offsets(group)?;
    Ok(rows
        .iter()
        .find(|r| r.topic == TOPIC && r.partition == partition)
        .and_then(|r| r.offset))
}

#[test]
fn the_group_client_speaks_tls_and_sasl_and_the_broker_checks_partitions() -> anyhow::Result<()> {
    let cluster = KafkaCluster::start()?;
    cluster.create_topic(TOPIC, 2, 3)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    let tls = client(&cluster.tls_bootstrap(), "tls-group", |c| {
        c.tls = Some(TlsSettings {
            ca_file: cluster.tls_ca(),
        });
    })?;
    runtime.block_on(async {
        assert_eq!(first_fetch(&tls, 1).await?, None);
        tls.commit(&commit(TOPIC, 1, 42)).await?;
        assert_eq!(tls.fetch(TOPIC, 1).await?, Some(42));
        assert_eq!(tls.fetch(TOPIC, 0).await?, None);
        // The broker refuses commits naming a partition or topic that does not exist.
        for (topic, partition) in [(TOPIC, 2), ("no-such-topic", 0)] {
            let err = tls.commit(&commit(topic, partition, 1)).await.err();
            let text = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                text.contains("UNKNOWN_TOPIC_OR_PARTITION"),
                "{topic}/{partition}: {text:?}"
            );
        }
        anyhow::Ok(())
    })?;
    assert_eq!(group_offset(&cluster, "tls-group", 1)?, Some(42));

    let mechanisms = [
        (SaslMechanism::Plain, "plain"),
        (SaslMechanism::ScramSha256, "scram-256"),
        (SaslMechanism::ScramSha512, "scram-512"),
    ];
    for (offset, (mechanism, name)) in (100..).zip(mechanisms) {
        let group = format!("sasl-{name}");
        let sasl = |password: &str| SaslSettings {
            mechanism,
            username: SASL_USER.to_owned(),
            password: password.to_owned(),
            password_file: None,
            password_env: None,
        };
        let good = client(&cluster.sasl_bootstrap(), &group, |c| {
            c.sasl = Some(sasl(SASL_PASSWORD))
        })?;
        let bad = client(&cluster.sasl_bootstrap(), &group, |c| {
            c.sasl = Some(sasl("wrong"))
        })?;
        runtime.block_on(async {
            assert_eq!(first_fetch(&good, 0).await?, None, "{name}");
            good.commit(&commit(TOPIC, 0, offset)).await?;
            assert_eq!(good.fetch(TOPIC, 0).await?, Some(offset), "{name}");
            let err = bad.fetch(TOPIC, 0).await.err().map(|e| e.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.contains("SASL_AUTHENTICATION_FAILED")),
                "{name} with a wrong password: {err:?}"
            );
            anyhow::Ok(())
        })?;
        assert_eq!(
            group_offset(&cluster, &group, 0)?,
            u64::try_from(offset).ok(),
            "{name}"
        );
    }
    Ok(())
}
