//! The `tern-bench` command line: subcommands and their flags. Parsing only; the benches live in
//! this crate's `log`, `mqtt` and `upstream` modules.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tern_upstream::Codec;

use crate::icount::{Arch, IcountOptions, Measure};
use crate::kafka::KafkaBenchOptions;
use crate::kafka::cold::ColdReadOptions;
use crate::mqtt::BenchOptions;
use crate::stress::StressOptions;
use crate::upstream::{UpstreamBenchOptions, codec_name};

/// tern-bench: tern's performance figures (never part of the tests' pass/fail) and the crash
/// tests' stress writer. Not shipped on a gateway.
#[derive(Debug, Parser)]
#[command(name = "tern-bench", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The log against the raw device and SQLite: throughput, write amplification, latency,
    /// reads, recovery, memory and a flash-lifetime projection, all on one file system.
    Log(BenchLogArgs),
    /// MQTT publish throughput and PUBACK latency: tern (durable acks) next to Mosquitto under
    /// the same load, with their ratio, plus tern's memory with idle clients. Needs `mosquitto`
    /// on PATH unless --broker is given.
    Mqtt(MqttBenchArgs),
    /// Forwarding to Kafka against a cluster you started: live MQTT ingest (the anchor) and the
    /// steady forwarding rate, then the drain of a backlog per compression codec with bytes on
    /// the wire per payload byte. Creates topics named `tern-bench.*`.
    Upstream(UpstreamBenchArgs),
    /// The link's return on a thin uplink, per strategy (strict order, priority classes, live
    /// first): a day's telemetry backlog drains under a bandwidth cap while live telemetry and
    /// alarms arrive; time to the first live record upstream, alarm latency, drain time against
    /// strict order's, each kind's share of the cap. Against a cluster you started; creates
    /// topics named `tern-bench.thin-*`.
    ThinLink(ThinLinkArgs),
    /// A fleet through a regional outage: N `tern serve` children (half mirror, half shared)
    /// with QoS 1 sensors forward through one proxy that cuts every link at once, then returns
    /// them; time until every backlog drained, the brokers' new connections per second, request
    /// latency and Produce throttling, the gateways' CPU and RSS, and a read-back of every
    /// acknowledged reading, with the reconnects jittered and without. Against a cluster you
    /// started (needs `kcat`); creates topics named `tern-bench.fleet-*`.
    Fleet(FleetArgs),
    /// Flash wear at sensor rates: a trickle of 100 B QoS 1 messages from 50 clients at
    /// 10, 100 and 1,000 msg/s against `tern serve` with its defaults on a fresh loop-mounted
    /// ext4 (root), beside SQLite (WAL, synchronous=FULL) at tern's commit cadence: device
    /// bytes per message, GB a day, projected card years, PUBACK p50/p99.
    Wear(WearArgs),
    /// The Kafka listener against a single-node Apache Kafka (KRaft) it starts from
    /// --kafka-classpath: consume and acks=all produce throughput with kcat (against Kafka
    /// fsyncing every write and Kafka's default), and tern's memory with a consumer group of 3.
    /// Needs `kcat` and `java` on PATH.
    Kafka(KafkaBenchArgs),
    /// Commands from the datacenter through `tern serve` (`[upstream.commands]`) to an MQTT
    /// device: produce-to-receipt p50/p99 on an idle link and while the upstream drains a
    /// capped backlog, and commands a second stored from a burst beside the same child's MQTT
    /// ingest. Needs a running cluster (scripts/bench-upstream.sh) and `java`.
    Downstream(DownstreamBenchArgs),
    /// Guest instructions per durable QoS 1 message on aarch64 and armv7: the cross-built
    /// release tern (scripts/cross.sh) and Debian's arm64/armhf Mosquitto (scripts/arm-peers.sh)
    /// under QEMU user mode with the bench's instruction-count plugin, N and then 2N messages.
    /// Checks the plugin on a known loop first. Needs gcc, the cross gcc and qemu-user.
    Icount(IcountArgs),
    /// PUBACK p50/p99 of a steady QoS 1 publisher alone and while `kcat` fetches a cold
    /// backlog from offset 0, with tern's reads from --dir's device limited to --read-iops
    /// (cgroup v1 blkio) and the page cache dropped. Root only; needs `kcat`.
    /// `scripts/cold-read-bench.sh` makes the loop-mounted --dir.
    ColdRead(ColdReadArgs),
    /// Internal: appends to a log until killed, printing progress (the bench's child process
    /// for recovery time and peak memory).
    #[command(hide = true)]
    LogWriter(LogWriterArgs),
    /// Crash-test helper: append from several tasks, printing each acknowledged append.
    #[command(hide = true)]
    Stress(StressArgs),
}

