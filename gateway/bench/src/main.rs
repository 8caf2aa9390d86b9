//! The `tern-bench` binary: parse the command line, run the bench, map errors to exit codes.

use std::process::ExitCode;

use clap::Parser;
use tern_bench::cli::Cli;

fn main() -> ExitCode {
    match tern_bench::run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tern-bench: {err}");
            ExitCode::FAILURE
        }
    }
}
