//! Harness for tern's end-to-end suites: builds and starts the real `tern` binary, waits until it
//! is ready, talks HTTP to its admin endpoint, and cleans up its temporary data directories.
//! Every process it starts is ended by its own PID when the handle drops.

pub mod commands;
pub mod fleet;
pub mod kafka;
pub mod kafka_groups;
pub mod kafka_mirror;
pub mod kafka_tools;
pub mod mosquitto;
pub mod proxy;

pub use kafka::KafkaCluster;
pub use mosquitto::MosquittoSub;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub mod firmware;
pub mod raw_mqtt;
pub mod system;

/// The `RUST_LOG` filter of every tern the tests start: `info`, or `TERN_TEST_LOG` when set
/// (`TERN_TEST_LOG=info,tern_upstream=debug` to see a forwarder's retries while chasing a flake).
fn log_filter() -> String {
    std::env::var("TERN_TEST_LOG").unwrap_or_else(|_| "info".to_owned())
}

/// Path of the `tern` binary, built once per test process with the same cargo that runs the tests.
pub fn tern_binary() -> anyhow::Result<PathBuf> {
    built_binaries().map(|dir| dir.join("tern"))
}

/// Path of the `tern-bench` binary (benchmarks and the process-crash tests' stress writer), built with
/// `tern` in the same directory, so the benches that start `tern serve` find it beside them.
pub fn bench_binary() -> anyhow::Result<PathBuf> {
    built_binaries().map(|dir| dir.join("tern-bench"))
}

/// Builds `tern` and `tern-bench` once per test process: the directory holding both.
fn built_binaries() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_binaries().map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_binaries() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let workspace = workspace_root();
    let mut command = Command::new(cargo);
    // `cargo test` hands the test process its package's CARGO_MANIFEST_DIR, CARGO_PKG_* and the
    // like; a build script that tracks one of them (ring's does) would see it change between this
    // build and the outer one and rebuild ring, rustls and tern on every test run.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
            ]
            .contains(&name.as_ref())
        {
            command.env_remove(name.as_ref());
        }
    }
    let status = command
        .args([
            "build",
            "--quiet",
            "-p",
            "tern",
            "-p",
            "tern-bench",
            "--bins",
        ])
        .current_dir(&workspace)
        .status()
        .context("cannot run cargo to build tern")?;
    if !status.success() {
        bail!("building tern failed: {status}");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let dir = target.join("debug");
    for binary in ["tern", "tern-bench"] {
        if !dir.join(binary).exists() {
            bail!("{binary} missing in {} after building", dir.display());
        }
    }
    Ok(dir)
}