/// Which data directory a `tern-bench wear` run of tern starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DirState {
    /// A new, empty data directory: its preallocated segment has never been written.
    Fresh,
    /// Aged until retention recycles segments: where a card spends its life.
    Steady,
}

/// Flags of the hidden `tern-bench stress`: the crash tests' writer.
#[derive(Debug, Args)]
pub struct StressArgs {
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    #[arg(long, default_value_t = 4)]
    pub tasks: u32,
    /// Appends per task; 0 = until killed.
    #[arg(long, default_value_t = 0)]
    pub appends: u64,
    #[arg(long, default_value_t = 64 * 1024)]
    pub segment_bytes: u64,
    /// Group-commit window in milliseconds.
    #[arg(long, default_value_t = 20)]
    pub max_delay_ms: u64,
    /// Shortest commit window while no fdatasync runs (`flush.min_delay`) [default: the
    /// config default, capped at --max-delay-ms].
    #[arg(long)]
    pub min_delay_ms: Option<u64>,
    /// Commit size that closes the window at once while no fdatasync runs
    /// (`flush.min_bytes`) [default: the config default].
    #[arg(long)]
    pub min_bytes: Option<u64>,
    /// Open-loop appends per second (0 = closed loop printing acks).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    #[arg(long, default_value_t = 100)]
    pub record_bytes: usize,
    /// Partition size limit; the oldest segments are dropped (and recycled) past it.
    #[arg(long, default_value_t = 0)]
    pub retention_bytes: u64,
}

impl StressArgs {
    /// The run these flags describe.
    pub fn options(&self) -> StressOptions {
        StressOptions {
            data_dir: self.data_dir.clone(),
            tasks: self.tasks,
            appends: self.appends,
            segment_bytes: self.segment_bytes,
            max_delay: Duration::from_millis(self.max_delay_ms),
            min_delay: self.min_delay_ms.map(Duration::from_millis),
            min_bytes: self.min_bytes,
            rate: self.rate,
            seconds: self.seconds,
            record_bytes: self.record_bytes,
            retention_bytes: self.retention_bytes,
        }
    }
}

/// Flags of `tern-bench log`.
#[derive(Debug, Args)]
pub struct BenchLogArgs {
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Parent directory for the bench's files (the ext4 image as root) [default: the system
    /// temporary directory].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Smaller sizes and a single run per workload: seconds instead of minutes.
    #[arg(long)]
    pub quick: bool,
    /// Do not make a loop-mounted ext4 image even as root: write in DIR and count the process's
    /// own write_bytes.
    #[arg(long)]
    pub no_loop: bool,
    /// Commit window for tern's append workloads instead of the default `flush.max_delay`
    /// (experiments behind that default).
    #[arg(long, value_name = "MS")]
    pub commit_max_delay_ms: Option<u64>,
    /// Early-commit size for tern's append workloads instead of the default `flush.max_bytes`.
    #[arg(long, value_name = "BYTES")]
    pub commit_max_bytes: Option<u64>,
    /// Run only the raw anchor and the main 1 KiB workload (64 appenders × 32 in flight):
    /// for profiling the log's ceiling.
    #[arg(long)]
    pub main_only: bool,
    /// Payload MiB per tern append run instead of the plan's (longer runs for a profiler).
    #[arg(long, value_name = "MIB")]
    pub append_mib: Option<u64>,
}

