//! The downstream against the real three-broker cluster: commands produced with kcat to one
//! fleet topic for two gateways (their records interleaved, plus `*` and `group:` addresses and
//! one the ACL refuses) reach each real `tern serve` through its link proxy while the link is
//! cut, gateway A is SIGKILLed and restarted, and a command partition's leader dies. Checked
//! afterwards: A's edge log holds every command addressed to it exactly once and in source
//! order, none of B's; A's persistent-session devices (`mosquitto_sub -c`), offline throughout,
//! receive every
//! unexpired command once they connect, and not the one whose MQTT expiry passed; B's online
//! device receives its commands live; every command's stored copy reached the datacenter once
//! (mirror mode's `ds.gw-a.commands`), with its outcomes (`delivered` by each device,
//! `expired` for each offline one and `no-subscriber` for the command that expired unreceived);
//! the group `ds.gw-a.commands` shows no lag. B also serves an MQTT 5 device at QoS 2 that
//! answers a request/response command, a `$share` subscriber and a command nobody hears
//! (`downstream/devices.rs`).
//!
//! The negative control runs the downstream in this process on a simulated disk (`FaultyFs`):
//! with the group offset committed before the local append, a power cut after the commit loses
//! the fetched commands and the checker says so; the product, cut at the same point, loses
//! nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_core::fs::{CrashMode, FaultyFs, Fs};
use tern_log::{Log, LogConfig};
use tern_tests::commands::{Cmd, produce};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{
    DumpedRecord, Gateway, KafkaCluster, ServeOptions, TempDir, free_port, read_log, wait_until,
};
use tern_upstream::{Ablation, CommandsConfig, StatusMap, UpstreamConfig};

mod devices;

/// The fleet's command topic in this test.
const COMMANDS: &str = "ds-commands";
const PREFIX: &str = "ds.";
const LOG_TOPIC: &str = "commands";
const STORED: &str = "tern_downstream_commands_total";
/// Gateway A's devices (`mosquitto_sub -c`, persistent sessions): client id and filter. They
/// subscribe once and stay offline until the end.
const A_DEVICES: [(&str, &str); 2] = [("a1", "devices/+/cmd"), ("a2", "devices/a2/cmd")];

fn start_gateway(
    dir: &TempDir,
    id: &str,
    groups: &[&str],
    bootstrap: &str,
    mqtt: SocketAddr,
) -> anyhow::Result<Gateway> {
    let bootstrap: Vec<String> = bootstrap.split(',').map(|b| format!("{b:?}")).collect();
    let groups: Vec<String> = groups.iter().map(|g| format!("{g:?}")).collect();
    let toml = format!(
        "[[upstream]]\nbootstrap = [{}]\ngateway_id = \"{id}\"\ntopic_prefix = \"{PREFIX}\"\n\
         topics = [\"{LOG_TOPIC}\", \"mqtt\"]\ncatch_up_settle = \"100ms\"\n\
         [upstream.commands]\ntopic = \"{COMMANDS}\"\ngroups = [{}]\n\
         allow = [\"devices/+/cmd\"]\nmax_wait = \"200ms\"\n",
        bootstrap.join(", "),
        groups.join(", ")
    );
    let config = dir.path().join("tern.toml");
    std::fs::write(&config, toml)?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        mqtt_listen: Some(mqtt),
    };
    Gateway::start(dir.path(), &options)
}

/// Waits until `gateway` has stored `count` commands since it started.
fn wait_stored(gateway: &mut Gateway, count: u64, what: &str) -> anyhow::Result<()> {
    gateway.wait_metric(STORED, "", what, Duration::from_secs(90), |n| {
        n.unwrap_or(0) >= count
    })
}

/// The end offsets of the command topic's partitions, summed.
fn command_end(cluster: &KafkaCluster) -> anyhow::Result<u64> {
    let mut total = 0;
    for partition in 0..3 {
        total += cluster.end_offset(COMMANDS, partition)?;
    }
    Ok(total)
}

