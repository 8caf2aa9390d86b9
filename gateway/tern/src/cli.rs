//! The command line: subcommands, flags and their help texts. Parsing only; no behaviour.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;
use crate::decode::Decoder;

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
    /// Inspect and check a log directory (read-only; safe while tern runs).
    #[command(subcommand)]
    Log(LogCommand),
    /// List, delete or reset the cursors that hold the log (MQTT sessions, shared groups,
    /// upstreams), offline on a data directory no tern is serving (`--data-dir`) or through a
    /// running tern's admin endpoint (`--admin`).
    #[command(subcommand)]
    Cursors(CursorsCommand),
    /// The fleet, seen from the datacenter: every gateway's last status record.
    #[command(subcommand)]
    Fleet(FleetCommand),
    /// Add, change or delete a user of an MQTT password file (argon2id hashes, mode 0600).
    /// The password is prompted for twice without echo on a terminal, else read from the first
    /// line of standard input. A running tern picks the change up at the next CONNECT.
    Passwd {
        /// The password file (`mqtt.auth.password_file`); created if missing.
        file: PathBuf,
        /// The username.
        user: String,
        /// Remove the user instead of setting a password.
        #[arg(long)]
        delete: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Reads the fleet's status topic (`[upstream.status] topic`, compacted) from the start
    /// and prints each gateway's last status: ready or why not, backlog, uptime, when it was
    /// last heard of and its clock's skew against the broker. Gateways silent for longer than
    /// `--silent-after` are flagged SILENT.
    Status {
        /// Bootstrap servers of the datacenter's Kafka cluster.
        #[arg(long, value_name = "HOST:PORT[,HOST:PORT...]", value_delimiter = ',')]
        kafka: Vec<String>,
        /// A tern.toml whose first [[upstream]] gives the connection (TLS, SASL, status topic);
        /// --kafka and --topic override it.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The status topic [default: tern-status].
        #[arg(long)]
        topic: Option<String>,
        /// Flag gateways whose last record is older than this.
        #[arg(long, value_name = "DURATION", default_value = "5m")]
        silent_after: tern_core::HumanDuration,
        /// Print one JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// Print records as JSON lines: topic, partition, offset, timestamp, key, headers, value
    /// (UTF-8 text when valid, else base64, flagged by *_encoding). With `--decode reading`
    /// each value is decoded as a sensor reading (`"reading": {...}`); a value that does not
    /// decode keeps its raw `value` and gets a `decode_error`.
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
        /// Decode each value through a shared schema: `reading` (tern_shared::Reading).
        #[arg(long, value_name = "SCHEMA")]
        decode: Option<Decoder>,
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
}

#[derive(Debug, Subcommand)]
pub enum CursorsCommand {
    /// Each cursor: owner, position per partition, lag in records and bytes, bytes held, age
    /// of the oldest record held.
    List {
        #[command(flatten)]
        target: CursorTarget,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove every position of a cursor: retention may then delete what it held. A connected
    /// owner (an online MQTT session, a running upstream) writes its cursor again.
    Delete {
        #[command(flatten)]
        target: CursorTarget,
        /// The cursor's name, as `list` prints it.
        name: String,
    },
    /// Move a cursor: its owner resumes from there.
    Reset {
        #[command(flatten)]
        target: CursorTarget,
        /// The cursor's name, as `list` prints it.
        name: String,
        /// `earliest` (oldest stored record), `latest` (skip everything stored) or an offset.
        #[arg(long, value_name = "earliest|latest|OFFSET")]
        to: String,
        /// Only this topic's positions [default: all of the cursor's].
        #[arg(long)]
        topic: Option<String>,
    },
}

/// Where a cursor command acts: exactly one of a data directory and an admin address.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct CursorTarget {
    /// A data directory no tern process is serving (refused while one holds its lock).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The admin endpoint of a running tern (`[admin] listen`, e.g. 127.0.0.1:9090).
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
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
    /// Address of the Kafka-protocol listener for local Kafka clients [default: 127.0.0.1:9092].
    #[arg(long, value_name = "ADDR")]
    pub kafka_listen: Option<SocketAddr>,
    /// Forward every topic to this Kafka cluster in mirror mode with default settings
    /// (replaces the file's [[upstream]]).
    #[arg(long, value_name = "BOOTSTRAP[,BOOTSTRAP...]", value_delimiter = ',')]
    pub kafka: Option<Vec<String>>,
    /// This gateway's name in upstream topic names [default: the host name].
    #[arg(long, value_name = "ID")]
    pub gateway_id: Option<String>,
}

impl ServeArgs {
    /// The settings these flags override.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            data_dir: self.data_dir.clone(),
            mqtt_listen: self.mqtt_listen,
            admin_listen: self.admin_listen,
            kafka_listen: self.kafka_listen,
            kafka: self.kafka.clone(),
            gateway_id: self.gateway_id.clone(),
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
    fn cursor_commands_need_exactly_one_target() {
        let parse =
            |args: &[&str]| Cli::try_parse_from(args).map(|cli| format!("{:?}", cli.command));
        assert!(parse(&["tern", "cursors", "list", "--data-dir", "/d"]).is_ok());
        assert!(parse(&["tern", "cursors", "delete", "x", "--admin", "127.0.0.1:1"]).is_ok());
        assert!(parse(&["tern", "cursors", "list"]).is_err());
        let both = [
            "tern",
            "cursors",
            "list",
            "--data-dir",
            "/d",
            "--admin",
            "127.0.0.1:1",
        ];
        assert!(parse(&both).is_err());
        assert!(
            parse(&["tern", "cursors", "reset", "x", "--data-dir", "/d"]).is_err(),
            "--to"
        );
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
            "--decode",
            "reading",
        ])
        .expect("valid command line");
        let Command::Log(LogCommand::Dump {
            topic,
            from,
            count,
            partition,
            decode,
            ..
        }) = cli.command
        else {
            panic!("expected log dump, got {:?}", cli.command);
        };
        assert_eq!(
            (topic.as_str(), from.as_deref(), count, partition, decode),
            ("t", Some("@5"), Some(2), None, Some(Decoder::Reading))
        );
    }

    #[test]
    fn an_unknown_decoder_is_refused_with_the_known_ones() {
        let err = Cli::try_parse_from([
            "tern",
            "log",
            "dump",
            "--data-dir",
            "/d",
            "--topic",
            "t",
            "--decode",
            "json",
        ])
        .map(|cli| format!("{:?}", cli.command));
        let message = err.map_err(|e| e.to_string());
        assert!(
            message
                .as_ref()
                .is_err_and(|m| m.contains("unknown decoder `json` (known: reading)")),
            "{message:?}"
        );
    }
}
