//! The `tern` binary: parse the command line, load the configuration, run the chosen command and
//! map its outcome to an exit code. The wiring is in `app.rs`; the layers are the `tern-*` crates.

use std::process::ExitCode;

use clap::Parser;

mod admin;
mod app;
mod cli;
mod config;
mod cursors;
mod decode;
mod deprecated;
mod device;
mod fleet;
mod health;
mod heap;
mod reload;
mod status;
mod systemd;

use cli::{Cli, Command, ConfigCommand, CursorTarget, CursorsCommand, FleetCommand, LogCommand};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tern: {}", describe(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: most layers' messages already include their
/// source's text, which `{:#}` would repeat (`preallocate F: No space…: preallocate F: No
/// space…: No space…`).
fn describe(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            let (mut config, deprecated) = config::load(args.config.as_deref(), &args.overrides())?;
            config.resolve_secrets()?;
            let level = tern_core::logging::init(config.logging.level.as_str());
            for key in &deprecated {
                tracing::warn!("{key}");
            }
            let source = reload::Source {
                path: args.config.clone(),
                overrides: args.overrides(),
                level,
            };
            app::serve(config, source)
        }
        Command::Config(ConfigCommand::Check { file }) => {
            let (config, deprecated) = config::load(Some(&file), &config::Overrides::default())?;
            for key in &deprecated {
                eprintln!("tern: warning: {key}");
            }
            config.clone().resolve_secrets()?;
            print!("{}", config.to_toml()?);
            Ok(())
        }
        Command::Log(command) => run_log_tool(command),
        Command::Cursors(command) => run_cursors(command),
        Command::Fleet(FleetCommand::Status {
            kafka,
            config,
            topic,
            silent_after,
            json,
        }) => fleet::run_status(&fleet::StatusQuery {
            kafka,
            config,
            topic,
            silent_after: silent_after.0,
            json,
        }),
        Command::Passwd { file, user, delete } => {
            use tern_auth::passwd;
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

fn run_cursors(command: CursorsCommand) -> anyhow::Result<()> {
    use cursors::Action;
    let (target, action, json) = match command {
        CursorsCommand::List { target, json } => (target, Action::List, json),
        CursorsCommand::Delete { target, name } => (target, Action::Delete { name }, true),
        CursorsCommand::Reset {
            target,
            name,
            to,
            topic,
        } => {
            let to = tern_log::ResetTo::parse(&to).map_err(anyhow::Error::msg)?;
            (target, Action::Reset { name, topic, to }, true)
        }
    };
    let answer = match target {
        CursorTarget {
            admin: Some(addr), ..
        } => cursors::run_remote(addr, &action)?,
        CursorTarget {
            data_dir: Some(dir),
            ..
        } => cursors::run_offline(&dir, &action)?,
        CursorTarget { .. } => anyhow::bail!("give --data-dir or --admin"),
    };
    let mut out = std::io::stdout().lock();
    if json {
        use std::io::Write;
        writeln!(out, "{answer}")?;
    } else {
        cursors::print_table(&answer, &mut out)?;
    }
    let missing = match &action {
        Action::Delete { .. } => answer["deleted"] == serde_json::json!(false),
        Action::Reset { .. } => answer["moved"] == serde_json::json!(0),
        Action::List => false,
    };
    if missing {
        anyhow::bail!("no such cursor");
    }
    Ok(())
}

fn run_log_tool(command: LogCommand) -> anyhow::Result<()> {
    use tern_log::tools;
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
                decode: decode.as_ref().map(|d| d as &dyn tools::ValueDecoder),
            };
            tools::dump(&data_dir, &topic, &options, &mut out)?;
            Ok(())
        }
        LogCommand::Verify { data_dir } => match tools::verify(&data_dir, &mut out)? {
            0 => Ok(()),
            n => anyhow::bail!("{n} problem(s) in the log of {}", data_dir.display()),
        },
        LogCommand::Topics { data_dir } => Ok(tools::topics(&data_dir, &mut out)?),
    }
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from_raw_os_error(28);
        let err = tern_log::LogError::Io {
            op: "preallocate",
            path: "d/0.log".into(),
            source: io,
        };
        let err = anyhow::Error::new(err).context("cannot open the log in d");
        let text = describe(&err);
        assert_eq!(text.matches("No space left on device").count(), 1, "{text}");
        assert!(
            text.starts_with("cannot open the log in d: preallocate d/0.log: "),
            "{text}"
        );
    }
}
