//! `tern-bench icount`: guest instructions per durable QoS 1 message on the Pi's instruction
//! sets. The cross-built release `tern` and Debian's arm64/armhf Mosquitto run under QEMU user
//! mode (`qemu-aarch64`, `qemu-arm`) with the bench's TCG plugin (`plugin.rs`), which counts
//! every guest instruction the broker executes. Each broker serves N messages in one run and 2N
//! in another; the difference of the two counts over N is the work of one message, start-up and
//! shut-down cancelling. Time under QEMU means nothing, so none is reported.
//!
//! Before any broker runs, the plugin's count of a known loop must be exact on each
//! architecture; otherwise the bench stops. It never touches a process it did not start.

mod estimate;
mod memory;
mod plugin;
mod records;
mod report;
mod symbols;

use std::path::{Path, PathBuf};
use std::process::Command;

pub use memory::MemoryFigure;
pub use plugin::{Plugin, SelfTest, expected_loop_insns};
pub use records::{KafkaPath, RecordCount};
pub use report::Report;

use report::BrokerCount;

use crate::BenchError;
use crate::mqtt::load::{self, Load};
use crate::mqtt::servers::Server;

/// An ARM architecture of the gateways, as QEMU user mode emulates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Aarch64,
    Armv7,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Aarch64, Arch::Armv7];

    pub fn name(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64",
            Arch::Armv7 => "armv7",
        }
    }

    /// Rust's target triple (scripts/cross.sh builds tern for it).
    pub fn triple(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64-unknown-linux-gnu",
            Arch::Armv7 => "armv7-unknown-linux-gnueabihf",
        }
    }

    /// Debian's name of the architecture (the peers' packages).
    pub fn debian(self) -> &'static str {
        match self {
            Arch::Aarch64 => "arm64",
            Arch::Armv7 => "armhf",
        }
    }

    pub fn qemu_program(self) -> &'static str {
        match self {
            Arch::Aarch64 => "qemu-aarch64",
            Arch::Armv7 => "qemu-arm",
        }
    }

    pub fn cross_gcc(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64-linux-gnu-gcc",
            Arch::Armv7 => "arm-linux-gnueabihf-gcc",
        }
    }

    /// A binutils program of the cross toolchain (`nm`).
    pub fn cross_tool(self, tool: &str) -> String {
        let gcc = self.cross_gcc();
        format!("{}{tool}", gcc.strip_suffix("gcc").unwrap_or(gcc))
    }

    /// The cross toolchain's C library, where QEMU finds tern's loader and libraries.
    fn cross_sysroot(self) -> &'static str {
        match self {
            Arch::Aarch64 => "/usr/aarch64-linux-gnu",
            Arch::Armv7 => "/usr/arm-linux-gnueabihf",
        }
    }

    /// QEMU with the plugin writing its count to `out`; the guest program and its arguments
    /// follow. Without `-L` (the known loop is static) the sysroot is not needed.
    fn qemu(self, plugin: &Plugin, out: &Path) -> Command {
        let mut command = Command::new(self.qemu_program());
        command.arg("-plugin").arg(plugin.argument(out, None));
        command
    }

    /// QEMU with the plugin writing its count to `out.count` (and, when attributing, its
    /// blocks to `out.blocks`), finding libraries under `sysroot`.
    fn qemu_in(self, sysroot: &Path, plugin: &Plugin, out: &Outputs) -> Command {
        let mut command = Command::new(self.qemu_program());
        command
            .arg("-plugin")
            .arg(plugin.argument(&out.count, out.blocks.as_deref()));
        command.arg("-L").arg(sysroot);
        command
    }
}

/// Runs of one broker and message count made before giving up when QEMU writes no count.
const RUN_ATTEMPTS: u32 = 3;

