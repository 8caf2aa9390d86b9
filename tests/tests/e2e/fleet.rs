//! A fleet in the lab: [`FLEET`] real `tern serve` processes ([`tern_tests::fleet`]), half in
//! mirror mode and half in shared mode, publish QoS 1 sensor readings into one three-broker
//! cluster through the cluster's cuttable client proxies. A regional outage cuts every
//! gateway's link at once while they keep ingesting; then the links return at once.
//!
//! Checked, with kcat (a real Kafka client; shared mode `read_committed`): every acknowledged
//! record of every gateway is upstream exactly once, in edge order per gateway (mirror: its own
//! topic; shared: its records in the shared topic, by `tern-gateway` and `tern-offset`), and the
//! fleet's status topic, read by `tern fleet status --json`, shows every gateway ready again.
//! Printed: the time from the links' return until every backlog drained, the peak rate of new
//! connections the brokers saw (from the proxies) before and after, the brokers' answer times
//! per request type after the return (from the proxies), and the gateways' RSS and CPU.
//! The system suite power-cuts a QEMU gateway among a smaller fleet during the same outage
//! (tests/tests/system/fleet.rs); `tern-bench fleet` is the bigger run.

use std::time::{Duration, Instant};

use tern_tests::fleet::{Fleet, peak_per_second, request_latencies, wait_all_ready};
use tern_tests::{KafkaCluster, now_ms};

/// Gateways in the fleet; the first half forward in mirror mode, the rest in shared mode.
const FLEET: usize = 50;
/// Each gateway's sensor: one QoS 1 reading every this long.
const SENSOR_PERIOD: Duration = Duration::from_millis(500);
/// How long the regional outage lasts once every gateway has noticed it.
const OUTAGE: Duration = Duration::from_secs(15);

#[test]
fn a_fleet_rides_out_a_regional_outage_exactly_once_and_reports_ready_again() -> anyhow::Result<()>
{
    let cluster = KafkaCluster::start()?;
    let direct = cluster.bootstrap();
    let mut fleet = Fleet::start(&cluster, "fleet", FLEET, SENSOR_PERIOD)?;
    fleet.wait_forwarding(Duration::from_secs(120))?;
    wait_all_ready(&direct, fleet.ids(), None, Duration::from_secs(60))?;
    // The regional outage: every link cut at once; every gateway notices, keeps ingesting.
    let cut_at = Instant::now();
    cluster.cut_clients();
    fleet.wait_failing(Duration::from_secs(60))?;
    // The outage's length is the scenario, not a wait for something to happen.
    std::thread::sleep(OUTAGE.saturating_sub(cut_at.elapsed()));
    let behind = fleet.records_behind();
    let restored = Instant::now();
    cluster.restore_clients();
    let caught_up = fleet.wait_drained(restored, Duration::from_secs(180))?;
    let drained = restored.elapsed();
    // What held the last gateway back, from its own log.
    let last = (0..FLEET).max_by_key(|i| caught_up[*i]).unwrap_or(0);
    let (retries, warnings) = fleet.warnings(last, 12);
    println!(
        "the last to catch up, {} ({:?}); {retries} transactional requests retried; its last warnings:\n{warnings}",
        fleet.id(last),
        caught_up[last],
    );
    let acked = fleet.stop_sensors()?;
    fleet.wait_forwarded(Duration::from_secs(120))?;
    // The brokers' view of the reconnects.
    let opened = cluster.client_connections_opened();
    let before: Vec<Instant> = opened.iter().copied().filter(|t| *t < cut_at).collect();
    let after: Vec<Instant> = opened.iter().copied().filter(|t| *t >= restored).collect();
    let usages = fleet.usages()?;
    // Exactly once, in order, nothing acknowledged missing.
    let records = fleet.check_upstream(&direct, &acked)?;
    // The status topic shows every gateway ready again, in a status sent after the drain.
    let drained_ms = now_ms();
    wait_all_ready(
        &direct,
        fleet.ids(),
        Some(drained_ms),
        Duration::from_secs(60),
    )?;
    let spread = |mode: bool| {
        let mut times: Vec<Duration> = (0..FLEET)
            .filter(|i| fleet.is_shared(*i) == mode)
            .map(|i| caught_up[i])
            .collect();
        times.sort();
        format!(
            "first {:?}, median {:?}, last {:?}",
            times[0],
            times[times.len() / 2],
            times[times.len() - 1]
        )
    };
    println!(
        "caught up after the return: mirror {}; shared {}",
        spread(false),
        spread(true)
    );
    // Kafka's own throttling needs quotas, which the test cluster does not set: the brokers'
    // answer times are the figure.
    println!(
        "broker answer times after the return (requests through the proxies; no quotas, so no throttling): {}",
        request_latencies(&cluster.client_requests_answered(), restored)
    );
    let mut rss: Vec<u64> = usages.iter().map(|u| u.0).collect();
    rss.sort_unstable();
    let cpu: f64 = usages.iter().map(|u| u.1).sum();
    println!(
        "fleet of {FLEET} ({} mirror, {} shared), one reading per {SENSOR_PERIOD:?} each: outage {:?} \
         with {behind} records behind at the return; every backlog drained {drained:?} after it; \
         peak new broker connections per second {} before the outage, {} after the return \
         ({} connections after it); gateway RSS median {} KiB, max {} KiB; CPU {cpu:.1} s in all \
         over {:?}; {records} acknowledged readings checked upstream",
        FLEET / 2,
        FLEET - FLEET / 2,
        restored.duration_since(cut_at),
        peak_per_second(&before),
        peak_per_second(&after),
        after.len(),
        rss[rss.len() / 2],
        rss[rss.len() - 1],
        cut_at.elapsed(),
    );
    for g in fleet.gateways.iter_mut() {
        g.stop()?;
    }
    Ok(())
}