/// Waits until `gateway`'s next offsets on the command partitions add up to `end`: it has read
/// (stored or skipped) every command produced so far.
fn wait_read(gateway: &mut Gateway, end: u64, what: &str) -> anyhow::Result<()> {
    let name = "tern_downstream_next_offset";
    gateway.wait_metric(name, "", what, Duration::from_secs(120), |n| n == Some(end))
}

/// The commands' values in a gateway's edge log, checked: each at most once, in source order
/// per command partition. Position and outcome records are skipped; refused commands included.
fn stored_values(records: &[DumpedRecord]) -> Result<Vec<String>, String> {
    let mut values = Vec::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for record in records {
        let id = record.header("tern-command");
        if id.is_empty() || !record.header("tern-outcome").is_empty() {
            continue;
        }
        let (partition, offset) = id
            .rsplit_once('/')
            .and_then(|(rest, offset)| Some((rest.to_owned(), offset.parse::<u64>().ok()?)))
            .ok_or_else(|| format!("bad tern-command {id:?}"))?;
        if last.get(&partition).is_some_and(|prev| *prev >= offset) {
            return Err(format!(
                "{id} stored after offset {:?}: out of order or twice",
                last[&partition]
            ));
        }
        last.insert(partition, offset);
        values.push(record.value.clone());
    }
    let unique: BTreeSet<&String> = values.iter().collect();
    if unique.len() != values.len() {
        return Err(format!("a command stored twice: {values:?}"));
    }
    Ok(values)
}

/// Exactly `expected`, each once, and nothing else.
fn check_exactly(stored: &[String], expected: &BTreeSet<String>) -> Result<(), String> {
    let got: BTreeSet<String> = stored.iter().cloned().collect();
    let missing: Vec<&String> = expected.difference(&got).collect();
    let extra: Vec<&String> = got.difference(expected).collect();
    if !missing.is_empty() || !extra.is_empty() || got.len() != stored.len() {
        return Err(format!(
            "{} stored, missing {missing:?}, not addressed here {extra:?}",
            stored.len()
        ));
    }
    Ok(())
}

/// Checks the outcome records upstream: every command in `delivered` acknowledged by device
/// `a1` (and the ones for `a2` by it), the expiring one expired and never delivered, no refused
/// one delivered.
fn check_outcomes(
    records: &[tern_tests::kafka_tools::ConsumedRecord],
    delivered: &BTreeSet<String>,
    refused: &BTreeSet<String>,
) -> Result<(), String> {
    let outcomes = devices::outcomes(records);
    let has = |value: &str, kind: &str, client: &str| {
        outcomes
            .get(value)
            .is_some_and(|o| o.iter().any(|(k, c, _)| k == kind && c == client))
    };
    for value in delivered {
        if !has(value, "delivered", "a1") {
            return Err(format!("no `delivered` outcome from a1 for {value}"));
        }
    }
    for value in ["r1-site-1", "r1-a2-lasting"] {
        if !has(value, "delivered", "a2") {
            return Err(format!("no `delivered` outcome from a2 for {value}"));
        }
    }
    let expired = ["a1", "a2"].map(|c| has("r1-expiring", "expired", c));
    if expired.contains(&false) || !has("r1-expiring", "no-subscriber", "") {
        return Err(format!("r1-expiring: {:?}", outcomes.get("r1-expiring")));
    }
    for value in refused.iter().map(String::as_str).chain(["r1-expiring"]) {
        if outcomes
            .get(value)
            .is_some_and(|o| o.iter().any(|(k, _, _)| k == "delivered"))
        {
            return Err(format!("{value} delivered: {:?}", outcomes.get(value)));
        }
    }
    Ok(())
}

/// Reads publishes from `client` until every value in `want` arrived (duplicates allowed, QoS
/// 1); returns everything received.
fn receive_all(client: &mut RawClient, want: &BTreeSet<String>) -> anyhow::Result<Vec<String>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !want.iter().all(|w| got.contains(w)) {
        if Instant::now() > deadline {
            bail!("received {got:?}, still waiting for some of {want:?}");
        }
        let publish = client.next_publish()?;
        got.push(String::from_utf8_lossy(&publish.payload).into_owned());
    }
    Ok(got)
}

