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
}
