//! Shared mode's transactions under faults, one cluster for all of them, each fault after the
//! previous one's check. The client proxies can be armed to cut the link when tern's EndTxn
//! arrives (dropped before the coordinator sees it), so a transaction's records are on the
//! brokers and it is still open. Then (1) the link returns and the same tern process
//! re-initialises, (2) tern is SIGKILLed while the transaction is open and restarted, (3) the
//! broker leading an upstream partition is SIGKILLed while mosquitto_pub keeps publishing, (4)
//! the transaction coordinator's broker is SIGKILLed while the transaction is open, (5) tern asks
//! for a short `transaction_timeout` and stays cut off until Kafka aborts the open transaction
//! itself, (6) the same, but the link stalls (tern's EndTxn held in the proxy, not dropped) and
//! the late EndTxn must be refused as fenced. After each, a `read_committed` console consumer must see every edge record exactly once
//! and in edge order per key, while a `read_uncommitted` one (the negative control) sees the
//! aborted copies. Both are printed after each fault.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_tests::kafka_tools::{Isolation, TransactionState};
use tern_tests::{Gateway, KafkaCluster, free_port, wait_until};

use super::faults::{publish_until, wait_forwarded_more};
use super::{
    EDGE_PARTITIONS, EDGE_TOPIC, SHARED_PARTITIONS, SharedGateway, UPSTREAM, check_upstream,
    publish, wait_forwarded,
};

/// Kafka's api key of EndTxn.
const END_TXN: i16 = 26;
/// Kafka looks for timed-out transactions every 10 s by default; every second here, so fault
/// (5)'s abort follows the timeout closely. Nothing else in this test lets a transaction time out.
const BROKER_PROPERTIES: &str =
    "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000\n";
/// Fault (5)'s `transaction_timeout`: long enough for a healthy transaction on a loaded machine,
/// far shorter than the cut, and short enough that fault (6) sees Kafka's abort before tern's
/// held EndTxn times out (10 s).
const SHORT_TXN_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a restarted broker may take to be back in every ISR.
const IN_SYNC_TIMEOUT: Duration = Duration::from_secs(180);

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
/// `read_uncommitted` one copies: `aborted` is their count after the previous fault, and this
/// fault must have added some when `aborts` (its transaction was open with records on the
/// brokers).
fn check(
    cluster: &KafkaCluster,
    shared: &SharedGateway,
    fault: &str,
    aborted: &mut u64,
    aborts: bool,
) -> anyhow::Result<()> {
    let gateways = std::slice::from_ref(shared);
    let committed = check_upstream(cluster, gateways, Isolation::ReadCommitted)?;
    let uncommitted = check_upstream(cluster, gateways, Isolation::ReadUncommitted)?;
    let added = uncommitted.duplicates.saturating_sub(*aborted);
    eprintln!(
        "{fault}: read_committed consumer saw {} records of {} edge records ({} copies); \
         read_uncommitted consumer saw {} records ({} aborted copies, {added} from this fault)",
        committed.seen,
        committed.records,
        committed.duplicates,
        uncommitted.seen,
        uncommitted.duplicates
    );
    assert_eq!(committed.duplicates, 0, "{fault}: read_committed copies");
    assert_eq!(committed.seen, committed.records as u64, "{fault}");
    assert!(
        uncommitted.duplicates > 0 && (added > 0 || !aborts),
        "{fault}: the read_uncommitted consumer saw no aborted copy of this fault's transaction, \
         so the checker was not shown able to fail"
    );
    *aborted = uncommitted.duplicates;
    Ok(())
}

/// The transactional ids of `shared`'s forwarders (one per edge partition, see `txn.rs`).
fn transactional_ids(shared: &SharedGateway) -> Vec<String> {
    (0..EDGE_PARTITIONS)
        .map(|p| format!("tern.{}.{EDGE_TOPIC}.{p}", shared.id))
        .collect()
}

/// A transactional id of `shared` whose transaction is open now, as Kafka's tool describes it.
fn open_transaction(
    cluster: &KafkaCluster,
    shared: &SharedGateway,
) -> anyhow::Result<(String, TransactionState)> {
    let mut seen = Vec::new();
    for id in transactional_ids(shared) {
        let state = cluster.describe_transaction(&id)?;
        if state.state == "Ongoing" {
            return Ok((id, state));
        }
        seen.push((id, state));
    }
    bail!("no open transaction: {seen:?}")
}

/// The epoch tern last logged for `transactional_id` ("transactional producer initialised").
fn logged_epoch(gateway: &mut Gateway, transactional_id: &str) -> Option<i16> {
    let id = format!("transactional_id={transactional_id} ");
    gateway
        .stderr_lines()
        .iter()
        .rev()
        .filter(|l| l.contains("transactional producer initialised") && l.contains(&id))
        .find_map(|l| {
            let (_, rest) = l.split_once(" epoch=")?;
            rest.split_whitespace().next()?.parse().ok()
        })
}

