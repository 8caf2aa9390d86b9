//! The brokers under test, as child processes on loopback: tern itself (`tern serve` from the
//! running binary, with a temporary data directory and durable acks at the default commit window)
//! and Debian's `mosquitto` (a generated config, persistence off as shipped). Each child is ended
//! by its own PID when its handle drops, and its temporary directory is removed.
//!
//! It must never touch a process it did not start and never listen beyond 127.0.0.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::BenchError;

/// How long a broker may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A broker child process and the address it listens on.
#[derive(Debug)]
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    /// Config and data, removed when the handle drops (after the child is ended).
    _dir: TempDir,
    /// Its last stderr lines, for error messages.
    stderr: mpsc::Receiver<String>,
}

/// tern's default `mqtt.max_connections` (a test checks it against tern-mqtt's).
const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The `[mqtt]` settings the bench changes from tern's defaults so that `connections` clients
/// fit (`max_connections`, only when the default is too small), as `key = value` lines. Every
/// one is printed beside the figures.
pub fn mqtt_overrides(connections: usize) -> Vec<String> {
    if connections <= DEFAULT_MAX_CONNECTIONS {
        return Vec::new();
    }
    vec![format!("max_connections = {connections}")]
}

/// The tern settings of the bench: the defaults, with the data directory in a temporary
/// directory, the MQTT, admin and Kafka listeners on loopback port 0, and `mqtt` (lines of
/// `[mqtt]`) on top.
pub(crate) fn tern_config(data_dir: &Path, mqtt: &[String]) -> String {
    let mut mqtt = mqtt.join("\n");
    if !mqtt.is_empty() {
        mqtt.push('\n');
    }
    format!(
        "data_dir = {data_dir:?}\n\
         [mqtt]\nlisten = \"127.0.0.1:0\"\n{mqtt}\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [kafka_listener]\nlisten = \"127.0.0.1:0\"\n",
        data_dir = data_dir.display().to_string()
    )
}

/// Mosquitto's settings: one loopback listener, anonymous clients, persistence off (the shipped
/// default, so it acknowledges from RAM), no connection limit, errors and warnings only.
fn mosquitto_config(port: u16) -> String {
    format!(
        "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
         max_connections -1\nlog_dest stderr\nlog_type error\nlog_type warning\n"
    )
}

/// NATS's settings (the durable-ack peer of `tern-bench icount`): MQTT on loopback `port`, its
/// QoS 1 messages stored in JetStream before the PUBACK; JetStream's file store in `store` with
/// `sync_interval: always` (an fsync on every write, acks as durable as tern's); the NATS client
/// listener on loopback `client_port`; no logging but errors.
fn nats_config(store: &Path, port: u16, client_port: u16) -> String {
    format!(
        "server_name: tern_bench\nlisten: \"127.0.0.1:{client_port}\"\n\
         jetstream {{\n  store_dir: {store:?}\n  sync_interval: always\n}}\n\
         mqtt {{\n  listen: \"127.0.0.1:{port}\"\n}}\n",
        store = store.display().to_string()
    )
}

impl Server {
    /// Starts `tern serve` (the running binary) with `mqtt` (lines of `[mqtt]`, see
    /// [`mqtt_overrides`]) over its defaults and waits for its MQTT listener.
    pub fn tern(mqtt: &[String]) -> Result<Self, BenchError> {
        Self::tern_with(mqtt, "")
    }

    /// The same, with `extra` (whole TOML tables such as `[[upstream]]`) added to its config.
    pub fn tern_with(mqtt: &[String], extra: &str) -> Result<Self, BenchError> {
        let dir = TempDir::new("tern")?;
        let data_dir = dir.path().join("data");
        Self::tern_from(
            dir,
            &format!("{}{extra}", tern_config(&data_dir, mqtt)),
            "mqtt listener on ",
            &[],
        )
    }

    /// [`Server::tern_with`] in a temporary directory of its own named by `label` (so many
    /// can run side by side), also returning its admin endpoint's address.
    pub fn tern_named(label: &str, extra: &str) -> Result<(Self, SocketAddr), BenchError> {
        let dir = TempDir::new(label)?;
        let data_dir = dir.path().join("data");
        let text = format!("{}{extra}", tern_config(&data_dir, &[]));
        let mut server = Self::tern_from(dir, &text, "mqtt listener on ", &[])?;
        let admin = server.wait_for_line("admin endpoint listening on ")?;
        Ok((server, admin))
    }

    /// Starts `tern serve` on its defaults with its data under `parent` and `env` added to its
    /// environment, and waits for its Kafka listener, whose address `addr` then is (the Kafka
    /// bench).
    pub fn tern_kafka(parent: &Path, env: &[(String, String)]) -> Result<Self, BenchError> {
        let dir = TempDir::new_in(parent, "tern")?;
        let data_dir = dir.path().join("data");
        Self::tern_from(dir, &tern_config(&data_dir, &[]), "kafka listener on ", env)
    }

