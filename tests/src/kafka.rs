//! A real Apache Kafka 4.x cluster for the end-to-end suites: three KRaft nodes (each broker and
//! controller) on loopback ports, replication factor 3, `min.insync.replicas=2`, run from the jars
//! that `tests/kafka/pom.xml` copies into `tests/kafka/cache/`. It owns the broker JVMs: each is
//! ended by its own PID, and each dies with the test process (`PR_SET_PDEATHSIG`). Single brokers
//! can be killed and restarted for failover tests. Clients under test (tern) can reach the brokers
//! through cuttable TCP proxies ([`KafkaCluster::proxied_bootstrap`]): each broker has a second
//! listener advertised at its proxy's port, while replication and Kafka's own tools stay direct.
//! It never speaks the Kafka protocol itself: what reached Kafka is checked with Kafka's own tools
//! ([`crate::kafka_tools`]), independently of tern.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use crate::proxy::{Answered, TcpProxy};
use crate::{Gateway, TempDir, workspace_root};

/// Nodes in every cluster; replication factor and `min.insync.replicas` follow from it.
pub const NODES: u32 = 3;
/// Fixed cluster id (base64 of 16 bytes); each cluster lives in its own directory.
const CLUSTER_ID: &str = "dGVybi10ZXN0LWthZmthIQ";
/// Heap of each broker JVM: the machine is small and shared.
const BROKER_JVM: &[&str] = &["-Xmx256m", "-Xms64m", "-XX:+UseSerialGC"];
/// The user every cluster knows on its SASL listener, for PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.
pub const SASL_USER: &str = "tern";
pub const SASL_PASSWORD: &str = "tern-secret";
/// How long a node may take to report "Kafka Server started" (JVM start on a loaded machine).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The jars' directory, fetched through Maven on first use.
pub fn kafka_classpath() -> anyhow::Result<String> {
    static FETCHED: OnceLock<Result<String, String>> = OnceLock::new();
    let dir = workspace_root().join("tests").join("kafka");
    maven_classpath(&FETCHED, &dir, "kafka_2.13-", "Kafka")
}

/// [`fetch_maven_jars`] once per test process: the first call's answer is every call's.
pub(crate) fn maven_classpath(
    fetched: &'static OnceLock<Result<String, String>>,
    dir: &Path,
    marker: &str,
    what: &str,
) -> anyhow::Result<String> {
    fetched
        .get_or_init(|| fetch_maven_jars(dir, marker, what).map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The `cache/` beside the pom in `dir` as a classpath: filled by `mvn dependency:copy-dependencies`
/// unless a jar whose name starts with `marker` is already there.
pub(crate) fn fetch_maven_jars(dir: &Path, marker: &str, what: &str) -> anyhow::Result<String> {
    let cache = dir.join("cache");
    let has_marker = || {
        fs::read_dir(&cache)
            .map(|entries| {
                entries
                    .map_while(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().starts_with(marker))
            })
            .unwrap_or(false)
    };
    if !has_marker() {
        let status = Command::new("mvn")
            .args([
                "-q",
                "-B",
                "-Dstyle.color=never",
                "dependency:copy-dependencies",
            ])
            .current_dir(dir)
            .status()
            .context("cannot run mvn (install maven and a Java 17 JDK: scripts/ensure-deps.sh)")?;
        if !status.success() || !has_marker() {
            bail!(
                "fetching the {what} jars with mvn in {} failed: {status}",
                dir.display()
            );
        }
    }
    Ok(format!("{}/*", cache.display()))
}

/// A `java` command with the Kafka classpath and the cluster's logging configuration.
pub(crate) fn java(dir: &Path, heap: &[&str], main_class: &str) -> anyhow::Result<Command> {
    let mut command = Command::new("java");
    command
        .args(heap)
        .arg("-Djava.awt.headless=true")
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            dir.join("log4j2.properties").display()
        ))
        .env("CLASSPATH", kafka_classpath()?)
        .arg(main_class)
        .stdin(Stdio::null());
    Ok(command)
}