/// How many times tern logged a shared-mode session failure since line `from`.
fn interruptions(gateway: &mut Gateway, from: usize) -> usize {
    let lines = gateway.stderr_lines();
    lines
        .get(from..)
        .unwrap_or_default()
        .iter()
        .filter(|l| l.contains("shared forwarding interrupted"))
        .count()
}

/// Waits until every partition of every topic has its full ISR again (a restarted broker caught
/// up), so the next fault may kill another broker without going below `min.insync.replicas`.
fn wait_in_sync(cluster: &KafkaCluster) -> anyhow::Result<()> {
    let mut last = Vec::new();
    wait_until(IN_SYNC_TIMEOUT, "every ISR complete again", || {
        last = cluster.under_replicated()?;
        Ok(last.is_empty())
    })
    .with_context(|| format!("still under-replicated: {last:?}"))
}

/// Waits until Kafka's tool shows a transaction of `shared` aborted by Kafka itself: aborting
/// or aborted, with the short timeout, at an epoch above the last one tern logged (tern is cut
/// off or stalled, so the epoch bump is the coordinator's). Returns the id, tern's epoch and the
/// description.
fn wait_aborted_by_kafka(
    cluster: &KafkaCluster,
    gateway: &mut Gateway,
    shared: &SharedGateway,
) -> anyhow::Result<(String, i16, TransactionState)> {
    let mut aborted = None;
    let mut seen = Vec::new();
    let waited = wait_until(
        Duration::from_secs(60),
        "Kafka aborting the timed-out transaction",
        || {
            seen.clear();
            // Both ids described at once: fault (6) must see the abort within tern's 10 s.
            let ids = transactional_ids(shared);
            let described: Vec<anyhow::Result<TransactionState>> = std::thread::scope(|scope| {
                let tools: Vec<_> = ids
                    .iter()
                    .map(|id| scope.spawn(move || cluster.describe_transaction(id)))
                    .collect();
                tools
                    .into_iter()
                    .map(|t| {
                        t.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("a describe thread panicked")))
                    })
                    .collect()
            });
            for (id, state) in ids.into_iter().zip(described) {
                let state = state?;
                let epoch = logged_epoch(gateway, &id).context("no epoch in tern's log")?;
                if u128::from(state.timeout_ms) == SHORT_TXN_TIMEOUT.as_millis()
                    && matches!(state.state.as_str(), "PrepareAbort" | "CompleteAbort")
                    && state.epoch > epoch
                {
                    aborted = Some((id, epoch, state));
                    return Ok(true);
                }
                seen.push((id, epoch, state));
            }
            Ok(false)
        },
    );
    waited.with_context(|| format!("last seen (id, tern's epoch, Kafka's view): {seen:?}"))?;
    aborted.context("no aborted transaction")
}

/// The upstream partition holding the most records now (a partition the forwarders write).
fn busiest_partition(cluster: &KafkaCluster) -> anyhow::Result<u32> {
    let mut busiest = (0, 0);
    for partition in 0..SHARED_PARTITIONS {
        let end = cluster.end_offset(UPSTREAM, partition)?;
        if end > busiest.1 {
            busiest = (partition, end);
        }
    }
    Ok(busiest.0)
}