    /// [`Server::tern_kafka`], also returning the MQTT listener's address.
    pub fn tern_kafka_mqtt(
        parent: &Path,
        env: &[(String, String)],
    ) -> Result<(Self, SocketAddr), BenchError> {
        let dir = TempDir::new_in(parent, "tern")?;
        let data_dir = dir.path().join("data");
        let mut server =
            Self::tern_from(dir, &tern_config(&data_dir, &[]), "mqtt listener on ", env)?;
        let mqtt = server.addr;
        server.addr = server.wait_for_line("kafka listener on ")?;
        Ok((server, mqtt))
    }

    /// Starts `tern serve` with exactly the config `text` (which must listen on loopback port
    /// 0 and name its own data directory) and waits for its MQTT listener.
    pub fn tern_configured(text: &str) -> Result<Self, BenchError> {
        Self::tern_from(TempDir::new("tern")?, text, "mqtt listener on ", &[])
    }

    /// Starts `exe serve` (another build of tern) with a copy of the log directory `log` as its
    /// log and `extra` (whole TOML tables) added to the bench's config, and waits for its MQTT
    /// listener. The copy is removed with the server.
    pub fn tern_build_on_copy(exe: &Path, log: &Path, extra: &str) -> Result<Self, BenchError> {
        let (dir, text) = on_copy(log, extra)?;
        Self::tern_exe_from(exe.to_path_buf(), dir, &text, "mqtt listener on ", &[])
    }

    /// [`Server::tern_build_on_copy`] as `command` (an emulator with its arguments and then
    /// tern), waiting for its Kafka listener, whose address `addr` then is (the
    /// instruction-count bench's consume and forward runs).
    pub fn tern_under_on_copy(
        command: Command,
        log: &Path,
        extra: &str,
    ) -> Result<Self, BenchError> {
        let (dir, text) = on_copy(log, extra)?;
        Self::tern_in(command, dir, &text, "kafka listener on ", &[])
    }

    /// Starts `tern serve` on `text` and waits for the address after `marker` in its log.
    fn tern_from(
        dir: TempDir,
        text: &str,
        marker: &str,
        env: &[(String, String)],
    ) -> Result<Self, BenchError> {
        Self::tern_exe_from(crate::tern_binary()?, dir, text, marker, env)
    }

    /// [`Server::tern_from`] with the binary `exe`.
    fn tern_exe_from(
        exe: PathBuf,
        dir: TempDir,
        text: &str,
        marker: &str,
        env: &[(String, String)],
    ) -> Result<Self, BenchError> {
        Self::tern_in(Command::new(exe), dir, text, marker, env)
    }

    /// Starts tern's MQTT broker as `command` (tern, or an emulator with its arguments and then
    /// tern) with its defaults but for loopback listeners and waits for its MQTT listener (the
    /// instruction-count bench runs it under QEMU).
    pub fn tern_under(command: Command) -> Result<Self, BenchError> {
        let dir = TempDir::new("tern")?;
        let text = tern_config(&dir.path().join("data"), &[]);
        Self::tern_in(command, dir, &text, "mqtt listener on ", &[])
    }