/// One KRaft node: its ports, its directory and, while it runs, its JVM.
#[derive(Debug)]
struct Node {
    id: u32,
    broker_port: u16,
    controller_port: u16,
    /// Listener for clients under test, advertised at the proxy's port.
    client_port: u16,
    /// SASL_PLAINTEXT listener (PLAIN and SCRAM) for authentication tests.
    sasl_port: u16,
    /// SSL listener with a certificate from the cluster's own CA ([`KafkaCluster::tls_ca`]).
    tls_port: u16,
    /// PLAINTEXT listener for a gateway in system QEMU: bound on 127.0.0.1, advertised as
    /// 10.0.2.2 at its proxy's port (the address under which QEMU's user network forwards the
    /// guest to the host's loopback).
    qemu_guest_port: u16,
    proxy: TcpProxy,
    /// The guest listener's cuttable proxy: a regional outage cuts the QEMU gateway too.
    guest_proxy: TcpProxy,
    child: Option<Child>,
}

/// The longest forwarding may take to resume after the link returns before the test fails: the
/// target is under 2 s (tern probes a link that is down every 500 ms and drops dead
/// connections), and tens of seconds is the regression this catches; 15 s leaves room for a
/// loaded machine and Kafka's own leader election.
pub const RESUME_BOUND: Duration = Duration::from_secs(15);

/// A running three-node cluster. Dropping it kills every broker it started, by PID.
#[derive(Debug)]
pub struct KafkaCluster {
    dir: PathBuf,
    _temp: Option<TempDir>,
    nodes: Vec<Node>,
    spawner: Spawner,
    /// Broker properties appended to every node's configuration (later keys win).
    extra: String,
    /// How long the last [`KafkaCluster::start`] took, from formatting to all nodes started.
    pub startup: Duration,
}

impl KafkaCluster {
    /// Formats and starts a fresh cluster in a temporary directory; waits until every node runs.
    pub fn start() -> anyhow::Result<Self> {
        let temp = TempDir::new("kafka")?;
        let dir = temp.path().to_path_buf();
        Self::start_in(&dir, Some(temp))
    }

    /// [`KafkaCluster::start`] with `properties` (`key=value` lines) added to every node's
    /// configuration, overriding the defaults of this harness.
    pub fn start_with(properties: &str) -> anyhow::Result<Self> {
        let temp = TempDir::new("kafka")?;
        let dir = temp.path().to_path_buf();
        Self::start_configured(&dir, Some(temp), properties)
    }

    /// Same, in `dir` (kept after the cluster stops).
    pub fn start_in(dir: &Path, temp: Option<TempDir>) -> anyhow::Result<Self> {
        Self::start_configured(dir, temp, "")
    }

    fn start_configured(dir: &Path, temp: Option<TempDir>, extra: &str) -> anyhow::Result<Self> {
        let started = Instant::now();
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ports = free_port_block(8 * NODES as usize)?;
        let port = |block: u32, i: u32| ports[(block * NODES + i) as usize];
        let nodes = (0..NODES)
            .map(|i| {
                let target = SocketAddr::from(([127, 0, 0, 1], port(2, i)));
                let proxy = TcpProxy::start(SocketAddr::from(([127, 0, 0, 1], port(3, i))), target)
                    .context("starting a client proxy")?;
                let guest_target = SocketAddr::from(([127, 0, 0, 1], port(6, i)));
                let guest_proxy =
                    TcpProxy::start(SocketAddr::from(([127, 0, 0, 1], port(7, i))), guest_target)
                        .context("starting a QEMU guest proxy")?;
                Ok(Node {
                    id: i + 1,
                    broker_port: port(0, i),
                    controller_port: port(1, i),
                    client_port: port(2, i),
                    sasl_port: port(4, i),
                    tls_port: port(5, i),
                    qemu_guest_port: port(6, i),
                    proxy,
                    guest_proxy,
                    child: None,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let mut cluster = Self {
            dir: dir.to_path_buf(),
            _temp: temp,
            nodes,
            spawner: Spawner::new(),
            extra: extra.to_owned(),
            startup: Duration::ZERO,
        };
        make_certificates(&cluster.dir.join("tls"))?;
        cluster.write_configs()?;
        cluster.format()?;
        for id in cluster.node_ids() {
            cluster.spawn_node(id)?;
        }
        for id in cluster.node_ids() {
            cluster.wait_started(id, 0)?;
        }
        cluster.startup = started.elapsed();
        Ok(cluster)
    }

    /// `host:port,…` of every broker, for clients' bootstrap lists.
    pub fn bootstrap(&self) -> String {
        let addrs: Vec<String> = self.nodes.iter().map(|n| self.broker(n.id)).collect();
        addrs.join(",")
    }

    /// `host:port,…` of every broker's client listener, through the cuttable proxies: what tern
    /// under test should use.
    pub fn proxied_bootstrap(&self) -> String {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| n.proxy.addr().to_string())
            .collect();
        addrs.join(",")
    }

    /// `10.0.2.2:port,…` of every broker's listener for a gateway in system QEMU
    /// ([`crate::system`]): the guest reaches the host's loopback at 10.0.2.2, and the brokers
    /// advertise that address on this listener, so Metadata answers stay reachable from the guest.
    pub fn qemu_guest_bootstrap(&self) -> String {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("10.0.2.2:{}", n.guest_proxy.addr().port()))
            .collect();
        addrs.join(",")
    }

    /// `host:port,…` of every broker's SASL_PLAINTEXT listener (user [`SASL_USER`]).
    pub fn sasl_bootstrap(&self) -> String {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.sasl_port))
            .collect();
        addrs.join(",")
    }

