//! A fleet in the lab: [`FLEET`] real `tern serve` processes, each with its own data directory
//! and configuration, half in mirror mode and half in shared mode, publish QoS 1 sensor readings
//! into one three-broker cluster through the cluster's cuttable client proxies. A regional outage
//! cuts every gateway's link at once while they keep ingesting; then the links return at once.
//!
//! Checked, with kcat (a real Kafka client; shared mode `read_committed`): every acknowledged
//! record of every gateway is upstream exactly once, in edge order per gateway (mirror: its own
//! topic; shared: its records in the shared topic, by `tern-gateway` and `tern-offset`), and the
//! fleet's status topic, read by `tern fleet status --json`, shows every gateway ready again.
//! Printed: the time from the links' return until every backlog drained, the peak rate of new
//! connections the brokers saw (from the proxies) before and after, and the gateways' RSS and CPU.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, KafkaCluster, ServeOptions, TempDir, run_tern, wait_until};

/// Gateways in the fleet; the first half forward in mirror mode, the rest in shared mode.
const FLEET: usize = 50;
/// Each gateway's sensor: one QoS 1 reading every this long.
const SENSOR_PERIOD: Duration = Duration::from_millis(500);
/// How long the regional outage lasts once every gateway has noticed it.
const OUTAGE: Duration = Duration::from_secs(15);
const MQTT_TOPIC: &str = "site/sensor/temp";
const EDGE_TOPIC: &str = "mqtt";
/// The shared topic all shared-mode gateways write into.
const SHARED_TOPIC: &str = "tern.mqtt";
const STATUS_TOPIC: &str = "tern-status";

fn gateway_id(i: usize) -> String {
    format!("fleet-{i:02}")
}

fn shared(i: usize) -> bool {
    i >= FLEET / 2
}

/// The gateway's configuration: the defaults (one partition per topic), status records every
/// 2 s.
fn config(i: usize, bootstrap: &str) -> String {
    let brokers: Vec<String> = bootstrap.split(',').map(|b| format!("\"{b}\"")).collect();
    let mode = if shared(i) { "shared" } else { "mirror" };
    format!(
        "[[upstream]]\nbootstrap = [{}]\ngateway_id = \"{}\"\n\
         mode = \"{mode}\"\n\n[upstream.status]\ninterval = \"2s\"\n",
        brokers.join(", "),
        gateway_id(i)
    )
}

/// One gateway's sensor: publishes until `stop`, reconnecting after a failure; returns the
/// sequence numbers tern acknowledged.
fn sensor(gateway: std::net::SocketAddr, id: String, stop: Arc<AtomicBool>) -> Vec<u64> {
    let mut acked = Vec::new();
    let mut seq = 0u64;
    let mut client: Option<RawClient> = None;
    while !stop.load(Ordering::SeqCst) {
        if client.is_none() {
            client = RawClient::connect(gateway, &id, 30, true, false).ok();
        }
        if let Some(c) = client.as_mut() {
            let payload = format!("{id} {seq:06}").into_bytes();
            match c.publish_batch_qos1(MQTT_TOPIC, &[payload]) {
                Ok(indices) if !indices.is_empty() => acked.push(seq),
                Ok(_) => {}
                Err(_) => client = None,
            }
            seq += 1;
        }
        // The sensor's rate, not a wait for anything.
        std::thread::sleep(SENSOR_PERIOD);
    }
    acked
}

/// `name` summed over every sample of `gateway`, 0 when absent.
fn metric(gateway: &Gateway, name: &str) -> u64 {
    gateway.metric_sum(name, "").ok().flatten().unwrap_or(0)
}