/// Where scripts/arm-peers.sh puts the cross-built NATS server in each peer root (Go, static).
const NATS_SERVER: &str = "usr/sbin/nats-server";

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcountOptions {
    pub archs: Vec<Arch>,
    /// Publisher connections of each run.
    pub publishers: usize,
    /// QoS 1 messages per publisher of the short run (the long run sends twice as many).
    pub messages: usize,
    pub size: usize,
    /// Unacknowledged QoS 1 publishes per connection.
    pub window: usize,
    /// Where scripts/cross.sh put the release builds (`<dir>/<triple>/release/tern`).
    pub cross_dir: PathBuf,
    /// Where scripts/arm-peers.sh unpacked Mosquitto and put NATS (`<dir>/arm64`,
    /// `<dir>/armhf`); `None` measures tern alone.
    pub peers_dir: Option<PathBuf>,
    /// Only check the plugin against the known loop.
    pub self_test_only: bool,
    /// Attribute each broker's instructions per message to functions and keep this many
    /// (`--symbols N`); tern then runs as its unstripped twin (`release-symbols`, same code).
    pub symbols: Option<usize>,
    /// Where to write tern's symbol ordering files (`--link-order`, with `symbols`).
    pub link_order: Option<PathBuf>,
    /// What to count (`--measure`).
    pub measures: Vec<Measure>,
    /// Pairs of publish runs per broker (`--runs`): tern's count follows how many publishes a
    /// batch gathers, so one pair is one draw.
    pub runs: usize,
    /// Records of the short consume and forward runs' backlog (the long one holds twice as many).
    pub records: u64,
    /// Bootstrap servers of the cluster the forward runs send to.
    pub kafka: Vec<String>,
    /// Idle MQTT clients of the memory runs.
    pub idle_clients: usize,
    /// Compression of the forward runs' upstream batches.
    pub forward_codec: tern_upstream::Codec,
}

/// What `tern-bench icount` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Measure {
    /// Instructions per durable QoS 1 message, tern and the peers.
    Publish,
    /// tern's instructions per record a Kafka client reads from its Kafka listener.
    Consume,
    /// tern's instructions per record its forwarder sends to Kafka (needs --kafka).
    Forward,
    /// Each broker's resident memory and address space with --idle-clients idle clients.
    Idle,
}

/// Where the plugin writes one run's figures.
#[derive(Debug)]
struct Outputs {
    count: PathBuf,
    blocks: Option<PathBuf>,
}

/// Runs the self-test and, unless only it was asked for, the brokers.
pub fn run(options: &IcountOptions) -> Result<Report, BenchError> {
    validate(options)?;
    let work = WorkDir::new()?;
    let plugin = Plugin::build(work.path())?;
    let mut report = Report::new(options);
    for &arch in &options.archs {
        let test = plugin.self_test(arch, plugin::LOOP_PASSES)?;
        report.self_tests.push(test);
        if !test.exact() {
            return Err(BenchError::Inexact {
                arch: arch.name(),
                expected: expected_loop_insns(test.passes),
                counted: test.short,
            });
        }
    }
    if options.self_test_only {
        return Ok(report);
    }
    let runtime = crate::runtime(None)?;
    let paths: Vec<KafkaPath> = options
        .measures
        .iter()
        .filter_map(|measure| match measure {
            Measure::Consume => Some(KafkaPath::Consume),
            Measure::Forward => Some(KafkaPath::Forward),
            Measure::Publish | Measure::Idle => None,
        })
        .collect();
    let backlogs = match paths.is_empty() {
        true => None,
        false => Some(runtime.block_on(records::Backlogs::build(
            work.path(),
            options.records,
            options.size,
        ))?),
    };
    let kafka = match paths.contains(&KafkaPath::Forward) {
        true => Some(runtime.block_on(tern_upstream::KafkaUpstream::connect(
            &tern_upstream::UpstreamConfig {
                bootstrap: options.kafka.clone(),
                ..tern_upstream::UpstreamConfig::default()
            },
        ))?),
        false => None,
    };
    let run_id = crate::upstream::run_id();
    let upstream = kafka.as_ref().map(|kafka| records::Upstream {
        kafka,
        bootstrap: &options.kafka,
        run_id: &run_id,
    });
    for &arch in &options.archs {
        let runs = Runs {
            arch,
            work: work.path(),
            options,
            runtime: &runtime,
            plugin: &plugin,
        };
        if options.measures.contains(&Measure::Publish) {
            runs.brokers(&mut report)?;
        }
        if let Some(backlogs) = &backlogs {
            let counts = runs.per_record(backlogs, upstream.as_ref(), &paths)?;
            report.records.extend(counts);
        }
        if options.measures.contains(&Measure::Idle) {
            let figures = runs.idle_memory(options.idle_clients)?;
            report.memory.extend(figures);
        }
    }
    Ok(report)
}