/// Flags of `tern-bench wear`.
#[derive(Debug, Args)]
pub struct WearArgs {
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Messages per second of each workload.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    pub rates: Vec<f64>,
    /// Publishing clients.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Seconds publishing before the counters are read.
    #[arg(long, default_value_t = 5)]
    pub warmup: u64,
    /// Seconds measured.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Runs per figure; the median is printed.
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Data directories tern runs from: `fresh` (new, its segment never written) and `steady`
    /// (first aged by a flood until the default retention recycles segments: the state a card
    /// lives in; the projected years are this row's).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "fresh,steady"
    )]
    pub states: Vec<DirState>,
    /// Parent directory for the ext4 images [default: the system temporary directory].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Do not loop-mount even as root (device bytes are then NOT counted: only this process's).
    #[arg(long)]
    pub no_loop: bool,
    /// Card size of the lifetime projection, bytes.
    #[arg(long, default_value_t = 32_000_000_000)]
    pub card_bytes: u64,
    /// Rated program/erase cycles of the card.
    #[arg(long, default_value_t = 1000)]
    pub card_cycles: u64,
    /// TOML appended to tern's config (experiments; printed beside the figures).
    #[arg(long, value_name = "TOML", default_value = "")]
    pub tern_config: String,
    /// Remount each ext4 image with `lazytime` (inode times in memory, written at most daily
    /// or on sync): what the mount option saves of ext4's own journal writes.
    #[arg(long)]
    pub lazytime: bool,
}

/// Flags of `tern-bench downstream`.
#[derive(Debug, Args)]
pub struct DownstreamBenchArgs {
    /// Bootstrap servers of the Kafka cluster (it is not started for you).
    #[arg(
        long,
        value_name = "HOST:PORT[,HOST:PORT...]",
        value_delimiter = ',',
        required = true
    )]
    pub kafka: Vec<String>,
    /// Latency samples per phase (one command in flight).
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub samples: usize,
    /// Commands produced at once for the stored-per-second figure.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub burst: u64,
    /// MQTT messages (100 B, QoS 1) in the upstream backlog of the draining phase.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub backlog: u64,
    /// The child's upstream `bandwidth` cap in KiB/s [default: about 1 Mbit/s].
    #[arg(long, value_name = "KIB", default_value_t = 128)]
    pub bandwidth_kib: u64,
    /// Java classpath with Kafka's tools, e.g. `tests/kafka/cache/*`: its console producer
    /// sends the commands.
    #[arg(long, value_name = "CLASSPATH", required = true)]
    pub kafka_classpath: String,
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl DownstreamBenchArgs {
    pub fn options(&self) -> crate::downstream::DownstreamBenchOptions {
        crate::downstream::DownstreamBenchOptions {
            kafka: self.kafka.clone(),
            samples: self.samples,
            burst: self.burst,
            backlog: self.backlog,
            bandwidth_kib: self.bandwidth_kib,
            kafka_classpath: self.kafka_classpath.clone(),
        }
    }
}