/// `n` commands for each gateway's device, interleaved, tagged `tag`; their values are added
/// to what each gateway must store.
fn round(
    n: usize,
    tag: &str,
    for_a: &mut BTreeSet<String>,
    for_b: &mut BTreeSet<String>,
) -> Vec<Cmd> {
    let mut commands = Vec::new();
    for i in 0..n {
        let a = Cmd::new("gw-a", "devices/a1/cmd", format!("{tag}-a1-{i}"));
        let b = Cmd::new("gw-b", "devices/b1/cmd", format!("{tag}-b1-{i}"));
        for_a.insert(a.value.clone());
        for_b.insert(b.value.clone());
        commands.extend([a, b]);
    }
    commands
}

/// Runs the downstream suite on `cluster` (the caller's, which this suite faults: a link cut
/// and a killed broker that is restarted).
pub(super) fn commands_reach_devices_exactly_once_on(
    cluster: &mut KafkaCluster,
) -> anyhow::Result<()> {
    cluster.create_topic(COMMANDS, 3, 3)?;
    let direct = cluster.bootstrap();
    let proxied = cluster.proxied_bootstrap();
    let (dir_a, dir_b) = (TempDir::new("downstream-a")?, TempDir::new("downstream-b")?);
    let mqtt_a = free_port()?;
    let mut a = start_gateway(&dir_a, "gw-a", &["site-1"], &proxied, mqtt_a)?;
    let mut b = start_gateway(&dir_b, "gw-b", &[], &proxied, free_port()?)?;

    // A's devices subscribe once and go offline; B's device stays online.
    for (id, filter) in A_DEVICES {
        devices::subscribe_and_leave(a.mqtt, id, filter)?;
    }
    let mut b1 = RawClient::connect(b.mqtt, "b1", 60, false, false)?;
    b1.subscribe("devices/b1/cmd", 1, 1)?;
    let mut b5 = devices::Mqtt5Device::subscribe(b.mqtt)?;
    let mut b2 = devices::shared_subscriber(b.mqtt)?;

    let mut for_a = BTreeSet::new();
    let mut for_b = BTreeSet::new();
    let mut refused = BTreeSet::new();

    // Round 1: both gateways, every address, one command the ACL refuses and one that
    // expires while its device is offline.
    let mut first = round(10, "r1", &mut for_a, &mut for_b);
    let everyone = Cmd::new("*", "devices/all/cmd", "r1-everyone".to_owned());
    let site = Cmd::new("group:site-1", "devices/a2/cmd", "r1-site-1".to_owned());
    let other_site = Cmd::new("group:site-2", "devices/a2/cmd", "r1-site-2".to_owned());
    let forbidden = Cmd::new("gw-a", "valves/1/open", "r1-forbidden".to_owned());
    let mut expiring = Cmd::new("gw-a", "devices/a2/cmd", "r1-expiring".to_owned());
    expiring
        .headers
        .push(("mqtt.message_expiry", "1".to_owned()));
    let lasting = Cmd::new("gw-a", "devices/a2/cmd", "r1-a2-lasting".to_owned());
    for c in [&everyone, &site, &forbidden, &expiring, &lasting] {
        for_a.insert(c.value.clone());
    }
    for_b.insert(everyone.value.clone());
    refused.insert(forbidden.value.clone());
    first.extend([everyone, site, other_site, forbidden, expiring, lasting]);
    for c in devices::commands() {
        for_b.insert(c.value.clone());
        first.push(c);
    }
    produce(&direct, COMMANDS, &first)?;
    let expired_at = Instant::now();
    wait_stored(&mut a, for_a.len() as u64, "round 1 on A")?;
    wait_stored(&mut b, for_b.len() as u64, "round 1 on B")?;
    b5.answer(b.mqtt)?;
    receive_all(&mut b2, &[devices::SHARED.to_owned()].into())?;

    // Round 2: A is SIGKILLed once it has stored some of it, and restarted.
    let before = a.metric_sum(STORED, "")?.unwrap_or(0);
    produce(&direct, COMMANDS, &round(30, "r2", &mut for_a, &mut for_b))?;
    a.wait_metric(
        STORED,
        "",
        "round 2 begun on A",
        Duration::from_secs(60),
        |n| n.unwrap_or(0) > before,
    )?;
    a.signal(libc::SIGKILL)?;
    a.wait_exit(Duration::from_secs(10))?;
    a = start_gateway(&dir_a, "gw-a", &["site-1"], &proxied, mqtt_a)?;
    wait_read(
        &mut a,
        command_end(cluster)?,
        "A to read every command of round 2",
    )?;

    // Round 3: produced while the gateways' link is cut.
    cluster.cut_clients();
    a.wait_metric(
        "tern_downstream_connected",
        "",
        "the cut noticed",
        Duration::from_secs(30),
        |n| n.unwrap_or(3) < 3,
    )?;
    produce(&direct, COMMANDS, &round(10, "r3", &mut for_a, &mut for_b))?;
    cluster.restore_clients();

    // Round 4: the leader of a command partition dies.
    let leader = cluster.leader(COMMANDS, 0)?;
    cluster.kill_broker(leader)?;
    produce(&direct, COMMANDS, &round(10, "r4", &mut for_a, &mut for_b))?;
    let total_a = for_a.len() as u64;
    let end = command_end(cluster)?;
    wait_read(&mut a, end, "A to read every command")?;
    wait_read(&mut b, end, "B to read every command")?;
    wait_stored(&mut b, for_b.len() as u64, "every command on B")?;
    cluster.restart_broker(leader)?;

    // B's online device got its commands live.
    let b_devices: BTreeSet<String> = for_b
        .iter()
        .filter(|v| v.contains("-b1-"))
        .cloned()
        .collect();
    receive_all(&mut b1, &b_devices)?;

    // A's offline devices connect now, after the expiry passed.
    let since = expired_at.elapsed();
    if since < Duration::from_secs(2) {
        // The expiry under test is time on the gateway's clock: it has to pass.
        std::thread::sleep(Duration::from_secs(2) - since);
    }
    let delivered: BTreeSet<String> = for_a
        .iter()
        .filter(|v| !refused.contains(*v) && *v != "r1-expiring")
        .cloned()
        .collect();
    let a2_want: BTreeSet<String> = ["r1-site-1", "r1-a2-lasting"].map(str::to_owned).into();
    for ((id, filter), want) in A_DEVICES.into_iter().zip([&delivered, &a2_want]) {
        let got = devices::come_back(a.mqtt, id, filter, want)?;
        assert!(
            !got.iter().any(|v| v == "r1-expiring"),
            "{id}: the expired command was delivered: {got:?}"
        );
    }

    // The stored copies reached the datacenter once each (mirror mode).
    a.wait_forwarded(&format!("topic=\"{LOG_TOPIC}\""), Duration::from_secs(60))?;
    let upstream = cluster.consume_all(&format!("{PREFIX}gw-a.{LOG_TOPIC}"), 0)?;
    let mut ids = BTreeSet::new();
    let commands = upstream
        .iter()
        .filter(|r| r.header("tern-command").is_some() && r.header("tern-outcome").is_none());
    for record in commands {
        let id = record.header("tern-command").unwrap_or_default().to_owned();
        assert!(ids.insert(id.clone()), "{id} reached the datacenter twice");
        assert_eq!(
            record.header("tern-refused").is_some(),
            refused.contains(&record.value),
            "{id}: {record:?}"
        );
    }
    assert_eq!(ids.len() as u64, total_a, "stored copies upstream");

    // The devices' acknowledgements and the expiry reached the datacenter as outcomes.
    let upstream_topic = format!("{PREFIX}gw-a.{LOG_TOPIC}");
    let mut last = String::new();
    wait_until(Duration::from_secs(120), "every outcome upstream", || {
        let records = cluster.consume_all(&upstream_topic, 0)?;
        let verdict = check_outcomes(&records, &delivered, &refused);
        last = format!("{verdict:?}");
        Ok(verdict.is_ok())
    })
    .with_context(|| last.clone())?;

    // B's devices: the MQTT 5 request answered, the $share delivery, the unheard command.
    b.wait_forwarded("", Duration::from_secs(60))?;
    let b_commands = format!("{PREFIX}gw-b.{LOG_TOPIC}");
    wait_until(Duration::from_secs(60), "B's outcomes upstream", || {
        let records = cluster.consume_all(&b_commands, 0)?;
        let verdict = devices::check_outcomes(&records);
        last = format!("{verdict:?}");
        Ok(verdict.is_ok())
    })
    .with_context(|| last.clone())?;
    let b_mqtt = format!("{PREFIX}gw-b.mqtt");
    let mut replies = Vec::new();
    for partition in 0..cluster.describe_topic(&b_mqtt)?.len() as u32 {
        replies.extend(cluster.consume_all(&b_mqtt, partition)?);
    }
    devices::check_reply(&replies).map_err(anyhow::Error::msg)?;
    b5.received_exactly_once()?;

    // The group shows no lag.
    for row in cluster.group_offsets(&format!("{PREFIX}gw-a.commands"))? {
        let end = cluster.end_offset(COMMANDS, row.partition)?;
        assert_eq!(row.offset, Some(end), "group lag on {row:?}");
    }

    a.stop()?;
    b.stop()?;
    let stored_a =
        stored_values(&read_log(dir_a.path(), LOG_TOPIC)?).map_err(anyhow::Error::msg)?;
    check_exactly(&stored_a, &for_a).map_err(|e| anyhow::anyhow!("gateway A: {e}"))?;
    let stored_b =
        stored_values(&read_log(dir_b.path(), LOG_TOPIC)?).map_err(anyhow::Error::msg)?;
    check_exactly(&stored_b, &for_b).map_err(|e| anyhow::anyhow!("gateway B: {e}"))?;
    println!(
        "downstream: A stored {} commands ({} refused), B {}, each once, across a SIGKILL, a link cut and a leader failover",
        stored_a.len(),
        refused.len(),
        stored_b.len()
    );
    a_power_cut_between_fetch_and_append_loses_nothing_and_the_control_does(cluster)
}

