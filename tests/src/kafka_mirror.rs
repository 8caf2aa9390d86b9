//! Kafka's MirrorMaker 2 in dedicated mode (`org.apache.kafka.connect.mirror.MirrorMaker`), run
//! from its own classpath (`tests/kafka/mirror/pom.xml` copies connect-mirror 4.1 and its
//! dependencies into `tests/kafka/mirror/cache/`), apart from the 4.4 jars of the test cluster.
//! Like the cluster's JVMs, the MirrorMaker JVM is ended by its PID when the handle drops and dies
//! with the test process.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use crate::kafka::{KafkaCluster, maven_classpath};
use crate::workspace_root;

/// The MirrorMaker jars' directory as a classpath, fetched through Maven on first use.
pub fn mirror_classpath() -> anyhow::Result<String> {
    static FETCHED: OnceLock<Result<String, String>> = OnceLock::new();
    let dir = workspace_root().join("tests").join("kafka").join("mirror");
    maven_classpath(&FETCHED, &dir, "connect-mirror-", "MirrorMaker")
}

/// A running dedicated MirrorMaker 2. Dropping it kills its JVM by PID.
#[derive(Debug)]
pub struct MirrorMaker {
    child: Option<Child>,
    log: PathBuf,
}

impl MirrorMaker {
    /// Starts MirrorMaker with `properties` (the text of an `mm2.properties`) written into `dir`,
    /// its output in `dir/mirror-maker.log`. The JVM is spawned by `cluster`'s spawner thread, so
    /// it dies with the test process like the brokers.
    pub fn start(cluster: &KafkaCluster, dir: &Path, properties: &str) -> anyhow::Result<Self> {
        fs::create_dir_all(dir)?;
        let config = dir.join("mm2.properties");
        fs::write(&config, properties)?;
        let log4j = dir.join("mirror-log4j2.properties");
        fs::write(&log4j, MIRROR_LOG4J2)?;
        let log = dir.join("mirror-maker.log");
        let out = File::create(&log)?;
        let mut command = Command::new("java");
        command
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg("-Djava.awt.headless=true")
            .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
            .env("CLASSPATH", mirror_classpath()?)
            .arg("org.apache.kafka.connect.mirror.MirrorMaker")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = cluster.spawn_tied(command)?;
        Ok(Self {
            child: Some(child),
            log,
        })
    }

    /// Whether the JVM still runs (false once it exited, e.g. on a bad configuration).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// The last `lines` lines of MirrorMaker's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for MirrorMaker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The cluster's logging (warnings) plus MirrorMaker's own start and task lines.
const MIRROR_LOG4J2: &str = "status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
logger.mirror.name = org.apache.kafka.connect.mirror
logger.mirror.level = info
";