/// Flags of `tern-bench upstream`.
#[derive(Debug, Args)]
pub struct UpstreamBenchArgs {
    /// Bootstrap servers of the Kafka cluster to measure against (it is not started for you:
    /// scripts/bench-upstream.sh does that).
    #[arg(
        long,
        value_name = "HOST:PORT[,HOST:PORT...]",
        value_delimiter = ',',
        required = true
    )]
    pub kafka: Vec<String>,
    /// Records in the backlog drained per codec.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub records: u64,
    /// Payload bytes per record and per MQTT message.
    #[arg(long, value_name = "S", default_value_t = 64)]
    pub size: usize,
    /// Runs per figure; the median is printed.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub repetitions: usize,
    /// Only these codecs [default: none,gzip,lz4,snappy,zstd].
    #[arg(long, value_name = "CODEC", value_delimiter = ',', value_parser = parse_codec)]
    pub codec: Vec<Codec>,
    /// `bandwidth` cap of the capped drain, bytes per second [default: 1 Mbit/s].
    #[arg(long, value_name = "BYTES", default_value_t = 125_000)]
    pub bandwidth: u64,
    /// Java classpath with Kafka's tools, e.g. `tests/kafka/cache/*`: the drain is compared with
    /// Kafka's own producer (`ProducerPerformance`) on the same cluster. Without it, it is not.
    #[arg(long, value_name = "CLASSPATH")]
    pub kafka_classpath: Option<String>,
    /// Another build's `tern` binary (e.g. an earlier commit's release build): the backlog is
    /// also drained by `tern serve` of that build, beside this build's, in mirror and shared
    /// mode, and the two are printed as a ratio.
    #[arg(long, value_name = "PATH")]
    pub compare_tern: Option<std::path::PathBuf>,
    /// Seconds of the shared-mode run at 100 records/s that counts its transactions.
    #[arg(long, value_name = "S", default_value_t = 10)]
    pub sensor_seconds: u64,
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl UpstreamBenchArgs {
    pub fn options(&self) -> UpstreamBenchOptions {
        UpstreamBenchOptions {
            kafka: self.kafka.clone(),
            records: self.records,
            size: self.size,
            repetitions: self.repetitions,
            codecs: if self.codec.is_empty() {
                UpstreamBenchOptions::ALL_CODECS.to_vec()
            } else {
                self.codec.clone()
            },
            bandwidth: self.bandwidth,
            kafka_classpath: self.kafka_classpath.clone(),
            sensor_seconds: self.sensor_seconds,
            compare_tern: self.compare_tern.clone(),
        }
    }
}

