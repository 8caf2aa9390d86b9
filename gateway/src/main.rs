//! The `tern` binary: parse the command line, load the configuration, run the chosen command and
//! map its outcome to an exit code. Everything else lives in the library modules.

use std::process::ExitCode;

use clap::Parser;
use tern_gateway::cli::{Cli, Command, ConfigCommand};
use tern_gateway::{app, config};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tern: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            let config = config::load(args.config.as_deref(), &args.overrides())?;
            tern_gateway::logging::init(&config.logging);
            app::serve(config)
        }
        Command::Bench(command) => Ok(tern_gateway::bench::run(command)?),
        Command::Config(ConfigCommand::Check { file }) => {
            let config = config::load(Some(&file), &config::Overrides::default())?;
            print!("{}", config.to_toml()?);
            Ok(())
        }
    }
}