fn validate(options: &IcountOptions) -> Result<(), BenchError> {
    let checks = [
        (options.archs.is_empty(), "--arch", "needs at least one"),
        (
            options.publishers == 0,
            "--publishers",
            "must be at least 1",
        ),
        (options.messages == 0, "--messages", "must be at least 1"),
        (
            options.symbols == Some(0),
            "--symbols",
            "must be at least 1",
        ),
        (
            options.measures.is_empty(),
            "--measure",
            "needs at least one",
        ),
        (options.records == 0, "--records", "must be at least 1"),
        (
            options.idle_clients == 0,
            "--idle-clients",
            "must be at least 1",
        ),
        (
            options.measures.contains(&Measure::Forward) && options.kafka.is_empty(),
            "--measure forward",
            "needs --kafka HOST:PORT",
        ),
        (
            !(1..=65_535).contains(&options.window),
            "--window",
            "must be between 1 and 65535",
        ),
    ];
    match checks.iter().find(|(bad, ..)| *bad) {
        Some((_, option, reason)) => Err(BenchError::Invalid { option, reason }),
        None => Ok(()),
    }
}

/// The measured runs of one architecture.
struct Runs<'a> {
    arch: Arch,
    work: &'a Path,
    options: &'a IcountOptions,
    runtime: &'a tokio::runtime::Runtime,
    plugin: &'a Plugin,
}