/// Flags of `tern-bench kafka`.
#[derive(Debug, Args)]
pub struct KafkaBenchArgs {
    /// Classpath of Apache Kafka's jars (the broker, its tools): `tests/kafka/cache/*`.
    #[arg(long, value_name = "CLASSPATH", required = true)]
    pub kafka_classpath: String,
    /// Records produced and consumed per run.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub records: u64,
    /// Value bytes per record.
    #[arg(long, value_name = "S", default_value_t = 100)]
    pub size: usize,
    /// Runs per figure; the median is printed.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub repetitions: usize,
    /// Parent directory of both brokers' data [default: the system temporary directory].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Microseconds each fsync and fdatasync of both brokers waits first, as an SD card's or
    /// eMMC's cache flush does (loads `libtern_flush_delay.so` from beside tern-bench).
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub flush_delay_us: u64,
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl KafkaBenchArgs {
    pub fn options(&self) -> Result<KafkaBenchOptions, crate::BenchError> {
        let invalid = |option, reason| crate::BenchError::Invalid { option, reason };
        if self.records == 0 {
            return Err(invalid("--records", "must be at least 1"));
        }
        if self.size == 0 {
            return Err(invalid("--size", "must be at least 1"));
        }
        if self.repetitions == 0 {
            return Err(invalid("--repetitions", "must be at least 1"));
        }
        Ok(KafkaBenchOptions {
            kafka_classpath: self.kafka_classpath.clone(),
            records: self.records,
            size: self.size,
            repetitions: self.repetitions,
            dir: self.dir.clone().unwrap_or_else(std::env::temp_dir),
            flush_delay_us: self.flush_delay_us,
        })
    }
}

/// Flags of `tern-bench cold-read`.
#[derive(Debug, Args)]
pub struct ColdReadArgs {
    /// Where tern's data directory is made: a file system of its own device (a loop mount).
    #[arg(long, value_name = "DIR", required = true)]
    pub dir: PathBuf,
    /// Backlog records.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    pub records: u64,
    /// Value bytes per backlog record.
    #[arg(long, value_name = "S", default_value_t = 1000)]
    pub size: usize,
    /// Reads a second tern may make from --dir's device (an SD card's cold random reads take
    /// milliseconds each).
    #[arg(long, value_name = "IOPS", default_value_t = 100)]
    pub read_iops: u64,
    /// QoS 1 messages per measured phase.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub messages: usize,
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl ColdReadArgs {
    pub fn options(&self) -> Result<ColdReadOptions, crate::BenchError> {
        let invalid = |option, reason| crate::BenchError::Invalid { option, reason };
        if self.records == 0 || self.size == 0 || self.messages == 0 || self.read_iops == 0 {
            return Err(invalid(
                "--records/--size/--messages/--read-iops",
                "must be at least 1",
            ));
        }
        Ok(ColdReadOptions {
            dir: self.dir.clone(),
            records: self.records,
            size: self.size,
            read_iops: self.read_iops,
            messages: self.messages,
        })
    }
}

fn parse_codec(text: &str) -> Result<Codec, String> {
    UpstreamBenchOptions::ALL_CODECS
        .into_iter()
        .find(|&c| codec_name(c) == text)
        .ok_or_else(|| format!("unknown codec `{text}` (known: none, gzip, lz4, snappy, zstd)"))
}

/// Flags of the hidden `tern-bench log-writer`.
#[derive(Debug, Args)]
pub struct LogWriterArgs {
    /// Log directory to append to.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Value size of each record in bytes.
    #[arg(long, default_value_t = 1024)]
    pub record_size: usize,
    /// Concurrent appenders.
    #[arg(long, default_value_t = 64)]
    pub appenders: usize,
    /// Records per append call.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Stop appending (and exit without closing the log) after this many payload bytes.
    #[arg(long)]
    pub max_bytes: u64,
}

/// Flags of `tern-bench mqtt`; unset ones take the full (or --quick) defaults.
#[derive(Debug, Args)]
pub struct MqttBenchArgs {
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Measure only this running broker instead of starting tern and Mosquitto.
    #[arg(long, value_name = "HOST:PORT")]
    pub broker: Option<String>,
    /// Publisher connections [default: 16; quick: 4].
    #[arg(long, value_name = "N")]
    pub publishers: Option<usize>,
    /// Messages per publisher [default: 5000; quick: 500].
    #[arg(long, value_name = "M")]
    pub messages: Option<usize>,
    /// Payload bytes per message [default: 64].
    #[arg(long, value_name = "S")]
    pub size: Option<usize>,
    /// Only this QoS level [default: 1 and 0].
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub qos: Option<u8>,
    /// Unacknowledged QoS 1 publishes per connection [default: 64].
    #[arg(long, value_name = "W")]
    pub window: Option<usize>,
    /// Runs per figure; the median is printed [default: 3; quick: 1].
    #[arg(long, value_name = "R")]
    pub repetitions: Option<usize>,
    /// Idle clients connected for each broker's memory figure [default: 1000; quick: 100].
    #[arg(long, value_name = "K")]
    pub idle_clients: Option<usize>,
    /// Publisher connections of the deep QoS 1 run, 0 for none [default: 64; quick: 8].
    #[arg(long, value_name = "N")]
    pub deep_publishers: Option<usize>,
    /// Unacknowledged QoS 1 publishes per connection in the deep run [default: 256; quick: 128].
    #[arg(long, value_name = "W")]
    pub deep_window: Option<usize>,
    /// Messages of the closed-loop run (one publisher, one QoS 1 publish in flight), 0 for
    /// none [default: 200; quick: 40].
    #[arg(long, value_name = "M")]
    pub closed_loop_messages: Option<usize>,
    /// A few seconds' run that checks the bench works (smaller defaults).
    #[arg(long)]
    pub quick: bool,
}

impl MqttBenchArgs {
    /// The bench these flags describe.
    pub fn options(&self) -> BenchOptions {
        let base = if self.quick {
            BenchOptions::quick()
        } else {
            BenchOptions::full()
        };
        BenchOptions {
            broker: self.broker.clone(),
            publishers: self.publishers.unwrap_or(base.publishers),
            messages: self.messages.unwrap_or(base.messages),
            size: self.size.unwrap_or(base.size),
            qos: self.qos.or(base.qos),
            window: self.window.unwrap_or(base.window),
            repetitions: self.repetitions.unwrap_or(base.repetitions),
            idle_clients: self.idle_clients.unwrap_or(base.idle_clients),
            deep_publishers: self.deep_publishers.unwrap_or(base.deep_publishers),
            deep_window: self.deep_window.unwrap_or(base.deep_window),
            closed_loop_messages: self
                .closed_loop_messages
                .unwrap_or(base.closed_loop_messages),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_kafka_flags_and_their_limits() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["tern-bench", "kafka", "--kafka-classpath", "jars/*"];
            argv.extend_from_slice(extra);
            let cli = Cli::try_parse_from(argv).expect("valid command line");
            let BenchCommand::Kafka(args) = cli.command else {
                panic!("expected bench kafka, got {:?}", cli.command);
            };
            args.options()
        };
        let options = parse(&[]).expect("defaults");
        assert_eq!(
            (options.records, options.size, options.repetitions),
            (1_000_000, 100, 3)
        );
        assert_eq!(options.kafka_classpath, "jars/*");
        assert_eq!(options.flush_delay_us, 0);
        let options =
            parse(&["--records", "5", "--dir", "d", "--flush-delay-us", "2000"]).expect("flags");
        assert_eq!((options.records, options.dir), (5, PathBuf::from("d")));
        assert_eq!(options.flush_delay_us, 2000);
        assert!(parse(&["--records", "0"]).is_err());
        assert!(parse(&["--repetitions", "0"]).is_err());
        assert!(Cli::try_parse_from(["tern-bench", "kafka"]).is_err());
    }