    /// [`Server::tern_from`] as `command`.
    fn tern_in(
        mut command: Command,
        dir: TempDir,
        text: &str,
        marker: &str,
        env: &[(String, String)],
    ) -> Result<Self, BenchError> {
        let config = dir.path().join("tern.toml");
        write_file(&config, text)?;
        command.arg("serve").arg("--config").arg(&config);
        command.env_remove("RUST_LOG");
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let (child, stderr) = spawn(command, "tern")?;
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            _dir: dir,
            stderr,
        };
        server.addr = server.wait_for_line(marker)?;
        Ok(server)
    }

    /// Starts `mosquitto -c FILE` on a free loopback port and waits until it accepts.
    pub fn mosquitto() -> Result<Self, BenchError> {
        Self::mosquitto_under(Command::new(mosquitto_binary()))
    }

    /// [`Server::mosquitto`] as `command` (mosquitto, or an emulator with its arguments and
    /// then mosquitto).
    pub fn mosquitto_under(mut command: Command) -> Result<Self, BenchError> {
        let dir = TempDir::new("mosquitto")?;
        let port = free_port()?;
        let config = dir.path().join("mosquitto.conf");
        write_file(&config, &mosquitto_config(port))?;
        command.arg("-c").arg(&config);
        let (child, stderr) = spawn(command, "mosquitto")?;
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
            stderr,
        };
        server.wait_accepting("mosquitto")?;
        Ok(server)
    }

    /// Starts NATS with JetStream as `command` (an emulator with its arguments and then
    /// `nats-server`) on a free loopback port and waits until it accepts.
    pub fn nats_under(mut command: Command) -> Result<Self, BenchError> {
        let dir = TempDir::new("nats")?;
        let port = free_port()?;
        let config = dir.path().join("nats.conf");
        write_file(
            &config,
            &nats_config(&dir.path().join("jetstream"), port, free_port()?),
        )?;
        command.arg("-c").arg(&config);
        let (child, stderr) = spawn(command, "nats-server")?;
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
            stderr,
        };
        server.wait_accepting("nats-server")?;
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Parses the address after `marker` in the child's stderr.
    pub fn wait_for_line(&mut self, marker: &str) -> Result<SocketAddr, BenchError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut seen = Vec::new();
        while let Ok(line) = self
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if let Some(addr) = line.split(marker).nth(1) {
                if let Ok(addr) = addr.trim().parse() {
                    return Ok(addr);
                }
            }
            seen.push(line);
        }
        Err(BenchError::Start {
            broker: "tern",
            output: seen.join("\n"),
        })
    }

    /// Waits until a TCP connection to `addr` succeeds.
    fn wait_accepting(&mut self, broker: &'static str) -> Result<(), BenchError> {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(BenchError::Start {
            broker,
            output: self.stderr.try_iter().collect::<Vec<_>>().join("\n"),
        })
    }

    /// CPU seconds the child has used so far, user plus system, all threads (`utime` and
    /// `stime` of `/proc/<pid>/stat`, in clock ticks).
    pub fn cpu_seconds(&self) -> Result<f64, BenchError> {
        let path = format!("/proc/{}/stat", self.pid());
        let stat = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
            what: "reading the broker's /proc stat",
            source,
        })?;
        let ticks = cpu_ticks(&stat).ok_or(BenchError::Proc { path })?;
        // SAFETY: sysconf only reads a constant of the system.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Ok(ticks as f64 / per_second.max(1) as f64)
    }

    /// [`Server::rss_kib`]'s resident set with its anonymous part (heap and stacks, without
    /// mapped files such as tern's sealed segments), in KiB, from one reading.
    pub fn rss_and_anon_kib(&self) -> Result<(u64, u64), BenchError> {
        let [rss, anon] = self.status_kib(["VmRSS:", "RssAnon:"])?;
        Ok((rss, anon))
    }

    /// The child's resident set (`VmRSS`) and its peak (`VmHWM`), in KiB.
    pub fn rss_kib(&self) -> Result<(u64, u64), BenchError> {
        let [rss, peak] = self.status_kib(["VmRSS:", "VmHWM:"])?;
        Ok((rss, peak))
    }

    /// The KiB figures of `/proc/<pid>/status` lines starting with `names`.
    fn status_kib<const N: usize>(&self, names: [&str; N]) -> Result<[u64; N], BenchError> {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
            what: "reading the broker's /proc status",
            source,
        })?;
        let mut out = [0; N];
        for (slot, name) in out.iter_mut().zip(names) {
            *slot = status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .ok_or_else(|| BenchError::Proc { path: path.clone() })?;
        }
        Ok(out)
    }
}

impl Server {
    /// Asks the child to exit (SIGTERM to its own PID, which both brokers handle by exiting
    /// cleanly) and waits for it; under QEMU this is when a plugin writes its figures.
    pub fn stop(mut self, broker: &'static str) -> Result<std::process::ExitStatus, BenchError> {
        let pid = libc::pid_t::try_from(self.pid()).map_err(|_| BenchError::Proc {
            path: format!("/proc/{}", self.pid()),
        })?;
        // SAFETY: kill only sends a signal, to the child this handle started and still owns
        // (it has not been waited for, so the PID is not reused).
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            let source = std::io::Error::last_os_error();
            return Err(BenchError::Spawn { broker, source });
        }
        self.child.wait().map_err(|source| BenchError::Io {
            what: "waiting for a broker to exit",
            source,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Child::kill sends SIGKILL to this child's own PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory whose `data/log` is a copy of `log`, and the bench's tern config on
/// it with `extra` added.
fn on_copy(log: &Path, extra: &str) -> Result<(TempDir, String), BenchError> {
    let dir = TempDir::new("tern")?;
    let data_dir = dir.path().join("data");
    copy_dir(log, &data_dir.join("log")).map_err(|source| BenchError::Io {
        what: "copying the backlog's log",
        source,
    })?;
    let text = format!("{}{extra}", tern_config(&data_dir, &[]));
    Ok((dir, text))
}

/// Copies the directory tree `from` to `to` (regular files and directories only, as a log
/// directory holds).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// `utime + stime` of a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses
/// and may hold spaces, so fields are counted after its closing parenthesis: field 3 (state)
/// comes first, utime and stime are fields 14 and 15.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Spawns `command` with stderr drained by a thread (so the child never blocks on a full pipe).
fn spawn(
    mut command: Command,
    broker: &'static str,
) -> Result<(Child, mpsc::Receiver<String>), BenchError> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|source| BenchError::Spawn { broker, source })?;
    let (tx, rx) = mpsc::channel();
    if let Some(stderr) = child.stderr.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Once nobody listens the lines are only drained.
                let _ = tx.send(line);
            }
        });
    }
    Ok((child, rx))
}

