//! The command line: subcommands, flags and their help texts. Parsing only; no behaviour.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;

/// tern: an edge message broker for ARM gateways. Devices publish over MQTT; every message is
/// kept in a segmented log on local flash and forwarded upstream to Kafka.
#[derive(Debug, Parser)]
#[command(name = "tern", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (MQTT listener, log, admin endpoint).
    Serve(ServeArgs),
    /// Work with configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Measure performance and print the figures (never part of the tests' pass/fail).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Inspect and check a log directory (read-only; safe while tern runs).
    #[command(subcommand)]
    Log(LogCommand),
    /// Add or change an MQTT user in a password file (argon2id); the password is read from
    /// the first line of stdin.
    Passwd {
        /// The password file ([mqtt] password_file); created if missing.
        file: PathBuf,
        /// The user name.
        user: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// Print records as JSON lines: topic, partition, offset, timestamp, key, headers, value
    /// (UTF-8 text when valid, else base64, flagged by *_encoding).
    Dump {
        /// The data directory (the log lives in its `log` subdirectory).
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        #[arg(long)]
        topic: String,
        /// Only this partition [default: all].
        #[arg(long)]
        partition: Option<u32>,
        /// First offset (`120`), or first time: `@<ms since epoch>` or RFC 3339
        /// (`2026-01-31T12:00:00Z`) [default: the oldest record].
        #[arg(long, value_name = "OFFSET|TIME")]
        from: Option<String>,
        /// Print at most this many records.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Check every segment, batch CRC, index, topic metadata and the cursor log; exits 1 and
    /// names file and byte on damage.
    Verify {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
    },
    /// List topics and partitions with offsets, sizes and segment counts.
    Topics {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
    },
    /// Crash-test helper: append from several tasks, printing each acknowledged append.
    #[command(hide = true)]
    Stress {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        #[arg(long, default_value_t = 4)]
        tasks: u32,
        /// Appends per task; 0 = until killed.
        #[arg(long, default_value_t = 0)]
        appends: u64,
        #[arg(long, default_value_t = 64 * 1024)]
        segment_bytes: u64,
        /// Group-commit window in milliseconds.
        #[arg(long, default_value_t = 20)]
        max_delay_ms: u64,
        /// Open-loop appends per second (0 = closed loop printing acks).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 100)]
        record_bytes: usize,
        /// Partition size limit; the oldest segments are dropped (and recycled) past it.
        #[arg(long, default_value_t = 0)]
        retention_bytes: u64,
    },
}

/// Flags of `tern serve`. Each flag overrides the same setting of the configuration file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file (see tern.example.toml). Without it the built-in defaults apply.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory holding the log, cursors and the lock file [default: ./tern-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address of the MQTT listener [default: 127.0.0.1:1883].
    #[arg(long, value_name = "ADDR")]
    pub mqtt_listen: Option<SocketAddr>,
    /// Address of the admin HTTP endpoint (/healthz, /metrics) [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
}

impl ServeArgs {
    /// The settings these flags override.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            data_dir: self.data_dir.clone(),
            mqtt_listen: self.mqtt_listen,
            admin_listen: self.admin_listen,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a configuration file and print the effective configuration.
    Check {
        /// The TOML file to check.
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The log against the raw device and SQLite: throughput, write amplification, latency,
    /// reads, recovery, memory and a flash-lifetime projection, all on one file system.
    Log(BenchLogArgs),
    /// Internal: appends to a log until killed, printing progress (the bench's child process
    /// for recovery time and peak memory).
    /// Load an MQTT 3.1.1 broker: N publishers x M messages of S bytes; prints msgs/s and PUBACK
    /// latency p50/p99/max, optionally against a second broker with the throughput ratio.
    Mqtt {
        /// The broker to measure (e.g. a running tern).
        #[arg(long, value_name = "HOST:PORT")]
        broker: SocketAddr,
        /// A second broker given the same load (e.g. Mosquitto); prints the ratio.
        #[arg(long, value_name = "HOST:PORT")]
        compare: Option<SocketAddr>,
        #[arg(long, default_value_t = 10)]
        publishers: usize,
        /// Messages per publisher.
        #[arg(long, default_value_t = 5000)]
        messages: usize,
        /// Payload bytes.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// 0 or 1.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
        qos: u8,
        /// Unacknowledged QoS 1 messages per publisher.
        #[arg(long, default_value_t = 32)]
        window: usize,
        /// Idle connections held open during the run.
        #[arg(long, default_value_t = 0)]
        idle: usize,
        /// PID of the first broker, to print its resident memory with the idle clients.
        #[arg(long)]
        broker_pid: Option<u32>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    #[command(hide = true)]
    LogWriter(LogWriterArgs),
}

/// Flags of `tern bench log`.
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
}

/// Flags of the hidden `tern bench log-writer`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_flags_become_overrides() {
        let cli = Cli::try_parse_from([
            "tern",
            "serve",
            "--data-dir",
            "/x",
            "--mqtt-listen",
            "127.0.0.1:1",
        ])
        .expect("valid command line");
        let Command::Serve(args) = cli.command else {
            panic!("expected serve, got {:?}", cli.command);
        };
        let overrides = args.overrides();
        assert_eq!(overrides.data_dir, Some(PathBuf::from("/x")));
        assert_eq!(
            overrides.mqtt_listen,
            Some("127.0.0.1:1".parse().expect("addr"))
        );
        assert_eq!(overrides.admin_listen, None);
    }

    #[test]
    fn log_dump_flags_parse() {
        let cli = Cli::try_parse_from([
            "tern",
            "log",
            "dump",
            "--data-dir",
            "/d",
            "--topic",
            "t",
            "--from",
            "@5",
            "--count",
            "2",
        ])
        .expect("valid command line");
        let Command::Log(LogCommand::Dump {
            topic,
            from,
            count,
            partition,
            ..
        }) = cli.command
        else {
            panic!("expected log dump, got {:?}", cli.command);
        };
        assert_eq!(
            (topic.as_str(), from.as_deref(), count, partition),
            ("t", Some("@5"), Some(2), None)
        );
    }
}