impl Runs<'_> {
    /// The per-message counts of tern and of each peer the options name.
    fn brokers(&self, report: &mut Report) -> Result<(), BenchError> {
        report
            .brokers
            .push(self.per_message("tern", |out| Server::tern_under(self.tern_command(out)))?);
        if let Some(peers) = &self.options.peers_dir {
            let root = peers.join(self.arch.debian());
            report.brokers.push(self.per_message("mosquitto", |out| {
                let mut command = self.arch.qemu_in(&root, self.plugin, out);
                command.arg(root.join("usr/sbin/mosquitto"));
                Server::mosquitto_under(command)
            })?);
            let nats = root.join(NATS_SERVER);
            if nats.is_file() {
                report.brokers.push(self.per_message("nats", |out| {
                    let mut command = self.arch.qemu_in(&root, self.plugin, out);
                    command.arg(&nats);
                    Server::nats_under(command)
                })?);
            }
        }
        Ok(())
    }

    /// QEMU with the plugin writing to `out`, running the cross-built tern (its unstripped
    /// twin when attributing); `serve` and its arguments follow.
    fn tern_command(&self, out: &Outputs) -> Command {
        let exe = match self.options.symbols {
            Some(_) => symbols::unstripped(&self.options.cross_dir, self.arch),
            None => self
                .options
                .cross_dir
                .join(self.arch.triple())
                .join("release/tern"),
        };
        let sysroot = Path::new(self.arch.cross_sysroot());
        let mut command = self.arch.qemu_in(sysroot, self.plugin, out);
        command.arg(exe);
        command
    }

    /// Guest instructions per message of the broker `start` starts (with the plugin writing to
    /// the path it is given): one run of N messages and one of 2N.
    fn per_message(
        &self,
        broker: &'static str,
        start: impl Fn(&Outputs) -> Result<Server, BenchError>,
    ) -> Result<BrokerCount, BenchError> {
        let messages = (self.options.publishers * self.options.messages) as u64;
        let mut pairs = Vec::with_capacity(self.options.runs);
        for _ in 0..self.options.runs.max(1) {
            let (short, short_blocks) = self.count(broker, &start, self.options.messages)?;
            let (long, long_blocks) = self.count(broker, &start, 2 * self.options.messages)?;
            let count = BrokerCount::new(self.arch, broker, messages, short, long);
            pairs.push((count, short_blocks, long_blocks));
        }
        let figures: Vec<f64> = pairs.iter().map(|(c, ..)| c.insns_per_message).collect();
        let median = crate::stats::median_run(pairs, |(c, ..)| c.insns_per_message);
        let Some((mut count, short_blocks, long_blocks)) = median else {
            return Err(BenchError::Tool {
                program: broker.to_owned(),
                message: "no publish run".into(),
            });
        };
        count.runs = figures;
        if let (Some(top), Some(short), Some(long)) =
            (self.options.symbols, short_blocks, long_blocks)
        {
            if let (Some(dir), "tern") = (&self.options.link_order, broker) {
                let exe = symbols::unstripped(&self.options.cross_dir, self.arch);
                let order = symbols::executed(self.arch, &exe, &[&short, &long])?;
                let path = dir.join(format!("{}.txt", self.arch.name()));
                let text: String = order.iter().map(|name| format!("{name}\n")).collect();
                std::fs::write(&path, text).map_err(|source| BenchError::File {
                    op: "writing the link order",
                    path: path.clone(),
                    source,
                })?;
                eprintln!("{}: {} functions", path.display(), order.len());
            }
            let mut shares = symbols::per_message(self.arch, &short, &long, messages)?;
            shares.truncate(top);
            count.functions = shares;
        }
        Ok(count)
    }

    /// The instructions of one whole broker run: start, `messages` per publisher, SIGTERM.
    fn count(
        &self,
        broker: &'static str,
        start: &impl Fn(&Outputs) -> Result<Server, BenchError>,
        messages: usize,
    ) -> Result<(u64, Option<symbols::Blocks>), BenchError> {
        let stem = format!("{broker}-{}-{messages}", self.arch.name());
        let load = Load {
            publishers: self.options.publishers,
            messages,
            size: self.options.size,
            qos1: true,
            window: self.options.window,
        };
        let label = format!("i{}{messages}", self.arch.name());
        let mut attempt = 1;
        loop {
            let run = self.counted(&stem, start, |server| {
                self.runtime
                    .block_on(load::run(server.addr, load, &label))
                    .map(|_| ())
            });
            match run {
                // QEMU ended the process without calling the plugin's exit callback (seen once
                // with NATS under qemu-arm): the run has no count, so it is run again.
                Err(BenchError::Parse { path }) if attempt < RUN_ATTEMPTS => {
                    eprintln!("no count in {}: running {stem} again", path.display());
                    attempt += 1;
                }
                run => return run,
            }
        }
    }

    /// The instructions of one whole broker run: `start` with the plugin writing to outputs
    /// named `stem`, `work`, SIGTERM; and, when attributing, its blocks.
    fn counted(
        &self,
        stem: &str,
        start: impl FnOnce(&Outputs) -> Result<Server, BenchError>,
        work: impl FnOnce(&Server) -> Result<(), BenchError>,
    ) -> Result<(u64, Option<symbols::Blocks>), BenchError> {
        let out = Outputs {
            count: self.work.join(format!("{stem}.count")),
            blocks: self
                .options
                .symbols
                .map(|_| self.work.join(format!("{stem}.blocks"))),
        };
        writable_by_anyone(&out.count)?;
        if let Some(blocks) = &out.blocks {
            writable_by_anyone(blocks)?;
        }
        let server = start(&out)?;
        work(&server)?;
        let status = server.stop("broker")?;
        if !status.success() {
            return Err(BenchError::Tool {
                program: stem.to_owned(),
                message: format!("exited with {status} under QEMU"),
            });
        }
        let blocks = out
            .blocks
            .as_deref()
            .map(symbols::Blocks::read)
            .transpose()?;
        Ok((plugin::read_count(&out.count)?, blocks))
    }
}

/// Creates the empty count file `path` writable by every user: Mosquitto started as root
/// drops to its own user before it exits, when the plugin writes the count.
fn writable_by_anyone(path: &Path) -> Result<(), BenchError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| BenchError::File {
        op: "creating",
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(path, "").map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(io)
}

/// The bench's own temporary directory (the plugin, the loop programs, the counts), removed on
/// drop.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> Result<Self, BenchError> {
        let path = std::env::temp_dir().join(format!("tern-bench-icount-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|source| BenchError::File {
            op: "creating",
            path: path.clone(),
            source,
        })?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