/// `mosquitto` from PATH, else where Debian installs it (/usr/sbin is not on every PATH).
fn mosquitto_binary() -> PathBuf {
    let debian = Path::new("/usr/sbin/mosquitto");
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("mosquitto").exists()));
    if on_path || !debian.exists() {
        PathBuf::from("mosquitto")
    } else {
        debian.to_path_buf()
    }
}

/// A loopback port nobody listens on right now.
pub(crate) fn free_port() -> Result<u16, BenchError> {
    let io = |source| BenchError::Io {
        what: "finding a free loopback port",
        source,
    };
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(io)?;
    Ok(listener.local_addr().map_err(io)?.port())
}

fn write_file(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Io {
        what: "writing a broker config",
        source,
    })
}

/// A temporary directory removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Result<Self, BenchError> {
        Self::new_in(&std::env::temp_dir(), label)
    }

    fn new_in(parent: &Path, label: &str) -> Result<Self, BenchError> {
        let path = parent.join(format!("tern-bench-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|source| BenchError::Io {
            what: "creating a temporary directory",
            source,
        })?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The body of `GET path` from a loopback HTTP/1.0 server.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> Result<String, BenchError> {
    let io = |source| BenchError::Io {
        what: "reading tern's /metrics",
        source,
    };
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(io)?;
    let mut text = String::new();
    stream.read_to_string(&mut text).map_err(io)?;
    Ok(text
        .split_once("\r\n\r\n")
        .map_or(text.clone(), |(_, b)| b.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tern_config_is_the_defaults_but_for_the_listeners_and_what_is_printed() {
        let default = tern_mqtt::MqttConfig::default().max_connections;
        assert_eq!(DEFAULT_MAX_CONNECTIONS, default);
        assert_eq!(mqtt_overrides(1_016), Vec::<String>::new());
        let overrides = mqtt_overrides(4_000);
        assert_eq!(overrides, vec!["max_connections = 4000".to_owned()]);
        let text = tern_config(Path::new("/tmp/x"), &[]);
        #[derive(serde::Deserialize)]
        struct Sections {
            data_dir: std::path::PathBuf,
            mqtt: tern_mqtt::MqttConfig,
            #[serde(default)]
            log: tern_log::LogConfig,
        }
        let config: Sections = toml::from_str(&text).expect("valid config");
        assert_eq!(config.data_dir, Path::new("/tmp/x"));
        let loopback = tern_mqtt::MqttConfig {
            listen: "127.0.0.1:0".parse().expect("address"),
            ..tern_mqtt::MqttConfig::default()
        };
        assert_eq!(config.mqtt, loopback);
        assert_eq!(config.log, tern_log::LogConfig::default());
        let text = tern_config(Path::new("/tmp/x"), &overrides);
        let config: Sections = toml::from_str(&text).expect("valid config");
        assert_eq!(config.mqtt.max_connections, 4000);
    }

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let stat = "4242 (tern serve) S 1 4242 4242 0 -1 4194560 905 0 0 0 137 21 0 0 20 0 5 0";
        assert_eq!(cpu_ticks(stat), Some(158));
        assert_eq!(cpu_ticks("4242 (x) S 1"), None);
    }

    #[test]
    fn the_nats_config_fsyncs_every_jetstream_write_and_listens_on_loopback() {
        let text = nats_config(Path::new("/tmp/js"), 4242, 4243);
        assert!(text.contains("sync_interval: always"), "{text}");
        assert!(text.contains("store_dir: \"/tmp/js\""), "{text}");
        assert!(text.contains("listen: \"127.0.0.1:4242\""), "{text}");
        assert!(text.contains("listen: \"127.0.0.1:4243\""), "{text}");
    }

    #[test]
    fn the_mosquitto_config_listens_on_loopback_only() {
        let text = mosquitto_config(4242);
        assert!(text.starts_with("listener 4242 127.0.0.1\n"), "{text}");
        assert!(text.contains("persistence false"), "{text}");
    }
}
