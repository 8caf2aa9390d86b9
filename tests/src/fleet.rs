//! A fleet of real `tern serve` processes on this machine, each with its own data directory and
//! configuration, forwarding into one [`KafkaCluster`] through its cuttable client proxies: the
//! 50-gateway test of the e2e suite and the system suite's fleet around a QEMU gateway.
//!
//! The first half of the fleet forwards in mirror mode, the rest in shared mode; each gateway has
//! one sensor that publishes a QoS 1 reading every sensor period and keeps the sequence numbers
//! tern acknowledged. [`Fleet::check_upstream`] reads Kafka with kcat (a real Kafka client;
//! shared mode `read_committed`) and checks every gateway's records exactly once and in edge
//! order.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::proxy::Answered;
use crate::raw_mqtt::RawClient;
use crate::{Gateway, KafkaCluster, ServeOptions, TempDir, run_tern, wait_until};

pub const MQTT_TOPIC: &str = "site/sensor/temp";
pub const EDGE_TOPIC: &str = "mqtt";
/// The shared topic all shared-mode gateways write into.
pub const SHARED_TOPIC: &str = "tern.mqtt";
pub const STATUS_TOPIC: &str = "tern-status";
/// A gateway has caught up once no record older than this waits for its upstream.
pub const CAUGHT_UP_AGE: Duration = Duration::from_secs(2);
/// How often every gateway of a fleet test sends its status record.
pub const STATUS_INTERVAL: &str = "2s";

/// The `[upstream.status]` section of a fleet test's gateways.
pub fn status_section() -> String {
    format!("[upstream.status]\ninterval = \"{STATUS_INTERVAL}\"\n")
}

/// Host gateways with their sensors; dropping it stops them (by PID).
#[derive(Debug)]
pub struct Fleet {
    /// The gateways, in the order of [`Fleet::id`].
    pub gateways: Vec<Gateway>,
    ids: Vec<String>,
    stop: Arc<AtomicBool>,
    sensors: Vec<JoinHandle<Vec<u64>>>,
    // Last: the data directories outlive the processes using them.
    _dirs: Vec<TempDir>,
}