/// The topic and gateway of the in-process runs.
const CUT_TOPIC: &str = "ds-cut-commands";
const CUT_COMMANDS: usize = 5;

/// The product and the negative control, each cut at the same point: after a fetch, while its
/// append waits for its sync.
fn a_power_cut_between_fetch_and_append_loses_nothing_and_the_control_does(
    cluster: &KafkaCluster,
) -> anyhow::Result<()> {
    cluster.create_topic(CUT_TOPIC, 1, 3)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let product = runtime.block_on(cut_run(cluster, "gw-product", Ablation::NONE))?;
    let expected: BTreeSet<String> = (0..CUT_COMMANDS)
        .map(|i| format!("gw-product-{i}"))
        .collect();
    check_exactly(&product, &expected)
        .map_err(|e| anyhow::anyhow!("the product lost commands to a power cut: {e}"))?;
    let ablation = Ablation {
        commit_before_append: true,
        ..Ablation::NONE
    };
    let control = runtime.block_on(cut_run(cluster, "gw-control", ablation))?;
    let expected: BTreeSet<String> = (0..CUT_COMMANDS)
        .map(|i| format!("gw-control-{i}"))
        .collect();
    let verdict = check_exactly(&control, &expected);
    println!("downstream negative control (group offset committed before the append): {verdict:?}");
    if verdict.is_ok() {
        bail!("the negative control lost nothing: the checker cannot see a loss");
    }
    Ok(())
}