/// (tern-gateway, tern-offset, value) of every record of `topic`/`partition`, read with kcat
/// from the beginning to the end.
fn read_kcat(
    bootstrap: &str,
    topic: &str,
    partition: u32,
    committed: bool,
) -> anyhow::Result<Vec<(String, u64, String)>> {
    let mut command = Command::new("kcat");
    command
        .args([
            "-b",
            bootstrap,
            "-C",
            "-t",
            topic,
            "-p",
            &partition.to_string(),
        ])
        .args(["-o", "beginning", "-e", "-q", "-f", "%h\t%s\n"]);
    if committed {
        command.args(["-X", "isolation.level=read_committed"]);
    }
    let output = command
        .stdin(Stdio::null())
        .output()
        .context("kcat (scripts/ensure-deps.sh installs it)")?;
    if !output.status.success() {
        bail!("kcat {topic}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let mut records = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let (headers, value) = line.split_once('\t').context("a kcat line")?;
        let header = |name: &str| {
            headers
                .split(',')
                .find_map(|h| h.strip_prefix(&format!("{name}=")))
                .map(str::to_owned)
        };
        let gateway = header("tern-gateway").with_context(|| format!("no gateway: {line}"))?;
        let offset = header("tern-offset")
            .with_context(|| format!("no offset: {line}"))?
            .parse()?;
        records.push((gateway, offset, value.to_owned()));
    }
    Ok(records)
}

/// Every record of gateway `id` is upstream once, edge offsets 0.. without a gap, its sensor's
/// sequence numbers increasing, every acknowledged one among them.
fn check_gateway(
    id: &str,
    upstream: &[(String, u64, String)],
    acked: &[u64],
) -> anyhow::Result<()> {
    let offsets: Vec<u64> = upstream.iter().map(|r| r.1).collect();
    let expected: Vec<u64> = (0..upstream.len() as u64).collect();
    if offsets != expected {
        bail!(
            "{id}: edge offsets upstream are not 0..{} once each in order",
            upstream.len()
        );
    }
    let seqs: Vec<u64> = upstream
        .iter()
        .map(|r| {
            r.2.rsplit(' ')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(u64::MAX)
        })
        .collect();
    if seqs.windows(2).any(|w| w[0] >= w[1]) {
        bail!("{id}: readings out of order or twice upstream");
    }
    let missing: Vec<&u64> = acked
        .iter()
        .filter(|s| seqs.binary_search(s).is_err())
        .collect();
    if !missing.is_empty() {
        bail!("{id}: acknowledged readings missing upstream: {missing:?}");
    }
    Ok(())
}

/// The most connections opened within any one second among `opened`.
fn peak_per_second(opened: &[Instant]) -> usize {
    let mut peak = 0;
    let mut start = 0;
    for (end, at) in opened.iter().enumerate() {
        while at.duration_since(opened[start]) >= Duration::from_secs(1) {
            start += 1;
        }
        peak = peak.max(end + 1 - start);
    }
    peak
}

/// (RSS in KiB, CPU seconds) of process `pid`.
fn usage(pid: u32) -> anyhow::Result<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    Ok((rss, ticks as f64 / hz as f64))
}

/// Every gateway's last status as `tern fleet status --json` reads it from the cluster.
fn fleet_status(bootstrap: &str) -> anyhow::Result<Vec<Value>> {
    let args = [
        "fleet",
        "status",
        "--kafka",
        bootstrap,
        "--topic",
        STATUS_TOPIC,
        "--json",
        "--silent-after",
        "30s",
    ];
    let (status, stdout, stderr) = run_tern(&args)?;
    if !status.success() {
        bail!("tern fleet status: {stderr}");
    }
    let rows: Value = serde_json::from_str(stdout.trim())?;
    Ok(rows.as_array().cloned().unwrap_or_default())
}

