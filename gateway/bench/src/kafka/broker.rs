//! The yardstick: a single-node Apache Kafka (one KRaft process that is broker and controller)
//! on loopback, from the jars on `--kafka-classpath`, with Kafka's defaults except what one node
//! needs (replication factors of 1) and a 512 MiB heap. Its data directory is a directory of
//! its own under the bench's parent directory, removed when the handle drops, after the JVM it
//! started was ended by its PID.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::BenchError;
use crate::mqtt::servers::free_port;

/// How long the JVM may take to log "Kafka Server started" on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// The broker's heap (`kafka-server-start.sh` gives 1 GiB; the machine is small).
pub const HEAP: &str = "-Xmx512m";
/// Any valid cluster id (base64 of 16 bytes).
const CLUSTER_ID: &str = "dGVybi1iZW5jaC1rYWZrYQ";
/// Warnings only, plus the line that says the server started.
const LOG4J2: &str = "status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = info
";

/// The broker settings that differ from Kafka's defaults (all for a cluster of one node).
pub fn properties(broker_port: u16, controller_port: u16, data: &Path) -> String {
    format!(
        "process.roles=broker,controller\n\
         node.id=1\n\
         controller.quorum.voters=1@127.0.0.1:{controller_port}\n\
         listeners=PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}\n\
         advertised.listeners=PLAINTEXT://127.0.0.1:{broker_port}\n\
         controller.listener.names=CONTROLLER\n\
         listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
         inter.broker.listener.name=PLAINTEXT\n\
         log.dirs={data}\n\
         num.partitions=1\n\
         default.replication.factor=1\n\
         offsets.topic.replication.factor=1\n\
         offsets.topic.num.partitions=1\n\
         transaction.state.log.replication.factor=1\n\
         transaction.state.log.min.isr=1\n\
         share.coordinator.state.topic.replication.factor=1\n\
         group.initial.rebalance.delay.ms=0\n",
        data = data.display()
    )
}

/// A running single-node Kafka.
#[derive(Debug)]
pub struct Kafka {
    child: Child,
    dir: PathBuf,
    classpath: String,
    pub bootstrap: String,
}

impl Kafka {
    /// Formats and starts a node under `parent`; returns once it logged that it started.
    /// `env` is added to the broker's environment.
    pub fn start(
        classpath: &str,
        parent: &Path,
        env: &[(String, String)],
    ) -> Result<Self, BenchError> {
        let dir = parent.join(format!("tern-bench-kafka-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::file("create", &dir, e))?;
        let (broker, controller) = (free_port()?, free_port()?);
        let config = dir.join("server.properties");
        write(&config, &properties(broker, controller, &dir.join("data")))?;
        write(&dir.join("log4j2.properties"), LOG4J2)?;
        let format_log = dir.join("format.log");
        let status = java(classpath, &dir, "-Xmx128m", "kafka.tools.StorageTool")
            .args(["format", "-t", CLUSTER_ID, "-c"])
            .arg(&config)
            .stdout(log_file(&format_log)?)
            .stderr(log_file(&format_log)?)
            .status()
            .map_err(spawn_error)?;
        if !status.success() {
            return Err(BenchError::Start {
                broker: "kafka (format)",
                output: std::fs::read_to_string(&format_log).unwrap_or_default(),
            });
        }
        let log = dir.join("kafka.log");
        let child = java(classpath, &dir, HEAP, "kafka.Kafka")
            .arg(&config)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(log_file(&log)?)
            .stderr(log_file(&log)?)
            .spawn()
            .map_err(spawn_error)?;
        let mut kafka = Self {
            child,
            dir,
            classpath: classpath.to_owned(),
            bootstrap: format!("127.0.0.1:{broker}"),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Kafka Server started") {
                return Ok(kafka);
            }
            let exited = matches!(kafka.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                return Err(BenchError::Start {
                    broker: "kafka",
                    output: text,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Creates `topic` (one partition) with topic-level `config` such as `flush.messages=1`,
    /// through Kafka's own `kafka-topics` tool.
    pub fn create_topic(&self, topic: &str, config: &[&str]) -> Result<(), BenchError> {
        let mut command = java(
            &self.classpath,
            &self.dir,
            "-Xmx128m",
            "org.apache.kafka.tools.TopicCommand",
        );
        command
            .args([
                "--bootstrap-server",
                &self.bootstrap,
                "--create",
                "--topic",
                topic,
            ])
            .args(["--partitions", "1", "--replication-factor", "1"]);
        for entry in config {
            command.args(["--config", entry]);
        }
        let output = command.output().map_err(spawn_error)?;
        if output.status.success() {
            Ok(())
        } else {
            Err(BenchError::Tool {
                program: "kafka-topics --create".to_owned(),
                message: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            })
        }
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        // SIGKILL to this child's own PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn java(classpath: &str, dir: &Path, heap: &str, main_class: &str) -> Command {
    let mut command = Command::new("java");
    command
        .args([heap, "-Djava.awt.headless=true"])
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            dir.join("log4j2.properties").display()
        ))
        .arg("-cp")
        .arg(classpath)
        .arg(main_class)
        .stdin(Stdio::null());
    command
}

fn spawn_error(source: std::io::Error) -> BenchError {
    BenchError::Spawn {
        broker: "java (Apache Kafka)",
        source,
    }
}

fn log_file(path: &Path) -> Result<File, BenchError> {
    File::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| BenchError::file("open", path, e))
}

fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|e| BenchError::file("write", path, e))
}