fn cut_config(cluster: &KafkaCluster, gateway: &str) -> UpstreamConfig {
    UpstreamConfig {
        bootstrap: cluster.bootstrap().split(',').map(str::to_owned).collect(),
        gateway_id: Some(gateway.to_owned()),
        topic_prefix: "ds-cut.".to_owned(),
        commands: Some(CommandsConfig {
            topic: CUT_TOPIC.to_owned(),
            allow: vec!["devices/#".to_owned()],
            max_wait: tern_core::HumanDuration(Duration::from_millis(200)),
            ..CommandsConfig::default()
        }),
        ..UpstreamConfig::default()
    }
}

/// One partition's status in `status`, if the downstream reported one.
fn partition_status(status: &StatusMap) -> Option<tern_upstream::PartitionStatus> {
    let map = status.lock().unwrap_or_else(|e| e.into_inner());
    map.get(&(CUT_TOPIC.to_owned(), 0)).cloned()
}

/// Starts the downstream of `gateway` on a simulated disk, produces its commands, cuts the
/// power once a fetch's append is waiting for its sync (and, for the control, once the group
/// offset covers the commands), reboots and reads on; returns the commands' values in the log.
async fn cut_run(
    cluster: &KafkaCluster,
    gateway: &str,
    ablation: Ablation,
) -> anyhow::Result<Vec<String>> {
    let fs = Arc::new(FaultyFs::new(7));
    let dir = Path::new("/data/log");
    let config = cut_config(cluster, gateway);
    let log = Log::open_with_fs(fs.clone() as Arc<dyn Fs>, dir, &LogConfig::default()).await?;
    let status = StatusMap::default();
    let (trigger, shutdown) = tern_core::shutdown::channel();
    let task = tokio::spawn(tern_upstream::downstream::run_ablated(
        config.clone(),
        ablation,
        gateway.to_owned(),
        log.clone(),
        status.clone(),
        shutdown,
    ));
    wait_async("the downstream connected", || {
        partition_status(&status).is_some_and(|s| s.connected)
    })
    .await?;
    fs.hold_syncs(true);
    let commands: Vec<Cmd> = (0..CUT_COMMANDS)
        .map(|i| Cmd::new(gateway, "devices/1/cmd", format!("{gateway}-{i}")))
        .collect();
    let bootstrap = cluster.bootstrap();
    tokio::task::spawn_blocking(move || produce(&bootstrap, CUT_TOPIC, &commands)).await??;
    wait_async(
        "the commands fetched and their append waiting for its sync",
        || {
            let fetched = partition_status(&status)
                .is_some_and(|s| s.upstream_end >= Some(CUT_COMMANDS as u64));
            fetched && fs.syncs_running() > 0
        },
    )
    .await?;
    if ablation.commit_before_append {
        let group = format!("ds-cut.{gateway}.commands");
        let covered = || -> anyhow::Result<bool> {
            let offsets = cluster.group_offsets(&group)?;
            Ok(offsets
                .iter()
                .any(|r| r.offset >= Some(CUT_COMMANDS as u64)))
        };
        // The tool is a JVM run: off the runtime's worker, polled by the suites' one wait.
        tokio::task::block_in_place(|| {
            wait_until(
                Duration::from_secs(60),
                "the control's group offset",
                || Ok(covered().unwrap_or(false)),
            )
        })?;
    }
    fs.cut_power();
    fs.hold_syncs(false);
    trigger.trigger();
    let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    drop(log);
    fs.crash(CrashMode::DropUnsynced);

    // Reboot: the same disk, the same downstream, until it has read the partition's end.
    let log = Log::open_with_fs(fs.clone() as Arc<dyn Fs>, dir, &LogConfig::default()).await?;
    let status = StatusMap::default();
    let (trigger, shutdown) = tern_core::shutdown::channel();
    let task = tokio::spawn(tern_upstream::downstream::run_ablated(
        config,
        ablation,
        gateway.to_owned(),
        log.clone(),
        status.clone(),
        shutdown,
    ));
    wait_async("the rebooted downstream at the partition's end", || {
        partition_status(&status).is_some_and(|s| {
            s.connected && s.upstream_end.is_some_and(|end| end == s.next && end > 0)
        })
    })
    .await?;
    trigger.trigger();
    task.await??;
    let mut values = Vec::new();
    let (_, end) = log.offsets(LOG_TOPIC, 0)?;
    for record in log.read(LOG_TOPIC, 0, 0, usize::MAX)? {
        if record.record.header("tern-command").is_some() {
            values.push(String::from_utf8_lossy(&record.record.value).into_owned());
        }
    }
    log.close().await?;
    println!(
        "{gateway}: {} records in the commands' log topic, {values:?}",
        end
    );
    Ok(values)
}

/// Polls `condition` every 50 ms for up to a minute.
async fn wait_async(what: &str, condition: impl Fn() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