#[test]
fn a_fleet_rides_out_a_regional_outage_exactly_once_and_reports_ready_again() -> anyhow::Result<()>
{
    let cluster = KafkaCluster::start()?;
    let (direct, proxied) = (cluster.bootstrap(), cluster.proxied_bootstrap());
    let dirs: Vec<TempDir> = (0..FLEET)
        .map(|i| TempDir::new(&format!("fleet-{i}")))
        .collect::<anyhow::Result<_>>()?;
    let mut gateways = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let path = dir.path().join("tern.toml");
        std::fs::write(&path, config(i, &proxied))?;
        let options = ServeOptions {
            args: vec!["--config".to_owned(), path.display().to_string()],
            mqtt_listen: None,
        };
        gateways.push(Gateway::start(&dir.path().join("data"), &options)?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sensors: Vec<JoinHandle<Vec<u64>>> = gateways
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let (addr, id, stop) = (g.mqtt, gateway_id(i), Arc::clone(&stop));
            std::thread::spawn(move || sensor(addr, id, stop))
        })
        .collect();
    // Every gateway forwards and has reported ready.
    wait_until(Duration::from_secs(120), "every gateway forwarding", || {
        Ok(gateways
            .iter()
            .all(|g| metric(g, "tern_upstream_forwarded_records_total") > 0))
    })?;
    wait_until(
        Duration::from_secs(60),
        "every gateway's status ready",
        || {
            let rows = fleet_status(&direct).unwrap_or_default();
            Ok(rows.len() == FLEET && rows.iter().all(|r| r["status"]["ready"] == true))
        },
    )?;
    // The regional outage: every link cut at once; every gateway notices, keeps ingesting.
    let cut_at = Instant::now();
    cluster.cut_clients();
    wait_until(Duration::from_secs(60), "every gateway failing", || {
        Ok(gateways
            .iter()
            .all(|g| metric(g, "tern_upstream_failing") > 0))
    })?;
    // The outage's length is the scenario, not a wait for something to happen.
    std::thread::sleep(OUTAGE.saturating_sub(cut_at.elapsed()));
    let behind: u64 = gateways
        .iter()
        .map(|g| metric(g, "tern_upstream_records_behind"))
        .sum();
    let restored = Instant::now();
    cluster.restore_clients();
    // When each gateway first had nothing behind and nothing failing after the return.
    let mut caught_up: Vec<Option<Duration>> = vec![None; FLEET];
    wait_until(Duration::from_secs(180), "every backlog drained", || {
        for (i, g) in gateways.iter().enumerate() {
            if caught_up[i].is_none()
                && metric(g, "tern_upstream_records_behind") == 0
                && metric(g, "tern_upstream_failing") == 0
            {
                caught_up[i] = Some(restored.elapsed());
            }
        }
        Ok(caught_up.iter().all(Option::is_some))
    })?;
    let drained = restored.elapsed();
    // What held the last gateway back, from its own log: its warnings, and how many times the
    // coordinator told it to retry.
    let last = (0..FLEET).max_by_key(|i| caught_up[*i]).unwrap_or(0);
    let lines = gateways[last].stderr_lines();
    let warnings: Vec<&String> = lines.iter().filter(|l| l.contains("WARN")).collect();
    let retries = lines
        .iter()
        .filter(|l| l.contains("retrying a transactional"))
        .count();
    println!(
        "the last to catch up, {} ({:?}); {retries} transactional requests retried; its last warnings:\n{}",
        gateway_id(last),
        caught_up[last],
        warnings[warnings.len().saturating_sub(12)..]
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    stop.store(true, Ordering::SeqCst);
    let acked: Vec<Vec<u64>> = sensors
        .into_iter()
        .map(|s| {
            s.join()
                .map_err(|_| anyhow::anyhow!("a sensor thread panicked"))
        })
        .collect::<anyhow::Result<_>>()?;
    for (i, g) in gateways.iter_mut().enumerate() {
        g.wait_forwarded("", Duration::from_secs(120))
            .with_context(|| gateway_id(i))?;
    }
    // The brokers' view of the reconnects.
    let opened = cluster.client_connections_opened();
    let before: Vec<Instant> = opened.iter().copied().filter(|t| *t < cut_at).collect();
    let after: Vec<Instant> = opened.iter().copied().filter(|t| *t >= restored).collect();
    let usages: Vec<(u64, f64)> = gateways
        .iter()
        .filter_map(|g| g.pid())
        .map(usage)
        .collect::<anyhow::Result<_>>()?;
    // Exactly once, in order, nothing acknowledged missing.
    let mut shared_records: BTreeMap<String, Vec<(String, u64, String)>> = BTreeMap::new();
    // One partition: the shared topic takes the edge topic's partition count.
    for record in read_kcat(&direct, SHARED_TOPIC, 0, true)? {
        shared_records
            .entry(record.0.clone())
            .or_default()
            .push(record);
    }
    for (i, acked) in acked.iter().enumerate() {
        let id = gateway_id(i);
        let upstream = match shared(i) {
            true => shared_records.remove(&id).unwrap_or_default(),
            false => read_kcat(&direct, &format!("tern.{id}.{EDGE_TOPIC}"), 0, false)?,
        };
        check_gateway(&id, &upstream, acked)?;
    }
    // The status topic shows every gateway ready again.
    wait_until(
        Duration::from_secs(60),
        "every gateway's status ready again",
        || {
            let rows = fleet_status(&direct)?;
            let fresh = |r: &Value| {
                r["status"]["sent_ms"].as_i64().unwrap_or(0) > tern_tests::now_ms() - 10_000
            };
            Ok(rows.len() == FLEET
                && rows
                    .iter()
                    .all(|r| r["status"]["ready"] == true && fresh(r)))
        },
    )?;
    let spread = |mode: bool| {
        let mut times: Vec<Duration> = (0..FLEET)
            .filter(|i| shared(*i) == mode)
            .filter_map(|i| caught_up[i])
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
    let mut rss: Vec<u64> = usages.iter().map(|u| u.0).collect();
    rss.sort_unstable();
    let cpu: f64 = usages.iter().map(|u| u.1).sum();
    let records: usize = acked.iter().map(Vec::len).sum();
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
    for mut g in gateways {
        g.stop()?;
    }
    drop(dirs);
    Ok(())
}