/// Polls `condition` until it holds, first every 10 ms, then less often (at most every 200 ms),
/// and fails after `timeout` with "timed out after … waiting for WHAT". The suites' one way to
/// wait for something they can observe (a metric, a log line, a file, a process state) instead
/// of sleeping a fixed time; an error from `condition` ends the wait at once.
pub fn wait_until(
    timeout: Duration,
    what: &str,
    mut condition: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut interval = Duration::from_millis(10);
    loop {
        if condition()? {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        // The poll interval between two checks of the condition, not a wait for a signal.
        std::thread::sleep(interval.min(left));
        interval = (interval * 2).min(Duration::from_millis(200));
    }
}

/// The random source of a randomised test: xorshift64* seeded from `TERN_TEST_SEED` when it is
/// set (to replay a failed run), otherwise from the clock and the PID. The seed is printed either
/// way, so a failure's output says how to replay it.
#[derive(Debug, Clone)]
pub struct TestRng(u64);

impl TestRng {
    /// Seeds the generator for the test called `test` and prints the seed.
    pub fn from_env(test: &str) -> anyhow::Result<Self> {
        let seed = match std::env::var("TERN_TEST_SEED") {
            Ok(text) => text
                .trim()
                .parse()
                .with_context(|| format!("TERN_TEST_SEED={text:?} is not a u64"))?,
            Err(_) => fresh_seed(),
        };
        eprintln!("{test}: seed {seed} (replay with TERN_TEST_SEED={seed})");
        Ok(Self::new(seed))
    }

    /// A generator with this seed (xorshift needs a non-zero state; 0 stands for 1).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }
}

fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Truncation is fine: any 64 bits of the clock make a seed.
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

/// Wall-clock milliseconds since the epoch, for record timestamps: Kafka's retention (7 days by
/// default) removes records with older timestamps right after they arrive.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The repository root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> anyhow::Result<Self> {
        static COUNTER: Mutex<u32> = Mutex::new(0);
        let n = {
            let mut guard = COUNTER.lock().unwrap_or_else(|e| e.into_inner());
            *guard += 1;
            *guard
        };
        let path =
            std::env::temp_dir().join(format!("tern-e2e-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `tern serve` process.
#[derive(Debug)]
pub struct Gateway {
    child: Option<Child>,
    pub admin: SocketAddr,
    /// The MQTT listener's address, learnt from the `mqtt listener on ADDR` log line.
    pub mqtt: SocketAddr,
    /// The Kafka listener's address, learnt from the `kafka listener on ADDR` log line (port 0
    /// while none was seen: the listener is disabled).
    pub kafka: SocketAddr,
    stderr: mpsc::Receiver<String>,
    log: Vec<String>,
}

/// What [`Gateway::start`] runs: `tern serve` with these extra arguments.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    pub args: Vec<String>,
    /// The MQTT listener's address [default: `127.0.0.1:0`, a free port]. A fixed one lets a
    /// restarted gateway come back where its clients reconnect (see [`free_port`]).
    pub mqtt_listen: Option<SocketAddr>,
}

impl Gateway {
    /// Starts `tern serve --data-dir DIR` on loopback port 0 and waits for its ready line.
    pub fn start(data_dir: &Path, options: &ServeOptions) -> anyhow::Result<Self> {
        let mut gateway = Self::spawn(data_dir, options)?;
        gateway.wait_ready(Duration::from_secs(30))?;
        Ok(gateway)
    }

    /// [`Gateway::start`] with the process's soft and hard `RLIMIT_NOFILE` set to `nofile`.
    pub fn start_with_nofile(
        data_dir: &Path,
        options: &ServeOptions,
        nofile: u64,
    ) -> anyhow::Result<Self> {
        let mut gateway = Self::spawn_with(data_dir, options, Some(nofile), &[])?;
        gateway.wait_ready(Duration::from_secs(30))?;
        Ok(gateway)
    }

    /// Like [`Gateway::start`], with extra environment variables (e.g. `LD_PRELOAD`).
    pub fn start_with_env(
        data_dir: &Path,
        options: &ServeOptions,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut gateway = Self::spawn_with(data_dir, options, None, env)?;
        gateway.wait_ready(Duration::from_secs(30))?;
        Ok(gateway)
    }

    /// Starts `tern serve` without waiting for it to become ready.
    pub fn spawn(data_dir: &Path, options: &ServeOptions) -> anyhow::Result<Self> {
        Self::spawn_with(data_dir, options, None, &[])
    }

    /// [`Gateway::spawn`] with extra environment variables (e.g. `NOTIFY_SOCKET`).
    pub fn spawn_with_env(
        data_dir: &Path,
        options: &ServeOptions,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::spawn_with(data_dir, options, None, env)
    }

    fn spawn_with(
        data_dir: &Path,
        options: &ServeOptions,
        nofile: Option<u64>,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mqtt = options
            .mqtt_listen
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
        let mut command = Command::new(tern_binary()?);
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--mqtt-listen")
            .arg(mqtt.to_string())
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(["--kafka-listen", "127.0.0.1:0"])
            .args(&options.args)
            .envs(env.iter().copied());
        if let Some(nofile) = nofile {
            use std::os::unix::process::CommandExt;
            let limit = tern_core::sys::FdLimit {
                soft: nofile,
                hard: nofile,
            };
            // SAFETY: `set_fd_limit` allocates nothing and calls only setrlimit, which is
            // async-signal-safe; `limit` is copied into the closure.
            unsafe {
                command.pre_exec(move || {
                    tern_core::sys::set_fd_limit(limit).map_err(std::io::Error::from)
                });
            }
        }
        Self::spawn_command(command)
    }

    /// Starts exactly `tern ARGS…` in `cwd` (no flags added) and waits for its ready line.
    pub fn start_exact(cwd: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let mut command = Command::new(tern_binary()?);
        command.args(args).current_dir(cwd);
        let mut gateway = Self::spawn_command(command)?;
        gateway.wait_ready(Duration::from_secs(30))?;
        Ok(gateway)
    }

    /// [`Gateway::start_exact`] in a network namespace of its own (`unshare --net`, loopback
    /// up; needs root, as the test command does): the default ports are tern's whatever else
    /// on the machine holds them. Reach its listeners with [`in_netns_of`].
    pub fn start_exact_isolated(cwd: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let mut command = Command::new("unshare");
        command
            .args([
                "--net",
                "--",
                "sh",
                "-c",
                "ip link set lo up && exec \"$0\" \"$@\"",
            ])
            .arg(tern_binary()?)
            .args(args)
            .current_dir(cwd);
        let mut gateway = Self::spawn_command(command)?;
        gateway.wait_ready(Duration::from_secs(30))?;
        Ok(gateway)
    }

    fn spawn_command(mut command: Command) -> anyhow::Result<Self> {
        command
            .env("RUST_LOG", log_filter())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().context("cannot start tern")?;
        let stderr = child.stderr.take().context("tern has no stderr pipe")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child: Some(child),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            mqtt: SocketAddr::from(([127, 0, 0, 1], 0)),
            kafka: SocketAddr::from(([127, 0, 0, 1], 0)),
            stderr: rx,
            log: Vec::new(),
        })
    }

    fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let line = self.next_line(deadline)?;
            if let Some(addr) = line.split("admin endpoint listening on ").nth(1) {
                self.admin = addr.trim().parse().context("admin address in log line")?;
            }
            if let Some(addr) = line.split("mqtt listener on ").nth(1) {
                self.mqtt = addr.trim().parse().context("MQTT address in log line")?;
            }
            if let Some(addr) = line.split("kafka listener on ").nth(1) {
                self.kafka = addr.trim().parse().context("Kafka address in log line")?;
            }
            if line.contains(" ready") && self.admin.port() != 0 && self.mqtt.port() != 0 {
                return Ok(());
            }
        }
    }

    /// Waits for the next stderr line, failing at `deadline` or when tern exits.
    fn next_line(&mut self, deadline: Instant) -> anyhow::Result<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.stderr.recv_timeout(left) {
            Ok(line) => {
                self.log.push(line.clone());
                Ok(line)
            }
            Err(_) => bail!(
                "tern not ready in time; stderr so far:\n{}",
                self.log.join("\n")
            ),
        }
    }

    /// Everything tern wrote to stderr so far.
    pub fn stderr_lines(&mut self) -> &[String] {
        while let Ok(line) = self.stderr.try_recv() {
            self.log.push(line);
        }
        &self.log
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` to this process (by its PID).
    pub fn signal(&self, signal: i32) -> anyhow::Result<()> {
        let pid = self.pid().context("tern already reaped")?;
        let pid = i32::try_from(pid).context("pid out of range")?;
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for the process to exit, failing after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let child = self.child.as_mut().context("tern already reaped")?;
        let mut status = None;
        wait_until(timeout, "tern to exit", || {
            status = child.try_wait()?;
            Ok(status.is_some())
        })?;
        self.child = None;
        self.drain_stderr(Instant::now() + Duration::from_secs(5));
        status.context("tern exited without a status")
    }

    /// Collects what tern wrote to stderr up to the pipe's end (the reader thread ends there),
    /// so that what an exited process said last is in [`Gateway::stderr_lines`]: the thread may
    /// still hold lines after `try_wait` saw the exit.
    fn drain_stderr(&mut self, deadline: Instant) {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => self.log.push(line),
                Err(_) => return,
            }
        }
    }

    /// Stops the gateway with SIGTERM and checks that it exits with status 0 within 15 s (a
    /// graceful shutdown); the error quotes its log otherwise.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGTERM)?;
        let status = self.wait_exit(Duration::from_secs(15))?;
        if status.code() != Some(0) {
            bail!("tern exited with {status}: {:#?}", self.stderr_lines());
        }
        Ok(())
    }

    /// `GET path` on the admin endpoint: (status, body).
    pub fn admin_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.admin, path)
    }

    /// The sum of the samples of metric `name` on `/metrics` whose labels start with `labels`
    /// (e.g. `topic="mqtt"`, or "" for every sample, labelled or not); `None` when there is none.
    pub fn metric_sum(&self, name: &str, labels: &str) -> anyhow::Result<Option<u64>> {
        metric_sum_at(self.admin, name, labels)
    }

    /// Waits until [`Gateway::metric_sum`] of `name`/`labels` satisfies `holds`; on timeout the
    /// error names `what`, the last value and quotes tern's last log lines.
    pub fn wait_metric(
        &mut self,
        name: &str,
        labels: &str,
        what: &str,
        timeout: Duration,
        holds: impl Fn(Option<u64>) -> bool,
    ) -> anyhow::Result<()> {
        let mut last = None;
        let waited = wait_until(timeout, what, || {
            last = self.metric_sum(name, labels)?;
            Ok(holds(last))
        });
        waited.with_context(|| {
            format!(
                "{name}{{{labels}}} is {last:?}; recent log: {:#?}",
                self.recent_log(20)
            )
        })
    }

    /// Waits until the upstream metrics whose labels start with `labels` report every durable
    /// record forwarded and no forwarder failing; on timeout the error quotes tern's last log
    /// lines.
    pub fn wait_forwarded(&mut self, labels: &str, timeout: Duration) -> anyhow::Result<()> {
        let mut last = (None, None);
        let waited = wait_until(timeout, "every record forwarded", || {
            let behind = self.metric_sum("tern_upstream_records_behind", labels)?;
            let failing = self.metric_sum("tern_upstream_failing", labels)?;
            last = (behind, failing);
            Ok(behind == Some(0) && failing == Some(0))
        });
        let (behind, failing) = last;
        waited.with_context(|| {
            format!(
                "still {behind:?} records behind, failing {failing:?}; recent log: {:#?}",
                self.recent_log(20)
            )
        })
    }

    /// The last `count` lines tern wrote to stderr.
    pub fn recent_log(&mut self, count: usize) -> Vec<String> {
        let lines = self.stderr_lines();
        lines[lines.len().saturating_sub(count)..].to_vec()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// [`Gateway::metric_sum`] against any admin endpoint (a QEMU gateway's forwarded one too).
pub fn metric_sum_at(admin: SocketAddr, name: &str, labels: &str) -> anyhow::Result<Option<u64>> {
    let (status, body) = http_get(admin, "/metrics")?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    let labelled = format!("{name}{{{labels}");
    let bare = format!("{name} ");
    let values: Vec<u64> = body
        .lines()
        .filter(|line| line.starts_with(&labelled) || labels.is_empty() && line.starts_with(&bare))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    Ok((!values.is_empty()).then(|| values.iter().sum()))
}

/// `tern passwd FILE USER` with `password` on stdin, or `tern passwd --delete FILE USER`
/// without one: the command an operator runs on the gateway. Its output, whatever the exit.
pub fn tern_passwd_output(
    file: &Path,
    user: &str,
    password: Option<&str>,
) -> anyhow::Result<Output> {
    let mut command = Command::new(tern_binary()?);
    command.arg("passwd");
    if password.is_none() {
        command.arg("--delete");
    }
    let mut child = command
        .arg(file)
        .arg(user)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run tern passwd")?;
    let mut stdin = child.stdin.take().context("no stdin pipe")?;
    if let Some(password) = password {
        writeln!(stdin, "{password}")?;
    }
    drop(stdin);
    Ok(child.wait_with_output()?)
}

/// Adds (or replaces) `user` with `password` in `file` (`tern passwd`); an error with its
/// stderr when it fails.
pub fn tern_passwd(file: &Path, user: &str, password: &str) -> anyhow::Result<()> {
    let output = tern_passwd_output(file, user, Some(password))?;
    if !output.status.success() {
        bail!(
            "tern passwd failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Throwaway certificates from `scripts/gen-test-certs.sh` (openssl) in `DIR/certs`: a test CA
/// (`ca.pem`), a server certificate for 127.0.0.1/localhost (`server.pem`, `server.key`) and
/// client certificates; the MQTT and Kafka TLS tests share them.
pub fn test_certs(dir: &Path) -> anyhow::Result<PathBuf> {
    let out = dir.join("certs");
    let status = Command::new("bash")
        .arg(workspace_root().join("scripts/gen-test-certs.sh"))
        .arg(&out)
        .status()
        .context("cannot run scripts/gen-test-certs.sh")?;
    if !status.success() {
        bail!("gen-test-certs.sh failed: {status}");
    }
    Ok(out)
}

/// Runs `tern ARGS…` to completion: (exit status, stdout, stderr).
pub fn run_tern(args: &[&str]) -> anyhow::Result<(ExitStatus, String, String)> {
    run_to_end(&tern_binary()?, args)
}

/// Runs `tern-bench ARGS…` to completion: (exit status, stdout, stderr).
pub fn run_bench(args: &[&str]) -> anyhow::Result<(ExitStatus, String, String)> {
    run_to_end(&bench_binary()?, args)
}

fn run_to_end(binary: &Path, args: &[&str]) -> anyhow::Result<(ExitStatus, String, String)> {
    let output = Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    Ok((
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// A loopback address with a port that was free a moment ago (the OS picked it; the listener is
/// closed again), for a server that must come back on the same port after a restart. Never the
/// same port twice in one test process, so parallel tests cannot be handed the same one.
pub fn free_port() -> anyhow::Result<SocketAddr> {
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..100 {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        if !handed_out.contains(&addr.port()) {
            handed_out.push(addr.port());
            return Ok(addr);
        }
    }
    bail!("no new free loopback port after 100 tries")
}

/// Runs `work` on a thread that has joined the network namespace of process `pid` (a gateway
/// of [`Gateway::start_exact_isolated`]), so its sockets reach that namespace's loopback.
pub fn in_netns_of<T: Send>(
    pid: u32,
    work: impl FnOnce() -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    use std::os::fd::AsRawFd;
    let namespace = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .with_context(|| format!("cannot open the network namespace of pid {pid}"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns only reads the descriptor, which outlives the call; it moves
                // this thread alone, which ends with the scope.
                if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    bail!(
                        "cannot join the network namespace of pid {pid}: {}",
                        std::io::Error::last_os_error()
                    );
                }
                work()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))?
    })
}

/// A minimal HTTP/1.1 GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .context("no header end in reply")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status in reply")?;
    Ok((status, body.to_owned()))
}

/// One record as `tern log dump` prints it (text fields; binary ones stay base64).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedRecord {
    pub partition: u64,
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<String>,
    pub value: String,
    pub headers: Vec<(String, String)>,
}

impl DumpedRecord {
    /// The first header called `name`, or "" if there is none.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map_or("", |(_, value)| value.as_str())
    }
}

/// Every record of `topic` under `data_dir`, read with `tern log dump`.
pub fn read_log(data_dir: &Path, topic: &str) -> anyhow::Result<Vec<DumpedRecord>> {
    let dir = data_dir.display().to_string();
    let (status, stdout, stderr) =
        run_tern(&["log", "dump", "--data-dir", &dir, "--topic", topic])?;
    if !status.success() {
        bail!("tern log dump failed: {stderr}");
    }
    stdout.lines().map(parse_dump_line).collect()
}

/// Every record of `topic` under `data_dir` as the JSON objects `tern log dump EXTRA…` prints
/// (for example `--decode reading`).
pub fn dump_json(
    data_dir: &Path,
    topic: &str,
    extra: &[&str],
) -> anyhow::Result<Vec<serde_json::Value>> {
    let dir = data_dir.display().to_string();
    let mut args = vec!["log", "dump", "--data-dir", &dir, "--topic", topic];
    args.extend_from_slice(extra);
    let (status, stdout, stderr) = run_tern(&args)?;
    if !status.success() {
        bail!("tern {} failed: {stderr}", args.join(" "));
    }
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).with_context(|| format!("dump line {line:?}")))
        .collect()
}

fn parse_dump_line(line: &str) -> anyhow::Result<DumpedRecord> {
    let json: serde_json::Value = serde_json::from_str(line).context("dump line is not JSON")?;
    let text = |value: &serde_json::Value| value.as_str().map(str::to_owned);
    let headers = json["headers"]
        .as_array()
        .context("dump line has no headers")?
        .iter()
        .map(|h| {
            (
                text(&h["name"]).unwrap_or_default(),
                text(&h["value"]).unwrap_or_default(),
            )
        })
        .collect();
    Ok(DumpedRecord {
        partition: json["partition"].as_u64().context("no partition")?,
        offset: json["offset"].as_u64().context("no offset")?,
        timestamp_ms: json["timestamp"].as_i64().context("no timestamp")?,
        key: text(&json["key"]),
        value: text(&json["value"]).context("no value")?,
        headers,
    })
}

/// Copies the directory tree `from` to `to` (created), files and subdirectories.
pub fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
