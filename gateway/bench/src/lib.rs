//! `tern-bench`: tern's performance figures, printed for people and never asserted by tests,
//! and the stress writers of the crash tests. It is a workspace member of its own so that none
//! of it (the SQLite comparison, loop mounts, load generators) is compiled into the `tern` that
//! is flashed onto a gateway.
//!
//! The sibling benches, `log` (the storage engine against the raw device and SQLite), `mqtt`
//! (tern next to Mosquitto), `upstream` (forwarding to Kafka), `thin-link` (draining after an outage under a bandwidth cap, per strategy), `fleet` (many
//! `tern serve` children through one regional outage), `kafka` (tern's Kafka listener
//! next to Apache Kafka) and `icount` (guest instructions per message under QEMU), share one error type
//! (`error.rs`), one statistics module (`stats.rs`) and the report helpers (`report.rs`). This
//! file only dispatches a parsed command line; it must never touch a data directory, process
//! or topic the benches did not create.

pub mod cli;
pub mod downstream;
mod error;
pub mod fleet;
pub mod icount;
pub mod kafka;
mod log;
pub mod mqtt;
mod report;
mod stats;
mod stress;
pub mod thin;
pub mod upstream;
pub mod wear;

use std::path::PathBuf;

use crate::cli::BenchCommand;

pub use error::BenchError;

/// Runs a `tern-bench` subcommand and prints its figures.
pub fn run(command: BenchCommand) -> Result<(), BenchError> {
    match command {
        BenchCommand::Log(args) => report::print(&log::run_log(&args)?, args.json),
        BenchCommand::LogWriter(args) => log::writer(&args),
        BenchCommand::Stress(args) => stress::run(&args.options()),
        BenchCommand::Upstream(args) => report::print(&upstream::run(&args.options())?, args.json),
        BenchCommand::Kafka(args) => report::print(&kafka::run(&args.options()?)?, args.json),
        BenchCommand::Downstream(args) => {
            let command = std::env::args().collect::<Vec<_>>().join(" ");
            let report = downstream::run(&args.options(), command)?;
            report::print(&report, args.json)
        }
        BenchCommand::ThinLink(args) => {
            let command = std::env::args().collect::<Vec<_>>().join(" ");
            report::print(&thin::run(&args.options(), command)?, args.json)
        }
        BenchCommand::Fleet(args) => {
            let command = std::env::args().collect::<Vec<_>>().join(" ");
            report::print(&fleet::run(&args.options(), command)?, args.json)
        }
        BenchCommand::Icount(args) => report::print(&icount::run(&args.options()?)?, args.json),
        BenchCommand::ColdRead(args) => {
            report::print(&kafka::cold::run(&args.options()?)?, args.json)
        }
        BenchCommand::Mqtt(args) => report::print(&mqtt::run(&args.options())?, args.json),
        BenchCommand::Wear(args) => report::print(&wear::run(&wear::options(&args))?, args.json),
    }
}

/// The path of `name` in the directory of the running `tern-bench` (where cargo builds the
/// workspace's other artefacts).
pub fn beside_exe(name: &str) -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe().map_err(|source| BenchError::Io {
        what: "finding the running tern-bench",
        source,
    })?;
    Ok(exe.with_file_name(name))
}

/// A bench's multi-threaded async runtime: `workers` threads, or tokio's default (one per core).
pub(crate) fn runtime(workers: Option<usize>) -> Result<tokio::runtime::Runtime, BenchError> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder
        .enable_all()
        .build()
        .map_err(|source| BenchError::Io {
            what: "starting the async runtime",
            source,
        })
}

/// The `tern` binary a bench starts: `$TERN_BIN` when set, else the `tern` built beside this
/// `tern-bench` (`cargo build --release -p tern -p tern-bench` puts both in one directory).
pub fn tern_binary() -> Result<PathBuf, BenchError> {
    if let Some(path) = std::env::var_os("TERN_BIN") {
        return Ok(PathBuf::from(path));
    }
    let beside = beside_exe("tern")?;
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(BenchError::NoTernBinary { path: beside })
    }
}
