//! The `tern` binary: parse the command line, load the configuration, run the chosen command and
//! map its outcome to an exit code. Everything else lives in the library modules.

use std::process::ExitCode;

use clap::Parser;
use tern_gateway::cli::{Cli, Command, ConfigCommand, LogCommand};
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
        Command::Config(ConfigCommand::Check { file }) => {
            let config = config::load(Some(&file), &config::Overrides::default())?;
            print!("{}", config.to_toml()?);
            Ok(())
        }
        Command::Log(command) => run_log_tool(command),
        Command::Bench(command) => Ok(tern_gateway::bench::run(command)?),
        Command::Passwd { file, user, delete } => {
            use tern_gateway::mqtt::auth::passwd;
            let password = if delete {
                None
            } else {
                Some(passwd::read_password()?)
            };
            passwd::update(&file, &user, password.as_deref())?;
            Ok(())
        }
    }
}

fn run_log_tool(command: LogCommand) -> anyhow::Result<()> {
    use tern_gateway::log::tools;
    let mut out = std::io::stdout().lock();
    match command {
        LogCommand::Dump {
            data_dir,
            topic,
            partition,
            from,
            count,
            decode,
        } => {
            let from = match from {
                Some(text) => tools::From::parse(&text).map_err(anyhow::Error::msg)?,
                None => tools::From::Offset(0),
            };
            let options = tools::DumpOptions {
                partition,
                from,
                count,
                decode,
            };
            tools::dump(&data_dir, &topic, &options, &mut out)?;
            Ok(())
        }
        LogCommand::Verify { data_dir } => match tools::verify(&data_dir, &mut out)? {
            0 => Ok(()),
            n => anyhow::bail!("{n} problem(s) in the log of {}", data_dir.display()),
        },
        LogCommand::Topics { data_dir } => tools::topics(&data_dir, &mut out),
        LogCommand::Stress {
            data_dir,
            tasks,
            appends,
            segment_bytes,
            max_delay_ms,
            min_delay_ms,
            min_bytes,
            rate,
            seconds,
            record_bytes,
            retention_bytes,
        } => {
            drop(out);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let options = tools::StressOptions {
                tasks,
                appends,
                segment_bytes,
                max_delay: std::time::Duration::from_millis(max_delay_ms),
                min_delay: min_delay_ms.map(std::time::Duration::from_millis),
                min_bytes,
                rate,
                seconds,
                record_bytes,
                retention_bytes,
            };
            runtime.block_on(tools::stress(&data_dir, options))
        }
    }
}
