//! Shared mode's transactions under faults placed exactly: the client proxies are armed to cut
//! the link when tern's EndTxn arrives (dropped before the coordinator sees it), so a
//! transaction's records are on the brokers and it is still open. Then (1) the link returns and
//! the same tern process re-initialises, (2) tern is SIGKILLed while the transaction is open and
//! restarted. Each time InitProducerId must abort the open transaction and the batch must be
//! sent again: a `read_committed` console consumer sees every edge record exactly once and in
//! edge order per key, while a `read_uncommitted` one (the negative control) sees the aborted
//! copies. Both are printed after each fault.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_tests::kafka_tools::Isolation;
use tern_tests::{Gateway, KafkaCluster, free_port};

use super::{SharedGateway, check_upstream, publish, wait_forwarded};

/// Kafka's api key of EndTxn.
const END_TXN: i16 = 26;

/// Arms the EndTxn cut, publishes a round and waits until the cut fired (every client proxy is
/// then cut).
fn cut_at_end_txn(
    cluster: &KafkaCluster,
    gateway: &Gateway,
    shared: &SharedGateway,
    round: u32,
) -> anyhow::Result<()> {
    cluster.cut_clients_at_request(END_TXN);
    publish(gateway, shared.id, round, 25)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cluster.request_cut_fired() {
        if Instant::now() > deadline {
            bail!("round {round}: no EndTxn reached the proxies in 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// What both consumers see now; the `read_committed` one must see each edge record once, the
/// `read_uncommitted` one must see copies.
fn check(cluster: &KafkaCluster, shared: &SharedGateway, fault: &str) -> anyhow::Result<()> {
    let gateways = std::slice::from_ref(shared);
    let committed = check_upstream(cluster, gateways, Isolation::ReadCommitted)?;
    let uncommitted = check_upstream(cluster, gateways, Isolation::ReadUncommitted)?;
    eprintln!(
        "{fault}: read_committed consumer saw {} records of {} edge records ({} copies); \
         read_uncommitted consumer saw {} records ({} aborted copies)",
        committed.seen,
        committed.records,
        committed.duplicates,
        uncommitted.seen,
        uncommitted.duplicates
    );
    assert_eq!(committed.duplicates, 0, "{fault}: read_committed copies");
    assert_eq!(committed.seen, committed.records as u64, "{fault}");
    assert!(
        uncommitted.duplicates > 0,
        "{fault}: the read_uncommitted consumer saw no aborted copy, so the checker was not \
         shown able to fail"
    );
    Ok(())
}

#[test]
fn a_transaction_cut_before_end_txn_or_killed_open_is_aborted_and_sent_once() -> anyhow::Result<()>
{
    let cluster = KafkaCluster::start()?;
    let mut shared = SharedGateway::new(&cluster, "gw-t")?;
    shared.options.mqtt_listen = Some(free_port()?);
    let mut gateway = shared.start()?;
    publish(&gateway, shared.id, 1, 25)?;
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("round 1")?;

    // (1) The link is lost between produce and EndTxn; the same process goes on after it returns.
    cut_at_end_txn(&cluster, &gateway, &shared, 2)?;
    gateway
        .wait_metric(
            "tern_upstream_failing",
            "",
            "the lost EndTxn noticed",
            Duration::from_secs(60),
            |n| n.unwrap_or(0) >= 1,
        )
        .context("tern did not notice the cut")?;
    cluster.restore_clients();
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("after the link cut")?;
    check(&cluster, &shared, "link cut between produce and EndTxn")?;

    // (2) tern is SIGKILLed with the transaction open, and restarted.
    cut_at_end_txn(&cluster, &gateway, &shared, 3)?;
    gateway.signal(libc::SIGKILL)?;
    gateway.wait_exit(Duration::from_secs(10))?;
    cluster.restore_clients();
    gateway = shared.start()?;
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("after the restart")?;
    gateway.signal(libc::SIGTERM)?;
    gateway.wait_exit(Duration::from_secs(15))?;
    check(&cluster, &shared, "SIGKILL mid-transaction and restart")?;
    Ok(())
}