#[test]
fn a_transaction_cut_before_end_txn_or_killed_open_is_aborted_and_sent_once() -> anyhow::Result<()>
{
    let mut cluster = KafkaCluster::start_with(BROKER_PROPERTIES)?;
    let test_started = Instant::now();
    let mut shared = SharedGateway::new(&cluster, "gw-t")?;
    shared.options.mqtt_listen = Some(free_port()?);
    let mut gateway = shared.start()?;
    publish(&gateway, shared.id, 1, 25)?;
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("round 1")?;
    let mut aborted = 0;

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
    let fault = "link cut between produce and EndTxn";
    check(&cluster, &shared, fault, &mut aborted, true)?;

    // (2) tern is SIGKILLed with the transaction open, and restarted.
    cut_at_end_txn(&cluster, &gateway, &shared, 3)?;
    gateway.signal(libc::SIGKILL)?;
    gateway.wait_exit(Duration::from_secs(10))?;
    cluster.restore_clients();
    gateway = shared.start()?;
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("after the restart")?;
    let fault = "SIGKILL mid-transaction and restart";
    check(&cluster, &shared, fault, &mut aborted, true)?;

    // (3) The broker leading an upstream partition is SIGKILLed while tern forwards a steady
    // stream (so a transaction is almost always open), and restarted after tern caught up
    // without it.
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (port, stop) = (gateway.mqtt.port(), Arc::clone(&stop));
        std::thread::spawn(move || publish_until(port, &stop))
    };
    wait_forwarded_more(&mut gateway, 200, "forwarding before the leader kill")?;
    let partition = busiest_partition(&cluster)?;
    let leader = cluster.leader(UPSTREAM, partition)?;
    let mark = gateway.stderr_lines().len();
    cluster.kill_broker(leader)?;
    let killed = Instant::now();
    wait_forwarded_more(&mut gateway, 300, "forwarding with the leader dead")?;
    stop.store(true, Ordering::SeqCst);
    let runs = publisher
        .join()
        .map_err(|_| anyhow::anyhow!("publisher panicked"))?;
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("after the leader kill")?;
    let new_leader = cluster.leader(UPSTREAM, partition)?;
    eprintln!(
        "leader kill: broker {leader} (leader of {UPSTREAM}/{partition}) killed; {} session \
         failures in tern; caught up {:?} later with broker {new_leader} leading, {runs} \
         publisher runs",
        interruptions(&mut gateway, mark),
        killed.elapsed()
    );
    assert_ne!(new_leader, leader, "the dead broker still leads");
    cluster.restart_broker(leader)?;
    wait_in_sync(&cluster)?;
    let fault = "partition leader killed";
    check(&cluster, &shared, fault, &mut aborted, false)?;

    // (4) The transaction coordinator's broker is SIGKILLed while a transaction is open (tern
    // cut at its EndTxn); the link returns while that broker is still dead.
    cut_at_end_txn(&cluster, &gateway, &shared, 4)?;
    let (id, open) = open_transaction(&cluster, &shared)?;
    cluster.kill_broker(open.coordinator)?;
    cluster.restore_clients();
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("after the coordinator kill")?;
    let moved = cluster.describe_transaction(&id)?;
    eprintln!(
        "coordinator kill: {id} open at broker {} (producer {}, epoch {}) killed; now at broker \
         {}, producer {}, epoch {}, {}",
        open.coordinator,
        open.producer_id,
        open.epoch,
        moved.coordinator,
        moved.producer_id,
        moved.epoch,
        moved.state
    );
    assert_ne!(
        moved.coordinator, open.coordinator,
        "{id}: coordinator did not move"
    );
    assert!(moved.epoch > open.epoch, "{id}: no new incarnation");
    cluster.restart_broker(open.coordinator)?;
    wait_in_sync(&cluster)?;
    let fault = "transaction coordinator killed";
    check(&cluster, &shared, fault, &mut aborted, true)?;

    // (5) A short transaction timeout, and tern cut off at EndTxn until Kafka aborted the open
    // transaction itself (bumping the epoch past tern's); then the link returns.
    gateway.signal(libc::SIGTERM)?;
    gateway.wait_exit(Duration::from_secs(15))?;
    let timeout = SHORT_TXN_TIMEOUT.as_secs();
    shared.configure(&format!("transaction_timeout = \"{timeout}s\"\n"))?;
    gateway = shared.start()?;
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("restart, short timeout")?;
    cut_at_end_txn(&cluster, &gateway, &shared, 5)?;
    let cut = Instant::now();
    let (id, epoch, state) = wait_aborted_by_kafka(&cluster, &mut gateway, &shared)?;
    eprintln!(
        "transaction timeout, link cut: {id} (tern's epoch {epoch}, timeout {} ms) aborted by \
         Kafka {:?} after the cut: {}, epoch {}",
        state.timeout_ms,
        cut.elapsed(),
        state.state,
        state.epoch
    );
    cluster.restore_clients();
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("after the timeout")?;
    let fault = "transaction timed out while cut off";
    check(&cluster, &shared, fault, &mut aborted, true)?;

    // (6) The same timeout, but the link stalls instead of closing: tern's EndTxn is held in the
    // proxy until Kafka aborted the transaction, then delivered late on the same connection.
    // Kafka must refuse it as fenced, and tern must start a new incarnation and send again.
    let mark = gateway.stderr_lines().len();
    cluster.hold_clients_at_request(END_TXN);
    publish(&gateway, shared.id, 6, 25)?;
    wait_until(Duration::from_secs(60), "tern's EndTxn held", || {
        Ok(cluster.request_held())
    })?;
    let held = Instant::now();
    let waited = wait_aborted_by_kafka(&cluster, &mut gateway, &shared);
    cluster.release_clients();
    let (id, epoch, state) = waited?;
    let abort_seen = held.elapsed();
    wait_forwarded(&mut gateway, Duration::from_secs(120)).context("after the late EndTxn")?;
    let refused: Vec<String> = gateway.stderr_lines()[mark..]
        .iter()
        .filter(|l| l.contains(&id) && l.contains("commit transaction: EndTxn: Kafka error"))
        .cloned()
        .collect();
    eprintln!(
        "transaction timeout, link stalled: {id} (tern's epoch {epoch}) aborted by Kafka {:?} \
         after the hold ({}, epoch {}); tern's late EndTxn: {refused:?}",
        abort_seen, state.state, state.epoch
    );
    assert!(
        refused
            .iter()
            .any(|l| l.contains("PRODUCER_FENCED") || l.contains("INVALID_PRODUCER_EPOCH")),
        "the late EndTxn of {id} was not refused as fenced: {refused:?} (the hold lasted \
         {abort_seen:?}; beyond tern's 10 s request timeout it times out instead)"
    );
    gateway.signal(libc::SIGTERM)?;
    gateway.wait_exit(Duration::from_secs(15))?;
    let fault = "transaction timed out while the link stalled";
    check(&cluster, &shared, fault, &mut aborted, true)?;
    eprintln!(
        "txn_faults: cluster started in {:?}, faults and checks took {:?}",
        cluster.startup,
        test_started.elapsed()
    );
    Ok(())
}