    /// `host:port,…` of every broker's TLS listener; its certificate names IP 127.0.0.1.
    pub fn tls_bootstrap(&self) -> String {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.tls_port))
            .collect();
        addrs.join(",")
    }

    /// PEM file of the CA that signed the brokers' TLS certificate.
    pub fn tls_ca(&self) -> PathBuf {
        self.dir.join("tls").join("ca.pem")
    }

    /// Cuts every client proxy, the QEMU guests' too: open connections close, new ones are
    /// refused.
    pub fn cut_clients(&self) {
        for node in &self.nodes {
            node.proxy.cut();
            node.guest_proxy.cut();
        }
    }

    /// Arms every client proxy to cut the link when a request with `api_key` arrives (dropped
    /// before the broker sees it); [`KafkaCluster::request_cut_fired`] tells when it did.
    pub fn cut_clients_at_request(&self, api_key: i16) {
        for node in &self.nodes {
            node.proxy.cut_at_request(api_key);
        }
    }

    /// Arms every client proxy to hold the next request with `api_key` (not forwarded, its
    /// connection left open) until [`KafkaCluster::release_clients`]; a hold that arrived shows
    /// in [`KafkaCluster::request_held`].
    pub fn hold_clients_at_request(&self, api_key: i16) {
        for node in &self.nodes {
            node.proxy.hold_at_request(api_key);
        }
    }

    /// Whether an armed hold fired (the request waits in a proxy).
    pub fn request_held(&self) -> bool {
        self.nodes.iter().any(|n| n.proxy.tripped())
    }

    /// Forwards the held request and disarms the other proxies' holds.
    pub fn release_clients(&self) {
        for node in &self.nodes {
            node.proxy.release();
        }
    }

    /// Whether an armed request cut fired; it then cuts every client proxy.
    pub fn request_cut_fired(&self) -> bool {
        let fired = self.nodes.iter().any(|n| n.proxy.tripped());
        if fired {
            self.cut_clients();
        }
        fired
    }

    /// When each client connection through the proxies reached a broker, every node's, in
    /// time order.
    pub fn client_connections_opened(&self) -> Vec<Instant> {
        let mut opened: Vec<Instant> = self
            .nodes
            .iter()
            .flat_map(|n| n.proxy.opened().into_iter().chain(n.guest_proxy.opened()))
            .collect();
        opened.sort();
        opened
    }

    /// Every request through the client proxies (the QEMU guests' too) that a broker
    /// answered, in the order of the answers.
    pub fn client_requests_answered(&self) -> Vec<Answered> {
        let mut answered: Vec<Answered> = self
            .nodes
            .iter()
            .flat_map(|n| {
                n.proxy
                    .answered()
                    .into_iter()
                    .chain(n.guest_proxy.answered())
            })
            .collect();
        answered.sort_by_key(|a| a.at);
        answered
    }

    /// Lets clients connect again after [`KafkaCluster::cut_clients`].
    pub fn restore_clients(&self) {
        for node in &self.nodes {
            node.proxy.restore();
            node.guest_proxy.restore();
        }
    }

    /// Restores the link to `cluster` and returns how long after it `tern_upstream_records_behind`
    /// fell below its value at the restore (records arrive during the cut, so it is above 0),
    /// printed with `what`; fails after [`RESUME_BOUND`].
    pub fn restore_and_time_resume(
        &self,
        gateway: &mut Gateway,
        labels: &str,
        what: &str,
    ) -> anyhow::Result<Duration> {
        self.restore_and_time_resume_within(gateway, labels, what, RESUME_BOUND)
    }

    /// [`KafkaCluster::restore_and_time_resume`] with another bound, for a restore that must
    /// also wait for Kafka itself (a dead follower leaving the ISR).
    pub fn restore_and_time_resume_within(
        &self,
        gateway: &mut Gateway,
        labels: &str,
        what: &str,
        bound: Duration,
    ) -> anyhow::Result<Duration> {
        let name = "tern_upstream_records_behind";
        let behind = gateway.metric_sum(name, labels)?.unwrap_or(0);
        if behind == 0 {
            bail!("{what}: no record waiting at the restore, nothing to time");
        }
        let io_before = io_progress(gateway);
        self.restore_clients();
        let restored = Instant::now();
        gateway
            .wait_metric(name, labels, what, bound, |n| n.is_some_and(|n| n < behind))
            .with_context(|| {
                // Whether the log kept committing meanwhile: a forwarder waits for its cursor's
                // sync, so a disk that stalls stops forwarding as surely as a client bug.
                let io_after = io_progress(gateway);
                format!(
                    "{what}: forwarding did not resume within {bound:?}; (fsyncs, fsync seconds,                      MQTT publishes received) at the restore {io_before:?}, now {io_after:?}"
                )
            })?;
        let resumed = restored.elapsed();
        eprintln!(
            "{what}: forwarding resumed {resumed:?} after the link returned ({behind} records behind)"
        );
        Ok(resumed)
    }

    /// `127.0.0.1:port` of broker `id`.
    pub fn broker(&self, id: u32) -> String {
        let port = self.node(id).map(|n| n.broker_port).unwrap_or(0);
        format!("127.0.0.1:{port}")
    }

    pub fn node_ids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// PID of node `id`'s JVM while it runs.
    pub fn pid(&self, id: u32) -> Option<u32> {
        self.node(id).and_then(|n| n.child.as_ref()).map(Child::id)
    }

    /// Whether node `id`'s JVM is running.
    pub fn is_running(&mut self, id: u32) -> bool {
        let Some(node) = self.nodes.iter_mut().find(|n| n.id == id) else {
            return false;
        };
        match node.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                node.child = None;
                false
            }
            None => false,
        }
    }

    /// SIGKILLs node `id` (a process crash: no controlled shutdown) and reaps it.
    pub fn kill_broker(&mut self, id: u32) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        let mut child = node
            .child
            .take()
            .with_context(|| format!("node {id} is not running"))?;
        child.kill().with_context(|| format!("killing node {id}"))?;
        child.wait().with_context(|| format!("reaping node {id}"))?;
        Ok(())
    }

    /// Starts node `id` again on its old ports and data, waiting until it runs.
    pub fn restart_broker(&mut self, id: u32) -> anyhow::Result<()> {
        if self.is_running(id) {
            bail!("node {id} is still running");
        }
        let log_len = fs::metadata(self.log_path(id))
            .map(|m| m.len())
            .unwrap_or(0);
        self.spawn_node(id)?;
        self.wait_started(id, log_len)
    }

    /// The last `lines` lines of node `id`'s log, for failure messages.
    pub fn log_tail(&self, id: u32, lines: usize) -> String {
        let text = fs::read_to_string(self.log_path(id)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Spawns `command` from the cluster's spawner thread, so the process dies with the test
    /// process as the brokers do (MirrorMaker, [`crate::kafka_mirror`]).
    pub(crate) fn spawn_tied(&self, command: Command) -> anyhow::Result<Child> {
        self.spawner.spawn(command)
    }

    fn node(&self, id: u32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    fn node_mut(&mut self, id: u32) -> anyhow::Result<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    fn config_path(&self, id: u32) -> PathBuf {
        self.dir.join(format!("node-{id}.properties"))
    }

    fn log_path(&self, id: u32) -> PathBuf {
        self.dir.join(format!("node-{id}.log"))
    }

    fn write_configs(&self) -> anyhow::Result<()> {
        fs::write(self.dir.join("log4j2.properties"), LOG4J2)?;
        let voters: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect();
        for node in &self.nodes {
            let mut config = node_config(node, &voters.join(","), &self.dir);
            config.push_str(&self.extra);
            if !config.ends_with('\n') {
                config.push('\n');
            }
            fs::write(self.config_path(node.id), config)?;
        }
        Ok(())
    }

    /// `kafka-storage format` for every node, in parallel.
    fn format(&self) -> anyhow::Result<()> {
        let mut children = Vec::new();
        for id in self.node_ids() {
            let out = File::create(self.dir.join(format!("format-{id}.log")))?;
            let mut command = java(
                &self.dir,
                &["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"],
                "kafka.tools.StorageTool",
            )?;
            command
                .args(["format", "--ignore-formatted", "-t", CLUSTER_ID])
                .args(scram_credentials())
                .arg("-c")
                .arg(self.config_path(id))
                .stdout(out.try_clone()?)
                .stderr(out);
            children.push((id, self.spawner.spawn(command)?));
        }
        for (id, mut child) in children {
            let status = child.wait()?;
            if !status.success() {
                let log = fs::read_to_string(self.dir.join(format!("format-{id}.log")))?;
                bail!("formatting node {id} failed ({status}):\n{log}");
            }
        }
        Ok(())
    }

    fn spawn_node(&mut self, id: u32) -> anyhow::Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))?;
        let mut command = java(&self.dir, BROKER_JVM, "kafka.Kafka")?;
        command
            .arg(self.config_path(id))
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = self.spawner.spawn(command)?;
        self.node_mut(id)?.child = Some(child);
        Ok(())
    }

    /// Waits for "Kafka Server started" in node `id`'s log past byte `from`.
    fn wait_started(&mut self, id: u32, from: u64) -> anyhow::Result<()> {
        let what = format!("\"Kafka Server started\" in node {id}'s log");
        let started = crate::wait_until(START_TIMEOUT, &what, || {
            if log_contains(&self.log_path(id), from, "Kafka Server started")? {
                return Ok(true);
            }
            if !self.is_running(id) {
                bail!("node {id} exited while starting");
            }
            Ok(false)
        });
        started.with_context(|| self.log_tail(id, 40))
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn node_config(node: &Node, voters: &str, dir: &Path) -> String {
    format!(
        "process.roles=broker,controller\n\
         node.id={id}\n\
         controller.quorum.voters={voters}\n\
         listeners=PLAINTEXT://127.0.0.1:{broker},CONTROLLER://127.0.0.1:{controller},CLIENT://127.0.0.1:{client},SASL://127.0.0.1:{sasl},SSL://127.0.0.1:{tls},QEMU_GUEST://127.0.0.1:{guest}\n\
         advertised.listeners=PLAINTEXT://127.0.0.1:{broker},CLIENT://{proxy},SASL://127.0.0.1:{sasl},SSL://127.0.0.1:{tls},QEMU_GUEST://10.0.2.2:{guest_proxy}\n\
         controller.listener.names=CONTROLLER\n\
         listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,CLIENT:PLAINTEXT,SASL:SASL_PLAINTEXT,SSL:SSL,QEMU_GUEST:PLAINTEXT\n\
         listener.name.ssl.ssl.keystore.type=PEM\n\
         listener.name.ssl.ssl.keystore.location={keystore}\n\
         sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512\n\
         listener.name.sasl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_{user}=\"{password}\";\n\
         listener.name.sasl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
         listener.name.sasl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
         inter.broker.listener.name=PLAINTEXT\n\
         log.dirs={data}\n\
         num.partitions=1\n\
         default.replication.factor=3\n\
         min.insync.replicas=2\n\
         offsets.topic.replication.factor=3\n\
         offsets.topic.num.partitions=3\n\
         transaction.state.log.replication.factor=3\n\
         transaction.state.log.min.isr=2\n\
         transaction.state.log.num.partitions=3\n\
         share.coordinator.state.topic.num.partitions=3\n\
         group.initial.rebalance.delay.ms=0\n\
         broker.heartbeat.interval.ms=500\n\
         broker.session.timeout.ms=3000\n\
         replica.lag.time.max.ms=10000\n\
         auto.create.topics.enable=false\n\
         unclean.leader.election.enable=false\n\
         num.network.threads=2\n\
         num.io.threads=2\n\
         background.threads=2\n\
         log.cleaner.enable=false\n",
        id = node.id,
        broker = node.broker_port,
        controller = node.controller_port,
        client = node.client_port,
        sasl = node.sasl_port,
        tls = node.tls_port,
        guest = node.qemu_guest_port,
        keystore = dir.join("tls").join("broker.pem").display(),
        user = SASL_USER,
        password = SASL_PASSWORD,
        proxy = node.proxy.addr(),
        guest_proxy = node.guest_proxy.addr().port(),
        data = dir.join(format!("data-{}", node.id)).display(),
    )
}

/// A CA and one broker certificate for IP 127.0.0.1 signed by it, made with `openssl` in `dir`:
/// `ca.pem` for clients, `broker.pem` (PKCS#8 key and certificate) as the brokers' PEM keystore.
fn make_certificates(dir: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(dir)?;
    fs::write(
        dir.join("broker.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         extendedKeyUsage=serverAuth\n",
    )?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: [&[&str]; 3] = [
        &[
            &["req", "-x509"][..],
            &ec[..],
            &[
                "-days",
                "3",
                "-subj",
                "/CN=tern test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        ]
        .concat(),
        &[
            &["req"][..],
            &ec[..],
            &[
                "-subj",
                "/CN=localhost",
                "-keyout",
                "broker.key",
                "-out",
                "broker.csr",
            ],
        ]
        .concat(),
        &[
            "x509",
            "-req",
            "-in",
            "broker.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3",
            "-extfile",
            "broker.ext",
            "-out",
            "broker.crt",
        ],
    ];
    for args in steps {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .context("cannot run openssl (scripts/ensure-deps.sh installs it)")?;
        if !output.status.success() {
            bail!(
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    let keystore = [
        fs::read_to_string(dir.join("broker.key"))?,
        fs::read_to_string(dir.join("broker.crt"))?,
    ]
    .concat();
    fs::write(dir.join("broker.pem"), keystore)?;
    Ok(())
}

/// `--add-scram` arguments for `kafka-storage format`: SCRAM credentials live in the metadata log.
fn scram_credentials() -> Vec<String> {
    ["SCRAM-SHA-256", "SCRAM-SHA-512"]
        .iter()
        .flat_map(|mechanism| {
            [
                "--add-scram".to_owned(),
                format!("{mechanism}=[name={SASL_USER},password={SASL_PASSWORD}]"),
            ]
        })
        .collect()
}

/// Logs to stderr (tools print records on stdout): warnings, plus the broker lifecycle lines the
/// harness waits for.
pub(crate) const LOG4J2: &str = "status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = info
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = info
logger.lifecycle.name = org.apache.kafka.server.BrokerLifecycleManager
logger.lifecycle.level = info
";

fn log_contains(path: &Path, from: u64, needle: &str) -> anyhow::Result<bool> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err.into()),
    };
    file.seek(SeekFrom::Start(from))?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text.contains(needle))
}

/// `count` consecutive loopback ports below the kernel's ephemeral range that are free now, so a
/// restarted broker finds its port again.
fn free_port_block(count: usize) -> anyhow::Result<Vec<u16>> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut seed = nanos ^ std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..200 {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let base = 20_000 + (seed >> 8) % 10_000;
        let ports: Vec<u16> = (0..count)
            .filter_map(|i| u16::try_from(base as usize + i).ok())
            .collect();
        let listeners: Vec<TcpListener> = ports
            .iter()
            .map_while(|&p| TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if listeners.len() == count {
            return Ok(ports);
        }
    }
    bail!("no block of {count} free loopback ports in 20000..30000")
}

/// Spawns child processes from one long-lived thread, so that `PR_SET_PDEATHSIG` (which fires
/// when the spawning *thread* exits) only fires when the cluster or the whole process goes away.
#[derive(Debug)]
struct Spawner {
    requests: mpsc::Sender<(Command, mpsc::Sender<std::io::Result<Child>>)>,
}

impl Spawner {
    fn new() -> Self {
        let (tx, rx) = mpsc::channel::<(Command, mpsc::Sender<std::io::Result<Child>>)>();
        std::thread::spawn(move || {
            for (mut command, reply) in rx {
                let _ = reply.send(spawn_tied_to_parent(&mut command));
            }
        });
        Self { requests: tx }
    }

    fn spawn(&self, command: Command) -> anyhow::Result<Child> {
        let (tx, rx) = mpsc::channel();
        self.requests
            .send((command, tx))
            .context("spawner thread is gone")?;
        rx.recv()
            .context("spawner thread is gone")?
            .context("cannot start java (install a Java 17 JDK: scripts/ensure-deps.sh)")
    }
}

fn spawn_tied_to_parent(command: &mut Command) -> std::io::Result<Child> {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// The log's fsyncs, their seconds and the MQTT publishes `gateway` has received so far (`None`
/// where it does not say).
fn io_progress(gateway: &Gateway) -> (Option<u64>, Option<u64>, Option<u64>) {
    let read = |name: &str| gateway.metric_sum(name, "").ok().flatten();
    (
        read("tern_log_fsyncs_total"),
        read("tern_log_fsync_seconds_total"),
        read("tern_mqtt_publishes_received_total"),
    )
}