    #[test]
    fn bench_mqtt_flags_override_the_quick_defaults() {
        let cli = Cli::try_parse_from([
            "tern-bench",
            "mqtt",
            "--quick",
            "--json",
            "--qos",
            "1",
            "--size",
            "512",
        ])
        .expect("valid command line");
        let BenchCommand::Mqtt(args) = cli.command else {
            panic!("expected bench mqtt, got {:?}", cli.command);
        };
        assert!(args.json);
        let options = args.options();
        assert_eq!(
            (options.qos, options.size, options.publishers),
            (Some(1), 512, BenchOptions::quick().publishers)
        );
        assert!(Cli::try_parse_from(["tern-bench", "mqtt", "--qos", "2"]).is_err());
    }

    #[test]
    fn bench_upstream_needs_kafka_and_takes_codecs() {
        assert!(Cli::try_parse_from(["tern-bench", "upstream"]).is_err());
        let cli = Cli::try_parse_from([
            "tern-bench",
            "upstream",
            "--kafka",
            "127.0.0.1:1,127.0.0.1:2",
            "--codec",
            "zstd,none",
            "--records",
            "500",
        ])
        .expect("valid command line");
        let BenchCommand::Upstream(args) = cli.command else {
            panic!("expected bench upstream, got {:?}", cli.command);
        };
        let options = args.options();
        assert_eq!(options.kafka, ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(options.codecs, [Codec::Zstd, Codec::None]);
        assert_eq!((options.records, options.size), (500, 64));
        let err = Cli::try_parse_from([
            "tern-bench",
            "upstream",
            "--kafka",
            "k:1",
            "--codec",
            "brotli",
        ])
        .map(|_| ());
        assert!(err.is_err_and(|e| e.to_string().contains("unknown codec `brotli`")));
    }
}

/// Flags of `tern-bench thin-link`.
#[derive(Debug, Args)]
pub struct ThinLinkArgs {
    /// Bootstrap servers of the Kafka cluster (scripts/bench-upstream.sh thin-link starts one).
    #[arg(
        long,
        value_name = "HOST:PORT[,HOST:PORT...]",
        value_delimiter = ',',
        required = true
    )]
    pub kafka: Vec<String>,
    /// Telemetry records in the backlog, stamped over the last 24 hours.
    #[arg(long, value_name = "N", default_value_t = 50_000)]
    pub backlog: u64,
    /// Payload bytes per record.
    #[arg(long, value_name = "S", default_value_t = 100)]
    pub size: usize,
    /// The `bandwidth` cap, bytes per second [default: 1 Mbit/s].
    #[arg(long, value_name = "BYTES", default_value_t = 125_000)]
    pub bandwidth: u64,
    /// Live telemetry records per second while the backlog drains.
    #[arg(long, value_name = "R", default_value_t = 20)]
    pub live_rate: u64,
    /// One alarm every this many milliseconds while the backlog drains.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub alarm_interval_ms: u64,
    /// Only these strategies [default: strict,priority,live-first].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub strategy: Vec<crate::thin::Strategy>,
    /// Also run live first with its copies written into the forwarded topic itself, the
    /// negative control of the checks on the topics (it duplicates and reorders on purpose).
    #[arg(long)]
    pub ablate_live_copies: bool,
    /// Also run live first in shared mode (a topic of the run's own for all gateways, records
    /// and group offsets in Kafka transactions).
    #[arg(long)]
    pub shared: bool,
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl ThinLinkArgs {
    pub fn options(&self) -> crate::thin::ThinOptions {
        crate::thin::ThinOptions {
            kafka: self.kafka.clone(),
            backlog: self.backlog,
            size: self.size,
            bandwidth: self.bandwidth,
            live_rate: self.live_rate,
            alarm_interval: std::time::Duration::from_millis(self.alarm_interval_ms),
            strategies: match self.strategy.is_empty() {
                true => crate::thin::Strategy::ALL.to_vec(),
                false => self.strategy.clone(),
            },
            ablate_live_copies: self.ablate_live_copies,
            shared: self.shared,
        }
    }
}

/// Flags of `tern-bench fleet`.
#[derive(Debug, Args)]
pub struct FleetArgs {
    /// Bootstrap servers of the Kafka cluster (scripts/bench-upstream.sh fleet starts one); the
    /// proxy fronts the first.
    #[arg(
        long,
        value_name = "HOST:PORT[,HOST:PORT...]",
        value_delimiter = ',',
        required = true
    )]
    pub kafka: Vec<String>,
    /// `tern serve` children in the fleet.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub gateways: usize,
    /// Each gateway's sensor publishes one QoS 1 reading per this period.
    #[arg(long, value_name = "DURATION", default_value = "500ms")]
    pub sensor_period: tern_core::HumanDuration,
    /// How long every link stays cut.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub outage: tern_core::HumanDuration,
    /// Forwarding mode of the fleet (`both`: the first half mirror, the rest shared).
    #[arg(long, value_enum, default_value = "both")]
    pub mode: crate::fleet::ModeChoice,
    /// Reconnect gaps jittered (`on`, the default of tern), not (`off`), or one run each.
    #[arg(long, value_enum, default_value = "both")]
    pub spread: crate::fleet::SpreadChoice,
    /// Every gateway's `reconnect_max` (tern's default 2s): the spread's window is its second
    /// half.
    #[arg(long, value_name = "DURATION", default_value = "2s")]
    pub reconnect_max: tern_core::HumanDuration,
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl FleetArgs {
    pub fn options(&self) -> crate::fleet::FleetOptions {
        crate::fleet::FleetOptions {
            kafka: self.kafka.clone(),
            gateways: self.gateways,
            sensor_period: self.sensor_period.0,
            outage: self.outage.0,
            mode: self.mode,
            spread: self.spread,
            reconnect_max: self.reconnect_max.0,
        }
    }
}

/// Flags of `tern-bench icount`.
#[derive(Debug, Args)]
pub struct IcountArgs {
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Only check the plugin's count against the known loop on each architecture.
    #[arg(long)]
    pub self_test: bool,
    /// Architectures to measure [default: both].
    #[arg(long, value_enum)]
    pub arch: Vec<Arch>,
    /// Publisher connections.
    #[arg(long, default_value_t = 4)]
    pub publishers: usize,
    /// QoS 1 messages per publisher in the short run (the long run sends twice as many).
    #[arg(long, default_value_t = 500)]
    pub messages: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Unacknowledged QoS 1 publishes per connection.
    #[arg(long, default_value_t = 64)]
    pub window: usize,
    /// Where scripts/cross.sh put the release builds, `DIR/<triple>/release/tern` [default:
    /// `cross` beside the directory of this tern-bench].
    #[arg(long, value_name = "DIR")]
    pub cross_dir: Option<PathBuf>,
    /// Where scripts/arm-peers.sh unpacked Debian's Mosquitto, `DIR/arm64` and `DIR/armhf`
    /// [default: `peers` beside the directory of this tern-bench, when it exists].
    #[arg(long, value_name = "DIR")]
    pub peers_dir: Option<PathBuf>,
    /// Also attribute each broker's instructions per message (and tern's per consumed or
    /// forwarded record) to functions and print the top N;
    /// tern runs as `DIR/<triple>/release-symbols/tern`, the release build with its symbols
    /// kept (`scripts/cross.sh --symbols`).
    #[arg(long, value_name = "N")]
    pub symbols: Option<usize>,
    /// With --symbols: also write, per architecture, the functions tern executed in its
    /// publish runs (start, connections, publishes, shutdown), most executed first, as the
    /// linker's symbol ordering file `DIR/<arch>.txt` (`gateway/tern/link-order/`, read by
    /// `gateway/tern/build.rs`: the code a running gateway touches lies together).
    #[arg(long, value_name = "DIR", requires = "symbols")]
    pub link_order: Option<PathBuf>,
    /// What to count: `publish` (instructions per durable QoS 1 message, tern and the peers),
    /// `consume` (tern's per record a host kcat reads from its Kafka listener), `forward`
    /// (tern's per record its forwarder sends to --kafka), `idle` (each broker's memory with
    /// --idle-clients idle clients) [default: publish].
    #[arg(long, value_enum)]
    pub measure: Vec<Measure>,
    /// Pairs of publish runs (N and 2N messages) per broker and architecture: the table shows
    /// the median pair and lists every pair's figure. tern's count follows how many publishes
    /// a batch gathers, so it moves by several percent from run to run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub runs: u16,
    /// Records of the consume and forward runs' short backlog (the long one holds twice as
    /// many).
    #[arg(long, default_value_t = 20_000)]
    pub records: u64,
    /// Bootstrap server of the Kafka cluster the forward runs send to, `host:port`
    /// (repeatable or comma-separated, as `scripts/kafka-cluster.sh start DIR` prints them).
    #[arg(long, value_name = "HOST:PORT", value_delimiter = ',')]
    pub kafka: Vec<String>,
    /// Compression of the forward runs' upstream batches [default: the forwarder's, lz4].
    #[arg(long, value_name = "CODEC", value_parser = parse_codec)]
    pub forward_codec: Option<Codec>,
    /// Idle MQTT clients of `--measure idle`.
    #[arg(long, default_value_t = 1_000)]
    pub idle_clients: usize,
}

impl IcountArgs {
    /// The run these flags describe; the default directories are the siblings of the directory
    /// cargo put this tern-bench in (`target/release/..`).
    pub fn options(&self) -> Result<IcountOptions, crate::BenchError> {
        let target = crate::beside_exe("..")?;
        let peers = self
            .peers_dir
            .clone()
            .or_else(|| Some(target.join("peers")).filter(|dir| dir.is_dir()));
        Ok(IcountOptions {
            archs: if self.arch.is_empty() {
                Arch::ALL.to_vec()
            } else {
                self.arch.clone()
            },
            publishers: self.publishers,
            messages: self.messages,
            size: self.size,
            window: self.window,
            cross_dir: self
                .cross_dir
                .clone()
                .unwrap_or_else(|| target.join("cross")),
            peers_dir: peers,
            self_test_only: self.self_test,
            symbols: self.symbols,
            link_order: self.link_order.clone(),
            runs: usize::from(self.runs),
            measures: match self.measure.is_empty() {
                true => vec![Measure::Publish],
                false => self.measure.clone(),
            },
            records: self.records,
            kafka: self.kafka.clone(),
            idle_clients: self.idle_clients,
            forward_codec: self
                .forward_codec
                .unwrap_or(tern_upstream::UpstreamConfig::default().compression),
        })
    }
}
