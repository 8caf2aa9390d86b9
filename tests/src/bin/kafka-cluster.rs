//! `kafka-cluster DIR`: starts the three-node test cluster of [`tern_tests::kafka`] in DIR for
//! manual runs and benchmarks, prints its bootstrap servers and start-up time, writes each node's
//! PID to `DIR/node-N.pid`, then runs until it is killed (the brokers die with it). It never
//! starts anything but the cluster; `scripts/kafka-cluster.sh` wraps it.

use std::path::PathBuf;

use anyhow::Context;
use tern_tests::KafkaCluster;

fn main() -> anyhow::Result<()> {
    let dir: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .context("usage: kafka-cluster DIR")?;
    let cluster = KafkaCluster::start_in(&dir, None)?;
    for id in cluster.node_ids() {
        let pid = cluster.pid(id).context("node not running")?;
        std::fs::write(dir.join(format!("node-{id}.pid")), format!("{pid}\n"))?;
    }
    println!(
        "bootstrap={} startup_ms={}",
        cluster.bootstrap(),
        cluster.startup.as_millis()
    );
    loop {
        std::thread::park();
    }
}