impl Fleet {
    /// Starts `size` gateways named `{prefix}-NN` forwarding to `cluster`'s proxied bootstrap
    /// (the defaults: one partition per topic; status records every [`STATUS_INTERVAL`]), and
    /// one sensor each publishing every `sensor_period`.
    pub fn start(
        cluster: &KafkaCluster,
        prefix: &str,
        size: usize,
        sensor_period: Duration,
    ) -> anyhow::Result<Self> {
        let bootstrap: Vec<String> = cluster
            .proxied_bootstrap()
            .split(',')
            .map(|b| format!("\"{b}\""))
            .collect();
        let ids: Vec<String> = (0..size).map(|i| format!("{prefix}-{i:02}")).collect();
        let mut dirs = Vec::new();
        let mut gateways = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let dir = TempDir::new(id)?;
            let mode = if i >= size / 2 { "shared" } else { "mirror" };
            let path = dir.path().join("tern.toml");
            std::fs::write(
                &path,
                format!(
                    "[[upstream]]\nbootstrap = [{}]\ngateway_id = \"{id}\"\nmode = \"{mode}\"\n\n{}",
                    bootstrap.join(", "),
                    status_section()
                ),
            )?;
            let options = ServeOptions {
                args: vec!["--config".to_owned(), path.display().to_string()],
                mqtt_listen: None,
            };
            gateways.push(Gateway::start(&dir.path().join("data"), &options)?);
            dirs.push(dir);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let sensors = gateways
            .iter()
            .zip(&ids)
            .map(|(g, id)| {
                let (addr, id, stop) = (g.mqtt, id.clone(), Arc::clone(&stop));
                std::thread::spawn(move || sensor(addr, &id, sensor_period, &stop))
            })
            .collect();
        Ok(Self {
            gateways,
            ids,
            stop,
            sensors,
            _dirs: dirs,
        })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Gateway `i`'s id.
    pub fn id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// Whether gateway `i` forwards in shared mode.
    pub fn is_shared(&self, i: usize) -> bool {
        i >= self.len() / 2
    }

    /// `name` of gateway `i` summed over its samples, 0 when absent.
    pub fn metric(&self, i: usize, name: &str) -> u64 {
        self.gateways[i]
            .metric_sum(name, "")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Waits until every gateway has forwarded a record.
    pub fn wait_forwarding(&self, timeout: Duration) -> anyhow::Result<()> {
        wait_until(timeout, "every gateway forwarding", || {
            Ok(
                (0..self.len())
                    .all(|i| self.metric(i, "tern_upstream_forwarded_records_total") > 0),
            )
        })
    }

    /// Waits until every gateway reports its upstream failing (the link is cut).
    pub fn wait_failing(&self, timeout: Duration) -> anyhow::Result<()> {
        wait_until(timeout, "every gateway failing", || {
            Ok((0..self.len()).all(|i| self.metric(i, "tern_upstream_failing") > 0))
        })
    }

    /// Records behind upstream, the whole fleet's.
    pub fn records_behind(&self) -> u64 {
        (0..self.len())
            .map(|i| self.metric(i, "tern_upstream_records_behind"))
            .sum()
    }

    /// Whether gateway `i` has caught up: its upstream not failing, and nothing behind or
    /// nothing older than [`CAUGHT_UP_AGE`] (one scrape of its `/metrics`). The age, not
    /// "nothing behind", because a shared-mode gateway at sensor rates has a reading in its
    /// open transaction most of the time, while an outage's backlog is as old as the outage.
    pub fn caught_up(&self, i: usize) -> anyhow::Result<bool> {
        let (status, body) = self.gateways[i].admin_get("/metrics")?;
        if status != 200 {
            bail!("{}: /metrics answered {status}", self.id(i));
        }
        // Every sample of `name` (bare or labelled) in the text exposition.
        let samples = |name: &'static str| {
            body.lines()
                .filter_map(move |l| l.strip_prefix(name))
                .filter(|rest| rest.starts_with(['{', ' ']))
                .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        };
        let sum = |name| samples(name).sum::<f64>();
        let oldest = samples("tern_upstream_backlog_age_seconds").fold(0.0, f64::max);
        Ok(sum("tern_upstream_failing") == 0.0
            && (sum("tern_upstream_records_behind") == 0.0 || oldest < CAUGHT_UP_AGE.as_secs_f64()))
    }

    /// Waits until every gateway has [caught up](Fleet::caught_up); returns when each got
    /// there, measured from `since`.
    pub fn wait_drained(&self, since: Instant, timeout: Duration) -> anyhow::Result<Vec<Duration>> {
        Ok(self.wait_drained_with(since, timeout, || Ok(true))?.0)
    }

    /// [`Fleet::wait_drained`] that also waits, in the same polls, until `other` (a gateway
    /// outside the fleet) says it caught up; returns when it did too.
    pub fn wait_drained_with(
        &self,
        since: Instant,
        timeout: Duration,
        mut other: impl FnMut() -> anyhow::Result<bool>,
    ) -> anyhow::Result<(Vec<Duration>, Duration)> {
        let mut caught_up: Vec<Option<Duration>> = vec![None; self.len()];
        let mut other_at = None;
        wait_until(timeout, "every backlog drained", || {
            for (i, at) in caught_up.iter_mut().enumerate() {
                if at.is_none() && self.caught_up(i)? {
                    *at = Some(since.elapsed());
                }
            }
            if other_at.is_none() && other()? {
                other_at = Some(since.elapsed());
            }
            Ok(other_at.is_some() && caught_up.iter().all(Option::is_some))
        })?;
        let other_at = other_at.unwrap_or_default();
        Ok((caught_up.into_iter().flatten().collect(), other_at))
    }

    /// Gateway `i`'s last `count` warnings and how many transactional requests it retried:
    /// what held it back.
    pub fn warnings(&mut self, i: usize, count: usize) -> (usize, String) {
        let lines = self.gateways[i].stderr_lines();
        let retries = lines
            .iter()
            .filter(|l| l.contains("retrying a transactional"))
            .count();
        let warnings: Vec<&str> = lines
            .iter()
            .filter(|l| l.contains("WARN"))
            .map(String::as_str)
            .collect();
        (
            retries,
            warnings[warnings.len().saturating_sub(count)..].join("\n"),
        )
    }

    /// Stops every sensor; returns each gateway's acknowledged sequence numbers.
    pub fn stop_sensors(&mut self) -> anyhow::Result<Vec<Vec<u64>>> {
        self.stop.store(true, Ordering::SeqCst);
        self.sensors
            .drain(..)
            .map(|s| {
                s.join()
                    .map_err(|_| anyhow::anyhow!("a sensor thread panicked"))
            })
            .collect()
    }

    /// Waits until every gateway has forwarded everything it stored.
    pub fn wait_forwarded(&mut self, timeout: Duration) -> anyhow::Result<()> {
        for (gateway, id) in self.gateways.iter_mut().zip(&self.ids) {
            gateway
                .wait_forwarded("", timeout)
                .with_context(|| id.clone())?;
        }
        Ok(())
    }

    /// (RSS in KiB, CPU seconds) of every gateway.
    pub fn usages(&self) -> anyhow::Result<Vec<(u64, f64)>> {
        self.gateways
            .iter()
            .filter_map(Gateway::pid)
            .map(usage)
            .collect()
    }

    /// Every acknowledged reading of every gateway is upstream exactly once and in edge order
    /// (`acked` from [`Fleet::stop_sensors`]), read from `bootstrap` (direct, not proxied);
    /// returns how many acknowledged readings were checked.
    pub fn check_upstream(&self, bootstrap: &str, acked: &[Vec<u64>]) -> anyhow::Result<usize> {
        let mut shared: BTreeMap<String, Vec<Upstream>> = BTreeMap::new();
        if (0..self.len()).any(|i| self.is_shared(i)) {
            // One partition: the shared topic takes the edge topic's partition count.
            for record in read_kcat(bootstrap, SHARED_TOPIC, 0, true)? {
                shared
                    .entry(record.gateway.clone())
                    .or_default()
                    .push(record);
            }
        }
        for (i, acked) in acked.iter().enumerate() {
            let id = self.id(i);
            let upstream = match self.is_shared(i) {
                true => shared.remove(id).unwrap_or_default(),
                false => read_kcat(bootstrap, &format!("tern.{id}.{EDGE_TOPIC}"), 0, false)?,
            };
            check_gateway(id, &upstream, acked)?;
        }
        Ok(acked.iter().map(Vec::len).sum())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One gateway's sensor: publishes `"{id} {seq:06}"` until `stop`, reconnecting after a failure;
/// returns the sequence numbers tern acknowledged.
fn sensor(gateway: SocketAddr, id: &str, period: Duration, stop: &AtomicBool) -> Vec<u64> {
    let mut acked = Vec::new();
    let mut seq = 0u64;
    let mut client: Option<RawClient> = None;
    while !stop.load(Ordering::SeqCst) {
        if client.is_none() {
            client = RawClient::connect(gateway, id, 30, true, false).ok();
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
        std::thread::sleep(period);
    }
    acked
}

/// One record upstream as the fleet checks read it.
#[derive(Debug, Clone)]
struct Upstream {
    gateway: String,
    offset: u64,
    value: String,
}

/// Every record of `topic`/`partition` (its `tern-gateway` and `tern-offset` headers and its
/// value), read with kcat from the beginning to the end.
fn read_kcat(
    bootstrap: &str,
    topic: &str,
    partition: u32,
    committed: bool,
) -> anyhow::Result<Vec<Upstream>> {
    let mut command = Command::new("kcat");
    command
        .args(["-b", bootstrap, "-C", "-t", topic])
        .args(["-p", &partition.to_string()])
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
        records.push(Upstream {
            gateway: header("tern-gateway").with_context(|| format!("no gateway: {line}"))?,
            offset: header("tern-offset")
                .with_context(|| format!("no offset: {line}"))?
                .parse()?,
            value: value.to_owned(),
        });
    }
    Ok(records)
}

/// Every record of gateway `id` is upstream once, edge offsets 0.. without a gap, its sensor's
/// sequence numbers increasing, every acknowledged one among them.
fn check_gateway(id: &str, upstream: &[Upstream], acked: &[u64]) -> anyhow::Result<()> {
    if !upstream
        .iter()
        .enumerate()
        .all(|(i, r)| r.offset == i as u64)
    {
        bail!(
            "{id}: edge offsets upstream are not 0..{} once each in order",
            upstream.len()
        );
    }
    let seqs: Vec<u64> = upstream
        .iter()
        .map(|r| {
            r.value
                .rsplit(' ')
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

/// The most instants within any one second among `opened` (sorted).
pub fn peak_per_second(opened: &[Instant]) -> usize {
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

/// The brokers' answers after `since` per request type (the ones a gateway sends), as
/// `name count p99 max`, the slowest maximum first: what the gateways waited for the brokers.
pub fn request_latencies(answered: &[Answered], since: Instant) -> String {
    const NAMES: [(i16, &str); 9] = [
        (0, "Produce"),
        (3, "Metadata"),
        (9, "OffsetFetch"),
        (10, "FindCoordinator"),
        (19, "CreateTopics"),
        (22, "InitProducerId"),
        (24, "AddPartitionsToTxn"),
        (26, "EndTxn"),
        (28, "TxnOffsetCommit"),
    ];
    let mut rows: Vec<(Duration, String)> = NAMES
        .iter()
        .filter_map(|&(key, name)| {
            let mut latencies: Vec<Duration> = answered
                .iter()
                .filter(|a| a.api_key == key && a.at >= since)
                .map(|a| a.latency)
                .collect();
            latencies.sort();
            let max = *latencies.last()?;
            let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
            Some((
                max,
                format!("{name} {} p99 {p99:.0?} max {max:.0?}", latencies.len()),
            ))
        })
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.0));
    rows.into_iter()
        .map(|(_, row)| row)
        .collect::<Vec<_>>()
        .join("; ")
}

/// (RSS in KiB, CPU seconds) of process `pid`.
pub fn usage(pid: u32) -> anyhow::Result<(u64, f64)> {
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

/// Every gateway's last status as `tern fleet status --json` reads it from `bootstrap`.
pub fn fleet_status(bootstrap: &str) -> anyhow::Result<Vec<Value>> {
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

/// Waits until the status topic holds a ready status of every gateway in `ids` (others may be
/// there too), each sent after `sent_after_ms` (Unix milliseconds) when given.
pub fn wait_all_ready(
    bootstrap: &str,
    ids: &[String],
    sent_after_ms: Option<i64>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let mut last = String::new();
    wait_until(timeout, "every gateway's status ready", || {
        let rows = fleet_status(bootstrap)?;
        let ready: Vec<&str> = rows
            .iter()
            .filter(|r| r["status"]["ready"] == true)
            .filter(|r| {
                sent_after_ms.is_none_or(|after| r["status"]["sent_ms"].as_i64() > Some(after))
            })
            .filter_map(|r| r["gateway"].as_str())
            .collect();
        last = format!("{} statuses, ready and fresh: {ready:?}", rows.len());
        Ok(ids.iter().all(|id| ready.contains(&id.as_str())))
    })
    .with_context(|| last.clone())
}
